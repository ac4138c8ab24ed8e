"""Issue 39 item 3, "Exact values": every partition value the table accepts reads back
identically through each projection, in one table, through upserts, updates, partition moves
and deletes.

One copy-on-write table (its projections are exact, format.md §11/§12) partitioned by a string
field holding null and ``""`` side by side, the literals Hive and this table use for null,
values whose directory names are shortened (§1; two of them share the shortened prefix), and
``/``, ``%``, ``+``, spaces, non-ASCII and other odd text; then tables partitioned by a zoned
timestamp and by a decimal (the other partition types whose text forms readers misread).
After every commit each Delta version (``deltalake``'s ``to_pyarrow_table`` and its DataFusion
``QueryBuilder``) and each Iceberg snapshot (``StaticTable.from_metadata(...).scan()``, and the
table registered in a pyiceberg SQL catalog) equals ``read_arrow --as-of`` of the same entry,
and the latest equals the oracle (``tests/oracle.py``). Polars reads both projections with its
own Parquet reader as a second reader of the latest state (and DuckDB pyiceberg's scan).

Arrow engine only, in process (``spark_jobs.cli.main``).
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.cli import main
from spark_jobs.table import Table, delta, iceberg
from spark_jobs.table.reader import read_arrow
from tests.harness.delta_reads import sorted_rows
from tests.oracle import reduce_batches

deltalake = pytest.importorskip("deltalake")
StaticTable = pytest.importorskip("pyiceberg.table").StaticTable

pytestmark = [pytest.mark.unit,
              # Polars plans through pyiceberg without its optional planner plugin: a warning, not a defect
              pytest.mark.filterwarnings("ignore:Iceberg scan planning")]

#: every kind of string partition value: null and "" apart; the null literals of Hive and of
#: this table; two 300-character values whose shortened directory names share their prefix
#: (they differ in the hash only) and a non-ASCII one shortened; '/', '%', '+', spaces,
#: non-ASCII, an escape-looking text, '=', 'null' as text, a tab and a character outside the BMP
VALUES = [None, "", "__NULL__", "__HIVE_DEFAULT_PARTITION__", "x" * 300, "x" * 299 + "y", "é" * 150 + " long",
          "a/b", "100%", "%2F", "x+y", "eu west", " ", "  ", "são paulo", "日本", "😀", "a=b", "null", "NULL",
          "\t", "~", "."]
ARGS = ["--record-key", "id", "--precombine-field", "ts", "--delete-field", "is_deleted", "--engine", "arrow"]
SCHEMA = pa.schema([("id", pa.string()), ("p", pa.string()), ("ts", pa.int64()), ("amount", pa.float64()),
                    ("is_deleted", pa.bool_())])


def _write(tmp: Path, name: str, rows: list[dict], schema: pa.Schema) -> str:
    path = tmp / "src" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def _upsert(uri: str, tmp: Path, batch: str, rows: list[dict], schema: pa.Schema, *extra: str) -> None:
    argv = ["upsert", uri, _write(tmp, batch, rows, schema), *ARGS, "--batch-id", batch, *extra]
    assert main(argv) == 0, argv


def _row(i: int, p: object, ts: int, *, deleted: bool = False) -> dict:
    return {"id": f"k {i:03d}", "p": p, "ts": ts, "amount": i + ts / 10, "is_deleted": deleted}


def _delta_sql(uri: str, version: int) -> pa.Table:
    dt_ = deltalake.DeltaTable(uri, version=version)
    return pa.table(deltalake.QueryBuilder().register("t", dt_).execute("select * from t"))


def _check_every_version(uri: str, names: list[str], *, catalog: object) -> None:
    """Every Delta version and Iceberg snapshot equals ``read --as-of`` of its entry, through
    each reader; the SQL catalog's registration of the latest metadata reads every snapshot too."""
    table = Table.load(uri)
    tl = table.timeline.reload()
    last = tl.last_seq
    assert delta.versions_present(table) == list(range(last + 1))
    assert iceberg.versions_present(table) == list(range(last + 1))
    ident = ("exact", f"t{abs(hash(uri)) % 10**8}_{last}")
    registered = catalog.register_table(ident, iceberg.metadata_uri(table, last))
    for v in range(1, last + 1):
        want = sorted_rows(read_arrow(uri, as_of=tl.entry(v)["instant"]), names)
        what = f"version {v} ({tl.entry(v)['action']})"
        got = deltalake.DeltaTable(uri, version=v).to_pyarrow_table()
        assert got.column_names == names, what
        assert sorted_rows(got, names) == want, f"deltalake, {what}"
        assert sorted_rows(_delta_sql(uri, v), names) == want, f"deltalake QueryBuilder, {what}"
        st = StaticTable.from_metadata(iceberg.metadata_uri(table, v))
        got = st.scan().to_arrow()
        assert got.column_names == names, what
        assert sorted_rows(got, names) == want, f"pyiceberg, {what}"
        assert sorted_rows(registered.scan(snapshot_id=v).to_arrow(), names) == want, f"SQL catalog, {what}"


def _check_latest(uri: str, names: list[str], expected: dict, *, partition: str | None, field: str) -> None:
    """The latest state through every reader equals the oracle, field by field."""
    import polars as pl

    def keyed(t: pa.Table) -> dict:
        rows = t.select(names).to_pylist()
        out = {(r[field], r["id"]) if partition else r["id"]: r for r in rows}
        assert len(out) == len(rows), "a record appears twice"
        return out

    want = {k: {c: r[c] for c in names} for k, r in expected.items()}
    assert keyed(read_arrow(uri)) == want
    assert keyed(deltalake.DeltaTable(uri).to_pyarrow_table()) == want, "deltalake"
    assert keyed(StaticTable.from_metadata(uri).scan().to_arrow()) == want, "pyiceberg"
    # a second reader: Polars, its own Parquet reader on each projection
    assert keyed(pl.scan_delta(uri).collect().to_arrow()) == want, "polars scan_delta"
    assert keyed(pl.scan_iceberg(StaticTable.from_metadata(uri)).collect().to_arrow()) == want, "polars scan_iceberg"
    assert keyed(pl.scan_iceberg(StaticTable.from_metadata(uri), reader_override="native").collect().to_arrow()) \
        == want, "polars scan_iceberg, native reader"
    con = StaticTable.from_metadata(uri).scan().to_duckdb("t")  # DuckDB on pyiceberg's scan
    assert keyed(con.sql("select * from t").arrow().read_all()) == want, "duckdb"


@pytest.fixture
def catalog(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("lake", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'wh'}")
    cat.create_namespace("exact")
    return cat


@pytest.mark.parametrize("index", ["record", "bucket"])
def test_every_string_partition_value_reads_back_through_both_projections(tmp_path, monkeypatch, catalog, index):
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    uri = str(tmp_path / "t")
    n = len(VALUES)
    names = ["id", "p", "ts", "amount"]
    b1 = [_row(i, VALUES[i % n], 1) for i in range(3 * n)]
    _upsert(uri, tmp_path, "b1", b1, SCHEMA, "--index", index, "--num-buckets", "2", "--table-type", "copy_on_write",
            "--partition-field", "p", "--mirror", "delta")
    assert main(["mirror", uri, "--enable", "iceberg"]) == 0
    layout = sorted(p.name for p in Path(uri).iterdir() if p.name.startswith("p="))
    assert len(layout) == n and any("~" in p for p in layout), "every value its own directory, some shortened"
    # updates in place, deletes (the whole "__NULL__" partition among them) and partition moves
    # between the values readers confuse: "" <-> null, "__HIVE_DEFAULT_PARTITION__" -> null,
    # the two shortened values into each other
    moves = {"": None, None: "", "__HIVE_DEFAULT_PARTITION__": None, "x" * 300: "x" * 299 + "y",
             "x" * 299 + "y": "x" * 300, " ": "  ", "%2F": "a/b"}
    b2 = [_row(i, VALUES[i % n], 2) for i in range(0, 3 * n, 4)]
    b2 += [_row(i, VALUES[i % n], 2, deleted=True) for i in range(3 * n) if VALUES[i % n] == "__NULL__"]
    b2 += [_row(i, moves[VALUES[i % n]], 3) for i in range(n, 2 * n) if VALUES[i % n] in moves]
    b2 += [_row(i, VALUES[i % n], 2, deleted=True) for i in range(2 * n + 1, 3 * n, 5)]
    b2 = list({r["id"] if index == "record" else (r["p"], r["id"]): r for r in b2}.values())
    _upsert(uri, tmp_path, "b2", b2, SCHEMA)
    b3 = [_row(i, VALUES[(i + 1) % n], 4) for i in range(5)] + [_row(900, "", 4), _row(901, None, 4)]
    _upsert(uri, tmp_path, "b3", b3, SCHEMA)
    _check_every_version(uri, names, catalog=catalog)
    partition = "p" if index == "bucket" else None
    expected = reduce_batches([b1, b2, b3], partition=partition)
    got = read_arrow(uri).column("p").to_pylist()
    assert got.count("") and got.count(None), "the cases the test is about"
    _check_latest(uri, names, expected, partition=partition, field="p")
    # filters on the field: each value finds its rows and only them (null is its own value)
    dt_ = deltalake.DeltaTable(uri)
    st = StaticTable.from_metadata(uri)
    from pyiceberg.expressions import EqualTo, IsNull

    for value in VALUES:
        want = got.count(value)
        if value is None:
            assert pa.table(deltalake.QueryBuilder().register("t", dt_).execute(
                "select count(*) as c from t where p is null")).to_pylist()[0]["c"] == want
            assert st.scan(row_filter=IsNull("p")).to_arrow().num_rows == want
            continue
        assert dt_.to_pyarrow_table(filters=[("p", "=", value)]).column("p").to_pylist() == [value] * want, repr(value)
        assert st.scan(row_filter=EqualTo("p", value)).to_arrow().column("p").to_pylist() == [value] * want, repr(value)


#: the other partition types, null among the values: zoned timestamps (stored in UTC whatever
#: the batch's zone) and decimals, whose text forms Delta readers misread (a zone-less timestamp
#: text is read in the writer's zone, PROTOCOL.md "Partition Value Serialization"; `-12.50` as
#: `-12.-50`), and every type whose Hive directory name Polars' scan_delta parses (`__NULL__`)
TYPED = {
    "timestamp_tz": (pa.timestamp("us", tz="UTC"),
                     [None, dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone.utc),
                      dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc),
                      dt.datetime(2024, 3, 31, 1, 30, 0, 5, tzinfo=dt.timezone.utc),
                      dt.datetime(2024, 10, 27, 0, 59, 59, tzinfo=dt.timezone.utc)]),
    "timestamp_ntz": (pa.timestamp("us"), [None, dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
                                           dt.datetime(2024, 3, 31, 2, 30)]),
    "int": (pa.int64(), [None, 0, -5, 2**40]),
    "date": (pa.date32(), [None, dt.date(1970, 1, 1), dt.date(1969, 12, 31), dt.date(2024, 2, 29)]),
    "bool": (pa.bool_(), [None, True, False]),
    "decimal": (pa.decimal128(20, 4), [None, Decimal("0.0000"), Decimal("-12.5000"), Decimal("-0.0001"),
                                       Decimal("1234567890123456.7890")]),
}


@pytest.mark.parametrize("kind", sorted(TYPED))
def test_typed_partition_values_read_back(tmp_path, monkeypatch, catalog, kind):
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    typ, values = TYPED[kind]
    schema = pa.schema([f if f.name != "p" else pa.field("p", typ) for f in SCHEMA])
    uri = str(tmp_path / "t")
    n = len(values)
    names = ["id", "p", "ts", "amount"]
    b1 = [_row(i, values[i % n], 1) for i in range(3 * n)]
    _upsert(uri, tmp_path, "b1", b1, schema, "--table-type", "copy_on_write", "--partition-field", "p",
            "--mirror", "delta")
    assert main(["mirror", uri, "--enable", "iceberg"]) == 0
    b2 = [_row(i, values[(i + 1) % n], 2) for i in range(0, 3 * n, 3)]  # partition moves, null among them
    b2 += [_row(i, values[i % n], 2, deleted=True) for i in range(1, 3 * n, 4)]
    b2 = list({r["id"]: r for r in b2}.values())
    _upsert(uri, tmp_path, "b2", b2, schema)
    if kind == "timestamp_tz":  # a batch in another zone: the table stores the instant (in UTC)
        paris = pa.schema([f if f.name != "p" else pa.field("p", pa.timestamp("us", tz="Europe/Paris"))
                           for f in SCHEMA])
        b3 = [_row(50, values[3], 3)]
        _upsert(uri, tmp_path, "b3", b3, paris)
    else:
        b3 = [_row(50, values[2], 3)]
        _upsert(uri, tmp_path, "b3", b3, schema)
    _check_every_version(uri, names, catalog=catalog)
    _check_latest(uri, names, reduce_batches([b1, b2, b3]), partition=None, field="p")
    got = read_arrow(uri)
    assert got.schema.field("p").type == typ
    assert deltalake.DeltaTable(uri).to_pyarrow_table().schema.field("p").type == typ
    assert StaticTable.from_metadata(uri).scan().to_arrow().schema.field("p").type == typ
    # published as a Delta data column: readers read each value from the files, never from a
    # partition value's text (which Polars parses out of the directory name) -- see format.md §11
    table = Table.load(uri)
    acts = [json.loads(x) for v in delta.versions_present(table)
            for x in table.io.read_bytes(delta.version_file(table, v)).decode().splitlines()]
    assert [a["metaData"]["partitionColumns"] for a in acts if "metaData" in a] == [[]]
    assert all(a["add"]["partitionValues"] == {} for a in acts if "add" in a)


def test_a_reference_partition_column_refuses_an_empty_value(tmp_path, caplog, capsys):
    """A reference bootstrap's Hive path column stays a Delta partition column while a referenced
    file is listed (it lacks the column), where Delta readers read ``""`` as null: a file written
    then with ``""`` is never
    published -- the log stays at the version before (stale, never wrong), the hook warns in one
    line and ``mirror --repair`` refuses in one line (exit 2), the table untouched. Null and
    every other value in such a column read back exactly (through ``QueryBuilder``, which
    reads files outside the root)."""
    import pyarrow.dataset as ds

    schema = pa.schema([("id", pa.string()), ("ts", pa.int64()), ("region", pa.string())])
    src = tmp_path / "dataset"
    ds.write_dataset(pa.Table.from_pylist([{"id": f"k{i}", "ts": 1, "region": ["eu", "us"][i % 2]} for i in range(4)],
                                          schema=schema), src, format="parquet", partitioning=["region"],
                     partitioning_flavor="hive")
    uri = str(tmp_path / "t")
    assert main(["bootstrap", uri, str(src), "--record-key", "id", "--partition-field", "region", "--precombine-field",
                 "ts", "--mode", "reference", "--engine", "arrow", "--mirror", "delta"]) == 0
    args = ["--record-key", "id", "--precombine-field", "ts", "--engine", "arrow"]
    ok = [{"id": "n1", "ts": 2, "region": None}, {"id": "n2", "ts": 2, "region": "eu west"},
          {"id": "n3", "ts": 2, "region": "__HIVE_DEFAULT_PARTITION__"}]
    assert main(["upsert", uri, _write(tmp_path, "ok", ok, schema), *args]) == 0
    table = Table.load(uri)
    assert any(s.path.startswith("..") for s in table.view().slices()), "the referenced files are still listed"
    assert delta.versions_present(table) == list(range(table.timeline.last_seq + 1))
    names = ["id", "ts", "region"]
    assert sorted_rows(_delta_sql(uri, table.timeline.last_seq), names) == sorted_rows(read_arrow(uri), names)
    published = table.timeline.last_seq
    assert main(["upsert", uri, _write(tmp_path, "empty", [{"id": "e1", "ts": 3, "region": ""}], schema), *args]) == 0
    assert "holds '' and is a Delta partition column" in caplog.text
    table = Table.load(uri)
    assert table.timeline.last_seq == published + 1, "the commit stands"
    assert delta.versions_present(table) == list(range(published + 1)), "the log stays at the version before"
    assert deltalake.DeltaTable(uri).version() == published
    capsys.readouterr()
    assert main(["mirror", uri, "--repair"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds ''" in err[0] and "'region'" in err[0], err
    assert delta.versions_present(Table.load(uri)) == list(range(published + 1))
    assert Table.load(uri).timeline.last_seq == published + 1, "nothing committed"


def test_a_reference_partition_column_becomes_a_data_column_when_the_references_leave(tmp_path, monkeypatch,
                                                                                     catalog):
    """While a snapshot lists a referenced file (which lacks its Hive path column) the field is
    a Delta partition column; the version whose entry replaces the last referenced file
    publishes a ``metaData`` without it, so readers read the in-root files' values from the
    files (Polars' scan_delta would parse ``__NULL__`` and ``+`` out of the directory names).
    Every version reads back as ``read --as-of`` (QueryBuilder: it reads files outside the root),
    and once the references are gone ``to_pyarrow_table`` and Polars read the latest exactly."""
    import polars as pl
    import pyarrow.dataset as ds

    schema = pa.schema([("id", pa.string()), ("ts", pa.int64()), ("region", pa.string())])
    src = tmp_path / "dataset"
    base = [{"id": f"k{i}", "ts": 1, "region": ["eu", "us"][i % 2]} for i in range(4)]
    ds.write_dataset(pa.Table.from_pylist(base, schema=schema), src, format="parquet", partitioning=["region"],
                     partitioning_flavor="hive")
    uri = str(tmp_path / "t")
    assert main(["bootstrap", uri, str(src), "--record-key", "id", "--partition-field", "region", "--precombine-field",
                 "ts", "--mode", "reference", "--engine", "arrow", "--mirror", "delta"]) == 0
    args = ["--record-key", "id", "--precombine-field", "ts", "--engine", "arrow"]
    b2 = [{"id": "n1", "ts": 2, "region": None}, {"id": "n2", "ts": 2, "region": "eu west"}]
    assert main(["upsert", uri, _write(tmp_path, "b2", b2, schema), *args]) == 0
    b3 = [dict(r, ts=3) for r in base]  # every key of the referenced files: they are replaced
    assert main(["upsert", uri, _write(tmp_path, "b3", b3, schema), *args]) == 0
    b4 = [{"id": "n3", "ts": 4, "region": ""}]  # now publishable: a data column
    assert main(["upsert", uri, _write(tmp_path, "b4", b4, schema), *args]) == 0
    table = Table.load(uri)
    assert not any(s.path.startswith("..") for s in table.view().slices()), "no referenced file is left"
    names = ["id", "ts", "region"]
    tl = table.timeline
    metas = {v: json.loads(x)["metaData"]["partitionColumns"] for v in delta.versions_present(table)
             for x in table.io.read_bytes(delta.version_file(table, v)).decode().splitlines() if '"metaData"' in x}
    assert metas == {0: [], 1: ["region"], 3: []}, metas
    for v in range(1, tl.last_seq + 1):
        assert sorted_rows(_delta_sql(uri, v), names) == \
            sorted_rows(read_arrow(uri, as_of=tl.entry(v)["instant"]), names), v
    want = reduce_batches([base, b2, b3, b4], delete_field=None)
    got = read_arrow(uri)
    assert {r["id"]: r["region"] for r in got.to_pylist()} == {k: r["region"] for k, r in want.items()}
    assert sorted_rows(deltalake.DeltaTable(uri).to_pyarrow_table(), names) == sorted_rows(got, names)
    assert sorted_rows(pl.scan_delta(uri).collect().to_arrow(), names) == sorted_rows(got, names)
