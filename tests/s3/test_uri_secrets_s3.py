"""Credentials in a URI's query are used, never shown nor kept (issue 36, item 5).

Every verb of the CLI runs as a user runs it -- a subprocess, with ``-v`` for the debug lines --
on an S3 table and an S3 source whose URIs carry the endpoint, a key id, a secret and a session
token in their query (the process's environment names no store at all, so the query is what
reaches the server). Afterwards the secret and the token appear in no stdout, no stderr, no
object of the bucket (timeline plans and commit metadata, markers, heartbeats, the Delta
projection, reports) and no file under the run's home and working folders. Error cases too: a
missing table, a missing source, a table that is not one.

The Spark-only verbs (``rehash``, ``bootstrap``) are in :func:`test_spark_verbs_keep_uri_secrets`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: distinctive, and with characters a URI must percent-encode (``/``, ``+``, ``=``)
SECRET = f"h4Secret/{uuid.uuid4().hex[:10]}+Zz="
TOKEN = f"h4Token{uuid.uuid4().hex[:12]}/Tk+"
KEY_ID = "AKIAH4EXAMPLEKEY"

ROWS1 = [{"id": f"k{i:02d} /%+é", "region": ["eu west/1", "sã%o+paulo", None, ""][i % 4], "ts": i,
          "amount": float(i)} for i in range(12)]
ROWS2 = [{"id": f"k{i:02d} /%+é", "region": ["eu west/1", "sã%o+paulo", None, ""][(i + 1) % 4], "ts": 100 + i,
          "amount": -float(i)} for i in range(6, 16)]


def _forms(value: str) -> list[str]:
    """The ways a value can appear in text: as given, percent-encoded, and its distinctive core."""
    return [value, quote(value, safe=""), value.split("/")[0]]


def with_secrets(uri: str, endpoint: str) -> str:
    """``uri`` carrying the store's settings and credentials in its query, as a user writes them."""
    return (f"{uri}?endpoint_url={quote(endpoint, safe='')}&access_key_id={KEY_ID}"
            f"&secret_access_key={quote(SECRET, safe='')}&region=us-east-1&session_token={quote(TOKEN, safe='')}")


class Runner:
    """Runs the CLI in a subprocess whose environment names no store, and keeps every output."""

    def __init__(self, tmp_path: Any) -> None:
        self.home = tmp_path / "home"
        self.cwd = tmp_path / "cwd"
        self.home.mkdir()
        self.cwd.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "BUCKETINDEX_STORAGE_OPTIONS"}
        env.update(PYTHONPATH=ROOT, BUCKETINDEX_HOME=str(self.home), HOME=str(self.home),
                   AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
                   AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        self.env = env
        self.outputs: list[tuple[list[str], str, str]] = []

    def __call__(self, *argv: str, status: int = 0) -> str:
        p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "-v", *argv], env=self.env, cwd=self.cwd,
                           capture_output=True, text=True, timeout=600)
        self.outputs.append((list(argv), p.stdout, p.stderr))
        assert p.returncode == status, (argv, p.returncode, p.stderr[-3000:])
        return p.stdout

    def leaks(self) -> list[str]:
        found = []
        for argv, out, err in self.outputs:
            for name, text in (("stdout", out), ("stderr", err)):
                for form in _forms(SECRET) + _forms(TOKEN):
                    if form in text:
                        line = next(ln for ln in text.splitlines() if form in ln)
                        found.append(f"{argv[0]} {name}: {line[:300]}")
                        break
        return found


def local_leaks(*dirs: Any) -> list[str]:
    found = []
    for d in dirs:
        for base, _, names in os.walk(d):
            for n in names:
                path = os.path.join(base, n)
                with open(path, "rb") as f:
                    data = f.read()
                if any(form.encode() in data for form in _forms(SECRET) + _forms(TOKEN)):
                    found.append(path)
    return found


def bucket_leaks(s3: Any, bucket: str) -> tuple[list[str], int]:
    """Objects of the bucket holding the secret or the token, and how many objects were read."""
    client = s3.client()
    name = bucket.split("://", 1)[1]
    found, n = [], 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
        for o in page.get("Contents", []):
            n += 1
            data = client.get_object(Bucket=name, Key=o["Key"])["Body"].read()
            if any(form.encode() in data for form in _forms(SECRET) + _forms(TOKEN)) or \
                    any(form in o["Key"] for form in _forms(SECRET) + _forms(TOKEN)):
                found.append(o["Key"])
    return found, n


def upload(s3: Any, bucket: str, key: str, rows: list[dict[str, Any]]) -> None:
    import io

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    s3.client().put_object(Bucket=bucket.split("://", 1)[1], Key=key, Body=buf.getvalue())


def test_arrow_verbs_keep_uri_secrets(s3, bucket, tmp_path):  # type: ignore[no-untyped-def]
    import json

    run = Runner(tmp_path)
    ep = s3.endpoint
    table = with_secrets(f"{bucket}/orders", ep)
    upload(s3, bucket, "landing/b1.parquet", ROWS1)
    upload(s3, bucket, "landing/b2.parquet", ROWS2)
    src1, src2 = with_secrets(f"{bucket}/landing/b1.parquet", ep), with_secrets(f"{bucket}/landing/b2.parquet", ep)
    upsert = ["--record-key", "id", "--precombine-field", "ts", "--partition-field", "region", "--engine", "arrow"]

    # the missing table and the missing source, before anything exists
    run("read", with_secrets(f"{bucket}/nothing", ep), "--engine", "arrow", status=2)
    run("show", with_secrets(f"{bucket}/nothing", ep), status=2)
    run("upsert", table, with_secrets(f"{bucket}/landing/absent.parquet", ep), *upsert, "--table-type",
        "merge_on_read", status=2)

    out = run("upsert", table, src1, *upsert, "--table-type", "merge_on_read", "--auto-compact", "off",
              "--num-buckets", "2", "--mirror", "delta")  # logs stay for the compact verbs below
    assert json.loads(out.splitlines()[-1])["counts"]["inserted"] == 12
    first = json.loads(run("upsert", table, src2, *upsert).splitlines()[-1])  # a batch id derived from the listing
    again = json.loads(run("upsert", table, src2, *upsert).splitlines()[-1])  # the same command: a no-op
    run("upsert", table, with_secrets(f"{bucket}/landing/absent.parquet", ep), *upsert, status=2)
    run("upsert", with_secrets(f"{bucket}/landing/b1.parquet", ep), src1, *upsert, status=2)  # a file, no table
    rows = run("read", table, "--engine", "arrow", "--limit", "100")
    assert "k15" in rows
    run("read", table, "--engine", "arrow", "--output", with_secrets(f"{bucket}/export/snapshot.parquet", ep))
    run("read", table, "--engine", "arrow", "--as-of", "1900-01-01T00:00:00Z", status=2)
    run("show", table)
    shown = json.loads(run("show", table, "--json"))
    assert shown["uri"].startswith(f"{bucket}/orders")
    run("validate", table, "--engine", "arrow")
    run("shadow-compare", table, "--engine", "arrow", "--report", with_secrets(f"{bucket}/reports/sc.json", ep))
    out = run("compact", table, "--schedule-only", "--min-logs", "1")
    planned = json.loads(out.splitlines()[0])
    run("rollback", table, planned["instant"])
    run("compact", table, "--engine", "arrow", "--min-logs", "1")
    run("alter", table, "--add-column", "note:string")
    run("clean", table, "--retain-commits", "1")
    run("mirror", table, "--repair")
    run("validate", table, "--engine", "arrow")

    in_bucket, n = bucket_leaks(s3, bucket)
    assert n > 20, "the table, its timeline and its projection were walked"
    leaks = {"printed": run.leaks(), "objects": in_bucket, "local files": local_leaks(tmp_path)}
    assert leaks == {"printed": [], "objects": [], "local files": []}
    # a URI's query is no glob: the derived batch id lists the file, so the same command is a no-op
    assert again["noop"] and again["batch_id"] == first["batch_id"], (first, again)


def test_a_derived_batch_id_reads_the_file_a_uri_with_a_query_names(s3, bucket):  # type: ignore[no-untyped-def]
    """The ``?`` of a query is no glob: the id lists the file itself (through the query's store),
    so two files of one folder get two ids, and credentials in the query do not change it."""
    from spark_jobs.table.action.batch_id import default_batch_id, source_listing
    from spark_jobs.table.action.upsert import UpsertOptions

    upload(s3, bucket, "landing/b1.parquet", ROWS1)
    upload(s3, bucket, "landing/b2.parquet", ROWS2)
    ep = s3.endpoint
    one = with_secrets(f"{bucket}/landing/b1.parquet", ep)
    assert [name for name, _, _ in source_listing(one)] == ["b1.parquet"]

    def batch_id(source: str) -> str:
        return default_batch_id(UpsertOptions(table=f"{bucket}/t", source=source, record_key=["id"]))

    rotated = one.replace(quote(SECRET, safe=""), "another-secret")
    assert batch_id(one) == batch_id(rotated) == batch_id(f"{bucket}/landing/b1.parquet")
    assert batch_id(one) != batch_id(with_secrets(f"{bucket}/landing/b2.parquet", ep))


@pytest.mark.spark
def test_spark_verbs_keep_uri_secrets(s3, bucket, tmp_path):  # type: ignore[no-untyped-def]
    """The verbs only Spark runs -- ``bootstrap`` (its plan, its commit's summary) and ``rehash`` --
    and a Spark upsert, with credentials in the table's and the dataset's URIs (one JVM each)."""
    import json

    run = Runner(tmp_path)
    ep = s3.endpoint
    for i, region in enumerate(["eu west/1", "sã%o+paulo"]):
        upload(s3, bucket, f"dataset/region={quote(region, safe='')}/part-{i}.parquet",
               [{k: v for k, v in r.items() if k != "region"} for r in ROWS1 if r["region"] == region])
    table = with_secrets(f"{bucket}/boot", ep)
    run("bootstrap", table, with_secrets(f"{bucket}/dataset", ep), "--record-key", "id", "--precombine-field", "ts",
        "--partition-field", "region", "--index", "bucket", "--mode", "rewrite", "--num-buckets", "2")
    run("rehash", table, "--num-buckets", "4")
    upload(s3, bucket, "landing/b2.parquet", ROWS2)
    run("upsert", table, with_secrets(f"{bucket}/landing/b2.parquet", ep), "--record-key", "id",
        "--precombine-field", "ts", "--partition-field", "region", "--engine", "spark")
    assert json.loads(run("show", table, "--json"))["config"]["num_buckets"] == 4

    in_bucket, n = bucket_leaks(s3, bucket)
    assert n > 10
    leaks = {"printed": run.leaks(), "objects": in_bucket, "local files": local_leaks(tmp_path)}
    assert leaks == {"printed": [], "objects": [], "local files": []}
