"""A Spark writer's decisions without writing are in its conflict check (format.md §4.5, issue 27).

tests/unit/test_conflict_reads.py on the Arrow engine, with writer B on Spark (the session's
``spark``): its routing reports deletes of absent keys and stale moves, its merge tasks the rows
dropped in their groups; A (Arrow) commits inside B's window. Each race must end with B retried
once and the table equal to the batches replayed in commit order.
"""

from __future__ import annotations

import pytest

from spark_jobs.jobs.upsert import run_upsert as spark_upsert
from spark_jobs.table import Action, Table
from spark_jobs.table.action import upsert as action_upsert
from tests.unit import test_conflict_reads as arrow_case

pytestmark = pytest.mark.spark

#: (index, base, A's batch, B's batch, keys B's final commit decided without writing). The
#: record race is the absent-key delete (decided when routed); B's batch also moves a key
#: with a stale row, which stays decided on A's snapshot: B's final ``read`` file holds it.
#: The bucket race is the stale row vs a delete, dropped by its merge-on-read group's merge.
CASES = [
    ("record", [("other", arrow_case.EU, 1, False), ("mover", arrow_case.EU, 5, False)],
     [(arrow_case.K, arrow_case.EU, 3, False)],
     [(arrow_case.K, arrow_case.EU, 10, True), ("mover", arrow_case.SP, 4, False)], 1),
    ("bucket", *arrow_case.RACES["stale-row-vs-delete"]["bucket"], 0),
]


def test_a_spark_writer_decides_again_after_a_concurrent_write_overturned_its_decision(spark, tmp_path, monkeypatch):
    for index, base, a_rows, b_rows, still_decided in CASES:
        d = tmp_path / index
        d.mkdir()
        uri = str(d / "t")
        arrow_case.run_upsert(arrow_case._opts(uri, d / "base.parquet", base, "base", index))
        a_opts = arrow_case._opts(uri, d / "a.parquet", a_rows, "A", index)
        real = action_upsert.maybe_crash
        fired: list[str] = []

        def interleave(point: str, a_opts=a_opts, fired=fired, real=real) -> None:
            if point == "before_complete" and not fired:
                fired.append(point)
                arrow_case.run_upsert(a_opts)  # commits between B's snapshot and B's conflict check
            real(point)

        monkeypatch.setattr(action_upsert, "maybe_crash", interleave)
        result = spark_upsert(spark, arrow_case._opts(uri, d / "b.parquet", b_rows, "B", index))
        monkeypatch.undo()
        assert fired and result["retries"] == 1, (index, result)
        arrow_case._check_commit_order(uri, {"base": base, "A": a_rows, "B": b_rows}, index)
        tl = Table.load(uri).timeline
        reads = tl.read_metadata(tl.completed([Action.COMMIT])[-1]).get("reads", {})
        assert sum(f["entries"] for f in reads.get("index", [])) == still_decided, reads
