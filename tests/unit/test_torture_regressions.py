"""Regression tests made from the torture test's shrunk divergences (issue 27).

**A row decided as a no-op on a stale snapshot commits after the write that made it matter.**
Shrunk from ``benchmarks/torture.py --seed 11`` (sequence seed 1336635198): three racing
writers on a copy-on-write record-index table; one inserts key ``50%`` (ts 3), another deletes
it (ts 10). The deleting writer planned on a snapshot without the key, so its delete was a
delete of an absent key: no index entry, no file group rewritten, so nothing of it enters the
conflict check (format.md §4.5: file groups and index deltas). It commits after the insert,
and the table keeps the key, while the sequence -- insert, then delete -- says it is gone: the
table is no longer the replay of its commits in sequence order (§4.1). The same hole exists for
a row dropped as stale against the snapshot (its key deleted by a concurrent commit: replayed
in order, the stale row is a re-insert after the delete).

Here writer B (a CLI process) takes its snapshot and pauses right after writing its plan;
writer A commits in this process meanwhile; then B resumes, checks the entries since its
snapshot and commits. Whatever B does, the table must equal the batches applied in the
order the timeline lists them: B may conflict and retry (re-tagging on A's snapshot) or
fail with exit 3, not commit a decision A invalidated.

The fix: a commit records what it decided without writing (``reads``: record index ``read``
files of those keys' fingerprints, the bucket index's file groups, global_simple's groups and
absent-key flag; ``spark_jobs.table.action.upsert.read_set``), and ``find_conflict`` treats a
concurrent write of it as a conflict (format.md §4.5). Per index type and on Spark:
``tests/unit/test_conflict_reads.py``, ``tests/spark/test_conflict_reads_spark.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.cli import main as cli_main
from spark_jobs.table import Action, Table
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from tests.harness import torture
from tests.harness.torture import run_sequence
from tests.oracle import reduce_batches, rows_by_identity

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64()), ("is_deleted", pa.bool_())])


def _batch(path: Path, rows: list[tuple]) -> str:
    pq.write_table(pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA), path)
    return str(path)


def _opts(uri: str, src: str, batch_id: str) -> UpsertOptions:
    return UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
                         index="record", num_buckets=1, delete_field="is_deleted", batch_id=batch_id)


CASES = {
    # the key is absent from B's snapshot: B's delete (ts 10) does nothing; A inserts it (ts 3)
    "delete-of-absent-key": ([("other", "eu west", 1, False)],
                             [("50%", "日本", 3, False)],
                             [("50%", None, 10, True)]),
    # B's row (ts 4) is stale against the stored ts 5; A deletes the key (ts 9): replayed in
    # commit order, B's row is a re-insert after the delete
    "stale-row-vs-delete": ([("k 1/+", "eu west", 5, False), ("other", "eu west", 1, False)],
                            [("k 1/+", "eu west", 9, True)],
                            [("k 1/+", "são paulo", 4, False)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_no_op_decided_on_an_old_snapshot_does_not_commit_after_the_write_that_changed_it(tmp_path, case):
    base, a_rows, b_rows = CASES[case]
    uri = str(tmp_path / "t")
    run_upsert(_opts(uri, _batch(tmp_path / "base.parquet", base), "base"))
    signals = tmp_path / "signals"
    b_src = _batch(tmp_path / "b.parquet", b_rows)
    b = subprocess.Popen([sys.executable, "-m", "spark_jobs.cli", "upsert", uri, b_src, "--record-key", "id",
                          "--precombine-field", "ts", "--partition-field", "region", "--delete-field", "is_deleted",
                          "--batch-id", "B", "--engine", "arrow"],
                         env={**os.environ, "BUCKETINDEX_PAUSE": "after_requested=3",
                              "BUCKETINDEX_PAUSE_SIGNAL": str(signals)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (signals / "after_requested").exists():
        assert b.poll() is None, b.stderr.read() if b.stderr else ""
        assert time.monotonic() < deadline, "writer B never reached its plan"
        time.sleep(0.05)
    started = time.monotonic()
    run_upsert(_opts(uri, _batch(tmp_path / "a.parquet", a_rows), "A"))  # commits while B sleeps
    assert time.monotonic() - started < 3, "A must commit inside B's pause for this race"
    _, err = b.communicate(timeout=120)
    assert b.returncode in (0, 3), err[-2000:]

    tl = Table.load(uri).timeline.reload()
    order = [tl.read_metadata(i)["batch_id"] for i in tl.completed([Action.COMMIT])]
    batches = {"base": base, "A": a_rows, "B": b_rows}
    as_dicts = [[dict(zip(SCHEMA.names, r)) for r in batches[bid]] for bid in order]
    assert order[:2] == ["base", "A"] and (order[2:] == ["B"] if b.returncode == 0 else order[2:] == [])
    expected = reduce_batches(as_dicts)
    assert rows_by_identity(read_arrow(uri).to_pylist()) == expected, f"commit order {order}"
    assert run_validate(uri)["ok"]


def test_two_processes_finishing_the_same_interrupted_rollback_both_succeed(tmp_path):
    """**A writer failed finishing a rollback another writer had just finished.** Found by the
    1,000-sequence run (``benchmarks/torture.py --seed 1126``, sequence 654, seed 287601702):
    racing writers each start with ``rollback`` of abandoned instants, which first finishes
    interrupted rollbacks (``rollback.repair``). Two writers found the same pending rollback;
    one claimed its decision (the rollback's entry), the other then saw the target aborted and
    tried to delete the rollback's plan as a redundant one -- but it was the very rollback now
    completed, so ``delete_pending`` refused and the upsert exited 1 with nothing written.

    Here the second process is replayed in order: a pending commit without a writer, a rollback
    of it planned and interrupted before its decision, process A's repair deciding it, then
    process B's repair of the same rollback, found pending before A's decision."""
    from spark_jobs.table.action.rollback import _decide_and_clean, repair

    uri = str(tmp_path / "t")
    run_upsert(_opts(uri, _batch(tmp_path / "b0.parquet", [("k 1/+", "eu west", 1, False)]), "b0"))
    table = Table.load(uri)
    tl = table.timeline
    abandoned = tl.create_requested(Action.COMMIT, {"batch_id": "lost"})
    plan = {"target": abandoned.timestamp, "target_action": Action.COMMIT, "files": []}
    rb = tl.create_requested(Action.ROLLBACK, plan)  # its process died before deciding
    stale = Table.load(uri)  # process B: lists the rollback as pending
    assert [i.timestamp for i in stale.timeline.reload().pending([Action.ROLLBACK])] == [rb.timestamp]
    repair(Table.load(uri))  # process A finishes it: the decision is its entry
    after_a = Table.load(uri).timeline.reload()
    assert after_a.is_completed(rb.timestamp) and abandoned.timestamp in after_a.aborted
    assert _decide_and_clean(stale, rb, plan)  # process B: the same rollback, decided
    final = Table.load(uri).timeline.reload()
    assert final.is_completed(rb.timestamp) and final.last_seq == after_a.last_seq  # one decision, kept
    assert not final.pending() and rows_by_identity(read_arrow(uri).to_pylist())["k 1/+"]["ts"] == 1
    assert run_validate(uri)["ok"]


def test_an_upsert_tags_keys_beside_a_group_compacted_to_nothing(tmp_path):
    """**The Arrow engine failed to tag a batch on a global_simple table holding an empty base.**
    Found by the 1,000-sequence run of the mirror generator (``benchmarks/torture.py --seed
    1128``, sequence 150, seed 1816365525): on a merge-on-read table, a key deleted through a
    log and the group then compacted leaves an empty base (compaction keeps the group for later
    logs: ``spark_jobs.kernels.tasks.compact_slices``). global_simple tags a batch by reading every
    live key of the snapshot, and that file yields no batch of keys, so
    ``pa.Table.from_batches([])`` raised ``ValueError: Must pass schema, or at least one
    RecordBatch`` and every later upsert of the table failed on the Arrow engine (Spark's
    ``mapInArrow`` takes an empty output). Shrunk to its 4 steps, without the race it came with."""
    row = {"amount": "1.00", "at": None, "note": "plain", "region": "日本"}
    seq = {"seed": 1816365525, "settings": {"table_type": "merge_on_read", "index": "global_simple",
                                            "partitioned": True, "num_buckets": 1, "checkpoint_interval": 10,
                                            "target_file_rows": 5},
           "steps": [{"op": "upsert", "via": "api", "batch_id": "b001", "zone": "Asia/Tokyo",
                      "rows": [dict(row, id="k20", ts=5, is_deleted=False)]},
                     {"op": "upsert", "via": "api", "batch_id": "b002", "zone": "UTC",
                      "rows": [dict(row, id="k20", ts=9, is_deleted=True)]},
                     {"op": "compact", "phase": "execute", "only": "data", "min": 1, "kill": None},
                     {"op": "upsert", "via": "api", "batch_id": "b004", "zone": "UTC",
                      "rows": [dict(row, id="k14", ts=10, is_deleted=False),
                               dict(row, id="ключ", ts=7, is_deleted=False, region="é" * 110)]}]}
    run_sequence(seq, tmp_path / "run")  # the oracle, validate, shadow-compare, time travel after each step

    # the same steps, inspected: the compaction leaves an empty base, the next upsert tags beside it
    uri = str(tmp_path / "t")

    def up(bid: str, rows: list[tuple]) -> None:
        run_upsert(UpsertOptions(table=uri, source=_batch(tmp_path / f"{bid}.parquet", rows), record_key=["id"],
                                 precombine_field="ts", partition_field="region", index="global_simple",
                                 table_type="merge_on_read", delete_field="is_deleted", batch_id=bid))

    up("b1", [("k20", "日本", 5, False)])
    up("b2", [("k20", "日本", 9, True)])
    assert cli_main(["compact", uri, "--engine", "arrow", "--min-logs", "1", "--only", "data"]) == 0
    table = Table.load(uri)
    assert [pq.ParquetFile(table.abs(s.path)).metadata.num_rows for s in table.view().slices()] == [0]
    up("b3", [("k14", "日本", 10, False), ("ключ", "é" * 110, 7, False)])
    assert sorted(r["id"] for r in read_arrow(uri).to_pylist()) == ["k14", "ключ"]
    assert run_validate(uri)["ok"]


def _mirrored_repair_then_kill(point: str) -> dict:
    """A mirrored table; an alter killed after its plan (pending, its writer gone); an upsert
    killed at ``point``: it first rolls the alter back (a sequence entry with its Delta version)."""
    row = {"amount": "9904150.83", "at": "2024-03-31T01:38:00.744513+00:00", "note": "ünï"}
    return {"seed": 1257956465, "settings": {"table_type": "copy_on_write", "index": "record", "partitioned": True,
                                             "num_buckets": 1, "checkpoint_interval": 10, "target_file_rows": 100,
                                             "mirror": "delta"},
            "steps": [{"op": "upsert", "via": "api", "batch_id": "b001", "zone": "America/New_York",
                       "rows": [dict(row, id="k22", ts=0, is_deleted=True, region="x+y")]},
                      {"op": "alter", "kill": "after_requested"},
                      {"op": "upsert", "via": "kill", "batch_id": "b006", "zone": "Asia/Kolkata",
                       "rows": [dict(row, id="k07", ts=17, is_deleted=False, region="__NULL__")], "kill": point},
                      {"op": "upsert", "via": "api", "batch_id": "b007", "zone": "UTC",
                       "rows": [dict(row, id="k 1/%", ts=3, is_deleted=False, region="a/b")]}]}


@pytest.mark.parametrize("point", ["after_commit_before_mirror", "after_rollback_before_mirror"])
def test_a_kill_after_the_commit_means_the_writers_own_commit(tmp_path, point):
    """**A writer killed "after its commit, before its Delta version" had not committed.** Found
    by the 1,000-sequence run of the mirror generator (``--seed 1128``, sequence 218, seed
    1257956465), shrunk to 3 steps: the writer first rolled back a pending alter, and since
    ddf1241 a rollback's decision writes its Delta version through the same post-commit hook --
    with the same crash point, so the kill fired in the repair, before the writer's own commit,
    and the harness found its batch missing ("write lost"). Nothing was lost (the log lagged one
    version until the next write, as after any such kill), but a fault point must name one
    place: a rollback's hook now has its own, ``after_rollback_before_mirror``. Killed at the
    commit hook's point the batch is visible; killed at the rollback's it is not, and the next
    writer fills the Delta log's gap (the harness checks versions 0..k and each against the
    oracle after every step)."""
    counts = torture.Counts()
    run_sequence(_mirrored_repair_then_kill(point), tmp_path / "run", counts=counts)
    assert counts.kills == 2 and counts.steps == 4
