"""Reading a snapshot with Arrow alone (no Spark): for small tables, tests and tools."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.table.table import Table

__all__ = ["read_arrow", "META_PREFIX"]

META_PREFIX = "_bi_"


def read_arrow(uri: str, as_of: str | None = None, *, with_meta: bool = False) -> pa.Table:
    """The table as of ``as_of`` (default: latest) as one Arrow table."""
    table = Table.load(uri)
    view = table.view(as_of)
    parts = []
    for s in view.slices():
        with table.io.open_input_file(table.abs(s.path)) as f:
            parts.append(pq.read_table(f))
    if parts:
        out = pa.concat_tables(parts, promote_options="default")
    elif view.schema is not None:
        out = view.schema.empty_table()
    else:
        out = pa.table({})
    if not with_meta:
        out = out.select([n for n in out.column_names if not n.startswith(META_PREFIX)])
    return out
