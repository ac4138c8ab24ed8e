"""Several writer processes on one table through the CLI, as overlapping DAG runs would be, on
the Arrow engine (in-process: no JVM, about a second per writer).

Each round starts three ``bucketindex upsert --engine arrow`` processes together, with a pause
injected between the conflict check and the commit point so their windows overlap. Afterwards
every batch that exited 0 is fully present, every batch that exited 3 is fully absent, no key
appears twice, the table equals the oracle of the successful batches in commit order, and
``validate`` passes. A second test fires ``rollback --force`` (and the Airflow rollback
operator) at points of a live upsert: the table is always the old snapshot or the new one,
and the writer's exit status says which.

The scenarios are the table protocol's (conflict check, commit point, forced rollback), so
they run here on Arrow; tests/spark/test_concurrent_writers.py runs the same bodies with Spark
writers (a forced rollback of a live Spark writer; the extended tier's three Spark writers) and
an Arrow writer racing a Spark writer on one table.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.arrow_engine.validate import run_validate as arrow_validate
from spark_jobs.table import Action, Table
from spark_jobs.table.describe import describe
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from tests.oracle import reduce_batches, rows_by_identity

pytestmark = pytest.mark.unit

REGIONS = ["eu west", "são paulo"]
WRITERS = 3
#: how a CLI writer runs on each engine
ARROW = ["--engine", "arrow"]
SPARK = ["--master", "local[1]"]

Upsert = Callable[[UpsertOptions], Any]
Validate = Callable[[str], dict]


def write_batch(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _key(i: int) -> str:
    return f"order {i:04d}/é+%"


def _row(i: int, region: str | None, ts: int, writer: str, deleted: bool = False) -> dict:
    return {"id": _key(i), "region": region, "ts": ts, "amount": float(i), "writer": writer, "is_deleted": deleted}


def _options(uri: str, src: str, index: str, batch_id: str, table_type: str | None = None) -> UpsertOptions:
    return UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
                         index=index, num_buckets=4, delete_field="is_deleted", batch_id=batch_id,
                         target_file_rows=100, table_type=table_type)


def _cli_upsert(uri: str, src: str, batch_id: str, env: dict[str, str], engine: list[str],
                *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "spark_jobs.cli", "upsert", uri, src, "--record-key", "id", "--precombine-field",
           "ts", "--partition-field", "region", "--delete-field", "is_deleted", "--batch-id", batch_id,
           *engine, *extra]
    return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _base(upsert: Upsert, tmp_path: Path, index: str, table_type: str | None = None) -> tuple[str, list[dict]]:
    """A table with a full and a small file group in 'eu west' (130 rows, 100 per file), one in 'são paulo',
    one in the empty-string partition and one in the null partition (two directories, format.md §1)."""
    uri = str(tmp_path / f"t-{index}")
    rows = ([_row(i, "eu west", 1, "base") for i in range(130)] + [_row(i, "são paulo", 1, "base") for i in range(130, 170)]
            + [_row(i, "", 1, "base") for i in range(170, 180)] + [_row(i, None, 1, "base") for i in range(180, 190)])
    upsert(_options(uri, write_batch(tmp_path / f"base-{index}.parquet", rows), index, "base", table_type))
    return uri, rows


def _round(validate: Validate, engine: list[str], tmp_path: Path, uri: str, index: str, name: str,
           batches: list[list[dict]], extra: list[list[str]], history: list[tuple[str, list[dict]]]) -> dict[str, int]:
    procs = {}
    for w, rows in enumerate(batches):
        batch_id = f"{name}-w{w}"
        src = write_batch(tmp_path / f"{index}-{batch_id}.parquet", rows)
        env = {"BUCKETINDEX_PAUSE": "after_conflict_check=1.5"}
        procs[batch_id] = (_cli_upsert(uri, src, batch_id, env, engine, *extra[w]), rows)
    status = {}
    for batch_id, (p, _) in procs.items():
        _, err = p.communicate(timeout=600)
        status[batch_id] = p.returncode
        assert p.returncode in (0, 3), (batch_id, p.returncode, err[-3000:])
        if p.returncode == 3:
            last = err.strip().splitlines()[-1]
            assert last.startswith("bucketindex: conflict:"), err[-2000:]
    # the oracle: successful batches applied in commit order
    tl = Table.load(uri).timeline.reload()
    order = [tl.read_metadata(i)["batch_id"] for i in tl.completed([Action.COMMIT])]
    committed = [b for b in order if b in procs]
    assert sorted(committed) == sorted(b for b, rc in status.items() if rc == 0), (order, status)
    history.extend((b, procs[b][1]) for b in committed)
    partition = "region" if index == "bucket" else None
    expected = reduce_batches([rows for _, rows in history], partition=partition)
    actual = rows_by_identity(read_arrow(uri).to_pylist(), partition=partition)  # asserts no key twice
    assert actual == expected
    for batch_id, rc in status.items():  # a failed batch left no row of its own behind
        if rc != 0:
            assert not any(r["writer"] == batch_id for r in actual.values())
    markers = Table.load(uri).layout.markers
    assert tl.pending() == [] and (not os.path.exists(markers) or not os.listdir(markers))
    report = validate(uri)
    assert report["ok"], report["problems"]
    return status


def three_writers_overlapping_then_disjoint(upsert: Upsert, validate: Validate, engine: list[str], tmp_path: Path,
                                            index: str, table_type: str) -> None:
    """Merge-on-read writers append logs instead of rewriting bases; the same conflict rules
    (a file group written by both, a key in both index deltas) keep them correct."""
    uri, base = _base(upsert, tmp_path, index, table_type)
    history: list[tuple[str, list[dict]]] = [("base", base)]

    # round 1, overlapping: all three update keys 0-39 (same ts: the later commit wins) and
    # insert keys of their own; the third may not retry, so it must lose cleanly if it meets a winner
    overlap = [[_row(i, "eu west", 5, f"r1-w{w}") for i in range(40)]
               + [_row(1000 + 100 * w + i, "eu west", 5, f"r1-w{w}") for i in range(15)] for w in range(WRITERS)]
    status = _round(validate, engine, tmp_path, uri, index, "r1", overlap, [[], [], ["--max-retries", "0"]], history)
    assert status["r1-w0"] == 0 or status["r1-w1"] == 0

    # round 2, disjoint: each writer updates its own existing keys and inserts new ones into the
    # same partition (the small file group takes inserts), one also deletes a key of its own
    disjoint = [[_row(40 + 20 * w + i, "eu west", 9, f"r2-w{w}") for i in range(10)]
                + [_row(2000 + 100 * w + i, "eu west", 9, f"r2-w{w}") for i in range(10)]
                + [_row(140 + w, "são paulo", 9, f"r2-w{w}", deleted=True)]
                # one writer each on the "" and the null partition's group: a delete, an update
                + {0: [_row(170, "", 9, "r2-w0", deleted=True)], 1: [_row(180, None, 9, "r2-w1")]}.get(w, [])
                for w in range(WRITERS)]
    status = _round(validate, engine, tmp_path, uri, index, "r2", disjoint, [[], [], []], history)
    assert all(rc == 0 for rc in status.values()), status  # writers on disjoint keys all commit

    t = Table.load(uri)
    retried = [c for i in t.timeline.completed([Action.COMMIT]) for c in t.timeline.read_metadata(i)["conflicts"]]
    assert retried, "the injected pause should have made at least one writer retry"
    assert describe(t)["conflicts"], "show lists the recent conflicts"


@pytest.mark.parametrize("index,table_type", [("record", "copy_on_write"), ("bucket", "copy_on_write"),
                                              ("record", "merge_on_read")])
def test_three_writers_overlapping_then_disjoint(tmp_path, index, table_type):
    three_writers_overlapping_then_disjoint(arrow_upsert, arrow_validate, ARROW, tmp_path, index, table_type)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"writer ended (rc {proc.returncode}) before reaching {path.name}: "
                                 f"{proc.stderr.read()[-3000:] if proc.stderr else ''}")
        assert time.monotonic() < deadline, f"writer never reached {path.name}"
        time.sleep(0.1)


def _rollback_with_operator(uri: str, batch_id: str) -> None:
    from airflow_provider_bucketindex.demo import sandbox

    sandbox.isolate_before_import()
    from airflow_provider_bucketindex.operators import RollbackBatchOperator

    RollbackBatchOperator(task_id="rollback", table_uri=uri, batch_id=batch_id, force=True).execute({})


def forced_rollback_of_a_live_writer(upsert: Upsert, validate: Validate, engine: list[str], tmp_path: Path,
                                     point: str, via: str) -> None:
    uri, base = _base(upsert, tmp_path, "record")
    before = rows_by_identity(read_arrow(uri).to_pylist())
    batch = [_row(i, "eu west", 7, "late") for i in range(0, 130, 3)] + [_row(5000 + i, "são paulo", 7, "late")
                                                                         for i in range(20)]
    src = write_batch(tmp_path / "late.parquet", batch)
    signals = tmp_path / "signals"
    # long enough for a rollback process to start and decide on a busy machine (2 cores, other jobs)
    writer = _cli_upsert(uri, src, "late", {"BUCKETINDEX_PAUSE": f"{point}=8", "BUCKETINDEX_PAUSE_SIGNAL": str(signals)},
                         engine)
    _wait_for(signals / point, writer)
    if via == "cli":
        pending = Table.load(uri).pending_for_batch("late")
        assert pending is not None
        rb = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "rollback", uri, pending.timestamp, "--force"],
                            capture_output=True, text=True, timeout=120)
        assert rb.returncode == 0, rb.stderr
    else:
        _rollback_with_operator(uri, "late")
    _, err = writer.communicate(timeout=300)

    t = Table.load(uri)
    after = rows_by_identity(read_arrow(uri).to_pylist())
    new = reduce_batches([base, batch])
    if writer.returncode == 0:
        assert after == new
    else:
        assert writer.returncode == 3, err[-3000:]
        assert "rolled back" in err.strip().splitlines()[-1]
        assert after == before
    assert t.timeline.reload().pending() == []
    assert not os.path.exists(t.layout.markers) or not os.listdir(t.layout.markers)
    on_disk = {str(p.relative_to(t.root)) for p in Path(t.root).rglob("*.parquet")}
    referenced = {fg["path"] for i in t.timeline.completed([Action.COMMIT])
                  for fg in t.timeline.read_metadata(i)["file_groups"] if fg["path"]}
    assert on_disk <= referenced, "the aborted writer's files are gone"
    assert validate(uri)["ok"]


@pytest.mark.parametrize("point,via", [("after_requested", "cli"), ("after_data_file", "cli"),
                                       ("after_index_file", "operator"), ("after_conflict_check", "cli")])
def test_forced_rollback_of_a_live_writer_never_leaves_a_broken_table(tmp_path, point, via):
    forced_rollback_of_a_live_writer(arrow_upsert, arrow_validate, ARROW, tmp_path, point, via)
