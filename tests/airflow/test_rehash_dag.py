"""End to end: the example rehash DAG through ``dag.test()`` with a params conf, a real
SQLite metadata DB and real ``spark-submit`` on local Spark.

1. A bucket-index table of 2 buckets (two real upserts): the run waits for no pending
   writes, rehashes to 8 (in the task: ``engine`` auto picks the in-process engine, the
   commit records it) and validates; every row is in bucket ``hash(key) mod 8`` and the
   table equals the batches reduced by key.
2. A count that is neither a multiple nor a divisor: the rehash task fails on its first try
   (no retry, although the DAG retries once) with nothing written -- the check runs in the
   task before any Spark job -- validate is upstream_failed and the run fails.
3. The DAG's params are ``Param`` objects the Trigger form validates: a count below 1 is
   refused before a run exists.
"""

from __future__ import annotations

import pytest

from airflow_provider_bucketindex.demo import sample_data
from tests.airflow.test_nightly_e2e import _cli_upserts
from tests.oracle import reduce_batches
from tests.spark.conftest import tree_digest

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(900)]

REHASH = "bucketindex_rehash"


@pytest.fixture(scope="module")
def lake(tmp_path_factory, airflow_db):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("rehash")
    batches = sample_data.make_batches(2, 80, seed=31)
    sources = [sample_data.write_batch(b, str(root / "landing" / f"b{i}")) for i, b in enumerate(batches)]
    table = str(root / "tables" / "ventes été")
    _cli_upserts(table, [(src, f"setup-{i}") for i, src in enumerate(sources)],
                 ("--partition-field", "region", "--index", "bucket", "--num-buckets", "2"))
    return {"root": root, "table": table, "batches": batches}


def _rows(table: str) -> dict:
    from spark_jobs.table.reader import read_arrow

    cols = ["id", "name", "amount", "region", "ts"]
    return {(r["region"], r["id"]): {c: r[c] for c in cols} for r in read_arrow(table).to_pylist()}


def test_triggered_rehash_waits_rehashes_and_validates(lake):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox
    from spark_jobs.index.hashing import buckets_of
    from spark_jobs.table import Table
    from spark_jobs.table.reader import read_slice

    table = lake["table"]
    dag = sandbox.load_dag(REHASH)
    assert dag.schedule is None or str(dag.timetable.summary) in ("None", "")
    run = sandbox.run_dag(dag, None, {"table_uri": table, "num_buckets": 8})

    assert run.state == "success", run
    for task in ("wait_for_no_pending_writes", "rehash", "validate"):
        assert run.task_state(task) == "success", (task, run)
    out = run.xcom("rehash")
    assert (out["num_buckets"], out["previous_num_buckets"], out["noop"]) == (8, 2, False)
    assert out["engine"] == "arrow", out  # auto: in the task, no spark-submit
    t = Table.load(table)
    done = t.timeline.find(str(out["instant"]))
    assert done is not None and done.is_completed and done.action == "rehash"
    engine = t.timeline.read_metadata(done)["engine"]
    assert engine["name"] == "arrow" and "in the Airflow task" in engine["reason"], engine
    assert t.num_buckets() == 8
    for s in t.view().slices():
        keys = read_slice(t, s.path, [lf.path for lf in s.logs], columns=["_bi_key"]).column(0).to_pylist()
        assert set(buckets_of(keys, 8).tolist()) == {int(s.file_id)}
    assert run.xcom("validate")["valid"] is True
    # the bucket index keys a record by (partition, key): a row that changed region is a new record
    state = reduce_batches([b.to_pylist() for b in lake["batches"]], partition="region")
    cols = ["id", "name", "amount", "region", "ts"]
    assert _rows(table) == {k: {c: r[c] for c in cols} for k, r in state.items()}


def test_a_bad_count_fails_the_task_before_any_spark_job(lake):  # type: ignore[no-untyped-def]
    from datetime import datetime, timezone

    from airflow_provider_bucketindex.demo import sandbox

    table = lake["table"]
    before = tree_digest(lake["root"] / "tables")
    dag = sandbox.load_dag(REHASH)
    assert dag.get_task("rehash").retries == 1  # a refusal must not be retried all the same
    run = sandbox.run_dag(dag, datetime(2024, 5, 1, tzinfo=timezone.utc), {"table_uri": table, "num_buckets": 12})

    assert run.state == "failed", run
    assert run.task_state("wait_for_no_pending_writes") == "success"
    assert run.task_state("rehash") == "failed" and run.tasks["rehash"]["try_number"] == 1, run
    assert run.task_state("validate") == "upstream_failed"
    assert tree_digest(lake["root"] / "tables") == before  # no Spark job wrote anything, not even a plan


def test_params_are_validated_by_the_trigger_form(airflow_db):  # type: ignore[no-untyped-def]
    import copy

    from airflow.sdk import Param
    from airflow.sdk.exceptions import ParamValidationError

    from airflow_provider_bucketindex.demo import sandbox

    param = sandbox.load_dag(REHASH).params.get_param("num_buckets")
    assert isinstance(param, Param)
    assert (param.schema["type"], param.schema["minimum"], param.schema["maximum"]) == ("integer", 1, 65536)
    for bad in (0, -4, "sixteen", 70000):
        with pytest.raises(ParamValidationError):
            copy.deepcopy(param).resolve(value=bad)
    assert copy.deepcopy(param).resolve(value=64) == 64
