"""Where each kind of file lives inside a table (format v1). Only this module builds paths."""

from __future__ import annotations

import hashlib
import posixpath
import re
from typing import Callable, Iterable, Protocol, TypeVar
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
    "DirOps",
    "partition_dir",
    "partition_path",
    "REFERENCE_PREFIX",
    "TableLayout",
]

META_DIR = ".bucketindex"
#: the partition directory value for a null partition field (the encoding: :func:`partition_dir`)
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


V = TypeVar("V")


class DirOps(Protocol[V]):
    """The string primitives :func:`partition_dir` is applied with: ``V`` is a Python ``str``
    (None for null) or a Spark ``Column``. Each propagates null except ``if_null``."""

    def lit(self, s: str) -> V: ...
    def url_encode(self, text: V) -> V: ...  # Java's URLEncoder (UTF-8): ``*-._`` kept, space as ``+``
    def sub(self, v: V, pattern: str, repl: str) -> V: ...  # regex replace (Java's and Python's syntax alike)
    def head(self, v: V, n: int) -> V: ...  # the first n characters
    def sha256_hex(self, text: V) -> V: ...  # the SHA-256 of the UTF-8 text, lower-case hex
    def longer(self, v: V, n: int, then: Callable[[], V], otherwise: V) -> V: ...  # then() if len(v) > n
    def concat(self, *vs: V) -> V: ...
    def if_null(self, v: V, default: str) -> V: ...


def partition_dir(field: str, text: V, ops: DirOps[V]) -> V:
    """The one definition of a partition directory (format.md §1), ``field=<encoded>`` of a
    value's text, applied with the string primitives of its caller (:func:`partition_path` in
    Python, ``jobs.keys.partition_expr`` as a Spark expression; the Arrow engine applies
    :func:`partition_path` per distinct value): the text URL-encoded as Java's URLEncoder does
    (which also encodes ``~``), a leading ``__`` escaped, ``__NULL__`` for null, and a long value
    shortened to a readable prefix plus ``~`` plus a hash of the whole text, so no name passes a
    file name's limit."""
    encoded = ops.sub(ops.url_encode(text), DUNDER_ESCAPE[0], DUNDER_ESCAPE[1])
    whole, prefix = long_value_budget(field=field)

    def shortened() -> V:
        return ops.concat(ops.sub(ops.head(encoded, prefix), CUT_ESCAPE, ""), ops.lit(LONG_VALUE_SEP),
                          ops.head(ops.sha256_hex(text), LONG_VALUE_HASH_CHARS))

    return ops.concat(ops.lit(f"{field}="), ops.if_null(ops.longer(encoded, whole, shortened, encoded), NULL_PARTITION))


class _PyDirOps:
    """:class:`DirOps` on Python strings (None for null)."""

    def lit(self, s: str) -> str:
        return s

    def url_encode(self, text: str | None) -> str | None:
        return None if text is None else quote_plus(text, safe="*").replace("~", "%7E")

    def sub(self, v: str | None, pattern: str, repl: str) -> str | None:
        return None if v is None else re.sub(pattern, repl, v)

    def head(self, v: str | None, n: int) -> str | None:
        return None if v is None else v[:n]

    def sha256_hex(self, text: str | None) -> str | None:
        return None if text is None else hashlib.sha256(text.encode()).hexdigest()

    def longer(self, v: str | None, n: int, then: Callable[[], str | None], otherwise: str | None) -> str | None:
        return then() if v is not None and len(v) > n else otherwise

    def concat(self, *vs: str | None) -> str | None:
        return None if any(v is None for v in vs) else "".join(vs)  # type: ignore[arg-type]

    def if_null(self, v: str | None, default: str) -> str:
        return default if v is None else v


_PY_DIR_OPS = _PyDirOps()


def partition_path(field: str, value: object) -> str:
    """``field=<value>`` for a string or integer value (None: null): :func:`partition_dir` on
    Python strings, for callers without a query to run (``tests/spark/test_keys.py`` holds it
    equal to Spark's ``partition_expr`` on users' kinds of values)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))):
        raise TypeError(f"partition_path takes a string or an integer, got {type(value).__name__}")
    out = partition_dir(field, None if value is None else str(value), _PY_DIR_OPS)
    assert out is not None
    return out


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
