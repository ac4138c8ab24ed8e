"""End to end: the example ingest DAG through ``dag.test()``, a real SQLite metadata DB, checked
against the oracle. Its ``engine="auto"`` runs these small batches inside the tasks; the killed
writer (2) is a real ``spark-submit`` on local Spark (``engine="spark"``).

The tests share one table and run in file order, each building on the snapshot the one
before left (spark-submit costs 10-20 s; one of them in all):

1. a scheduled run upserts batch 1 and validates -> SUCCESS, table == oracle(batch 1);
2. a run whose writer is killed just before its commit (``BUCKETINDEX_FAULT``) -> the
   rollback branch removes the pending instant, the run FAILS, the table is snapshot 1;
3. a run with a corrupt source -> bad input (exit 2 on the Spark path): no retry, rollback
   is a no-op, FAILED;
4. a task that fails after its commit and is retried with the same batch id -> one commit.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pytest

from airflow_provider_bucketindex.demo import sample_data

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(600)]

INGEST = "bucketindex_ingest"
D1, D2, D3 = (datetime(2024, 3, d, tzinfo=timezone.utc) for d in (1, 2, 3))


@pytest.fixture(scope="module")
def lake(tmp_path_factory, airflow_db):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("lake")
    batches = sample_data.make_batches(2, 200, seed=11)
    landing = root / "landing"
    sample_data.write_batch(batches[0], str(landing / "2024-03-01"))
    sample_data.write_batch(batches[1], str(landing / "2024-03-02"))  # used by the crash run and the retry DAG
    corrupt = landing / "2024-03-03"
    corrupt.mkdir(parents=True)
    (corrupt / "part-00000.parquet").write_bytes(b"this is not parquet\n" * 10)
    return {
        "table": str(root / "table"),
        "landing": str(landing),
        "batches": batches,
        "conf": {"table_uri": str(root / "table"), "landing_uri": str(landing)},
        "state": {},
    }


def _ingest(**task_overrides):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox

    dag = sandbox.load_dag(INGEST)  # a fresh parse: overrides never leak between tests
    for attr, value in task_overrides.items():
        setattr(dag.get_task("upsert"), attr, value)
    return dag


def _commits(table_uri: str) -> list[tuple[str, str]]:
    from spark_jobs.table import Action, Table

    t = Table.load(table_uri)
    tl = t.timeline.reload()
    return [(i.timestamp, tl.read_metadata(i).get("batch_id")) for i in tl.completed([Action.COMMIT])]


def test_scheduled_run_upserts_validates_and_matches_oracle(lake):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.batch import source_suffix
    from airflow_provider_bucketindex.demo import sandbox

    run = sandbox.run_dag(_ingest(), D1, lake["conf"])

    assert run.state == "success", run
    assert run.task_state("upsert") == "success"
    assert run.task_state("validate") == "success"
    assert run.task_state("rollback_failed_upsert") == "skipped"
    assert sample_data.compare(lake["table"], lake["batches"][:1]) == []

    commits = _commits(lake["table"])
    assert len(commits) == 1
    instant, batch_id = commits[0]
    source = os.path.join(lake["landing"], "2024-03-01")  # the rendered {{ params.landing_uri }}/{{ ds }}
    assert batch_id == run.batch_id("upsert", source=source) == \
        f"{INGEST}/upsert/2024-03-01T00:00:00+00:00" + source_suffix(source)
    assert run.xcom("upsert", "instant") == instant
    expected_keys = len(sample_data.expected_rows(lake["batches"][:1]))
    assert run.xcom("upsert", "counts") == {"inserted": expected_keys, "updated": 0, "deleted": 0}
    summary = run.xcom("upsert")
    assert summary["instant"] == instant and summary["batch_id"] == batch_id and summary["inserted"] == expected_keys
    lake["state"]["snapshot1"] = sample_data.table_rows(lake["table"])
    lake["state"]["commits1"] = commits


def test_writer_killed_before_commit_is_rolled_back_and_run_fails(lake):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox
    from spark_jobs.table import Action, Table

    if "snapshot1" not in lake["state"]:
        pytest.skip("needs the first run's snapshot")
    # engine spark: the fault kills spark-submit's session (in the task it would kill the task runner)
    dag = _ingest(env_vars={"BUCKETINDEX_FAULT": "before_complete"}, retries=0, engine="spark")

    run = sandbox.run_dag(dag, D2, lake["conf"])

    assert run.state == "failed", run
    assert run.task_state("upsert") == "failed"
    assert run.task_state("rollback_failed_upsert") == "success"
    assert run.task_state("validate") == "upstream_failed"
    rolled = run.xcom("rollback_failed_upsert")
    assert rolled["batch_id"] == run.batch_id("upsert", source=os.path.join(lake["landing"], "2024-03-02"))
    assert rolled["rolled_back"], "the killed writer left a pending instant; the rollback task must remove it"

    t = Table.load(lake["table"])
    tl = t.timeline.reload()
    assert tl.pending() == []
    assert _commits(lake["table"]) == lake["state"]["commits1"]
    rollbacks = [tl.read_metadata(i) for i in tl.completed([Action.ROLLBACK])]
    assert [r["rolled_back"] for r in rollbacks] == [rolled["rolled_back"]]
    assert rollbacks[0]["deleted_files"], "the crashed writer had written files"
    on_disk = {os.path.relpath(os.path.join(d, f), lake["table"]) for d, _, fs in os.walk(lake["table"]) for f in fs}
    assert not [f for f in on_disk if rolled["rolled_back"] in f and not f.startswith(".bucketindex/timeline")]
    assert sample_data.table_rows(lake["table"]) == lake["state"]["snapshot1"]


def test_corrupt_source_fails_without_retry_and_leaves_table(lake):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox

    if "snapshot1" not in lake["state"]:
        pytest.skip("needs the first run's snapshot")
    dag = _ingest()
    assert dag.get_task("upsert").retries == 2  # the DAG retries upserts, but not bad input

    run = sandbox.run_dag(dag, D3, lake["conf"])

    assert run.state == "failed", run
    assert run.task_state("upsert") == "failed"
    assert run.tasks["upsert"]["try_number"] == 1, "exit status 2 (bad input) must not be retried"
    assert run.task_state("rollback_failed_upsert") == "success"
    assert run.xcom("rollback_failed_upsert")["rolled_back"] is None  # nothing was written
    assert run.task_state("validate") == "upstream_failed"
    assert _commits(lake["table"]) == lake["state"]["commits1"]
    assert sample_data.table_rows(lake["table"]) == lake["state"]["snapshot1"]


def test_retry_with_same_batch_id_leaves_one_commit(lake):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox

    if "snapshot1" not in lake["state"]:
        pytest.skip("needs the first run's snapshot")
    dag = sandbox.load_dag("bucketindex_test_retry")
    conf = {"table_uri": lake["table"], "source_uri": os.path.join(lake["landing"], "2024-03-02")}

    run = sandbox.run_dag(dag, D2, conf)

    assert run.state == "success", run
    assert run.task_state("consume") == "success"  # downstream tasks get the instant as a string
    assert run.tasks["upsert"]["try_number"] == 2, "the first try fails after its commit and is retried"
    batch_id = run.batch_id("upsert", source=conf["source_uri"])
    commits = _commits(lake["table"])
    assert [b for _, b in commits].count(batch_id) == 1
    assert len(commits) == len(lake["state"]["commits1"]) + 1
    assert run.xcom("upsert", "instant") == commits[-1][0]
    exp = sample_data.expected_rows(lake["batches"][:2])
    old = sample_data.rows_by_key(sample_data.expected_rows(lake["batches"][:1]))
    new = sample_data.rows_by_key(exp)
    assert run.xcom("upsert", "counts") == {
        "inserted": len(set(new) - set(old)),
        "updated": len([k for k in set(new) & set(old) if new[k] != old[k]]),
        "deleted": len(set(old) - set(new)),
    }
    assert sample_data.compare(lake["table"], lake["batches"][:2]) == []
