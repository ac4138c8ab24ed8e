"""The options of ``bucketindex validate``: the full index <-> data check.

The checks themselves: :mod:`spark_jobs.table.validation` (shared), run by
:mod:`spark_jobs.arrow_engine.validate` or :mod:`spark_jobs.jobs.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_jobs.table.action.options import POSITIONAL, VerbOptions, check_engine, option

__all__ = ["ValidateOptions"]


@dataclass(frozen=True, kw_only=True)
class ValidateOptions(VerbOptions):
    """The table and the engine choice; validated once (a bad ``--memory-budget``: exit 2)."""

    VERB = "validate"

    table: str = option(form=POSITIONAL)
    engine: str | None = option("--engine", default=None)
    memory_budget: str | None = option("--memory-budget", default=None)

    def __post_init__(self) -> None:
        check_engine(self.engine, self.memory_budget)
