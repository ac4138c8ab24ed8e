"""``spark.read.format("bucketindex")`` (``spark_jobs.jobs.datasource``, Spark's Python Data
Source API) equals ``read_arrow`` -- itself checked against the oracle by the table builder of
tests/unit/test_dataset.py -- on a copy-on-write and a merge-on-read table (partition values
with spaces, ``/``, ``%``, ``+``, non-ASCII and null; an ``alter``; a partial compaction), at an
earlier ``as_of``, through a temporary view made with SQL, with a projection and a partition
filter. A reference-bootstrapped table (bootstrap is Spark-only and slow) is read through Spark's
data source and the pyarrow dataset by tests/spark/test_bootstrap.py's reference-table test,
which already builds one (reference bases with logs and without, after compaction, rehash and
clean).

The session's ``spark`` fixture (``get_spark``) registers the source, as every session the
package starts does.
"""

from __future__ import annotations

import shutil

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.layout import partition_path
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.unit.test_dataset import PICK, build, sort_rows, write_batch

pytestmark = pytest.mark.spark


def _rows(df) -> list[dict]:  # type: ignore[no-untyped-def]
    return sort_rows(df.toArrow())


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_spark_reads_the_snapshot_as_of_through_sql_with_pruning(spark, tmp_path, table_type):
    t = build(tmp_path, table_type=table_type, index="record")
    uri = t["uri"]
    want = read_arrow(uri)
    df = spark.read.format("bucketindex").load(uri)
    assert df.columns == want.column_names
    assert _rows(df) == sort_rows(want)

    old = spark.read.format("bucketindex").option("as_of", t["first"]).load(uri)
    assert "score" not in old.columns and _rows(old) == sort_rows(read_arrow(uri, as_of=t["first"]))

    view = f"bi_{table_type}"
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {view} USING bucketindex OPTIONS (path '{uri}')")
    got = spark.sql(f"SELECT id, amount FROM {view} WHERE region = '{PICK}'").collect()
    picked = sorted((r["id"], r["amount"]) for r in want.to_pylist() if r["region"] == PICK)
    assert picked and sorted((r["id"], r["amount"]) for r in got) == picked

    # pruning, shown by its effect: with every file of the other partitions gone (a copy of the
    # table), a query on PICK still reads, and a query without the filter fails on a missing file
    copy = tmp_path / "copy"
    shutil.copytree(uri, copy)
    enc = partition_path("region", PICK)
    assert any(s.partition == enc for s in Table.load(uri).view().slices())
    for part in copy.iterdir():
        if part.name not in (enc, ".bucketindex"):
            shutil.rmtree(part)
    pruned = spark.read.format("bucketindex").load(str(copy)).where(f"region = '{PICK}'").select("id", "amount")
    assert sorted((r["id"], r["amount"]) for r in pruned.collect()) == picked
    with pytest.raises(Exception, match="missing"):
        spark.read.format("bucketindex").load(str(copy)).where("region IS NULL").collect()


def test_options_are_checked(spark, tmp_path):
    """A misspelt option is refused (it would read the latest snapshot silently), and so is a path without a table."""
    uri = str(tmp_path / "t")
    run_upsert(UpsertOptions(table=uri, source=write_batch(tmp_path / "b.parquet", [{"id": "a", "ts": 1}]),
                             record_key=["id"]))
    first = Table.load(uri).timeline.completed()[-1].timestamp
    assert spark.read.format("bucketindex").option("as_of", first).load(uri).count() == 1
    with pytest.raises(Exception, match="unknown option.*asof"):
        spark.read.format("bucketindex").option("asof", first).load(uri).collect()
    with pytest.raises(Exception, match="no bucketindex table"):
        spark.read.format("bucketindex").load(str(tmp_path / "nothing")).collect()
