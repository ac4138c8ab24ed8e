"""The fresh view of a merge-on-read table's Iceberg projection (issue 39 item 2): each log an
added data file, the rows the merge drops position-delete files, so Iceberg readers see every
commit's rows, not the bases as of the last compaction.

Every retained snapshot, read by pyiceberg (``StaticTable`` from each version's metadata, the
latest metadata's time travel, the same metadata registered in a pyiceberg SQL catalog) and by
a second reader (Polars' own Parquet reader on the files pyiceberg plans, and DuckDB over
pyiceberg's scan), must equal ``read --as-of`` of its entry, and the latest the oracle (the
batches reduced by key). After a compaction the fresh and read-optimized views agree. Arrow
engine, in process (``spark_jobs.cli.main``), except the SIGKILL between a commit point and its
metadata write.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.cli import main
from spark_jobs.table import Table, iceberg
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.view import FileSystemView
from tests.harness.delta_reads import read_optimized
from tests.harness.delta_reads import sorted_rows as _rows
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_iceberg_mirror import _cli_proc, _write, check_every_snapshot

pyiceberg_table = pytest.importorskip("pyiceberg.table")
StaticTable = pyiceberg_table.StaticTable

pytestmark = [pytest.mark.unit, pytest.mark.filterwarnings("ignore:Iceberg scan planning")]

#: partition values as users have them: spaces, '/', '%', '+', non-ASCII, null, ""
REGIONS = ["eu west", "a/b", "100%", "x+y", "são paulo", None, ""]
#: record keys likewise (a key cannot be null or "": the table refuses both)
KEYS = ["k 0/é+%", "a/b", "100%", "x+y", "日本 語", "__NULL__", " ", "k%2F", "z+z/z", "ü",
        "k 10", "k 11", "k 12", "k 13"]
KEY_ARGS = ["--record-key", "id", "--precombine-field", "ts", "--partition-field", "region",
            "--delete-field", "is_deleted", "--engine", "arrow"]
NAMES = ["id", "region", "ts", "amount"]


def _row(i: int, region: str | None, ts: int, *, deleted: bool = False) -> dict:
    return {"id": KEYS[i] if i < len(KEYS) else f"k {i}/é", "region": region, "ts": ts, "amount": i + ts / 10,
            "is_deleted": deleted}


def _cli(*argv: str) -> None:
    assert main(list(argv)) == 0, argv


def _upsert(uri: str, tmp: Path, batch: str, rows: list[dict], *extra: str) -> None:
    _cli("upsert", uri, _write(tmp, batch, rows), *KEY_ARGS, "--batch-id", batch, *extra)


def _duckdb(scan: object) -> pa.Table:
    """DuckDB's SQL over pyiceberg's scan (which applies the position deletes)."""
    con = scan.to_duckdb("t")  # type: ignore[attr-defined]
    return con.execute("select * from t").to_arrow_table()


def _polars(st: object, snapshot_id: int) -> pa.Table:
    """Polars' own Parquet reader on the data and delete files pyiceberg plans."""
    import polars as pl

    return pl.scan_iceberg(st, snapshot_id=snapshot_id).collect().to_arrow()


def check_fresh(uri: str, *, second_reader: bool = True) -> int:
    """Every retained version of the fresh view equals ``read --as-of`` of its entry (by
    pyiceberg from its own metadata, and by time travel in the latest); returns how many."""
    table = Table.load(uri)
    tl = table.timeline.reload()
    last = tl.last_seq
    assert iceberg.versions_present(table) == list(range(last + 1))
    latest = StaticTable.from_metadata(uri)
    assert latest.metadata_location.endswith(f"v{last}.metadata.json")
    assert latest.properties["bucketindex.projection"] == "fresh"
    kept = table.retained_from()
    first = kept["earliest_retained_seq"] if kept is not None else 1
    assert [s.snapshot_id for s in latest.snapshots()] == list(range(first, last + 1))
    compared = 0
    for v in range(first, last + 1):
        st = StaticTable.from_metadata(iceberg.metadata_uri(table, v))
        assert st.properties["bucketindex.projection"] == "fresh" and st.current_snapshot().snapshot_id == v
        want = read_arrow(uri, as_of=tl.entry(v)["instant"])
        names = [n for n in want.column_names if not n.startswith("_bi_")]
        got = st.scan().to_arrow()
        assert got.column_names == names, v
        assert _rows(got, names) == _rows(want, names), f"version {v} ({tl.entry(v)['action']})"
        assert _rows(latest.scan(snapshot_id=v).to_arrow(), names) == _rows(want, names), v
        if second_reader:
            assert _rows(_polars(latest, v), names) == _rows(want, names), f"polars, version {v}"
            assert _rows(_duckdb(latest.scan(snapshot_id=v)), names) == _rows(want, names), f"duckdb, version {v}"
        compared += 1
    return compared


def _delete_files(st: object) -> list[object]:
    return [d for task in st.scan().plan_files() for d in task.delete_files]  # type: ignore[attr-defined]


@pytest.mark.parametrize("index", ["record", "bucket"])
def test_fresh_view_equals_every_commit_and_the_oracle(tmp_path, index):
    """Upserts with updates, deletes, in-batch duplicates, stale updates (precombine), partition
    moves and a delete then re-insert, on a merge-on-read table without automatic compaction:
    every snapshot of the fresh view is the table's at that commit. The table starts with the
    read-optimized projection; turning the fresh view on rewrites its history; a compaction
    makes the two views agree; turning the read-optimized view back on rewrites it again."""
    uri = str(tmp_path / "t")
    b0 = [_row(i, REGIONS[i % 7], 1) for i in range(14)]
    _upsert(uri, tmp_path, "b0", b0, "--index", index, "--num-buckets", "2", "--table-type", "merge_on_read",
            "--auto-compact", "off", "--mirror", "iceberg")
    b1 = ([_row(i, REGIONS[i % 7], 2) for i in range(0, 14, 3)]  # updates
          + [_row(1, REGIONS[1], 2, deleted=True)]  # a delete
          + [_row(4, REGIONS[4], 5), _row(4, REGIONS[4], 3)]  # in-batch duplicates: ts 5 wins
          + [_row(14, None, 2), _row(15, "", 2)])  # inserts into null and ""
    _upsert(uri, tmp_path, "b1", b1)
    assert StaticTable.from_metadata(uri).properties["bucketindex.projection"] == "read_optimized"
    _cli("mirror", uri, "--enable", "iceberg", "--view", "fresh")
    table = Table.load(uri)
    assert table.view().properties == {"mirrors": ["iceberg"], "mirror_views": {"iceberg": "fresh"}}
    assert check_fresh(uri) == 3, "the history before the view changed is rewritten in the fresh view"
    b2 = ([_row(2, REGIONS[2], 1)]  # stale: ts 1 < stored 2, dropped
          + [_row(4, REGIONS[4], 4)]  # stale against the log's ts 5
          + [_row(5, REGIONS[5], 6), _row(7, REGIONS[0], 6, deleted=True)]
          + ([_row(6, "x+y", 7)] if index == "record" else []))  # a partition move (global index)
    _upsert(uri, tmp_path, "b2", b2)
    b3 = [_row(7, REGIONS[0], 8), _row(1, REGIONS[1], 8), _row(8, REGIONS[1], 8), _row(8, REGIONS[1], 9),
          _row(14, None, 8, deleted=True)]  # re-inserts after deletes; a log delete of a log insert
    _upsert(uri, tmp_path, "b3", b3)
    batches = [b0, b1, b2, b3]
    partition = "region" if index == "bucket" else None
    expected = reduce_batches(batches, partition=partition)
    st = StaticTable.from_metadata(uri)
    got = st.scan().to_arrow()
    assert {k: {c: r[c] for c in NAMES} for k, r in rows_by_identity(got.to_pylist(), partition=partition).items()} \
        == {k: {c: r[c] for c in NAMES} for k, r in expected.items()}, "the fresh view is the oracle"
    ro = read_optimized(Table.load(uri), Table.load(uri).view())
    assert _rows(ro, NAMES) != _rows(got, NAMES), "the read-optimized view would be stale here"
    assert _delete_files(st), "the merge's drops are position-delete files"
    summary = st.current_snapshot().summary
    assert int(summary["total-position-deletes"]) > 0 and summary["bucketindex.read-optimized-file-groups"] is None
    assert check_fresh(uri) == 5
    # the same metadata in a pyiceberg SQL catalog reads the same, and travels in time the same
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'wh'}")
    catalog.create_namespace("analytics")
    t5 = Table.load(uri)
    catalog.register_table(("analytics", "t"), iceberg.metadata_uri(t5, 5))
    registered = catalog.load_table("analytics.t")
    assert _rows(registered.scan().to_arrow(), NAMES) == _rows(read_arrow(uri), NAMES)
    for v in (2, 4):
        assert _rows(registered.scan(snapshot_id=v).to_arrow(), NAMES) == \
            _rows(read_arrow(uri, as_of=t5.timeline.entry(v)["instant"]), NAMES), v
    # a compaction folds every log: the snapshot lists bases only, no delete file, and the two views agree
    _cli("compact", uri, "--min-logs", "1", "--only", "data")
    table = Table.load(uri)
    assert table.timeline.entry(table.timeline.last_seq)["action"] == "compaction"
    assert not any(s.logs for s in table.view().slices())
    st = StaticTable.from_metadata(uri)
    assert not _delete_files(st) and int(st.current_snapshot().summary["total-position-deletes"]) == 0
    assert _rows(st.scan().to_arrow(), NAMES) == _rows(read_optimized(table, table.view()), NAMES) \
        == _rows(read_arrow(uri), NAMES)
    assert check_fresh(uri) == 6
    _cli("mirror", uri, "--repair")  # every version sound: nothing rewritten
    assert check_fresh(uri, second_reader=False) == 6
    # a schema change, logs on it, a rehash (every file rewritten), logs again, a clean that
    # deletes files old snapshots list, and logs after it
    _cli("alter", uri, "--add-column", "note:string")
    b4 = [dict(_row(i, REGIONS[i % 7], 10), note=f"n {i}/é") for i in (0, 3, 9)] + [dict(_row(16, "a/b", 10), note="")]
    _upsert(uri, tmp_path, "b4", b4)
    _cli("rehash", uri, "--num-buckets", "4", "--engine", "arrow")
    b5 = [dict(_row(0, REGIONS[0], 11), note=None), dict(_row(16, "a/b", 9), note="stale"),
          dict(_row(9, REGIONS[2], 11, deleted=True), note=None)]
    _upsert(uri, tmp_path, "b5", b5)
    last = Table.load(uri).timeline.last_seq
    assert check_fresh(uri) == last
    st = StaticTable.from_metadata(uri)
    assert [s.column_names for s in st.schemas().values()] == [NAMES, NAMES + ["note"]]
    _cli("clean", uri, "--retain-commits", "1")
    assert Table.load(uri).retained_from() is not None, "the clean deleted files"
    b6 = [dict(_row(i, REGIONS[(i + 1) % 7] if index == "record" else REGIONS[i % 7], 12), note="late")
          for i in (3, 11, 30)]
    _upsert(uri, tmp_path, "b6", b6)
    kept = Table.load(uri).retained_from()["earliest_retained_seq"]
    assert check_fresh(uri) == last + 2 - kept + 1
    expected = reduce_batches([*batches, b4, b5, b6], partition=partition)
    got = StaticTable.from_metadata(uri).scan().to_arrow().to_pylist()
    assert {k: {c: r.get(c) for c in [*NAMES, "note"]} for k, r in rows_by_identity(got, partition=partition).items()} \
        == {k: {c: r.get(c) for c in [*NAMES, "note"]} for k, r in expected.items()}
    # back to the read-optimized view: every version rewritten in it
    _cli("mirror", uri, "--enable", "iceberg", "--view", "read_optimized")
    table = Table.load(uri)
    assert table.view().properties["mirror_views"] == {"iceberg": "read_optimized"}
    assert check_every_snapshot(uri, second_reader=False) == table.timeline.last_seq - kept + 1
    assert not _delete_files(StaticTable.from_metadata(uri))


def test_a_kill_between_commit_and_metadata_is_repaired(tmp_path):
    """A writer killed after its commit point leaves fresh-view readers at the previous
    version; the next write (and `mirror --repair`) writes the gap, deletes included."""
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 7], 0) for i in range(7)], "--table-type", "merge_on_read",
            "--auto-compact", "off")
    _cli("mirror", uri, "--enable", "iceberg", "--view", "fresh")
    for n, repair_by in ((1, "next write"), (2, "mirror --repair")):
        src = _write(tmp_path, f"k{n}", [_row(i, REGIONS[(i + n) % 7] if i == 6 else REGIONS[i % 7], n)
                                         for i in range(n, 7)])
        p = _cli_proc(uri, src, f"k{n}", {"BUCKETINDEX_FAULT": "after_commit_before_mirror"})
        p.communicate(timeout=120)
        assert p.returncode == -9
        table = Table.load(uri)
        seq = table.timeline.last_seq
        assert iceberg.versions_present(table)[-1] == seq - 1, "Iceberg readers stay at the previous version"
        stale = StaticTable.from_metadata(uri)
        assert _rows(stale.scan().to_arrow(), NAMES) == \
            _rows(read_arrow(uri, as_of=table.timeline.entry(seq - 1)["instant"]), NAMES)
        if repair_by == "next write":
            _upsert(uri, tmp_path, f"after{n}", [_row(3, REGIONS[3], 9)])
        else:
            _cli("mirror", uri, "--repair")
            _cli("mirror", uri, "--repair")  # idempotent
    assert check_fresh(uri, second_reader=False) == Table.load(uri).timeline.last_seq


def test_a_partial_update_log_shows_its_file_group_as_of_compaction(tmp_path):
    """A partial-update log overlays columns, which no set of positions expresses: its file
    group is shown as of its last compaction (counted in the snapshot summary), never with
    wrong values; its compaction brings it up to date."""
    uri = str(tmp_path / "t")
    rows = [{"id": k, "ts": 1, "amount": float(i), "note": f"n{i}"} for i, k in enumerate(KEYS[:6])]
    args = ["--record-key", "id", "--precombine-field", "ts", "--engine", "arrow"]
    _cli("upsert", uri, _write(tmp_path, "b0", rows), *args, "--table-type", "merge_on_read", "--auto-compact", "off",
         "--num-buckets", "1")
    _cli("mirror", uri, "--enable", "iceberg", "--view", "fresh")
    _cli("upsert", uri, _write(tmp_path, "b1", [{"id": KEYS[0], "ts": 2, "amount": -1.0}]), *args, "--partial-update")
    table = Table.load(uri)
    assert len(table.view().slices()) == 1
    st = StaticTable.from_metadata(uri)
    names = ["id", "ts", "amount", "note"]
    assert st.current_snapshot().summary["bucketindex.read-optimized-file-groups"] == "1"
    assert _rows(st.scan().to_arrow(), names) == _rows(read_optimized(table, table.view()), names)
    assert _rows(st.scan().to_arrow(), names) != _rows(read_arrow(uri), names)
    _cli("upsert", uri, _write(tmp_path, "b2", [{"id": KEYS[1], "ts": 3, "amount": 7.0, "note": "full"}]), *args)
    assert StaticTable.from_metadata(uri).current_snapshot().summary["bucketindex.read-optimized-file-groups"] == "1"
    _cli("compact", uri, "--min-logs", "1", "--only", "data")
    st = StaticTable.from_metadata(uri)
    assert st.current_snapshot().summary["bucketindex.read-optimized-file-groups"] is None
    assert _rows(st.scan().to_arrow(), names) == _rows(read_arrow(uri), names)


def test_copy_on_write_is_exact_whatever_the_view(tmp_path):
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 7], 0) for i in range(5)], "--mirror", "iceberg")
    _cli("mirror", uri, "--enable", "iceberg", "--view", "fresh")
    _upsert(uri, tmp_path, "b1", [_row(i, REGIONS[i % 7], 1) for i in range(2, 7)])
    st = StaticTable.from_metadata(uri)
    assert st.properties["bucketindex.projection"] == "exact" and not _delete_files(st)
    assert check_every_snapshot(uri, second_reader=False) == Table.load(uri).timeline.last_seq


@pytest.mark.parametrize("argv,message", [
    (["--view", "fresh"], "one of the arguments --enable --repair is required"),
    (["--repair", "--view", "fresh"], "--view goes with --enable"),
    (["--enable", "iceberg", "--view", "latest"], "--view must be one of read_optimized, fresh, got 'latest'"),
    (["--enable", "delta", "--view", "fresh"], "the Delta projection cannot publish the fresh view of a table partitioned by"),
])
def test_bad_view_options_are_refused_in_one_line(tmp_path, capsys, argv, message):
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 7], 0) for i in range(3)], "--table-type", "merge_on_read")
    before = Table.load(uri).timeline.last_seq
    capsys.readouterr()
    try:
        code = main(["mirror", uri, *argv])
    except SystemExit as e:  # the parser's own refusal
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert Table.load(uri).timeline.last_seq == before and not os.path.exists(os.path.join(uri, "metadata"))


def test_the_python_api_takes_the_view(tmp_path):
    from spark_jobs.api import Table as ApiTable

    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "b0", [_row(i, REGIONS[i % 7], 0) for i in range(5)], "--table-type", "merge_on_read",
            "--auto-compact", "off")
    _upsert(uri, tmp_path, "b1", [_row(i, REGIONS[i % 7], 1) for i in range(2, 7)])
    result = ApiTable(uri).mirror(enable="iceberg", view="fresh")
    assert result.details["view"] == "fresh" and result.version == 3
    assert json.loads(json.dumps(dict(FileSystemView.at_seq(Table.load(uri).timeline, 3).properties))) == {
        "mirrors": ["iceberg"], "mirror_views": {"iceberg": "fresh"}}
    assert check_fresh(uri, second_reader=False) == 3


def test_on_object_storage(bucket, s3):
    """On S3 the delete files are written through the table's own S3 file system and named by
    ``s3://`` URIs; pyiceberg reads them, and the logs, with its own."""
    from spark_jobs.io.filesystem import resolve

    uri = f"{bucket}/lake/t"
    for n in range(3):
        io, path = resolve(f"{bucket}/src/b{n}.parquet")
        rows = [_row(i, REGIONS[i % 7], n, deleted=(n == 2 and i == 1)) for i in range(n, 7)]
        with io.fs.open_output_stream(path) as f:
            pq.write_table(pa.Table.from_pylist(rows), f)
        _cli("upsert", uri, f"{bucket}/src/b{n}.parquet", *KEY_ARGS, "--batch-id", f"b{n}",
             *(["--table-type", "merge_on_read", "--auto-compact", "off"] if n == 0 else []))
        if n == 0:
            _cli("mirror", uri, "--enable", "iceberg", "--view", "fresh")
    table = Table.load(uri)
    assert iceberg.versions_present(table) == [0, 1, 2, 3, 4]
    props = {"s3.endpoint": s3.endpoint, "s3.access-key-id": s3.access_key_id,
             "s3.secret-access-key": s3.env()["AWS_SECRET_ACCESS_KEY"], "s3.region": "us-east-1"}
    st = StaticTable.from_metadata(iceberg.metadata_uri(table, 4), properties=props)
    deletes = _delete_files(st)
    assert deletes and all(d.file_path.startswith("s3://") for d in deletes)
    for v in (1, 3, 4):
        assert _rows(st.scan(snapshot_id=v).to_arrow(), NAMES) == \
            _rows(read_arrow(uri, as_of=table.timeline.entry(v)["instant"]), NAMES), v


def test_a_reference_bootstrap_with_logs(tmp_path):
    """A reference bootstrap's files (outside the root, lacking the Hive path column and the key
    column, which the table derives) take position deletes like the table's own: the plan's
    positions are rows of the file as stored."""
    import pyarrow.dataset as ds

    from tests.unit.test_bootstrap_arrow import SCHEMA, dataset_rows

    root = tmp_path / "dataset"
    schema = pa.schema([f if f.name != "at" else pa.field("at", pa.timestamp("us", tz="UTC")) for f in SCHEMA])
    for name, rows in zip(("a", "b"), dataset_rows()):
        ds.write_dataset(pa.Table.from_pylist(rows, schema=schema), root, format="parquet", partitioning=["region"],
                         partitioning_flavor="hive", basename_template=f"{name}-{{i}}.parquet",
                         existing_data_behavior="overwrite_or_ignore")
    uri = str(tmp_path / "t")
    _cli("bootstrap", uri, str(root), "--record-key", "id", "--partition-field", "region", "--precombine-field", "ts",
         "--mode", "reference", "--engine", "arrow", "--table-type", "merge_on_read")
    _cli("mirror", uri, "--enable", "iceberg", "--view", "fresh")
    before = read_arrow(uri)
    names = [c for c in before.column_names if not c.startswith("_bi_")]
    batch = [dict({n: r[n] for n in names}, ts=(r["ts"] or 0) + 100) for r in before.to_pylist()[::7]]
    src = tmp_path / "u.parquet"
    pq.write_table(pa.Table.from_pylist(batch, schema=pa.schema([before.schema.field(n) for n in names])), src)
    _cli("upsert", uri, str(src), "--record-key", "id", "--precombine-field", "ts", "--partition-field", "region",
         "--engine", "arrow", "--auto-compact", "off")
    table = Table.load(uri)
    assert any(s.logs and s.path.startswith("..") for s in table.view().slices()), "a referenced base has a log"
    st = StaticTable.from_metadata(uri)
    assert _delete_files(st)
    want = read_arrow(uri)
    assert _rows(st.scan().to_arrow(), names) == _rows(want, names) != _rows(before, names)
    assert _rows(_polars(st, table.timeline.last_seq), names) == _rows(want, names)
