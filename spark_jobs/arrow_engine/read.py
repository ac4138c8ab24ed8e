"""``read`` in-process: the snapshot through :func:`spark_jobs.table.reader.read_arrow`, printed
as Spark's ``DataFrame.show`` prints it.

:func:`needed_bytes` is what ``--engine auto`` compares with the memory budget: the file
slices that will be read, as held in memory (only the first ones when only the first rows are
printed).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from spark_jobs.table.action.engine import IN_MEMORY_EXPANSION
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.view import FileSystemView

__all__ = ["needed_bytes", "show", "format_rows"]


def needed_bytes(view: FileSystemView, limit: int | None = None) -> int:
    """Bytes :func:`show` (``limit`` rows) or a whole read (``limit`` None) holds for ``view``:
    the slices read, in the view's order, until their recorded live rows reach ``limit``."""
    total, rows = 0, 0
    for s in view.slices():
        if limit is not None and rows >= limit:
            break
        total += s.size + sum(lf.size for lf in s.logs)
        rows += s.num_rows
    return total * IN_MEMORY_EXPANSION


def show(uri: str, as_of: str | None = None, limit: int = 20) -> str:
    """The first ``limit`` rows of the snapshot as a text table (one more is read, to say whether there are more)."""
    t = read_arrow(uri, as_of, limit=max(limit, 0) + 1)
    return format_rows(t.slice(0, max(limit, 0)), more=t.num_rows > limit)


def _text(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} -> {_text(x)}" for k, x in v.items()) + "}"
    return str(v)


def format_rows(t: pa.Table, *, more: bool = False) -> str:
    """``t`` as Spark's ``show(truncate=False)`` lays it out: a grid, values left-aligned."""
    names = t.column_names
    cells = [[_text(v) for v in t.column(n).to_pylist()] for n in names]
    widths = [max([len(n), *(len(c) for c in col)]) for n, col in zip(names, cells)]
    rule = "+" + "+".join("-" * w for w in widths) + "+"
    line = lambda vals: "|" + "|".join(v.ljust(w) for v, w in zip(vals, widths)) + "|"  # noqa: E731
    out = [rule, line(names), rule, *(line(r) for r in zip(*cells)), rule]
    if more:
        out.append(f"only showing top {t.num_rows} row{'' if t.num_rows == 1 else 's'}")
    return "\n".join(out) + "\n"
