"""The Iceberg projection (issue 39 items 1 and 3): ``metadata/v<seq>.metadata.json`` written
after each commit point with pyiceberg's own writers, read back by pyiceberg and by Polars.

For every sequence entry ``v``: ``StaticTable.from_metadata(v<v>.metadata.json)`` -- and the
latest metadata's ``scan(snapshot_id=v)`` and ``snapshot_as_of_timestamp`` -- must equal the
snapshot right after entry ``v``: ``read_arrow(uri, as_of=...)`` (the table's own reader, by
instant and by time) for copy-on-write, and for merge-on-read the read-optimized view (bases
only, read with plain pyarrow: ``tests.harness.delta_reads``). The latest state also equals the
oracle (the batches reduced by key). Snapshots older than clean's retained window are refused
by the table's reader and list files clean deleted, so both fail.

Arrow engine only, in process (``spark_jobs.cli.main``) except the SIGKILL between a commit
point and its metadata write.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.cli import main
from spark_jobs.exceptions import BadInputError
from spark_jobs.table import Table, delta, iceberg
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.timeline import completion_floors, instant_to_iso, resolve_as_of
from spark_jobs.table.view import FileSystemView
from tests.harness.delta_reads import read_optimized, read_view
from tests.harness.delta_reads import sorted_rows as _rows
from tests.oracle import reduce_batches, rows_by_identity

pyiceberg_table = pytest.importorskip("pyiceberg.table")
StaticTable = pyiceberg_table.StaticTable

pytestmark = [pytest.mark.unit,
              # Polars plans through pyiceberg without its optional planner plugin: a warning, not a defect
              pytest.mark.filterwarnings("ignore:Iceberg scan planning")]

#: partition values as users have them: spaces, '/', '%', '+', non-ASCII, null, ""
REGIONS = ["eu west", "a/b", "100%", "x+y", "são paulo", None, ""]
KEY_ARGS = ["--record-key", "id", "--precombine-field", "ts", "--partition-field", "region",
            "--delete-field", "is_deleted", "--engine", "arrow"]
#: every kind of string partition value the table accepts (as tests/unit/test_delta_exact.py)
COUNTRIES = [None, "", "__NULL__", "__HIVE_DEFAULT_PARTITION__", "é" * 150 + " long", "são paulo", "日本",
             "a/b %2F+c=d e", "=", "%", " "]
ARGS = ["--record-key", "id", "--precombine-field", "ts", "--engine", "arrow"]


def _row(i: int, region: str | None, ts: int, *, deleted: bool = False, **more: object) -> dict:
    return {"id": f"k {i:03d}/é+%", "region": region, "ts": ts, "amount": float(i) + ts / 10,
            "is_deleted": deleted, **more}


def _write(tmp: Path, name: str, rows: list[dict], schema: pa.Schema | None = None) -> str:
    path = tmp / "src" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def _cli(*argv: str) -> None:
    assert main(list(argv)) == 0, argv


def _upsert(uri: str, tmp: Path, batch: str, rows: list[dict], *extra: str) -> None:
    _cli("upsert", uri, _write(tmp, batch, rows), *KEY_ARGS, "--batch-id", batch, *extra)


def _polars(st: object, snapshot_id: int) -> pa.Table:
    """Polars' own Parquet reader on the snapshot pyiceberg plans (a second reader)."""
    import polars as pl

    return pl.scan_iceberg(st, snapshot_id=snapshot_id).collect().to_arrow()


def check_every_snapshot(uri: str, *, second_reader: bool = True) -> int:
    """Every metadata version equals the snapshot of its sequence entry; returns how many
    versions were compared (retained ones)."""
    table = Table.load(uri)
    tl = table.timeline.reload()
    last = tl.last_seq
    assert iceberg.versions_present(table) == list(range(last + 1)), "no gap, version == sequence"
    latest = StaticTable.from_metadata(uri)  # the directory: version-hint.text names the latest
    assert latest.metadata_location.endswith(f"v{last}.metadata.json")
    floors = completion_floors(tl)
    kept = table.retained_from()
    first = kept["earliest_retained_seq"] if kept is not None else 1
    # one snapshot per retained entry (a clean expires the ones whose files it deleted): id =
    # Iceberg sequence number = commit sequence number, the time the entry's completion floor
    # (what `read --as-of <time>` resolves with)
    snaps = latest.snapshots()
    assert [s.snapshot_id for s in snaps] == list(range(first, last + 1))
    assert [s.sequence_number for s in snaps] == list(range(first, last + 1))
    assert [s.summary["bucketindex.instant"] for s in snaps] == [tl.entry(v)["instant"] for v in range(first, last + 1)]
    assert [s.timestamp_ms for s in snaps] == [iceberg._instant_ms(f) for f in floors[first - 1:]]
    compared = 0
    for v in range(last + 1):
        st = StaticTable.from_metadata(iceberg.metadata_uri(table, v))
        if v == 0:
            assert st.current_snapshot() is None and st.scan().to_arrow().num_rows == 0
            continue
        entry = tl.entry(v)
        assert st.current_snapshot().snapshot_id == v
        if kept is not None and v < kept["earliest_retained_seq"]:
            with pytest.raises(BadInputError, match="older than the retained window"):
                read_arrow(uri, as_of=entry["instant"])
            assert latest.snapshot_by_id(v) is None  # expired with the clean
            continue
        view = FileSystemView.at_seq(tl, v)
        names = [f.name for f in view.schema if not f.name.startswith("_bi_")]
        want = read_optimized(table, view) if table.config.merge_on_read else read_view(table, view)
        got = st.scan().to_arrow()
        assert got.column_names == names, v  # the published schema: no _bi_* column, in order
        assert int(st.current_snapshot().summary["total-records"]) == want.num_rows, v  # pyiceberg's own counts
        assert _rows(got, names) == _rows(want, names), f"version {v} ({entry['action']})"
        # time travel in the latest metadata: by snapshot id, and by time as `read --as-of <time>`
        assert _rows(latest.scan(snapshot_id=v).to_arrow(), names) == _rows(want, names), v
        # `read --as-of <time>` and Iceberg's snapshot_as_of_timestamp pick the same snapshot: the
        # last whose completion floor is at or before the time (racing writers can complete two
        # entries in one millisecond: both then pick the later one)
        at_time = resolve_as_of(tl, instant_to_iso(floors[v - 1])).seq
        assert at_time >= v and latest.snapshot_as_of_timestamp(iceberg._instant_ms(floors[v - 1])).snapshot_id == at_time
        if not table.config.merge_on_read:
            by_time = latest.scan(snapshot_id=at_time).to_arrow()
            assert _rows(read_arrow(uri, as_of=instant_to_iso(floors[v - 1])), names) == _rows(by_time, names), v
            # by instant: with racing writers an instant may name a later entry's snapshot (§4.1)
            at_instant = resolve_as_of(tl, entry["instant"]).seq
            assert _rows(read_arrow(uri, as_of=entry["instant"]), names) == \
                _rows(latest.scan(snapshot_id=at_instant).to_arrow(), names), v
        if second_reader:
            assert _rows(_polars(latest, v), names) == _rows(want, names), f"polars, version {v}"
        compared += 1
    return compared


def _history(uri: str, tmp: Path, index: str, table_type: str) -> list[list[dict]]:
    """Upserts with updates, deletes, partition moves and odd partition values ("" and null in
    one table), an alter, a compaction, a rehash, a clean that deletes files old snapshots
    list, and an upsert after it; every snapshot checked before the clean. Returns the batches."""
    b1 = [_row(i, REGIONS[i % len(REGIONS)], 1) for i in range(14)]
    b2 = ([_row(i, REGIONS[i % len(REGIONS)], 2) for i in range(0, 14, 3)]
          + [_row(1, REGIONS[1], 2, deleted=True), _row(15, None, 2), _row(16, "", 2)]
          + [_row(2, "x+y" if REGIONS[2] != "x+y" else "a/b", 3)])  # a partition move
    _upsert(uri, tmp, "b1", b1)
    _upsert(uri, tmp, "b2", b2)
    _cli("alter", uri, "--add-column", "note:string")
    b3 = [_row(i, REGIONS[i % len(REGIONS)], 4, note=f"n{i}") for i in (0, 4, 6, 20)]
    _upsert(uri, tmp, "b3", b3)
    b4 = [_row(i, REGIONS[i % len(REGIONS)], 5, note="again") for i in (3, 5, 21)] + [
        _row(6, REGIONS[6], 5, deleted=True, note=None)]
    _upsert(uri, tmp, "b4", b4)
    if table_type == "merge_on_read":
        _cli("compact", uri, "--min-logs", "1", "--only", "data")
        # the compaction brought the logs' rows in: Iceberg sees the merged table at its snapshot
        table = Table.load(uri)
        seq = table.timeline.last_seq
        assert table.timeline.entry(seq)["action"] == "compaction"
        at = StaticTable.from_metadata(iceberg.metadata_uri(table, seq)).scan().to_arrow()
        assert at.num_rows == FileSystemView.at_seq(table.timeline, seq).num_rows > 0
        assert at.num_rows > StaticTable.from_metadata(iceberg.metadata_uri(table, seq - 1)).scan().to_arrow().num_rows
    elif index == "record":
        _cli("compact", uri, "--min-deltas", "1")
    _cli("rehash", uri, "--num-buckets", "4", "--engine", "arrow")  # every file rewritten, the same rows
    assert Table.load(uri).timeline.entry(Table.load(uri).timeline.last_seq)["action"] == "rehash"
    assert check_every_snapshot(uri) == Table.load(uri).timeline.last_seq  # before the clean: all of them
    _cli("clean", uri, "--retain-commits", "1")
    assert Table.load(uri).retained_from() is not None, "the clean deleted files"
    b5 = [_row(i, REGIONS[(i + 1) % len(REGIONS)], 6, note="late") for i in (7, 8, 30)]
    _upsert(uri, tmp, "b5", b5)
    return [b1, b2, b3, b4, b5]


@pytest.mark.parametrize("index,table_type", [("record", "copy_on_write"), ("bucket", "copy_on_write"),
                                              ("record", "merge_on_read"), ("bucket", "merge_on_read")])
def test_every_snapshot_equals_the_snapshot(tmp_path, index, table_type):
    uri = str(tmp_path / "t")
    first = [_row(i, REGIONS[i % len(REGIONS)], 0) for i in range(3)]
    # merge-on-read without automatic compaction: the history's own compaction brings the logs in
    # (tests/unit/test_delta_mirror.py runs its history with the default automatic compaction)
    auto = ["--auto-compact", "off"] if table_type == "merge_on_read" else []
    _upsert(uri, tmp_path, "b0", first, "--index", index, "--num-buckets", "2", "--table-type", table_type, *auto,
            "--mirror", "iceberg")
    batches = [first, *_history(uri, tmp_path, index, table_type)]
    partition = "region" if index == "bucket" else None
    expected = reduce_batches(batches, partition=partition)
    cols = ("id", "region", "ts", "amount")
    latest = read_arrow(uri)
    assert {k: {c: r[c] for c in cols} for k, r in rows_by_identity(latest.to_pylist(), partition=partition).items()} \
        == {k: {c: r[c] for c in cols} for k, r in expected.items()}
    assert check_every_snapshot(uri) >= 2
    table = Table.load(uri)
    st = StaticTable.from_metadata(uri)
    if table_type == "copy_on_write":  # exact: the Iceberg table is the oracle's
        got = st.scan().to_arrow().to_pylist()
        assert {k: {c: r[c] for c in cols} for k, r in rows_by_identity(got, partition=partition).items()} \
            == {k: {c: r[c] for c in cols} for k, r in expected.items()}
    else:
        assert st.properties["bucketindex.projection"] == "read_optimized"
    # a schema change is an Iceberg schema change; the partition spec is identity on the field
    assert [s.column_names for s in st.schemas().values()] == [["id", "region", "ts", "amount"],
                                                                ["id", "region", "ts", "amount", "note"]]
    assert [(f.name, str(f.transform)) for f in st.spec().fields] == [("region", "identity")]
    # column statistics from the footers, counted by pyiceberg (a float, an integer, a string)
    files = list(st.scan().plan_files())
    ts_id = st.schema().find_field("ts").field_id
    assert files and all(f.file.record_count > 0 and ts_id in f.file.lower_bounds for f in files)
    assert sum(f.file.record_count for f in files) == st.scan().to_arrow().num_rows
    assert not any(n.startswith("_bi_") for n in st.schema().column_names)


def test_empty_and_null_partition_values_read_back_exactly(tmp_path, monkeypatch):
    """Issue 39 item 3: every string value the table accepts -- null and "" in the same
    table, Hive's and this table's null literals, a value whose directory name is shortened,
    odd characters -- is its own Iceberg partition value and reads back identically, through
    the scan, its filters (pruned on the partition tuples) and Polars."""
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    uri = str(tmp_path / "t")
    rows = [{"id": f"k {i:02d}/é", "country": COUNTRIES[i % len(COUNTRIES)], "ts": 1, "amount": i + 0.25,
             "at": dt.datetime(2024, 3, 30, 23, i % 60, 1, 123456, tzinfo=dt.timezone.utc),
             "price": Decimal(i) / 4} for i in range(33)]
    schema = pa.schema([("id", pa.string()), ("country", pa.string()), ("ts", pa.int64()), ("amount", pa.float64()),
                        ("at", pa.timestamp("us", tz="UTC")), ("price", pa.decimal128(10, 2))])
    _cli("upsert", uri, _write(tmp_path, "b1", rows, schema), *ARGS, "--partition-field", "country",
         "--mirror", "iceberg")
    b2 = [dict(rows[i], ts=2, amount=-float(i)) for i in range(0, 33, 4)]
    _cli("upsert", uri, _write(tmp_path, "b2", b2, schema), *ARGS)
    want = read_arrow(uri)
    names = [c for c in want.column_names if not c.startswith("_bi_")]
    st = StaticTable.from_metadata(uri)
    got = st.scan().to_arrow()
    assert got.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert got.schema.field("price").type == pa.decimal128(10, 2)
    assert _rows(got, names) == _rows(want, names)
    assert _rows(_polars(st, 2), names) == _rows(want, names)
    counts = Counter(want.column("country").to_pylist())
    assert counts[""] and counts[None], "the table holds both"
    # one file per value, each with its exact value as its partition tuple (null as null)
    tuples = sorted((repr(f.file.partition[0]) for f in st.scan().plan_files()))
    assert tuples == sorted(repr(v) for v in COUNTRIES)
    from pyiceberg.expressions import EqualTo, IsNull

    for value in COUNTRIES:
        expr = IsNull("country") if value is None else EqualTo("country", value)
        scan = st.scan(row_filter=expr)
        assert len(list(scan.plan_files())) == 1, repr(value)  # pruned on the partition tuple
        assert scan.to_arrow().column("country").to_pylist() == [value] * counts[value], repr(value)


@pytest.mark.parametrize("typ,values", [
    (pa.int64(), [None, 0, -5, 2**40]),
    (pa.date32(), [None, dt.date(1970, 1, 1), dt.date(2024, 2, 29)]),
    (pa.bool_(), [None, True, False]),
    (pa.timestamp("us", tz="UTC"), [None, dt.datetime(2024, 3, 31, 1, 30, 0, 5, tzinfo=dt.timezone.utc)]),
    (pa.decimal128(10, 2), [None, Decimal("0.00"), Decimal("-12.50")]),
    (pa.timestamp("us"), [None, dt.datetime(1969, 12, 31, 23, 59, 59, 999999)]),
])
def test_other_partition_types_read_back_exactly(tmp_path, typ, values):
    """Iceberg keeps a partition value typed: each reads back as written, and its partition
    tuple is the value itself (Delta needs decimals as a data column; Iceberg does not)."""
    from pyiceberg.expressions import EqualTo, IsNull

    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.string()), ("p", typ), ("ts", pa.int64())])
    rows = [{"id": f"k{i}", "p": values[i % len(values)], "ts": 1} for i in range(4 * len(values))]
    _cli("upsert", uri, _write(tmp_path, "b1", rows, schema), *ARGS, "--partition-field", "p", "--mirror", "iceberg")
    st = StaticTable.from_metadata(uri)
    want = read_arrow(uri)
    got = st.scan().to_arrow()
    assert got.schema.field("p").type == typ
    assert _rows(got, ["id", "p", "ts"]) == _rows(want, ["id", "p", "ts"])
    assert sorted(map(repr, (f.file.partition[0] for f in st.scan().plan_files()))) == \
        sorted(map(repr, (iceberg_partition_value(v) for v in values)))
    for v in values:
        expr = IsNull("p") if v is None else EqualTo("p", _literal(v))
        scan = st.scan(row_filter=expr)
        assert len(list(scan.plan_files())) == 1, repr(v)
        assert scan.to_arrow().column("p").to_pylist() == [v] * 4, repr(v)


def iceberg_partition_value(v: object) -> object:
    """A value in pyiceberg's partition representation (dates as days, times as microseconds)."""
    if isinstance(v, dt.datetime):
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc if v.tzinfo else None)
        return (v - epoch) // dt.timedelta(microseconds=1)
    if isinstance(v, dt.date):
        return (v - dt.date(1970, 1, 1)).days
    return v


def _literal(v: object) -> object:
    """A value as a pyiceberg literal takes it: dates, times and decimals as their text."""
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    return v


def test_every_type_the_table_stores_has_an_exact_iceberg_form(tmp_path, capsys):
    """The table stores a zoned timestamp in UTC, an unsigned integer widened, milliseconds as
    microseconds, and refuses nanoseconds at the door: what it stores, Iceberg v2 holds exactly,
    and the projection reads each value back. A schema it could not hold (a table written
    otherwise) is refused in one line before anything is committed."""
    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.string()), ("at", pa.timestamp("us", tz="Europe/Paris")), ("n", pa.uint32()),
                        ("ms", pa.timestamp("ms")), ("ts", pa.int64())])
    at = dt.datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)
    rows = [{"id": "a", "at": at, "n": 2**32 - 1, "ms": dt.datetime(2024, 1, 1, 0, 0, 0, 5000), "ts": 1}]
    _cli("upsert", uri, _write(tmp_path, "b1", rows, schema), *ARGS)
    _cli("mirror", uri, "--enable", "iceberg")
    got = StaticTable.from_metadata(uri).scan().to_arrow()
    assert got.to_pylist() == [{"id": "a", "at": at, "n": 2**32 - 1, "ms": dt.datetime(2024, 1, 1, 0, 0, 0, 5000),
                                "ts": 1}]
    table = Table.load(uri)
    for typ, word in ((pa.timestamp("ns"), "nanosecond"), (pa.uint64(), "unsigned"),
                      (pa.timestamp("us", tz="Europe/Paris"), "Europe/Paris"),
                      (pa.list_(pa.timestamp("ns")), "nanosecond")):
        with pytest.raises(BadInputError, match=word) as e:
            iceberg.check_supported(table, pa.schema([("id", pa.string()), ("x", typ)]))
        assert len(str(e.value).splitlines()) == 1 and "'x'" in str(e.value)


def test_enable_on_an_existing_table_writes_the_history(tmp_path, capsys):
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 7], 0) for i in range(7)], "--mirror", "delta")
    _upsert(uri, tmp_path, "b1", [_row(i, REGIONS[(i + 1) % 7], 1) for i in range(2, 9)])
    assert not os.path.exists(os.path.join(uri, "metadata"))
    capsys.readouterr()
    _cli("mirror", uri, "--enable", "iceberg")
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[0])["written"] == [0, 1, 2, 3] and out[1] == "Iceberg metadata at version 3: 4 versions written"
    table = Table.load(uri)
    # the property the enable committed; table.json keeps what creation fixed
    assert table.view().properties == {"mirrors": ["iceberg"]} and table.config.mirrors == ["delta"]
    assert delta.mirrors(table) == {"delta", "iceberg"}
    assert iceberg.versions_present(table) == [0, 1, 2, 3]
    _upsert(uri, tmp_path, "b2", [_row(7, "a/b", 2)])
    check_every_snapshot(uri)
    assert delta.versions_present(Table.load(uri)) == [0, 1, 2, 3, 4], "the Delta log is written beside it"
    # a SQL catalog (sqlite) registers the projection's metadata and reads it as StaticTable does
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'wh'}")
    catalog.create_namespace("analytics")
    registered = catalog.register_table(("analytics", "t"), iceberg.metadata_uri(Table.load(uri), 4))
    names = ["id", "region", "ts", "amount"]
    assert registered.current_snapshot().snapshot_id == 4
    assert _rows(catalog.load_table("analytics.t").scan().to_arrow(), names) == _rows(read_arrow(uri), names)
    assert _rows(registered.scan(snapshot_id=2).to_arrow(), names) == \
        _rows(read_arrow(uri, as_of=Table.load(uri).timeline.entry(2)["instant"]), names)
    _cli("mirror", uri, "--enable", "iceberg")  # again: nothing committed
    assert Table.load(uri).timeline.last_seq == 4
    capsys.readouterr()
    _cli("mirror", uri, "--repair")  # both projections checked, nothing to do
    out = capsys.readouterr().out.splitlines()
    assert [json.loads(out[0])["rewritten"], json.loads(out[2])] == [[], {"version": 4, "written": [], "rewritten": [],
                                                                          "checkpoints": []}]
    assert out[3].startswith("Iceberg metadata at version 4: every version checked")


def _cli_proc(uri: str, src: str, batch: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spark_jobs.cli", "upsert", uri, src, *KEY_ARGS,
                             "--batch-id", batch], env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_a_kill_between_commit_and_metadata_is_repaired(tmp_path):
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 7], 0) for i in range(7)], "--mirror", "iceberg")
    for n, repair_by in ((1, "next write"), (2, "mirror --repair")):
        src = _write(tmp_path, f"k{n}", [_row(i, REGIONS[(i + n) % 7], n) for i in range(4)])
        p = _cli_proc(uri, src, f"k{n}", {"BUCKETINDEX_FAULT": "after_commit_before_mirror"})
        p.communicate(timeout=120)
        assert p.returncode == -9
        table = Table.load(uri)
        seq = table.timeline.last_seq
        assert table.timeline.entry(seq)["metadata"]["batch_id"] == f"k{n}", "the commit point was passed"
        assert iceberg.versions_present(table)[-1] == seq - 1, "Iceberg readers stay at the previous version"
        stale = StaticTable.from_metadata(uri)
        assert stale.current_snapshot().snapshot_id == seq - 1
        names = ["id", "region", "ts", "amount"]
        prev = read_arrow(uri, as_of=table.timeline.entry(seq - 1)["instant"])
        assert _rows(stale.scan().to_arrow(), names) == _rows(prev, names)
        if repair_by == "next write":
            _upsert(uri, tmp_path, f"after{n}", [_row(50 + n, "eu west", 9)])
        else:
            _cli("mirror", uri, "--repair")
            _cli("mirror", uri, "--repair")  # idempotent
    check_every_snapshot(uri, second_reader=False)


@pytest.mark.parametrize("damage", ["empty", "garbage", "other version"])
def test_repair_rewrites_a_damaged_version(tmp_path, capsys, damage):
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 7], 0) for i in range(7)], "--mirror", "iceberg")
    for n in range(1, 4):
        _upsert(uri, tmp_path, f"b{n}", [_row(i, REGIONS[(i + n) % 7], n) for i in range(n, 9, 2)])
    md = Path(uri, "metadata")
    v2 = md / "v2.metadata.json"
    if damage == "empty":
        v2.write_bytes(b"")
    elif damage == "garbage":
        v2.write_bytes(b'{"format-version": 2, "oops\n')
    else:
        v2.write_bytes((md / "v1.metadata.json").read_bytes())
    capsys.readouterr()
    assert main(["mirror", uri, "--repair"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[0])
    assert report == {"version": 4, "written": [], "rewritten": [2], "checkpoints": []}
    check_every_snapshot(uri, second_reader=False)
    capsys.readouterr()
    assert main(["mirror", uri, "--repair"]) == 0  # idempotent
    assert json.loads(capsys.readouterr().out.splitlines()[0])["rewritten"] == []


def test_the_hook_never_fails_the_commit(tmp_path, monkeypatch, caplog):
    """A projection that raises is a warning: the commit stands, the Delta log beside it is
    still written, and the next commit writes the Iceberg gap."""
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 7], 0) for i in range(4)], "--mirror", "iceberg")
    _cli("mirror", uri, "--enable", "delta")

    def boom(table: object, seq: int) -> list[int]:
        raise OSError("disk on fire")

    monkeypatch.setattr(iceberg, "mirror_commit", boom)
    _upsert(uri, tmp_path, "b1", [_row(9, "", 1)])
    assert "the Iceberg metadata of" in caplog.text and "disk on fire" in caplog.text
    table = Table.load(uri)
    assert iceberg.versions_present(table) == [0, 1, 2] and delta.versions_present(table) == [0, 1, 2, 3]
    monkeypatch.undo()
    _upsert(uri, tmp_path, "b2", [_row(10, None, 2)])
    check_every_snapshot(uri, second_reader=False)


def test_concurrent_writers_leave_no_gap_and_no_duplicate(tmp_path):
    """Writers commit in some order and each mirrors its own entry, writing a predecessor's
    version first when it is not there yet: racing creates of one ``v<n>`` leave exactly one,
    the loser finds the same entry in it (its own manifests deleted by pyiceberg)."""
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "base", [_row(i, REGIONS[i % 7], 0) for i in range(14)], "--mirror", "iceberg")
    procs = []
    for w in range(3):  # disjoint keys, overlapping windows: they all commit, in some order
        src = _write(tmp_path, f"w{w}", [_row(100 * (w + 1) + i, REGIONS[w], 1) for i in range(3)])
        procs.append(_cli_proc(uri, src, f"w{w}", {"BUCKETINDEX_PAUSE": "after_conflict_check=1"}))
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
        assert "was not written" not in err, err[-2000:]  # no projection failed in any writer
    table = Table.load(uri)
    assert table.timeline.last_seq == 4
    check_every_snapshot(uri, second_reader=False)
    assert StaticTable.from_metadata(uri).scan().to_arrow().num_rows == 23
    # every manifest a snapshot names, and nothing else but the metadata: a loser's files are gone
    latest = StaticTable.from_metadata(uri)
    named = {posixpath_name(s.manifest_list) for s in latest.snapshots()}
    named |= {posixpath_name(m.manifest_path) for s in latest.snapshots() for m in s.manifests(latest.io)}
    avro = {n for n in os.listdir(Path(uri, "metadata")) if n.endswith(".avro")}
    assert avro == named


def posixpath_name(uri: str) -> str:
    return uri.rsplit("/", 1)[-1]


def test_on_object_storage(bucket, s3):
    """On S3 the projection is written through the table's own S3 file system (its endpoint and
    credentials), the metadata created with a conditional PUT; pyiceberg reads it with its own."""
    import pyarrow.fs as pafs

    from spark_jobs.io.filesystem import resolve

    uri = f"{bucket}/lake/t"
    for n in range(2):
        io, path = resolve(f"{bucket}/src/b{n}.parquet")
        with io.fs.open_output_stream(path) as f:
            pq.write_table(pa.Table.from_pylist([_row(i, REGIONS[(i + n) % 7], n) for i in range(7 - 3 * n)]), f)
        _cli("upsert", uri, f"{bucket}/src/b{n}.parquet", *KEY_ARGS, "--batch-id", f"b{n}",
             *(["--mirror", "iceberg"] if n == 0 else []))
    assert isinstance(io.fs, pafs.S3FileSystem)
    table = Table.load(uri)
    assert iceberg.versions_present(table) == [0, 1, 2]
    assert iceberg.location(table).startswith("s3://") and "?" not in iceberg.location(table)
    props = {"s3.endpoint": s3.endpoint, "s3.access-key-id": s3.access_key_id,
             "s3.secret-access-key": s3.env()["AWS_SECRET_ACCESS_KEY"], "s3.region": "us-east-1"}
    st = StaticTable.from_metadata(iceberg.metadata_uri(table, 2), properties=props)
    names = ["id", "region", "ts", "amount"]
    for v in (1, 2):
        assert _rows(st.scan(snapshot_id=v).to_arrow(), names) == \
            _rows(read_arrow(uri, as_of=table.timeline.entry(v)["instant"]), names), v


def test_a_second_writer_of_a_version_finds_it_and_leaves_no_file(tmp_path):
    """The race's losing side, made deterministic: mirroring an entry whose version exists
    writes nothing (the create is refused, pyiceberg deletes the attempt's manifests); a
    version holding another entry is an error, not overwritten."""
    from spark_jobs.exceptions import TableCorruptError

    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 7], 0) for i in range(7)], "--mirror", "iceberg")
    _upsert(uri, tmp_path, "b1", [_row(i, REGIONS[(i + 1) % 7], 1) for i in range(3)])
    table = Table.load(uri)
    md = Path(uri, "metadata")
    before = {n: (md / n).read_bytes() for n in os.listdir(md)}
    assert iceberg.mirror_commit(table, 2) == []
    assert {n: (md / n).read_bytes() for n in os.listdir(md)} == before, "nothing written, nothing left behind"
    (md / "v2.metadata.json").write_bytes((md / "v1.metadata.json").read_bytes())  # entry 1's, not 2's
    with pytest.raises(TableCorruptError, match="version 2 .* is not what sequence entry 2 projects to"):
        iceberg.mirror_commit(table, 2)
    assert (md / "v2.metadata.json").read_bytes() == (md / "v1.metadata.json").read_bytes()


def test_a_reference_bootstrap_reads_back(tmp_path, capsys):
    """A reference bootstrap's files lie outside the root and lack their Hive path column: each
    is listed by its absolute URI with the partition value of its Hive directory, which Iceberg
    readers project for an identity partition field the file does not hold. A referenced file
    that stores a column in a type pyiceberg refuses (a timestamp zoned America/New_York, read
    by the table as UTC) makes the projection refuse in one line."""
    import pyarrow.dataset as ds

    from tests.unit.test_bootstrap_arrow import SCHEMA, dataset_rows

    for zone in ("UTC", "America/New_York"):
        root = tmp_path / f"dataset-{zone.replace('/', '_')}"
        schema = pa.schema([f if f.name != "at" else pa.field("at", pa.timestamp("us", tz=zone)) for f in SCHEMA])
        for name, rows in zip(("a", "b"), dataset_rows()):
            ds.write_dataset(pa.Table.from_pylist(rows, schema=schema), root, format="parquet", partitioning=["region"],
                             partitioning_flavor="hive", basename_template=f"{name}-{{i}}.parquet",
                             existing_data_behavior="overwrite_or_ignore")
        uri = str(tmp_path / f"table-{zone.replace('/', '_')}")
        assert main(["bootstrap", uri, str(root), "--record-key", "id", "--partition-field", "region",
                     "--precombine-field", "ts", "--mode", "reference", "--engine", "arrow"]) == 0
        table = Table.load(uri)
        assert any(s.path.startswith("..") for s in table.view().slices()), "some files are referenced in place"
        capsys.readouterr()
        if zone != "UTC":
            assert main(["mirror", uri, "--enable", "iceberg"]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "America/New_York" in err[0] and "'at'" in err[0], err
            assert Table.load(uri).timeline.last_seq == 1 and not os.path.exists(os.path.join(uri, "metadata"))
            continue
        _cli("mirror", uri, "--enable", "iceberg")
        st = StaticTable.from_metadata(uri)
        want = read_arrow(uri)
        names = [c for c in want.column_names if not c.startswith("_bi_")]
        assert _rows(st.scan().to_arrow(), names) == _rows(want, names)
        paths = {f.file.file_path for f in st.scan().plan_files()}
        assert any(str(root) in p for p in paths) and all(p.startswith("file:///") for p in paths)


def test_the_python_api_turns_it_on_and_repairs_both(tmp_path):
    """``spark_jobs.Table.mirror``: ``enable="iceberg"`` reports the versions written; ``repair``
    on a table with both projections reports the Delta log's and, under ``projections``, each."""
    import spark_jobs

    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 7], 0) for i in range(7)], "--mirror", "delta")
    t = spark_jobs.Table(uri)
    m = t.mirror(enable="iceberg")
    assert m.version == 2 and m.written == (0, 1, 2)
    (Path(uri, "metadata") / "v1.metadata.json").write_bytes(b"")
    r = t.mirror(repair=True)
    assert r.version == 2 and r.rewritten == ()  # the Delta log's report first: sound
    assert r.details["projections"]["iceberg"]["rewritten"] == [1]
    assert r.details["projections"]["delta"]["rewritten"] == []
    check_every_snapshot(uri, second_reader=False)
