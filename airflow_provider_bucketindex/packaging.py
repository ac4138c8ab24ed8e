"""What a spark-submit of a bucketindex job needs from the Airflow worker's environment.

* the entry script ``spark_jobs/submit.py`` of the *installed* ``spark_jobs`` package;
* that package as a zip for ``--py-files`` (so executors on other machines import the
  same code), built from the installed package directory and cached by content hash;
* a ``spark-submit`` binary -- a pip-installed pyspark puts it in the environment's
  ``bin/``, which is not necessarily on PATH (the Spark provider only searches PATH);
* the Python interpreter for ``PYSPARK_PYTHON`` (executors otherwise start ``python3``
  from PATH, which may lack pyarrow).

Nothing here imports ``pyspark``, ``spark_jobs`` or Airflow: packages are located with
:func:`importlib.util.find_spec`, which does not execute them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
import zipfile

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
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same files always give the same bytes


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


def _package_files(root: str) -> list[tuple[str, str]]:
    """(absolute path, archive name) of every file of the package, sorted, archive names
    starting with the package folder name."""
    top = os.path.basename(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for fn in sorted(filenames):
            if fn.endswith(_SKIP_SUFFIXES) or fn.startswith("."):
                continue
            full = os.path.join(dirpath, fn)
            arc = "/".join([top, *os.path.relpath(full, root).split(os.sep)])
            out.append((full, arc))
    return sorted(out, key=lambda p: p[1])


def spark_jobs_zip(cache_dir: str | None = None, package: str = "spark_jobs") -> str:
    """Path of a zip of the installed ``spark_jobs`` package (``spark_jobs/`` as its top folder).

    The zip is named by a hash of the package's file names and contents and kept in
    ``<tmp>/bucketindex-pyfiles/``; an unchanged package reuses the existing zip, an
    edited one gets a new zip. Written to a temp name and renamed, so concurrent tasks
    never ship a half-written zip.
    """
    root = package_dir(package)
    files = _package_files(root)
    if not any(arc == f"{os.path.basename(root)}/__init__.py" for _, arc in files):
        raise ModuleNotFoundError(f"{root} has no __init__.py; cannot ship it as a package")
    digest = hashlib.sha256()
    contents = []
    for full, arc in files:
        with open(full, "rb") as f:
            data = f.read()
        contents.append((arc, data))
        digest.update(arc.encode() + b"\0" + hashlib.sha256(data).digest())
    cache = cache_dir or os.path.join(tempfile.gettempdir(), ZIP_CACHE_DIR_NAME)
    os.makedirs(cache, exist_ok=True)
    target = os.path.join(cache, f"{package}-{digest.hexdigest()[:20]}.zip")
    if os.path.exists(target):
        return target
    fd, tmp = tempfile.mkstemp(prefix=f".{package}-", suffix=".zip.tmp", dir=cache)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
            for arc, data in contents:
                info = zipfile.ZipInfo(arc, date_time=_ZIP_DATE)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, data)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


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
