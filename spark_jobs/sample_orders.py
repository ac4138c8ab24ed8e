"""``python -m spark_jobs.sample_orders [DIR]``: the sample data the README's command-line examples use.

The README's examples must work when pasted in order into an empty directory (the test
``tests/unit/test_readme_examples.py`` does exactly that), so they need data that exists: this
writes, under DIR (default: the current directory),

* ``legacy/orders/region=<r>/part-0.parquet`` -- an existing Parquet dataset, one Hive-style
  directory per region, as ``bucketindex bootstrap`` takes it (the region is in the directory
  names, not in the files);
* ``landing/2024-01-01/part-0.parquet`` and ``landing/2024-01-02/part-0.parquet`` -- two
  batches of changes as ``bucketindex upsert`` takes them: updates (later ``updated_at``),
  new orders, a delete (``is_deleted``), an order moving to another region, and a key twice
  in one batch (the later ``updated_at`` wins).

Plain pyarrow, no randomness: the same files every time. Columns: ``order_id`` (string),
``customer`` (string), ``amount`` (decimal(10,2)), ``updated_at`` (timestamp, UTC),
``region`` (the partition field) and, in the batches only, ``is_deleted`` (boolean).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["SCHEMA", "REGIONS", "legacy_orders", "batches", "write", "main"]

REGIONS = ("eu", "us", "apac")
_UTC = dt.timezone.utc
#: the columns of a batch (the legacy files lack ``region``, held by their directory, and ``is_deleted``)
SCHEMA = pa.schema([
    ("order_id", pa.string()),
    ("customer", pa.string()),
    ("amount", pa.decimal128(10, 2)),
    ("updated_at", pa.timestamp("us", tz="UTC")),
    ("region", pa.string()),
    ("is_deleted", pa.bool_()),
])
_CUSTOMERS = ("Ana Souza", "Björn Nilsson", "Chen Wei", "Dana O'Neil", "Émile Roux", "Farah Khan")


def _order(i: int, *, region: str, at: dt.datetime, amount: str, deleted: bool = False) -> dict[str, Any]:
    return {"order_id": f"o-{i:05d}", "customer": _CUSTOMERS[i % len(_CUSTOMERS)], "amount": Decimal(amount),
            "updated_at": at, "region": region, "is_deleted": deleted}


def legacy_orders() -> list[dict[str, Any]]:
    """30 orders, 10 per region, as of the end of 2023."""
    at = dt.datetime(2023, 12, 31, 23, 0, tzinfo=_UTC)
    return [_order(i, region=REGIONS[i % 3], at=at, amount=f"{10 + i}.50") for i in range(30)]


def batches() -> dict[str, list[dict[str, Any]]]:
    """Two days of changes to :func:`legacy_orders`."""
    d1 = dt.datetime(2024, 1, 1, 9, 0, tzinfo=_UTC)
    d2 = dt.datetime(2024, 1, 2, 9, 0, tzinfo=_UTC)
    hour = dt.timedelta(hours=1)
    return {
        "2024-01-01": [
            _order(0, region="eu", at=d1, amount="12.00"),                 # an update
            _order(4, region="us", at=d1, amount="99.99"),                 # an update ...
            _order(4, region="us", at=d1 + hour, amount="100.00"),         # ... twice: the later one wins
            _order(7, region="eu", at=d1, amount="17.50"),                 # moves from us to eu
            _order(9, region="eu", at=d1, amount="19.50", deleted=True),   # a delete
            _order(30, region="apac", at=d1, amount="5.25"),               # new orders
            _order(31, region="eu", at=d1, amount="6.75"),
        ],
        "2024-01-02": [
            _order(0, region="eu", at=d2, amount="13.00"),
            _order(30, region="apac", at=d2, amount="5.75"),
            _order(12, region="eu", at=d2, amount="22.50", deleted=True),
            _order(32, region="us", at=d2, amount="42.00"),
        ],
    }


def write(root: str = ".") -> list[str]:
    """Write the legacy dataset and the batches under ``root``; returns the files written."""
    written = []
    legacy = pa.Table.from_pylist(legacy_orders(), schema=SCHEMA)
    for region in REGIONS:
        folder = os.path.join(root, "legacy", "orders", f"region={region}")
        os.makedirs(folder, exist_ok=True)
        rows = legacy.filter(pa.compute.equal(legacy.column("region"), region))
        path = os.path.join(folder, "part-0.parquet")
        pq.write_table(rows.drop_columns(["region", "is_deleted"]), path)
        written.append(path)
    for day, rows in batches().items():
        folder = os.path.join(root, "landing", day)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "part-0.parquet")
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.sample_orders",
                                description="Write the README's sample data: legacy/orders/ (a Parquet dataset, "
                                            "a directory per region) and landing/2024-01-0{1,2}/ (two batches).")
    p.add_argument("dir", nargs="?", default=".", help="where to write (default: the current directory)")
    args = p.parse_args(argv)
    for path in write(args.dir):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
