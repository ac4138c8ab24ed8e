"""Requests are a cost users pay: the request budget of format.md §10, held on the counting server.

* the request count of a 200-row upsert (Arrow engine, in-process CLI) is the same after a short
  history and after a long one -- long enough that checkpointing and archival each ran at least
  twice -- and equals the budget formula for the file groups it touches;
* no directory marker (a PUT of a key ending in ``/``) after a session of every verb;
* ``clean`` deletes in batches: one ``DeleteObjects`` per 1,000 files, not a request per file;
* a heartbeat is one PUT;
* ``show`` makes no HEAD per index delta.

History is built with real :class:`Transaction` commits that change no file (a CLI upsert is
~2 s here, a metadata commit ~0.25 s): what grows with history is the timeline -- sequence
entries, plans, checkpoints, archives -- and that is exactly what they grow.
"""

from __future__ import annotations

import contextlib
import io
import math
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.cli import main as cli
from spark_jobs.io.filesystem import S3FileIO, resolve
from spark_jobs.table.action.transaction import Transaction
from spark_jobs.table.heartbeat import Heartbeat
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action
from tests.oracle import reduce_batches, rows_by_identity

PARTS = ["eu west/1", "sã%o+paulo", "東京 +%"]
BUCKETS = 4
KEYS = [f"k{i:03d} /%+é" for i in range(200)]


def batch(ts: int, *, only: list[int] | None = None) -> list[dict[str, Any]]:
    """200 rows (or the ``only`` ones): every key in one of 3 partitions, so 3 x 4 file groups."""
    return [{"id": KEYS[i], "p": PARTS[i % 3], "ts": ts, "amount": None if i % 7 == 0 else float(i)}
            for i in (range(200) if only is None else only)]


def source(tmp_path, name: str, rows: list[dict[str, Any]]) -> str:
    path = str(tmp_path / f"{name}.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def counted(server, *argv: str) -> tuple[dict[str, int], list[list[str]]]:
    """Run one CLI verb in-process; the requests it made, by kind, and their log."""
    server.reset_counts()
    with contextlib.redirect_stdout(io.StringIO()):
        status = cli(list(argv))
    assert status == 0, argv
    got = server.requests()
    return {k: v for k, v in got["counts"].items() if v}, got["log"]


def history(table: Table, n: int) -> None:
    """``n`` completed commits through the real commit protocol, no file changed."""
    for i in range(n):
        txn = Transaction(table, Action.COMMIT, {"batch_id": f"history-{table.timeline.last_seq}-{i}"}).begin()
        txn.commit({"batch_id": f"history-{table.timeline.last_seq}-{i}", "index": {"added": []},
                    "file_groups": []})


def upsert_budget(*, file_groups: int, entries_since_checkpoint: int) -> dict[str, int]:
    """format.md §10's budget of a copy-on-write, bucket-index upsert through the CLI (Arrow engine)
    that touches ``file_groups`` file groups of small files, on a table with a checkpoint and
    ``entries_since_checkpoint`` entries after it, no pending instant, not itself checkpointing."""
    g, k = file_groups, entries_since_checkpoint
    opens = 3  # the CLI's table check, the engine's precheck, the upsert: each reads table.json + timeline
    return {
        # the table root (CLI); the slot below ours (archived?); per group: the base's size to read, the written size
        "HEAD": 2 + 2 * g,
        # per open: table.json, the checkpoint, the k entries after it; the batch ids; per group: the base (2 ranges)
        "GET": opens * (2 + k) + 1 + 2 * g,
        # per open: sequence/, checkpoints/, timeline/; 7 timeline reloads of 2; repair's markers/ and
        # heartbeats/; the root (CLI); this commit's markers (2); per group: the rollback check before and after
        "LIST": opens * 3 + 7 * 2 + 2 + 1 + 2 + 2 * g,
        # requested, heartbeat, inflight, the sequence entry; per group: its marker and its new base
        "PUT": 4 + 2 * g,
        # the markers (one DeleteObjects), the heartbeat
        "DELETE": 2,
    }


def test_upsert_costs_the_same_after_a_long_history_and_what_the_budget_says(s3, bucket, tmp_path):
    uri = f"{bucket}/orders"
    batches = [batch(1)]
    counted(s3, "upsert", uri, source(tmp_path, "b1", batches[0]), "--record-key", "id", "--precombine-field",
            "ts", "--partition-field", "p", "--index", "bucket", "--num-buckets", str(BUCKETS), "--table-type",
            "copy_on_write", "--engine", "arrow")  # the budget below is format.md §10's for copy-on-write
    table = Table.load(uri)

    def upsert(rows: list[dict[str, Any]]) -> dict[str, int]:
        batches.append(rows)
        counts, log = counted(s3, "upsert", uri, source(tmp_path, f"b{len(batches)}", rows), "--engine", "arrow")
        assert not [r for r in log if r[0] == "PUT" and r[1].endswith("/")], "a directory marker was written"
        return counts

    # N1 = 14 and N2 = 74 commits of history, the same place in the checkpoint interval (10): the
    # measured upsert is entry 15, then 75; by 75 checkpoints 10..70 exist and archival ran at 40 and 70
    history(table, 14 - table.timeline.reload().last_seq)
    short = upsert(batch(14))
    # the budget's per-file-group and per-entry terms: one partition's 4 groups, one entry more since the checkpoint
    assert upsert(batch(15, only=list(range(0, 200, 3)))) == upsert_budget(file_groups=BUCKETS,
                                                                           entries_since_checkpoint=5)
    history(table, 74 - table.timeline.reload().last_seq)
    long = upsert(batch(74))
    tl = Table.load(uri).timeline
    assert len(tl.archives()) >= 2 and tl.base_seq == 70 and tl.last_seq == 75, (tl.archives(), tl.base_seq)
    assert short == long, (short, long)
    assert long == upsert_budget(file_groups=len(PARTS) * BUCKETS, entries_since_checkpoint=4)
    want = reduce_batches(batches, partition="p", delete_field=None)
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition="p") == want
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli(["validate", uri, "--engine", "arrow"]) == 0


def test_no_directory_markers_batched_deletes_and_no_head_per_delta_in_a_session_of_every_verb(
        s3, bucket, tmp_path):
    """A merge-on-read, record-index table through every verb: no directory marker anywhere;
    ``clean`` deletes its K files in ceil(K / 1000) requests and sizes them without a HEAD
    each; ``show`` sizes the index deltas without a HEAD each."""
    uri = f"{bucket}/orders"
    logs: dict[str, list[list[str]]] = {}
    b1 = batch(1, only=list(range(0, 120)))
    b2 = batch(2, only=list(range(0, 200, 2)))  # updates, and new keys: index deltas
    argvs = [
        ["upsert", uri, source(tmp_path, "b1", b1), "--record-key", "id", "--precombine-field", "ts",
         "--partition-field", "p", "--table-type", "merge_on_read", "--num-buckets", "2", "--engine", "arrow"],
        ["upsert", uri, source(tmp_path, "b2", b2), "--engine", "arrow"],
        ["show", uri],
        ["read", uri, "--engine", "arrow", "--output", f"{bucket}/out/read.parquet"],
        ["compact", uri, "--engine", "arrow"],
        ["clean", uri, "--retain-commits", "1"],
        ["validate", uri, "--engine", "arrow"],
        ["rollback", uri],
        ["shadow-compare", uri, "--engine", "arrow"],
    ]
    for argv in argvs:
        logs[argv[0]] = logs.get(argv[0], []) + counted(s3, *argv)[1]
    every = [r for log in logs.values() for r in log]
    assert not [r for r in every if r[0] == "PUT" and r[1].endswith("/")], "a directory marker was written"
    keys = [o["Key"] for page in s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket[5:])
            for o in page.get("Contents", [])]
    assert keys and not [k for k in keys if k.endswith("/")]

    assert not [r for r in logs["show"] if r[0] == "HEAD" and "/.bucketindex/index/" in r[1]], logs["show"]

    table = Table.load(uri)
    done = table.timeline.last_completed([Action.CLEAN])
    assert done is not None
    k = table.timeline.read_metadata(done)["counts"]["files"]
    assert k >= 2  # the compacted logs and bases, the folded index deltas: more than one file, one request
    assert len([r for r in logs["clean"] if r[0] == "POST" and "delete" in r[2]]) == math.ceil(k / 1000)
    assert not [r for r in logs["clean"] if r[0] == "DELETE" and "/.bucketindex/" not in r[1]], \
        "a data file deleted on its own"
    assert not [r for r in logs["clean"] if r[0] == "HEAD" and r[1].endswith((".parquet", ".arrow"))], \
        "a HEAD per file to size it"
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches([b1, b2], delete_field=None)


def test_delete_many_is_one_request_per_1000_keys(s3, bucket):
    io_, root = resolve(f"{bucket}/many")
    assert isinstance(io_, S3FileIO)
    paths = [f"{root}/f {i:04d} %+é.parquet" for i in range(2001)]
    for p in paths[::1000]:
        io_.write_bytes(p, b"x")
    s3.reset_counts()
    io_.delete_many(paths)
    assert s3.counts() == {"DELETE": 3}  # ceil(2001 / 1000)
    assert io_.list_names(root) == []


def test_a_heartbeat_is_one_put(s3, bucket):
    table = Table.open(f"{bucket}/orders")
    s3.reset_counts()
    beat = Heartbeat(table.io, table.layout, "20261126093000000")
    beat.beat()
    beat.beat()
    assert [r[0] for r in s3.requests()["log"]] == ["PUT", "PUT"]
    assert table.io.read_bytes(table.layout.heartbeat_file("20261126093000000")).startswith(b"{")
    s3.reset_counts()
    beat.stop(delete=True)
    assert s3.counts() == {"DELETE": 1} and not table.io.exists(table.layout.heartbeat_file("20261126093000000"))
