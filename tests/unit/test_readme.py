"""The README's two commands are the ones CI and users run: keep them true."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TEST_COMMAND = "python3.11 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
DEMO_COMMAND = "python3.11 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/bucketindex demo"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert TEST_COMMAND in readme
    assert TEST_COMMAND in ci.splitlines()


def test_readme_main_command_runs_the_demo():
    assert DEMO_COMMAND in (ROOT / "README.md").read_text()


def test_readme_names_the_operators_that_exist():
    import airflow_provider_bucketindex.operators as ops

    readme = (ROOT / "README.md").read_text()
    for name in ("UpsertWithIndexOperator", "ValidateTableOperator", "RollbackBatchOperator",
                 "AsyncIndexCompactionOperator", "CleanTableOperator", "RehashOperator",
                 "IndexShadowCompareOperator"):
        assert name in readme and hasattr(ops, name)
