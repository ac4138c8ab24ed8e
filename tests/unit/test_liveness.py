"""Liveness that cannot lie: heartbeats are never read torn, a writer between its plan and
its first beat is not dead, and two writers that pick the same millisecond both end well."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time

import pytest

from spark_jobs.table import Action, Table, TableConfig
from spark_jobs.table.action import Transaction
from spark_jobs.table.heartbeat import Heartbeat, is_alive, owner_info
from spark_jobs.table.timeline import Timeline

pytestmark = pytest.mark.unit


def _new_table(tmp_path) -> Table:
    t = Table.open(str(tmp_path / "t"))
    t.create(TableConfig(record_key_fields=["id"], num_buckets=1))
    return t


def _beat_fast(uri: str, instant: str, stop) -> None:  # child process: a writer beating in a tight loop
    t = Table.load(uri)
    hb = Heartbeat(t.io, t.layout, instant, interval_s=0.0005).start()
    stop.wait(30)
    hb.stop(delete=False)


def test_a_reader_racing_a_beating_writer_never_sees_a_torn_beat(tmp_path):
    t = _new_table(tmp_path)
    inst = t.timeline.create_requested(Action.COMMIT, {"batch_id": "b", "owner": owner_info()})
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    p = ctx.Process(target=_beat_fast, args=(t.root, inst.timestamp, stop))
    p.start()
    path = t.layout.heartbeat_file(inst.timestamp)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        reads = verdicts = 0
        # a thousand reads against the beating writer (time-boxed, not time-fixed: a loaded
        # machine reads slower, and the race needs the reads, not the seconds)
        end = time.monotonic() + 30.0
        while reads <= 1000 and time.monotonic() < end:
            with open(path, "rb") as f:
                beat = json.loads(f.read())  # a torn or empty file would raise here
            assert beat["pid"] == p.pid
            reads += 1
            assert is_alive(t.io, t.layout, inst.timestamp, 60, owner=None)
            verdicts += 1
        assert reads > 1000 and verdicts == reads
    finally:
        stop.set()
        p.join(10)


def test_liveness_before_the_first_beat_and_after_death(tmp_path):
    t = _new_table(tmp_path)
    me = owner_info()
    assert is_alive(t.io, t.layout, "20260101000000000", 60, owner=me)  # plan written, no beat yet
    stale = {**me, "at": time.time() - 120}
    assert not is_alive(t.io, t.layout, "20260101000000000", 60, owner=stale)  # plan too old, never beat
    ctx = mp.get_context("fork")
    child = ctx.Process(target=lambda: None)
    child.start()
    child.join()
    dead = {**me, "pid": child.pid}  # a process on this host that has exited
    assert not is_alive(t.io, t.layout, "20260101000000000", 60, owner=dead)
    assert not is_alive(t.io, t.layout, "20260101000000000", 60, owner=None)  # no plan owner, no beat


def test_writers_that_pick_the_same_millisecond_both_end_correctly(tmp_path, monkeypatch):
    t = _new_table(tmp_path)
    a = Transaction(Table.load(t.root), Action.COMMIT, {"batch_id": "a"}).begin()
    a_beat = open(t.layout.heartbeat_file(a.ts), "rb").read()
    a_plan = a.table.timeline.read_plan(a.instant)

    real = Timeline.new_instant_time
    calls = []

    def same_ms_first(self):  # type: ignore[no-untyped-def]
        calls.append(1)
        return a.ts if len(calls) == 1 else real(self)

    monkeypatch.setattr(Timeline, "new_instant_time", same_ms_first)
    b = Transaction(Table.load(t.root), Action.COMMIT, {"batch_id": "b"}).begin()
    monkeypatch.undo()

    assert len(calls) == 2 and b.ts != a.ts and b.ts > a.ts
    # the loser touched nothing of the winner's: same plan, same heartbeat file owner
    assert a.table.timeline.read_plan(a.instant) == a_plan
    assert json.loads(open(t.layout.heartbeat_file(a.ts), "rb").read())["pid"] == json.loads(a_beat)["pid"]
    meta = lambda fg: {"batch_id": None, "file_groups": [{"partition": "", "file_id": fg, "path": None,  # noqa: E731
                                                           "num_rows": 0, "removed": True}], "index": {"added": []}}
    b.commit(meta("fg-b"))
    a.commit(meta("fg-a"))
    tl = Table.load(t.root).timeline
    assert [i.timestamp for i in tl.completed()] == [b.ts, a.ts]  # commit order, not instant order
    assert tl.pending() == []
    assert not os.path.exists(t.layout.heartbeat_file(a.ts)) and not os.path.exists(t.layout.heartbeat_file(b.ts))


def test_a_killed_writer_left_as_a_zombie_is_dead(tmp_path):
    """Killed writers are often zombies until reaped; they must not look alive for the timeout."""
    import signal
    import subprocess
    import sys

    t = _new_table(tmp_path)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = {**owner_info(), "pid": p.pid}
        assert is_alive(t.io, t.layout, "20260101000000000", 60, owner=owner)
        os.kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while is_alive(t.io, t.layout, "20260101000000000", 60, owner=owner) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_alive(t.io, t.layout, "20260101000000000", 60, owner=owner)  # not reaped yet: a zombie
    finally:
        p.wait()
