"""The commit protocol under contention, without Spark: processes racing through
plan -> conflict check -> complete, with random pauses between the check and the commit point.

Every transaction reads a version of each file group and record key it writes from its
snapshot and writes version + 1. If two overlapping transactions ever both won from the
same snapshot, one version would be skipped or repeated on replay; so replaying the commit
sequence and finding every version exactly one above the previous one proves the outcome is
serialisable (in commit order) and that no two overlapping writers both won.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import random
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.index.record_index import IndexEntries, lookup, write_index_file
from spark_jobs.table import Action, Table, TableConfig
from spark_jobs.table.action import CommitConflict, Transaction

pytestmark = pytest.mark.unit

PROCS, ROUNDS = 8, 50
FILE_GROUPS = [f"fg{i:02d}" for i in range(16)]
KEYS = [f"key {i} /%+é東" for i in range(48)]  # keys as users have them
MAX_RETRIES = 3


def _versions_in(view, t: Table, fgs: list[str], keys: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Current version of each file group (its num_rows) and key (its index location) in a snapshot."""
    fg_v = {fg: view.file_groups[("", fg)].num_rows if ("", fg) in view.file_groups else 0 for fg in fgs}
    key_v = {k: 0 for k in keys}
    files = view.index_files.get(0, [])
    if files:
        res = lookup(t.io, [t.abs(f) for f in files], keys)
        for i, k in enumerate(keys):
            loc = res.target(i)
            key_v[k] = int(loc[1]) if loc else 0
    return fg_v, key_v


def _attempt(t: Table, txn: Transaction, fgs: list[str], keys: list[str], rng: random.Random) -> dict:
    """Write this attempt's files (under markers) and return the commit metadata."""
    fg_v, key_v = _versions_in(txn.view, t, fgs, keys)
    groups = []
    for fg in fgs:
        rel = f"{fg}_{txn.ts}_{rng.getrandbits(32):08x}.parquet"
        t.create_marker(txn.ts, rel)
        pq.write_table(pa.table({"v": [fg_v[fg] + 1]}), t.abs(rel))
        groups.append({"partition": "", "file_id": fg, "path": rel, "num_rows": fg_v[fg] + 1})
    added = []
    if keys:
        path = t.layout.index_file(0, "delta", txn.ts)
        t.create_marker(txn.ts, t.layout.rel(path))
        write_index_file(t.io, path, IndexEntries.from_keys(keys, [("", str(key_v[k] + 1)) for k in keys]))
        added.append({"bucket": 0, "path": t.layout.rel(path), "kind": "delta"})
    return {"batch_id": None, "file_groups": groups, "index": {"added": added, "removed": []},
            "read": {"fgs": fg_v, "keys": key_v}, "num_buckets": 1}


def _writer(uri: str, wid: int, barrier, results, disjoint_rounds: set[int]) -> None:  # child process
    import spark_jobs.table.action.transaction as txn_mod

    rng = random.Random(1000 + wid)
    # a random pause between the conflict check and claiming the sequence slot
    txn_mod.maybe_crash = lambda point: time.sleep(rng.uniform(0, 0.02)) if point == "after_conflict_check" else None
    t = Table.load(uri)
    for rnd in range(ROUNDS):
        if rnd in disjoint_rounds:  # every writer its own file group and keys
            fgs, keys = [FILE_GROUPS[wid]], KEYS[wid * 5: wid * 5 + 3]
        else:
            fgs = rng.sample(FILE_GROUPS, rng.randint(0, 2))
            keys = rng.sample(KEYS, rng.randint(0 if fgs else 1, 3))
        barrier.wait(timeout=120)  # a dead peer breaks the barrier instead of hanging
        txn = Transaction(t, Action.COMMIT, {"batch_id": f"w{wid}-r{rnd}"}).begin()
        conflicts = []
        outcome = "aborted"
        try:
            for _ in range(MAX_RETRIES + 1):
                meta = _attempt(t, txn, fgs, keys, rng)
                try:
                    txn.commit(meta)
                    outcome = "committed"
                    break
                except CommitConflict as c:
                    conflicts.append((c.conflict.instant, txn.view.seq))
                    txn.rebase()
        finally:
            if outcome != "committed":
                txn.abort()
        results.put({"wid": wid, "round": rnd, "instant": txn.ts, "outcome": outcome, "fgs": fgs, "keys": keys,
                     "conflicts": conflicts, "disjoint": rnd in disjoint_rounds})


def test_racing_writers_commit_exactly_the_serialisable_outcomes(tmp_path):
    uri = str(tmp_path / "t")
    t = Table.open(uri)
    t.create(TableConfig(record_key_fields=["id"], num_buckets=1))
    disjoint_rounds = set(range(0, ROUNDS, 5))
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(PROCS), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(uri, w, barrier, results, disjoint_rounds)) for w in range(PROCS)]
    for p in procs:
        p.start()
    outcomes = []
    deadline = time.monotonic() + 300
    while len(outcomes) < PROCS * ROUNDS:  # a writer that died fails the test now, not in 300 s
        try:
            outcomes.append(results.get(timeout=1))
        except queue.Empty:
            dead = [(w, p.exitcode) for w, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                pytest.fail(f"writers died (writer, exit code): {dead}" if dead else "writers stalled for 300 s")
    for p in procs:
        p.join(30)
        assert p.exitcode == 0

    t = Table.load(uri)
    tl = t.timeline.reload()
    by_instant = {o["instant"]: o for o in outcomes}
    committed = [i for i in tl.completed([Action.COMMIT])]
    assert sorted(i.timestamp for i in committed) == sorted(o["instant"] for o in outcomes if o["outcome"] == "committed")
    assert len({o["instant"] for o in outcomes}) == PROCS * ROUNDS, "every transaction had an instant of its own"

    # replay in commit order: every write read the version the previous winner wrote
    fg_version = {fg: 0 for fg in FILE_GROUPS}
    key_version = {k: 0 for k in KEYS}
    for inst in committed:
        meta = tl.read_metadata(inst)
        for fg, seen in meta["read"]["fgs"].items():
            assert seen == fg_version[fg], f"{inst}: read {fg} v{seen} but v{fg_version[fg]} was committed before it"
            fg_version[fg] += 1
        for k, seen in meta["read"]["keys"].items():
            assert seen == key_version[k], f"{inst}: read key {k!r} v{seen}, committed v{key_version[k]}"
            key_version[k] += 1

    # every conflict was real: the named commit came after the snapshot and overlaps
    seq_of = {i.timestamp: i.seq for i in committed}
    for o in outcomes:
        for other, snapshot_seq in o["conflicts"]:
            assert seq_of[other] > snapshot_seq
            theirs = by_instant[other]
            assert set(o["fgs"]) & set(theirs["fgs"]) or set(o["keys"]) & set(theirs["keys"]), (o, theirs)

    # disjoint rounds: everybody commits, first try
    for o in outcomes:
        if o["disjoint"]:
            assert o["outcome"] == "committed" and not o["conflicts"], o

    # losers leave no trace: nothing pending, no markers, only committed files on disk
    assert tl.pending() == []
    assert not os.path.exists(t.layout.markers) or os.listdir(t.layout.markers) == []
    referenced = {fg["path"] for i in committed for fg in tl.read_metadata(i)["file_groups"]}
    assert {f for f in os.listdir(t.root) if f.endswith(".parquet")} == referenced
    deltas = {a["path"] for i in committed for a in tl.read_metadata(i)["index"]["added"]}
    on_disk = {t.layout.rel(os.path.join(t.layout.index_bucket_dir(0), f)) for f in os.listdir(t.layout.index_bucket_dir(0))}
    assert on_disk == deltas
    # and the final index agrees with the replayed versions
    _, final_keys = _versions_in(t.view(), t, [], KEYS)
    assert final_keys == key_version
    assert sum(o["outcome"] == "committed" for o in outcomes) > PROCS * ROUNDS // 2
