"""Partition values and keys that look like users' data (DESIGN §6).

Partition directories hold the URL-encoded value (``region=s%C3%A3o+paulo``), so a reader
that compares or re-parses paths sees a *different* string than the table's metadata.
Every reader -- validate, the ``global_simple`` tag join, ``read_table``, ``read_arrow`` --
must find every row of every partition regardless of what the value contains.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from spark_jobs.jobs.read import keys_with_location, read_table
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.jobs.validate import run_validate
from spark_jobs.table.reader import read_arrow, read_slice
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import write_batch

pytestmark = pytest.mark.spark

#: values whose encoded directory name differs from the value, or holds `%`, `+`, `=` or `*`
#: (URL encoding keeps `*`, a glob character to Spark).
#: The long one is 125 bytes; a value whose quoted marker name would pass 255 bytes is
#: tested at the end.
REGIONS: list[str | None] = [
    "south east", "a+b", "100%", "x/y", "k=v", "são paulo", "東京", "a*b", "long-" + "value-" * 20, None,
]
KEY_SHAPES = ["k {}", "k+{}", "k%{}", "k/{}", "k={}", "chave-ção-{}", "鍵{}", "long-" * 40 + "{}"]
ROWS_PER_REGION = 45
TARGET_FILE_ROWS = 20


def key_of(i: int) -> str:
    return KEY_SHAPES[i % len(KEY_SHAPES)].format(i)


def first_batch() -> list[dict[str, Any]]:
    """Every region gets enough rows for several file groups at ``TARGET_FILE_ROWS``."""
    return [
        {"id": key_of(i), "region": REGIONS[i % len(REGIONS)], "ts": 1, "amount": float(i), "is_deleted": False}
        for i in range(ROWS_PER_REGION * len(REGIONS))
    ]


def second_batch(first: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Updates (some moving to another region, some late and ignored), deletes and inserts."""
    rnd = random.Random(seed)
    rows = []
    for r in first:
        roll = rnd.random()
        if roll < 0.25:
            rows.append({**r, "ts": 2, "amount": r["amount"] + 0.5})
        elif roll < 0.35:
            rows.append({**r, "region": rnd.choice(REGIONS), "ts": 2, "amount": -r["amount"]})
        elif roll < 0.40:
            rows.append({**r, "ts": 0, "amount": 999.0})  # late event: the stored row stays
        elif roll < 0.55:
            rows.append({**r, "ts": 2, "is_deleted": True})
    start = len(first)
    rows += [
        {"id": key_of(i), "region": REGIONS[i % len(REGIONS)], "ts": 2, "amount": float(i), "is_deleted": False}
        for i in range(start, start + 60)
    ]
    return rows


def upsert(spark, uri: str, src: str, index: str, batch_id: str, table_type: str | None = None) -> dict[str, Any]:
    return run_upsert(spark, UpsertOptions(
        table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region", index=index,
        num_buckets=3, delete_field="is_deleted", batch_id=batch_id, target_file_rows=TARGET_FILE_ROWS,
        table_type=table_type,
    ))


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


@pytest.mark.parametrize("index,table_type", [("record", None), ("bucket", None), ("global_simple", None),
                                              ("record", "merge_on_read")])
def test_odd_partition_values_and_keys(spark, tmp_path, index, table_type):
    partition = "region" if index == "bucket" else None
    uri = str(tmp_path / "table")
    batches = [first_batch()]
    batches.append(second_batch(batches[0], seed=len(index)))
    for i, rows in enumerate(batches):
        res = upsert(spark, uri, write_batch(tmp_path / f"b{i}.parquet", rows), index, f"b{i}", table_type)
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
    upsert(spark, uri, write_batch(tmp_path / "b.parquet", rows), "global_simple", "b0")
    table = Table.load(uri)
    assert Path(table.root) == root
    (only,) = table.view().slices()
    decoy = Path(table.abs(only.path.replace("region=a*b", "region=aXb")))
    decoy.parent.mkdir()
    shutil.copy(table.abs(only.path), decoy)  # matches the glob, but no commit references it
    assert read_table(spark, uri).count() == len(rows)
    assert run_validate(spark, uri)["ok"]


def test_value_whose_marker_name_exceeds_a_file_name(spark, tmp_path):
    """A partition value whose directory name is well under 255 bytes must be writable."""
    value = "東京都千代田区丸の内一丁目"
    uri = str(tmp_path / "table")
    rows = [{"id": "k", "region": value, "ts": 1, "is_deleted": False}]
    upsert(spark, uri, write_batch(tmp_path / "b.parquet", rows), "record", "b0")
    assert read_arrow(uri).column("region").to_pylist() == [value]
