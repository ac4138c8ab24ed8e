"""Time travel by time (issue 24 item 3): ``read --as-of`` and ``read_arrow(as_of=...)`` take an
instant or an ISO-8601 time (with or without a zone; no zone is UTC, the instants' clock) and
return the snapshot a reader at that time could see; anything else, or a time before the first
commit, is refused with one line (exit 2). Arrow engine only: real upserts, no JVM."""

from __future__ import annotations

import datetime as dt
import json
import time
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.cli import main
from spark_jobs.exceptions import BadInputError
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action, parse_as_of, resolve_as_of
from tests.oracle import reduce_batches, rows_by_identity

SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64()),
                    ("amount", pa.decimal128(12, 2)), ("at", pa.timestamp("us", tz="Asia/Kolkata")),
                    ("is_deleted", pa.bool_())])
KEY = "k{:02d} /%+é"
REGIONS = ["eu west/1", "sã%o+paulo", None]


def _batch(lo: int, hi: int, ts: int, *, deletes: int = 0) -> list[dict]:
    return [{"id": KEY.format(i), "region": REGIONS[i % 3], "ts": ts, "amount": Decimal(i) / 4,
             "at": dt.datetime(2026, 3, 29, 0, 30, tzinfo=dt.timezone.utc), "is_deleted": i < lo + deletes}
            for i in range(lo, hi)]


BATCHES = [_batch(0, 12, 1), _batch(6, 20, 2, deletes=2), _batch(15, 25, 3, deletes=1)]


def _utc(instant: str) -> dt.datetime:
    """A 17-digit instant (or completion time) as an aware UTC datetime."""
    return dt.datetime.strptime(instant[:14], "%Y%m%d%H%M%S").replace(
        microsecond=int(instant[14:17]) * 1000, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A table of three Arrow upserts, a few milliseconds apart; its completion times."""
    root = tmp_path_factory.mktemp("tt")
    uri = str(root / "t")
    for n, rows in enumerate(BATCHES):
        src = root / f"b{n}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), src)
        run_upsert(UpsertOptions(table=uri, source=str(src), record_key=["id"], precombine_field="ts",
                                 partition_field="region", delete_field="is_deleted", batch_id=f"b{n}",
                                 num_buckets=2, table_type="copy_on_write"))  # one entry per upsert
        time.sleep(0.05)
    assert run_validate(uri)["ok"]
    tl = Table.load(uri).timeline.reload()
    entries = [tl.entry(s) for s in range(1, tl.last_seq + 1)]
    assert [e["action"] for e in entries] == [Action.COMMIT] * 3
    done = [e["completed"] for e in entries]  # recorded at the commit point, UTC, the instants' form
    assert all(e["instant"] <= c for e, c in zip(entries, done)) and done == sorted(done)
    return uri, entries, done


def _oracle(n: int) -> dict:
    return reduce_batches(BATCHES[:n])


def _rows(table: pa.Table) -> dict:
    return rows_by_identity(table.to_pylist())


def test_read_arrow_by_time_equals_each_snapshot(history):
    uri, entries, done = history
    for n, completed in enumerate(done, start=1):
        at = _utc(completed)
        assert _rows(read_arrow(uri, as_of=completed)) == _oracle(n)  # an instant: by commit order
        for form in (at.strftime("%Y-%m-%dT%H:%M:%S.%f"),  # no zone: UTC
                     at.isoformat(),  # +00:00
                     at.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z",
                     at.astimezone(dt.timezone(dt.timedelta(hours=5, minutes=30))).isoformat(),
                     at.astimezone(dt.timezone(-dt.timedelta(hours=3))).isoformat().replace("T", " ")):
            assert _rows(read_arrow(uri, as_of=form)) == _oracle(n), form  # exactly at the commit
        later = at + dt.timedelta(milliseconds=1)  # between this commit and the next
        if n < len(done):
            assert later < _utc(done[n])
        assert _rows(read_arrow(uri, as_of=later.isoformat())) == _oracle(n)
        before = at - dt.timedelta(milliseconds=1)  # a millisecond before it completed: the previous one
        if n > 1:
            assert before >= _utc(done[n - 2])
            assert _rows(read_arrow(uri, as_of=before.isoformat())) == _oracle(n - 1)


def test_cli_read_as_of_time_writes_the_snapshot(history, tmp_path, capsys):
    uri, entries, done = history
    at = _utc(done[1]).astimezone(dt.timezone(dt.timedelta(hours=1)))
    out = tmp_path / "snap.parquet"
    assert main(["read", uri, "--as-of", at.isoformat(), "--output", str(out), "--engine", "arrow"]) == 0
    assert _rows(pq.read_table(out)) == _oracle(2)
    # the printed form (no --output) goes through the same resolution
    assert main(["read", uri, "--as-of", at.strftime("%Y-%m-%d %H:%M:%S.%f%z"), "--limit", "50"]) == 0
    printed = capsys.readouterr().out
    assert KEY.format(19) in printed and KEY.format(20) not in printed  # batch 3 inserted 20..24


def test_minute_and_date_forms(history):
    uri, entries, done = history
    last = _utc(done[-1])
    minute_after = (last + dt.timedelta(minutes=1)).strftime("%Y-%m-%d %H:%M")
    assert _rows(read_arrow(uri, as_of=minute_after)) == _oracle(3)
    tomorrow = (last + dt.timedelta(days=1)).date().isoformat()  # a date: its midnight, UTC
    assert _rows(read_arrow(uri, as_of=tomorrow)) == _oracle(3)


def test_before_the_first_commit_and_garbage_exit_2(history, capsys):
    uri, entries, done = history
    snapshot = sorted(p.name for p in Path(uri).rglob("*"))
    first = _utc(done[0])
    early = (first - dt.timedelta(seconds=1)).isoformat()
    assert main(["read", uri, "--as-of", early]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no completed instant at or before it" in err[0]
    assert entries[0]["instant"] in err[0] and first.strftime("%Y-%m-%dT%H:%M:%S") in err[0]
    for bad in ("yesterday", "2026-13-01", "2026-11-25T25:00", "20261125", "1700000000", "2026-11-25T09:24+25:00",
                "next tuesday", ""):
        assert main(["read", uri, "--as-of", bad]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--as-of must be an instant or a time: " in err[0], err
        assert f"{bad!r} is not an instant (17 digits" in err[0], err
        assert "ISO-8601" in err[0] and "UTC" in err[0]
    assert sorted(p.name for p in Path(uri).rglob("*")) == snapshot  # nothing written
    with pytest.raises(BadInputError, match="no completed instant"):
        read_arrow(uri, as_of=early)


def test_parse_forms():
    utc = dt.timezone.utc
    assert parse_as_of("20261125092400123") == "20261125092400123"
    assert parse_as_of("2026-11-25T09:24:00") == dt.datetime(2026, 11, 25, 9, 24, tzinfo=utc)
    assert parse_as_of("2026-11-25 09:24") == dt.datetime(2026, 11, 25, 9, 24, tzinfo=utc)
    assert parse_as_of("2026-11-25T09:24:00+01:00") == dt.datetime(2026, 11, 25, 8, 24, tzinfo=utc)
    assert parse_as_of("2026-11-25T09:24:00-0230") == dt.datetime(2026, 11, 25, 11, 54, tzinfo=utc)
    assert parse_as_of("2026-11-25T09:24:00.5Z") == dt.datetime(2026, 11, 25, 9, 24, 0, 500000, tzinfo=utc)
    assert parse_as_of("2026-11-25") == dt.datetime(2026, 11, 25, tzinfo=utc)
    assert parse_as_of("2026", option="--since", instant_prefix=True) == "2026"  # --since's leading digits
    with pytest.raises(BadInputError, match="--as-of must be an instant or a time: '2026' is not an instant"):
        parse_as_of("2026")


def test_a_commit_requested_before_t_but_completed_after_t_is_not_in_it(tmp_path):
    """Instants are request times; a reader at T saw only what had *completed*: the commit
    requested first but completed after T is left out by time, kept by instant."""
    uri = str(tmp_path / "t")
    src = tmp_path / "b0.parquet"
    pq.write_table(pa.Table.from_pylist(BATCHES[0], schema=SCHEMA), src)
    opts = dict(record_key=["id"], precombine_field="ts", partition_field="region", delete_field="is_deleted",
                table_type="copy_on_write")  # one entry per upsert: the sequence below is exact
    run_upsert(UpsertOptions(table=uri, source=str(src), batch_id="b0", **opts))
    table = Table.load(uri)
    slow = table.timeline.create_requested(Action.COMPACTION, {"file_groups": [], "index_buckets": []})
    time.sleep(0.02)
    src1 = tmp_path / "b1.parquet"
    pq.write_table(pa.Table.from_pylist(BATCHES[1], schema=SCHEMA), src1)
    run_upsert(UpsertOptions(table=uri, source=str(src1), batch_id="b1", **opts))
    time.sleep(0.02)
    between = dt.datetime.now(dt.timezone.utc)
    time.sleep(0.02)
    table.timeline.complete(slow, {"file_groups": [], "index": {"added": [], "removed": []}})
    tl = Table.load(uri).timeline
    assert [tl.entry(s)["instant"] for s in (1, 2, 3)][2] < tl.entry(2)["instant"]  # completed out of order
    assert resolve_as_of(tl, between.isoformat()).seq == 2  # the slow action had not completed
    assert resolve_as_of(tl, tl.entry(2)["instant"]).seq == 3  # by instant: commit order, it is in
    assert _rows(read_arrow(uri, as_of=between.isoformat())) == _oracle(2)
    # --since a time: only what completed after it (nothing written after `between`)
    assert main(["shadow-compare", uri, "--since", between.isoformat(), "--engine", "arrow"]) == 0


def test_shadow_compare_since_time_counts_the_commits_after_it(history, capsys):
    uri, entries, done = history
    after_first = (_utc(done[0]) + dt.timedelta(milliseconds=1)).isoformat()
    assert main(["shadow-compare", uri, "--since", after_first, "--engine", "arrow"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["commits_since"] == 2 and report["since"] == after_first
    assert main(["shadow-compare", uri, "--since", "soon", "--engine", "arrow"]) == 2
    assert "--since must be an instant or a time: 'soon' is not an instant" in capsys.readouterr().err
