"""The default batch id of an upsert run without ``--batch-id``: derived, so a rerun is a no-op.

A batch id is the upsert's idempotence key (a batch id already committed makes the run a
no-op). A random default (``adhoc-<uuid>``) made every rerun of the same command apply the
batch again -- harmless for plain upserts, but it records a second commit, and a rerun after a
later correction would undo that correction. The default is therefore a function of what
decides what a run writes: the table, the source's files as listed (relative paths, sizes,
modification times), and the options that change how the rows are applied (delete field,
source format, partial updates, schema evolution). The same command on the same unchanged
files gets the same id and is a no-op; a file added, replaced or touched gets a new id.

The key, partition, precombine, index and table-type options are not part of it: the table
fixes them after creation, and a run contradicting them is refused before it writes anything.
One derivation for the CLI, the hook and the Python API (:func:`spark_jobs.table.action.upsert.run`);
the Airflow operator passes its own run-based id and never gets here.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_jobs.table.action.upsert import UpsertOptions

__all__ = ["PREFIX", "default_batch_id", "source_listing"]

#: derived ids start with this (``auto-`` + 20 hex digits: 80 bits of a SHA-256)
PREFIX = "auto-"


def source_listing(source: str) -> list[tuple[str, int, int]]:
    """``(relative path, size, modification time in ns)`` of every file a read of ``source``
    may see, sorted: the file itself, or every file under the directory (for a glob: under its
    longest literal directory). Hidden and metadata entries (a name starting with ``.`` or
    ``_`` without ``=``) are skipped, as Spark's and Arrow's readers skip them, so a rewritten
    ``_SUCCESS`` marker does not change the id."""
    import pyarrow.fs as pafs

    from spark_jobs.io.filesystem import GLOB_CHARS, is_glob, resolve, split_query

    root = source
    path, query = split_query(source)  # a query's ``?`` is no glob; its storage options reach the listing
    if is_glob(path):
        cut = min(path.find(ch) for ch in GLOB_CHARS if ch in path)
        prefix = path[:cut]
        root = ((prefix.rsplit("/", 1)[0] or "/") if "/" in prefix else ".") + query
    io, path = resolve(root)
    info = io.fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [(posixpath.basename(path), int(info.size or 0), int(info.mtime_ns or 0))]
    if info.type != pafs.FileType.Directory:
        raise FileNotFoundError(f"source {source} does not exist")
    out = []
    for e in io.fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        if e.type != pafs.FileType.File:
            continue
        rel = posixpath.relpath(e.path, path)
        if any(part.startswith((".", "_")) and "=" not in part for part in rel.split("/")):
            continue
        out.append((rel, int(e.size or 0), int(e.mtime_ns or 0)))
    return sorted(out)


def _evolution_modes(value: Any) -> Any:
    """``--schema-evolution`` as the set of modes it allows (``none`` and absent alike: None), so
    spellings of the same choice (``all``, ``add-columns,widen``) give the same id."""
    try:
        from spark_jobs.table.schema import parse_schema_evolution  # type: ignore[attr-defined]

        return sorted(parse_schema_evolution(value)) or None
    except Exception:  # noqa: BLE001 - no parser (or a value it refuses, refused elsewhere): the raw value
        return value or None


def default_batch_id(opts: "UpsertOptions") -> str:
    """``auto-<20 hex>`` from the table, the source's listing and the options that change what is
    written (module doc). A batch given as a frame (``source_df``), or a source that cannot be
    listed (the read then fails with its own error), gets a random ``adhoc-<uuid>``."""
    from spark_jobs.io.filesystem import resolve

    if opts.source_df is not None:
        return f"adhoc-{uuid.uuid4().hex}"
    try:
        listing = source_listing(opts.source)
    except OSError:
        return f"adhoc-{uuid.uuid4().hex}"
    table_io, table_path = resolve(opts.table)
    source_io, source_path = resolve(opts.source)
    what: dict[str, Any] = {
        "table": [table_io.scheme, table_path],
        "source": [source_io.scheme, source_path],
        "files": listing,
        "source_format": opts.source_format,
        "delete_field": opts.delete_field,
        # options other changes may add to UpsertOptions; absent means off
        "partial_update": getattr(opts, "partial_update", None) or None,
        "schema_evolution": _evolution_modes(getattr(opts, "schema_evolution", None)),
        "operation": opts.operation,
    }
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()
    return PREFIX + digest[:20]
