"""Partial updates (``--partial-update``, format.md §5.1 and §8) on the Arrow engine, against an
oracle that applies the batches in order and keeps the stored values of the columns a batch lacks.

Histories interleave full and partial batches carrying different column subsets, with a
zone-aware timestamp as the precombine field, stale partial rows, in-batch duplicates,
inserts through a partial batch (nulls), deletes in a partial batch and re-inserts, partial
rows moving their key to another partition (stored values fetched from the old one); the
lacking columns include a decimal and a list. Every instant is read back (``read_arrow
--as-of``) on both table types and three index types; then compaction leaves the snapshot
unchanged, and validate passes. The refusals run through the CLI and leave the table tree
as it was. The Spark engine and Spark's reader: tests/spark/test_partial_update_spark.py.
"""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.compact import run_compact
from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.merge import LOG_COLUMNS_KEY
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.harness.cli import run_cli

pytestmark = pytest.mark.unit

TOKYO = "Asia/Tokyo"
SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.timestamp("us", tz=TOKYO)),
                    ("amount", pa.decimal128(12, 2)), ("tags", pa.list_(pa.string())), ("note", pa.string()),
                    ("is_deleted", pa.bool_())])
COLUMNS = [f.name for f in SCHEMA if f.name != "is_deleted"]
KEYS = [f"order {i:02d}/é+%{'東' if i % 2 else 'x'}" for i in range(12)]
REGIONS = ["São Paulo", "a/b %+", "東京 west"]
MOVED = "moved/é %+"
T0 = datetime(2026, 11, 25, 9, 0, tzinfo=timezone(timedelta(hours=9)))


def t(minutes: int | None) -> datetime | None:
    return None if minutes is None else T0 + timedelta(minutes=minutes)


def row(i: int, ts: int | None, **values: Any) -> dict[str, Any]:
    """A row of key ``i`` (its region fixed by the key: partial rows never move)."""
    return {"id": KEYS[i], "region": REGIONS[i % 3], "ts": t(ts), "is_deleted": False, **values}


def moved(i: int, ts: int | None, **values: Any) -> dict[str, Any]:
    """A row of key ``i`` in partition :data:`MOVED` (not its own)."""
    return {**row(i, ts, **values), "region": MOVED}


def full(i: int, ts: int | None, *, n: int, deleted: bool = False) -> dict[str, Any]:
    return row(i, ts, amount=Decimal(f"{n}.{i:02d}"), tags=[f"t{n}", f"k{i} /%"], note=f"note {n} é",
               is_deleted=deleted)


# (partial?, rows); a partial batch's columns are those of its rows (every row the same)
HISTORY: list[tuple[bool, list[dict[str, Any]]]] = [
    (False, [full(i, 10 + i, n=1) for i in range(10)] + [full(11, None, n=1)]),
    # note only: updates, a stale row (5), an insert (10), an in-batch duplicate (1: the later ts wins),
    # a null precombine value after a stored one (2: stale, nulls lowest), the null-ts key (11) updated
    (True, [row(0, 20, note="p2 a"), row(1, 21, note="p2 dup low"), row(1, 25, note="p2 dup high"),
            row(2, None, note="p2 null ts"), row(4, 24, note="p2 e"), row(5, 1, note="p2 stale"),
            row(10, 30, note="p2 insert"), row(11, 5, note="p2 after null")]),
    # full: an update, a delete
    (False, [full(2, 40, n=3), full(3, 40, n=3, deleted=True)]),
    # amount and tags only (the decimal and the list lacking elsewhere): updates, a re-insert of the
    # deleted key (its note is null), a stale row (4), a delete (6), an insert with null tags
    (True, [row(0, 50, amount=Decimal("500.50"), tags=["p4"]), row(2, 41, amount=Decimal("2.22"), tags=None),
            row(3, 1, amount=Decimal("3.33"), tags=["back"]), row(4, 23, amount=Decimal("4.44"), tags=["stale"]),
            row(6, 60, amount=None, tags=None, is_deleted=True), row(10, 31, amount=Decimal("10.10"), tags=[])]),
    # note again: a tie on the precombine value is accepted (0), an insert (9 exists; 7 updated)
    (True, [row(0, 50, note="p5 tie"), row(7, 70, note="p5 g"), row(6, 70, note="p5 reinsert")]),
    # full rows of keys a partial log touched
    (False, [full(0, 80, n=6), full(10, 20, n=6)]),
    # partial rows changing their partition value: record and global_simple move the key, taking its
    # stored values along (a stale move -- 9 -- is dropped); bucket: new identities (nulls)
    (True, [moved(7, 100, note="p7 moved"), moved(8, 100, note="p7 moved"), moved(9, 1, note="p7 stale move")]),
    # into the group those moves opened: an in-place partial update beside a key moving in
    (True, [moved(7, 110, amount=Decimal("7.77"), tags=["p8"]), moved(5, 110, amount=None, tags=["p8 moved"])]),
]


def oracle(history: list[tuple[bool, list[dict[str, Any]]]], *, bucket: bool) -> dict[Any, dict[str, Any]]:
    """The table after ``history``: per batch the highest ts wins per identity; a row older than
    the stored one is stale (nulls lowest, ties accepted); a delete removes; a partial row
    overlays its columns onto the stored row (nulls for a new one)."""
    def ident(r: dict[str, Any]) -> Any:
        return (r["region"], r["id"]) if bucket else r["id"]

    def order(v: datetime | None) -> tuple:
        return (0,) if v is None else (1, v)

    state: dict[Any, dict[str, Any]] = {}
    for _, batch in history:
        winners: dict[Any, dict[str, Any]] = {}
        for r in batch:
            cur = winners.get(ident(r))
            if cur is None or order(r["ts"]) > order(cur["ts"]):
                winners[ident(r)] = r
        for k, r in winners.items():
            stored = state.get(k)
            if stored is not None and order(stored["ts"]) > order(r["ts"]):
                continue
            if r["is_deleted"]:
                state.pop(k, None)
                continue
            new = dict(stored) if stored is not None else dict.fromkeys(COLUMNS)
            new.update({c: v for c, v in r.items() if c != "is_deleted"})
            state[k] = new
    return state


def write(path: Path, rows: list[dict[str, Any]]) -> str:
    cols = list(rows[0])
    assert all(list(r) == cols for r in rows), "a batch's rows carry the same columns"
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([SCHEMA.field(c) for c in cols])), path)
    return str(path)


def snapshot(uri: str, as_of: str | None = None, *, bucket: bool) -> dict[Any, dict[str, Any]]:
    out = {}
    for r in read_arrow(uri, as_of).to_pylist():
        k = (r["region"], r["id"]) if bucket else r["id"]
        assert k not in out, f"{k!r} twice"
        out[k] = r
    return out


def opts(uri: str, src: str, *, index: str, table_type: str, partial: bool, batch: int) -> UpsertOptions:
    return UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
                         index=index, num_buckets=2, table_type=table_type, delete_field="is_deleted",
                         batch_id=f"b{batch}", target_file_rows=4, partial_update=partial, engine="arrow",
                         # partial logs are kept until the test's own compaction folds them
                         auto_compact="off" if table_type == "merge_on_read" else None)


def partial_logs(uri: str) -> int:
    """Logs of the latest snapshot that name their columns (partial logs)."""
    table = Table.load(uri)
    n = 0
    for s in table.view().slices():
        for lf in s.logs:
            md = pq.read_schema(table.abs(lf.path)).metadata or {}
            n += LOG_COLUMNS_KEY in md
    return n


@pytest.mark.parametrize("table_type,index", [
    ("copy_on_write", "record"), ("merge_on_read", "record"), ("merge_on_read", "bucket"),
    ("copy_on_write", "bucket"), ("merge_on_read", "global_simple"), ("copy_on_write", "global_simple"),
])
def test_partial_history_equals_oracle_at_every_instant_and_through_compaction(tmp_path, table_type, index):
    uri = str(tmp_path / "t")
    bucket = index == "bucket"
    instants = []
    for n, (partial, rows) in enumerate(HISTORY, start=1):
        src = write(tmp_path / f"b{n}.parquet", rows)
        res = arrow_upsert(opts(uri, src, index=index, table_type=table_type, partial=partial, batch=n))
        instants.append(res["instant"])
        assert snapshot(uri, bucket=bucket) == oracle(HISTORY[:n], bucket=bucket), n
    for n, instant in enumerate(instants, start=1):  # every instant again, as of its time
        assert snapshot(uri, instant, bucket=bucket) == oracle(HISTORY[:n], bucket=bucket), n
    expected = oracle(HISTORY, bucket=bucket)
    assert run_validate(uri)["ok"]
    if table_type == "merge_on_read":
        assert partial_logs(uri) > 0  # the history did write partial logs that the reads merged
        res = run_compact(uri, policy=CompactionPolicy(min_logs=1, min_deltas=2))
        assert res["instant"] is not None
        assert partial_logs(uri) == 0
        assert snapshot(uri, bucket=bucket) == expected
        assert run_validate(uri)["ok"]
    # a partial batch after compaction (or on top of copy-on-write's rewritten files)
    after = [(True, [row(0, 90, amount=None, tags=["after"]), row(8, 90, amount=Decimal("8.88"), tags=["after"])])]
    src = write(tmp_path / "after.parquet", after[0][1])
    arrow_upsert(opts(uri, src, index=index, table_type=table_type, partial=True, batch=99))
    assert snapshot(uri, bucket=bucket) == oracle(HISTORY + after, bucket=bucket)
    assert run_validate(uri)["ok"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli("upsert", *args, "--engine", "arrow", timeout=120)


def test_refusals_exit_2_with_one_line_and_the_table_unchanged(tmp_path):
    from tests.spark.conftest import tree_digest

    uri = str(tmp_path / "t")
    arrow_upsert(opts(uri, write(tmp_path / "b1.parquet", HISTORY[0][1]), index="record",
                      table_type="merge_on_read", partial=False, batch=1))
    before = tree_digest(tmp_path / "t")
    base = ["--record-key", "id", "--precombine-field", "ts", "--partition-field", "region"]
    cases = [
        ({"region": "São Paulo", "ts": t(99), "note": "no key"}, ["--partial-update"],
         "record key field 'id' is not in the source"),
        ({"id": KEYS[0], "ts": t(99), "note": "no partition"}, ["--partial-update"],
         "partition field 'region' is not in the source"),
        ({"id": KEYS[0], "region": REGIONS[0], "note": "no precombine"}, ["--partial-update"],
         "precombine field 'ts' is not in the source"),
        ({"id": KEYS[0], "region": REGIONS[0], "ts": t(99), "note": "not partial"}, [],
         "the batch lacks columns amount, tags that the table has"),
    ]
    for n, (r, flags, needle) in enumerate(cases):
        src = write(tmp_path / f"bad{n}.parquet", [r])
        p = _cli(uri, src, *base, *flags)
        assert p.returncode == 2, (n, p.stderr)
        assert p.stderr.strip().count("\n") == 0 and needle in p.stderr, (n, p.stderr)
        if not flags:
            assert "--partial-update" in p.stderr
        assert tree_digest(tmp_path / "t") == before
    # the same batch with --partial-update is applied
    src = write(tmp_path / "good.parquet", [cases[-1][0]])
    p = _cli(uri, src, *base, "--partial-update")
    assert p.returncode == 0, p.stderr
    got = snapshot(uri, bucket=False)[KEYS[0]]
    assert got["note"] == "not partial" and got["amount"] == Decimal("1.00") and got["tags"] == ["t1", "k0 /%"]


class _TI:
    """What the operator reads of its task instance (its batch id) and writes (XCom)."""

    #: the real task instance's metric tags (ResumableJobMixin reads them)
    stats_tags: dict[str, str] = {}

    def __init__(self, run_id: str) -> None:
        self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number = "ingest", run_id, "upsert", -1, 1
        self.pushed: dict[str, object] = {}

    def xcom_push(self, key, value):  # type: ignore[no-untyped-def]
        self.pushed[key] = value


def test_the_upsert_operator_passes_partial_update_to_both_engines(tmp_path, monkeypatch):
    from airflow_provider_bucketindex.demo import sandbox

    sandbox.isolate_before_import()
    from airflow_provider_bucketindex.operators import UpsertWithIndexOperator

    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    uri = str(tmp_path / "t")
    arrow_upsert(opts(uri, write(tmp_path / "b1.parquet", HISTORY[0][1]), index="record",
                      table_type="copy_on_write", partial=False, batch=1))
    src = write(tmp_path / "b2.parquet", [row(0, 99, note="from airflow"), row(10, 99, note="new")])
    kw = {"task_id": "upsert", "table_uri": uri, "source_uri": src, "delete_field": "is_deleted",
          "partial_update": True}
    assert "--partial-update" in UpsertWithIndexOperator(**kw, engine="spark").spark_submit_command("b")
    assert "--partial-update" not in UpsertWithIndexOperator(**{**kw, "partial_update": False},
                                                             engine="spark").spark_submit_command("b")
    out = UpsertWithIndexOperator(**kw).execute({"ti": _TI("r1")})
    assert out["engine"] == "arrow" and (out["updated"], out["inserted"]) == (1, 1)
    got = snapshot(uri, bucket=False)
    assert got[KEYS[0]]["note"] == "from airflow" and got[KEYS[0]]["tags"] == ["t1", "k0 /%"]
    assert got[KEYS[10]]["amount"] is None and got[KEYS[10]]["note"] == "new"
