"""Path safety (issue 22, D1-D3): nothing a write is given can name a path outside the table
root or inside ``.bucketindex/``; null, ``""`` and every literal partition value get their
own directory; a long value gets a short stable directory name; and a failed write can
always be rolled back (format.md §1, "Partition paths" and "Paths").
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

import spark_jobs.table.layout as layout
from spark_jobs.exceptions import BadInputError, PathEscapeError
from spark_jobs.io.filesystem import resolve
from spark_jobs.jobs.bootstrap import BootstrapOptions, run_bootstrap
from spark_jobs.jobs.read import read_table
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.jobs.validate import run_validate
from spark_jobs.table.action.clean import _deleter
from spark_jobs.table.action.rollback import rollback
from spark_jobs.table.action.transaction import Transaction
from spark_jobs.table.layout import partition_path
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import tree_digest, write_batch

pytestmark = pytest.mark.spark

ADDRESS = "東京都千代田区千代田一丁目一番一号皇居東御苑内管理事務所前棟"  # 30 characters, 90 bytes UTF-8
LONG = "x" * 300
ESCAPES = ["..", ".", "/abs", "../../escape", ".bucketindex", "a\x00b", "line\nbreak"]
LOOKALIKES = [None, "__NULL__", "", "__HIVE_DEFAULT_PARTITION__", "%5F_NULL__"]
# the recipe: `dup` in null and in "__NULL__"; `dup2` in null, then in "__NULL__" with
# a lower precombine value (and `dup` in "" too): 5 rows in a bucket-index table, 3 before the fix
RECIPE = [
    [{"id": "dup", "region": None, "ts": 1}, {"id": "dup", "region": "__NULL__", "ts": 2},
     {"id": "dup", "region": "", "ts": 3}],
    [{"id": "dup2", "region": None, "ts": 5}],
    [{"id": "dup2", "region": "__NULL__", "ts": 3}],
]
# and every lookalike, the path tricks and the long values, with the first batch
EVERY = ([{"id": f"look{i}", "region": v, "ts": 1} for i, v in enumerate(LOOKALIKES)]
         + [{"id": f"esc{i}", "region": v, "ts": 1} for i, v in enumerate(ESCAPES)]
         + [{"id": "long", "region": LONG, "ts": 1}, {"id": "addr", "region": ADDRESS, "ts": 1}])
#: the bucket-index table gets the recipe; the record-index table its first batch only (a
#: record index has one row per key whatever the partition: the directories are what differ)
BATCHES = {"bucket": [RECIPE[0] + EVERY, *RECIPE[1:]], "record": [RECIPE[0] + EVERY]}
SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64())])


def _options(uri: str, src: str, index: str, batch_id: str, **kw) -> UpsertOptions:
    return UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
                         index=index, num_buckets=2, batch_id=batch_id, **kw)


def _outside(base: Path, root: Path) -> dict[str, str]:
    """Every file under ``base`` but outside the table ``root``, with its digest."""
    return {p: h for p, h in tree_digest(base).items() if not (base / p).is_relative_to(root)}


def _assert_matches_oracle(spark, uri: str, expected: dict, partition: str | None, *, spark_read: bool) -> None:
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition=partition) == expected
    report = run_validate(spark, uri)
    assert report["ok"] and report["rows"] == len(expected), report
    from spark_jobs.arrow_engine.validate import run_validate as run_in_process

    assert run_in_process(uri) == report  # the in-process engine: the same report
    if spark_read:
        via_spark = rows_by_identity([r.asDict() for r in read_table(spark, uri).collect()], partition=partition)
        assert via_spark == expected


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory):
    """One record-index and one bucket-index table, each after the recipe and the last batch:
    the escape, lookalike and long-value tests all look at these."""
    src = tmp_path_factory.mktemp("src")
    base = tmp_path_factory.mktemp("tables")
    out = {}
    for index, batches in BATCHES.items():
        root = base / index
        before = _outside(base, root)
        for i, rows in enumerate(batches):
            batch = write_batch(src / f"{index}{i}.parquet", rows, SCHEMA)
            run_upsert(spark, _options(str(root), batch, index, f"b{i}"))
        assert _outside(base, root) == before, "a write created a file outside the table root"
        out[index] = SimpleNamespace(uri=str(root), root=root)
    assert not Path("/abs").exists() and not (base.parent / "escape").exists()
    return out


def test_recipe_null_and_lookalikes_stay_distinct_on_the_bucket_index(spark, tables):
    t = tables["bucket"]
    recipe = {k: r for k, r in rows_by_identity(read_arrow(t.uri).to_pylist(), partition="region").items()
              if k[1].startswith("dup")}
    assert len(recipe) == 5  # the issue saw 3: null and "__NULL__" shared a directory
    _assert_matches_oracle(spark, t.uri, reduce_batches(BATCHES["bucket"], partition="region"), "region",
                           spark_read=True)
    dirs = {s.partition for s in Table.load(t.uri).view().slices()}
    values = [*LOOKALIKES, *ESCAPES, LONG, ADDRESS]
    assert dirs == {partition_path("region", v) for v in values}
    assert len(dirs) == len(values)  # one directory per value


def test_record_index_matches_the_oracle(spark, tables):
    t = tables["record"]
    _assert_matches_oracle(spark, t.uri, reduce_batches(BATCHES["record"]), None, spark_read=True)
    dirs = {s.partition for s in Table.load(t.uri).view().slices()}
    assert dirs == {partition_path("region", v) for v in [*LOOKALIKES, *ESCAPES, LONG, ADDRESS]}


@pytest.mark.parametrize("index", ["bucket", "record"])
def test_every_file_is_under_the_root_and_names_are_short(tables, index):
    t = tables[index]
    for dirpath, dirs, files in os.walk(t.root):
        for name in dirs + files:
            assert len(name.encode()) <= 255, name
            assert Path(dirpath, name).resolve().is_relative_to(t.root.resolve())
    meta = t.root / ".bucketindex"
    assert not any(p.suffix == ".parquet" for p in meta.rglob("*")), "a data file inside .bucketindex/"
    long_dirs = [d.name for d in t.root.iterdir() if "~" in d.name]
    assert sorted(long_dirs) == sorted(partition_path("region", v) for v in (LONG, ADDRESS))
    assert all(len(d.encode()) <= layout.MAX_PARTITION_DIR_BYTES for d in long_dirs)


def test_bootstrap_rewrite_round_trips_long_values(spark, tmp_path):
    rows = [{"id": f"k{i}", "region": v, "ts": 1} for i, v in enumerate([LONG, ADDRESS, None, "__NULL__", ""])]
    write_batch(tmp_path / "ds" / "part-0.parquet", rows, SCHEMA)
    uri = str(tmp_path / "table")
    res = run_bootstrap(spark, BootstrapOptions(table=uri, source=str(tmp_path / "ds"), record_key=["id"],
                                                partition_field="region", index="bucket", mode="rewrite",
                                                num_buckets=2))
    assert not res["noop"]
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition="region") == reduce_batches(
        [rows], partition="region", delete_field=None)
    dirs = {s.partition for s in Table.load(uri).view().slices()}
    assert dirs == {partition_path("region", r["region"]) for r in rows}


# -- field names ------------------------------------------------------------------------
BAD_NAMES = {"absolute": "/ESCAPED", "relative up": "../up", "nested": "a/b", "dot": ".", "dotdot": "..",
             "hidden": ".hidden", "backslash": "a\\b", "equals": "a=b", "nul": "a\x00b", "newline": "a\nb",
             "empty key": "", "too long": "f" * 129, "struct syntax": "a.b", "backtick": "a`b"}
#: refused only as a partition field, whose name is a directory name's first part
PATH_ONLY = {"absolute", "nested", "backslash", "equals"}


@pytest.mark.parametrize("case", list(BAD_NAMES))
def test_bad_field_names_are_refused_before_anything(tmp_path, case):
    """Checked when the options are made: no Spark, no file, one line."""
    name = BAD_NAMES[case]
    if case == "absolute":
        name = str(tmp_path / "ESCAPED")
    uri = str(tmp_path / "table")
    before = tree_digest(tmp_path)
    for kw in ({"partition_field": name}, {"record_key": [name]}, {"precombine_field": name}):
        if case == "empty key" and "record_key" not in kw:
            continue  # an empty optional field means "none"
        if case in PATH_ONLY and "partition_field" not in kw:
            assert UpsertOptions(**{"table": uri, "source": "s.parquet", "record_key": ["id"], **kw})
            continue
        with pytest.raises(BadInputError) as e:
            UpsertOptions(**{"table": uri, "source": "s.parquet", "record_key": ["id"], **kw})
        assert "\n" not in str(e.value) and "field name" in str(e.value)
    if case != "empty key":
        def no_spark():
            raise AssertionError("Spark started for a bad field name")

        write_batch(tmp_path / "ds" / "f.parquet", [{"id": "a", "region": "eu"}])
        with pytest.raises(BadInputError):
            run_bootstrap(no_spark, BootstrapOptions(table=uri, source=str(tmp_path / "ds"), record_key=["id"],
                                                     partition_field=name, mode="rewrite"))
        (tmp_path / "ds" / "f.parquet").unlink()
        (tmp_path / "ds").rmdir()
    assert tree_digest(tmp_path) == before
    assert not list(tmp_path.parent.glob("ESCAPED*")) and not (tmp_path / "table").exists()


def test_cli_refuses_an_absolute_partition_field_before_the_jvm(tmp_path):
    """The issue's recipe: exit 2, one line, nothing written anywhere, no JVM started."""
    escaped = tmp_path / "x" / "ESCAPED"
    src = write_batch(tmp_path / "abs.parquet", [{"id": "a", str(escaped): "eu", "ts": 1},
                                                 {"id": "b", str(escaped): "us", "ts": 2}])
    before = tree_digest(tmp_path)
    started = time.perf_counter()
    cli = Path(sys.executable).parent / "bucketindex"
    p = subprocess.run([str(cli), "upsert", str(tmp_path / "t_abs"), src, "--record-key", "id",
                        "--partition-field", str(escaped)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "partition field name" in p.stderr
    assert time.perf_counter() - started < 30  # a JVM start alone takes longer here
    assert tree_digest(tmp_path) == before and not escaped.parent.exists()


# -- one check for every path written or deleted ------------------------------------------
def test_layout_and_fileio_refuse_paths_outside_the_root(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    t = Table.open(str(tmp_path / "table"))
    for rel in (str(outside), "a/../../outside.txt", "region=eu/../..", "", "."):
        with pytest.raises(PathEscapeError):
            t.abs(rel)
    for rel in (".bucketindex/table.json", "a/../.bucketindex/x.parquet", "../ds/f.parquet"):
        with pytest.raises(PathEscapeError):
            t.layout.data_path(rel)
    assert t.abs("../ds/f.parquet").endswith("/ds/f.parquet")  # a reference file: readable
    for op in (lambda: t.io.write_bytes(str(outside), b"x"), lambda: t.io.delete(str(outside)),
               lambda: t.io.write_atomic(str(outside), b"x"), lambda: t.io.create_exclusive(str(outside) + "2", b""),
               lambda: t.io.delete_dir(str(tmp_path)), lambda: t.io.mkdirs(str(tmp_path / "t2")),
               lambda: t.io.open_output_stream(t.root + "/../x")):
        with pytest.raises(PathEscapeError):
            op()
    assert outside.read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["outside.txt"]
    unconfined, _ = resolve(str(tmp_path))
    assert unconfined.exists(str(outside))  # only a table's FileIO is confined


def test_clean_and_rollback_never_delete_outside_the_root(tmp_path):
    """Paths an older release recorded outside the root (or reference files) are skipped."""
    victims = [tmp_path / "victim.parquet", tmp_path / "ds" / "f.parquet"]
    for v in victims:
        v.parent.mkdir(exist_ok=True)
        v.write_text("keep")
    t = Table.open(str(tmp_path / "table"))
    inside = t.root + "/region=eu/f.parquet"
    os.makedirs(os.path.dirname(inside))
    Path(inside).write_text("old version")
    files = [str(victims[0]), "../victim.parquet", "../ds/f.parquet", "region=eu/../../victim.parquet",
             "region=eu/f.parquet"]
    plan = {"files": files, "bytes": 0, "earliest_retained_seq": 1, "earliest_retained_instant": "x",
            "previous_retained_seq": 0, "policy": "test"}
    _deleter(t)(SimpleNamespace(plan=plan, ts="20260101000000000"))
    assert all(v.read_text() == "keep" for v in victims) and not Path(inside).exists()
    assert not any(t.delete_file(f) for f in files[:4])


def test_delete_treats_a_name_too_long_as_absent(tmp_path):
    t = Table.open(str(tmp_path / "table"))
    too_long = t.root + "/region=" + "y" * 300 + "/f.parquet"
    t.io.delete(too_long)
    t.io.delete_dir(os.path.dirname(too_long))
    with pytest.raises(OSError) as e:
        t.io.write_bytes(too_long, b"x")
    assert e.value.errno == errno.ENAMETOOLONG


# -- a failed write can always be rolled back ---------------------------------------------
def test_a_write_that_fails_on_a_long_name_is_rolled_back(spark, tmp_path, monkeypatch):
    """The issue's D3: with names not shortened (as before the fix) the task fails with
    ENAMETOOLONG; the abort must still remove everything, and the table stay usable."""
    uri = str(tmp_path / "table")
    first = [{"id": f"k{i}", "region": "eu", "ts": 1} for i in range(5)]
    bad = [{"id": "k0", "region": LONG, "ts": 2}, {"id": "new", "region": ADDRESS, "ts": 2}]
    run_upsert(spark, _options(uri, write_batch(tmp_path / "b0.parquet", first, SCHEMA), "record", "b0"))
    before = tree_digest(Path(uri))
    monkeypatch.setattr(layout, "MAX_PARTITION_DIR_BYTES", 10_000)  # the driver plans unshortened names
    with pytest.raises(Exception) as e:
        run_upsert(spark, _options(uri, write_batch(tmp_path / "b1.parquet", bad, SCHEMA), "record", "b1"))
    assert "name too long" in str(e.value)
    monkeypatch.undo()
    table = Table.load(uri)
    assert not table.timeline.reload().pending()
    assert {p for p in tree_digest(Path(uri)) if not p.startswith(".bucketindex/")} == {
        p for p in before if not p.startswith(".bucketindex/")}

    # a writer that died after its marker, with a marker naming a never-created 300-byte name
    txn = Transaction(table, "commit", {"batch_id": "crashed", "operation": "upsert"}).begin()
    table.create_marker(txn.ts, "region=" + "z" * 300 + "/f_0-1-0_" + txn.ts + ".parquet")
    txn._stop_heartbeat()  # the writer is gone
    assert rollback(table, txn.ts, force=True) == [txn.ts]
    assert not table.timeline.reload().pending()

    run_upsert(spark, _options(uri, str(tmp_path / "b1.parquet"), "record", "b1"))
    _assert_matches_oracle(spark, uri, reduce_batches([first, bad], delete_field=None), None, spark_read=False)


def test_a_table_written_before_keeps_its_old_directories(spark, tmp_path, monkeypatch):
    """Directories named by the rule before issue 22 (a value starting with `__` unescaped, a
    name of 201-255 bytes whole) keep their values: a bucket-index update must find its key
    there, not store a second copy under the new name."""
    uri = str(tmp_path / "table")
    old_value, long_value = "__x", "w" * 230
    first = [{"id": "a", "region": old_value, "ts": 1}, {"id": "b", "region": long_value, "ts": 1},
             {"id": "c", "region": "eu", "ts": 1}]
    # the old rule, in the one definition of a partition directory (the driver's Spark expression applies it)
    monkeypatch.setattr(layout, "DUNDER_ESCAPE", ("(?!)", ""))
    monkeypatch.setattr(layout, "MAX_PARTITION_DIR_BYTES", 255)
    run_upsert(spark, _options(uri, write_batch(tmp_path / "b0.parquet", first, SCHEMA), "bucket", "b0"))
    monkeypatch.undo()
    old_dirs = {s.partition for s in Table.load(uri).view().slices()}
    assert "region=__x" in old_dirs and f"region={long_value}" in old_dirs
    second = [{**r, "ts": 2} for r in first] + [{"id": "d", "region": old_value, "ts": 2}]
    run_upsert(spark, _options(uri, write_batch(tmp_path / "b1.parquet", second, SCHEMA), "bucket", "b1"))
    assert {s.partition for s in Table.load(uri).view().slices()} == old_dirs
    _assert_matches_oracle(spark, uri, reduce_batches([first, second], partition="region", delete_field=None),
                           "region", spark_read=False)
