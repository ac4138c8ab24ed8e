"""The upsert action, engine-neutral: its options, its rules, and the driver every engine runs under.

An upsert routes every key of a batch through the index and writes data and index in one
commit. Its phases (each logged and timed into the commit metadata):

1. **validate** -- read the source; check key, precombine, partition and delete columns,
   null/empty keys, castability to the table schema, options against the table. Any
   problem raises :class:`BadInputError` before an instant exists or a byte is written.
2. **dedupe** -- one row per identity (the key; (partition, key) for the bucket index): the
   highest precombine value wins (nulls lowest); ties go to the greatest source row compared
   column by column, so the winner never depends on file or task order (format.md §8).
3. **tag** -- find each key's current file group: ``record`` looks up the index buckets the
   keys hash to; ``bucket`` computes ``hash % N`` (no read); ``global_simple`` joins against
   the keys of every live data file (the baseline).
4. **write** -- per affected file group: copy-on-write merges its current file with its
   updates, inserts and deletes into a new Parquet file; merge-on-read appends a log. Rows
   entering a partition (new keys, keys moving in) fill the partition's small file groups up
   to the target, then new ones (:func:`plan_new_file_groups`).
5. **index** -- ``record`` only: one sorted delta per touched index bucket.
6. **commit** -- the :class:`~spark_jobs.table.action.Transaction` checks every commit
   completed since the snapshot and claims the next commit-sequence slot. On a conflict the
   batch is re-tagged and re-written on the new snapshot, up to ``max_retries`` times.

Semantics: ``record`` and ``global_simple`` are *global* -- a key lives in one partition, and
a key whose partition value changes moves there (unless the stored row's precombine value is
higher: a stale move is dropped). ``bucket`` is *per partition*. Across batches the stored
row is replaced only when the incoming precombine value is not lower; without a precombine
field the newest batch wins. A delete of a key that does not exist is a no-op.

**Decided without writing** (format.md §4.5). Two kinds of batch rows write nothing: a delete
of a key the snapshot does not hold (dropped when routed; for the bucket index, by the merge
of its group) and a row dropped as stale against its stored row (a stale move when routed,
any other in its group's merge). Both are decisions on the snapshot that a concurrent write
of the key overturns, so the commit records them (``reads``, :func:`read_set`) and the
conflict check compares them with later commits. The engines report such rows as
``(key, partition, file id)`` -- the group holding the stored row or the group the key routes
to, ``(None, None)`` for a delete routed nowhere: the merge tasks (``spark_jobs.kernels.tasks``,
shared) emit ``read`` rows for their groups; the routing of each engine adds absent deletes
and stale moves.

This module holds what both engines must agree on: the options, how they resolve against the
table, the column rules, the file-group plan for entering rows, what a commit records, and
the driver (:func:`run`) that owns the phases, idempotence by batch id, table creation, the
repair of abandoned instants and the retries. An engine (:class:`UpsertEngine`: Spark in
:mod:`spark_jobs.jobs.upsert`, Arrow in :mod:`spark_jobs.arrow_engine.upsert`) only executes
the validate/dedupe and tag/route/write phases; the equivalence tests hold the two to the same
snapshots and the same routing.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from spark_jobs.exceptions import BadInputError, ConfigConflictError
from spark_jobs.io.storage import redact_uri
from spark_jobs.table.action.options import (
    CSV,
    POSITIONAL,
    SWITCH,
    VerbOptions,
    check_choice,
    check_engine,
    check_heartbeat_timeout,
    check_max_retries,
    option,
)
from spark_jobs.table.action.compact import (
    DEFAULT_AUTO_MAX_BUCKETS,
    DEFAULT_AUTO_MAX_BYTES,
    DEFAULT_AUTO_MAX_GROUPS,
    AutoCompaction,
    Pick,
    auto_compact,
)
from spark_jobs.table.action.engine import parse_size
from spark_jobs.table.action.transaction import Transaction
from spark_jobs.table.commit import EngineInfo, FileGroupChange, IndexFileChange, LogChange, ReadSet, Written
from spark_jobs.table.config import (
    DEFAULT_NUM_BUCKETS,
    EVOLVING_FORMAT_VERSION,
    INDEX_BUCKET,
    INDEX_GLOBAL_SIMPLE,
    INDEX_RECORD,
    INDEX_TYPES,
    MERGE_ON_READ,
    MIRRORS,
    TABLE_TYPES,
    TableConfig,
    check_field_names,
    new_auto_compact,
    new_table_type,
    table_mirrors,
)
from spark_jobs.table.schema import parse_schema_evolution, refuse_missing_fields
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import FileSystemView, encode_schema
from spark_jobs.table.faults import maybe_crash
from spark_jobs.text import plural

if TYPE_CHECKING:
    from spark_jobs.table.action.engine import EngineChoice
    from spark_jobs.table.table import Table

__all__ = [
    "UpsertOptions",
    "SOURCE_FORMATS",
    "UpsertEngine",
    "PreparedBatch",
    "Attempt",
    "Phases",
    "resolve_config",
    "check_shadow_index",
    "check_source_columns",
    "plan_new_file_groups",
    "new_file_id",
    "file_group_entry",
    "attempt_written",
    "run",
    "SHADOW_INDEXES",
    "TEE_KINDS",
    "READ",
    "read_set",
    "needs_read_files",
]

log = logging.getLogger("bucketindex.upsert")

#: the columns an engine's batch carries besides the user's (data files store KEY only)
KEY, DEL, PART = "_bi_key", "_bi_del", "_bi_part"
OLD_PART, OLD_FID = "_bi_old_part", "_bi_old_fid"
TPART, TFID = "_bi_tpart", "_bi_tfid"
#: routing operations (``spark_jobs.kernels.tasks``): a log stores its own op
OP, FOUND = "_bi_op", "_bi_found"
UPSERT, DELETE, MOVE_IN, MOVE_OUT = "upsert", "delete", "move_in", "move_out"
#: what a tee records, in shadow-compare's words (a batch has one row per key: nothing is duplicated)
SHADOW_INDEXES = (INDEX_GLOBAL_SIMPLE, INDEX_BUCKET)
TEE_KINDS = ("missing", "extra", "wrong_location")
#: the salt of the hash that spreads a partition's entering rows over its planned file groups
#: (independent of the index bucket, so file groups do not follow buckets): both engines compute
#: ``pmod(xxhash64(key, FILE_GROUP_SALT), rows entering the partition)``
FILE_GROUP_SALT = "file-group"
#: the delete field's accepted types (Spark's simple names); null reads as "not a delete"
DELETE_FIELD_TYPES = ("boolean", "string", "int", "bigint", "smallint", "tinyint")


def not_a_delete_flag(delete_field: str, value: Any) -> BadInputError:
    """The refusal of a string delete-field value that is not a boolean as Spark casts one
    (``true/t/yes/y/1``, ``false/f/no/n/0``, any case, trimmed): both engines name the smallest
    such value of the batch, so they give the same line whatever the row order."""
    return BadInputError(f"delete field {delete_field!r} holds {value!r}, which is not a boolean "
                         f"(true/false, t/f, yes/no, y/n, 1/0)")


#: ``--auto-compact``'s values
AUTO_COMPACT_CHOICES = ("on", "off")
#: how ``--source-format`` reads a batch (the engines' own lists, ``jobs.source`` and ``arrow_engine.source``)
SOURCE_FORMATS = ("parquet", "json", "csv")


@dataclass(frozen=True, kw_only=True)
class UpsertOptions(VerbOptions):
    """The options of ``bucketindex upsert`` (and of an upsert from the Airflow operator or the
    Python API), validated once when made: a bad value is one line, exit 2, before a JVM starts.
    :meth:`to_argv` / :meth:`from_args` are the CLI's form (:mod:`.options`)."""

    VERB = "upsert"

    table: str = option(form=POSITIONAL)
    source: str = option(form=POSITIONAL)
    #: the key field(s); None: the table's (``table.json``), needed only to create a table
    record_key: list[str] | None = option("--record-key", form=CSV, default=None)
    precombine_field: str | None = option("--precombine-field", default=None)
    partition_field: str | None = option("--partition-field", default=None)
    index: str | None = option("--index", default=None)
    num_buckets: int | None = option("--num-buckets", default=None)
    #: copy_on_write | merge_on_read, fixed at creation (default merge_on_read, copy_on_write with
    #: ``--mirror``: :func:`spark_jobs.table.config.new_table_type`)
    table_type: str | None = option("--table-type", default=None)
    source_format: str = option("--source-format", default="parquet")
    delete_field: str | None = option("--delete-field", default=None)
    batch_id: str | None = option("--batch-id", default=None)
    target_file_rows: int | None = option("--target-file-rows", default=None)
    #: how often a conflicting commit is re-tagged and re-written on the new snapshot
    max_retries: int = option("--max-retries", default=3)
    #: a pending instant whose heartbeat is older than this is abandoned (default: heartbeat.TIMEOUT_S)
    heartbeat_timeout_s: float | None = option("--heartbeat-timeout", default=None)
    #: tee: also tag the batch with this index (global_simple | bucket) and record disagreements
    shadow_index: str | None = option("--shadow-index", default=None)
    #: the batch as an engine's frame, read by the caller (a rewrite bootstrap reads its dataset
    #: with pyarrow, whose Hive partition values Spark would decode differently); ``source``
    #: then only names it. Spark: a DataFrame.
    source_df: Any = None
    #: the timeline action and operation the commit records (a rewrite bootstrap: ``bootstrap``)
    action: str = Action.COMMIT
    operation: str = "upsert"
    #: more commit metadata (a bootstrap's ``bootstrap`` summary)
    extra_metadata: dict[str, Any] = field(default_factory=dict)
    #: auto | spark | arrow (``spark_jobs.table.action.engine``); None means auto
    engine: str | None = option("--engine", default=None)
    #: the in-process engine's memory budget (``4g``); default derived from the machine
    memory_budget: str | None = option("--memory-budget", default=None)
    #: ``--schema-evolution``: none (default) | add-columns | widen | all, or a comma list
    #: (``spark_jobs.table.schema.evolve``: what a batch may change of the table's schema)
    schema_evolution: str | None = option("--schema-evolution", default=None)
    #: ``--partial-update``: the batch may lack table columns; updated rows keep their stored
    #: values of those, inserted rows get nulls (format.md §8)
    partial_update: bool = option("--partial-update", form=SWITCH, default=False)
    #: ``--mirror delta``: a projection written beside each commit, fixed at creation
    #: (``bucketindex mirror --enable`` turns it on later; ``spark_jobs.table.delta``)
    mirror: str | None = option("--mirror", default=None)
    #: ``--auto-compact on|off``: after the commit, compact the due file groups the upsert touched
    #: (merge-on-read, either engine; :func:`spark_jobs.table.action.compact.auto_compact`). None:
    #: the table's setting (``table.json``'s ``auto_compact``, recorded when the upsert that
    #: creates the table gives the flag; absent: off); given later, it decides for this run only
    auto_compact: str | None = option("--auto-compact", default=None)
    #: its bounds per upsert (None: ``compact.DEFAULT_AUTO_MAX_GROUPS`` / ``DEFAULT_AUTO_MAX_BYTES``)
    auto_compact_max_groups: int | None = option("--auto-compact-max-groups", default=None)
    #: a size: ``512m``, ``2g``, bytes
    auto_compact_max_bytes: str | None = option("--auto-compact-max-bytes", default=None)
    #: record-index buckets folded per upsert (None: ``compact.DEFAULT_AUTO_MAX_BUCKETS``)
    auto_compact_max_buckets: int | None = option("--auto-compact-max-buckets", default=None)
    #: set by the driver, not by users: columns added to the table by a concurrent commit after
    #: the batch was first validated. Validated again on the new schema, the batch may lack them;
    #: its rows hold null there, as rows written before the column existed read it
    absent_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # checked when the options are made: before a JVM starts (the CLI makes them first, the
        # operator before it submits) and before any file is written
        if self.record_key is not None and not [k for k in self.record_key if k]:
            raise BadInputError("--record-key gives an empty field name (omit the option to use the table's key)")
        check_field_names(record_key=list(self.record_key or []), partition_field=self.partition_field,
                          precombine_field=self.precombine_field, delete_field=self.delete_field)
        check_choice("--index", self.index, INDEX_TYPES)
        check_choice("--table-type", self.table_type, TABLE_TYPES)
        check_choice("--source-format", self.source_format, SOURCE_FORMATS)
        # "record" passes here: on a record-index table the table's own check says why it is refused
        # (the tee would compare the index with itself), elsewhere that it is not a shadow index
        if self.shadow_index != INDEX_RECORD:
            check_choice("--shadow-index", self.shadow_index, SHADOW_INDEXES)
        check_choice("--mirror", self.mirror, MIRRORS)
        if self.num_buckets is not None and self.num_buckets < 1:
            raise BadInputError(f"--num-buckets must be at least 1, got {self.num_buckets}")
        if self.target_file_rows is not None and self.target_file_rows < 1:
            raise BadInputError(f"--target-file-rows must be at least 1, got {self.target_file_rows}")
        check_max_retries(self.max_retries)
        check_heartbeat_timeout(self.heartbeat_timeout_s)
        check_engine(self.engine, self.memory_budget)
        parse_schema_evolution(self.schema_evolution)  # a bad value: one line, exit 2, before anything runs
        check_choice("--auto-compact", self.auto_compact, AUTO_COMPACT_CHOICES)
        if self.auto_compact == "off" and (self.auto_compact_max_groups is not None
                                           or self.auto_compact_max_bytes is not None
                                           or self.auto_compact_max_buckets is not None):
            raise BadInputError("--auto-compact-max-groups, --auto-compact-max-buckets and --auto-compact-max-bytes "
                                "bound the automatic compaction that --auto-compact off turns off: give one or "
                                "the other")
        self.auto_compaction  # noqa: B018 - the bounds' own checks, once

    @property
    def auto_compaction(self) -> AutoCompaction:
        """The bounds of this upsert's automatic compaction (the defaults for values not given)."""
        max_bytes = DEFAULT_AUTO_MAX_BYTES
        if self.auto_compact_max_bytes is not None:
            try:
                max_bytes = parse_size(str(self.auto_compact_max_bytes))
            except BadInputError:
                raise BadInputError(f"--auto-compact-max-bytes takes a size like 512m or 2g, got "
                                    f"{self.auto_compact_max_bytes!r}") from None
        return AutoCompaction(
            max_groups=DEFAULT_AUTO_MAX_GROUPS if self.auto_compact_max_groups is None else self.auto_compact_max_groups,
            max_bytes=max_bytes,
            max_buckets=(DEFAULT_AUTO_MAX_BUCKETS if self.auto_compact_max_buckets is None
                         else self.auto_compact_max_buckets))

    def auto_compacts(self, cfg: TableConfig) -> bool:
        """Whether this upsert compacts after its commit on a table with ``cfg``: ``--auto-compact``
        when given, else the table's setting (merge-on-read only)."""
        if not cfg.merge_on_read:
            return False
        if self.auto_compact is not None:
            return self.auto_compact == "on"
        return bool(cfg.auto_compact)

    @property
    def evolution_modes(self) -> frozenset[str]:
        """What the batch may change of the table's schema (``schema.parse_schema_evolution``)."""
        return parse_schema_evolution(self.schema_evolution)


class Phases:
    """Timings of the phases, logged as they end."""

    def __init__(self) -> None:
        self.timings: dict[str, int] = {}
        self._t = time.perf_counter()
        self._deferred: list[tuple[str, str]] = []

    def note(self, line: str) -> None:
        """A line logged with the next phase that is not deferred (or never, if the batch is bad)."""
        self._deferred.append(("", line))

    def done(self, name: str, detail: str = "", *, defer: bool = False) -> None:
        """Record a phase; ``defer`` holds its log line back until the next phase (a batch
        that turns out bad must print exactly one line: the error)."""
        now = time.perf_counter()
        self.timings[f"{name}_ms"] = int((now - self._t) * 1000)
        self._t = now
        self._deferred.append((name, detail))
        if not defer:
            for n, d in self._deferred:
                if n:
                    log.info("phase %-8s %6d ms %s", n, self.timings[f"{n}_ms"], d)
                else:
                    log.info("%s", d)
            self._deferred.clear()


@dataclass
class PreparedBatch:
    """A validated, deduplicated batch in an engine's own form (``frame``)."""

    frame: Any
    #: identities in the batch (one row each after dedupe)
    n: int
    #: of which upserts (not deletes)
    upserts: int
    #: the data files' schema: the table's, or the batch's for a new table (user columns + KEY)
    data_schema: pa.Schema
    #: rows read from the source, before dedupe (the commit's ``rows_in_batch``; ``n`` is its
    #: ``keys_in_batch``); None: not counted, taken as ``n``
    rows: int | None = None
    #: ``--partial-update``: the user columns the batch carries (``schema.carried_columns``);
    #: None: every column (the frame holds the others as nulls, which the write does not apply)
    carried: list[str] | None = None
    #: the table's data schema the batch was validated against (None: a new table). When the
    #: snapshot a write attempt runs on has another (a concurrent alter, an evolving upsert, a
    #: table created meanwhile), the driver validates the batch again on it
    base_schema: pa.Schema | None = None


@dataclass
class Attempt:
    """What one write attempt on one snapshot needs."""

    table: "Table"
    cfg: TableConfig
    view: FileSystemView
    num_buckets: int
    batch: PreparedBatch
    instant: str
    phases: Phases
    #: the sequence position the writer planned on (a rollback of the instant decides after it)
    planned_seq: int
    shadow_index: str | None
    #: the batch's id (new file ids derive from it: :func:`new_file_id`)
    batch_id: str = ""
    #: 1 for the first attempt, then one more per conflict: names the attempt's files
    number: int = 1


class UpsertEngine(Protocol):
    """What an engine executes of an upsert; the rules and the protocol are :func:`run`'s."""

    name: str

    def prepare(self, opts: UpsertOptions, cfg: TableConfig, view: FileSystemView | None,
                phases: Phases) -> PreparedBatch:
        """Read, validate and deduplicate the batch (phases ``validate`` and ``dedupe``);
        BadInputError before anything is written."""

    def write(self, attempt: Attempt) -> Written:
        """Tag, route, merge and index one attempt; returns the commit's write set and counts
        (:func:`attempt_written`: file groups, index deltas, counts, bucket count, reads and,
        with a tee, ``shadow``), typed, so no engine builds commit metadata."""

    def release(self, batch: PreparedBatch | None) -> None:
        """Free what :meth:`prepare` holds (a cached DataFrame)."""

    def session_start_ms(self) -> int | None:
        """JVM and session start, apart from the phases (None: no session)."""


def resolve_config(opts: UpsertOptions, table: "Table") -> tuple[TableConfig, FileSystemView | None]:
    """The table's configuration this write runs under, and its snapshot (None for a new table).

    A new table takes the options (defaults for the rest; a record key is required); an
    existing one fixes its key, partition field, precombine field, index, table type and bucket
    count, so an option left out means the table's and one given must not contradict it
    (ConfigConflictError, exit 2). Needs only metadata: :func:`spark_jobs.engines.precheck_upsert`
    calls it before any engine (or JVM) starts, and :func:`run` again on the snapshot it writes
    on, so the pre-check and the driver cannot disagree.
    """
    existing = table.config
    if existing is None and not opts.record_key:
        raise BadInputError(f"--record-key is required: the table {opts.table} does not exist yet and its first "
                            f"upsert fixes the key (later upserts read it from the table)")
    explicit = {"record_key_fields"} if opts.record_key else set()
    if opts.index:
        explicit.add("index_type")
    if opts.partition_field is not None:
        explicit.add("partition_fields")
    if opts.precombine_field is not None:
        explicit.add("precombine_field")
    if opts.table_type:
        explicit.add("table_type")
    index = opts.index or (existing.index_type if existing else INDEX_RECORD)
    mirrors_asked = [opts.mirror] if opts.mirror else []
    table_type = existing.table_type if existing and not opts.table_type else new_table_type(
        table_type=opts.table_type, mirrors=mirrors_asked)
    cfg = TableConfig(
        record_key_fields=list(opts.record_key) if opts.record_key else list(existing.record_key_fields),
        index_type=index,
        num_buckets=opts.num_buckets or (existing.num_buckets if existing else DEFAULT_NUM_BUCKETS[index]),
        partition_fields=[opts.partition_field] if opts.partition_field else (
            existing.partition_fields if existing else []),
        precombine_field=opts.precombine_field if opts.precombine_field is not None else (
            existing.precombine_field if existing else None),
        target_file_rows=opts.target_file_rows or (
            existing.target_file_rows if existing else TableConfig.target_file_rows),
        table_type=table_type,
        mirrors=mirrors_asked,
        # a new merge-on-read table records on unless --auto-compact off; an existing one keeps its own
        auto_compact=new_auto_compact(table_type=table_type, auto_compact=opts.auto_compact),
    )
    view = None
    if existing is not None:
        view = table.view()
        if opts.mirror and opts.mirror not in table_mirrors(table, view.properties):
            raise ConfigConflictError(f"--mirror {opts.mirror} is set when a table is created; turn it on for this "
                                      f"table with `bucketindex mirror {opts.table} --enable {opts.mirror}`")
        existing.check_compatible(cfg, explicit=explicit)
        in_force = table.num_buckets(view)
        if opts.num_buckets and opts.num_buckets != in_force:
            raise ConfigConflictError(
                f"--num-buckets {opts.num_buckets} contradicts the table's {in_force} buckets; "
                f"change it with `bucketindex rehash` instead"
            )
        cfg = existing
    check_shadow_index(cfg.index_type, opts.shadow_index)
    if opts.auto_compact == "on" and not cfg.merge_on_read:
        raise BadInputError(f"--auto-compact on compacts a merge-on-read table's logs; {opts.table} is "
                            f"{cfg.table_type} and writes none")
    return cfg, view


def check_shadow_index(index_type: str, shadow_index: str | None) -> None:
    """BadInputError (one line, exit 2) for a ``--shadow-index`` that makes no sense for the table."""
    if shadow_index is None:
        return
    if shadow_index == index_type:
        raise BadInputError(f"--shadow-index {shadow_index} on a {index_type}-index table compares the index "
                            f"with itself; use the other index type")
    if shadow_index not in SHADOW_INDEXES:
        raise BadInputError(f"--shadow-index must be one of {', '.join(SHADOW_INDEXES)}, got {shadow_index!r}")
    if (index_type, shadow_index) == (INDEX_GLOBAL_SIMPLE, INDEX_BUCKET):
        raise BadInputError("--shadow-index bucket needs hash-bucketed file groups; a global_simple table has none")


def check_source_columns(*, cfg: TableConfig, delete_field: str | None, columns: list[str],
                         delete_type: str | None) -> list[str]:
    """The batch's column rules that need no row: the named fields exist, no reserved name, a
    delete field of a readable type (``delete_type``: its Spark simple name). Returns the data
    columns (the source's, without the delete field)."""
    refuse_missing_fields(columns=columns, record_key=cfg.record_key_fields, partition_fields=cfg.partition_fields,
                          precombine_field=cfg.precombine_field)
    if delete_field and delete_field not in columns:
        raise BadInputError(f"delete field {delete_field!r} is not in the source (columns: {', '.join(columns)})")
    data_cols = [c for c in columns if c != delete_field]
    if any(c.startswith("_bi_") for c in data_cols):
        raise BadInputError("source columns may not start with '_bi_' (reserved for bucketindex)")
    if delete_field and delete_type not in DELETE_FIELD_TYPES:
        raise BadInputError(f"delete field {delete_field!r} must be a boolean, an integer or a string "
                            f"(true/false, yes/no, 1/0), got {delete_type}")
    return data_cols


def check_schema(view: FileSystemView, batch: PreparedBatch) -> bool:
    """Whether ``batch`` was validated against the schema of ``view`` (the snapshot a write
    attempt runs on). False when the schema changed since -- a concurrent ``alter`` or
    evolving upsert committed, or another writer created the table: the driver then validates
    the batch again on the new snapshot, so it is cast to (and evolves from) the schema in force."""
    if view.schema is None:
        return True
    seen = batch.base_schema if batch.base_schema is not None else batch.data_schema
    return view.schema.equals(seen)


#: one planned file-group range for rows entering a partition:
#: (partition, file id, first slot, end slot, rows entering the partition)
GroupRange = tuple[str, str, int, int, int]


def plan_new_file_groups(cfg: TableConfig, view: FileSystemView, counts: dict[str, int], *,
                         batch_id: str) -> list[GroupRange]:
    """Where rows entering each partition go: fill small groups up to the target, then new ones.

    Each partition's ``n`` entering rows are spread over slots ``0..n-1`` by
    ``pmod(xxhash64(key, FILE_GROUP_SALT), n)`` and every planned file group takes a range of
    slots. A hash rather than a row number: numbering rows needs a sort of every insert (10M
    rows into a new unpartitioned table ran out of memory on Spark). Group sizes are then the
    target give or take a fraction of a percent.

    ``counts`` (rows entering each partition) come from the tag phase; they may overcount (a
    stale mover dropped later), which only leaves part of a planned range unused. New file
    ids are derived (:func:`new_file_id`), so the plan is a function of the snapshot and the
    batch: both engines, and a retry on the same snapshot, plan the same groups.
    """
    target = cfg.target_file_rows
    ranges: list[GroupRange] = []
    for part, n in sorted(counts.items()):
        start = 0
        for s in sorted(view.slices(part), key=lambda s: (s.num_rows, s.file_id)):
            if start >= n:
                break
            room = target - s.num_rows
            if room > 0:
                ranges.append((part, s.file_id, start, start + room, n))
                start += room
        ordinal = 0
        while start < n:
            ranges.append((part, new_file_id(batch_id=batch_id, snapshot_seq=view.seq, partition=part,
                                             ordinal=ordinal), start, start + target, n))
            start += target
            ordinal += 1
    return ranges


#: the namespace of derived file ids (any fixed UUID: it only separates them from other uuid5s)
_FILE_ID_NAMESPACE = uuid.UUID("5b0c6f3e-8d1f-4b2a-9a57-3f1e2d4c6b80")


def new_file_id(*, batch_id: str, snapshot_seq: int, partition: str, ordinal: int) -> str:
    """The id of a new file group an upsert opens: 32 hex digits, a name-based UUID of the batch,
    the snapshot it was planned on, the partition and the group's ordinal there. Unique as long
    as (batch id, snapshot) is: a batch id commits once, and any later snapshot has another
    sequence number, so a batch id reapplied after its commit was archived still gets new ids."""
    return uuid.uuid5(_FILE_ID_NAMESPACE, f"{batch_id}\x00{snapshot_seq}\x00{partition}\x00{ordinal}").hex


def file_group_entry(f: dict[str, Any]) -> FileGroupChange:
    """The commit's entry of one merge task's output (format.md §3.3)."""
    if f["log"]:
        return FileGroupChange(partition=f["part"], file_id=f["fid"], row_delta=f["row_delta"],
                               log=LogChange(path=f["path"], num_rows=f["num_rows"], size=f["size"]))
    return FileGroupChange(partition=f["part"], file_id=f["fid"], path=f["path"], num_rows=f["num_rows"],
                           size=f["size"], removed=f["path"] is None)


def attempt_written(*, files: Iterable[dict[str, Any]], index_deltas: Iterable[dict[str, Any]],
                    counts: dict[str, int], num_buckets: int, shadow: dict[str, Any] | None,
                    reads: ReadSet | None) -> Written:
    """What one attempt of either engine reports (:meth:`UpsertEngine.write`), from its merge
    tasks' file rows (``tasks._merge_schema``'s ``kind == "file"``), the index deltas it wrote
    (``tasks.write_index_delta``'s rows), its counts, the bucket count it wrote under, the tee's
    report and its :func:`read_set`. One builder, so the engines cannot record a write set
    differently; a file row of a log task that wrote nothing is not a change."""
    return Written(
        file_groups=tuple(file_group_entry(f) for f in files if f["path"] or not f["log"]),
        index_added=tuple(IndexFileChange(bucket=r["bucket"], path=r["path"], entries=r["entries"], size=r["size"],
                                          kind="delta") for r in index_deltas),
        index_removed=(), counts=counts, num_buckets=num_buckets, shadow=shadow, reads=reads)


#: a merge task's output row of a batch row decided without writing (``tasks._read_rows``)
READ = "read"


def read_set(*, index_type: str, groups: Iterable[tuple[str | None, str | None]],
             read_files: list[dict[str, Any]]) -> ReadSet | None:
    """The commit's ``reads`` (``commit.ReadSet``) from the rows an attempt decided without
    writing: ``groups`` -- each such row's (partition, file id), (None, None) for a delete of a
    key absent from the snapshot routed to no group; ``read_files`` -- record index: the ``read``
    files (``tasks.write_index_reads``) of their keys, one per index bucket. What is recorded is
    the finest thing the index type can compare with a concurrent commit's write set: keys
    (record), the file groups a key can only live in (bucket), the groups holding the stored
    rows and whether absent keys were deleted (global_simple, which knows no keys of others).
    Returns None when nothing was decided (``reads`` absent)."""
    if index_type == INDEX_RECORD:
        files = tuple(IndexFileChange(bucket=int(f["bucket"]), path=f["path"], entries=int(f["entries"]),
                                      size=int(f["size"]), kind=READ)
                      for f in sorted(read_files, key=lambda f: int(f["bucket"])))
        return ReadSet(index=files) if files else None
    seen = set(groups)
    held = frozenset((p, f) for p, f in seen if p is not None and f is not None)
    absent = index_type == INDEX_GLOBAL_SIMPLE and any(f is None for _, f in seen)
    return ReadSet(groups=held, absent_keys=absent) if held or absent else None


def needs_read_files(index_type: str) -> bool:
    """Whether an attempt writes ``read`` index files of its decided keys (the record index)."""
    return index_type == INDEX_RECORD


def run(engine: UpsertEngine, opts: UpsertOptions, *, choice: "EngineChoice | None" = None,
        announce: bool = True, compact: Pick | None = None) -> dict[str, Any]:
    """Upsert one batch with ``engine``; returns the instant, counts and timings.

    ``choice`` is recorded in the commit and, with ``announce``, logged with the first phase;
    a caller that has logged the choice itself (a bootstrap's rewrite, an Airflow task) passes
    ``announce=False`` so the choice is logged once.

    ``compact``: the engine's :data:`~spark_jobs.table.action.compact.Pick` that folds an
    automatic compaction's plan after the commit, when the upsert auto-compacts
    (:meth:`UpsertOptions.auto_compacts`): each engine passes its own (the upsert's process or
    Spark session writes the new bases); None leaves compaction to ``bucketindex compact``.
    The result then holds ``auto_compaction`` (its summary).

    Raises BadInputError on bad input (nothing written), ConflictError when concurrent
    commits kept conflicting, InstantRolledBackError when a forced rollback aborted it.
    """
    from spark_jobs.table.table import Table

    phases = Phases()
    if choice is not None and announce:
        phases.note(f"engine: {choice.engine} ({choice.reason})")
    started = time.perf_counter()
    table = Table.open(opts.table)
    cfg, view = resolve_config(opts, table)
    batch_id = opts.batch_id
    if not batch_id:  # derived from the table, the source's files and the options: a rerun is a no-op
        from spark_jobs.table.action.batch_id import default_batch_id

        batch_id = default_batch_id(opts)
        phases.note(f"batch id {batch_id} (derived from the source's files and the options; --batch-id to name it)")
    if table.config is not None:
        done = table.commit_for_batch(batch_id)
        if done is not None:
            log.info("batch %s is already committed as instant %s: nothing to do", batch_id, done.timestamp)
            # a writer killed past its commit point left markers and a heartbeat: the rerun repairs
            from spark_jobs.table.action.rollback import repair

            repair(table)
            return _noop_result(table, done, batch_id)
    batches = [engine.prepare(opts, cfg, view, phases)]  # one more per re-validation (check_schema)
    try:
        return _commit(engine, opts, table, cfg, view, batches, batch_id, phases, started, choice, compact)
    finally:
        engine.release(batches[-1])


def _commit(engine: UpsertEngine, opts: UpsertOptions, table: "Table", cfg: TableConfig,
            view: FileSystemView | None, batches: list[PreparedBatch], batch_id: str, phases: Phases,
            started: float, choice: "EngineChoice | None", compact: Pick | None = None) -> dict[str, Any]:
    if table.config is None:
        cfg = table.create(cfg)
        log.info("created table %s (%s index, %s, %s%s%s)", redact_uri(opts.table), cfg.index_type,
                 plural(cfg.num_buckets, "bucket"), cfg.table_type, "" if opts.table_type else " by default",
                 ", automatic compaction on" if cfg.auto_compact else "")
    # the source as it may be shown: every reader of the timeline reads the plan (nothing reads the
    # source back from it; a retry or a rerun is given the source again, and the batch id is derived
    # from the source's listing, not from this text)
    plan = {"batch_id": batch_id, "operation": opts.operation, "source": redact_uri(opts.source),
            "index_type": cfg.index_type,
            "num_buckets": table.num_buckets(view)}
    # abandoned instants are rolled back first (live writers go on)
    txn = Transaction(table, opts.action, plan, view=view, repair=True,
                      heartbeat_timeout_s=opts.heartbeat_timeout_s).begin()
    ts = txn.ts
    assert txn.view is not None
    planned_seq = txn.view.seq  # a rollback of this instant can only decide after this position
    log.info("instant %s: upserting %s into %s (snapshot at commit %d)", ts, redact_uri(opts.source),
             redact_uri(opts.table), planned_seq)

    def attempt(view: FileSystemView, retries: list[dict[str, Any]]) -> Written:
        batch = batches[-1]
        if not check_schema(view, batch):
            log.info("instant %s: the table's schema changed since the batch was validated; validating it again", ts)
            engine.release(batch)
            first = batches[0]
            # columns a concurrent commit added since: the batch cannot have known them (a batch
            # for a table created meanwhile gets no such allowance: it is validated as it is)
            since = [] if first.base_schema is None else [
                n for n in view.schema.names if n not in first.data_schema.names]
            batch = engine.prepare(replace(opts, absent_columns=tuple(since)), cfg, view, phases)
            batches.append(batch)
        evolves = view.schema is not None and not view.schema.equals(batch.data_schema)
        if evolves or (batch.carried is not None and cfg.merge_on_read):
            # before any file is written: a release that cannot read them refuses the table instead
            table.require_format(EVOLVING_FORMAT_VERSION, why="a schema change" if evolves else "a partial log")
        num_buckets = table.num_buckets(view)
        written = engine.write(Attempt(table=table, cfg=cfg, view=view, num_buckets=num_buckets, batch=batch,
                                      instant=ts, phases=phases, planned_seq=planned_seq,
                                      shadow_index=opts.shadow_index, batch_id=batch_id,
                                      number=len(retries) + 1))
        # the engine's typed report (file groups, index deltas, counts, reads, shadow), and what
        # the caller records beside it (a rewrite bootstrap's summary; the engine's fields win)
        if opts.extra_metadata:
            written = _beside(Written.from_json(opts.extra_metadata), written)
        # the batch's size, set here once so both engines report the same figures: rows read
        # (in-batch duplicates included) and distinct identities after dedupe
        counts = {**(written.counts or {}), "rows_in_batch": batch.n if batch.rows is None else batch.rows,
                  "keys_in_batch": batch.n}
        written = written.replace(
            operation=opts.operation, index_type=cfg.index_type,
            # only a commit that changes the schema records it (the view keeps the previous one):
            # a writer must not put back the schema a concurrent alter replaced (format.md
            # "Schema evolution"); two commits that both change it conflict (conflict.py)
            schema=encode_schema(batch.data_schema)
            if view.schema is None or not view.schema.equals(batch.data_schema) else None,
            engine=EngineInfo.from_json(choice.as_metadata()) if choice is not None else written.engine,
            counts=counts, ignored=ignored_counts(counts, upserts=batch.upserts),
            # JVM and session start, apart from the phases
            session_start_ms=engine.session_start_ms())
        maybe_crash("before_complete")
        return written.replace(timings_ms={**phases.timings, "total_ms": int((time.perf_counter() - started) * 1000)})

    committed = txn.run(attempt, max_retries=opts.max_retries, batch_id=batch_id, what="the upsert")
    if committed.instant is None:  # a concurrent writer applied this batch
        return _noop_result(table, table.timeline.find(committed.applied_by), batch_id)
    metadata, retries = committed.metadata, committed.retries
    phases.done("commit", f"check {txn.check_ms} ms")
    counts = metadata["counts"]
    log.info("committed %s: %d inserted, %d updated, %d deleted%s", ts, counts["inserted"], counts["updated"],
             counts["deleted"], f" after {plural(len(retries), 'conflict')}" if retries else "")
    # the stored total stops at the commit point; the caller's total includes committing
    total = int((time.perf_counter() - started) * 1000)
    out = {"instant": ts, "batch_id": batch_id, "noop": False, "counts": counts, "ignored": metadata["ignored"],
           "retries": len(retries),
           "engine": engine.name, "timings_ms": {**metadata["timings_ms"], **phases.timings, "total_ms": total},
           "session_start_ms": engine.session_start_ms(),
           **({"shadow": metadata["shadow"]} if "shadow" in metadata else {})}
    cfg = table.config or cfg
    if opts.auto_compacts(cfg):
        if compact is None:
            log.info("this %s upsert does not compact automatically; schedule `bucketindex compact`", engine.name)
        else:  # post-commit: never fails or undoes the commit (auto_compact logs what went wrong)
            touched = {(g["partition"], g["file_id"]) for g in metadata.get("file_groups", [])}
            # the record-index buckets this commit wrote a delta to: only they grew
            buckets = {int(f["bucket"]) for f in (metadata.get("index") or {}).get("added", [])}
            out["auto_compaction"] = auto_compact(table, touched=touched, pick=compact,
                                                  settings=opts.auto_compaction, after=ts,
                                                  heartbeat_timeout_s=opts.heartbeat_timeout_s,
                                                  touched_buckets=buckets)
            out["timings_ms"]["auto_compact_ms"] = out["auto_compaction"]["total_ms"]
    return out


def _beside(base: Written, report: Written) -> Written:
    """``report`` with ``base``'s fields where the report has none (a caller's summary beside an
    engine's write set)."""
    given = {f.name: getattr(report, f.name) for f in fields(Written)
             if getattr(report, f.name) is not None and f.name != "extra"}
    extra = {**base.extra, **report.extra}
    return base.replace(**given, extra=extra)


def ignored_counts(counts: dict[str, int], *, upserts: int) -> dict[str, int]:
    """The batch's identities that changed nothing, by reason, from the counts both engines
    report alike: each identity left after the dedupe (``keys_in_batch``) is an insert, an
    update (a key moving partitions included), a delete, or nothing --

    * ``stale_upserts``: an upsert older than the stored row of its key (``--precombine-field``);
    * ``stale_or_absent_deletes``: a delete of a key the table does not hold, or older than
      its stored row.

    Without them a batch whose rows lost looked fully applied (issue 36)."""
    applied = int(counts.get("inserted", 0)) + int(counts.get("updated", 0))
    deletes = int(counts.get("keys_in_batch", 0)) - upserts
    return {"stale_upserts": max(0, upserts - applied),
            "stale_or_absent_deletes": max(0, deletes - int(counts.get("deleted", 0)))}


def _noop_result(table: "Table", done: Any, batch_id: str) -> dict[str, Any]:
    meta = table.timeline.read_metadata(done)
    return {"instant": done.timestamp, "batch_id": batch_id, "noop": True, "counts": meta.get("counts", {}),
            "timings_ms": meta.get("timings_ms", {})}
