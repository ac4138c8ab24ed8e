"""``spark_jobs.table.dataset``: a snapshot as a ``pyarrow.dataset.Dataset``, read by pyarrow,
DuckDB and Polars, equal to ``read_arrow`` (the project's reader, itself checked against the
oracle here) at the latest instant and at an earlier ``as_of``.

The tables are built by the in-process Arrow engine: copy-on-write and merge-on-read, record and
bucket indexes, through upserts with updates, stale updates, deletes, partition moves and
re-inserts, partition values with spaces, ``/``, ``%``, ``+``, non-ASCII and null, an ``alter
--add-column`` (files written before it read the column as null), a compaction that folds only
some merge-on-read slices (so a snapshot holds plain and merged slices), and a clean. The
reference-bootstrapped case (bootstrap is Spark-only) is tests/spark/test_datasource.py's.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.compact import run_compact
from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.exceptions import BadInputError
from spark_jobs.table.action.alter import run_alter
from spark_jobs.table.action.clean import run_clean
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table import dataset
from spark_jobs.table.dataset import MergedSliceFiles, partition_candidates
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity

pytestmark = pytest.mark.unit

REGIONS: list[str | None] = ["eu west", "x/y", "100%", "a+b", "são paulo", "東京", None]
#: the filter each engine is asked for: a value whose directory name is encoded
PICK = "são paulo"


def _key(i: int) -> str:
    return f"k {i:03d}/%+é"


def write_batch(path: Path, rows: list[dict[str, Any]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def make_batches(*, seed: int, moves: bool) -> list[list[dict[str, Any]]]:
    """Three batches: inserts; updates (some moving partition), stale updates, deletes,
    inserts; then -- after the ``score`` column is added -- updates carrying it, re-inserts."""
    rnd = random.Random(seed)
    b1 = [{"id": _key(i), "region": REGIONS[i % len(REGIONS)], "ts": 1, "amount": float(i), "is_deleted": False}
          for i in range(56)]
    b2 = []
    for r in b1:
        roll = rnd.random()
        if roll < 0.3:
            b2.append({**r, "ts": 2, "amount": r["amount"] + 0.5})
        elif roll < 0.4 and moves:
            b2.append({**r, "region": rnd.choice(REGIONS), "ts": 2, "amount": -r["amount"]})
        elif roll < 0.5:
            b2.append({**r, "ts": 0, "amount": 999.0})  # stale: the stored row stays
        elif roll < 0.6:
            b2.append({**r, "ts": 3, "is_deleted": True})
    b2 += [{"id": _key(100 + i), "region": REGIONS[(i * 3) % len(REGIONS)], "ts": 1, "amount": 7.0,
            "is_deleted": False} for i in range(8)]
    b3 = [{**r, "ts": 5, "amount": r["amount"] * 2, "score": i, "is_deleted": False}
          for i, r in enumerate(b1[::4])]  # updates, and re-inserts of keys b2 deleted
    return [b1, b2, b3]


def sort_rows(t: pa.Table) -> list[dict[str, Any]]:
    return sorted(t.to_pylist(), key=lambda r: (r["id"], str(r["region"])))


def build(tmp_path: Path, *, table_type: str, index: str, uri: str | None = None) -> dict[str, Any]:
    """The table after every step, and what each step's snapshot must hold."""
    uri = uri or str(tmp_path / "t")
    moves = index == "record"
    batches = make_batches(seed=7, moves=moves)
    partition = None if moves else "region"  # the bucket index's record is (partition, key)
    common = dict(table=uri, record_key=["id"], precombine_field="ts", partition_field="region",
                  delete_field="is_deleted", index=index, num_buckets=2, table_type=table_type, target_file_rows=6)
    run_upsert(UpsertOptions(source=write_batch(tmp_path / "b1.parquet", batches[0]), batch_id="b1", **common))
    first = Table.load(uri).timeline.completed()[-1].timestamp
    run_upsert(UpsertOptions(source=write_batch(tmp_path / "b2.parquet", batches[1]), batch_id="b2", **common))
    run_alter(uri, add_columns=["score:bigint"])
    run_upsert(UpsertOptions(source=write_batch(tmp_path / "b3.parquet", batches[2]), batch_id="b3", **common))
    if table_type == "merge_on_read":
        # only the groups with two logs or more: the snapshot then holds plain and merged slices
        run_compact(uri, policy=CompactionPolicy(min_logs=2, log_ratio=100.0, index=False))
        view = Table.load(uri).view()
        assert any(s.logs for s in view.slices()) and any(not s.logs for s in view.slices())
    expected = rows_by_identity([{"score": None, **r} for r in reduce_batches(batches, partition=partition).values()],
                                partition=partition)
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition=partition) == expected
    return {"uri": uri, "first": first, "first_rows": reduce_batches(batches[:1], partition=partition)}


@pytest.mark.parametrize("table_type,index", [("copy_on_write", "record"), ("merge_on_read", "record"),
                                              ("copy_on_write", "bucket"), ("merge_on_read", "bucket")])
def test_dataset_equals_the_snapshot_through_pyarrow_duckdb_and_polars(tmp_path, table_type, index):
    import duckdb
    import polars as pl

    t = build(tmp_path, table_type=table_type, index=index)
    uri = t["uri"]
    want = read_arrow(uri)
    d = dataset(uri)
    assert isinstance(d, ds.Dataset) and d.schema.equals(want.schema)
    assert not any(n.startswith("_bi_") for n in d.schema.names)
    assert sort_rows(d.to_table()) == sort_rows(want)
    assert sort_rows(d.to_table()) == sort_rows(want)  # scanned again: the same rows
    assert d.count_rows() == want.num_rows

    # time travel: the snapshot before the alter has no score column, and the first batch's rows
    old = dataset(uri, as_of=t["first"])
    assert "score" not in old.schema.names
    assert sort_rows(old.to_table()) == sort_rows(read_arrow(uri, as_of=t["first"]))
    assert old.count_rows() == len(t["first_rows"])

    # DuckDB pushes its projection and filter into the dataset's scanner
    picked = sorted((r["id"], r["amount"], r["score"]) for r in want.to_pylist() if r["region"] == PICK)
    assert picked
    got = duckdb.sql(f"select id, amount, score from d where region = '{PICK}' order by id").fetchall()
    assert got == picked
    nulls = sorted(r["id"] for r in want.to_pylist() if r["region"] is None and r["amount"] > 3)
    assert nulls and duckdb.sql("select id from d where region is null and amount > 3 order by id").fetchall() == [
        (k,) for k in nulls]
    agg = duckdb.sql("select count(*), sum(amount) from d").fetchall()[0]
    assert agg[0] == want.num_rows and agg[1] == pytest.approx(sum(r["amount"] for r in want.to_pylist()))

    # Polars: a lazy scan with a filter and a projection
    lf = pl.scan_pyarrow_dataset(d).filter(pl.col("region") == "x/y").select(["id", "amount"])
    assert sorted(lf.collect().rows()) == sorted((r["id"], r["amount"]) for r in want.to_pylist()
                                                 if r["region"] == "x/y")
    # pandas, through pyarrow
    assert len(d.to_table().to_pandas()) == want.num_rows

    # a filter on the partition field prunes fragments before any is opened (or merged)
    frags = list(_fragments(d))
    kept = list(_fragments(d, filter=ds.field("region") == PICK))
    assert 0 < len(kept) < len(frags)

    # after a clean, the latest snapshot reads the same and the cleaned one is refused
    run_clean(uri, retain_commits=1)
    assert sort_rows(dataset(uri).to_table()) == sort_rows(want)
    with pytest.raises(BadInputError, match="older than the retained window"):
        dataset(uri, as_of=t["first"])
    assert run_validate(uri)["ok"]


def _fragments(d: ds.Dataset, *, filter: ds.Expression | None = None) -> list[ds.Fragment]:
    kids = d.children if isinstance(d, ds.UnionDataset) else [d]
    return [f for k in kids for f in k.get_fragments(filter=filter)]


def test_merged_slices_are_merged_once_per_scan_and_pruned_by_partition(tmp_path):
    """A merge-on-read snapshot's merged slices: each merged once per scan (pyarrow opens an IPC
    fragment twice), none merged for a partition a filter excludes."""
    uri = build(tmp_path, table_type="merge_on_read", index="record")["uri"]

    def merged_part() -> tuple[ds.FileSystemDataset, MergedSliceFiles]:
        (part,) = [k for k in dataset(uri).children if isinstance(k.format, ds.IpcFileFormat)]
        return part, part.filesystem.handler

    part, files = merged_part()
    n = len(files.paths)
    assert sort_rows(part.to_table()) == sort_rows(part.to_table())
    assert files.merges == 2 * n  # the cache holds fewer slices than the scan reads
    values = [ds.get_partition_keys(f.partition_expression).get("region") for f in part.get_fragments()]
    pick = next(v for v in values if v is not None)
    part, files = merged_part()
    where = ds.field("region") == pick
    got = part.to_table(columns=["id"], filter=where)
    assert got.num_rows > 0
    # the slices of other partitions are not merged; a null partition's name proves no value
    # (format.md §1: it may hold a literal "__NULL__" from before the rule), so it is read
    assert files.merges == len(list(part.get_fragments(filter=where))) == values.count(pick) + values.count(None) < n


def test_an_empty_snapshot_and_a_missing_table(tmp_path):
    uri = str(tmp_path / "t")
    rows = [{"id": "a", "region": "r", "ts": 1, "amount": 1.0, "is_deleted": True}]
    run_upsert(UpsertOptions(table=uri, source=write_batch(tmp_path / "b.parquet", rows), record_key=["id"],
                             precombine_field="ts", partition_field="region", delete_field="is_deleted"))
    d = dataset(uri)
    assert d.to_table().num_rows == 0 and d.schema.names == ["id", "region", "ts", "amount"]
    with pytest.raises(BadInputError, match="no bucketindex table"):
        dataset(str(tmp_path / "nothing"))


def test_partition_candidates_only_from_names_that_encode_back(tmp_path):
    """A directory name narrows a slice's values only when the decoded value encodes to it:
    never for a shortened long value or a name from before format.md §1's rule."""
    from spark_jobs.table.view import FileSlice

    uri = str(tmp_path / "t")
    rows = [{"id": "a", "region": "r", "ts": 1, "amount": 1.0, "is_deleted": False}]
    run_upsert(UpsertOptions(table=uri, source=write_batch(tmp_path / "b.parquet", rows), record_key=["id"],
                             precombine_field="ts", partition_field="region", delete_field="is_deleted"))
    table = Table.load(uri)
    schema = Table.load(uri).view().schema

    def cands(part: str, typ: pa.DataType | None = None) -> list[Any] | None:
        s = FileSlice(part, "f", f"{part}/f.parquet", "1", 1)
        return partition_candidates(table, s, pa.schema([("region", typ or pa.string())]))

    assert cands("region=s%C3%A3o+paulo") == ["são paulo"]
    assert cands("region=x%2Fy") == ["x/y"] and cands("region=100%25") == ["100%"]
    assert cands("region=%5F_NULL__") == ["__NULL__"]
    assert cands("region=__NULL__") == [None, "__NULL__"]  # null, or a literal from before the rule
    assert cands("region=__old") is None  # a name from before the rule
    assert cands("region=" + "v" * 100 + "~" + "0" * 32) is None  # shortened: the value is not in the name
    assert cands("region=7", pa.int64()) == [7] and cands("region=07", pa.int64()) is None
    assert cands("region=2024-01-02", pa.date32()) is not None
    assert cands("region=1.5", pa.float64()) is None
    assert schema is not None


def test_dataset_on_s3(bucket, tmp_path):
    """One small merge-on-read table on the S3-compatible server: the dataset reads its plain
    and merged slices through the table's filesystem, and DuckDB reads the dataset."""
    import duckdb

    uri = f"{bucket}/t"
    rows = [{"id": _key(i), "region": REGIONS[i % 3], "ts": 1, "amount": float(i), "is_deleted": False}
            for i in range(12)]
    common = dict(table=uri, record_key=["id"], precombine_field="ts", partition_field="region",
                  delete_field="is_deleted", table_type="merge_on_read", target_file_rows=4,
                  auto_compact="off")  # the logs stay: the dataset must merge them
    run_upsert(UpsertOptions(source=write_batch(tmp_path / "b1.parquet", rows), **common))
    # rows 0, 3 (one region: 0 deleted) and 1 updated: the third region's slice stays plain
    upd = [{**r, "ts": 2, "amount": -r["amount"], "is_deleted": r is rows[0]} for r in (rows[0], rows[3], rows[1])]
    run_upsert(UpsertOptions(source=write_batch(tmp_path / "b2.parquet", upd), **common))
    want = read_arrow(uri)
    d = dataset(uri)
    assert isinstance(d, ds.UnionDataset)  # plain slices and merged ones
    assert sort_rows(d.to_table()) == sort_rows(want) and want.num_rows == 11
    assert duckdb.sql("select count(*), sum(amount) from d where amount < 0").fetchall() == [(2, -4.0)]
