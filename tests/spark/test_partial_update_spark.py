"""Partial updates on Spark: the partial history of tests/unit/test_partial_update.py applied to
two merge-on-read tables -- its partial batches through the Spark engine to one (its full
batches through Arrow, to save JVM time: they are not what is tested) and every batch through
the Arrow engine to the other -- gives equal snapshots at every instant, equal to the oracle;
and Spark's reader (``read_table``: bases and full logs by position, slices with a partial log
merged whole in Arrow) returns what ``read_arrow`` returns. The history includes partial rows
moving partitions, whose stored values the Spark engine fetches from the old group."""

from __future__ import annotations

import dataclasses

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.jobs.read import read_table
from spark_jobs.jobs.upsert import run_upsert as spark_upsert
from spark_jobs.table.reader import read_arrow
from tests.unit.test_partial_update import HISTORY, opts, oracle, partial_logs, snapshot, write

pytestmark = pytest.mark.spark


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["id"], r["region"]))


def test_partial_history_on_spark_equals_arrow_and_spark_reads_partial_logs(spark, tmp_path):
    on_spark, on_arrow = str(tmp_path / "spark"), str(tmp_path / "arrow")
    for n, (partial, rows) in enumerate(HISTORY, start=1):
        src = write(tmp_path / f"b{n}.parquet", rows)
        o = opts(on_spark, src, index="record", table_type="merge_on_read", partial=partial, batch=n)
        if partial:
            spark_upsert(spark, dataclasses.replace(o, engine="spark"))
        else:
            arrow_upsert(o)
        arrow_upsert(opts(on_arrow, src, index="record", table_type="merge_on_read", partial=partial, batch=n))
        expected = oracle(HISTORY[:n], bucket=False)
        assert snapshot(on_spark, bucket=False) == expected, n
        assert snapshot(on_arrow, bucket=False) == expected, n
    assert partial_logs(on_spark) > 0
    assert run_validate(on_spark)["ok"]
    want = _sorted(read_arrow(on_spark).to_pylist())
    df = read_table(spark, on_spark)
    plan = (df._jdf.queryExecution().optimizedPlan().toString() if hasattr(df, "_jdf")
            else df._explain_string(extended=True))  # Spark Connect
    assert "LeftAnti" in plan  # the positional path, with the partial slices merged whole beside it
    assert _sorted(df.toArrow().to_pylist()) == want
