"""The cost of Parquet page checksums (issue 36 item 3): one 1M-row data file written and read
with and without them, as ``spark_jobs.io.parquet`` writes and reads the table's files.

    python benchmarks/page_checksums.py [--rows N] [--repeat K]

Prints the best of ``--repeat`` runs per contender, alternating them (the machine is shared);
the last line is one JSON object with the figures."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    n = a.rows
    rows = pa.table({"_bi_key": pa.array([f"key-{i:09d}" for i in range(n)]), "ts": pa.array(np.arange(n)),
                     "amount": pa.array(rng.random(n)), "name": pa.array(rng.choice(["alice", "bob", "carol"], n)),
                     "qty": pa.array(rng.integers(0, 1000, n))})
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.repeat):
            for on in (False, True):
                path = os.path.join(d, f"{on}.parquet")
                s = time.perf_counter()
                pq.write_table(rows, path, compression="zstd", write_page_checksum=on)
                w = time.perf_counter() - s
                s = time.perf_counter()
                pq.read_table(path, page_checksum_verification=on)
                r = time.perf_counter() - s
                for k, v in ((f"write_ms_{'on' if on else 'off'}", w), (f"read_ms_{'on' if on else 'off'}", r)):
                    best[k] = min(best.get(k, v), v)
                best[f"bytes_{'on' if on else 'off'}"] = os.path.getsize(path)
    out = {k: round(v * 1000) if k.endswith(("on", "off")) and "ms" in k else v for k, v in best.items()}
    out["rows"] = n
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
