"""Merge-on-read deletes with a per-key versus a global precombine value, at scale (issue 38).

A merge-on-read log may hold a delete only when it is not older than its key's stored row
(docs/format.md §5.1). Until session 49 the writer read the key and precombine columns of every
file slice a delete touched; now a delete not older than the greatest precombine value in the
slice's Parquet footers is logged without that read (``table/reader.py`` ``slice_value_bound``).
Whether the shortcut applies depends on the precombine field users choose:

* **global** -- an event time, a log sequence number: a batch's values are above everything
  stored, so every delete is decided from footers;
* **per key** -- a version counter per key (what ``benchmarks/scale.py`` generates: ``seq =
  version << 40 | ordinal``): a slice holds keys at higher versions than a deleted key's next
  one, so the footers cannot decide and the slice is read as before.

From a batch file that ``scale.py`` wrote for an existing table (``--from``), this makes two 1M-row
CDC batches of disjoint live keys (1% deletes of live keys, 49% updates, 50% inserts with new
UUIDs), one stamped per key (``seq + 1 << 40``) and one globally (``1 << 50`` + row number), and
upserts each with the cold CLI (``bucketindex upsert TABLE BATCH --delete-field _deleted``, table
defaults), per-key first. It prints each run's wall and CPU time, the phases the CLI reports, and
the bytes the process read (``/proc/<pid>/io`` ``rchar``). The table changes: use a benchmark table.

    python benchmarks/delete_bound.py --table W/tables/bucketindex_merge_on_read_record_uuid_flat_100000000 \\
        --from W/data/uuid_100000000/batch_004_1M.parquet --work /tmp/delete_bound
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def make_batches(src: Path, work: Path, *, seed: int = 49) -> dict[str, Path]:
    """Two 1M-row batches of disjoint live keys (the source batch's rows that are not deletes:
    inserted or updated by it, so live), one per precombine stamping."""
    t = pq.read_table(src)
    live = t.filter(pc.invert(t.column("_deleted")))
    n = live.num_rows
    rng = np.random.default_rng(seed)
    live = live.take(pa.array(rng.permutation(n)))
    half = n // 2
    out: dict[str, Path] = {}
    for name, part in (("per_key", live.slice(0, half)), ("global", live.slice(half, n - half))):
        rows = 1_000_000
        n_del = rows // 100
        n_upd = min(part.num_rows - n_del, rows // 2 - n_del)
        deletes = part.slice(0, n_del)
        updates = part.slice(n_del, n_upd)
        inserts = part.take(pa.array(np.arange(rows - n_del - n_upd) % part.num_rows))  # other columns reused
        new_ids = pa.array([str(uuid.UUID(int=int(x), version=4)) for x in rng.integers(0, 2**62, inserts.num_rows)])
        inserts = inserts.set_column(inserts.schema.get_field_index("id"), "id", new_ids)
        flags = np.zeros(rows, dtype=bool)
        flags[:n_del] = True
        b = pa.concat_tables([deletes, updates, inserts]).drop_columns(["_deleted"])
        if name == "per_key":  # the key's next version, as scale.py stamps an update
            seq = pc.add(b.column("seq"), pa.scalar(1 << 40, pa.int64()))
        else:  # an LSN: above every value stored (scale.py's are below 16 << 40)
            seq = pa.array((1 << 50) + np.arange(rows, dtype=np.int64))
        b = b.set_column(b.schema.get_field_index("seq"), "seq", seq).append_column("_deleted", pa.array(flags))
        path = work / f"{name}_1M.parquet"
        pq.write_table(b.take(pa.array(rng.permutation(rows))), path)
        out[name] = path
    return out


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cold_upsert(table: Path, batch: Path, batch_id: str) -> dict:
    exe = str(Path(sys.executable).with_name("bucketindex"))
    cmd = [exe, "upsert", str(table), str(batch), "--delete-field", "_deleted", "--batch-id", batch_id]
    load = _load()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rchar = 0
    while p.poll() is None:
        try:
            rchar = max(rchar, int(next(l for l in Path(f"/proc/{p.pid}/io").read_text().splitlines()
                                        if l.startswith("rchar")).split()[1]))
        except (OSError, StopIteration, ValueError):
            pass
        time.sleep(0.1)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode != 0:
        raise SystemExit(f"upsert failed ({p.returncode}): {err[-2000:]}")
    res = json.loads(out.strip().splitlines()[-1])
    return {"batch": batch.name, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "peak_rss_gb": round((after.ru_maxrss) / 1e6, 2), "read_gb": round(rchar / 1e9, 2), "load_before": load,
            "load_after": _load(), "phases_ms": res.get("timings_ms"), "counts": res.get("counts"),
            "ignored": res.get("ignored"), "engine": res.get("engine")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=Path, required=True)
    ap.add_argument("--from", dest="src", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    batches = make_batches(args.src, args.work)
    results = []
    for name in ("per_key", "global"):
        r = cold_upsert(args.table, batches[name], f"delete-bound-{name}-{int(time.time())}")
        print(json.dumps(r), flush=True)
        results.append(r)
    print(json.dumps({"benchmark": "delete_bound", "table": str(args.table), "runs": results}))


if __name__ == "__main__":
    main()
