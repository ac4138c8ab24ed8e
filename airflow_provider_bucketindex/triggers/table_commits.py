"""TableCommitEventTrigger: one Asset event per commit to a table, whoever made it -- for an ``AssetWatcher``.

The operators record an Asset event when *they* commit; a commit made with the CLI, the
Python API or another scheduler records none. This trigger watches the table itself: it
polls the table's commit sequence (:func:`spark_jobs.table.state.commits_after`, pure
Python over the table's small metadata files, in a worker thread) and yields one
``TriggerEvent`` per commit (by default an upsert or a bootstrap), in commit order, whose
payload becomes the Asset event's ``extra["payload"]``::

    {"table_uri", "seq", "instant", "action", "batch_id", "counts"}

Use it in an ``AssetWatcher`` on the table's Asset::

    from airflow.sdk import Asset, AssetWatcher
    from airflow_provider_bucketindex.lineage import table_asset_uri
    from airflow_provider_bucketindex.triggers import TableCommitEventTrigger

    uri = table_asset_uri("s3://lake/events")
    events = Asset(name=uri, uri=uri, watchers=[AssetWatcher(
        name="events_commits", trigger=TableCommitEventTrigger(table_uri="s3://lake/events"))])

**The watermark** -- ``{"seq", "instant"}`` of the last entry whose event was handed on -- is
kept in the watched Asset's state store (Airflow 3.3's ``asset_state_store``, which the
triggerer gives a ``BaseEventTrigger`` as ``self.asset_state_store`` when it runs it for an
``AssetWatcher``) under :data:`WATERMARK_KEY`, so a triggerer restart, or the trigger moving
to another triggerer, starts after the last commit it reported: no commit is skipped, none is
reported twice. Two details of Airflow 3.3.2 decide *when* it is written:

* a yielded event sits in the trigger runner's queue until its next state sync with the
  triggerer's supervisor (about once a second), which stores it; the asset state store is
  written at once. Writing the watermark right after the yield could record a commit whose
  event a crash then loses (a skip). So the watermark of a poll's events is written
  ``watermark_delay_s`` (default 5 s, several syncs) after the last of them was yielded --
  and before the next poll. A crash (or a restart) inside those seconds reports those commits
  again after the restart; an event's ``seq`` lets a consumer that must never see one twice
  drop it. Outside that window a restart neither repeats nor skips.
* the store is reachable only when the trigger watches one Asset (``AssetStateStoreAccessors``
  with a single accessor; the same trigger arguments on two Assets are one trigger in Airflow)
  and only in the triggerer. Elsewhere -- the trigger run by hand, in a test, on two Assets, on
  Airflow before 3.3 -- the watermark lives in the trigger instance (logged once): a restart
  then starts from ``start`` again. A store that does not answer is logged and the watcher goes
  on (its watermark in memory until a write succeeds): events matter more than the bookmark.

``start`` says where a watcher without a watermark begins: ``"latest"`` (default) after the
table's last commit at that moment (no backlog; a table not there yet is waited for, and its
first commit is reported), ``"earliest"`` at its first. A table replaced at the same place
(the entry at the watermark's ``seq`` has another instant) is reported from its first commit.

Imports nothing heavy at module level: DAG files build this trigger while being parsed.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, AsyncIterator

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_provider_bucketindex.triggers.table_state import Poll, TableStateTrigger, _is_bad_input, _one_line

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["TableCommitEventTrigger", "DEFAULT_ACTIONS", "WATERMARK_KEY", "STARTS"]

#: the asset state store key of the watermark: ``{"seq": int, "instant": str | None}``
WATERMARK_KEY = "bucketindex_commit_watermark"
#: where a watcher without a watermark starts
STARTS = ("latest", "earliest")
#: the actions a watcher reports by default: the ones that add a batch of user data (an upsert,
#: a bootstrap), as ``spark_jobs.table.state.COMMIT_ACTIONS``; a compaction, rehash, clean or
#: rollback changes no row a reader sees (``actions=None`` reports them too)
DEFAULT_ACTIONS = ("commit", "bootstrap")


class TableCommitEventTrigger(TableStateTrigger, BaseEventTrigger):
    """Yields one event per commit to ``table_uri``, in commit order, forever (an ``AssetWatcher``'s trigger).

    :param table_uri: the table (a path, ``file://``, ``s3://`` ... URI; no secrets in it).
    :param actions: the actions reported (default :data:`DEFAULT_ACTIONS`: ``commit`` and
        ``bootstrap``, the ones that add a batch; None: every completed entry of the commit
        sequence, compactions, rehashes, cleans and rollbacks included). Entries of other
        actions still move the watermark.
    :param start: ``"latest"`` (default) or ``"earliest"``: where a watcher without a watermark begins.
    :param poke_interval: seconds between two looks at the table (at least ``watermark_delay_s``
        matters only after a poll that reported something).
    :param max_events: at most this many events per poll (the rest on the next poll, in order).
    :param watermark_delay_s: seconds between a poll's last event and writing its watermark
        (see the module doc: the events must have reached the triggerer's database first).
    :param conn_id: / :param storage_conn_id: / :param storage_options: as
        :class:`~airflow_provider_bucketindex.triggers.table_state.TableStateTrigger`.
    """

    def __init__(self, *, table_uri: str, actions: list[str] | tuple[str, ...] | None = DEFAULT_ACTIONS,
                 start: str = "latest",
                 poke_interval: float = 30.0, max_events: int = 100, watermark_delay_s: float = 5.0,
                 **storage: Any) -> None:
        super().__init__(table_uri=table_uri, poke_interval=poke_interval, timeout_s=None, **storage)
        if start not in STARTS:
            raise ValueError(f"start must be one of {', '.join(STARTS)}, got {start!r}")
        if int(max_events) < 1:
            raise ValueError(f"max_events must be at least 1, got {max_events}")
        self.actions = None if actions is None else [str(a) for a in actions]
        self.start = start
        self.max_events = int(max_events)
        self.watermark_delay_s = max(0.0, float(watermark_delay_s))
        self._memory_watermark: dict[str, Any] | None = None
        self._store_warned = False

    def _arguments(self) -> dict[str, Any]:
        return {"actions": self.actions, "start": self.start, "max_events": self.max_events,
                "watermark_delay_s": self.watermark_delay_s}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath, kwargs = super().serialize()
        kwargs.pop("timeout_s", None)  # a watcher runs forever: not an argument of this trigger
        return classpath, kwargs

    # -- the watermark -----------------------------------------------------------------------
    def _store(self) -> Any:
        """The watched Asset's state store accessor, or None (logged once) when there is none."""
        store = getattr(self, "asset_state_store", None)
        if store is not None:
            try:
                store._single_accessor()  # raises ValueError unless exactly one Asset is watched
                return store
            except AttributeError:  # a stand-in with get/set (or aget/aset) only
                return store
            except ValueError:
                why = "it watches more than one Asset"
        else:
            why = "Airflow gave it no asset state store (not run by a triggerer for an AssetWatcher)"
        if not self._store_warned:
            self.log.warning("%s: the watermark is kept in memory only, because %s; a restart starts "
                             "from start=%r again", self.table_uri, why, self.start)
            self._store_warned = True
        return None

    async def load_watermark(self) -> dict[str, Any] | None:
        """The stored watermark ``{"seq", "instant"}``, or None (none yet, or not one)."""
        store = self._store()
        if store is None:
            return self._memory_watermark
        try:
            if hasattr(store, "aget"):
                value = await store.aget(WATERMARK_KEY, default=None)
            else:  # Airflow 3.3.0/3.3.1: the blocking accessor only
                value = await asyncio.to_thread(store.get, WATERMARK_KEY, None)
        except Exception as e:  # the store did not answer: start as without one, and say so
            self.log.warning("%s: the asset state store did not answer (%s); starting from start=%r",
                             self.table_uri, _one_line(e), self.start)
            return self._memory_watermark
        if isinstance(value, dict) and isinstance(value.get("seq"), int) and value["seq"] >= 0:
            return {"seq": value["seq"], "instant": value.get("instant")}
        if value is not None:
            self.log.warning("%s: ignoring a stored watermark that is not one: %r", self.table_uri, value)
        return None

    async def save_watermark(self, watermark: dict[str, Any]) -> None:
        self._memory_watermark = dict(watermark)
        store = self._store()
        if store is None:
            return
        try:
            if hasattr(store, "aset"):
                await store.aset(WATERMARK_KEY, dict(watermark))
            else:
                await asyncio.to_thread(store.set, WATERMARK_KEY, dict(watermark))
        except Exception as e:  # keep watching; the next write carries the watermark on
            self.log.warning("%s: the watermark (seq %s) is not stored (%s); a restart now would report "
                             "again what came after the last one stored", self.table_uri, watermark.get("seq"),
                             _one_line(e))

    # -- one look at the table ---------------------------------------------------------------
    def _check(self, state: ModuleType) -> Poll:  # the sensors' interface: not used by a watcher
        raise NotImplementedError("TableCommitEventTrigger is a watcher's trigger, not a sensor's")

    def read_commits(self, watermark: dict[str, Any] | None) -> dict[str, Any]:
        """``state.commits_after`` the watermark, with the trigger's storage options (blocking).
        Without a watermark: everything (``earliest``) or nothing but the position (``latest``)."""
        from airflow_provider_bucketindex.storage import storage_scope
        from spark_jobs.table import state  # pyarrow, numpy: imported where it runs, not at DAG parse

        with storage_scope(self.storage_settings()):
            if watermark is None and self.start == "latest":
                found = state.commits_after(self.table_uri, after_seq=0, actions=(), limit=None)
                return {**found, "commits": []}
            w = watermark or {"seq": 0, "instant": None}
            return state.commits_after(self.table_uri, after_seq=w["seq"], after_instant=w.get("instant"),
                                       actions=self.actions, limit=self.max_events)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watermark = await self.load_watermark()
        self.log.info("%s: watching commits after %s", self.table_uri,
                      f"seq {watermark['seq']} ({watermark.get('instant')})" if watermark else f"start={self.start}")
        while True:
            try:
                found = await asyncio.to_thread(self.read_commits, watermark)
            except Exception as e:
                # no table yet (start=latest waits for its first commit), or storage unreachable:
                # a watcher keeps watching; the next poll tries again
                level = self.log.info if _is_bad_input(e) else self.log.warning
                level("%s: %s; next look in %g s", self.table_uri, _one_line(e), self.poke_interval)
                if watermark is None and self.start == "latest" and _is_bad_input(e):
                    watermark = {"seq": 0, "instant": None}  # no table yet: its first commit is news
                    await self.save_watermark(watermark)
                await asyncio.sleep(self.poke_interval)
                continue
            if found["replaced"]:
                self.log.warning("%s: the entry at the watermark (seq %s, %s) is not there any more: the "
                                 "table was replaced; reporting its commits from the first",
                                 self.table_uri, (watermark or {}).get("seq"), (watermark or {}).get("instant"))
            commits = found["commits"]
            for commit in commits:
                yield TriggerEvent({"table_uri": self.table_uri, **commit})
            if watermark is None and self.start == "latest":  # first look: the table's end
                new = {"seq": found["last_seq"], "instant": found["last_instant"]}
            elif len(commits) >= self.max_events:  # more to come: after the last one reported
                new = {"seq": commits[-1]["seq"], "instant": commits[-1]["instant"]}
            else:
                new = {"seq": found["last_seq"], "instant": found["last_instant"]}
            if new != watermark:
                if commits:
                    self.log.info("%s: reported %d commit(s), seq %s..%s", self.table_uri, len(commits),
                                  commits[0]["seq"], commits[-1]["seq"])
                    await asyncio.sleep(self.watermark_delay_s)  # the events reach the database first
                await self.save_watermark(new)
                watermark = new
            if len(commits) >= self.max_events:
                continue  # a backlog: the next batch at once
            await asyncio.sleep(self.poke_interval)
