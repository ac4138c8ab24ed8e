"""Partition values and keys that look like users' data (DESIGN §6), through the in-process Arrow
engine alone: the ``global_simple`` table (whose tag reads every key with its file group) holds
the oracle's rows in every partition, ``validate`` agrees, and a long partition value's marker
name is writable. Spark's readers on the same values (and a Spark-written table):
tests/spark/test_partition_values.py, which imports this module's batches."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_arrow_oracle_upsert import write_batch

pytestmark = pytest.mark.unit

#: values whose encoded directory name differs from the value, or holds `%`, `+`, `=` or `*`
#: (URL encoding keeps `*`, a glob character to Spark).
#: The long one is 125 bytes; a value whose marker name would pass 255 bytes is
#: ``test_value_whose_marker_name_exceeds_a_file_name``.
REGIONS: list[str | None] = [
    "south east", "a+b", "100%", "x/y", "k=v", "são paulo", "東京", "a*b", "long-" + "value-" * 20, None, "",
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


def upsert(uri: str, src: str, index: str, batch_id: str, table_type: str | None = None) -> dict[str, Any]:
    return run_upsert(UpsertOptions(
        table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region", index=index,
        num_buckets=3, delete_field="is_deleted", batch_id=batch_id, target_file_rows=TARGET_FILE_ROWS,
        table_type=table_type,
    ))


def test_odd_partition_values_and_keys_on_arrow(tmp_path):
    """tests/spark/test_partition_values.py's ``global_simple`` case with Arrow's reader and validate."""
    index, partition = "global_simple", None
    uri = str(tmp_path / "table")
    batches = [first_batch()]
    batches.append(second_batch(batches[0], seed=len(index)))
    for i, rows in enumerate(batches):
        res = upsert(uri, write_batch(tmp_path / f"b{i}.parquet", rows), index, f"b{i}")
        assert not res["noop"] and res["engine"] == "arrow"
        expected = reduce_batches(batches[: i + 1], partition=partition)
        assert rows_by_identity(read_arrow(uri).to_pylist(), partition=partition) == expected
    report = run_validate(uri)
    assert report["ok"], report
    assert report["rows"] == report["rows_expected"] == len(expected)
    per_partition = Counter(s.partition for s in Table.load(uri).view().slices())
    assert len(per_partition) == len(REGIONS)
    assert all(n > 1 for n in per_partition.values()), per_partition  # several file groups everywhere


def test_value_whose_marker_name_exceeds_a_file_name(tmp_path):
    """A partition value whose directory name is well under 255 bytes must be writable."""
    value = "東京都千代田区丸の内一丁目"
    uri = str(tmp_path / "table")
    rows = [{"id": "k", "region": value, "ts": 1, "is_deleted": False}]
    upsert(uri, write_batch(tmp_path / "b.parquet", rows), "record", "b0")
    assert read_arrow(uri).column("region").to_pylist() == [value]
