"""What the provider ships to Spark: the spark_jobs zip (from the installed package, cached
by content), the entry script, spark-submit lookup, and no pyspark import anywhere."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile

import pytest

from airflow_provider_bucketindex import packaging

pytestmark = pytest.mark.unit


def test_zip_is_the_installed_spark_jobs_package_with_spark_jobs_on_top():
    path = packaging.spark_jobs_zip()
    installed = packaging.package_dir("spark_jobs")
    names = zipfile.ZipFile(path).namelist()
    assert {"spark_jobs/__init__.py", "spark_jobs/submit.py", "spark_jobs/cli.py", "spark_jobs/table/table.py"} <= set(names)
    assert all(n.startswith("spark_jobs/") for n in names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    on_disk = {
        os.path.relpath(os.path.join(d, f), os.path.dirname(installed)).replace(os.sep, "/")
        for d, dirs, fs in os.walk(installed)
        for f in fs
        if "__pycache__" not in d and not f.endswith(".pyc") and not f.startswith(".")
    }
    assert set(names) == on_disk
    with zipfile.ZipFile(path) as zf:
        assert zf.read("spark_jobs/submit.py") == open(os.path.join(installed, "submit.py"), "rb").read()


def test_entry_script_is_inside_the_installed_package():
    assert packaging.submit_script() == os.path.join(packaging.package_dir("spark_jobs"), "submit.py")
    assert os.path.isfile(packaging.submit_script())


def test_zip_is_cached_by_content_and_rebuilt_when_the_package_changes(tmp_path, monkeypatch):
    pkg = tmp_path / "src" / "bi_fake_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    importlib.invalidate_caches()
    cache = str(tmp_path / "cache")

    first = packaging.spark_jobs_zip(cache, package="bi_fake_pkg")
    again = packaging.spark_jobs_zip(cache, package="bi_fake_pkg")
    assert first == again and os.path.dirname(first) == cache
    assert sorted(zipfile.ZipFile(first).namelist()) == ["bi_fake_pkg/__init__.py", "bi_fake_pkg/sub/__init__.py"]
    (pkg / "__init__.py").write_text("X = 2\n")
    changed = packaging.spark_jobs_zip(cache, package="bi_fake_pkg")
    assert changed != first
    assert zipfile.ZipFile(changed).read("bi_fake_pkg/__init__.py") == b"X = 2\n"
    assert sorted(os.listdir(cache)) == sorted([os.path.basename(first), os.path.basename(changed)])  # no temp files


def test_zip_bytes_are_deterministic(tmp_path):
    a = packaging.spark_jobs_zip(str(tmp_path / "a"))
    b = packaging.spark_jobs_zip(str(tmp_path / "b"))
    assert open(a, "rb").read() == open(b, "rb").read()


def test_spark_submit_found_without_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    found = packaging.resolve_spark_binary("spark-submit")
    assert found == os.path.join(os.path.dirname(sys.executable), "spark-submit")
    assert os.access(found, os.X_OK)


def test_spark_submit_falls_back_to_path_then_pyspark_bin(tmp_path, monkeypatch):
    monkeypatch.setattr(packaging, "_env_bin_dirs", lambda: [str(tmp_path / "empty")])
    on_path = tmp_path / "bin"
    on_path.mkdir()
    fake = on_path / "spark3-submit"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert packaging.resolve_spark_binary("spark3-submit", path=str(on_path)) == str(fake)
    pyspark_bin = os.path.join(packaging.package_dir("pyspark"), "bin", "spark-submit")
    assert packaging.resolve_spark_binary("spark-submit", path=str(on_path)) == pyspark_bin
    with pytest.raises(packaging.SparkBinaryNotFound):
        packaging.resolve_spark_binary("spark2-submit", path=str(on_path))


def test_only_known_spark_binaries(tmp_path):
    with pytest.raises(ValueError):
        packaging.resolve_spark_binary("/bin/sh")


def test_python_for_spark_defaults_to_this_interpreter():
    assert packaging.python_for_spark() == sys.executable
    assert packaging.python_for_spark("/opt/py") == "/opt/py"


def test_provider_never_imports_pyspark(tmp_path):
    """Import every provider module (and parse the example DAG) in a fresh interpreter."""
    code = (
        "import sys\n"
        "import airflow_provider_bucketindex, airflow_provider_bucketindex.cli\n"
        "from airflow_provider_bucketindex import batch, packaging\n"
        "from airflow_provider_bucketindex.demo import runner, sample_data, sandbox\n"
        "from airflow_provider_bucketindex.hooks import bucketindex\n"
        "from airflow_provider_bucketindex.operators import base, upsert, validate, rollback, compaction, clean\n"
        "from airflow_provider_bucketindex.sensors import table_state as sensors\n"
        "from airflow_provider_bucketindex.triggers import table_state as triggers\n"
        "import airflow_provider_bucketindex.dags.bucketindex_ingest\n"
        "import airflow_provider_bucketindex.dags.bucketindex_nightly_compaction\n"
        "h = bucketindex.BucketIndexHook(); h.build_command('validate', ['/t']); h.pending_instants('/nowhere')\n"
        "from spark_jobs.table.state import compaction_due, pending_writes, find_commit\n"
        "from spark_jobs.table.action.clean import run_clean  # CleanTableOperator runs it in the task\n"
        "bad = sorted(m for m in sys.modules if m == 'pyspark' or m.startswith('pyspark.'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(tmp_path / "home"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{tmp_path / 'home' / 'airflow.db'}",
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
