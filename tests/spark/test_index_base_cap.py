"""The record index's base cap (RFC-08 option 1, format.md §6.1): a compaction that would write
an index base of more than the cap seals it; later compactions fold only the open base and the
deltas above the sealed ones, keep the tombstones that still hide a sealed entry, and every
lookup, read, validate and time-travel read sees the same table as without a cap.

The compactions (executed on Spark) are the subject; the upserts feeding them and ``validate`` run on
the in-process Arrow engine. The cap's bad input needs no Spark: tests/unit/test_arrow_oracle_index_base_cap.py."""

from __future__ import annotations

import numpy as np
import pytest

from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.index.hashing import bucket_of, fingerprints
from spark_jobs.index.record_index import TOMBSTONE, IndexFile, is_sealed_base, lookup
from spark_jobs.jobs.compact import run_compact
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.describe import describe
from spark_jobs.table.table import Table
from spark_jobs.table.view import is_index_delta
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import write_batch
from tests.unit.test_arrow_oracle_index_base_cap import _upsert
from tests.unit.test_arrow_oracle_upsert import REGIONS, _dedupe_ties, make_batches

pytestmark = pytest.mark.spark

CAP = 30
#: every bucket with a delta is due; a new base of more than 30 entries is sealed
TINY_CAP = CompactionPolicy(min_deltas=1, data=False, index_base_cap=CAP)


def _compact(spark, uri):  # type: ignore[no-untyped-def]
    """Schedule (checking the plan leaves sealed bases out), then execute."""
    planned = run_compact(None, uri, policy=TINY_CAP, schedule_only=True)
    assert planned["scheduled"], "every bucket has deltas: something is due"
    t = Table.load(uri)
    plan = t.timeline.read_plan(t.timeline.find(planned["instant"]))
    view = t.view()
    for b in plan["index_buckets"]:
        files = view.index_files[b["bucket"]]
        sealed = [f for f in files if is_sealed_base(f)]
        assert b["sealed"] == sealed == files[: len(sealed)], "sealed bases come first and are listed"
        assert not any(is_sealed_base(f) for f in b["files"]), "a sealed base is never folded again"
        assert b["files"] == files[len(sealed): len(sealed) + len(b["files"])], "open base + prefix of deltas"
    done = run_compact(spark, uri, instant=planned["instant"])
    assert done["executed"]
    return plan, done


def _entry(t: Table, rel: str, key: str) -> int | None:
    """The loc of ``key`` in one index file (TOMBSTONE for a tombstone), None if it has no entry."""
    hi, lo = fingerprints([key])
    with IndexFile(t.io, t.abs(rel)) as f:
        e = f.entries()
    at = np.nonzero((e.fp_hi == hi[0]) & (e.fp_lo == lo[0]))[0]
    return int(e.loc[at[0]]) if at.size else None


def _located(t: Table, keys: list[str]) -> dict[str, tuple[str, str] | None]:
    """Each key's (partition, file id) through the record index, as an upsert's tagging sees it."""
    view = t.view()
    out = {}
    for k in keys:
        files = view.index_files.get(bucket_of(k, 2), [])
        out[k] = lookup(t.io, [t.abs(f) for f in files], [k]).target(0)
    return out


def test_sealed_bases_past_the_cap_keep_the_table_equal_to_the_oracle(spark, tmp_path):
    batches = make_batches(seed=61, n_batches=2)  # deletes, re-inserts after delete, partition moves
    _dedupe_ties(batches, False)
    uri = str(tmp_path / "t")
    done: list[list[dict]] = []
    instants = []

    def upsert(rows: list[dict], name: str) -> None:
        instants.append(_upsert(uri, write_batch(tmp_path / f"{name}.parquet", rows), name)["instant"])
        done.append(rows)

    upsert(batches[0], "b0")
    _compact(spark, uri)  # ~60 live keys per bucket: sealed
    upsert(batches[1], "b1")  # ~100 keys per bucket, deleting, moving and re-inserting sealed entries
    _compact(spark, uri)  # ~60 more: sealed again
    t = Table.load(uri)
    view = t.view()
    sealed_before = dict(view.index_files)
    for b, fs in view.index_files.items():
        assert len(fs) == 2 and all(is_sealed_base(f) for f in fs), (b, fs)
        for f in fs:
            with IndexFile(t.io, t.abs(f)) as idx:
                assert idx.sealed and idx.num_entries > CAP
    state = reduce_batches(done)
    assert rows_by_identity(read_arrow(uri).to_pylist()) == state
    shown = describe(t)["index_deltas"]["buckets"]
    assert all(shown[b]["sealed"] == len(fs) and shown[b]["deltas"] == 0 for b, fs in view.index_files.items())

    # every live key's entry now sits in a sealed base
    gone, back, moved, kept = sorted(state)[:4]
    region = {k: state[k]["region"] for k in (gone, back, moved, kept)}
    other = next(r for r in REGIONS if r != region[moved])
    was = _located(t, [moved, kept])
    assert None not in was.values()
    ts = 10**6
    small = [
        {**state[gone], "ts": ts, "is_deleted": True},
        {**state[back], "ts": ts, "is_deleted": True},
        {**state[moved], "ts": ts, "region": other, "amount": 1.5, "is_deleted": False},
        {**state[kept], "ts": ts, "amount": 2.5, "is_deleted": False},
        *({"id": f"new-{i}", "region": "eu", "ts": ts, "amount": 0.0, "note": "n", "is_deleted": False}
          for i in range(6)),
    ]
    upsert(small, "s1")
    plan, _ = _compact(spark, uri)
    t = Table.load(uri)
    view = t.view()
    opened = {}
    for b, fs in view.index_files.items():
        n = len(sealed_before[b])
        assert fs[:n] == sealed_before[b], "sealed bases are never rewritten"
        assert len(fs) == n + 1 and not is_index_delta(fs[n]) and not is_sealed_base(fs[n])
        opened[b] = fs[n]
        with IndexFile(t.io, t.abs(fs[n])) as idx:
            assert not idx.sealed and idx.num_entries <= CAP
    # the tombstones of keys the sealed bases still hold stay in the open base; they hide them
    assert any(_entry(t, f, gone) == TOMBSTONE for f in opened.values())
    assert any(_entry(t, f, back) == TOMBSTONE for f in opened.values())
    assert _located(t, [gone, back]) == {gone: None, back: None}
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(done)

    # re-insert `back` elsewhere, delete a new key: the next compaction folds the open base too
    upsert([{**state[back], "ts": ts + 1, "region": other, "amount": 3.5, "is_deleted": False},
            {"id": "new-0", "region": "eu", "ts": ts + 1, "amount": 0.0, "note": "n", "is_deleted": True}],
           "s2")
    plan, _ = _compact(spark, uri)
    assert any(opened[b["bucket"]] in b["files"] for b in plan["index_buckets"]), "the open base is folded"
    t = Table.load(uri)
    view = t.view()
    folded = {int(b["bucket"]) for b in plan["index_buckets"]}
    for b, fs in view.index_files.items():
        assert fs[:-1] == sealed_before[b] and not is_sealed_base(fs[-1])
        assert (fs[-1] != opened[b]) == (b in folded), "a folded open base is replaced, the others stay"
    newest = [fs[-1] for fs in view.index_files.values()]
    assert any(_entry(t, f, gone) == TOMBSTONE for f in newest), "still hides the sealed entry"
    assert all(_entry(t, f, "new-0") is None for f in newest), "a tombstone hiding nothing sealed is dropped"
    final = reduce_batches(done)
    assert gone not in final and back in final and final[moved]["region"] == other
    located = _located(t, [gone, back, moved, kept])
    assert located[gone] is None
    assert located[back] is not None and located[moved] not in (None, was[moved])
    assert located[kept] == was[kept], "an update in place needs no new entry"
    assert rows_by_identity(read_arrow(uri).to_pylist()) == final
    assert run_validate(uri)["ok"]
    # time travel: every snapshot reads as its batches say
    for i, inst in enumerate(instants):
        assert rows_by_identity(read_arrow(uri, as_of=inst).to_pylist()) == reduce_batches(done[: i + 1]), i
