"""The walk of an upsert through the layers: which layer calls which, and how often it goes up.

Method (docs/architecture.md "The walk of an upsert"): one ``bucketindex upsert --engine arrow``
runs in this process (:func:`spark_jobs.cli.main`, the console script's table verbs) into a
small existing table, with a :func:`sys.setprofile` hook that sees every Python call. Each call
whose callee is a module of ours is attributed to its **caller**: the nearest frame of ours
below it on the stack (calls through the standard library or pyarrow keep their caller). A call
between two layers is a *transition*; it goes *down* when the callee's layer is lower in
:data:`RANK` (CLI 0 ... core 5) and *up* otherwise -- an up-call is the walk returning to a layer
it already left (an engine calling back into the verb dispatch, the core calling an engine).
Returns are not transitions. Shared leaves (``text``, ``processes``, ``resources``, ``home``)
belong to no layer and are skipped. Import-time calls are excluded: every module is imported by
a first, untraced upsert (the one that creates the table).

Run: ``python benchmarks/layer_walk.py`` (about 10 s). Last line: one JSON object.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

#: the layers of docs/architecture.md, top (0) to bottom; a module takes its longest prefix
RANK: dict[str, int] = {
    "spark_jobs.cli": 0,
    "airflow_provider_bucketindex.cli": 0,
    "spark_jobs.engines": 1,            # the verb: options resolved, engine chosen, fallback
    "spark_jobs.arrow_engine": 2,       # the engines
    "spark_jobs.jobs": 2,
    "spark_jobs.kernels": 3,            # per-file kernels both engines run
    "spark_jobs.table.action": 4,       # each verb's rules: options, transaction, commit
    "spark_jobs.table": 5,              # the core: timeline, view, reader, layout, ...
    "spark_jobs.index": 5,
    "spark_jobs.io": 5,
    "spark_jobs.exceptions": 5,
    "spark_jobs.redaction": 5,
}
NAMES = {0: "CLI", 1: "verb", 2: "engine", 3: "kernels", 4: "action rules", 5: "core"}


def layer_of(module: str) -> int | None:
    best = None
    for prefix, rank in RANK.items():
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, rank)
    return None if best is None else best[1]


def _batch(keys: range, version: int) -> pa.Table:
    """Keys and partition values as users have them: spaces, ``/``, ``%``, ``+``, non-ASCII."""
    regions = ["eu west", "us/east", "ap+south", "sä 100%"]
    return pa.table({
        "order_id": [f"order {i}/ü" for i in keys],
        "region": [regions[i % len(regions)] for i in keys],
        "amount": [float(i * version) for i in keys],
        "updated_at": [version] * len(keys),
    })


def main() -> int:
    from spark_jobs import cli

    work = tempfile.mkdtemp(prefix="layer-walk-")
    table = os.path.join(work, "orders")
    first, second = os.path.join(work, "b1.parquet"), os.path.join(work, "b2.parquet")
    pq.write_table(_batch(range(0, 2000), 1), first)
    pq.write_table(_batch(range(1000, 3000), 2), second)  # half updates, half new keys
    common = ["--engine", "arrow"]
    status = cli.main(["upsert", table, first, "--record-key", "order_id", "--partition-field", "region",
                       "--precombine-field", "updated_at", *common])
    assert status == 0, status

    calls: collections.Counter[tuple[int, int]] = collections.Counter()
    module_edges: collections.Counter[tuple[str, str]] = collections.Counter()
    #: what an up-call calls: (caller module, callee module, callee function) -> count
    up_calls: collections.Counter[tuple[str, str, str]] = collections.Counter()
    ranks: dict[str, int | None] = {}

    def rank(module: str) -> int | None:
        if module not in ranks:
            ranks[module] = layer_of(module)
        return ranks[module]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        to = rank(callee)
        if to is None:
            return
        caller = frame.f_back
        while caller is not None and rank(caller.f_globals.get("__name__", "")) is None:
            caller = caller.f_back
        if caller is None:
            return
        source = caller.f_globals["__name__"]
        frm = rank(source)
        if frm != to:
            calls[(frm, to)] += 1
            module_edges[(source, callee)] += 1
            if to < frm:
                up_calls[(source, callee, frame.f_code.co_qualname)] += 1

    t0 = time.perf_counter()
    sys.setprofile(profile)
    try:
        status = cli.main(["upsert", table, second, *common])
    finally:
        sys.setprofile(None)
    elapsed = time.perf_counter() - t0
    assert status == 0, status

    down = sum(n for (a, b), n in calls.items() if b > a)
    up = sum(n for (a, b), n in calls.items() if b < a)
    up_edges = sorted(((s, c), n) for (s, c), n in module_edges.items() if rank(c) < rank(s))
    print("cross-layer calls (caller -> callee: count):")
    for (a, b), n in sorted(calls.items()):
        print(f"  {NAMES[a]:>12} -> {NAMES[b]:<12} {n:6d}  {'down' if b > a else 'UP'}")
    print("up-calls (caller module -> callee function: count):")
    for (s, c, f), n in sorted(up_calls.items()):
        print(f"  {s} -> {c}.{f}: {n}")
    print(json.dumps({
        "cross_layer_calls": sum(calls.values()), "down": down, "up": up,
        "distinct_cross_layer_module_edges": len(module_edges),
        "distinct_upward_module_edges": len(up_edges),
        "layer_pairs": {f"{NAMES[a]}->{NAMES[b]}": n for (a, b), n in sorted(calls.items())},
        "traced_seconds": round(elapsed, 2),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
