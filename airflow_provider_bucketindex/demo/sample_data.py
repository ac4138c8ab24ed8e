"""Sample batches, the reduce-by-key oracle, and reading a table snapshot -- all with pyarrow.

Used by ``bucketindex demo`` (to generate its landing folder and to check the result)
and by the end-to-end tests. No Spark, no Airflow.

The oracle: a table must equal its batches reduced by key -- for each key the row with
the largest precombine value wins, and if that row is a delete the key is gone.
Precombine values here are unique across all batches, so "largest wins" and "later
batch wins" agree and the expected table is unambiguous.
"""

from __future__ import annotations

import os
import random
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "SCHEMA",
    "KEY",
    "PRECOMBINE",
    "DELETE",
    "make_batches",
    "write_batch",
    "expected_rows",
    "table_rows",
    "rows_by_key",
]

KEY, PRECOMBINE, DELETE = "id", "ts", "is_deleted"
SCHEMA = pa.schema(
    [
        (KEY, pa.string()),
        ("name", pa.string()),
        ("amount", pa.float64()),
        ("region", pa.string()),
        (PRECOMBINE, pa.int64()),
        (DELETE, pa.bool_()),
    ]
)
REGIONS = ("eu", "us", "apac")
INTERNAL_PREFIX = "_bi_"


def make_batches(n_batches: int = 3, rows: int = 200, seed: int = 7) -> list[pa.Table]:
    """``n_batches`` batches: the first inserts ``rows`` keys; each later one updates about
    a third of the live keys, inserts ``rows // 2`` new ones, deletes about a tenth, and
    re-inserts a previously deleted key. Every batch repeats a few keys with two versions
    (the larger ``ts`` must win)."""
    rng = random.Random(seed)
    ts = 1_000
    next_key = 0
    live: set[str] = set()
    deleted: list[str] = []
    out = []

    def row(key: str, *, delete: bool = False) -> dict[str, Any]:
        nonlocal ts
        ts += 1
        return {
            KEY: key,
            "name": f"name-{key}-{ts}",
            "amount": round(rng.uniform(0, 1000), 2),
            "region": rng.choice(REGIONS),
            PRECOMBINE: ts,
            DELETE: delete,
        }

    for b in range(n_batches):
        batch: list[dict[str, Any]] = []
        if b == 0:
            n_new, updates, deletes = rows, [], []
        else:
            pool = sorted(live)
            updates = rng.sample(pool, max(1, len(pool) // 3))
            rest = sorted(set(pool) - set(updates))
            deletes = rng.sample(rest, max(1, len(pool) // 10))
            n_new = rows // 2
        for _ in range(n_new):
            key = f"k{next_key:06d}"
            next_key += 1
            batch.append(row(key))
        for key in updates:
            batch.append(row(key))
        if deleted:  # a deleted key comes back
            batch.append(row(deleted.pop(0)))
        for key in deletes:
            batch.append(row(key, delete=True))
        # in-batch duplicates: an older version first, then a newer one
        for key in rng.sample([r[KEY] for r in batch if not r[DELETE]], 5):
            batch.append(row(key))
        rng.shuffle(batch)
        # rows of duplicated keys were appended in ts order; shuffling keeps ts the judge
        state = rows_by_key(expected_rows([pa.Table.from_pylist(batch, schema=SCHEMA)]))
        live |= set(state)
        live -= set(deletes)
        deleted.extend(deletes)
        out.append(pa.Table.from_pylist(batch, schema=SCHEMA))
    return out


def write_batch(batch: pa.Table, folder: str, name: str = "part-00000.parquet") -> str:
    """Write one batch as a folder holding one Parquet file; returns the folder."""
    os.makedirs(folder, exist_ok=True)
    pq.write_table(batch, os.path.join(folder, name))
    return folder


def expected_rows(
    batches: Iterable[pa.Table], key: str = KEY, precombine: str = PRECOMBINE, delete: str | None = DELETE
) -> list[dict[str, Any]]:
    """The oracle: batches reduced by key, largest precombine wins, deletes drop the key.
    Rows sorted by key."""
    best: dict[Any, dict[str, Any]] = {}
    for batch in batches:
        for r in batch.to_pylist():
            cur = best.get(r[key])
            if cur is None or r[precombine] > cur[precombine]:
                best[r[key]] = r
    live = [r for r in best.values() if not (delete and r.get(delete))]
    return sorted(live, key=lambda r: r[key])


def table_rows(table_uri: str, columns: Iterable[str] | None = None, as_of: str | None = None) -> list[dict[str, Any]]:
    """The snapshot's rows, read with pyarrow from the files the timeline lists, without
    the format's internal ``_bi_`` columns; sorted by :data:`KEY` when present."""
    from spark_jobs.table import Table

    t = Table.load(table_uri)
    parts = []
    for s in t.view(as_of).slices():
        tbl = pq.read_table(t.abs(s.path), filesystem=t.io.fs)
        keep = [c for c in tbl.column_names if not c.startswith(INTERNAL_PREFIX)]
        parts.append(tbl.select(keep))
    if not parts:
        return []
    rows = pa.concat_tables(parts, promote_options="permissive").to_pylist()
    if columns is not None:
        cols = list(columns)
        rows = [{c: r.get(c) for c in cols} for r in rows]
    if rows and KEY in rows[0]:
        rows.sort(key=lambda r: r[KEY])
    return rows


def rows_by_key(rows: Iterable[dict[str, Any]], key: str = KEY) -> dict[Any, dict[str, Any]]:
    return {r[key]: r for r in rows}


def compare(table_uri: str, batches: Iterable[pa.Table]) -> list[str]:
    """Differences between the table and the oracle (empty when they agree). Compares
    the source columns the table stores (the delete flag may or may not be stored)."""
    expected = expected_rows(batches)
    actual = table_rows(table_uri)
    problems = []
    stored = set(actual[0]) if actual else set(SCHEMA.names)
    missing = [c for c in SCHEMA.names if c not in stored and c != DELETE]
    if missing:
        problems.append(f"table lacks source columns {missing}")
    cols = [c for c in SCHEMA.names if c in stored]
    exp = {r[KEY]: {c: r[c] for c in cols} for r in expected}
    act: dict[Any, dict[str, Any]] = {}
    for r in actual:
        if r[KEY] in act:
            problems.append(f"key {r[KEY]} appears more than once")
        act[r[KEY]] = {c: r.get(c) for c in cols}
    for k in sorted(set(exp) - set(act)):
        problems.append(f"key {k} missing")
    for k in sorted(set(act) - set(exp)):
        problems.append(f"key {k} should not be there")
    for k in sorted(set(exp) & set(act)):
        if exp[k] != act[k]:
            problems.append(f"key {k}: expected {exp[k]}, got {act[k]}")
    return problems
