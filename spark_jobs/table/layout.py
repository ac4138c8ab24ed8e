"""Where each kind of file lives inside a table (format v1). Only this module builds paths."""

from __future__ import annotations

import hashlib
import posixpath
import re
from typing import Iterable
from urllib.parse import quote, quote_plus, unquote, unquote_plus

from spark_jobs.exceptions import PathEscapeError
from spark_jobs.io.filesystem import is_inside

__all__ = [
    "META_DIR",
    "NULL_PARTITION",
    "MAX_PARTITION_DIR_BYTES",
    "PathEscapeError",
    "data_file_name",
    "log_file_name",
    "is_reference",
    "legacy_partition_aliases",
    "partition_path",
    "REFERENCE_PREFIX",
    "TableLayout",
]

META_DIR = ".bucketindex"
#: the partition directory value for a null partition field. Partition paths themselves are
#: built by Spark (``spark_jobs.jobs.keys.partition_expr``), the one place that encodes them.
NULL_PARTITION = "__NULL__"
#: an encoded value starting with ``__`` gets its first ``_`` as ``%5F`` -- which the
#: URL encoder never emits -- so no string value shares a directory with ``__NULL__``
#: (or with Hive's ``__HIVE_DEFAULT_PARTITION__``); format.md §1
DUNDER_ESCAPE = (r"^_(?=_)", "%5F")
#: the longest partition directory name kept as is (a file name is at most 255 bytes);
#: a longer one is a readable prefix, ``~`` (never emitted by the encoder) and a hash
MAX_PARTITION_DIR_BYTES = 200
LONG_VALUE_SEP = "~"
LONG_VALUE_HASH_CHARS = 32
#: a trailing, cut ``%XX`` escape, dropped from the readable prefix of a long value
CUT_ESCAPE = r"%[0-9A-F]?$"
INDEX_FILE_SUFFIX = ".arrow"
#: longest quoted marker name kept as is (file names are at most 255 bytes)
MAX_QUOTED_MARKER = 200
HASHED_MARKER_PREFIX = "h-"
#: a *reference* file -- a user's Parquet file that a reference bootstrap adopted in place
#: (format.md §5.3) -- is named by its path relative to the table root, which then climbs
#: out of it; no file the table writes starts so
REFERENCE_PREFIX = "../"


def is_reference(rel: str) -> bool:
    """Whether ``rel`` names a file outside the table root: a bootstrapped user file, which
    bucketindex reads but never writes or deletes."""
    return rel.startswith(REFERENCE_PREFIX)


def long_value_budget(*, field: str) -> tuple[int, int]:
    """``(longest encoded value kept whole, length of a long value's readable prefix)`` in
    ``field``'s directories: computed once from the field name, so the Python and Spark
    encodings cut at the same place (the encoded value is ASCII: characters are bytes)."""
    whole = MAX_PARTITION_DIR_BYTES - len(f"{field}=".encode())
    return whole, whole - len(LONG_VALUE_SEP) - LONG_VALUE_HASH_CHARS


def partition_path(field: str, value: object) -> str:
    """``field=<value>`` as Spark's ``partition_expr`` builds it, for a string or integer
    value (format.md §1): the value URL-encoded (Java's URLEncoder, which also encodes ``~``),
    a leading ``__`` escaped, ``__NULL__`` for null, and a long value shortened to a readable
    prefix plus ``~`` plus a hash of the whole value, so no name passes a file name's limit.
    The Python twin for callers without a query to run (``tests/spark/test_keys.py`` checks both agree)."""
    if value is None:
        return f"{field}={NULL_PARTITION}"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"partition_path takes a string or an integer, got {type(value).__name__}")
    text = str(value)
    encoded = re.sub(DUNDER_ESCAPE[0], DUNDER_ESCAPE[1], quote_plus(text, safe="*").replace("~", "%7E"))
    whole, prefix = long_value_budget(field=field)
    if len(encoded) > whole:
        digest = hashlib.sha256(text.encode()).hexdigest()[:LONG_VALUE_HASH_CHARS]
        encoded = re.sub(CUT_ESCAPE, "", encoded[:prefix]) + LONG_VALUE_SEP + digest
    return f"{field}={encoded}"


def legacy_partition_aliases(*, field: str, partitions: Iterable[str]) -> dict[str, str]:
    """``{<directory the value gets now>: <directory a table written before has for it>}``
    for the table's partitions named by the rule before format.md §1 steps 2-3 (a value
    starting with ``__``, or a name of 201-255 bytes). A writer keeps writing such a value
    into its old directory: a bucket-index file group is found by its partition's name, so
    a new name would hold a second copy of every key already stored under the old one.
    (Null's ``__NULL__`` keeps its name under both rules; a ``"__NULL__"`` string written
    before shares it and cannot be told apart without reading the files.)"""
    out: dict[str, str] = {}
    head = f"{field}="
    for p in partitions:
        if not p.startswith(head):
            continue
        value = p[len(head):]
        if not ((value.startswith("__") and value != NULL_PARTITION) or len(p.encode()) > MAX_PARTITION_DIR_BYTES):
            continue
        now = partition_path(field, unquote_plus(value))
        if now != p:
            out[now] = p
    return out


def data_file_name(file_id: str, write_token: str, instant: str) -> str:
    return f"{file_id}_{write_token}_{instant}.parquet"


def log_file_name(file_id: str, write_token: str, instant: str) -> str:
    """A merge-on-read log of file group ``file_id``: what ``instant`` wrote on top of its base."""
    return f"{file_id}_{write_token}_{instant}.log.parquet"


class TableLayout:
    """Paths of one table, relative to its root path on its filesystem."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.meta = posixpath.join(root, META_DIR)
        self.config_file = posixpath.join(self.meta, "table.json")
        self.timeline = posixpath.join(self.meta, "timeline")
        self.index = posixpath.join(self.meta, "index")
        self.markers = posixpath.join(self.meta, "markers")
        self.heartbeats = posixpath.join(self.meta, "heartbeats")
        self.sequence = posixpath.join(self.meta, "sequence")
        self.conflicts = posixpath.join(self.meta, "conflicts")
        self.checkpoints = posixpath.join(self.meta, "checkpoints")
        self.archive = posixpath.join(self.meta, "archive")

    def abs(self, rel: str) -> str:
        """The path of the table's file ``rel``: under the root (``..`` normalised), or --
        for a reference file -- outside it, where it may only be read (the table's FileIO
        refuses to write or delete outside the root). Raises :class:`PathEscapeError` for any
        other path that leaves the root (an absolute one, or one climbing out with ``..``)."""
        if is_reference(rel):  # out of the root: normalised, since object stores take ".." literally
            return posixpath.normpath(posixpath.join(self.root, rel))
        path = posixpath.join(self.root, rel)
        if not rel or not is_inside(path, self.root) or posixpath.normpath(path) == posixpath.normpath(self.root):
            raise PathEscapeError(f"{rel!r} is not a file under the table root {self.root}")
        return path

    def data_path(self, rel: str) -> str:
        """:meth:`abs` for a data file or log about to be written: also refused inside
        ``.bucketindex/`` and for a reference file (read-only), so no value, key or bug can
        make a data write land on the table's metadata or on a user's file."""
        if is_reference(rel):
            raise PathEscapeError(f"{rel!r} is a reference file: bucketindex never writes it")
        path = self.abs(rel)
        if is_inside(path, self.meta):
            raise PathEscapeError(f"{rel!r} is inside {META_DIR}/: not a data file path")
        return path

    def rel(self, path: str) -> str:
        return posixpath.relpath(path, self.root)

    def index_bucket_dir(self, bucket: int) -> str:
        return posixpath.join(self.index, f"bucket={bucket:05d}")

    def index_file(self, bucket: int, kind: str, instant: str) -> str:
        """``kind`` is ``base`` or ``delta``."""
        return posixpath.join(self.index_bucket_dir(bucket), f"{kind}_{instant}{INDEX_FILE_SUFFIX}")

    def marker_dir(self, instant: str) -> str:
        return posixpath.join(self.markers, instant)

    def marker_file(self, instant: str, rel_path: str) -> str:
        """The marker of ``rel_path``: its quoted path as the name, or -- when that would pass
        a file name's 255 bytes (quoting a non-ASCII partition value triples it) -- a hash of
        it, with the path stored as the marker's content (:meth:`marker_content`)."""
        name = quote(rel_path, safe="")
        if len(name) > MAX_QUOTED_MARKER:
            name = HASHED_MARKER_PREFIX + hashlib.sha1(rel_path.encode()).hexdigest()
        return posixpath.join(self.marker_dir(instant), name + ".marker")

    @staticmethod
    def marker_content(rel_path: str) -> bytes:
        return rel_path.encode() if len(quote(rel_path, safe="")) > MAX_QUOTED_MARKER else b""

    @staticmethod
    def marker_target(marker_name: str) -> str | None:
        """The path a marker names, or None for a hashed marker (read its content instead)."""
        if marker_name.startswith(HASHED_MARKER_PREFIX):
            return None
        return unquote(marker_name[: -len(".marker")])

    def heartbeat_file(self, instant: str) -> str:
        return posixpath.join(self.heartbeats, instant)

    def sequence_file(self, seq: int) -> str:
        """The commit point of the ``seq``-th completed action (see timeline.py)."""
        return posixpath.join(self.sequence, f"{seq:020d}.json")

    def checkpoint_file(self, seq: int) -> str:
        """The file-system view after sequence entry ``seq`` (format.md §3.5)."""
        return posixpath.join(self.checkpoints, f"{seq:020d}.json")

    def archived_checkpoint_file(self, seq: int) -> str:
        """An older checkpoint kept for time travel, out of the directory every open lists."""
        return posixpath.join(self.archive, "checkpoints", f"{seq:020d}.json")

    def checkpoint_batches_file(self, seq: int) -> str:
        """Every batch id committed up to ``seq``: read only to check idempotence."""
        return posixpath.join(self.checkpoints, f"{seq:020d}.batches.json")

    def archive_file(self, first: int, last: int) -> str:
        """Sequence entries ``first..last`` (and their plans) moved out of ``sequence/``."""
        return posixpath.join(self.archive, f"{first:020d}-{last:020d}.json")

    def conflict_file(self, instant: str) -> str:
        return posixpath.join(self.conflicts, f"{instant}.json")
