"""Object-store requests of each projection at 1M (or 10M) rows (issue 39 item 4): turning it on and what it adds to a commit, on the counting S3 server.

``projection_scale.py`` measures the projections' milliseconds and bytes on local disk at 1M and
10M rows; ``delta_mirror.py`` counts their requests per commit on a 200-row table. This one
counts requests on a table of realistic size: the built table of a ``projection_scale.py``
workdir (``<workdir>/tables/base_<size>``, the state before its CDC batches) is uploaded to the
counting moto server (:mod:`tests.harness.s3_server`, loopback) once per copy, each copy's
projection is turned on there (``bucketindex mirror --enable ...``, in this process, every request
of the command counted), then the workdir's CDC batches (``data/uuid_<size>/batch_*.parquet``,
uploaded too) are upserted into each copy in turn (the in-process CLI, Arrow engine, as
``projection_scale.py`` does). ``delta.mirror_commit`` and ``iceberg.mirror_commit`` are wrapped:
the server's counts are reset when the post-commit hook starts and read when it returns, so a
commit's figure is exactly the projection's requests for that sequence entry (the upsert around
it is single-threaded; an automatic compaction's own entry is reported apart). The per-process
caches a CLI process starts without are cleared before each upsert.

    nice -n 10 python benchmarks/projection_requests.py --workdir /work/h5-proj --size 1000000 \\
        [--copies ro,fresh,dfresh]

Copies (as ``projection_scale.py``'s): ``ro`` Delta and Iceberg read-optimized, ``fresh`` Iceberg
fresh view, ``dfresh`` Delta fresh view. The moto server keeps every object in memory: a 1M-row
table is ~90 MB per copy. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from projection_scale import COPY_STEPS, clear_process_caches, load1, log  # noqa: E402 (benchmarks/ is on sys.path)
from results import emit_result  # noqa: E402

def _upload(local: Path, uri: str) -> int:
    """Copy a local directory tree (or file) to ``uri`` through the product's FileIO; returns bytes."""
    import pyarrow.fs as pafs

    from spark_jobs.io.filesystem import resolve

    fio, dst = resolve(uri)
    # one file at a time: moto drops connections under pyarrow's parallel multipart uploads of 1 GB
    pafs.copy_files(str(local), dst, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fio.fs,
                    use_threads=False)
    return sum(f.stat().st_size for f in ([local] if local.is_file() else local.rglob("*")) if f.is_file())


def _total(counts: dict[str, int]) -> int:
    """Every request the server counted (LIST, GET, HEAD, PUT, DELETE, POST: multipart uploads)."""
    return sum(counts.values())


def run(work: Path, size: int, copies: list[str], server: Any) -> dict[str, Any]:
    from spark_jobs.cli import main as cli_main
    from spark_jobs.table import delta, iceberg

    base = work / "tables" / f"base_{size}"
    data = work / "data" / f"uuid_{size}"
    if not base.is_dir():
        raise SystemExit(f"no built table at {base}: run projection_scale.py --workdir {work} --sizes {size} first")
    batches = sorted(data.glob("batch_*.parquet"))
    bucket = server.create_bucket(f"proj-{int(time.time())}")
    root = f"s3://{bucket}"
    t0 = time.perf_counter()
    up = sum(_upload(b, f"{root}/src/{b.name}") for b in batches)
    log(f"uploaded {len(batches)} batches ({up / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")

    calls: list[dict[str, Any]] = []
    originals = {"delta": delta.mirror_commit, "iceberg": iceberg.mirror_commit}

    def wrap(kind: str) -> Callable[[Any, int], list[int]]:
        def counted(t: Any, seq: int) -> list[int]:
            server.reset_counts()
            t1 = time.perf_counter()
            written = originals[kind](t, seq)
            calls.append({"projection": kind, "seq": seq, "ms": round((time.perf_counter() - t1) * 1000, 1),
                          "requests": server.counts(), "versions": written})
            return written
        return counted

    out: dict[str, Any] = {"size": size, "copies": {}}
    for copy in copies:
        uri = f"{root}/{copy}_{size}"
        t0 = time.perf_counter()
        nbytes = _upload(base, uri)
        log(f"{copy}: uploaded the table ({nbytes / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
        rec: dict[str, Any] = {"table_bytes": nbytes, "enable": {}, "commits": []}
        for args in COPY_STEPS[copy]:
            name = "_".join(a.lstrip("-") for a in args)
            server.reset_counts()
            ld, t0 = load1(), time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                rc = cli_main(["mirror", uri, "--enable", *args])
            if rc != 0:
                raise SystemExit(f"mirror --enable {' '.join(args)} on {uri} failed ({rc})")
            c = server.counts()
            rec["enable"][name] = {"ms": round((time.perf_counter() - t0) * 1000, 1), "requests": c,
                                   "total": _total(c), "load_1m": ld}
            log(f"  {copy}: mirror --enable {' '.join(args)}: {rec['enable'][name]['ms'] / 1000:.2f} s, "
                f"{_total(c)} requests {c}")
        delta.mirror_commit, iceberg.mirror_commit = wrap("delta"), wrap("iceberg")
        try:
            for b in batches:
                calls.clear()
                clear_process_caches()
                ld, t0 = load1(), time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):
                    rc = cli_main(["upsert", uri, f"{root}/src/{b.name}", "--delete-field", "_deleted",
                                   "--engine", "arrow"])
                wall = (time.perf_counter() - t0) * 1000
                if rc != 0:
                    raise SystemExit(f"upsert of {b.name} into {uri} failed ({rc})")
                seqs = sorted({c["seq"] for c in calls})
                entry = {"batch": b.name, "upsert_ms": round(wall, 1), "load_1m": ld,
                         "commit": [c for c in calls if seqs and c["seq"] == seqs[0]],
                         "after": [c for c in calls if seqs and c["seq"] != seqs[0]]}
                rec["commits"].append(entry)
                log(f"  {copy} {b.name}: upsert {wall / 1000:.2f} s; "
                    + ", ".join(f"{c['projection']} +{c['ms']:.0f} ms {_total(c['requests'])} requests "
                                f"{c['requests']}" for c in entry["commit"])
                    + (f"; compaction entries: " + ", ".join(f"{c['projection']} {_total(c['requests'])} requests"
                                                             for c in entry["after"]) if entry["after"] else ""))
        finally:
            delta.mirror_commit, iceberg.mirror_commit = originals["delta"], originals["iceberg"]
        out["copies"][copy] = rec
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True, type=Path, help="a projection_scale.py workdir (its built table)")
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--copies", default=",".join(COPY_STEPS), help="ro, fresh, dfresh")
    args = ap.parse_args(argv)
    copies = [c for c in args.copies.split(",") if c]
    if bad := [c for c in copies if c not in COPY_STEPS]:
        ap.error(f"unknown copies {bad}: choose from {', '.join(COPY_STEPS)}")
    import logging

    logging.basicConfig(level=logging.WARNING)
    from spark_jobs.io import storage
    from tests.harness.s3_server import start_server

    server = start_server()
    os.environ.update(server.env())
    storage.configure(None)
    log(f"counting S3 server at {server.endpoint}; load {load1()}")
    try:
        result = run(args.workdir, args.size, copies, server)
    finally:
        server.stop()
    result["load_1m_end"] = load1()
    emit_result({"benchmark": "projection_requests", **result})


if __name__ == "__main__":
    main()
