"""``bucketindex bootstrap --engine arrow|auto``: the bootstrap in-process (no JVM), both modes.

The dataset looks like users' data: Hive partition values with spaces, ``/``, ``%``, ``+``,
non-ASCII, ``""`` and null (``__HIVE_DEFAULT_PARTITION__`` directories), keys with the same,
zone-aware timestamps, decimals, and duplicate keys across and within files resolved by a
float precombine field holding NaN and null. After a bootstrap the table equals the oracle
and ``validate`` passes; a crash at each fault point leaves no snapshot rows and a rerun
finishes; ``auto`` picks Spark when the dataset would not fit the budget.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.cli import main
from spark_jobs.engines import bootstrap
from spark_jobs.exceptions import EngineUnsupportedError
from spark_jobs.io.filesystem import resolve
from spark_jobs.table.action.bootstrap import BootstrapOptions
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView
from tests.oracle import reduce_batches
from tests.unit.test_cli_newcomer import tree_digest

REGIONS = ["eu west", "us/east", "100%", "x+y", "亚太 ap", "são paulo", "", None]
SCHEMA = pa.schema([("id", pa.string()), ("ts", pa.float64()), ("amount", pa.decimal128(12, 2)),
                    ("at", pa.timestamp("us", tz="America/New_York")), ("region", pa.string())])
NY = dt.timezone(dt.timedelta(hours=-5))


def _key(i: int) -> str:
    return f"k {i}/%+ключ" if i % 3 else f"u{i:03d}"


def dataset_rows(n: int = 40) -> tuple[list[dict], list[dict]]:
    """Two files' worth of rows (each key in one partition); duplicates across and within them:
    NaN beats a number, a number beats null, the higher number wins."""
    def row(i: int, ts: float | None) -> dict:
        return {"id": _key(i), "ts": ts, "amount": Decimal(f"{i * 7}.{i % 100:02d}"),
                "at": dt.datetime(2024, 3, 10, 1, i % 60, tzinfo=NY), "region": REGIONS[i % len(REGIONS)]}

    first = [row(i, float(i)) for i in range(n)]
    second = [row(n + i, float(i)) for i in range(n // 2)]
    first.append(row(1, float("nan")))    # key 1: NaN wins over 1.0 (same file)
    second.append(row(2, None))           # key 2: 2.0 wins over null (across files)
    second.append({**row(3, 99.5), "amount": Decimal("-1.50")})  # key 3: 99.5 wins over 3.0
    second.append(row(4, -4.0))           # key 4: 4.0 wins over -4.0
    return first, second


def write_dataset(root: Path, *, flat: bool = False) -> list[dict]:
    first, second = dataset_rows()
    for name, rows in (("a", first), ("b", second)):
        ds.write_dataset(pa.Table.from_pylist(rows, schema=SCHEMA), root, format="parquet",
                         partitioning=None if flat else ["region"], partitioning_flavor=None if flat else "hive",
                         basename_template=f"{name}-{{i}}.parquet", existing_data_behavior="overwrite_or_ignore")
    return first + second


def _comparable(r: dict) -> dict:
    return {k: ("NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()
            if not k.startswith("_bi_")}


def expected(rows: list[dict]) -> dict:
    return {k: _comparable(r) for k, r in reduce_batches([rows], precombine="ts", delete_field=None).items()}


def snapshot(uri: str) -> dict:
    return {r["id"]: _comparable(r) for r in read_arrow(uri).to_pylist()}


def _run(args: list[str], capsys) -> tuple[int, dict | None, list[str]]:
    code = main(args)
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return code, (json.loads(lines[-1]) if lines else None), [e for e in err.splitlines() if e.strip()]


CASES = [("reference", "record"), ("rewrite", "record"), ("rewrite", "bucket"), ("rewrite", "global_simple")]


@pytest.mark.parametrize("mode,index", CASES)
def test_arrow_bootstrap_equals_the_oracle_and_validates(tmp_path, capsys, mode, index):
    root = tmp_path / "dataset"
    rows = write_dataset(root)
    uri = str(tmp_path / "table")
    code, res, err = _run(["bootstrap", uri, str(root), "--record-key", "id", "--partition-field", "region",
                           "--precombine-field", "ts", "--mode", mode, "--index", index, "--engine", "arrow"], capsys)
    assert code == 0, err
    assert res["engine"]["name"] == "arrow" and res["mode"] == mode and res["index_type"] == index
    c = res["counts"]
    assert (c["duplicate_keys"], c["rows_dropped"], c["rows"], c["source_rows"]) == (4, 4, len(rows) - 4, len(rows))
    assert snapshot(uri) == expected(rows)
    report = run_validate(uri)
    assert report["ok"], report
    table = Table.load(uri)
    [inst] = table.timeline.completed()
    meta = table.timeline.read_metadata(inst)
    assert inst.action == "bootstrap" and meta["engine"]["name"] == "arrow"
    if mode == "reference":  # files without a loser are referenced in place; the others rewritten
        assert c["files_rewritten"] >= 1 and c["files_referenced"] >= 1
        parts = {g["partition"] for g in meta["file_groups"]}
        assert "region=__NULL__" in parts and "region=" in parts and "region=us%2Feast" in parts, parts
    # a rerun is a no-op
    code, again, _ = _run(["bootstrap", uri, str(root), "--record-key", "id", "--partition-field", "region",
                           "--precombine-field", "ts", "--mode", mode, "--index", index, "--engine", "arrow"], capsys)
    assert code == 0 and again["noop"] and again["instant"] == res["instant"]


def test_duplicates_without_precombine_exit_2_and_write_nothing(tmp_path, capsys):
    root = tmp_path / "dataset"
    write_dataset(root, flat=True)
    uri = str(tmp_path / "table")
    for mode in ("reference", "rewrite"):
        code, _, err = _run(["bootstrap", uri, str(root), "--record-key", "id", "--mode", mode, "--engine", "arrow"],
                            capsys)
        assert code == 2 and len(err) == 1, err
        assert "4 record key(s) (id) appear more than once in the source (8 rows)" in err[0], err
        assert not os.path.exists(uri)


def test_a_flat_dataset_has_no_path_columns_and_reads_back_through_every_reader(tmp_path, capsys):
    """A flat dataset (no ``name=value`` directory) referenced in place: pyarrow 26 reports its
    Hive partitioning with the dataset's whole schema, which once made every column a "path
    column" that no path holds -- the table's own dataset() then failed (KeyError) and the Delta
    projection published the partition field as null. Now: no path column; a partition field that
    is only a file column is refused in one line (reference mode needs its directories); every
    reader reads the referenced files' own values."""
    from spark_jobs.table import dataset
    from tests.harness.delta_reads import query_delta

    root = tmp_path / "dataset"
    first, second = dataset_rows()
    first, second = first[:40], second[:20]  # without the duplicates, so no file is rewritten
    root.mkdir()
    for name, part in (("a", first), ("b", second)):
        pq.write_table(pa.Table.from_pylist(part, schema=SCHEMA), root / f"{name}.parquet")
    rows = first + second
    before = tree_digest(root)
    refused = str(tmp_path / "refused")
    code, _, err = _run(["bootstrap", refused, str(root), "--record-key", "id", "--precombine-field", "ts",
                         "--partition-field", "region", "--mode", "reference", "--engine", "arrow"], capsys)
    assert code == 2 and len(err) == 1, err
    assert "--mode reference needs the dataset partitioned by region directories" in err[0], err
    assert not os.path.exists(refused)

    uri = str(tmp_path / "table")
    code, out, err = _run(["bootstrap", uri, str(root), "--record-key", "id", "--precombine-field", "ts",
                           "--mode", "reference", "--engine", "arrow", "--mirror", "delta"], capsys)
    assert code == 0, err
    assert out["mode"] == "reference" and out["counts"]["files_referenced"] == 2, out
    t = Table.load(uri)
    assert t.config.reference["path_columns"] == {}
    want = expected(rows)
    assert snapshot(uri) == want
    assert {r["id"]: _comparable(r) for r in dataset(uri).to_table().to_pylist()} == want
    delta = query_delta(uri, 1).select(SCHEMA.names)  # version 1: the bootstrap (sequence 1)
    assert {r["id"]: _comparable(r) for r in delta.to_pylist()} == want
    assert tree_digest(root) == before  # referenced in place, never edited


def test_a_dataset_whose_files_disagree_on_a_type_exits_2_with_one_line(tmp_path, capsys):
    root = tmp_path / "dataset"
    root.mkdir()
    pq.write_table(pa.table({"id": ["a"], "region": pa.array([dt.date(2024, 2, 29)], pa.date32())}),
                   root / "a.parquet")
    (root / "region=eu").mkdir()
    pq.write_table(pa.table({"id": ["b"], "region": ["eu"]}), root / "region=eu" / "b.parquet")
    uri = str(tmp_path / "table")
    code, _, err = _run(["bootstrap", uri, str(root), "--record-key", "id", "--engine", "arrow"], capsys)
    assert code == 2 and len(err) == 1, err
    assert "cannot read the Parquet dataset at" in err[0] and "region" in err[0], err
    assert not os.path.exists(uri)


def test_engine_arrow_refuses_what_only_spark_defines_with_one_line(tmp_path, capsys):
    """A double record key's text is Java's (``1.0E7``): ``--engine arrow`` refuses before
    anything is written; exit 2, one line naming ``--engine spark``."""
    root = tmp_path / "dataset"
    root.mkdir()
    ds.write_dataset(pa.table({"id": [1.5, 1.0e7], "v": [1, 2]}), root, format="parquet")
    uri = str(tmp_path / "table")
    code, _, err = _run(["bootstrap", uri, str(root), "--record-key", "id", "--mode", "rewrite", "--engine", "arrow"],
                        capsys)
    assert code == 2 and len(err) == 1, err
    assert "--engine arrow cannot run this bootstrap" in err[0] and "--engine spark" in err[0], err
    assert not os.path.exists(uri)


def test_engine_arrow_over_a_budget_it_was_given_exits_2_and_writes_nothing(tmp_path, capsys):
    root = tmp_path / "dataset"
    write_dataset(root)
    uri = str(tmp_path / "table")
    before = tree_digest(root)
    code, _, err = _run(["bootstrap", uri, str(root), "--record-key", "id", "--precombine-field", "ts",
                         "--engine", "arrow", "--memory-budget", "1k"], capsys)
    assert code == 2 and len(err) == 1 and "over the 1 KiB budget" in err[0], err
    assert not os.path.exists(uri) and tree_digest(root) == before


class _SparkStarted(Exception):
    """The Spark session factory was called: the run went to Spark."""


def _no_spark():  # the factory engines.bootstrap calls only when it runs Spark
    raise _SparkStarted()


def test_auto_runs_spark_when_the_dataset_would_not_fit_and_says_why(tmp_path, caplog):
    root = tmp_path / "dataset"
    write_dataset(root)
    uri = str(tmp_path / "table")
    opts = BootstrapOptions(table=uri, source=str(root), record_key=["id"], precombine_field="ts",
                            memory_budget="2k")
    with caplog.at_level(logging.INFO, logger="bucketindex.engine"), pytest.raises(_SparkStarted):
        bootstrap(opts, spark=_no_spark)
    assert any("engine: spark (needs about" in m and "over the 2 KiB budget" in m for m in caplog.messages), \
        caplog.messages
    assert not os.path.exists(uri)
    # within the budget: in-process, and the commit says why
    res = bootstrap(BootstrapOptions(table=uri, source=str(root), record_key=["id"], precombine_field="ts"),
                    spark=_no_spark)
    assert res["engine"]["name"] == "arrow" and "within the" in res["engine"]["reason"]


def test_a_rewrite_bootstrap_is_sized_as_the_upsert_of_its_rows(tmp_path, caplog):
    """The listing's rule (compressed bytes x 6) under-stated a 10M-row rewrite 2.6x (docs/benchmarks.md
    "Scale", 10M): a rewrite is one upsert of every row, sized by the upsert's calibrated rule."""
    from spark_jobs.arrow_engine.source import batch_size
    from spark_jobs.arrow_engine.upsert import needed_bytes
    from spark_jobs.engines import IN_MEMORY_EXPANSION, bootstrap_footprint
    from spark_jobs.table.action import bootstrap as action

    root = tmp_path / "flat"
    rows = write_dataset(root, flat=True)
    opts = BootstrapOptions(table=str(tmp_path / "t"), source=str(root), record_key=["id"], precombine_field="ts",
                            index="bucket")  # the bucket index bootstraps by rewrite
    prepared = action.prepare(opts)
    assert prepared.mode == action.MODE_REWRITE
    n, decoded = batch_size(str(root), "parquet")
    assert n == len(rows)
    listing = action.footprint(prepared.source, expansion=IN_MEMORY_EXPANSION)
    upsert_rule = needed_bytes(rows=n, batch_bytes=decoded, table_bytes=0)
    assert upsert_rule > listing and bootstrap_footprint(prepared) == upsert_rule
    # the decision uses it: a budget between the two rules sends the rewrite to Spark
    budget = f"{(listing + upsert_rule) // 2 // 1024}k"
    with caplog.at_level(logging.INFO, logger="bucketindex.engine"), pytest.raises(_SparkStarted):
        bootstrap(BootstrapOptions(**{**opts.__dict__, "memory_budget": budget}), spark=_no_spark)
    assert not os.path.exists(opts.table)
    # a reference bootstrap keeps the listing's rule
    ref = action.prepare(BootstrapOptions(table=str(tmp_path / "r"), source=str(root), record_key=["id"],
                                          precombine_field="ts"))
    assert ref.mode == action.MODE_REFERENCE and bootstrap_footprint(ref) == action.footprint(
        ref.source, expansion=IN_MEMORY_EXPANSION)


def test_a_hive_dataset_is_sized_from_its_footers_listed_once(tmp_path, monkeypatch):
    """A Hive layout is sized as a flat one is, from the files ``prepare`` listed: no second
    listing of the source (the rule once fell back to the listing's for any Hive layout)."""
    from spark_jobs.arrow_engine import source as source_module
    from spark_jobs.arrow_engine.upsert import needed_bytes
    from spark_jobs.engines import IN_MEMORY_EXPANSION, bootstrap_footprint
    from spark_jobs.table.action import bootstrap as action

    root = tmp_path / "hive"
    rows = write_dataset(root)
    prepared = action.prepare(BootstrapOptions(table=str(tmp_path / "t"), source=str(root), record_key=["id"],
                                               precombine_field="ts", index="bucket"))
    assert prepared.mode == action.MODE_REWRITE and prepared.source.path_columns == ["region"]
    monkeypatch.setattr(source_module, "_source_files", lambda *a: pytest.fail("the source was listed again"))
    n, decoded = source_module.parquet_size(resolve(str(root))[0], [(f.path, f.size) for f in prepared.source.files])
    assert n == len(rows)
    assert bootstrap_footprint(prepared) == needed_bytes(rows=n, batch_bytes=decoded, table_bytes=0) > \
        action.footprint(prepared.source, expansion=IN_MEMORY_EXPANSION)


def test_a_rewrite_whose_rows_decode_over_the_budget_goes_to_spark_before_writing(tmp_path, caplog):
    """Footers count a dictionary-encoded value once: a dataset of one long repeated value looks
    small until it is read. The rewrite checks the rows it read against the budget ``auto``
    chose by and hands the work to Spark before anything is written."""
    from spark_jobs.arrow_engine.upsert import needed_bytes
    from spark_jobs.engines import bootstrap_footprint
    from spark_jobs.table.action import bootstrap as action

    root = tmp_path / "repeated"
    n = 20_000
    for part in ("eu west", "東京 +%"):
        (root / f"region={part}").mkdir(parents=True)
        note = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array(["x" * 2000]))
        pq.write_table(pa.table({"id": [f"{part}/{i}" for i in range(n)], "ts": list(range(n)), "note": note}),
                       root / f"region={part}" / "part-0.parquet", compression="zstd", store_schema=False)
    opts = BootstrapOptions(table=str(tmp_path / "t"), source=str(root), record_key=["id"], precombine_field="ts",
                            partition_field="region", index="bucket")
    estimated = bootstrap_footprint(action.prepare(opts))
    exact = needed_bytes(rows=2 * n, batch_bytes=ds.dataset(root, partitioning="hive").to_table().nbytes,
                         table_bytes=0)
    assert exact - estimated > 100 * 2**20  # 80 MB of text the footers do not show, held more than once
    budget = f"{(estimated + exact) // 2 // 1024}k"
    with caplog.at_level(logging.INFO, logger="bucketindex.engine"), pytest.raises(_SparkStarted):
        bootstrap(BootstrapOptions(**{**opts.__dict__, "memory_budget": budget}), spark=_no_spark)
    assert any("engine: spark (the arrow engine cannot run this bootstrap (the dataset (40000 rows) decodes to"
               in m for m in caplog.messages), caplog.messages
    assert not os.path.exists(opts.table)
    # --engine arrow with that budget: one line naming the budget, nothing written
    with pytest.raises(EngineUnsupportedError, match="over the .* budget"):
        bootstrap(BootstrapOptions(**{**opts.__dict__, "memory_budget": budget, "engine": "arrow"}), spark=_no_spark)
    assert not os.path.exists(opts.table)


def test_auto_falls_back_to_spark_when_arrow_cannot_run_it(tmp_path, caplog):
    root = tmp_path / "dataset"
    root.mkdir()
    ds.write_dataset(pa.table({"id": [1.5, 1.0e7], "v": [1, 2]}), root, format="parquet")
    uri = str(tmp_path / "table")
    opts = BootstrapOptions(table=uri, source=str(root), record_key=["id"], mode="rewrite")
    with caplog.at_level(logging.INFO, logger="bucketindex.engine"), pytest.raises(_SparkStarted):
        bootstrap(opts, spark=_no_spark)
    assert any("the arrow engine cannot run this bootstrap" in m for m in caplog.messages), caplog.messages
    assert not os.path.exists(uri)


def _cli(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spark_jobs.cli", *args], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize("mode,point", [
    ("reference", "before_complete"),  # index written, commit point not reached
    ("reference", "after_index_file"),
    ("reference", "after_data_file"),  # a file with a losing duplicate being rewritten
    ("rewrite", "after_data_file"),
    ("rewrite", "after_index_file"),
])
def test_killed_arrow_bootstrap_leaves_no_rows_and_the_next_run_finishes(tmp_path, capsys, mode, point):
    root = tmp_path / "dataset"
    rows = write_dataset(root)
    uri = str(tmp_path / "table")
    args = ["bootstrap", uri, str(root), "--record-key", "id", "--partition-field", "region",
            "--precombine-field", "ts", "--mode", mode, "--engine", "arrow"]
    p = _cli(args, {"BUCKETINDEX_FAULT": point})
    _, err = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL, (p.returncode, err[-2000:])
    table = Table.load(uri)
    assert table.view().num_rows == 0 and read_arrow(uri).num_rows == 0  # readers see no snapshot
    assert [i.action for i in table.timeline.pending()] == ["bootstrap"]

    time.sleep(0.2)
    code, res, err = _run([*args, "--heartbeat-timeout", "0.1"], capsys)
    assert code == 0 and not res["noop"], err
    table = Table.load(uri)
    assert not table.timeline.pending()
    assert snapshot(uri) == expected(rows)
    assert run_validate(uri)["ok"]
    assert not table.io.list_names(table.layout.markers)
    on_disk = {str(q.relative_to(uri)) for ext in ("*.parquet", "*.arrow") for q in Path(uri).rglob(ext)}
    assert on_disk <= FileSystemView.at_seq(table.timeline, table.timeline.last_seq).all_files()
