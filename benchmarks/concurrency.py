"""Optimistic concurrency: what the conflict check costs, and what concurrent writers gain.

Two measurements, both on the record index:

1. **The conflict check, pure Python (no Spark).** A writer begins a
   :class:`~spark_jobs.table.action.Transaction` (its snapshot is taken), then ``--concurrent``
   other transactions complete, each writing ``--concurrent-keys`` random UUID keys as index
   deltas (one delta file per index bucket, under markers, as the upsert job does) plus a few
   file groups in partitions of their own. Then the writer writes its own ``--keys``-key deltas
   and ``Transaction.commit`` runs the check against every concurrent entry and claims the
   sequence slot; that call is timed. Cases, each on a fresh table per repeat:

   * ``disjoint``: no key or file group in common -- the commit succeeds;
   * ``overlap``: ``--overlap`` of the writer's keys are also in the *last* concurrent commit
     (so the check reads every entry before it finds the conflict) -- timed until
     ``CommitConflict`` is raised;
   * ``baseline``: the same commit with nothing concurrent (reload + slot + marker clean-up).

   For context: listing and reading the commit sequence on a fresh handle, and the check alone
   (``find_conflict`` over the concurrent entries, without claiming the slot).

2. **Concurrent writers through the real CLI.** A base table (``--rows`` rows over 4 partitions
   ``region=p0..p3``, created by one CLI upsert) is copied twice; on one copy 4 batches (each
   ``--batch-rows`` rows confined to one partition: half updates of that partition's keys, half
   inserts) run as 4 ``python -m spark_jobs.cli upsert`` processes started together, on the other
   one after another. Cold processes, CLI defaults (``local[*]``). Reported: wall seconds of both,
   ``parallel_speedup = sequential / parallel``, the conflicts the winners recorded (their
   ``conflicts`` metadata) and give-up notes; both tables must end with the same rows, equal to a
   Python oracle, or the script fails.

    python benchmarks/concurrency.py [--repeats 5] [--keys 100000] [--concurrent 10]
        [--rows 40000] [--batch-rows 10000] [--cli-repeats 1] [--skip-cli] [--dir DIR] [--keep]

Progress goes to stdout; the last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results import emit_result  # noqa: E402
from machine_info import cpu_model, mem_total_gb  # noqa: E402 (benchmarks/ is on sys.path)
from spark_jobs.index.hashing import buckets_of, fingerprints  # noqa: E402
from spark_jobs.index.record_index import IndexEntries, write_index_file  # noqa: E402
from spark_jobs.table import Action, Table, TableConfig, Timeline  # noqa: E402
from spark_jobs.table.action import CommitConflict, Transaction, WriteSet, find_conflict  # noqa: E402

NUM_BUCKETS = 16
PARTITIONS = 4
KEY_RE = re.compile(r"(\d+) record key\(s\) written by both")
CHECK_RE = re.compile(r"phase commit\s+\d+ ms check (\d+) ms")


def log(msg: str) -> None:
    print(msg, flush=True)


def uuid4_strings(n: int, rng: random.Random) -> list[str]:
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]


def git_head() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+uncommitted" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        f = ROOT / "COMMIT"
        return f.read_text().strip() if f.exists() else "unknown"


def java_version() -> str | None:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "([^"]+)"', out)
    return m.group(1) if m else None


def med(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


# == 1. the conflict check =====================================================================
def write_commit_files(t: Table, txn: Transaction, keys: list[str], partition: str, groups: int,
                       rng: random.Random) -> tuple[dict, int]:
    """Write ``keys`` as this transaction's index deltas (one per bucket, under markers) and
    return the commit metadata naming them plus ``groups`` file groups in ``partition``, and
    the bytes written. Data files are not written: the check never opens them."""
    ts = txn.ts
    fgs = [(partition, uuid.UUID(int=rng.getrandbits(128)).hex) for _ in range(groups)]
    hi, lo = fingerprints(keys)
    bucket = buckets_of(keys, NUM_BUCKETS)
    slot = np.arange(len(keys)) % groups
    added, size = [], 0
    for b in range(NUM_BUCKETS):
        sel = np.nonzero(bucket == b)[0]
        if not sel.size:
            continue
        path = t.layout.index_file(b, "delta", ts)
        rel = t.layout.rel(path)
        t.create_marker(ts, rel)
        entries = IndexEntries.from_fingerprints(hi[sel], lo[sel], [fgs[i] for i in slot[sel].tolist()])
        size += write_index_file(t.io, path, entries, metadata={"instant": ts, "bucket": b})
        added.append({"bucket": b, "path": rel, "kind": "delta"})
    per_group = np.bincount(slot, minlength=groups)
    meta = {
        "action": Action.COMMIT, "instant": ts, "batch_id": f"bench-{ts}", "operation": "upsert",
        "index_type": "record", "num_buckets": NUM_BUCKETS, "snapshot_seq": txn.view.seq if txn.view else 0,
        "conflicts": [],
        "file_groups": [{"partition": p, "file_id": f, "path": f"{p}/{f}_0-0-0_{ts}.parquet",
                         "num_rows": int(per_group[i]), "size": 0} for i, (p, f) in enumerate(fgs)],
        "index": {"added": added, "removed": []},
        "counts": {"inserted": len(keys), "updated": 0, "deleted": 0, "moved": 0},
    }
    return meta, size


def check_case(workdir: Path, name: str, args, rng: random.Random, overlap: int | None) -> dict:
    """One fresh table: the writer begins, ``args.concurrent`` commits complete (none when
    ``overlap`` is None: the baseline), the writer writes its deltas and commits (timed)."""
    uri = str(workdir / name)
    shutil.rmtree(uri, ignore_errors=True)
    Table.open(uri).create(TableConfig(record_key_fields=["id"], num_buckets=NUM_BUCKETS))
    mine_t = Table.load(uri)  # the writer's own handle: it has not seen the concurrent entries
    txn = Transaction(mine_t, Action.COMMIT, {"batch_id": f"mine-{name}"}).begin()
    my_keys = uuid4_strings(args.keys, rng)
    rec: dict = {"case": name}
    concurrent = 0 if overlap is None else args.concurrent
    others: list[str] = []
    for i in range(concurrent):
        t = Table.load(uri)  # another process's handle
        other = Transaction(t, Action.COMMIT, {"batch_id": f"other-{i}"}).begin()
        keys = uuid4_strings(args.concurrent_keys, rng)
        if overlap and i == concurrent - 1:  # the last concurrent commit shares `overlap` of my keys
            keys[:overlap] = rng.sample(my_keys, overlap)
        meta, _ = write_commit_files(t, other, keys, f"region=c{i}", args.groups, rng)
        other.commit(meta)
        others.append(other.ts)

    # context: list + read the commit sequence on a fresh handle (what commit's reload does)
    t0 = time.perf_counter()
    Timeline(mine_t.io, mine_t.layout)
    rec["list_read_ms"] = (time.perf_counter() - t0) * 1000

    t0 = time.perf_counter()
    meta, my_bytes = write_commit_files(mine_t, txn, my_keys, "region=mine", args.groups, rng)
    rec["write_deltas_ms"] = (time.perf_counter() - t0) * 1000
    rec["my_delta_bytes"] = my_bytes

    def check_alone() -> None:
        """The check again, without claiming a slot (every file is in the page cache by now)."""
        tl = Timeline(mine_t.io, mine_t.layout)
        entries = [e for e in tl.entries if e["instant"] in set(others)]
        mine_ws = WriteSet.of(Action.COMMIT, meta)
        t1 = time.perf_counter()
        for e in entries:
            if find_conflict(mine_ws, e, mine_t.io, mine_t.layout) is not None:
                break
        rec["find_conflict_ms"] = (time.perf_counter() - t1) * 1000
        rec["entries_checked"] = len(entries)

    t0 = time.perf_counter()
    try:
        txn.commit(meta)
        rec["commit_ms"] = (time.perf_counter() - t0) * 1000
        rec["check_ms_txn"] = txn.check_ms  # Transaction's own figure: check + slot, whole ms
        rec["outcome"] = "committed"
        check_alone()
    except CommitConflict as c:
        rec["commit_ms"] = (time.perf_counter() - t0) * 1000
        rec["outcome"] = "conflict"
        rec["conflict"] = str(c.conflict)
        m = KEY_RE.search(c.conflict.reason)
        rec["shared_keys_found"] = int(m.group(1)) if m else None
        rec["conflict_with_last"] = c.conflict.instant == others[-1]
        check_alone()  # before abort, which deletes this attempt's deltas
        txn.abort()

    expected = {None: "committed", 0: "committed"}.get(overlap, "conflict")
    if rec["outcome"] != expected:
        raise SystemExit(f"conflict check case {name}: expected {expected}, got {rec}")
    if expected == "conflict" and (rec["shared_keys_found"] != overlap or not rec["conflict_with_last"]):
        raise SystemExit(f"conflict check case {name}: wrong conflict reported: {rec}")
    if not args.keep:
        shutil.rmtree(uri, ignore_errors=True)
    return rec


def bench_check(workdir: Path, args) -> dict:
    rng = random.Random(args.seed)
    runs: dict[str, list[dict]] = {"baseline": [], "disjoint": [], "overlap": []}
    overlap_keys = max(1, round(args.keys * args.overlap))
    # warm-up: imports, numpy, pyarrow IPC writer paths
    check_case(workdir, "warmup", argparse.Namespace(**{**vars(args), "keys": 2000, "concurrent": 2,
                                                          "concurrent_keys": 500, "keep": False}), rng, 0)
    for r in range(args.repeats):
        order = [("disjoint", 0), ("overlap", overlap_keys), ("baseline", None)]
        order = order[r % 3:] + order[: r % 3]  # rotate: no case always runs first
        for case, ov in order:
            rec = check_case(workdir, f"{case}_{r}", args, rng, ov)
            runs[case].append(rec)
            log(f"[check] repeat {r + 1}/{args.repeats} {case:8s}: commit {rec['commit_ms']:7.1f} ms "
                f"({rec['outcome']}; check alone {rec['find_conflict_ms']:6.1f} ms over {rec['entries_checked']} "
                f"entries), list+read sequence {rec['list_read_ms']:5.1f} ms, writing own deltas "
                f"{rec['write_deltas_ms']:6.1f} ms")
    d, o, b = runs["disjoint"], runs["overlap"], runs["baseline"]
    return {
        "conflict_check_ms_100k_vs_10": med([x["commit_ms"] for x in d]),
        "conflict_check_ms_disjoint": med([x["commit_ms"] for x in d]),
        "conflict_check_ms_overlap": med([x["commit_ms"] for x in o]),
        "commit_ms_no_concurrent": med([x["commit_ms"] for x in b]),
        "find_conflict_ms_disjoint": med([x["find_conflict_ms"] for x in d]),
        "find_conflict_ms_overlap": med([x["find_conflict_ms"] for x in o]),
        "list_read_sequence_ms": med([x["list_read_ms"] for x in d]),
        "write_own_deltas_ms": med([x["write_deltas_ms"] for x in d + o + b]),
        "check_ms_txn_disjoint": statistics.median(x["check_ms_txn"] for x in d),
        "check_setup": {
            "keys": args.keys, "concurrent": args.concurrent, "concurrent_keys": args.concurrent_keys,
            "num_buckets": NUM_BUCKETS, "file_groups_per_commit": args.groups, "overlap_keys": overlap_keys,
            "my_delta_bytes": d[0]["my_delta_bytes"], "repeats": args.repeats,
        },
        "check_runs_ms": {k: [round(x["commit_ms"], 2) for x in v] for k, v in runs.items()},
        "overlap_conflict": o[0]["conflict"],
    }


# == 2. concurrent writers through the CLI =====================================================
def make_rows(ids: list[str], region: str, ts: int, rng: np.random.Generator) -> pa.Table:
    n = len(ids)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    payload = [bytes(r).decode() for r in letters[rng.integers(0, 26, size=(n, 40))]]
    return pa.table({
        "id": pa.array(ids, pa.string()),
        "region": pa.array([region] * n, pa.string()),
        "ts": pa.array(np.full(n, ts, dtype=np.int64)),
        "amount": pa.array(np.round(rng.random(n) * 1000.0, 2)),
        "payload": pa.array(payload, pa.string()),
    })


def cli_upsert(uri: str, src: str, batch_id: str, logs: Path) -> tuple[subprocess.Popen, Path, Path]:
    cmd = [sys.executable, "-m", "spark_jobs.cli", "upsert", uri, src, "--record-key", "id",
           "--precombine-field", "ts", "--partition-field", "region", "--batch-id", batch_id]
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / f"{batch_id}.out", logs / f"{batch_id}.err"
    env = {**os.environ, "BUCKETINDEX_SPARK_LOG": str(logs / f"{batch_id}.spark.log")}
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fo, stderr=fe, text=True)
    return p, out, err


def finish(p: subprocess.Popen, out: Path, err: Path, batch_id: str, started: float) -> dict:
    rc = p.wait()
    wall = time.perf_counter() - started
    if rc != 0:
        tail = "\n".join(err.read_text().splitlines()[-15:])
        raise SystemExit(f"upsert {batch_id} exited {rc}:\n{tail}")
    res = json.loads(out.read_text().strip().splitlines()[-1])
    m = CHECK_RE.search(err.read_text())
    return {"batch_id": batch_id, "wall_s": round(wall, 2),
            "upsert_total_s": round(res["timings_ms"]["total_ms"] / 1000, 2),
            "retries": res.get("retries", 0), "check_ms": int(m.group(1)) if m else None,
            "counts": res["counts"]}


def table_conflicts(uri: str) -> tuple[int, int, int]:
    """(conflicts recorded by the winners, writers that gave up, commits) of a table."""
    t = Table.load(uri)
    tl = t.timeline.reload()
    commits = tl.completed([Action.COMMIT])
    recorded = sum(len(tl.read_metadata(i).get("conflicts", [])) for i in commits)
    notes = [n for n in t.io.list_names(t.layout.conflicts) if n.endswith(".json") and not n.startswith(".")]
    return recorded, len(notes), len(commits)


def sorted_rows(uri: str) -> pa.Table:
    from spark_jobs.table.reader import read_arrow

    t = read_arrow(uri).select(["id", "region", "ts", "amount", "payload"])
    return t.sort_by([("id", "ascending")])


def bench_cli(workdir: Path, args) -> dict:
    rng = random.Random(args.seed + 1)
    nrng = np.random.default_rng(args.seed + 1)
    src = workdir / "src"
    src.mkdir(parents=True, exist_ok=True)
    per_part = args.rows // PARTITIONS
    half = args.batch_rows // 2
    if half > per_part:
        raise SystemExit("--batch-rows / 2 must not exceed --rows / 4 (the updates come from one partition)")
    regions = [f"p{i}" for i in range(PARTITIONS)]
    ids = {r: uuid4_strings(per_part, rng) for r in regions}
    base = pa.concat_tables([make_rows(ids[r], r, 1, nrng) for r in regions])
    pq.write_table(base, src / "base.parquet")
    batches = {}
    oracle = {row["id"]: row for row in base.to_pylist()}
    for r in regions:
        b = pa.concat_tables([make_rows(rng.sample(ids[r], half), r, 2, nrng),
                              make_rows(uuid4_strings(args.batch_rows - half, rng), r, 2, nrng)])
        b = b.take(pa.array(nrng.permutation(b.num_rows)))
        pq.write_table(b, src / f"batch_{r}.parquet")
        batches[r] = str(src / f"batch_{r}.parquet")
        oracle.update({row["id"]: row for row in b.to_pylist()})
    expected = pa.Table.from_pylist(sorted(oracle.values(), key=lambda x: x["id"]), schema=base.schema)

    base_uri = str(workdir / "tables" / "base")
    log(f"[cli] creating the base table ({args.rows:,} rows over {PARTITIONS} partitions) with one CLI upsert ...")
    t0 = time.perf_counter()
    p, out, err = cli_upsert(base_uri, str(src / "base.parquet"), "base", workdir / "logs" / "base")
    base_rec = finish(p, out, err, "base", t0)
    log(f"[cli] base table: {base_rec['wall_s']:.1f} s wall (upsert itself {base_rec['upsert_total_s']:.1f} s)")

    runs = []
    for r in range(args.cli_repeats):
        rec: dict = {"repeat": r}
        modes = ["parallel", "sequential"] if r % 2 == 0 else ["sequential", "parallel"]
        for mode in modes:
            uri = str(workdir / "tables" / f"{mode}_{r}")
            shutil.copytree(base_uri, uri)
            logs = workdir / "logs" / f"{mode}_{r}"
            procs = []
            load_before = round(os.getloadavg()[0], 1)
            t0 = time.perf_counter()
            if mode == "parallel":
                started = {}
                for reg in regions:
                    started[reg] = time.perf_counter()
                    procs.append((reg, *cli_upsert(uri, batches[reg], f"batch-{reg}", logs)))
                per = [finish(pp, o, e, f"batch-{reg}", started[reg]) for reg, pp, o, e in procs]
            else:
                per = []
                for reg in regions:
                    s = time.perf_counter()
                    pp, o, e = cli_upsert(uri, batches[reg], f"batch-{reg}", logs)
                    per.append(finish(pp, o, e, f"batch-{reg}", s))
            wall = time.perf_counter() - t0
            recorded, gave_up, commits = table_conflicts(uri)
            rec[mode] = {"wall_s": round(wall, 2), "load_before": load_before,
                         "load_after": round(os.getloadavg()[0], 1), "conflicts": recorded, "gave_up": gave_up,
                         "retries": sum(x["retries"] for x in per), "commits": commits, "processes": per}
            log(f"[cli] repeat {r + 1}/{args.cli_repeats} {mode:10s}: {wall:6.1f} s wall; per process "
                + ", ".join(f"{x['batch_id']} {x['wall_s']:.1f} s (upsert {x['upsert_total_s']:.1f} s, "
                            f"check {x['check_ms']} ms, {x['retries']} retries)" for x in per)
                + f"; conflicts recorded {recorded}, gave up {gave_up}; load average {load_before} -> "
                f"{rec[mode]['load_after']}")
        # both tables must hold the same rows, and the oracle's
        a = sorted_rows(str(workdir / "tables" / f"parallel_{r}"))
        b = sorted_rows(str(workdir / "tables" / f"sequential_{r}"))
        if not a.equals(b):
            raise SystemExit(f"repeat {r}: the parallel and the sequential table differ "
                             f"({a.num_rows} vs {b.num_rows} rows)")
        if not a.equals(expected):
            raise SystemExit(f"repeat {r}: the tables differ from the oracle "
                             f"({a.num_rows} vs {expected.num_rows} rows)")
        rec["rows"] = a.num_rows
        rec["parallel_speedup"] = round(rec["sequential"]["wall_s"] / rec["parallel"]["wall_s"], 2)
        log(f"[cli] repeat {r + 1}: both tables hold the same {a.num_rows:,} rows (= oracle); "
            f"parallel speedup {rec['parallel_speedup']}")
        runs.append(rec)
        if not args.keep:
            for mode in ("parallel", "sequential"):
                shutil.rmtree(workdir / "tables" / f"{mode}_{r}", ignore_errors=True)

    seq = med([x["sequential"]["wall_s"] for x in runs])
    par = med([x["parallel"]["wall_s"] for x in runs])
    return {
        "sequential_s": seq,
        "parallel_s": par,
        "parallel_speedup": round(seq / par, 2),
        "conflicts_parallel": sum(x["parallel"]["conflicts"] for x in runs),
        "retries_parallel": sum(x["parallel"]["retries"] for x in runs),
        "gave_up_parallel": sum(x["parallel"]["gave_up"] for x in runs),
        "conflicts_sequential": sum(x["sequential"]["conflicts"] for x in runs),
        "rows_match": True,
        "cli_setup": {
            "base_rows": args.rows, "partitions": PARTITIONS, "writers": PARTITIONS, "batch_rows": args.batch_rows,
            "batch_updates": half, "batch_inserts": args.batch_rows - half, "final_rows": runs[-1]["rows"],
            "cli_repeats": args.cli_repeats, "master": "local[*] (CLI default)", "base_create_s": base_rec["wall_s"],
            "note": f"{os.cpu_count()} cores: the {PARTITIONS} concurrent JVMs compete for them",
        },
        "cli_runs": runs,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="conflict check: repeats per case (fresh table each); median")
    p.add_argument("--keys", type=int, default=100_000, help="conflict check: keys of the checked batch")
    p.add_argument("--concurrent", type=int, default=10, help="conflict check: commits completed since the snapshot")
    p.add_argument("--concurrent-keys", type=int, default=10_000, help="conflict check: keys per concurrent commit")
    p.add_argument("--groups", type=int, default=3, help="conflict check: file groups per commit")
    p.add_argument("--overlap", type=float, default=0.01,
                   help="conflict check: fraction of the batch's keys in the last concurrent commit (overlap case)")
    p.add_argument("--rows", type=int, default=40_000, help="CLI: base table rows (over 4 partitions)")
    p.add_argument("--batch-rows", type=int, default=None,
                   help="CLI: rows per writer batch, half updates and half inserts (default rows / 4)")
    p.add_argument("--cli-repeats", type=int, default=1, help="CLI: parallel + sequential rounds (median)")
    p.add_argument("--skip-cli", action="store_true", help="only the conflict check (no Spark)")
    p.add_argument("--dir", default=None, help="working directory (default: a temp dir under /tmp, deleted)")
    p.add_argument("--keep", action="store_true", help="keep the tables and logs")
    p.add_argument("--seed", type=int, default=20240701)
    p.add_argument("--json-out", default=None, help="also write the final JSON object to this file")
    args = p.parse_args()
    if args.batch_rows is None:
        args.batch_rows = args.rows // PARTITIONS
    if args.repeats < 1 or args.cli_repeats < 1:
        p.error("--repeats and --cli-repeats must be at least 1")
    if args.concurrent < 1:
        p.error("--concurrent must be at least 1")
    if not 0 < args.overlap <= 1:
        p.error("--overlap must be in (0, 1]")
    if round(args.keys * args.overlap) > args.concurrent_keys:
        p.error("the overlap must fit into one concurrent commit (--keys * --overlap <= --concurrent-keys)")

    t_script = time.perf_counter()
    own = args.dir is None
    workdir = Path(tempfile.mkdtemp(prefix="concurrency_", dir="/tmp") if own else args.dir)
    workdir.mkdir(parents=True, exist_ok=True)
    env = {"cpu": cpu_model(), "cores": os.cpu_count(), "mem_gb": mem_total_gb(),
           "python": platform.python_version(), "pyarrow": pa.__version__, "numpy": np.__version__,
           "commit": git_head()}
    if not args.skip_cli:
        import pyspark

        env.update({"pyspark": pyspark.__version__, "java": java_version()})
    env["load_avg_1m_at_start"] = round(os.getloadavg()[0], 1)
    log(f"workdir {workdir}")
    log("machine: " + ", ".join(f"{k} {v}" for k, v in env.items()))

    result: dict = {}
    try:
        log(f"== conflict check: {args.keys:,}-key batch vs {args.concurrent} concurrent commits of "
            f"{args.concurrent_keys:,} keys, {NUM_BUCKETS} index buckets, {args.repeats} repeats")
        result.update(bench_check(workdir, args))
        log(f"commit with the check (disjoint) {result['conflict_check_ms_disjoint']} ms, until CommitConflict "
            f"(overlap) {result['conflict_check_ms_overlap']} ms, commit with nothing concurrent "
            f"{result['commit_ms_no_concurrent']} ms; check alone {result['find_conflict_ms_disjoint']} ms; "
            f"list+read sequence {result['list_read_sequence_ms']} ms (medians)")
        if not args.skip_cli:
            log(f"== concurrent writers through the CLI: {PARTITIONS} batches of {args.batch_rows:,} rows on disjoint "
                f"partitions, {args.cli_repeats} round(s)")
            result.update(bench_cli(workdir, args))
            log(f"sequential {result['sequential_s']} s, parallel {result['parallel_s']} s: speedup "
                f"{result['parallel_speedup']}; conflicts {result['conflicts_parallel']}, retries "
                f"{result['retries_parallel']} (parallel)")
    finally:
        if own and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    env["load_avg_1m_at_end"] = round(os.getloadavg()[0], 1)
    result["env"] = env
    result["runtime_s"] = round(time.perf_counter() - t_script, 1)
    log(f"benchmark runtime {result['runtime_s']:.0f} s")
    emit_result(result, args.json_out)


if __name__ == "__main__":
    main()
