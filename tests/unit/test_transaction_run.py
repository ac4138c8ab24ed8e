"""``Transaction.run``: the one retry policy of every action, on the pure-Python core (no Spark).

A writer's attempt writes a data file under its instant's markers and returns the commit
metadata; concurrent writers are plain transactions committed from inside the attempt, so
every race here is deterministic: a conflict and a retry on the new snapshot, giving up
after ``max_retries`` (exit 3, a note for ``show``, nothing left behind), a batch already
applied by another writer, a failure in the attempt, and a rollback of the instant by
another process. Resumed table services go through the same loop and keep their plan.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.exceptions import ConflictError, InstantRolledBackError, RetryableError
from spark_jobs.table.action import service
from spark_jobs.table.action.rollback import rollback
from spark_jobs.table.action.transaction import Committed, Transaction
from spark_jobs.table.config import TableConfig
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.describe import describe
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action, State
from spark_jobs.table.view import FileSystemView, encode_schema

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("id", pa.string()), ("v", pa.int64()), ("_bi_key", pa.string())])


def new_table(tmp_path: Path) -> Table:
    t = Table.open(str(tmp_path / "t"))
    t.create(TableConfig(record_key_fields=["id"], num_buckets=2))
    return t


def write_file(t: Table, ts: str, fid: str, v: int, token: str = "") -> str:
    """One data file of ``ts`` under its marker (what an engine's task does)."""
    rel = f"{fid}_{token or '0-0-0'}_{ts}_{v}.parquet"
    t.create_marker(ts, rel)
    pq.write_table(pa.table({"id": [fid], "v": [v], "_bi_key": [fid]}, schema=SCHEMA), t.abs(rel))
    return rel


def meta(batch_id: str | None, fid: str, rel: str, retries: list | None = None) -> dict:
    return {"batch_id": batch_id, "schema": encode_schema(SCHEMA), "index": {"added": []},
            "file_groups": [{"partition": "", "file_id": fid, "path": rel, "num_rows": 1}],
            "conflicts": list(retries or [])}


def concurrent_commit(uri: str, fid: str, batch_id: str, v: int) -> str:
    """Another writer (another process as far as the protocol knows) commits to ``fid``."""
    t = Table.load(uri)
    txn = Transaction(t, Action.COMMIT, {"batch_id": batch_id}).begin()
    txn.commit(meta(batch_id, fid, write_file(t, txn.ts, fid, v)))
    return txn.ts


def no_trace(t: Table, ts: str, files: list[str]) -> None:
    """Nothing of the aborted instant ``ts`` is left: its files, markers, heartbeat and plan."""
    for rel in files:
        assert not os.path.exists(t.abs(rel)), rel
    assert t.marked_files(ts) == []
    assert not os.path.exists(t.layout.heartbeat_file(ts))
    tl = Table.load(t.uri).timeline.reload()
    assert tl.pending() == [] and not tl.is_completed(ts)


def test_success_the_first_time(tmp_path):
    t = new_table(tmp_path)
    txn = Transaction(t, Action.COMMIT, {"batch_id": "b1"})
    seen: list[FileSystemView] = []

    def attempt(view: FileSystemView, retries: list) -> dict:
        seen.append(view)
        return meta("b1", "fg1", write_file(t, txn.ts, "fg1", 1), retries)

    done = txn.run(attempt, max_retries=3, batch_id="b1")
    assert isinstance(done, Committed) and done.retries == [] and done.applied_by is None
    assert done.instant is not None and done.instant.state == State.COMPLETED and done.instant.timestamp == txn.ts
    assert done.metadata["batch_id"] == "b1" and len(seen) == 1 and seen[0].seq == 0
    fresh = Table.load(t.uri)
    assert fresh.commit_for_batch("b1").timestamp == txn.ts
    assert read_arrow(t.uri).to_pylist() == [{"id": "fg1", "v": 1}]
    assert fresh.timeline.pending() == [] and fresh.marked_files(txn.ts) == []
    assert not os.path.exists(t.layout.heartbeat_file(txn.ts))


def test_a_conflict_then_success_on_the_new_snapshot(tmp_path):
    t = new_table(tmp_path)
    txn = Transaction(t, Action.COMMIT, {"batch_id": "mine"})
    calls: list[tuple[int, list]] = []
    written: list[str] = []
    other: list[str] = []

    def attempt(view: FileSystemView, retries: list) -> dict:
        calls.append((view.seq, [dict(r) for r in retries]))
        rel = write_file(t, txn.ts, "fg1", 10 + len(calls))
        written.append(rel)
        if len(calls) == 1:  # another writer rewrites the same file group meanwhile
            other.append(concurrent_commit(t.uri, "fg1", "theirs", 5))
        return meta("mine", "fg1", rel, retries)

    done = txn.run(attempt, max_retries=2, batch_id="mine")
    assert done.instant is not None and done.instant.timestamp == txn.ts
    record = {"attempt": 1, "with": other[0], "with_action": Action.COMMIT,
              "reason": "1 file group(s) written by both, e.g. fg1"}
    assert done.retries == [record]
    # the retry saw the new snapshot (the other commit) and the conflicts so far
    assert calls == [(0, []), (1, [record])]
    assert done.metadata["conflicts"] == [record]
    assert Table.load(t.uri).timeline.read_metadata(done.instant)["conflicts"] == [record]
    assert not os.path.exists(t.abs(written[0])), "rebase deleted the first attempt's file"
    assert read_arrow(t.uri).to_pylist() == [{"id": "fg1", "v": 12}]
    assert [c.instant for c in txn.conflicts] == other


@pytest.mark.parametrize("batch_id,again", [("mine", "retry with the same batch id"),
                                            (None, "run the upsert again")])
def test_gives_up_after_max_retries_with_a_note_and_nothing_left(tmp_path, batch_id, again):
    t = new_table(tmp_path)
    txn = Transaction(t, Action.COMMIT, {"batch_id": batch_id})
    written: list[str] = []

    def attempt(view: FileSystemView, retries: list) -> dict:
        rel = write_file(t, txn.ts, "fg1", len(written))
        written.append(rel)
        concurrent_commit(t.uri, "fg1", f"theirs-{len(written)}", 100 + len(written))  # every time
        return meta(batch_id, "fg1", rel, retries)

    with pytest.raises(ConflictError) as e:
        txn.run(attempt, max_retries=1, batch_id=batch_id, what="the upsert")
    assert isinstance(e.value, RetryableError)
    msg = str(e.value)
    assert msg.startswith("conflict: 1 file group(s) written by both, e.g. fg1 (concurrent commit ")
    assert msg.endswith(f"; gave up after 2 attempts (--max-retries 1); nothing was written, {again}"), msg
    assert len(written) == 2 and len(txn.conflicts) == 2
    no_trace(t, txn.ts, written)
    # the note `show` lists
    assert os.path.exists(t.layout.conflict_file(txn.ts))
    noted = describe(Table.load(t.uri))["conflicts"]
    assert [(c["instant"], c["batch_id"]) for c in noted] == [(txn.ts, batch_id)]
    assert read_arrow(t.uri).to_pylist() == [{"id": "fg1", "v": 102}]  # the other writer's


def test_already_applied_by_a_concurrent_writer(tmp_path):
    t = new_table(tmp_path)
    txn = Transaction(t, Action.COMMIT, {"batch_id": "hourly-7"})
    written: list[str] = []
    theirs: list[str] = []

    def attempt(view: FileSystemView, retries: list) -> dict:
        written.append(write_file(t, txn.ts, "fg2", 1))
        theirs.append(concurrent_commit(t.uri, "fg1", "hourly-7", 1))  # the same batch, by another writer
        return meta("hourly-7", "fg2", written[-1], retries)

    done = txn.run(attempt, max_retries=3, batch_id="hourly-7")
    assert done == Committed(None, {}, [], applied_by=theirs[0])
    no_trace(t, txn.ts, written)
    assert Table.load(t.uri).commit_for_batch("hourly-7").timestamp == theirs[0]


def test_a_failing_attempt_aborts_the_instant(tmp_path):
    t = new_table(tmp_path)
    txn = Transaction(t, Action.COMMIT, {"batch_id": "b"})
    written: list[str] = []

    def attempt(view: FileSystemView, retries: list) -> dict:
        written.append(write_file(t, txn.ts, "fg1", 1))
        raise ValueError("a task failed")

    with pytest.raises(ValueError, match="a task failed"):
        txn.run(attempt, max_retries=3, batch_id="b")
    no_trace(t, txn.ts, written)
    assert not os.path.exists(t.layout.conflict_file(txn.ts)), "a failure is no conflict"
    assert read_arrow(t.uri).num_rows == 0


def test_a_failure_after_a_conflict_still_aborts(tmp_path):
    t = new_table(tmp_path)
    txn = Transaction(t, Action.COMMIT, {"batch_id": "b"})
    written: list[str] = []

    def attempt(view: FileSystemView, retries: list) -> dict:
        written.append(write_file(t, txn.ts, "fg1", len(written)))
        if retries:
            raise OSError("disk full")
        concurrent_commit(t.uri, "fg1", "theirs", 9)
        return meta("b", "fg1", written[-1], retries)

    with pytest.raises(OSError, match="disk full"):
        txn.run(attempt, max_retries=3, batch_id="b")
    no_trace(t, txn.ts, written)


def test_rolled_back_by_another_process_while_writing(tmp_path):
    t = new_table(tmp_path)
    txn = Transaction(t, Action.COMMIT, {"batch_id": "b"})
    written: list[str] = []

    def attempt(view: FileSystemView, retries: list) -> dict:
        written.append(write_file(t, txn.ts, "fg1", 1))
        rollback(Table.load(t.uri), txn.ts, force=True)  # `bucketindex rollback --force` from elsewhere
        raise RuntimeError("task failed: instant was rolled back while this task wrote")  # what a task then says

    with pytest.raises(InstantRolledBackError) as e:
        txn.run(attempt, max_retries=3, batch_id="b")
    assert str(e.value) == (f"conflict: instant {txn.ts} was rolled back by another process while it was writing; "
                            f"nothing was written")
    assert isinstance(e.value.__cause__, RuntimeError)
    for rel in written:
        assert not os.path.exists(t.abs(rel))
    assert Table.load(t.uri).timeline.reload().pending() == []


def test_rolled_back_before_the_commit_point(tmp_path):
    t = new_table(tmp_path)
    txn = Transaction(t, Action.COMMIT, {"batch_id": "b"})
    written: list[str] = []

    def attempt(view: FileSystemView, retries: list) -> dict:
        written.append(write_file(t, txn.ts, "fg1", 1))
        rollback(Table.load(t.uri), txn.ts, force=True)
        return meta("b", "fg1", written[-1], retries)

    with pytest.raises(InstantRolledBackError) as e:
        txn.run(attempt, max_retries=3, batch_id="b")
    assert f"instant {txn.ts} was rolled back by another process" in str(e.value)
    assert not os.path.exists(t.abs(written[0]))
    tl = Table.load(t.uri).timeline.reload()
    assert not tl.is_completed(txn.ts) and tl.pending() == []


# -- table services: a resumed plan goes through the same loop and keeps its plan ----------
def _compaction_plan(t: Table, fid: str) -> str:
    return service.schedule(t, Action.COMPACTION, {"file_groups": [{"partition": "", "file_id": fid}],
                                                   "index_buckets": [], "snapshot_seq": t.view().seq}).timestamp


def _compacting(t: Table, fid: str, written: list[str], fail: BaseException | None = None):  # type: ignore[no-untyped-def]
    def run(txn: Transaction) -> dict:
        assert txn.attempt
        rel = write_file(t, txn.ts, fid, 7, token=txn.attempt)
        written.append(rel)
        if fail is not None:
            raise fail
        return {"action": Action.COMPACTION, "instant": txn.ts, "operation": "compaction", "index": {"added": []},
                "file_groups": [{"partition": "", "file_id": fid, "path": rel, "size": 1, "compacted_logs": []}],
                "counts": {"file_groups": 1}}
    return run


def test_a_resumed_service_keeps_its_plan_when_an_attempt_fails(tmp_path):
    t = new_table(tmp_path)
    concurrent_commit(t.uri, "fg1", "b0", 1)
    planned = _compaction_plan(t, "fg1")
    written: list[str] = []
    with pytest.raises(ValueError, match="executor lost"):
        service.execute(Table.load(t.uri), planned, Action.COMPACTION,
                        _compacting(t, "fg1", written, ValueError("executor lost")))
    assert not os.path.exists(t.abs(written[0])), "the failed attempt's own file is deleted"
    tl = Table.load(t.uri).timeline.reload()
    assert [i.timestamp for i in tl.pending()] == [planned], "the plan stays for the next attempt"
    done = service.execute(Table.load(t.uri), planned, Action.COMPACTION, _compacting(t, "fg1", written))
    assert not done.noop and Table.load(t.uri).timeline.is_completed(planned)
    assert Table.load(t.uri).view().file_groups[("", "fg1")].path == written[1]


def test_a_service_whose_commit_conflicts_is_cancelled_and_retryable(tmp_path):
    t = new_table(tmp_path)
    concurrent_commit(t.uri, "fg1", "b0", 1)
    first, second = _compaction_plan(t, "fg1"), _compaction_plan(t, "fg1")
    written: list[str] = []
    real = _compacting(t, "fg1", written)

    def racing(txn: Transaction) -> dict:  # the first plan completes while the second runs
        service.execute(Table.load(t.uri), first, Action.COMPACTION, _compacting(t, "fg1", []))
        return real(txn)

    with pytest.raises(ConflictError) as e:
        service.execute(Table.load(t.uri), second, Action.COMPACTION, racing)
    assert str(e.value) == (f"conflict: 1 file group(s) written by both, e.g. fg1 (concurrent compaction {first}); "
                            f"compaction {second} was cancelled, schedule a new one")
    assert not os.path.exists(t.abs(written[0]))
    tl = Table.load(t.uri).timeline.reload()
    assert tl.is_completed(first) and second in tl.aborted and tl.pending() == []


def test_a_service_rolled_back_while_it_ran_is_a_conflict(tmp_path):
    t = new_table(tmp_path)
    concurrent_commit(t.uri, "fg1", "b0", 1)
    planned = _compaction_plan(t, "fg1")
    written: list[str] = []
    real = _compacting(t, "fg1", written)

    def cancelled_meanwhile(txn: Transaction) -> dict:
        rollback(Table.load(t.uri), txn.ts, force=True)  # what a concurrent rehash does to the plan
        return real(txn)

    with pytest.raises(ConflictError, match=f"compaction {planned} was cancelled .* while it ran"):
        service.execute(Table.load(t.uri), planned, Action.COMPACTION, cancelled_meanwhile)
    assert not os.path.exists(t.abs(written[0]))
    assert Table.load(t.uri).timeline.reload().pending() == []
