"""The options of ``bucketindex read``: a snapshot printed or written whole as one Parquet file.

The engines' read paths are :mod:`spark_jobs.arrow_engine.read` (in-process) and
:mod:`spark_jobs.jobs.read` (Spark); :func:`spark_jobs.engines.run` chooses between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_jobs.table.action.options import POSITIONAL, VerbOptions, check_engine, option
from spark_jobs.table.timeline import parse_as_of

__all__ = ["ReadOptions"]


@dataclass(frozen=True, kw_only=True)
class ReadOptions(VerbOptions):
    """What to read and where it goes, validated once: a bad ``--as-of`` is one line (exit 2)
    before a JVM starts or a file is read."""

    VERB = "read"

    table: str = option(form=POSITIONAL)
    #: time travel: an instant (or its leading digits) or a time (``timeline.AS_OF_FORMS``)
    as_of: str | None = option("--as-of", default=None)
    #: write the snapshot as one Parquet file here instead of printing rows
    output: str | None = option("--output", default=None)
    #: rows printed without ``output``
    limit: int = option("--limit", default=20)
    engine: str | None = option("--engine", default=None)
    memory_budget: str | None = option("--memory-budget", default=None)

    def __post_init__(self) -> None:
        if self.as_of is not None:  # `--as-of yesterday` must not read the latest snapshot
            parse_as_of(self.as_of, option="--as-of")
        check_engine(self.engine, self.memory_budget)
