"""bucketindex against its peers: the same upsert, on the same data, by every contender, in one run.

Why: a user choosing how to keep a lake table upsertable compares what they could use instead --
delta-rs (Delta Lake's Rust engine, no JVM), pyiceberg (Iceberg in Python, a SQL catalog on
SQLite), or a plain PySpark job that rewrites the table -- with bucketindex's two index types. The
other benchmarks compare bucketindex with itself; this one says whether it is worth its JVM.

Contenders (``--contenders``), each checked for correctness after every measured upsert:

* ``delta_rs`` -- ``DeltaTable.merge(batch, "t.id = s.id").when_matched_update_all()
  .when_not_matched_insert_all()``, the batch read with pyarrow (reading is in the time).
* ``pyiceberg`` -- ``table.upsert(batch, join_cols=["id"])`` on a table of a ``SqlCatalog``
  backed by SQLite.
* ``plain_spark`` -- what a Spark user without a table format writes: read table + batch, union,
  keep the row with the highest ``ts`` per ``id`` (the batch wins ties) with ``row_number`` over a
  window, write the whole table to a new directory and swap it in.
* ``bucketindex_record`` / ``bucketindex_bucket`` -- the upsert job on a table with the record-level
  index / the bucket hash index, at defaults (no tuning flag, no Spark conf).
* ``bucketindex_record_mor`` / ``bucketindex_bucket_mor`` -- the same on a ``merge_on_read`` table
  (created with ``--table-type merge_on_read``; upserts append logs, nothing is compacted during
  the run). Read-back checks merge the logs like every reader.
* ``bucketindex_record_connect`` -- the CLI as a Spark Connect client (``--remote sc://...``)
  against a server that is already running. Skipped, with a message, without ``--remote`` or while
  the CLI has no ``--remote`` option.

The contenders above run on the Spark engine: their CLI gets ``--engine spark`` (the CLI's default,
``auto``, would run most of these batches in-process) and their warm calls are
``spark_jobs.jobs.upsert.run_upsert`` in this process's session. The engines of issue 23:

* ``bucketindex_record_arrow`` / ``bucketindex_record_mor_arrow`` / ``bucketindex_bucket_arrow`` -- the
  same tables (record copy-on-write, record merge-on-read, bucket copy-on-write) upserted by the
  in-process Arrow engine: cold = the CLI with ``--engine arrow``; warm = the Python API
  ``spark_jobs.arrow_engine.upsert.run_upsert(UpsertOptions(...))`` in this process (no Spark
  session, no JVM).
* ``bucketindex_record_mor_auto`` -- the CLI at its default engine (``auto``; ``--memory-budget`` is
  passed on if given), cold only. The engine it chose (the JSON line's ``engine``) and why (its
  ``bucketindex.engine`` log line) are in the figures (``engine``, ``engine_reason``).

A contender that differs from another only by engine shares its built table (each run copies it).
The bucketindex tables are built by Spark when a Spark contender of the same table is in the run,
else by the Arrow engine (``--build-engine`` forces one; the build engine is in ``build``).

Modes (``--modes``), because a scheduler pays very different costs depending on how it runs a job:

* ``cold`` -- a new process per upsert, timed from outside from start to exit (interpreter,
  imports, for Spark the JVM and session start): the bucketindex CLI exactly as a user runs it
  (``python -m airflow_provider_bucketindex.cli upsert ...``), plain Spark as a ``python -c``
  script that starts its own ``local[*]`` session at Spark's defaults, delta-rs and pyiceberg as a
  ``python -c`` script too (so their process start is counted like everyone else's).
* ``warm`` -- the same call inside this benchmark's running process: for Spark contenders in one
  session started at bucketindex's defaults (``get_spark("local[*]")``, start reported apart) after
  one warm-up upsert per contender into a scratch table; delta-rs and pyiceberg in-process after a
  warm-up of their own.

Data: UUID4 string keys created in order (so "newest keys" = the last ones generated) and 9 columns
of mixed types (``id, ts, amount, qty, note, region, flag, event_date, score``; ``--partitioned``
adds ``month``, 6 values following key order, as the partition column of every contender). Per
size one base table (written as Parquet files of at most ``--base-file-rows``) and three batches,
each half updates and half inserts, written once as Parquet and read by every contender:

* ``uniform_<batch>`` -- updates drawn uniformly from all keys (touches every file of the table);
* ``recent_<batch>`` -- updates drawn from the newest 5 % of keys (CDC's usual locality);
* ``small_<small-batch>`` -- the scheduled small batch (200 rows), updates drawn uniformly.

Every contender builds its own table from the base Parquet (build time printed, never in the
figures; with ``--keep`` and a ``--workdir``, the generated data (``manifest.json``) and the built tables
(``<table>.build.json``) of an earlier run with the same parameters are reused), and every measured
upsert starts from the built state: a fresh ``copytree`` of the table
(delta-rs, plain Spark, bucketindex) or, for pyiceberg (whose metadata holds absolute paths), the
base metadata file registered as a new catalog table, the files the run wrote removed afterwards.

Correctness, after every measured upsert (not timed): rows == base + inserts, every ``id``
distinct, and for 100 sampled updated and 100 sampled inserted keys the batch's ``ts`` is present
(read with deltalake / pyiceberg / pyarrow / ``spark_jobs.table.reader.read_arrow``). A failed check
is printed loudly and reported in the JSON (``ok: false``); the run goes on.

CPU: a cold run also records ``cpu_s``, the user + system CPU seconds of the process and the
children it waited for (``getrusage``; not recorded for a process that started children, e.g. a JVM,
which its python parent does not wait for): on a loaded machine a cold process's wall time is mostly
its wait for a core, and its CPU time is the better guess of the wall time on a quiet one; a warm
run without a JVM records this process's CPU time during the call.

Memory: cold = peak of the summed RSS of the process tree (the python process and its JVM, if it
starts one: an Arrow-engine CLI starts none), polled every 100 ms; warm Spark contenders = the same
over this process and its JVM (the JVM's heap is rarely given back, so warm figures are upper
bounds shaped by earlier runs; ``mem_growth_mb`` is the growth during the call); warm delta-rs /
pyiceberg / Arrow engine = this python process alone (which also holds the benchmark's own data:
``mem_growth_mb`` is the call's share).

Ratios: ``speedup_vs_<peer>_<size>`` = peer time / bucketindex record time (above 1: bucketindex
is faster), cold (bucketindex cold CLI vs the peer's cold process) and warm, for the headline case
(``uniform`` at ``--batch``); ``mor_speedup_...`` the same for ``record_mor``, and
``<record_mor_arrow|record_arrow|bucket_arrow|record_mor_auto>_speedup_vs_<peer>_<size>[_small]``
for the engines of issue 23 on the headline and the small case; every case and ``best`` are in
``ratios``. Each run records the 1-minute load average (``load_1m``): the machine is shared.

    python benchmarks/compare_peers.py [--sizes 1000000,10000000] [--with-50m] [--batch 100000]
        [--small-batch 200] [--patterns uniform,recent] [--contenders ...] [--modes cold,warm]
        [--repeats 1] [--small-repeats N] [--memory-budget SIZE] [--build-engine auto|spark|arrow]
        [--partitioned] [--remote sc://localhost:15002] [--workdir DIR] [--keep] [--json-out FILE]

Needs the optional ``bench`` extra (``pip install -e .[bench]``: deltalake, pyiceberg[sql-sqlite],
psutil). Progress goes to stdout; the last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results import emit_result  # noqa: E402
from machine_info import cpu_model, mem_total_gb  # noqa: E402 (benchmarks/ is on sys.path)

ARROW_CONTENDERS = ("bucketindex_record_arrow", "bucketindex_record_mor_arrow", "bucketindex_bucket_arrow")
AUTO_CONTENDERS = ("bucketindex_record_mor_auto",)
CONTENDERS = ("delta_rs", "pyiceberg", "plain_spark", "bucketindex_record", "bucketindex_bucket",
              "bucketindex_record_mor", "bucketindex_bucket_mor", "bucketindex_record_connect",
              *ARROW_CONTENDERS, *AUTO_CONTENDERS)
PEERS = ("delta_rs", "pyiceberg", "plain_spark")
SPARK_CONTENDERS = ("plain_spark", "bucketindex_record", "bucketindex_bucket", "bucketindex_record_mor",
                    "bucketindex_bucket_mor")
#: bucketindex contenders whose ratios are reported: copy-on-write and merge-on-read, per engine
OWN = ("record", "bucket", "record_mor", "bucket_mor", "record_arrow", "record_mor_arrow", "bucket_arrow",
       "record_mor_auto")
MODES = ("cold", "warm")
PATTERNS = ("uniform", "recent")
RECENT_FRACTION = 0.05
MONTHS = [f"m2024-{m:02d}" for m in range(1, 7)]  # not date-like: Spark infers partition values as strings
T0_MS = 1_700_000_000_000
SESSION_SHUFFLE_PARTITIONS = "8"  # what spark_jobs.jobs.session.get_spark sets
SAMPLE = 100
PHASES = ("validate", "dedupe", "tag", "write", "index", "commit", "total")  # run_upsert's own timings


def engine_of(contender: str) -> str | None:
    """The ``--engine`` a bucketindex contender runs with (None: not bucketindex)."""
    if not contender.startswith("bucketindex"):
        return None
    return "arrow" if contender.endswith("_arrow") else "auto" if contender.endswith("_auto") else "spark"


def variant_of(contender: str) -> str:
    """The table a contender upserts into: the engine (and Connect) does not change the table."""
    for suffix in ("_arrow", "_auto", "_connect"):
        contender = contender.removesuffix(suffix)
    return contender


def log(msg: str) -> None:
    print(msg, flush=True)


def loud(msg: str) -> None:
    bar = "!" * 100
    print(f"{bar}\n!!! {msg}\n{bar}", flush=True)


# == the contenders' code ===========================================================================
# Each peer's upsert is one small program, run as it is by ``python -c`` (cold) and exec'd into this
# process (warm): the two modes run the same lines.
CHILD_MAIN = r'''
if __name__ == "__main__":
    import json, sys, time
    _t0 = time.perf_counter()
    _res = main_child(**json.loads(sys.argv[1]))
    _res["child_s"] = time.perf_counter() - _t0
    print(json.dumps(_res), flush=True)
'''

DELTA_RS_CODE = r'''
import time

def upsert(table, source):
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    batch = pq.read_table(source)
    m = (DeltaTable(table)
         .merge(batch, predicate="t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_update_all()
         .when_not_matched_insert_all()
         .execute())
    return {"updated": m.get("num_target_rows_updated"), "inserted": m.get("num_target_rows_inserted"),
            "files_added": m.get("num_target_files_added"), "files_removed": m.get("num_target_files_removed")}

def main_child(table, source):
    t0 = time.perf_counter()
    import pyarrow.parquet, deltalake  # noqa: F401  (counted as process start)
    t1 = time.perf_counter()
    out = upsert(table, source)
    return {"import_s": t1 - t0, "upsert_s": time.perf_counter() - t1, **out}
''' + CHILD_MAIN

PYICEBERG_CODE = r'''
import time

def catalog(catalog_db, warehouse):
    from pyiceberg.catalog.sql import SqlCatalog
    return SqlCatalog("bench", uri=f"sqlite:///{catalog_db}", warehouse=f"file://{warehouse}")

def upsert(catalog_db, warehouse, name, source):
    import pyarrow.parquet as pq
    table = catalog(catalog_db, warehouse).load_table(name)
    batch = pq.read_table(source)
    r = table.upsert(batch, join_cols=["id"])
    return {"updated": r.rows_updated, "inserted": r.rows_inserted}

def main_child(catalog_db, warehouse, name, source):
    t0 = time.perf_counter()
    import pyarrow.parquet, pyiceberg.catalog.sql, pyiceberg.table  # noqa: F401  (counted as process start)
    t1 = time.perf_counter()
    out = upsert(catalog_db, warehouse, name, source)
    return {"import_s": t1 - t0, "upsert_s": time.perf_counter() - t1, **out}
''' + CHILD_MAIN

PLAIN_SPARK_CODE = r'''
import time

def rewrite(spark, table, source, partition_col=None):
    """Read table + batch, keep the newest row per id (the batch wins ties), rewrite, swap."""
    import os, shutil
    from pyspark.sql import Window, functions as F
    cur = table.rstrip("/")
    nxt, old = cur + ".next", cur + ".old"
    t = spark.read.parquet(cur).withColumn("_src", F.lit(0))
    b = spark.read.parquet(source).withColumn("_src", F.lit(1))
    w = Window.partitionBy("id").orderBy(F.col("ts").desc(), F.col("_src").desc())
    out = (t.unionByName(b).withColumn("_rn", F.row_number().over(w))
           .where(F.col("_rn") == 1).drop("_rn", "_src"))
    writer = out.write.mode("overwrite")
    if partition_col:
        writer = writer.partitionBy(partition_col)
    writer.parquet(nxt)
    os.rename(cur, old)
    os.rename(nxt, cur)
    shutil.rmtree(old)
    return {}

def main_child(table, source, partition_col=None):
    t0 = time.perf_counter()
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.master("local[*]").appName("plain-spark-rewrite").getOrCreate()  # Spark defaults
    t1 = time.perf_counter()
    out = rewrite(spark, table, source, partition_col)
    t2 = time.perf_counter()
    spark.stop()
    return {"session_s": t1 - t0, "upsert_s": t2 - t1, **out}
''' + CHILD_MAIN

CODE = {"delta_rs": DELTA_RS_CODE, "pyiceberg": PYICEBERG_CODE, "plain_spark": PLAIN_SPARK_CODE}


def load_code(name: str) -> dict:
    ns: dict = {"__name__": f"compare_peers_{name}"}
    exec(compile(CODE[name], f"<{name} upsert>", "exec"), ns)  # noqa: S102 - our own constant code
    return ns


# == data generation (vectorised: no Python loop per row) ===========================================
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
REGIONS = pa.array(["north", "south", "east", "west", "central", "islands", "mountains", "coast"])


def _fixed_width_strings(chars: np.ndarray) -> pa.StringArray:
    """An Arrow string array from an (n, w) uint8 matrix of ASCII characters."""
    n, w = chars.shape
    offsets = np.arange(0, w * (n + 1), w, dtype=np.int64)
    return pa.LargeStringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(chars).tobytes())
    ).cast(pa.string())


def uuid4_strings(rng: np.random.Generator, n: int) -> pa.StringArray:
    """``n`` random UUID4 strings (36 chars), formatted with numpy."""
    return uuid4_from_bytes(rng.integers(0, 256, size=(n, 16), dtype=np.uint8))


def uuid4_from_bytes(b: np.ndarray) -> pa.StringArray:
    """UUID4 strings of an (n, 16) uint8 matrix of random bytes (its version and variant bits are
    overwritten): ``scale.py`` derives the bytes from each key's ordinal, so a key can be made again."""
    n = b.shape[0]
    b = b.copy()
    b[:, 6] = (b[:, 6] & 0x0F) | 0x40  # version 4
    b[:, 8] = (b[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
    h = np.empty((n, 32), dtype=np.uint8)
    h[:, 0::2] = _HEX[b >> 4]
    h[:, 1::2] = _HEX[b & 0x0F]
    out = np.full((n, 36), ord("-"), dtype=np.uint8)
    for dst, src in ((slice(0, 8), slice(0, 8)), (slice(9, 13), slice(8, 12)), (slice(14, 18), slice(12, 16)),
                     (slice(19, 23), slice(16, 20)), (slice(24, 36), slice(20, 32))):
        out[:, dst] = h[:, src]
    return _fixed_width_strings(out)


def note_strings(rng: np.random.Generator, n: int) -> pa.StringArray:
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    return _fixed_width_strings(letters[rng.integers(0, 26, size=(n, 20))])


def make_rows(rng: np.random.Generator, ids: pa.Array, ordinal: np.ndarray, ts: np.ndarray, size: int,
              partitioned: bool) -> pa.Table:
    """Rows for keys ``ids``; ``ordinal`` is each key's creation order (0 .. size-1, size for inserts):
    ``event_date`` and ``month`` follow it, as they would in a table filled over time."""
    n = len(ids)
    cols = {
        "id": ids,
        "ts": pa.array(ts.astype(np.int64)),
        "amount": pa.array(np.round(rng.random(n) * 1000.0, 2)),
        "qty": pa.array(rng.integers(0, 1_000_000, size=n, dtype=np.int32)),
        "note": note_strings(rng, n),
        "region": REGIONS.take(pa.array(rng.integers(0, len(REGIONS), size=n))),
        "flag": pa.array(rng.random(n) < 0.5),
        "event_date": pa.array((19_358 + ordinal * 180 // max(size, 1)).astype(np.int32)).cast(pa.date32()),
        "score": pa.array(rng.random(n).astype(np.float32)),
    }
    if partitioned:
        m = np.minimum(ordinal * len(MONTHS) // max(size, 1), len(MONTHS) - 1)
        cols["month"] = pa.array(MONTHS).take(pa.array(m))
    return pa.table(cols)


class Case:
    """One measured batch of one size: its file, what it should do, and the keys to check."""

    def __init__(self, name: str, pattern: str, rows: int, path: str, upd_ids: list[str], upd_ts: list[int],
                 ins_ids: list[str], ins_ts: list[int]):
        self.name, self.pattern, self.rows, self.path = name, pattern, rows, path
        self.inserts = rows - rows // 2
        self.sample_ids = upd_ids + ins_ids
        self.sample_ts = upd_ts + ins_ts
        self.n_upd_sample = len(upd_ids)

    def to_json(self) -> dict:
        n = self.n_upd_sample
        return {"name": self.name, "pattern": self.pattern, "rows": self.rows, "path": self.path,
                "upd_ids": self.sample_ids[:n], "upd_ts": self.sample_ts[:n], "ins_ids": self.sample_ids[n:],
                "ins_ts": self.sample_ts[n:]}


def data_key(size: int, args) -> dict:
    """What the generated data of one size depends on: a cached copy is reused only if it matches."""
    return {"seed": args.seed, "size": size, "batch": args.batch, "small_batch": args.small_batch,
            "patterns": args.patterns_list, "base_file_rows": args.base_file_rows, "partitioned": args.partitioned}


def base_key(size: int, args) -> dict:
    """What the base files of one size depend on (generated first from the seed: the batches do not
    change them), and so what a built table depends on."""
    return {k: v for k, v in data_key(size, args).items() if k in ("seed", "size", "base_file_rows", "partitioned")}


def generate(size: int, args, sdir: Path) -> tuple[list[str], list[Case]]:
    """The data of one size, generated -- or, with ``--keep`` and a ``--workdir`` that holds data generated
    with the same parameters (``manifest.json``), reused as it is."""
    manifest = sdir / "manifest.json"
    if args.keep and size >= 0 and manifest.exists():
        m = json.loads(manifest.read_text())
        if m.get("key") == data_key(size, args) and all(Path(f).exists() for f in m["files"]) and all(
                Path(c["path"]).exists() for c in m["cases"]):
            return m["files"], [Case(**c) for c in m["cases"]]
    manifest.unlink(missing_ok=True)
    files, cases = _generate(size, args, sdir)
    if args.keep and size >= 0:
        manifest.write_text(json.dumps({"key": data_key(size, args), "files": files,
                                        "cases": [c.to_json() for c in cases]}))
    return files, cases


def _generate(size: int, args, sdir: Path) -> tuple[list[str], list[Case]]:
    """Base Parquet files (at most --base-file-rows each) and the measured batches of one size."""
    rng = np.random.default_rng([args.seed, size])
    base_dir = sdir / "base"
    base_dir.mkdir(parents=True, exist_ok=True)
    ids = uuid4_strings(rng, size)
    files = []
    for lo in range(0, size, args.base_file_rows):
        hi = min(size, lo + args.base_file_rows)
        ordinal = np.arange(lo, hi, dtype=np.int64)
        path = base_dir / f"part-{len(files):05d}.parquet"
        pq.write_table(make_rows(rng, ids.slice(lo, hi - lo), ordinal, T0_MS + ordinal, size, args.partitioned),
                       path, compression="zstd")
        files.append(str(path))
    specs = [(f"{p}_{human_rows(args.batch)}", p, args.batch) for p in args.patterns_list]
    if args.small_batch:
        specs.append((f"small_{human_rows(args.small_batch)}", "uniform", args.small_batch))
    cases = []
    recent = max(1, int(np.ceil(size * RECENT_FRACTION)))
    for name, pattern, rows in specs:
        half = rows // 2
        if pattern == "uniform":
            upd = rng.choice(size, half, replace=False)
        else:  # the newest 5 % of keys
            upd = size - recent + rng.choice(recent, half, replace=False)
        new_ids = uuid4_strings(rng, rows - half)
        b_ids = pa.concat_arrays([ids.take(pa.array(upd)), new_ids])
        ordinal = np.concatenate([upd, np.full(rows - half, size - 1)])  # inserts: the newest month
        ts = T0_MS + size + 1 + np.arange(rows, dtype=np.int64)  # above every stored ts: the batch wins
        tbl = make_rows(rng, b_ids, ordinal, ts, size, args.partitioned)
        tbl = tbl.take(pa.array(rng.permutation(rows)))  # updates and inserts interleaved
        path = sdir / f"batch_{name}.parquet"
        pq.write_table(tbl, path, compression="zstd")
        su = rng.choice(half, min(SAMPLE, half), replace=False)
        si = half + rng.choice(rows - half, min(SAMPLE, rows - half), replace=False)
        ids_py, ts_np = b_ids.to_pylist(), ts
        cases.append(Case(name, pattern, rows, str(path), [ids_py[i] for i in su], [int(ts_np[i]) for i in su],
                          [ids_py[i] for i in si], [int(ts_np[i]) for i in si]))
    return files, cases


# == helpers ========================================================================================
def human_rows(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def size_label(n: int) -> str:
    return "warmup" if n < 0 else human_rows(n).lower()


def dir_size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += (Path(dirpath) / f).stat().st_size
            except OSError:
                pass
    return total


def data_files(path: Path) -> int:
    return sum(1 for _, _, fs in os.walk(path) for f in fs if f.endswith(".parquet"))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def parse_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


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


def version_of(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def child_env() -> dict:
    """The environment of a cold process: ours, less what this benchmark set for its own session."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_GATEWAY", "BUCKETINDEX_", "SPARK_CONNECT_MODE"))}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class PeakRss:
    """Peak of the summed RSS of a process (and, with ``tree``, its descendants), polled in a thread."""

    def __init__(self, pid: int, tree: bool = True, interval: float = 0.1, extra_pids: tuple[int, ...] = ()):
        import psutil

        self._psutil = psutil
        self.pids = (pid, *extra_pids)
        self.tree, self.interval = tree, interval
        self.peak = self.before = 0
        self.descendants_seen = False  # did the process start children (a JVM)?
        #: per pid seen, the last (read_chars, write_chars) of /proc/<pid>/io: every read/write
        #: call, page cache included; polled, so the last interval before a process exits is missed
        self._io: dict[int, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        ps = self._psutil
        total = 0
        for pid in self.pids:
            try:
                p = ps.Process(pid)
                procs = [p, *(p.children(recursive=True) if self.tree else [])]
            except ps.Error:
                continue
            if len(procs) > 1 and pid == self.pids[0]:
                self.descendants_seen = True
            for q in procs:
                try:
                    total += q.memory_info().rss
                    io = q.io_counters()
                    self._io[q.pid] = (io.read_chars, io.write_chars)
                except (ps.Error, AttributeError):  # AttributeError: no io_counters on this platform
                    pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakRss":
        self.before = self._sample()
        self.peak = self.before
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())

    @property
    def peak_mb(self) -> float:
        return round(self.peak / 2**20, 1)

    @property
    def io_chars(self) -> tuple[int, int]:
        """Bytes read and written by every process of the tree seen (lower bounds: polled)."""
        return sum(r for r, _ in self._io.values()), sum(w for _, w in self._io.values())

    @property
    def before_mb(self) -> float:
        return round(self.before / 2**20, 1)


def run_cold(cmd: list[str], logs: Path, name: str, timeout: float, extra_pids: tuple[int, ...] = ()) -> dict:
    """Run ``cmd`` as a new process; wall time from start to exit and the tree's peak RSS."""
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / f"{name}.out", logs / f"{name}.err"
    env = child_env()
    env["BUCKETINDEX_SPARK_LOG"] = str(logs / f"{name}.spark.log")  # where the CLI sends the JVM's own log
    import resource

    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "w") as fo, open(err, "w") as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
        with PeakRss(p.pid, extra_pids=extra_pids) as mem:
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
                rc = f"timeout after {timeout:.0f} s"
        wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the process and the children it waited for (its JVM): on a loaded machine, a
    # cold process's wall time mostly measures the queue for a core; its CPU time much less so
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if mem.descendants_seen:  # a JVM child is not waited for by its python parent: its CPU is not in the sum
        cpu = None
    text = out.read_text()
    last = text.strip().splitlines()[-1] if text.strip() else ""
    try:
        payload = json.loads(last) if last.startswith("{") else {}
    except json.JSONDecodeError:
        payload = {}
    read_chars, write_chars = mem.io_chars
    rec = {"time_s": round(wall, 3), "cpu_s": round(cpu, 3) if cpu is not None else None, "peak_mem_mb": mem.peak_mb,
           "read_chars": read_chars, "write_chars": write_chars,
           "mem_scope": "the new process and its children",
           "rc": rc, "stdout": str(out), "stderr": str(err), "result": payload}
    if rc != 0:
        tail = "\n".join(err.read_text().splitlines()[-12:])
        rec["error"] = f"exit {rc}: {tail[-1500:]}"
    return rec


# == per-contender: build, fresh copy, run, read back ===============================================
class Bench:
    def __init__(self, args, workdir: Path):
        self.args, self.workdir = args, workdir
        self.spark = None
        self.spark_start_s = None
        self.code: dict[str, dict] = {}
        self.n = 0
        self.iceberg_db = workdir / "iceberg" / "catalog.db"
        self.iceberg_wh = workdir / "iceberg" / "warehouse"
        self.part = "month" if args.partitioned else None
        self.built: dict[tuple[str, int], dict] = {}

    # -- sessions and catalogs -----------------------------------------------------------------
    def start_spark(self) -> None:
        from spark_jobs.jobs.session import get_spark

        t0 = time.perf_counter()
        self.spark = get_spark("local[*]", app_name="compare-peers")
        self.spark_start_s = time.perf_counter() - t0

    def catalog(self):
        self.iceberg_wh.mkdir(parents=True, exist_ok=True)
        return self.peer("pyiceberg")["catalog"](str(self.iceberg_db), str(self.iceberg_wh))

    def peer(self, name: str) -> dict:
        if name not in self.code:
            self.code[name] = load_code(name)
        return self.code[name]

    def table_dir(self, contender: str, size: int) -> Path:
        return self.workdir / "tables" / size_label(size) / contender

    # -- building ------------------------------------------------------------------------------
    def build_engine(self, contender: str) -> str:
        """Who builds a bucketindex table: Spark when a Spark contender of the same table is in the run
        (its figures stay comparable with earlier runs) or ``--build-engine spark``, else the Arrow engine."""
        if self.args.build_engine != "auto":
            return self.args.build_engine
        v = variant_of(contender)
        return "spark" if self.spark is not None and any(variant_of(c) == v and engine_of(c) == "spark"
                                                           for c in self.args.contenders_list) else "arrow"

    def build(self, contender: str, size: int, files: list[str]) -> dict:
        """Build the contender's table from the base files. bucketindex contenders that differ only by
        engine share one table (each run copies it); with ``--keep``, a table built by an earlier run on
        the same data and with the same build engine (``<table>.build.json``) is reused."""
        if contender.startswith("bucketindex") and variant_of(contender) != contender:
            shared = self.built.get((variant_of(contender), size))
            if shared is None:
                shared = self.build(variant_of(contender), size, files)
            self.built[(contender, size)] = shared
            return shared
        t0 = time.perf_counter()
        path = self.table_dir(contender, size)
        engine = self.build_engine(contender) if contender.startswith("bucketindex") else None
        stamp = path.parent / f"{contender}.build.json"
        key = {"base": base_key(size, self.args), "engine": engine}
        if self.args.keep and size >= 0 and stamp.exists() and path.exists():
            cached = json.loads(stamp.read_text())
            if cached.get("key") == key and (contender != "pyiceberg" or (
                    self.catalog().table_exists(cached["info"]["name"])
                    and Path(cached["info"]["metadata_location"].removeprefix("file://")).exists())):
                info = cached["info"]
                if "base_files" in info:
                    info["base_files"] = set(info["base_files"])
                info["reused"] = True
                self.built[(contender, size)] = info
                return info
        stamp.unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        info: dict = {"path": str(path)}
        if contender == "delta_rs":
            import pyarrow.dataset as ds
            from deltalake import write_deltalake

            write_deltalake(str(path), ds.dataset(files, format="parquet").scanner().to_reader(),
                            partition_by=[self.part] if self.part else None)
        elif contender == "pyiceberg":
            cat = self.catalog()
            if ("bench",) not in cat.list_namespaces():
                cat.create_namespace("bench")
            name = f"bench.base_{size_label(size)}"
            if cat.table_exists(name):
                cat.purge_table(name)
            schema = pq.read_schema(files[0])
            tbl = cat.create_table(name, schema=schema, location=f"file://{path}")
            if self.part:
                with tbl.update_spec() as spec:
                    spec.add_identity(self.part)
            with tbl.transaction() as tx:
                for f in files:
                    tx.append(pq.read_table(f))
            tbl = cat.load_table(name)
            info.update(name=name, metadata_location=tbl.metadata_location,
                        base_files={str(p) for p in path.rglob("*") if p.is_file()})
        elif contender == "plain_spark":
            w = self.spark.read.parquet(*files).write.mode("overwrite")
            (w.partitionBy(self.part) if self.part else w).parquet(str(path))
        else:  # bucketindex: one upsert per base file, the first creates the table, at defaults
            from spark_jobs.table.action.upsert import UpsertOptions

            ix = contender.split("_")[1]
            table_type = "merge_on_read" if contender.endswith("_mor") else None  # else the default
            for i, f in enumerate(files):
                opts = UpsertOptions(table=str(path), source=f, record_key=["id"], precombine_field="ts",
                                     partition_field=self.part, index=ix, batch_id=f"build-{i}",
                                     table_type=table_type, engine=engine)
                if engine == "spark":
                    from spark_jobs.jobs.upsert import run_upsert

                    self.spark.conf.set("spark.sql.shuffle.partitions", SESSION_SHUFFLE_PARTITIONS)
                    run_upsert(self.spark, opts)
                else:
                    from spark_jobs.arrow_engine.upsert import run_upsert as run_arrow

                    run_arrow(opts)
                    pa.default_memory_pool().release_unused()
            info["build_engine"] = engine
        info["build_s"] = round(time.perf_counter() - t0, 1)
        info["bytes"] = dir_size(path)
        info["files"] = data_files(path)
        self.built[(contender, size)] = info
        if self.args.keep and size >= 0:
            stamp.write_text(json.dumps({"key": key, "info": {
                k: (sorted(v) if isinstance(v, set) else v) for k, v in info.items()}}))
        return info

    # -- one measured upsert -------------------------------------------------------------------
    def fresh(self, contender: str, size: int) -> str:
        """A fresh copy of the built table (a catalog name for pyiceberg); returns its handle."""
        self.n += 1
        base = self.built[(variant_of(contender), size)]
        if contender == "pyiceberg":
            name = f"bench.run_{self.n}"
            self.catalog().register_table(name, base["metadata_location"])
            return name
        dst = self.workdir / "runs" / f"{contender}_{size_label(size)}_{self.n}"
        shutil.rmtree(dst, ignore_errors=True)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(base["path"], dst)
        return str(dst)

    def discard(self, contender: str, size: int, handle: str) -> None:
        if contender == "pyiceberg":
            self.catalog().drop_table(handle)  # the catalog entry; the files the run wrote follow
            base = self.built[(contender, size)]
            for p in Path(base["path"]).rglob("*"):
                if p.is_file() and str(p) not in base["base_files"]:
                    p.unlink()
        else:
            shutil.rmtree(handle, ignore_errors=True)

    def cold_cmd(self, contender: str, handle: str, case: Case) -> list[str]:
        py = sys.executable
        if contender == "delta_rs":
            return [py, "-c", DELTA_RS_CODE, json.dumps({"table": handle, "source": case.path})]
        if contender == "pyiceberg":
            return [py, "-c", PYICEBERG_CODE, json.dumps({"catalog_db": str(self.iceberg_db),
                                                          "warehouse": str(self.iceberg_wh), "name": handle,
                                                          "source": case.path})]
        if contender == "plain_spark":
            return [py, "-c", PLAIN_SPARK_CODE, json.dumps({"table": handle, "source": case.path,
                                                            "partition_col": self.part})]
        # the bucketindex console script's module, as a user runs it: at defaults, no tuning flag
        cmd = [py, "-m", "airflow_provider_bucketindex.cli", "upsert", handle, case.path, "--record-key", "id",
               "--precombine-field", "ts"]
        if self.part:
            cmd += ["--partition-field", self.part]
        if contender == "bucketindex_record_connect":
            cmd += ["--remote", self.args.remote]  # --remote means Spark
        elif engine_of(contender) in ("spark", "arrow"):
            cmd += ["--engine", engine_of(contender)]  # explicit: the default (auto) may pick either
        elif self.args.memory_budget:  # auto, at the machine's budget unless --memory-budget is given
            cmd += ["--memory-budget", self.args.memory_budget]
        return cmd

    def run_warm(self, contender: str, handle: str, case: Case) -> dict:
        spark_side = contender in SPARK_CONTENDERS
        if spark_side:
            self.spark.conf.set("spark.sql.shuffle.partitions", SESSION_SHUFFLE_PARTITIONS)
        gc.collect()
        detail: dict = {}
        with PeakRss(os.getpid(), tree=spark_side) as mem:
            t0, c0 = time.perf_counter(), time.process_time()
            if contender == "delta_rs":
                detail = self.peer("delta_rs")["upsert"](handle, case.path)
            elif contender == "pyiceberg":
                detail = self.peer("pyiceberg")["upsert"](str(self.iceberg_db), str(self.iceberg_wh), handle,
                                                          case.path)
            elif contender == "plain_spark":
                detail = self.peer("plain_spark")["rewrite"](self.spark, handle, case.path, self.part)
            elif engine_of(contender) == "arrow":  # the Python API in this process: no Spark session, no JVM
                from spark_jobs.arrow_engine.upsert import run_upsert as run_arrow
                from spark_jobs.table.action.engine import EngineChoice
                from spark_jobs.table.action.upsert import UpsertOptions

                res = run_arrow(UpsertOptions(table=handle, source=case.path, record_key=["id"],
                                              precombine_field="ts", partition_field=self.part, engine="arrow"),
                                choice=EngineChoice("arrow", "--engine arrow (in-process Python API)"))
                detail = {"counts": res["counts"], "timings_ms": res["timings_ms"], "retries": res.get("retries"),
                          "engine": res.get("engine")}
            else:
                from spark_jobs.jobs.upsert import run_upsert
                from spark_jobs.table.action.upsert import UpsertOptions

                res = run_upsert(self.spark, UpsertOptions(table=handle, source=case.path, record_key=["id"],
                                                           precombine_field="ts", partition_field=self.part,
                                                           engine="spark"))
                detail = {"counts": res["counts"], "timings_ms": res["timings_ms"], "retries": res.get("retries"),
                          "engine": res.get("engine")}
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"time_s": round(wall, 3), "peak_mem_mb": mem.peak_mb,
                # this process's CPU (all its threads; a Spark contender's JVM is not counted)
                **({} if spark_side else {"cpu_s": round(cpu, 3)}), "rss_before_mb": mem.before_mb,
                "mem_growth_mb": round(mem.peak_mb - mem.before_mb, 1),
                "mem_scope": "this process + its JVM" if spark_side else "this python process",
                "detail": detail}

    # -- reading back --------------------------------------------------------------------------
    def read_back(self, contender: str, handle: str) -> pa.Table:
        if contender == "delta_rs":
            from deltalake import DeltaTable

            return DeltaTable(handle).to_pyarrow_table(columns=["id", "ts"])
        if contender == "pyiceberg":
            return self.catalog().load_table(handle).scan(selected_fields=("id", "ts")).to_arrow()
        if contender == "plain_spark":
            import pyarrow.dataset as ds

            return ds.dataset(handle, format="parquet", partitioning="hive" if self.part else None).to_table(
                columns=["id", "ts"])
        from spark_jobs.table.reader import read_arrow

        return read_arrow(handle).select(["id", "ts"])


def check(tbl: pa.Table, expected_rows: int, case: Case) -> dict:
    rows = tbl.num_rows
    distinct = pc.count_distinct(tbl["id"]).as_py()
    sel = tbl.filter(pc.is_in(tbl["id"], value_set=pa.array(case.sample_ids)))
    got = dict(zip(sel["id"].to_pylist(), sel["ts"].to_pylist()))
    bad_upd = sum(got.get(k) != v for k, v in zip(case.sample_ids[:case.n_upd_sample], case.sample_ts))
    bad_ins = sum(got.get(k) != v for k, v in zip(case.sample_ids[case.n_upd_sample:],
                                                  case.sample_ts[case.n_upd_sample:]))
    ok = rows == expected_rows and distinct == rows and not bad_upd and not bad_ins
    return {"ok": ok, "rows": rows, "expected_rows": expected_rows, "distinct_ids": distinct,
            "sampled_updates_wrong": bad_upd, "sampled_inserts_wrong": bad_ins,
            "sampled": len(case.sample_ids)}


# == the benchmark ==================================================================================
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000000", help="table sizes in rows, comma separated (default 1M)")
    p.add_argument("--with-50m", action="store_true", help="add a 50M-row table to --sizes")
    p.add_argument("--batch", type=int, default=100_000, help="measured batch: half updates, half inserts")
    p.add_argument("--small-batch", type=int, default=200, help="the scheduled small batch (0: none)")
    p.add_argument("--patterns", default=",".join(PATTERNS), help="update patterns of --batch: uniform, recent")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="subset of " + ", ".join(CONTENDERS))
    p.add_argument("--modes", default=",".join(MODES), help="cold (a new process per upsert), warm (in-process)")
    p.add_argument("--repeats", type=int, default=1, help="measured upserts per (case, contender, mode); median")
    p.add_argument("--small-repeats", type=int, default=None,
                   help="repeats of the small-batch case (default: --repeats): the noisiest, and the cheapest")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="the cold auto contender's --memory-budget (default: the CLI's, a quarter of RAM)")
    p.add_argument("--build-engine", choices=("auto", "spark", "arrow"), default="auto",
                   help="who builds the bucketindex tables (auto: spark when a spark contender of that table "
                        "runs, else arrow)")
    p.add_argument("--partitioned", action="store_true", help="add a 'month' partition column (6 values)")
    p.add_argument("--remote", default=None, metavar="sc://HOST:PORT",
                   help="Spark Connect server for bucketindex_record_connect (the CLI's --remote)")
    p.add_argument("--base-file-rows", type=int, default=2_000_000,
                   help="rows per base Parquet file; bucketindex builds its tables with one upsert per file")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before a cold process is killed")
    p.add_argument("--workdir", default=None, help="where tables, sources and logs go (default: a temp dir)")
    p.add_argument("--keep", action="store_true",
                   help="keep the built tables, sources and logs (the per-run copies are always removed)")
    p.add_argument("--seed", type=int, default=20250301)
    p.add_argument("--json-out", default=None, help="also write the final JSON object to this file")
    args = p.parse_args()

    sizes = [int(float(x)) for x in parse_list(args.sizes)]
    if args.with_50m and 50_000_000 not in sizes:
        sizes.append(50_000_000)
    contenders = parse_list(args.contenders)
    args.contenders_list = contenders
    modes = parse_list(args.modes)
    args.patterns_list = parse_list(args.patterns)
    for c in contenders:
        if c not in CONTENDERS:
            p.error(f"unknown contender {c!r} (one of {', '.join(CONTENDERS)})")
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}")
    for pat in args.patterns_list:
        if pat not in PATTERNS:
            p.error(f"unknown pattern {pat!r}")
    if args.batch < 2 or (args.small_batch and args.small_batch < 2) or args.repeats < 1 or (
            args.small_repeats is not None and args.small_repeats < 1):
        p.error("--batch and --small-batch must be at least 2, --repeats and --small-repeats at least 1")
    for s in sizes:
        if args.batch // 2 > s or ("recent" in args.patterns_list
                                    and args.batch // 2 > int(np.ceil(s * RECENT_FRACTION))):
            p.error(f"size {s:,}: the batch's {args.batch // 2:,} updates must fit in the table "
                    f"(and, for 'recent', in its newest 5 %: {int(np.ceil(s * RECENT_FRACTION)):,} keys)")

    t_script = time.perf_counter()
    own = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="compare_peers_") if own else args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"workdir {workdir}")
    os.environ.setdefault("BUCKETINDEX_SPARK_LOG_LEVEL", "ERROR")  # this process only; cold runs get the default
    import logging

    logging.basicConfig(level=logging.INFO, format="    %(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    for noisy in ("pyiceberg", "deltalake", "sqlalchemy"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    b = Bench(args, workdir)
    skipped: dict[str, str] = {}
    if "bucketindex_record_connect" in contenders:
        reason = connect_unavailable(args)
        if reason:
            skipped["bucketindex_record_connect"] = reason
            log(f"SKIPPED bucketindex_record_connect: {reason}")
            contenders.remove("bucketindex_record_connect")

    env = {"cpu": cpu_model(), "cores": os.cpu_count(), "mem_gb": mem_total_gb(), "python": platform.python_version(),
           "pyspark": version_of("pyspark"), "pyarrow": pa.__version__, "numpy": np.__version__,
           "deltalake": version_of("deltalake"), "pyiceberg": version_of("pyiceberg"), "java": java_version(),
           "commit": git_head(), "load_avg_1m_at_start": round(os.getloadavg()[0], 1),
           "load_avg_at_start": [round(x, 1) for x in os.getloadavg()]}
    log("machine: " + ", ".join(f"{k} {v}" for k, v in env.items()))

    needs_spark = any(c in SPARK_CONTENDERS or c == "bucketindex_record_connect" for c in contenders) or (
        args.build_engine == "spark" and any(c.startswith("bucketindex") for c in contenders))
    if needs_spark:
        b.start_spark()
        log(f"spark session local[*] at bucketindex's defaults (get_spark) started in {b.spark_start_s:.1f} s "
            f"(builds and warm runs use it)")
    runs: list[dict] = []
    try:
        if "warm" in modes:
            warm_up(b, contenders, workdir)
        for size in sizes:
            runs += run_size(b, size, contenders, modes, args)
    finally:
        if b.spark is not None:
            b.spark.stop()
        if not args.keep:
            shutil.rmtree(workdir if own else workdir / "tables", ignore_errors=True)
            if not own:
                for d in ("src", "runs", "iceberg", "warmup", "logs"):
                    shutil.rmtree(workdir / d, ignore_errors=True)
    env["load_avg_1m_at_end"] = round(os.getloadavg()[0], 1)
    env["load_avg_at_end"] = [round(x, 1) for x in os.getloadavg()]
    result = summarise(runs, sizes, contenders, modes, args, skipped)
    result.update({"env": env, "spark_start_s": round(b.spark_start_s, 2) if b.spark_start_s else None,
                   "build": {f"{c}@{size_label(s)}": {k: v for k, v in i.items() if k not in ("base_files", "path")}
                             for (c, s), i in b.built.items()}})
    result["runtime_s"] = round(time.perf_counter() - t_script, 1)
    log(f"benchmark runtime {result['runtime_s']:.0f} s")
    emit_result(result, args.json_out)


def connect_unavailable(args) -> str | None:
    if not args.remote:
        return "no --remote sc://HOST:PORT given (start a Spark Connect server and pass its address)"
    help_text = subprocess.run([sys.executable, "-m", "airflow_provider_bucketindex.cli", "upsert", "--help"],
                               capture_output=True, text=True, cwd=ROOT, env=child_env()).stdout
    if "--remote" not in help_text:
        return "the bucketindex CLI has no --remote option yet (the Spark Connect path has not landed)"
    return None


def warm_up(b: Bench, contenders: list[str], workdir: Path) -> None:
    """One small upsert per warm contender into a scratch table: imports, JIT and first-job costs."""
    t0 = time.perf_counter()
    args = argparse.Namespace(**{**vars(b.args), "batch": 1000, "small_batch": 0, "patterns_list": ["uniform"],
                                 "base_file_rows": 4000})
    files, cases = generate(4000, args, workdir / "warmup" / "src")
    for c in contenders:
        if c == "bucketindex_record_connect" or c in AUTO_CONTENDERS:  # cold only
            continue
        b.build(c, -1, files)
        h = b.fresh(c, -1)
        rec = b.run_warm(c, h, cases[0])
        chk = check(b.read_back(c, h), 4000 + cases[0].inserts, cases[0])
        b.discard(c, -1, h)
        log(f"warm-up {c:19s} {rec['time_s']:6.2f} s ({'ok' if chk['ok'] else 'CHECK FAILED'})")
        if not chk["ok"]:
            loud(f"warm-up correctness check failed for {c}: {chk}")
    for (c, size), info in list(b.built.items()):
        if size == -1:
            b.built.pop((c, size))
            if c == "pyiceberg":
                b.catalog().drop_table(info["name"])
    shutil.rmtree(b.table_dir("x", -1).parent, ignore_errors=True)
    shutil.rmtree(workdir / "warmup", ignore_errors=True)
    log(f"warm-up done in {time.perf_counter() - t0:.1f} s")


def run_size(b: Bench, size: int, contenders: list[str], modes: list[str], args) -> list[dict]:
    sl = human_rows(size)
    sdir = b.workdir / "src" / size_label(size)
    t0 = time.perf_counter()
    files, cases = generate(size, args, sdir)
    log(f"[{sl}] generated {size:,} rows in {len(files)} base file(s) + batches "
        f"{', '.join(c.name for c in cases)} in {time.perf_counter() - t0:.1f} s ({human_bytes(dir_size(sdir))} "
        f"of zstd Parquet)")
    for c in contenders:
        if c == "bucketindex_record_connect":
            if ("bucketindex_record", size) not in b.built:
                b.build("bucketindex_record", size, files)
            continue
        if (c, size) in b.built:
            continue
        shared = (variant_of(c), size) in b.built and variant_of(c) != c
        info = b.build(c, size, files)
        how = ("shares the table of " + variant_of(c) if shared else "reused from an earlier run (--keep)"
               if info.get("reused") else f"built in {info['build_s']:6.1f} s")
        log(f"[{sl}] {c:28s} {how}: {info['files']} data files, {human_bytes(info['bytes'])} on disk"
            + (f", built by the {info['build_engine']} engine" if info.get("build_engine") else "")
            + " (not measured)")

    out: list[dict] = []
    turn = 0
    small_repeats = args.small_repeats or args.repeats
    for r in range(max(args.repeats, small_repeats)):
        for case in cases:
            if r >= (small_repeats if case.name.startswith("small_") else args.repeats):
                continue
            order = contenders[turn % len(contenders):] + contenders[:turn % len(contenders)]
            turn += 1
            for c in order:
                cmodes = ["connect"] if c == "bucketindex_record_connect" else (
                    [m for m in modes if m == "cold"] if c in AUTO_CONTENDERS else
                    modes if turn % 2 else list(reversed(modes)))
                for mode in cmodes:
                    out.append(measure(b, size, case, c, mode, r))
    if not b.args.keep:
        shutil.rmtree(b.workdir / "tables" / size_label(size), ignore_errors=True)
        shutil.rmtree(sdir, ignore_errors=True)
        if "pyiceberg" in contenders:
            b.catalog().drop_table(b.built[("pyiceberg", size)]["name"])
    return out


def measure(b: Bench, size: int, case: Case, contender: str, mode: str, repeat: int) -> dict:
    sl = human_rows(size)
    rec: dict = {"size": size, "case": case.name, "pattern": case.pattern, "batch": case.rows,
                 "contender": contender, "mode": mode, "repeat": repeat, "load_1m": round(os.getloadavg()[0], 1)}
    handle = b.fresh(contender, size)
    try:
        if mode == "warm":
            rec.update(b.run_warm(contender, handle, case))
        else:
            extra = server_pids(b.args.remote) if mode == "connect" else ()
            logs = b.workdir / "logs" / size_label(size)
            rec.update(run_cold(b.cold_cmd(contender, handle, case), logs,
                                f"{case.name}_{contender}_{mode}_{repeat}", b.args.timeout, extra))
            if mode == "connect":
                rec["mem_scope"] = "CLI client tree" + (" + Connect server tree" if extra else "")
            elif contender in SPARK_CONTENDERS:
                rec["mem_scope"] = "the new process tree (python + its JVM)"
            if contender.startswith("bucketindex"):
                rec.update(engine_said(rec))
    except Exception as e:  # a contender that fails is reported, and the others still run
        rec["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:1500]}"
    detail = describe(rec)
    if "error" in rec:
        rec["ok"] = False
        loud(f"[{sl}] {case.name} {contender} {mode} FAILED: {rec['error']}")
    else:
        t0 = time.perf_counter()
        try:
            chk = check(b.read_back(contender, handle), size + case.inserts, case)
        except Exception as e:
            chk = {"ok": False, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"}
        pa.default_memory_pool().release_unused()  # the read-back must not inflate the next warm run's figures
        rec["check"] = chk
        rec["ok"] = chk["ok"]
        log(f"[{sl}] {case.name:13s} {contender:26s} {mode:7s} {rec['time_s']:8.2f} s"
            + (f" (cpu {rec['cpu_s']:.2f} s)" if rec.get("cpu_s") is not None else "") + f"  load {rec['load_1m']}  peak "
            f"{rec['peak_mem_mb']:7.0f} MB  {detail}  check {'OK' if chk['ok'] else 'FAILED'} "
            f"[{time.perf_counter() - t0:.1f} s]")
        if not chk["ok"]:
            loud(f"[{sl}] {case.name} {contender} {mode}: CORRECTNESS CHECK FAILED: {chk}")
    rec.pop("result", None)
    b.discard(contender, size, handle)
    return rec


ENGINE_LINE = re.compile(r"bucketindex\.engine: engine: (\w+) \((.*)\)\s*$")


def engine_said(rec: dict) -> dict:
    """The engine a cold bucketindex CLI ran (its JSON line's ``engine``) and why (its last
    ``bucketindex.engine`` log line on stderr: a fallback from arrow to spark logs a second one)."""
    out: dict = {}
    name = (rec.get("result") or {}).get("engine")
    reason = None
    try:
        for line in Path(rec["stderr"]).read_text(errors="replace").splitlines():
            m = ENGINE_LINE.search(line)
            if m:
                reason = m.group(2) if name in (None, m.group(1)) else reason
                name = name or m.group(1)
    except (OSError, KeyError):
        pass
    if name:
        out["engine"] = name
    if reason:
        out["engine_reason"] = reason
    if name == "arrow":
        out["mem_scope"] = "the new python process (arrow engine: no JVM)"
    return out


def server_pids(remote: str | None) -> tuple[int, ...]:
    """The process listening on the Connect port (to count the server's memory), if visible."""
    m = re.search(r":(\d+)", remote or "")
    if not m:
        return ()
    try:
        import psutil

        return tuple({c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == int(m.group(1))
                      and c.status == psutil.CONN_LISTEN and c.pid})
    except Exception:  # noqa: BLE001 - best effort
        return ()


def describe(rec: dict) -> str:
    """One line of what the contender said about its own run (phases, counts, start-up)."""
    c, mode = rec["contender"], rec["mode"]
    if mode == "warm":
        d = rec.get("detail") or {}
    else:
        d = rec.get("result") or {}
    if c.startswith("bucketindex"):
        t = d.get("timings_ms", {})
        if mode != "warm" and t.get("total_ms") is not None:
            rec["process_start_s"] = round(rec["time_s"] - t["total_ms"] / 1000, 2)
        phases = {k: t[f"{k}_ms"] for k in PHASES if f"{k}_ms" in t}
        if phases:
            rec["phases_ms"] = phases
        cnt = d.get("counts", {})
        if mode == "warm" and d.get("engine"):
            rec["engine"] = d["engine"]
        return ((f"[{rec['engine']}] " if rec.get("engine") else "")
                + " ".join(f"{k} {v / 1000:.2f}" for k, v in phases.items())
                + (f" | +{cnt.get('inserted')} ~{cnt.get('updated')}" if cnt else "")
                + (f" | start+exit {rec['process_start_s']:.1f} s" if "process_start_s" in rec else ""))
    if mode != "warm" and d.get("upsert_s") is not None:
        rec["process_start_s"] = round(rec["time_s"] - d["upsert_s"], 2)
        rec["child"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()}
    parts = []
    if d.get("updated") is not None:
        parts.append(f"+{d.get('inserted')} ~{d.get('updated')}")
    if d.get("files_removed") is not None:
        parts.append(f"files -{d['files_removed']} +{d['files_added']}")
    if "process_start_s" in rec:
        parts.append(f"start+exit {rec['process_start_s']:.1f} s")
    if mode == "warm":
        rec["counts"] = {k: v for k, v in d.items() if v is not None}
    return " | ".join(parts)


# == figures ========================================================================================
def summarise(runs: list[dict], sizes: list[int], contenders: list[str], modes: list[str], args,
              skipped: dict[str, str]) -> dict:
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["size"], r["case"], r["contender"], r["mode"]), []).append(r)
    figures = []
    med: dict[tuple, float] = {}
    for (size, case, c, mode), rs in groups.items():
        good = [x["time_s"] for x in rs if "error" not in x]
        cpu = [x["cpu_s"] for x in rs if "error" not in x and x.get("cpu_s") is not None]
        f = {"size": size, "case": case, "pattern": rs[0]["pattern"], "batch": rs[0]["batch"], "contender": c,
             "mode": mode, "time_s": round(statistics.median(good), 3) if good else None,
             **({"cpu_s": round(statistics.median(cpu), 3)} if cpu else {}),
             "load_1m": [x.get("load_1m") for x in rs],
             "times_s": [x.get("time_s") for x in rs],
             "peak_mem_mb": max((x.get("peak_mem_mb") or 0) for x in rs),
             "ok": all(x.get("ok") for x in rs), "check": rs[-1].get("check"), "repeats": len(rs)}
        for k in ("mem_scope", "process_start_s", "phases_ms", "mem_growth_mb", "rss_before_mb", "child", "counts",
                  "engine", "engine_reason"):
            if k in rs[-1]:
                f[k] = rs[-1][k]
        engines = sorted({x["engine"] for x in rs if x.get("engine")})
        if len(engines) > 1:  # auto chose differently between repeats
            f["engine"] = "/".join(engines)
        errors = [x["error"] for x in rs if "error" in x]
        if errors:
            f["error"] = errors[0]
        figures.append(f)
        if good and f["ok"]:
            med[(size, case, c, mode)] = f["time_s"]

    # ratios: peer time / bucketindex time; cold compares cold processes (a peer's in-process time if
    # its cold run was not measured), warm compares in-process calls
    ratios = []
    headline: dict = {}
    head_case = f"uniform_{human_rows(args.batch)}" if "uniform" in args.patterns_list else (
        f"{args.patterns_list[0]}_{human_rows(args.batch)}" if args.patterns_list else None)
    small_case = f"small_{human_rows(args.small_batch)}" if args.small_batch else None
    cases = sorted({(r["size"], r["case"]) for r in runs}, key=lambda x: (x[0], x[1]))
    for size, case in cases:
        for peer in PEERS:
            for mode in ("cold", "warm"):
                peer_mode = mode if (size, case, peer, mode) in med else "warm"
                pt = med.get((size, case, peer, peer_mode))
                if pt is None:
                    continue
                own = {ix: med.get((size, case, f"bucketindex_{ix}", mode)) for ix in OWN}
                best_ix = min((ix for ix in own if own[ix]), key=lambda ix: own[ix], default=None)
                for label, t in (*((ix, own[ix]) for ix in OWN),
                                 (f"best ({best_ix})", own.get(best_ix) if best_ix else None)):
                    if t:
                        ratios.append({"size": size, "case": case, "vs": peer, "mode": mode, "peer_mode": peer_mode,
                                       "bucketindex": label, "speedup": round(pt / t, 2)})
                if own["record"] and case == head_case:
                    headline.setdefault(f"speedup_vs_{peer}_{size_label(size)}", {})[mode] = round(
                        pt / own["record"], 2)
                    if peer_mode != mode:
                        headline[f"speedup_vs_{peer}_{size_label(size)}"][f"{mode}_peer_mode"] = peer_mode
                if own["record_mor"] and case == head_case:  # the merge-on-read table type
                    headline.setdefault(f"mor_speedup_vs_{peer}_{size_label(size)}", {})[mode] = round(
                        pt / own["record_mor"], 2)
                for label in ("record_mor_arrow", "record_arrow", "bucket_arrow", "record_mor_auto"):
                    if own[label] and case in (head_case, small_case):  # the engines of issue 23
                        key = f"{label}_speedup_vs_{peer}_{size_label(size)}" + ("_small" if case == small_case
                                                                                 else "")
                        headline.setdefault(key, {})[mode] = round(pt / own[label], 2)
                        if peer_mode != mode:
                            headline[key][f"{mode}_peer_mode"] = peer_mode

    peak = {}
    for f in figures:
        if f["size"] == max(sizes):
            key = f"{f['contender']}_{f['mode']}"
            peak[key] = max(peak.get(key, 0), f["peak_mem_mb"])

    failed = [f"{f['contender']} {f['mode']} {human_rows(f['size'])} {f['case']}" for f in figures if not f["ok"]]
    print_summary(figures, ratios, headline, failed, skipped)
    return {
        **headline,
        "headline_case": head_case,
        "headline_note": "speedup = peer time / bucketindex record time; cold: whole processes, warm: in-process",
        "all_ok": not failed, "failed": failed, "skipped": skipped,
        "peak_driver_mem_mb": peak,
        "figures": figures, "ratios": ratios,
        "setup": {"sizes": sizes, "batch": args.batch, "small_batch": args.small_batch,
                  "patterns": args.patterns_list, "recent_fraction": RECENT_FRACTION, "contenders": contenders,
                  "modes": modes, "repeats": args.repeats, "small_repeats": args.small_repeats or args.repeats,
                  "memory_budget": args.memory_budget, "build_engine": args.build_engine,
                  "partitioned": args.partitioned,
                  "base_file_rows": args.base_file_rows, "remote": args.remote,
                  "columns": ["id", "ts", "amount", "qty", "note", "region", "flag", "event_date", "score"]
                  + (["month"] if args.partitioned else []),
                  "spark": "local[*]; cold: CLI / plain script at defaults; warm: one session from "
                           "spark_jobs.jobs.session.get_spark('local[*]')"},
        "runs": runs,
    }


def print_summary(figures: list[dict], ratios: list[dict], headline: dict, failed: list[str],
                  skipped: dict[str, str]) -> None:
    log("")
    log(f"{'size':>5s} {'case':13s} {'contender':28s} {'mode':7s} {'time s':>8s} {'cpu s':>7s} {'start s':>8s} "
        f"{'peak MB':>8s} {'engine':>7s}  check")
    for f in sorted(figures, key=lambda x: (x["size"], x["case"], x["contender"], x["mode"])):
        t = f"{f['time_s']:8.2f}" if f["time_s"] is not None else f"{'error':>8s}"
        st = f"{f['process_start_s']:8.1f}" if f.get("process_start_s") is not None else f"{'':>8s}"
        cs = f"{f['cpu_s']:7.2f}" if f.get("cpu_s") is not None else f"{'':>7s}"
        log(f"{human_rows(f['size']):>5s} {f['case']:13s} {f['contender']:28s} {f['mode']:7s} {t} {cs} {st} "
            f"{f['peak_mem_mb']:8.0f} {f.get('engine') or '':>7s}  {'ok' if f['ok'] else 'FAILED'}"
            + (f"  (auto: {f['engine_reason']})" if f["contender"] in AUTO_CONTENDERS and f.get("engine_reason")
               else ""))
    log("")
    log("speedup of bucketindex = peer time / bucketindex time (> 1: bucketindex faster); record (bucket)")
    log(f"{'size':>5s} {'case':13s} {'vs':12s} {'cold':>15s} {'warm':>15s}")
    cell: dict[tuple, dict] = {}
    for r in ratios:
        if not r["bucketindex"].startswith("best"):
            cell.setdefault((r["size"], r["case"], r["vs"]), {}).setdefault(r["mode"], {})[r["bucketindex"]] = (
                r["speedup"], r["peer_mode"])

    def fmt(d: dict | None, mode: str) -> str:
        if not d:
            return f"{'-':>15s}"
        rec, buck = d.get("record"), d.get("bucket")
        if not rec and not buck:
            return f"{'-':>15s}"
        txt = (f"{rec[0]:.2f}" if rec else "-") + (f" ({buck[0]:.2f})" if buck else "")
        pm = (rec or buck)[1]
        return f"{txt + ('*' if pm != mode else ''):>15s}"

    for (size, case, vs), d in sorted(cell.items()):
        log(f"{human_rows(size):>5s} {case:13s} {vs:12s} {fmt(d.get('cold'), 'cold')} {fmt(d.get('warm'), 'warm')}")
    engines = ("record_mor", "record_mor_arrow", "record_arrow", "bucket_arrow", "record_mor_auto")
    if any(r["bucketindex"] in engines[1:] for r in ratios):
        log("")
        log("the same, per engine (cold / warm; auto is cold only)")
        log(f"{'size':>5s} {'case':13s} {'vs':12s} " + " ".join(f"{e:>17s}" for e in engines))
        for (size, case, vs), d in sorted(cell.items()):
            row = []
            for e in engines:
                c, w = (d.get("cold") or {}).get(e), (d.get("warm") or {}).get(e)
                row.append(f"{(f'{c[0]:.2f}' if c else '-') + ' / ' + (f'{w[0]:.2f}' if w else '-'):>17s}")
            log(f"{human_rows(size):>5s} {case:13s} {vs:12s} " + " ".join(row))
    if any(r["peer_mode"] != r["mode"] for r in ratios):
        log("  * the peer's in-process time (its cold run was not measured)")
    for k, v in headline.items():
        log(f"{k:34s} {v}")
    for c, why in skipped.items():
        log(f"skipped {c}: {why}")
    if failed:
        loud("FAILED (error or correctness check): " + "; ".join(failed))


if __name__ == "__main__":
    main()
