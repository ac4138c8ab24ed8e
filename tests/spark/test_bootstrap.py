"""``bucketindex bootstrap``: a table made of an existing Parquet dataset, in both modes.

The dataset is written by plain pyarrow (``write_dataset`` with Hive partitioning: partition
values with spaces, ``/``, ``%``, ``+``, non-ASCII and null, keys with the same and very long
keys). After a bootstrap the table reads as the dataset (Arrow and Spark readers), ``validate``
and ``shadow-compare`` pass, and upserts after it (updates, stale updates, deletes,
re-inserts, partition moves) leave the table equal to the oracle. A reference bootstrap never
changes, moves or deletes a dataset file -- not through upserts, compaction, rehash or clean.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from spark_jobs.cli import main
from spark_jobs.jobs.bootstrap import BootstrapOptions, run_bootstrap  # the Spark engine
from spark_jobs.jobs.compact import run_compact
from spark_jobs.jobs.read import read_table
from spark_jobs.jobs.rehash import run_rehash
from spark_jobs.jobs.shadow_compare import run_shadow_compare
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.jobs.validate import run_validate
from spark_jobs.table import (
    dataset as table_dataset,  # this module has a `dataset` fixture
)
from spark_jobs.table import delta
from spark_jobs.table.action.clean import run_clean
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.describe import describe
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView
from tests.harness.delta_reads import query_delta
from tests.oracle import reduce_batches
from tests.spark.conftest import tree_digest, write_batch
from tests.unit.test_delta_mirror import check_every_version

pytestmark = pytest.mark.spark

REGIONS = ["eu west", "us/east", "100%", "x+y", "亚太 ap", "são paulo", None]
COLUMNS = ["id", "v", "ts", "region"]


def _key(i: int) -> str:
    if i % 100_000 == 7:
        return f"long-{i}-" + "ключ/" * 80  # a 400+ character key
    return f"u{i:07d}" + (" /%+ключ" if i % 1000 == 3 else "")


def make_dataset(root: Path, n: int, *, flat: bool = False, rows_per_file: int = 100_000) -> pa.Table:
    """``n`` rows written by plain pyarrow; returns them as pyarrow reads the dataset back."""
    i = np.arange(n)
    t = pa.table({"id": pa.array([_key(int(x)) for x in i]), "v": pa.array(i * 3, pa.int64()),
                  "ts": pa.array(i % 5, pa.int64()),
                  "region": pa.array([REGIONS[int(x) % len(REGIONS)] for x in i], pa.string())})
    ds.write_dataset(t, root, format="parquet", partitioning=None if flat else ["region"],
                     partitioning_flavor=None if flat else "hive", max_rows_per_file=rows_per_file,
                     max_rows_per_group=min(rows_per_file, 65_536))
    return read_dataset(root)


def read_dataset(root: Path) -> pa.Table:
    return ds.dataset(root, format="parquet", partitioning="hive").to_table().select(COLUMNS)


def file_digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _sorted(t: pa.Table, ident: list[str]) -> pa.Table:
    t = t.select(COLUMNS).cast(pa.schema([("id", pa.string()), ("v", pa.int64()), ("ts", pa.int64()),
                                          ("region", pa.string())]))
    return t.sort_by([(c, "ascending") for c in ident])


def assert_same_rows(actual: pa.Table, expected: pa.Table, ident: list[str]) -> None:
    a, e = _sorted(actual, ident), _sorted(expected, ident)
    assert a.num_rows == e.num_rows, (a.num_rows, e.num_rows)
    if not a.equals(e):
        for c in COLUMNS:
            diff = pc.invert(pc.fill_null(pc.equal(a.column(c), e.column(c)), False))
            bad = pc.indices_nonzero(pc.and_(diff, pc.invert(pc.and_(pc.is_null(a.column(c)),
                                                                      pc.is_null(e.column(c))))))
            assert len(bad) == 0, (c, a.slice(bad[0].as_py(), 1).to_pylist(), e.slice(bad[0].as_py(), 1).to_pylist())
        raise AssertionError("tables differ")


def _batches(data: pa.Table, seed: int) -> list[list[dict]]:
    """Two batches on the dataset's keys: updates (some stale, some moving partition),
    deletes, inserts; then re-inserts of deleted keys and updates of moved ones."""
    rng = np.random.default_rng(seed)
    rows = data.take(pa.array(rng.choice(data.num_rows, 3000, replace=False))).to_pylist()
    upd, dele, stale = rows[:1500], rows[1500:2500], rows[2500:]
    b1 = [{**r, "v": -1, "ts": 10, "is_deleted": False} for r in upd]
    for r in b1[:300]:
        r["region"] = REGIONS[(REGIONS.index(r["region"]) + 1) % len(REGIONS)]  # moves partition
    b1 += [{**r, "v": -2, "ts": -1, "is_deleted": False} for r in stale]  # older than the stored row: ignored
    b1 += [{**r, "ts": 10, "is_deleted": True} for r in dele]
    b1 += [{"id": f"new {i} ü/+", "v": i, "ts": 1, "region": REGIONS[i % len(REGIONS)], "is_deleted": False}
           for i in range(500)]
    b2 = [{**r, "v": -3, "ts": 20, "is_deleted": False} for r in dele[:200]]  # re-inserted
    b2 += [{**r, "v": -4, "ts": 20, "is_deleted": False} for r in b1[:100]]  # the moved ones again
    return [b1, b2]


def expected_after(data: pa.Table, batches: list[list[dict]], ident: list[str]) -> pa.Table:
    """The oracle: rows no batch touches stay as in the dataset; the touched ones are the
    dataset's rows of those identities reduced with the batches."""
    def identity(r: dict) -> tuple:
        return tuple(r[c] for c in ident)

    touched = {identity(r) for b in batches for r in b}
    ids = pa.array(sorted({t[-1] for t in touched}))
    candidates = data.filter(pc.is_in(data.column("id"), ids)).to_pylist()
    base_rows = [r for r in candidates if identity(r) in touched]
    if len(ident) == 1:  # global identity: every dataset row of a touched key is touched
        keep = data.filter(pc.invert(pc.is_in(data.column("id"), ids)))
    else:
        rest = {identity(r) for r in candidates} - touched
        keep = data.filter(pc.invert(pc.is_in(data.column("id"), ids)))
        keep = pa.concat_tables([keep, pa.Table.from_pylist([r for r in candidates if identity(r) in rest],
                                                            schema=data.schema)])
    state = reduce_batches([base_rows, *batches], partition="region" if len(ident) == 2 else None)
    out = pa.Table.from_pylist([{c: r[c] for c in COLUMNS} for r in state.values()], schema=data.schema)
    return pa.concat_tables([keep, out])


def _upsert(spark, uri: str, tmp: Path, batch: list[dict], n: int) -> None:
    src = write_batch(tmp / f"batch-{n}.parquet", batch)
    run_upsert(spark, UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts",
                                    partition_field="region", delete_field="is_deleted", batch_id=f"b{n}"))


def assert_healthy(spark, uri: str, ident: list[str]) -> None:
    report = run_validate(spark, uri)
    assert report["ok"], report
    shadow = run_shadow_compare(spark, uri)
    # every record (a key, or a key in its partition for the bucket index) was checked
    assert shadow["ok"] and shadow["keys_checked"] == read_arrow(uri).group_by(ident).aggregate([]).num_rows, shadow


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("bootstrap") / "dataset"
    # several files per partition directory, small enough for the default tier; the scale run
    # (10M rows, timed) is benchmarks/bootstrap.py
    data = make_dataset(root, 120_000, rows_per_file=15_000)
    assert len(list(root.rglob("*.parquet"))) >= 2 * len(REGIONS)
    return root, data


@pytest.mark.parametrize("index,mode,table_type", [
    ("record", "reference", "copy_on_write"),
    ("bucket", "rewrite", "merge_on_read"),
])
def test_bootstrap_of_a_multi_file_hive_dataset(spark, dataset, tmp_path, index, mode, table_type):
    root, data = dataset
    before = file_digests(root)
    uri = str(tmp_path / "table")
    res = run_bootstrap(spark, BootstrapOptions(table=uri, source=str(root), record_key=["id"],
                                                partition_field="region", precombine_field="ts", index=index,
                                                mode=mode, table_type=table_type, num_buckets=4,
                                                mirror="delta" if mode == "rewrite" else None))
    assert res["mode"] == mode and not res["noop"]
    assert res["counts"]["rows"] == data.num_rows and res["counts"]["duplicate_keys"] == 0
    files = len(before)
    if mode == "reference":  # every dataset file is a file slice, in place; only the index was written
        assert res["counts"]["files_referenced"] == files and res["counts"]["files_rewritten"] == 0
        assert not list(Path(uri).rglob("*.parquet"))
        view = Table.load(uri).view()
        assert all(s.path.startswith("../") for s in view.slices()) and len(view.slices()) == files
    else:
        assert len(list(Path(uri).rglob("*.parquet"))) >= 4
    ident = ["id"] if index == "record" else ["region", "id"]
    assert_same_rows(read_arrow(uri), data, ident)
    if mode == "rewrite":  # --mirror delta on the upsert path a rewrite takes: Delta reads the bootstrap
        assert check_every_version(uri) == 1
    assert_same_rows(read_table(spark, uri).toArrow(), data, ident)
    assert_healthy(spark, uri, ident)
    # a second run is a no-op (an Airflow retry), and changes nothing
    again = run_bootstrap(spark, BootstrapOptions(table=uri, source=str(root), record_key=["id"],
                                                  partition_field="region", precombine_field="ts", index=index,
                                                  mode=mode, table_type=table_type, num_buckets=4,
                                                  mirror="delta" if mode == "rewrite" else None))
    assert again["noop"] and again["instant"] == res["instant"]

    batches = _batches(data, seed=3)
    for n, b in enumerate(batches):
        _upsert(spark, uri, tmp_path, b, n)
    expected = expected_after(data, batches, ident)
    assert_same_rows(read_arrow(uri), expected, ident)
    assert_healthy(spark, uri, ident)
    if mode == "reference":  # clean drops what no retained snapshot reads, never a dataset file
        assert run_clean(uri, retain_commits=1)["files"] > 0
        assert_same_rows(read_table(spark, uri).toArrow(), expected, ident)
    assert file_digests(root) == before


def test_reference_table_through_merge_on_read_compaction_rehash_and_clean(spark, tmp_path):
    root = tmp_path / "dataset"
    data = make_dataset(root, 6000, rows_per_file=700)
    before = file_digests(root)
    uri = str(tmp_path / "table")
    run_bootstrap(spark, BootstrapOptions(table=uri, source=str(root), record_key=["id"], partition_field="region",
                                          precombine_field="ts", table_type="merge_on_read", num_buckets=2,
                                          mirror="delta"))  # the Delta projection: reference files by URI
    assert delta.versions_present(Table.load(uri)) == [0, 1]
    batches = _batches(data, seed=5)
    _upsert(spark, uri, tmp_path, batches[0], 0)
    assert any(s.logs and s.path.startswith("../") for s in Table.load(uri).view().slices())  # logs on user files
    compaction = run_compact(spark, uri)
    view = Table.load(uri).view()
    assert compaction["executed"] and not any(s.logs for s in view.slices())
    # the compacted groups' new bases are the table's, in its partition directories
    compacted = [s for s in view.slices() if s.instant == compaction["instant"]]
    assert compacted and all(s.path.startswith(s.partition + "/") for s in compacted)
    run_rehash(spark, uri, 8)
    _upsert(spark, uri, tmp_path, batches[1], 1)
    # every Delta version equals the read-optimized view of its snapshot: the bootstrap's
    # reference files (absolute add.paths), logs on them, their compaction, the rehash
    assert check_every_version(uri, read=query_delta) == Table.load(uri).timeline.last_seq
    run_clean(uri, retain_commits=1)
    expected = expected_after(data, batches, ["id"])
    assert_same_rows(read_arrow(uri), expected, ["id"])
    assert_same_rows(read_table(spark, uri).toArrow(), expected, ["id"])
    # other engines' paths: the pyarrow dataset (Hive path columns from fragment expressions) and the data source
    assert_same_rows(table_dataset(uri).to_table(), expected, ["id"])
    assert_same_rows(spark.read.format("bucketindex").load(uri).toArrow(), expected, ["id"])
    assert check_every_version(uri, read=query_delta) >= 1  # after the clean: the retained ones
    assert_healthy(spark, uri, ["id"])
    assert file_digests(root) == before


def _dup_dataset(root: Path) -> list[dict]:
    """A flat dataset (no partition directories) in two files, keys duplicated within and across them."""
    a = [{"id": f"k{i}", "v": i, "ts": 1, "region": "r"} for i in range(50)]
    a += [{"id": "k1", "v": 100, "ts": 5, "region": "r"}]  # k1 twice in one file; ts 5 wins
    b = [{"id": "k2", "v": 200, "ts": 0, "region": "r"}, {"id": "k3", "v": 300, "ts": 9, "region": "r"},
         {"id": "k4", "v": 400, "ts": 1, "region": "r"}]  # k4: a tie, the later file wins
    write_batch(root / "part-a.parquet", a)
    write_batch(root / "part-b.parquet", b)
    return a + b


def test_duplicate_keys_refused_with_counts_and_samples_or_resolved_by_precombine(spark, tmp_path, capsys):
    root = tmp_path / "dataset"
    rows = _dup_dataset(root)
    before = file_digests(root)
    uri = str(tmp_path / "table")
    assert main(["bootstrap", uri, str(root), "--record-key", "id", "--engine", "spark"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "4 record key(s) (id) appear more than once in the source (8 rows)" in err[0], err
    assert "'k1', 'k2', 'k3', 'k4'" in err[0]
    assert not os.path.exists(uri)

    res = run_bootstrap(spark, BootstrapOptions(table=uri, source=str(root), record_key=["id"],
                                                precombine_field="ts"))
    c = res["counts"]
    assert (c["duplicate_keys"], c["rows_dropped"], c["rows"], c["files_rewritten"]) == (4, 4, 50, 2)
    want = {r["id"]: r for r in rows if r["id"] not in ("k1", "k2", "k3", "k4")}
    want.update({"k1": rows[50], "k2": rows[2], "k3": rows[52], "k4": rows[53]})
    got = {r["id"]: r for r in read_arrow(uri).to_pylist()}
    assert got == want
    assert_healthy(spark, uri, ["id"])
    assert file_digests(root) == before  # the losers' files were replaced in the table, not edited


@pytest.mark.parametrize("args,message", [
    (["--index", "bucket", "--mode", "reference"], "the bucket index needs --mode rewrite"),
    (["--record-key", "nope"], "record key field 'nope' is not in the source"),
    (["--record-key", "amount"], "--mode reference needs string or integer record key columns (amount is double)"),
    (["--partition-field", "v"], "--mode reference needs the dataset partitioned by v directories"),
    (["--num-buckets", "0"], "--num-buckets must be at least 1"),
    (["--index", "global_simple", "--mode", "reference"], "the global_simple index needs --mode rewrite"),
    (["--index", "hash"], "invalid choice"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    root = tmp_path / "dataset"
    write_batch(root / "region=eu/part-0.parquet", [{"id": "a", "v": 1, "amount": 1.5}])
    uri = str(tmp_path / "table")
    base = ["bootstrap", uri, str(root), "--record-key", "id", "--engine", "spark"]
    try:
        code = main(base + args)
    except SystemExit as e:  # argparse's own refusal (a choice it does not offer)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not os.path.exists(uri)


def test_a_table_with_data_is_refused(spark, tmp_path, capsys):
    root = tmp_path / "dataset"
    write_batch(root / "part-0.parquet", [{"id": "a", "v": 1}])
    uri = str(tmp_path / "table")
    run_upsert(spark, UpsertOptions(table=uri, source=str(root / "part-0.parquet"), record_key=["id"]))
    before = tree_digest(Path(uri))
    assert main(["bootstrap", uri, str(root), "--record-key", "id", "--engine", "spark"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds a table with data" in err[0], err
    assert tree_digest(Path(uri)) == before


def _cli(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spark_jobs.cli", *args], env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize("mode,point", [
    ("reference", "before_complete"),  # index written, commit point not reached
    ("reference", "after_index_file"),
    ("rewrite", "after_data_file"),
])
def test_killed_bootstrap_leaves_no_table_rows_and_the_next_run_finishes(spark, spark_cli_args, tmp_path, capsys,
                                                                         mode, point):
    root = tmp_path / "dataset"
    data = make_dataset(root, 3000, rows_per_file=500)
    uri = str(tmp_path / "table")
    args = ["bootstrap", uri, str(root), "--record-key", "id", "--partition-field", "region", "--mode", mode,
            "--engine", "spark", *spark_cli_args]
    p = _cli(args, {"BUCKETINDEX_FAULT": point})
    _, err = p.communicate(timeout=300)
    assert p.returncode == -signal.SIGKILL, (p.returncode, err[-2000:])
    table = Table.load(uri)
    assert table.view().num_rows == 0 and read_arrow(uri).num_rows == 0  # readers see no snapshot
    assert [i.action for i in table.timeline.pending()] == ["bootstrap"]

    time.sleep(0.2)
    res = run_bootstrap(spark, BootstrapOptions(table=uri, source=str(root), record_key=["id"],
                                                partition_field="region", mode=mode, heartbeat_timeout_s=0.1))
    assert not res["noop"]
    table = Table.load(uri)
    assert not table.timeline.pending()
    assert_same_rows(read_arrow(uri), data, ["id"])
    assert run_validate(spark, uri)["ok"]
    # nothing the dead attempt wrote is left outside the snapshots
    assert not table.io.list_names(table.layout.markers)
    on_disk = {str(q.relative_to(uri)) for ext in ("*.parquet", "*.arrow") for q in Path(uri).rglob(ext)}
    assert on_disk <= FileSystemView.at_seq(table.timeline, table.timeline.last_seq).all_files()
    # and a third run is a no-op that needs no Spark
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["noop"]


def test_validate_reports_a_reference_file_changed_or_removed_under_the_table(spark, tmp_path):
    root = tmp_path / "dataset"
    make_dataset(root, 200, rows_per_file=50)
    uri = str(tmp_path / "table")
    run_bootstrap(spark, BootstrapOptions(table=uri, source=str(root), record_key=["id"], partition_field="region"))
    files = sorted(root.rglob("*.parquet"))
    write_batch(files[0], [{"id": "x", "v": 1, "ts": 1}])  # rewritten by someone else
    files[1].unlink()
    report = run_validate(spark, uri)
    assert not report["ok"]
    problem = report["problems"]["reference_files_changed"]
    assert problem["count"] == 2 and any(s.endswith(": missing") for s in problem["samples"]), problem


@pytest.mark.parametrize("racer", ["bootstrap", "commit"])
def test_reference_bootstrap_losing_a_race_exits_3_with_one_line(spark, tmp_path, capsys, monkeypatch, racer):
    """A writer completes between the bootstrap's plan and its commit point: the bootstrap's
    commit conflicts (another bootstrap always does; a commit that rewrote one of its file
    groups does by write sets). Exit 3 (retryable) with one ``conflict:`` line, not a
    traceback, and nothing of the bootstrap is left."""
    from spark_jobs.table.action import Transaction
    from spark_jobs.table.action import bootstrap as bootstrap_action
    from spark_jobs.table.action.bootstrap import file_id_of, reference_path
    from spark_jobs.table.timeline import Action

    root = tmp_path / "dataset"
    make_dataset(root, 400, flat=True, rows_per_file=100)
    uri = str(tmp_path / "table")
    raced: list[str] = []

    def other_writer_commits(point: str) -> None:
        if point != "before_complete" or raced:
            return
        t = Table.load(uri)
        if racer == "bootstrap":  # another bootstrap of this table under another batch id
            meta = {"batch_id": "other", "file_groups": [], "index": {"added": [], "removed": []}}
        else:  # a write that rewrote a file group the bootstrap references
            first = min(str(p) for p in root.rglob("*.parquet"))
            meta = {"batch_id": "other", "index": {"added": [], "removed": []},
                    "file_groups": [{"partition": "", "file_id": file_id_of(reference_path(t, first)),
                                     "path": None, "num_rows": 0, "removed": True}]}
        txn = Transaction(t, getattr(Action, racer.upper()), {"batch_id": "other"}).begin()
        txn.commit(meta)
        raced.append(txn.ts)

    monkeypatch.setattr(bootstrap_action, "maybe_crash", other_writer_commits)
    code = main(["bootstrap", uri, str(root), "--record-key", "id", "--mode", "reference", "--engine", "spark"],
                submitted=True)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 3, err
    assert len(err) == 1 and err[0].startswith("bucketindex: conflict: "), err
    assert f"(concurrent {racer} {raced[0]}); the bootstrap was not committed; nothing was written" in err[0]
    table = Table.load(uri)
    tl = table.timeline.reload()
    assert tl.pending() == [] and [i.timestamp for i in tl.completed()] == raced
    assert not table.io.list_names(table.layout.markers)
    assert not [p for p in Path(uri).rglob("*.arrow")], "the bootstrap's index deltas were deleted"
    assert describe(table)["conflicts"], "show lists the conflict"


def test_a_bootstraps_total_leaves_out_the_session_start_as_show_does(spark, tmp_path, capsys):
    """The result's ``total_ms`` and the commit's (what ``show`` prints) leave the session's start
    out and give it beside, as an upsert does: a user saw 36,792 ms in the JSON and 19,788 ms in
    ``show`` for one bootstrap (issue 36 item 14), the difference Spark's start."""
    root = tmp_path / "dataset"
    write_batch(root / "part-0.parquet", [{"id": f"k {i}/é", "v": i} for i in range(30)])
    uri = str(tmp_path / "table")

    def slow_start():  # a session that takes 3 s to start, as a cold JVM does (longer)
        time.sleep(3)
        return spark

    t = time.perf_counter()
    res = run_bootstrap(slow_start, BootstrapOptions(table=uri, source=str(root), record_key=["id"],
                                                     mode="reference"))
    wall_ms = (time.perf_counter() - t) * 1000
    assert res["session_start_ms"] >= 3000
    assert res["timings_ms"]["total_ms"] <= wall_ms - 3000, (res, wall_ms)
    assert main(["show", uri, "--json"]) == 0
    shown = [c for c in json.loads(capsys.readouterr().out)["timeline"] if c["action"] == "bootstrap"]
    assert len(shown) == 1 and shown[0]["session_start_ms"] == res["session_start_ms"]
    # the commit's total stops at its commit point: never more than the result's
    assert shown[0]["timings_ms"]["total_ms"] <= res["timings_ms"]["total_ms"]
    assert main(["show", uri]) == 0
    assert f"+session start {res['session_start_ms']}ms" in capsys.readouterr().out
