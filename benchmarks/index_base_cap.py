"""The record index's base cap (RFC-08 option 1): one big base per bucket, or sealed bases of ``cap``?

Index compaction rewrites a bucket's base with its deltas folded in. Without a cap the base
grows with the bucket, and so does every compaction of it (RFC-08: "at some point we could
have 2M entries or greater in one HFile which might give us bad performance"). With a cap,
a base past it is sealed and never rewritten: compaction rewrites only the open base (at
most ``cap`` entries), and lookups open ``ceil(N / cap)`` bases instead of one.

For each bucket size N in ``--sizes`` and each cap in ``--caps`` with cap <= N (cap = N is
"no cap": one base), this script builds the bucket as ``ceil(N / cap)`` index files of random
fingerprints (1,000 locations, so ``loc`` is int16), with ``--keys`` / 2 known keys spread
over them, and measures:

* **lookup**: ``record_index.lookup`` of ``--keys`` key strings (half present, half absent;
  hashing included, every call opens the files anew, as an upsert's tagging does), median
  of ``--runs`` runs, the caps of one size interleaved; every run checked (the present keys
  found at their locations, the absent ones not);
* **compaction**: what one compaction of the bucket does -- ``compact_entries`` of the open
  base (``cap`` entries: the worst case, just below sealing) and 10 deltas of 10k entries
  (30% updates to new locations, 10% tombstones, 60% new keys), with the other bases as
  sealed ones, then ``write_index_file`` -- median time of ``--merge-runs`` runs in a fresh
  child process per configuration, and that process's peak RSS growth over its RSS before
  the first merge (what a Spark task's Python worker needs on top of its start).

Progress goes to stdout; the last line is one JSON object (DESIGN §5).

    python benchmarks/index_base_cap.py [--sizes 1000000,2000000,4000000,8000000] [--keys 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark_jobs.index.hashing import fingerprints  # noqa: E402
from spark_jobs.index.record_index import IndexEntries, compact_entries, lookup, write_index_file  # noqa: E402
from spark_jobs.io.filesystem import resolve  # noqa: E402
from machine_info import cpu_model, mem_total_gb  # noqa: E402 (benchmarks/ is on sys.path)
from results import emit_result  # noqa: E402
from index_common import status_kb as _status_kb  # noqa: E402

LOCATIONS = [(f"region={i % 8}", f"fg-{i:05d}") for i in range(1000)]
DELTAS, DELTA_ENTRIES = 10, 10_000


def _entries(hi: np.ndarray, lo: np.ndarray, rng: np.random.Generator) -> IndexEntries:
    loc = rng.integers(0, len(LOCATIONS), hi.size).astype(np.int32)
    return IndexEntries(hi, lo, loc, list(LOCATIONS))


def build(root: Path, n: int, cap: int, keys: list[str], seed: int) -> dict:
    """A bucket of ``n`` entries as ceil(n / cap) bases (the last one open) plus the deltas."""
    rng = np.random.default_rng(seed)
    io, _ = resolve(str(root))
    hi = rng.integers(0, 2**64, n, dtype=np.uint64)
    lo = rng.integers(0, 2**64, n, dtype=np.uint64)
    khi, klo = fingerprints(keys)
    at = rng.choice(n, len(keys), replace=False)  # the known keys, spread over all bases
    hi[at], lo[at] = khi, klo
    e = _entries(hi, lo, rng)
    expected = [LOCATIONS[i] for i in e.loc[at].tolist()]
    bases = []
    for j, start in enumerate(range(0, n, cap)):
        sl = slice(start, start + cap)
        path = str(root / f"base_{j:03d}.arrow")
        write_index_file(io, path, IndexEntries(e.fp_hi[sl], e.fp_lo[sl], e.loc[sl], e.locations),
                         metadata={"sealed": start + cap < n})
        bases.append(path)
    # deltas on the open base's keys (updates, tombstones) and new keys
    open_lo = (len(bases) - 1) * cap
    deltas = []
    for d in range(DELTAS):
        k = DELTA_ENTRIES
        old = rng.choice(np.arange(open_lo, n), int(k * 0.4), replace=False)
        nhi = np.concatenate([e.fp_hi[old], rng.integers(0, 2**64, k - old.size, dtype=np.uint64)])
        nlo = np.concatenate([e.fp_lo[old], rng.integers(0, 2**64, k - old.size, dtype=np.uint64)])
        de = _entries(nhi, nlo, rng)
        de.loc[int(k * 0.3):old.size] = -1  # 10% tombstones
        path = str(root / f"delta_{d:03d}.arrow")
        write_index_file(io, path, de)
        deltas.append(path)
    return {"bases": bases, "deltas": deltas, "expected": expected}


def time_lookup(paths: list[str], keys: list[str], present: int, expected: list) -> float:
    io, _ = resolve(paths[0])
    t0 = time.perf_counter()
    res = lookup(io, paths, keys)
    ms = (time.perf_counter() - t0) * 1000
    assert res.found[:present].all() and not res.found[present:].any(), "lookup result is wrong"
    assert [res.target(i) for i in range(present)] == expected, "lookup found a wrong location"
    return ms


def merge_child(args: argparse.Namespace) -> None:
    """In a fresh process: compact the open base + deltas above the sealed bases, ``runs`` times."""
    spec = json.loads(Path(args.child).read_text())
    io, _ = resolve(spec["out"])
    sealed, files = spec["bases"][:-1], [spec["bases"][-1], *spec["deltas"]]
    rss0 = _status_kb("VmRSS")
    times, entries = [], 0
    for r in range(args.merge_runs):
        t0 = time.perf_counter()
        merged = compact_entries(io, files, sealed=sealed)
        write_index_file(io, f"{spec['out']}_{r}.arrow", merged)
        times.append((time.perf_counter() - t0) * 1000)
        entries = len(merged)
        del merged
        os.remove(f"{spec['out']}_{r}.arrow")
    peak = _status_kb("VmHWM")
    print(json.dumps({"merge_ms": round(statistics.median(times), 1), "runs_ms": [round(t, 1) for t in times],
                      "peak_rss_growth_mb": round((peak - rss0) / 1024, 1), "entries_out": entries}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,2000000,4000000,8000000")
    ap.add_argument("--caps", default="1000000,2000000,4000000,8000000")
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--merge-runs", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return merge_child(args)
    started = time.perf_counter()
    sizes = [int(x) for x in args.sizes.split(",")]
    caps = [int(x) for x in args.caps.split(",")]
    present = args.keys // 2
    keys = [f"order-{i:012d}" for i in range(args.keys)]  # the first half is in the bucket
    t0 = time.perf_counter()
    fingerprints(keys)
    hash_ms = (time.perf_counter() - t0) * 1000
    tmp = Path(tempfile.mkdtemp(prefix="index_base_cap_"))
    rows = []
    try:
        for n in sizes:
            layouts = {}
            for cap in [c for c in caps if c < n] + [n]:
                d = tmp / f"n{n}_c{cap}"
                d.mkdir()
                layouts[cap] = build(d, n, cap, keys[:present], seed=n // 1000 + cap // 1000)
                print(f"built N={n:,} cap={cap:,}: {len(layouts[cap]['bases'])} bases", flush=True)
            lk: dict[int, list[float]] = {c: [] for c in layouts}
            for r in range(args.runs + 1):  # the first round warms the page cache, not counted
                order = list(layouts) if r % 2 == 0 else list(reversed(layouts))
                for cap in order:
                    ms = time_lookup(layouts[cap]["bases"], keys, present, layouts[cap]["expected"])
                    if r:
                        lk[cap].append(ms)
            for cap, lay in layouts.items():
                spec = tmp / f"spec_{n}_{cap}.json"
                spec.write_text(json.dumps({**lay, "expected": None, "out": str(tmp / f"merged_{n}_{cap}")}))
                p = subprocess.run([sys.executable, __file__, "--child", str(spec), "--merge-runs",
                                    str(args.merge_runs)], capture_output=True, text=True, check=True)
                m = json.loads(p.stdout.strip().splitlines()[-1])
                row = {"entries": n, "cap": cap if cap < n else None, "bases": len(lay["bases"]),
                       "open_base_entries": n - (len(lay["bases"]) - 1) * cap,
                       "lookup_ms": round(statistics.median(lk[cap]), 1),
                       "lookup_runs_ms": [round(x, 1) for x in lk[cap]], **m}
                rows.append(row)
                print(f"N={n:>9,} cap={str(row['cap']):>9} bases={row['bases']}: lookup {row['lookup_ms']:7.1f} ms, "
                      f"compaction {row['merge_ms']:7.1f} ms, peak +{row['peak_rss_growth_mb']} MB", flush=True)
            shutil.rmtree(tmp / f"n{n}_c{n}", ignore_errors=True)
            for cap in layouts:
                shutil.rmtree(tmp / f"n{n}_c{cap}", ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    emit_result({"benchmark": "index_base_cap", "keys": args.keys, "runs": args.runs,
                 "deltas": f"{DELTAS}x{DELTA_ENTRIES}", "hash_ms": round(hash_ms, 1), "rows": rows,
                 "env": {"cpu": cpu_model(), "cores": os.cpu_count(), "mem_gb": mem_total_gb(),
                         "python": platform.python_version(), "commit": commit,
                         "loadavg_end": os.getloadavg()[0]},
                 "runtime_s": round(time.perf_counter() - started, 1)})


if __name__ == "__main__":
    main()
