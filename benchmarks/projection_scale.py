"""The projections at 1M and 10M rows (issue 39 item 4): each one's first full projection, what it adds to a commit, and each view's read cost with each reader.

A new script rather than a ``--base`` option of ``benchmarks/delta_mirror.py``: that harness
grows a 200-row table from nothing through one projection, on local disk and S3; this one needs a
large prebuilt table (kept, resumable), the scale run's realistic rows and oracle
(``benchmarks/scale.py``'s :class:`Dataset`: 12 columns, UUID keys, 1% deletes), three copies of the
table (a projection has one view at a time) and a read phase with four readers.

Per size (``--sizes``, default 1M):

1. **Build** (kept in ``--workdir``): ``scale.Dataset`` makes the base files and the CDC batches
   (``--batches``, default ``1000,100000,1000,100000,1000``) and keeps the expected checksums; the
   table is built by one cold ``bucketindex upsert ... --engine arrow --table-type merge_on_read``
   per base file (record index, unpartitioned, automatic compaction on: the default).
2. **Enable**: the table is copied three times: ``ro`` gets ``bucketindex mirror --enable delta`` then
   ``--enable iceberg`` (read-optimized view), ``fresh`` gets ``--enable iceberg --view fresh``,
   ``dfresh`` gets ``--enable delta --view fresh`` (logs as added files, inline deletion vectors);
   each is one cold CLI process, timed (wall, includes the interpreter's start), and the bytes the
   projection wrote (``_delta_log/``, ``metadata/``, ``deletes/``) measured.
3. **Commits**: each batch is upserted into each copy in this process (``cli.main``, Arrow engine,
   ``--delete-field _deleted``) with the projections on; each projection's ``mirror_commit`` is
   wrapped to time it and to measure the bytes it added under its directories, so the figure is
   exactly the hook's work for that projection (an automatic compaction's own entry, projected by
   the same hook, is reported apart). Per-process caches (Iceberg's manifests, Delta's version-0
   check and the fresh view's slice plans) are cleared before each upsert, as a CLI process (one
   commit each) starts without them.
4. **Reads** (best of ``--repeats``, in-process, warm): the table's own read
   (``spark_jobs.table.dataset(...).to_table()``); the Delta read-optimized view with
   ``deltalake`` (``DeltaTable.to_pyarrow_table``), Polars (``read_delta``) and DuckDB over
   ``DeltaTable.to_pyarrow_dataset()``; the Delta fresh view with ``deltalake``'s ``QueryBuilder``
   (``select *``: DataFusion applies deletion vectors), Polars (``read_delta``, which applies them
   too) and ``to_pyarrow_table`` (which refuses the ``deletionVectors`` feature: recorded as
   the error it raises); each Iceberg view with pyiceberg (``StaticTable`` scan
   ``to_arrow``), Polars (``scan_iceberg``) and DuckDB through pyiceberg's scan (``to_duckdb``).
   DuckDB's own ``delta_scan`` / ``iceberg_scan`` are tried too and reported as not loaded when
   the extensions cannot be fetched (offline). Every read's row count and every column's checksum
   are compared (outside the timing) with the expected ones: the oracle's for the table and the
   fresh views; the current bases' rows for the read-optimized views (format.md §11).

No S3 request counts here (copying the table into the counting moto server costs more than the
run; ``delta_mirror.py`` counts requests per commit, which do not depend on the table's size
except through the files a commit touches).

    nice -n 10 python benchmarks/projection_scale.py --workdir /work/h4-proj [--sizes 1000000,10000000]

``--views`` limits a run to some of the copies (default all three, ``ro,fresh,dfresh``): the
others are neither copied nor upserted into nor read, which saves their time and disk (a 10M-row
copy is ~1 GB). The table's own read is then taken from the first copy named; the
read-optimized views' expected rows need the ``ro`` copy. A subset's figures are merged into
those a previous run kept for the other copies.

The last line is one JSON object; ``<workdir>/results.json`` keeps each finished phase (a rerun
skips them; ``--redo`` names phases to run again: build,enable,commits,reads).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow.parquet as pq  # noqa: E402

import scale  # noqa: E402 (benchmarks/ is on sys.path)
from compare_peers import dir_size, human_rows, run_cold  # noqa: E402
from results import emit_result  # noqa: E402

PROJ_DIRS = {"delta": ("_delta_log",), "iceberg": ("metadata", "deletes")}
#: the table's copies and the projections each gets (``mirror --enable ...``): a projection has one view at a time
COPY_STEPS = {"ro": [["delta"], ["iceberg"]], "fresh": [["iceberg", "--view", "fresh"]],
              "dfresh": [["delta", "--view", "fresh"]]}
COPIES = tuple(COPY_STEPS)
OPTS = ["--record-key", "id", "--precombine-field", "seq", "--index", "record"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def proj_bytes(table: Path, kind: str) -> int:
    return sum(dir_size(table / d) for d in PROJ_DIRS[kind] if (table / d).exists())


class State:
    def __init__(self, path: Path):
        self.path = path
        self.d: dict = json.loads(path.read_text()) if path.exists() else {}

    def done(self, key: str, redo: set[str]) -> bool:
        return key in self.d and key.split(":")[0] not in redo

    def put(self, key: str, value: Any) -> None:
        self.d[key] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.d, indent=1))
        os.replace(tmp, self.path)


# == 1. build ========================================================================================
def build(work: Path, data: scale.Dataset) -> dict:
    base = data.base()
    table = work / "tables" / f"base_{data.size}"
    shutil.rmtree(table, ignore_errors=True)
    table.parent.mkdir(parents=True, exist_ok=True)
    total, t_load = 0.0, []
    for i, f in enumerate(base["files"]):
        t_load.append(load1())
        rec = run_cold([*scale.CLI, "upsert", str(table), f, *OPTS, "--table-type", "merge_on_read",
                        "--engine", "arrow"], work / "logs", f"build_{data.size}_{i}", 7200)
        if rec["rc"] != 0:
            raise SystemExit(f"build failed: {rec}")
        total += rec["time_s"]
    return {"table": str(table), "upserts": len(base["files"]), "time_s": round(total, 2),
            "table_bytes": dir_size(table), "load_1m": t_load}


# == 2. enable =======================================================================================
def enable(work: Path, size: int, copy: str, steps: list[list[str]]) -> dict:
    src = work / "tables" / f"base_{size}"
    table = work / "tables" / f"{copy}_{size}"
    shutil.rmtree(table, ignore_errors=True)
    shutil.copytree(src, table)
    out = {"table": str(table)}
    for args in steps:
        kind = args[0]
        name = "_".join(a.lstrip("-") for a in args)
        ld = load1()
        rec = run_cold([*scale.CLI, "mirror", str(table), "--enable", *args], work / "logs",
                       f"enable_{size}_{copy}_{name}", 7200)
        if rec["rc"] != 0:
            raise SystemExit(f"mirror --enable {' '.join(args)} failed: {rec}")
        out[name] = {"time_s": rec["time_s"], "peak_rss_mb": rec.get("peak_rss_mb"),
                     "bytes": proj_bytes(table, kind), "load_1m": ld}
        log(f"  {copy}: mirror --enable {' '.join(args)}: {rec['time_s']:.2f} s, "
            f"{out[name]['bytes'] / 1e6:.2f} MB")
    return out


def clear_process_caches() -> None:
    """Forget what the projections cache per process (Iceberg's manifests, Delta's version-0
    check and the fresh view's slice plans): a CLI process, one commit each, starts without them."""
    from spark_jobs.table import delta, iceberg

    iceberg._AVRO_CACHE.clear()
    delta._CURRENT_FORM.clear()
    delta._PLANS.clear()


# == 3. commits ======================================================================================
def commits(table: Path, batches: list[dict]) -> list[dict]:
    from spark_jobs.cli import main as cli_main
    from spark_jobs.table import delta, iceberg

    calls: list[dict] = []
    originals = {"delta": delta.mirror_commit, "iceberg": iceberg.mirror_commit}

    def wrap(kind: str) -> Callable:
        def timed(t: Any, seq: int) -> list[int]:
            b0 = proj_bytes(table, kind)
            t0 = time.perf_counter()
            written = originals[kind](t, seq)
            ms = (time.perf_counter() - t0) * 1000
            calls.append({"projection": kind, "seq": seq, "ms": round(ms, 1),
                          "bytes": proj_bytes(table, kind) - b0, "versions": written})
            return written
        return timed

    # pyiceberg's modules imported once before the first commit: the figures are the projection's
    # work (a CLI process pays the import once, ~1 s on this machine, measured in the enable step)
    import pyiceberg.io.pyarrow  # noqa: F401
    import pyiceberg.table  # noqa: F401
    import pyiceberg.table.update  # noqa: F401

    delta.mirror_commit, iceberg.mirror_commit = wrap("delta"), wrap("iceberg")
    out = []
    try:
        for b in batches:
            calls.clear()
            clear_process_caches()
            ld = load1()
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                rc = cli_main(["upsert", str(table), b["path"], "--delete-field", "_deleted", "--engine", "arrow"])
            wall = (time.perf_counter() - t0) * 1000
            if rc != 0:
                raise SystemExit(f"upsert of batch {b['k']} into {table} failed ({rc})")
            seqs = sorted({c["seq"] for c in calls})
            rec = {"k": b["k"], "rows": b["rows"], "upsert_ms": round(wall, 1), "load_1m": ld,
                   "entries": len(seqs), "commit": [c for c in calls if c["seq"] == seqs[0]] if seqs else [],
                   "after": [c for c in calls if seqs and c["seq"] != seqs[0]]}
            out.append(rec)
            log(f"  {table.name} batch {b['k']} ({human_rows(b['rows'])}): upsert {wall / 1000:.2f} s; "
                + ", ".join(f"{c['projection']} +{c['ms']:.0f} ms {c['bytes'] / 1e3:.1f} kB" for c in rec["commit"])
                + (f"; then {len(rec['after'])} projected entries after (compaction): "
                   + ", ".join(f"{c['projection']} {c['ms']:.0f} ms" for c in rec["after"]) if rec["after"] else ""))
    finally:
        delta.mirror_commit, iceberg.mirror_commit = originals["delta"], originals["iceberg"]
    return out


# == 4. reads ========================================================================================
def check(con: Any, obj: Any, expected: dict) -> dict:
    got = scale.checksums(con, obj, keys="uuid")
    v = scale.compare(got, expected)
    return {"rows": v["rows"], "expected_rows": v["expected_rows"], "ok": v["ok"],
            **({"columns_differing": v["columns_differing"]} if v["columns_differing"] else {})}


def best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    times, last = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        last = fn()
        times.append(time.perf_counter() - t0)
    return round(min(times), 3), last


def reads(work: Path, size: int, expected: dict, repeats: int, views: tuple[str, ...] = COPIES) -> dict:
    import polars as pl
    from deltalake import DeltaTable
    from pyiceberg.table import StaticTable

    from spark_jobs.table.dataset import dataset
    from spark_jobs.table.table import Table

    con = scale.duck()
    ro, fresh = work / "tables" / f"ro_{size}", work / "tables" / f"fresh_{size}"
    dfresh = work / "tables" / f"dfresh_{size}"
    out: dict = {"views": list(views)}

    def record(view: str, reader: str, fn: Callable[[], Any], exp: dict) -> None:
        ld = load1()
        try:
            s, obj = best_of(repeats, fn)
            v = check(con, obj, exp)
        except Exception as e:  # noqa: BLE001 - a reader that cannot read the view is a finding
            out.setdefault(view, {})[reader] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            log(f"  {view} / {reader}: ERROR {out[view][reader]['error']}")
            return
        out.setdefault(view, {})[reader] = {"best_s": s, **v, "load_1m": ld}
        log(f"  {view} / {reader}: {s:.3f} s, {v['rows']} rows (expected {v['expected_rows']}), "
            f"{'ok' if v['ok'] else 'MISMATCH ' + str(v.get('columns_differing'))}")

    # every copy holds the same table after the same batches: its own read from the first one named
    own = work / "tables" / f"{'fresh' if 'fresh' in views else views[0]}_{size}"
    record("table", "bucketindex dataset().to_table()", lambda: dataset(str(own)).to_table(), expected)

    ro_exp: dict = {}
    if "ro" in views:
        # the read-optimized views' rows: the current bases (format.md §11), read directly
        t = Table.load(str(ro))
        base_files = [t.abs(s.path) for s in t.view().slices()]
        ro_exp = scale.checksums(con, pq.ParquetDataset(base_files).read(columns=list(scale.COLUMNS)), keys="uuid")
        out["read_optimized_expected_rows"] = ro_exp["rows"]
        record("delta_read_optimized", "deltalake to_pyarrow_table", lambda: DeltaTable(str(ro)).to_pyarrow_table(),
               ro_exp)
        record("delta_read_optimized", "polars read_delta", lambda: pl.read_delta(str(ro)).to_arrow(), ro_exp)
        record("delta_read_optimized", "duckdb over deltalake dataset",
               lambda: _duck_arrow(DeltaTable(str(ro)).to_pyarrow_dataset()), ro_exp)
        _try_duck_ext(out, "delta_read_optimized", "delta", f"SELECT * FROM delta_scan('{ro}')")

    if "dfresh" in views and dfresh.exists():
        from deltalake import QueryBuilder
        import pyarrow as pa

        record("delta_fresh", "deltalake QueryBuilder select *",
               lambda: pa.table(QueryBuilder().register("t", DeltaTable(str(dfresh))).execute("select * from t")),
               expected)
        record("delta_fresh", "polars read_delta", lambda: pl.read_delta(str(dfresh)).to_arrow(), expected)
        record("delta_fresh", "deltalake to_pyarrow_table", lambda: DeltaTable(str(dfresh)).to_pyarrow_table(),
               expected)

    for view, path, copy in (("iceberg_read_optimized", ro, "ro"), ("iceberg_fresh", fresh, "fresh")):
        if copy not in views:
            continue
        exp = expected if view == "iceberg_fresh" else ro_exp

        def static(p: Path = path) -> Any:
            return StaticTable.from_metadata(str(p))

        record(view, "pyiceberg StaticTable scan to_arrow", lambda: static().scan().to_arrow(), exp)
        record(view, "polars scan_iceberg", lambda: pl.scan_iceberg(static()).collect().to_arrow(), exp)
        record(view, "duckdb through pyiceberg scan (to_duckdb)",
               lambda: static().scan().to_duckdb("t").sql("SELECT * FROM t").to_arrow_table(), exp)
        _try_duck_ext(out, view, "iceberg", f"SELECT * FROM iceberg_scan('{path}')")
    return out


def _duck_arrow(ds: Any) -> Any:
    c = scale.duck()
    c.register("d", ds)
    return c.sql("SELECT * FROM d").to_arrow_table()


def _try_duck_ext(out: dict, view: str, ext: str, sql: str) -> None:
    c = scale.duck()
    try:
        c.execute(f"LOAD {ext}")
    except Exception as e:  # noqa: BLE001
        out.setdefault(view, {})[f"duckdb {ext} extension"] = {"error": f"not loaded: {str(e).splitlines()[0][:160]}"}
        log(f"  {view} / duckdb {ext} extension: not loaded (offline)")
        return
    t0 = time.perf_counter()
    n = c.execute(f"SELECT count(*) FROM ({sql})").fetchone()[0]
    out.setdefault(view, {})[f"duckdb {ext} extension count(*)"] = {"best_s": round(time.perf_counter() - t0, 3),
                                                                      "rows": n}


# == summary =========================================================================================
def summarize(size: int, st: dict) -> dict:
    s: dict = {"rows": size}
    if any(f"commits:{size}:{c}" in st for c in COPIES):
        for copy in COPIES:
            per: dict = {}
            for rec in st.get(f"commits:{size}:{copy}", []):
                for c in rec["commit"]:
                    key = (f"{c['projection']}_fresh" if copy != "ro" else f"{c['projection']}_read_optimized")
                    per.setdefault(key, {}).setdefault(rec["rows"], []).append((c["ms"], c["bytes"]))
            for key, by_rows in per.items():
                s[key] = {str(r): {"ms_median": statistics.median(x[0] for x in v),
                                   "bytes_median": statistics.median(x[1] for x in v), "n": len(v)}
                          for r, v in by_rows.items()}
    return s


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--sizes", default="1000000")
    ap.add_argument("--batches", default="1000,100000,1000,100000,1000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--file-rows", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--redo", default="", help="phases to run again: build,enable,commits,reads")
    ap.add_argument("--views", default=",".join(COPIES),
                    help="the copies to enable, upsert into and read (default all: ro,fresh,dfresh); "
                         "e.g. dfresh for the Delta fresh view alone")
    args = ap.parse_args(argv)
    views = tuple(dict.fromkeys(filter(None, args.views.split(","))))
    if not views or not set(views) <= set(COPIES):
        ap.error(f"--views: a comma-separated subset of {','.join(COPIES)}, not {args.views!r}")
    import logging

    logging.basicConfig(level=logging.WARNING)
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    st = State(work / "results.json")
    redo = set(filter(None, args.redo.split(",")))
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = [int(x) for x in args.batches.split(",")]
    for size in sizes:
        log(f"== {human_rows(size)} rows (load {load1()})")
        data = scale.Dataset(work, keys="uuid", size=size, seed=args.seed, file_rows=args.file_rows)
        batches = [data.batch(k + 1, n) for k, n in enumerate(rows)]
        if not st.done(f"build:{size}", redo):
            st.put(f"build:{size}", build(work, data))
            redo |= {"enable", "commits", "reads"}
        log(f"  build: {st.d[f'build:{size}']['time_s']} s")
        # an upsert is not idempotent: a copy's commits start from a fresh copy of the table (a
        # copy added later -- dfresh -- is enabled alone, the others' figures kept)
        todo = {c for c in views if not st.done(f"commits:{size}:{c}", redo) or "enable" in redo}
        if todo:
            # the copies left out of --views keep what an earlier run measured
            done = {c: v for c, v in st.d.get(f"enable:{size}", {}).items() if c not in todo}
            st.put(f"enable:{size}", {**done, **{c: enable(work, size, c, COPY_STEPS[c]) for c in COPIES if c in todo}})
            for c in todo:
                st.d.pop(f"commits:{size}:{c}", None)
            redo |= {"reads"}
        for copy in views:
            if not st.done(f"commits:{size}:{copy}", redo):
                st.put(f"commits:{size}:{copy}", commits(work / "tables" / f"{copy}_{size}", batches))
                redo |= {"reads"}
        if not st.done(f"reads:{size}", redo) or set(views) - set(st.d[f"reads:{size}"].get("views", COPIES)):
            kept = st.d.get(f"reads:{size}", {}) if set(views) != set(COPIES) else {}
            got = reads(work, size, batches[-1]["expected"], args.repeats, views)
            # a subset's reads merged over what an earlier run read of the other copies
            st.put(f"reads:{size}", {**kept, **got,
                                     "views": sorted(set(kept.get("views", [])) | set(views), key=COPIES.index)})
        st.put(f"summary:{size}", summarize(size, st.d))
    result = {"benchmark": "projection_scale", "uptime": os.popen("uptime").read().strip(), **st.d}
    emit_result(result)
    return result


if __name__ == "__main__":
    main()
