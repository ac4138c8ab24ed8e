"""The classic tier's oracle, retry and crash tests, unchanged, over Spark Connect.

The test bodies are those of tests/spark (imported), so both tiers run the same code and
assertions; here ``spark`` is a Connect session and the crash tests' CLI writers run with
``--remote`` (their tasks run in the server's Python workers, and a crash point inside a
task kills the writer -- the CLI process -- not the shared server).

All of test_upsert_oracle.py runs here (record, bucket and global_simple indexes, time
travel, composite keys) and the idempotent retry. Of the crash matrix, a subset keeps the
tier near its time budget: each Connect-specific mechanism once -- a crash inside a server
task during the data write (record and bucket index) and during the index write (repaired
by an explicit rollback), and a crash of the client between Spark actions
(``before_complete``). The merge-on-read oracle runs for the record index. Left to the
classic tier: ``after_requested`` and
``after_conflict_check`` (client-side points like ``before_complete``: over Connect the same
kill of the CLI process) and the crash during a rollback (pure Python, no Spark).
"""

from __future__ import annotations

import pytest

from tests.spark import test_retry_and_crash as crash
from tests.spark.test_retry_and_crash import test_same_batch_id_twice_is_one_commit  # noqa: F401
from tests.spark.test_upsert_oracle import (  # noqa: F401 - collected here with this tier's fixtures
    test_composite_key_and_unpartitioned,
    test_random_batches_match_oracle,
    test_time_travel_reads_each_snapshot,
)

pytestmark = [pytest.mark.connect, pytest.mark.timeout(600)]

CRASHES = [
    ("record", "after_data_file", "rerun"),
    ("record", "after_index_file", "rollback"),
    ("record", "before_complete", "rerun"),
    ("bucket", "after_data_file", "rerun"),
]


def test_crash_subset_is_drawn_from_the_classic_matrix():
    (mark,) = [m for m in crash.test_killed_writer_leaves_old_snapshot_and_next_run_repairs.pytestmark
               if m.name == "parametrize"]
    assert set(CRASHES) <= set(mark.args[1])


@pytest.mark.parametrize("index,point,repair", CRASHES)
def test_killed_writer_leaves_old_snapshot_and_next_run_repairs(spark, spark_cli_args, tmp_path, index, point, repair):  # type: ignore[no-untyped-def]
    crash.test_killed_writer_leaves_old_snapshot_and_next_run_repairs(spark, spark_cli_args, tmp_path, index, point, repair)


def test_every_oracle_test_runs_over_connect_too():
    from tests.spark import test_upsert_oracle as oracle

    assert {n for n in dir(oracle) if n.startswith("test_")} <= set(globals())


def test_merge_on_read_over_connect(spark, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The merge-on-read oracle (logs, Spark reads merging them in server tasks, time travel,
    validate, data compaction) with the record index: the other indexes share every Connect
    mechanism it uses, so the classic tier covers them."""
    from tests.spark import test_merge_on_read as mor

    mor.test_logs_not_rewrites_and_every_reader_merges_them(spark, tmp_path, monkeypatch, "record")
