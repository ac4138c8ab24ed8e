"""Rehash on the in-process Arrow engine (``bucketindex rehash --engine arrow|auto``), no Spark.

* rehashes 2 -> 8 -> 16 -> 4 under ``auto`` (which picks Arrow for these tables and says
  why), with upserts after each: the table equals the oracle, every row or index entry sits
  in bucket ``hash(key) mod M``, ``validate`` passes, reads as of earlier instants see the
  old layout, and the commit records the engine;
* ``auto`` picks Spark for a rehash over the memory budget (before anything is written), and
  ``--engine arrow`` over a budget the user set is bad input;
* a SIGKILL at each fault point of the Arrow rehash leaves the old or the new layout, and
  the next run finishes.

The same rehash on both engines: tests/spark/test_rehash_engines.py.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.cli import main
from spark_jobs.exceptions import BadInputError
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_arrow_oracle_rehash import _batches, _upsert, assert_layout
from tests.unit.test_arrow_oracle_upsert import tree_digest

pytestmark = pytest.mark.unit

#: (new count, batches upserted after it)
STEPS = [(8, 1), (16, 1), (4, 1)]


def _no_spark(*_a, **_k):  # type: ignore[no-untyped-def]
    raise AssertionError("the rehash started a Spark session")


def _result(out: str) -> dict:
    return json.loads(out.strip().splitlines()[0])


@pytest.mark.parametrize("index,table_type", [("bucket", "merge_on_read"), ("record", "copy_on_write")])
def test_auto_rehash_runs_on_arrow_and_matches_the_oracle(tmp_path, monkeypatch, capsys, index, table_type):
    monkeypatch.setattr("spark_jobs.cli._spark", _no_spark)
    per_partition = index == "bucket"
    ident = "region" if per_partition else None
    batches = _batches(seed=11, per_partition=per_partition)
    uri = str(tmp_path / "t")

    def check(n: int, buckets: int) -> None:
        assert rows_by_identity(read_arrow(uri).to_pylist(), partition=ident) == reduce_batches(batches[:n],
                                                                                               partition=ident)
        assert_layout(uri, buckets)

    _upsert(uri, tmp_path, batches, 0, index=index, num_buckets=2, table_type=table_type)
    _upsert(uri, tmp_path, batches, 1)
    check(2, 2)
    n, history = 2, []
    for m, after in STEPS:
        table = Table.load(uri)
        history.append((table.timeline.last_completed().timestamp,
                        reduce_batches(batches[:n], partition=ident), table.num_buckets()))
        capsys.readouterr()
        assert main(["rehash", uri, "--num-buckets", str(m)]) == 0
        res = _result(capsys.readouterr().out)
        assert not res["noop"] and res["num_buckets"] == m
        # auto says why it chose arrow, in the result and in the commit
        assert res["engine"]["name"] == "arrow" and "within the" in res["engine"]["reason"], res["engine"]
        table = Table.load(uri)
        assert table.timeline.read_metadata(table.timeline.find(res["instant"]))["engine"] == res["engine"]
        check(n, m)
        for _ in range(after):
            _upsert(uri, tmp_path, batches, n)
            n += 1
            check(n, m)
    assert n == len(batches)
    assert run_validate(uri)["ok"]
    for instant, state, buckets in history:  # time travel: the old layout and the old rows
        assert rows_by_identity(read_arrow(uri, instant).to_pylist(), partition=ident) == state
        assert Table.load(uri).view(instant).num_buckets == buckets
    before = tree_digest(tmp_path)
    assert main(["rehash", uri, "--num-buckets", "4"]) == 0  # an Airflow retry: nothing to do
    assert tree_digest(tmp_path) == before


def _refuse_spark(*_a, **_k):  # type: ignore[no-untyped-def]
    raise BadInputError("no Spark session in this test")


@pytest.mark.parametrize("index", ["bucket", "record"])
def test_auto_picks_spark_over_the_budget_and_arrow_over_a_set_budget_is_refused(tmp_path, monkeypatch, capsys,
                                                                                caplog, index):
    monkeypatch.setattr("spark_jobs.cli._spark", _refuse_spark)
    batches = _batches(seed=4, per_partition=index == "bucket")
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, batches, 0, index=index, num_buckets=2,
            table_type="merge_on_read" if index == "bucket" else "copy_on_write")
    before = tree_digest(tmp_path)
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="bucketindex.engine"):
        # auto sizes the rehash, finds it over 1 KiB and starts Spark (refused here) before writing anything
        assert main(["rehash", uri, "--num-buckets", "8", "--memory-budget", "1k"]) == 2
    assert "no Spark session in this test" in capsys.readouterr().err
    assert any("engine: spark (needs about" in r.getMessage() and "over the 1 KiB budget" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert tree_digest(tmp_path) == before
    assert main(["rehash", uri, "--num-buckets", "8", "--engine", "arrow", "--memory-budget", "1k"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "over the 1 KiB budget" in err, err
    assert tree_digest(tmp_path) == before
    # --engine arrow beside --master is a contradiction: exit 2, nothing written
    assert main(["rehash", uri, "--num-buckets", "8", "--engine", "arrow", "--master", "local[1]"]) == 2
    assert "asks for Spark" in capsys.readouterr().err
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("index,point", [
    ("bucket", "after_requested"),  # the instant reserved, nothing written
    ("bucket", "after_data_file"),  # some children written
    ("record", "after_index_file"),  # some new index bases written (a split)
    ("record", "before_complete"),  # everything written, conflict check not done
    ("bucket", "after_conflict_check"),  # everything written and checked, commit point not claimed
    ("record", "after_complete"),  # committed, markers not cleaned
])
def test_killed_arrow_rehash_leaves_old_or_new_layout_and_next_run_finishes(tmp_path, index, point):
    per_partition = index == "bucket"
    ident = "region" if per_partition else None
    batches = _batches(seed=21, per_partition=per_partition)
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, batches, 0, index=index, num_buckets=2,
            table_type="merge_on_read" if per_partition else "copy_on_write")
    _upsert(uri, tmp_path, batches, 1)
    expected = reduce_batches(batches[:2], partition=ident)

    p = subprocess.Popen([sys.executable, "-m", "spark_jobs.cli", "rehash", uri, "--num-buckets", "8",
                          "--engine", "arrow"], env={**os.environ, "BUCKETINDEX_FAULT": point},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _, err = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL, (p.returncode, err[-2000:])
    committed = point == "after_complete"
    # readers see one layout or the other, never a mix, and the same rows
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition=ident) == expected
    assert_layout(uri, 8 if committed else 2)
    pending = Table.load(uri).timeline.pending()
    assert [i.action for i in pending] == ([] if committed else ["rehash"])

    # the next run rolls the dead one back (its heartbeat is old) and finishes, or has nothing to do
    time.sleep(0.2)
    assert main(["rehash", uri, "--num-buckets", "8", "--engine", "arrow", "--heartbeat-timeout", "0.1"]) == 0
    table = Table.load(uri)
    assert not table.timeline.pending()
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition=ident) == expected
    assert_layout(uri, 8)
    assert run_validate(uri)["ok"]
    # nothing the dead attempt wrote is left on disk outside the snapshots (the upserts' ``read``
    # files, for their conflict checks only, are in no snapshot by design)
    assert not table.io.list_names(table.layout.markers)
    on_disk = {str(q.relative_to(uri)) for q in Path(uri).rglob("*.parquet")}
    on_disk |= {str(q.relative_to(uri)) for q in Path(uri).rglob("*.arrow") if not q.name.startswith("read_")}
    for dead in pending:
        assert not [q for q in Path(uri).rglob(f"*{dead.timestamp}*") if "timeline" not in str(q)], dead
    tl = table.timeline
    referenced = set()
    for seq in range(1, tl.last_seq + 1):
        referenced |= FileSystemView.at_seq(tl, seq).all_files()
    assert on_disk <= referenced, sorted(on_disk - referenced)[:5]
