"""A merge-on-read delete is logged only when it is not older than its key's stored row
(format.md §5.1). The writer used to read the slice's key and precombine columns for every
group a delete touched (2.4 GB for a 1M-row batch into 100M rows: docs/benchmarks.md); now a
delete not older than the greatest precombine value the slice's footers record needs no read.

These tests hold the shortcut to the slow path's answer: the bound against the stored column
read whole, the table against the oracle (the batches reduced by key) and ``validate``, with
deletes newer than everything (no read), newer than their row but not than the slice (read),
and older than their row (read, ignored)."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.arrow_engine.validate import run_validate as arrow_validate
from spark_jobs.kernels import tasks
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow, slice_value_bound
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView
from tests.oracle import reduce_batches, rows_by_identity

pytestmark = pytest.mark.unit

T0 = datetime(2024, 3, 31, 1, 30, tzinfo=timezone(timedelta(hours=2)))
KEYS = [f"order {i:03d}/é+%{'x' * (i % 3) * 40}" for i in range(60)]
REGIONS = ["eu west/1", "", None, "zürich %2F+"]


def _row(i: int, ts: datetime, *, deleted: bool = False, amount: float = 0.0) -> dict:
    return {"id": KEYS[i], "region": REGIONS[i % len(REGIONS)], "ts": ts, "amount": amount, "is_deleted": deleted}


def _write(path: Path, rows: list[dict]) -> str:
    schema = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.timestamp("us", tz="+02:00")),
                        ("amount", pa.float64()), ("is_deleted", pa.bool_())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def _opts(uri: str, src: str, batch: str) -> UpsertOptions:
    return UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
                         delete_field="is_deleted", batch_id=batch, table_type="merge_on_read", target_file_rows=10)


@pytest.fixture()
def slice_reads(monkeypatch):  # type: ignore[no-untyped-def]
    """Every slice read of the log writer (``append_log``), recorded; the read itself still runs.
    (Automatic compaction after the commit reads the slices it folds: not counted.)"""
    calls: list[str] = []
    real = tasks.read_slice

    def spy(t, base, logs, **kw):  # type: ignore[no-untyped-def]
        if sys._getframe(1).f_code.co_name == "append_log":
            calls.append(base)
        return real(t, base, logs, **kw)

    monkeypatch.setattr(tasks, "read_slice", spy)
    return calls


def _slices(uri: str) -> list[tuple[str, list[str]]]:
    view = FileSystemView.build(Table.load(uri).timeline)
    return [(s.path, [lf.path for lf in s.logs]) for s in view.slices()]


def test_deletes_newer_than_every_stored_value_read_no_slice(tmp_path, slice_reads):  # type: ignore[no-untyped-def]
    uri = str(tmp_path / "t b/é")
    b1 = [_row(i, T0 + timedelta(minutes=i), amount=float(i)) for i in range(60)]
    # updates of some keys (one in-place log per touched group), one of them stale
    b2 = [_row(i, T0 + timedelta(hours=1, minutes=i), amount=-1.0) for i in range(0, 60, 3)]
    b2.append(_row(1, T0 - timedelta(days=1), amount=99.0))  # older than its row: loses
    arrow_upsert(_opts(uri, _write(tmp_path / "b1.parquet", b1), "b1"))
    arrow_upsert(_opts(uri, _write(tmp_path / "b2.parquet", b2), "b2"))
    slice_reads.clear()
    # deletes later than anything the table holds: provably effective from the footers
    b3 = [_row(i, T0 + timedelta(days=2), deleted=True) for i in range(0, 60, 4)]
    res = arrow_upsert(_opts(uri, _write(tmp_path / "b3.parquet", b3), "b3"))
    assert slice_reads == [], "a delete newer than the slice's footers' bound read the slice"
    want = reduce_batches([b1, b2, b3])
    assert rows_by_identity(read_arrow(uri).to_pylist()) == want
    assert res["counts"]["deleted"] == len(b3) == 15  # every delete counted, as the read would count it
    assert res["ignored"]["stale_or_absent_deletes"] == 0
    assert arrow_validate(uri)["ok"]


def test_a_delete_older_than_the_slice_but_not_its_row_reads_and_applies(tmp_path, slice_reads):  # type: ignore[no-untyped-def]
    uri = str(tmp_path / "t")
    b1 = [_row(i, T0 + timedelta(minutes=i)) for i in range(60)]
    arrow_upsert(_opts(uri, _write(tmp_path / "b1.parquet", b1), "b1"))
    slice_reads.clear()
    # key 0's row is the oldest of its group: a delete between it and the group's newest row
    # is effective but cannot be proved from the footers, so the slice is read
    b2 = [_row(0, T0 + timedelta(seconds=30), deleted=True), _row(4, T0 - timedelta(hours=1), deleted=True)]
    res = arrow_upsert(_opts(uri, _write(tmp_path / "b2.parquet", b2), "b2"))
    assert slice_reads, "a delete the footers cannot prove effective did not read the slice"
    assert res["counts"]["deleted"] == 1 and res["ignored"]["stale_or_absent_deletes"] == 1
    got = rows_by_identity(read_arrow(uri).to_pylist())
    want = reduce_batches([b1, b2])
    assert got == want
    assert KEYS[0] not in {k for k in (r["id"] for r in got.values())}  # applied
    assert KEYS[4] in {r["id"] for r in got.values()}  # stale delete ignored
    assert arrow_validate(uri)["ok"]


def test_the_bound_is_the_greatest_stored_value_or_none(tmp_path):  # type: ignore[no-untyped-def]
    uri = str(tmp_path / "t")
    b1 = [_row(i, T0 + timedelta(minutes=(i * 7) % 60)) for i in range(60)]
    b2 = [_row(i, T0 + timedelta(hours=3, minutes=i)) for i in range(0, 60, 5)]
    arrow_upsert(_opts(uri, _write(tmp_path / "b1.parquet", b1), "b1"))
    arrow_upsert(_opts(uri, _write(tmp_path / "b2.parquet", b2), "b2"))
    t = Table.load(uri)
    schema = read_arrow(uri).schema
    checked = 0
    for base, logs in _slices(uri):
        stored = pa.concat_tables([pq.read_table(t.abs(f), columns=["ts"]).cast(pa.schema([schema.field("ts")]))
                                   for f in [base, *logs]])
        bound = slice_value_bound(t, base, logs, column="ts", schema=schema)
        assert bound is not None and bound.type == schema.field("ts").type
        assert bound[0].as_py() == pc.max(stored.column("ts")).as_py()
        # a float column's footer max leaves NaN out (§8 ranks it highest): no bound
        assert slice_value_bound(t, base, logs, column="amount", schema=schema) is None
        checked += 1 + len(logs)
    assert checked > len(_slices(uri))  # some slices had logs


@pytest.mark.parametrize("typ, values", [
    (pa.int64(), [3, None, -7]),
    (pa.date32(), [date(2024, 1, 2), date(1969, 12, 31), None]),
    (pa.timestamp("ms", tz="America/New_York"), [datetime(2024, 11, 3, 1, 30, tzinfo=timezone.utc), None]),
    (pa.int32(), [None, None]),
])
def test_the_bound_of_each_exact_type_from_a_written_file(tmp_path, typ, values):  # type: ignore[no-untyped-def]
    """The footers' bound equals the column's max (null when all null), per type, several row groups."""
    uri = str(tmp_path / "t")
    arrow_upsert(UpsertOptions(table=uri, source=_write(tmp_path / "b.parquet", [_row(0, T0)]), record_key=["id"],
                               table_type="merge_on_read"))
    t = Table.load(uri)
    col = pa.array(values * 5, type=typ)
    pq.write_table(pa.table({"v": col}), t.abs("probe.parquet"), row_group_size=2)
    bound = slice_value_bound(t, "probe.parquet", [], column="v", schema=pa.schema([("v", typ)]))
    assert bound is not None
    assert bound[0].as_py() == pc.max(col).as_py()
