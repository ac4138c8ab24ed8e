"""Every rule of table format v1 that does not need Spark: timeline states and atomic
completion, reader visibility, time travel, config conflicts, markers and rollback."""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.exceptions import (
    BadInputError,
    ConfigConflictError,
    InstantRolledBackError,
    TableNotFoundError,
    WriterAliveError,
)
from spark_jobs.index.record_index import IndexEntries, lookup, write_index_file
from spark_jobs.io.filesystem import InstantExistsError, resolve
from spark_jobs.table.action.rollback import rollback
from spark_jobs.table.config import TableConfig
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.describe import describe
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action, InstantConflictError, State
from spark_jobs.table.view import encode_schema

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("id", pa.string()), ("v", pa.int64()), ("_bi_key", pa.string())])


def new_table(tmp_path, **kw) -> Table:
    t = Table.open(str(tmp_path / "t"))
    t.create(TableConfig(record_key_fields=["id"], num_buckets=2, **kw))
    return t


def write_commit(t: Table, rows: list[tuple[str, int]], file_id: str = "fg1", complete: bool = True,
                 index: bool = True) -> str:
    """A hand-made commit (what the Spark job does), to test reader rules in isolation."""
    tl = t.timeline
    inst = tl.create_requested(Action.COMMIT, {"batch_id": f"b-{len(tl.instants)}"})
    inst = tl.transition_to_inflight(inst)
    rel = f"{file_id}_0-0-0_{inst.timestamp}.parquet"
    t.create_marker(inst.timestamp, rel)
    pq.write_table(pa.table({"id": [r[0] for r in rows], "v": [r[1] for r in rows],
                             "_bi_key": [r[0] for r in rows]}, schema=SCHEMA), t.abs(rel))
    added = []
    if index:
        path = t.layout.index_file(0, "delta", inst.timestamp)
        t.create_marker(inst.timestamp, t.layout.rel(path))
        write_index_file(t.io, path, IndexEntries.from_keys([r[0] for r in rows], [("", file_id)] * len(rows)))
        added.append({"bucket": 0, "path": t.layout.rel(path), "kind": "delta"})
    if complete:
        tl.complete(inst, {"batch_id": f"b-{inst.timestamp}", "schema": encode_schema(SCHEMA),
                           "file_groups": [{"partition": "", "file_id": file_id, "path": rel, "num_rows": len(rows)}],
                           "index": {"added": added}})
    return inst.timestamp


# -- timeline --------------------------------------------------------------------------

def test_instant_moves_requested_inflight_completed(tmp_path):
    t = new_table(tmp_path)
    tl = t.timeline
    inst = tl.create_requested(Action.COMMIT, {"batch_id": "x"})
    assert tl.pending()[0].state == State.REQUESTED
    inst = tl.transition_to_inflight(inst)
    assert tl.pending()[0].state == State.INFLIGHT
    tl.complete(inst, {"k": 1})
    assert tl.pending() == [] and tl.completed()[0].timestamp == inst.timestamp
    assert tl.read_metadata(tl.completed()[0]) == {"k": 1}
    assert tl.read_plan(tl.completed()[0]) == {"batch_id": "x"}


def test_instant_times_are_strictly_increasing(tmp_path):
    tl = new_table(tmp_path).timeline
    stamps = [tl.create_requested(Action.COMMIT, {}).timestamp for _ in range(30)]
    assert stamps == sorted(stamps) and len(set(stamps)) == 30
    assert all(len(s) == 17 for s in stamps)


def _race(path: str, ts: str, barrier, results) -> None:  # runs in a child process
    tl = Table.load(path).timeline
    inst = tl.find(ts)
    barrier.wait()
    try:
        tl.complete(inst, {"winner": os.getpid(), "padding": "x" * 200_000})
        results.put("won")
    except InstantConflictError as e:
        results.put(f"lost: {e}")


def test_racing_completers_exactly_one_wins(tmp_path):
    t = new_table(tmp_path)
    inst = t.timeline.transition_to_inflight(t.timeline.create_requested(Action.COMMIT, {}))
    n = 6
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(t.root, inst.timestamp, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcomes = [results.get(timeout=5) for _ in range(n)]
    assert outcomes.count("won") == 1, outcomes
    losers = [o for o in outcomes if o != "won"]
    assert all("already completed (another writer got there first)" in o for o in losers), losers
    meta = t.timeline.reload().read_metadata(t.timeline.completed()[0])
    assert len(meta["padding"]) == 200_000  # the winner's whole metadata, never a half-written file
    assert [n for n in os.listdir(t.layout.timeline) if n.endswith(".tmp")] == []
    assert [n for n in os.listdir(t.layout.sequence) if n.endswith(".tmp")] == []


def test_exclusive_create_refuses_existing(tmp_path):
    io, root = resolve(str(tmp_path))
    io.create_exclusive(root + "/f", b"one")
    with pytest.raises(InstantExistsError):
        io.create_exclusive(root + "/f", b"two")
    assert io.read_bytes(root + "/f") == b"one"


def _flap(path: str, stop) -> None:  # child process: a directory appearing and vanishing
    while not stop.is_set():
        os.makedirs(path, exist_ok=True)
        os.rmdir(path)


def test_listing_a_directory_that_appears_meanwhile_is_never_an_error(tmp_path):
    """A writer's first commit creates ``sequence/`` while others list it: Arrow's local
    listing raised when the directory appeared between its listing and its existence check
    (a racing writer died on it in the commit-protocol stress test)."""
    io, root = resolve(str(tmp_path))
    path = root + "/sequence"
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    flapper = ctx.Process(target=_flap, args=(path, stop))
    flapper.start()
    try:
        seen = {tuple(io.list_names(path)) for _ in range(5_000)} | {tuple(io.list_sizes(path)) for _ in range(1_000)}
    finally:
        stop.set()
        flapper.join(10)
    assert seen == {()}


def test_listing_ignores_temp_and_foreign_files(tmp_path):
    t = new_table(tmp_path)
    d = t.layout.timeline
    os.makedirs(d, exist_ok=True)
    for name in (".20260101000000000.commit.abc.tmp", "README", "20260101000000000.unknownaction"):
        open(os.path.join(d, name), "w").close()
    assert t.timeline.reload().instants == []


# -- reader visibility and time travel --------------------------------------------------

def test_uncommitted_files_are_invisible(tmp_path):
    t = new_table(tmp_path)
    write_commit(t, [("a", 1), ("b", 2)])
    write_commit(t, [("a", 10), ("c", 3)], complete=False)  # pending: files and index delta on disk
    assert sorted(read_arrow(t.uri).to_pylist(), key=lambda r: r["id"]) == [{"id": "a", "v": 1}, {"id": "b", "v": 2}]
    view = t.view()
    assert len(view.index_files[0]) == 1  # the pending delta is not part of the index
    res = lookup(t.io, [t.abs(p) for p in view.index_files[0]], ["a", "c"])
    assert res.found.tolist() == [True, False]


def test_time_travel_returns_each_snapshot(tmp_path):
    t = new_table(tmp_path)
    i1 = write_commit(t, [("a", 1)])
    i2 = write_commit(t, [("a", 2), ("b", 2)])
    assert read_arrow(t.uri, as_of=i1).to_pylist() == [{"id": "a", "v": 1}]
    assert len(read_arrow(t.uri, as_of=i2)) == 2
    assert read_arrow(t.uri).num_rows == 2
    with pytest.raises(BadInputError, match="no completed instant"):
        t.view(as_of="19990101000000000")


def test_view_tracks_removed_file_groups(tmp_path):
    t = new_table(tmp_path)
    write_commit(t, [("a", 1)], file_id="fg1")
    inst = t.timeline.create_requested(Action.COMMIT, {})
    t.timeline.complete(t.timeline.transition_to_inflight(inst),
                        {"file_groups": [{"partition": "", "file_id": "fg1", "path": None, "removed": True}]})
    assert t.view().file_groups == {}
    assert read_arrow(t.uri).num_rows == 0


# -- config ----------------------------------------------------------------------------

def test_config_round_trip_and_conflicts(tmp_path):
    t = new_table(tmp_path, partition_fields=["region"], precombine_field="ts")
    again = Table.load(t.uri)
    assert again.config == t.config
    for change, label in [({"record_key_fields": ["other"]}, "record key"), ({"index_type": "bucket"}, "index type"),
                          ({"partition_fields": ["day"]}, "partition fields"), ({"precombine_field": "v"}, "precombine field")]:
        cfg = TableConfig(**{**json.loads(t.config.to_json()), **change})
        with pytest.raises(ConfigConflictError, match=f"{label} .* contradicts"):
            again.config.check_compatible(cfg)
    # options the caller did not give never conflict
    loose = TableConfig(record_key_fields=["id"])
    again.config.check_compatible(loose, explicit={"record_key_fields"})


def test_creating_an_existing_table_checks_compatibility(tmp_path):
    t = new_table(tmp_path)
    with pytest.raises(ConfigConflictError):
        Table.open(t.uri).create(TableConfig(record_key_fields=["id"], index_type="bucket"))
    assert Table.open(t.uri).create(TableConfig(record_key_fields=["id"], num_buckets=2)) == t.config


@pytest.mark.parametrize("kw,msg", [
    ({"record_key_fields": []}, "at least one field"),
    ({"record_key_fields": ["id"], "index_type": "bloom"}, "unknown index type"),
    ({"record_key_fields": ["id"], "num_buckets": 0}, "at least 1"),
    ({"record_key_fields": ["id"], "hash_function": "md5"}, "unknown hash function"),
    ({"record_key_fields": ["id"], "format_version": 1}, "not supported"),
])
def test_invalid_config_is_rejected(kw, msg):
    with pytest.raises(BadInputError, match=msg):
        TableConfig(**kw)


def test_loading_a_missing_table_is_bad_input(tmp_path):
    with pytest.raises(TableNotFoundError, match="no bucketindex table"):
        Table.load(str(tmp_path / "nothing"))


# -- markers and rollback ----------------------------------------------------------------

def test_rollback_deletes_only_marked_files_and_resumes(tmp_path):
    t = new_table(tmp_path)
    write_commit(t, [("a", 1)])
    committed = {p for p in os.listdir(t.root) if p.endswith(".parquet")}
    pending = write_commit(t, [("a", 9), ("z", 9)], file_id="fg2", complete=False)
    assert len(t.marked_files(pending)) == 2
    assert rollback(t) == [pending]
    assert {p for p in os.listdir(t.root) if p.endswith(".parquet")} == committed
    assert t.timeline.pending() == [] and not os.path.exists(t.layout.marker_dir(pending))
    rb = t.timeline.completed([Action.ROLLBACK])
    assert t.timeline.read_metadata(rb[0])["rolled_back"] == pending
    assert rollback(t) == []  # nothing left: a no-op


def test_interrupted_rollback_is_finished_first(tmp_path):
    t = new_table(tmp_path)
    pending = write_commit(t, [("a", 1)], complete=False)
    files = t.marked_files(pending)
    # a rollback that wrote its plan, then died before deleting anything
    t.timeline.create_requested(Action.ROLLBACK, {"target": pending, "target_action": "commit", "files": files})
    assert rollback(t) == []  # it resumes the interrupted one; nothing else is pending
    assert t.timeline.pending() == []
    assert not any(os.path.exists(t.abs(f)) for f in files)


def test_live_writer_blocks_rollback(tmp_path):
    from spark_jobs.table.heartbeat import Heartbeat

    t = new_table(tmp_path)
    pending = write_commit(t, [("a", 1)], complete=False)
    hb = Heartbeat(t.io, t.layout, pending).start()
    try:
        assert rollback(t) == []  # a sweep of abandoned instants leaves a live writer alone
        assert [i.timestamp for i in t.timeline.pending()] == [pending]
        with pytest.raises(WriterAliveError, match="live writer"):
            rollback(t, pending)  # named: refused, retryable (exit 3)
        assert rollback(t, pending, force=True) == [pending]
    finally:
        hb.stop()


def test_a_task_overtaken_by_a_rollback_leaves_nothing(tmp_path):
    """A writer's task still running after its instant was rolled back (a killed Spark
    Connect client's job keeps running on the server) removes what it wrote."""
    t = new_table(tmp_path)
    write_commit(t, [("a", 1)])
    committed = {p for p in os.listdir(t.root) if p.endswith(".parquet")}
    seq = t.timeline.reload().last_seq
    pending = write_commit(t, [("b", 2)], file_id="fg2", complete=False)

    def write_while_rolled_back(rel: str):
        def write() -> None:
            assert rollback(t, pending, force=True) == [pending]  # decides and cleans before our file exists
            pq.write_table(pa.table({"id": ["c"], "v": [3], "_bi_key": ["c"]}, schema=SCHEMA), t.abs(rel))
        return write

    late = f"fg3_0-9-0_{pending}.parquet"
    with pytest.raises(InstantRolledBackError, match="rolled back while this task wrote"):
        t.write_marked(pending, late, write_while_rolled_back(late), snapshot_seq=seq)
    assert {p for p in os.listdir(t.root) if p.endswith(".parquet")} == committed
    assert not os.path.exists(t.layout.marker_dir(pending))
    # a task that starts after the decision writes nothing at all
    with pytest.raises(InstantRolledBackError, match="task not run"):
        t.write_marked(pending, late, lambda: pytest.fail("must not write"), snapshot_seq=seq)
    assert not os.path.exists(t.layout.marker_dir(pending))
    # a writer nobody rolled back writes, under its marker, even past the earlier rollback
    live = write_commit(t, [("d", 4)], file_id="fg4", complete=False)
    t.write_marked(live, "x.parquet", lambda: open(t.abs("x.parquet"), "wb").close(), snapshot_seq=seq)
    assert os.path.exists(t.abs("x.parquet")) and "x.parquet" in t.marked_files(live)


def test_rollback_of_completed_instant_is_refused(tmp_path):
    t = new_table(tmp_path)
    done = write_commit(t, [("a", 1)])
    with pytest.raises(BadInputError, match="is completed"):
        rollback(t, done)
    with pytest.raises(BadInputError, match="no pending instant"):
        rollback(t, "20000101000000000")


def test_finalize_markers_deletes_unreferenced_attempts(tmp_path):
    t = new_table(tmp_path)
    ts = "20260101000000000"
    for rel in ("fg_0-1-0_x.parquet", "fg_0-1-1_x.parquet"):  # a task and its speculative twin
        t.create_marker(ts, rel)
        open(t.abs(rel), "wb").close()
    assert t.finalize_markers(ts, keep={"fg_0-1-1_x.parquet"}) == ["fg_0-1-0_x.parquet"]
    assert os.path.exists(t.abs("fg_0-1-1_x.parquet")) and not os.path.exists(t.abs("fg_0-1-0_x.parquet"))


def test_batch_id_lookup(tmp_path):
    t = new_table(tmp_path)
    ts = write_commit(t, [("a", 1)])
    assert t.commit_for_batch(f"b-{ts}").timestamp == ts
    assert t.commit_for_batch("other") is None
    p = write_commit(t, [("b", 1)], complete=False)
    assert t.pending_for_batch(t.timeline.read_plan(t.timeline.find(p))["batch_id"]).timestamp == p


# -- CLI verbs that need no Spark -------------------------------------------------------

def test_cli_read_output_writes_one_parquet_file(tmp_path, capsys):
    from spark_jobs.cli import main

    t = new_table(tmp_path)
    first = write_commit(t, [("a", 1), ("b", 2)])
    write_commit(t, [("c", 3)], file_id="fg2")
    out = tmp_path / "snap.parquet"
    assert main(["read", t.uri, "--output", str(out)]) == 0
    assert sorted(pq.read_table(out).to_pylist(), key=lambda r: r["id"]) == [
        {"id": "a", "v": 1}, {"id": "b", "v": 2}, {"id": "c", "v": 3}]
    assert main(["read", t.uri, "--as-of", first, "--output", str(out)]) == 0
    assert pq.read_table(out).num_rows == 2


def test_cli_show_json_and_text(tmp_path, capsys):
    from spark_jobs.cli import main

    t = new_table(tmp_path)
    write_commit(t, [("a", 1)])
    pending = write_commit(t, [("b", 1)], complete=False)
    assert main(["show", t.uri, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rows"] == 1 and d["file_groups"] == 1 and d["index_buckets"] == {"0": 1}
    delta = t.view().index_files[0][0]
    assert d["index_deltas"] == {"total": 1, "bytes": os.path.getsize(t.abs(delta)), "max_per_bucket": 1,
                                 "buckets": {"0": {"bases": 0, "deltas": 1, "delta_bytes": os.path.getsize(t.abs(delta))}}}
    assert d["pending"] == [f"{pending}.commit[inflight]"]
    assert main(["show", t.uri]) == 0
    text = capsys.readouterr().out
    assert "1 row in 1 file group" in text and f"{pending}.commit[inflight]" in text
    assert "deltas: 1 (" in text and "at most 1 per bucket" in text


def test_cli_bad_table_exits_2(tmp_path, capsys):
    from spark_jobs.cli import main

    assert main(["show", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bucketindex: error: no bucketindex table")


def test_markers_of_long_non_ascii_paths_fit_a_file_name_and_round_trip(tmp_path):
    t = new_table(tmp_path)
    ts = "20260101000000000"
    long_rel = "region=" + "%E6%9D%B1" * 14 + "/fg_0-1-0_x.parquet"  # a 13-character Japanese value, encoded
    short_rel = "region=eu/fg_0-1-0_x.parquet"
    for rel in (long_rel, short_rel):
        t.create_marker(ts, rel)
    assert all(len(n) <= 255 for n in os.listdir(t.layout.marker_dir(ts)))
    assert sorted(t.marked_files(ts)) == sorted([long_rel, short_rel])


def test_repair_leaves_a_live_writers_markers_and_heartbeat(tmp_path):
    """A sweep of abandoned work runs while other writers write: their files must survive it."""
    from spark_jobs.table.action import Transaction

    t = new_table(tmp_path)
    live = Transaction(Table.load(t.root), Action.COMMIT, {"batch_id": "live"}).begin()
    rel = f"fg_0-0-0_{live.ts}.parquet"
    t.create_marker(live.ts, rel)
    open(t.abs(rel), "wb").close()
    try:
        assert rollback(Table.load(t.root)) == []
        assert os.path.exists(t.abs(rel)) and t.marked_files(live.ts) == [rel]
        assert os.path.exists(t.layout.heartbeat_file(live.ts))
    finally:
        live.abort()
    assert not os.path.exists(t.abs(rel)) and Table.load(t.root).timeline.pending() == []


def test_show_lists_live_writers_and_recent_conflicts(tmp_path, capsys):
    from spark_jobs.cli import main
    from spark_jobs.table.action import CommitConflict, Transaction

    t = new_table(tmp_path)

    def meta(batch: str) -> dict:
        return {"batch_id": batch, "file_groups": [{"partition": "", "file_id": "fg1", "path": None, "num_rows": 0,
                                                    "removed": True}], "index": {"added": []}}

    a = Transaction(Table.load(t.root), Action.COMMIT, {"batch_id": "a"}).begin()
    b = Transaction(Table.load(t.root), Action.COMMIT, {"batch_id": "b"}).begin()
    live = Transaction(Table.load(t.root), Action.COMMIT, {"batch_id": "hourly"}).begin()
    try:
        a.commit(meta("a"))
        with pytest.raises(CommitConflict):
            b.commit(meta("b"))
        b.record_give_up("b", 1)
        b.abort()
        d = describe(Table.load(t.root))
        assert [(w["instant"], w["batch_id"], w["alive"]) for w in d["writers"]] == [(live.ts, "hourly", True)]
        assert [(c["instant"], c["batch_id"], c["with"]) for c in d["conflicts"]] == [(b.ts, "b", a.ts)]
        assert main(["show", t.root]) == 0
        out = capsys.readouterr().out
        assert f"{live.ts} commit" in out and "alive" in out and "gave up after 1 attempt(s)" in out
    finally:
        live.abort()
    assert describe(Table.load(t.root))["writers"] == []
