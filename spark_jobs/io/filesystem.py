"""Filesystem access for the table format.

Everything the table format reads or writes goes through :class:`FileIO`, a thin layer
over ``pyarrow.fs`` so that local paths, ``file://``, ``hdfs://`` and ``s3://`` URIs all
work the same. The one operation pyarrow does not offer portably is *create this file
atomically, only if it is absent* -- the primitive the commit protocol stands on -- so
each backend implements it with what that storage guarantees:

* local disk: write a temp file, then ``os.link`` it to the final name (``link`` fails
  if the name exists, and the content is complete before the name appears);
* S3: a conditional ``PutObject`` with ``If-None-Match: *`` through boto3 (pyarrow has no
  conditional put), retried on the same key after a 409;
* HDFS, GCS, Azure: none this release trusts, so a table there is refused when it is opened
  (:func:`refuse_uncommittable`); their files are still readable (sources).
"""

from __future__ import annotations

import copy
import errno
import io as io_module
import os
import posixpath
import random
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from spark_jobs.exceptions import BadInputError, PathEscapeError, StorageUnavailableError, UnsupportedStorageError
from spark_jobs.io import storage
from spark_jobs.io.storage import SCHEME_ALIASES, StorageConfig, split_uri_options

__all__ = ["FileIO", "InstantExistsError", "PathEscapeError", "is_inside", "resolve", "refuse_uncommittable",
           "normalise_uri", "scheme_of", "clear_cache", "is_unreachable", "GLOB_CHARS", "is_glob", "split_query"]

#: what a delete treats as "not there": a missing file, a missing or non-directory parent,
#: and a name too long to exist at all (a write that failed on it created nothing)
_ABSENT_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG)


class InstantExistsError(FileExistsError):
    """Raised when an exclusive create finds the file already there (another writer won)."""


def is_inside(path: str, root: str) -> bool:
    """Whether ``path``, with ``.`` and ``..`` normalised, is ``root`` or lies under it."""
    p, r = posixpath.normpath(path), posixpath.normpath(root)
    return p == r or p.startswith(r.rstrip("/") + "/")


class FileIO:
    """Filesystem operations over one pyarrow filesystem; paths are filesystem paths."""

    scheme = "generic"
    #: whether :meth:`create_exclusive` is a real create-if-absent on this store (a table
    #: can live here); :func:`refuse_uncommittable` refuses a table where it is not
    supports_exclusive_create = True

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs
        #: when set (:meth:`confined`), every write and delete must lie under it
        self.root: str | None = None

    def confined(self, root: str) -> "FileIO":
        """A copy that refuses (:class:`PathEscapeError`) to write, create or delete anything
        outside ``root``: the one check every path a table writes or deletes passes, so
        neither a bad name nor a future bug can touch a file outside the table."""
        io = copy.copy(self)
        io.root = root
        return io

    def _guard(self, path: str) -> None:
        if self.root is not None and not is_inside(path, self.root):
            raise PathEscapeError(f"refusing to write or delete {path}: outside the table root {self.root}")

    # -- reading ---------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def is_file(self, path: str) -> bool:
        """Whether ``path`` is a file: for callers that know it is not a directory, which an
        object store answers with one HEAD instead of a HEAD and a LIST (format.md §10)."""
        return self.fs.get_file_info(path).type == pafs.FileType.File

    def read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return f.read()

    def size(self, path: str) -> int:
        return self.fs.get_file_info(path).size

    def sizes(self, paths: Iterable[str]) -> dict[str, int | None]:
        """Bytes of each file (None: not there), for callers with many files to size."""
        paths = list(paths)
        return {p: (i.size if i.type == pafs.FileType.File else None)
                for p, i in zip(paths, self.fs.get_file_info(paths))}

    def list_sizes(self, path: str) -> dict[str, int]:
        """Every file under ``path`` (recursive) and its bytes: one listing for a whole tree
        where a size per file would be a request per file on an object store."""
        return {i.path: int(i.size or 0) for i in self._list(path, recursive=True) if i.type == pafs.FileType.File}

    def total_size(self, path: str) -> int:
        """Bytes of a file, or of every file under a directory."""
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            sel = pafs.FileSelector(path, recursive=True)
            return sum(i.size or 0 for i in self.fs.get_file_info(sel) if i.type == pafs.FileType.File)
        return info.size or 0

    def list_names(self, path: str) -> list[str]:
        """Names directly under ``path`` (empty when it does not exist)."""
        return sorted(posixpath.basename(i.path) for i in self._list(path, recursive=False))

    def _list(self, path: str, *, recursive: bool) -> list[pafs.FileInfo]:
        """Entries under ``path``, none when it does not exist.

        Arrow's local listing with ``allow_not_found`` checks existence again after a failed
        listing and raises when the directory appeared in between (another writer's first
        commit creating ``sequence/``): the directory was absent when listed, so list it once
        more, and take a second miss as empty."""
        sel = pafs.FileSelector(path, allow_not_found=True, recursive=recursive)
        try:
            return self.fs.get_file_info(sel)
        except FileNotFoundError:
            try:
                return self.fs.get_file_info(sel)
            except FileNotFoundError:
                return []

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self.fs.open_input_file(path)

    def memory_map(self, path: str) -> pa.NativeFile:
        """A zero-copy view of the file where the storage allows it, else a random-access file."""
        return self.fs.open_input_file(path)

    def identity(self, path: str) -> tuple[int, ...] | None:
        """What tells this version of the file at ``path`` from any other, cheaply: for caches of
        decoded immutable files (the record index's open files). None where it is not cheap --
        an object store would answer with a HEAD request per file -- and nothing is cached
        there. FileNotFoundError when the file is not there."""
        return None

    # -- writing ---------------------------------------------------------------------
    def mkdirs(self, path: str) -> None:
        self._guard(path)
        self.fs.create_dir(path, recursive=True)

    def open_output_stream(self, path: str) -> pa.NativeFile:
        self._guard(path)
        self.mkdirs(posixpath.dirname(path))
        return self.fs.open_output_stream(path)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write (or replace) a whole file; not atomic, use only for files nobody trusts yet."""
        with self.open_output_stream(path) as f:
            f.write(data)

    def write_atomic(self, path: str, data: bytes) -> None:
        """Replace ``path`` so that a reader sees the old content or the new, never a torn file.

        The base implementation is one PUT, which object stores apply atomically.
        """
        self.write_bytes(path, data)

    def create_exclusive(self, path: str, data: bytes) -> None:
        """Create ``path`` with ``data`` atomically, only if absent; else InstantExistsError.

        A store without a primitive this release trusts refuses (one line), never a
        ``NotImplementedError`` at the first commit; tables there are refused at open anyway."""
        raise UnsupportedStorageError(_UNSUPPORTED["other"].format(scheme=self.scheme))

    def delete(self, path: str) -> None:
        """Delete a file; deleting a missing file is not an error (rollback resumes), nor is
        one whose name is too long to exist (a write that failed on it leaves it for a
        rollback to delete)."""
        self._guard(path)
        try:
            self.fs.delete_file(path)
        except OSError as e:
            if not isinstance(e, FileNotFoundError) and e.errno not in _ABSENT_ERRNOS:
                raise

    def delete_many(self, paths: Iterable[str]) -> None:
        """Delete files (missing ones are fine); object stores batch them into few requests."""
        for path in paths:
            self.delete(path)

    def delete_dir(self, path: str) -> None:
        self._guard(path)
        try:
            self.fs.delete_dir(path)
        except OSError as e:
            if not isinstance(e, FileNotFoundError) and e.errno not in _ABSENT_ERRNOS:
                raise

    def _tmp_name(self, path: str) -> str:
        """The temp name of an atomic write or create of ``path``: every such write starts
        here, so its target is checked against the root here too."""
        self._guard(path)
        return posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")

    def _delete_quietly(self, path: str) -> None:
        """Remove a temp file after a failed write; a second failure must not hide the first."""
        try:
            self.delete(path)
        except OSError:
            pass


def _write_local(tmp: str, data: bytes, *, final: str, sync: bool) -> None:
    """Write ``tmp`` for ``final``; an OSError without a file name (a full disk fails in
    ``write``, not ``open``) is re-raised naming ``final``, so the error says which storage failed."""
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    except OSError as e:
        if e.filename is None and e.errno is not None:
            raise OSError(e.errno, e.strerror or os.strerror(e.errno), final) from e
        raise


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


#: how old a local file's mtime must be before :meth:`LocalFileIO.identity` vouches for it (2 s:
#: far above the kernel's timestamp tick, and index files are read long after they are written)
SETTLE_NS = 2_000_000_000


class LocalFileIO(FileIO):
    scheme = "file"

    def _guard(self, path: str) -> None:
        """The lexical check, and on a local disk the resolved one: a table directory replaced by
        a symlink leaving the root (``region=eu -> /elsewhere``) would have the table's files
        written, and cleaned, through it. The deepest part of ``path`` that exists must resolve
        inside the resolved root (the root itself may be a symlink): PathEscapeError otherwise,
        one line naming the link, before anything is written or deleted."""
        super()._guard(path)
        if self.root is None:
            return
        existing = path
        while existing != self.root and not os.path.lexists(existing):
            parent = posixpath.dirname(existing)
            if parent == existing:
                break
            existing = parent
        real, real_root = os.path.realpath(existing), os.path.realpath(self.root)
        if not is_inside(real, real_root):
            raise PathEscapeError(f"refusing to write or delete {path}: {existing} resolves to {real}, outside the "
                                  f"table root {self.root} (a symlink leaving the table); replace the link with "
                                  f"the directory it should be")

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = self._tmp_name(path)
        self.mkdirs(posixpath.dirname(path))
        try:
            _write_local(tmp, data, final=path, sync=False)
            os.replace(tmp, path)  # rename(2) replaces the name in one step
        except BaseException:
            _unlink_quietly(tmp)  # a full disk must not leave a temp file no later run removes
            raise

    def memory_map(self, path: str) -> pa.NativeFile:
        return pa.memory_map(path, "r")

    def identity(self, path: str) -> tuple[int, ...] | None:
        """Device, inode, size and modification time (ns): one ``stat``. A file replaced (a new
        inode), truncated or rewritten (size, mtime) has another identity -- once its mtime is
        :data:`SETTLE_NS` old: the kernel stamps mtimes from a clock that ticks every few ms, so
        a file rewritten in place, at the same size, in the tick it was written keeps its mtime.
        Before that, None (not cacheable yet)."""
        st = os.stat(path)
        if time.time_ns() - st.st_mtime_ns < SETTLE_NS:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def create_exclusive(self, path: str, data: bytes) -> None:
        tmp = self._tmp_name(path)
        self.mkdirs(posixpath.dirname(path))
        try:
            _write_local(tmp, data, final=path, sync=True)
            os.link(tmp, path)
        except FileExistsError as e:
            raise InstantExistsError(f"{path} already exists") from e
        finally:
            _unlink_quietly(tmp)  # also when the write or the link failed (a full disk, a denied directory)


class HadoopFileIO(FileIO):
    """HDFS through pyarrow (libhdfs): readable, but no table can be committed to it.

    pyarrow's ``move`` replaces an existing destination on HDFS, so a temp file renamed to a
    commit slot can clobber another writer's commit, and libhdfs offers no create that fails
    when the file exists. Until one exists here, a table on ``hdfs://`` is refused when it is
    opened (:func:`refuse_uncommittable`); a source on HDFS is read as any other.
    """

    scheme = "hdfs"
    supports_exclusive_create = False

    def create_exclusive(self, path: str, data: bytes) -> None:
        raise UnsupportedStorageError(_UNSUPPORTED["hdfs"])


class S3FileIO(FileIO):
    """S3 and S3-compatible stores: pyarrow's S3 filesystem for streamed reads of data files and
    large writes, and one boto3 client, built from the same
    :class:`~spark_jobs.io.storage.StorageConfig`, for everything pyarrow does with more requests
    than the protocol needs (format.md §10, the request budget): the conditional ``PutObject`` of
    a commit, a whole small file as one ``PutObject`` or one ``GetObject``, a file's existence as
    one ``HeadObject``, a listing as one ``ListObjectsV2`` per 1,000 names, batch deletes.

    Why not pyarrow for those: its ``get_file_info`` of a missing file is a HEAD and a LIST (it
    looks for a "directory"), ``delete_file``/``delete_dir`` re-create the parent's directory
    marker (HEAD, LIST, PUT), its output stream is a multipart upload (three requests for a
    heartbeat), and a random-access read is a HEAD and a GET per range. No directory markers:
    an object store has no directories, so :meth:`mkdirs` writes nothing.
    """

    scheme = "s3"
    #: a 409 ``ConditionalRequestConflict`` (another conditional put on the same key in flight)
    #: is retried on the same key this often before the commit gives up as retryable
    CONFLICT_RETRIES = 8
    #: keys per ``DeleteObjects`` request (S3's limit)
    DELETE_BATCH = 1000
    #: a written file up to this size is one ``PutObject`` (index files, markers, plans,
    #: heartbeats, most data files of a small batch); a larger one continues as pyarrow's
    #: multipart upload, where a part costs one request per 10 MB anyway
    SINGLE_PUT_BYTES = 8 << 20

    def __init__(self, fs: pafs.FileSystem, config: StorageConfig | None = None) -> None:
        super().__init__(fs)
        self.config = config or StorageConfig()
        # shared by the confined copies of this FileIO: one client per store, built on first use
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        with self._lock:
            if "s3" not in self._clients:
                self._clients["s3"] = self.config.s3_client()
            return self._clients["s3"]

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        bucket, _, key = path.partition("/")
        return bucket, key

    @contextmanager
    def _call(self, path: str) -> Iterator[None]:
        """boto3's errors as the ``OSError``\\s pyarrow raises (and callers catch): a missing key
        or bucket is FileNotFoundError, a refusal PermissionError, an unreachable store
        StorageUnavailableError."""
        from botocore.exceptions import ClientError

        try:
            with _store_errors(f"s3://{path}"):
                yield
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code"))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound") or status == 404:
                raise FileNotFoundError(errno.ENOENT, f"no such object ({code})", f"s3://{path}") from e
            if code in ("AccessDenied", "403", "Forbidden") or status == 403:
                raise PermissionError(errno.EACCES, f"access denied ({code})", f"s3://{path}") from e
            raise OSError(errno.EIO, f"{code}: {e.response.get('Error', {}).get('Message', e)}",
                          f"s3://{path}") from e

    # -- reading ---------------------------------------------------------------------
    def _head(self, path: str) -> dict[str, Any] | None:
        """One ``HeadObject``: the object's metadata, or None when there is no such key."""
        bucket, key = self._split(path)
        if not key:
            return None
        try:
            with self._call(path):
                return self.client.head_object(Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None

    def is_file(self, path: str) -> bool:
        return self._head(path) is not None

    def exists(self, path: str) -> bool:
        """One HEAD for a file; a LIST of one name only when no file has that name (a "directory")."""
        if self._head(path) is not None:
            return True
        bucket, key = self._split(path)
        with self._call(path):
            answer = self.client.list_objects_v2(Bucket=bucket, Prefix=key.rstrip("/") + "/" if key else "",
                                                 MaxKeys=1)
        return bool(answer.get("KeyCount") or answer.get("Contents") or answer.get("CommonPrefixes"))

    def size(self, path: str) -> int:
        head = self._head(path)
        return None if head is None else int(head["ContentLength"])  # type: ignore[return-value]

    def sizes(self, paths: Iterable[str]) -> dict[str, int | None]:
        """One LIST per directory holding two or more of ``paths`` (per 1,000 names), one HEAD
        for a file alone in its directory: not a HEAD per file (format.md §10)."""
        by_dir: dict[str, list[str]] = {}
        for p in paths:
            by_dir.setdefault(posixpath.dirname(p), []).append(p)
        out: dict[str, int | None] = {}
        for d, ps in by_dir.items():
            if len(ps) == 1:
                out[ps[0]] = self.size(ps[0])
                continue
            bucket, key = self._split(d)
            prefix = key.rstrip("/") + "/" if key else ""
            listed: dict[str, int] = {}
            with self._call(d):
                for page in self.client.get_paginator("list_objects_v2").paginate(
                        Bucket=bucket, Prefix=prefix, Delimiter="/"):
                    listed.update((f"{bucket}/{o['Key']}", int(o["Size"])) for o in page.get("Contents", []))
            out.update((p, listed.get(p)) for p in ps)
        return out

    def read_bytes(self, path: str) -> bytes:
        """One ``GetObject`` (pyarrow's input stream is a HEAD and a GET)."""
        bucket, key = self._split(path)
        with self._call(path):
            body = self.client.get_object(Bucket=bucket, Key=key)["Body"]
            try:
                return body.read()
            finally:
                body.close()

    def memory_map(self, path: str) -> pa.NativeFile:
        """The whole object in one ``GetObject``: an index file is read whole anyway (a lookup
        scans its blocks), and pyarrow's random-access file costs a HEAD plus a GET per block."""
        return pa.BufferReader(self.read_bytes(path))

    def list_names(self, path: str) -> list[str]:
        """One ``ListObjectsV2`` per 1,000 names, with a delimiter (nothing below is listed)."""
        bucket, key = self._split(path)
        prefix = key.rstrip("/") + "/" if key else ""
        names: set[str] = set()
        with self._call(path):
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=bucket, Prefix=prefix, Delimiter="/"):
                names.update(o["Key"][len(prefix):] for o in page.get("Contents", []))
                names.update(p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", []))
        names.discard("")  # a directory marker another tool left for this prefix
        return sorted(names)

    def list_sizes(self, path: str) -> dict[str, int]:
        """One ``ListObjectsV2`` per 1,000 keys under ``path``, no delimiter."""
        bucket, key = self._split(path)
        prefix = key.rstrip("/") + "/" if key else ""
        out: dict[str, int] = {}
        with self._call(path):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                out.update((f"{bucket}/{o['Key']}", int(o["Size"])) for o in page.get("Contents", []))
        return out

    def _list_keys(self, path: str) -> list[str]:
        """Every key under ``path`` (recursive), one ``ListObjectsV2`` per 1,000."""
        bucket, key = self._split(path)
        prefix = key.rstrip("/") + "/" if key else ""
        keys: list[str] = []
        with self._call(path):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                keys.extend(o["Key"] for o in page.get("Contents", []))
        return keys

    # -- writing ---------------------------------------------------------------------
    def mkdirs(self, path: str) -> None:
        self._guard(path)  # nothing to create: a key's prefix needs no object

    def _put(self, path: str, data: bytes) -> None:
        bucket, key = self._split(path)
        with self._call(path):
            self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def write_bytes(self, path: str, data: bytes) -> None:
        """One ``PutObject``, which S3 applies atomically (a heartbeat, a plan, a marker)."""
        self._guard(path)
        self._put(path, data)

    def write_atomic(self, path: str, data: bytes) -> None:
        self.write_bytes(path, data)

    def open_output_stream(self, path: str) -> pa.NativeFile:
        """A stream that is one ``PutObject`` when closed under :attr:`SINGLE_PUT_BYTES`, else
        pyarrow's multipart upload (pyarrow's own stream is a multipart upload of three
        requests at least, whatever the size)."""
        self._guard(path)
        return pa.PythonFile(_SinglePutStream(self, path), mode="w")

    def create_exclusive(self, path: str, data: bytes) -> None:
        """One conditional ``PutObject`` with ``If-None-Match: *``: 412 means another writer
        holds the key (InstantExistsError); 409 ``ConditionalRequestConflict`` means a
        concurrent conditional put on the key was still undecided, so the same key is tried
        again (format.md §10)."""
        from botocore.exceptions import ClientError

        self._guard(path)
        bucket, key = self._split(path)
        for attempt in range(self.CONFLICT_RETRIES + 1):
            try:
                with _store_errors(f"s3://{path}"):
                    self.client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
                return
            except ClientError as e:
                code = str(e.response.get("Error", {}).get("Code"))
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if code == "PreconditionFailed" or status == 412:
                    raise InstantExistsError(f"s3://{path} already exists") from e
                if code == "ConditionalRequestConflict" or status == 409:
                    time.sleep(min(1.0, 0.02 * 2 ** attempt) * (0.5 + random.random()))
                    continue
                raise
        raise StorageUnavailableError(
            f"s3://{path}: the store kept answering 409 ConditionalRequestConflict to a conditional put; "
            f"nothing was committed, safe to retry")

    def delete(self, path: str) -> None:
        """One ``DeleteObject`` (pyarrow's delete also re-creates the parent's directory marker)."""
        self._guard(path)
        bucket, key = self._split(path)
        with _store_errors(f"s3://{path}"):
            self.client.delete_object(Bucket=bucket, Key=key)  # a missing key is not an error on S3

    def delete_many(self, paths: Iterable[str]) -> None:
        """``DeleteObjects``, up to 1,000 keys a request; missing keys are not errors."""
        by_bucket: dict[str, list[str]] = {}
        for path in paths:
            self._guard(path)
            bucket, key = self._split(path)
            by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            keys = list(dict.fromkeys(keys))
            if len(keys) == 1:  # a batch of one is a plain DeleteObject (also one request)
                self.delete(f"{bucket}/{keys[0]}")
                continue
            for i in range(0, len(keys), self.DELETE_BATCH):
                chunk = keys[i:i + self.DELETE_BATCH]
                with _store_errors(f"s3://{bucket}"):
                    answer = self.client.delete_objects(
                        Bucket=bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True})
                failed = [e for e in answer.get("Errors", []) if e.get("Code") != "NoSuchKey"]
                if failed:
                    first = failed[0]
                    raise OSError(errno.EIO, f"delete refused: {first.get('Code')} {first.get('Message')}",
                                  f"s3://{bucket}/{first.get('Key')}")

    def delete_dir(self, path: str) -> None:
        """Every key under ``path``: one LIST and one ``DeleteObjects`` per 1,000 keys (pyarrow's
        also HEADs the "directory" and re-creates the parent's marker)."""
        self._guard(path)
        bucket, _ = self._split(path)
        keys = self._list_keys(path)
        if keys:
            self.delete_many(f"{bucket}/{k}" for k in keys)


class _SinglePutStream:
    """The file object behind :meth:`S3FileIO.open_output_stream`: buffered in memory and put
    whole on close, or -- past :attr:`S3FileIO.SINGLE_PUT_BYTES` -- handed to pyarrow's
    multipart upload with what was buffered so far."""

    def __init__(self, io: S3FileIO, path: str) -> None:
        self._io, self._path = io, path
        self._buf: io_module.BytesIO | None = io_module.BytesIO()
        self._stream: pa.NativeFile | None = None
        self._pos = 0
        self.closed = False

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = view.nbytes
        if self._stream is not None:
            self._stream.write(view)
        else:
            assert self._buf is not None
            self._buf.write(view)
            if self._buf.tell() > self._io.SINGLE_PUT_BYTES:
                self._stream = self._io.fs.open_output_stream(self._path)
                self._stream.write(self._buf.getbuffer())
                self._buf = None
        self._pos += n
        return n

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._stream is not None:
            self._stream.close()
        else:
            assert self._buf is not None
            self._io._put(self._path, self._buf.getvalue())
            self._buf = None


class UncommittableFileIO(FileIO):
    """A store pyarrow reads but this release cannot commit to (GCS, Azure): see :func:`refuse_uncommittable`."""

    supports_exclusive_create = False

    def __init__(self, fs: pafs.FileSystem, scheme: str) -> None:
        super().__init__(fs)
        self.scheme = scheme

    def create_exclusive(self, path: str, data: bytes) -> None:
        raise UnsupportedStorageError(_UNSUPPORTED.get(self.scheme, _UNSUPPORTED["other"]).format(scheme=self.scheme))


#: why a table cannot live on a store, one line each (format.md §10)
_UNSUPPORTED = {
    "hdfs": "tables on hdfs:// are not supported yet: pyarrow's HDFS client has no create that fails when the "
            "file exists and its rename replaces one, so two writers could both take one commit; HDFS sources "
            "can be read",
    "gs": "tables on gs:// are not supported yet: committing needs a create-if-absent (a generation-match-0 "
          "upload) that pyarrow's GCS filesystem does not offer; GCS sources can be read",
    "abfs": "tables on {scheme}:// are not supported yet: committing needs a create-if-absent (If-None-Match: *) "
            "that pyarrow's Azure filesystem does not offer; Azure sources can be read",
    "other": "tables on {scheme}:// are not supported: its store has no create-if-absent this release can use",
}


_cache: dict[tuple[str, StorageConfig], FileIO] = {}
_cache_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child (a test's writer processes, a multiprocessing pool) starts with fresh
    locks and no FileIO of its parent's: a lock another thread held at the fork would never be
    released in the child, and a boto3 client must not be shared across processes."""
    global _cache_lock
    _cache_lock = threading.Lock()
    _cache.clear()


def clear_cache() -> None:
    """Forget the built FileIOs (the run's storage options changed)."""
    with _cache_lock:
        _cache.clear()


storage.on_configure(clear_cache)  # storage.configure calls it: storage cannot import this module


def normalise_uri(uri: str) -> str:
    """``uri`` with an alias scheme replaced (``s3a://b/t`` -> ``s3://b/t``)."""
    parsed = urlparse(uri)
    alias = SCHEME_ALIASES.get(parsed.scheme.lower())
    if alias is None:
        return uri
    return alias + uri[len(parsed.scheme):]


#: Hadoop's glob characters: Spark reads any source path holding one of them as a glob
GLOB_CHARS = "*?[{"


def is_glob(path: str) -> bool:
    """Whether Spark reads ``path`` (a source, a path component) as a Hadoop glob. A URI's
    query (storage options: :func:`split_query`) is not part of its path: ask about the path."""
    return any(ch in path for ch in GLOB_CHARS)


def split_query(uri: str) -> tuple[str, str]:
    """``uri`` without its query, and the query with its ``?`` (``""`` when there is none).

    Only a URI with a scheme has a query (the storage options of
    :func:`~spark_jobs.io.storage.split_uri_options`); a local path may hold ``?`` literally,
    where Spark reads it as a glob character."""
    parsed = urlparse(uri)
    if len(parsed.scheme) <= 1 or "?" not in uri:
        return uri, ""
    base, _, query = uri.partition("?")
    return base, "?" + query


def scheme_of(uri: str) -> str:
    """The store a URI names: ``file`` for a plain path, aliases resolved."""
    parsed = urlparse(uri)
    if parsed.scheme == "" or len(parsed.scheme) == 1:
        return "file"
    return SCHEME_ALIASES.get(parsed.scheme.lower(), parsed.scheme.lower())


def resolve(uri: str, *, options: dict[str, str] | None = None) -> tuple[FileIO, str]:
    """The FileIO for ``uri`` and the path inside it; a bare path means the local disk.

    One FileIO (and so one pyarrow filesystem and one boto3 client) per store and settings
    for the process: every table handle and task of a run shares them. ``options`` are the
    run's storage options (default: :func:`spark_jobs.io.storage.configured`).
    """
    parsed = urlparse(uri)
    if parsed.scheme == "" or len(parsed.scheme) == 1:  # a plain path (or a Windows drive letter)
        return _cached("file", StorageConfig(), lambda: LocalFileIO(pafs.LocalFileSystem())), (
            os.path.abspath(uri).rstrip("/") or "/")
    uri, uri_options = split_uri_options(normalise_uri(uri))
    scheme = scheme_of(uri)
    if scheme == "s3":
        config = StorageConfig.resolve(uri_options=uri_options, options=options)
        io = _cached("s3", config, lambda: S3FileIO(config.s3_filesystem(), config))
        return io, uri.split("://", 1)[1].rstrip("/")
    if uri_options:
        raise BadInputError(f"storage options in the URI are read for s3:// only, not {scheme}:// ({uri})")
    fs, path = pafs.FileSystem.from_uri(uri)
    path = path.rstrip("/")
    if isinstance(fs, pafs.LocalFileSystem):
        return LocalFileIO(fs), path
    if isinstance(fs, pafs.HadoopFileSystem):
        return HadoopFileIO(fs), path
    return UncommittableFileIO(fs, scheme), path


def _cached(scheme: str, config: StorageConfig, build: Callable[[], FileIO]) -> FileIO:
    with _cache_lock:
        io = _cache.get((scheme, config))
        if io is None:
            io = _cache[(scheme, config)] = build()
        return io


def refuse_uncommittable(io: FileIO, uri: str) -> None:
    """UnsupportedStorageError (one line, before anything is written) when ``uri``'s store
    cannot hold a table: its FileIO has no create-if-absent this release trusts."""
    if not io.supports_exclusive_create:
        raise UnsupportedStorageError(_UNSUPPORTED.get(io.scheme, _UNSUPPORTED["other"]).format(scheme=io.scheme)
                                      + f" ({uri})")


def refuse_uncommittable_uri(uri: str) -> None:
    """:func:`refuse_uncommittable` by the URI's scheme alone, before its filesystem is built:
    building one may need what is not there (libhdfs and a JVM, cloud credentials) or wait on a
    network, and a table there is refused whatever the answer."""
    scheme = scheme_of(uri)
    if scheme in ("hdfs", "gs", "abfs"):
        raise UnsupportedStorageError(_UNSUPPORTED[scheme].format(scheme=urlparse(uri).scheme.lower()) + f" ({uri})")


#: pyarrow's (the AWS SDK's) words for a store that did not answer
_UNREACHABLE = ("NETWORK_CONNECTION", "Couldn't connect", "curlCode: 7", "curlCode: 28", "Connection refused",
                "Timeout was reached", "Could not resolve host")


def is_unreachable(error: BaseException) -> bool:
    """Whether a pyarrow filesystem error says the store did not answer (a resource failure,
    exit 3), as opposed to a missing or unreadable file."""
    if isinstance(error, StorageUnavailableError):
        return True
    text = str(error)
    return isinstance(error, OSError) and any(m in text for m in _UNREACHABLE)


@contextmanager
def _store_errors(where: str) -> Iterator[None]:
    """An endpoint that does not answer is the store's state, not the input's: StorageUnavailableError."""
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

    try:
        yield
    except (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError) as e:
        raise StorageUnavailableError(f"the store of {where} did not answer ({e}); nothing was committed, "
                                      f"safe to retry") from e


os.register_at_fork(after_in_child=_after_fork_in_child)
