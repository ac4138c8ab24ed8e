"""The Iceberg projection of a table (format.md §12, issue 39 item 1): an Iceberg v2 table
written after every commit point, beside the Delta one (:mod:`spark_jobs.table.delta`).

The engines most analysts query with (Athena, Snowflake, BigQuery, Trino, DuckDB, Spark) read
Iceberg. A table with ``iceberg`` in its mirrors (``--mirror iceberg`` at creation,
``bucketindex mirror TABLE --enable iceberg`` later: the same ``mirrors`` list as Delta) gets,
after each sequence entry ``n``, ``metadata/v<n>.metadata.json`` and the manifest list and
manifests it names, all under ``<table>/metadata/``.

**Where.** The Iceberg table's location is the bucketindex table's root and its metadata lives in
``<root>/metadata/`` -- Iceberg's own layout for a table in a file system (the "Hadoop table":
``v<N>.metadata.json`` plus ``version-hint.text``), as the Delta log lives in
``<root>/_delta_log/`` because Delta readers look there. So a reader handed the table's
directory finds it (``StaticTable.from_metadata(<root>)`` reads the hint; DuckDB's
``iceberg_scan``, Spark's ``HadoopTables``), Iceberg's data file paths (absolute URIs) point at
the table's own Parquet files in place, and XTable places its Iceberg metadata the same way. The
name cannot collide with the table's own files: partition directories are ``<field>=<value>``
and everything of bucketindex's own is under ``.bucketindex/``.

**Numbers.** Metadata version ``n`` = commit sequence number ``n``: version 0 is the empty table
(first recorded schema, no snapshot) before entry 1; version ``n >= 1`` holds one more snapshot
than ``n - 1``, whose **snapshot id and Iceberg sequence number are ``n``** and whose
``timestamp-ms`` is the entry's completion floor (:func:`~spark_jobs.table.timeline.completion_floors`:
the running maximum of ``completed``/instant), so ``scan(snapshot_id=n)`` is ``read --as-of
<instant of entry n>`` and ``snapshot_as_of_timestamp(T)`` is ``read --as-of T`` (the rule
``seq_at_time`` applies, at the instants' millisecond precision). Every entry gets a snapshot,
also one that changes no published file (a clean, a rollback, an index compaction, a
merge-on-read log): an ``append`` of nothing, so the numbers never drift. The snapshot summary
names the entry: ``bucketindex.seq``, ``bucketindex.instant``, ``bucketindex.action``.

**How it is written: pyiceberg's own writers, committed by a file-system "catalog".** A version
is one pyiceberg :class:`~pyiceberg.table.Transaction` on a :class:`~pyiceberg.table.Table` loaded
from version ``n - 1``'s metadata: ``update_schema().union_by_name`` for a schema change, then one
snapshot producer (pyiceberg's ``overwrite``: ``delete_data_file`` for each base that left the
snapshot, ``append_data_file`` for each that entered) -- pyiceberg writes the manifests and the
manifest list (Avro) and computes the new :class:`TableMetadata` (``update_table_metadata``); its
``DataFile``\\ s come from pyiceberg's own footer statistics
(``data_file_statistics_from_parquet_metadata``, what ``add_files`` uses). Nothing here writes Avro
or metadata by hand. The commit goes to :class:`_FileSystemCatalog`, a pyiceberg ``Catalog`` whose
``commit_table`` applies the updates and **creates** ``v<n>.metadata.json`` with the table's
create-if-absent primitive (``FileIO.create_exclusive``: temp + ``link`` on disk,
``If-None-Match: *`` on S3) -- Iceberg's own commit rule for file-system tables (rename-if-absent
of ``v<N>``). Why not a ``SqlCatalog`` on a throw-away sqlite file (or pyiceberg's in-memory
catalog, the same thing on ``:memory:``): it names each metadata file ``<n>-<random uuid>``
and commits by updating its database, not the file system, so two processes would each write a
version ``n`` and readers of the directory could not tell which is the table; a catalog that
creates ``v<n>`` exclusively gives the one publication point §3.2 gives the timeline, costs no
database per commit, and leaves nothing to register. (Registering the table in a user's catalog
is issue 39's optional part, not done here; a SQL catalog's ``register_table`` of a version's
metadata reads it, tested.)

**Bounded cost.** The producer merges manifests with pyiceberg's ``_ManifestMergeManager`` once
a snapshot would name :data:`MANIFEST_MIN_MERGE_COUNT` (each commit adds one, and each commit
reads them all to find the removed files' entries); removed files are named by path and
pyiceberg finds their live entries (refusing the commit if one is not live); manifests are read
once per process (:data:`_AVRO_CACHE`); a clean's snapshot expires (``ExpireSnapshots``,
metadata only) the snapshots whose files that clean deleted, so the metadata -- which
pyiceberg deep-copies on every access inside a transaction -- stays the size of the retention
window. Measured in format.md §12 "Cost".

**Publication.** Manifests and the manifest list are written first under names unique to the
attempt (pyiceberg's commit uuid), and are invisible until the metadata file naming them
exists; the metadata file is created whole or not at all, so a reader never sees a half-written
version. A process that finds ``v<n>`` already there (another one mirrored the same entry)
checks that it holds snapshot ``n`` of the same instant (the attempt's own files are deleted by
pyiceberg, which treats the refused create as a failed commit; ``commit.retry.num-retries`` is
0); anything else is an error (something else wrote the table). Then ``version-hint.text`` is
set to ``n`` unless it already names a later version: a stale hint leaves readers of the
directory one consistent version behind, never on a half-written one.

**Gaps.** As for Delta: a writer killed between its commit point and its metadata write leaves
readers at ``n - 1``; the next commit's hook finds ``v<n - 1>`` missing (one HEAD) and writes
every missing version first (each from the one before: Iceberg versions form a chain), and
``bucketindex mirror TABLE --repair`` (:func:`verify_and_repair`) checks every version -- it
parses, its current snapshot is ``n`` of entry ``n``'s instant, its files are the snapshot's
bases, its columns the published ones -- and writes again each one that is not.

**Merge-on-read: two views** (format.md §12; copy-on-write tables are exact either way). The
*read-optimized* view (the default, as the Delta projection, §11): bases only; a log's rows reach
Iceberg readers when data compaction folds them into a new base. The *fresh* view (issue 39 item
2; ``bucketindex mirror TABLE --enable iceberg --view fresh``, the timeline property
``mirror_views``): each log is an added data file and the rows the slice's merge drops
(:func:`~spark_jobs.table.merge.plan_slice`'s positions) are a Parquet position-delete file per
slice, listed in delete manifests (:func:`_fresh_changes`), so a snapshot reads as ``read
--as-of`` does. Every version is in the view the latest properties name (``bucketindex.projection``
in the table properties); a version found in the other view makes the chain be rewritten from
version 0 (:class:`_OtherView`).

**Columns.** The published schema is the table's without ``_bi_*`` columns, every column
optional, field ids assigned by pyiceberg, and ``schema.name-mapping.default`` set (the data
files carry no Iceberg field ids: readers map columns by name, pyiceberg keeping the mapping
current through schema changes). The partition spec is ``identity`` on the partition field.
Iceberg keeps a partition value as a typed value in the manifests, so null, ``""``,
``"__NULL__"``, ``"__HIVE_DEFAULT_PARTITION__"``, long values (whose directory names are
shortened), non-ASCII text, decimals and timestamps read back exactly -- unlike Delta, the
field can stay a partition column whatever its type. Each file's value is read from its footer
statistics (or its column), never from the directory name. Types Iceberg v2 cannot hold exactly
(nanosecond timestamps, unsigned integers, a zone other than UTC) make :func:`check_supported`
refuse the projection in one line.

No pyspark, no airflow. ``pyiceberg`` (``pip install 'airflow-provider-bucketindex[iceberg]'``)
is imported only when a table asks for this projection.
"""

from __future__ import annotations

import datetime as _dt
import logging
import posixpath
import re
import threading
import uuid
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa

from spark_jobs.exceptions import BadInputError, TableCorruptError
from spark_jobs.io.filesystem import InstantExistsError
from spark_jobs.table.config import MIRRORS
from spark_jobs.table.delta import VIEW_FRESH
from spark_jobs.table.layout import is_reference
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import FileSlice, FileSystemView, LogFile

if TYPE_CHECKING:
    import pyarrow.parquet as pq

    from spark_jobs.table.delta import RepairReport
    from spark_jobs.table.table import Table

__all__ = ["MIRROR_ICEBERG", "METADATA_DIR", "VERSION_HINT", "enabled", "check_supported", "check_files",
           "mirror_commit",
           "repair", "verify_and_repair", "versions_present", "metadata_file", "metadata_uri", "location",
           "iceberg_arrow_schema"]

log = logging.getLogger("bucketindex.iceberg")

MIRROR_ICEBERG = "iceberg"
assert MIRROR_ICEBERG in MIRRORS
METADATA_DIR = "metadata"
VERSION_HINT = "version-hint.text"
_VERSION_NAME = re.compile(r"^v(\d+)\.metadata\.json$")
#: the table's uuid is a name-based UUID of its first entry, so every process derives the same
_UUID_NAMESPACE = uuid.UUID("0b5c9a3e-5d1e-4f0b-8a43-3f6b2c9e7d21")
INTERNAL_PREFIX = "_bi_"
#: the snapshot summary keys naming the sequence entry a snapshot projects
SUMMARY_SEQ, SUMMARY_INSTANT, SUMMARY_ACTION = "bucketindex.seq", "bucketindex.instant", "bucketindex.action"
#: the fresh view's snapshot summary key counting file groups shown as of their last compaction
#: (a partial-update log, which no position can express: :func:`spark_jobs.table.delta.slice_deletes`)
SUMMARY_STALE = "bucketindex.read-optimized-file-groups"
#: where the fresh view's position-delete files live: beside the metadata, derived like it
DELETES_DIR = "deletes"
#: the field ids and names of a position-delete file's columns (Iceberg spec, "Position Delete Files")
DELETE_FILE_PATH_ID, DELETE_POS_ID = 2147483546, 2147483545


# -- config and paths ------------------------------------------------------------------------

def enabled(table: "Table", properties: "dict[str, Any] | None" = None) -> bool:
    """Whether ``table`` asks for the Iceberg projection (``table.json``'s or the timeline's
    ``mirrors``, :func:`spark_jobs.table.delta.mirrors`)."""
    from spark_jobs.table.delta import mirrors

    return MIRROR_ICEBERG in mirrors(table, properties)


def require() -> None:
    """BadInputError (one line) when pyiceberg is not installed: asked before a projection is
    turned on, so the commits after it do not each log that it is missing."""
    import importlib.util

    if importlib.util.find_spec("pyiceberg") is None:
        raise BadInputError("the Iceberg projection needs pyiceberg: pip install 'pyiceberg>=0.10' "
                            "(or the package's [iceberg] extra)")


def metadata_dir(table: "Table") -> str:
    return posixpath.join(table.root, METADATA_DIR)


def metadata_file(table: "Table", version: int) -> str:
    """The file-system path of metadata version ``version`` (for ``table.io``)."""
    return posixpath.join(metadata_dir(table), f"v{version}.metadata.json")


def _prefix(table: "Table") -> str:
    """What turns a path of ``table.io``'s file system into the URI readers open: ``file://``
    on a local disk, ``s3://`` (never ``s3a://``, which not every reader knows) on S3."""
    uri = table.uri.split("?", 1)[0]
    if "://" not in uri or uri.startswith("file:"):
        return "file://" if table.root.startswith("/") else "file:///"
    scheme = uri.split("://", 1)[0]
    scheme = {"s3a": "s3", "s3n": "s3"}.get(scheme, scheme)
    if scheme == "hdfs":  # hdfs://namenode:port/path: the authority is not in the root
        rest = uri.split("://", 1)[1]
        authority = rest.split("/", 1)[0]
        return f"hdfs://{authority}" if table.root.startswith("/") else f"hdfs://{authority}/"
    return f"{scheme}://"


def location(table: "Table") -> str:
    """The Iceberg table's location: the table root as a URI (no query string, no credentials)."""
    return _prefix(table) + table.root.rstrip("/")


def metadata_uri(table: "Table", version: int) -> str:
    """Metadata version ``version`` as readers open it (``StaticTable.from_metadata``)."""
    return _prefix(table) + metadata_file(table, version)


def _file_uri(table: "Table", rel: str) -> str:
    """A data file's Iceberg ``file_path``: an absolute URI, never percent-encoded (Iceberg
    paths are opened as written, and the partition directories are already form-encoded);
    a reference file (§5.3, outside the root) is its absolute location like any other."""
    return _prefix(table) + table.abs(rel)


def versions_present(table: "Table") -> list[int]:
    """The metadata versions in ``metadata/`` (one listing: only repair and tests ask)."""
    return sorted(int(m.group(1)) for m in map(_VERSION_NAME.match, table.io.list_names(metadata_dir(table))) if m)


# -- schema ----------------------------------------------------------------------------------

def _public(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f for f in schema if not f.name.startswith(INTERNAL_PREFIX)])


def iceberg_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """The published schema as the Arrow schema pyiceberg converts: no ``_bi_*`` column, every
    top-level column optional (a later file may hold a null where an earlier one could not,
    and the table's own schema does not promise otherwise)."""
    return pa.schema([f.with_nullable(True) for f in _public(schema)])


def _unsupported(typ: pa.DataType) -> str | None:
    """Why Iceberg v2 cannot hold ``typ`` exactly, or None."""
    if pa.types.is_timestamp(typ):
        if typ.unit == "ns":
            return "nanosecond timestamps (Iceberg v2 holds microseconds)"
        if typ.tz is not None and typ.tz.upper() not in ("UTC", "+00:00", "ETC/UTC", "Z"):
            return f"a timestamp in zone {typ.tz} (Iceberg holds UTC instants and would read it back in UTC)"
    if pa.types.is_time(typ) and typ.unit == "ns":
        return "nanosecond times"
    if pa.types.is_unsigned_integer(typ):
        return "unsigned integers"
    if pa.types.is_large_list(typ) or pa.types.is_list(typ) or pa.types.is_fixed_size_list(typ):
        return _unsupported(typ.value_type)
    if pa.types.is_map(typ):
        return _unsupported(typ.key_type) or _unsupported(typ.item_type)
    if pa.types.is_struct(typ):
        for i in range(typ.num_fields):
            why = _unsupported(typ.field(i).type)
            if why:
                return why
    if pa.types.is_dictionary(typ) or pa.types.is_null(typ) or pa.types.is_duration(typ) \
            or pa.types.is_interval(typ) or pa.types.is_float16(typ):
        return f"Arrow type {typ}"
    return None


def check_supported(table: "Table", schema: pa.Schema) -> None:
    """BadInputError, one line, when the projection could not give readers every value of
    ``schema`` exactly (format.md §12 "Exact values"): a column of a type Iceberg v2 has no
    exact form for. Asked before the projection is turned on, and by every version written."""
    for f in _public(schema):
        why = _unsupported(f.type)
        if why:
            raise BadInputError(f"the Iceberg projection cannot hold column {f.name!r} of {table.display_uri} "
                                f"exactly: {why}; keep the Delta projection for this table")
    try:
        from pyiceberg.catalog import Catalog

        Catalog._convert_schema_if_needed(iceberg_arrow_schema(schema))
    except (TypeError, ValueError) as e:
        raise BadInputError(f"the Iceberg projection cannot hold the schema of {table.display_uri}: "
                            f"{str(e).splitlines()[0]}") from None


#: field ids the name mapping gives the table's own columns in the data files (``_bi_key`` in
#: every base): readers must map every file column (pyiceberg refuses a file with an unmapped
#: one), and no published column may claim them -- the schema never holds these ids, so readers
#: skip the columns. Far above any id pyiceberg assigns (one per column, from 1) and below
#: Iceberg's reserved metadata ids (from 2147483447 down).
INTERNAL_FIELD_IDS = {"_bi_key": 2_100_000_001, "_bi_op": 2_100_000_002}


def _name_mapping(fresh: Any, schema: pa.Schema) -> str:
    """``schema.name-mapping.default``: the published columns by name, and the table's own
    columns (:data:`INTERNAL_FIELD_IDS`) under ids no published column has."""
    from pyiceberg.table.name_mapping import MappedField, NameMapping

    internal = dict(INTERNAL_FIELD_IDS)
    for n, f in enumerate(sorted(f.name for f in schema if f.name.startswith(INTERNAL_PREFIX) and f.name not in internal)):
        internal[f] = 2_100_000_010 + n
    extra = [MappedField(field_id=i, names=[name]) for name, i in internal.items()]
    return NameMapping([*fresh.name_mapping.root, *extra]).model_dump_json()


def check_file(table: "Table", rel: str, footer: "pq.FileMetaData", schema: pa.Schema) -> None:
    """BadInputError, one line, when data file ``rel`` stores a published column in a type
    pyiceberg will not read -- a reference file (§5.3) keeps the types its writer chose, e.g.
    a timestamp zoned ``America/New_York`` that the table reads as UTC, and pyiceberg refuses
    the file's Arrow schema. Files the table writes hold the table's own types."""
    stored = footer.schema.to_arrow_schema()
    for f in _public(schema):
        if f.name in stored.names:
            why = _unsupported(stored.field(f.name).type)
            if why:
                raise BadInputError(f"the Iceberg projection cannot list {table.abs(rel)} of {table.display_uri}: it "
                                    f"stores column {f.name!r} as {stored.field(f.name).type} ({why}), which "
                                    f"Iceberg readers would refuse; keep the Delta projection for this table")


def check_files(table: "Table", view: FileSystemView) -> None:
    """:func:`check_file` for every reference file of ``view`` (the only files whose types the
    table did not choose): one footer read each, before the projection is turned on."""
    from spark_jobs.table.delta import _footer

    assert view.schema is not None
    for s in view.slices():
        if is_reference(s.path):
            footer = _footer(table, s.path)
            if footer is not None:
                check_file(table, s.path, footer, view.schema)


def _iceberg_schema(schema: pa.Schema) -> Any:
    from pyiceberg.catalog import Catalog

    return Catalog._convert_schema_if_needed(iceberg_arrow_schema(schema))


# -- pyiceberg plumbing ----------------------------------------------------------------------

#: manifests and manifest lists already read by this process, by location: Avro files pyiceberg
#: never rewrites in place (new ones get new names), so a copy stays true. pyiceberg reads each
#: manifest two or three times per commit (the removed files' entries, the manifests kept, the
#: merge), and a repair reads a version's manifests again for the next one; bounded in bytes.
_AVRO_CACHE: "dict[str, bytes]" = {}
_AVRO_CACHE_BYTES = 32 * 1024 * 1024
_AVRO_LOCK = threading.Lock()


def _file_io(table: "Table") -> Any:
    """pyiceberg's Arrow FileIO over the table's own file system: the credentials and endpoint
    the table was opened with, not a second configuration to keep in step; Avro files are read
    once (:data:`_AVRO_CACHE`)."""
    from pyiceberg.io import InputFile
    from pyiceberg.io.pyarrow import PyArrowFileIO

    class _Cached(InputFile):
        def __init__(self, location: str, data: bytes) -> None:
            super().__init__(location)
            self.data = data

        def __len__(self) -> int:
            return len(self.data)

        def exists(self) -> bool:
            return True

        def open(self, seekable: bool = True) -> Any:
            import io as _io

            return _io.BytesIO(self.data)

    class _TableFileIO(PyArrowFileIO):
        def new_input(self, location: str) -> Any:
            if not location.endswith(".avro"):
                return super().new_input(location)
            data = _AVRO_CACHE.get(location)
            if data is None:
                inp = super().new_input(location)
                with inp.open() as f:
                    data = f.read()
                with _AVRO_LOCK:  # pyiceberg reads manifests from a thread pool
                    while _AVRO_CACHE and sum(map(len, _AVRO_CACHE.values())) + len(data) > _AVRO_CACHE_BYTES:
                        _AVRO_CACHE.pop(next(iter(_AVRO_CACHE)))
                    _AVRO_CACHE[location] = data
            return _Cached(location, data)

    io = _TableFileIO()
    fs = table.io.fs
    io.fs_by_scheme = lambda scheme, netloc: fs  # type: ignore[method-assign,assignment]
    return io


_CATALOG_CLASS: Any = None


def _catalog(table: "Table", version: int, *, timestamp_ms: int, replace: bool) -> Any:
    """A pyiceberg catalog that commits version ``version`` (see the module docstring)."""
    global _CATALOG_CLASS
    if _CATALOG_CLASS is None:
        from pyiceberg.catalog.noop import NoopCatalog
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.table import CommitTableResponse
        from pyiceberg.table.update import AddSnapshotUpdate, update_table_metadata

        class _FileSystemCatalog(NoopCatalog):
            """Commits a pyiceberg transaction by creating ``v<n>.metadata.json`` if absent
            (Iceberg's rule for tables in a file system); the snapshot's time is the entry's."""

            def __init__(self, table: "Table", version: int, timestamp_ms: int, replace: bool) -> None:
                super().__init__("bucketindex")
                self.bi_table, self.version, self.timestamp_ms, self.replace = table, version, timestamp_ms, replace

            def commit_table(self, itable: Any, requirements: Any, updates: Any) -> Any:
                for r in requirements:
                    r.validate(itable.metadata)
                # the snapshot's time is the entry's completion floor, not this process's clock
                updates = tuple(AddSnapshotUpdate(snapshot=u.snapshot.model_copy(
                    update={"timestamp_ms": self.timestamp_ms})) if isinstance(u, AddSnapshotUpdate) else u
                    for u in updates)
                md = update_table_metadata(itable.metadata, updates, metadata_location=itable.metadata_location)
                md = md.model_copy(update={"last_updated_ms": self.timestamp_ms})
                data = md.model_dump_json().encode()
                path = metadata_file(self.bi_table, self.version)
                if self.replace:
                    self.bi_table.io.write_atomic(path, data)
                else:
                    try:
                        self.bi_table.io.create_exclusive(path, data)
                    except InstantExistsError:
                        raise CommitFailedException(f"version {self.version} exists") from None
                return CommitTableResponse(metadata=md, metadata_location=metadata_uri(self.bi_table, self.version))

        _CATALOG_CLASS = _FileSystemCatalog
    return _CATALOG_CLASS(table, version, timestamp_ms, replace)


def _read_metadata(table: "Table", version: int) -> Any:
    from pyiceberg.serializers import FromInputFile

    return FromInputFile.table_metadata(_file_io(table).new_input(metadata_uri(table, version)))


def _instant_ms(instant: str) -> int:
    t = _dt.datetime.strptime(instant[:17], "%Y%m%d%H%M%S%f").replace(tzinfo=_dt.timezone.utc)
    return int(t.timestamp() * 1000)


def _floor_ms(entry: dict[str, Any], prev_ms: int) -> int:
    """Entry ``n``'s completion floor in ms from entry ``n - 1``'s (``completion_floors``)."""
    return max(prev_ms, _instant_ms(entry["instant"]), _instant_ms(entry["completed"]) if entry.get("completed") else 0)


def _table_uuid(table: "Table") -> uuid.UUID:
    first = table.timeline.entry(1)["instant"] if table.timeline.last_seq else "empty"
    return uuid.uuid5(_UUID_NAMESPACE, first)


#: the table property saying what the projection publishes: ``exact`` (copy-on-write), or a
#: merge-on-read table's view, ``read_optimized`` or ``fresh`` (:func:`projection_kind`)
PROJECTION_PROPERTY = "bucketindex.projection"


def projection_kind(table: "Table", properties: dict[str, Any]) -> str:
    """What the projection publishes for the snapshot ``properties`` (the timeline's): ``exact``
    for a copy-on-write table (no logs: every view is the table), else the merge-on-read view
    the ``mirror_views`` property names (:func:`spark_jobs.table.delta.mirror_view`)."""
    from spark_jobs.table.delta import mirror_view

    assert table.config is not None
    if not table.config.merge_on_read:
        return "exact"
    return mirror_view(table, MIRROR_ICEBERG, properties)


def _latest_kind(table: "Table", tl: Any) -> str:
    """:func:`projection_kind` of the latest snapshot: the view every version is written in."""
    return projection_kind(table, FileSystemView.at_seq(tl, tl.last_seq).properties if tl.last_seq else {})


class _OtherView(Exception):
    """The previous version was written in another view (the view changed: `mirror --enable
    iceberg --view`): the chain is rewritten from version 0 (:func:`verify_and_repair`)."""


def _properties(table: "Table", kind: str) -> dict[str, str]:
    assert table.config is not None
    return {
        # a lost race to create v<n> is not retried: the other process wrote the same entry
        "commit.retry.num-retries": "0",
        PROJECTION_PROPERTY: kind,
        # the table's own clean deletes files; an Iceberg writer must not (no expire, no orphan removal)
        "bucketindex.note": "derived from the bucketindex timeline; do not write with an Iceberg writer",
    }


def _version0(table: "Table", schema: pa.Schema, kind: str) -> Any:
    """The metadata of version 0: the empty table with the first recorded schema, the identity
    partition spec on the partition field, and the name mapping, created at entry 1's time."""
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
    from pyiceberg.schema import assign_fresh_schema_ids
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
    from pyiceberg.transforms import IdentityTransform

    assert table.config is not None
    check_supported(table, schema)
    fresh = assign_fresh_schema_ids(_iceberg_schema(schema))
    fields = [f for f in table.config.partition_fields or [] if f in fresh.column_names]
    spec = UNPARTITIONED_PARTITION_SPEC
    if fields:
        spec = PartitionSpec(PartitionField(source_id=fresh.find_field(fields[0]).field_id, field_id=1000,
                                            transform=IdentityTransform(), name=fields[0]))
    props = {**_properties(table, kind), "schema.name-mapping.default": _name_mapping(fresh, schema)}
    md = new_table_metadata(fresh, spec, UNSORTED_SORT_ORDER, location(table), props, table_uuid=_table_uuid(table))
    created = _instant_ms(table.timeline.entry(1)["instant"]) if table.timeline.last_seq else 0
    return md.model_copy(update={"last_updated_ms": created})


# -- the hook ----------------------------------------------------------------------------------

def mirror_commit(table: "Table", seq: int) -> list[int]:
    """Write metadata version ``seq`` for the completed entry ``seq``; if version ``seq - 1``
    is missing (a crash, a writer that did not mirror), :func:`repair` writes the gap first.

    Costs one existence check of the previous version, one read of its metadata, the manifests
    pyiceberg reads to drop removed files, the footer of each file the entry added, and the
    writes: a manifest per kind of change, the manifest list, the metadata (a conditional PUT)
    and the hint. Returns the versions written."""
    if seq < 1:
        return []
    require()  # a table created with --mirror iceberg where pyiceberg is missing: the hook's warning says so
    if not table.io.exists(metadata_file(table, seq - 1)):
        return repair(table, upto=seq)
    tl = table.timeline
    prev = FileSystemView.at_seq(tl, seq - 1)
    from spark_jobs.table.delta import _advance

    cur = _advance(tl, prev, seq)
    try:
        written = [seq] if _write_version(table, seq, prev, cur, replace=False,
                                          kind=projection_kind(table, cur.properties)) else []
    except _OtherView:  # this entry changed the view: every version is rewritten in the new one
        report = verify_and_repair(table)
        return sorted(report.written + report.rewritten)
    _advance_hint(table, seq)
    return written


def repair(table: "Table", *, upto: int | None = None) -> list[int]:
    """Write every missing version up to ``upto`` (default: the current sequence), each from
    the one before; idempotent. Returns the versions written."""
    from spark_jobs.table.delta import gap

    present = set(versions_present(table))
    found = gap(table, present=present, upto=upto)
    if found is None:
        return []
    tl, start, last, first = found
    kind = _latest_kind(table, tl)
    written: list[int] = []
    for v, prev, cur in _views(table, tl, start=start, last=last):
        if v in present:
            continue
        try:
            if (_write_version0(table, first, replace=False, kind=kind) if v == 0
                    else _write_version(table, v, prev, cur, replace=False, kind=kind)):
                written.append(v)
        except _OtherView:  # the versions before the gap are in another view: rewrite them all
            report = verify_and_repair(table)
            return sorted(report.written + report.rewritten)
        present.add(v)
    if written:
        _advance_hint(table, last)
    return written


def _views(table: "Table", tl: Any, *, start: int, last: int
           ) -> Iterator[tuple[int, FileSystemView | None, FileSystemView | None]]:
    """``(v, view after v - 1, view after v)`` for ``v`` in ``start..last``, replayed once."""
    from spark_jobs.table.delta import _advance

    prev = FileSystemView.at_seq(tl, start - 1) if start > 0 else None
    for v in range(start, last + 1):
        if v == 0:
            yield 0, None, None
            prev = FileSystemView.at_seq(tl, 0)
            continue
        assert prev is not None
        cur = _advance(tl, prev, v)
        yield v, prev, cur
        prev = cur


def _write_version0(table: "Table", schema: pa.Schema, *, replace: bool, kind: str) -> bool:
    md = _version0(table, schema, kind)
    data = md.model_dump_json().encode()
    path = metadata_file(table, 0)
    if replace:
        table.io.write_atomic(path, data)
        return True
    try:
        table.io.create_exclusive(path, data)
        return True
    except InstantExistsError:
        got = _read_metadata(table, 0)
        if got.properties.get(PROJECTION_PROPERTY) != kind:
            raise _OtherView()
        if got.table_uuid != md.table_uuid or got.snapshots:
            raise TableCorruptError(f"Iceberg metadata version 0 of {table.display_uri} is not the empty table this "
                                    f"timeline starts with: something else wrote it; move {METADATA_DIR}/ aside "
                                    f"and run `bucketindex mirror --repair`", path=path) from None
        return False


def _advance_hint(table: "Table", version: int) -> None:
    """``version-hint.text`` := ``version`` unless it names a later one already (a racing
    writer's): readers that take the directory open the hinted version."""
    path = posixpath.join(metadata_dir(table), VERSION_HINT)
    try:
        current = int(table.io.read_bytes(path).decode().strip())
    except (FileNotFoundError, OSError, ValueError, UnicodeDecodeError):
        current = -1
    if current < version:
        table.io.write_atomic(path, str(version).encode())


# -- one version -------------------------------------------------------------------------------

def _write_version(table: "Table", version: int, prev: FileSystemView, cur: FileSystemView, *,
                   replace: bool, kind: str) -> bool:
    """Commit metadata version ``version`` (the change from ``prev`` to ``cur``) on top of
    version ``version - 1``, in view ``kind`` (:func:`projection_kind`). Returns whether this
    call wrote it (False: an equal one was there); :class:`_OtherView` when version ``version -
    1`` is in another view."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException
    from pyiceberg.table import Table as IcebergTable

    from spark_jobs.table.delta import _first_schema
    from spark_jobs.table.table import retention

    assert table.config is not None
    entry = table.timeline.entry(version)
    base = _read_metadata(table, version - 1)
    if base.properties.get(PROJECTION_PROPERTY) != kind:
        raise _OtherView()
    io = _file_io(table)
    prev_ms = base.current_snapshot().timestamp_ms if base.current_snapshot() else 0
    ts_ms = _floor_ms(entry, prev_ms)
    catalog = _catalog(table, version, timestamp_ms=ts_ms, replace=replace)
    itable = IcebergTable(("bucketindex", table.display_uri), base, metadata_uri(table, version - 1), io, catalog)
    new_schema = cur.schema or prev.schema or _first_schema(table, version)
    assert new_schema is not None
    check_supported(table, new_schema)
    tx = itable.transaction()
    if _shape(_iceberg_schema(new_schema)) != _shape(base.schema()):
        with tx.update_schema() as us:
            us.union_by_name(iceberg_arrow_schema(new_schema))
    if entry["action"] == Action.CLEAN:
        # clean deleted the files of every snapshot before its retained window: Iceberg's
        # expire_snapshots (metadata only) drops them, so readers list only snapshots they can read
        earliest = retention(entry["instant"], entry["metadata"])["earliest_retained_seq"]
        gone = [s.snapshot_id for s in base.snapshots if s.snapshot_id < earliest]
        if gone:
            from pyiceberg.table.update.snapshot import ExpireSnapshots

            ExpireSnapshots(tx).by_ids(gone).commit()
    md = tx.table_metadata  # pyiceberg recomputes it on each access (a deep copy): once
    summary = {SUMMARY_SEQ: str(version), SUMMARY_INSTANT: entry["instant"], SUMMARY_ACTION: entry["action"]}
    if kind == VIEW_FRESH:
        gone, new, stale = _fresh_changes(table, md, io, cur, new_schema)
        if stale:
            summary[SUMMARY_STALE] = str(stale)
        producer = _producer(tx, io, snapshot_id=version, removed=bool(gone), added=bool(new), properties=summary)
        for f in gone:
            producer.remove_file(f)
        for f in new:
            producer.add_file(f)
    else:
        before = {s.path: s for s in prev.slices()}
        after = {s.path: s for s in cur.slices()}
        removed = sorted(set(before) - set(after))
        added = sorted(set(after) - set(before))
        producer = _producer(tx, io, snapshot_id=version, removed=bool(removed), added=bool(added), properties=summary)
        for path in removed:
            # named by path (a DataFile is its path to pyiceberg); pyiceberg finds the live entry in
            # the manifests and refuses the commit if a named file is not live (ValidationException)
            producer.delete_data_file(_named(md, _file_uri(table, path)))
        for path in added:
            producer.append_data_file(_data_file(table, md, io, after[path]))
    try:
        producer.commit()
    except ValidationException as e:
        raise TableCorruptError(f"Iceberg metadata version {version - 1} of {table.display_uri} does not list every "
                                f"file sequence entry {version} removes ({str(e).splitlines()[0][:300]}): run "
                                f"`bucketindex mirror --repair`", path=metadata_file(table, version - 1)) from None
    try:
        tx.commit_transaction()
        return True
    except CommitFailedException:
        got = _read_metadata(table, version)
        snap = got.current_snapshot()
        if snap is None or snap.snapshot_id != version or (snap.summary or {}).get(SUMMARY_INSTANT) != entry["instant"]:
            raise TableCorruptError(
                f"Iceberg metadata version {version} of {table.display_uri} is not what sequence entry {version} "
                f"projects to: something else wrote it; move {METADATA_DIR}/ aside and run `bucketindex mirror "
                f"--repair`", path=metadata_file(table, version)) from None
        return False


def _shape(schema: Any) -> list[tuple[str, str, bool]]:
    """An Iceberg schema without its field ids: what a schema change changes."""
    return [(f.name, str(f.field_type), f.required) for f in schema.fields]


#: merge the manifests once a snapshot would name this many: every commit adds one, and each
#: commit reads them all (the removed files' entries), so an unmerged history costs a read per
#: commit so far (measured: 40 GETs + 40 HEADs per commit after 20 commits on S3)
MANIFEST_MIN_MERGE_COUNT = 8

_PRODUCER_CLASS: Any = None


def _producer(tx: Any, io: Any, *, snapshot_id: int, removed: bool, added: bool, properties: dict[str, str]) -> Any:
    """pyiceberg's overwrite producer (it both adds and removes data files in one snapshot)
    with pyiceberg's manifest merging (``_ManifestMergeManager``, what its ``merge_append``
    uses, so the manifests a snapshot names stay few), the operation named after what changed
    and the snapshot id the sequence number.

    pyiceberg draws snapshot ids at random and takes no id or operation from its callers, so
    both are set on the producer before it writes anything (the manifests carry the id): a
    rebuilt projection then has the same snapshot ids, and ``scan(snapshot_id=n)`` is entry
    ``n``. ``tests/unit/test_iceberg_mirror.py`` pins both, so a pyiceberg that changes the
    producer fails there, not in readers' hands; ``tests/unit/test_iceberg_fresh.py`` pins what the
    fresh view adds (delete manifests through ``ManifestWriterV2``, ``_existing_manifests`` per
    content, the summary counting delete files)."""
    global _PRODUCER_CLASS
    from pyiceberg.table.snapshots import Operation

    if _PRODUCER_CLASS is None:
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus, \
            ManifestWriterV2
        from pyiceberg.table.update.snapshot import _ManifestMergeManager, _OverwriteFiles

        class _DeleteManifestWriter(ManifestWriterV2):
            """pyiceberg's v2 manifest writer for a *delete* manifest: pyiceberg (0.12) writes data
            manifests only (its ``ManifestWriterV2`` fixes ``content`` to data; apache/iceberg-python
            PR 4002 makes it a parameter), and a position-delete file must be listed in a manifest
            whose content is ``deletes`` (Iceberg spec: "Manifests"). The entries, Avro schema and
            file are pyiceberg's; only the content it declares differs."""

            def content(self) -> Any:
                return ManifestContent.DELETES

            @property
            def _meta(self) -> dict[str, str]:
                return {**super()._meta, "content": "deletes"}

        class _DeleteSide:
            """The producer as pyiceberg's manifest merger sees it when it merges delete
            manifests: every merged manifest is written as a delete manifest."""

            def __init__(self, producer: Any) -> None:
                self._producer = producer

            def __getattr__(self, name: str) -> Any:
                return getattr(self._producer, name)

            def new_manifest_writer(self, spec: Any) -> Any:
                return self._producer.manifest_writer(ManifestContent.DELETES, spec)

        class _MergingOverwrite(_OverwriteFiles):
            #: position-delete files this snapshot adds and removes (the fresh view): kept apart
            #: from pyiceberg's data files, which it validates and writes as data
            bi_added_deletes: list[Any]
            bi_removed: set[Any]

            def add_file(self, f: Any) -> None:
                """Add a data file or a position-delete file."""
                if f.content == DataFileContent.DATA:
                    self.append_data_file(f)
                else:
                    self.bi_added_deletes.append(f)

            def remove_file(self, f: Any) -> None:
                """Remove a live data file or position-delete file (the live ``DataFile``)."""
                self.bi_removed.add(f)
                if f.content == DataFileContent.DATA:
                    self.delete_data_file(f)

            def manifest_writer(self, content: Any, spec: Any) -> Any:
                """pyiceberg's manifest writer for ``content`` (data, or deletes: :class:`_DeleteManifestWriter`)."""
                if content == ManifestContent.DATA:
                    return self.new_manifest_writer(spec)
                return _DeleteManifestWriter(spec, self.schema(), self.new_manifest_output(), self._snapshot_id,
                                             self._compression)

            def _build_delete_files_partition_predicate(self) -> None:
                # the files to remove are named by path alone (see _deleted_entries): every
                # manifest is read, as it would be anyway (each commit's manifest spans partitions)
                self._predicate = AlwaysTrue()

            def _deleted_entries(self) -> list[Any]:
                entries = super()._deleted_entries()  # pyiceberg checks every named data file is live
                # the live DataFiles, not the path-only ones they were named by: the summary's
                # removed counts and sizes come from these (and from the removed delete files)
                self._deleted_data_files = {e.data_file for e in entries} | {
                    f for f in self.bi_removed if f.content != DataFileContent.DATA}
                return entries

            def _existing_manifests(self) -> list[Any]:
                """pyiceberg's ``_OverwriteFiles._existing_manifests`` for data *and* delete
                manifests: each live manifest is kept, or rewritten without the removed files in
                a manifest of its own content (pyiceberg's would write a delete manifest's
                entries into a data manifest); and the added delete files, in a delete manifest."""
                removed = set(self.bi_removed) | set(self._deleted_data_files)
                out = []
                snap = self._transaction.table_metadata.snapshot_by_name(name=self._target_branch)
                for manifest in snap.manifests(io=self._io) if snap is not None else []:
                    entries = manifest.fetch_manifest_entry(io=self._io, discard_deleted=True)
                    kept = [e for e in entries if e.data_file not in removed]
                    if len(kept) == len(entries):
                        out.append(manifest)
                        continue
                    if kept:
                        with self.manifest_writer(manifest.content, self.spec(manifest.partition_spec_id)) as w:
                            for e in kept:
                                w.existing(e)
                        out.append(w.to_manifest_file())
                if self.bi_added_deletes:
                    with self.manifest_writer(ManifestContent.DELETES, self._transaction.table_metadata.spec()) as w:
                        for f in self.bi_added_deletes:
                            w.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED,
                                                          snapshot_id=self._snapshot_id, sequence_number=None,
                                                          file_sequence_number=None, data_file=f))
                    out.insert(0, w.to_manifest_file())  # the merger takes the first one as the new one
                return out

            def _summary(self, snapshot_properties: Any = None) -> Any:
                # pyiceberg counts the files it was given to add; the added delete files are counted too
                # (added-position-deletes, total-position-deletes)
                data = self._added_data_files
                self._added_data_files = data + self.bi_added_deletes
                try:
                    return super()._summary(snapshot_properties or {})
                finally:
                    self._added_data_files = data

            def _process_manifests(self, manifests: list[Any]) -> list[Any]:
                data = [m for m in manifests if m.content == ManifestContent.DATA]
                deletes = [m for m in manifests if m.content == ManifestContent.DELETES]

                def merger(producer: Any) -> Any:
                    return _ManifestMergeManager(target_size_bytes=8 * 1024 * 1024,
                                                 min_count_to_merge=MANIFEST_MIN_MERGE_COUNT, merge_enabled=True,
                                                 snapshot_producer=producer)

                return merger(self).merge_manifests(data) + merger(_DeleteSide(self)).merge_manifests(deletes)

        _PRODUCER_CLASS = _MergingOverwrite
    op = Operation.OVERWRITE if removed and added else Operation.DELETE if removed else Operation.APPEND
    producer = _PRODUCER_CLASS(operation=op, transaction=tx, io=io, snapshot_properties=properties)
    producer._snapshot_id = snapshot_id
    producer.bi_added_deletes, producer.bi_removed = [], set()
    return producer


def _named(md: Any, uri: str) -> Any:
    """A DataFile that only names ``uri``: what ``delete_data_file`` matches live entries by."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    return DataFile.from_args(content=DataFileContent.DATA, file_path=uri, file_format=FileFormat.PARQUET,
                              partition=Record(*[None for _ in md.spec().fields]), record_count=0,
                              file_size_in_bytes=0, spec_id=md.default_spec_id)


def _data_files(md: Any, io: Any) -> dict[str, Any]:
    """The live data files of ``md``'s current snapshot by path."""
    snap = md.current_snapshot()
    out: dict[str, Any] = {}
    if snap is None:
        return out
    for m in snap.manifests(io):
        for e in m.fetch_manifest_entry(io, discard_deleted=True):
            out[e.data_file.file_path] = e.data_file
    return out


def _data_file(table: "Table", md: Any, io: Any, s: FileSlice, *, log: LogFile | None = None,
               partition: list[Any] | None = None) -> Any:
    """The pyiceberg ``DataFile`` of base ``s`` (or of its log ``log``: the fresh view):
    pyiceberg's own statistics of its footer (what ``add_files`` computes: counts, null counts,
    bounds truncated as the table's metrics mode says), and its partition value read from the
    file (:func:`_partition_record`; ``partition``: already read, a log's being its base's)."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    from spark_jobs.table.delta import _footer

    rel, rows, size = (s.path, s.num_rows, s.size) if log is None else (log.path, log.num_rows, log.size)
    schema = md.schema()
    footer = _footer(table, rel)
    stats: dict[str, Any] = {"record_count": rows}
    if footer is not None:
        if is_reference(rel):
            from pyiceberg.io.pyarrow import schema_to_pyarrow

            check_file(table, rel, footer, schema_to_pyarrow(schema, include_field_ids=False))
        stats = _footer_statistics(footer, schema, md.properties)
    if partition is None:
        partition = _partition_record(table, md, s, footer)
    return DataFile.from_args(content=DataFileContent.DATA, file_path=_file_uri(table, rel),
                              file_format=FileFormat.PARQUET, partition=Record(*partition),
                              file_size_in_bytes=int(size) or int(table.io.size(table.abs(rel))),
                              sort_order_id=None, spec_id=md.default_spec_id, equality_ids=None, key_metadata=None,
                              **stats)


# -- the fresh view of a merge-on-read table (issue 39 item 2) ----------------------------------

def _deletes_rel(s: FileSlice) -> str:
    """The position-delete file of slice ``s`` in the fresh view, relative to the table root:
    named by the slice's files (a hash of their paths), so its content -- a function of those
    immutable files -- is the same whoever writes it, a slice that gains a log gets a new one,
    and an unchanged slice keeps its own."""
    import hashlib

    digest = hashlib.sha256("\n".join(s.files).encode()).hexdigest()[:32]
    return posixpath.join(METADATA_DIR, DELETES_DIR, f"{digest}-deletes.parquet")


def _delete_file(table: "Table", md: Any, s: FileSlice, drops: dict[str, Any], partition: list[Any]) -> Any:
    """Write slice ``s``'s position-delete file (:func:`_deletes_rel`) and return its pyiceberg
    ``DataFile``: Parquet with the spec's ``file_path`` (the data file's URI as the manifests
    name it) and ``pos`` (0-based row position) columns and field ids, sorted by both, in the
    slice's partition; its ``file_path`` bounds let readers match it to the files it names.
    Written whole or not at all (``write_atomic``); a second writer writes the same bytes."""
    import io as _io

    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    uris = sorted((_file_uri(table, rel), positions) for rel, positions in drops.items())
    paths = pa.array([u for u, p in uris for _ in range(len(p))], pa.string())
    pos = pa.array([int(x) for _, p in uris for x in p], pa.int64())
    schema = pa.schema([pa.field("file_path", pa.string(), nullable=False,
                                 metadata={b"PARQUET:field_id": str(DELETE_FILE_PATH_ID).encode()}),
                        pa.field("pos", pa.int64(), nullable=False,
                                 metadata={b"PARQUET:field_id": str(DELETE_POS_ID).encode()})])
    buf = _io.BytesIO()
    pq.write_table(pa.table([paths, pos], schema=schema), buf)
    data = buf.getvalue()
    rel = _deletes_rel(s)
    table.io.write_atomic(table.abs(rel), data)
    first, last = uris[0][0].encode(), uris[-1][0].encode()
    return DataFile.from_args(content=DataFileContent.POSITION_DELETES, file_path=_file_uri(table, rel),
                              file_format=FileFormat.PARQUET, partition=Record(*partition),
                              record_count=len(pos), file_size_in_bytes=len(data),
                              lower_bounds={DELETE_FILE_PATH_ID: first}, upper_bounds={DELETE_FILE_PATH_ID: last},
                              sort_order_id=None, spec_id=md.default_spec_id, equality_ids=None, key_metadata=None)


def _fresh_changes(table: "Table", md: Any, io: Any, cur: FileSystemView,
                   schema: pa.Schema | None) -> "tuple[list[Any], list[Any], int]":
    """What the fresh view's snapshot of ``cur`` removes from and adds to the live files of
    ``md``'s current snapshot (data and position-delete files), and how many file groups it
    shows as of their last compaction (:func:`~spark_jobs.table.delta.slice_deletes`).

    A slice whose files are all live already is unchanged (its delete file, named by those
    files, too); only a changed slice -- a new base, a new log -- is planned, reading its key
    and precombine columns. Diffing against the live files rather than the previous view makes
    a version the same whatever the previous one held."""
    from spark_jobs.table.delta import _footer, slice_deletes

    live = _data_files(md, io)
    keep: set[str] = set()
    added: list[Any] = []
    stale = 0
    for s in cur.slices():
        uris = [_file_uri(table, rel) for rel in s.files]
        deletes_uri = _file_uri(table, _deletes_rel(s))
        if all(u in live for u in uris):
            keep.update(uris)
            if deletes_uri in live:
                keep.add(deletes_uri)
            continue
        published, drops = slice_deletes(table, s, schema)
        if s.logs and published == [s.path]:
            stale += 1
            log.warning("the fresh Iceberg view of %s shows file group %s/%s as of its last compaction: it holds a "
                        "partial-update log, which position deletes cannot express", table.display_uri,
                        s.partition, s.file_id)
        base = live.get(uris[0])
        # the base's partition tuple: from its live entry when it has one (no footer read), else its file
        partition = [base.partition[i] for i in range(len(base.partition))] if base is not None \
            else _partition_record(table, md, s, _footer(table, s.path))
        logs = {lf.path: lf for lf in s.logs}
        for rel in published:
            u = _file_uri(table, rel)
            if u in live:
                keep.add(u)
            else:
                added.append(_data_file(table, md, io, s, log=logs.get(rel), partition=partition))
        if drops:
            if deletes_uri in live:
                keep.add(deletes_uri)
            else:
                added.append(_delete_file(table, md, s, drops, partition))
    new = {f.file_path for f in added}
    removed = [f for u, f in live.items() if u not in keep and u not in new]
    return removed, added, stale


_SINK = -1  # the field id the footer's columns outside the published schema are counted under


def _footer_statistics(footer: "pq.FileMetaData", schema: Any, properties: Any) -> dict[str, Any]:
    """pyiceberg's ``data_file_statistics_from_parquet_metadata`` (what ``add_files`` uses) for a
    file that also holds columns the published schema leaves out (``_bi_key``, ``_bi_op``):
    those are counted under a field id whose metrics mode is ``none``, then dropped."""
    from pyiceberg.io.pyarrow import MetricModeTypes, MetricsMode, StatisticsCollector, compute_statistics_plan, \
        data_file_statistics_from_parquet_metadata, parquet_path_to_id_mapping
    from pyiceberg.types import StringType

    plan = dict(compute_statistics_plan(schema, properties))
    plan[_SINK] = StatisticsCollector(field_id=_SINK, iceberg_type=StringType(),
                                      mode=MetricsMode(MetricModeTypes.NONE), column_name=INTERNAL_PREFIX)

    class _Mapping(dict):  # type: ignore[type-arg]
        def __missing__(self, key: str) -> int:
            return _SINK

    stats = data_file_statistics_from_parquet_metadata(parquet_metadata=footer, stats_columns=plan,
                                                       parquet_column_mapping=_Mapping(parquet_path_to_id_mapping(schema)))
    for counted in (stats.column_sizes, stats.value_counts, stats.null_value_counts, stats.column_aggregates):
        counted.pop(_SINK, None)
    return stats.to_serialized_dict()


def _partition_record(table: "Table", md: Any, s: FileSlice, footer: "pq.FileMetaData | None") -> list[Any]:
    """The file's partition tuple: the one value of the partition field the file holds, read
    from its footer statistics or its column (a reference file: its Hive directory), as
    Delta's projection reads it -- never decoded from the directory name, which may be
    shortened -- in pyiceberg's partition representation."""
    from pyiceberg.partitioning import partition_record_value

    from spark_jobs.table.delta import _value_from_file

    spec = md.spec()
    if not spec.fields:
        return []
    field = spec.fields[0]
    schema = md.schema()
    name = schema.find_field(field.source_id).name
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    typ = schema_to_pyarrow(schema, include_field_ids=False).field(name).type
    value = _value_from_file(table, s, name, typ, footer)
    if isinstance(value, _dt.datetime) and pa.types.is_timestamp(typ) and typ.tz is not None and value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)  # footer statistics of a UTC column: naive UTC
    return [partition_record_value(field, value, schema)]


# -- verify and repair (`bucketindex mirror --repair`) -----------------------------------------

def _sound(table: "Table", version: int, view: FileSystemView | None, entry: dict[str, Any] | None,
           kind: str) -> bool:
    """Whether metadata version ``version`` is what the timeline projects: it parses, it is in
    view ``kind``, its current snapshot is ``version`` of the entry's instant (none for version
    0), it lists the snapshot's bases (the fresh view: and their logs, and only delete files
    named after the snapshot's slices) and publishes the snapshot's columns."""
    from pyiceberg.manifest import DataFileContent

    try:
        md = _read_metadata(table, version)
        if md.properties.get(PROJECTION_PROPERTY) != kind:
            return False
        snap = md.current_snapshot()
        if version == 0:
            return snap is None and md.table_uuid == _table_uuid(table)
        assert view is not None and entry is not None
        if snap is None or snap.snapshot_id != version or (snap.summary or {}).get(SUMMARY_INSTANT) != entry["instant"]:
            return False
        files = _data_files(md, _file_io(table))
        data = {u for u, f in files.items() if f.content == DataFileContent.DATA}
        bases = {_file_uri(table, s.path) for s in view.slices()}
        if kind != VIEW_FRESH:
            if data != bases or len(files) != len(data):
                return False
        else:
            logs = {_file_uri(table, lf.path) for s in view.slices() for lf in s.logs}
            names = {_file_uri(table, _deletes_rel(s)) for s in view.slices() if s.logs}
            # a slice with a partial-update log publishes its base alone (delta.slice_deletes)
            if not bases <= data <= bases | logs or not set(files) - data <= names:
                return False
        names = [f.name for f in iceberg_arrow_schema(view.schema)] if view.schema is not None else None
        return names is None or md.schema().column_names == names
    except Exception:  # noqa: BLE001 - anything that does not read back is not sound
        return False


def verify_and_repair(table: "Table") -> "RepairReport":
    """``bucketindex mirror TABLE --repair`` for the Iceberg projection: check every version
    (:func:`_sound`), create the missing ones and write again each one that is not sound,
    from the version before it (checked first, so a rewrite builds on a sound version; a
    version whose manifests are damaged is unsound, and so is every later one still naming
    them, so they are all rewritten). Replacing is atomic (rename on disk, one PUT on S3). A version file past the
    last sequence entry is reported in one line (TableCorruptError) and left in place."""
    from spark_jobs.table.delta import RepairReport, _first_schema

    present_before = set(versions_present(table))
    tl = table.timeline.reload()
    last = tl.last_seq
    written: list[int] = []
    rewritten: list[int] = []
    stray = sorted(v for v in present_before if v > last)
    first = _first_schema(table, last)
    if first is not None:
        present = set(versions_present(table))
        kind = _latest_kind(table, tl)
        for v, prev, cur in _views(table, tl, start=0, last=last):
            entry = tl.entry(v) if v else None
            if v in present and _sound(table, v, cur, entry, kind):
                continue
            replace = v in present
            ok = (_write_version0(table, first, replace=replace, kind=kind) if v == 0
                  else _write_version(table, v, prev, cur, replace=replace, kind=kind))  # type: ignore[arg-type]
            if replace:
                rewritten.append(v)
                log.warning("rewrote Iceberg metadata version %d of %s: it was not what sequence entry %d "
                            "projects to", v, table.display_uri, v)
            elif ok:
                written.append(v)
        if written or rewritten:
            path = posixpath.join(metadata_dir(table), VERSION_HINT)
            table.io.write_atomic(path, str(last).encode())
        else:
            _advance_hint(table, last)
    if stray:
        raise TableCorruptError(
            f"Iceberg metadata version {stray[0]} of {table.display_uri} has no sequence entry (the last is {last}): "
            f"something else wrote it; move {', '.join(metadata_file(table, v) for v in stray)} aside "
            f"(versions 0..{last} are repaired)", path=metadata_file(table, stray[0]))
    return RepairReport(version=last, written=written, rewritten=rewritten, checkpoints=[])
