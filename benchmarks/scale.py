"""bucketindex at scale, as a scheduled task runs it: tables of 1M-100M rows, CDC batches through the
cold CLI, full reads, compaction, the peers on the same data, every state checked against an oracle.

Why: every other figure stops at 10M rows, while the product's promise (an upsert costs what its
batch costs, however large the table) and the failures users report (delta-rs #2573, Hudi #12252)
are at 100M rows and beyond. This is the one command that measures it (issue 38, item 2).

    python benchmarks/scale.py --workdir DIR [--sizes 1000000,10000000,100000000]
        [--batches 1000,100000,1000000] [--table-types copy_on_write,merge_on_read]
        [--indexes record,bucket] [--keys uuid,order] [--layouts flat,partitioned]
        [--build bootstrap|upsert] [--peers delta_rs,pypaimon] [--paimon-python PATH]
        [--peer-timeout S] [--step-timeout S] [--batches-before-read 10] [--validate-up-to N]
        [--check-every-batch-up-to N] [--arrow-read-up-to N] [--file-rows N] [--seed N] [--json-out FILE]

**Resumable.** Everything lives in ``--workdir``: the generated data (``data/<keys>_<size>/``),
the tables (``tables/...``), each contender's finished steps (``state/<contender>.json``) and
the results, one JSON object per finished step appended to ``results.jsonl``. A rerun with the
same parameters redoes no finished step: it goes on where the last run stopped (a step killed
half-way is run again; an upsert that had committed is then a no-op of the CLI's batch-id
idempotence, recorded with ``"noop": true``). The last line printed is one JSON object with every
step's result (also written to ``--json-out``, default ``<workdir>/results.json``).

**Data**, deterministic from ``--seed``: key ordinal ``i`` has a key -- a UUID4 string derived
from ``i`` (``--keys uuid``) or a monotone order id ``10_000_000_000 + i`` (``--keys order``) --
and every version ``v`` of its row is a pure function of ``(seed, i, v)``: 12 columns (``id``,
``seq`` (the precombine field), strings with spaces, ``/``, ``%``, ``+``, non-ASCII and nulls,
``decimal(12,2)``, ``int32``, ``double``, two UTC timestamps, a ``month`` partition value that
follows ``i`` as in a table filled over time, a boolean). The base is written as Parquet files of
``--file-rows`` rows (one row group each). Batch ``k`` (the ``--batches`` sizes in turn, until
``--batches-before-read`` batches) has ``rows // 2`` inserts (new ordinals), ``rows // 100``
deletes (``_deleted`` true) and the rest updates, both of live keys drawn uniformly.

**Oracle**, without holding a table: the generator keeps one ``uint16`` version per key ordinal
(0 = absent), so the rows a batch replaces can be made again; per column the expected sum of
DuckDB's ``hash()`` of every live value is kept incrementally (plus the row count) -- minus the
replaced rows', plus the batch's. A state is checked by streaming the same sums over the table
(DuckDB over ``spark_jobs.table.dataset(...)``, the Arrow reader's result, delta-rs's dataset,
pypaimon's read), and by looking up sampled keys of the last batch (updated, inserted, deleted).

**Contenders**: ``bucketindex_<table type>_<index>`` per ``--table-types`` x ``--indexes``, built as
a user would (``bootstrap --mode rewrite`` of the base Parquet dataset, or ``--build upsert``: one
cold ``upsert`` per base file), then every batch through the cold CLI at defaults (a new process
per batch, ``--engine`` left at ``auto``); ``delta_rs`` (``write_deltalake`` then ``merge`` per
batch, deletes by ``when_matched_delete``; compaction = ``optimize.compact``); ``pypaimon`` (a
primary-key table of 16 buckets, ``rowkind.field`` for deletes, in its own virtualenv
``--paimon-python`` since it needs pyarrow < 20; no compaction step). A peer step that fails, runs
out of memory or past ``--peer-timeout`` is recorded as a result and ends that peer's run at that
size.

**Per step** (each a new process, timed from outside): wall time, peak RSS of the process tree
(psutil, every 100 ms), bytes read and written by the tree (``/proc/<pid>/io`` rchar/wchar, polled:
lower bounds), and for bucketindex the engine ``auto`` chose and why, the phases the CLI logged,
the bytes the commit wrote (its metadata: data files, logs, index files) and the index's bytes per
live entry. Reads after ``--batches-before-read`` batches and again after a compaction: the Arrow
reader (``read_arrow``) and DuckDB over ``dataset()`` (a checksum of every column: a full scan).
``bucketindex validate`` runs after the last read up to ``--validate-up-to`` rows.

Needs psutil, duckdb and deltalake (``pip install -e .[bench]``); pypaimon only for that peer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from compare_peers import dir_size, human_bytes, human_rows, parse_list, run_cold, uuid4_from_bytes  # noqa: E402
from machine_info import cpu_model, mem_total_gb  # noqa: E402
from results import emit_result  # noqa: E402

CLI = [sys.executable, "-m", "airflow_provider_bucketindex.cli"]
T0_US = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z
ORDER_ID_BASE = 10_000_000_000
MONTHS = 12
STATUSES = pa.array(["new", "paid", "shipped", "returned / partial", "annulé", "100% refunded", "a+b", ""])
NOTE_PREFIXES = pa.array(["note ", "remarque é ", "a/b+c% ", "  padded "])
COLUMNS = ("id", "seq", "customer", "status", "amount", "qty", "rate", "created_at", "updated_at", "month",
           "note", "flag")
#: the DuckDB type each column is hashed as, so a reader's physical type (a timestamp without
#: zone, a wider decimal) does not change a checksum
DUCK_TYPES = {"seq": "BIGINT", "customer": "VARCHAR", "status": "VARCHAR", "amount": "DECIMAL(12,2)",
              "qty": "INTEGER", "rate": "DOUBLE", "created_at": "TIMESTAMPTZ", "updated_at": "TIMESTAMPTZ",
              "month": "VARCHAR", "note": "VARCHAR", "flag": "BOOLEAN"}
SAMPLE = 50
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def log(msg: str) -> None:
    print(msg, flush=True)


# == data: rows as a pure function of (seed, ordinal, version) ======================================
def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised (uint64 arithmetic wraps)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _draw(seed: int, ordinal: np.ndarray, salt: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _mix(ordinal.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64((seed * 1_000_003 + salt)
                                                                                          & 0xFFFFFFFFFFFFFFFF))


def keys_of(ordinal: np.ndarray, *, seed: int, keys: str) -> pa.Array:
    """The record key of each ordinal: a UUID4 made from it, or a monotone order id."""
    if keys == "order":
        return pa.array(ORDER_ID_BASE + ordinal.astype(np.int64))
    words = np.stack([_draw(seed, ordinal, 1), _draw(seed, ordinal, 2)], axis=1)
    return uuid4_from_bytes(words.view(np.uint8).reshape(len(ordinal), 16))


def _concat(*parts: pa.Array | str) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def rows_of(ordinal: np.ndarray, version: np.ndarray, *, seed: int, keys: str, size: int) -> pa.Table:
    """Version ``version`` of the rows of keys ``ordinal`` (``size``: the base's rows, which spreads
    ``month`` over the base; inserts beyond it land in the last month)."""
    ordinal = ordinal.astype(np.int64)
    v = version.astype(np.uint64)
    with np.errstate(over="ignore"):
        r = _draw(seed, ordinal.astype(np.uint64) * np.uint64(65_537) + v, 3)
    r2 = _mix(r)
    n = len(ordinal)
    cents = (r >> np.uint64(16)) % np.uint64(10_000_000)
    amount = np.zeros((n, 2), dtype=np.int64)
    amount[:, 0] = cents.astype(np.int64)
    month_no = np.minimum(ordinal * MONTHS // max(size, 1), MONTHS - 1)
    month = _concat("2024-", pc.utf8_lpad(pc.cast(pa.array(month_no + 1), pa.string()), width=2, padding="0"))
    note_null = pa.array((r2 >> np.uint64(20)) % np.uint64(10) == 0)
    note = _concat(NOTE_PREFIXES.take(pa.array((r2 % np.uint64(4)).astype(np.int64))),
                   pc.cast(pa.array((r2 >> np.uint64(8)) % np.uint64(1000)), pa.string()))
    cols = {
        "id": keys_of(ordinal, seed=seed, keys=keys),
        "seq": pa.array((v.astype(np.int64) << 40) + ordinal),
        "customer": _concat("cust ", pc.cast(pa.array(r % np.uint64(50_000)), pa.string())),
        "status": STATUSES.take(pa.array(((r >> np.uint64(8)) % np.uint64(len(STATUSES))).astype(np.int64))),
        "amount": pa.Array.from_buffers(pa.decimal128(12, 2), n, [None, pa.py_buffer(amount.tobytes())]),
        "qty": pa.array(((r >> np.uint64(40)) % np.uint64(1000)).astype(np.int32)),
        "rate": pa.array((r2 >> np.uint64(11)).astype(np.float64) * 2.0**-53),
        "created_at": pa.array(T0_US + ordinal * 1_000_000, pa.timestamp("us", tz="UTC")),
        "updated_at": pa.array(T0_US + v.astype(np.int64) * 3_600_000_000 + (r2 % np.uint64(3_600_000_000)).astype(
            np.int64), pa.timestamp("us", tz="UTC")),
        "month": month,
        "note": pc.if_else(note_null, pa.scalar(None, pa.string()), note),
        "flag": pa.array((r2 >> np.uint64(5)) & np.uint64(1) == 1),
    }
    return pa.table(cols)


# == the oracle: per-column sums of DuckDB's hash() ==================================================
def checksum_sql(relation: str, columns: list[str], id_type: str) -> str:
    types = {**DUCK_TYPES, "id": id_type}
    sums = ", ".join(f'sum(hash(CAST("{c}" AS {types[c]}))::HUGEINT)' for c in columns)
    return f"SELECT count(*), {sums} FROM {relation}"


def duck() -> Any:
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    return con


def checksums(con: Any, relation_obj: Any, *, keys: str) -> dict:
    """``{"rows": n, "sums": {column: sum of hash}}`` of an Arrow table, dataset or reader, streamed."""
    con.register("rel", relation_obj)
    try:
        row = con.execute(checksum_sql("rel", list(COLUMNS), "BIGINT" if keys == "order" else "VARCHAR")).fetchall()[0]
    finally:
        con.unregister("rel")
    return {"rows": int(row[0]), "sums": {c: str(int(s or 0)) for c, s in zip(COLUMNS, row[1:])}}


def _add(a: dict, b: dict, sign: int) -> dict:
    return {"rows": a["rows"] + sign * b["rows"],
            "sums": {c: str(int(a["sums"][c]) + sign * int(b["sums"][c])) for c in COLUMNS}}


def compare(got: dict, expected: dict) -> dict:
    """The oracle's verdict on a state: row count, and every column's checksum."""
    bad = [c for c in COLUMNS if got["sums"].get(c) != expected["sums"][c]]
    return {"rows": got["rows"], "expected_rows": expected["rows"], "columns_differing": bad,
            "ok": got["rows"] == expected["rows"] and not bad}


# == generated data of one (keys, size): base files and batches, made once, kept ======================
class Dataset:
    """The data of one key shape and size in ``dir``, with the oracle's state after each batch."""

    def __init__(self, root: Path, *, keys: str, size: int, seed: int, file_rows: int):
        self.keys, self.size, self.seed, self.file_rows = keys, size, seed, file_rows
        self.dir = root / "data" / f"{keys}_{size}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.manifest_path = self.dir / "manifest.json"
        self.params = {"keys": keys, "size": size, "seed": seed, "file_rows": file_rows}
        m = json.loads(self.manifest_path.read_text()) if self.manifest_path.exists() else {}
        if m and m.get("params") != self.params:
            raise SystemExit(f"{self.manifest_path}: data made with {m.get('params')}, not {self.params}: "
                             "use another --workdir or the same options")
        m = m or {"params": self.params, "base": None, "batches": []}
        self.m = m

    def _save(self, versions: np.ndarray | None = None) -> None:
        if versions is not None:
            tmp = self.dir / "versions.tmp.npy"
            np.save(tmp, versions)
            os.replace(tmp, self.dir / "versions.npy")
        tmp = self.manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.m))
        os.replace(tmp, self.manifest_path)

    def base(self) -> dict:
        """The base Parquet files (``file_rows`` rows, one row group each) and their checksums."""
        if self.m["base"]:
            return self.m["base"]
        t0 = time.perf_counter()
        bdir = self.dir / "base"
        shutil.rmtree(bdir, ignore_errors=True)
        bdir.mkdir()
        con, total, files = duck(), None, []
        for lo in range(0, self.size, self.file_rows):
            ordinal = np.arange(lo, min(self.size, lo + self.file_rows), dtype=np.int64)
            t = rows_of(ordinal, np.ones(len(ordinal), np.uint16), seed=self.seed, keys=self.keys, size=self.size)
            path = bdir / f"part-{len(files):05d}.parquet"
            pq.write_table(t, path, row_group_size=len(t), compression="zstd")
            files.append(str(path))
            c = checksums(con, t, keys=self.keys)
            total = c if total is None else _add(total, c, 1)
        versions = np.ones(self.size, dtype=np.uint16)
        self.m["base"] = {"files": files, "bytes": dir_size(bdir), "expected": total,
                          "generate_s": round(time.perf_counter() - t0, 1)}
        self.m["batches"] = []
        self._save(versions)
        log(f"  data {self.keys} {human_rows(self.size)}: {len(files)} base files, "
            f"{human_bytes(self.m['base']['bytes'])} ({self.m['base']['generate_s']} s)")
        return self.m["base"]

    def batch(self, k: int, rows: int) -> dict:
        """Batch ``k`` (1-based) of ``rows`` rows, made from the state after batch ``k - 1``."""
        self.base()
        if len(self.m["batches"]) < k - 1:
            raise RuntimeError(f"batch {k} asked before batch {len(self.m['batches']) + 1}")
        if len(self.m["batches"]) >= k:
            b = self.m["batches"][k - 1]
            if b["rows"] != rows:
                raise SystemExit(f"{self.dir}: batch {k} was made with {b['rows']} rows, not {rows}: "
                                 "use another --workdir or the same --batches")
            return b
        versions = np.load(self.dir / "versions.npy")
        rng = np.random.default_rng([self.seed, self.size, k])
        n_ins, n_del = rows - rows // 2, rows // 100
        n_upd = rows - n_ins - n_del
        touched = self._live_sample(rng, versions, n_upd + n_del)
        upd, dele = touched[:n_upd], touched[n_upd:]
        start = len(versions)
        ins = np.arange(start, start + n_ins, dtype=np.int64)
        versions = np.concatenate([versions, np.zeros(n_ins, np.uint16)])
        con = duck()
        old = rows_of(touched, versions[touched], seed=self.seed, keys=self.keys, size=self.size)
        new_ord = np.concatenate([upd, ins, dele])
        new_ver = np.concatenate([versions[upd] + 1, np.ones(n_ins, np.uint16), versions[dele] + 1])
        new = rows_of(new_ord, new_ver, seed=self.seed, keys=self.keys, size=self.size)
        live_new = new.slice(0, n_upd + n_ins)
        prev = self.m["batches"][-1]["expected"] if self.m["batches"] else self.m["base"]["expected"]
        expected = _add(_add(prev, checksums(con, old, keys=self.keys), -1),
                        checksums(con, live_new, keys=self.keys), 1)
        flags = np.zeros(rows, dtype=bool)
        flags[n_upd + n_ins:] = True
        out = new.append_column("_deleted", pa.array(flags)).take(pa.array(rng.permutation(rows)))
        path = self.dir / f"batch_{k:03d}_{human_rows(rows)}.parquet"
        pq.write_table(out, path, compression="zstd")
        versions[upd] += 1
        versions[ins] = 1
        versions[dele] = 0
        ids = new.column("id")
        seqs = new.column("seq")

        def sample(lo: int, hi: int) -> list:
            idx = rng.choice(np.arange(lo, hi), min(SAMPLE, hi - lo), replace=False) if hi > lo else []
            return [[ids[int(i)].as_py(), seqs[int(i)].as_py() if i < n_upd + n_ins else None] for i in idx]

        b = {"k": k, "rows": rows, "path": str(path), "updates": n_upd, "inserts": n_ins, "deletes": n_del,
             "expected": expected, "samples": sample(0, n_upd) + sample(n_upd, n_upd + n_ins)
             + sample(n_upd + n_ins, rows)}
        self.m["batches"].append(b)
        self._save(versions)
        return b

    @staticmethod
    def _live_sample(rng: np.random.Generator, versions: np.ndarray, n: int) -> np.ndarray:
        """``n`` distinct live ordinals drawn uniformly, without listing the live ones (rejection)."""
        got = np.empty(0, dtype=np.int64)
        while len(got) < n:
            cand = rng.integers(0, len(versions), size=int((n - len(got)) * 1.2) + 16)
            cand = cand[versions[cand] > 0]
            got = np.unique(np.concatenate([got, cand]))
        return rng.permutation(got)[:n]


# == the processes each step runs ====================================================================
BI_READ = r'''
import json, sys, time
a = json.loads(sys.argv[1])
sys.path.insert(0, a["bench"])
import scale
con = scale.duck()
t0 = time.perf_counter()
if a["how"] == "arrow":
    from spark_jobs.table.reader import read_arrow
    rel = read_arrow(a["table"])
    read_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    sums = scale.checksums(con, rel, keys=a["keys"])
    check_s = time.perf_counter() - t1
else:  # DuckDB over dataset(): the checksum query is the full scan
    from spark_jobs.table.dataset import dataset
    rel = dataset(a["table"])
    sums = scale.checksums(con, rel, keys=a["keys"])
    read_s = time.perf_counter() - t0
    check_s = 0.0
found = scale.lookup(rel, [s[0] for s in a["samples"]])
print(json.dumps({"read_s": read_s, "check_s": check_s, "checksums": sums, "found": found}))
'''

DELTA = r'''
import json, sys, time
a = json.loads(sys.argv[1])
sys.path.insert(0, a["bench"])
import pyarrow.dataset as pads, pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
t0 = time.perf_counter()
out = {}
if a["op"] == "build":
    src = pads.dataset(a["files"], format="parquet")
    write_deltalake(a["table"], src.scanner().to_reader(), partition_by=a["partition_by"] or None)
elif a["op"] == "upsert":
    batch = pq.read_table(a["source"])
    cols = [c for c in batch.column_names if c != "_deleted"]
    m = (DeltaTable(a["table"]).merge(batch, predicate="t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_delete(predicate="s._deleted")
         .when_matched_update(updates={c: f"s.{c}" for c in cols}, predicate="NOT s._deleted")
         .when_not_matched_insert(updates={c: f"s.{c}" for c in cols}, predicate="NOT s._deleted")
         .execute())
    out["metrics"] = {k: v for k, v in m.items() if isinstance(v, (int, float))}
elif a["op"] == "compact":
    out["metrics"] = {k: v for k, v in DeltaTable(a["table"]).optimize.compact().items() if isinstance(v, (int, float))}
else:  # read: the Arrow table, then the checksum over it; duckdb: the checksum over the dataset
    import scale
    con = scale.duck()
    ds = DeltaTable(a["table"]).to_pyarrow_dataset()
    if a["op"] == "read_arrow":
        rel = ds.to_table()
        out["read_s"] = time.perf_counter() - t0
        out["checksums"] = scale.checksums(con, rel, keys=a["keys"])
    else:
        rel = ds
        out["checksums"] = scale.checksums(con, rel, keys=a["keys"])
        out["read_s"] = time.perf_counter() - t0
    out["found"] = scale.lookup(rel, [s[0] for s in a["samples"]])
out["child_s"] = time.perf_counter() - t0
print(json.dumps(out), flush=True)
import os
os._exit(0)  # deltalake's dataset scanned by DuckDB can abort at interpreter exit ("terminate called ...")
'''

#: runs in pypaimon's own virtualenv (pyarrow < 20, no duckdb): a read writes what it read to an
#: Arrow IPC file, checked by this process
PAIMON = r'''
import json, sys, time
a = json.loads(sys.argv[1])
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
from pypaimon import CatalogFactory, Schema
t0 = time.perf_counter()
cat = CatalogFactory.create({"warehouse": a["table"]})
out = {}

def with_kind(t):
    if "_deleted" in t.column_names:
        kind = pc.if_else(t.column("_deleted"), "-D", "+I")
    else:
        kind = pa.array(["+I"] * len(t), pa.string())
    t = t.drop_columns([c for c in ["_deleted"] if c in t.column_names])
    return t.append_column("_rowkind", kind)

def write(tables):
    wb = cat.get_table("db.t").new_batch_write_builder()
    w, c = wb.new_write(), wb.new_commit()
    for t in tables:
        w.write_arrow(with_kind(t))
    c.commit(w.prepare_commit())
    w.close(); c.close()

if a["op"] == "build":
    first = pq.read_table(a["files"][0])
    schema = with_kind(first.slice(0, 0)).schema
    pk = ["id"] + ([a["partition_by"][0]] if a["partition_by"] else [])
    cat.create_database("db", True)
    cat.create_table("db.t", Schema.from_pyarrow_schema(schema, partition_keys=a["partition_by"] or None,
                     primary_keys=pk, options={"bucket": "16", "rowkind.field": "_rowkind"}), False)
    write(pq.ParquetFile(f).read() for f in a["files"])
elif a["op"] == "upsert":
    write([pq.read_table(a["source"])])
else:
    rb = cat.get_table("db.t").new_read_builder()
    t = rb.new_read().to_arrow(rb.new_scan().plan().splits())
    out["read_s"] = time.perf_counter() - t0
    t = t.drop_columns(["_rowkind"])
    with pa.ipc.new_file(a["dump"], t.schema) as f:
        f.write_table(t)
out["child_s"] = time.perf_counter() - t0
print(json.dumps(out))
'''


def lookup(rel: Any, keys: list) -> dict:
    """``{key: seq}`` of the sampled keys found in an Arrow table or dataset (absent keys left out)."""
    import pyarrow.dataset as pads

    if not keys:
        return {}
    arr = pa.array(keys)
    if isinstance(rel, pa.Table):
        t = rel.filter(pc.is_in(rel.column("id"), value_set=arr.cast(rel.schema.field("id").type)))
        t = t.select(["id", "seq"])
    else:
        assert isinstance(rel, pads.Dataset)
        t = rel.to_table(columns=["id", "seq"], filter=pads.field("id").isin(arr.cast(rel.schema.field("id").type)))
    return {str(k): s for k, s in zip(t.column("id").to_pylist(), t.column("seq").to_pylist())}


def sample_verdict(found: dict, samples: list) -> dict:
    """Sampled keys of the last batch: updated and inserted ones hold the batch's ``seq``, deleted
    ones are gone."""
    wrong = [k for k, seq in samples if found.get(str(k)) != seq]
    return {"sampled": len(samples), "sampled_wrong": wrong[:5], "sampled_ok": not wrong}


# == running steps ===================================================================================
class Runner:
    """Runs the steps of every contender, skipping those a previous run finished."""

    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work = args, work
        self.results_path = work / "results.jsonl"
        (work / "state").mkdir(parents=True, exist_ok=True)
        self.logs = work / "logs"
        self.all: list[dict] = []

    def step(self, contender: str, size: int, name: str, fn: Callable[[], dict], extra: dict, params: dict) -> dict:
        """``fn``'s result for this step: recorded once (``state/`` and ``results.jsonl``), reused after.
        ``params`` are what the table's state depends on (data, batches, build): a workdir holding a table
        made with others is refused rather than measured on."""
        state_path = self.work / "state" / f"{contender}_{size}.json"
        state = json.loads(state_path.read_text()) if state_path.exists() else {"_params": params}
        if state.get("_params") != params:
            raise SystemExit(f"{state_path}: made with {state.get('_params')}, not {params}: "
                             "use another --workdir or the same options")
        if name in state:
            self.all.append(state[name])
            return state[name]
        log(f"  {contender} {human_rows(size)}: {name} ...")
        res = {"contender": contender, "size": size, "step": name, **extra, **fn(),
               "load_1m": round(os.getloadavg()[0], 2), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        state[name] = res
        tmp = state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, state_path)
        with open(self.results_path, "a") as f:
            f.write(json.dumps(res) + "\n")
        self.all.append(res)
        log(f"    -> {describe(res)}")
        return res

    def cold(self, cmd: list[str], name: str, timeout: float) -> dict:
        rec = run_cold(cmd, self.logs, re.sub(r"[^A-Za-z0-9_.-]", "_", name), timeout=timeout)
        # cpu_s: on a shared machine the wall time mostly measures the queue for a core (None when a
        # JVM child ran: its CPU is not in the sum)
        out = {"time_s": rec["time_s"], "cpu_s": rec["cpu_s"], "peak_rss_mb": rec["peak_mem_mb"],
               "read_chars": rec["read_chars"],
               "write_chars": rec["write_chars"], "rc": rec["rc"]}
        if rec["rc"] != 0:
            out["error"] = rec.get("error", "")[-800:]
        return out | {"_payload": rec.get("result") or {}, "_stderr": rec["stderr"]}


def describe(r: dict) -> str:
    keys = ("time_s", "cpu_s", "engine", "peak_rss_mb", "written_bytes", "read_s", "index_bytes_per_entry", "oracle_ok",
            "validate_ok", "rc", "error")
    return " ".join(f"{k}={str(r[k])[:300]}" for k in keys if k in r)


def cli_said(rec: dict) -> dict:
    """What the cold CLI reported: the engine ``auto`` chose and why, its phases."""
    payload = rec.pop("_payload")
    stderr = Path(rec.pop("_stderr")).read_text(errors="replace")
    m = re.search(r"engine: (\w+) \((.*)\)", stderr)
    engine = payload.get("engine")
    if isinstance(engine, dict):  # bootstrap reports {"name", "reason"}
        engine = engine.get("name")
    out = {"engine": engine or (m.group(1) if m else None), "engine_reason": m.group(2) if m else None,
           "phases_ms": payload.get("timings_ms"), "counts": payload.get("counts"), "noop": payload.get("noop")}
    return {k: v for k, v in out.items() if v is not None}


def commit_written(table: Path) -> dict:
    """Bytes the newest commit wrote, from its metadata: the data files and logs (entries with a path
    and a size, not marked removed) and the index files it added."""
    seq = sorted((table / ".bucketindex" / "sequence").glob("*.json"))
    if not seq:
        return {}
    meta = json.loads(seq[-1].read_text()).get("metadata", {})
    total = 0

    def walk(x: Any) -> None:
        nonlocal total
        if isinstance(x, dict):
            if isinstance(x.get("size"), int) and "path" in x and not x.get("removed"):
                total += x["size"]
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(meta)
    return {"written_bytes": total}


def index_stats(table: Path, live_rows: int) -> dict:
    """The index files the latest snapshot reads (base and deltas; not the superseded ones a
    ``clean`` has yet to delete) per live row, and the table directory's bytes (everything on disk)."""
    from spark_jobs.table.table import Table

    files = [f for fs in Table.load(str(table)).view().index_files.values() for f in fs]
    b = sum((table / f).stat().st_size for f in files)
    return {"index_bytes": b, "index_files": len(files),
            "index_bytes_per_entry": round(b / live_rows, 2) if live_rows else None, "table_bytes": dir_size(table)}


def run_contender(r: Runner, data: Dataset, layout: str, contender: str, batches: list[int]) -> None:
    """Build, batches, read, compact, read, validate: the steps of one contender on one data set."""
    a, size = r.args, data.size
    tag = f"{contender}_{data.keys}_{layout}"
    table = r.work / "tables" / f"{tag}_{size}"
    partition_by = ["month"] if layout == "partitioned" else []
    base = data.base()
    base_state = {"expected": base["expected"], "samples": []}  # what a build must hold
    peer = not contender.startswith("bucketindex")
    timeout = a.peer_timeout if peer else a.step_timeout
    extra = {"keys": data.keys, "layout": layout}
    params = {**data.params, "batches": batches, "build": a.build}
    failed: list[str] = []

    def guarded(name: str, fn: Callable[[], dict]) -> dict | None:
        if failed:
            return None
        res = r.step(tag, size, name, fn, extra, params)
        if res.get("rc", 0) != 0 or res.get("oracle_ok") is False:
            failed.append(name)  # a peer out of memory or time is its result; nothing after it means anything
        return res

    def peer_cmd(op: str, **kw: Any) -> list[str]:
        args = {"op": op, "table": str(table), "bench": str(Path(__file__).resolve().parent), "keys": data.keys,
                "partition_by": partition_by, **kw}
        if contender == "pypaimon":
            return [a.paimon_python, "-c", PAIMON, json.dumps(args)]
        return [sys.executable, "-c", DELTA, json.dumps(args)]

    def build() -> dict:
        shutil.rmtree(table, ignore_errors=True)
        table.parent.mkdir(parents=True, exist_ok=True)
        if peer:
            rec = r.cold(peer_cmd("build", files=base["files"]), f"{tag}_{size}_build", timeout)
            rec.pop("_payload"), rec.pop("_stderr")
            out = rec | {"table_bytes": dir_size(table)}
            if contender == "delta_rs" and rec["rc"] == 0 and a.check_every_batch_up_to >= size:
                from deltalake import DeltaTable

                out |= check_in_process(DeltaTable(str(table)).to_pyarrow_dataset(), base_state)
            return out
        ttype = "copy_on_write" if "copy_on_write" in contender else "merge_on_read"
        index = contender.rsplit("_", 1)[1]
        opts = ["--record-key", "id", "--precombine-field", "seq", "--index", index]
        opts += ["--partition-field", "month"] if partition_by else []
        if a.build == "bootstrap":
            rec = r.cold([*CLI, "bootstrap", str(table), str(Path(base["files"][0]).parent), *opts,
                          "--mode", "rewrite", "--table-type", ttype], f"{tag}_{size}_build", timeout)
            said = cli_said(rec)
        else:
            total: dict = {"time_s": 0.0, "peak_rss_mb": 0.0, "read_chars": 0, "write_chars": 0, "rc": 0}
            for i, f in enumerate(base["files"]):
                rec = r.cold([*CLI, "upsert", str(table), f, *opts, "--table-type", ttype],
                             f"{tag}_{size}_build_{i}", timeout)
                said = cli_said(rec)
                total = {"time_s": round(total["time_s"] + rec["time_s"], 3),
                         "peak_rss_mb": max(total["peak_rss_mb"], rec["peak_rss_mb"]),
                         "read_chars": total["read_chars"] + rec["read_chars"],
                         "write_chars": total["write_chars"] + rec["write_chars"], "rc": rec["rc"],
                         **({"error": rec["error"]} if "error" in rec else {})}
                if rec["rc"] != 0:
                    break
            rec = total | {"upserts": len(base["files"])}
        out = rec | said | index_stats(table, size)
        if rec["rc"] == 0 and a.check_every_batch_up_to >= size:
            from spark_jobs.table.dataset import dataset

            out |= check_in_process(dataset(str(table)), base_state)
        return out

    def upsert(b: dict) -> Callable[[], dict]:
        def run() -> dict:
            if peer:
                rec = r.cold(peer_cmd("upsert", source=b["path"]), f"{tag}_{size}_b{b['k']}", timeout)
                payload = rec.pop("_payload")
                rec.pop("_stderr")
                out = rec | {"metrics": payload.get("metrics")}
                if contender == "delta_rs" and rec["rc"] == 0 and a.check_every_batch_up_to >= size:
                    from deltalake import DeltaTable

                    out |= check_in_process(DeltaTable(str(table)).to_pyarrow_dataset(), b)
                return out
            rec = r.cold([*CLI, "upsert", str(table), b["path"], "--delete-field", "_deleted"],
                         f"{tag}_{size}_b{b['k']}", timeout)
            out = rec | cli_said(rec) | commit_written(table)
            live = b["expected"]["rows"]
            if rec["rc"] == 0 and a.check_every_batch_up_to >= size:
                from spark_jobs.table.dataset import dataset

                out |= check_in_process(dataset(str(table)), b)
            return out | (index_stats(table, live) if b["k"] in (1, len(batches)) else {})
        return run

    def check_in_process(ds: Any, b: dict) -> dict:
        """The oracle after a batch: a streamed checksum of the table's dataset (not in the figures)."""
        t0 = time.perf_counter()
        got = checksums(duck(), ds, keys=data.keys)
        v = compare(got, b["expected"]) | sample_verdict(lookup(ds, [s[0] for s in b["samples"]]), b["samples"])
        return {"oracle_ok": v["ok"] and v["sampled_ok"], "oracle": v, "check_s": round(time.perf_counter() - t0, 2)}

    def read(how: str, b: dict, label: str) -> Callable[[], dict]:
        def run() -> dict:
            args = {"table": str(table), "how": how, "keys": data.keys, "samples": b["samples"],
                    "bench": str(Path(__file__).resolve().parent)}
            if contender == "pypaimon":
                dump = r.work / "tmp" / f"{tag}_{size}.arrow"
                dump.parent.mkdir(exist_ok=True)
                rec = r.cold(peer_cmd("read", dump=str(dump)), f"{tag}_{size}_{label}", timeout)
                payload = rec.pop("_payload")
                rec.pop("_stderr")
                if rec["rc"] == 0:
                    with pa.memory_map(str(dump)) as src:
                        t = pa.ipc.open_file(src).read_all()
                        payload |= {"checksums": checksums(duck(), t, keys=data.keys),
                                    "found": lookup(t, [s[0] for s in b["samples"]])}
                    del t
                dump.unlink(missing_ok=True)
            elif peer:
                rec = r.cold(peer_cmd("read_arrow" if how == "arrow" else "read_duckdb", samples=b["samples"]),
                             f"{tag}_{size}_{label}", timeout)
                payload = rec.pop("_payload")
                rec.pop("_stderr")
            else:
                rec = r.cold([sys.executable, "-c", BI_READ, json.dumps(args)], f"{tag}_{size}_{label}", timeout)
                payload = rec.pop("_payload")
                rec.pop("_stderr")
            out = rec | {"read": how, "read_s": round(payload.get("read_s", 0.0), 3) if payload else None}
            if "checksums" in payload:
                v = compare(payload["checksums"], b["expected"]) | sample_verdict(payload["found"], b["samples"])
                out |= {"oracle_ok": v["ok"] and v["sampled_ok"], "oracle": v}
            elif rec["rc"] == 0:
                out |= {"oracle_ok": False, "oracle": {"error": "the read printed no checksums"}}
            return out
        return run

    def compact() -> dict:
        if peer:
            rec = r.cold(peer_cmd("compact"), f"{tag}_{size}_compact", timeout)
            rec.pop("_stderr")
            return rec | {"metrics": rec.pop("_payload").get("metrics")}
        rec = r.cold([*CLI, "compact", str(table)], f"{tag}_{size}_compact", timeout)
        # whether anything was due (the default policy: a group with 4 logs, a bucket with 10 deltas);
        # when nothing was, the "after compact" reads read the table as the batches left it
        compacted = bool(rec["_payload"].get("executed"))
        # the engine auto chose for the compaction and its counts, as for every other bucketindex step
        return rec | cli_said(rec) | {"compacted": compacted} | index_stats(table, last["expected"]["rows"])

    def validate() -> dict:
        rec = r.cold([*CLI, "validate", str(table)], f"{tag}_{size}_validate", timeout)
        payload = rec.pop("_payload")
        rec.pop("_stderr")
        return rec | {"validate_ok": rec["rc"] == 0, "report": {k: v for k, v in payload.items()
                                                                if not isinstance(v, (list, dict))}}

    guarded("build", build)
    last = None
    for k, rows in enumerate(batches, 1):
        last = data.batch(k, rows)
        guarded(f"batch_{k:02d}_{human_rows(rows)}", upsert(last))
    assert last is not None
    reads = ("arrow",) if contender == "pypaimon" else ("arrow", "duckdb")  # pypaimon: its own reader only
    # the Arrow reader materialises the whole table (~1.4 GB per 10M rows here): above
    # --arrow-read-up-to only the streamed reads run (DuckDB over the dataset)
    reads = tuple(h for h in reads if h != "arrow" or size <= a.arrow_read_up_to)
    for how in reads:
        guarded(f"read_{how}_after_{len(batches)}", read(how, last, f"read_{how}_{len(batches)}"))
    if contender != "pypaimon":
        guarded("compact", compact)
        for how in ("arrow", "duckdb") if size <= a.arrow_read_up_to else ("duckdb",):
            guarded(f"read_{how}_after_compact", read(how, last, f"read_{how}_compact"))
    if not peer and size <= a.validate_up_to:
        guarded("validate", validate)


def summary(steps: list[dict]) -> str:
    """The markdown table of docs/benchmarks.md's "Scale" section: per size and contender, the
    median cold time of each batch size (the engine ``auto`` chose), the reads, peak RSS, index
    bytes per entry and the oracle's verdict over every step."""
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for st in steps:
        groups.setdefault((st["size"], st["contender"]), []).append(st)
    names = sorted({re.sub(r"batch_\d+_", "", st["step"]) for st in steps if st["step"].startswith("batch_")},
                   key=lambda x: int(x.replace("k", "000").replace("M", "000000")))
    head = ["rows", "contender", "build s"] + [f"batch {b} s" for b in names] + [
        "peak RSS MB (batches)", "read after the batches: arrow / duckdb s", "compact s",
        "read after compact: arrow / duckdb s", "index B/entry", "oracle"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]

    def t(st: dict | None, key: str = "time_s") -> str:
        if st is None:
            return "-"
        if st.get("rc", 0) != 0:
            return f"failed ({str(st.get('rc'))[:40]})"
        v = st.get(key)
        return "-" if v is None else f"{v:.2f}"

    for (size, contender), sts in groups.items():
        by = {st["step"]: st for st in sts}
        row = [human_rows(size), contender, t(by.get("build"))]
        for b in names:
            runs = [st for st in sts if re.fullmatch(rf"batch_\d+_{b}", st["step"])]
            ok = [st["time_s"] for st in runs if st.get("rc", 0) == 0]
            engines = sorted({st["engine"] for st in runs if st.get("engine")})
            cell = f"{statistics.median(ok):.2f}" if ok else (t(runs[0]) if runs else "-")
            row.append(cell + (f" ({'/'.join(engines)}, x{len(runs)})" if engines else f" (x{len(runs)})"))
        peaks = [st["peak_rss_mb"] for st in sts if st["step"].startswith("batch_") and "peak_rss_mb" in st]
        row.append(f"{max(peaks):.0f}" if peaks else "-")
        after = [k for k in by if k.startswith(("read_arrow_after_", "read_duckdb_after_"))
                 and not k.endswith("_after_compact")]
        n = after[0].rsplit("_", 1)[1] if after else "10"
        row.append(f"{t(by.get(f'read_arrow_after_{n}'), 'read_s')} / {t(by.get(f'read_duckdb_after_{n}'), 'read_s')}")
        row.append(t(by.get("compact")))
        row.append(f"{t(by.get('read_arrow_after_compact'), 'read_s')} / "
                   f"{t(by.get('read_duckdb_after_compact'), 'read_s')}")
        ipe = [st["index_bytes_per_entry"] for st in sts if st.get("index_bytes_per_entry") is not None]
        row.append(f"{ipe[-1]:.1f}" if ipe else "-")
        checked = [st for st in sts if "oracle_ok" in st]
        verdict = f"{sum(st['oracle_ok'] for st in checked)}/{len(checked)} ok"
        if "validate" in by:
            verdict += f", validate {'ok' if by['validate'].get('validate_ok') else 'FAILED'}"
        row.append(verdict)
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True, help="data, tables, state and results: keep it to resume")
    ap.add_argument("--sizes", default="1000000,10000000,100000000")
    ap.add_argument("--batches", default="1000,100000,1000000", help="batch sizes, applied in turn")
    ap.add_argument("--batches-before-read", type=int, default=10)
    ap.add_argument("--table-types", default="copy_on_write,merge_on_read")
    ap.add_argument("--indexes", default="record")
    ap.add_argument("--keys", default="uuid", help="uuid, order or both")
    ap.add_argument("--layouts", default="flat", help="flat, partitioned or both")
    ap.add_argument("--build", choices=("bootstrap", "upsert"), default="bootstrap")
    ap.add_argument("--peers", default="delta_rs,pypaimon", help="delta_rs, pypaimon; '' for none")
    ap.add_argument("--paimon-python", default="/work/venvs/paimon/bin/python")
    ap.add_argument("--peer-timeout", type=float, default=1800.0)
    ap.add_argument("--step-timeout", type=float, default=4 * 3600.0)
    ap.add_argument("--validate-up-to", type=int, default=10_000_000)
    ap.add_argument("--arrow-read-up-to", type=int, default=10_000_000,
                    help="above this size, skip the in-memory Arrow read (it holds the whole table)")
    ap.add_argument("--check-every-batch-up-to", type=int, default=10_000_000,
                    help="check bucketindex against the oracle after every batch up to this size")
    ap.add_argument("--file-rows", type=int, default=1_000_000, help="rows per base Parquet file (one row group)")
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    r = Runner(args, work)
    sizes = [int(s) for s in parse_list(args.sizes)]
    sizes_b = [int(s) for s in parse_list(args.batches)]
    batches = [sizes_b[i % len(sizes_b)] for i in range(max(args.batches_before_read, len(sizes_b)))]
    peers = parse_list(args.peers)
    if "pypaimon" in peers and not Path(args.paimon_python).exists():
        log(f"pypaimon: no interpreter at {args.paimon_python} (it needs pyarrow < 20: a virtualenv of its own); "
            "skipped")
        peers.remove("pypaimon")
    contenders = [f"bucketindex_{t}_{i}" for t in parse_list(args.table_types) for i in parse_list(args.indexes)]
    contenders += peers
    t0 = time.perf_counter()
    for size in sizes:
        for keys in parse_list(args.keys):
            data = Dataset(work, keys=keys, size=size, seed=args.seed, file_rows=args.file_rows)
            for layout in parse_list(args.layouts):
                for c in contenders:
                    run_contender(r, data, layout, c, batches)
    steps = r.all
    result = {"benchmark": "scale", "sizes": sizes, "batches": batches, "contenders": contenders,
              "keys": parse_list(args.keys), "layouts": parse_list(args.layouts), "build": args.build,
              "steps": steps, "oracle_ok": all(s.get("oracle_ok", True) for s in steps),
              "failed_steps": [f"{s['contender']} {s['size']} {s['step']}" for s in steps
                               if s.get("rc", 0) != 0 or s.get("oracle_ok") is False],
              "elapsed_s": round(time.perf_counter() - t0, 1),
              "env": {"cpu": cpu_model(), "mem_gb": mem_total_gb(), "cores": os.cpu_count(),
                      "load": os.getloadavg()}}
    log(summary(steps))
    emit_result(result, args.json_out or str(work / "results.json"))
    return result


if __name__ == "__main__":
    main()
