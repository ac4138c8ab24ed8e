"""Automatic compaction (issue 38 item 1): a day of hourly batches into a merge-on-read table,
with and without the upsert's automatic compaction, on the Arrow engine.

Two ``record``-index merge-on-read tables are built from the same ``--base-rows`` rows
(compare_peers' generator: UUID keys, 9 columns, unpartitioned, default file size): ``auto``
created with ``--auto-compact on``, ``off`` created without it (today's behaviour). Then
``--batches`` batches of ``--batch`` rows (half uniform updates of existing keys, half inserts)
go into both, in alternating order, each upsert timed (wall, and the automatic compaction's
share). Afterwards the full snapshot of each is read with the in-process reader
(``read_arrow``: every row and column merged) ``--repeats`` times; then the ``off`` table is
compacted completely (``compact`` with every group that has a log due) and read again: that is
the compacted table the goal compares with. Correctness: the three snapshots (auto, off before
and after its compaction) hold the same rows.

    python benchmarks/auto_compact.py [--base-rows 200000] [--batch 2000] [--batches 24]
        [--repeats 5] [--workdir DIR] [--json-out FILE]

The goal it reports: ``read_ratio_auto_vs_compacted`` (full read of the auto table / of the
compacted table: <= 1.2), next to ``read_ratio_off_vs_compacted`` (what the logs cost without
it) and the upsert latency cost (median and max upsert wall time, auto / off). Progress goes to
stdout; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compare_peers import T0_MS, make_rows, uuid4_strings  # noqa: E402
from machine_info import machine  # noqa: E402
from results import emit_result  # noqa: E402

KINDS = ("auto", "off")


def log(msg: str) -> None:
    print(msg, flush=True)


def generate(base_rows: int, batch: int, batches: int, seed: int, out: Path) -> tuple[str, list[str]]:
    """One base file and ``batches`` batch files: half uniform updates of keys that exist when the
    batch runs, half new keys; each batch's ts above everything before."""
    rng = np.random.default_rng([seed, base_rows])
    out.mkdir(parents=True, exist_ok=True)
    ids = uuid4_strings(rng, base_rows)
    ordinal = np.arange(base_rows, dtype=np.int64)
    base = out / "base.parquet"
    pq.write_table(make_rows(rng, ids, ordinal, T0_MS + ordinal, base_rows, False), base, compression="zstd")
    known = ids
    files = []
    ts0 = T0_MS + base_rows + 1
    for b in range(batches):
        half = batch // 2
        upd = rng.choice(len(known), half, replace=False)
        new = uuid4_strings(rng, batch - half)
        b_ids = pa.concat_arrays([known.take(pa.array(upd)), new])
        ords = np.concatenate([upd, np.full(batch - half, base_rows - 1)])
        ts = ts0 + b * batch + np.arange(batch, dtype=np.int64)
        tbl = make_rows(rng, b_ids, ords, ts, base_rows, False).take(pa.array(rng.permutation(batch)))
        p = out / f"batch-{b:03d}.parquet"
        pq.write_table(tbl, p, compression="zstd")
        files.append(str(p))
        known = pa.concat_arrays([known, new])
    return str(base), files


def timed_read(uri: str, repeats: int) -> tuple[float, pa.Table]:
    from spark_jobs.table.reader import read_arrow

    times, t = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        t = read_arrow(uri)
        times.append(time.perf_counter() - t0)
    assert t is not None
    return round(statistics.median(times), 4), t


def logs_of(uri: str) -> dict[str, int]:
    from spark_jobs.table.table import Table

    slices = list(Table.load(uri).view().slices())
    return {"file_groups": len(slices), "logs": sum(len(s.logs) for s in slices),
            "max_logs_per_group": max((len(s.logs) for s in slices), default=0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-rows", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=2_000)
    p.add_argument("--batches", type=int, default=24)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workdir", default=None)
    p.add_argument("--seed", type=int, default=20261128)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bi-auto-compact-"))
    t_script = time.perf_counter()

    from spark_jobs.arrow_engine.compact import run_compact
    from spark_jobs.arrow_engine.upsert import run_upsert
    from spark_jobs.table.action.compact import CompactionPolicy
    from spark_jobs.table.action.upsert import UpsertOptions
    from spark_jobs.table.table import Table

    base, batches = generate(args.base_rows, args.batch, args.batches, args.seed, work / "src")
    log(f"generated {args.base_rows:,} rows and {len(batches)} batches of {args.batch:,}")
    uris = {k: str(work / "tables" / k) for k in KINDS}
    for k, uri in uris.items():
        shutil.rmtree(uri, ignore_errors=True)
        t0 = time.perf_counter()
        run_upsert(UpsertOptions(table=uri, source=base, record_key=["id"], precombine_field="ts", batch_id="build",
                                 table_type="merge_on_read", auto_compact="on" if k == "auto" else None))
        log(f"built {k} in {time.perf_counter() - t0:.1f} s (auto_compact {Table.load(uri).config.auto_compact})")
    per: dict = {k: {"upsert_s": [], "auto_compact_s": []} for k in KINDS}
    compactions = 0
    for b, f in enumerate(batches):
        for k in (KINDS if b % 2 == 0 else tuple(reversed(KINDS))):
            t0 = time.perf_counter()
            res = run_upsert(UpsertOptions(table=uris[k], source=f, batch_id=f"h{b:02d}"))
            wall = time.perf_counter() - t0
            per[k]["upsert_s"].append(round(wall, 4))
            auto = res.get("auto_compaction")
            per[k]["auto_compact_s"].append(round((auto or {}).get("total_ms", 0) / 1000, 4))
            if auto and auto.get("instant") and not auto.get("noop"):
                compactions += 1
            assert not (auto or {}).get("error"), auto
            assert (auto is None) == (k == "off"), (k, auto)
        log(f"hour {b + 1:2d}: auto {per['auto']['upsert_s'][-1]:6.3f} s (compaction "
            f"{per['auto']['auto_compact_s'][-1]:5.3f} s)  off {per['off']['upsert_s'][-1]:6.3f} s  "
            f"logs auto {logs_of(uris['auto'])['logs']} off {logs_of(uris['off'])['logs']}")
    layout = {k: logs_of(uris[k]) for k in KINDS}
    reads = {}
    frames = {}
    for k in KINDS:
        reads[k], frames[k] = timed_read(uris[k], args.repeats)
    t0 = time.perf_counter()
    comp = run_compact(uris["off"], policy=CompactionPolicy(min_logs=1, index=False))
    compact_s = round(time.perf_counter() - t0, 3)
    log(f"compacted the off table: {comp.get('counts')} in {compact_s:.2f} s")
    reads["compacted"], frames["compacted"] = timed_read(uris["off"], args.repeats)
    # the three snapshots hold the same rows
    cols = [c for c in frames["compacted"].column_names if not c.startswith("_bi_")]
    canon = {k: v.select(cols).sort_by("id") for k, v in frames.items()}
    equal = all(canon[k].equals(canon["compacted"]) for k in canon)
    expected = args.base_rows + sum(args.batch - args.batch // 2 for _ in batches)
    assert frames["compacted"].num_rows == expected, (frames["compacted"].num_rows, expected)
    log(f"full read: auto {reads['auto']:.3f} s, off {reads['off']:.3f} s, compacted {reads['compacted']:.3f} s; "
        f"snapshots equal: {equal}")
    med = {k: statistics.median(per[k]["upsert_s"]) for k in KINDS}
    result = {
        "benchmark": "auto_compact", "base_rows": args.base_rows, "batch": args.batch, "batches": args.batches,
        "rows_after": expected, "read_s": reads,
        "read_ratio_auto_vs_compacted": round(reads["auto"] / reads["compacted"], 3),
        "read_ratio_off_vs_compacted": round(reads["off"] / reads["compacted"], 3),
        "median_upsert_s": med, "max_upsert_s": {k: max(per[k]["upsert_s"]) for k in KINDS},
        "total_upsert_s": {k: round(sum(per[k]["upsert_s"]), 3) for k in KINDS},
        "median_upsert_ratio_auto_vs_off": round(med["auto"] / med["off"], 3),
        "auto_compact_s": {"median": statistics.median(per["auto"]["auto_compact_s"]),
                           "max": max(per["auto"]["auto_compact_s"]),
                           "total": round(sum(per["auto"]["auto_compact_s"]), 3)},
        "automatic_compactions": compactions, "layout_after_batches": layout, "final_compaction_s": compact_s,
        "snapshots_equal": equal, "upserts": per, "machine": machine(),
        "loadavg_end": os.getloadavg()[0], "runtime_s": round(time.perf_counter() - t_script, 1),
    }
    result["goal_met"] = result["read_ratio_auto_vs_compacted"] <= 1.2 and equal
    log(f"read ratio auto/compacted {result['read_ratio_auto_vs_compacted']} (goal <= 1.2), off/compacted "
        f"{result['read_ratio_off_vs_compacted']}; median upsert auto {med['auto']:.3f} s vs off {med['off']:.3f} s")
    emit_result(result, args.json_out)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
