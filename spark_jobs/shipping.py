"""The ``spark_jobs`` package as a zip for Spark's Python workers (pure Python, stdlib only).

Two paths ship the same zip: ``spark-submit --py-files`` (the Airflow provider, see
``airflow_provider_bucketindex.packaging``) and Spark Connect's ``addArtifacts(...,
pyfile=True)`` (:mod:`spark_jobs.jobs.connect`). The zip is named by a hash of the
package's file names and contents, so an unchanged package reuses it and the bytes are
the same on every machine (fixed timestamps).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile

__all__ = ["ZIP_CACHE_DIR_NAME", "package_files", "zip_package"]

ZIP_CACHE_DIR_NAME = "bucketindex-pyfiles"
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same files always give the same bytes


def package_files(root: str) -> list[tuple[str, str]]:
    """(absolute path, archive name) of every file of the package at ``root``, sorted,
    archive names starting with the package folder name."""
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


def zip_package(root: str, cache_dir: str | None = None) -> str:
    """Path of a zip of the package directory ``root`` (its folder name on top).

    Kept in ``<tmp>/bucketindex-pyfiles/`` (or ``cache_dir``) under a content-hash name;
    written to a temp name and renamed, so concurrent callers never ship a half-written zip.
    """
    name = os.path.basename(root)
    files = package_files(root)
    if not any(arc == f"{name}/__init__.py" for _, arc in files):
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
    target = os.path.join(cache, f"{name}-{digest.hexdigest()[:20]}.zip")
    if os.path.exists(target):
        return target
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".zip.tmp", dir=cache)
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
