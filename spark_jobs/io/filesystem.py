"""Filesystem access for the table format.

Everything the table format reads or writes goes through :class:`FileIO`, a thin layer
over ``pyarrow.fs`` so that local paths, ``file://``, ``hdfs://`` and ``s3://`` URIs all
work the same. The one operation pyarrow does not offer portably is *create this file
atomically, only if it is absent* -- the primitive the commit protocol stands on -- so
each backend implements it with what that storage guarantees:

* local disk: write a temp file, then ``os.link`` it to the final name (``link`` fails
  if the name exists, and the content is complete before the name appears);
* HDFS: write a temp file, then ``rename`` (HDFS rename never overwrites);
* S3: a conditional ``PutObject`` with ``If-None-Match: *`` through boto3 (pyarrow has no
  conditional put).
"""

from __future__ import annotations

import copy
import errno
import os
import posixpath
import uuid
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from spark_jobs.exceptions import PathEscapeError

__all__ = ["FileIO", "InstantExistsError", "PathEscapeError", "is_inside", "resolve"]

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

    def read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return f.read()

    def size(self, path: str) -> int:
        return self.fs.get_file_info(path).size

    def total_size(self, path: str) -> int:
        """Bytes of a file, or of every file under a directory."""
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            sel = pafs.FileSelector(path, recursive=True)
            return sum(i.size or 0 for i in self.fs.get_file_info(sel) if i.type == pafs.FileType.File)
        return info.size or 0

    def list_names(self, path: str) -> list[str]:
        """Names directly under ``path`` (empty when it does not exist)."""
        sel = pafs.FileSelector(path, allow_not_found=True, recursive=False)
        return sorted(posixpath.basename(i.path) for i in self.fs.get_file_info(sel))

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self.fs.open_input_file(path)

    def memory_map(self, path: str) -> pa.NativeFile:
        """A zero-copy view of the file where the storage allows it, else a random-access file."""
        return self.fs.open_input_file(path)

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
        """Create ``path`` with ``data`` atomically, only if absent; else InstantExistsError."""
        raise NotImplementedError

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


class LocalFileIO(FileIO):
    scheme = "file"

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
    scheme = "hdfs"

    def write_atomic(self, path: str, data: bytes) -> None:
        # HDFS rename does not overwrite: the name is briefly absent (never torn); readers
        # of heartbeats treat an absent file with the plan's start time (heartbeat.is_alive).
        tmp = self._tmp_name(path)
        try:
            self.write_bytes(tmp, data)
            self.delete(path)
            self.fs.move(tmp, path)
        except BaseException:
            self._delete_quietly(tmp)
            raise

    def create_exclusive(self, path: str, data: bytes) -> None:
        tmp = self._tmp_name(path)
        try:
            self.write_bytes(tmp, data)
        except BaseException:
            self._delete_quietly(tmp)  # a half-written temp file would stay forever
            raise
        if self.exists(path):
            self.delete(tmp)
            raise InstantExistsError(f"{path} already exists")
        try:
            self.fs.move(tmp, path)  # HDFS rename refuses to overwrite an existing file
        except OSError as e:
            self.delete(tmp)
            raise InstantExistsError(f"{path} already exists") from e


class S3FileIO(FileIO):
    scheme = "s3"

    def create_exclusive(self, path: str, data: bytes) -> None:
        try:
            import boto3  # optional: only object-store commits need it
            from botocore.exceptions import ClientError
        except ImportError as e:  # pragma: no cover - depends on the installation
            raise RuntimeError(
                "committing to s3:// needs boto3 (conditional PutObject); pip install boto3"
            ) from e
        self._guard(path)
        bucket, _, key = path.partition("/")
        try:
            boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise InstantExistsError(f"s3://{path} already exists") from e
            raise


def resolve(uri: str) -> tuple[FileIO, str]:
    """The FileIO for ``uri`` and the path inside it; a bare path means the local disk."""
    parsed = urlparse(uri)
    if parsed.scheme == "" or len(parsed.scheme) == 1:  # a plain path (or a Windows drive letter)
        return LocalFileIO(pafs.LocalFileSystem()), os.path.abspath(uri).rstrip("/") or "/"
    fs, path = pafs.FileSystem.from_uri(uri)
    path = path.rstrip("/")
    if isinstance(fs, pafs.LocalFileSystem):
        return LocalFileIO(fs), path
    if isinstance(fs, pafs.HadoopFileSystem):
        return HadoopFileIO(fs), path
    if isinstance(fs, pafs.S3FileSystem):
        return S3FileIO(fs), path
    return FileIO(fs), path
