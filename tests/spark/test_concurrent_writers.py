"""Several writer processes on one table through the CLI, as overlapping DAG runs would be --
what Spark adds to tests/unit/test_arrow_concurrent_writers.py.

The protocol's scenarios (three writers overlapping then disjoint, ``rollback --force`` at
each point of a live writer) run there on the Arrow engine, with the same bodies this file
runs with Spark writers: a forced rollback (by the Airflow operator) of a live Spark writer
whose index write runs in a Spark task, and, in the extended tier, the other rollback points
and three Spark writers. Here also an Arrow writer races a Spark writer on one table: the
conflict rules hold across engines and the table equals the oracle.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.arrow_engine.validate import run_validate as arrow_validate
from spark_jobs.jobs.upsert import run_upsert
from spark_jobs.jobs.validate import run_validate
from spark_jobs.table import Action, Table
from spark_jobs.table.describe import describe
from spark_jobs.table.reader import read_arrow
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_arrow_concurrent_writers import (
    ARROW,
    SPARK,
    _base,
    _cli_upsert,
    _row,
    _wait_for,
    forced_rollback_of_a_live_writer,
    three_writers_overlapping_then_disjoint,
    write_batch,
)

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("index,table_type", [("record", "merge_on_read")])
def test_three_writers_overlapping_then_disjoint(spark, tmp_path, index, table_type):
    """Three Spark writer processes (the extended tier: tests/unit runs the same rounds on Arrow
    for every index and table type, and the race below has a Spark writer retry over an Arrow
    commit in the default tier). One case on Spark: the retry policy is the engine-neutral
    ``Transaction.run``; what is Spark's own is re-tagging and re-writing on the new snapshot,
    which merge-on-read exercises with its logs and index deltas (copy-on-write's rewrite of
    the same groups ran here too, 100 s a case, until the protocol moved out of the engines)."""
    three_writers_overlapping_then_disjoint(lambda o: run_upsert(spark, o), lambda u: run_validate(spark, u), SPARK,
                                            tmp_path, index, table_type)


# after_requested is not here: the writer is killed before any engine work, which the Arrow
# engine's cases (tests/unit/test_arrow_concurrent_writers.py) cover at the same point
@pytest.mark.parametrize("point,via", [("after_data_file", "cli"), ("after_index_file", "operator"),
                                       ("after_conflict_check", "cli")])
def test_forced_rollback_of_a_live_writer_never_leaves_a_broken_table(spark, tmp_path, point, via):
    """A Spark writer rolled back while it is live: at ``after_index_file`` it is paused inside a
    Spark task (a Python worker), and finds out when its job returns."""
    forced_rollback_of_a_live_writer(lambda o: run_upsert(spark, o), lambda u: run_validate(spark, u), SPARK,
                                     tmp_path, point, via)


def test_arrow_writer_racing_a_spark_writer_matches_the_oracle(tmp_path):
    """An Arrow writer commits inside a Spark writer's window, and another Arrow writer starts
    inside the Spark writer's second window and commits after it: each engine's conflict check
    finds the other engine's commit (file groups and index keys written by both), the loser
    writes again on the new snapshot, and the table equals the oracle in commit order."""
    uri, base = _base(arrow_upsert, tmp_path, "record")
    batches = {
        # the Spark writer updates keys 0-59 and inserts its own
        "spark": [_row(i, "eu west", 5, "spark") for i in range(60)]
        + [_row(3000 + i, "eu west", 5, "spark") for i in range(10)],
        # the first Arrow writer updates keys 30-89 (30-59 also the Spark writer's) and inserts its own
        "arrow-1": [_row(i, "eu west", 5, "arrow-1") for i in range(30, 90)]
        + [_row(4000 + i, "são paulo", 5, "arrow-1") for i in range(10)],
        # the second updates keys 0-19 (the Spark writer's), inserts its own and deletes one
        "arrow-2": [_row(i, "eu west", 5, "arrow-2") for i in range(20)]
        + [_row(5000 + i, "eu west", 5, "arrow-2") for i in range(5)] + [_row(150, "são paulo", 5, "arrow-2", True)],
    }
    src = {b: write_batch(tmp_path / f"{b}.parquet", rows) for b, rows in batches.items()}
    signals = tmp_path / "signals"
    # the Spark writer holds its first snapshot for 8 s after planning, and each checked
    # attempt for 6 s before it claims its commit point
    spark_w = _cli_upsert(uri, src["spark"], "spark", {"BUCKETINDEX_PAUSE": "after_requested=8,after_conflict_check=6",
                                                       "BUCKETINDEX_PAUSE_SIGNAL": str(signals)}, SPARK)
    _wait_for(signals / "after_requested", spark_w)
    first = _cli_upsert(uri, src["arrow-1"], "arrow-1", {}, ARROW)
    _, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1[-3000:]
    assert not (signals / "after_conflict_check").exists(), \
        "the Spark writer checked before the first Arrow writer committed: the race did not happen"
    # the Spark writer finds the Arrow commit, writes again and checks; its commit point is
    # 6 s away. The second Arrow writer plans now and holds its snapshot past it.
    _wait_for(signals / "after_conflict_check", spark_w)
    second = _cli_upsert(uri, src["arrow-2"], "arrow-2", {"BUCKETINDEX_PAUSE": "after_requested=10"}, ARROW)
    _, err_s = spark_w.communicate(timeout=600)
    _, err2 = second.communicate(timeout=120)
    assert spark_w.returncode == 0, err_s[-3000:]
    assert second.returncode == 0, err2[-3000:]

    t = Table.load(uri)
    commits = {t.timeline.read_metadata(i)["batch_id"]: (i, t.timeline.read_metadata(i))
               for i in t.timeline.completed([Action.COMMIT])}
    assert [b for b in commits if b != "base"] == ["arrow-1", "spark", "arrow-2"], list(commits)
    assert {b: m["engine"]["name"] for b, (_, m) in commits.items() if b != "base"} == \
        {"arrow-1": "arrow", "spark": "spark", "arrow-2": "arrow"}
    # the losers' commits list the conflict with the other engine's commit, and each loser's
    # final attempt was written on a snapshot that holds the winner's commit
    assert commits["arrow-1"][1]["conflicts"] == []
    for loser, winner in (("spark", "arrow-1"), ("arrow-2", "spark")):
        inst, _ = commits[winner]
        assert inst.timestamp in {c["with"] for c in commits[loser][1]["conflicts"]}, (loser, commits[loser][1]["conflicts"])
        assert commits[loser][1]["snapshot_seq"] >= inst.seq, (loser, winner)
    assert describe(t)["conflicts"], "show lists the recent conflicts"

    expected = reduce_batches([base] + [batches[b] for b in commits if b != "base"])
    assert rows_by_identity(read_arrow(uri).to_pylist()) == expected  # asserts no key twice
    assert t.timeline.reload().pending() == []
    assert not os.path.exists(t.layout.markers) or not os.listdir(t.layout.markers)
    on_disk = {str(p.relative_to(t.root)) for p in Path(t.root).rglob("*.parquet")}
    referenced = set()  # bases and logs of every completed action (the default table compacts after upserts)
    for inst in t.timeline.completed():
        for fg in t.timeline.read_metadata(inst).get("file_groups", []):
            referenced |= {fg.get("path"), (fg.get("log") or {}).get("path")}
    assert on_disk <= referenced, "the losers' first attempts left no file"
    report = arrow_validate(uri)
    assert report["ok"], report["problems"]
