"""The record index's base cap, bad input: one line, exit 2, nothing written, before a Spark
session starts -- on a table the in-process Arrow engine wrote. The capped compactions (on
Spark) against the oracle: tests/spark/test_index_base_cap.py, which imports this module's upsert."""

from __future__ import annotations

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.exceptions import BadInputError
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.action.upsert import UpsertOptions
from tests.harness.cli import run_cli
from tests.unit.test_arrow_oracle_upsert import make_batches, tree_digest, write_batch

pytestmark = pytest.mark.unit


def _upsert(uri, src, batch_id):  # type: ignore[no-untyped-def]
    """An upsert on the Arrow engine, in this process. Automatic compaction off: the tests
    compact explicitly, and since it folds due index buckets too it would leave them nothing due."""
    return run_upsert(UpsertOptions(
        table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region", index="record",
        num_buckets=2, delete_field="is_deleted", batch_id=batch_id, target_file_rows=60, auto_compact="off"))


def test_index_base_cap_bad_input_is_one_line_and_writes_nothing(tmp_path):
    uri = str(tmp_path / "t")
    _upsert(uri, write_batch(tmp_path / "b.parquet", make_batches(seed=62, n_batches=1)[0]), "b0")
    before = tree_digest(tmp_path / "t")
    with pytest.raises(BadInputError, match="--index-base-cap must be at least 1"):
        CompactionPolicy(index_base_cap=0)
    for args, needle in ((["--index-base-cap", "0"], "--index-base-cap must be at least 1, got 0"),
                         (["--index-base-cap", "-5", "--min-deltas", "1"], "--index-base-cap must be at least 1"),
                         (["--execute", "20990101000000000", "--index-base-cap", "5"], "apply when scheduling")):
        p = run_cli("compact", uri, *args, timeout=120)
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.strip().count("\n") == 0 and needle in p.stderr, (args, p.stderr)
        assert tree_digest(tmp_path / "t") == before
