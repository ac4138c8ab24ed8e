"""The fresh view of a merge-on-read table's Delta projection (issue 39 item 2): each log an
added data file, the rows the merge drops inline deletion vectors, offered only for tables
whose every path Polars 2.1 applies a vector on (format.md §11, ``delta.fresh_view_refusal``).

Every retained version, read by ``deltalake``'s ``QueryBuilder`` and by Polars' ``read_delta``
(both apply deletion vectors), must equal ``read --as-of`` of its entry, and the latest the
oracle (the batches reduced by key); ``to_pyarrow_table`` refuses the table (a clear error, not
rows). A table whose paths Polars would misread -- a string or timestamp partition field, the
values users have (spaces, ``/``, ``%``, ``+``, non-ASCII, null, ``""``) -- is refused in one
line, untouched. Arrow engine, in process.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pyarrow as pa
import pytest

from spark_jobs.cli import main
from spark_jobs.table import Table, delta
from spark_jobs.table.reader import read_arrow
from tests.harness.delta_reads import query_delta, read_delta, read_optimized
from tests.harness.delta_reads import sorted_rows as _rows
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_iceberg_mirror import _write

deltalake = pytest.importorskip("deltalake")
pl = pytest.importorskip("polars")

pytestmark = [pytest.mark.unit]

#: record keys as users have them (keys are not in paths: any text)
KEYS = ["k 0/é+%", "a/b", "100%", "x+y", "日本 語", "__NULL__", " ", "k%2F", "z+z/z", "ü",
        "k 10", "k 11", "k 12", "k 13"]
#: partition values of each accepted type, null included
ZONES = {
    "int": [7, -2, 0, None, 1_000_000, 3, 12],
    "date": [dt.date(2024, 1, 1), dt.date(1999, 12, 31), None, dt.date(2024, 2, 29), dt.date(1970, 1, 1),
             dt.date(2030, 6, 1), dt.date(2024, 1, 2)],
    "none": [None] * 7,  # unpartitioned
}
NAMES = ["id", "zone", "ts", "amount"]


def _args(kind: str) -> list[str]:
    part = [] if kind == "none" else ["--partition-field", "zone"]
    return ["--record-key", "id", "--precombine-field", "ts", *part, "--delete-field", "is_deleted",
            "--engine", "arrow"]


def _row(kind: str, i: int, z: int, ts: int, *, deleted: bool = False) -> dict:
    return {"id": KEYS[i] if i < len(KEYS) else f"k {i}/é", "zone": ZONES[kind][z % 7], "ts": ts,
            "amount": i + ts / 10, "is_deleted": deleted}


def _schema(kind: str) -> pa.Schema:
    zone = {"int": pa.int64(), "date": pa.date32(), "none": pa.int64()}[kind]
    return pa.schema([("id", pa.string()), ("zone", zone), ("ts", pa.int64()), ("amount", pa.float64()),
                      ("is_deleted", pa.bool_())])


def _cli(*argv: str) -> None:
    assert main(list(argv)) == 0, argv


def _upsert(uri: str, tmp: Path, kind: str, batch: str, rows: list[dict], *extra: str) -> None:
    _cli("upsert", uri, _write(tmp, batch, rows, _schema(kind)), *_args(kind), "--batch-id", batch, *extra)


def _polars(uri: str, version: int) -> pa.Table:
    return pl.read_delta(uri, version=version).to_arrow()


def check_fresh(uri: str) -> int:
    """Every retained version of the fresh view equals ``read --as-of`` of its entry, through
    ``QueryBuilder`` and Polars (``read_delta``, ``scan_delta``); ``to_pyarrow_table`` refuses each. Returns how many."""
    table = Table.load(uri)
    tl = table.timeline.reload()
    kept = table.retained_from()
    first = kept["earliest_retained_seq"] if kept is not None else 1
    compared = 0
    for v in range(first, tl.last_seq + 1):
        want = read_arrow(uri, as_of=tl.entry(v)["instant"])
        names = [n for n in want.column_names if not n.startswith("_bi_")]
        what = f"version {v} ({tl.entry(v)['action']})"
        assert _rows(query_delta(uri, v), names) == _rows(want, names), f"QueryBuilder, {what}"
        assert _rows(_polars(uri, v), names) == _rows(want, names), f"Polars read_delta, {what}"
        assert _rows(pl.scan_delta(uri, version=v).collect().to_arrow(), names) == _rows(want, names), \
            f"Polars scan_delta, {what}"
        with pytest.raises(deltalake.exceptions.DeltaProtocolError, match="deletionVectors"):
            read_delta(uri, v)
        compared += 1
    return compared


def _add_paths(uri: str, *, vectors_only: bool = False) -> list[str]:
    """Every ``add.path`` the JSON versions hold (``vectors_only``: of adds with a vector)."""
    import json

    log_dir = os.path.join(uri, "_delta_log")
    out = []
    for name in sorted(os.listdir(log_dir)):
        if name.endswith(".json"):
            with open(os.path.join(log_dir, name)) as f:
                adds = [json.loads(line)["add"] for line in f if line.startswith('{"add"')]
                out += [a["path"] for a in adds if a.get("deletionVector") or not vectors_only]
    return out


def _vectors(uri: str) -> int:
    return pa.RecordBatchReader.from_stream(deltalake.DeltaTable(uri).deletion_vectors()).read_all().num_rows


@pytest.mark.parametrize("kind", ["int", "date", "none"])
def test_fresh_view_equals_every_commit_and_the_oracle(tmp_path, kind):
    """Upserts with updates, deletes, in-batch duplicates, stale updates, partition moves
    (between values and null), a delete then re-insert, compaction, a clean and logs after it:
    every retained version of the fresh view is the table's at that commit; turning the
    read-optimized view back on rewrites the history without vectors."""
    uri = str(tmp_path / "t")
    b0 = [_row(kind, i, i, 1) for i in range(14)]
    _upsert(uri, tmp_path, kind, "b0", b0, "--index", "record", "--num-buckets", "2", "--table-type",
            "merge_on_read", "--auto-compact", "off", "--mirror", "delta")
    b1 = ([_row(kind, i, i, 2) for i in range(0, 14, 3)]  # updates
          + [_row(kind, 1, 1, 2, deleted=True)]  # a delete
          + [_row(kind, 4, 4, 5), _row(kind, 4, 4, 3)]  # in-batch duplicates: ts 5 wins
          + [_row(kind, 14, 3, 2)])  # an insert into the null partition
    _upsert(uri, tmp_path, kind, "b1", b1)
    assert not deltalake.DeltaTable(uri).protocol().reader_features  # read-optimized: no vectors
    _cli("mirror", uri, "--enable", "delta", "--view", "fresh")
    assert Table.load(uri).view().properties == {"mirrors": ["delta"], "mirror_views": {"delta": "fresh"}}
    assert "deletionVectors" in deltalake.DeltaTable(uri).protocol().reader_features
    assert check_fresh(uri) == 3, "the history before the view changed is rewritten in the fresh view"
    b2 = ([_row(kind, 2, 2, 1)]  # stale: ts 1 < stored 2, dropped
          + [_row(kind, 4, 4, 4)]  # stale against the log's ts 5
          + [_row(kind, 5, 5, 6), _row(kind, 7, 7, 6, deleted=True)]
          + [_row(kind, 6, 3, 7), _row(kind, 3, 0, 7)])  # partition moves: into null, out of null
    _upsert(uri, tmp_path, kind, "b2", b2)
    b3 = [_row(kind, 7, 0, 8), _row(kind, 1, 1, 8), _row(kind, 8, 1, 8), _row(kind, 8, 1, 9),
          _row(kind, 14, 3, 8, deleted=True)]  # re-inserts after deletes; a log delete of a log insert
    _upsert(uri, tmp_path, kind, "b3", b3)
    expected = reduce_batches([b0, b1, b2, b3])
    got = query_delta(uri, Table.load(uri).timeline.last_seq)
    assert {k: {c: r[c] for c in NAMES} for k, r in rows_by_identity(got.to_pylist()).items()} \
        == {k: {c: r[c] for c in NAMES} for k, r in expected.items()}, "the fresh view is the oracle"
    table = Table.load(uri)
    assert _rows(read_optimized(table, table.view()), NAMES) != _rows(got, NAMES), "read-optimized is stale here"
    assert _vectors(uri) > 0, "the merge's drops are deletion vectors"
    paths = _add_paths(uri)
    assert paths and all("%" not in p for p in paths), paths  # Polars applies vectors on these
    if kind != "none":
        assert any(p.startswith("zone=") for p in paths), paths  # '=' raw, not %3D
    assert check_fresh(uri) == 5
    _cli("mirror", uri, "--repair")  # every version sound: nothing rewritten
    assert check_fresh(uri) == 5
    # a compaction folds every log: no vector left, and the two views agree
    _cli("compact", uri, "--min-logs", "1", "--only", "data")
    table = Table.load(uri)
    assert not any(s.logs for s in table.view().slices())
    assert _vectors(uri) == 0
    assert _rows(query_delta(uri, table.timeline.last_seq), NAMES) == \
        _rows(read_optimized(table, table.view()), NAMES) == _rows(read_arrow(uri), NAMES)
    b4 = [_row(kind, i, i + 1, 10) for i in (0, 9, 10)] + [_row(kind, 11, 11, 10, deleted=True)]
    _upsert(uri, tmp_path, kind, "b4", b4)
    last = Table.load(uri).timeline.last_seq
    assert check_fresh(uri) == last
    _cli("clean", uri, "--retain-commits", "1")
    assert Table.load(uri).retained_from() is not None, "the clean deleted files"
    b5 = [_row(kind, i, i + 2, 12) for i in (3, 12, 30)]
    _upsert(uri, tmp_path, kind, "b5", b5)
    kept = Table.load(uri).retained_from()["earliest_retained_seq"]
    assert check_fresh(uri) == Table.load(uri).timeline.last_seq - kept + 1
    expected = reduce_batches([b0, b1, b2, b3, b4, b5])
    got = _polars(uri, Table.load(uri).timeline.last_seq).to_pylist()
    assert {k: {c: r[c] for c in NAMES} for k, r in rows_by_identity(got).items()} \
        == {k: {c: r[c] for c in NAMES} for k, r in expected.items()}
    # back to the read-optimized view: every version rewritten without vectors
    _cli("mirror", uri, "--enable", "delta", "--view", "read_optimized")
    table = Table.load(uri)
    assert not deltalake.DeltaTable(uri).protocol().reader_features
    for v in range(kept, table.timeline.last_seq + 1):
        assert _rows(read_delta(uri, v), NAMES) == _rows(query_delta(uri, v), NAMES), v


@pytest.mark.parametrize("field,values,schema", [
    ("region", ["eu west", "a/b", "100%", "x+y", "são paulo", None, ""], pa.string()),
    ("region", ["plain", "also_plain", None], pa.string()),  # refused on the type: a later value may not be
    ("at", [dt.datetime(2024, 3, 31, 1, 30, tzinfo=dt.timezone.utc), None], pa.timestamp("us", tz="UTC")),
])
def test_a_table_whose_paths_polars_misreads_is_refused_in_one_line(tmp_path, capsys, field, values, schema):
    uri = str(tmp_path / "t")
    rows = [{"id": KEYS[i], field: v, "ts": 1} for i, v in enumerate(values)]
    src = _write(tmp_path, "b0", rows, pa.schema([("id", pa.string()), (field, schema), ("ts", pa.int64())]))
    _cli("upsert", uri, src, "--record-key", "id", "--precombine-field", "ts", "--partition-field", field,
         "--engine", "arrow", "--table-type", "merge_on_read", "--mirror", "delta")
    before = Table.load(uri).timeline.last_seq
    log_before = sorted(os.listdir(os.path.join(uri, "_delta_log")))
    capsys.readouterr()
    assert main(["mirror", uri, "--enable", "delta", "--view", "fresh"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot publish the fresh view" in err[0] and "Polars" in err[0], err
    table = Table.load(uri)
    assert table.timeline.last_seq == before and "mirror_views" not in table.view().properties
    assert sorted(os.listdir(os.path.join(uri, "_delta_log"))) == log_before
    assert _rows(read_delta(uri, before), ["id"]) == _rows(read_optimized(table, table.view()), ["id"])


def test_copy_on_write_is_exact_whatever_the_partition_type(tmp_path):
    """No logs, no vectors: the fresh view of a copy-on-write table is its exact projection,
    whatever its partition values."""
    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64())])
    rows = [{"id": KEYS[i], "region": v, "ts": 1} for i, v in enumerate(["a/b", "100%", "x+y", "são paulo", None, ""])]
    _cli("upsert", uri, _write(tmp_path, "b0", rows, schema), "--record-key", "id", "--precombine-field", "ts",
         "--partition-field", "region", "--engine", "arrow", "--mirror", "delta")
    _cli("mirror", uri, "--enable", "delta", "--view", "fresh")
    table = Table.load(uri)
    assert delta.fresh_view_refusal(table, table.view()) is None
    assert not deltalake.DeltaTable(uri).protocol().reader_features
    assert _rows(_polars(uri, 1), ["id", "region"]) == _rows(read_arrow(uri), ["id", "region"])


def test_a_path_polars_would_misread_gets_no_vector_stale_never_wrong(tmp_path, monkeypatch):
    """The backstop behind the refusal: were a file group's path ever one Polars ignores a
    vector on (forced here by skipping the refusal on a string partition field with the values
    users have), that group is published as of its last compaction -- no vector -- and every
    reader reads the same rows: fresh where the path is plain, read-optimized where it holds an
    escape, never the rows a vector would drop."""
    from spark_jobs.table.reader import read_slice
    from spark_jobs.table.view import FileSystemView

    regions = ["eu west", "a/b", "100%", "x+y", "são paulo", None, ""]
    schema = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64()), ("amount", pa.float64())])
    args = ["--record-key", "id", "--precombine-field", "ts", "--partition-field", "region", "--engine", "arrow"]
    uri = str(tmp_path / "t")

    def rows(ts: int, ids: range) -> list[dict]:
        return [{"id": KEYS[i], "region": regions[i % 7], "ts": ts, "amount": float(i + ts)} for i in ids]

    _cli("upsert", uri, _write(tmp_path, "b0", rows(1, range(14)), schema), *args, "--table-type", "merge_on_read",
         "--auto-compact", "off", "--num-buckets", "1")
    monkeypatch.setattr(delta, "fresh_view_refusal", lambda table, view: None)
    _cli("mirror", uri, "--enable", "delta", "--view", "fresh")
    _cli("upsert", uri, _write(tmp_path, "b1", rows(2, range(0, 14, 2)), schema), *args)
    table = Table.load(uri)
    tl = table.timeline
    names = ["id", "region", "ts", "amount"]
    escaped = 0
    for v in range(1, tl.last_seq + 1):
        view = FileSystemView.at_seq(tl, v)
        parts = []
        for s in view.slices():
            stale = "%" in delta._delta_path(table, s.path, fresh=True)
            escaped += stale and bool(s.logs)
            parts.append(read_slice(table, s.path, [] if stale else [lf.path for lf in s.logs],
                                    precombine="ts", schema=view.schema).select(names))
        want = _rows(pa.concat_tables(parts), names)
        assert _rows(query_delta(uri, v), names) == want, v
        assert _rows(_polars(uri, v), names) == want, v
    assert escaped >= 4, "the escaped file groups had logs (a/b, 100%, x+y, são paulo)"
    assert _rows(query_delta(uri, tl.last_seq), names) != _rows(read_arrow(uri), names), "stale there"
    assert _vectors(uri) > 0, "the plain paths (eu+west, __NULL__, '') carry vectors"
    assert all("%" not in p for p in _add_paths(uri, vectors_only=True)), "no vector on an escaped path"


def test_on_object_storage(bucket, s3, tmp_path):
    """On S3 (the moto server) Polars scans ``s3://`` URIs and matches them with the vectors'
    ``s3://`` paths: every version reads as ``read --as-of`` through both readers."""
    import pyarrow.parquet as pq

    from spark_jobs.io.filesystem import resolve

    uri = f"{bucket}/lake/t"

    def put(name: str, rows: list[dict]) -> str:
        src = f"{bucket}/src/{name}.parquet"
        io, path = resolve(src)
        with io.fs.open_output_stream(path) as f:
            pq.write_table(pa.Table.from_pylist(rows, schema=_schema("int")), f)
        return src

    _cli("upsert", uri, put("b0", [_row("int", i, i, 1) for i in range(10)]), *_args("int"), "--table-type",
         "merge_on_read", "--auto-compact", "off", "--num-buckets", "2")
    _cli("mirror", uri, "--enable", "delta", "--view", "fresh")
    _cli("upsert", uri, put("b1", [_row("int", i, i, 2) for i in range(0, 10, 3)]
                                  + [_row("int", 1, 1, 2, deleted=True), _row("int", 5, 3, 2)]), *_args("int"))
    opts = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": s3.access_key_id,
            "AWS_SECRET_ACCESS_KEY": s3.env()["AWS_SECRET_ACCESS_KEY"], "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true"}
    tl = Table.load(uri).timeline
    for v in range(1, tl.last_seq + 1):
        want = _rows(read_arrow(uri, as_of=tl.entry(v)["instant"]), NAMES)
        assert _rows(query_delta(uri, v, opts), NAMES) == want, v
        assert _rows(pl.read_delta(uri, version=v, storage_options=opts).to_arrow(), NAMES) == want, v
    assert pa.RecordBatchReader.from_stream(
        deltalake.DeltaTable(uri, storage_options=opts).deletion_vectors()).read_all().num_rows > 0


def test_repair_rewrites_a_lost_or_damaged_fresh_version_as_it_was(tmp_path):
    """A fresh version is a function of the timeline: ``mirror --repair`` recreates a missing
    one and replaces a damaged one with the same bytes, deletion vectors included, and the
    next writer fills a gap in the fresh view too."""
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, "int", "b0", [_row("int", i, i, 1) for i in range(10)], "--table-type", "merge_on_read",
            "--auto-compact", "off", "--num-buckets", "1")
    _cli("mirror", uri, "--enable", "delta", "--view", "fresh")
    _upsert(uri, tmp_path, "int", "b1", [_row("int", i, i, 2) for i in range(0, 10, 2)])
    _upsert(uri, tmp_path, "int", "b2", [_row("int", 3, 3, 3, deleted=True), _row("int", 4, 1, 3)])
    log_dir = Path(uri, "_delta_log")
    last = Table.load(uri).timeline.last_seq
    versions = {v: (log_dir / f"{v:020d}.json").read_bytes() for v in range(last + 1)}
    assert b'"deletionVector"' in versions[last] and b'"deletionVector"' in versions[last - 1]
    (log_dir / f"{last:020d}.json").unlink()
    (log_dir / f"{last - 1:020d}.json").write_bytes(b'{"commitInfo": {}}\n')
    _cli("mirror", uri, "--repair")
    assert {v: (log_dir / f"{v:020d}.json").read_bytes() for v in range(last + 1)} == versions
    (log_dir / f"{last:020d}.json").unlink()  # a gap: the next commit's hook writes it first
    _upsert(uri, tmp_path, "int", "b3", [_row("int", 5, 5, 4)])
    assert (log_dir / f"{last:020d}.json").read_bytes() == versions[last]
    assert check_fresh(uri) == last + 1
