"""Zone-aware and zone-naive timestamps round-trip exactly through the in-process Arrow engine
(issue 22): batches in ``Asia/Tokyo`` and ``America/New_York`` (across its DST change), a naive
``local_at``, decimals, lists and structs; ``updated_at`` is the precombine field, the newest
*instant* wins. Every index and table type; ``read_arrow`` and ``read --output`` (in-process)
return ``timestamp[us, tz=UTC]`` and ``timestamp[us]`` with the oracle's values.

The batches and checks live here, free of ``pyspark``; tests/spark/test_timestamps.py imports
them and holds Spark's cast and reader to the same rows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.cli import main
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_arrow_oracle_upsert import write_batch

pytestmark = pytest.mark.unit

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


@pytest.mark.parametrize("index,table_type", [("record", "copy_on_write"), ("record", "merge_on_read"),
                                              ("bucket", "copy_on_write"), ("bucket", "merge_on_read")])
def test_upserts_round_trip_on_arrow(tmp_path, monkeypatch, index, table_type):
    monkeypatch.setattr("spark_jobs.cli._spark", lambda *a: pytest.fail("read started a Spark session"))
    first, later = batches()
    uri = str(tmp_path / "orders")
    common = dict(table=uri, record_key=["id"], precombine_field="updated_at", partition_field="region",
                  delete_field="is_deleted")
    schema = source_schema("Asia/Tokyo")
    run_upsert(UpsertOptions(**common, source=write_batch(tmp_path / "b1.parquet", first, schema),
                             index=index, table_type=table_type, num_buckets=2))
    schema = source_schema("America/New_York")
    run_upsert(UpsertOptions(**common, source=write_batch(tmp_path / "b2.parquet", later, schema)))
    per_partition = index == "bucket"
    assert_matches(read_arrow(uri), per_partition, "read_arrow")
    out = tmp_path / "out.parquet"
    assert main(["read", uri, "--output", str(out)]) == 0
    assert_matches(pq.read_table(out), per_partition, "read --output")
