"""What a spark-submit of a bucketindex job needs from the Airflow worker's environment.

* the entry script ``spark_jobs/submit.py`` of the *installed* ``spark_jobs`` package;
* that package as a zip for ``--py-files`` (so executors on other machines import the
  same code), built from the installed package directory and cached by content hash;
* a ``spark-submit`` binary -- a pip-installed pyspark puts it in the environment's
  ``bin/``, which is not necessarily on PATH (the Spark provider only searches PATH);
* the Python interpreter for ``PYSPARK_PYTHON`` (executors otherwise start ``python3``
  from PATH, which may lack pyarrow).

Nothing here imports ``pyspark`` or Airflow, and of ``spark_jobs`` only the stdlib-only
:mod:`spark_jobs.shipping` (which builds the zip): packages are located with
:func:`importlib.util.find_spec`, which does not execute them.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig

__all__ = [
    "ALLOWED_SPARK_BINARIES",
    "SparkBinaryNotFound",
    "package_dir",
    "spark_jobs_zip",
    "submit_script",
    "resolve_spark_binary",
    "python_for_spark",
]

#: Same allow-list as the Spark provider: a connection editor must not be able to run
#: an arbitrary program on the worker.
ALLOWED_SPARK_BINARIES = ("spark-submit", "spark2-submit", "spark3-submit")
ZIP_CACHE_DIR_NAME = "bucketindex-pyfiles"


class SparkBinaryNotFound(FileNotFoundError):
    pass


def package_dir(name: str = "spark_jobs") -> str:
    """The directory of the installed package ``name`` (without importing it)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {name!r} is not installed in {sys.prefix}")
    return os.path.realpath(list(spec.submodule_search_locations)[0])


def submit_script() -> str:
    """``.../spark_jobs/submit.py``: the spark-submit entry point of every bucketindex job."""
    return os.path.join(package_dir("spark_jobs"), "submit.py")


def spark_jobs_zip(cache_dir: str | None = None, package: str = "spark_jobs") -> str:
    """Path of a zip of the installed ``spark_jobs`` package (``spark_jobs/`` as its top folder).

    The zip is named by a hash of the package's file names and contents and kept in
    ``<tmp>/bucketindex-pyfiles/``; an unchanged package reuses the existing zip, an
    edited one gets a new zip. Written to a temp name and renamed, so concurrent tasks
    never ship a half-written zip. (The zip itself is built by :mod:`spark_jobs.shipping`,
    stdlib only, which the Spark Connect path uses too.)
    """
    from spark_jobs.shipping import zip_package

    return zip_package(package_dir(package), cache_dir)


def _env_bin_dirs() -> list[str]:
    """bin/ directories of the running interpreter's environment (venv first)."""
    dirs = [os.path.dirname(os.path.abspath(sys.executable)), sysconfig.get_path("scripts")]
    out: list[str] = []
    for d in dirs:
        if d and d not in out:
            out.append(d)
    return out


def resolve_spark_binary(binary: str = "spark-submit", *, path: str | None = None) -> str:
    """Absolute path of ``binary`` (one of :data:`ALLOWED_SPARK_BINARIES`).

    Looked up, in order: the running interpreter's environment ``bin/`` (where
    ``pip install pyspark`` puts it, matching the pyspark the jobs were tested with),
    then ``PATH``, then ``pyspark/bin`` inside the installed pyspark package.
    """
    if binary not in ALLOWED_SPARK_BINARIES:
        raise ValueError(f"spark binary must be one of {', '.join(ALLOWED_SPARK_BINARIES)}, got {binary!r}")
    for d in _env_bin_dirs():
        cand = os.path.join(d, binary)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    found = shutil.which(binary, path=path)
    if found:
        return os.path.abspath(found)
    try:
        cand = os.path.join(package_dir("pyspark"), "bin", binary)
    except ModuleNotFoundError:
        cand = ""
    if cand and os.path.isfile(cand):
        return cand
    raise SparkBinaryNotFound(
        f"{binary} not found in {', '.join(_env_bin_dirs())}, on PATH, or in an installed pyspark; "
        f"install pyspark into the Airflow worker's environment or put {binary} on PATH"
    )


def python_for_spark(configured: str | None = None) -> str:
    """The interpreter Spark should start for the driver and the Python workers."""
    return configured or sys.executable
