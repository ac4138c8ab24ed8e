"""Object-storage requests per verb (issue 25): LIST/GET/HEAD/PUT/DELETE at a short and a long history.

On the counting S3 server (:mod:`tests.harness.s3_server`: moto on loopback, in its own
process, counting every request of every client), for each table type (``--table-types``,
default copy_on_write and merge_on_read; record index, ``--buckets`` index buckets,
partitioned by ``p``):

1. a table is created by a ``--rows``-row upsert (keys and partition values with spaces,
   ``/``, ``%``, ``+``, non-ASCII; 3 partitions);
2. its history is grown to N completed commits (each of ``--commits``, default 10 and 1,000)
   with real :class:`~spark_jobs.table.action.transaction.Transaction` commits that change no
   file -- plan, heartbeat, inflight, conflict check, sequence entry, checkpoint and archival
   exactly as an upsert's, so everything that grows with history (sequence entries, plans,
   checkpoints, archives, the batch-id list) grows; the data and the index stay as the first
   upsert left them, so that any difference between N's is the timeline's;
3. every verb runs once, in-process (``spark_jobs.cli.main``, ``--engine arrow`` where the verb
   has one), in this order, each counted on its own: ``upsert`` (the same ``--rows`` keys,
   new values: every file group and index bucket the first one wrote), ``read``, ``validate``,
   ``show``, ``shadow-compare``, ``compact --min-logs 1 --min-deltas 1`` (every log and index
   delta folded), ``clean --retain-commits 1``, ``rollback
   INSTANT --force`` of a pending upsert left by a writer that wrote one data file (its
   setup is not counted).

History N counts the table's completed commits before the verbs run, the creating upsert
included: N = 10 and 1,000 sit at the same place in the checkpoint interval, so the two
columns differ exactly by what grows with history. Progress goes to stdout; the last line is
one JSON object (``--json-out`` writes it to a file too).

    python benchmarks/s3_requests.py [--commits 10,1000] [--table-types copy_on_write,merge_on_read]
        [--rows 200] [--buckets 4] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import platform
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from results import emit_result  # noqa: E402 (benchmarks/ is on sys.path)

KINDS = ("LIST", "GET", "HEAD", "PUT", "DELETE")
VERBS = ("upsert", "read", "validate", "show", "shadow-compare", "compact", "clean", "rollback")
PARTS = ["eu west/1", "sã%o+paulo", "東京 +%"]


def rows(n: int, ts: int) -> list[dict[str, Any]]:
    return [{"id": f"k{i:05d} /%+é", "p": PARTS[i % 3], "ts": ts, "amount": None if i % 7 == 0 else float(i)}
            for i in range(n)]


def cli(*argv: str) -> None:
    from spark_jobs.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        status = main(list(argv))
    if status != 0:
        raise SystemExit(f"bucketindex {' '.join(argv)} exited {status}")


def counted(server: Any, *argv: str) -> dict[str, int]:
    server.reset_counts()
    cli(*argv)
    got = server.counts()
    return {k: int(got.get(k, 0)) for k in KINDS}


def grow_history(uri: str, upto: int) -> float:
    """Metadata-only commits through the real Transaction until ``upto`` commits completed; seconds taken."""
    from spark_jobs.table.action.transaction import Transaction
    from spark_jobs.table.table import Table
    from spark_jobs.table.timeline import Action

    table = Table.load(uri)
    started = time.perf_counter()
    while table.timeline.reload().last_seq < upto:
        bid = f"history-{table.timeline.last_seq + 1}"
        txn = Transaction(table, Action.COMMIT, {"batch_id": bid}).begin()
        txn.commit({"batch_id": bid, "index": {"added": []}, "file_groups": []})
        if table.timeline.last_seq % 100 == 0:
            print(f"    history: {table.timeline.last_seq} commits", flush=True)
    return time.perf_counter() - started


def pending_writer(uri: str) -> str:
    """A writer that planned, marked and wrote one data file, then died: what ``rollback`` undoes."""
    from spark_jobs.table.action.transaction import Transaction
    from spark_jobs.table.table import Table
    from spark_jobs.table.timeline import Action

    table = Table.load(uri)
    txn = Transaction(table, Action.COMMIT, {"batch_id": "abandoned"}).begin()
    rel = f"p=dead/abandoned_0-0-0_{txn.ts}.parquet"
    table.write_marked(txn.ts, rel, lambda: table.io.write_bytes(table.layout.data_path(rel), b"not parquet"),
                       snapshot_seq=txn.view.seq if txn.view is not None else 0)
    assert txn._heartbeat is not None
    txn._heartbeat.stop(delete=False)  # dies: its heartbeat stays behind
    return txn.ts


def one_table(server: Any, *, table_type: str, history: int, n_rows: int, buckets: int, tmp: str) -> dict[str, Any]:
    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    server.create_bucket(bucket)
    uri = f"s3://{bucket}/orders"
    src1, src2 = os.path.join(tmp, f"{bucket}-1.parquet"), os.path.join(tmp, f"{bucket}-2.parquet")
    pq.write_table(pa.Table.from_pylist(rows(n_rows, 1)), src1)
    pq.write_table(pa.Table.from_pylist(rows(n_rows, 2)), src2)
    create = counted(server, "upsert", uri, src1, "--record-key", "id", "--precombine-field", "ts",
                     "--partition-field", "p", "--table-type", table_type, "--num-buckets", str(buckets),
                     "--engine", "arrow")
    seconds = grow_history(uri, history)
    out: dict[str, Any] = {"create": create, "history_seconds": round(seconds, 1)}
    arrow = ("--engine", "arrow")
    plan = {
        "upsert": ("upsert", uri, src2, *arrow),
        "read": ("read", uri, *arrow),
        "validate": ("validate", uri, *arrow),
        "show": ("show", uri),
        "shadow-compare": ("shadow-compare", uri, *arrow),
        "compact": ("compact", uri, "--min-logs", "1", "--min-deltas", "1", *arrow),  # fold every log and delta
        "clean": ("clean", uri, "--retain-commits", "1"),
    }
    for verb in VERBS:
        if verb == "rollback":
            target = pending_writer(uri)
            argv: tuple[str, ...] = ("rollback", uri, target, "--force")
        else:
            argv = plan[verb]
        started = time.perf_counter()
        out[verb] = counted(server, *argv)
        out[verb]["seconds"] = round(time.perf_counter() - started, 2)
        print(f"    {verb:15s} " + " ".join(f"{k}={out[verb][k]:<4d}" for k in KINDS)
              + f" ({out[verb]['seconds']} s)", flush=True)
    from spark_jobs.table.table import Table

    tl = Table.load(uri).timeline
    out["timeline"] = {"completed": tl.last_seq, "checkpoint": tl.base_seq,
                       "archive_files": len(tl.archives(refresh=True))}
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commits", default="10,1000", help="history sizes, comma-separated (default 10,1000)")
    p.add_argument("--table-types", default="copy_on_write,merge_on_read")
    p.add_argument("--rows", type=int, default=200)
    p.add_argument("--buckets", type=int, default=4)
    p.add_argument("--json-out")
    args = p.parse_args(argv)
    logging.disable(logging.INFO)

    from spark_jobs.io import storage
    from tests.harness.s3_server import start_server

    server = start_server()
    try:
        os.environ.update(server.env())
        os.environ.pop("BUCKETINDEX_STORAGE_OPTIONS", None)
        storage.configure(None)
        commits = [int(c) for c in args.commits.split(",")]
        results: dict[str, Any] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for table_type in args.table_types.split(","):
                results[table_type] = {}
                for n in commits:
                    print(f"{table_type}, {n} commits of history", flush=True)
                    results[table_type][str(n)] = one_table(server, table_type=table_type, history=n,
                                                            n_rows=args.rows, buckets=args.buckets, tmp=tmp)
        same = {tt: {verb: len({json.dumps({k: r[str(n)][verb][k] for k in KINDS}) for n in commits}) == 1
                     for verb in VERBS} for tt, r in results.items()}
        print("requests per verb (LIST/GET/HEAD/PUT/DELETE), by history length:")
        for tt, r in results.items():
            for verb in VERBS:
                cells = "  ".join(f"{n}: " + "/".join(str(r[str(n)][verb][k]) for k in KINDS) for n in commits)
                print(f"  {tt:14s} {verb:15s} {cells}  {'same' if same[tt][verb] else 'DIFFERS'}")
        import moto
        import pyarrow

        emit_result({
            "benchmark": "s3_requests",
            "setup": {"rows": args.rows, "buckets": args.buckets, "index": "record", "partitions": len(PARTS),
                      "commits": commits, "engine": "arrow", "server": f"moto {moto.__version__} (counting)",
                      "pyarrow": pyarrow.__version__, "python": platform.python_version()},
            "results": results,
            "same_at_every_history": same,
        }, args.json_out)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
