"""Automatic compaction on the Spark engine (issue 38 item 1): a merge-on-read upsert run by
Spark compacts the due file groups it touched after its commit, in its own session, through the
same scheduled plan as the Arrow engine's, record-index buckets included (``spark_jobs.table.action.compact.auto_compact``), so
a table keeps compacting whichever engine ``auto`` picks for its batches.

The same batches through both engines give the same snapshot layout (file groups and their log
counts), the same rows as the oracle, and a clean ``validate``; the Spark table's compactions
record the Spark engine's choice. tests/unit/test_arrow_auto_compact.py holds the protocol
(crashes, racing writers, bounds) on the Arrow engine.
"""

from __future__ import annotations

import random

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.jobs.compact import AUTO_CHOICE as SPARK_AUTO
from spark_jobs.jobs.upsert import run_upsert as spark_upsert
from spark_jobs.jobs.validate import run_validate
from spark_jobs.table import Table
from spark_jobs.table.action.compact import DEFAULT_MIN_DELTAS, DEFAULT_MIN_LOGS
from spark_jobs.table.reader import read_arrow
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_arrow_auto_compact import (
    _batch,
    _compactions,
    _deltas_per_bucket,
    _index_batch,
    _max_logs,
    _opts,
    _seed_rows,
    _write,
)

pytestmark = pytest.mark.spark


def _layout(uri: str) -> list[tuple[str, str, int]]:
    return sorted((s.partition, s.file_id, len(s.logs)) for s in Table.load(uri).view().slices())


def _both_engines(spark, tmp_path, batches: list[list[dict]], *, after_batch,
                  counted) -> tuple[dict[str, int], str]:
    """The batches through both engines, each into its own table (the first batch creates it
    with automatic compaction on): per batch, each upsert names its engine and reports no
    automatic-compaction error, ``after_batch(engine, uri, b)`` checks the table, nothing is left
    pending, and the two layouts are equal; then both tables equal the oracle and the Spark one
    passes ``validate``. Returns ``counted(auto_compaction report)`` summed per engine, and the
    Spark table's URI."""
    uris = {"spark": str(tmp_path / "spark"), "arrow": str(tmp_path / "arrow")}
    runs = {"spark": lambda o: spark_upsert(spark, o), "arrow": arrow_upsert}
    total = {"spark": 0, "arrow": 0}
    for b, rows in enumerate(batches):
        src = _write(tmp_path / f"b{b}.parquet", rows)
        for engine, uri in uris.items():
            extra = {"auto_compact": "on"} if b == 0 else {}
            out = runs[engine](_opts(uri, src, f"b{b}", **extra))
            assert out["engine"] == engine
            if b:
                assert "error" not in out["auto_compaction"], out["auto_compaction"]
                total[engine] += counted(out["auto_compaction"])
            after_batch(engine, uri, b)
            assert Table.load(uri).timeline.pending() == []
        assert _layout(uris["spark"]) == _layout(uris["arrow"]), f"batch {b}: the engines' layouts differ"
    expected = reduce_batches(batches)
    for engine, uri in uris.items():
        assert rows_by_identity(read_arrow(uri).to_pylist()) == expected, engine
    report = run_validate(spark, uris["spark"])
    assert report["ok"], report["problems"]
    return total, uris["spark"]


def test_spark_upserts_compact_automatically_as_arrow_upserts_do(spark, tmp_path):
    seed = _seed_rows()
    rnd = random.Random(3811)
    # a few hot keys: their groups fall due within the run
    batches = [seed] + [_batch(rnd, b, keys=range(0, 12), size=8) for b in range(1, 5)]

    def after_batch(engine: str, uri: str, b: int) -> None:
        assert _max_logs(uri) < DEFAULT_MIN_LOGS, f"{engine}, batch {b}: a touched group kept its logs"

    automatic, uri = _both_engines(spark, tmp_path, batches, after_batch=after_batch,
                              counted=lambda report: report["instant"] is not None)
    assert automatic["spark"] >= 1 and automatic["spark"] == automatic["arrow"], automatic
    done = _compactions(uri)
    assert len(done) == automatic["spark"]
    assert all(m["engine"] == SPARK_AUTO.as_metadata() for m in done), [m["engine"] for m in done]


def test_spark_upserts_fold_due_index_buckets_as_arrow_upserts_do(spark, tmp_path):
    """Batches of new keys write a delta to every index bucket: after the 10th the buckets fall
    due (``--min-deltas`` 10), and each engine's upsert folds them in its automatic compaction
    (the Spark one in its session's tasks), leaving the same deltas per bucket after every
    batch, the same rows, and a clean ``validate``."""
    seed = _seed_rows()
    rnd = random.Random(3812)
    batches = [seed] + [_index_batch(rnd, b, fresh=16, size=4) for b in range(1, DEFAULT_MIN_DELTAS + 3)]
    deltas: dict[str, dict[int, int]] = {}

    def after_batch(engine: str, uri: str, b: int) -> None:
        deltas[engine] = _deltas_per_bucket(uri)
        assert max(deltas[engine].values()) < DEFAULT_MIN_DELTAS, f"{engine}, batch {b}"
        if engine == "arrow":  # the Spark table's upsert of this batch ran first
            assert deltas["spark"] == deltas["arrow"], f"batch {b}"

    folded, uri = _both_engines(spark, tmp_path, batches, after_batch=after_batch,
                           counted=lambda report: report["index_buckets"])
    assert folded["spark"] >= 4 and folded["spark"] == folded["arrow"], folded
    done = [m for m in _compactions(uri) if m["counts"]["index_buckets"]]
    assert done and all(m["engine"] == SPARK_AUTO.as_metadata() for m in done)
