"""The Python API: one handle on a table, used as a delta-rs user uses ``DeltaTable``.

:class:`Table` is a facade over the core (:class:`spark_jobs.table.table.Table`, the timeline,
the snapshot's view) and the verbs' functions the CLI runs: every method calls the same
function the CLI's ``cmd_*`` calls, with the same options object where one exists
(:class:`~spark_jobs.table.action.upsert.UpsertOptions`,
:class:`~spark_jobs.table.action.compact.CompactionPolicy`,
:class:`~spark_jobs.table.shadow.ShadowOptions`), so the rules, the engine choice (``auto``:
the in-process Arrow engine when the work fits the memory budget) and the errors are the
CLI's. Errors are :mod:`spark_jobs.exceptions`' (``BadInputError``: nothing was written).
Results are frozen dataclasses; each keeps the verb's full report in ``details``.

In-memory batches (a ``pyarrow.Table`` or ``RecordBatchReader``, a pandas or Polars frame) are
written to a temporary Parquet file, then upserted like a file -- why not hand the frame to the
engine (``UpsertOptions.source_df``): the file path keeps every rule the CLI applies to a batch
(the pre-check of its columns against the table before any engine starts, the memory sizing
``auto`` does from the batch's bytes, the Spark fallback when the Arrow engine cannot run a
batch, which needs a file Spark can read), and a ``RecordBatchReader`` is streamed to it batch
by batch, never held whole. The cost is one local Parquet write of the batch.

Importing this module imports neither pyspark nor airflow (a Spark verb imports pyspark when
it runs); pandas and Polars are never imported here: a frame is recognised by its type's module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import pyarrow as pa

from spark_jobs.exceptions import BadInputError, TableNotFoundError
from spark_jobs.table.action.alter import AlterOptions
from spark_jobs.table.action.clean import CleanOptions
from spark_jobs.table.action.compact import CompactOptions
from spark_jobs.table.action.mirror import MirrorOptions
from spark_jobs.table.action.rehash import RehashOptions
from spark_jobs.table.action.rollback import RollbackOptions
from spark_jobs.table.action.rollback import rollback as rollback_pending
from spark_jobs.table.action.shadow_compare import ShadowCompareOptions
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.action.validate import ValidateOptions
from spark_jobs.table.commit import CommitMetadata
from spark_jobs.table.timeline import instant_to_iso

if TYPE_CHECKING:
    import pyarrow.dataset as ds

    from spark_jobs.table.table import Table as CoreTable

__all__ = ["Table", "WriteResult", "Ignored", "HistoryEntry", "ValidationReport", "ShadowCompareReport",
           "CompactResult", "CleanResult", "RehashResult", "AlterResult", "RollbackResult", "MirrorResult",
           "schema_history"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})

#: options of :class:`UpsertOptions` the handle sets itself (the rest are the caller's keywords)
_HANDLE_FIELDS = ("table", "source", "source_df")
#: what ``upsert(**options)`` takes: the options object's own fields
_UPSERT_FIELDS = frozenset(f.name for f in dataclasses.fields(UpsertOptions) if f.init)


def _frozen(d: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d or {}))


# -- results ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Ignored:
    """A batch's identities that changed nothing (they are not errors): ``stale_upserts`` lost
    to a stored row with a higher precombine value; ``stale_or_absent_deletes`` deleted a key
    the table did not hold, or one whose stored row is newer."""

    stale_upserts: int = 0
    stale_or_absent_deletes: int = 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Ignored:
        d = d or {}
        return cls(stale_upserts=int(d.get("stale_upserts", 0)),
                   stale_or_absent_deletes=int(d.get("stale_or_absent_deletes", 0)))


@dataclass(frozen=True, kw_only=True)
class WriteResult:
    """What one upsert (or :meth:`Table.delete`) committed. ``noop``: the batch id was already
    committed (a rerun), ``instant`` then names that commit."""

    instant: str
    batch_id: str
    noop: bool
    inserted: int
    updated: int
    deleted: int
    rows_in_batch: int
    keys_in_batch: int
    ignored: Ignored
    engine: str | None
    retries: int
    timings_ms: Mapping[str, Any]
    details: Mapping[str, Any] = field(repr=False, default_factory=lambda: _EMPTY)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WriteResult:
        c = d.get("counts") or {}
        ignored = d.get("ignored")
        return cls(instant=d["instant"], batch_id=d["batch_id"], noop=bool(d.get("noop")),
                   inserted=int(c.get("inserted", 0)), updated=int(c.get("updated", 0)),
                   deleted=int(c.get("deleted", 0)), rows_in_batch=int(c.get("rows_in_batch", 0)),
                   keys_in_batch=int(c.get("keys_in_batch", 0)), ignored=Ignored.from_json(ignored),
                   engine=d.get("engine"), retries=int(d.get("retries", 0)),
                   timings_ms=_frozen(d.get("timings_ms")), details=_frozen(d))


@dataclass(frozen=True, kw_only=True)
class HistoryEntry:
    """One completed timeline entry, from its typed :class:`~spark_jobs.table.commit.CommitMetadata`.

    ``schema_changes``: what this entry changed of the table's schema, in words (``added x
    bigint``, ``widened y int -> bigint``); empty for the entry that created the table and for
    every entry that kept the schema. An upsert with a change is a schema evolution."""

    sequence: int
    instant: str
    #: the instant (when the write began) as a UTC time, the instants' clock
    timestamp: _dt.datetime
    #: when the entry completed (its commit point), None for an entry that does not say: a
    #: ``read(as_of=completed)`` sees this entry, ``as_of=timestamp`` does not (it began then)
    completed: _dt.datetime | None
    action: str
    operation: str | None
    batch_id: str | None
    counts: Mapping[str, Any]
    ignored: Ignored | None
    engine: str | None
    timings_ms: Mapping[str, Any]
    schema_changes: tuple[str, ...]
    metadata: CommitMetadata = field(repr=False)


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    """``validate``: ``ok`` and the problems found (empty when ok)."""

    ok: bool
    problems: Mapping[str, Any]
    engine: str
    details: Mapping[str, Any] = field(repr=False, default_factory=lambda: _EMPTY)


@dataclass(frozen=True, kw_only=True)
class ShadowCompareReport:
    """``shadow-compare``: ``ok`` unless more than ``max_mismatches`` keys mismatch."""

    ok: bool
    mismatches: int
    keys_compared: int | None
    engine: str
    details: Mapping[str, Any] = field(repr=False, default_factory=lambda: _EMPTY)


@dataclass(frozen=True, kw_only=True)
class CompactResult:
    """``compact``: ``instant`` None when nothing was due (``noop``)."""

    instant: str | None
    scheduled: bool
    executed: bool
    noop: bool
    counts: Mapping[str, Any]
    engine: str | None
    total_ms: int | None
    details: Mapping[str, Any] = field(repr=False, default_factory=lambda: _EMPTY)


@dataclass(frozen=True, kw_only=True)
class CleanResult:
    """``clean``: files (and bytes) deleted, or that a dry run would delete."""

    instant: str | None
    files: int
    bytes: int
    earliest_retained: str | None
    dry_run: bool
    details: Mapping[str, Any] = field(repr=False, default_factory=lambda: _EMPTY)


@dataclass(frozen=True, kw_only=True)
class RehashResult:
    instant: str | None
    noop: bool
    previous_num_buckets: int | None
    num_buckets: int
    counts: Mapping[str, Any]
    #: the engine that rewrote the table (None: a no-op)
    engine: str | None = None
    details: Mapping[str, Any] = field(repr=False, default_factory=lambda: _EMPTY)


@dataclass(frozen=True, kw_only=True)
class AlterResult:
    instant: str | None
    noop: bool
    changes: tuple[str, ...]
    details: Mapping[str, Any] = field(repr=False, default_factory=lambda: _EMPTY)


@dataclass(frozen=True, kw_only=True)
class RollbackResult:
    rolled_back: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class MirrorResult:
    """``mirror``: the projection's latest version (Delta log or Iceberg metadata) and the
    versions written (and, on repair, rewritten)."""

    version: int
    written: tuple[int, ...]
    rewritten: tuple[int, ...] = ()
    details: Mapping[str, Any] = field(repr=False, default_factory=lambda: _EMPTY)


# -- the handle -------------------------------------------------------------------------------
class Table:
    """A bucketindex table at ``uri`` (a local directory, ``file://`` or ``s3://``).

    ``storage_options`` (``endpoint_url``, ``region``, credentials, ...: the CLI's
    ``--storage-option`` keys) apply to this handle's calls, over the environment's; a write
    sets them as the process's run options for its duration (the verbs read them there), so
    handles with different options should not write from two threads at once.
    """

    def __init__(self, uri: str, *, storage_options: Mapping[str, str] | None = None) -> None:
        self.uri = str(uri)
        self.storage_options = dict(storage_options or {}) or None
        self._core()  # TableNotFoundError (a BadInputError) now, not at the first call

    def __repr__(self) -> str:
        from spark_jobs.io.storage import redact_uri

        return f"Table({redact_uri(self.uri)!r})"

    @classmethod
    def create(cls, uri: str, data: Any = None, *, record_key: str | Sequence[str],
               partition_field: str | None = None, precombine_field: str | None = None, index: str | None = None,
               table_type: str | None = None, num_buckets: int | None = None,
               storage_options: Mapping[str, str] | None = None, **options: Any) -> Table:
        """Create a table and, when ``data`` is given (anything :meth:`upsert` takes), write it as
        the first commit; the fixed options (key, partition, precombine, index, type, buckets)
        are the CLI's first ``upsert``'s. BadInputError when a table is already there (open it
        with ``Table(uri)``) or an option is bad; nothing is written then."""
        keys = [record_key] if isinstance(record_key, str) else list(record_key)
        fixed = dict(record_key=keys, partition_field=partition_field, precombine_field=precombine_field,
                     index=index, table_type=table_type, num_buckets=num_buckets)
        with _storage(storage_options):
            from spark_jobs.table.dataset import open_table

            try:
                open_table(uri, storage_options=storage_options)
            except TableNotFoundError:
                pass
            else:
                raise BadInputError(f"a table already exists at {uri}: open it with Table(uri)")
            if data is None:
                if options:
                    raise BadInputError(f"{', '.join(sorted(options))} apply to a batch: give data, or pass them "
                                        f"to the first upsert")
                from spark_jobs.table.action.upsert import resolve_config
                from spark_jobs.table.table import Table as CoreTable

                core = CoreTable.open(uri)
                cfg, _ = resolve_config(UpsertOptions(table=uri, source="", **fixed), core)
                core.create(cfg)
                return cls(uri, storage_options=storage_options)
        handle = cls.__new__(cls)
        handle.uri, handle.storage_options = str(uri), dict(storage_options or {}) or None
        handle._upsert(data, options={**fixed, **options})
        return handle

    # -- reading ------------------------------------------------------------------------------
    def _core(self) -> CoreTable:
        from spark_jobs.table.dataset import open_table

        return open_table(self.uri, storage_options=self.storage_options)

    @property
    def config(self) -> Mapping[str, Any]:
        """The table's fixed options: record key, partition and precombine fields, index, type."""
        c = self._core().config
        assert c is not None
        return MappingProxyType({"record_key": tuple(c.record_key_fields), "partition_fields": tuple(c.partition_fields),
                                 "precombine_field": c.precombine_field, "index": c.index_type,
                                 "table_type": c.table_type})

    def version(self) -> int:
        """The sequence number of the latest completed entry (0: none yet; the Delta version)."""
        return self._core().timeline.reload().last_seq

    def schema(self, as_of: str | _dt.datetime | None = None) -> pa.Schema:
        """The table's columns and types as of ``as_of`` (an instant, an ISO-8601 time or a
        ``datetime``; default latest), without the reserved ``_bi_*`` columns."""
        from spark_jobs.table.dataset import public_schema

        return public_schema(self._core().view(_as_of(as_of)).schema)

    def read(self, as_of: str | _dt.datetime | None = None, *, columns: Sequence[str] | None = None) -> pa.Table:
        """The snapshot as of ``as_of`` (default latest) as one Arrow table (merge-on-read logs
        merged), as ``bucketindex read``."""
        from spark_jobs.table.reader import read_view

        core = self._core()
        t = read_view(core, core.view(_as_of(as_of)))
        return t.select(list(columns)) if columns is not None else t

    def to_pyarrow_dataset(self, as_of: str | _dt.datetime | None = None) -> ds.Dataset:
        """The snapshot as a ``pyarrow.dataset.Dataset`` (DuckDB, Polars, pandas read it lazily;
        :mod:`spark_jobs.table.dataset` says what is pushed down)."""
        from spark_jobs.table.dataset import snapshot_dataset

        core = self._core()
        return snapshot_dataset(core, core.view(_as_of(as_of)))

    def to_pandas(self, as_of: str | _dt.datetime | None = None) -> Any:
        return self.read(as_of).to_pandas()

    def history(self, limit: int | None = None) -> list[HistoryEntry]:
        """Completed timeline entries, newest first (at most ``limit``), typed."""
        return list(reversed(schema_history(self._core(), limit=limit)))

    def describe(self) -> Mapping[str, Any]:
        """What ``bucketindex show --json`` prints."""
        from spark_jobs.table.describe import describe

        return MappingProxyType(describe(self._core()))

    # -- writing ------------------------------------------------------------------------------
    def upsert(self, source: Any, **options: Any) -> WriteResult:
        """Upsert (and delete, with ``delete_field``) one batch: a path, a glob, a directory, a
        ``pyarrow.Table``, a ``pyarrow.RecordBatchReader``, a pandas or a Polars DataFrame.
        ``options`` are :class:`~spark_jobs.table.action.upsert.UpsertOptions` fields
        (``delete_field``, ``batch_id``, ``partial_update``, ``schema_evolution``, ``engine``,
        ``memory_budget``, ``source_format``, ...), validated by it."""
        return self._upsert(source, options=options)

    def delete(self, keys: Any, *, partition: Any = None, precombine: Any = None, **options: Any) -> WriteResult:
        """Delete records by key, one commit. ``keys``: the key values (a list of scalars for a
        one-field key, of tuples for a composite one), or rows naming the key fields (a list of
        dicts, a ``pyarrow.Table``, a frame) -- which may also carry the partition and
        precombine fields. A key the table does not hold is counted in ``ignored``.

        A table with a precombine field keeps a stored row newer than the delete: give the
        deletes' precombine value(s) (``precombine=`` for all, or a column). A bucket-indexed
        partitioned table needs the partition (``partition=`` or a column); the other indexes
        find each key's partition themselves."""
        core = self._core()
        cfg = core.config
        assert cfg is not None
        view = core.view()
        rows = _delete_rows(keys, cfg=cfg, schema=view.schema, partition=partition, precombine=precombine)
        flag = "_delete"
        while flag in rows.column_names or (view.schema is not None and flag in view.schema.names):
            flag += "_"
        rows = rows.append_column(flag, pa.array([True] * rows.num_rows, pa.bool_()))
        return self._upsert(rows, options={**options, "delete_field": flag})

    def _upsert(self, source: Any, *, options: Mapping[str, Any]) -> WriteResult:
        from spark_jobs.engines import precheck_upsert, upsert

        bad = [k for k in options if k in _HANDLE_FIELDS or k not in _UPSERT_FIELDS]
        if bad:
            raise BadInputError(f"upsert got unknown option(s) {', '.join(sorted(bad))} "
                                f"(UpsertOptions fields: {', '.join(sorted(_UPSERT_FIELDS - set(_HANDLE_FIELDS)))})")
        with _storage(self.storage_options), batch_source(source) as (path, label):
            opts = UpsertOptions(table=self.uri, source=path, **options)
            try:
                precheck_upsert(opts)  # the CLI's: bad input is one line before any engine starts
                result = upsert(opts)
            except BadInputError as e:
                raise _relabel(e, path, label) from None
        return WriteResult.from_json(result)

    # -- the other verbs: the CLI's options objects, the CLI's functions --------------------------
    def _options(self, cls: type, options: Any, given: Mapping[str, Any]) -> Any:
        """``cls`` (a verb's options dataclass, the one the CLI builds from its flags) for this
        table: ``options`` as given (its ``table`` replaced by this handle's), or made from the
        keywords; either way checked by the dataclass itself (BadInputError, one line)."""
        if options is not None:
            if not isinstance(options, cls):
                raise BadInputError(f"expected {cls.__name__}, got {type(options).__name__}")
            if given:
                raise BadInputError(f"pass either a {cls.__name__} or keywords, not both ({', '.join(sorted(given))})")
            return dataclasses.replace(options, table=self.uri)
        names = {f.name for f in dataclasses.fields(cls) if f.init} - {"table"}
        unknown = sorted(set(given) - names)
        if unknown:
            raise BadInputError(f"{', '.join(unknown)}: not an option of {cls.__name__} "
                                f"(its options: {', '.join(sorted(names))})")
        return cls(table=self.uri, **given)

    def _run(self, verb: str, opts: Any) -> tuple[Any, str]:
        """``engines.run`` (the CLI's sizing, engine choice and fallback) under this handle's
        storage options; returns the verb's result and the engine that ran it."""
        from spark_jobs.engines import run
        from spark_jobs.table.action.engine import ARROW, SPARK

        used: list[bool] = []

        def spark() -> Any:
            used.append(True)
            return _local_spark()

        with _storage(self.storage_options):
            result = run(verb, opts, spark=spark)
        return result, SPARK if used else ARROW

    def validate(self, options: ValidateOptions | None = None, /, **kwargs: Any) -> ValidationReport:
        """Every check of ``bucketindex validate`` (:class:`ValidateOptions`: ``engine``,
        ``memory_budget``); the report's ``ok`` is False on a problem: no exception, as the
        CLI's exit 1 is a finding, not a failure."""
        report, engine = self._run("validate", self._options(ValidateOptions, options, kwargs))
        return ValidationReport(ok=bool(report["ok"]), problems=_frozen(report.get("problems")),
                                engine=engine, details=_frozen(report))

    def shadow_compare(self, options: ShadowCompareOptions | None = None, /, **kwargs: Any) -> ShadowCompareReport:
        """``bucketindex shadow-compare`` (:class:`ShadowCompareOptions`: ``against``, ``since``,
        ``sample_fraction``, ``max_mismatches``, ...): the index's answer for each key against
        the data."""
        report, engine = self._run("shadow-compare", self._options(ShadowCompareOptions, options, kwargs))
        return ShadowCompareReport(ok=bool(report["ok"]), mismatches=int(report.get("mismatches", 0)),
                                   keys_compared=report.get("keys_compared"), engine=engine,
                                   details=_frozen(report))

    def compact(self, options: CompactOptions | None = None, /, **kwargs: Any) -> CompactResult:
        """``bucketindex compact`` (:class:`CompactOptions`: ``min_logs``, ``min_deltas``,
        ``schedule_only``, ``execute``, ``engine``, ...): schedule and/or execute a compaction.
        ``rebuild_index`` is the CLI's ``compact --rebuild-index``."""
        opts = self._options(CompactOptions, options, kwargs)
        if opts.rebuild_index:
            from spark_jobs.arrow_engine.compact import run_rebuild_index

            with _storage(self.storage_options):
                r = run_rebuild_index(opts.table, buckets=opts.bucket, index_base_cap=opts.index_base_cap,
                                      heartbeat_timeout_s=opts.heartbeat_timeout_s)
            ran: str | None = "arrow"
        else:
            r, ran = self._run("compact", opts)
        eng = r.get("engine")
        if r.get("instant") is None:
            ran = None  # nothing was due: no engine ran
        return CompactResult(instant=r.get("instant"), scheduled=bool(r.get("scheduled")),
                             executed=bool(r.get("executed")), noop=bool(r.get("noop")),
                             counts=_frozen(r.get("counts")),
                             engine=eng.get("name") if isinstance(eng, dict) else (eng or ran),
                             total_ms=r.get("total_ms"), details=_frozen(r))

    def clean(self, options: CleanOptions | None = None, /, **kwargs: Any) -> CleanResult:
        """``bucketindex clean`` (:class:`CleanOptions`: ``retain_commits``, ``retain_hours``,
        ``dry_run``): delete file versions no retained snapshot reads."""
        from spark_jobs.table.action.clean import run_clean

        opts = self._options(CleanOptions, options, kwargs)
        with _storage(self.storage_options):
            r = run_clean(opts.table, retain_commits=opts.retain_commits, retain_hours=opts.retain_hours,
                          dry_run=opts.dry_run, heartbeat_timeout_s=opts.heartbeat_timeout_s)
        return CleanResult(instant=r.get("instant"), files=int(r.get("files") or 0), bytes=int(r.get("bytes") or 0),
                           earliest_retained=r.get("earliest_retained"), dry_run=bool(r.get("dry_run", opts.dry_run)),
                           details=_frozen(r))

    def rehash(self, num_buckets: int | None = None, /, options: RehashOptions | None = None,
               **kwargs: Any) -> RehashResult:
        """``bucketindex rehash`` (:class:`RehashOptions`): change the bucket count by a multiple
        or a divisor, on the engine ``auto`` sizes it for (in-process when it fits)."""
        if num_buckets is not None:
            kwargs["num_buckets"] = num_buckets
        r, _ = self._run("rehash", self._options(RehashOptions, options, kwargs))
        eng = r.get("engine")
        return RehashResult(instant=r.get("instant"), noop=bool(r.get("noop")),
                            previous_num_buckets=r.get("previous_num_buckets"),
                            num_buckets=int(r.get("num_buckets", num_buckets or 0)), counts=_frozen(r.get("counts")),
                            engine=eng.get("name") if isinstance(eng, dict) else eng, details=_frozen(r))

    def alter(self, options: AlterOptions | None = None, /, **kwargs: Any) -> AlterResult:
        """``bucketindex alter`` (:class:`AlterOptions`): add nullable columns or widen types
        (``{"name": "bigint"}`` or the CLI's ``"name:bigint"`` specs); no data file is rewritten."""
        from spark_jobs.table.action.alter import run_alter

        for name in ("add_columns", "widen_columns"):
            if name in kwargs:
                kwargs[name] = _specs(kwargs[name])
        opts = self._options(AlterOptions, options, kwargs)
        with _storage(self.storage_options):
            r = run_alter(opts.table, add_columns=opts.add_columns, widen_columns=opts.widen_columns,
                          max_retries=opts.max_retries, heartbeat_timeout_s=opts.heartbeat_timeout_s)
        return AlterResult(instant=r.get("instant"), noop=bool(r.get("noop")),
                           changes=tuple(r.get("changes") or ()), details=_frozen(r))

    def rollback(self, options: RollbackOptions | None = None, /, **kwargs: Any) -> RollbackResult:
        """``bucketindex rollback`` (:class:`RollbackOptions`: ``instant``, ``force``): roll
        back pending instants (every abandoned one, or ``instant``)."""
        opts = self._options(RollbackOptions, options, kwargs)
        with _storage(self.storage_options):
            done = rollback_pending(self._core(), opts.instant, force=opts.force, timeout_s=opts.heartbeat_timeout_s)
        return RollbackResult(rolled_back=tuple(done))

    def mirror(self, options: MirrorOptions | None = None, /, **kwargs: Any) -> MirrorResult:
        """``bucketindex mirror`` (:class:`MirrorOptions`): turn a projection on
        (``enable="delta"`` or ``"iceberg"``; ``view="fresh"``: the fresh view of a
        merge-on-read table, format.md §11-12) or check and repair every version of each
        projection the table has (``repair=True``; with both, the result is the Delta log's and
        ``details["projections"]`` holds each one's report)."""
        from spark_jobs.table import delta, projection
        from spark_jobs.table.config import MIRRORS

        opts = self._options(MirrorOptions, options, kwargs)
        with _storage(self.storage_options):
            if opts.enable is not None:
                from spark_jobs.table.action.mirror import enable_mirror

                writer = projection.module(opts.enable)
                before = set(writer.versions_present(self._core()))
                r = enable_mirror(self.uri, opts.enable, view=opts.view)
                written = sorted(set(writer.versions_present(self._core())) - before)
                return MirrorResult(version=int(r["version"]), written=tuple(written), details=_frozen(r))
            core = self._core()
            enabled = [m for m in MIRRORS if m in delta.mirrors(core)]
            if not enabled:
                raise BadInputError(f"the table {self.uri} has no projection; turn one on with "
                                    f"mirror(enable='delta') or mirror(enable='iceberg')")
            reports = {m: projection.module(m).verify_and_repair(core) for m in enabled}
        report = reports[enabled[0]]
        details = report.as_dict()
        if len(reports) > 1:
            details["projections"] = {m: r.as_dict() for m, r in reports.items()}
        return MirrorResult(version=report.version, written=tuple(report.written),
                            rewritten=tuple(report.rewritten), details=_frozen(details))


# -- the timeline, typed ----------------------------------------------------------------------
def schema_history(core: CoreTable, *, limit: int | None = None) -> list[HistoryEntry]:
    """The last ``limit`` completed entries (default all) of ``core``'s timeline, oldest first,
    each with the schema changes it made: the schema before an entry that records one is the
    snapshot's right before it (:meth:`FileSystemView.at_seq`, from the nearest checkpoint),
    so a short listing of a long history reads only what it shows."""
    from spark_jobs.table.schema import schema_changes
    from spark_jobs.table.view import FileSystemView, decode_schema

    tl = core.timeline.reload()
    instants = tl.recent(limit) if limit is not None else tl.completed()
    out = []
    previous: pa.Schema | None = None
    known = False  # whether ``previous`` is the schema right before the entry being read
    for inst in instants:
        meta = tl.read_commit(inst)
        seq = int(inst.seq or 0)
        changes: tuple[str, ...] = ()
        if meta.schema:
            if not known:
                previous = FileSystemView.at_seq(tl, seq - 1).schema if seq > 1 else None
            new = decode_schema(meta.schema)
            if previous is not None:
                changes = tuple(schema_changes(previous, new))
            previous, known = new, True
        elif not known and seq > 0:
            previous, known = FileSystemView.at_seq(tl, seq).schema, True
        engine = meta.engine.name if meta.engine is not None else None
        ignored = meta.get("ignored")
        done = tl.entry(seq).get("completed") if seq else None
        out.append(HistoryEntry(
            sequence=seq, instant=inst.timestamp, timestamp=_utc(inst.timestamp),
            completed=_utc(done) if isinstance(done, str) and done.isdigit() else None,
            action=inst.action, operation=meta.operation, batch_id=meta.batch_id, counts=_frozen(meta.counts),
            ignored=Ignored.from_json(ignored) if isinstance(ignored, Mapping) else None, engine=engine,
            timings_ms=_frozen(meta.timings_ms), schema_changes=changes, metadata=meta))
    return out


# -- helpers ----------------------------------------------------------------------------------
def _utc(instant: str) -> _dt.datetime:
    """An instant-form time (``20261125092400123``) as an aware UTC datetime."""
    return _dt.datetime.fromisoformat(instant_to_iso(instant).replace("Z", "+00:00"))


def _as_of(as_of: str | _dt.datetime | None) -> str | None:
    if isinstance(as_of, _dt.datetime):
        t = as_of if as_of.tzinfo is None else as_of.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        return t.isoformat()
    return as_of


def _specs(columns: Mapping[str, str] | Sequence[str]) -> list[str]:
    if isinstance(columns, Mapping):
        return [f"{name}:{typ}" for name, typ in columns.items()]
    if isinstance(columns, str):
        return [columns]
    return list(columns)


@contextlib.contextmanager
def _storage(options: Mapping[str, str] | None) -> Iterator[None]:
    """This handle's storage options as the process's run options for one call, then the
    previous ones back (the verbs resolve URIs with the run options, as under the CLI)."""
    if not options:
        yield
        return
    from spark_jobs.io import storage

    before = storage.configured() or None
    storage.configure(options)
    try:
        yield
    finally:
        storage.configure(before)


def _local_spark() -> Any:
    """A local Spark session for a verb that runs (or falls back to) Spark from Python."""
    from spark_jobs.jobs.session import get_spark

    return get_spark("local[*]", ui=False, datasource=False)


def _frame_module(obj: Any) -> str:
    return type(obj).__module__.split(".", 1)[0]


def to_arrow(source: Any) -> pa.Table | pa.RecordBatchReader | None:
    """An in-memory batch as Arrow (None: not one -- a path). pandas: without its index;
    Polars: ``to_arrow()``; anything with the Arrow C stream interface: its stream."""
    if isinstance(source, (pa.Table, pa.RecordBatchReader)):
        return source
    if isinstance(source, pa.RecordBatch):
        return pa.Table.from_batches([source])
    module = _frame_module(source)
    try:
        if module == "pandas":
            return pa.Table.from_pandas(source, preserve_index=False)
        if module == "polars":
            return source.to_arrow()
        if hasattr(source, "__arrow_c_stream__"):
            return pa.RecordBatchReader.from_stream(source)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise BadInputError(f"the {module} frame cannot be converted to Arrow: {' '.join(str(e).split())}") from e
    if isinstance(source, (str, os.PathLike)):
        return None
    raise BadInputError(f"cannot upsert a {type(source).__name__}: give a path or glob, a pyarrow.Table or "
                        f"RecordBatchReader, or a pandas or Polars DataFrame")


def _microseconds(t: pa.DataType) -> pa.DataType:
    """``t`` with nanosecond timestamps as microseconds (Spark's unit, and the table's)."""
    if pa.types.is_timestamp(t) and t.unit == "ns":
        return pa.timestamp("us", t.tz)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(t.value_field.with_type(_microseconds(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_microseconds(t.field(i).type)) for i in range(t.num_fields)])
    return t


@contextlib.contextmanager
def batch_source(source: Any) -> Iterator[tuple[str, str]]:
    """(path, label) of the batch: a path as given, an in-memory batch streamed to a temporary
    Parquet file removed afterwards (module doc). Public for the other callers that upsert an
    in-memory batch the same way (the Airflow provider's ``@task.bucketindex_upsert``).
    Nanosecond timestamps (pandas') are cast to microseconds -- safely: a value finer than a
    microsecond is bad input, not truncated."""
    data = to_arrow(source)
    if data is None:
        yield os.fspath(source), os.fspath(source)
        return
    import pyarrow.parquet as pq

    label = f"the {_frame_module(source) if _frame_module(source) in ('pandas', 'polars') else 'Arrow'} batch"
    reader = data if isinstance(data, pa.RecordBatchReader) else pa.RecordBatchReader.from_batches(
        data.schema, data.to_batches())
    target = pa.schema([f.with_type(_microseconds(f.type)) for f in reader.schema], metadata=None)
    folder = tempfile.mkdtemp(prefix="bucketindex-batch-")
    path = os.path.join(folder, "batch.parquet")
    try:
        with pq.ParquetWriter(path, target) as writer:
            for batch in reader:
                if not batch.schema.equals(target):
                    try:
                        batch = batch.cast(target)
                    except pa.ArrowInvalid as e:
                        raise BadInputError(f"{label} holds timestamps finer than a microsecond, which the table "
                                            f"cannot hold (Spark's unit); round them first: "
                                            f"{' '.join(str(e).split())}") from e
                writer.write_batch(batch)
        yield path, label
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _relabel(e: BadInputError, path: str, label: str) -> BadInputError:
    """The error with the temporary file's path replaced by what the caller gave."""
    if path == label or path not in str(e):
        return e
    try:
        new = type(e)(str(e).replace(path, label))
    except TypeError:
        return e
    new.__cause__ = e.__cause__
    return new


def _delete_rows(keys: Any, *, cfg: Any, schema: pa.Schema | None, partition: Any, precombine: Any) -> pa.Table:
    """The rows of a delete batch: the key fields (typed as the table's), the partition field
    and the precombine field (given or filled)."""
    fields = list(cfg.record_key_fields)
    data = to_arrow(keys) if not isinstance(keys, (list, tuple)) and not _is_iterable_of_scalars(keys) else None
    if isinstance(data, pa.RecordBatchReader):
        data = data.read_all()
    if data is None:
        items = list(keys)
        if items and all(isinstance(k, Mapping) for k in items):
            data = pa.Table.from_pylist([dict(k) for k in items])
        else:
            if len(fields) > 1:
                bad = [k for k in items if not isinstance(k, tuple) or len(k) != len(fields)]
                if bad:
                    raise BadInputError(f"the record key is {','.join(fields)}: give each key as a tuple of "
                                        f"{len(fields)} values, got {bad[0]!r}")
                cols = {f: [k[i] for k in items] for i, f in enumerate(fields)}
            else:
                cols = {fields[0]: items}
            data = pa.table({n: pa.array(v, type=_field_type(schema, n)) for n, v in cols.items()})
    if data.num_rows == 0:
        raise BadInputError("no keys to delete")
    missing = [f for f in fields if f not in data.column_names]
    if missing:
        raise BadInputError(f"the keys to delete lack the record key field(s) {', '.join(missing)} "
                            f"(columns: {', '.join(data.column_names)})")
    keep = fields + [c for c in (*cfg.partition_fields, cfg.precombine_field) if c and c in data.column_names]
    data = data.select(list(dict.fromkeys(keep)))
    for name, value, what in [(p, partition, "partition") for p in cfg.partition_fields] + \
            ([(cfg.precombine_field, precombine, "precombine")] if cfg.precombine_field else []):
        if name in data.column_names:
            continue
        if value is None and what == "precombine":
            raise BadInputError(f"the table keeps the row with the highest {name}: give the deletes' {name} "
                                f"(precombine=VALUE, or a {name} column), or a stored row newer than none "
                                f"would be kept")
        if value is None and cfg.index_type == "bucket":
            raise BadInputError(f"the bucket index finds a key within its partition: give the deletes' {name} "
                                f"(partition=VALUE, or a {name} column)")
        data = data.append_column(name, pa.array([value] * data.num_rows, type=_field_type(schema, name)))
    if schema is not None:  # the table's types: a key given as text where the column is an int is refused
        try:
            data = data.cast(pa.schema([f.with_type(_field_type(schema, f.name) or f.type) for f in data.schema]))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise BadInputError(f"the keys to delete do not fit the table's types: {' '.join(str(e).split())}") from e
    return data


def _is_iterable_of_scalars(keys: Any) -> bool:
    return isinstance(keys, (set, frozenset)) or (hasattr(keys, "__iter__") and _frame_module(keys) == "builtins"
                                                 and not isinstance(keys, (str, bytes)))


def _field_type(schema: pa.Schema | None, name: str) -> pa.DataType | None:
    if schema is None or name not in schema.names:
        return None
    return schema.field(name).type

