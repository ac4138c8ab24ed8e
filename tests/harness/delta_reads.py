"""What a Delta reader should see, and what it does see: shared by the mirror's tests and the
torture test (issue 26's "every version equals the snapshot", checked after every torture step).

The expected side is computed from the table's own view without the product's Delta code:
copy-on-write versions are the snapshot's rows (the view read as ``read_arrow`` reads it);
merge-on-read versions are the read-optimized view, the bases alone read with plain pyarrow
(format.md §11). The actual side is ``deltalake`` (delta-rs), the reader pandas, Polars and
pyarrow users call. No pyspark, no airflow; ``deltalake`` is imported when a version is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.table.layout import is_reference
from spark_jobs.table.reader import read_slice
from spark_jobs.table.view import FileSystemView

if TYPE_CHECKING:
    from spark_jobs.table.table import Table

__all__ = ["read_delta", "query_delta", "read_optimized", "read_view", "published_names", "has_reference_files"]


def read_delta(uri: str, version: int, storage_options: dict[str, str] | None = None) -> pa.Table:
    """Delta version ``version`` as pandas, Polars and pyarrow users read it."""
    import deltalake

    return deltalake.DeltaTable(uri, version=version, storage_options=storage_options).to_pyarrow_table()


def query_delta(uri: str, version: int, storage_options: dict[str, str] | None = None) -> pa.Table:
    """Delta version ``version`` through delta-rs's SQL engine (DataFusion), which resolves an
    absolute ``add.path`` (a reference file outside the root) where ``to_pyarrow_table`` cannot."""
    import deltalake

    dt = deltalake.DeltaTable(uri, version=version, storage_options=storage_options)
    # an arro3 reader: pyarrow takes it through the Arrow C stream interface
    return pa.table(deltalake.QueryBuilder().register("t", dt).execute("select * from t"))


def published_names(view: FileSystemView) -> list[str]:
    """The columns a Delta reader sees, in order: the schema without internal ``_bi_*`` columns."""
    return [f.name for f in view.schema if not f.name.startswith("_bi_")] if view.schema is not None else []


def has_reference_files(view: FileSystemView) -> bool:
    """Whether the snapshot lists a reference-bootstrapped file (an absolute ``add.path``)."""
    return any(is_reference(s.path) for s in view.slices())


def read_optimized(table: "Table", view: FileSystemView) -> pa.Table:
    """The bases of a snapshot, read with plain pyarrow (no bucketindex reader), in its
    published schema: what the projection of a merge-on-read table promises."""
    assert view.schema is not None
    schema = pa.schema([f for f in view.schema if not f.name.startswith("_bi_")])
    parts = []
    for s in view.slices():
        # a reference file (a bootstrapped dataset's, outside the root) lacks its Hive path
        # column: the base is read as the table reads it, its logs left out
        t = (read_slice(table, s.path, [], precombine=table.config.precombine_field, schema=view.schema)
             if is_reference(s.path) else _read_parquet(table, s.path))
        cols = [t.column(f.name).cast(f.type) if f.name in t.column_names else pa.nulls(t.num_rows, f.type)
                for f in schema]
        parts.append(pa.Table.from_arrays(cols, schema=schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _read_parquet(table: "Table", rel: str) -> pa.Table:
    with table.io.fs.open_input_file(table.abs(rel)) as f:
        return pq.read_table(f)


def read_view(table: "Table", view: FileSystemView) -> pa.Table:
    """The rows of one snapshot's view, read as ``read_arrow`` reads them."""
    assert view.schema is not None
    parts = [read_slice(table, s.path, [lf.path for lf in s.logs], precombine=table.config.precombine_field,
                        schema=view.schema) for s in view.slices()]
    return pa.concat_tables(parts, promote_options="default") if parts else view.schema.empty_table()


def sorted_rows(t: pa.Table, names: list[str]) -> list[tuple[Any, ...]]:
    """The rows of ``t`` in ``names``' order, as a sorted list (a multiset to compare); a NaN
    (a precombine value may be one) as the text ``"NaN"``, since NaN is not equal to itself."""
    d = t.select(names).to_pylist()
    nan = lambda v: "NaN" if isinstance(v, float) and v != v else v  # noqa: E731
    return sorted((tuple(nan(r[n]) for n in names) for r in d), key=repr)
