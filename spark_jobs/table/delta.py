"""The Delta Lake projection of a table (format.md "Delta Lake projection", issue 26).

Other engines read Delta; they do not read bucketindex's timeline. So a table with
``mirrors: ["delta"]`` in ``table.json`` (``--mirror delta`` at creation) or in the properties
its timeline set (``bucketindex mirror --enable delta``, :mod:`spark_jobs.table.action.mirror`)
gets, after every commit point, a ``_delta_log/<seq as 20 digits>.json`` that describes the
same snapshot in Delta's terms: **Delta version = commit sequence number**. Version 0 (``protocol`` + ``metaData`` with the
first schema, no files) is the empty table before sequence entry 1; version ``n`` is the
snapshot right after entry ``n`` (``read_arrow(uri, as_of=<instant of entry n>)``). An entry
that changes no file (a clean, a rollback, an ``alter`` without a new schema, a merge-on-read
log -- see below) is a version with only ``commitInfo``, so the numbers never drift apart.

The projection is *derived*, never the source of truth: a version is computed from the typed
commit metadata (``FileSystemView.apply`` replays it) as the difference between the views
after entries ``n - 1`` and ``n``, with the same create-if-absent primitive as the sequence
(``FileIO.create_exclusive``: temp + ``link`` on disk, ``If-None-Match: *`` on S3), so two
processes can never publish two different version ``n`` files. Its content is a function of
the timeline alone (times from the entries, ids from the table's first entry, statistics from
the data files' footers), so a second process that computes the same version writes the same
actions and finding it already there is fine; a *different* one is a bug and raises.

A crash between the commit point and the log write leaves Delta readers at the previous
version (consistent, only stale). The next commit's hook sees its predecessor missing and
calls :func:`repair`, which writes every missing version up to the current sequence (one
HEAD per commit: a version that is present but damaged is not seen there).
``bucketindex mirror TABLE --repair`` (:func:`verify_and_repair`) checks every version against
the timeline and rewrites what differs, and the checkpoints built from it.

**Merge-on-read**: the projection is by default the *read-optimized view* -- bases only, so a
log's rows reach Delta readers when compaction folds them into a new base. Deletion vectors would show
them at once (the Iceberg projection's fresh view does so with position deletes), and
``mirror --enable delta --view fresh`` writes them (:func:`_fresh_diff`: inline vectors) --
for a table whose every path Polars reads right only (:func:`fresh_view_refusal`). Measured
with ``benchmarks/delta_dv_probe.py``: ``deltalake`` 1.6's ``to_pyarrow_table``/``to_pyarrow_dataset``
(what pandas and pyarrow users call) refuse any table whose protocol names the
``deletionVectors`` reader feature (a clear refusal), its DataFusion ``QueryBuilder`` applies
them, and Polars 2.1's ``read_delta``/``scan_delta`` ignore a deletion vector whose file's
``add.path`` holds a percent-escape and return the rows it deletes (``polars/io/delta/_dataset.py``
joins the decoded ``file_uris()`` with the still-encoded ``deletion_vectors()`` paths). No path
form avoids the escape for a partition directory holding a literal ``%`` (every string value
outside ``[A-Za-z0-9*._-]`` and space, every timestamp): ``%25`` in a URI. So the fresh view
is offered for unpartitioned tables and integer, date, boolean and decimal partition fields,
whose directory names hold no ``%``, with paths escaped only where a URI path may not hold a
character raw (:func:`_delta_path`: ``region=7``, not ``region%3D7``); a string or timestamp
partition field is refused in one line. Copy-on-write tables have no logs, so
their projection is exact.

No pyspark, no airflow. ``deltalake`` is optional: it is used only to write Parquet checkpoints
(every :data:`CHECKPOINT_INTERVAL` versions); without it readers replay the JSON log.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import posixpath
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.exceptions import BadInputError, TableCorruptError
from spark_jobs.io.filesystem import InstantExistsError
from spark_jobs.io.storage import redact_uri
from spark_jobs.table.config import MIRRORS
from spark_jobs.table.config import table_mirrors as mirrors  # defined there: an upsert loads no projection module
from spark_jobs.table.layout import is_reference
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import FileSlice, FileSystemView

if TYPE_CHECKING:
    from spark_jobs.table.table import Table

__all__ = ["MIRROR_DELTA", "MIRRORS", "DELTA_LOG", "CHECKPOINT_INTERVAL", "mirror_commit", "repair", "gap",
           "verify_and_repair", "RepairReport", "partition_columns",
           "mirrors", "enabled", "mirror_view", "VIEWS", "VIEW_READ_OPTIMIZED", "VIEW_FRESH", "FRESH_VIEW_MIRRORS",
           "VIEWS_PROPERTY", "delta_schema", "versions_present", "version_actions",
           "reader_uri", "reader_storage_options"]

log = logging.getLogger("bucketindex.delta")

MIRROR_DELTA = "delta"
assert MIRROR_DELTA in MIRRORS  # the projections a table may ask for
DELTA_LOG = "_delta_log"
#: a Parquet checkpoint every this many versions: Delta's default, and the timeline's
CHECKPOINT_INTERVAL = 10
#: ``metaData.id`` is a name-based UUID of the table's first entry, so every process derives the same
_ID_NAMESPACE = uuid.UUID("6b1f3a52-2a5e-4c3f-9d0b-6c1d2e0f4a11")
_VERSION_NAME = re.compile(r"^(\d{20})\.json$")
#: string statistics longer than this are left out: Delta truncates them, and a long value costs bytes
MAX_STAT_STRING = 64
INTERNAL_PREFIX = "_bi_"


# -- config --------------------------------------------------------------------------------

def enabled(table: "Table", properties: "dict[str, Any] | None" = None) -> bool:
    """Whether ``table`` asks for the Delta projection (see :func:`mirrors`)."""
    return MIRROR_DELTA in mirrors(table, properties)


#: the views of a merge-on-read table a projection can publish (``bucketindex mirror TABLE --enable
#: iceberg --view fresh``): the bases as of each file group's last compaction (the default), or
#: every commit's rows, logs as added data files and the rows their merge drops as deletes
VIEW_READ_OPTIMIZED, VIEW_FRESH = "read_optimized", "fresh"
VIEWS = (VIEW_READ_OPTIMIZED, VIEW_FRESH)
#: the projections that can publish the fresh view: Iceberg (position-delete files) and Delta
#: (inline deletion vectors; only for tables whose paths Polars 2.1 reads right:
#: :func:`fresh_view_refusal`, module docstring)
FRESH_VIEW_MIRRORS = ("iceberg", "delta")
#: the timeline property naming each projection's view (absent, or a projection absent from it:
#: read-optimized), set with the ``mirrors`` list by ``bucketindex mirror --enable``
VIEWS_PROPERTY = "mirror_views"


def mirror_view(table: "Table", mirror: str, properties: "dict[str, Any] | None" = None) -> str:
    """The view of the merge-on-read table ``table`` that projection ``mirror`` publishes, from the
    snapshot's ``properties`` (default: the latest view's): :data:`VIEW_FRESH` or
    :data:`VIEW_READ_OPTIMIZED`. A copy-on-write table has no logs: both views are the table."""
    if properties is None:
        properties = table.view().properties if table.config is not None else {}
    return (properties.get(VIEWS_PROPERTY) or {}).get(mirror, VIEW_READ_OPTIMIZED)


# -- the fresh view of a merge-on-read table: deletion vectors (issue 39 item 2) ----------------

def slice_deletes(table: "Table", s: FileSlice, schema: pa.Schema | None) -> "tuple[list[str], dict[str, Any]]":
    """The files slice ``s`` publishes in the fresh view and, by file, the row positions its
    merge drops (:func:`~spark_jobs.table.merge.plan_slice`: stale or superseded base rows; of
    each log, every row that is not its key's winner -- superseded, stale by precombine, and the
    delete and move-out rows themselves). Reads the key, precombine and op columns only.

    A slice holding a partial-update log publishes its base only (the read-optimized view of
    that file group, until compaction folds the log): its merge overlays columns, which no set
    of positions expresses, and publishing the log's rows would show wrong values."""
    import numpy as np

    from spark_jobs.table.reader import read_slice_plan

    assert table.config is not None
    if not s.logs:
        return [s.path], {}
    plan, logs = read_slice_plan(table, s.path, [lf.path for lf in s.logs],
                                 precombine=table.config.precombine_field, schema=schema)
    if plan.partial:
        return [s.path], {}
    drops: dict[str, Any] = {}
    if len(plan.dropped):
        drops[s.path] = np.sort(plan.dropped)
    for lf, lg, live in zip(s.logs, logs, plan.live):
        dead = np.setdiff1d(np.arange(lg.num_rows, dtype=np.int64), live)
        if dead.size:
            drops[lf.path] = dead
    return s.files, drops


#: the fresh view's published files of slices planned by this process, by the table and the
#: slice's files (immutable, so a plan stays true): a commit plans the slice it changed and,
#: next commit, the same slice as the previous version's
_PLANS: "dict[tuple[str, ...], dict[str, Any]]" = {}
_PLANS_MAX = 4096

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def _z85(data: bytes) -> str:
    """Z85, the Delta protocol's encoding of an inline deletion vector (zero-padded to 4 bytes)."""
    data = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i:i + 4], "big")
        chunk = []
        for _ in range(5):
            v, r = divmod(v, 85)
            chunk.append(_Z85[r])
        out.append("".join(reversed(chunk)))
    return "".join(out)


def _roaring32(values: Any) -> bytes:
    """The portable serialization of a 32-bit Roaring bitmap of ``values`` (sorted, unique
    uint32): no run containers (cookie 12346, so the offset header is present), an array
    container for <= 4096 values of a 16-bit key, a bitmap container (1024 little-endian
    64-bit words) above."""
    import struct

    import numpy as np

    hi = (values >> 16).astype(np.uint32)
    lo = (values & 0xFFFF).astype(np.uint16)
    keys = np.unique(hi)
    desc, bodies = [], []
    for k in keys:
        vals = lo[hi == k]
        desc.append(struct.pack("<HH", int(k), len(vals) - 1))
        if len(vals) <= 4096:
            bodies.append(vals.astype("<u2").tobytes())
        else:
            bits = np.zeros(65536, dtype=bool)
            bits[vals] = True
            bodies.append(np.packbits(bits, bitorder="little").tobytes())
    offsets, at = [], 8 + 8 * len(keys)
    for body in bodies:
        offsets.append(at)
        at += len(body)
    return (struct.pack("<II", 12346, len(keys)) + b"".join(desc) + struct.pack(f"<{len(keys)}I", *offsets)
            + b"".join(bodies))


def deletion_vector(positions: Any) -> dict[str, Any]:
    """The inline deletion vector (``storageType`` ``i``) of row ``positions``: Delta's
    RoaringBitmapArray (magic 1681511377, the number of 32-bit bitmaps, each with its key and
    portable serialization), Z85-encoded. Inline, so a version's actions are a function of the
    data files alone (no DV file to write, find or lose); its bytes are in the log."""
    import struct

    import numpy as np

    pos = np.unique(np.asarray(positions, dtype=np.uint64))
    high = pos >> np.uint64(32)
    keys = np.unique(high)
    blob = struct.pack("<i", 1681511377) + struct.pack("<q", len(keys)) + b"".join(
        struct.pack("<i", int(k)) + _roaring32((pos[high == k] & np.uint64(0xFFFFFFFF)).astype(np.uint32))
        for k in keys)
    return {"storageType": "i", "pathOrInlineDv": _z85(blob), "sizeInBytes": len(blob), "cardinality": int(len(pos))}


def _fresh_slice(table: "Table", s: FileSlice, schema: pa.Schema | None) -> dict[str, Any]:
    """The files slice ``s`` publishes in the fresh view, each with its log (None: the base) and
    deletion vector (None: no row dropped). A slice whose files are gone (a version older than
    clean's window, repaired late) lists every file without deletion vectors: it cannot be read
    anyway, and :func:`_without_file_facts` compares such versions without them."""
    key = (table.uri, *s.files)
    got = _PLANS.get(key)
    if got is not None:
        return got
    logs = {lf.path: lf for lf in s.logs}
    try:
        published, drops = slice_deletes(table, s, schema)
    except (FileNotFoundError, TableCorruptError):
        return {rel: (logs.get(rel), None) for rel in s.files}
    out = {rel: (logs.get(rel), deletion_vector(drops[rel]) if rel in drops else None) for rel in published}
    if drops and any(_polars_misreads(table, rel) for rel in drops):
        # a vector Polars 2.1 would ignore (module docstring): the file group as of its last
        # compaction, the read-optimized view's -- stale, never wrong (fresh_view_refusal keeps
        # such paths out of a table in the fresh view; this is the backstop)
        log.warning("the fresh Delta view of %s shows file group %s as of its last compaction: its path %s "
                    "holds a percent-escape, on which Polars ignores deletion vectors",
                    table.display_uri, s.file_id, s.path)
        out = {s.path: (None, None)}
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[key] = out
    return out


def _fresh_diff(table: "Table", prev: FileSystemView, cur: FileSystemView, *, old_schema: pa.Schema,
                new_schema: pa.Schema, ts_ms: int, data_change: bool, references: bool
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``remove`` and ``add`` actions of the fresh view from ``prev`` to ``cur``: file
    groups whose files are the same are unchanged; in a changed one, a file that left, or whose
    deletion vector changed, is removed (with the vector it had: Delta names a file by path and
    vector) and a file that entered, or whose vector changed, is added with its new one."""
    before = {(s.partition, s.file_id): s for s in prev.slices()}
    after = {(s.partition, s.file_id): s for s in cur.slices()}
    removes: list[dict[str, Any]] = []
    adds: list[dict[str, Any]] = []
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        if b is not None and a is not None and b.files == a.files:
            continue
        old = _fresh_slice(table, b, old_schema) if b is not None else {}
        new = _fresh_slice(table, a, new_schema) if a is not None else {}
        for rel, (lf, dv) in old.items():
            if rel not in new or new[rel][1] != dv:
                assert b is not None
                rm: dict[str, Any] = {"path": _delta_path(table, rel, fresh=True), "deletionTimestamp": ts_ms,
                                      "dataChange": data_change, "size": int(b.size if lf is None else lf.size)}
                if dv is not None:
                    rm["deletionVector"] = dv
                removes.append({"remove": rm})
        for rel, (lf, dv) in new.items():
            if rel not in old or old[rel][1] != dv:
                assert a is not None
                adds.append({"add": _add(table, a, new_schema, ts_ms=ts_ms, data_change=data_change,
                                         references=references, log=lf, dv=dv, fresh=True)})
    removes.sort(key=lambda x: (x["remove"]["path"], json.dumps(x["remove"].get("deletionVector"))))
    adds.sort(key=lambda x: x["add"]["path"])
    return removes, adds


def _kind(table: "Table", properties: dict[str, Any]) -> str:
    """What the Delta log publishes for the snapshot ``properties``: ``exact`` (copy-on-write),
    or the merge-on-read view :func:`mirror_view` names."""
    assert table.config is not None
    return "exact" if not table.config.merge_on_read else mirror_view(table, MIRROR_DELTA, properties)


def _latest_kind(table: "Table", tl: Any) -> str:
    return _kind(table, FileSystemView.at_seq(tl, tl.last_seq).properties if tl.last_seq else {})


#: the view each table's log was found in by this process (version 0's configuration)
_LOG_KIND: dict[str, str] = {}


def _log_kind(table: "Table") -> str | None:
    """The view the log is written in (version 0's ``bucketindex.projection``), or None when
    version 0 is missing or damaged; one GET per process and table."""
    got = _LOG_KIND.get(table.uri)
    if got is not None:
        return got
    try:
        acts = _parsed(table.io.read_bytes(version_file(table, 0)))
    except (FileNotFoundError, OSError):
        return None
    meta = next((a["metaData"] for a in acts or [] if "metaData" in a), None)
    if meta is None:
        return None
    kind = (meta.get("configuration") or {}).get("bucketindex.projection")
    if kind is not None:
        _LOG_KIND[table.uri] = kind
    return kind


def _rewrite_in(table: "Table", kind: str) -> list[int]:
    """The log is in another view than ``kind`` (the view changed): every version rewritten."""
    log.info("the Delta log of %s is rewritten in the %s view", table.display_uri, kind)
    _LOG_KIND.pop(table.uri, None)
    report = verify_and_repair(table)
    _LOG_KIND[table.uri] = kind
    return sorted(set(report.written) | set(report.rewritten))


# -- paths ---------------------------------------------------------------------------------

def log_dir(table: "Table") -> str:
    return posixpath.join(table.root, DELTA_LOG)


def version_file(table: "Table", version: int) -> str:
    return posixpath.join(log_dir(table), f"{version:020d}.json")


def versions_present(table: "Table") -> list[int]:
    """The versions in ``_delta_log/`` (one listing: only repair and tests ask)."""
    return sorted(int(m.group(1)) for m in map(_VERSION_NAME.match, table.io.list_names(log_dir(table))) if m)


# -- one version after a commit (the hook: spark_jobs.table.projection.after_commit) -------------

def mirror_commit(table: "Table", seq: int) -> list[int]:
    """Write Delta version ``seq`` for the completed entry ``seq``; if version ``seq - 1`` is
    missing (a crash, a writer that did not mirror), :func:`repair` writes the gap first.

    Costs one existence check of the previous version, the footer of each file the entry
    added (statistics) and one conditional PUT; a partitioned table's first commit in a process
    also reads version 0, and a log an older release wrote is rewritten first
    (:func:`_written_in_an_old_form`). Returns the versions written."""
    if seq < 1:
        return []
    if _written_in_an_old_form(table):
        return _migrate(table)
    if not table.io.exists(version_file(table, seq - 1)):
        return repair(table, upto=seq)
    tl = table.timeline
    prev = FileSystemView.at_seq(tl, seq - 1)
    cur = _advance(tl, prev, seq)
    kind = _kind(table, cur.properties)
    if MIRROR_DELTA in (cur.properties.get(VIEWS_PROPERTY) or {}) and _log_kind(table) not in (kind, None):
        return _rewrite_in(table, kind)  # the view changed (a table that never set one reads nothing here)
    schema = prev.schema or cur.schema
    if schema is None:  # pragma: no cover - version seq-1 exists, so a schema was known
        schema = _first_schema(table, seq)
    written = [seq] if _publish(table, seq, version_actions(table, seq, prev, cur, first_schema=schema,
                                                            kind=kind)) else []
    _maybe_checkpoint(table, seq)
    return written


def repair(table: "Table", *, upto: int | None = None) -> list[int]:
    """Write every missing version after the last one present, up to ``upto`` (default: the
    current sequence). Idempotent; returns the versions written.

    Versions are computed replaying the timeline from the last present one (archived entries
    included), so the cost follows the gap, not the history -- except on the first run, which
    writes every version from 0."""
    if _written_in_an_old_form(table):
        return _migrate(table)
    present = set(versions_present(table))
    found = gap(table, present=present, upto=upto)
    if found is None:
        return []
    tl, start, last, first = found
    kind = _latest_kind(table, tl)
    if start > 0 and _log_kind(table) not in (kind, None):
        return _rewrite_in(table, kind)
    written: list[int] = []
    for v, acts in _projected(table, tl, first=first, start=start, last=last, kind=kind):
        if v not in present:
            if _publish(table, v, acts):
                written.append(v)
            _maybe_checkpoint(table, v)
    return written


#: tables (by URI) whose log this process found in the current form: checked once per process
_CURRENT_FORM: set[str] = set()


def _written_in_an_old_form(table: "Table") -> bool:
    """Whether the log's version 0 declares a partition column this release publishes as a data
    column (:func:`partition_columns`): a log an older release wrote (a string field before
    issue 36, any other type before issue 39). Appending to it would be wrong, not stale: its
    ``metaData`` keeps the column a partition column, so the new ``add`` actions, which carry no
    ``partitionValues``, would read as null in every row (measured with ``deltalake`` 1.6).
    One GET of version 0 (a few hundred bytes) per process and table; an unpartitioned table
    costs nothing."""
    assert table.config is not None
    if not table.config.partition_fields or table.uri in _CURRENT_FORM:
        return False
    try:
        acts = _parsed(table.io.read_bytes(version_file(table, 0)))
    except (FileNotFoundError, OSError):
        return False  # no version 0 yet: whatever writes it writes the current form
    meta = next((a["metaData"] for a in acts or [] if "metaData" in a), None)
    if meta is None:
        return False  # a damaged version 0: `mirror --repair` rewrites it
    ref = (table.config.reference or {}).get("path_columns", {})
    if any(c not in ref for c in meta.get("partitionColumns") or []):
        return True
    _CURRENT_FORM.add(table.uri)
    return False


def _migrate(table: "Table") -> list[int]:
    """Rewrite a log an older release wrote in the current form (:func:`verify_and_repair`:
    every version recomputed, those that differ replaced, the checkpoints built from them
    written again) before anything is appended to it. Returns the versions written or replaced."""
    log.warning("the Delta log of %s declares a partition column in the form of an older release (whose values "
                "readers misread); rewriting the whole log in the current form (format.md §11)", table.display_uri)
    report = verify_and_repair(table)
    _CURRENT_FORM.add(table.uri)
    return sorted(set(report.written) | set(report.rewritten))


def gap(table: "Table", *, present: set[int], upto: int | None) -> tuple[Any, int, int, pa.Schema] | None:
    """What a projection's repair writes, given the versions ``present``: ``(timeline, first
    missing version, last version to write, version 0's schema)``, or None when nothing is
    missing up to ``upto`` (default: the current sequence) or nothing with a schema is committed
    yet (version 0 waits for it). Shared by the Delta and Iceberg projections."""
    tl = table.timeline.reload()
    last = tl.last_seq if upto is None else min(upto, tl.last_seq)
    start = 0
    while start in present:  # the first missing version: everything before it is there
        start += 1
    if start > last:
        return None
    first = _first_schema(table, last)
    if first is None:
        return None
    return tl, start, last, first


def _projected(table: "Table", tl: Any, *, first: pa.Schema, start: int, last: int,
               kind: str | None = None) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Versions ``start..last`` with the actions the timeline projects each to
    (:func:`version_actions`), the snapshots replayed once, in order."""
    prev = FileSystemView.at_seq(tl, start - 1) if start > 0 else None
    for v in range(start, last + 1):
        if v == 0:
            acts = version_actions(table, 0, None, None, first_schema=first, kind=kind)
            cur = FileSystemView.at_seq(tl, 0)
        else:
            assert prev is not None
            cur = _advance(tl, prev, v)
            acts = version_actions(table, v, prev, cur, first_schema=first, kind=kind)
        yield v, acts
        prev = cur


def _advance(tl: Any, prev: FileSystemView, seq: int) -> FileSystemView:
    """The view after entry ``seq`` from the one after ``seq - 1`` (a copy: ``prev`` stays), so a
    version costs one entry's replay and no checkpoint listing."""
    from spark_jobs.table.timeline import Instant, State

    view = FileSystemView.from_state(prev.to_state())
    e = tl.entry(seq)
    if e["action"] in Action.WRITES:
        view.apply(Instant(e["instant"], e["action"], State.COMPLETED, seq), e["metadata"])
    view.seq = seq
    return view


def _encode(actions: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(a, sort_keys=True, separators=(",", ":")) + "\n" for a in actions).encode()


def _publish(table: "Table", version: int, actions: list[dict[str, Any]]) -> bool:
    """Create version ``version`` if absent; an identical existing one is fine (another process
    mirrored the same entry), a different one is a bug. Returns whether this call wrote it."""
    data = _encode(actions)
    path = version_file(table, version)
    try:
        table.io.create_exclusive(path, data)
        return True
    except InstantExistsError:
        existing = table.io.read_bytes(path)
        if _comparable(existing) != _comparable(data):
            raise TableCorruptError(
                f"Delta log version {version} of {table.uri} differs from what sequence entry {version} projects "
                f"to: it was written by something else; move {DELTA_LOG}/ aside and run `bucketindex mirror "
                f"--repair`", path=path) from None
        return False


def _comparable(data: bytes) -> list[Any]:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def _parsed(data: bytes) -> list[Any] | None:
    """A version file's actions, or None when it is not a Delta version at all (empty,
    truncated, not UTF-8, not JSON, a line that is not one action)."""
    try:
        acts = _comparable(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not acts or not all(isinstance(a, dict) and len(a) == 1 for a in acts):
        return None
    return acts


def _without_file_facts(actions: list[Any]) -> list[Any]:
    """A version's actions without what only a data file's footer gives (``stats``, the
    partition *values*; their keys stay, so the published form is still compared): how a
    version whose files clean deleted is compared, since they cannot be read again."""
    out = []
    for a in actions:
        if "add" in a:
            add = {k: v for k, v in a["add"].items() if k not in ("stats", "deletionVector")}
            add["partitionValues"] = sorted(add.get("partitionValues") or {})
            a = {"add": add}
        elif "remove" in a:  # the fresh view: a vector is computed from the files' keys
            a = {"remove": {k: v for k, v in a["remove"].items() if k != "deletionVector"}}
        out.append(a)
    return out


# -- verify and repair (`bucketindex mirror --repair`) ------------------------------------------

_CHECKPOINT_NAME = re.compile(r"^(\d{20})\.checkpoint(?:\.\d+\.\d+)?\.parquet$")
LAST_CHECKPOINT = "_last_checkpoint"


@dataclass
class RepairReport:
    """What :func:`verify_and_repair` did: versions it created (missing), versions it
    replaced (present but not what the timeline projects), Parquet checkpoints it wrote again."""

    version: int
    written: list[int]
    rewritten: list[int]
    checkpoints: list[int]

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "written": self.written, "rewritten": self.rewritten,
                "checkpoints": self.checkpoints}


def verify_and_repair(table: "Table") -> RepairReport:
    """``bucketindex mirror TABLE --repair``: compare **every** version file with what the
    timeline projects and make the log what it should be.

    The log is derived (module docstring), so each version ``v`` is recomputed from the
    timeline (:func:`version_actions`, archived entries included) and compared with the file:
    a missing one is created (create-if-absent, as a writer would), one that differs --
    truncated, garbage, hand-edited, or written by an older release in another form (before
    issue 36 a string partition field was in ``partitionColumns``: version 0's ``metaData``
    and every ``add`` differ, so the whole log is rewritten) -- is replaced. A version older
    than clean's retained window lists files clean deleted, whose footers cannot be read
    again: it is compared without what only a footer gives (:func:`_without_file_facts`), so a
    sound old version is left as it is and a damaged one is rewritten with what is known.

    Then the Parquet checkpoints: one at or after the first version replaced was built from
    the log as it was (a damaged version makes ``deltalake`` build a wrong one, or none), and
    one that does not parse is damaged; both are deleted and written again in version order
    (each from the previous good checkpoint plus the repaired versions), with
    ``_last_checkpoint`` (deleted first: it may name a checkpoint being replaced; ``deltalake``
    lists the log without it, and writes it again with the checkpoint).

    What it cannot fix it says in one line (TableCorruptError, exit 1): a version file past
    the last sequence entry was written by something else, and a Delta reader takes it for
    the latest version; it is not deleted (a person decides), the versions before it are
    repaired first.

    **Overwriting is safe against concurrent writers.** Writers publish a version only if
    absent (:func:`_publish`); the only process that replaces an existing version is this
    one, and it replaces version ``v`` only with the bytes :func:`version_actions` computes
    for it -- a function of sequence entries ``<= v``, which never change once committed. So
    two repairs racing write the same bytes (the replace is atomic: rename on disk, one PUT
    on S3, so a reader sees the old file or the new one), and a writer that finds ``v``
    present compares it with the same expected bytes: before the replace it reports the
    difference as a warning (its commit is done, the hook never fails it), after it finds
    what it computed. A version that already holds the expected content is never written.
    (A clean racing the repair may delete the footer of a file a retained version lists;
    that version is then written without that file's ``stats`` -- statistics are optional,
    never a wrong value.)"""
    present_before = set(versions_present(table))  # listed before the timeline is read (see above)
    tl = table.timeline.reload()
    last = tl.last_seq
    written: list[int] = []
    rewritten: list[int] = []
    first = _first_schema(table, last)
    stray = sorted(v for v in present_before if v > last)
    if first is not None:
        kept = table.retained_from()
        earliest = int(kept["earliest_retained_seq"]) if kept else 0
        present = set(versions_present(table))
        kind = _latest_kind(table, tl)
        for v, acts in _projected(table, tl, first=first, start=0, last=last, kind=kind):
            if v not in present:
                if _publish(table, v, acts):
                    written.append(v)
                continue
            path = version_file(table, v)
            got = _parsed(table.io.read_bytes(path))
            want = _comparable(_encode(acts))
            if got is not None and (got == want or v < earliest
                                    and _without_file_facts(got) == _without_file_facts(want)):
                continue
            table.io.write_atomic(path, _encode(acts))
            rewritten.append(v)
            log.warning("rewrote Delta log version %d of %s: it was %s", v, table.uri,
                        "not a Delta version (empty or not JSON)" if got is None else
                        "not what sequence entry %d projects to" % v)
    changed = min(written + rewritten, default=None)
    checkpoints = _repair_checkpoints(table, last, since=changed)
    if stray:
        raise TableCorruptError(
            f"Delta log version {stray[0]} of {table.uri} has no sequence entry (the last is {last}): something "
            f"else wrote it, and Delta readers take it for the latest version; move "
            f"{', '.join(version_file(table, v) for v in stray)} aside (versions 0..{last} are repaired)",
            path=version_file(table, stray[0]))
    return RepairReport(version=last, written=written, rewritten=rewritten, checkpoints=checkpoints)


def _checkpoint_ok(table: "Table", name: str) -> bool:
    try:
        with table.io.open_input_file(posixpath.join(log_dir(table), name)) as f:
            pq.read_metadata(f)
        return True
    except (OSError, pa.ArrowInvalid):
        return False


def _repair_checkpoints(table: "Table", last: int, *, since: int | None) -> list[int]:
    """Delete and write again every Parquet checkpoint built from versions that changed (at or
    after ``since``) or that does not parse, plus those :func:`_maybe_checkpoint` would have
    written for the changed versions; a damaged ``_last_checkpoint`` is replaced with the
    latest checkpoint's. Returns the checkpoint versions written (those ``deltalake`` wrote)."""
    names = table.io.list_names(log_dir(table))
    by_version: dict[int, list[str]] = {}
    for n in names:
        m = _CHECKPOINT_NAME.match(n)
        if m:
            by_version.setdefault(int(m.group(1)), []).append(n)
    bad = {c for c, files in by_version.items()
           if (since is not None and c >= since) or c > last or not all(_checkpoint_ok(table, f) for f in files)}
    want = {c for c in bad if c <= last}
    if since is not None:
        want |= {c for c in range(CHECKPOINT_INTERVAL, last + 1, CHECKPOINT_INTERVAL) if c >= since}
    pointer = posixpath.join(log_dir(table), LAST_CHECKPOINT)
    good = sorted(set(by_version) - bad)
    if LAST_CHECKPOINT in names:
        try:
            pointed = json.loads(table.io.read_bytes(pointer))["version"]
        except (ValueError, KeyError, TypeError):
            pointed = None
        if want or pointed not in good or good and pointed != good[-1]:
            if good and not want:
                want.add(good[-1])  # written again, it writes the pointer
            table.io.delete(pointer)
    if not want and not bad:
        return []
    table.io.delete_many([posixpath.join(log_dir(table), f) for c in sorted(bad) for f in by_version[c]])
    done = []
    for c in sorted(want):
        _maybe_checkpoint(table, c, every=1)
        if any(_CHECKPOINT_NAME.match(n) and int(_CHECKPOINT_NAME.match(n).group(1)) == c  # type: ignore[union-attr]
               for n in table.io.list_names(log_dir(table))):
            done.append(c)
    return done


# -- one version ---------------------------------------------------------------------------

def version_actions(table: "Table", version: int, prev: FileSystemView | None, cur: FileSystemView | None, *,
                    first_schema: pa.Schema, kind: str | None = None) -> list[dict[str, Any]]:
    """The actions of Delta version ``version``: the change from ``prev`` (after entry
    ``version - 1``) to ``cur`` (after entry ``version``) in view ``kind`` (default: the
    latest snapshot's, :func:`_kind`): bases only, or in the fresh view bases and logs with
    deletion vectors (module docstring)."""
    assert table.config is not None
    tl = table.timeline
    if kind is None:
        kind = _latest_kind(table, tl)
    fresh = kind == VIEW_FRESH
    if version == 0:
        return [{"protocol": protocol_for(first_schema, fresh=fresh)},
                {"metaData": _metadata(table, first_schema, references=False, kind=kind)},
                {"commitInfo": {"operation": "CREATE TABLE", "timestamp": _created_ms(table),
                                "bucketindex": {"seq": 0}}}]
    assert prev is not None and cur is not None
    entry = tl.entry(version)
    ts_ms = _instant_ms(entry.get("completed") or entry["instant"])
    out: list[dict[str, Any]] = []
    old_schema = prev.schema or first_schema
    new_schema = cur.schema or old_schema
    old_refs, new_refs = _lists_reference_files(prev), _lists_reference_files(cur)
    if _public(new_schema) != _public(old_schema) or \
            partition_columns(table, old_schema, references=old_refs) != \
            partition_columns(table, new_schema, references=new_refs):
        if protocol_for(new_schema, fresh=fresh) != protocol_for(old_schema, fresh=fresh):
            out.append({"protocol": protocol_for(new_schema, fresh=fresh)})
        out.append({"metaData": _metadata(table, new_schema, references=new_refs, kind=kind)})
    before = {s.path: s for s in prev.slices()}
    after = {s.path: s for s in cur.slices()}
    # a rehash only moves rows between files; every other change is one readers see (a
    # merge-on-read compaction brings log rows into the read-optimized view)
    data_change = entry["action"] != Action.REHASH
    if fresh:
        removes, adds = _fresh_diff(table, prev, cur, old_schema=old_schema, new_schema=new_schema, ts_ms=ts_ms,
                                    data_change=data_change, references=new_refs)
        before = after = {}
        out += removes + adds
    for path in sorted(set(before) - set(after)):
        out.append({"remove": {"path": _delta_path(table, path), "deletionTimestamp": ts_ms,
                               "dataChange": data_change, "size": int(before[path].size)}})
    for path in sorted(set(after) - set(before)):
        out.append({"add": _add(table, after[path], new_schema, ts_ms=ts_ms, data_change=data_change,
                                references=new_refs)})
    out.append({"commitInfo": {"operation": _operation(entry), "timestamp": ts_ms,
                               "bucketindex": {"seq": version, "instant": entry["instant"],
                                               "action": entry["action"]}}})
    return out


def _operation(entry: dict[str, Any]) -> str:
    from spark_jobs.table.commit import parse

    meta = parse(entry["metadata"])
    op = meta.operation or entry["action"]
    return {"upsert": "MERGE", "alter_schema": "ADD COLUMNS", "compaction": "OPTIMIZE"}.get(op, op.upper())


def _lists_reference_files(view: FileSystemView) -> bool:
    """Whether a snapshot lists a reference bootstrap's file (outside the root, §5.3)."""
    return any(is_reference(s.path) for s in view.slices())


def _add(table: "Table", s: FileSlice, schema: pa.Schema, *, ts_ms: int, data_change: bool,
         references: bool, log: Any = None, dv: dict[str, Any] | None = None,
         fresh: bool = False) -> dict[str, Any]:
    """The ``add`` of base ``s`` -- or, in the fresh view (``fresh``: its path form,
    :func:`_delta_path`), of its log ``log`` (its partition value the base's: one file group,
    one partition) -- with deletion vector ``dv``."""
    assert table.config is not None
    footer = _footer(table, s.path)
    file_footer = footer if log is None else _footer(table, log.path)
    fields = [f for f in table.config.partition_fields or [] if f in schema.names]
    published = partition_columns(table, schema, references=references)
    part_values: dict[str, str | None] = {}
    known: dict[str, Any] = {}
    if fields:
        field, typ = fields[0], schema.field(fields[0]).type
        value: Any = _value_from_file(table, s, field, typ, footer)
        if field in published:
            if value == "" and not is_reference(s.path):
                # a reference bootstrap's Hive path column stays a partition column (its files
                # lack it), and Delta readers read an empty partition value as null
                raise BadInputError(
                    f"the Delta log of {table.display_uri} cannot publish {s.path}: its partition field {field!r} "
                    f"holds '' and is a Delta partition column (a reference bootstrap's Hive path column, absent "
                    f"from those files), which Delta readers read as null; the log stays at the version before "
                    f"(stale, never wrong)")
            part_values[field] = None if value is None else partition_string(value, typ)
        else:
            # published as a data column: the file holds this one value, so its statistics are
            # exact whatever its length, and readers skip files on it as on a partition column
            known[field] = value
    path, size, instant = (s.path, s.size, s.instant) if log is None else (log.path, log.size, log.instant)
    add: dict[str, Any] = {"path": _delta_path(table, path, fresh=fresh), "partitionValues": part_values,
                           "size": int(size), "modificationTime": _instant_ms(instant) if instant else ts_ms,
                           "dataChange": data_change}
    if file_footer is not None:
        stats = _stats(file_footer, schema, skip=set(part_values), known=known)
        if dv is not None:
            stats["tightBounds"] = False  # the bounds cover the rows the vector drops too
        add["stats"] = json.dumps(stats, sort_keys=True, separators=(",", ":"))
    if dv is not None:
        add["deletionVector"] = dv
    return add


#: what an RFC 2396/3986 URI path may hold raw besides letters, digits and ``-._~``: the fresh
#: view's ``add.path`` leaves these unescaped (``region=7``), since Polars 2.1 applies a deletion
#: vector only on a path without escapes (module docstring)
URI_PATH_SAFE = "/=+*~!$&'(),;:@"


def _delta_path(table: "Table", rel: str, *, fresh: bool = False) -> str:
    """A data file's ``add.path``: relative to the root and percent-encoded (an RFC 2396 URI
    path, as Delta requires); a reference file (outside the root) as an absolute URI. In the
    fresh view (``fresh``) only what a URI path may not hold raw is escaped
    (:data:`URI_PATH_SAFE`), so that a path of a table :func:`fresh_view_refusal` accepts holds
    no escape; the read-optimized view keeps the form its logs have always had."""
    if is_reference(rel):
        absolute = table.abs(rel)
        scheme = table.uri.split("://", 1)[0] if "://" in table.uri else "file"
        return f"{scheme}://{quote(absolute if absolute.startswith('/') or scheme != 'file' else '/' + absolute)}"
    return quote(rel, safe=URI_PATH_SAFE) if fresh else quote(rel)


def _polars_misreads(table: "Table", rel: str) -> bool:
    """Whether Polars 2.1 would ignore a deletion vector on ``rel``'s fresh-view ``add.path``:
    it holds a percent-escape, or it is a reference file's absolute URI (which Polars cannot
    read today; a vector on it would be ignored the day it can)."""
    return is_reference(rel) or "%" in _delta_path(table, rel, fresh=True)


#: partition field types whose directory names (format.md §1) never hold ``%``: Spark's text of
#: an integer, a date (``YYYY-MM-DD``), a boolean and a decimal (plain, ``-12.50``), and ``__NULL__``
_ESCAPE_FREE_PARTITION_TYPES = (pa.types.is_integer, pa.types.is_date, pa.types.is_boolean, pa.types.is_decimal)


def fresh_view_refusal(table: "Table", view: FileSystemView) -> str | None:
    """Why the Delta projection cannot publish the fresh view of ``table`` (one line), or None.

    Every path the table can ever write must be one Polars 2.1 applies a deletion vector on:
    one without a percent-escape in its ``add.path`` (module docstring, measured with
    ``benchmarks/delta_dv_probe.py``). A copy-on-write table has no vectors (accepted); a
    merge-on-read one needs no partition field, or ones whose name needs no escape and whose
    type is an integer, date, boolean or decimal -- a string or timestamp value's directory
    holds ``%`` -- and no reference-bootstrapped file (an absolute URI) in its snapshot."""
    assert table.config is not None
    if not table.config.merge_on_read:
        return None
    why = ("the Delta projection cannot publish the fresh view of {what}: Polars ignores a deletion vector on a "
           "percent-escaped path and would read deleted rows (format.md §11); use --enable iceberg --view fresh, "
           "or the read-optimized view")
    for field in (table.config.partition_fields or [])[:1]:  # the directory names the first field only
        if quote(f"{field}=", safe=URI_PATH_SAFE) != f"{field}=":
            return why.format(what=f"a table partitioned by {field!r} (its directory names need escaping)")
        typ = view.schema.field(field).type if view.schema is not None and field in view.schema.names else None
        if typ is None or not any(ok(typ) for ok in _ESCAPE_FREE_PARTITION_TYPES):
            return why.format(what=f"a table partitioned by the {typ} field {field!r} (its directory names hold "
                                   f"escapes)")
    if any(is_reference(rel) for s in view.slices() for rel in s.files):
        return why.format(what="a table holding reference-bootstrapped files (absolute paths)")
    return None


def _footer(table: "Table", rel: str) -> pq.FileMetaData | None:
    """The Parquet footer of a data file (None when it is gone: a version outside clean's
    retention, projected late, lists it without statistics)."""
    try:
        with table.io.open_input_file(table.abs(rel)) as f:
            return pq.ParquetFile(f).metadata
    except (FileNotFoundError, OSError):
        return None


# -- partition values ----------------------------------------------------------------------

def partition_columns(table: "Table", schema: pa.Schema, *, references: bool) -> list[str]:
    """The table's partition fields that the projection publishes as Delta **partition
    columns** (``metaData.partitionColumns``) in a snapshot that lists a reference file
    (``references``) or not: only a reference bootstrap's Hive path columns, and only while a
    snapshot lists a referenced file. Every other partition field is published as an ordinary
    data column (format.md §11).

    Why: a partition column's value reaches a reader through text, and readers misread the
    text this table can give. Delta (and Hive) readers read an empty partition value as null
    (``deltalake`` 1.6: ``{"country": ""}`` reads back null, and a filter on ``""`` finds
    nothing); ``deltalake`` reads the decimal ``-12.50`` as ``-12.-50``; a timestamp's text
    without a zone is read "in the time zone of the system which wrote to the table"
    (PROTOCOL.md, Partition Value Serialization); and Polars' ``scan_delta`` (2.1, its native
    reader) ignores ``partitionValues`` and parses the value out of the file's Hive directory
    name, where this table writes ``__NULL__`` for null and form-encodes the value (§1): it fails
    on every integer, date, boolean or timestamp partition column holding a null, and on every
    timestamp (``2024-03-31+01%3A30...``), measured in ``tests/unit/test_projection_exact_values.py``.
    Every data file carries its partition field as a column (what :func:`_value_from_file`
    reads), so published as a data column it reads back exactly through every reader, and its
    exact min/max statistics (:func:`_add`) still let readers skip files on it where Delta
    keeps exact statistics for its type (strings, integers, dates, booleans). A reference file
    (§5.3) lacks its Hive path column, so a partition field that is one stays a partition
    column whatever its type while such a file is listed: its value comes from the dataset's own
    Hive directory, which cannot hold ``""`` either. Once compaction or updates have replaced
    every referenced file, every file carries the column: the version that removes the last
    one publishes a ``metaData`` without it (Polars would otherwise parse the in-root directory
    names: ``__NULL__`` as that text, ``+`` for a space)."""
    assert table.config is not None
    if not references:
        return []
    ref = (table.config.reference or {}).get("path_columns", {})
    return [f for f in table.config.partition_fields or [] if f in schema.names and f in ref]


_NO_VALUE = object()


def _value_from_file(table: "Table", s: FileSlice, field: str, typ: pa.DataType,
                     footer: pq.FileMetaData | None) -> Any:
    from spark_jobs.table.dataset import partition_candidates
    from spark_jobs.table.reader import hive_values

    hive = hive_values(s.path) if is_reference(s.path) else {}
    if field in hive and table.config is not None and table.config.reference is not None \
            and field in table.config.reference.get("path_columns", {}):
        text = hive[field]  # (a path column no directory names is the file's own: read below)
        return None if text is None else pa.scalar(text, pa.string()).cast(typ).as_py()
    if footer is not None and footer.num_rows > 0:
        got = _value_from_stats(footer, field)
        if got is not _NO_VALUE:
            return got
        from spark_jobs.table.reader import read_data_file

        col = read_data_file(table, s.path, [field]).column(field).unique().to_pylist()
        vals = [v for v in col if v is not None]
        if len(col) == 1:
            return col[0]
        raise TableCorruptError(f"data file {s.path} holds {len(col)} values of partition field {field} "
                                f"({vals[:3]}...): a file holds one partition's rows", path=s.path)
    cands = partition_candidates(table, s, schema=pa.schema([pa.field(field, typ)]))
    return cands[0] if cands is not None and len(cands) == 1 else None


def _value_from_stats(footer: pq.FileMetaData, field: str) -> Any:
    names = footer.schema.to_arrow_schema().names
    if field not in names:
        return _NO_VALUE
    idx = names.index(field)
    lo = hi = _NO_VALUE
    nulls = 0
    for rg in range(footer.num_row_groups):
        col = footer.row_group(rg).column(idx)
        st = col.statistics
        if st is None or not st.has_null_count:
            return _NO_VALUE
        nulls += st.null_count
        if st.null_count == col.num_values:
            continue
        if not st.has_min_max:
            return _NO_VALUE
        if lo is _NO_VALUE:
            lo, hi = st.min, st.max
        elif st.min != lo or st.max != hi:
            return _NO_VALUE
    if nulls == footer.num_rows:
        return None
    if nulls or lo is _NO_VALUE or lo != hi:
        return _NO_VALUE
    return lo


def partition_string(value: Any, typ: pa.DataType) -> str:
    """Delta's serialized form of a partition value (PROTOCOL.md "Partition Value Serialization")."""
    if pa.types.is_boolean(typ):
        return "true" if value else "false"
    if pa.types.is_timestamp(typ):
        if isinstance(value, _dt.datetime):
            if value.tzinfo is not None:  # the form the protocol recommends: ISO 8601 in UTC, `Z`
                return value.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            return value.strftime("%Y-%m-%d %H:%M:%S.%f")
        return str(value)
    if pa.types.is_date(typ):
        return value.isoformat() if isinstance(value, _dt.date) else str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


# -- statistics ----------------------------------------------------------------------------

def _stats(footer: pq.FileMetaData, schema: pa.Schema, *, skip: set[str], known: dict[str, Any]
           ) -> dict[str, Any]:
    """``numRecords`` and, from the row-group statistics of top-level primitive columns,
    ``nullCount`` and (integers, dates, booleans, short strings: exact and cheap)
    ``minValues``/``maxValues``. A column the file lacks (added since) is all null. ``known``:
    columns whose one value in the file is known (a partition field published as a data
    column), whatever its length.

    ``minValues``/``maxValues`` are written only when *every* column with a non-null value in
    the file has both: ``deltalake`` 1.6 turns a column missing from ``minValues`` into the
    fragment guarantee ``col >= null``, so a filter on it (``to_pyarrow_table(filters=...)``)
    skips the file and returns no rows (measured: a float, a 100-character string, a boolean).
    Without the two maps readers do not skip on values, which is slower, never wrong."""
    out: dict[str, Any] = {"numRecords": int(footer.num_rows)}
    names = footer.schema.to_arrow_schema().names
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    complete = True  # every column with a value has exact min/max
    for f in schema:
        if f.name.startswith(INTERNAL_PREFIX) or f.name in skip:
            continue
        if pa.types.is_nested(f.type):
            continue
        if f.name not in names:  # added after the file was written: readers fill null
            nulls[f.name] = int(footer.num_rows)
            continue
        if f.name in known:
            one = known[f.name]
            nulls[f.name] = int(footer.num_rows) if one is None else 0
            j = None if one is None else _stat_json(one, f.type, exact=True)
            if j is not None and footer.num_rows:
                mins[f.name] = maxs[f.name] = j
            elif one is not None:
                complete = False
            continue
        idx = names.index(f.name)
        total_nulls, lo, hi, ok_minmax = 0, None, None, True
        for rg in range(footer.num_row_groups):
            col = footer.row_group(rg).column(idx)
            st = col.statistics
            if st is None or not st.has_null_count:
                total_nulls = -1
                break
            total_nulls += st.null_count
            if st.null_count == col.num_values:
                continue
            if not st.has_min_max:
                ok_minmax = False
                continue
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
        if total_nulls < 0:
            complete = False
            continue
        nulls[f.name] = total_nulls
        if total_nulls == footer.num_rows:
            continue  # all null: nullCount says so
        lo_j = hi_j = None
        if ok_minmax and lo is not None:
            lo_j, hi_j = _stat_json(lo, f.type), _stat_json(hi, f.type)
        if lo_j is None or hi_j is None:
            complete = False
        else:
            mins[f.name], maxs[f.name] = lo_j, hi_j
    if footer.num_rows and complete:
        out["minValues"], out["maxValues"] = mins, maxs
    out["nullCount"] = nulls
    return out


def _stat_json(value: Any, typ: pa.DataType, *, exact: bool = False) -> Any:
    if pa.types.is_integer(typ) and isinstance(value, int) and not isinstance(value, bool):
        return value
    if pa.types.is_boolean(typ) and isinstance(value, bool):
        return value
    if pa.types.is_date32(typ) and isinstance(value, _dt.date):
        return value.isoformat()
    if (pa.types.is_string(typ) or pa.types.is_large_string(typ)) and isinstance(value, str) \
            and (exact or len(value) <= MAX_STAT_STRING):
        return value
    return None


# -- schema and metadata -------------------------------------------------------------------

def _public(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f for f in schema if not f.name.startswith(INTERNAL_PREFIX)])


def delta_type(typ: pa.DataType) -> Any:
    """An Arrow type as a Delta schema type (PROTOCOL.md "Schema Serialization Format")."""
    simple = [(pa.types.is_string, "string"), (pa.types.is_large_string, "string"),
              (pa.types.is_boolean, "boolean"), (pa.types.is_int8, "byte"), (pa.types.is_int16, "short"),
              (pa.types.is_int32, "integer"), (pa.types.is_int64, "long"), (pa.types.is_float32, "float"),
              (pa.types.is_float64, "double"), (pa.types.is_binary, "binary"),
              (pa.types.is_large_binary, "binary"), (pa.types.is_date32, "date")]
    for test, name in simple:
        if test(typ):
            return name
    if pa.types.is_timestamp(typ):
        return "timestamp" if typ.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(typ):
        return f"decimal({typ.precision},{typ.scale})"
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return {"type": "array", "elementType": delta_type(typ.value_type), "containsNull": True}
    if pa.types.is_map(typ):
        return {"type": "map", "keyType": delta_type(typ.key_type), "valueType": delta_type(typ.item_type),
                "valueContainsNull": True}
    if pa.types.is_struct(typ):
        return {"type": "struct", "fields": [_delta_field(typ.field(i)) for i in range(typ.num_fields)]}
    raise BadInputError(f"Arrow type {typ} has no Delta Lake type (unsigned integers, nanosecond times, ...)")


def _delta_field(f: pa.Field) -> dict[str, Any]:
    return {"name": f.name, "type": delta_type(f.type), "nullable": True, "metadata": {}}


def delta_schema(schema: pa.Schema) -> dict[str, Any]:
    """The published schema (``_bi_*`` columns left out) as a Delta ``struct``."""
    return {"type": "struct", "fields": [_delta_field(f) for f in _public(schema)]}


def _uses_ntz(t: Any) -> bool:
    if t == "timestamp_ntz":
        return True
    if isinstance(t, dict):
        return any(_uses_ntz(v) for v in t.values()) or any(_uses_ntz(f["type"]) for f in t.get("fields", []))
    return False


def protocol_for(schema: pa.Schema, *, fresh: bool = False) -> dict[str, Any]:
    """The lowest protocol that covers what the projection uses: (1, 2) -- plain Parquet, no
    column mapping, no deletion vectors -- unless the schema holds a zone-naive timestamp, which
    needs the ``timestampNtz`` table feature (reader 3, writer 7), or the log is the fresh view
    (``fresh``), whose deletion vectors need the ``deletionVectors`` feature."""
    features = (["deletionVectors"] if fresh else []) + (["timestampNtz"] if _uses_ntz(delta_schema(schema)) else [])
    if features:
        return {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": features,
                "writerFeatures": features}
    return {"minReaderVersion": 1, "minWriterVersion": 2}


def configuration(table: "Table", kind: str | None = None) -> dict[str, str]:
    """``metaData.configuration``: retention consistent with ``clean`` (format.md), and the view
    ``kind`` (:func:`_kind`; default: the read-optimized one) in ``bucketindex.projection``."""
    assert table.config is not None
    hours = table.config.clean_retain_hours
    conf = {
        "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
        # clean (not Delta) deletes files: a version is readable while clean's window retains it
        "delta.deletedFileRetentionDuration": f"interval {int(hours)} hours" if hours else "interval 1 days",
        "delta.logRetentionDuration": "interval 30 days",
        # the log is derived and cheap: a Delta client's checkpoint must not delete versions
        "delta.enableExpiredLogCleanup": "false",
        "bucketindex.projection": kind or ("read_optimized" if table.config.merge_on_read else "exact"),
    }
    if kind == VIEW_FRESH:
        conf["delta.enableDeletionVectors"] = "true"
    return conf


def _metadata(table: "Table", schema: pa.Schema, *, references: bool, kind: str | None = None) -> dict[str, Any]:
    assert table.config is not None
    return {"id": _table_id(table), "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps(delta_schema(schema), separators=(",", ":")),
            "partitionColumns": partition_columns(table, schema, references=references),
            "configuration": configuration(table, kind), "createdTime": _created_ms(table)}


def _table_id(table: "Table") -> str:
    first = table.timeline.entry(1)["instant"] if table.timeline.last_seq else "empty"
    return str(uuid.uuid5(_ID_NAMESPACE, f"{first}"))


def _created_ms(table: "Table") -> int:
    return _instant_ms(table.timeline.entry(1)["instant"]) if table.timeline.last_seq else 0


def _instant_ms(instant: str) -> int:
    t = _dt.datetime.strptime(instant[:17], "%Y%m%d%H%M%S%f").replace(tzinfo=_dt.timezone.utc)
    return int(t.timestamp() * 1000)


def _first_schema(table: "Table", upto: int) -> pa.Schema | None:
    """The schema of the first entry that records one (version 0's), among entries 1..upto."""
    from spark_jobs.table.commit import parse
    from spark_jobs.table.view import decode_schema

    tl = table.timeline
    for n in range(1, upto + 1):
        meta = parse(tl.entry(n)["metadata"])
        if meta.schema:
            return decode_schema(meta.schema)
    return None


# -- checkpoints ---------------------------------------------------------------------------

def reader_uri(table: "Table") -> str:
    """``table``'s location as ``deltalake`` takes it (``s3://``, no query string)."""
    return table.uri.replace("s3a://", "s3://").split("?", 1)[0]


def reader_storage_options(table: "Table") -> dict[str, str] | None:
    """The ``storage_options`` a ``deltalake`` reader (or its checkpoint writer) needs for
    ``table``'s store, from the table's one storage configuration; None on local disk."""
    from spark_jobs.io.filesystem import S3FileIO

    io = table.io
    if not isinstance(io, S3FileIO):
        return None
    v = io.config.values
    out = {"AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
    for ours, theirs in (("endpoint_url", "AWS_ENDPOINT_URL"), ("region", "AWS_REGION"),
                         ("access_key_id", "AWS_ACCESS_KEY_ID"), ("secret_access_key", "AWS_SECRET_ACCESS_KEY"),
                         ("session_token", "AWS_SESSION_TOKEN")):
        if v.get(ours):
            out[theirs] = v[ours]
    if v.get("addressing_style") == "virtual":
        out["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "true"
    return out


@dataclass(frozen=True)
class _Checkpointer:
    """Delta Parquet checkpoints through ``deltalake`` (optional): it writes
    ``<v>.checkpoint.parquet`` and ``_last_checkpoint`` as its own readers expect them."""

    table: "Table"

    def write(self, version: int) -> None:
        try:
            from deltalake import DeltaTable
        except ImportError:
            log.debug("deltalake is not installed: no Parquet checkpoint for version %d", version)
            return
        DeltaTable(reader_uri(self.table), version=version,
                   storage_options=reader_storage_options(self.table)).create_checkpoint()


def _maybe_checkpoint(table: "Table", version: int, *, every: int = CHECKPOINT_INTERVAL) -> None:
    """Every :data:`CHECKPOINT_INTERVAL` versions, a Parquet checkpoint; never fails the caller
    (readers replay the JSON versions without one). ``every=1``: at ``version`` (repair)."""
    if version == 0 or version % every:
        return
    try:
        _Checkpointer(table).write(version)
    except Exception as e:  # noqa: BLE001 - a missing checkpoint costs readers time, not correctness
        log.warning("no Delta checkpoint at version %d of %s: %s", version, table.display_uri, redact_uri(str(e)))
