"""A record-index file deleted or truncated outside bucketindex (issue 36, item 6).

The data is intact, so the table is repairable: ``validate`` names the file as a finding
(exit 1) and checks the rest; every verb that reads the bucket stops with one line naming
the file and the repair command (exit 1: the table is at fault); ``compact --rebuild-index``
rebuilds the bucket from the snapshot's rows as one compaction commit, crash-safe, after
which validate passes, upserts work and the table equals the oracle. All on the Arrow
engine (no JVM).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.index.hashing import buckets_of
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.harness.cli import run_cli
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_arrow_concurrent_writers import write_batch
from tests.unit.test_arrow_retry_and_crash import B1, B2, KEY, options
from tests.unit.test_cli_newcomer import tree_digest

pytestmark = pytest.mark.unit

#: a third batch with a null and an empty partition value beside the others' spaces, "/", "%",
#: "+", non-ASCII and "__NULL__"
B3 = [{"id": KEY.format(i), "region": [None, "", "eu west/1"][i % 3], "ts": 5000 + i, "amount": 3.0,
       "is_deleted": i % 11 == 0} for i in range(150, 200)]
UPSERT = ("--record-key", "id", "--precombine-field", "ts", "--partition-field", "region",
          "--delete-field", "is_deleted", "--engine", "arrow")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """In this process (:func:`tests.harness.cli.run_cli`); a fault in ``env`` runs a process of its own."""
    return run_cli(*args, env=env, timeout=300)


def errors(p: subprocess.CompletedProcess) -> list[str]:
    """The lines of stderr that are not log records: what the user is told."""
    return [ln for ln in p.stderr.splitlines() if ln and " INFO " not in ln and " WARNING " not in ln]


def make_table(tmp_path: Path) -> str:
    uri = str(tmp_path / "t")
    run_upsert(options(uri, write_batch(tmp_path / "b1.parquet", B1), "record", "batch-1"))
    run_upsert(options(uri, write_batch(tmp_path / "b2.parquet", B2), "record", "batch-2"))
    return uri


def damage(uri: str, *, only: str | None = None) -> dict[str, str]:
    """Delete one live index delta and truncate another (in other buckets), or ``only`` one of
    the two; returns kind -> path."""
    t = Table.load(uri)
    view = t.view()
    buckets = sorted(b for b, files in view.index_files.items() if any("delta_" in f for f in files))
    assert len(buckets) >= 2
    gone = t.abs(next(f for f in view.index_files[buckets[0]] if "delta_" in f))
    cut = t.abs(next(f for f in view.index_files[buckets[1]] if "delta_" in f))
    if only in (None, "missing"):
        os.remove(gone)
    if only in (None, "truncated"):
        with open(cut, "r+b") as f:  # the first half of it: no footer
            f.truncate(os.path.getsize(cut) // 2)
    return {"missing": gone, "truncated": cut}


def bucket_of(path: str) -> int:
    return int(path.rsplit("bucket=", 1)[1].split("/", 1)[0])


def test_validate_names_a_missing_and_a_truncated_index_file_and_checks_the_rest(tmp_path):
    uri = make_table(tmp_path)
    healthy = run_validate(uri)
    assert healthy["ok"], healthy
    bad = damage(uri)
    report = run_validate(uri)
    assert not report["ok"]
    found = report["problems"]["index_files_unreadable"]
    assert found["count"] == 2
    assert any(s.startswith(bad["missing"] + ": missing") for s in found["samples"]), found
    assert any(s.startswith(bad["truncated"] + ": damaged") for s in found["samples"]), found
    # the rest is checked: every row read, the intact buckets' entries compared with their keys,
    # and no key of a damaged bucket reported as missing from the index
    assert report["rows"] == report["rows_expected"] == healthy["rows"]
    damaged = {bucket_of(bad["missing"]), bucket_of(bad["truncated"])}
    t = Table.load(uri)
    live = [r["id"] for r in read_arrow(uri).to_pylist()]
    intact = sum(1 for b in buckets_of(live, t.num_buckets()) if b not in damaged)
    assert 0 < report["index_entries"] == intact
    assert set(report["problems"]) == {"index_files_unreadable"}

    p = cli("validate", uri, "--engine", "arrow")
    assert p.returncode == 1, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert json.loads(p.stdout)["problems"]["index_files_unreadable"]["count"] == 2
    [line] = errors(p)
    assert "index_files_unreadable" in line and "--rebuild-index" in line


@pytest.mark.parametrize("kind", ["missing", "truncated"])
def test_every_verb_reading_the_index_stops_with_one_line_naming_the_file_and_the_repair(tmp_path, kind):
    uri = make_table(tmp_path)
    path = damage(uri, only=kind)[kind]
    before = read_arrow(uri).to_pylist()
    src = write_batch(tmp_path / "b3.parquet", B3)
    bucket = bucket_of(path)
    repair = f"bucketindex compact {uri} --rebuild-index --bucket {bucket}"
    digest = tree_digest(Path(uri))
    # compact folds the damaged deltas (due with one); shadow-compare reads every bucket's
    # entries; an upsert touches every bucket (B3's keys hash to all of them)
    for verb in (("compact", uri, "--engine", "arrow", "--min-deltas", "1"),
                 ("shadow-compare", uri, "--engine", "arrow"), ("upsert", uri, src, *UPSERT)):
        p = cli(*verb)
        assert p.returncode == 1, (verb, p.returncode, p.stderr[-3000:])
        assert "Traceback" not in p.stderr, (verb, p.stderr[-3000:])
        lines = errors(p)
        assert len(lines) == 1, (verb, lines)
        assert path in lines[0] and repair in lines[0], (verb, lines[0])
        assert (" missing " if kind == "missing" else " damaged ") in lines[0]
        if verb[0] != "upsert":  # they stop before writing anything
            assert tree_digest(Path(uri)) == digest, verb
    # nothing committed, and the failed upsert aborted its own attempt
    assert read_arrow(uri).to_pylist() == before
    assert Table.load(uri).timeline.pending() == []


def test_rebuild_index_repairs_the_table_in_one_commit(tmp_path):
    uri = make_table(tmp_path)
    bad = damage(uri)
    t = Table.load(uri)
    commits_before = len(t.timeline.completed())
    p = cli("compact", uri, "--rebuild-index", "--bucket", str(bucket_of(bad["missing"])),
            "--bucket", str(bucket_of(bad["truncated"])))
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[0])
    assert out["executed"] and out["buckets"] == sorted({bucket_of(bad["missing"]), bucket_of(bad["truncated"])})
    t = Table.load(uri)
    done = t.timeline.completed()
    assert len(done) == commits_before + 1  # one commit
    meta = t.timeline.read_metadata(done[-1])
    assert meta["action"] == "compaction" and meta["operation"] == "index_rebuild"
    removed = set(meta["index"]["removed"])
    assert t.layout.rel(bad["missing"]) in removed and t.layout.rel(bad["truncated"]) in removed
    assert run_validate(uri)["ok"]
    # the table can be written again, and holds exactly what the batches say
    src = write_batch(tmp_path / "b3.parquet", B3)
    p = cli("upsert", uri, src, *UPSERT, "--batch-id", "batch-3")
    assert p.returncode == 0, p.stderr[-3000:]
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches([B1, B2, B3])
    assert run_validate(uri)["ok"]
    # and compacted, and rebuilt whole
    assert cli("compact", uri, "--engine", "arrow", "--min-deltas", "1").returncode == 0
    p = cli("compact", uri, "--rebuild-index")
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.splitlines()[0])["buckets"] == list(range(Table.load(uri).num_buckets()))
    assert run_validate(uri)["ok"]
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches([B1, B2, B3])


def test_rebuild_cancels_a_waiting_compaction_of_the_damaged_bucket(tmp_path):
    uri = make_table(tmp_path)
    p = cli("compact", uri, "--schedule-only", "--only", "index", "--min-deltas", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    planned = p.stdout.strip().splitlines()[-1]
    damage(uri)
    p = cli("compact", uri, "--engine", "arrow")  # runs the waiting plan first: it folds a damaged file
    assert p.returncode == 1 and "--rebuild-index" in errors(p)[0], p.stderr[-3000:]
    p = cli("compact", uri, "--rebuild-index")
    assert p.returncode == 0, p.stderr[-3000:]
    t = Table.load(uri)
    assert planned in t.timeline.aborted and t.timeline.pending() == []
    assert run_validate(uri)["ok"]
    assert cli("compact", uri, "--engine", "arrow", "--min-deltas", "1").returncode == 0


@pytest.mark.parametrize("point", ["schedule_after_requested", "after_index_file", "after_conflict_check",
                                   "after_complete"])
def test_rebuild_killed_leaves_a_snapshot_and_the_next_run_repairs(tmp_path, point):
    uri = make_table(tmp_path)
    damage(uri)
    before_view = Table.load(uri).view().index_files
    p = cli("compact", uri, "--rebuild-index", env={**os.environ, "BUCKETINDEX_FAULT": point})
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])
    t = Table.load(uri)
    if point == "after_complete":  # past its commit point: the new snapshot
        assert t.view().index_files != before_view and run_validate(uri)["ok"]
    else:  # the old snapshot, damaged as before
        assert t.view().index_files == before_view
        assert "index_files_unreadable" in run_validate(uri)["problems"]
        [pending] = t.timeline.pending()
        assert pending.action == "compaction"
    p = cli("compact", uri, "--rebuild-index")
    assert p.returncode == 0, p.stderr[-3000:]
    t = Table.load(uri)
    assert t.timeline.pending() == []
    assert run_validate(uri)["ok"]
    # the dead attempt's index files are gone: every one on disk is read by some snapshot
    on_disk = {t.layout.rel(str(f)) for f in (Path(uri) / ".bucketindex" / "index").rglob("base_*")}
    referenced = {a["path"] for i in t.timeline.completed(["compaction"])
                  for a in t.timeline.read_metadata(i)["index"]["added"]}
    assert on_disk <= referenced
    src = write_batch(tmp_path / "b3.parquet", B3)
    assert cli("upsert", uri, src, *UPSERT, "--batch-id", "batch-3").returncode == 0
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches([B1, B2, B3])
    assert run_validate(uri)["ok"]


@pytest.mark.parametrize("argv,needle", [
    (("--rebuild-index", "--bucket", "4"), "(0 to 3)"),  # the table has buckets 0-3
    (("--rebuild-index", "--bucket", "-1"), "--bucket -1: "),
    (("--bucket", "1"), "add --rebuild-index"),
    (("--rebuild-index", "--engine", "spark"), "in-process"),
    (("--rebuild-index", "--min-deltas", "2"), "--min-deltas"),
    (("--rebuild-index", "--execute", "20260101000000000"), "--execute"),
])
def test_bad_rebuild_options_are_one_line_exit_2_and_write_nothing(tmp_path, argv, needle):
    uri = make_table(tmp_path)
    damage(uri)
    digest = tree_digest(Path(uri))
    p = cli("compact", uri, *argv)
    assert p.returncode == 2, p.stderr[-2000:]
    [line] = errors(p)
    assert line.startswith("bucketindex: error:") and needle in line, line
    assert tree_digest(Path(uri)) == digest


@pytest.mark.parametrize("index", ["bucket", "global_simple"])
def test_indexes_without_index_files_have_nothing_to_rebuild(tmp_path, index):
    uri = str(tmp_path / "t")
    run_upsert(options(uri, write_batch(tmp_path / "b1.parquet", B1), index, "batch-1"))
    assert not (Path(uri) / ".bucketindex" / "index").exists()  # no index files to lose
    digest = tree_digest(Path(uri))
    p = cli("compact", uri, "--rebuild-index")
    assert p.returncode == 2, p.stderr[-2000:]
    [line] = errors(p)
    assert f"the {index} index, which keeps no index files" in line
    assert tree_digest(Path(uri)) == digest
