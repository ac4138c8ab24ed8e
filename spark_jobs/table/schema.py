"""The table schema's rules, engine-neutral: what a batch's columns must be against the table's,
and what type a zone-aware timestamp is stored as.

Every engine asks here -- the Spark upsert's validation, a rewrite or reference bootstrap,
and the pyarrow pre-check the CLI runs before a JVM starts (:func:`check_batch_schema`) -- so
the rules cannot drift apart between them.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Sequence

import pyarrow as pa

from spark_jobs.exceptions import BadInputError, EngineUnsupportedError

if TYPE_CHECKING:
    from spark_jobs.table.config import TableConfig

__all__ = ["STORED_TZ", "stored_type", "stored_schema", "check_timestamp_units", "check_batch_columns",
           "looks_like_delete_flag", "extra_columns_message",
           "refuse_missing_columns", "missing_columns_message", "carried_columns", "refuse_missing_fields",
           "check_batch_schema", "footer_schema", "spark_type", "spark_type_name", "SCHEMA_EVOLUTION_CHOICES", "parse_schema_evolution", "parse_type_name", "type_name",
           "widens", "widening_problem", "evolve", "schema_changes", "conform", "kind_problem",
           "refuse_kind_changes"]

#: the time zone of every zone-aware timestamp a table stores (format.md §5). Spark holds a
#: zone-aware timestamp as a UTC instant and forgets the zone it came in, so storing instants in
#: UTC is the one choice that reads back identically from Spark and from Arrow: the source's zone
#: name (``Asia/Tokyo``) is not kept, the instants are.
STORED_TZ = "UTC"

#: the record key column of every data file (``spark_jobs.kernels.tasks.KEY``): not a user column
_KEY_COLUMN = "_bi_key"


# -- Spark's view of Arrow types (the type words of every engine's errors) ------------------

def spark_type(t: pa.DataType, *, name: str = "?") -> pa.DataType:
    """The Arrow type a column of type ``t`` has once Spark read it from Parquet and handed it
    back (``to_arrow_schema(..., timezone="UTC")``): unsigned ints widened to the next signed
    type (uint64 to ``decimal(20,0)``), strings, binaries and lists to their plain forms,
    dictionaries decoded, dates to date32, timestamps to microseconds -- zone-aware ones in UTC
    (Spark keeps the instant, not the zone), naive ones naive (``timestamp_ntz``) -- and an
    all-null column to int32. Types Spark cannot read (time, float16, decimals over 38 digits)
    or that it reads differently from their Arrow meaning (durations) raise
    :class:`EngineUnsupportedError`."""
    if pa.types.is_dictionary(t):
        return spark_type(t.value_type, name=name)
    if pa.types.is_null(t):
        return pa.int32()  # Parquet's UNKNOWN logical type: Spark reads it as a null int
    if pa.types.is_boolean(t) or pa.types.is_signed_integer(t) or t in (pa.float32(), pa.float64()):
        return t
    if pa.types.is_unsigned_integer(t):
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}.get(t.bit_width, pa.decimal128(20, 0))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) \
            or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_date(t):
        return pa.date32()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=STORED_TZ if t.tz is not None else None)
    if pa.types.is_decimal(t):
        if t.precision > 38:
            raise EngineUnsupportedError(f"column {name!r}: decimal precision {t.precision} exceeds Spark's 38")
        return pa.decimal128(t.precision, t.scale)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) \
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.list_(pa.field("element", spark_type(t.value_type, name=name), t.value_field.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(t.field(i).name, spark_type(t.field(i).type, name=name), t.field(i).nullable)
                          for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(pa.field("key", spark_type(t.key_type, name=name), False),
                       pa.field("value", spark_type(t.item_type, name=name), t.item_field.nullable))
    raise EngineUnsupportedError(f"column {name!r} of type {t} is not read by Spark as Arrow types it: "
                                 "use the Spark engine")


def spark_type_name(t: pa.DataType) -> str:
    """Spark's ``simpleString`` of the Spark type that Arrow type ``t`` stands for (after
    :func:`spark_type`): the words the Spark path's errors use."""
    if pa.types.is_dictionary(t):
        return spark_type_name(t.value_type)
    names = {pa.int8(): "tinyint", pa.int16(): "smallint", pa.int32(): "int", pa.int64(): "bigint",
             pa.float32(): "float", pa.float64(): "double", pa.bool_(): "boolean", pa.date32(): "date",
             pa.date64(): "date", pa.null(): "void"}
    if t in names:
        return names[t]
    if pa.types.is_unsigned_integer(t):
        return spark_type_name(spark_type(t))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"array<{spark_type_name(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{t.field(i).name}:{spark_type_name(t.field(i).type)}"
                                    for i in range(t.num_fields)) + ">"
    if pa.types.is_map(t):
        return f"map<{spark_type_name(t.key_type)},{spark_type_name(t.item_type)}>"
    return str(t)


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
    write no values) and in a ``--partial-update`` batch (updated rows keep the stored
    values): the caller applies :func:`refuse_missing_columns` once it knows whether
    the batch holds any other row. ``table_columns`` are the user columns (no ``_bi_key``).
    """
    data = [c for c in batch_columns if c != delete_field]
    extra = [c for c in data if c not in table_columns]
    if extra:
        raise BadInputError(extra_columns_message(extra))
    return [c for c in table_columns if c != _KEY_COLUMN and c not in batch_columns]


#: names of a column that marks deletes in CDC and lake-table exports (compared in lower case,
#: leading underscores dropped: ``_deleted``, ``__deleted`` of Debezium, ``__op``); with a boolean
#: column, what :func:`looks_like_delete_flag` takes for one
DELETE_FLAG_NAMES = frozenset({"deleted", "is_deleted", "delete", "is_delete", "op"})


def looks_like_delete_flag(name: str, type_: pa.DataType | None = None) -> bool:
    """Whether a column the table lacks is more likely a delete marker sent without
    ``--delete-field`` than data: a name in :data:`DELETE_FLAG_NAMES`, or a boolean column.
    Only the advice depends on it: storing such a column as data makes deletes silently stop."""
    return name.lower().lstrip("_") in DELETE_FLAG_NAMES or (type_ is not None and pa.types.is_boolean(type_))


def extra_columns_message(extra: Sequence[str], *, types: "dict[str, pa.DataType] | None" = None) -> str:
    """The refusal of batch columns the table lacks. A column that looks like a delete flag
    (:func:`looks_like_delete_flag`) is named first with ``--delete-field``: following the
    usual advice (add it as a column) would store the flag as data and stop the deletes."""
    flags = [c for c in extra if looks_like_delete_flag(c, (types or {}).get(c))]
    add = "--schema-evolution add-columns, or first with `bucketindex alter TABLE --add-column NAME:TYPE`"
    if not flags:
        return f"source columns {', '.join(extra)} are not in the table schema; add them with {add}"
    return (f"source columns {', '.join(extra)} are not in the table schema, and {flags[0]} looks like a delete "
            f"flag: if it marks deletes, pass --delete-field {flags[0]} (it is then not stored); to store "
            f"{'them' if len(extra) > 1 else 'it'} as data, add {'them' if len(extra) > 1 else 'it'} with {add}")


def missing_columns_message(missing: Sequence[str]) -> str:
    return (f"the batch lacks columns {', '.join(missing)} that the table has; send them (null where unknown), "
            f"or pass --partial-update to keep their stored values on updated rows (null on inserted ones); "
            f"a batch of deletes alone may omit them")


def refuse_missing_columns(*, missing: Sequence[str], non_delete_rows: int, partial_update: bool = False) -> None:
    """BadInputError when the batch lacks table columns and holds a row that is not a delete.

    With ``partial_update`` a missing column is the point (format.md §8): updated rows keep
    its stored value. The fields every row needs whatever it carries -- the record key, the
    partition and the precombine field -- are refused by the source-column check before this.
    """
    if missing and non_delete_rows > 0 and not partial_update:
        raise BadInputError(missing_columns_message(missing))


def carried_columns(*, table_columns: Sequence[str], missing: Sequence[str],
                    partial_update: bool) -> list[str] | None:
    """The user columns a ``--partial-update`` batch carries, in table order, or None when it
    carries them all (a full batch: its rows replace stored rows whole, and a merge-on-read
    log of it is a full log that readers merge on the fast path)."""
    if not partial_update or not missing:
        return None
    return [c for c in table_columns if c != _KEY_COLUMN and c not in missing]


def refuse_missing_fields(*, columns: Sequence[str], record_key: Sequence[str], partition_fields: Sequence[str],
                          precombine_field: str | None) -> None:
    """BadInputError for a batch lacking the record key, partition or precombine field, in the
    words of the source-column check (``action.upsert.check_source_columns``): a partial batch
    still needs them, to find the stored row, to route it, and to order it against it."""
    for f in record_key:
        if f not in columns:
            raise BadInputError(f"record key field {f!r} is not in the source (columns: {', '.join(columns)})")
    for label, f in (("precombine", precombine_field), ("partition", (list(partition_fields) or [None])[0])):
        if f and f not in columns:
            raise BadInputError(f"{label} field {f!r} is not in the source (columns: {', '.join(columns)})")


def check_batch_schema(*, batch: pa.Schema, config: "TableConfig", table_schema: pa.Schema, record_key: Sequence[str],
                       delete_field: str | None, partial_update: bool = False,
                       schema_evolution: "str | Sequence[str] | None" = None) -> None:
    """The column rules of :func:`check_batch_columns` and :func:`evolve` on a batch's schema
    from its Parquet footers (``batch``: :func:`footer_schema`) against an existing table
    (``config``; ``table_schema``, the snapshot's data schema), before a JVM starts: a bad batch
    costs a second, not a Spark session (``spark_jobs.engines.precheck_upsert``).

    Only what can be told surely from schemas is refused here: a batch without a delete column
    (whether every row deletes needs the rows), with the key columns and no reserved name.
    Anything else -- a missing key column, the fields' own messages -- is left to the
    validation, which applies the same rules and names the same problems.
    """
    names = batch.names
    if partial_update:  # a partial batch still needs these; the validation would say so after a JVM start
        refuse_missing_fields(columns=names, record_key=config.record_key_fields,
                              partition_fields=config.partition_fields, precombine_field=config.precombine_field)
    refuse_kind_changes(table_schema=table_schema, batch_schema=batch, delete_field=delete_field)
    if any(k not in names for k in record_key) or any(c.startswith("_bi_") for c in names):
        return  # the validation names the key column, or the reserved prefix
    schema = table_schema
    stored = _stored_batch_schema(batch)
    if stored is not None:  # the engines' evolution rule (:func:`evolve`): extra columns, widenings
        schema = evolve(schema, stored, modes=parse_schema_evolution(schema_evolution), delete_field=delete_field,
                        text_fixed=text_fixed_columns(config))
    if delete_field:
        return  # a batch of deletes alone may omit columns: that needs the rows (or the field is absent)
    missing = check_batch_columns(table_columns=[n for n in schema.names if n != _KEY_COLUMN],
                                  batch_columns=names, delete_field=delete_field)
    special = {*config.record_key_fields, *config.partition_fields, config.precombine_field}
    if any(c in special for c in missing):
        return  # those have messages of their own (the validation's)
    refuse_missing_columns(missing=missing, non_delete_rows=1, partial_update=partial_update)


def footer_schema(source: str) -> pa.Schema | None:
    """:func:`_source_schema`, or None when reading the footers fails: a pre-check never fails a
    run the validation would judge (it names an unreadable file in its own words)."""
    try:
        return _source_schema(source)
    except Exception:  # noqa: BLE001
        return None


#: a flat source directory with more files than this is not pre-checked (a footer read per file)
PRECHECK_MAX_FILES = 32


def _source_schema(source: str) -> pa.Schema | None:
    """The schema of a Parquet source from its footers (every file's columns, the first
    file's type of each), or None when that is not cheap or sure."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from spark_jobs.io.filesystem import is_glob, resolve, split_query

    if is_glob(split_query(source)[0]):
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


# -- schema evolution (format.md "Schema evolution") -----------------------------------------

#: ``--schema-evolution`` values: ``none`` (default) refuses a batch column the table lacks and
#: casts a wider batch type back to the table's; ``add-columns`` adds such columns, nullable;
#: ``widen`` widens a column to the batch's type where :func:`widens` allows; ``all`` both.
#: A comma list (``add-columns,widen``) is the union.
SCHEMA_EVOLUTION_CHOICES = ("none", "add-columns", "widen", "all")
ADD_COLUMNS, WIDEN = "add-columns", "widen"

_INT_ORDER = {8: 0, 16: 1, 32: 2, 64: 3}
#: Spark's widest decimal: a wider one cannot be read by Spark
MAX_DECIMAL_PRECISION = 38


def parse_schema_evolution(value: "str | Sequence[str] | None") -> frozenset[str]:
    """The evolution modes a ``--schema-evolution`` value allows (a subset of ``{add-columns, widen}``).

    ``None``/``none`` allow nothing; ``all`` both; a comma list its members. Anything else is
    BadInputError (exit 2) naming the accepted words."""
    if value is None:
        return frozenset()
    words = [w.strip() for w in (value.split(",") if isinstance(value, str) else value) if w and w.strip()]
    bad = [w for w in words if w not in SCHEMA_EVOLUTION_CHOICES]
    if bad or not words:
        raise BadInputError(f"--schema-evolution takes {', '.join(SCHEMA_EVOLUTION_CHOICES)} or a comma list of "
                            f"them, got {value if isinstance(value, str) else ','.join(value)!r}")
    out: set[str] = set()
    for w in words:
        out |= {"none": set(), "all": {ADD_COLUMNS, WIDEN}}.get(w, {w})
    return frozenset(out)


def type_name(t: pa.DataType) -> str:
    """Spark's simple name of a stored type (the words of errors and of ``alter``'s TYPE)."""
    names = {pa.int8(): "tinyint", pa.int16(): "smallint", pa.int32(): "int", pa.int64(): "bigint",
             pa.float32(): "float", pa.float64(): "double", pa.bool_(): "boolean", pa.string(): "string",
             pa.large_string(): "string", pa.binary(): "binary", pa.date32(): "date"}
    if t in names:
        return names[t]
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz is not None else "timestamp_ntz"
    return str(t)


_TYPE_WORDS = {"tinyint": pa.int8(), "byte": pa.int8(), "smallint": pa.int16(), "short": pa.int16(),
               "int": pa.int32(), "integer": pa.int32(), "bigint": pa.int64(), "long": pa.int64(),
               "float": pa.float32(), "real": pa.float32(), "double": pa.float64(), "string": pa.string(),
               "boolean": pa.bool_(), "binary": pa.binary(), "date": pa.date32(),
               "timestamp": pa.timestamp("us", tz=STORED_TZ), "timestamp_ltz": pa.timestamp("us", tz=STORED_TZ),
               "timestamp_ntz": pa.timestamp("us"), "decimal": pa.decimal128(10, 0)}


def parse_type_name(text: str) -> pa.DataType:
    """The stored Arrow type of a Spark simple type name (``int``, ``bigint``, ``decimal(10,2)``,
    ``timestamp`` -- zone-aware, stored in UTC -- ``timestamp_ntz``, ...); BadInputError naming
    the accepted names otherwise. Nested types are not accepted: a column added by name is a
    simple one (send a batch with ``--schema-evolution add-columns`` for a nested column)."""
    t = text.strip().lower().replace(" ", "")
    if t.startswith("decimal(") and t.endswith(")"):
        p, _, s = t[len("decimal("):-1].partition(",")
        try:
            precision, scale = int(p), int(s or 0)
        except ValueError:
            precision = scale = -1
        if not (1 <= precision <= MAX_DECIMAL_PRECISION and 0 <= scale <= precision):
            raise BadInputError(f"type {text!r}: a decimal needs 1 <= precision <= {MAX_DECIMAL_PRECISION} and "
                                f"0 <= scale <= precision, e.g. decimal(10,2)")
        return pa.decimal128(precision, scale)
    if t not in _TYPE_WORDS:
        raise BadInputError(f"unknown type {text!r}; use one of {', '.join(sorted(_TYPE_WORDS))} or "
                            f"decimal(P,S)")
    return _TYPE_WORDS[t]


def _kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "floating point"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return "date/time"
    return "other"


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether a column stored as ``old`` may become ``new`` by schema evolution: every stored
    value converts exactly, in every engine, and readers can widen old files on the fly.

    tinyint -> smallint -> int -> bigint; float -> double; decimal(p,s) -> decimal(q,s) with
    p < q <= 38 (the same scale: a stored value keeps its digits); date -> timestamp_ntz (the
    day's midnight, a wall-clock value: a date has no zone, and Spark's Parquet reader widens
    a date to ``timestamp_ntz`` but not to a zone-aware timestamp). Nothing else."""
    if old.equals(new):
        return False
    if pa.types.is_signed_integer(old) and pa.types.is_signed_integer(new):
        return _INT_ORDER[old.bit_width] < _INT_ORDER[new.bit_width]
    if old == pa.float32() and new == pa.float64():
        return True
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return new.scale == old.scale and old.precision < new.precision <= MAX_DECIMAL_PRECISION
    if pa.types.is_date32(old) and pa.types.is_timestamp(new):
        return new.tz is None and new.unit == "us"
    return False


def widening_problem(old: pa.DataType, new: pa.DataType, *, text_fixed: str | None = None) -> str | None:
    """Why a column stored as ``old`` may not become ``new`` (None: it may, :func:`widens`).

    ``text_fixed`` names the role of a column whose text form is part of the layout (``record
    key``, ``partition``): its canonical text must not change, so only integer and decimal
    precision widenings, which print alike, are allowed there."""
    if old.equals(new):
        return None
    if widens(old, new):
        if text_fixed and not (pa.types.is_integer(old) or pa.types.is_decimal(old)):
            return (f"it is the {text_fixed} field, whose text form names the record and its place; "
                    f"{type_name(old)} to {type_name(new)} would change that text")
        return None
    if widens(new, old):
        return "that is narrowing, which would lose or round values the table holds"
    ko, kn = _kind(old), _kind(new)
    if pa.types.is_decimal(old) and pa.types.is_decimal(new) and new.scale != old.scale:
        return "a decimal's scale is fixed: a different scale changes what the stored digits mean"
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return f"a decimal holds at most {MAX_DECIMAL_PRECISION} digits in Spark"
    if pa.types.is_timestamp(old) and pa.types.is_timestamp(new):
        return ("zone-aware and zone-naive timestamps are different kinds (an instant against a wall-clock "
                "reading)")
    if pa.types.is_date32(old) and pa.types.is_timestamp(new):
        return ("a date widens to timestamp_ntz only (its midnight as a wall-clock value): a zone-aware "
                "timestamp would need a zone the date does not have")
    if pa.types.is_floating(old) and pa.types.is_floating(new):
        return "that is narrowing, which would round values the table holds"
    if ko == kn and ko != "other":
        return "that is narrowing, which would lose values the table holds"
    return (f"a change of kind ({ko if ko != 'other' else type_name(old)} to "
            f"{kn if kn != 'other' else type_name(new)}) would change stored values or their meaning; "
            f"only widening within a kind is schema evolution")


def _shape(t: pa.DataType) -> str:
    """A type's shape as Spark's cast sees it: ``array``, ``struct``, ``map``, ``null`` (an
    all-null column: Spark casts it to anything) or ``scalar``, whatever Arrow's spelling
    (large and view lists, dictionaries)."""
    while pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) \
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return "array"
    if pa.types.is_struct(t):
        return "struct"
    if pa.types.is_map(t):
        return "map"
    return "scalar"


def kind_problem(old: pa.DataType, new: pa.DataType) -> str | None:
    """Why no value of a batch type ``new`` casts to a table type ``old`` -- told from the two
    types alone -- or None when the cast may succeed and the values decide.

    Spark's cast (``try_cast`` included) refuses a type pair before reading a row
    (``DATATYPE_MISMATCH.CAST_WITHOUT_SUGGESTION``) when the shapes differ: a scalar and a
    nested type, a list and a struct or map, structs of a different field count (it casts
    structs by position), at any depth. Any type casts to a string, and an all-null column
    to anything; two scalars are left to the cast (numeric strings to numbers, double to
    bigint, int to string are Spark's, row by row). So this refuses only what Spark would
    refuse after a JVM start, and the Arrow engine can refuse the same batch in the same words.
    """
    while pa.types.is_dictionary(new):
        new = new.value_type
    so, sn = _shape(old), _shape(new)
    if sn == "null" or (so == "scalar" and (pa.types.is_string(old) or pa.types.is_large_string(old))):
        return None
    if so == "scalar" and sn == "scalar":
        return None
    if so != sn:
        words = {"array": "a list", "struct": "a struct", "map": "a map", "scalar": "a single value"}
        return f"{words[sn]} cannot become {words[so]}"
    if so == "array":
        return kind_problem(old.value_type, new.value_type)
    if so == "map":
        return kind_problem(old.key_type, new.key_type) or kind_problem(old.item_type, new.item_type)
    if old.num_fields != new.num_fields:
        return f"a struct of {new.num_fields} fields cannot become one of {old.num_fields} (Spark casts by position)"
    return next((p for p in (kind_problem(old.field(i).type, new.field(i).type) for i in range(old.num_fields))
                 if p), None)


def refuse_kind_changes(*, table_schema: pa.Schema, batch_schema: pa.Schema, delete_field: str | None) -> None:
    """BadInputError (exit 2, one line naming the column and both types) for the first batch
    column, in batch order, whose type can never be cast to the table's (:func:`kind_problem`).

    Every engine asks this before anything is written -- the pre-check from the Parquet
    footers before a JVM starts, the Arrow engine, the Spark job -- so such a batch is bad
    input everywhere, never a cast crash (exit 1) that a scheduler retries. It holds with any
    ``--schema-evolution``: a change of shape is never evolution. ``batch_schema`` may hold the
    source's own Arrow types or Spark's (an all-null column: ``null``, cast to anything)."""
    have = {f.name: f.type for f in table_schema}
    for f in batch_schema:
        if f.name == delete_field or f.name.startswith("_bi_") or f.name not in have:
            continue
        problem = kind_problem(have[f.name], f.type)
        if problem:
            raise BadInputError(f"column {f.name!r}: the batch's {spark_type_name(f.type)} cannot be cast to the "
                                f"table's {spark_type_name(have[f.name])}: {problem}; nothing was written")


def _evolvable(t: pa.DataType) -> bool:
    return _kind(t) != "other"


def evolve(table_schema: pa.Schema, batch_schema: pa.Schema, *, modes: "frozenset[str] | set[str]",
           delete_field: str | None = None, text_fixed: "dict[str, str] | None" = None) -> pa.Schema:
    """The data schema a batch writes into a table whose data schema is ``table_schema``
    (user columns and ``_bi_key``): ``table_schema`` itself when the batch changes nothing.

    ``batch_schema`` holds the batch's columns in their stored (Spark) types; the delete field
    and reserved ``_bi_`` columns are ignored. ``modes`` (:func:`parse_schema_evolution`):

    * a batch column the table lacks is added, nullable, after the table's user columns, with
      ``add-columns``; without it the batch is refused (BadInputError, one line naming the
      columns and the two ways to add them);
    * a batch column whose type :func:`widens` the table's becomes the column's new type with
      ``widen``; without it the values are cast to the table's type, as before (a value that
      does not fit is refused by the cast);
    * a batch type narrower than the table's is cast up (that is no evolution);
    * with ``widen``, a numeric or date/time batch type that neither widens nor narrows the
      table's (a change of kind, a decimal's scale, a zone) is refused naming the column, both
      types and why: evolution never narrows or changes a kind, and casting would silently
      change values the user asked to keep. Other types (strings, booleans, nested ones) are
      left to the cast, as without the option: nested types never evolve.

    ``text_fixed`` maps a record key or partition column to its role (see :func:`widening_problem`).
    Columns are never dropped or renamed: a column the batch lacks stays.
    """
    text_fixed = text_fixed or {}
    fields = {f.name: f for f in table_schema}
    changed = False
    added: list[pa.Field] = []
    extra: list[str] = []
    for bf in batch_schema:
        name = bf.name
        if name == delete_field or name.startswith("_bi_"):
            continue
        if name not in fields:
            extra.append(name)
            if ADD_COLUMNS in modes:
                added.append(pa.field(name, stored_type(bf.type), True))
            continue
        old, new = fields[name].type, stored_type(bf.type)
        if old.equals(new) or widens(new, old):
            continue  # equal, or narrower: cast up
        if WIDEN not in modes:
            continue  # the cast decides (a value that does not fit is refused)
        problem = widening_problem(old, new, text_fixed=text_fixed.get(name))
        if problem is None:
            fields[name] = fields[name].with_type(new)
            changed = True
        elif widens(old, new) or (_evolvable(old) and _evolvable(new)):
            raise BadInputError(f"column {name!r}: the table's {type_name(old)} cannot become the batch's "
                                f"{type_name(new)}: {problem}; nothing was written")
    if extra and ADD_COLUMNS not in modes:
        raise BadInputError(extra_columns_message(extra, types={f.name: f.type for f in batch_schema}))
    if not changed and not added:
        return table_schema
    user = [fields[f.name] for f in table_schema if f.name != _KEY_COLUMN]
    key = [fields[f.name] for f in table_schema if f.name == _KEY_COLUMN]
    return pa.schema([*user, *added, *key], metadata=table_schema.metadata)


def schema_changes(old: pa.Schema, new: pa.Schema) -> list[str]:
    """What ``new`` changes of ``old``, in words (``added x bigint``, ``widened y int -> bigint``)."""
    out = []
    for f in new:
        if f.name not in old.names:
            out.append(f"added {f.name} {type_name(f.type)}")
        elif not old.field(f.name).type.equals(f.type):
            out.append(f"widened {f.name} {type_name(old.field(f.name).type)} -> {type_name(f.type)}")
    return out


def conform(t: pa.Table, schema: pa.Schema, columns: "Sequence[str] | None" = None) -> pa.Table:
    """Rows of a data file read in the snapshot's ``schema``: the one rule for reading a file
    written before the schema changed (format.md "Schema evolution").

    A column of ``schema`` the file lacks (added since) is all null; a column the file holds
    narrower (widened since) is cast to the schema's type, exactly (:func:`widens`). Output
    columns are ``columns`` when given, else the schema's then any other column the file holds
    (a log's ``_bi_op``); a requested column in neither is a KeyError. The file's schema-level
    key/value metadata is kept: a partial log records the columns it carries there."""
    names = list(columns) if columns is not None else [
        *schema.names, *(c for c in t.column_names if c not in schema.names)]
    have = set(t.column_names)
    cols, fields = [], []
    for name in names:
        target = schema.field(name) if name in schema.names else None
        if name in have:
            col = t.column(name)
            if target is not None and not col.type.equals(target.type):
                col = col.cast(target.type)
            cols.append(col)
            fields.append(target if target is not None else t.schema.field(name))
        elif target is not None:
            cols.append(pa.nulls(t.num_rows, target.type))
            fields.append(target.with_nullable(True))
        else:
            raise KeyError(f"column {name!r} is neither in the file nor in the table schema")
    return pa.Table.from_arrays(cols, schema=pa.schema(fields, metadata=t.schema.metadata))


def text_fixed_columns(cfg: object) -> dict[str, str]:
    """The columns whose text form is part of the layout (``evolve``'s ``text_fixed``): the
    record key fields (the canonical key) and the partition field (its directory name)."""
    out = {k: "record key" for k in getattr(cfg, "record_key_fields", None) or []}
    out.update({p: "partition" for p in getattr(cfg, "partition_fields", None) or []})
    return out


def _stored_batch_schema(batch: pa.Schema) -> pa.Schema | None:
    """A footer schema in the types the engines read it as (Spark's), or None when only Spark decides."""
    try:
        return pa.schema([pa.field(f.name, spark_type(f.type, name=f.name)) for f in batch])
    except EngineUnsupportedError:
        return None
