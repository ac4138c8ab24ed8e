"""The table schema's rules, engine-neutral: what a batch's columns must be against the table's,
and what type a zone-aware timestamp is stored as.

Every engine asks here -- the Spark upsert's validation, a rewrite or reference bootstrap,
and the pyarrow pre-check the CLI runs before a JVM starts (:func:`precheck_batch`) -- so
the rules cannot drift apart between them.
"""

from __future__ import annotations

import posixpath
from typing import Sequence

import pyarrow as pa

from spark_jobs.exceptions import BadInputError

__all__ = ["STORED_TZ", "stored_type", "stored_schema", "check_timestamp_units", "check_batch_columns",
           "refuse_missing_columns", "missing_columns_message", "precheck_batch"]

#: the time zone of every zone-aware timestamp a table stores (format.md §5). Spark holds a
#: zone-aware timestamp as a UTC instant and forgets the zone it came in, so storing instants in
#: UTC is the one choice that reads back identically from Spark and from Arrow: the source's zone
#: name (``Asia/Tokyo``) is not kept, the instants are.
STORED_TZ = "UTC"

#: the record key column of every data file (``spark_jobs.jobs.tasks.KEY``): not a user column
_KEY_COLUMN = "_bi_key"


def stored_type(t: pa.DataType) -> pa.DataType:
    """``t`` as a table stores it: every timestamp, nested ones included, in microseconds
    (Spark's precision; seconds and milliseconds widen exactly), a zone-aware one in
    :data:`STORED_TZ` (the same instants); everything else unchanged. Nanoseconds are refused
    first (:func:`check_timestamp_units`)."""
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=STORED_TZ if t.tz is not None else None)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = t.value_field.with_type(stored_type(t.value_type))
        if pa.types.is_list(t):
            return pa.list_(inner)
        if pa.types.is_large_list(t):
            return pa.large_list(inner)
        return pa.list_(inner, t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(stored_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(stored_type(t.key_type)),
                       t.item_field.with_type(stored_type(t.item_type)), keys_sorted=t.keys_sorted)
    return t


def stored_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with :func:`stored_type` applied to every field (metadata kept)."""
    return pa.schema([f.with_type(stored_type(f.type)) for f in schema], metadata=schema.metadata)


def _nanosecond_columns(t: pa.DataType) -> bool:
    if pa.types.is_timestamp(t):
        return t.unit == "ns"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _nanosecond_columns(t.value_type)
    if pa.types.is_struct(t):
        return any(_nanosecond_columns(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _nanosecond_columns(t.key_type) or _nanosecond_columns(t.item_type)
    return False


def check_timestamp_units(schema: pa.Schema, *, source: str) -> None:
    """BadInputError naming the nanosecond timestamp columns of ``schema``: Spark holds
    microseconds and cannot read them (an upsert's Parquet reader refuses them too), and
    truncating would change the values silently."""
    bad = [f.name for f in schema if _nanosecond_columns(f.type)]
    if bad:
        raise BadInputError(f"columns {', '.join(bad)} of {source} hold nanosecond timestamps, which Spark cannot "
                            f"hold; write them in microseconds (pyarrow: coerce_timestamps='us', pandas: "
                            f"df.to_parquet(..., coerce_timestamps='us', allow_truncated_timestamps=True))")


def check_batch_columns(*, table_columns: Sequence[str], batch_columns: Sequence[str],
                        delete_field: str | None) -> list[str]:
    """The table's columns the batch lacks; raises BadInputError for a batch column the table lacks.

    Both directions are refused until schema evolution and partial updates exist: a new
    column would be dropped, and a missing one would overwrite every updated row's value with
    null -- silently losing data. A missing column is only fine on rows that delete (they
    write no values): the caller applies :func:`refuse_missing_columns` once it knows whether
    the batch holds any other row. ``table_columns`` are the user columns (no ``_bi_key``).
    """
    data = [c for c in batch_columns if c != delete_field]
    extra = [c for c in data if c not in table_columns]
    if extra:
        raise BadInputError(f"source columns {', '.join(extra)} are not in the table schema "
                            f"(schema evolution is not supported in format v1)")
    return [c for c in table_columns if c != _KEY_COLUMN and c not in batch_columns]


def missing_columns_message(missing: Sequence[str]) -> str:
    return (f"the batch lacks columns {', '.join(missing)} that the table has; send them (null where unknown) "
            f"-- partial updates are not supported yet (a batch of deletes alone may omit them)")


def refuse_missing_columns(*, missing: Sequence[str], non_delete_rows: int) -> None:
    """BadInputError when the batch lacks table columns and holds a row that is not a delete."""
    if missing and non_delete_rows > 0:
        raise BadInputError(missing_columns_message(missing))


def precheck_batch(*, table_uri: str, source: str, source_format: str, record_key: Sequence[str],
                   delete_field: str | None) -> None:
    """The column rules of :func:`check_batch_columns` (and :func:`check_timestamp_units`)
    from Parquet footers alone, before a JVM starts: a bad batch costs a second, not a Spark session.

    Only what can be told cheaply and surely is refused here: a Parquet file or a flat
    directory of a few Parquet files, a table that exists, and a batch without a delete
    column (whether every row deletes needs the rows). Anything else -- other formats,
    Hive directories, globs, unreadable files, a missing key column -- is left to the Spark
    validation, which applies the same rules and names the same problems.
    """
    if source_format != "parquet":
        return
    from spark_jobs.table.table import Table  # the table module imports much; only this pre-check needs it

    try:
        batch = _source_schema(source)
    except Exception:  # noqa: BLE001 - a pre-check never fails a run the validation would judge
        return
    if batch is None:
        return
    check_timestamp_units(batch, source=source)  # Spark's reader would refuse them less helpfully
    try:
        table = Table.open(table_uri)
        schema = table.view().schema if table.config is not None else None
    except Exception:  # noqa: BLE001 - as above: damaged metadata is the job's to report
        return
    if schema is None or table.config is None:
        return
    names = batch.names
    if any(k not in names for k in record_key) or any(c.startswith("_bi_") for c in names):
        return  # the validation names the key column, or the reserved prefix
    if delete_field:
        return  # a batch of deletes alone may omit columns: that needs the rows (or the field is absent)
    missing = check_batch_columns(table_columns=[n for n in schema.names if n != _KEY_COLUMN],
                                  batch_columns=names, delete_field=delete_field)
    special = {*table.config.record_key_fields, *table.config.partition_fields, table.config.precombine_field}
    if any(c in special for c in missing):
        return  # those have messages of their own (the validation's)
    refuse_missing_columns(missing=missing, non_delete_rows=1)


#: a flat source directory with more files than this is not pre-checked (a footer read per file)
PRECHECK_MAX_FILES = 32


def _source_schema(source: str) -> pa.Schema | None:
    """The schema of a Parquet source from its footers (every file's columns, the first
    file's type of each), or None when that is not cheap or sure."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from spark_jobs.io.filesystem import resolve

    if any(ch in source for ch in "*?[{"):
        return None
    io, path = resolve(source)
    info = io.fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        files = [path]
    elif info.type == pafs.FileType.Directory:
        entries = io.fs.get_file_info(pafs.FileSelector(path, recursive=False))
        if any(e.type == pafs.FileType.Directory for e in entries):
            return None  # Hive directories add columns a footer does not hold
        files = [e.path for e in entries if not posixpath.basename(e.path).startswith((".", "_"))]
        if not files or len(files) > PRECHECK_MAX_FILES:
            return None
    else:
        return None
    fields: dict[str, pa.Field] = {}
    for f in files:
        with io.open_input_file(f) as fh:
            for fld in pq.ParquetFile(fh).schema_arrow:
                fields.setdefault(fld.name, fld)
    return pa.schema(list(fields.values()))
