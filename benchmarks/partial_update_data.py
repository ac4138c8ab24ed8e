"""Data for docs/benchmarks.md "Schema changes, partial updates and time travel (issue 24)".

Writes to the working directory: ``initial.parquet`` (200,000 rows), and a 10,000-key update of
it twice -- ``full.parquet`` (every column) and ``partial.parquet`` (key, partition, precombine
field and ``amount``: what ``upsert --partial-update`` sends). Keys and partition values hold
spaces, ``/``, ``%``, ``+`` and non-ASCII, as users' do. Seeded: the same files every run.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS = 200_000
UPDATED = 10_000
REGIONS = ["São Paulo", "a/b %+", "東京"]
BASE = datetime(2026, 11, 25, tzinfo=timezone.utc)

rng = np.random.default_rng(1)
ids = [f"order {i:07d}/é+%" for i in range(ROWS)]


def batch(idx: Iterable[int], minute: int, columns: set[str]) -> pa.Table:
    idx = list(idx)
    d: dict[str, object] = {
        "id": [ids[i] for i in idx],
        "region": [REGIONS[i % 3] for i in idx],
        "ts": pa.array([BASE + timedelta(minutes=minute)] * len(idx), pa.timestamp("us", tz="UTC")),
    }
    if "amount" in columns:
        d["amount"] = pa.array(rng.integers(0, 10**6, len(idx)), pa.int64())
    if "note" in columns:
        d["note"] = [f"note {minute} {i}" for i in idx]
    if "qty" in columns:
        d["qty"] = pa.array(rng.integers(0, 100, len(idx)), pa.int32())
    return pa.table(d)


if __name__ == "__main__":
    pq.write_table(batch(range(ROWS), 0, {"amount", "note", "qty"}), "initial.parquet")
    updated = rng.choice(ROWS, UPDATED, replace=False)
    pq.write_table(batch(updated, 1, {"amount", "note", "qty"}), "full.parquet")
    pq.write_table(batch(updated, 1, {"amount"}), "partial.parquet")
