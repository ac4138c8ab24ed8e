"""End to end: the example shadow-compare DAG (its test variant, built by the example's own
factory, hands its alert off to a notifier that appends to a file) through ``dag.test()``,
a real SQLite metadata DB and real ``spark-submit`` on local Spark.

1. A healthy record-index table (two real upserts): the run compares every key (first run:
   no ``--since``), succeeds, its XCom summary holds the instant and the report location, the
   report is written beside the table (not inside it) -- and no alert is sent.
2. A fault planted after that run (a tombstone for a live key, committed): the next run
   compares only the commits since the first run's instant, finds the key missing, fails
   on its first try (no retry) and the run fails; the notifier's hand-off wrote one alert
   carrying the counts and the report location.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_provider_bucketindex.demo import sample_data
from tests.airflow.test_nightly_e2e import _cli_upserts

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(600)]

DAG_ID = "bucketindex_test_shadow_compare"


@pytest.fixture(scope="module")
def lake(tmp_path_factory, airflow_db):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("shadow")
    batches = sample_data.make_batches(2, 60, seed=41)
    sources = [sample_data.write_batch(b, str(root / "landing" / f"b{i}")) for i, b in enumerate(batches)]
    table = str(root / "tables" / "ventes été")
    _cli_upserts(table, [(src, f"setup-{i}") for i, src in enumerate(sources)])
    alerts = root / "alerts.jsonl"
    old = os.environ.get("BUCKETINDEX_TEST_ALERTS")
    os.environ["BUCKETINDEX_TEST_ALERTS"] = str(alerts)
    yield {"root": root, "table": table, "alerts": alerts}
    if old is None:
        os.environ.pop("BUCKETINDEX_TEST_ALERTS", None)
    else:
        os.environ["BUCKETINDEX_TEST_ALERTS"] = old


def _alerts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _live_keys(table: str) -> list[str]:
    from spark_jobs.table.reader import read_arrow

    return sorted(read_arrow(table).column("id").to_pylist())


def test_healthy_table_succeeds_and_sends_nothing(lake):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox
    from spark_jobs.table import Table

    table = lake["table"]
    dag = sandbox.load_dag(DAG_ID)
    assert dag.get_task("shadow_compare").retries == 0
    run = sandbox.run_dag(dag, datetime(2025, 3, 1, 10, tzinfo=timezone.utc), {"table_uri": table})

    assert run.state == "success", run
    out = run.xcom("shadow_compare")
    assert out["ok"] is True and out["mismatches"] == 0 and out["since"] is None, out
    assert out["keys_checked"] == len(_live_keys(table)) and out["instant"] == Table.load(table).timeline.max_instant()
    report = Path(out["report_uri"])
    assert report.exists() and not report.resolve().is_relative_to(Path(table).resolve())
    assert json.loads(report.read_text())["ok"] is True
    assert _alerts(lake["alerts"]) == []


def test_a_planted_fault_since_the_last_run_fails_the_run_and_alerts(lake):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox
    from spark_jobs.table import Table
    from tests.spark.test_validate import add_index_delta, bucket_of_key

    table = lake["table"]
    dag = sandbox.load_dag(DAG_ID)
    previous = Table.load(table).timeline.max_instant()
    t = Table.load(table)
    key = _live_keys(table)[3]
    add_index_delta(t, bucket_of_key(t, key), [key], [None])  # a tombstone for a live key, committed

    run = sandbox.run_dag(dag, datetime(2025, 3, 1, 11, tzinfo=timezone.utc), {"table_uri": table})

    assert run.state == "failed", run
    assert run.task_state("shadow_compare") == "failed" and run.tasks["shadow_compare"]["try_number"] == 1, run
    assert run.xcom("shadow_compare") is None
    summary = run.xcom("shadow_compare", "shadow_compare_summary")
    assert summary["since"] == previous and summary["ok"] is False, summary
    assert (summary["missing"], summary["mismatches"]) == (1, 1) and summary["samples"]["missing"] == [key]
    report = json.loads(Path(summary["report_uri"]).read_text())
    assert report["missing"] == 1 and report["since"] == previous

    alerts = _alerts(lake["alerts"])
    assert len(alerts) == 1, alerts
    assert alerts[0]["counts"] == f"1/0/0/0 of {summary['keys_checked']} at {summary['report_uri']}"
    text = alerts[0]["text"]
    assert "found 1 mismatch (allowed: 0)" in text and "missing 1, wrong_location 0, extra 0, duplicated 0" in text
    assert summary["report_uri"] in text and key in text
