"""Merge-on-read tables on the Arrow engine: a log writer killed before its commit point
leaves the old snapshot and the next run repairs; and ``compact``'s bad input is one line
that writes nothing (its checks run before any engine).

The Spark side -- Spark readers merging logs, data compaction executed in Spark tasks, a log
writer killed inside a Spark task -- is tests/spark/test_merge_on_read.py.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.arrow_engine.validate import run_validate as arrow_validate
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.harness.cli import run_cli
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_arrow_concurrent_writers import ARROW, write_batch
from tests.unit.test_arrow_retry_and_crash import B1, crash_upsert

pytestmark = pytest.mark.unit

Upsert = Callable[[UpsertOptions], Any]
Validate = Callable[[str], dict]


def killed_log_writer_leaves_old_snapshot_and_next_run_repairs(upsert: Upsert, validate: Validate,
                                                               engine: list[str], tmp_path: Path, point: str) -> None:
    """Killed after its first log (the others unwritten) and after every log and index delta,
    before its commit point. The batch updates and deletes keys in place, so it writes logs only."""
    B2 = [{**r, "ts": 1000 + i, "amount": -1.0, "is_deleted": i % 7 == 0} for i, r in enumerate(B1[:70])]

    uri = str(tmp_path / "t")
    upsert(UpsertOptions(table=uri, source=write_batch(tmp_path / "b1.parquet", B1), record_key=["id"],
                         precombine_field="ts", partition_field="region", delete_field="is_deleted",
                         batch_id="batch-1", target_file_rows=50, table_type="merge_on_read"))
    before = read_arrow(uri).to_pylist()
    src2 = write_batch(tmp_path / "b2.parquet", B2)
    p = crash_upsert(uri, src2, "record", point, engine)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])
    t = Table.load(uri)
    (pending,) = t.timeline.pending()
    marked = t.marked_files(pending.timestamp)
    data = [f for f in marked if not f.startswith(".bucketindex")]
    assert data and all(f.endswith(".log.parquet") for f in data), marked
    assert read_arrow(uri).to_pylist() == before
    opts = UpsertOptions(table=uri, source=src2, record_key=["id"], precombine_field="ts", partition_field="region",
                         delete_field="is_deleted", batch_id="batch-2")
    res = upsert(opts)
    assert not res["noop"]
    assert upsert(opts)["noop"]  # a retry of the same batch id applies nothing twice
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches([B1, B2])
    assert validate(uri)["ok"]
    assert len(Table.load(uri).timeline.completed(["commit"])) == 2


@pytest.mark.parametrize("point", ["after_data_file", "before_complete"])
def test_killed_log_writer_leaves_old_snapshot_and_next_run_repairs(tmp_path, point):
    killed_log_writer_leaves_old_snapshot_and_next_run_repairs(arrow_upsert, arrow_validate, ARROW, tmp_path, point)


def test_compaction_bad_input_is_one_line_and_writes_nothing(tmp_path):
    from tests.spark.conftest import tree_digest
    from tests.spark.test_upsert_oracle import make_batches

    uri = str(tmp_path / "t")
    src = write_batch(tmp_path / "b.parquet", make_batches(seed=41, n_batches=1)[0])
    arrow_upsert(UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts",
                               delete_field="is_deleted", num_buckets=2, table_type="copy_on_write"))
    before = tree_digest(tmp_path / "t")
    for args, needle in (
        (["--only", "data"], "copy_on_write table with the record index: it has no logs to compact"),
        (["--execute", "20990101000000000"], "no scheduled compaction 20990101000000000"),
        (["--min-logs", "0"], "--min-logs must be at least 1"),
        (["--execute", "20990101000000000", "--min-logs", "2"], "apply when scheduling"),
    ):
        p = run_cli("compact", uri, *args, timeout=120)
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.strip().count("\n") == 0 and needle in p.stderr, (args, p.stderr)
        assert tree_digest(tmp_path / "t") == before
    # nothing due on a merge-on-read table: no instant, and the command says so
    mor = str(tmp_path / "m")
    arrow_upsert(UpsertOptions(table=mor, source=src, record_key=["id"], precombine_field="ts",
                               partition_field="region", index="record", num_buckets=4, delete_field="is_deleted",
                               batch_id="b0", target_file_rows=60, table_type="merge_on_read"))
    p = run_cli("compact", mor, "--schedule-only", timeout=120)
    assert p.returncode == 0 and p.stdout.strip().splitlines()[-1] == "nothing to compact: no file group or index bucket is due"
    assert json.loads(p.stdout.splitlines()[0])["instant"] is None
    assert Table.load(mor).timeline.pending() == []
