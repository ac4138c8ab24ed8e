"""Zone-aware and zone-naive timestamps round-trip exactly (issue 22, the newcomer's defects).

Change-data-capture feeds carry ``updated_at timestamp[us, tz=...]``: batches arrive in
``Asia/Tokyo``, ``America/New_York`` (across its DST change) and UTC, with a zone-naive
``local_at``, decimals, lists and structs beside them. ``updated_at`` is the precombine field:
the newest *instant* wins, whatever wall clock it was written in. The table stores zone-aware
timestamps as ``timestamp[us, tz=UTC]`` (format.md §5) and naive ones as ``timestamp[us]``;
every reader returns those types and the oracle's values, on every index and table type and
after a bootstrap in either mode (the bootstrap on Spark, the batch after it on Arrow).

Spark's rules (its cast of each source's zones, its reader) keep their cases: the record/copy-on-write
and bucket/merge-on-read tables are written by Spark, the other two by the in-process Arrow engine,
and Spark's reader reads all four. The same round trip through the Arrow engine alone, every index
and table type: tests/unit/test_arrow_oracle_timestamps.py.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.cli import main
from spark_jobs.jobs.bootstrap import BootstrapOptions, run_bootstrap
from spark_jobs.jobs.read import read_table
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.table.reader import read_arrow
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import write_batch
from tests.unit.test_arrow_oracle_timestamps import (  # noqa: F401 - the batches and checks, free of pyspark
    ADDR,
    BASE,
    NEW_YORK,
    STORED,
    TOKYO,
    _row,
    assert_matches,
    batches,
    canonical,
    expected,
    source_schema,
)

pytestmark = pytest.mark.spark


def check_readers(spark, uri: str, per_partition: bool, out: Path) -> None:
    assert_matches(read_arrow(uri), per_partition, "read_arrow")
    df = read_table(spark, uri)
    assert_matches(df.toArrow(), per_partition, "read_table")
    assert main(["read", uri, "--output", str(out)]) == 0
    assert_matches(pq.read_table(out), per_partition, "read --output")


def _write(path: Path, rows: list[dict], tz: str) -> str:
    return write_batch(path, rows, schema=source_schema(tz))


@pytest.mark.parametrize("index,table_type,engine", [
    ("record", "copy_on_write", "spark"), ("record", "merge_on_read", "arrow"),
    ("bucket", "copy_on_write", "arrow"), ("bucket", "merge_on_read", "spark"),
])
def test_upserts_round_trip(spark, tmp_path, index, table_type, engine):
    first, later = batches()
    uri = str(tmp_path / "orders")
    common = dict(table=uri, record_key=["id"], precombine_field="updated_at", partition_field="region",
                  delete_field="is_deleted")
    upsert = (lambda opts: run_upsert(spark, opts)) if engine == "spark" else arrow_upsert
    upsert(UpsertOptions(**common, source=_write(tmp_path / "b1.parquet", first, "Asia/Tokyo"),
                         index=index, table_type=table_type, num_buckets=2))
    upsert(UpsertOptions(**common, source=_write(tmp_path / "b2.parquet", later, "America/New_York")))
    check_readers(spark, uri, index == "bucket", tmp_path / "out.parquet")


@pytest.mark.parametrize("mode", ["rewrite", "reference"])
def test_bootstrap_then_upsert_round_trip(spark, tmp_path, mode):
    """A Hive-partitioned dataset in Tokyo time (``local_at`` in milliseconds, as some writers
    store it), bootstrapped, then the New York batch upserted."""
    first, later = batches()
    data = pa.Table.from_pylist(first, schema=source_schema("Asia/Tokyo")).drop_columns(["is_deleted"])
    data = data.set_column(data.schema.get_field_index("local_at"), "local_at",
                           data.column("local_at").cast(pa.timestamp("ms")))
    src = tmp_path / "dataset"
    ds.write_dataset(data, src, format="parquet", partitioning=["region"], partitioning_flavor="hive")
    uri = str(tmp_path / "orders")
    run_bootstrap(spark, BootstrapOptions(table=uri, source=str(src), record_key=["id"], partition_field="region",
                                          precombine_field="updated_at", mode=mode, num_buckets=2))
    boot = rows_by_identity(read_arrow(uri).to_pylist())
    assert canonical(boot) == canonical(reduce_batches([first], key="id", precombine="updated_at",
                                                       delete_field="is_deleted"))
    # the bootstrap is the subject (Spark); the batch after it goes through the in-process Arrow engine
    arrow_upsert(UpsertOptions(table=uri, record_key=["id"], precombine_field="updated_at",
                               partition_field="region", delete_field="is_deleted",
                               source=_write(tmp_path / "b2.parquet", later, "America/New_York")))
    check_readers(spark, uri, False, tmp_path / "out.parquet")


def test_nanosecond_timestamps_are_refused_before_spark(tmp_path):
    """pandas writes nanoseconds; Spark holds microseconds: one line naming the column and the
    fix, before a JVM starts (an upsert's CLI pre-check and a bootstrap alike)."""
    from spark_jobs.exceptions import BadInputError
    from spark_jobs.engines import precheck_upsert
    from spark_jobs.table.action.upsert import UpsertOptions

    src = tmp_path / "dataset"
    src.mkdir()
    pq.write_table(pa.table({"id": ["a"], "updated_at": pa.array([0], pa.timestamp("ns", tz="Asia/Tokyo"))}),
                   src / "part-0.parquet")
    with pytest.raises(BadInputError, match="columns updated_at of .* hold nanosecond timestamps"):
        run_bootstrap(lambda: pytest.fail("started Spark"), BootstrapOptions(
            table=str(tmp_path / "t"), source=str(src), record_key=["id"], mode="rewrite"))
    with pytest.raises(BadInputError, match="coerce_timestamps='us'"):
        precheck_upsert(UpsertOptions(table=str(tmp_path / "t"), source=str(src / "part-0.parquet"),
                                      record_key=["id"]))
    assert not (tmp_path / "t").exists()
