"""What a cold ``bucketindex`` process imports (issue 38): the Arrow engine's verbs load neither
pandas (a third of a second of a 200-row upsert, through pyarrow's lazy pandas probes) nor
pyspark, and give the table the in-process API and the oracle give.

Each CLI run here is a new interpreter started the way the console script starts it
(``main()`` with no argv: the process is the program), with no Java reachable; the wrapper
fails the run when pandas or pyspark is in ``sys.modules`` at the end.
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

#: the console script's call (``sys.exit(main())``), then: nothing of pandas or pyspark loaded
AS_THE_PROGRAM = ("import sys; from airflow_provider_bucketindex.cli import main; rc = main(); "
                  "loaded = [m for m in ('pandas', 'pyspark') if m in sys.modules]; "
                  "assert not loaded, f'the CLI imported {loaded}'; sys.exit(rc)")
#: ``python -m spark_jobs.cli``, the table layer's own entry point, checked the same way
AS_THE_MODULE = ("import runpy, sys; sys.argv[0] = 'bucketindex'\n"
                 "try:\n    runpy.run_module('spark_jobs.cli', run_name='__main__')\n"
                 "except SystemExit as e:\n    rc = e.code\n"
                 "loaded = [m for m in ('pandas', 'pyspark') if m in sys.modules]\n"
                 "assert not loaded, f'the CLI imported {loaded}'; sys.exit(rc)")


def _cold(*args: str, program: str = AS_THE_PROGRAM) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    p = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=180,
                       env=_no_java_env())
    assert "the CLI imported" not in p.stderr, p.stderr[-2000:]
    assert p.returncode == 0, p.stderr[-3000:]
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
