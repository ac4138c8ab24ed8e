"""Partition values and keys that look like users' data (DESIGN §6).

Partition directories hold the URL-encoded value (``region=s%C3%A3o+paulo``), so a reader
that compares or re-parses paths sees a *different* string than the table's metadata.
Every reader -- validate, the ``global_simple`` tag join, ``read_table``, ``read_arrow`` --
must find every row of every partition regardless of what the value contains.

The readers here are Spark's (``validate``, ``read_table``, ``keys_with_location``) and run on
every index and table type; the tables are written by the in-process Arrow engine, except the
``global_simple`` case, which Spark writes (its tag join reads keys by location through Spark).
The same values through the Arrow engine alone, and the marker-name limit:
tests/unit/test_arrow_oracle_partition_values.py.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.jobs.read import keys_with_location, read_table
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.jobs.validate import run_validate
from spark_jobs.table.reader import read_arrow, read_slice
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import write_batch
from tests.unit.test_arrow_oracle_partition_values import (  # noqa: F401 - the batches, free of pyspark
    KEY_SHAPES,
    REGIONS,
    ROWS_PER_REGION,
    TARGET_FILE_ROWS,
    first_batch,
    key_of,
    second_batch,
)

pytestmark = pytest.mark.spark

def upsert(spark, uri: str, src: str, index: str, batch_id: str, table_type: str | None = None) -> dict[str, Any]:
    """On Spark with a session, else (``spark`` None) on the in-process Arrow engine."""
    opts = UpsertOptions(
        table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region", index=index,
        num_buckets=3, delete_field="is_deleted", batch_id=batch_id, target_file_rows=TARGET_FILE_ROWS,
        table_type=table_type,
    )
    return arrow_upsert(opts) if spark is None else run_upsert(spark, opts)


def assert_matches_oracle(spark, uri: str, expected: dict, partition: str | None) -> None:
    """Every reader returns exactly the oracle's rows, and validate agrees."""
    actual = rows_by_identity(read_arrow(uri).to_pylist(), partition=partition)  # also: no duplicates
    assert actual == expected, "read_arrow differs from the oracle"
    report = run_validate(spark, uri)
    assert report["ok"], report
    assert report["rows"] == report["rows_expected"] == len(expected)
    df = read_table(spark, uri)
    assert df.count() == len(expected)
    via_spark = rows_by_identity([r.asDict() for r in df.collect()], partition=partition)
    assert via_spark == expected, "read_table differs from the oracle"


def assert_keys_located_per_file(spark, uri: str) -> None:
    """Every key comes back with the file group whose file holds it -- per file, not per path."""
    table = Table.load(uri)
    view = table.view()
    expected: Counter = Counter()
    for s in view.slices():  # a merge-on-read slice: its base merged with its logs
        keys = read_slice(table, s.path, [lf.path for lf in s.logs], columns=["_bi_key"])
        for k in keys.column("_bi_key").to_pylist():
            expected[(k, s.partition, s.file_id)] += 1
    df = keys_with_location(spark, table, view, part="p", fid="f")
    assert df is not None and df.columns == ["_bi_key", "p", "f"]
    assert Counter(tuple(r) for r in df.collect()) == expected


@pytest.mark.parametrize("index,table_type,engine", [
    ("record", None, "arrow"), ("bucket", None, "arrow"), ("global_simple", None, "spark"),
    ("record", "merge_on_read", "arrow"),
])
def test_odd_partition_values_and_keys(spark, tmp_path, index, table_type, engine):
    partition = "region" if index == "bucket" else None
    uri = str(tmp_path / "table")
    batches = [first_batch()]
    batches.append(second_batch(batches[0], seed=len(index)))
    for i, rows in enumerate(batches):
        res = upsert(spark if engine == "spark" else None, uri, write_batch(tmp_path / f"b{i}.parquet", rows), index, f"b{i}", table_type)
        assert not res["noop"]
        expected = reduce_batches(batches[: i + 1], partition=partition)
        # the cheap check after each batch; the second batch's routing depends on the first
        assert rows_by_identity(read_arrow(uri).to_pylist(), partition=partition) == expected
    assert_matches_oracle(spark, uri, expected, partition)
    assert_keys_located_per_file(spark, uri)
    per_partition = Counter(s.partition for s in Table.load(uri).view().slices())
    assert len(per_partition) == len(REGIONS)
    assert all(n > 1 for n in per_partition.values()), per_partition  # several file groups everywhere
    if table_type == "merge_on_read":  # the second batch's updates, deletes and moves went to logs
        assert any(s.logs for s in Table.load(uri).view().slices())


def test_spark_reads_exactly_the_files_named(spark, tmp_path):
    """The table URI is percent-escaped (pyarrow decodes it, Hadoop would not), and a `*`
    survives URL encoding into ``region=a*b/<file>``: Spark must read that file, not a glob."""
    root = tmp_path / "my table 100%"
    uri = "file://" + quote(str(root))
    rows = [{"id": f"k{i}", "region": "a*b", "ts": 1, "is_deleted": False} for i in range(5)]
    upsert(None, uri, write_batch(tmp_path / "b.parquet", rows), "global_simple", "b0")  # written by Arrow
    table = Table.load(uri)
    assert Path(table.root) == root
    (only,) = table.view().slices()
    decoy = Path(table.abs(only.path.replace("region=a*b", "region=aXb")))
    decoy.parent.mkdir()
    shutil.copy(table.abs(only.path), decoy)  # matches the glob, but no commit references it
    assert read_table(spark, uri).count() == len(rows)
    assert run_validate(spark, uri)["ok"]
