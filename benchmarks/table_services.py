"""Table services: record-index lookups with many deltas vs after compaction, compaction
throughput, and the cost of opening a table as its timeline grows.

Three measurements, each selectable with ``--parts`` (default all):

* ``lookup`` -- one record-index bucket built with ``spark_jobs.index.record_index``: a base
  of ``--entries`` random UUID keys plus ``--deltas`` deltas of ``--delta-min`` ..
  ``--delta-max`` entries each (new keys, keys moving to another file group, tombstones, and
  re-inserts of deleted keys). ``--keys`` keys (hits in the base, hits in the deltas, keys
  deleted by a delta, misses) are looked up with ``record_index.lookup`` from their key
  *strings* -- what an upsert's lookup task (``tasks.lookup_bucket``) calls -- against the base
  plus the first k deltas for every k of ``--delta-sweep``; then the bucket is merged into one
  base exactly as index compaction does it (``merge_entries`` newest-wins, tombstones dropped,
  ``write_index_file``: the body of ``tasks.compact_index_buckets``) and looked up again.
  Every result is checked against an oracle, and the answers before and after compaction
  must be equal. Median of ``--runs`` timed runs after a warm-up; k and the compacted bucket
  interleaved within each repetition. The merge itself is timed too (single process:
  entries merged per second).
* ``compact`` -- end to end on a real table: a record-index table of ``--spark-rows`` rows in
  ``--spark-buckets`` index buckets created with the real upsert job (``run_upsert``;
  partitioned by ``region``, with a delete column), then ``--spark-upserts`` small upserts of
  ``--spark-batch`` rows each (updates, most of them moving the key to another region, new
  keys, deletes) so every bucket has deltas; then ``run_compact`` (index only) in this
  process's Spark session, and ``--cli-runs`` cold runs of ``bucketindex compact TABLE
  --only index`` as a user runs it, each on a fresh copy of the uncompacted table (the copy is
  not timed; a compaction cannot be repeated on the same table).
* ``open`` -- ``Table.load(uri)`` + ``table.view()`` (what every CLI run, sensor poke and job
  start pays) on tables with ``--commits`` completed commits. A small table is created by
  one real upsert, then commits are made with the pure-Python core, no Spark: each goes
  through ``Transaction`` (plan, heartbeat, inflight, markers, conflict check, sequence entry
  -- exactly the files the protocol writes), rewrites one or two file groups (a new data file
  path: **the data file is not written**, readers of the snapshot would miss it; opening the
  table never reads it) and inserts one to three keys with a real index delta file per
  touched bucket. Every ``--compact-every`` commits an index compaction runs through the real
  scheduler and executor (``schedule_compaction`` + ``service.execute``, the Spark task's
  pure-Python body run in-process), as a table compacted on a schedule would have. Timed:
  warm (in this process, median of ``--open-runs``), cold (a fresh Python process that
  imports the core and opens the table, median of ``--cold-runs``; and ``bucketindex show
  TABLE``), and a breakdown of the warm open (listing, reading, JSON parsing, replay).
  Generation time per commit count is reported too. ``--keep DIR`` keeps the generated
  tables in DIR and reuses them when the script runs again (so the same timelines can be
  re-measured after a format change).

    python benchmarks/table_services.py [--quick] [--parts lookup,compact,open]
        [--entries 1000000] [--deltas 50] [--keys 100000] [--runs 7]
        [--spark-rows 1000000] [--spark-buckets 16] [--spark-upserts 20] [--spark-batch 10000]
        [--commits 10,1000,10000] [--compact-every 100] [--keep DIR] [--workdir DIR] [--json-out FILE]

Progress goes to stdout; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import posixpath
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machine_info import cpu_model, mem_total_gb  # noqa: E402 (benchmarks/ is on sys.path)
from results import emit_result  # noqa: E402

from spark_jobs.index.hashing import buckets_of, fingerprints  # noqa: E402
from spark_jobs.index.record_index import IndexEntries, IndexFile, lookup, merge_entries, write_index_file  # noqa: E402
from spark_jobs.io.filesystem import resolve  # noqa: E402

PARTS = ("lookup", "compact", "open")


def log(msg: str) -> None:
    print(msg, flush=True)


def load() -> float:
    return round(os.getloadavg()[0], 2)


def med_ms(ts: list[float]) -> float:
    return round(statistics.median(ts) * 1000, 2)


# ===================================================================================== lookup

def _uuid_strings(rng: np.random.Generator, n: int) -> list[str]:
    from compare_peers import uuid4_strings

    return uuid4_strings(rng, n).to_pylist()


def build_bucket(args, work: Path, rng: np.random.Generator) -> dict:
    """A base and ``args.deltas`` deltas of one bucket, plus the oracle: per key id, its live
    location (global location index) or -1, after each number of deltas."""
    n = args.entries
    sizes = rng.integers(args.delta_min, args.delta_max + 1, size=args.deltas)
    ins_total = int(sizes.sum())  # upper bound on new keys the deltas insert
    t0 = time.perf_counter()
    keys = _uuid_strings(rng, n + ins_total + args.keys)  # the tail: keys never written (misses)
    hi, lo = fingerprints(keys)
    log(f"[lookup] {len(keys):,} keys generated and fingerprinted in {time.perf_counter() - t0:.1f} s")
    # base locations: 20 partitions x 50 file groups; each delta adds a few new file groups
    locations = [(f"dt=2024-03-{p + 1:02d}", f"{p * 50 + f:05d}-{rng.integers(2**62):016x}")
                 for p in range(20) for f in range(50)]
    state = np.full(n + ins_total, -1, dtype=np.int64)
    state[:n] = rng.integers(0, len(locations), size=n)
    io, _ = resolve(str(work))
    paths = []
    base = work / "base.arrow"
    write_index_file(io, str(base), IndexEntries(hi[:n], lo[:n], state[:n].astype(np.int32), locations))
    paths.append(str(base))
    next_new = n
    deleted: list[np.ndarray] = []
    states = [state.copy()]  # states[k]: after k deltas
    counts = {"inserts": 0, "moves": 0, "tombstones": 0, "reinserts": 0}
    for d, size in enumerate(sizes.tolist()):
        new_locs = list(range(len(locations), len(locations) + 5))
        locations += [(f"dt=2024-04-{d % 28 + 1:02d}", f"new{d:03d}{j}-{rng.integers(2**62):016x}") for j in range(5)]
        n_ins = size * 4 // 10
        n_mov = size * 3 // 10
        n_tomb = size * 2 // 10
        live = np.nonzero(state[:next_new] >= 0)[0]
        pick = rng.choice(live, n_mov + n_tomb, replace=False)
        mov, tomb = pick[:n_mov], pick[n_mov:]
        dead = np.concatenate(deleted) if deleted else np.empty(0, np.int64)
        dead = np.unique(dead[state[dead] < 0]) if dead.size else dead
        n_re = min(size - n_ins - n_mov - n_tomb, dead.size)
        re = rng.choice(dead, n_re, replace=False) if n_re else np.empty(0, np.int64)
        ins = np.arange(next_new, next_new + n_ins)
        next_new += n_ins
        ids = np.concatenate([ins, mov, re, tomb])
        new_loc = np.concatenate([rng.choice(new_locs, n_ins),
                                  rng.integers(0, len(locations), n_mov),  # a move: any other group
                                  rng.integers(0, len(locations), re.size),
                                  np.full(tomb.size, -1)])
        state[ids] = new_loc
        deleted.append(tomb)
        for k, v in (("inserts", n_ins), ("moves", n_mov), ("tombstones", tomb.size), ("reinserts", re.size)):
            counts[k] += int(v)
        p = work / f"delta_{d:03d}.arrow"
        write_index_file(io, str(p), IndexEntries(hi[ids], lo[ids], new_loc.astype(np.int32), locations))
        paths.append(str(p))
        states.append(state.copy())
    # the batch: hits in the base (some moved or deleted later), keys the deltas inserted, misses
    q = args.keys
    n_delta_keys = min(q * 3 // 10, next_new - n)
    n_miss = q // 10
    base_q = rng.choice(n, q - n_delta_keys - n_miss, replace=False)
    delta_q = rng.choice(np.arange(n, next_new), n_delta_keys, replace=False)
    miss_q = np.arange(n + ins_total, n + ins_total + n_miss)
    query = rng.permutation(np.concatenate([base_q, delta_q, miss_q]))
    final = states[-1]
    qk = [keys[i] for i in query.tolist()]
    kinds = {"base_keys": int(base_q.size), "delta_inserted_keys": int(delta_q.size), "never_written": int(n_miss),
             "live_at_end": int(np.count_nonzero(np.where(query < final.size, final[np.minimum(query, final.size - 1)],
                                                          -1) >= 0))}
    log(f"[lookup] bucket: base {n:,} entries + {args.deltas} deltas ({int(sizes.sum()):,} entries: {counts}); "
        f"batch of {q:,} keys {kinds}")
    return {"paths": paths, "locations": locations, "states": states, "query": query, "query_keys": qk,
            "delta_entries": int(sizes.sum()), "delta_counts": counts, "batch": kinds, "io": io}


def _check(res, expected_state: np.ndarray, query: np.ndarray, locations: list, what: str) -> None:
    exp = np.full(query.size, -1, dtype=np.int64)
    inside = query < expected_state.size
    exp[inside] = expected_state[query[inside]]
    if not np.array_equal(res.found, exp >= 0):
        raise AssertionError(f"{what}: {int(np.count_nonzero(res.found != (exp >= 0)))} keys found/absent wrongly")
    gidx = {loc: i for i, loc in enumerate(locations)}
    remap = np.array([gidx[tuple(l)] for l in res.locations] + [-1], dtype=np.int64)
    got = remap[np.where(res.loc >= 0, res.loc, len(res.locations))]
    if not np.array_equal(got, exp):
        raise AssertionError(f"{what}: {int(np.count_nonzero(got != exp))} targets differ")


def _targets(res) -> list:
    return [res.target(i) for i in range(res.loc.size)]


def run_lookup(args, work: Path) -> dict:
    rng = np.random.default_rng([args.seed, 1])
    work.mkdir(parents=True, exist_ok=True)
    b = build_bucket(args, work, rng)
    io, paths, keys = b["io"], b["paths"], b["query_keys"]
    sweep = sorted({k for k in args.delta_sweep if k <= args.deltas} | {0, args.deltas})
    # the merge compaction does, timed (merge newest-wins + write the new base)
    in_entries = sum(IndexFile(io, p).num_entries for p in paths)
    merge_ts, out_entries = [], 0
    compacted = str(work / "compacted.arrow")
    for r in range(args.merge_runs):
        gc.collect()
        t0 = time.perf_counter()
        merged = merge_entries(io, paths)
        write_index_file(io, compacted, merged, metadata={"instant": "bench", "bucket": 0})
        merge_ts.append(time.perf_counter() - t0)
        out_entries = len(merged)
        del merged
        log(f"[lookup] merge {r + 1}/{args.merge_runs}: {in_entries:,} entries in {len(paths)} files -> "
            f"{out_entries:,} in {merge_ts[-1]:.2f} s")
    merge_s = statistics.median(merge_ts)
    with IndexFile(io, compacted) as f:
        assert f.num_entries == out_entries
    # verify every configuration once (also the warm-up), then time them interleaved
    configs = {f"deltas_{k}": paths[: k + 1] for k in sweep}
    configs["compacted"] = [compacted]
    before = after = None
    for name, ps in configs.items():
        res = lookup(io, ps, keys)
        k = args.deltas if name == "compacted" else int(name.split("_")[1])
        _check(res, b["states"][k], b["query"], b["locations"], name)
        if name == f"deltas_{args.deltas}":
            before = _targets(res)
        if name == "compacted":
            after = _targets(res)
    assert before is not None and before == after, "answers differ before and after compaction"
    log(f"[lookup] every configuration checked against the oracle; answers with {args.deltas} deltas == after "
        f"compaction ({sum(t is not None for t in after):,} of {len(after):,} keys found)")
    times: dict[str, list[float]] = {n: [] for n in configs}
    names = list(configs)
    gc.collect()
    for r in range(args.runs):
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            t0 = time.perf_counter()
            lookup(io, configs[name], keys)
            times[name].append(time.perf_counter() - t0)
    med = {n: med_ms(v) for n, v in times.items()}
    base_ms = med["deltas_0"]
    for n in names:
        log(f"[lookup] {n:>12}: {med[n]:8.1f} ms (x{med[n] / base_ms:.2f} of the base alone; "
            f"min {min(times[n]) * 1000:.1f}, max {max(times[n]) * 1000:.1f})")
    full, comp = med[f"deltas_{args.deltas}"], med["compacted"]
    log(f"[lookup] {args.deltas} deltas vs compacted: {full:.1f} ms vs {comp:.1f} ms = x{full / comp:.2f}")
    log(f"[lookup] core merge: {in_entries:,} entries in -> {out_entries:,} out in {merge_s:.2f} s = "
        f"{in_entries / merge_s:,.0f} entries/s in, {out_entries / merge_s:,.0f} out")
    return {
        "entries": args.entries, "deltas": args.deltas, "delta_entries": b["delta_entries"],
        "delta_counts": b["delta_counts"], "keys": args.keys, "batch": b["batch"], "runs": args.runs,
        "lookup_ms": med, "lookup_ms_min": {n: round(min(v) * 1000, 2) for n, v in times.items()},
        "lookup_ms_max": {n: round(max(v) * 1000, 2) for n, v in times.items()},
        "ratio_deltas_vs_compacted": round(full / comp, 2),
        "slowdown_vs_base_alone": {n: round(med[n] / base_ms, 3) for n in names},
        "answers_equal": True,
        "merge": {"files": len(paths), "entries_in": in_entries, "entries_out": out_entries,
                  "seconds": round(merge_s, 3), "seconds_all": [round(t, 3) for t in merge_ts],
                  "entries_in_per_s": round(in_entries / merge_s), "entries_out_per_s": round(out_entries / merge_s)},
        "loadavg_end": load(),
    }


# ==================================================================================== compact

def _spark():  # type: ignore[no-untyped-def]
    from spark_jobs.jobs.session import get_spark

    t0 = time.perf_counter()
    s = get_spark("local[*]")
    log(f"spark session started in {time.perf_counter() - t0:.1f} s")
    return s


def _rows(rng: np.random.Generator, ids: pa.Array, ts0: int, deleted: np.ndarray | None = None) -> pa.Table:
    from compare_peers import make_rows

    n = len(ids)
    t = make_rows(rng, ids, np.zeros(n, np.int64), ts0 + np.arange(n, dtype=np.int64), max(n, 1), False)
    return t.append_column("is_deleted", pa.array(deleted if deleted is not None else np.zeros(n, bool)))


def _upsert_opts(uri: str, src: str, batch_id: str, buckets: int, **kw):  # type: ignore[no-untyped-def]
    from spark_jobs.jobs.upsert import UpsertOptions

    return UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
                         index="record", num_buckets=buckets, delete_field="is_deleted", batch_id=batch_id, **kw)


def build_spark_table(spark, uri: str, src_dir: Path, rows: int, buckets: int, upserts: int, batch: int,
                      seed: int) -> dict:
    """A record-index table of ``rows`` rows, then ``upserts`` small upserts (40% updates --
    region drawn anew, so most move partition -- 40% new keys, 20% deletes)."""
    from compare_peers import uuid4_strings

    from spark_jobs.jobs.upsert import run_upsert

    rng = np.random.default_rng([seed, rows])
    src_dir.mkdir(parents=True, exist_ok=True)
    ids = uuid4_strings(rng, rows)
    p = src_dir / "base.parquet"
    pq.write_table(_rows(rng, ids, 1_700_000_000_000), p)
    t0 = time.perf_counter()
    run_upsert(spark, _upsert_opts(uri, str(p), "base", buckets))
    build_s = time.perf_counter() - t0
    log(f"[compact] created {uri} with {rows:,} rows in {buckets} index buckets in {build_s:.1f} s")
    live = ids
    ts = 1_800_000_000_000
    up_s = []
    for u in range(upserts):
        n_upd, n_ins = batch * 4 // 10, batch * 4 // 10
        n_del = batch - n_upd - n_ins
        pick = rng.choice(len(live), n_upd + n_del, replace=False)
        new = uuid4_strings(rng, n_ins)
        b_ids = pa.concat_arrays([live.take(pa.array(pick)), new])
        flags = np.zeros(batch, bool)
        flags[n_upd:n_upd + n_del] = True
        t = _rows(rng, b_ids, ts, flags)
        ts += batch
        f = src_dir / f"u{u:03d}.parquet"
        pq.write_table(t, f)
        t0 = time.perf_counter()
        res = run_upsert(spark, _upsert_opts(uri, str(f), f"u{u}", buckets))
        up_s.append(time.perf_counter() - t0)
        keep = np.ones(len(live), bool)
        keep[pick[n_upd:]] = False
        live = pa.concat_arrays([live.filter(pa.array(keep)), new])
        c = res["counts"]
        log(f"[compact] upsert {u + 1}/{upserts}: +{c['inserted']} ~{c['updated']} -{c['deleted']} "
            f"moved {c['moved']} in {up_s[-1]:.1f} s")
    return {"build_s": round(build_s, 1), "upsert_s_median": round(statistics.median(up_s), 2) if up_s else None,
            "live_rows": len(live)}


def _index_state(uri: str) -> dict:
    from spark_jobs.table.table import Table

    t = Table.load(uri)
    v = t.view()
    files = [f for fs in v.index_files.values() for f in fs]
    entries = 0
    for f in files:
        with IndexFile(t.io, t.abs(f)) as x:
            entries += x.num_entries
    per = [len(fs) for fs in v.index_files.values()]
    return {"buckets": len(v.index_files), "files": len(files), "entries": entries,
            "files_per_bucket_max": max(per, default=0), "commits": v.seq}


def run_compact(args, work: Path, spark) -> dict:  # type: ignore[no-untyped-def]
    from spark_jobs.jobs.compact import run_compact as compact
    from spark_jobs.table.action.compact import CompactionPolicy

    uri = str(work / "table")
    pristine = work / "pristine"
    shutil.rmtree(work, ignore_errors=True)
    t_build = time.perf_counter()
    built = build_spark_table(spark, uri, work / "src", args.spark_rows, args.spark_buckets, args.spark_upserts,
                              args.spark_batch, args.seed)
    built["total_s"] = round(time.perf_counter() - t_build, 1)
    shutil.copytree(uri, pristine)
    before = _index_state(uri)
    log(f"[compact] before: {before}")
    policy = CompactionPolicy(min_deltas=args.spark_min_deltas, data=False)
    load_before = load()
    t0 = time.perf_counter()
    res = compact(spark, uri, policy=policy)
    wall = time.perf_counter() - t0
    counts = res["counts"]
    after = _index_state(uri)
    assert after["files_per_bucket_max"] == 1 and after["files"] == before["buckets"], after
    log(f"[compact] in-process run_compact: {counts} in {wall:.2f} s (its total_ms {res['total_ms']}) = "
        f"{counts['index_entries'] / wall:,.0f} entries/s out, {before['entries'] / wall:,.0f} in; after: {after}")
    # cold CLI, each run on a fresh copy of the uncompacted table (the copy not timed)
    cli = shutil.which("bucketindex", path=str(Path(sys.executable).parent)) or "bucketindex"
    cli_s, cli_out = [], None
    for r in range(args.cli_runs):
        target = work / f"cli{r}"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(pristine, target)
        cmd = [cli, "compact", str(target), "--only", "index", "--min-deltas", str(args.spark_min_deltas)]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        cli_s.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
        cli_out = json.loads(next(x for x in p.stdout.splitlines() if x.startswith("{")))
        assert _index_state(str(target))["files_per_bucket_max"] == 1
        shutil.rmtree(target, ignore_errors=True)
        log(f"[compact] cold CLI run {r + 1}/{args.cli_runs}: {cli_s[-1]:.1f} s (its total_ms {cli_out['total_ms']}, "
            f"session start {cli_out.get('session_start_ms')} ms)")
    out = {
        "rows": args.spark_rows, "index_buckets": args.spark_buckets, "upserts": args.spark_upserts,
        "batch_rows": args.spark_batch, "min_deltas": args.spark_min_deltas, "table": built, "before": before,
        "after": after, "counts": counts, "in_process_s": round(wall, 2), "in_process_total_ms": res["total_ms"],
        "entries_out_per_s": round(counts["index_entries"] / wall),
        "entries_in_per_s": round(before["entries"] / wall),
        "loadavg_before": load_before, "loadavg_end": load(),
    }
    if cli_s:
        m = statistics.median(cli_s)
        out["cli"] = {"command": "bucketindex compact TABLE --only index --min-deltas "
                                 f"{args.spark_min_deltas}", "runs": len(cli_s),
                      "wall_s": [round(t, 2) for t in cli_s], "wall_s_median": round(m, 2),
                      "total_ms_last": cli_out["total_ms"], "session_start_ms_last": cli_out.get("session_start_ms"),
                      "entries_out_per_s": round(counts["index_entries"] / m)}
        log(f"[compact] cold CLI median {m:.1f} s = {counts['index_entries'] / m:,.0f} entries/s end to end")
    if not args.keep_spark_table:
        shutil.rmtree(work, ignore_errors=True)
    return out


# ======================================================================================= open

class CommitGenerator:
    """Makes small, realistic commits on a table through the real protocol, no Spark."""

    def __init__(self, uri: str, seed: int, compact_every: int) -> None:
        from spark_jobs.table.table import Table
        from spark_jobs.table.view import encode_schema

        self.uri = uri
        self.table = Table.load(uri)
        self.view = self.table.view()
        assert self.view.schema is not None and self.table.config is not None
        self.schema_b64 = encode_schema(self.view.schema)
        self.num_buckets = self.table.num_buckets(self.view)
        self.rng = random.Random(seed)
        self.compact_every = compact_every
        self.made = 0
        self.compactions = 0

    @property
    def commits(self) -> int:
        return self.view.seq

    def commit(self) -> None:
        from spark_jobs.table.action.transaction import Transaction
        from spark_jobs.table.layout import data_file_name
        from spark_jobs.table.timeline import Action

        t, rng = self.table, self.rng
        batch_id = f"synthetic-{self.view.seq + 1}"
        plan = {"batch_id": batch_id, "operation": "upsert", "source": f"synthetic://{batch_id}",
                "index_type": "record", "num_buckets": self.num_buckets}
        txn = Transaction(t, Action.COMMIT, plan, view=self.view).begin()
        ts = txn.ts
        groups = rng.sample(sorted(self.view.file_groups), rng.choice((1, 2)))
        new_keys = [f"synthetic-{ts}-{j}" for j in range(rng.randint(1, 3))]
        file_groups = []
        for i, key in enumerate(groups):
            s = self.view.file_groups[key]
            ins = len(new_keys) if i == 0 else 0
            rel = posixpath.join(posixpath.dirname(s.path), data_file_name(s.file_id, "0-0-0", ts))
            file_groups.append({"partition": s.partition, "file_id": s.file_id, "path": rel,
                                "num_rows": s.num_rows + ins, "size": s.size + 80 * ins, "removed": False})
        g0 = self.view.file_groups[groups[0]]
        added = []
        buckets = buckets_of(new_keys, self.num_buckets).tolist()
        for b in sorted(set(buckets)):
            ks = [k for k, kb in zip(new_keys, buckets) if kb == b]
            entries = IndexEntries.from_keys(ks, [(g0.partition, g0.file_id)] * len(ks))
            path = t.layout.index_file(b, "delta", ts)
            rel = t.layout.rel(path)
            size = t.write_marked(ts, rel, lambda e=entries, p=path, b=b: write_index_file(
                t.io, p, e, metadata={"instant": ts, "bucket": b}), snapshot_seq=self.view.seq)
            added.append({"bucket": b, "path": rel, "entries": len(ks), "size": size, "kind": "delta"})
        metadata = {
            "action": Action.COMMIT, "instant": ts, "batch_id": batch_id, "operation": "upsert",
            "index_type": "record", "schema": self.schema_b64, "snapshot_seq": self.view.seq, "conflicts": [],
            "file_groups": file_groups, "index": {"added": added, "removed": []},
            "counts": {"inserted": len(new_keys), "updated": rng.randint(0, 40), "deleted": 0, "moved": 0,
                       "rows_in_batch": len(new_keys) + 40},
            "num_buckets": self.num_buckets,
            "timings_ms": {k: rng.randint(5, 3000) for k in ("validate_ms", "dedupe_ms", "tag_ms", "write_ms",
                                                             "index_ms", "commit_ms", "total_ms")},
        }
        done = txn.commit(metadata)
        self.view.apply(done, metadata)
        self.view.seq = done.seq or self.view.seq
        self.made += 1
        if self.compact_every and self.made % self.compact_every == 0:
            self.compact()

    def compact(self) -> None:
        """An index compaction at the default policy, scheduled and executed for real (the
        Spark task's body run in this process)."""
        from spark_jobs.kernels import tasks
        from spark_jobs.table.action.compact import (
            DEFAULT_INDEX_BASE_CAP,
            CompactionPolicy,
            compaction_metadata,
            schedule_compaction,
        )
        from spark_jobs.table.action.service import execute
        from spark_jobs.table.timeline import Action

        planned = schedule_compaction(self.table, CompactionPolicy(data=False))
        if planned is not None:
            def work(txn):  # type: ignore[no-untyped-def]
                rows = [{"bucket": int(b["bucket"]), "files": b["files"], "sealed": b.get("sealed", [])}
                        for b in txn.plan["index_buckets"]]
                batch = pa.RecordBatch.from_pylist(rows, schema=pa.schema([("bucket", pa.int32()),
                                                                            ("files", pa.list_(pa.string())),
                                                                            ("sealed", pa.list_(pa.string()))]))
                cap = int(txn.plan.get("index_base_cap") or DEFAULT_INDEX_BASE_CAP)
                written = [r for out in tasks.compact_index_buckets([batch], table_uri=self.uri, instant=txn.ts,
                                                                    attempt=txn.attempt, snapshot_seq=txn.view.seq,
                                                                    cap=cap)
                           for r in out.to_pylist()]
                return compaction_metadata(txn.ts, txn.plan, [], written)

            execute(self.table, planned["instant"], Action.COMPACTION, work)
            self.compactions += 1
        self.view = self.table.view()


def make_open_base(spark, uri: str, src: Path, rows: int, buckets: int, seed: int) -> None:
    from compare_peers import uuid4_strings

    from spark_jobs.jobs.upsert import run_upsert

    rng = np.random.default_rng([seed, 3])
    src.mkdir(parents=True, exist_ok=True)
    p = src / "open-base.parquet"
    pq.write_table(_rows(rng, uuid4_strings(rng, rows), 1_700_000_000_000), p)
    run_upsert(spark, _upsert_opts(uri, str(p), "base", buckets, target_file_rows=max(rows // 24, 100)))


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def open_breakdown(uri: str) -> dict:
    """Where a warm open spends its time: listing, reading the entries, parsing them, replaying."""
    import re

    from spark_jobs.table.layout import TableLayout
    from spark_jobs.table.table import Table
    from spark_jobs.table.view import FileSystemView, decode_schema

    io, root = resolve(uri)
    layout = TableLayout(root)
    t0 = time.perf_counter()
    seq_names = [n for n in io.list_names(layout.sequence) if re.match(r"^\d{20}\.json$", n)]
    tl_names = io.list_names(layout.timeline)
    t1 = time.perf_counter()
    raw = [io.read_bytes(posixpath.join(layout.sequence, n)) for n in seq_names]
    t2 = time.perf_counter()
    entries = [json.loads(b) for b in raw]
    t3 = time.perf_counter()
    tl = Table.load(uri).timeline
    t4 = time.perf_counter()
    FileSystemView.build(tl)
    t5 = time.perf_counter()
    n_schema = 0
    for e in entries:
        if e["metadata"].get("schema"):
            decode_schema(e["metadata"]["schema"])
            n_schema += 1
    t6 = time.perf_counter()
    return {"list_ms": round((t1 - t0) * 1000, 2), "read_ms": round((t2 - t1) * 1000, 2),
            "json_ms": round((t3 - t2) * 1000, 2), "replay_ms": round((t5 - t4) * 1000, 2),
            "decode_schema_ms": round((t6 - t5) * 1000, 2), "entries": len(seq_names),
            "timeline_files": len(tl_names), "sequence_bytes": sum(len(b) for b in raw),
            "timeline_calls_per_open": "Table.load lists both dirs and reads every entry; view() lists both again"}


COLD_CODE = r"""
import json, sys, time
t0 = time.perf_counter()
from spark_jobs.table.table import Table
t1 = time.perf_counter()
t = Table.load(sys.argv[1])
t2 = time.perf_counter()
v = t.view()
t3 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1000, "load_ms": (t2 - t1) * 1000, "view_ms": (t3 - t2) * 1000,
                  "seq": v.seq, "file_groups": len(v.file_groups)}))
"""


def time_open(uri: str, args) -> dict:
    from spark_jobs.table.table import Table

    # warm: in this process (files in the page cache), median of --open-runs
    v = Table.load(uri).view()
    warm, load_t, view_t = [], [], []
    gc.collect()
    for _ in range(args.open_runs):
        t0 = time.perf_counter()
        t = Table.load(uri)
        t1 = time.perf_counter()
        v = t.view()
        t2 = time.perf_counter()
        warm.append(t2 - t0)
        load_t.append(t1 - t0)
        view_t.append(t2 - t1)
    # cold: a fresh process importing the core and opening the table; and `bucketindex show`
    cli = shutil.which("bucketindex", path=str(Path(sys.executable).parent)) or "bucketindex"
    cold, inner, show = [], [], []
    for r in range(args.cold_runs + 1):  # the first is a warm-up (imports into the page cache)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", COLD_CODE, uri], capture_output=True, text=True, cwd=ROOT,
                           timeout=600)
        el = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(p.stderr[-2000:])
        t0 = time.perf_counter()
        s = subprocess.run([cli, "show", uri], capture_output=True, text=True, timeout=600)
        el_show = time.perf_counter() - t0
        if s.returncode != 0:
            raise RuntimeError(s.stderr[-2000:])
        if r:
            cold.append(el)
            inner.append(json.loads(p.stdout.strip().splitlines()[-1]))
            show.append(el_show)
    return {
        "commits": v.seq, "file_groups": len(v.file_groups),
        "index_files": sum(len(fs) for fs in v.index_files.values()),
        "warm_ms": med_ms(warm), "warm_load_ms": med_ms(load_t), "warm_view_ms": med_ms(view_t),
        "warm_ms_min": round(min(warm) * 1000, 2), "warm_ms_max": round(max(warm) * 1000, 2),
        "cold_process_ms": med_ms(cold),
        "cold_inner_ms": {k: round(statistics.median(x[k] for x in inner), 1)
                          for k in ("import_ms", "load_ms", "view_ms")},
        "show_process_ms": med_ms(show),
        "breakdown": open_breakdown(uri),
    }


def run_open(args, work: Path, spark_factory) -> dict:  # type: ignore[no-untyped-def]
    counts = sorted(args.commits)
    keep = Path(args.keep) if args.keep else work / "open"
    keep.mkdir(parents=True, exist_ok=True)
    meta_file = keep / "generation.json"
    gen_meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    tables = {c: keep / f"commits_{c}" for c in counts}
    missing = [c for c in counts if not (tables[c] / ".bucketindex" / "table.json").exists()
               or str(c) not in gen_meta.get("tables", {})]
    gen: dict = gen_meta.get("tables", {})
    if missing:
        # one chain of commits; a copy of the table is kept at each count (copies not timed)
        chain = keep / "chain"
        shutil.rmtree(chain, ignore_errors=True)
        # resume from the largest kept table below the first missing count, if any
        have = [int(c) for c in gen if int(c) < min(missing) and (keep / f"commits_{c}").exists()]
        base_s = gen_meta.get("base_s")
        if have:
            c0 = max(have)
            shutil.copytree(keep / f"commits_{c0}", chain)
            log(f"[open] resuming generation from the kept {c0:,}-commit table")
        else:
            t0 = time.perf_counter()
            make_open_base(spark_factory(), str(chain), work / "open-src", args.open_rows, args.open_buckets,
                           args.seed)
            base_s = round(time.perf_counter() - t0, 1)
            log(f"[open] base table created by a real upsert in {base_s:.1f} s")
        g = CommitGenerator(str(chain), args.seed + len(have), args.compact_every)
        spent = 0.0
        if have:
            prev = gen[str(c0)]
            spent = float(prev["generation_s"])
            g.compactions = int(prev["compactions"])
            g.made = int(prev["commits"]) - 1 - g.compactions  # sequence entries minus the base upsert
        window_t, window_n = time.perf_counter(), 0
        for c in counts:
            if c not in missing:  # kept from an earlier run
                continue
            while g.commits < c:
                t0 = time.perf_counter()
                g.commit()
                spent += time.perf_counter() - t0
                window_n += 1
                if time.perf_counter() - window_t > 30:
                    log(f"[open] {g.commits:,} commits ({g.compactions} compactions), "
                        f"{window_n / (time.perf_counter() - window_t):.1f} commits/s lately, {spent:.0f} s so far")
                    window_t, window_n = time.perf_counter(), 0
                if args.gen_budget_s and spent > args.gen_budget_s:
                    break
            if g.commits < c:
                log(f"[open] generation budget {args.gen_budget_s} s spent at {g.commits:,} commits; "
                    f"stopping before {c:,}; keeping the table at {g.commits:,}")
                c = g.commits
                tables[c] = keep / f"commits_{c}"
                counts.append(c)
            shutil.rmtree(tables[c], ignore_errors=True)
            shutil.copytree(chain, tables[c])
            gen[str(c)] = {"commits": g.commits, "generation_s": round(spent, 1), "compactions": g.compactions,
                           "metadata_bytes": _tree_bytes(tables[c] / ".bucketindex" / "sequence"),
                           "timeline_bytes": _tree_bytes(tables[c] / ".bucketindex" / "timeline"),
                           "compact_every": args.compact_every}
            log(f"[open] {c:,} commits reached after {spent:.1f} s of generation ({g.compactions} compactions)")
            if c == g.commits and c not in args.commits:
                break
        shutil.rmtree(chain, ignore_errors=True)
        meta_file.write_text(json.dumps({"tables": gen, "base_s": base_s}, indent=1))
    else:
        log(f"[open] reusing the tables in {keep}")
    results = {}
    for c in sorted(set(counts)):
        if str(c) not in gen:
            continue
        r = time_open(str(tables[c]), args)
        r["generation"] = gen[str(c)]
        r["loadavg"] = load()
        results[str(c)] = r
        log(f"[open] {c:>6,} commits: warm {r['warm_ms']:.1f} ms (load {r['warm_load_ms']:.1f} + view "
            f"{r['warm_view_ms']:.1f}), cold process {r['cold_process_ms']:.0f} ms (inside: {r['cold_inner_ms']}), "
            f"`bucketindex show` {r['show_process_ms']:.0f} ms; breakdown {r['breakdown']}")
    done = [int(c) for c in results]
    out: dict = {"tables": results, "kept_in": str(keep) if args.keep else None}
    if len(done) >= 2:
        lo, hi = str(min(done)), str(max(done))
        out["ratio_largest_vs_smallest"] = {
            "commits": f"{hi} vs {lo}",
            "warm": round(results[hi]["warm_ms"] / results[lo]["warm_ms"], 2),
            "cold_process": round(results[hi]["cold_process_ms"] / results[lo]["cold_process_ms"], 2),
            "show_process": round(results[hi]["show_process_ms"] / results[lo]["show_process_ms"], 2),
        }
        out["goal"] = "largest vs smallest within 2x (once timeline checkpoints exist)"
        log(f"[open] ratio {hi} vs {lo} commits: {out['ratio_largest_vs_smallest']}")
    if not args.keep:
        shutil.rmtree(keep, ignore_errors=True)
    return out


# ======================================================================================= main

def _code_version() -> dict:
    """Which spark_jobs was measured (a benchmark of a tree others are editing must say)."""
    import spark_jobs

    where = Path(spark_jobs.__file__).resolve().parents[1]
    out: dict = {"spark_jobs": str(where), "git_head": os.environ.get("BENCH_CODE_REV")}
    try:
        out["git_head"] = out["git_head"] or subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "spark_jobs"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        out["spark_jobs_modified"] = bool(dirty)
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run of every part in a few minutes")
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--deltas", type=int, default=50)
    p.add_argument("--delta-min", type=int, default=2_000)
    p.add_argument("--delta-max", type=int, default=20_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--merge-runs", type=int, default=3)
    p.add_argument("--delta-sweep", type=ints, default=[0, 1, 2, 5, 10, 20, 30, 50])
    p.add_argument("--spark-rows", type=int, default=1_000_000)
    p.add_argument("--spark-buckets", type=int, default=16)
    p.add_argument("--spark-upserts", type=int, default=20)
    p.add_argument("--spark-batch", type=int, default=10_000)
    p.add_argument("--spark-min-deltas", type=int, default=2)
    p.add_argument("--cli-runs", type=int, default=3)
    p.add_argument("--keep-spark-table", action="store_true")
    p.add_argument("--commits", type=ints, default=[10, 1000, 10000])
    p.add_argument("--compact-every", type=int, default=100,
                   help="run an index compaction (default policy) every N generated commits; 0: never")
    p.add_argument("--gen-budget-s", type=float, default=0,
                   help="stop generating commits after this many seconds (0: no limit)")
    p.add_argument("--open-rows", type=int, default=20_000)
    p.add_argument("--open-buckets", type=int, default=16)
    p.add_argument("--open-runs", type=int, default=7)
    p.add_argument("--cold-runs", type=int, default=5)
    p.add_argument("--keep", default=None, help="keep the generated open-table tables here (and reuse them)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    if args.quick:
        for k, v in dict(entries=100_000, deltas=10, delta_min=200, delta_max=2_000, keys=10_000, runs=3,
                         merge_runs=1, delta_sweep=[0, 2, 5, 10], spark_rows=20_000, spark_buckets=4,
                         spark_upserts=3, spark_batch=1_000, cli_runs=1, commits=[10, 100, 300], compact_every=50,
                         open_rows=2_000, open_runs=3, cold_runs=2).items():
            if p.get_default(k) == getattr(args, k):
                setattr(args, k, v)
    parts = [x for x in args.parts.split(",") if x]
    bad = set(parts) - set(PARTS)
    if bad:
        p.error(f"unknown parts {sorted(bad)}; choose from {PARTS}")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bi-services-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result: dict = {"benchmark": "table_services", "quick": args.quick, "parts": parts,
                    "env": {"cpu": cpu_model(), "cores": os.cpu_count(), "mem_gb": mem_total_gb(),
                            "python": platform.python_version(), "loadavg_start": load()},
                    "code": _code_version()}
    log(f"table services benchmark: parts {parts}, work dir {work}, load {load()}")
    spark = None

    def spark_factory():  # type: ignore[no-untyped-def]
        nonlocal spark
        if spark is None:
            spark = _spark()
        return spark

    t0 = time.perf_counter()
    if "lookup" in parts:
        result["lookup"] = run_lookup(args, work / "lookup")
        result["lookup"]["part_s"] = round(time.perf_counter() - t0, 1)
        shutil.rmtree(work / "lookup", ignore_errors=True)
    if "compact" in parts:
        t0 = time.perf_counter()
        result["compact"] = run_compact(args, work / "compact", spark_factory())
        result["compact"]["part_s"] = round(time.perf_counter() - t0, 1)
    if "open" in parts:
        t0 = time.perf_counter()
        result["open"] = run_open(args, work, spark_factory)
        result["open"]["part_s"] = round(time.perf_counter() - t0, 1)
    result["env"]["loadavg_end"] = load()
    result["runtime_s"] = round(time.perf_counter() - started, 1)
    if spark is not None:
        spark.stop()
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    emit_result(result, args.json_out)


if __name__ == "__main__":
    main()
