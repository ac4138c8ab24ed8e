"""The correctness oracle: what a table must contain after a sequence of batches.

Semantics (docs/format.md, "Write semantics"): within a batch the highest precombine
value wins per record; across batches the stored row is replaced (or deleted) only when the
incoming precombine value is not lower; deletes of absent keys do nothing. Record identity
is the key (global indexes) or (partition, key) (bucket index). Precombine values compare
as format.md §8 orders them (as Spark orders SQL values): null lowest, NaN above every
number and equal to itself, -0.0 equal to 0.0. Within a batch a tie keeps the first row seen
(the format's tie-break on the whole row is not modelled: batches given here avoid such ties).
"""

from __future__ import annotations

import math
from typing import Any, Iterable


def precombine_order(v: Any) -> tuple:
    """format.md §8's order of one precombine value, written here independently of the code
    under test: null lowest, NaN highest (NaNs tie), -0.0 equal to 0.0."""
    if v is None:
        return (0,)
    if isinstance(v, float) and math.isnan(v):
        return (2,)
    return (1, v + 0.0 if isinstance(v, float) else v)


def reduce_batches(
    batches: Iterable[list[dict[str, Any]]],
    *,
    key: str = "id",
    precombine: str | None = "ts",
    delete_field: str | None = "is_deleted",
    partition: str | None = None,
) -> dict[Any, dict[str, Any]]:
    state: dict[Any, dict[str, Any]] = {}
    ident = (lambda r: (r[partition], r[key])) if partition else (lambda r: r[key])
    for batch in batches:
        winners: dict[Any, dict[str, Any]] = {}
        for r in batch:
            k = ident(r)
            cur = winners.get(k)
            if cur is None or (precombine and precombine_order(r[precombine]) > precombine_order(cur[precombine])):
                winners[k] = r
        for k, r in winners.items():
            stored = state.get(k)
            if stored is not None and precombine and \
                    precombine_order(stored[precombine]) > precombine_order(r[precombine]):
                continue  # late, older event: the stored row stays
            if delete_field and r.get(delete_field):
                state.pop(k, None)
            else:
                state[k] = {c: v for c, v in r.items() if c != delete_field}
    return state


def rows_by_identity(rows: list[dict[str, Any]], *, key: str = "id", partition: str | None = None) -> dict:
    out = {}
    for r in rows:
        k = (r[partition], r[key]) if partition else r[key]
        assert k not in out, f"record {k!r} appears twice in the table"
        out[k] = r
    return out
