"""Where each kind of file lives inside a table (format v1). Only this module builds paths."""

from __future__ import annotations

import posixpath
from urllib.parse import quote, unquote

__all__ = [
    "META_DIR",
    "NULL_PARTITION",
    "data_file_name",
    "parse_data_file_name",
    "partition_path",
    "TableLayout",
]

META_DIR = ".bucketindex"
NULL_PARTITION = "__NULL__"
INDEX_FILE_SUFFIX = ".arrow"


def partition_path(fields: list[str], values: list[object]) -> str:
    """Hive-style ``field=value`` directories; ``""`` for an unpartitioned table."""
    parts = []
    for f, v in zip(fields, values):
        text = NULL_PARTITION if v is None else quote(str(v), safe="")
        parts.append(f"{f}={text}")
    return "/".join(parts)


def partition_values(path: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for seg in filter(None, path.split("/")):
        k, _, v = seg.partition("=")
        out[k] = None if v == NULL_PARTITION else unquote(v)
    return out


def data_file_name(file_id: str, write_token: str, instant: str) -> str:
    return f"{file_id}_{write_token}_{instant}.parquet"


def parse_data_file_name(name: str) -> tuple[str, str, str]:
    """(file_id, write_token, instant) of a data file name."""
    stem = name[: -len(".parquet")]
    file_id, write_token, instant = stem.rsplit("_", 2)
    return file_id, write_token, instant


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

    def abs(self, rel: str) -> str:
        return posixpath.join(self.root, rel)

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
        return posixpath.join(self.marker_dir(instant), quote(rel_path, safe="") + ".marker")

    @staticmethod
    def marker_target(marker_name: str) -> str:
        return unquote(marker_name[: -len(".marker")])

    def heartbeat_file(self, instant: str) -> str:
        return posixpath.join(self.heartbeats, instant)
