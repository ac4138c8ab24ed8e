"""An S3-compatible server on loopback that counts the requests it answers (tests, benchmarks).

moto's server (``moto[server]``, a test and bench dependency, never a runtime one) speaks
S3 with conditional puts (``If-None-Match: *`` -> 412); this wraps its WSGI app in a
counter (which also makes each write atomic, as S3's are: see ``CountingApp.write_lock``) so
that a test or a benchmark can read how many LIST/GET/HEAD/PUT/DELETE requests a
verb made -- every client counted, pyarrow's and boto3's, in every process (CLI
subprocesses, Spark's Python workers), because they all talk to this one server.

Run it in its own process (``python tests/harness/s3_server.py``; it prints
``port <n>`` once it listens), so a SIGKILLed writer or a busy driver never stalls it:

* ``GET /_bi/requests`` -> ``{"counts": {"LIST": n, ...}, "log": [[method, path, query], ...]}``
* ``POST /_bi/requests/reset`` -> zero the counters.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs

from spark_jobs.processes import stop_with_parent

__all__ = ["classify", "CountingApp", "S3Server", "start_server"]

#: the request kinds counted; a batch delete (``POST ?delete``) counts as one DELETE
KINDS = ("LIST", "GET", "HEAD", "PUT", "DELETE", "POST")


def classify(method: str, path: str, query: str) -> str | None:
    """The kind of one path-style S3 request, or None for what is not a data request (bucket creation)."""
    parts = path.lstrip("/").split("/", 1)
    has_key = len(parts) == 2 and parts[1] != ""
    q = parse_qs(query, keep_blank_values=True)
    if method == "HEAD":
        return "HEAD"
    if method == "GET":
        if has_key:
            return "GET"
        return None if "location" in q else "LIST"
    if method == "PUT":
        return "PUT" if has_key else None
    if method == "DELETE":
        return "DELETE" if has_key else None
    if method == "POST":
        return "DELETE" if "delete" in q else "POST"
    return None


class CountingApp:
    """WSGI middleware: count each request by :func:`classify`, answer ``/_bi/requests``."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()
        #: one writing request at a time: moto checks a conditional put's precondition and then
        #: stores the object without a lock, so two racing ``If-None-Match: *`` puts of one key
        #: could both succeed (seen: two winners of one slot in test_fileio_contract's race at
        #: load 5), where S3 answers the second with 412. Reads still run concurrently.
        self.write_lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.log: list[tuple[str, str, str]] = []

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        query = environ.get("QUERY_STRING", "")
        if path == "/_bi/requests":
            with self.lock:
                body = json.dumps({"counts": dict(self.counts), "log": self.log}).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if path == "/_bi/requests/reset":
            with self.lock:
                self.counts.clear()
                self.log.clear()
            start_response("204 No Content", [])
            return [b""]
        kind = classify(method, path, query)
        if kind is not None:
            with self.lock:
                self.counts[kind] += 1
                self.log.append((method, path, query))
        if method in ("PUT", "POST", "DELETE"):
            with self.write_lock:
                return list(self.app(environ, start_response))  # the response produced inside the lock
        return self.app(environ, start_response)


def serve(host: str, port: int) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = CountingApp(DomainDispatcherApplication(create_backend_app))
    server = make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


@dataclass
class S3Server:
    """A running server process: its endpoint, credentials for it, and its request counters."""

    process: subprocess.Popen
    port: int
    host: str = "127.0.0.1"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    #: moto accepts any credentials; these name the run so a stray real AWS call fails loudly
    access_key_id = "bucketindex-test"
    secret_access_key = "bucketindex-test-secret"
    region = "us-east-1"

    def env(self) -> dict[str, str]:
        """The ``AWS_*`` variables a process needs to reach this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret_access_key, "AWS_REGION": self.region,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def options(self) -> dict[str, str]:
        """The same settings as storage options (``--storage-option``, ``storage.configure``)."""
        return {"endpoint_url": self.endpoint, "access_key_id": self.access_key_id,
                "secret_access_key": self.secret_access_key, "region": self.region}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key_id,
                            aws_secret_access_key=self.secret_access_key, region_name=self.region)

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def counts(self) -> dict[str, int]:
        return {k: v for k, v in self.requests()["counts"].items()}

    def requests(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.endpoint}/_bi/requests", timeout=10) as r:
            return json.loads(r.read())

    def reset_counts(self) -> None:
        req = urllib.request.Request(f"{self.endpoint}/_bi/requests/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).close()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_server(port: int = 0, host: str = "127.0.0.1", *, timeout: float = 30.0) -> S3Server:
    """Start the counting S3 server in a child process on a free port and wait until it listens."""
    env = dict(os.environ)
    env.pop("AWS_ENDPOINT_URL", None)
    proc = subprocess.Popen([sys.executable, __file__, "--host", host,
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, preexec_fn=stop_with_parent())
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("port "):
            server = S3Server(proc, int(line.split()[1]), host)
            proc.stdout.close()
            return server
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"the S3 test server did not start (is moto[server] installed?): {line!r}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    serve(args.host, args.port)


if __name__ == "__main__":
    main()
