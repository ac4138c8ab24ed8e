"""What a writer decides without writing is in its conflict check (format.md §4.5, issue 27).

Writer B decides rows on its snapshot that write nothing: a delete of a key the snapshot does
not hold, a row dropped as stale against its stored row. Writer A commits a write of that key
after B's snapshot and before B's commit. B must conflict, re-decide on A's snapshot and
commit a table equal to the batches replayed in commit order -- per index type, on the Arrow
engine. A write of an unrelated key meanwhile must not make B conflict.

The interleaving is exact and in-process: B's ``before_complete`` fault point (its files are
written, its conflict check not run) runs A's whole upsert once. That is the window of two
writer processes, without their start-up (tests/unit/test_torture_regressions.py races two
processes; tests/spark/test_conflict_reads_spark.py puts a Spark writer in B's place).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.table import Action, Table
from spark_jobs.table.action import upsert as action_upsert
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from tests.oracle import reduce_batches, rows_by_identity

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64()), ("is_deleted", pa.bool_())])
K = "50% k/+ é"  # the contested key
EU, SP = "eu west", "são paulo/日本"

#: one bucket: the bucket index's contested key shares its group with the stored rows (whose
#: merge-on-read slice then gets no log from B), as a larger table's keys do
#: index -> table type: merge-on-read where a copy-on-write rewrite of the group would
#: already conflict (the bucket index's and global_simple's in-place rows), so the read set is what is tested
TYPES = {"record": "copy_on_write", "bucket": "merge_on_read", "global_simple": "merge_on_read"}

#: race -> (base, A's batch, B's batch) per index. The stale row of the global indexes moves
#: partitions (dropped when routed: an in-place one rewrites its group or, merge-on-read, is
#: left in a log for readers to drop, both in the write set); the bucket index's identity is
#: per partition: in place, dropped by its group's merge (merge-on-read: no log).
RACES: dict[str, dict[str, tuple[list[tuple], list[tuple], list[tuple]]]] = {
    "absent-delete-vs-insert": {
        ix: ([("other", EU, 1, False)], [(K, EU, 3, False)], [(K, EU, 10, True)]) for ix in TYPES},
    "stale-row-vs-delete": {
        "record": ([(K, EU, 5, False), ("other", EU, 1, False)], [(K, EU, 9, True)], [(K, SP, 4, False)]),
        "bucket": ([(K, EU, 5, False), ("other", EU, 1, False)], [(K, EU, 9, True)], [(K, EU, 4, False)]),
        "global_simple": ([(K, EU, 5, False), ("other", EU, 1, False)], [(K, EU, 9, True)], [(K, SP, 4, None)]),
    },
}

#: index -> (base, A's batch, B's batch) where A writes nothing B decided on
UNRELATED = {
    # a key B does not touch, in B's key's partition
    "record": ([("other", EU, 1, False)], [("new one", EU, 3, False)], [(K, EU, 10, True)]),
    # another partition: another file group than the one B's delete routes to
    "bucket": ([("other", EU, 1, False)], [(K, SP, 3, False)], [(K, EU, 10, True)]),
    # global_simple cannot tell added keys apart: B's decision here is a stale move, and A
    # writes another partition's group than the one holding the stored row
    "global_simple": ([(K, EU, 5, False), ("x", SP, 1, False)], [("x", SP, 2, False)], [(K, SP, 4, False)]),
}


def _rows(rows: list[tuple]) -> list[dict[str, Any]]:
    return [dict(zip(SCHEMA.names, r)) for r in rows]


def _opts(uri: str, path: Path, rows: list[tuple], batch_id: str, index: str) -> UpsertOptions:
    pq.write_table(pa.Table.from_pylist(_rows(rows), schema=SCHEMA), path)
    return UpsertOptions(table=uri, source=str(path), record_key=["id"], precombine_field="ts",
                         partition_field="region", index=index, num_buckets=1, table_type=TYPES[index],
                         delete_field="is_deleted", batch_id=batch_id)


def _race(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: str, base: list[tuple], a_rows: list[tuple],
          b_rows: list[tuple]) -> tuple[dict[str, Any], str]:
    """B upserts; at its first ``before_complete`` A upserts and commits. Returns B's result."""
    uri = str(tmp_path / "t")
    run_upsert(_opts(uri, tmp_path / "base.parquet", base, "base", index))
    a_opts = _opts(uri, tmp_path / "a.parquet", a_rows, "A", index)
    real = action_upsert.maybe_crash
    fired: list[str] = []

    def interleave(point: str) -> None:
        if point == "before_complete" and not fired:
            fired.append(point)
            run_upsert(a_opts)  # commits between B's snapshot and B's conflict check
        real(point)

    monkeypatch.setattr(action_upsert, "maybe_crash", interleave)
    result = run_upsert(_opts(uri, tmp_path / "b.parquet", b_rows, "B", index))
    assert fired, "A never ran inside B's window"
    return result, uri


def _check_commit_order(uri: str, batches: dict[str, list[tuple]], index: str) -> list[str]:
    tl = Table.load(uri).timeline.reload()
    order = [tl.read_metadata(i)["batch_id"] for i in tl.completed([Action.COMMIT])]
    assert order == ["base", "A", "B"]
    part = "region" if index == "bucket" else None
    expected = reduce_batches([_rows(batches[b]) for b in order], partition=part)
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition=part) == expected, f"commit order {order}"
    assert run_validate(uri)["ok"]
    return order


@pytest.mark.parametrize("index", sorted(TYPES))
@pytest.mark.parametrize("race", sorted(RACES))
def test_a_decision_a_concurrent_write_overturned_is_made_again(tmp_path, monkeypatch, index, race):
    base, a_rows, b_rows = RACES[race][index]
    result, uri = _race(tmp_path, monkeypatch, index, base, a_rows, b_rows)
    assert result["retries"] == 1, "B must conflict with A and decide again on A's snapshot"
    _check_commit_order(uri, {"base": base, "A": a_rows, "B": b_rows}, index)
    tl = Table.load(uri).timeline
    b_meta = tl.read_metadata(tl.completed([Action.COMMIT])[-1])
    # the read set's rule, not another one a copy-on-write rewrite of the group would trip
    reason = b_meta["conflicts"][0]["reason"]
    assert "without writing" in reason or "absent from its snapshot" in reason, reason


@pytest.mark.parametrize("index", sorted(TYPES))
def test_a_write_of_an_unrelated_key_does_not_conflict(tmp_path, monkeypatch, index):
    base, a_rows, b_rows = UNRELATED[index]
    result, uri = _race(tmp_path, monkeypatch, index, base, a_rows, b_rows)
    assert result["retries"] == 0, "a write of nothing B decided on is no conflict"
    _check_commit_order(uri, {"base": base, "A": a_rows, "B": b_rows}, index)
    tl = Table.load(uri).timeline
    reads = tl.read_metadata(tl.completed([Action.COMMIT])[-1]).get("reads")
    assert reads, "B decided a row without writing: its commit records it"
    if index == "record":  # its read file is under the table's index dir, not in any snapshot's index
        (f,) = reads["index"]
        assert f["kind"] == "read" and Table.load(uri).io.exists(Table.load(uri).layout.abs(f["path"]))
        assert f["path"] not in {p for files in Table.load(uri).view().index_files.values() for p in files}
