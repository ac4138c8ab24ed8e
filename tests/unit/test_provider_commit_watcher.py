"""TableCommitEventTrigger, the AssetWatcher trigger: its async generator run against real
tables on local disk (paths with spaces, ``%``, ``+`` and non-ASCII), commits made by the
``bucketindex`` CLI in its own process (Arrow engine, no Spark) and by the Python API
(``spark_jobs.Table``), one event per commit in commit order, and a restart -- a new trigger
instance over the same asset state store -- that neither repeats nor skips.

The asset state store is a stand-in here (a dict behind ``aget``/``aset``, the interface the
triggerer gives the trigger); tests/airflow/test_commit_watcher_dag.py runs the trigger over
Airflow's own store and database."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_bucketindex.demo import sandbox

pytestmark = pytest.mark.unit

#: table directories as users name them
ODD_NAME = "ventes été 50%+x"


@pytest.fixture(scope="module")
def watcher():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex.triggers import table_commits

    return table_commits


class Store:
    """The asset state store as a trigger sees it (``aget``/``aset``), in a dict; counts writes."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.writes = 0

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        assert value is not None
        self.values[key] = value
        self.writes += 1


def _source(tmp_path: Path, name: str, rows: list[dict[str, Any]]) -> str:
    path = tmp_path / "landing" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.string()), ("ts", pa.int64()),
                                                                ("v", pa.string())])), path)
    return str(path)


def cli_upsert(table: str, source: str, batch_id: str) -> str:
    """``bucketindex upsert`` in its own process, Arrow engine; returns the stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "airflow_provider_bucketindex.cli", "upsert", table, source, "--record-key", "id",
         "--precombine-field", "ts", "--batch-id", batch_id, "--engine", "arrow"],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def api_upsert(table: str, rows: list[dict[str, Any]]) -> str:
    """An upsert through the Python API (in this process); returns its instant."""
    from spark_jobs import Table

    return Table(table).upsert(pa.Table.from_pylist(rows)).instant


def _rows(i: int) -> list[dict[str, Any]]:
    values = [f"v{i}", "", None, "a/b c%", "ü+", f"w{i}"]  # "" and null where a value appears
    return [{"id": k, "ts": i, "v": v} for k, v in zip(("a b", "x/y", "50%", "1+1", "Zürich ☃", "nul"), values)]


class Running:
    """A trigger's ``run()`` driven as the triggerer drives it: a task that queues every event
    it yields until the trigger is stopped (cancelled, as a triggerer shutting down does)."""

    def __init__(self, trigger: Any) -> None:
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.task = asyncio.ensure_future(self._pump(trigger))

    async def _pump(self, trigger: Any) -> None:
        async for event in trigger.run():
            await self.events.put(event)

    async def take(self, n: int, limit: float = 30.0) -> list[Any]:
        """The next ``n`` events."""
        return [await asyncio.wait_for(self.events.get(), limit) for _ in range(n)]

    async def quiet(self, seconds: float) -> None:
        """Let the trigger poll for ``seconds`` (writing any due watermark); no event may come."""
        await asyncio.sleep(seconds)
        assert self.events.empty(), f"an event nobody committed: {self.events.get_nowait().payload}"
        assert not self.task.done(), self.task.result()

    async def stop(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def _timeline(table: str, actions: tuple[str, ...] | None = ("commit", "bootstrap")) -> list[tuple[int, str, str, str | None]]:
    """The table's commits (``actions``; None: every entry), as the table says, in commit order."""
    from spark_jobs.table import Table

    tl = Table.load(table).timeline
    return [(i.seq, i.timestamp, i.action, tl.read_commit(i).batch_id) for i in tl.reload().completed(actions)]


def _last(table: str) -> dict[str, Any]:
    from spark_jobs.table import Table

    (i,) = Table.load(table).timeline.reload().recent(1)
    return {"seq": i.seq, "instant": i.timestamp}


def _seen(events: list[Any]) -> list[tuple[int, str, str, str | None]]:
    return [(e.payload["seq"], e.payload["instant"], e.payload["action"], e.payload["batch_id"]) for e in events]


@pytest.mark.asyncio
async def test_every_commit_by_anyone_is_one_event_in_order_and_a_restart_neither_repeats_nor_skips(
        watcher, tmp_path):  # type: ignore[no-untyped-def]
    table = str(tmp_path / "lake" / ODD_NAME)
    store = Store()
    cli_upsert(table, _source(tmp_path, "b0", _rows(0)), "cli batch 1 é")
    first = watcher.TableCommitEventTrigger(table_uri=table, start="earliest", poke_interval=0.05,
                                            watermark_delay_s=0)
    first.asset_state_store = store
    run = Running(first)
    events = await run.take(1)  # the table's first commit (start="earliest")
    api_upsert(table, _rows(1))
    cli_upsert(table, _source(tmp_path, "b2", _rows(2)), "cli batch 2 / +%")
    events += await run.take(2)
    await run.quiet(1.0)
    await run.stop()  # the triggerer stops; the watermark of every event is stored
    assert _seen(events) == _timeline(table)
    assert [e.payload["batch_id"] for e in events][::2] == ["cli batch 1 é", "cli batch 2 / +%"]
    assert all(e.payload["table_uri"] == table and e.payload["action"] == "commit" for e in events)
    assert events[0].payload["counts"]["inserted"] == 6 and events[2].payload["counts"]["updated"] == 6
    assert store.values[watcher.WATERMARK_KEY] == _last(table)  # automatic compactions included

    # commits while no triggerer runs: the next trigger instance reports exactly those, in order
    api_upsert(table, _rows(3))
    cli_upsert(table, _source(tmp_path, "b4", _rows(4)), "cli batch 4")
    second = watcher.TableCommitEventTrigger(table_uri=table, start="earliest", poke_interval=0.05,
                                             watermark_delay_s=0)
    second.asset_state_store = store
    run = Running(second)
    later = await run.take(2)
    await run.quiet(1.0)
    await run.stop()
    assert _seen(later) == _timeline(table)[3:]
    assert _seen(events + later) == _timeline(table) and len(events + later) == 5
    assert store.values[watcher.WATERMARK_KEY] == _last(table)


@pytest.mark.asyncio
async def test_latest_starts_after_the_last_commit_and_waits_for_a_table_not_there_yet(
        watcher, tmp_path):  # type: ignore[no-untyped-def]
    existing = str(tmp_path / "déjà là")
    cli_upsert(existing, _source(tmp_path, "b0", _rows(0)), "old")
    store = Store()
    trig = watcher.TableCommitEventTrigger(table_uri=existing, poke_interval=0.05, watermark_delay_s=0)
    trig.asset_state_store = store
    run = Running(trig)
    await run.quiet(0.6)  # the old commit is history, not news
    assert store.values[watcher.WATERMARK_KEY] == _last(existing)
    instant = api_upsert(existing, _rows(1))
    (event,) = await run.take(1)
    await run.stop()
    assert event.payload["instant"] == instant and _seen([event]) == _timeline(existing)[1:]

    absent = str(tmp_path / "pas encore" / "t 1")
    trig = watcher.TableCommitEventTrigger(table_uri=absent, poke_interval=0.05, watermark_delay_s=0)
    run = Running(trig)  # no store: the watermark is in memory, and said so
    await run.quiet(0.4)
    cli_upsert(absent, _source(tmp_path, "b1", _rows(0)), "premier")
    (event,) = await run.take(1)
    await run.stop()
    assert (event.payload["seq"], event.payload["batch_id"]) == (1, "premier")


@pytest.mark.asyncio
async def test_a_crash_before_the_watermark_is_written_repeats_never_skips(watcher, tmp_path):  # type: ignore
    """The documented window: the watermark follows its events by ``watermark_delay_s``; a
    trigger killed inside it reports those commits again after the restart."""
    table = str(tmp_path / "t é")
    cli_upsert(table, _source(tmp_path, "b0", _rows(0)), "one")
    store = Store()
    trig = watcher.TableCommitEventTrigger(table_uri=table, start="earliest", poke_interval=0.05,
                                           watermark_delay_s=30)
    trig.asset_state_store = store
    run = Running(trig)
    (event,) = await run.take(1)
    await run.quiet(0.3)  # now inside the delay
    await run.stop()  # the triggerer dies
    assert watcher.WATERMARK_KEY not in store.values
    again = watcher.TableCommitEventTrigger(table_uri=table, start="earliest", poke_interval=0.05,
                                            watermark_delay_s=0)
    again.asset_state_store = store
    run = Running(again)
    (repeated,) = await run.take(1)
    await run.stop()
    assert repeated.payload == event.payload


@pytest.mark.asyncio
async def test_a_replaced_table_is_reported_from_its_first_commit_and_actions_none_reports_every_entry(
        watcher, tmp_path):  # type: ignore[no-untyped-def]
    from spark_jobs import Table

    table = str(tmp_path / "r+p")
    cli_upsert(table, _source(tmp_path, "b0", _rows(0)), "old 1")
    api_upsert(table, _rows(1))
    api_upsert(table, _rows(2))
    store = Store()
    trig = watcher.TableCommitEventTrigger(table_uri=table, poke_interval=0.05, watermark_delay_s=0)
    trig.asset_state_store = store
    run = Running(trig)
    await run.quiet(0.4)
    await run.stop()
    assert store.values[watcher.WATERMARK_KEY] == _last(table) and _last(table)["seq"] >= 3

    shutil.rmtree(table)  # dropped and made again at the same place: its seq 1 is a new commit
    cli_upsert(table, _source(tmp_path, "n0", _rows(5)), "new 1")
    api_upsert(table, _rows(6))  # a log on a file group: the upsert compacts it after its commit
    trig = watcher.TableCommitEventTrigger(table_uri=table, actions=None, poke_interval=0.05, watermark_delay_s=0)
    trig.asset_state_store = store
    run = Running(trig)
    everything = _timeline(table, None)
    events = await run.take(len(everything))
    await run.quiet(0.5)
    await run.stop()
    assert _seen(events) == everything and [a for _, _, a, _ in everything] == ["commit", "commit", "compaction"]
    assert events[0].payload["batch_id"] == "new 1" and store.values[watcher.WATERMARK_KEY] == _last(table)


def test_serializes_without_secrets_and_fits_an_asset_watcher(watcher):  # type: ignore[no-untyped-def]
    from airflow.sdk import Asset, AssetWatcher
    from airflow.triggers.base import BaseEventTrigger

    from airflow_provider_bucketindex.lineage import table_asset_uri

    trig = watcher.TableCommitEventTrigger(table_uri="s3a://lake/ventes été/", actions=["commit"],
                                           storage_conn_id="aws_lake", storage_options={"region": "eu-west-1"})
    assert isinstance(trig, BaseEventTrigger) and trig.asset_state_store is None
    path, kwargs = trig.serialize()
    assert path == "airflow_provider_bucketindex.triggers.table_commits.TableCommitEventTrigger"
    assert kwargs == {"table_uri": "s3a://lake/ventes été/", "actions": ["commit"], "start": "latest",
                      "max_events": 100, "watermark_delay_s": 5.0, "poke_interval": 30.0,
                      "storage_conn_id": "aws_lake", "storage_options": {"region": "eu-west-1"}}
    assert watcher.TableCommitEventTrigger(**kwargs).serialize() == (path, kwargs)
    uri = table_asset_uri("s3a://lake/ventes été/")
    asset = Asset(name=uri, uri=uri, watchers=[AssetWatcher(name="w", trigger=trig)])
    assert asset.uri == "bucketindex:s3://lake/ventes été" and asset.watchers[0].trigger is trig
    with pytest.raises(Exception, match="secret"):
        watcher.TableCommitEventTrigger(table_uri="/t", storage_options={"secret_key": "x"}).serialize()
    with pytest.raises(ValueError, match="start must be one of latest, earliest"):
        watcher.TableCommitEventTrigger(table_uri="/t", start="now")


@pytest.mark.asyncio
async def test_two_watched_assets_keep_the_watermark_in_memory_and_say_so(watcher, tmp_path):  # type: ignore
    from airflow.sdk import Asset
    from airflow.sdk.execution_time.context import AssetStateStoreAccessors

    table = str(tmp_path / "deux")
    cli_upsert(table, _source(tmp_path, "b0", _rows(0)), "one")
    trig = watcher.TableCommitEventTrigger(table_uri=table, start="earliest", poke_interval=0.05,
                                           watermark_delay_s=0)
    trig.asset_state_store = AssetStateStoreAccessors(inlets=[Asset(name="a", uri="s3://b/a"),
                                                              Asset(name="b", uri="s3://b/b")])
    run = Running(trig)
    (event,) = await run.take(1)
    await run.quiet(0.3)
    await run.stop()
    assert event.payload["seq"] == 1 and trig._memory_watermark == {"seq": 1, "instant": event.payload["instant"]}
    assert trig._store_warned  # logged once: "... kept in memory only, because it watches more than one Asset"


def test_commits_after_lists_in_commit_order_caps_and_refuses_bad_input(tmp_path):  # type: ignore[no-untyped-def]
    from spark_jobs.exceptions import BadInputError
    from spark_jobs.table import state

    table = str(tmp_path / "ordre é")
    cli_upsert(table, _source(tmp_path, "b0", _rows(0)), "un")
    for i in range(1, 3):
        api_upsert(table, _rows(i))
    every = _timeline(table, None)
    found = state.commits_after(table, after_seq=0, actions=None)
    assert [(c["seq"], c["instant"], c["action"], c["batch_id"]) for c in found["commits"]] == every
    assert (found["last_seq"], found["last_instant"], found["replaced"]) == (every[-1][0], every[-1][1], False)
    first, second = _timeline(table)[:2]
    capped = state.commits_after(table, after_seq=first[0], after_instant=first[1], actions=["commit"], limit=1)
    assert [(c["seq"], c["batch_id"]) for c in capped["commits"]] == [(second[0], second[3])]
    gone = state.commits_after(table, after_seq=first[0], after_instant="20000101000000000", actions=["commit"])
    assert gone["replaced"] and len(gone["commits"]) == 3  # not this table's entry: from the first
    beyond = state.commits_after(table, after_seq=every[-1][0] + 5, actions=("commit",))
    assert beyond["replaced"] and len(beyond["commits"]) == 3
    for kwargs, message in (({"after_seq": -1}, "after_seq must be at least 0"), ({"limit": 0}, "limit must be at least 1")):
        with pytest.raises(BadInputError, match=message):
            state.commits_after(table, **kwargs)
    with pytest.raises(BadInputError, match="no bucketindex table"):
        state.commits_after(str(tmp_path / "nowhere"))


@pytest.mark.asyncio
async def test_a_backlog_comes_in_order_max_events_at_a_time(watcher, tmp_path):  # type: ignore[no-untyped-def]
    table = str(tmp_path / "arriéré")
    cli_upsert(table, _source(tmp_path, "b0", _rows(0)), "un")
    for i in range(1, 5):
        api_upsert(table, _rows(i))
    store = Store()
    trig = watcher.TableCommitEventTrigger(table_uri=table, start="earliest", max_events=2, poke_interval=30,
                                           watermark_delay_s=0)
    trig.asset_state_store = store
    run = Running(trig)
    events = await run.take(5, limit=10)  # not one poke_interval between two batches
    await run.quiet(0.3)
    await run.stop()
    assert _seen(events) == _timeline(table) and store.values[watcher.WATERMARK_KEY] == _last(table)
    assert store.writes == 3  # after each batch of at most 2: seq of the 2nd, the 4th, then the end


@pytest.mark.asyncio
async def test_a_store_that_fails_does_not_stop_the_watcher(watcher, tmp_path):  # type: ignore[no-untyped-def]
    class Broken(Store):
        async def aget(self, key, default=None):  # type: ignore[no-untyped-def]
            raise RuntimeError("the API server is down")

        async def aset(self, key, value):  # type: ignore[no-untyped-def]
            raise RuntimeError("the API server is down")

    table = str(tmp_path / "panne")
    cli_upsert(table, _source(tmp_path, "b0", _rows(0)), "un")
    trig = watcher.TableCommitEventTrigger(table_uri=table, poke_interval=0.05, watermark_delay_s=0)
    trig.asset_state_store = Broken()
    run = Running(trig)
    await run.quiet(0.5)
    instant = api_upsert(table, _rows(1))
    (event,) = await run.take(1)
    await run.quiet(0.3)
    await run.stop()
    assert event.payload["instant"] == instant and trig._memory_watermark == _last(table)
