"""``bucketindex alter``: change a table's schema as a timeline action, writing no data file.

An alter adds nullable columns and widens column types (the rules of
:mod:`spark_jobs.table.schema`: :func:`~spark_jobs.table.schema.widens`). It is one ``commit``
instant with ``operation: "alter_schema"`` whose metadata records the new schema, no file group
and no index file, written through the commit protocol (:class:`~.transaction.Transaction`):
the schema is a property of the snapshot, so ``read --as-of`` an earlier instant returns the
older schema, and readers of files written before fill an added column with null and widen a
widened one (``schema.conform``). No data file is rewritten: adding a column to a large table
costs one sequence entry.

Concurrency: an alter records a schema, so it conflicts with a concurrent commit that also
recorded one (another alter, an upsert with ``--schema-evolution`` that changed the schema, the
table's creation) and is validated again on the new snapshot; upserts that change nothing of the
schema record none and commit beside it (their rows read the new column as null). No JVM, no
``pyspark``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import pyarrow as pa

from spark_jobs.exceptions import BadInputError
from spark_jobs.table.action.options import (
    POSITIONAL,
    REPEAT,
    VerbOptions,
    check_heartbeat_timeout,
    check_max_retries,
    option,
)
from spark_jobs.table.action.transaction import Transaction
from spark_jobs.table.commit import NO_ROWS_CHANGED, Written
from spark_jobs.table.config import EVOLVING_FORMAT_VERSION, _field_name_problem
from spark_jobs.table.schema import (
    parse_type_name,
    schema_changes,
    text_fixed_columns,
    type_name,
    widening_problem,
)
from spark_jobs.table.timeline import Action
from spark_jobs.table.view import FileSystemView, encode_schema

__all__ = ["AlterOptions", "OPERATION", "parse_column_spec", "altered_schema", "run_alter"]

log = logging.getLogger("bucketindex.alter")


@dataclass(frozen=True, kw_only=True)
class AlterOptions(VerbOptions):
    """The options of ``bucketindex alter``, validated once: each ``NAME:TYPE`` parses
    (:func:`parse_column_spec`) and the retry and heartbeat values are in range -- one line,
    exit 2, before the table is read. Whether a change is allowed is decided on the table."""

    VERB = "alter"

    table: str = option(form=POSITIONAL)
    #: ``NAME:TYPE`` of nullable columns to add
    add_columns: list[str] = option("--add-column", form=REPEAT, default_factory=list)
    #: ``NAME:TYPE`` of columns to widen
    widen_columns: list[str] = option("--widen-column", form=REPEAT, default_factory=list)
    max_retries: int = option("--max-retries", default=3)
    heartbeat_timeout_s: float | None = option("--heartbeat-timeout", default=None)

    def __post_init__(self) -> None:
        check_heartbeat_timeout(self.heartbeat_timeout_s)
        check_max_retries(self.max_retries)
        for spec in self.add_columns:
            parse_column_spec(spec, option="--add-column")
        for spec in self.widen_columns:
            parse_column_spec(spec, option="--widen-column")

#: the ``operation`` of an alter's commit
OPERATION = "alter_schema"
_KEY = "_bi_key"


def parse_column_spec(text: str, *, option: str) -> tuple[str, pa.DataType]:
    """``NAME:TYPE`` (``TYPE`` a Spark simple name: int, bigint, string, double, decimal(10,2),
    date, timestamp, timestamp_ntz, boolean, ...) as a column name and its stored Arrow type;
    BadInputError (exit 2) naming ``option`` for anything else. The type is after the last ``:``
    (no type name holds one), so a column name may."""
    name, sep, type_text = text.rpartition(":")
    if not sep or not name or not type_text.strip():
        raise BadInputError(f"{option} takes NAME:TYPE (e.g. {option} discount:decimal(10,2)), got {text!r}")
    problem = _field_name_problem(name, path=False)
    if problem is not None:
        raise BadInputError(f"{option} {text!r}: column name {name!r} {problem}")
    if name.startswith("_bi_"):
        raise BadInputError(f"{option} {text!r}: column names starting with '_bi_' are reserved for bucketindex")
    try:
        typ = parse_type_name(type_text)
    except BadInputError as e:
        raise BadInputError(f"{option} {text!r}: {e}") from None
    return name, typ


def altered_schema(schema: pa.Schema, *, add: Sequence[tuple[str, pa.DataType]] = (),
                   widen: Sequence[tuple[str, pa.DataType]] = (), text_fixed: dict[str, str] | None = None
                   ) -> pa.Schema:
    """``schema`` (a table's data schema, ``_bi_key`` last) with ``add`` appended (nullable,
    before ``_bi_key``) and ``widen`` applied; ``schema`` itself when nothing changes.

    Idempotent, so running the same ``alter`` again is a no-op: adding a column that exists
    with the same type, or widening a column to its type, changes nothing. Refused
    (BadInputError, one line naming the column, both types and why): adding a column that
    exists with another type, naming a column twice, widening a column the table lacks, and
    any change :func:`~spark_jobs.table.schema.widening_problem` refuses -- narrowing, a change
    of kind, a decimal's scale, a zone, a record key or partition field's text form."""
    seen: set[str] = set()
    for name, _ in [*add, *widen]:
        if name in seen:
            raise BadInputError(f"column {name!r} is named twice; name each column once")
        seen.add(name)
    fields = {f.name: f for f in schema}
    added: list[pa.Field] = []
    for name, typ in add:
        if name in fields:
            if fields[name].type.equals(typ):
                continue  # already there: a rerun
            raise BadInputError(f"--add-column {name}: the table already has column {name!r} as "
                                f"{type_name(fields[name].type)}; widen it with --widen-column {name}:TYPE")
        added.append(pa.field(name, typ, True))
    for name, typ in widen:
        if name not in fields:
            raise BadInputError(f"--widen-column {name}: the table has no column {name!r}; add it with "
                                f"--add-column {name}:{type_name(typ)}")
        old = fields[name].type
        problem = widening_problem(old, typ, text_fixed=(text_fixed or {}).get(name))
        if problem is not None:
            raise BadInputError(f"--widen-column {name}: the table's {type_name(old)} cannot become "
                                f"{type_name(typ)}: {problem}; nothing was written")
        fields[name] = fields[name].with_type(typ)
    user = [fields[f.name] for f in schema if f.name != _KEY]
    key = [fields[f.name] for f in schema if f.name == _KEY]
    out = pa.schema([*user, *added, *key], metadata=schema.metadata)
    return schema if out.equals(schema) else out


def run_alter(table_uri: str, *, add_columns: Sequence[str] = (), widen_columns: Sequence[str] = (),
              max_retries: int = 3, heartbeat_timeout_s: float | None = None) -> dict[str, Any]:
    """Add and widen columns of the table at ``table_uri`` (``NAME:TYPE`` specs, as the CLI's
    ``--add-column``/``--widen-column``); one ``alter_schema`` commit, or nothing when the
    table already has the schema asked for (``noop``).

    Bad input (a bad spec, a refused change, no table) raises BadInputError before anything
    is written; a conflict that keeps recurring raises ConflictError (exit 3)."""
    from spark_jobs.table.table import Table

    add = [parse_column_spec(s, option="--add-column") for s in add_columns]
    widen = [parse_column_spec(s, option="--widen-column") for s in widen_columns]
    if not add and not widen:
        raise BadInputError("alter needs at least one --add-column NAME:TYPE or --widen-column NAME:TYPE")
    table = Table.open(table_uri)
    view = table.view() if table.config is not None else None
    if table.config is None or view is None or view.schema is None:
        raise BadInputError(f"no table at {table_uri}: alter changes an existing table's schema (its first "
                            f"upsert or bootstrap creates it)")
    fixed = text_fixed_columns(table.config)
    new = altered_schema(view.schema, add=add, widen=widen, text_fixed=fixed)
    if new is view.schema:
        log.info("the table already has this schema: nothing to do")
        return {"instant": None, "noop": True, "changes": [], "schema": _columns(view.schema)}
    assert table.config is not None
    index_type = table.config.index_type
    plan = {"operation": OPERATION, "add_columns": list(add_columns), "widen_columns": list(widen_columns)}
    txn = Transaction(table, Action.COMMIT, plan, view=view, repair=True, heartbeat_timeout_s=heartbeat_timeout_s)

    def attempt(view: FileSystemView, retries: list[dict[str, Any]]) -> Written:
        # validated again on every snapshot: a concurrent alter or evolving upsert may have changed it
        assert view.schema is not None
        schema = altered_schema(view.schema, add=add, widen=widen, text_fixed=fixed)
        changes = schema_changes(view.schema, schema)
        if changes:  # a release that cannot read an evolved schema refuses the table (format.md §9)
            table.require_format(EVOLVING_FORMAT_VERSION, why="a schema change")
        return Written(operation=OPERATION, index_type=index_type,
                       schema=encode_schema(schema) if changes else None, file_groups=(), index_added=(),
                       index_removed=(), counts=NO_ROWS_CHANGED, alter={"changes": changes})

    committed = txn.run(attempt, max_retries=max_retries, what="the alter")
    meta = committed.metadata
    changes = list(meta["alter"]["changes"])
    log.info("committed %s: %s", txn.ts, "; ".join(changes) or "no change (a concurrent alter made it)")
    final = table.view().schema
    return {"instant": txn.ts, "noop": False, "changes": changes, "retries": len(committed.retries),
            "schema": _columns(final) if final is not None else {}}


def _columns(schema: pa.Schema) -> dict[str, str]:
    """The user columns and their Spark type names (what ``alter`` prints)."""
    return {f.name: type_name(f.type) for f in schema if f.name != _KEY}
