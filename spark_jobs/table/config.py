"""``table.json``: the options fixed when a table is created.

Options a writer may not change (record key, partition fields, index type, hash) are
checked against every write: a contradicting write fails before it touches anything.
The *bucket count in force* is not read from here after a rehash; it is versioned on the
timeline (see :meth:`spark_jobs.table.table.Table.num_buckets`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_jobs.exceptions import BadInputError, ConfigConflictError, TableCorruptError
from spark_jobs.index.hashing import DEFAULT_HASH
from spark_jobs.io.filesystem import FileIO, InstantExistsError
from spark_jobs.vocabulary import (  # the index and table types, defined where the CLI's parser reads them
    COPY_ON_WRITE,
    INDEX_BUCKET,
    INDEX_GLOBAL_SIMPLE,
    INDEX_RECORD,
    INDEX_TYPES,
    MERGE_ON_READ,
    MIRRORS,  # projections of each commit a table may ask for (spark_jobs.table.delta, .iceberg)
    TABLE_TYPES,
)

if TYPE_CHECKING:
    from spark_jobs.table.table import Table

__all__ = [
    "table_mirrors",
    "FORMAT_VERSION",
    "REFERENCE_FORMAT_VERSION",
    "EVOLVING_FORMAT_VERSION",
    "INDEX_TYPES",
    "TABLE_TYPES",
    "MAX_NUM_BUCKETS",
    "COPY_ON_WRITE",
    "MERGE_ON_READ",
    "TableConfig",
    "ConfigConflictError",
    "BadInputError",
    "MAX_FIELD_NAME_BYTES",
    "check_field_names",
    "DEFAULT_TABLE_TYPE",
    "new_table_type",
    "new_auto_compact",
]

FORMAT_VERSION = 2
#: a table made by a reference bootstrap (format.md §5.3): version 2 plus reference files,
#: which a release that only knows version 2 would read without their key column
REFERENCE_FORMAT_VERSION = 3
#: a table whose history holds a schema change (format.md §5.4) or a partial log (§5.1),
#: with or without reference files: a release that knows only 2 and 3 would read an evolved
#: schema's old files without their new columns, and a partial log's absent columns as nulls.
#: A table is upgraded to it by the first writer that needs it (:meth:`TableConfig.upgraded`),
#: so tables that never use these features stay readable by older releases.
EVOLVING_FORMAT_VERSION = 4
SUPPORTED_FORMAT_VERSIONS = (FORMAT_VERSION, REFERENCE_FORMAT_VERSION, EVOLVING_FORMAT_VERSION)
#: the largest bucket count: record-index bucket directories and bucket-index file ids stay
#: fixed width, and a bucket-index table already has this many file groups per partition
MAX_NUM_BUCKETS = 65_536
DEFAULT_NUM_BUCKETS = {INDEX_RECORD: 16, INDEX_BUCKET: 8, INDEX_GLOBAL_SIMPLE: 16}
DEFAULT_TARGET_FILE_ROWS = 100_000
DEFAULT_CHECKPOINT_INTERVAL = 10
#: a day of hourly upserts stays readable with ``read --as-of``
DEFAULT_CLEAN_RETAIN_COMMITS = 24


#: the longest field name: a partition directory ``<field>=<value>`` keeps at least a
#: readable prefix of a long value within its 200 bytes (format.md §1)
MAX_FIELD_NAME_BYTES = 128
#: characters a partition field name may not hold: it is a directory name's first part
_PATH_CHARS = ("/", "\\", "=")


def check_field_names(*, record_key: list[str], partition_field: str | None = None,
                      precombine_field: str | None = None, delete_field: str | None = None) -> None:
    """Refuse (BadInputError: one line, exit 2, nothing written) a field name that could
    name a path or that Spark would parse instead of take literally -- once, where a write's
    options are resolved, before any Spark job or file (format.md §2).

    Every name: not empty, at most 128 bytes, no control character (NUL, newline), no ``.``
    or backtick (Spark reads ``a.b`` as a struct field, so such a column cannot be addressed
    by name), not ``*``. A partition field name is also a directory name's first part
    (``<field>=<value>``): no ``/``, ``\\`` or ``=`` either, so it can neither climb out
    of the table nor be split differently by a Hive-style reader.
    """
    named = [("record key", k) for k in record_key] + [
        (label, f) for label, f in (("partition", partition_field), ("precombine", precombine_field),
                                    ("delete", delete_field)) if f]  # "" means "not given" everywhere
    for label, name in named:
        problem = _field_name_problem(name, path=label == "partition")
        if problem is not None:
            raise BadInputError(f"{label} field name {name!r} {problem}")


def _field_name_problem(name: object, *, path: bool) -> str | None:
    if not isinstance(name, str) or not name:
        return "is empty"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in name):
        return "holds a control character"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_FIELD_NAME_BYTES:
        return f"is longer than {MAX_FIELD_NAME_BYTES} bytes"
    if path and (any(c in name for c in _PATH_CHARS) or name.startswith(".")):
        return "cannot be a directory name (<field>=<value>): it holds '/', '\\' or '=' or starts with '.'"
    if "." in name or "`" in name or name == "*":
        return "holds '.' or '`' (or is '*'), which Spark reads as column syntax; rename the column"
    return None


#: the type of a table created without ``--table-type`` (issue 38, docs/benchmarks.md "Scale" and
#: "Automatic compaction"): merge-on-read writes what a batch holds (a 1k-row batch into 2.5M rows:
#: 0.2 MiB written against copy-on-write's 207 MiB, 7.0 s against 18.6 s), and the automatic
#: compaction a new merge-on-read table gets keeps a full read within 1.03x of a compacted table's
#: after a day of hourly batches. Tables written before this default keep the type they recorded.
DEFAULT_TABLE_TYPE = MERGE_ON_READ


def new_table_type(*, table_type: str | None, mirrors: list[str]) -> str:
    """The type of a table being created: the one asked for, else :data:`DEFAULT_TABLE_TYPE` --
    except copy-on-write when the table is created with a projection (``--mirror``): a projection
    is exact only for copy-on-write, while it shows a merge-on-read table as of each file group's
    last compaction (format.md §11), and an analyst reading it should not see rows older than
    the table's by default. Asking for merge-on-read with a mirror still gets it."""
    if table_type:
        return table_type
    return COPY_ON_WRITE if mirrors else DEFAULT_TABLE_TYPE


def new_auto_compact(*, table_type: str, auto_compact: str | None) -> bool | None:
    """``auto_compact`` of a table being created: on for merge-on-read unless ``--auto-compact off``
    (a merge-on-read table whose logs nobody folds reads 3.2x slower after 24 hourly batches,
    docs/benchmarks.md "Automatic compaction"); None for copy-on-write, which writes no logs."""
    if table_type != MERGE_ON_READ:
        return None
    return auto_compact != "off"


@dataclass(frozen=True)
class TableConfig:
    record_key_fields: list[str]
    index_type: str = INDEX_RECORD
    num_buckets: int = 16
    partition_fields: list[str] = field(default_factory=list)
    precombine_field: str | None = None
    hash_function: str = DEFAULT_HASH
    target_file_rows: int = DEFAULT_TARGET_FILE_ROWS
    format_version: int = FORMAT_VERSION
    #: absent from tables written before merge-on-read existed: those are copy-on-write
    table_type: str = COPY_ON_WRITE
    #: a timeline checkpoint every this many completed entries (format.md §3.5)
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL
    #: what ``clean`` retains when run without options: the last N snapshot-changing
    #: commits, or (if set) the snapshots of the last H hours (format.md §3.6)
    clean_retain_commits: int = DEFAULT_CLEAN_RETAIN_COMMITS
    clean_retain_hours: float | None = None
    #: set by a reference bootstrap (format_version 3): ``{"source": <dataset uri>,
    #: "path_columns": {<column>: <Arrow type name>}}`` -- the columns a referenced file does
    #: not hold, whose values its Hive-style directory names carry (format.md §5.3)
    reference: dict | None = None
    #: projections written beside each commit (``["delta"]``: a Delta Lake log, format.md
    #: "Delta Lake projection"); absent when empty, so older tables' ``table.json`` is unchanged
    mirrors: list[str] = field(default_factory=list)
    #: merge-on-read: each upsert compacts the due file groups it touched after its commit
    #: (format.md §5.2). Recorded by the upsert or bootstrap that creates a merge-on-read table:
    #: true unless it gives ``--auto-compact off`` (:func:`new_auto_compact`); absent (None) --
    #: every table created before that default -- means off, so their upserts keep their
    #: latency; ``upsert --auto-compact on|off`` on a later upsert decides for that run
    auto_compact: bool | None = None

    def __post_init__(self) -> None:
        if not self.record_key_fields or any(not f for f in self.record_key_fields):
            raise BadInputError("a record key needs at least one field name")
        if self.index_type not in INDEX_TYPES:
            raise BadInputError(f"unknown index type {self.index_type!r}; expected one of {', '.join(INDEX_TYPES)}")
        if self.table_type not in TABLE_TYPES:
            raise BadInputError(f"unknown table type {self.table_type!r}; expected one of {', '.join(TABLE_TYPES)}")
        if self.num_buckets < 1:
            raise BadInputError(f"--num-buckets must be at least 1, got {self.num_buckets}")
        if self.num_buckets > MAX_NUM_BUCKETS:
            raise BadInputError(f"--num-buckets {self.num_buckets} is above the maximum of {MAX_NUM_BUCKETS}")
        if self.hash_function != DEFAULT_HASH:
            raise BadInputError(f"unknown hash function {self.hash_function!r}; this version supports {DEFAULT_HASH}")
        if self.checkpoint_interval < 1:
            raise BadInputError(f"checkpoint_interval must be at least 1, got {self.checkpoint_interval}")
        if self.clean_retain_commits < 1:
            raise BadInputError(f"clean_retain_commits must be at least 1, got {self.clean_retain_commits}")
        if self.clean_retain_hours is not None and self.clean_retain_hours <= 0:
            raise BadInputError(f"clean_retain_hours must be positive, got {self.clean_retain_hours}")
        for m in self.mirrors:
            if m not in MIRRORS:
                raise BadInputError(f"unknown mirror {m!r}; expected one of {', '.join(MIRRORS)}")
        if self.auto_compact is not None and not isinstance(self.auto_compact, bool):
            raise BadInputError(f"auto_compact must be true or false, got {self.auto_compact!r}")
        if self.auto_compact and not self.merge_on_read:
            raise BadInputError("auto_compact is for merge-on-read tables: a copy-on-write table has no logs")
        if len(self.partition_fields) > 1:
            raise BadInputError("format v1 supports at most one partition field")
        if self.format_version not in SUPPORTED_FORMAT_VERSIONS:
            raise BadInputError(
                f"table format version {self.format_version} is not supported by this release "
                f"(supports {', '.join(map(str, SUPPORTED_FORMAT_VERSIONS))})"
            )
        if self.format_version != EVOLVING_FORMAT_VERSION and (
                (self.reference is not None) != (self.format_version == REFERENCE_FORMAT_VERSION)):
            raise BadInputError(f"table format version {self.format_version} "
                                f"{'needs' if self.reference is None else 'cannot have'} reference files")

    @property
    def merge_on_read(self) -> bool:
        return self.table_type == MERGE_ON_READ

    def upgraded(self, version: int) -> "TableConfig":
        """This config at format ``version`` (itself when already there or later)."""
        if self.format_version >= version:
            return self
        return dataclasses.replace(self, format_version=version)

    # -- (de)serialisation ---------------------------------------------------------------
    def to_json(self) -> bytes:
        raw = dataclasses.asdict(self)
        if raw["reference"] is None:  # only a reference bootstrap's table has it (format version 3)
            del raw["reference"]
        if not raw["mirrors"]:  # tables without a projection keep the bytes they always had
            del raw["mirrors"]
        if raw["auto_compact"] is None:  # copy-on-write and older tables keep their bytes too
            del raw["auto_compact"]
        return json.dumps(raw, indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "TableConfig":
        raw = json.loads(data)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    # -- persistence ------------------------------------------------------------------
    @classmethod
    def load(cls, io: FileIO, path: str) -> "TableConfig | None":
        try:  # one read, not an existence check and a read: every open costs it (format.md §10)
            data = io.read_bytes(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return cls.from_json(data)
        except (ValueError, TypeError, AttributeError) as e:
            if isinstance(e, BadInputError):  # parsed, but a value this release refuses: its own message
                raise

            why = "not valid JSON" if isinstance(e, ValueError) else "not a table configuration"
            raise TableCorruptError.damaged(path, what="table metadata", why=f"{why}, {len(data)} bytes") from e

    def create(self, io: FileIO, path: str) -> "TableConfig":
        """Write this config as a new table's; if another writer created it first, check against theirs."""
        try:
            io.create_exclusive(path, self.to_json())
            return self
        except InstantExistsError:
            existing = TableConfig.load(io, path)
            assert existing is not None
            existing.check_compatible(self)
            return existing

    def check_compatible(self, requested: "TableConfig", *, explicit: set[str] | None = None) -> None:
        """Raise ConfigConflictError when ``requested`` contradicts this (existing) config.

        ``explicit`` names the options the caller actually gave; defaults filled in for
        options the caller left out never conflict.
        """
        checks = {
            "record_key_fields": "record key",
            "index_type": "index type",
            "partition_fields": "partition fields",
            "precombine_field": "precombine field",
            "hash_function": "hash function",
            "table_type": "table type",
        }
        for attr, label in checks.items():
            if explicit is not None and attr not in explicit:
                continue
            mine, theirs = getattr(self, attr), getattr(requested, attr)
            if mine != theirs:
                raise ConfigConflictError(
                    f"{label} {_show(theirs)} contradicts the table's {label} {_show(mine)}; "
                    f"it cannot change after the table is created"
                )


def table_mirrors(table: "Table", properties: "dict[str, Any] | None" = None) -> set[str]:
    """The projections ``table`` asks for: ``table.json``'s ``mirrors`` (set at creation) and the
    ``mirrors`` property its timeline set later (``bucketindex mirror --enable``, a
    ``set_properties`` commit). ``properties``: the snapshot's (``FileSystemView.properties``),
    when the caller has them; otherwise the latest view's are read. (Also
    ``spark_jobs.table.delta.mirrors``; defined here so that an upsert, which asks after every
    commit, loads no projection module when the table has none.)"""
    out = set(table.config.mirrors or ()) if table.config is not None else set()
    if properties is None:
        properties = table.view().properties if table.config is not None else {}
    return out | set(properties.get("mirrors") or ())


def _show(v: object) -> str:
    if isinstance(v, list):
        return ",".join(v) if v else "(none)"
    return "(none)" if v is None else str(v)
