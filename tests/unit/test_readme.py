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


def test_ci_runs_the_ci_and_release_tiers_after_the_readme_command_and_the_readme_says_so():
    """The default run leaves the CI and release tiers out; CI runs both (the issue: every tier,
    the extended crash matrix included, in ``.ci/run``) after the README's command; the README
    names each tier's command and CI's."""
    import configparser

    readme = (ROOT / "README.md").read_text()
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    tiers = '.venv/bin/python -m pytest -m "ci or slow" -n 3'
    assert ci.index(tiers) > ci.index(TEST_COMMAND)
    assert [line for line in ci if "pytest" in line and not line.startswith("#")] == [TEST_COMMAND, tiers]
    for command in (".venv/bin/python -m pytest -m ci", ".venv/bin/python -m pytest -m slow"):
        assert f"`{command}`" in readme
    assert '`-m "ci or slow" -n 3`' in readme
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert '-m "not slow and not ci"' in cfg["tool:pytest"]["addopts"]


def test_readme_main_command_runs_the_demo():
    assert DEMO_COMMAND in (ROOT / "README.md").read_text()


def test_readme_names_the_operators_that_exist():
    import airflow_provider_bucketindex.operators as ops

    readme = (ROOT / "README.md").read_text()
    for name in ("UpsertWithIndexOperator", "ValidateTableOperator", "RollbackBatchOperator",
                 "AsyncIndexCompactionOperator", "CleanTableOperator", "RehashOperator",
                 "IndexShadowCompareOperator"):
        assert name in readme and hasattr(ops, name)
