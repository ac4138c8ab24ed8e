"""The torture test's long run (issue 27): N random operation sequences, zero divergence expected.

Each sequence is generated from one seed (``tests.harness.torture.generate``): table
settings and 4-12 steps -- upserts (in-process, CLI, Spark), kills at fault points, 2-3
racing writers (a table service beside them), forced rollbacks of live writers, compaction,
clean, rollback, schema change, rehash and bootstrap (each on Arrow, ``auto`` or Spark) -- with
the table checked against the oracle, ``validate``, ``shadow-compare``, time travel, a file
audit and a digest of its surroundings after every step. A fraction ``--spark-share`` of the
sequences take Spark steps, all in one in-process local Spark session; the others rehash and
bootstrap on Arrow only. A fraction ``--mirror-share`` mirror their table to Delta or
(``--iceberg-share`` of them) Iceberg (every retained version is then read back through
``deltalake`` or pyiceberg after every step; ``--delta-fresh-share`` of the merge-on-read ones
left on Delta publish its fresh view, read by ``QueryBuilder`` and Polars: unpartitioned, unless
``--partition-type int|date`` makes every sequence's partition field an integer or a date column,
which that view accepts partitioned), and ``--long-share`` run 40-48 steps so that archival runs
and is killed.

A divergence of a bug already filed with a failing regression test (``torture.KNOWN``) is
counted (``known_divergences``) and the run goes on; any other is shrunk to the fewest steps
and rows that still fail the same check and printed as JSON with the command that replays it
(``--replay FILE|JSON``). Progress lines go to stdout;
the last line is one JSON object: ``sequences``, ``steps``, ``kills``, ``overlaps``,
``divergences``, ``delta_versions`` (read back and compared; ``delta_fresh_versions`` of them in
the fresh view), ``iceberg_versions``, ``archived_sequences``,
``duration_s``, ``seed`` and the step count per action (``actions``: upserts per route,
``upsert_api`` ... ``upsert_spark``; rehash and bootstrap per engine asked for, ``rehash_arrow``,
``rehash_auto``, ``rehash_spark``, ``bootstrap_*``).

    python benchmarks/torture.py [--sequences 1000] [--seed S] [--spark-share 0.05]
                                 [--mirror-share 0.25] [--iceberg-share 0.5]
                                 [--delta-fresh-share 0.5] [--long-share 0.04]
                                 [--partition-type string|int|date]
                                 [--storage local|s3] [--replay FILE|JSON] [--no-shrink]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import emit_result  # noqa: E402 (benchmarks/ is on sys.path)

from tests.harness import torture  # noqa: E402


def log(msg: str) -> None:
    print(msg, flush=True)


def _replayed(text: str) -> dict[str, Any]:
    p = Path(text)
    if not text.lstrip().startswith("{") and p.exists():
        text = p.read_text()
    return json.loads(text)


def _storage(kind: str) -> tuple[torture.Storage, Any]:
    if kind == "local":
        return torture.Storage(), None
    from spark_jobs.io import storage as storage_config
    from tests.harness.s3_server import start_server

    server = start_server()
    os.environ.update(server.env())  # this process, its CLI children and Spark's workers
    os.environ.pop("BUCKETINDEX_STORAGE_OPTIONS", None)
    storage_config.configure(None)
    name = f"torture-{os.getpid()}"
    server.create_bucket(name)
    return torture.Storage(kind="s3", bucket=f"s3://{name}"), server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=1000, help="how many sequences (default 1000)")
    ap.add_argument("--seed", type=int, default=None, help="the run's seed (default: random, printed)")
    ap.add_argument("--spark-share", type=float, default=0.03,
                    help="fraction of sequences with Spark steps (upsert, rehash, bootstrap; the others rehash "
                         "and bootstrap on Arrow); default 0.03")
    ap.add_argument("--mirror-share", type=float, default=0.25,
                    help="fraction of sequences mirrored (from creation or by `mirror --enable`): half of them to Delta, half to Iceberg; "
                         "default 0.25")
    ap.add_argument("--iceberg-share", type=float, default=0.5,
                    help="fraction of the mirrored sequences mirrored to Iceberg instead of Delta; default 0.5")
    ap.add_argument("--delta-fresh-share", type=float, default=0.5,
                    help="fraction of the merge-on-read sequences mirrored to Delta that publish its fresh view "
                         "(deletion vectors; unpartitioned); default 0.5")
    ap.add_argument("--partition-type", choices=torture.PARTITION_TYPES, default="string",
                    help="the partition field's type in every sequence: string (the default), or int or date "
                         "(the Delta fresh view's sequences then stay partitioned)")
    ap.add_argument("--long-share", type=float, default=0.04,
                    help="fraction of sequences of 40-48 steps, long enough for archival; default 0.04")
    ap.add_argument("--storage", choices=("local", "s3"), default="local",
                    help="s3: tables on an S3-compatible server this run starts on loopback")
    ap.add_argument("--replay", metavar="FILE|JSON", help="run one sequence (a divergence's printed JSON)")
    ap.add_argument("--no-kills", action="store_true", help="no processes killed at fault points")
    ap.add_argument("--no-overlaps", action="store_true", help="no racing writers, no forced rollbacks")
    ap.add_argument("--no-shrink", action="store_true", help="print a divergence as found, unshrunk")
    ap.add_argument("--shrink-budget", type=float, default=600, help="seconds spent shrinking one divergence")
    ap.add_argument("--keep-going", action="store_true", help="after a divergence, run the remaining sequences")
    ap.add_argument("--json-out", help="also write the result line to this file")
    args = ap.parse_args(argv)
    for name in ("spark_share", "mirror_share", "iceberg_share", "delta_fresh_share", "long_share"):
        if not 0 <= getattr(args, name) <= 1:
            ap.error(f"--{name.replace('_', '-')} must be in [0, 1]")
    logging.disable(logging.WARNING)  # the product's INFO lines; its warnings and errors still show
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    storage, server = _storage(args.storage)
    counts = torture.Counts()
    work = Path(tempfile.mkdtemp(prefix="bucketindex-torture-"))
    t0 = time.perf_counter()
    spark = None
    divergent: list[dict[str, Any]] = []

    def spark_session() -> None:
        nonlocal spark
        if spark is None:
            from spark_jobs.jobs.session import get_spark

            spark = get_spark("local[2]", app_name="bucketindex-torture", ui=False)

    try:
        if args.replay:
            seqs = [_replayed(args.replay)]
        else:
            rng = random.Random(seed)
            seqs = []
            for s in torture.iter_seeds(seed, args.sequences):
                with_spark = rng.random() < args.spark_share
                seqs.append(torture.generate(s, spark=with_spark, kills=not args.no_kills,
                                             overlaps=not args.no_overlaps, mirror_share=args.mirror_share,
                                             long_share=args.long_share, iceberg_share=args.iceberg_share,
                                             delta_fresh_share=args.delta_fresh_share,
                                             partition_type=args.partition_type))
        log(f"torture: {len(seqs)} sequences, seed {seed}, storage {args.storage}, "
            f"{sum(1 for q in seqs if torture.uses_spark(q))} with Spark steps; work dir {work}")
        for i, seq in enumerate(seqs):
            if torture.uses_spark(seq):
                spark_session()
            d = torture.diverges(seq, work / f"s{i}", storage=storage, counts=counts)
            if i % 10 == 9 or i == len(seqs) - 1 or d is not None:
                el = time.perf_counter() - t0
                log(f"  {i + 1}/{len(seqs)} sequences, {counts.steps} steps, {counts.kills} kills, "
                    f"{counts.overlaps} overlaps, {counts.divergences + (d is not None)} divergences, {el:.0f} s")
            if d is None:
                continue
            counts.divergences += 1
            log(f"DIVERGENCE in sequence {i} (seed {seq['seed']}): {d}")
            shrunk, why = seq, d
            if d.known:  # filed, with a failing regression test: counted, not shrunk, not a stop
                counts.known[d.known] += 1
                log(f"  a known bug: {torture.KNOWN[d.known]}")
                log("  sequence: " + json.dumps(seq, ensure_ascii=False))
                divergent.append({"seed": seq["seed"], "check": d.check, "known": d.known})
                continue
            if not args.no_shrink:
                log(f"  shrinking (at most {args.shrink_budget:.0f} s) ...")
                shrunk, why = torture.shrink(seq, d, work / "shrink", budget_s=args.shrink_budget, storage=storage,
                                             log=log)
            path = work / f"divergence-{seq['seed']}.json"
            path.write_text(json.dumps(shrunk, ensure_ascii=False, indent=1))
            log(f"  {why}")
            log("  shrunk sequence: " + json.dumps(shrunk, ensure_ascii=False))
            log(f"  replay: python benchmarks/torture.py --replay {path}"
                + (f" --storage {args.storage}" if args.storage != "local" else ""))
            log(f"  or: {torture.replay_command(shrunk, storage=args.storage)}")
            divergent.append({"seed": seq["seed"], "check": why.check, "file": str(path)})
            if not args.keep_going:
                break
    finally:
        if not divergent or all(d.get("known") for d in divergent):
            import shutil

            shutil.rmtree(work, ignore_errors=True)
        if spark is not None:
            spark.stop()
        if server is not None:
            server.stop()
    result = {**counts.as_dict(), "duration_s": round(time.perf_counter() - t0, 1), "seed": seed,
              "storage": args.storage, "spark_share": args.spark_share, "mirror_share": args.mirror_share,
              "long_share": args.long_share, "iceberg_share": args.iceberg_share,
              "delta_fresh_share": args.delta_fresh_share, "partition_type": args.partition_type,
              "spark_sequences": sum(1 for q in seqs if torture.uses_spark(q)), "divergent": divergent,
              "python": sys.version.split()[0]}
    emit_result(result, args.json_out)
    return 1 if counts.divergences else 0



if __name__ == "__main__":
    sys.exit(main())
