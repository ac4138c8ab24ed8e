"""First-day papercuts of issue 36 (items 12, 13, 14): each found by a new user on realistic
data, each shown here through the CLI as a subprocess on real tables (no mocks).

* 12: two Parquet files of one batch whose timestamps differ only in zone stay on Arrow;
* 13: an ``is_deleted``-like column sent without ``--delete-field`` is refused naming it first;
* 14: ``ignored`` counts in the upsert result, ``show`` of a bootstrap's timings, ``--help``
  and the stores a table may live on, ``mirror --enable``'s count, ``show | head`` without a
  traceback, a partition directory that is a symlink leaving the table.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.test_cli_newcomer import commits

pytestmark = pytest.mark.unit

UTC = dt.timezone.utc


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE",)}
    env.update(extra)
    return env


def cli(*args: str, **kw) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    return subprocess.run([sys.executable, "-m", "spark_jobs.cli", *args], capture_output=True, text=True,
                          timeout=120, env=_env(), **kw)


def result(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[0 if p.stdout.lstrip().startswith("{") else -1])


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_symlink():
            h.update(os.readlink(p).encode())
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


ROWS = [
    {"id": "a b", "region": "eu west", "ts": dt.datetime(2024, 3, 10, 1, tzinfo=UTC), "v": "1"},
    {"id": "c/d", "region": "us/east", "ts": dt.datetime(2024, 3, 10, 1, tzinfo=UTC), "v": "2"},
    {"id": "50%+", "region": None, "ts": dt.datetime(2024, 3, 10, 1, tzinfo=UTC), "v": "3"},
    {"id": "Zoë", "region": "", "ts": dt.datetime(2024, 3, 10, 1, tzinfo=UTC), "v": "4"},
]
SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.string())])


def _write(path: Path, rows: list[dict], schema: pa.Schema = SCHEMA) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


@pytest.fixture()
def table(tmp_path: Path) -> tuple[Path, str]:
    uri = str(tmp_path / "t")
    result(cli("upsert", uri, _write(tmp_path / "in" / "b1" / "part-0.parquet", ROWS), "--record-key", "id",
               "--precombine-field", "ts", "--partition-field", "region", "--engine", "arrow"))
    return tmp_path, uri


# -- 14 (e): `show | head` -------------------------------------------------------------------------------


def test_a_reader_that_closes_stdout_ends_show_without_a_traceback(table):
    d, uri = table
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written: every write raises EPIPE
    try:
        p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "show", uri], stdout=w, stderr=subprocess.PIPE,
                           text=True, timeout=120, env=_env())
    finally:
        os.close(w)
    assert "Traceback" not in p.stderr and "BrokenPipeError" not in p.stderr, p.stderr
    assert p.stderr == "", p.stderr
    assert p.returncode == 1


# -- 14 (c): the stores `--help` offers for a table are the ones a table may live on ----------------------


def _table_helps() -> dict[str, str]:
    """verb -> the help of its TABLE argument, from the CLI's own parser."""
    from spark_jobs.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "verb")
    return {verb: next(a.help for a in p._actions if a.dest == "table")
            for verb, p in sub.choices.items() if any(a.dest == "table" for a in p._actions)}


def test_help_offers_no_table_store_that_is_refused_at_open():
    import re

    from spark_jobs.exceptions import UnsupportedStorageError
    from spark_jobs.io.filesystem import refuse_uncommittable_uri

    helps = _table_helps()
    assert {"upsert", "show", "read"} <= set(helps)
    for verb, text in helps.items():
        offered = text.split(";")[0]  # what follows a ';' may only name stores that are refused
        for scheme in re.findall(r"([a-z0-9]+)://", offered):
            refuse_uncommittable_uri(f"{scheme}://bucket/t")  # raises for a refused store
        for scheme in re.findall(r"([a-z0-9]+)://", text.split(";", 1)[1] if ";" in text else ""):
            with pytest.raises(UnsupportedStorageError):
                refuse_uncommittable_uri(f"{scheme}://nn:8020/t")
    # and the CLI says the same in one line when such a table is given
    p = cli("show", "hdfs://nn:8020/t")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "hdfs://" in p.stderr, p.stderr


# -- 14 (d): `mirror --enable` counts the versions it wrote ------------------------------------------------


def test_mirror_enable_reports_the_versions_it_wrote(table):
    d, uri = table
    for i in range(2):  # two more commits: the history the projection writes
        rows = [dict(r, v=f"{r['v']}-{i}", ts=r["ts"] + dt.timedelta(hours=i + 1)) for r in ROWS[i:]]
        result(cli("upsert", uri, _write(d / "in" / f"u{i}" / "part-0.parquet", rows), "--engine", "arrow"))
    assert not (Path(uri) / "_delta_log").exists()
    p = cli("mirror", uri, "--enable", "delta")
    out = result(p)
    log = sorted(n for n in os.listdir(Path(uri) / "_delta_log") if n.endswith(".json"))
    assert len(log) >= 4  # three upserts and the commit that turned the projection on
    assert out["written"] == [int(n.split(".")[0]) for n in log]
    assert p.stdout.strip().splitlines()[-1].endswith(f": {len(log)} versions written"), p.stdout
    again = cli("mirror", uri, "--enable", "delta")  # on already: nothing committed, nothing written
    assert result(again)["written"] == [] and again.stdout.strip().endswith(": 0 versions written")


# -- 13: a delete flag sent without --delete-field ---------------------------------------------------------


@pytest.mark.parametrize("column,kind,values", [
    ("is_deleted", pa.bool_(), [False, True, None, False]),
    ("__deleted", pa.string(), ["false", "true", "false", "false"]),  # Debezium's unwrap transform
    ("gone", pa.bool_(), [False, False, True, False]),  # any boolean column the table lacks
])
def test_a_delete_flag_without_delete_field_is_refused_naming_delete_field_first(table, column, kind, values):
    d, uri = table
    rows = [dict(r, ts=r["ts"] + dt.timedelta(hours=1), **{column: v}) for r, v in zip(ROWS, values)]
    src = _write(d / "in" / "flag" / "part-0.parquet", rows, SCHEMA.append(pa.field(column, kind)))
    before = tree_digest(Path(uri))
    for engine in ("arrow", "auto"):
        p = cli("upsert", uri, src, "--engine", engine)
        assert p.returncode == 2, p.stderr
        line = p.stderr.strip()
        assert len(line.splitlines()) == 1, line
        assert f"--delete-field {column}" in line, line
        assert line.index("--delete-field") < line.index("--schema-evolution add-columns"), line
        assert tree_digest(Path(uri)) == before
    # following the advice deletes the flagged key
    result(cli("upsert", uri, src, "--delete-field", column, "--engine", "arrow"))
    from spark_jobs.table.reader import read_arrow

    deleted = {r["id"] for r, v in zip(ROWS, values) if v in (True, "true")}
    assert {r["id"] for r in read_arrow(uri).to_pylist()} == {r["id"] for r in ROWS} - deleted


def test_a_plain_new_column_keeps_the_schema_evolution_advice(table):
    d, uri = table
    rows = [dict(r, note="x") for r in ROWS]
    p = cli("upsert", uri, _write(d / "in" / "note" / "part-0.parquet", rows, SCHEMA.append(pa.field("note", pa.string()))),
            "--engine", "arrow")
    assert p.returncode == 2 and "--delete-field" not in p.stderr and "--schema-evolution add-columns" in p.stderr


# -- 12: files of one batch whose timestamps differ only in zone ------------------------------------------


def _zoned(path: Path, rows: list[dict], zone: str) -> None:
    schema = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.timestamp("us", tz=zone)),
                        ("v", pa.string()), ("seen", pa.list_(pa.timestamp("ms", tz=zone)))])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def test_files_whose_timestamps_differ_only_in_zone_stay_on_arrow_and_keep_their_instants(tmp_path: Path):
    from zoneinfo import ZoneInfo

    from spark_jobs.arrow_engine.source import read_source
    from tests.oracle import reduce_batches
    from spark_jobs.table.reader import read_arrow

    paris, ny = ZoneInfo("Europe/Paris"), ZoneInfo("America/New_York")

    def rows(n: int, zone: ZoneInfo, hour: int) -> list[dict]:
        ts = dt.datetime(2024, 3, 31, hour, 30, tzinfo=zone)  # the night Paris moves to summer time
        return [{"id": k, "region": r, "ts": ts + dt.timedelta(minutes=i), "v": f"{k}@{zone.key}",
                 "seen": [ts, None]} for i, (k, r) in enumerate([("a b", "eu west"), ("c/d", None), ("Zoë", ""),
                                                                 (f"k{n}%+", "us/east")])]

    uri = str(tmp_path / "t")
    batches = []
    for n, (hour_paris, hour_ny) in enumerate([(1, 2), (4, 1)]):
        b1, b2 = rows(n, paris, hour_paris), rows(n, ny, hour_ny)
        _zoned(tmp_path / "in" / f"b{n}" / "part-0.parquet", b1, "Europe/Paris")
        _zoned(tmp_path / "in" / f"b{n}" / "part-1.parquet", b2, "America/New_York")
        batches.append(b1 + b2)
        # the Arrow reader takes the two files as one schema (on the old code: "different schemas")
        read = read_source(str(tmp_path / "in" / f"b{n}"), "parquet", table_schema=None)
        assert read.schema.field("ts").type == pa.timestamp("us", tz="UTC") and read.num_rows == 8
        out = result(cli("upsert", uri, str(tmp_path / "in" / f"b{n}"), "--record-key", "id",
                         "--precombine-field", "ts", "--partition-field", "region"))
        assert out["engine"] == "arrow", out
        assert commits(uri)[-1]["engine"]["name"] == "arrow"
    stored = {r["id"]: r for r in read_arrow(uri).to_pylist()}
    expected = reduce_batches(batches, delete_field=None)
    assert stored.keys() == expected.keys()
    for k, want in expected.items():  # aware datetimes compare as instants
        got = stored[k]
        assert got["ts"] == want["ts"] and got["v"] == want["v"] and got["seen"] == want["seen"], (got, want)
        assert got["ts"].utcoffset() == dt.timedelta(0)


# -- 14 (a): rows that lost are reported -------------------------------------------------------------------


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_the_upsert_result_reports_ignored_rows_by_reason(tmp_path: Path, table_type):
    from tests.oracle import reduce_batches

    schema = pa.schema([("id", pa.string()), ("p", pa.string()), ("ts", pa.int64()), ("gone", pa.bool_())])
    first = [{"id": "a b", "p": "x/1", "ts": 5, "gone": False}, {"id": "50%+", "p": "x/1", "ts": 5, "gone": False},
             {"id": "Zoë", "p": "", "ts": 5, "gone": False}]
    second = [{"id": "a b", "p": "x/1", "ts": 1, "gone": False},  # stale update
              {"id": "nobody", "p": "x/1", "ts": 9, "gone": True},  # delete of an absent key
              {"id": "50%+", "p": "x/1", "ts": 1, "gone": True},  # stale delete
              {"id": "Zoë", "p": None, "ts": 9, "gone": False},  # a move: an update
              {"id": "e€", "p": "x/1", "ts": 1, "gone": False},  # insert
              {"id": "e€", "p": "x/1", "ts": 0, "gone": False}]  # in-batch duplicate: not a key of its own
    uri = str(tmp_path / "t")
    result(cli("upsert", uri, _write(tmp_path / "b1.parquet", first, schema), "--record-key", "id",
               "--precombine-field", "ts", "--partition-field", "p", "--delete-field", "gone", "--engine", "arrow",
               "--table-type", table_type))
    out = result(cli("upsert", uri, _write(tmp_path / "b2.parquet", second, schema), "--delete-field", "gone",
                     "--engine", "arrow"))
    assert out["counts"]["keys_in_batch"] == 5 and out["counts"]["inserted"] == 1 and out["counts"]["updated"] == 1
    assert out["ignored"] == {"stale_upserts": 1, "stale_or_absent_deletes": 2}, out
    # the upsert's commit (a merge-on-read table's automatic compaction may follow it)
    assert next(c for c in reversed(commits(uri)) if c["action"] == "commit")["ignored"] == out["ignored"]
    from spark_jobs.table.reader import read_arrow

    assert {r["id"]: r["ts"] for r in read_arrow(uri).to_pylist()} == {
        k: r["ts"] for k, r in reduce_batches([first, second], delete_field="gone").items()}


# -- 14 (f): a partition directory replaced by a symlink leaving the table -----------------------------------


def test_a_partition_directory_that_is_a_symlink_leaving_the_table_is_refused(table):
    import shutil

    d, uri = table
    root = Path(uri)
    parts = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert parts, list(root.iterdir())
    victim = parts[0]
    outside = d / "elsewhere"
    shutil.move(str(victim), str(outside))
    victim.symlink_to(outside, target_is_directory=True)
    before_outside = tree_digest(outside)
    rows = [dict(r, ts=r["ts"] + dt.timedelta(hours=1), v=r["v"] + "'") for r in ROWS]
    p = cli("upsert", uri, _write(d / "in" / "b2" / "part-0.parquet", rows), "--engine", "arrow")
    assert p.returncode == 1, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert "Traceback" not in p.stderr and "symlink leaving the table" in line and str(victim) in line, p.stderr
    assert tree_digest(outside) == before_outside
    c = cli("clean", uri, "--retain-commits", "1")
    assert tree_digest(outside) == before_outside, c.stderr
    assert victim.is_symlink()
