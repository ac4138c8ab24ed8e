"""Reading a snapshot with Arrow alone (no Spark): for small tables, tests, tools, and the
per-file-group reads of Spark tasks (a merge-on-read slice is merged here, in one place)."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.table.merge import LOG_OP, SlicePlan, merge_slice, plan_slice
from spark_jobs.table.table import Table

__all__ = ["read_arrow", "read_slice", "read_slice_plan", "META_PREFIX"]

META_PREFIX = "_bi_"
#: the record key column of every data file (``spark_jobs.jobs.tasks.KEY``)
KEY_COLUMN = "_bi_key"


def read_slice(table: Table, base: str, logs: Sequence[str] = (), *, columns: Sequence[str] | None = None,
               precombine: str | None = None, schema: pa.Schema | None = None) -> pa.Table:
    """The live rows of one file slice (relative paths): the base, merged with its logs.

    ``columns`` (default: all of the base's) are the columns returned. Only the columns the
    merge needs are read from the logs (those plus the key, the precombine field and the op).
    ``schema`` casts every file to the snapshot's schema first (older files may lack a
    column added since, or hold a narrower type).
    """
    cols = list(columns) if columns is not None else None
    if not logs:
        return _cast(_read(table, base, cols), schema)
    need = None if cols is None else list(dict.fromkeys([*cols, KEY_COLUMN] + ([precombine] if precombine else [])))
    b = _cast(_read(table, base, need), schema)
    ls = [_cast(_read(table, rel, None if need is None else [*need, LOG_OP]), schema) for rel in logs]
    return merge_slice(b, ls, key=KEY_COLUMN, precombine=precombine, columns=cols or b.column_names)


def read_slice_plan(table: Table, base: str, logs: Sequence[str], *, precombine: str | None,
                    schema: pa.Schema | None = None) -> tuple[SlicePlan, list[pa.Table]]:
    """The merge plan of one slice (``merge.plan_slice``) and its logs' merge columns.

    Only the columns the merge rules look at are read (key, precombine, and a log's op): a
    reader that applies the plan by position reads the rows themselves some other way.
    """
    merge_cols = [KEY_COLUMN] + ([precombine] if precombine else [])
    b = _cast(_read(table, base, merge_cols), schema)
    ls = [_cast(_read(table, rel, [*merge_cols, LOG_OP]), schema) for rel in logs]
    return plan_slice(b, ls, key=KEY_COLUMN, precombine=precombine), ls


def _read(table: Table, rel: str, cols: list[str] | None) -> pa.Table:
    with table.io.open_input_file(table.abs(rel)) as f:
        return pq.read_table(f, columns=cols)


def _cast(t: pa.Table, schema: pa.Schema | None) -> pa.Table:
    if schema is None:
        return t
    fields = [schema.field(n) if n in schema.names else t.schema.field(n) for n in t.column_names]
    return t.cast(pa.schema(fields))


def read_arrow(uri: str, as_of: str | None = None, *, with_meta: bool = False) -> pa.Table:
    """The table as of ``as_of`` (default: latest) as one Arrow table."""
    table = Table.load(uri)
    view = table.view(as_of)
    assert table.config is not None
    precombine = table.config.precombine_field
    parts = [read_slice(table, s.path, [lf.path for lf in s.logs], precombine=precombine) for s in view.slices()]
    if parts:
        out = pa.concat_tables(parts, promote_options="default")
    elif view.schema is not None:
        out = view.schema.empty_table()
    else:
        out = pa.table({})
    if not with_meta:
        out = out.select([n for n in out.column_names if not n.startswith(META_PREFIX)])
    return out
