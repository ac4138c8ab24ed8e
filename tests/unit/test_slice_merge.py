"""The merge-on-read rules of ``spark_jobs.table.merge`` against copy-on-write applied step by step.

Merge-on-read defers the precombine comparison of upserts to read time; it must give exactly
what copy-on-write gives when it applies each commit to the stored rows as it arrives. The
oracle here is that sequential application; the inputs are random histories with ties,
nulls, deletes, re-inserts after deletes and keys moving out.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from spark_jobs.table.merge import LOG_DELETE, LOG_MOVE_OUT, LOG_OP, LOG_UPSERT, merge_slice

pytestmark = pytest.mark.unit

KEYS = ["a", "b b", "c/d", "e%f", "g+h", "ünï", "k" * 300, "", "x"]


def _stale(incoming, stored) -> bool:  # type: ignore[no-untyped-def]
    """Copy-on-write: an incoming row older than the stored one is ignored (nulls lowest)."""
    if incoming is None:
        return stored is not None
    return stored is not None and stored > incoming


def _oracle(base: list[dict], logs: list[list[dict]], precombine: bool) -> dict[str, dict]:
    state = {r["k"]: r for r in base}
    for log in logs:
        for r in log:
            row = {c: r[c] for c in ("k", "v", "ts")}
            if r[LOG_OP] in (LOG_DELETE, LOG_MOVE_OUT):
                state.pop(r["k"], None)
            elif not (precombine and r["k"] in state and _stale(r["ts"], state[r["k"]]["ts"])):
                state[r["k"]] = row
    return state


def _history(rng: random.Random, precombine: bool) -> tuple[list[dict], list[list[dict]]]:
    ts = lambda: rng.choice([None, 1, 2, 2, 3, 5])  # noqa: E731 - ties and nulls on purpose
    base = [{"k": k, "v": i, "ts": ts()} for i, k in enumerate(rng.sample(KEYS, rng.randint(0, len(KEYS))))]
    live = {r["k"]: r for r in base}
    logs = []
    for n in range(rng.randint(1, 5)):
        log = []
        for k in rng.sample(KEYS, rng.randint(0, len(KEYS))):  # a key at most once per commit (deduped batch)
            op = rng.choice([LOG_UPSERT, LOG_UPSERT, LOG_UPSERT, LOG_DELETE, LOG_MOVE_OUT])
            row = {"k": k, "v": 100 * (n + 1) + len(log), "ts": ts(), LOG_OP: op}
            if op == LOG_DELETE:
                # writers log only deletes that are effective against the stored row
                if k not in live or (precombine and _stale(row["ts"], live[k]["ts"])):
                    continue
            if op == LOG_MOVE_OUT and k not in live:
                continue
            log.append(row)
        logs.append(log)
        live = _oracle(list(live.values()), [log], precombine)
    return base, logs


def _table(rows: list[dict], with_op: bool) -> pa.Table:
    cols = {"k": pa.string(), "v": pa.int64(), "ts": pa.int64()}
    if with_op:
        cols[LOG_OP] = pa.string()
    return pa.Table.from_pylist(rows, schema=pa.schema(list(cols.items())))


@pytest.mark.parametrize("precombine", [True, False])
def test_merge_equals_copy_on_write_applied_in_order(precombine: bool) -> None:
    rng = random.Random(20261123 + precombine)
    for _ in range(400):
        base, logs = _history(rng, precombine)
        got = merge_slice(_table(base, False), [_table(l, True) for l in logs], key="k",
                          precombine="ts" if precombine else None)
        expected = _oracle(base, logs, precombine)
        assert sorted(got.to_pylist(), key=lambda r: r["k"]) == sorted(expected.values(), key=lambda r: r["k"])


def test_reinsert_after_delete_wins_whatever_its_precombine_value() -> None:
    base = _table([{"k": "a", "v": 1, "ts": 10}], False)
    deleted = _table([{"k": "a", "v": 0, "ts": 12, LOG_OP: LOG_DELETE}], True)
    again = _table([{"k": "a", "v": 2, "ts": 1, LOG_OP: LOG_UPSERT}], True)
    assert merge_slice(base, [deleted, again], key="k", precombine="ts").to_pylist() == [{"k": "a", "v": 2, "ts": 1}]
    assert merge_slice(base, [deleted], key="k", precombine="ts").num_rows == 0


def test_no_logs_is_the_base_and_empty_inputs_keep_the_schema() -> None:
    base = _table([{"k": "a", "v": 1, "ts": None}], False)
    assert merge_slice(base, [], key="k", precombine="ts").equals(base)
    empty = merge_slice(None, [_table([], True)], key="k", precombine="ts")
    assert empty.num_rows == 0 and empty.column_names == ["k", "v", "ts"]
