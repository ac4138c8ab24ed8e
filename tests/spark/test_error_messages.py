"""Every failure of issue 22's D5-D7 ends with one line naming its cause and the documented
exit status: a full disk (which one), damaged metadata, a missing data file, a corrupt
source, a table path that is a file, a store that refuses access, a compaction cancelled by
a rehash. Most run ``cli.main`` in-process on the shared session; a cold process only where
the process itself is the point (a real full tmpfs, another user, a check before the JVM)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs import cli
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.table.action.rollback import rollback
from spark_jobs.table.table import Table
from tests.spark.conftest import tree_digest, write_batch

pytestmark = pytest.mark.spark

ROWS = [{"id": f"k{i}", "region": "eu" if i % 2 else "us", "ts": 1} for i in range(6)]
BIN = [sys.executable, "-m", "spark_jobs.cli"]


@pytest.fixture(scope="module")
def made(spark, tmp_path_factory) -> Path:
    """A record-index table with two commits (the second rewrites the ``eu`` group, so a clean has work)."""
    d = tmp_path_factory.mktemp("errs")
    uri = str(d / "table")
    for i, rows in enumerate([ROWS, [{"id": "k1", "region": "eu", "ts": 2}]]):
        run_upsert(spark, UpsertOptions(table=uri, source=write_batch(d / f"b{i}.parquet", rows), record_key=["id"],
                                        precombine_field="ts", partition_field="region", num_buckets=2,
                                        table_type="copy_on_write"))  # the second rewrites the group
    write_batch(d / "src.parquet", [{"id": "k9", "region": "eu", "ts": 3}])
    return d


def _copy(made: Path, dest: Path) -> str:
    shutil.copytree(made / "table", dest)
    return str(dest)


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("bucketindex:")]


def _one(capsys) -> str:  # type: ignore[no-untyped-def]
    lines = _lines(capsys.readouterr().err)
    assert len(lines) == 1, lines
    return lines[0]


def _no_tmp(root: str | Path) -> None:
    assert not [p for p in Path(root).rglob("*.tmp")], "temp files left behind"


def test_disk_full_on_the_table_storage(made, tmp_path):
    """D5: a 1 MiB tmpfs holding the table, filled up; the source, Spark's local dir and /tmp elsewhere."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = tmp_path / "out"
    shutil.copytree(made / "table", tmp_path / "seed")
    cmd = " ".join(BIN)
    script = f"""
mount -t tmpfs -o size=1m tmpfs {mnt} && cp -a {tmp_path}/seed {mnt}/T || exit 9
dd if=/dev/zero of={mnt}/filler bs=4k 2>/dev/null
cd {mnt}/T && find . -type f | sort | xargs sha256sum > {tmp_path}/before.txt
cd {tmp_path}
{cmd} clean {mnt}/T --retain-commits 1 2> {out}.clean; echo $? > {out}.clean.rc
{cmd} compact {mnt}/T --schedule-only --min-deltas 1 2> {out}.compact; echo $? > {out}.compact.rc
{cmd} upsert {mnt}/T {made}/src.parquet --record-key id --master local[1] 2> {out}.upsert; echo $? > {out}.upsert.rc
{cmd} read {made}/table --output {mnt}/snap.parquet 2> {out}.read; echo $? > {out}.read.rc
cd {mnt}/T && find . -type f | sort | xargs sha256sum > {tmp_path}/after.txt
find {mnt} -name '*.tmp' > {tmp_path}/tmps.txt; ls {mnt} > {tmp_path}/top.txt
"""
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    for verb in ("clean", "compact", "upsert"):
        last = Path(f"{out}.{verb}").read_text().strip().splitlines()[-1]
        assert Path(f"{out}.{verb}.rc").read_text().strip() == "1", last
        assert last.startswith(f"bucketindex: {verb} failed: out of disk: the table's storage is full ({mnt}/T"), last
        assert "spark.local.dir" not in last
    last = Path(f"{out}.read").read_text().strip().splitlines()[-1]
    assert Path(f"{out}.read.rc").read_text().strip() == "1"
    assert f"the driver's disk holding the output {mnt}/snap.parquet is full" in last, last
    assert (tmp_path / "before.txt").read_text() == (tmp_path / "after.txt").read_text()
    assert (tmp_path / "tmps.txt").read_text() == ""
    assert (tmp_path / "top.txt").read_text().split() == ["T", "filler"]  # no torn snap.parquet


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damaged", ["table.json", "newest sequence entry"])
def test_damaged_metadata_is_named_by_every_verb(made, tmp_path, capsys, damaged):
    """D6: exit 1, one line naming the file and what to do, nothing written (all fail before Spark)."""
    uri = _copy(made, tmp_path / "t")
    meta = tmp_path / "t" / ".bucketindex"
    target = meta / "table.json" if damaged == "table.json" else sorted((meta / "sequence").glob("*.json"))[-1]
    _truncate(target)
    before = tree_digest(tmp_path / "t")
    verbs = [["read", uri], ["read", uri, "--output", str(tmp_path / "o.parquet")], ["show", uri],
             ["rollback", uri], ["clean", uri], ["validate", uri], ["compact", uri],
             ["upsert", uri, str(made / "src.parquet"), "--record-key", "id"]]
    for argv in verbs:
        assert cli.main(argv, submitted=True) == 1, argv
        line = _one(capsys)
        assert line.startswith(f"bucketindex: {argv[0]} failed: ") and f"{target} is damaged (not valid JSON" in line
        assert "restore it from a backup" in line
    assert tree_digest(tmp_path / "t") == before and not (tmp_path / "o.parquet").exists()
    if damaged == "table.json":  # a cold process: one line, and no JVM started for it
        t0 = time.perf_counter()
        p = subprocess.run([*BIN, "validate", uri], capture_output=True, text=True, timeout=120)
        assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "table.json is damaged" in p.stderr and time.perf_counter() - t0 < 10


def test_missing_data_file(made, tmp_path, capsys):
    """D6: ``validate`` reports it (exit 1, file listed); read and upsert name it (exit 1)."""
    uri = _copy(made, tmp_path / "t")
    # the live eu file: the upsert below inserts into that group, so it must read it
    gone = max((tmp_path / "t").glob("region=eu/*.parquet"), key=lambda q: q.stem.rsplit("_", 1)[1])
    gone.unlink()
    assert cli.main(["validate", uri], submitted=True) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["problems"]["data_files_missing"]["samples"] == [str(gone)]
    lines = _lines(err)
    assert len(lines) == 1 and "data_files_missing" in lines[0] and str(gone) in lines[0]
    for argv in (["read", uri, "--output", str(tmp_path / "o.parquet")], ["read", uri],
                 ["upsert", uri, str(made / "src.parquet"), "--record-key", "id"]):
        assert cli.main(argv, submitted=True) == 1, argv
        line = _one(capsys)
        assert line.startswith(f"bucketindex: {argv[0]} failed: data file {gone} of the committed snapshot is missing")
    assert Table.load(uri).timeline.reload().last_seq == 2  # the upsert committed nothing
    _no_tmp(uri)


@pytest.mark.parametrize("case", ["junk file in a source directory", "truncated parquet file"])
def test_corrupt_source_is_named(made, tmp_path, capsys, case):
    """D7: exit 2, one line naming the file as corrupt or not Parquet, nothing written."""
    uri = _copy(made, tmp_path / "t")
    if case.startswith("junk"):
        src = tmp_path / "src"
        write_batch(src / "part-0.parquet", [{"id": "x", "region": "eu", "ts": 9}])
        bad = src / "part-1.parquet"
        bad.write_bytes(b"this is not parquet at all")
    else:
        src = bad = tmp_path / "trunc.parquet"
        pq.write_table(pa.table({"id": ["x"] * 50, "region": ["eu"] * 50, "ts": list(range(50))}), bad)
        _truncate(bad)
    before = tree_digest(tmp_path / "t")
    assert cli.main(["upsert", uri, str(src), "--record-key", "id"], submitted=True) == 2
    line = _one(capsys)
    assert line.startswith(f"bucketindex: error: source file {bad} is corrupt or not Parquet"), line
    assert tree_digest(tmp_path / "t") == before
    _no_tmp(uri)


def test_table_path_that_is_a_file(made, tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    for argv in (["upsert", str(f), str(made / "src.parquet"), "--record-key", "id"], ["read", str(f)]):
        assert cli.main(argv, submitted=True) == 2
        assert _one(capsys) == f"bucketindex: error: table path {f} is a file, not a table directory"
    assert f.read_text() == "x"


def test_permission_denied_on_timeline_and_sequence(made):
    """D7: the store refused, not the input: exit 1, one line naming the directory."""
    base = Path(tempfile.mkdtemp(prefix="bi-perm-"))  # pytest's tmp dirs are 0700: another user cannot enter
    try:
        base.chmod(0o755)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        # timeline/ not writable: the whole table is root's, readable by all
        ro = _copy(made, base / "ro")
        for p in [Path(ro), *Path(ro).rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        before = tree_digest(Path(ro))
        p = subprocess.run([*nobody, *BIN, "compact", ro, "--schedule-only", "--min-deltas", "1"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 1, p.stderr
        last = p.stderr.strip().splitlines()[-1]
        assert last == (f"bucketindex: compact failed: permission denied on {ro}/.bucketindex/timeline "
                        f"(Permission denied): the store refused access; grant this user access to the table's "
                        f"files and run again"), last
        assert tree_digest(Path(ro)) == before
        # only sequence/ not writable: clean plans and deletes, then cannot complete
        seq = _copy(made, base / "seq")
        for p in [Path(seq), *Path(seq).rglob("*")]:
            os.chown(p, 65534, 65534)
        os.chown(Path(seq) / ".bucketindex" / "sequence", 0, 0)
        p = subprocess.run([*nobody, *BIN, "clean", seq, "--retain-commits", "1"], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 1, p.stderr
        last = p.stderr.strip().splitlines()[-1]
        assert last.startswith(f"bucketindex: clean failed: permission denied on {seq}/.bucketindex/sequence "), last
        _no_tmp(ro)
        _no_tmp(seq)
    finally:
        shutil.rmtree(base)


def test_compaction_cancelled_by_a_rehash_exits_3_then_2(spark, made, tmp_path, capsys, monkeypatch):
    """D7: a plan a rehash cancels while it runs: exit 3, one ``conflict:`` line; running a
    cancelled plan (again) is final, exit 2, so a scheduler does not retry it in vain."""
    from spark_jobs.jobs import compact as compact_job
    from spark_jobs.jobs.rehash import run_rehash

    uri = _copy(made, tmp_path / "t")
    assert cli.main(["compact", uri, "--schedule-only", "--min-deltas", "1"]) == 0
    planned = capsys.readouterr().out.strip().splitlines()[-1]
    run_rehash(spark, uri, 4)  # cancels the plan made under 2 buckets
    assert cli.main(["compact", uri, "--execute", planned], submitted=True) == 2
    line = _one(capsys)
    assert line.startswith(f"bucketindex: error: compaction {planned} was cancelled") and "before it ran" in line
    # cancelled while its tasks run: they stop with InstantRolledBackError inside Spark's exception
    run_upsert(spark, UpsertOptions(table=uri, source=str(made / "src.parquet"), record_key=["id"]))  # a delta
    assert cli.main(["compact", uri, "--schedule-only", "--min-deltas", "1"]) == 0
    planned = capsys.readouterr().out.strip().splitlines()[-1]
    real = compact_job._execute

    def rehashed_meanwhile(s, table, txn):  # type: ignore[no-untyped-def]
        rollback(Table.load(uri), txn.ts, force=True)  # what a concurrent rehash does to the plan
        return real(s, table, txn)

    monkeypatch.setattr(compact_job, "_execute", rehashed_meanwhile)
    assert cli.main(["compact", uri, "--execute", planned], submitted=True) == 3
    line = _one(capsys)
    assert line.startswith(f"bucketindex: conflict: compaction {planned} was cancelled") and "while it ran" in line
    assert not Table.load(uri).timeline.reload().pending()
    monkeypatch.setattr(compact_job, "_execute", real)
    assert cli.main(["compact", uri, "--execute", planned], submitted=True) == 2  # the retry: final
    assert "before it ran" in _one(capsys)
    _no_tmp(uri)
