"""Filesystem access for the table format: one small interface, one implementation per backend.

The names below are loaded on first use (PEP 562), as the package root does: importing a
submodule (``spark_jobs.io.storage``, the storage options every Airflow operator, sensor and
trigger module needs) runs this ``__init__`` first, and an eager import of
:mod:`spark_jobs.io.filesystem` here made each of them -- so every DAG file the Airflow DAG
processor parses -- load pyarrow and numpy (issue 40).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_jobs.io.filesystem import FileIO, InstantExistsError, resolve

__all__ = ["FileIO", "InstantExistsError", "resolve"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from spark_jobs.io import filesystem

        value = getattr(filesystem, name)
        globals()[name] = value  # once
        return value
    raise AttributeError(f"module 'spark_jobs.io' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
