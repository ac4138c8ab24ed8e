"""Zone-aware and zone-naive timestamps round-trip exactly (issue 22, the newcomer's defects).

Change-data-capture feeds carry ``updated_at timestamp[us, tz=...]``: batches arrive in
``Asia/Tokyo``, ``America/New_York`` (across its DST change) and UTC, with a zone-naive
``local_at``, decimals, lists and structs beside them. ``updated_at`` is the precombine field:
the newest *instant* wins, whatever wall clock it was written in. The table stores zone-aware
timestamps as ``timestamp[us, tz=UTC]`` (format.md §5) and naive ones as ``timestamp[us]``;
every reader returns those types and the oracle's values, on every index and table type and
after a bootstrap in either mode.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from spark_jobs.cli import main
from spark_jobs.jobs.bootstrap import BootstrapOptions, run_bootstrap
from spark_jobs.jobs.read import read_table
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.table.reader import read_arrow
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import write_batch

pytestmark = pytest.mark.spark

TOKYO, NEW_YORK = ZoneInfo("Asia/Tokyo"), ZoneInfo("America/New_York")
#: 30 minutes before New York's 2024 DST change (07:00 UTC)
BASE = datetime(2024, 3, 10, 6, 30, tzinfo=timezone.utc)
ADDR = pa.struct([("city", pa.string()), ("zip", pa.string())])


def source_schema(tz: str) -> pa.Schema:
    return pa.schema([("id", pa.string()), ("region", pa.string()), ("updated_at", pa.timestamp("us", tz=tz)),
                      ("local_at", pa.timestamp("us")), ("amount", pa.decimal128(12, 2)),
                      ("tags", pa.list_(pa.string())), ("addr", ADDR), ("is_deleted", pa.bool_())])


#: what every reader returns: zone-aware in UTC, naive kept naive
STORED = pa.schema([f for f in source_schema("UTC") if f.name != "is_deleted"])


def _row(i: int, at: datetime, tz: ZoneInfo, *, region: str | None = None, deleted: bool = False) -> dict[str, Any]:
    return {"id": f"order-{i:03d}", "region": region or ("eu" if i % 2 else "ap"),
            "updated_at": at.astimezone(tz),
            "local_at": None if i % 7 == 3 else (datetime(2024, 3, 10, 2, 30)
                                                 + timedelta(minutes=17 * i, milliseconds=i)),
            "amount": None if i % 5 == 4 else Decimal(f"{i * 13}.{i % 100:02d}"),
            "tags": None if i % 6 == 5 else [f"t{j}" for j in range(i % 3)],
            "addr": None if i % 8 == 7 else {"city": "東京" if i % 2 else "New York", "zip": f"{i:05d}"},
            "is_deleted": deleted}


def batches() -> tuple[list[dict], list[dict]]:
    """The creating batch (Tokyo wall clocks, one key twice) and a later one (New York wall
    clocks: newer, stale and equal instants, deletes, inserts, a partition move, an in-batch
    duplicate one microsecond apart)."""
    first = [_row(i, BASE + timedelta(minutes=i, microseconds=i), TOKYO) for i in range(24)]
    first.append(_row(0, BASE - timedelta(hours=1), TOKYO))  # an older copy of order-000: loses
    later = [_row(i, BASE + timedelta(hours=1, minutes=i), NEW_YORK) for i in range(0, 10)]  # newer: win
    later += [_row(i, BASE - timedelta(hours=2), NEW_YORK) for i in range(10, 14)]  # older instants: stale
    later += [_row(i, BASE + timedelta(hours=2), NEW_YORK, deleted=True) for i in range(14, 17)]  # deletes
    later += [_row(i, BASE + timedelta(minutes=i, microseconds=i), NEW_YORK) for i in range(17, 19)]  # equal: win
    later += [_row(i, BASE + timedelta(days=1, minutes=i), NEW_YORK) for i in range(24, 30)]  # inserts
    later.append({**_row(4, BASE + timedelta(hours=1, minutes=4, microseconds=1), NEW_YORK), "amount": Decimal("0.01")})
    for r in later[:10]:
        r["amount"] = None if r["amount"] is None else r["amount"] + Decimal("1.00")
    later[6]["region"] = "eu"  # order-006 moves partition (the bucket index: a new record in eu)
    return first, later


def expected(per_partition: bool) -> dict:
    first, later = batches()
    return reduce_batches([first, later], key="id", precombine="updated_at", delete_field="is_deleted",
                          partition="region" if per_partition else None)


def canonical(rows: dict) -> dict:
    """Exact values: timestamps as ISO text (a zone-aware one must be in UTC, a naive one naive)."""
    def text(v: Any) -> Any:
        if isinstance(v, datetime):
            return v.astimezone(timezone.utc).isoformat() if v.tzinfo is not None else v.isoformat()
        return v
    return {k: {c: text(v) for c, v in r.items()} for k, r in rows.items()}


def assert_matches(t: pa.Table, per_partition: bool, what: str) -> None:
    assert {f.name: f.type for f in t.schema} == {f.name: f.type for f in STORED}, f"{what}: {t.schema}"
    rows = rows_by_identity(t.to_pylist(), partition="region" if per_partition else None)
    for r in rows.values():  # values come back in UTC, not merely as equal instants
        assert r["updated_at"].utcoffset() == timedelta(0), (what, r)
    assert canonical(rows) == canonical(expected(per_partition)), what


def check_readers(spark, uri: str, per_partition: bool, out: Path) -> None:
    assert_matches(read_arrow(uri), per_partition, "read_arrow")
    df = read_table(spark, uri)
    assert_matches(df.toArrow(), per_partition, "read_table")
    assert main(["read", uri, "--output", str(out)]) == 0
    assert_matches(pq.read_table(out), per_partition, "read --output")


def _write(path: Path, rows: list[dict], tz: str) -> str:
    return write_batch(path, rows, schema=source_schema(tz))


@pytest.mark.parametrize("index,table_type", [("record", "copy_on_write"), ("record", "merge_on_read"),
                                              ("bucket", "copy_on_write"), ("bucket", "merge_on_read")])
def test_upserts_round_trip(spark, tmp_path, index, table_type):
    first, later = batches()
    uri = str(tmp_path / "orders")
    common = dict(table=uri, record_key=["id"], precombine_field="updated_at", partition_field="region",
                  delete_field="is_deleted")
    run_upsert(spark, UpsertOptions(**common, source=_write(tmp_path / "b1.parquet", first, "Asia/Tokyo"),
                                    index=index, table_type=table_type, num_buckets=2))
    run_upsert(spark, UpsertOptions(**common, source=_write(tmp_path / "b2.parquet", later, "America/New_York")))
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
    run_upsert(spark, UpsertOptions(table=uri, record_key=["id"], precombine_field="updated_at",
                                    partition_field="region", delete_field="is_deleted",
                                    source=_write(tmp_path / "b2.parquet", later, "America/New_York")))
    check_readers(spark, uri, False, tmp_path / "out.parquet")


def test_nanosecond_timestamps_are_refused_before_spark(tmp_path):
    """pandas writes nanoseconds; Spark holds microseconds: one line naming the column and the
    fix, before a JVM starts (an upsert's CLI pre-check and a bootstrap alike)."""
    from spark_jobs.exceptions import BadInputError
    from spark_jobs.table.schema import precheck_batch

    src = tmp_path / "dataset"
    src.mkdir()
    pq.write_table(pa.table({"id": ["a"], "updated_at": pa.array([0], pa.timestamp("ns", tz="Asia/Tokyo"))}),
                   src / "part-0.parquet")
    with pytest.raises(BadInputError, match="columns updated_at of .* hold nanosecond timestamps"):
        run_bootstrap(lambda: pytest.fail("started Spark"), BootstrapOptions(
            table=str(tmp_path / "t"), source=str(src), record_key=["id"], mode="rewrite"))
    with pytest.raises(BadInputError, match="coerce_timestamps='us'"):
        precheck_batch(table_uri=str(tmp_path / "t"), source=str(src / "part-0.parquet"), source_format="parquet",
                       record_key=["id"], delete_field=None)
    assert not (tmp_path / "t").exists()
