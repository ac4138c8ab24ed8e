"""Memory bounded by design on the in-process engine (issue 38, item 5).

A batch the Arrow engine would hold beyond the budget is never attempted whole:

* ``auto`` sizes it before reading (the process, the batch decoded -- from the source's Parquet
  footers -- times what the engine holds of it, the table's share) and hands a batch over the
  budget to Spark, logging why; the choice is checked here, Spark is not started;
* a batch whose footers under-state it (a column of one long repeated value: a dictionary page
  of a few bytes that decodes to megabytes) is caught by the engine itself once read, before
  anything is written: ``auto`` runs Spark, ``--engine arrow`` with a budget fails with one line
  (exit 2), the table untouched;
* a batch within a small budget runs, the process's measured peak (the kernel's high-water
  mark of its RSS) stays under that budget and under the estimate the run reported, and the
  table equals the oracle and validates.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs import engines
from spark_jobs.arrow_engine.upsert import BATCH_HOLD, PROCESS_BYTES, ROW_BYTES, needed_bytes
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.table.action.engine import parse_size
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_cli_newcomer import tree_digest

pytestmark = pytest.mark.unit

MIB = 1 << 20


class SparkAsked(Exception):
    """Raised where the Spark job would start: the engine chosen was Spark (no JVM, no pyspark)."""


def _no_spark() -> None:
    raise AssertionError("the arrow engine asked for a Spark session")


@pytest.fixture()
def spark_runs(monkeypatch):  # type: ignore[no-untyped-def]
    """The Spark upsert replaced by a stub that records the choice it was given and stops."""
    seen: list = []
    stub = types.ModuleType("spark_jobs.jobs.upsert")

    def run_upsert(session, opts, *, choice):  # type: ignore[no-untyped-def]
        seen.append(choice)
        raise SparkAsked(choice.reason)

    stub.run_upsert = run_upsert  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "spark_jobs.jobs.upsert", stub)
    return seen


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "BUCKETINDEX_ARROW_MEMORY_BUDGET")}


def _rows(rnd: random.Random, keys: list[int], ts: int) -> list[dict]:
    return [{"id": f"key-{k:09d}", "ts": ts + rnd.randrange(1000),
             "amount": rnd.random(), "note": rnd.choice(["a", "bb", "ключ", "鍵"]) * rnd.randrange(1, 8),
             "is_deleted": False} for k in keys]


def _write(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _repeated_value_batch(path: Path, *, rows: int, width: int) -> str:
    """A batch of a few hundred KB whose ``note`` decodes to ``rows * width`` bytes: one long
    value, dictionary-encoded on disk (its footer counts the dictionary once), read back as
    plain strings (no Arrow schema stored)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    note = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["x" * width]))
    pq.write_table(pa.table({"id": [f"r{i:07d}" for i in range(rows)], "ts": list(range(rows)), "note": note}),
                   path, compression="zstd", store_schema=False)
    return str(path)


def _opts(table: str, source: str, **kw) -> UpsertOptions:  # type: ignore[no-untyped-def]
    return UpsertOptions(table=table, source=source, record_key=["id"], precombine_field="ts", **kw)


def test_auto_hands_a_batch_over_the_budget_to_spark_and_says_why(tmp_path, spark_runs):
    rnd = random.Random(1)
    src = _write(tmp_path / "in" / "b.parquet", _rows(rnd, list(range(200_000)), 0))
    opts = _opts(str(tmp_path / "t"), src, memory_budget="256m")
    needed = engines.upsert_footprint(opts)
    # the estimate counts the process, the rows and the batch decoded: over 256 MiB
    md = pq.read_metadata(src)
    assert needed >= PROCESS_BYTES + ROW_BYTES * md.num_rows + BATCH_HOLD * md.row_group(0).total_byte_size
    assert needed > 256 * MIB
    with pytest.raises(SparkAsked):
        engines.upsert(opts, spark=lambda: "a session")
    # the reason the Spark job logs with its first phase (``engine: spark (...)``) and records
    assert [c.reason for c in spark_runs] == [f"needs about {needed / MIB:.0f} MiB in memory, over the 256 MiB budget"]
    assert not (tmp_path / "t").exists()  # nothing was created or written
    # the same batch within a budget it fits runs in-process
    fits = _opts(str(tmp_path / "t"), src, memory_budget="2g")
    assert engines.upsert(fits, spark=_no_spark)["engine"] == "arrow"


def test_a_batch_whose_footers_understate_it_is_refused_by_the_engine_before_writing(tmp_path, spark_runs):
    rnd = random.Random(2)
    uri = str(tmp_path / "t")
    first = _write(tmp_path / "in" / "first.parquet", [{k: v for k, v in r.items() if k in ("id", "ts", "note")}
                                                       for r in _rows(rnd, list(range(100)), 0)])
    assert engines.upsert(_opts(uri, first, engine="arrow"), spark=_no_spark)["engine"] == "arrow"
    src = _repeated_value_batch(tmp_path / "in" / "wide.parquet", rows=60_000, width=2000)  # 120 MB decoded
    assert os.path.getsize(src) < 2 * MIB
    opts = _opts(uri, src, memory_budget="400m")
    # auto's estimate from the footers fits the budget: it picks arrow ...
    assert engines.upsert_footprint(opts) < parse_size("400m")
    before = tree_digest(Path(uri))
    with pytest.raises(SparkAsked):
        engines.upsert(opts, spark=lambda: "a session")  # ... and the engine, having read 120 MB, hands it to Spark
    assert len(spark_runs) == 1 and spark_runs[0].engine == "spark"
    assert re.fullmatch(r"the arrow engine cannot run this batch \(the batch \(60000 rows\) decodes to \d+ MiB in memory, about "
                        r"\d+ MiB at the arrow engine's peak, over the 400 MiB budget .*\)", spark_runs[0].reason), \
        spark_runs[0].reason
    assert tree_digest(Path(uri)) == before
    # forced onto arrow with that budget: one line, exit 2, nothing written
    p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "upsert", uri, src, "--engine", "arrow",
                        "--memory-budget", "400m"], capture_output=True, text=True, timeout=300, env=_env())
    assert p.returncode == 2, p.stderr[-2000:]
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "decodes to" in p.stderr and "400 MiB budget" in p.stderr and "--memory-budget" in p.stderr, p.stderr
    assert tree_digest(Path(uri)) == before
    # without a budget set, --engine arrow is the user's call: the same batch runs (120 MB is no danger here)
    ok = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "upsert", uri, src, "--engine", "arrow"],
                        capture_output=True, text=True, timeout=300, env=_env())
    assert ok.returncode == 0, ok.stderr[-2000:]


#: runs the CLI and prints the kernel's high-water mark of its RSS (``ru_maxrss``, KiB): exact,
#: where polling would miss a short peak; this wrapper's own children are only the CLI
_PEAK = ("import json, resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
         "print(json.dumps({'rc': p.returncode, 'maxrss_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))")


def _cli_peak(*args: str) -> tuple[dict, dict]:
    p = subprocess.run([sys.executable, "-c", _PEAK, sys.executable, "-m", "spark_jobs.cli", *args],
                       capture_output=True, text=True, timeout=600, env=_env())
    lines = p.stdout.strip().splitlines()
    peak = json.loads(lines[-1])
    assert peak["rc"] == 0, p.stderr[-3000:]
    return json.loads(lines[-2]), {**peak, "stderr": p.stderr}


def test_a_batch_within_a_small_budget_stays_under_it_and_matches_the_oracle(tmp_path):
    budget = "400m"
    rnd = random.Random(3)
    n = 200_000
    load = _rows(rnd, list(range(n)), 0)
    # half updates of loaded keys (a few of them twice: in-batch duplicates), half inserts, some deletes
    upd = rnd.sample(range(n), n // 2)
    batch = _rows(rnd, upd, 10_000) + _rows(rnd, list(range(n, n + n // 2)), 10_000)
    for r in rnd.sample(batch, 2_000):
        batch.append({**r, "ts": r["ts"] + 5_000, "amount": -1.0})
    for r in rnd.sample(batch[: n // 2], 1_000):
        r["is_deleted"] = True
    uri = str(tmp_path / "t")
    runs = []
    for i, rows in enumerate((load, batch)):
        src = _write(tmp_path / "in" / f"b{i}.parquet", rows)
        result, peak = _cli_peak("upsert", uri, src, "--record-key", "id", "--precombine-field", "ts",
                                 "--delete-field", "is_deleted", "--engine", "arrow", "--memory-budget", budget,
                                 "--batch-id", f"b{i}")
        assert result["engine"] == "arrow"
        said = re.search(r"engine: arrow \(--engine arrow, about (\d+) MiB in memory, within the 400 MiB budget\)",
                         peak["stderr"])
        assert said, peak["stderr"][-2000:]
        runs.append((int(said.group(1)) * MIB, peak["maxrss_kib"] * 1024))
    for estimate, rss in runs:
        # the budget is the process's peak, by design: no overhead is added to it here
        assert rss <= parse_size(budget), (rss / MIB, runs)
        # and the estimate the run reported is an upper bound of what it held (before the
        # calibration it was ~1/3 of the peak: source bytes x 6)
        assert rss <= estimate, (rss / MIB, estimate / MIB)
    expected = reduce_batches([load, batch])
    assert rows_by_identity(read_arrow(uri).to_pylist()) == expected
    report = run_validate(uri)
    assert report["ok"] and report["rows"] == len(expected), report


def test_the_plan_grows_with_the_batch_and_counts_the_process():
    assert needed_bytes(rows=0, batch_bytes=0, table_bytes=0) == PROCESS_BYTES
    assert needed_bytes(rows=10, batch_bytes=MIB, table_bytes=3) == PROCESS_BYTES + 10 * ROW_BYTES + BATCH_HOLD * MIB + 3
