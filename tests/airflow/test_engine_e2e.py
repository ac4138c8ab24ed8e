"""End to end: the example ingest DAG through ``dag.test()`` and a real SQLite metadata DB with
its default ``engine="auto"``: a 200-row batch runs inside the tasks -- upsert and validate on
the in-process Arrow engine, no spark-submit -- and publishes what the Spark path publishes
(XCom, the table's Asset event, with the engine that wrote the commit); the table equals the
oracle. Two runs: a new table, then updates, deletes and inserts into it. (The Spark path of
the same DAG: ``test_ingest_e2e.py``'s killed writer, ``test_mapped_e2e.py``, the cluster and
Connect tiers, all with ``engine="spark"``.)"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from airflow_provider_bucketindex.demo import sample_data

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]

INGEST = "bucketindex_ingest"
D1, D2 = (datetime(2024, 4, d, tzinfo=timezone.utc) for d in (1, 2))


def _asset_extras(table: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_provider_bucketindex.lineage import table_asset_uri

    with create_session() as session:
        asset = session.scalars(select(AssetModel).where(AssetModel.uri == table_asset_uri(table))).one()
        events = session.scalars(select(AssetEvent).where(AssetEvent.asset_id == asset.id)
                                 .order_by(AssetEvent.id)).all()
        return [dict(e.extra) for e in events]


def _commit_engines(table: str) -> list[dict]:
    from spark_jobs.table import Action, Table

    tl = Table.load(table).timeline.reload()
    return [tl.read_metadata(i)["engine"] for i in tl.completed([Action.COMMIT])]


def test_small_batches_run_in_the_task_and_publish_as_the_spark_path(tmp_path, airflow_db):  # type: ignore[no-untyped-def]
    from airflow_provider_bucketindex.demo import sandbox

    batches = sample_data.make_batches(2, 200, seed=23)
    landing, table = tmp_path / "landing", str(tmp_path / "table")
    for d, b in zip((D1, D2), batches):
        sample_data.write_batch(b, str(landing / d.date().isoformat()))
    conf = {"table_uri": table, "landing_uri": str(landing)}
    expected = []
    for n, d in enumerate((D1, D2), start=1):
        run = sandbox.run_dag(sandbox.load_dag(INGEST), d, conf)  # the DAG's default: engine auto

        assert run.state == "success", run
        assert run.task_state("rollback_failed_upsert") == "skipped"
        summary = run.xcom("upsert")
        assert summary["engine"] == "arrow", "a 200-row batch fits the budget: in the task, no spark-submit"
        assert run.xcom("validate") == {"table_uri": table, "valid": True, "instant": summary["instant"],
                                        "engine": "arrow"}
        counts = {k: summary[k] for k in ("inserted", "updated", "deleted")}
        assert run.xcom("upsert", "instant") == summary["instant"] and run.xcom("upsert", "counts") == counts
        assert summary["batch_id"] == run.batch_id("upsert", source=f"{landing}/{d.date().isoformat()}")
        expected.append({"instant": summary["instant"], "batch_id": summary["batch_id"], **counts,
                         "engine": "arrow"})
        assert _asset_extras(table) == expected
        assert sample_data.compare(table, batches[:n]) == []
        old = sample_data.rows_by_key(sample_data.expected_rows(batches[:n - 1]))
        new = sample_data.rows_by_key(sample_data.expected_rows(batches[:n]))
        assert counts == {"inserted": len(set(new) - set(old)), "deleted": len(set(old) - set(new)),
                          "updated": len([k for k in set(new) & set(old) if new[k] != old[k]])}
    engines = _commit_engines(table)
    assert [e["name"] for e in engines] == ["arrow", "arrow"]
    assert all(e["reason"].startswith("engine='auto': needs about") for e in engines), engines
