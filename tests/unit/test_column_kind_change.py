"""A batch column whose type changed shape (issue 36, item 8): a string for a ``list<string>``
column, a ``list<int>`` for an ``int``, a list for a struct, a struct of other arity, a list
of lists for a list of ints. No value of such a type casts to the table's (Spark refuses the
pair with ``DATATYPE_MISMATCH.CAST_WITHOUT_SUGGESTION``), so it is bad input: one line naming
the column and both types, exit 2, nothing written, decided from the Parquet footers before
any JVM starts, whatever ``--engine`` and ``--schema-evolution`` say.

Casts whose values decide (a numeric string to a number, an int to a string) keep going
where they went: the Arrow engine runs them.

Real Parquet, a real table, the CLI as a subprocess with a fake ``java`` that records any
start (as ``test_cli_newcomer`` checks metadata-only refusals).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.table.reader import read_arrow
from spark_jobs.table.schema import kind_problem
from tests.unit.test_cli_newcomer import _fake_java, cli, result, tree_digest

pytestmark = pytest.mark.unit

STRUCT = pa.struct([("a", pa.int64())])
SCHEMA = pa.schema([("id", pa.string()), ("region", pa.string()), ("note", pa.string()), ("n", pa.int32()),
                    ("tags", pa.list_(pa.string())), ("s", STRUCT), ("deep", pa.list_(pa.int32()))])
ROWS = [
    {"id": "a b/%+é", "region": "eu west", "note": None, "n": 1, "tags": ["x", ""], "s": {"a": 1}, "deep": [1]},
    {"id": "Zoë", "region": None, "note": "ü", "n": 2, "tags": None, "s": None, "deep": []},
    {"id": "c", "region": "", "note": "", "n": None, "tags": [], "s": {"a": None}, "deep": None},
]


@pytest.fixture()
def table(tmp_path: Path) -> tuple[Path, str]:
    uri = str(tmp_path / "t")
    src = tmp_path / "in" / "b1.parquet"
    src.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS, schema=SCHEMA), src)
    result(cli("upsert", uri, str(src), "--record-key", "id", "--partition-field", "region", "--engine", "arrow"))
    return tmp_path, uri


def _batch(d: Path, column: str, typ: pa.DataType, value: object) -> str:
    schema = SCHEMA.set(SCHEMA.get_field_index(column), pa.field(column, typ))
    rows = [{**ROWS[0], column: value}]
    path = d / "in" / f"{column}-{abs(hash(str(typ)))}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


CHANGED = [  # column, batch type, value, engine, options, the two types' names
    ("tags", pa.string(), "x", "auto", (), "string", "array<string>"),
    ("tags", pa.string(), "x", "spark", ("--schema-evolution", "add-columns"), "string", "array<string>"),
    ("n", pa.list_(pa.int32()), [7], "auto", (), "array<int>", "int"),
    ("n", pa.list_(pa.int32()), [7], "auto", ("--schema-evolution", "all"), "array<int>", "int"),
    ("s", pa.list_(pa.int64()), [1], "spark", (), "array<bigint>", "struct<a:bigint>"),
    ("s", pa.struct([("a", pa.int64()), ("b", pa.string())]), {"a": 1, "b": "x"}, "auto", (),
     "struct<a:bigint,b:string>", "struct<a:bigint>"),
    ("deep", pa.list_(pa.list_(pa.int32())), [[1]], "arrow", (), "array<array<int>>", "array<int>"),
]


@pytest.mark.parametrize("column,typ,value,engine,options,batch_type,table_type", CHANGED,
                         ids=[f"{c[0]}-{c[5]}-{c[3]}{'-' + c[4][1] if c[4] else ''}" for c in CHANGED])
def test_a_change_of_shape_is_refused_in_one_line_before_a_jvm(table, column, typ, value, engine, options,
                                                                batch_type, table_type):
    d, uri = table
    src = _batch(d, column, typ, value)
    env, marker = _fake_java(d)
    before = tree_digest(Path(uri))
    p = cli("upsert", uri, src, "--engine", engine, *options, env=env)
    assert p.returncode == 2, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"bucketindex: error: column {column!r}: the batch's {batch_type} cannot be cast "
                               f"to the table's {table_type}: "), lines[0]
    assert not marker.exists(), f"a JVM was started: {marker.read_text()}"
    assert tree_digest(Path(uri)) == before


def test_casts_the_values_decide_keep_going_on_the_arrow_engine(table):
    """A numeric string for an int, an int for a string: the values decide, and the Arrow
    engine casts them as Spark does."""
    d, uri = table
    schema = SCHEMA.set(SCHEMA.get_field_index("n"), pa.field("n", pa.string())) \
        .set(SCHEMA.get_field_index("note"), pa.field("note", pa.int64()))
    src = d / "in" / "values.parquet"
    pq.write_table(pa.Table.from_pylist([{**ROWS[0], "n": " 42", "note": 7}], schema=schema), src)
    result(cli("upsert", uri, str(src), "--engine", "arrow"))
    got = {r["id"]: r for r in read_arrow(uri).to_pylist()}
    assert (got["a b/%+é"]["n"], got["a b/%+é"]["note"]) == (42, "7")


def test_kind_problem_leaves_value_decided_pairs_to_the_cast():
    for old, new in [(pa.int64(), pa.string()), (pa.string(), pa.list_(pa.int32())), (pa.string(), STRUCT),
                     (pa.int64(), pa.float64()), (pa.list_(pa.string()), pa.null()),
                     (pa.list_(pa.string()), pa.large_list(pa.int8())),
                     (pa.struct([("x", pa.string())]), STRUCT),  # by position, any names
                     (pa.map_(pa.string(), pa.int64()), pa.map_(pa.int32(), pa.string()))]:
        assert kind_problem(old, new) is None, (old, new)
    for old, new in [(pa.list_(pa.string()), pa.string()), (pa.int32(), pa.list_(pa.int32())),
                     (STRUCT, pa.map_(pa.string(), pa.int64())), (pa.map_(pa.string(), pa.int64()), STRUCT),
                     (pa.binary(), pa.list_(pa.int8())), (pa.list_(STRUCT), pa.list_(pa.int64()))]:
        assert kind_problem(old, new), (old, new)
