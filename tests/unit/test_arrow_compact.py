"""Compaction on the in-process engine (``compact --engine arrow``): data and index plans of
tables the Arrow upsert wrote fold into new bases without changing what a read sees, the index
stays whole, a SIGKILL mid-compaction leaves the snapshot and the next compact finishes, and
the CLI run imports no ``pyspark``; ``auto`` sizes a plan by the slices it folds at once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.compact import needed_bytes, run_compact
from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.cli import main
from spark_jobs.table.action.compact import CompactionPolicy, plan_compaction
from spark_jobs.table.action.engine import IN_MEMORY_EXPANSION, choose_engine
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from spark_jobs.table.view import is_index_delta
from tests.oracle import reduce_batches, rows_by_identity

EVERYTHING = CompactionPolicy(min_logs=1, min_deltas=2)
SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("ts", pa.int64()), ("amount", pa.float64()),
                    ("is_deleted", pa.bool_())])
REGIONS = ["eu west/1", "sã%o+paulo", None, "us"]
#: a wrapper that fails when the CLI imported pyspark
NO_PYSPARK = ("import sys; from spark_jobs.cli import main; rc = main(sys.argv[1:]); "
              "assert 'pyspark' not in sys.modules, 'pyspark was imported'; sys.exit(rc)")


def _batches(seed: int, n: int = 4, pool: int = 150, size: int = 90) -> list[list[dict]]:
    """Updates, deletes, re-inserts after a delete, partition moves, late (stale) events; keys
    with spaces, ``/``, ``%``, ``+`` and non-ASCII; null partitions. (key, ts) unique per batch."""
    rnd = random.Random(seed)
    region_of = {k: rnd.choice(REGIONS) for k in range(pool)}
    out = []
    for b in range(n):
        rows = []
        for j in range(size):
            k = rnd.randrange(pool)
            if rnd.random() < 0.15:
                region_of[k] = rnd.choice(REGIONS)
            ts = b * 1000 + j if rnd.random() > 0.1 else b * 1000 - 500 - j  # 10% late events
            rows.append({"id": f"k{k:03d} /%+é", "region": region_of[k], "ts": ts, "amount": rnd.random(),
                         "is_deleted": rnd.random() < 0.12})
        out.append(rows)
    return out


def _opts(uri: str, src: str, index: str, batch_id: str) -> UpsertOptions:
    return UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
                         index=index, num_buckets=4, delete_field="is_deleted", batch_id=batch_id,
                         target_file_rows=40, table_type="merge_on_read",
                         auto_compact="off")  # compaction is run by each test, when it says


def _build(tmp_path: Path, index: str, batches: list[list[dict]]) -> str:
    uri = str(tmp_path / "t")
    for i, rows in enumerate(batches):
        src = tmp_path / f"b{i}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), src)
        run_upsert(_opts(uri, str(src), index, f"b{i}"))
    return uri


def _identity(index: str) -> str | None:
    return "region" if index == "bucket" else None


def _no_java_env(**extra: str) -> dict[str, str]:
    """The environment with no Java reachable: a JVM start would fail the run."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME", "SPARK_REMOTE")}
    env["JAVA_HOME"] = "/nonexistent-java"
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not os.path.exists(os.path.join(p, "java")))
    env.update(extra)
    return env


def _on_disk_unreferenced(uri: str) -> set[str]:
    """Data and index files on disk that no completed action added."""
    t = Table.load(uri)
    added: set[str] = set()
    for inst in t.timeline.completed():
        meta = t.timeline.read_metadata(inst)
        for fg in meta.get("file_groups", []):
            added |= {fg.get("path"), (fg.get("log") or {}).get("path")}
        added |= {f["path"] for f in (meta.get("index") or {}).get("added", [])}
    root = Path(t.root)
    on_disk = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.suffix in (".parquet", ".arrow")
               and ".bucketindex" not in p.relative_to(root).parts[:1]}
    return on_disk - added


@pytest.mark.parametrize("index", ["record", "bucket", "global_simple"])
def test_arrow_compaction_keeps_the_snapshot_and_the_index(tmp_path, index):
    batches = _batches(seed=7)
    uri = _build(tmp_path, index, batches[:3])
    before = rows_by_identity(read_arrow(uri).to_pylist(), partition=_identity(index))
    assert before == reduce_batches(batches[:3], partition=_identity(index))
    view = Table.load(uri).view()
    assert any(s.logs for s in view.file_groups.values())

    out = run_compact(uri, policy=EVERYTHING)
    assert out["executed"] and not out["noop"] and out["engine"]["name"] == "arrow"
    t = Table.load(uri)
    assert t.timeline.pending() == [] and not t.marked_files(out["instant"])
    view = t.view()
    assert not any(s.logs for s in view.file_groups.values()), "every group with logs was due"
    if index == "record":
        assert out["counts"]["index_buckets"] > 0
        assert not any(is_index_delta(f) for fs in view.index_files.values() for f in fs)
    meta = t.timeline.read_metadata(t.timeline.find(out["instant"]))
    assert meta["engine"] == {"name": "arrow", "reason": "spark_jobs.arrow_engine.compact.run_compact"}
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition=_identity(index)) == before
    report = run_validate(uri)
    assert report["ok"], report["problems"]
    assert not _on_disk_unreferenced(uri)

    # the compacted table takes the next batch as before
    src = tmp_path / "b3.parquet"
    pq.write_table(pa.Table.from_pylist(batches[3], schema=SCHEMA), src)
    run_upsert(_opts(uri, str(src), index, "b3"))
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition=_identity(index)) == \
        reduce_batches(batches, partition=_identity(index))
    assert run_validate(uri)["ok"]
    assert run_compact(uri, policy=CompactionPolicy(min_logs=5, log_ratio=100, min_deltas=5,
                                                    delta_ratio=100))["noop"]  # nothing due


@pytest.mark.parametrize("point", ["after_data_file", "after_index_file"])
def test_killed_arrow_compaction_leaves_the_snapshot_and_the_next_compact_finishes(tmp_path, point):
    batches = _batches(seed=8, n=3)
    uri = _build(tmp_path, "record", batches)
    before = read_arrow(uri).to_pylist()
    p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "compact", uri, "--engine", "arrow",
                        "--min-logs", "1", "--min-deltas", "2", "--heartbeat-timeout", "1"],
                       capture_output=True, text=True, timeout=120, env=_no_java_env(BUCKETINDEX_FAULT=point),
                       start_new_session=True)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])
    t = Table.load(uri)
    pending = t.timeline.pending()
    assert [i.action for i in pending] == ["compaction"]
    assert t.marked_files(pending[0].timestamp), "the dead attempt should have left a new base"
    assert read_arrow(uri).to_pylist() == before  # readers see the snapshot before the compaction
    assert run_validate(uri)["ok"]  # the index in force is the old one, whole
    time.sleep(1.5)  # the dead attempt's heartbeat expires

    out = run_compact(uri, policy=EVERYTHING, heartbeat_timeout_s=1)  # runs the waiting plan first
    assert [r["instant"] for r in out["resumed"]] == [pending[0].timestamp] and not out["resumed"][0]["noop"]
    t = Table.load(uri)
    assert t.timeline.pending() == [] and not t.marked_files(pending[0].timestamp)
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]
    assert not _on_disk_unreferenced(uri), "the crashed attempt's files are deleted at the commit"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_PYSPARK, *args], capture_output=True, text=True, timeout=120,
                          env=_no_java_env())


def test_cli_compact_on_arrow_imports_no_pyspark_and_shows_the_engine(tmp_path, capsys):
    batches = _batches(seed=9, n=3)
    uri = _build(tmp_path, "record", batches)
    before = rows_by_identity(read_arrow(uri).to_pylist())
    assert main(["compact", uri, "--schedule-only", "--only", "index", "--min-deltas", "2"]) == 0
    planned = capsys.readouterr().out.strip().splitlines()[-1]
    # --execute with the default engine (auto), as users run it: the plan is sized, fits, runs
    # in that process, which imports no pyspark and finds no Java
    p = _cli("compact", uri, "--execute", planned)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "engine: arrow (needs about" in p.stderr
    out = json.loads(p.stdout.strip().splitlines()[0])
    assert out["executed"] and out["engine"]["name"] == "arrow" and "session_start_ms" not in out
    # both steps at once, the engine asked for
    assert main(["compact", uri, "--engine", "arrow", "--min-logs", "1"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    assert out["executed"] and out["engine"] == {"name": "arrow", "reason": "--engine arrow"}
    assert rows_by_identity(read_arrow(uri).to_pylist()) == before
    assert run_validate(uri)["ok"]
    assert main(["show", uri]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if " compaction " in ln and "deltas folded" in ln]
    assert len(lines) == 2 and "engine=arrow (needs about" in lines[0] and "engine=arrow (--engine arrow)" in lines[1], \
        lines
    # a Spark master with --engine arrow: bad usage, nothing written
    n = len(Table.load(uri).timeline.reload().completed())
    assert main(["compact", uri, "--engine", "arrow", "--master", "local[1]", "--min-logs", "1"]) == 2
    assert "--engine arrow runs in-process" in capsys.readouterr().err
    assert len(Table.load(uri).timeline.reload().completed()) == n and not Table.load(uri).timeline.pending()


def test_auto_sizes_a_plan_by_the_slices_it_folds_at_once(tmp_path):
    uri = _build(tmp_path, "record", _batches(seed=10, n=3))
    table = Table.load(uri)
    plan = plan_compaction(table, table.view(), EVERYTHING)
    assert plan is not None and len(plan["file_groups"]) > 2
    groups = sorted((g["base_bytes"] + g["log_bytes"] for g in plan["file_groups"]), reverse=True)
    buckets = sorted((b["base_bytes"] + b["delta_bytes"] for b in plan["index_buckets"]), reverse=True)
    need = needed_bytes(table, plan)
    assert need == (sum(groups[:2]) + sum(buckets[:2])) * IN_MEMORY_EXPANSION
    assert need < sum(groups) * IN_MEMORY_EXPANSION  # not the whole plan: two groups at a time
    # a plan scheduled before the sizes were recorded is sized from its files
    bare = {**plan, "file_groups": [{k: v for k, v in g.items() if not k.endswith("_bytes")}
                                    for g in plan["file_groups"]],
            "index_buckets": [{k: v for k, v in b.items() if not k.endswith("_bytes")} for b in plan["index_buckets"]]}
    assert needed_bytes(table, bare) == need
    assert choose_engine(requested="auto", needed_bytes=need, budget=need).engine == "arrow"
    over = choose_engine(requested="auto", needed_bytes=need, budget=need - 1)
    assert over.engine == "spark" and "over the" in over.reason
