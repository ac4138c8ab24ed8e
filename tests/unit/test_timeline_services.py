"""Timeline checkpoints, archival and clean on the pure-Python core (no Spark): opening reads
O(1) history, old history stays answerable, clean deletes exactly what no retained snapshot
reads, and a SIGKILL at every step leaves a readable table that the next run repairs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.exceptions import BadInputError
from spark_jobs.table.action import checkpoint as ckpt
from spark_jobs.table.action.clean import run_clean
from spark_jobs.table.action.rollback import rollback
from spark_jobs.table.action.transaction import Transaction
from spark_jobs.table.config import TableConfig
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action, SequenceTakenError, Timeline
from spark_jobs.table.view import FileSystemView, encode_schema

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("id", pa.string()), ("v", pa.int64()), ("_bi_key", pa.string())])
GROUPS = ("g a+1", "g/b", "g%c é")  # file ids are ours, but keys with odd characters go through every path


def new_table(root: Path, **kw) -> Table:
    t = Table.open(str(root))
    t.create(TableConfig(record_key_fields=["id"], num_buckets=2, **kw))
    return t


def commit(t: Table, i: int) -> str:
    """One copy-on-write style commit through the real Transaction: rewrites one of three
    file groups (a new base file each time), so every commit leaves an old version behind."""
    fid = f"fg{i % 3}"
    key = GROUPS[i % 3]
    txn = Transaction(t, Action.COMMIT, {"batch_id": f"b{i}"}).begin()
    rel = f"{fid}_0-0-0_{txn.ts}.parquet"
    t.create_marker(txn.ts, rel)
    pq.write_table(pa.table({"id": [key], "v": [i], "_bi_key": [key]}, schema=SCHEMA), t.abs(rel))
    txn.commit({"batch_id": f"b{i}", "schema": encode_schema(SCHEMA), "index": {"added": []},
                "file_groups": [{"partition": "", "file_id": fid, "path": rel, "num_rows": 1}]})
    return txn.ts


def oracle(upto: int) -> dict[str, int]:
    """What the table holds after commits 0..upto-1: the last value written to each group."""
    return {GROUPS[i % 3]: i for i in range(upto)}


def rows(uri: str, as_of: str | None = None) -> dict[str, int]:
    return {r["id"]: r["v"] for r in read_arrow(uri, as_of).to_pylist()}


def scratch_view(t: Table) -> FileSystemView:
    """The view replayed from entry 1 without any checkpoint: what a checkpoint must equal."""
    tl = Timeline(t.io, t.layout)
    tl.load_history()
    tl.checkpoint, tl.base_seq = None, 0
    return FileSystemView.at_seq(tl, tl.last_seq)


def test_checkpoints_make_opening_read_only_the_recent_entries(tmp_path):
    t = new_table(tmp_path / "t")
    instants = [commit(t, i) for i in range(25)]
    assert ckpt.checkpoint_seqs(t.io, t.layout) == [10, 20]
    fresh = Table.load(t.uri)
    tl = fresh.timeline
    assert tl.base_seq == 20 and tl.last_seq == 25
    assert sorted(tl._entries) == [21, 22, 23, 24, 25], "opening read entries older than the checkpoint"
    view = fresh.view()
    assert view.to_state() == scratch_view(fresh).to_state()
    assert rows(t.uri) == oracle(25)
    # idempotence reaches back past the checkpoint (its batch list), without the history
    assert fresh.commit_for_batch("b3").timestamp == instants[3]
    assert fresh.commit_for_batch("never") is None
    assert sorted(fresh.timeline._entries) == [21, 22, 23, 24, 25]
    # time travel to every instant still equals the oracle
    for i, ts in enumerate(instants):
        assert rows(t.uri, ts) == oracle(i + 1)
    # the full history is still there for whoever asks
    assert [i.timestamp for i in Table.load(t.uri).timeline.completed()] == instants


def test_a_torn_checkpoint_is_skipped_for_the_previous_one(tmp_path):
    t = new_table(tmp_path / "t")
    for i in range(21):
        commit(t, i)
    Path(t.layout.checkpoint_file(20)).write_text('{"format": 1, "seq": 20, "view": {"file_gr')
    fresh = Table.load(t.uri)
    assert fresh.timeline.base_seq == 10
    assert fresh.view().to_state() == scratch_view(fresh).to_state() and rows(t.uri) == oracle(21)
    assert fresh.commit_for_batch("b2") is not None


def test_archival_keeps_directories_small_and_history_answerable(tmp_path):
    t = new_table(tmp_path / "t")
    instants = [commit(t, i) for i in range(45)]
    # the commit at entry 40 checkpointed and archived up to the previous checkpoint (30)
    assert Table.load(t.uri).timeline.archives() == [(1, 30)]
    assert ckpt.archive(t, min_entries=10) is None  # 31..30 + 10: not yet worth a file
    assert ckpt.checkpoint_seqs(t.io, t.layout) == [30, 40]  # older ones retired from the listed dir
    assert ckpt.checkpoint_seqs(t.io, t.layout, archived=True) == [10]  # kept for time travel
    names = os.listdir(t.layout.sequence)
    assert len(names) == 15 and min(names) == f"{31:020d}.json"
    plans = os.listdir(t.layout.timeline)
    assert not any(n.startswith(instants[5]) for n in plans), "archived instants' plan files stay listed"
    fresh = Table.load(t.uri)
    assert fresh.view().to_state() == scratch_view(fresh).to_state()
    assert fresh.commit_for_batch("b5").timestamp == instants[5]
    for i in (0, 5, 14, 29, 30, 44):  # 14: from the archived checkpoint at 10
        assert rows(t.uri, instants[i]) == oracle(i + 1)
    assert [i.timestamp for i in fresh.timeline.completed()] == instants
    # a plan file of an archived instant never looks pending (nothing to roll back)
    assert rollback(fresh) == [] and fresh.timeline.pending() == []
    commit(t, 45)
    assert rows(t.uri) == oracle(46)


def test_a_stale_writer_never_commits_into_an_archived_slot(tmp_path):
    t = new_table(tmp_path / "t")
    for i in range(45):
        commit(t, i)
    ckpt.archive(t, min_entries=10)
    tl = t.timeline
    inst = tl.create_requested(Action.COMMIT, {"batch_id": "stale"})
    with pytest.raises(SequenceTakenError):
        tl.append(inst, {"batch_id": "stale"}, seq=20)  # a writer that last saw entry 19
    assert not os.path.exists(t.layout.sequence_file(20))
    assert Table.load(t.uri).commit_for_batch("stale") is None


def test_archival_never_passes_a_live_writers_snapshot(tmp_path):
    t = new_table(tmp_path / "t")
    for i in range(12):
        commit(t, i)
    live = Transaction(t, Action.COMMIT, {"batch_id": "slow"}).begin()  # planned on entry 12
    try:
        for i in range(12, 45):
            commit(t, i)
        assert ckpt.archive(t, min_entries=5) == (1, 12)
        assert os.path.exists(t.layout.sequence_file(13))
    finally:
        live.abort()


def test_clean_deletes_exactly_the_versions_no_retained_snapshot_reads(tmp_path):
    t = new_table(tmp_path / "t")
    instants = [commit(t, i) for i in range(12)]
    before = set(os.listdir(t.root))
    dry = run_clean(t.uri, retain_commits=4, dry_run=True)
    assert dry["files"] == 8 - 2 and set(os.listdir(t.root)) == before  # a dry run deletes nothing
    assert Table.load(t.uri).timeline.pending() == []
    out = run_clean(t.uri, retain_commits=4)
    assert out["files"] == 6 and out["earliest_retained"] == instants[8] and out["instant"]
    # retained: the snapshots of the last 4 commits (and the files they read)
    for i in range(8, 12):
        assert rows(t.uri, instants[i]) == oracle(i + 1)
    with pytest.raises(BadInputError, match="older than the retained window"):
        read_arrow(t.uri, instants[7])
    # a second clean with the same window has nothing to do and writes nothing
    seq = Table.load(t.uri).timeline.last_seq
    assert run_clean(t.uri, retain_commits=4)["instant"] is None
    assert Table.load(t.uri).timeline.last_seq == seq
    # later commits and a later clean go on from there
    for i in range(12, 15):
        commit(t, i)
    assert run_clean(t.uri, retain_commits=4)["files"] == 3
    assert rows(t.uri) == oracle(15)


def test_clean_keeps_what_a_live_writer_and_a_scheduled_compaction_read(tmp_path):
    t = new_table(tmp_path / "t")
    for i in range(6):
        commit(t, i)
    live = Transaction(t, Action.COMMIT, {"batch_id": "slow"}).begin()  # planned on entry 6
    try:
        for i in range(6, 12):
            commit(t, i)
        out = run_clean(t.uri, retain_commits=2)
        assert out["held_back_by"] == live.ts
        assert Table.load(t.uri).retained_from()["earliest_retained_seq"] == 6
        assert rows(t.uri, Table.load(t.uri).timeline.entry(6)["instant"]) == oracle(6)
    finally:
        live.abort()


def test_clean_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    from spark_jobs.cli import main

    t = new_table(tmp_path / "t")
    commit(t, 0)
    before = sorted(p for p in Path(t.root).rglob("*"))
    assert main(["clean", t.uri, "--retain-commits", "0"]) == 2
    assert main(["clean", t.uri, "--retain-hours", "-1"]) == 2
    assert main(["clean", str(tmp_path / "nothing-here")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("bucketindex: error: ") for e in err)
    with pytest.raises(SystemExit) as e:
        main(["clean", t.uri, "--retain-commits", "2", "--retain-hours", "3"])
    assert e.value.code == 2
    assert sorted(p for p in Path(t.root).rglob("*")) == before


def test_show_reports_checkpoints_archive_and_clean(tmp_path, capsys):
    from spark_jobs.cli import main

    t = new_table(tmp_path / "t")
    for i in range(30):
        commit(t, i)
    assert main(["show", t.uri, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["completed_instants"] == 30 and d["checkpoints"]["latest"] == 30
    # the default keeps the last 24 snapshots (entries 7..30): the 4 versions replaced before entry 7 go
    assert d["clean"]["would_delete_files"] == 4
    assert main(["show", t.uri]) == 0
    text = capsys.readouterr().out
    assert "checkpoint every 10" in text and "a clean now" in text


_CHILD = """
import sys
sys.path.insert(0, {root!r})
from tests.unit.test_timeline_services import commit
from spark_jobs.table.table import Table
from spark_jobs.table.action.clean import run_clean
from spark_jobs.table.action import checkpoint as ckpt
t = Table.load({uri!r})
what = {what!r}
if what == "clean":
    run_clean(t.uri, retain_commits=3)
elif what == "archive":
    ckpt.archive(t, min_entries=5)
else:
    commit(t, {i})
"""


def _killed(t: Table, what: str, point: str, i: int = 0) -> None:
    code = _CHILD.format(root=str(Path(__file__).parents[2]), uri=t.uri, what=what, i=i)
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "BUCKETINDEX_FAULT": point},
                       start_new_session=True, capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]


@pytest.mark.parametrize("point", ["clean_after_plan", "clean_after_delete"])
def test_killed_clean_leaves_a_readable_table_and_the_next_clean_finishes(tmp_path, point):
    t = new_table(tmp_path / "t")
    instants = [commit(t, i) for i in range(9)]
    _killed(t, "clean", point)
    assert rows(t.uri) == oracle(9)
    assert rows(t.uri, instants[6]) == oracle(7)
    with pytest.raises(BadInputError, match="retained window"):  # a pending clean may have deleted them
        read_arrow(t.uri, instants[5])
    out = run_clean(t.uri, retain_commits=3)
    assert len(out["resumed"]) == 1 and Table.load(t.uri).timeline.pending() == []
    referenced = FileSystemView.at_seq(Table.load(t.uri).timeline, 7).all_files() | Table.load(t.uri).view().all_files()
    on_disk = {p.name for p in Path(t.root).glob("*.parquet")}
    assert on_disk == {Path(f).name for f in referenced}, "a version no retained snapshot reads is left"


@pytest.mark.parametrize("point", ["checkpoint_before_write", "archive_after_copy", "archive_after_plans"])
def test_killed_checkpoint_or_archival_leaves_a_readable_table(tmp_path, point):
    t = new_table(tmp_path / "t")
    instants = [commit(t, i) for i in range(49)]  # checkpoints 10..40, entries 1..30 archived
    if point == "checkpoint_before_write":
        _killed(t, "commit", point, i=49)  # the commit completes, its checkpoint does not
        assert ckpt.checkpoint_seqs(t.io, t.layout) == [30, 40]
        assert os.path.exists(t.layout.checkpoint_batches_file(50))
    else:
        commit(t, 49)
        _killed(t, "archive", point)  # archiving 31..40
    fresh = Table.load(t.uri)
    assert rows(t.uri) == oracle(50) and fresh.view().to_state() == scratch_view(fresh).to_state()
    assert rows(t.uri, instants[3]) == oracle(4) and rows(t.uri, instants[35]) == oracle(36)
    assert fresh.commit_for_batch("b1") is not None and fresh.commit_for_batch("b33") is not None
    assert rollback(fresh) == []  # nothing looks abandoned
    for i in range(50, 61):  # the next commits checkpoint and archive again
        commit(t, i)
    ckpt.archive(t, min_entries=5)
    fresh = Table.load(t.uri)
    assert rows(t.uri) == oracle(61) and fresh.view().to_state() == scratch_view(fresh).to_state()
    assert [i.timestamp for i in fresh.timeline.completed()][:49] == instants
    assert all(int(n[:20]) > fresh.timeline.archives()[-1][1] for n in os.listdir(t.layout.sequence))


def test_opening_cost_does_not_grow_with_history(tmp_path):
    """Entries read when opening: bounded by the checkpoint interval, not the history."""
    small, big = new_table(tmp_path / "s"), new_table(tmp_path / "b")
    for i in range(5):
        commit(small, i)
    for i in range(205):
        commit(big, i)
    listed = {n: len(os.listdir(x.layout.sequence)) for n, x in (("small", small), ("big", big))}
    assert listed["big"] <= ckpt.ARCHIVE_MIN_ENTRIES + 3 * 10
    opened = Table.load(big.uri)
    opened.view()
    assert len(opened.timeline._entries) <= 10
    shutil.rmtree(tmp_path / "s")
