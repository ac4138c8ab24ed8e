"""Retries are idempotent; a writer killed at any step leaves the previous snapshot visible,
and the next run (or ``rollback``) repairs the table -- with Spark writers.

The protocol's cases run on the Arrow engine (tests/unit/test_arrow_engine.py's crash matrix,
tests/unit/test_arrow_retry_and_crash.py: this data, the remaining points, a rollback killed
half-way). Spark keeps what only it runs: a crash inside a Spark task during the data write
(``after_data_file``, in a Python worker) and during the index write (``after_index_file``,
repaired by an explicit rollback), and the idempotent retry of its own write; the extended
tier kills Spark writers at the client-side points too. tests/connect runs these bodies over
Spark Connect.
"""

from __future__ import annotations

import pytest

from spark_jobs.jobs.upsert import run_upsert
from spark_jobs.jobs.validate import run_validate
from tests.unit.test_arrow_retry_and_crash import (  # noqa: F401 - B1, B2, options: tests/connect's data
    B1,
    B2,
    killed_writer_leaves_old_snapshot_and_next_run_repairs,
    options,
    same_batch_id_twice_is_one_commit,
)

pytestmark = pytest.mark.spark


def test_same_batch_id_twice_is_one_commit(spark, tmp_path):
    same_batch_id_twice_is_one_commit(lambda o: run_upsert(spark, o), tmp_path)


@pytest.mark.parametrize(
    "index,point,repair",
    [
        ("record", "after_requested", "rerun"),
        ("record", "after_data_file", "rerun"),
        ("record", "after_index_file", "rollback"),
        ("record", "before_complete", "rerun"),
        ("record", "after_conflict_check", "rerun"),  # checked, commit point not yet claimed
        ("bucket", "after_data_file", "rerun"),
    ],
)
def test_killed_writer_leaves_old_snapshot_and_next_run_repairs(spark, spark_cli_args, tmp_path, index, point, repair):
    """The default tier: ``record-after_data_file`` and ``record-after_index_file`` (the kills
    inside Spark tasks); the other points are the extended tier's (tests/conftest.py)."""
    killed_writer_leaves_old_snapshot_and_next_run_repairs(lambda o: run_upsert(spark, o),
                                                           lambda u: run_validate(spark, u), spark_cli_args, tmp_path,
                                                           index, point, repair)
