"""What a cold ``bucketindex`` process imports (issue 38): the Arrow engine's verbs load neither
pandas (a third of a second of a 200-row upsert, through pyarrow's lazy pandas probes) nor
pyspark, and give the table the in-process API and the oracle give.

Each CLI run here is a new interpreter started the way the console script starts it
(``main()`` with no argv: the process is the program), with no Java reachable; the wrapper
fails the run when pandas, pyspark or airflow (or, for the upsert into an existing table, a
module made lazy for it: :data:`LAZY`) is in ``sys.modules`` where the program ends -- when
``main`` returns, or in ``os._exit``, by which the program ends itself after its work.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.table.reader import read_arrow
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_arrow_engine import B1, B2, _no_java_env, _upsert_args, _utc, _write

#: modules a cold Arrow run of the program must not load: pandas and pyspark (issue 38), Airflow
#: (the provider's side), and what the Arrow upsert of a Parquet batch was made to load lazily
#: (session 44): ``pyarrow.dataset`` (``pq.read_table`` built a dataset for one file: 15-40 ms),
#: the CSV and JSON readers (only a CSV or JSON batch needs them) and the tee's module; and (h3):
#: ``numpy.ma`` (14-25 ms: ``pa.array(ndarray)`` and ``np.unique`` load it; the engine hands its
#: arrays over with ``spark_jobs.io.arrays``), the Delta projection's module (a table without
#: mirrors needs only ``config.table_mirrors``) and Spark's sizing rules (``spark_jobs.resources``:
#: a read that succeeds does not ask whether it ran out of memory)
NOT_LOADED = ("pandas", "pyspark", "airflow")
LAZY = ("pyarrow.dataset", "pyarrow.csv", "pyarrow.json", "csv", "spark_jobs.table.shadow",
        "numpy.ma", "spark_jobs.table.delta", "spark_jobs.resources")

#: checked where the program ends: when ``main`` returns, and in ``os._exit``, by which the
#: program ends itself after its work (``spark_jobs.cli._end_process``); prints ``ended-by``
_CHECK = ("import os, sys\n"
          "NOT_LOADED = {modules!r}\n"
          "def check(how):\n"
          "    loaded = [m for m in NOT_LOADED if m in sys.modules]\n"
          "    print(f'ended-by {{how}}', file=sys.stderr)\n"
          "    assert not loaded, f'the CLI imported {{loaded}}'\n"
          "real_exit = os._exit\n"
          "def fast_exit(code):\n"
          "    try:\n        check('os._exit')\n"
          "    except AssertionError as e:\n        print(e, file=sys.stderr); sys.stderr.flush(); real_exit(97)\n"
          "    sys.stderr.flush(); real_exit(code)\n"
          "os._exit = fast_exit\n")


def as_the_program(modules: tuple[str, ...] = NOT_LOADED) -> str:
    """The console script's call (``sys.exit(main())``), then: none of ``modules`` loaded."""
    return (_CHECK.format(modules=modules)
            + "from airflow_provider_bucketindex.cli import main\nrc = main()\ncheck('return')\nsys.exit(rc)\n")


def as_the_module(modules: tuple[str, ...] = NOT_LOADED) -> str:
    """``python -m spark_jobs.cli``, the table layer's own entry point, checked the same way."""
    return (_CHECK.format(modules=modules)
            + "import runpy; sys.argv[0] = 'bucketindex'\n"
              "try:\n    runpy.run_module('spark_jobs.cli', run_name='__main__')\n"
              "except SystemExit as e:\n    rc = e.code\n"
              "check('return'); sys.exit(rc)\n")


AS_THE_PROGRAM = as_the_program()
AS_THE_MODULE = as_the_module()


def _cold(*args: str, program: str = AS_THE_PROGRAM) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    p = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=180,
                       env=_no_java_env())
    assert "the CLI imported" not in p.stderr, p.stderr[-2000:]
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ended-by " in p.stderr, p.stderr[-2000:]  # the check ran, whichever way the program ended
    return p


@pytest.mark.parametrize("program", [AS_THE_PROGRAM, AS_THE_MODULE], ids=["console-script", "python-m"])
def test_cold_arrow_verbs_import_neither_pandas_nor_pyspark(tmp_path: Path, program: str) -> None:
    uri = str(tmp_path / "t")
    for i, rows in enumerate([B1, B2]):  # a partitioned merge-on-read table, deletes in the second batch
        p = _cold(*_upsert_args(uri, _write(tmp_path / f"b{i}.parquet", rows), f"b{i}"), program=program)
        assert json.loads(p.stdout.strip().splitlines()[-1])["engine"] == "arrow"
    expected = _utc(reduce_batches([B1, B2]))
    assert _utc(rows_by_identity(read_arrow(uri).to_pylist())) == expected

    out = tmp_path / "snapshot.parquet"
    p = _cold("read", uri, "--output", str(out), program=program)
    assert p.stdout.strip() == f"wrote {len(expected)} rows to {out}"
    assert _utc(rows_by_identity(pq.read_table(out).to_pylist())) == expected
    p = _cold("read", uri, "--limit", "5", program=program)
    assert "k" in p.stdout and "/%+é" in p.stdout, p.stdout  # the printed rows, keys as written
    p = _cold("validate", uri, program=program)
    assert json.loads(p.stdout)["ok"] is True and json.loads(p.stdout)["rows"] == len(expected)
    _cold("show", uri, program=program)
    _cold("compact", uri, program=program)
    _cold("rehash", uri, "--num-buckets", "32", program=program)
    _cold("clean", uri, program=program)
    # the maintenance verbs changed the layout, not the rows
    assert _utc(rows_by_identity(read_arrow(uri).to_pylist())) == expected
    assert run_validate(uri)["ok"]


def test_a_program_that_calls_main_keeps_pyarrow_seeing_pandas(tmp_path: Path) -> None:
    """``main(argv)`` from a user's program (or ``run_cli`` in a test) is the library: pyarrow's
    pandas integration must stay as it is there (a pandas Series is array-like to ``pa.array``)."""
    src = _write(tmp_path / "b.parquet", B1)
    code = ("import sys; from spark_jobs.cli import main\n"
            f"assert main({_upsert_args(str(tmp_path / 't'), src, 'b')!r}) == 0\n"
            "import pandas as pd, pyarrow as pa\n"
            "assert pa.lib._pandas_api.have_pandas\n"
            "assert pa.array(pd.Series(pd.Categorical(['a b', 'é/%']))).type == pa.dictionary(pa.int8(), pa.string())\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=_no_java_env())
    assert p.returncode == 0, p.stderr[-3000:]


def test_pandas_comes_back_when_work_asks_for_it() -> None:
    """After the program kept pandas out, a Spark verb's start (``_allow_pandas``) or an explicit
    ``to_pandas``/``from_pandas`` finds it: round trips of users' values are exact."""
    code = ("import sys; from spark_jobs import cli\n"
            "cli._defer_pandas()\n"
            "import pyarrow as pa\n"
            "t = pa.table({'id': ['k /%+é', '', None], 'n': [1, None, 3]})\n"
            "assert 'pandas' not in sys.modules\n"
            "cli._allow_pandas()\n"
            "import pandas as pd\n"
            "assert pa.lib._pandas_api.have_pandas\n"
            "assert pa.Table.from_pandas(t.to_pandas(), schema=t.schema, preserve_index=False).equals(t)\n"
            "assert pa.array(pd.Series(pd.Categorical(['x']))).type == pa.dictionary(pa.int8(), pa.string())\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_no_java_env())
    assert p.returncode == 0, p.stderr[-3000:]


#: the program's help and usage errors: nothing of the table core's heavy imports
NO_PYARROW = ("import sys; from airflow_provider_bucketindex.cli import main\n"
              "try:\n    rc = main()\nexcept SystemExit as e:\n    rc = e.code\n"
              "loaded = [m for m in ('pyarrow', 'numpy', 'pandas', 'pyspark') if m in sys.modules]\n"
              "assert not loaded, f'the CLI imported {loaded}'; sys.exit(rc)")


@pytest.mark.parametrize("argv, status, shown", [
    (["--help"], 0, "upsert"),
    (["upsert", "--help"], 0, "{record,bucket,global_simple}"),  # the choices, from spark_jobs.vocabulary
    (["read", "--help"], 0, "Accepts an instant"),
    (["upsert", "t a/b%c"], 2, "bucketindex: error: the following arguments are required: source"),
    (["upsert", "t", "b.parquet", "--index", "hash é"], 2, "invalid choice: 'hash é'"),
], ids=["help", "upsert-help", "read-help", "missing-source", "bad-choice"])
def test_help_and_usage_errors_load_no_pyarrow(argv: list[str], status: int, shown: str) -> None:
    """``bucketindex --help`` and a usage error (exit 2, one line) answer from the parser alone:
    pyarrow and numpy (about 0.4 s of a cold process) are not loaded."""
    p = subprocess.run([sys.executable, "-c", NO_PYARROW, *argv], capture_output=True, text=True, timeout=60,
                       env=_no_java_env())
    assert "the CLI imported" not in p.stderr, p.stderr[-2000:]
    assert p.returncode == status, p.stderr[-2000:]
    assert shown in (p.stdout if status == 0 else p.stderr), (p.stdout[-2000:], p.stderr[-2000:])
    if status == 2:
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_cold_arrow_upsert_into_an_existing_table_loads_only_what_it_needs(tmp_path: Path, table_type: str) -> None:
    """The cold upsert of a Parquet batch into an existing table (issue 38's 0.4 s case): besides
    pandas, pyspark and Airflow, none of the modules made lazy for it is loaded (:data:`LAZY`),
    the program ends itself once its output is written (``ended-by os._exit``), and the table
    holds what the in-process API and the oracle say. On the code before, ``pyarrow.dataset``
    (each merge's base file read), ``csv``, ``pyarrow.csv`` and ``pyarrow.json`` (the source
    module) and the tee's module were loaded, and the process went through the interpreter's
    teardown; before h3's change, ``numpy.ma``, ``spark_jobs.table.delta`` and
    ``spark_jobs.resources`` were."""
    uri = str(tmp_path / "t")
    args = ["--record-key", "id", "--precombine-field", "ts", "--partition-field", "region",
            "--delete-field", "is_deleted", "--table-type", table_type, "--target-file-rows", "50"]
    _cold("upsert", uri, _write(tmp_path / "b1.parquet", B1), *args)
    # the second batch updates stored keys (their file groups are read and merged, or get a log),
    # inserts new ones and deletes some: without the options the table fixed, as a later run gives it
    p = _cold("upsert", uri, _write(tmp_path / "b2.parquet", B2), "--delete-field", "is_deleted",
              program=as_the_program(NOT_LOADED + LAZY))
    assert "ended-by os._exit" in p.stderr, p.stderr[-2000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["engine"] == "arrow" and result["noop"] is False
    assert result["counts"]["updated"] > 0 and result["counts"]["inserted"] > 0 and result["counts"]["deleted"] > 0
    expected = _utc(reduce_batches([B1, B2]))
    assert _utc(rows_by_identity(read_arrow(uri).to_pylist())) == expected
    assert run_validate(uri)["ok"]


def test_a_program_that_calls_main_returns_and_keeps_its_interpreter() -> None:
    """Only the program itself ends its process early: ``main(argv)`` called by a user's program
    (or a test) returns its status, and the caller's code after it runs."""
    code = ("import os, sys\nfrom spark_jobs.cli import main\n"
            "os._exit = lambda code: (print('os._exit called', file=sys.stderr), sys.exit(98))\n"
            "rc = main(['rollback', '/nonexistent-table é'])\n"
            "print(f'returned {rc}')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_no_java_env())
    assert p.returncode == 0 and "os._exit called" not in p.stderr, p.stderr[-2000:]
    assert p.stdout.strip() == "returned 2", (p.stdout, p.stderr[-2000:])  # no table there: bad input


#: command lines of every verb, as users give them (options in any order, values with spaces and %)
ARGVS = [
    ["upsert", "t a/b%c", "b.parquet", "--record-key", "id,region", "--precombine-field", "ts", "--index", "bucket",
     "--num-buckets", "8", "--engine", "arrow", "--storage-option", "region=eu-west-1", "--schema-evolution", "all"],
    ["-v", "read", "t", "--as-of", "2026-11-25T09:24:00", "--limit", "5", "--memory-budget", "1g"],
    ["show", "t", "--json"],
    ["validate", "t", "--master", "local[2]"],
    ["shadow-compare", "t", "--against", "bucket", "--since", "20261125092400000", "--sample-fraction", "0.5"],
    ["rollback", "t", "20261125092400000", "--force"],
    ["compact", "t", "--schedule-only", "--only", "index", "--min-deltas", "3"],
    ["clean", "t", "--retain-hours", "1.5", "--dry-run"],
    ["alter", "t", "--add-column", "discount:decimal(10,2)", "--widen-column", "qty:bigint"],
    ["rehash", "t", "--num-buckets", "32"],
    ["bootstrap", "t", "src dir", "--record-key", "id", "--mode", "reference"],
    ["mirror", "t", "--enable", "delta"],
]


@pytest.mark.parametrize("argv", ARGVS, ids=[a[0] if a[0] != "-v" else a[1] for a in ARGVS])
def test_the_parser_of_one_verb_parses_as_the_full_parser(argv: list[str]) -> None:
    """A run builds the arguments of its own verb only (``build_parser(verbs=...)``: argparse
    formats every argument as it is added, 15-25 ms of a cold run for all twelve verbs); what it
    parses, and the verb's help, are the full parser's."""
    from spark_jobs.cli import build_parser, verb_of

    verb = verb_of(argv)
    one = build_parser(verbs=(verb,))
    full = build_parser()
    assert vars(one.parse_args(argv)) == vars(full.parse_args(argv))

    def sub(parser: object, name: str) -> object:
        action = next(a for a in parser._actions if a.dest == "verb")  # type: ignore[attr-defined]
        return action.choices[name]

    assert sub(one, verb).format_help() == sub(full, verb).format_help()
    assert one.format_help() == full.format_help()  # every verb still listed, with its help
    others = [name for name in ("upsert", "read", "compact") if name != verb]
    for name in others:  # the other verbs' arguments were not built: only -h
        assert [a.dest for a in sub(one, name)._actions] == ["help"]  # type: ignore[attr-defined]
