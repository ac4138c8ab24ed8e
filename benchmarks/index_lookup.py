"""RFC-08's HFile experiment for the record index: look up a batch of keys in one index bucket.

RFC-08 measured an HFile-backed record index at ~600 ms to look up 100k keys in a bucket of
1M entries. This script builds one such bucket with ``spark_jobs.index.record_index`` --
``--entries`` random UUID4 keys mapped to (partition, file id) locations -- and times
``lookup`` in each mode (seek, scan, auto) from the batch's key *strings*, so hashing the
batch is part of every figure, and every call opens the bucket's files anew.

* headline: ``--keys`` existing keys, median of at least ``--runs`` timed runs after a
  warm-up, the three modes interleaved within each repetition (cycling through all six
  orders of the three, so each mode follows the cache-flushing scan equally often);
* sweep: the same at each batch size of ``--sweep`` (more runs below 10k keys);
* a realistic bucket state, base + 3 deltas (~1% of the entries each: updates to new
  locations, tombstones, new keys), checked against an oracle, reported separately;
* the same lookups through the generic (not memory-mapped) FileIO, with the number of read
  requests each mode issues -- the basis of ``auto``'s rule on HDFS / object stores.

Every mode's result is checked once per batch size (all keys found, every target equal to
the expected location). Progress goes to stdout; the last line is one JSON object.

    python benchmarks/index_lookup.py [--entries 1000000] [--keys 100000] [--runs 7]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark_jobs.index.hashing import fingerprints  # noqa: E402
from spark_jobs.index.record_index import (  # noqa: E402
    BLOCK_ROWS,
    IndexEntries,
    IndexFile,
    lookup,
    merge_entries,
    write_index_file,
)
from spark_jobs.io.filesystem import resolve  # noqa: E402
from machine_info import cpu_model, machine, mem_total_gb  # noqa: E402 (benchmarks/ is on sys.path)
from index_common import Checker, CountingFileIO, log, make_locations  # noqa: E402

MODES = ("seek", "scan", "auto")
ORDERS = list(itertools.permutations(MODES))
PARTITIONS = 20
FILES_PER_PARTITION = 50


def uuid4_strings(n: int, rng: random.Random) -> list[str]:
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]


def time_modes(io, paths, keys, runs: int, checker: Checker, expected: np.ndarray, what: str) -> dict:
    """Warm up and verify every mode, then time ``runs`` interleaved repetitions (median, ms)."""
    chosen = None
    for mode in MODES:  # warm-up + full verification of every mode
        res = lookup(io, paths, keys, mode=mode)
        checker.check(res, expected, f"{what} mode={mode}")
        if mode == "auto":
            chosen = res.mode
    # every order of the three modes equally often (runs rounded up to a multiple of 6), so
    # each mode runs equally often right after each other mode (scan evicts caches)
    runs = -(-runs // len(ORDERS)) * len(ORDERS)
    times = {m: [] for m in MODES}
    gc.collect()
    for r in range(runs):
        for mode in ORDERS[r % len(ORDERS)]:
            t0 = time.perf_counter()
            lookup(io, paths, keys, mode=mode)
            times[mode].append(time.perf_counter() - t0)
    med = {m: statistics.median(v) * 1000 for m, v in times.items()}
    return {
        "seek_ms": round(med["seek"], 3),
        "scan_ms": round(med["scan"], 3),
        "auto_ms": round(med["auto"], 3),
        "auto_mode": chosen,
        "runs": runs,
    }


def time_hash(keys, runs: int) -> float:
    fingerprints(keys)
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fingerprints(keys)
        ts.append(time.perf_counter() - t0)
    return round(statistics.median(ts) * 1000, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--sweep", default="100,1000,10000,100000,300000,1000000")
    ap.add_argument("--block-rows", type=int, default=BLOCK_ROWS)
    ap.add_argument("--workdir", default=None, help="default: a temporary directory, deleted at the end")
    ap.add_argument("--seed", type=int, default=8)
    args = ap.parse_args()
    if args.runs < 5:
        ap.error("--runs must be at least 5")
    if args.keys > args.entries:
        ap.error("--keys must not exceed --entries (the headline looks up existing keys)")
    sweep = sorted({min(int(s), args.entries) for s in args.sweep.split(",") if s.strip()})

    t_start = time.perf_counter()
    own_workdir = args.workdir is None
    workdir = tempfile.mkdtemp(prefix="index_lookup_") if own_workdir else args.workdir
    io, root = resolve(workdir)
    io.mkdirs(root)
    bucket = f"{root}/.bucketindex/index/bucket=00000"
    io.mkdirs(bucket)
    try:
        run(args, sweep, io, bucket, t_start)
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def run(args, sweep: list[int], io, bucket: str, t_start: float) -> None:
    rng = random.Random(args.seed)
    nrng = np.random.default_rng(args.seed)
    n = args.entries
    log(f"python {platform.python_version()}, pyarrow {pa.__version__}, numpy {np.__version__}, "
        f"{os.cpu_count()} cpus ({cpu_model()}), {mem_total_gb()} GB RAM")

    # ---- the base file -----------------------------------------------------------------
    t0 = time.perf_counter()
    keys = uuid4_strings(n, rng)
    base_locs = make_locations("0", PARTITIONS, FILES_PER_PARTITION)
    loc_of = nrng.integers(0, len(base_locs), size=n)  # global location index per key
    entries = IndexEntries.from_keys(keys, [base_locs[i] for i in loc_of.tolist()])
    t_build = time.perf_counter() - t0
    base = f"{bucket}/base_00000000000001.idx"
    t0 = time.perf_counter()
    size = write_index_file(io, base, entries, block_rows=args.block_rows, metadata={"instant": "1"})
    t_write = time.perf_counter() - t0
    del entries
    with IndexFile(io, base) as f:
        blocks = f.num_blocks
    bytes_per_entry = size / n
    log(f"base file: {n:,} entries, {len(base_locs)} locations, {blocks} blocks of {args.block_rows:,} rows, "
        f"{size:,} bytes = {bytes_per_entry:.2f} bytes/entry (keys+hash {t_build:.1f} s, write {t_write:.2f} s)")
    checker = Checker(base_locs)

    def sample(k: int) -> tuple[list[str], np.ndarray]:
        idx = nrng.choice(n, size=k, replace=False)
        return [keys[i] for i in idx.tolist()], loc_of[idx]

    # ---- headline ------------------------------------------------------------------------
    q, exp = sample(args.keys)
    head = time_modes(io, [base], q, args.runs, checker, exp, f"headline {args.keys}")
    hash_ms = time_hash(q, max(args.runs, 5))
    log(f"headline {args.keys:,} keys ({head['runs']} runs): seek {head['seek_ms']:.1f} ms, "
        f"scan {head['scan_ms']:.1f} ms, auto {head['auto_ms']:.1f} ms (-> {head['auto_mode']}); "
        f"hashing alone {hash_ms:.1f} ms")

    # ---- sweep -------------------------------------------------------------------------
    rows = []
    for k in sweep:
        q, exp = sample(k)
        runs = max(args.runs, 15) if k < 10_000 else args.runs
        r = time_modes(io, [base], q, runs, checker, exp, f"sweep {k}")
        r = {"keys": k, **r, "hash_ms": time_hash(q, runs)}
        best = min(r["seek_ms"], r["scan_ms"])
        r["auto_overhead_pct"] = round(100 * (r["auto_ms"] - best) / best, 2)
        rows.append(r)
        log(f"sweep {k:>9,} keys ({r['runs']:>2} runs): seek {r['seek_ms']:9.2f} ms  scan {r['scan_ms']:9.2f} ms  "
            f"auto {r['auto_ms']:9.2f} ms (-> {r['auto_mode']}, {r['auto_overhead_pct']:+.1f}% vs best)  "
            f"hash {r['hash_ms']:8.2f} ms  scan/seek {r['scan_ms'] / r['seek_ms']:.2f}x")
    worst = max(r["auto_overhead_pct"] for r in rows) if rows else None
    by_k = {r["keys"]: r for r in rows}
    if 1000 in by_k:
        lookup_1k = by_k[1000]["auto_ms"]
    else:
        q, exp = sample(min(1000, n))
        lookup_1k = time_modes(io, [base], q, max(args.runs, 15), checker, exp, "1k")["auto_ms"]

    # ---- base + 3 deltas -------------------------------------------------------------------
    delta_locs = make_locations("d", PARTITIONS, 5)  # files written by later commits
    all_locs = base_locs + delta_locs
    checker_d = Checker(all_locs)
    all_keys = list(keys)
    cur = loc_of.copy()  # newest location per key of all_keys, -1 = deleted
    paths = [base]
    per_delta = max(1, n // 100)
    delta_bytes = 0
    for d in range(3):
        n_upd, n_del = int(per_delta * 0.6), int(per_delta * 0.2)
        n_new = per_delta - n_upd - n_del
        touched = nrng.choice(len(all_keys), size=n_upd + n_del, replace=False)  # may hit earlier deltas' keys
        upd, dele = touched[:n_upd], touched[n_upd:]
        new_keys = uuid4_strings(n_new, rng)
        new_ids = np.arange(len(all_keys), len(all_keys) + n_new)
        all_keys += new_keys
        new_locs_upd = len(base_locs) + nrng.integers(0, len(delta_locs), size=n_upd)  # includes partition moves
        new_locs_ins = len(base_locs) + nrng.integers(0, len(delta_locs), size=n_new)
        d_keys = [all_keys[i] for i in upd.tolist()] + [all_keys[i] for i in dele.tolist()] + new_keys
        d_targets = (
            [all_locs[i] for i in new_locs_upd.tolist()] + [None] * n_del + [all_locs[i] for i in new_locs_ins.tolist()]
        )
        cur = np.concatenate([cur, np.full(n_new, -1, dtype=cur.dtype)])
        cur[upd] = new_locs_upd
        cur[dele] = -1
        cur[new_ids] = new_locs_ins
        p = f"{bucket}/delta_{d + 2:014d}.idx"
        delta_bytes += write_index_file(io, p, IndexEntries.from_keys(d_keys, d_targets), block_rows=args.block_rows)
        paths.append(p)
    # query: existing-or-ever-existing keys, so deleted keys (expected absent) and keys from
    # every file take part
    idx = nrng.choice(len(all_keys), size=args.keys, replace=False)
    qd = [all_keys[i] for i in idx.tolist()]
    exp_d = cur[idx]
    dl = time_modes(io, paths, qd, args.runs, checker_d, exp_d, "base+3 deltas")
    t0 = time.perf_counter()
    merged = merge_entries(io, paths)
    merge_ms = (time.perf_counter() - t0) * 1000
    if len(merged) != int(np.count_nonzero(cur >= 0)):
        raise AssertionError(f"merge_entries: {len(merged)} live entries, expected {int(np.count_nonzero(cur >= 0))}")
    log(f"base + 3 deltas ({per_delta:,} entries each, {delta_bytes:,} delta bytes), {args.keys:,} keys incl. "
        f"{int(np.count_nonzero(exp_d < 0)):,} deleted: seek {dl['seek_ms']:.1f} ms, scan {dl['scan_ms']:.1f} ms, "
        f"auto {dl['auto_ms']:.1f} ms (-> {dl['auto_mode']}); merge_entries {merge_ms:.0f} ms "
        f"({len(merged):,} live entries, checked)")
    del merged

    # ---- without a memory map (the generic FileIO, as for HDFS / S3) ---------------------------
    cio = CountingFileIO()
    nomap = []
    for k in sorted({min(10, n), min(1000, n), args.keys}):
        q, exp = sample(k)
        r = time_modes(cio, [base], q, args.runs, checker, exp, f"no-mmap {k}")
        for mode in MODES:
            cio.counter.update(reads=0, bytes=0)
            lookup(cio, [base], q, mode=mode)
            r[f"{mode}_reads"] = cio.counter["reads"]
            r[f"{mode}_read_mb"] = round(cio.counter["bytes"] / 1e6, 2)
        nomap.append({"keys": k, **r})
        log(f"no mmap {k:>7,} keys: seek {r['seek_ms']:.2f} ms / {r['seek_reads']} reads / {r['seek_read_mb']} MB, "
            f"scan {r['scan_ms']:.2f} ms / {r['scan_reads']} reads / {r['scan_read_mb']} MB, "
            f"auto {r['auto_ms']:.2f} ms (-> {r['auto_mode']})")

    elapsed = time.perf_counter() - t_start
    log(f"done in {elapsed:.0f} s")
    out = {
        "benchmark": "index_lookup",
        "lookup_100k_ms": head["auto_ms"],
        "lookup_1k_ms": lookup_1k,
        "seek_100k_ms": head["seek_ms"],
        "scan_100k_ms": head["scan_ms"],
        "auto_100k_mode": head["auto_mode"],
        "hash_100k_ms": hash_ms,
        "bytes_per_entry": round(bytes_per_entry, 3),
        "index_bytes": size,
        "auto_worst_overhead_pct": worst,
        "sweep": rows,
        "lookup_100k_with_3_deltas_ms": dl["auto_ms"],
        "deltas": {**dl, "delta_entries_each": per_delta, "delta_bytes": delta_bytes, "merge_entries_ms": round(merge_ms, 1)},
        "no_mmap": nomap,
        "entries": n,
        "keys": args.keys,
        "runs": args.runs,
        "headline_runs": head["runs"],
        "block_rows": args.block_rows,
        "blocks": blocks,
        "locations": len(base_locs),
        **machine(),
        "elapsed_s": round(elapsed, 1),
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
