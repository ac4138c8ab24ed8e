"""The ``bucketindex`` Asset URI scheme (issue 40, item 3): one Asset per table whatever its
spelling, registered with Airflow's ProvidersManager so that Airflow itself normalises every
``bucketindex:`` URI (an ``Asset(...)`` a user writes in a DAG file included)."""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

import pytest

from airflow_provider_bucketindex import assets, get_provider_info
from airflow_provider_bucketindex.demo import sandbox

pytestmark = pytest.mark.unit

sandbox.isolate_before_import()  # a private Airflow home before anything imports airflow


@pytest.mark.parametrize("spellings, expected", [
    (["s3a://b/t", "s3://b/t/", "s3n://b/t//", "S3://b/t", "s3://b/t?region=eu-west-1&endpoint_url=http://x:9",
      "s3://conn_id@b/t", "s3://key:secret@b/t/", "s3://b/t#frag", "bucketindex:s3a://b/t/",
      "BUCKETINDEX:s3://b/t?secret_access_key=abc"],
     "bucketindex:s3://b/t"),
    (["/data/events", "/data/./x/../events/", "//data/events", "file:///data/events", "file:/data/events",
      "file://localhost/data/events/", "FILE:///data/events?x=1", "bucketindex:/data/events",
      "bucketindex:file:///data/events"],
     "bucketindex:file:///data/events"),
    (["/data/my events/é%c", "file:///data/my%20events/%C3%A9%25c"],
     "bucketindex:file:///data/my%20events/%C3%A9%25c"),
    (["/data/a?b#c", "file:///data/a%3Fb%23c"], "bucketindex:file:///data/a%3Fb%23c"),
    (["gcs://b/k/t", "gs://b/k/t/"], "bucketindex:gs://b/k/t"),
    (["hdfs://nn:8020/lake/t/", "hdfs://user@nn:8020/lake/t"], "bucketindex:hdfs://nn:8020/lake/t"),
    (["abfss://box@acct.dfs.core.windows.net/t", "az://box:pw@acct.dfs.core.windows.net/t/"],
     "bucketindex:abfs://box@acct.dfs.core.windows.net/t"),
], ids=["s3", "local", "local-quoted", "local-query-chars", "gs", "hdfs", "azure-container-kept"])
def test_every_spelling_of_a_table_is_one_asset_uri(spellings: list[str], expected: str) -> None:
    assert {assets.asset_uri(s) for s in spellings} == {expected}
    # idempotent: the normalised URI is its own normal form, through the function and the handler
    assert assets.asset_uri(expected) == expected
    assert assets.sanitize_uri(urlsplit(expected)).geturl() == expected


def test_distinct_tables_stay_distinct() -> None:
    uris = ["s3://b/t", "s3://b/t2", "s3://c/t", "s3://b/T", "gs://b/t", "/b/t", "hdfs://nn/b/t", "hdfs://nn:9000/b/t"]
    assert len({assets.asset_uri(u) for u in uris}) == len(uris)


@pytest.mark.parametrize("uri, says", [
    ("data/events", "is a relative path"),
    ("./events", "is a relative path"),
    ("file:data/events", "is a relative path"),
    ("bucketindex:events", "is a relative path"),
    ("file://data/events", "file:// names the host 'data'"),
    ("s3:///events", "names no bucket"),
    ("s3://key:s3cr3t@/events", "names no bucket"),
    ("bucketindex://b/t", "not a table's Asset URI"),
], ids=["relative", "dot-relative", "file-relative", "asset-relative", "file-host", "no-bucket", "no-bucket-creds",
        "authority-form"])
def test_uris_with_no_definite_location_are_refused_with_one_clear_error(uri: str, says: str) -> None:
    with pytest.raises(assets.TableAssetUriError) as e:
        assets.asset_uri(uri)
    assert isinstance(e.value, ValueError)  # what Airflow expects of a normaliser
    assert says in str(e.value)
    assert "s3cr3t" not in str(e.value)
    if "relative" in says:
        assert "absolute path or a URI" in str(e.value)


def test_the_provider_info_registers_the_scheme_with_importable_callables() -> None:
    (entry,) = get_provider_info()["asset-uris"]
    assert entry["schemes"] == ["bucketindex"]

    def import_string(path: str) -> object:
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)

    assert import_string(entry["handler"]) is assets.sanitize_uri
    assert import_string(entry["factory"]) is assets.create_asset
    assert import_string(entry["to_openlineage_converter"]) is assets.convert_asset_to_openlineage


def test_airflow_normalises_bucketindex_uris_through_the_registered_handler() -> None:
    """The installed provider's entry point makes Airflow's own ``Asset`` apply the handler: an
    Asset a user writes by hand in any spelling is the one the operators emit events for."""
    from airflow.sdk import Asset
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    pm = ProvidersManagerTaskRuntime()
    assert pm.asset_uri_handlers.get("bucketindex") is assets.sanitize_uri
    assert pm.asset_factories.get("bucketindex") is assets.create_asset
    by_hand = Asset(name="events", uri="bucketindex:s3a://b/t/?region=eu-west-1")
    assert by_hand.uri == "bucketindex:s3://b/t" == assets.create_asset(table_uri="s3://b/t").uri
    assert by_hand.normalized_uri == "bucketindex:s3://b/t"
    with pytest.raises(ValueError, match="is a relative path"):
        Asset(uri="bucketindex:data/events")


def test_two_spellings_are_one_asset_name_and_uri() -> None:
    """Airflow keys assets by name as well as by URI: the factory names the Asset by its URI, so
    two spellings give equal Assets (not two Assets with one URI, which Airflow refuses)."""
    from airflow_provider_bucketindex.lineage import table_asset, table_asset_uri

    a, b = table_asset("s3a://b/t"), table_asset("s3://b/t/")
    assert a == b and (a.name, a.uri) == (b.name, b.uri) == ("bucketindex:s3://b/t",) * 2
    assert table_asset("/lake/events").uri == table_asset_uri("file:///lake/events/") == "bucketindex:file:///lake/events"
    assert table_asset("s3://b/t").extra == {}
    assert assets.create_asset(table_uri="s3://b/t", extra={"owner": "x"}).extra == {"owner": "x"}
    with pytest.raises(ValueError, match="is a relative path"):
        table_asset("tables/events")


def test_openlineage_names_the_tables_location() -> None:
    from airflow_provider_bucketindex.lineage import openlineage_dataset

    assert assets.openlineage_dataset("bucketindex:s3://b/lake/events") == ("s3://b", "lake/events")
    assert assets.openlineage_dataset("s3a://key:secret@b/lake/events/") == ("s3://b", "lake/events")
    assert assets.openlineage_dataset("bucketindex:file:///data/my%20events") == ("file", "/data/my events")
    assert assets.openlineage_dataset("hdfs://nn:8020/lake/events") == ("hdfs://nn:8020", "/lake/events")
    # a task's own paths: a relative source is the worker's, a glob stays as written
    assert openlineage_dataset("landing/2024-01-0?") [1].endswith("/landing/2024-01-0?")
    assert openlineage_dataset("/landing/a b") == ("file", "/landing/a b")

    pytest.importorskip("airflow.providers.common.compat.openlineage.facet")
    from airflow.sdk import Asset

    ds = assets.convert_asset_to_openlineage(Asset(uri="bucketindex:s3n://b/lake/events/"), None)
    assert (ds.namespace, ds.name) == ("s3://b", "lake/events")


def test_a_task_that_wrote_a_relative_table_emits_the_asset_of_where_it_wrote(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A DAG file's ``table_asset("t")`` is refused (the DAG processor cannot know the worker's
    directory), but a task given a relative ``table_uri`` wrote to one definite place: its event
    is for that absolute path's Asset, on the alias and on an outlet naming the table."""
    from tests.unit.test_provider_engine import FakeEvents, FakeTI, _landing, _upsert

    from airflow_provider_bucketindex import operators as ops
    from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook
    from airflow_provider_bucketindex.lineage import TABLE_UPDATES, table_asset

    monkeypatch.setattr(BucketIndexHook, "submit", lambda *a, **k: pytest.fail("a small batch runs in the task"))
    monkeypatch.delenv("AIRFLOW_CONN_BUCKETINDEX_DEFAULT", raising=False)
    _, sources = _landing(tmp_path, n=1, rows=20)
    monkeypatch.chdir(tmp_path)
    mine = table_asset(str(tmp_path / "t"))
    events = FakeEvents()
    out = _upsert(ops, "t", sources[0], outlets=[mine]).execute({"ti": FakeTI(), "outlet_events": events})
    assert (tmp_path / "t" / ".bucketindex").is_dir()
    assert events[TABLE_UPDATES].added == [(mine, {"instant": out["instant"], "batch_id": out["batch_id"],
                                                   **{k: out[k] for k in ("inserted", "updated", "deleted")},
                                                   "engine": "arrow"})]
    assert events[mine].extra["instant"] == out["instant"]
