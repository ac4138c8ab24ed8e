"""Automatic compaction (issue 38 item 1): a merge-on-read upsert on the Arrow engine compacts
the due file groups it touched after its commit, through a scheduled compaction plan.

* 24 small batches keep every group's logs below the due rule and the table equal to the
  oracle, with ``validate`` clean; the bound per upsert holds;
* a writer killed in the middle of its automatic compaction (plan scheduled; new bases
  written, not committed) has committed its batch, the table reads as the oracle, and the
  next upsert or ``compact`` finishes the plan;
* two racing writer processes, both compacting, end equal to the oracle with nothing pending;
* the opt-out (``--auto-compact off``, or an older table without the setting) keeps the
  behaviour before automatic compaction: logs accumulate, no compaction instant is written.
  (A new merge-on-read table compacts by default: tests/unit/test_default_table_type.py.)
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.compact import AUTO_CHOICE, run_compact
from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.cli import build_parser
from spark_jobs.exceptions import BadInputError
from spark_jobs.table import Action, Table
from spark_jobs.table.action.compact import DEFAULT_MIN_DELTAS, DEFAULT_MIN_LOGS, CompactionPolicy, is_auto
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.view import is_index_delta
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_arrow_compact import _on_disk_unreferenced  # data and index files no completed action added

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64()), ("amount", pa.float64()),
                    ("writer", pa.string()), ("pad", pa.string()), ("is_deleted", pa.bool_())])
REGIONS = ["eu west/1", "sã%o+paulo", None]
POOL = 240
#: incompressible bytes per row: a base is then large against a log of a few rows, so a group
#: becomes due by its count of logs (4), not by the log-bytes ratio on the first small log
PAD = 2000


def _pad(rnd: random.Random) -> str:
    return rnd.randbytes(PAD).hex()


def _key(k: int) -> str:
    return f"k{k:04d} /%+é"


def _seed_rows() -> list[dict]:
    rnd = random.Random(0)
    return [{"id": _key(k), "region": REGIONS[k % 3], "ts": 0, "amount": 0.0, "writer": "seed", "pad": _pad(rnd),
             "is_deleted": False} for k in range(POOL)]


def _batch(rnd: random.Random, b: int, writer: str = "w", keys: range | None = None, size: int = 30) -> list[dict]:
    """Updates (a few partition moves and late events), deletes and re-inserts of the pool's keys,
    and a few new keys; (key, ts) unique in the batch."""
    pick = list(keys if keys is not None else range(POOL))
    rows = []
    for j, k in enumerate(rnd.sample(pick, min(size, len(pick)))):
        ts = b * 1000 + j if rnd.random() > 0.1 else b * 1000 - 900  # 10% late
        rows.append({"id": _key(k), "region": rnd.choice(REGIONS) if rnd.random() < 0.1 else REGIONS[k % 3],
                     "ts": ts, "amount": rnd.random(), "writer": writer, "pad": _pad(rnd),
                     "is_deleted": rnd.random() < 0.1})
    return rows


def _write(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return str(path)


def _opts(uri: str, src: str, batch_id: str, **extra) -> UpsertOptions:
    return UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
                         num_buckets=4, delete_field="is_deleted", batch_id=batch_id, target_file_rows=40,
                         table_type="merge_on_read", **extra)


def _create(tmp_path: Path, **extra) -> tuple[str, list[dict]]:
    uri = str(tmp_path / "t")
    seed = _seed_rows()
    run_upsert(_opts(uri, _write(tmp_path / "seed.parquet", seed), "seed", **extra))
    return uri, seed


def _max_logs(uri: str) -> int:
    return max((len(s.logs) for s in Table.load(uri).view().slices()), default=0)


def _deltas_per_bucket(uri: str) -> dict[int, int]:
    """Record-index deltas of each bucket in the latest snapshot (what a lookup opens besides bases)."""
    return {b: sum(1 for f in files if is_index_delta(f)) for b, files in Table.load(uri).view().index_files.items()}


def _index_batch(rnd: random.Random, b: int, *, fresh: int = 12, size: int = 12) -> list[dict]:
    """``_batch``'s updates, moves and deletes of the pool, and ``fresh`` new keys: new keys write
    a delta to their buckets, so every bucket gets one nearly every batch."""
    rows = _batch(rnd, b, size=size)
    for j in range(fresh):
        rows.append({"id": _key(1000 + b * fresh + j), "region": REGIONS[j % 3], "ts": b * 1000 + 500 + j,
                     "amount": rnd.random(), "writer": "w", "pad": _pad(rnd), "is_deleted": False})
    return rows


def _compactions(uri: str) -> list[dict]:
    t = Table.load(uri)
    return [t.timeline.read_metadata(i) for i in t.timeline.completed([Action.COMPACTION])]


def _is_automatic(meta: dict) -> bool:
    """A completed compaction an upsert ran (its plan's ``trigger`` is gone once archived; the
    engine choice it records says so)."""
    return meta.get("engine") == {"name": AUTO_CHOICE.engine, "reason": AUTO_CHOICE.reason}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BUCKETINDEX_FAULT", "BUCKETINDEX_PAUSE")}
    env.update(extra)
    return env


def _cli_upsert(uri: str, src: str, batch_id: str, env: dict[str, str], *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "spark_jobs.cli", "upsert", uri, src, "--batch-id", batch_id, "--engine", "arrow",
           "--delete-field", "is_deleted",
           *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


# -- (a) a day of small batches ----------------------------------------------------------------

def test_24_batches_keep_logs_bounded_and_the_table_equal_to_the_oracle(tmp_path):
    uri, seed = _create(tmp_path, auto_compact="on")
    assert Table.load(uri).config.auto_compact is True  # recorded: later upserts need no flag
    rnd = random.Random(38)
    batches = [seed]
    most = 0
    for b in range(1, 25):
        rows = _batch(rnd, b, size=12)
        batches.append(rows)
        # the table's setting, bounded generously: every due group it touched is folded
        out = run_upsert(_opts(uri, _write(tmp_path / f"b{b}.parquet", rows), f"b{b}",
                               auto_compact_max_groups=64))
        assert "error" not in out["auto_compaction"], out["auto_compaction"]
        assert out["timings_ms"]["auto_compact_ms"] >= 0
        most = max(most, _max_logs(uri))
        assert _max_logs(uri) < DEFAULT_MIN_LOGS, f"batch {b}: a touched group kept {_max_logs(uri)} logs"
        assert Table.load(uri).timeline.pending() == []
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    report = run_validate(uri)
    assert report["ok"], report["problems"]
    done = _compactions(uri)
    assert done and all(_is_automatic(m) for m in done), "every compaction was an upsert's automatic one"
    assert max(_deltas_per_bucket(uri).values(), default=0) < DEFAULT_MIN_DELTAS
    assert most >= 1, "the batches should have written logs between compactions"
    assert not _on_disk_unreferenced(uri)


def test_the_bound_per_upsert_holds_and_a_later_upsert_catches_up(tmp_path):
    uri, seed = _create(tmp_path, auto_compact="on")
    rnd = random.Random(7)
    batches = [seed]
    for b in range(1, 9):
        rows = _batch(rnd, b, size=80)  # touches most groups: more are due at once than the bound
        batches.append(rows)
        out = run_upsert(_opts(uri, _write(tmp_path / f"b{b}.parquet", rows), f"b{b}", auto_compact_max_groups=1))
        assert out["auto_compaction"]["file_groups"] <= 1
    done = _compactions(uri)
    assert done and all(m["counts"]["file_groups"] == 1 for m in done)
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]

    # a byte bound below every group's size plans nothing (such groups are left to `compact`)
    rows = _batch(rnd, 9, size=80)
    batches.append(rows)
    out = run_upsert(_opts(uri, _write(tmp_path / "b9.parquet", rows), "b9", auto_compact_max_bytes="1"))
    assert out["auto_compaction"]["instant"] is None
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)


# -- (a2) the record index: deltas folded as they fall due --------------------------------------

def test_index_deltas_per_bucket_stay_below_the_threshold_and_the_table_equal_to_the_oracle(tmp_path):
    """K = 24 upserts, each writing a delta to (nearly) every index bucket, against the due rule's
    k = 10 deltas (``compact --min-deltas``' default): every bucket is folded by an upsert as it
    falls due, so none holds k deltas after any upsert -- without it, a bucket held ~K."""
    uri, seed = _create(tmp_path, auto_compact="on")
    rnd = random.Random(3838)
    batches = [seed]
    folded = 0
    for b in range(1, 25):
        rows = _index_batch(rnd, b)
        batches.append(rows)
        out = run_upsert(_opts(uri, _write(tmp_path / f"b{b}.parquet", rows), f"b{b}"))
        auto = out["auto_compaction"]
        assert "error" not in auto, auto
        assert auto["index_buckets"] <= 4  # the default budget (4 buckets: this table's count)
        folded += auto["index_buckets"]
        deltas = _deltas_per_bucket(uri)
        assert max(deltas.values()) < DEFAULT_MIN_DELTAS, f"batch {b}: {deltas}"
        assert Table.load(uri).timeline.pending() == []
    assert folded >= 8, "every bucket should have fallen due at least twice in 24 batches"
    done = _compactions(uri)
    assert all(_is_automatic(m) for m in done)
    assert sum(m["counts"]["index_deltas_folded"] for m in done) >= 8 * (DEFAULT_MIN_DELTAS - 1)
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    report = run_validate(uri)
    assert report["ok"], report["problems"]
    assert not _on_disk_unreferenced(uri)


def test_the_bucket_budget_holds_and_later_upserts_catch_up(tmp_path):
    """``--auto-compact-max-buckets 1``: one bucket folded per upsert, the one with the most deltas;
    the result says how many were due. The buckets left are folded by the next upserts, and
    with the budget off (``--auto-compact off``) deltas pile up past the threshold."""
    uri, seed = _create(tmp_path, auto_compact="on")
    rnd = random.Random(383)
    batches = [seed]
    for b in range(1, DEFAULT_MIN_DELTAS + 1):  # every bucket falls due at the last of these
        rows = _index_batch(rnd, b, fresh=16, size=0)
        batches.append(rows)
        run_upsert(_opts(uri, _write(tmp_path / f"b{b}.parquet", rows), f"b{b}", auto_compact="off"))
    before = _deltas_per_bucket(uri)
    assert len(before) == 4 and min(before.values()) >= DEFAULT_MIN_DELTAS - 1, before
    due_seen = []
    for b in range(DEFAULT_MIN_DELTAS + 1, DEFAULT_MIN_DELTAS + 6):
        rows = _index_batch(rnd, b, fresh=16, size=0)
        batches.append(rows)
        out = run_upsert(_opts(uri, _write(tmp_path / f"b{b}.parquet", rows), f"b{b}", auto_compact_max_buckets=1))
        auto = out["auto_compaction"]
        assert "error" not in auto, auto
        due_seen.append(auto.get("due_index_buckets", 0))
        assert auto["index_buckets"] <= 1
        if auto["index_buckets"]:
            # the most deltas first: of the snapshot the upsert committed, the bucket folded had the most
            at_upsert = {bk: sum(1 for f in files if is_index_delta(f))
                         for bk, files in Table.load(uri).view(as_of=out["instant"]).index_files.items()}
            after = _deltas_per_bucket(uri)
            gone = [bk for bk in after if after[bk] < at_upsert[bk]]
            assert len(gone) == 1, (at_upsert, after)
            assert at_upsert[gone[0]] == max(at_upsert.values()), (at_upsert, gone)
    assert due_seen[0] == 4 and due_seen[1] == 3, due_seen  # 4 due, one folded a run
    assert max(_deltas_per_bucket(uri).values()) < DEFAULT_MIN_DELTAS
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]


def test_compact_max_buckets_plans_the_buckets_with_the_most_deltas(tmp_path):
    """``compact --max-buckets N``: the explicit compaction's budget on index buckets, as
    ``--max-groups`` is on file groups; the rest stay due for the next run."""
    from spark_jobs.table.action.compact import CompactOptions

    uri, seed = _create(tmp_path, auto_compact="off")
    rnd = random.Random(99)
    batches = [seed]
    for b in range(1, DEFAULT_MIN_DELTAS + 1):
        rows = _index_batch(rnd, b, fresh=16, size=0)
        batches.append(rows)
        run_upsert(_opts(uri, _write(tmp_path / f"b{b}.parquet", rows), f"b{b}"))
    before = _deltas_per_bucket(uri)
    assert sum(1 for n in before.values() if n >= DEFAULT_MIN_DELTAS) >= 3, before
    out = run_compact(uri, policy=CompactOptions(table=uri, max_buckets=2, only="index").policy)
    assert out["counts"]["index_buckets"] == 2
    after = _deltas_per_bucket(uri)
    folded = sorted(bk for bk in after if after[bk] < before[bk])
    assert len(folded) == 2 and min(before[bk] for bk in folded) >= max(
        n for bk, n in before.items() if bk not in folded), (before, after)
    out = run_compact(uri, policy=CompactOptions(table=uri, only="index").policy)
    assert max(_deltas_per_bucket(uri).values()) == 0
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    for bad in ({"max_buckets": 0}, {"max_buckets": 2, "execute": "20261127092400123"},
                {"max_buckets": 2, "rebuild_index": True}):
        with pytest.raises(BadInputError):
            CompactOptions(table=uri, **bad)


# -- (b) a crash in the middle of it -----------------------------------------------------------

@pytest.mark.parametrize("point", ["schedule_after_requested", "auto_compact_before_commit"])
@pytest.mark.parametrize("finisher", ["upsert", "compact"])
def test_killed_automatic_compaction_leaves_the_upsert_committed_and_is_finished_next(tmp_path, point, finisher):
    uri, seed = _create(tmp_path, auto_compact="on")
    rnd = random.Random(5)
    batches = [seed]
    # logs without a due group yet: three batches that each touch every group
    for b in range(1, 4):
        rows = _batch(rnd, b, size=POOL // 2)
        batches.append(rows)
        run_upsert(_opts(uri, _write(tmp_path / f"b{b}.parquet", rows), f"b{b}", auto_compact="off"))
    rows = _batch(rnd, 4, size=POOL // 2)
    batches.append(rows)
    p = _cli_upsert(uri, _write(tmp_path / "b4.parquet", rows), "b4", _env(BUCKETINDEX_FAULT=point),
                    "--auto-compact-max-groups", "64")
    _, err = p.communicate(timeout=180)
    assert p.returncode == -signal.SIGKILL, (p.returncode, err[-2000:])

    t = Table.load(uri)
    assert t.commit_for_batch("b4") is not None, "the upsert committed before its automatic compaction"
    pending = t.timeline.pending()
    assert [i.action for i in pending] == [Action.COMPACTION]
    assert is_auto(t.timeline.read_plan(pending[0]))
    if point == "auto_compact_before_commit":
        assert t.marked_files(pending[0].timestamp), "the dead attempt should have left new bases"
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]
    time.sleep(2.5)  # the dead attempt's heartbeat expires

    if finisher == "upsert":
        rows = _batch(rnd, 5, size=10)
        batches.append(rows)
        out = run_upsert(_opts(uri, _write(tmp_path / "b5.parquet", rows), "b5", heartbeat_timeout_s=2))
        assert out["auto_compaction"]["resumed"] == [pending[0].timestamp]
    else:
        out = run_compact(uri, policy=CompactionPolicy(), heartbeat_timeout_s=2)
        assert [r["instant"] for r in out["resumed"]] == [pending[0].timestamp]
    t = Table.load(uri)
    assert t.timeline.pending() == [] and not t.marked_files(pending[0].timestamp)
    assert t.timeline.is_completed(pending[0].timestamp)
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]
    assert not _on_disk_unreferenced(uri), "the crashed attempt's files are deleted at the commit"


@pytest.mark.parametrize("point", ["schedule_after_requested", "auto_compact_before_commit"])
@pytest.mark.parametrize("finisher", ["upsert", "compact"])
def test_killed_automatic_index_fold_leaves_the_upsert_committed_and_is_finished_next(tmp_path, point, finisher):
    """The index fold is ``compact``'s own (same plan, same commit point): killed after its plan is
    scheduled or after its new index bases are written, the upsert stands, lookups still see every
    key (the table reads and upserts as the oracle), and the next upsert or ``compact`` finishes it."""
    uri, seed = _create(tmp_path, auto_compact="on")
    rnd = random.Random(55)
    batches = [seed]
    for b in range(1, DEFAULT_MIN_DELTAS):
        rows = _index_batch(rnd, b, fresh=16, size=4)
        batches.append(rows)
        run_upsert(_opts(uri, _write(tmp_path / f"b{b}.parquet", rows), f"b{b}", auto_compact="off"))
    b = DEFAULT_MIN_DELTAS
    rows = _index_batch(rnd, b, fresh=16, size=4)
    batches.append(rows)
    p = _cli_upsert(uri, _write(tmp_path / f"b{b}.parquet", rows), f"b{b}", _env(BUCKETINDEX_FAULT=point))
    _, err = p.communicate(timeout=180)
    assert p.returncode == -signal.SIGKILL, (p.returncode, err[-2000:])

    t = Table.load(uri)
    assert t.commit_for_batch(f"b{b}") is not None
    (pending,) = t.timeline.pending()
    plan = t.timeline.read_plan(pending)
    assert is_auto(plan) and plan["index_buckets"], plan
    if point == "auto_compact_before_commit":
        assert any(f.endswith(".arrow") for f in t.marked_files(pending.timestamp)), "new index bases written"
    assert max(_deltas_per_bucket(uri).values()) >= DEFAULT_MIN_DELTAS, "nothing folded before the commit point"
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]
    time.sleep(2.5)  # the dead attempt's heartbeat expires

    if finisher == "upsert":
        rows = _index_batch(rnd, b + 1, fresh=16, size=4)
        batches.append(rows)
        out = run_upsert(_opts(uri, _write(tmp_path / f"b{b + 1}.parquet", rows), f"b{b + 1}",
                               heartbeat_timeout_s=2))
        assert out["auto_compaction"]["resumed"] == [pending.timestamp]
    else:
        out = run_compact(uri, policy=CompactionPolicy(), heartbeat_timeout_s=2)
        assert [r["instant"] for r in out["resumed"]] == [pending.timestamp]
    t = Table.load(uri)
    assert t.timeline.pending() == [] and t.timeline.is_completed(pending.timestamp)
    assert t.timeline.read_metadata(t.timeline.find(pending.timestamp))["counts"]["index_buckets"] > 0
    assert max(_deltas_per_bucket(uri).values()) < DEFAULT_MIN_DELTAS
    # an upsert after the fold looks its keys up in the new bases: updates stay updates
    rows = _index_batch(rnd, b + 2, fresh=4, size=60)
    batches.append(rows)
    run_upsert(_opts(uri, _write(tmp_path / f"b{b + 2}.parquet", rows), f"b{b + 2}"))
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]
    assert not _on_disk_unreferenced(uri), "the crashed attempt's files are deleted at the commit"


# -- (c) racing writers ------------------------------------------------------------------------

def test_two_racing_writers_with_automatic_compaction_end_equal_to_the_oracle(tmp_path):
    uri, seed = _create(tmp_path, auto_compact="on")
    rnd = random.Random(11)
    history = [seed]
    # both writers plan their compaction with a pause before scheduling it, so their plans race
    # for the same groups; disjoint keys (even/odd) in the same groups, so both batches commit
    env = _env(BUCKETINDEX_PAUSE="schedule_after_plan=0.7")
    for r in range(1, 7):
        procs = {}
        for w in range(2):
            rows = _batch(rnd, r, writer=f"r{r}w{w}", keys=range(w, POOL, 2), size=60)
            procs[f"r{r}w{w}"] = (_cli_upsert(uri, _write(tmp_path / f"r{r}w{w}.parquet", rows), f"r{r}w{w}", env,
                                              "--auto-compact-max-groups", "64"), rows)
        for batch_id, (p, _) in procs.items():
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, (batch_id, p.returncode, err[-3000:])
            assert "Traceback" not in err, err[-3000:]
            assert "auto_compaction" in json.loads(out.strip().splitlines()[-1])
        tl = Table.load(uri).timeline.reload()
        order = [tl.read_metadata(i)["batch_id"] for i in tl.completed([Action.COMMIT])]
        history += [procs[b][1] for b in order if b in procs]
        assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(history), f"round {r}"
        assert tl.pending() == [], f"round {r}: {tl.pending()}"
    report = run_validate(uri)
    assert report["ok"], report["problems"]
    assert _compactions(uri), "the writers' automatic compactions should have committed"
    assert not _on_disk_unreferenced(uri)


# -- (d) the opt-out ---------------------------------------------------------------------------

def test_without_the_setting_nothing_is_compacted(tmp_path):
    """A table created before automatic compaction became a new merge-on-read table's default
    has no ``auto_compact`` in table.json: its upserts keep today's behaviour."""
    uri, seed = _create(tmp_path, auto_compact="off")
    t = Table.load(uri)
    raw = json.loads(Path(t.layout.config_file).read_text())
    del raw["auto_compact"]  # as an older release wrote it
    Path(t.layout.config_file).write_text(json.dumps(raw, indent=2, sort_keys=True))
    t = Table.load(uri)
    assert t.config.auto_compact is None
    rnd = random.Random(3)
    batches = [seed]
    for b in range(1, 7):
        rows = _batch(rnd, b, size=POOL // 2)
        batches.append(rows)
        out = run_upsert(_opts(uri, _write(tmp_path / f"b{b}.parquet", rows), f"b{b}"))
        assert "auto_compaction" not in out
    assert not _compactions(uri) and Table.load(uri).timeline.pending() == []
    assert _max_logs(uri) >= DEFAULT_MIN_LOGS, "logs accumulate, as before"
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)

    # --auto-compact on for one run compacts what it touched that is due; the table keeps its setting
    rows = _batch(rnd, 7, size=POOL // 2)
    batches.append(rows)
    out = run_upsert(_opts(uri, _write(tmp_path / "b7.parquet", rows), "b7", auto_compact="on",
                           auto_compact_max_groups=64))
    assert out["auto_compaction"]["file_groups"] > 0
    assert Table.load(uri).config.auto_compact is None
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]


def test_off_for_one_run_of_a_table_that_asks_for_it(tmp_path):
    uri, seed = _create(tmp_path, auto_compact="on")
    rnd = random.Random(4)
    for b in range(1, 7):
        out = run_upsert(_opts(uri, _write(tmp_path / f"b{b}.parquet", _batch(rnd, b, size=POOL // 2)), f"b{b}",
                               auto_compact="off"))
        assert "auto_compaction" not in out
    assert not _compactions(uri)
    assert _max_logs(uri) >= DEFAULT_MIN_LOGS


def test_created_with_off_records_it(tmp_path):
    uri, _ = _create(tmp_path, auto_compact="off")
    assert Table.load(uri).config.auto_compact is False


def test_options_are_checked_and_round_trip(tmp_path):
    opts = _opts("t", "s", "b", auto_compact="on", auto_compact_max_groups=2, auto_compact_max_bytes="64m",
                 auto_compact_max_buckets=3)
    argv = ["upsert", *opts.to_argv()]
    assert "--auto-compact" in argv and "--auto-compact-max-groups" in argv and "--auto-compact-max-bytes" in argv
    assert "--auto-compact-max-buckets" in argv
    assert UpsertOptions.from_args(build_parser().parse_args(argv)) == opts
    assert opts.auto_compaction.max_groups == 2 and opts.auto_compaction.max_bytes == 64 * 1024 * 1024
    assert opts.auto_compaction.max_buckets == 3 and opts.auto_compaction.policy.max_buckets == 3
    for bad in ({"auto_compact": "yes"}, {"auto_compact_max_groups": 0}, {"auto_compact_max_bytes": "lots"},
                {"auto_compact_max_buckets": 0}, {"auto_compact": "off", "auto_compact_max_groups": 2},
                {"auto_compact": "off", "auto_compact_max_buckets": 2}):
        with pytest.raises(BadInputError):
            _opts("t", "s", "b", **bad)
    # a copy-on-write table has no logs: asking for it is bad input, before anything is written
    src = _write(tmp_path / "s.parquet", _seed_rows()[:5])
    with pytest.raises(BadInputError, match="merge-on-read"):
        run_upsert(UpsertOptions(table=str(tmp_path / "cow"), source=src, record_key=["id"], batch_id="x",
                                 table_type="copy_on_write", auto_compact="on"))
    assert not (tmp_path / "cow").exists()
