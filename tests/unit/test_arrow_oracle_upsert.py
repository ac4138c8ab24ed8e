"""The upsert oracle on the in-process Arrow engine (no JVM, no Spark session): random batches
with updates, inserts, in-batch duplicates, deletes, re-inserts and partition moves; afterwards
the table equals the batches reduced by key and ``validate`` passes -- for all three indexes.

The batch generators live here, free of ``pyspark``, and tests/spark imports them. The Spark
upsert's own oracle test is tests/spark/test_upsert_oracle.py (the record index in the default
tier; tests/spark/test_engine_equivalence.py holds Spark's bucket and global_simple tagging to
the Arrow engine and the oracle batch by batch).
"""

from __future__ import annotations

import random

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity

# plain helpers (pyarrow only); the Spark session fixture there is not used here
from tests.spark.conftest import tree_digest, write_batch  # noqa: F401

pytestmark = pytest.mark.unit

REGIONS = ["eu", "us", "ap"]


def make_batches(seed: int, n_batches: int = 4, pool: int = 240, size: int = 160) -> list[list[dict]]:
    rnd = random.Random(seed)
    region_of = {k: rnd.choice(REGIONS) for k in range(pool)}
    deleted: set[int] = set()
    batches = []
    for b in range(n_batches):
        rows = []
        for j in range(size):
            k = rnd.randrange(pool)
            if k in deleted and rnd.random() < 0.7:
                deleted.discard(k)  # re-insert after delete
            if rnd.random() < 0.15:
                region_of[k] = rnd.choice(REGIONS)  # partition move
            is_del = rnd.random() < 0.12
            if is_del:
                deleted.add(k)
            # ts mostly grows across batches; 10% are late events older than what is stored
            ts = (b * 1000 + j) if rnd.random() > 0.1 else rnd.randrange(0, max(1, b * 1000))
            rows.append({"id": f"key-{k:04d}", "region": region_of[k], "ts": ts, "amount": rnd.random(),
                         "note": rnd.choice(["a", "b", "ключ", "鍵"]), "is_deleted": is_del})
        # in-batch duplicates: repeat some keys with other values
        for r in rnd.sample(rows, 20):
            rows.append({**r, "ts": r["ts"] + rnd.choice([-1, 1]) * 5000 - 2500, "amount": -1.0})
        batches.append(rows)
    return batches


def _dedupe_ties(batches: list[list[dict]], partition: bool) -> None:
    """The oracle does not model the JSON tie-break; make (identity, ts) unique within a batch."""
    for rows in batches:
        seen = set()
        for r in rows:
            k = ((r["region"], r["id"]) if partition else r["id"], r["ts"])
            while k in seen:
                r["ts"] += 1
                k = (k[0], r["ts"])
            seen.add(k)


@pytest.mark.parametrize("index", ["record", "bucket", "global_simple"])
def test_random_batches_match_oracle(tmp_path, index):
    """tests/spark/test_upsert_oracle.py's oracle test, the same seeds and assertions, on Arrow."""
    per_partition = index == "bucket"
    batches = make_batches(seed={"record": 1, "bucket": 2, "global_simple": 3}[index],
                           n_batches=3 if index == "global_simple" else 4)
    _dedupe_ties(batches, per_partition)
    uri = str(tmp_path / "table")
    for i, rows in enumerate(batches):
        src = write_batch(tmp_path / f"batch{i}.parquet", rows)
        res = run_upsert(UpsertOptions(
            table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
            index=index, num_buckets=4, delete_field="is_deleted", batch_id=f"b{i}", target_file_rows=60,
        ))
        assert not res["noop"] and res["engine"] == "arrow"
        expected = reduce_batches(batches[: i + 1], partition="region" if per_partition else None)
        actual = rows_by_identity(read_arrow(uri).to_pylist(), partition="region" if per_partition else None)
        assert actual == expected, f"after batch {i}: table differs from the oracle"
    report = run_validate(uri)
    assert report["ok"], report
    assert report["rows"] == len(expected)
    if index == "record":
        assert report["index_entries"] == len(expected)
    # every commit is on the timeline with its counts
    t = Table.load(uri)
    assert [i.timestamp for i in t.timeline.completed()] == sorted(i.timestamp for i in t.timeline.completed())
    assert len(t.timeline.completed(["commit"])) == len(batches)


def test_composite_key_and_unpartitioned(tmp_path):
    rows = [{"a": "x,y", "b": "z", "v": 1}, {"a": "x", "b": "y,z", "v": 2}, {"a": "x", "b": "y,z", "v": 3}]
    uri = str(tmp_path / "t")
    src = write_batch(tmp_path / "b.parquet", rows)
    run_upsert(UpsertOptions(table=uri, source=src, record_key=["a", "b"], precombine_field="v", num_buckets=2))
    got = sorted((r["a"], r["b"], r["v"]) for r in read_arrow(uri).to_pylist())
    assert got == [("x", "y,z", 3), ("x,y", "z", 1)]  # two distinct records, despite equal naive joins
    assert run_validate(uri)["ok"]
