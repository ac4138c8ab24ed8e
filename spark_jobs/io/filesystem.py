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

import os
import posixpath
import uuid
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = ["FileIO", "InstantExistsError", "resolve"]


class InstantExistsError(FileExistsError):
    """Raised when an exclusive create finds the file already there (another writer won)."""


class FileIO:
    """Filesystem operations over one pyarrow filesystem; paths are filesystem paths."""

    scheme = "generic"

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs

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
        self.fs.create_dir(path, recursive=True)

    def open_output_stream(self, path: str) -> pa.NativeFile:
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
        """Delete a file; deleting a missing file is not an error (rollback resumes)."""
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass

    def delete_dir(self, path: str) -> None:
        try:
            self.fs.delete_dir(path)
        except FileNotFoundError:
            pass

    def _tmp_name(self, path: str) -> str:
        return posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")


class LocalFileIO(FileIO):
    scheme = "file"

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = self._tmp_name(path)
        self.mkdirs(posixpath.dirname(path))
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # rename(2) replaces the name in one step

    def memory_map(self, path: str) -> pa.NativeFile:
        return pa.memory_map(path, "r")

    def create_exclusive(self, path: str, data: bytes) -> None:
        tmp = self._tmp_name(path)
        self.mkdirs(posixpath.dirname(path))
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError as e:
            raise InstantExistsError(f"{path} already exists") from e
        finally:
            os.unlink(tmp)


class HadoopFileIO(FileIO):
    scheme = "hdfs"

    def write_atomic(self, path: str, data: bytes) -> None:
        # HDFS rename does not overwrite: the name is briefly absent (never torn); readers
        # of heartbeats treat an absent file with the plan's start time (heartbeat.is_alive).
        tmp = self._tmp_name(path)
        self.write_bytes(tmp, data)
        self.delete(path)
        self.fs.move(tmp, path)

    def create_exclusive(self, path: str, data: bytes) -> None:
        tmp = self._tmp_name(path)
        self.write_bytes(tmp, data)
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
