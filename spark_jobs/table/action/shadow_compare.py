"""The options of ``bucketindex shadow-compare``: the index's answer per key against a truth.

The comparison's own options (:class:`~spark_jobs.table.shadow.ShadowOptions`, what both
engines take) plus the table, the report's destination and the engine choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_jobs.table.action.options import POSITIONAL, VerbOptions, check_engine, option
from spark_jobs.table.config import INDEX_RECORD
from spark_jobs.table.shadow import ShadowOptions, check_options

__all__ = ["ShadowCompareOptions"]


@dataclass(frozen=True, kw_only=True)
class ShadowCompareOptions(VerbOptions):
    """Validated once when made; the checks that need the table's index type
    (``--against bucket`` on a bucket table) are :func:`~spark_jobs.table.shadow.check_options`'s,
    run by :meth:`check_against` once the table is open."""

    VERB = "shadow-compare"

    table: str = option(form=POSITIONAL)
    #: scan | global_simple | bucket
    against: str = option("--against", default="scan")
    #: only keys touched after this instant or time
    since: str | None = option("--since", default=None)
    sample_fraction: float = option("--sample-fraction", default=1.0)
    max_mismatches: int = option("--max-mismatches", default=0)
    #: also write the JSON report here (a path or URI)
    report: str | None = option("--report", default=None)
    engine: str | None = option("--engine", default=None)
    memory_budget: str | None = option("--memory-budget", default=None)

    def __post_init__(self) -> None:
        # the checks that need no table: as on a record-index table, which accepts every --against
        check_options(INDEX_RECORD, self.shadow)
        check_engine(self.engine, self.memory_budget)

    @property
    def shadow(self) -> ShadowOptions:
        """The comparison's options, as the engines take them."""
        return ShadowOptions(against=self.against, since=self.since, sample_fraction=self.sample_fraction,
                             max_mismatches=self.max_mismatches)

    def check_against(self, index_type: str) -> None:
        """The options against the table's index type (BadInputError, one line, exit 2)."""
        check_options(index_type, self.shadow)
