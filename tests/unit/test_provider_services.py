"""CleanTableOperator (conventions, how it calls the core's ``run_clean``, failure mapping, bad
input from the real core) and RollbackBatchOperator's ``instant`` (cancelling a scheduled
compaction plan, the failure branch of the nightly DAG). No Spark."""

from __future__ import annotations

import pytest

from airflow_provider_bucketindex.demo import sandbox
from spark_jobs.table import Table, TableConfig
from tests.unit.test_table_format import write_commit

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex import operators

    return operators


def _table(tmp_path, deltas: int) -> Table:  # type: ignore[no-untyped-def]
    t = Table.open(str(tmp_path / "lake" / "ventes été"))
    t.create(TableConfig(record_key_fields=["id"], num_buckets=2))
    for i in range(deltas):
        write_commit(t, [(f"clé {i}/%+", i)], file_id=f"fg{i}")
    return t


# -- CleanTableOperator ------------------------------------------------------------------


def test_clean_conventions(ops, tmp_path):  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError):
        ops.CleanTableOperator("c", "/t")  # type: ignore[misc]
    kw = dict(table_uri="{{ params.t }}", retain_commits="{{ params.n }}", retain_hours=None,
              heartbeat_timeout_s="{{ params.hb }}", storage_conn_id="{{ params.store }}",
              storage_options={"region": "{{ params.region }}"})
    op = ops.CleanTableOperator(task_id="c", dry_run=True, **kw)
    assert set(op.template_fields) == set(kw)
    assert all(getattr(op, f) == kw[f] for f in op.template_fields)
    # nothing done in __init__: no table looked at, no hook, no core imported for it
    missing = tmp_path / "nowhere"
    op = ops.CleanTableOperator(task_id="c", table_uri=str(missing), retain_commits=1, retain_hours=2)
    assert not missing.exists() and "hook" not in vars(op)


def test_clean_calls_run_clean_with_the_rendered_arguments(ops, monkeypatch):  # type: ignore[no-untyped-def]
    from spark_jobs.table.action import clean

    calls = []

    def fake_run_clean(uri, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((uri, kwargs))
        return {"instant": "20240101000000000", "noop": False, "files": 3, "bytes": 1234,
                "earliest_retained": "20231231000000000"}

    monkeypatch.setattr(clean, "run_clean", fake_run_clean)
    op = ops.CleanTableOperator(task_id="c", table_uri="{{ params.t }}", retain_commits="{{ params.n }}",
                                heartbeat_timeout_s="{{ params.hb }}")
    op.render_template_fields({"params": {"t": "/lake/t", "n": "5", "hb": "30"}})
    out = op.execute({})
    assert calls == [("/lake/t", {"retain_commits": 5, "retain_hours": None, "dry_run": False,
                                  "heartbeat_timeout_s": 30.0})]
    assert out == {"table_uri": "/lake/t", "instant": "20240101000000000", "noop": False, "files": 3,
                   "bytes": 1234, "earliest_retained": "20231231000000000", "dry_run": False}

    calls.clear()
    ops.CleanTableOperator(task_id="c", table_uri="/t", retain_hours=1.5, dry_run=True).execute({})
    ops.CleanTableOperator(task_id="c", table_uri="/t", retain_commits="", retain_hours="None").execute({})
    assert calls == [("/t", {"retain_commits": None, "retain_hours": 1.5, "dry_run": True, "heartbeat_timeout_s": None}),
                     ("/t", {"retain_commits": None, "retain_hours": None, "dry_run": False,
                             "heartbeat_timeout_s": None})]


def test_clean_maps_bad_input_to_final_and_busy_to_retryable_failures(ops, monkeypatch):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from spark_jobs.exceptions import BadInputError, RetryableError, WriterAliveError
    from spark_jobs.table.action import clean

    def raising(exc):  # type: ignore[no-untyped-def]
        def run_clean(uri, **kwargs):  # type: ignore[no-untyped-def]
            raise exc
        return run_clean

    op = ops.CleanTableOperator(task_id="c", table_uri="/t")
    monkeypatch.setattr(clean, "run_clean", raising(BadInputError("give --retain-commits or\n--retain-hours, not both")))
    with pytest.raises(AirflowFailException, match=r"^clean /t: give --retain-commits or --retain-hours, not both$"):
        op.execute({})
    for busy in (RetryableError("busy: another clean is running"), WriterAliveError("busy: a live writer")):
        monkeypatch.setattr(clean, "run_clean", raising(busy))
        with pytest.raises(AirflowException, match="clean /t: busy") as info:
            op.execute({})
        assert not isinstance(info.value, AirflowFailException)
    monkeypatch.setattr(clean, "run_clean", raising(OSError("storage down")))
    with pytest.raises(OSError):  # anything else: an ordinary (retried) failure, unchanged
        op.execute({})
    with pytest.raises(AirflowFailException, match="retain_commits must be a number, got 'three'"):
        ops.CleanTableOperator(task_id="c", table_uri="/t", retain_commits="three").execute({})


def test_clean_bad_input_from_the_core_fails_without_retry(ops, tmp_path):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    missing = tmp_path / "none"
    with pytest.raises(AirflowFailException) as info:
        ops.CleanTableOperator(task_id="c", table_uri=str(missing)).execute({})
    assert "\n" not in str(info.value) and str(missing) in str(info.value)
    assert not missing.exists()
    t = _table(tmp_path, 2)
    with pytest.raises(AirflowFailException):
        ops.CleanTableOperator(task_id="c", table_uri=t.uri, retain_commits=1, retain_hours=1).execute({})


def test_clean_dry_run_reports_and_a_clean_deletes_the_replaced_versions(ops, tmp_path):  # type: ignore[no-untyped-def]
    import os

    t = Table.open(str(tmp_path / "lake" / "ventes été"))
    t.create(TableConfig(record_key_fields=["id"], num_buckets=2))
    for i in range(3):  # one file group rewritten by every commit, as copy-on-write upserts do
        write_commit(t, [(f"clé {i}/%+", i)], file_id="fg")
    root = tmp_path / "lake" / "ventes été"

    def files() -> list[str]:
        return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
                      if not d.startswith(str(root / ".bucketindex")))

    before = files()
    latest = t.view().slices()[0].path
    old_versions = [f for f in before if f.endswith(".parquet") and f != latest]
    assert len(old_versions) == 2
    dry = ops.CleanTableOperator(task_id="c", table_uri=t.uri, retain_commits=1, dry_run=True).execute({})
    assert (dry["dry_run"], dry["noop"], dry["instant"], dry["files"]) == (True, False, None, 2), dry
    assert files() == before  # a dry run deletes nothing

    out = ops.CleanTableOperator(task_id="c", table_uri=t.uri, retain_commits=1).execute({})
    assert out["noop"] is False and out["files"] == 2 and out["bytes"] > 0 and out["instant"]
    assert t.timeline.reload().is_completed(out["instant"])
    assert sorted(set(before) - set(files())) == old_versions and latest in files()
    again = ops.CleanTableOperator(task_id="c", table_uri=t.uri, retain_commits=1).execute({})
    assert (again["noop"], again["instant"], again["files"]) == (True, None, 0)


# -- RollbackBatchOperator(instant=...) --------------------------------------------------


def _scheduled(ops, tmp_path) -> tuple[Table, str]:  # type: ignore[no-untyped-def]
    t = _table(tmp_path, 3)
    out = ops.AsyncIndexCompactionOperator(task_id="s", table_uri=t.uri, mode="schedule", min_deltas=2).execute({})
    return t, str(out["instant"])


def test_rollback_instant_is_templated_and_keeps_batch_behaviour(ops):  # type: ignore[no-untyped-def]
    r = ops.RollbackBatchOperator(task_id="r", table_uri="{{ params.t }}", instant="{{ ti.xcom_pull('s') }}")
    assert set(r.template_fields) == {"table_uri", "batch_id", "upsert_task_id", "instant", "storage_conn_id",
                                      "storage_options"}
    assert r.instant == "{{ ti.xcom_pull('s') }}" and r.trigger_rule == "one_failed"


def test_rollback_instant_cancels_a_scheduled_compaction(ops, tmp_path):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    from spark_jobs.table.action.service import execute

    t, planned = _scheduled(ops, tmp_path)
    op = ops.RollbackBatchOperator(task_id="cancel", table_uri=t.uri, instant=planned)
    assert op.execute({}) == {"instant": planned, "rolled_back": planned}
    tl = t.timeline.reload()
    assert tl.pending() == [] and planned in tl.aborted
    with pytest.raises(Exception, match="cancelled"):  # the plan is never executed
        execute(t, planned, "compaction", lambda txn: pytest.fail("ran a cancelled plan"))
    # again: already rolled back, a no-op
    assert op.execute({}) == {"instant": planned, "rolled_back": None}
    # the buckets are due again: the next schedule plans them
    again = ops.AsyncIndexCompactionOperator(task_id="s", table_uri=t.uri, mode="schedule", min_deltas=2).execute({})
    assert again["instant"] != planned and again["index_buckets"] == 1
    with pytest.raises(AirflowFailException, match="no pending instant 20000101000000000"):
        ops.RollbackBatchOperator(task_id="c", table_uri=t.uri, instant="20000101000000000").execute({})
    with pytest.raises(AirflowFailException, match="not both"):
        ops.RollbackBatchOperator(task_id="c", table_uri=t.uri, instant=planned, batch_id="b").execute({})


def test_rollback_instant_of_a_completed_or_unscheduled_plan_is_a_noop(ops, tmp_path):  # type: ignore[no-untyped-def]
    t = _table(tmp_path, 1)
    committed = t.timeline.reload().completed()[-1].timestamp
    assert ops.RollbackBatchOperator(task_id="c", table_uri=t.uri, instant=committed).execute({}) == {
        "instant": committed, "rolled_back": None}
    # the template rendered empty (the schedule task pushed nothing): nothing to roll back
    for rendered in (None, "", "None"):
        op = ops.RollbackBatchOperator(task_id="c", table_uri=t.uri, instant="{{ x }}")
        op.instant = rendered
        assert op.execute({}) == {"instant": None, "rolled_back": None}
    assert t.timeline.reload().completed()[-1].timestamp == committed
