"""The added cost per commit of a projection (Delta Lake, issue 26; Iceberg, issue 39): milliseconds and object-store requests.

For local disk and the counting S3 server (moto on loopback, :mod:`tests.harness.s3_server`),
a table (``--table-type``, record index, partitioned, keys and partition values with spaces, ``/``,
``%``, ``+``, non-ASCII) is created and grown by ``--commits`` upserts of ``--rows`` rows through
the in-process CLI (``--engine arrow``). Each upsert runs with the projection *off*; then the
post-commit hook's own work -- ``mirror_commit`` of that sequence entry
(:mod:`spark_jobs.table.delta` or, with ``--projection iceberg``, :mod:`spark_jobs.table.iceberg`),
with the projection turned on in the handle -- is timed (and, on S3, its requests counted) on its
own, so the figures are exactly what ``--mirror delta|iceberg`` adds to a commit, apart from the
noise of the upsert around it. Version 0 and the first version (a repair from nothing) are
reported apart. On local disk the files the projection wrote per commit are counted (a
listing of its directory before and after). The median upsert time is printed beside it for scale.

    python benchmarks/delta_mirror.py [--commits 20] [--rows 200] [--table-type copy_on_write]
        [--stores local,s3] [--projection delta|iceberg] [--view read_optimized|fresh]

A merge-on-read table is created with automatic compaction off (a compaction is an entry of
its own, which the hook would project too). ``--view fresh`` (issue 39 item 2) projects the
fresh view (the projection's view set in the handle, as the mirror list is): every commit adds a
log to slices holding all the earlier ones: each such slice is planned again (its key and
precombine columns read from the base and every log) and gets a new position-delete file
(Iceberg) or its files are re-added with new inline deletion vectors (Delta) -- the fresh
view's worst case between compactions. The Delta fresh view refuses a string partition field
(``delta.fresh_view_refusal``), so with ``--projection delta --view fresh`` the table is
partitioned by an integer field (``pn``, 3 values) instead of the text one.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from results import emit_result  # noqa: E402 (benchmarks/ is on sys.path)

PARTS = ["eu west/1", "sã%o+paulo", "東京 +%"]
KINDS = ("LIST", "GET", "HEAD", "PUT", "DELETE")


def batch(n: int, ts: int) -> pa.Table:
    return pa.Table.from_pylist([{"id": f"k {i:06d}/é", "p": PARTS[i % 3], "pn": i % 3, "ts": ts,
                                  "v": float(i * ts)} for i in range(n)])


def run(store: str, *, commits: int, rows: int, table_type: str, server: Any,
        projection: str = "delta", view: str = "read_optimized") -> dict[str, Any]:
    from spark_jobs.cli import main
    from spark_jobs.io.filesystem import resolve
    from spark_jobs.table.projection import module
    from spark_jobs.table.table import Table

    writer = module(projection)
    fresh = view == "fresh"
    if fresh:
        assert table_type == "merge_on_read", "the fresh view is a merge-on-read table's"
        if projection == "iceberg":
            writer.projection_kind = lambda table, properties: "fresh"  # the view in the handle
        else:
            writer._kind = lambda table, properties: writer.VIEW_FRESH
    part = "pn" if fresh and projection == "delta" else "p"
    subdir = "_delta_log" if projection == "delta" else "metadata"

    tmp = tempfile.mkdtemp(prefix="delta-mirror-")
    if store == "s3":
        name = f"bench-{int(time.time() * 1000)}"
        server.create_bucket(name)
        root = f"s3://{name}"
    else:
        root = tmp
    uri = f"{root}/t"
    upsert_ms, mirror_ms, reqs, files = [], [], [], []
    first: dict[str, Any] = {}
    for n in range(commits):
        src = f"{root}/src/b{n}.parquet"
        fio, path = resolve(src)
        fio.mkdirs(os.path.dirname(path))
        with fio.fs.open_output_stream(path) as f:
            pq.write_table(batch(rows, n + 1), f)
        argv = ["upsert", uri, src, "--record-key", "id", "--precombine-field", "ts", "--partition-field", part,
                "--engine", "arrow", "--batch-id", f"b{n}", "--num-buckets", "4", "--table-type", table_type,
                *(["--auto-compact", "off"] if table_type == "merge_on_read" and n == 0 else [])]
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(argv) == 0
        upsert_ms.append((time.perf_counter() - t0) * 1000)
        table = Table.load(uri)
        assert table.config is not None
        table.config = dataclasses.replace(table.config, mirrors=[projection])  # the hook's view of the table
        seq = table.timeline.last_seq
        if server is not None:
            server.reset_counts()
        listed = set(os.listdir(os.path.join(uri, subdir))) if store == "local" and n else set()
        if projection == "iceberg":  # cold, as in a CLI process (one commit each): no manifest read before
            writer._AVRO_CACHE.clear()
        else:  # likewise: version 0's form and view not read yet, no slice planned in this process
            writer._CURRENT_FORM.clear()
            writer._LOG_KIND.clear()
            writer._PLANS.clear()
        t0 = time.perf_counter()
        written = writer.mirror_commit(table, seq)
        ms = (time.perf_counter() - t0) * 1000
        if store == "local" and n:
            files.append(len(set(os.listdir(os.path.join(uri, subdir))) - listed))
        counts = server.counts() if server is not None else {}
        if n == 0:
            first = {"versions": written, "ms": round(ms, 1), "requests": counts}
            continue
        assert written == [seq], (written, seq)
        mirror_ms.append(ms)
        reqs.append(counts)
    per_kind = {k: statistics.median([r.get(k, 0) for r in reqs]) for k in KINDS} if server is not None else None
    out = {"store": store, "projection": projection, "table_type": table_type, "view": view, "commits": commits,
           "rows": rows,
           "upsert_ms_median": round(statistics.median(upsert_ms[1:]), 1),
           "mirror_ms_median": round(statistics.median(mirror_ms), 1),
           "mirror_ms_p90": round(sorted(mirror_ms)[int(len(mirror_ms) * 0.9) - 1], 1),
           "first_repair": first}
    if files:
        out["files_written_median"] = statistics.median(files)
    if per_kind is not None:
        out["mirror_requests_median"] = per_kind
        out["mirror_requests_total_median"] = statistics.median([sum(r.values()) for r in reqs])
    print(f"{store:5s} {projection} {table_type} {view}: upsert {out['upsert_ms_median']} ms (median), mirror +{out['mirror_ms_median']} ms "
          f"(p90 {out['mirror_ms_p90']})" + (f", requests {per_kind}" if per_kind else ""), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=20)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--table-type", default="copy_on_write", choices=("copy_on_write", "merge_on_read"))
    ap.add_argument("--stores", default="local,s3")
    ap.add_argument("--projection", default="delta", choices=("delta", "iceberg"))
    ap.add_argument("--view", default="read_optimized", choices=("read_optimized", "fresh"))
    args = ap.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.WARNING)
    results = []
    stores = args.stores.split(",")
    server = None
    if "s3" in stores:
        from spark_jobs.io import storage
        from tests.harness.s3_server import start_server

        server = start_server()
        os.environ.update(server.env())
        storage.configure(None)
    try:
        for store in stores:
            results.append(run(store, commits=args.commits, rows=args.rows, table_type=args.table_type,
                               server=server if store == "s3" else None, projection=args.projection,
                               view=args.view))
    finally:
        if server is not None:
            server.stop()
    emit_result({"benchmark": "delta_mirror" if args.projection == "delta" else "iceberg_mirror",
                 "results": results})


if __name__ == "__main__":
    main()
