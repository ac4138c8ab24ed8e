"""Automatic index compaction (issue 38): the tag phase of a later batch after many small
upserts, with and without the upsert's automatic compaction folding record-index deltas.

Two merge-on-read, record-index tables (16 buckets, the defaults otherwise) are built from the
same ``--keys`` rows (compare_peers' generator: UUID keys, 9 columns), both with automatic
compaction on. Then ``--upserts`` small batches of ``--small`` rows (half uniform updates, half
inserts) go into both, in-process on the Arrow engine:

* ``fold``: today's automatic compaction (data logs and due index buckets, the defaults:
  10 deltas or half the base's bytes, at most 4 buckets per upsert);
* ``nofold``: the behaviour before it -- automatic compaction of data logs only (the script
  replaces ``AutoCompaction.policy`` with one whose ``index`` is off, in this process only).

Each small upsert's wall time and automatic compaction share are recorded. Then the probe
batches (``--probes``, uniform updates of existing keys) go into each table through the cold
CLI (``bucketindex upsert ... --engine arrow --auto-compact off``, a new process: no index file
cached), and the tag phase (the index lookup of the batch's keys) is read from its result.
Correctness: the two tables hold the same rows afterwards (every column compared, sorted by key).

``--variants compacted`` (run after the others, on the kept ``nofold`` table): ``compact --only
index`` folds every bucket completely, and the probes run again (new batch ids): the reference
of a fully compacted index.

    python benchmarks/auto_compact_index.py [--keys 1000000] [--small 1000] [--upserts 100]
        [--probes 100000,1000000] [--workdir DIR] [--json-out FILE]

Progress goes to stdout; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from compare_peers import T0_MS, make_rows, uuid4_strings  # noqa: E402
from machine_info import machine  # noqa: E402
from results import emit_result  # noqa: E402

VARIANTS = ("fold", "nofold")


def log(msg: str) -> None:
    print(msg, flush=True)


def generate(keys: int, small: int, upserts: int, probes: list[int], seed: int, out: Path
             ) -> tuple[str, list[str], list[str]]:
    """The base file, the small batches (half updates of keys that exist then, half new keys)
    and the probe batches (uniform updates of base keys); ts rises batch after batch."""
    rng = np.random.default_rng([seed, keys])
    out.mkdir(parents=True, exist_ok=True)
    ids = uuid4_strings(rng, keys)
    ordinal = np.arange(keys, dtype=np.int64)
    base = out / "base.parquet"
    if not base.exists():
        pq.write_table(make_rows(rng, ids, ordinal, T0_MS + ordinal, keys, False), base, compression="zstd")
    known = ids
    smalls, ts0 = [], T0_MS + keys + 1
    for b in range(upserts):
        half = small // 2
        upd = rng.choice(len(known), half, replace=False)
        new = uuid4_strings(rng, small - half)
        b_ids = pa.concat_arrays([known.take(pa.array(upd)), new])
        ords = np.concatenate([np.minimum(upd, keys - 1), np.full(small - half, keys - 1)])
        ts = ts0 + b * small + np.arange(small, dtype=np.int64)
        p = out / f"small-{b:03d}.parquet"
        if not p.exists():
            pq.write_table(make_rows(rng, b_ids, ords, ts, keys, False), p, compression="zstd")
        smalls.append(str(p))
        known = pa.concat_arrays([known, new])
    files, ts0 = [], ts0 + upserts * small + 1
    for i, n in enumerate(probes):
        pick = rng.choice(keys, n, replace=False)
        ts = ts0 + i * max(probes) + np.arange(n, dtype=np.int64)
        p = out / f"probe-{i}-{n}.parquet"
        if not p.exists():
            pq.write_table(make_rows(rng, ids.take(pa.array(pick)), pick, ts, keys, False), p, compression="zstd")
        files.append(str(p))
    return str(base), smalls, files


def deltas_per_bucket(uri: str) -> dict[str, float]:
    from spark_jobs.table.table import Table
    from spark_jobs.table.view import is_index_delta

    per = [sum(1 for f in files if is_index_delta(f)) for files in Table.load(uri).view().index_files.values()]
    return {"buckets": len(per), "max": max(per, default=0), "mean": round(statistics.fmean(per), 1) if per else 0,
            "index_files": sum(per) + sum(len(files) - d for files, d in
                                          zip(Table.load(uri).view().index_files.values(), per))}


def cold_upsert(uri: str, src: str, batch_id: str) -> dict:
    """One cold CLI upsert; its result (the CLI's last stdout line) and wall time."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "upsert", uri, src, "--engine", "arrow",
                        "--auto-compact", "off", "--batch-id", batch_id],
                       env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"probe upsert failed ({p.returncode}): {p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return {"wall_s": round(wall, 2), "timings_ms": out.get("timings_ms"), "engine": out.get("engine")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--upserts", type=int, default=100)
    ap.add_argument("--probes", default="100000,1000000")
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--workdir", default="/tmp/auto_compact_index")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    probes = [int(x) for x in args.probes.split(",") if x]
    variants = [v for v in args.variants.split(",") if v]
    work = Path(args.workdir)
    from spark_jobs.arrow_engine.upsert import run_upsert
    from spark_jobs.table.action import compact as compact_action
    from spark_jobs.table.action.upsert import UpsertOptions

    t0 = time.perf_counter()
    base, smalls, probe_files = generate(args.keys, args.small, args.upserts, probes, args.seed, work / "data")
    log(f"data: {args.keys} keys, {len(smalls)} batches of {args.small}, probes {probes} "
        f"({time.perf_counter() - t0:.1f} s)")
    original = compact_action.AutoCompaction.policy
    result: dict = {"benchmark": "auto_compact_index", "machine": machine(), "keys": args.keys, "small": args.small,
                    "upserts": args.upserts, "probes": probes, "variants": {}}
    for v in variants:
        if v == "compacted":
            from spark_jobs.arrow_engine.compact import run_compact

            uri = str(work / "nofold")
            r = {"deltas_before_compact": deltas_per_bucket(uri)}
            t = time.perf_counter()
            run_compact(uri, policy=compact_action.CompactionPolicy(data=False, min_deltas=1))
            r["compact_s"] = round(time.perf_counter() - t, 1)
            r["deltas_before_probes"] = deltas_per_bucket(uri)
            r["probes"] = {}
            for n, src in zip(probes, probe_files):
                got = cold_upsert(uri, src, f"probe-{n}-compacted")
                r["probes"][str(n)] = got
                log(f"{v}: probe {n} keys: tag {got['timings_ms'].get('tag_ms')} ms, wall {got['wall_s']} s "
                    f"(phases {got['timings_ms']})")
            result["variants"][v] = r
            continue
        if v == "nofold":  # the behaviour before: data logs only
            compact_action.AutoCompaction.policy = property(  # type: ignore[method-assign]
                lambda self: compact_action.CompactionPolicy(max_groups=self.max_groups, max_bytes=self.max_bytes,
                                                             index=False))
        else:
            compact_action.AutoCompaction.policy = original  # type: ignore[method-assign]
        uri = str(work / v)
        r: dict = {}
        t = time.perf_counter()
        run_upsert(UpsertOptions(table=uri, source=base, record_key=["id"], precombine_field="ts",
                                 table_type="merge_on_read", auto_compact="on", batch_id="base"))
        r["build_s"] = round(time.perf_counter() - t, 1)
        log(f"{v}: built in {r['build_s']} s")
        walls, autos, folded = [], [], 0
        for i, src in enumerate(smalls):
            t = time.perf_counter()
            out = run_upsert(UpsertOptions(table=uri, source=src, batch_id=f"small-{i}"))
            walls.append(time.perf_counter() - t)
            ac = out.get("auto_compaction") or {}
            assert "error" not in ac, ac
            autos.append(ac.get("total_ms", 0) / 1000)
            folded += int(ac.get("index_buckets", 0))
            if i % 10 == 9:
                log(f"{v}: {i + 1} upserts, last {walls[-1]:.2f} s (auto-compaction {autos[-1]:.2f} s), "
                    f"deltas {deltas_per_bucket(uri)}")
        r["small_upserts"] = {"median_s": round(statistics.median(walls), 3), "max_s": round(max(walls), 3),
                              "total_s": round(sum(walls), 1), "auto_compact_median_s": round(statistics.median(autos), 3),
                              "auto_compact_max_s": round(max(autos), 3), "index_buckets_folded": folded}
        r["deltas_before_probes"] = deltas_per_bucket(uri)
        r["probes"] = {}
        for n, src in zip(probes, probe_files):
            got = cold_upsert(uri, src, f"probe-{n}")
            r["probes"][str(n)] = got
            log(f"{v}: probe {n} keys: tag {got['timings_ms'].get('tag_ms')} ms, wall {got['wall_s']} s "
                f"(phases {got['timings_ms']})")
        result["variants"][v] = r
    compact_action.AutoCompaction.policy = original  # type: ignore[method-assign]
    if set(VARIANTS) <= set(variants):
        from spark_jobs.table.reader import read_arrow

        a, b = (read_arrow(str(work / v)) for v in VARIANTS)
        a, b = (x.select(sorted(x.column_names)).sort_by("id") for x in (a, b))
        same = a.num_rows == b.num_rows and a.equals(b)
        result["same_rows"] = same
        result["rows"] = a.num_rows
        log(f"rows: {a.num_rows}; the two tables hold the same rows: {same}")
        if not same:
            raise SystemExit("the tables differ")
    result["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    emit_result(result, args.json_out)


if __name__ == "__main__":
    main()
