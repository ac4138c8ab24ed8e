"""Which engine runs an action: ``--engine auto|spark|arrow``.

``auto`` (the default) runs in-process on Arrow when the work -- the batch plus the file groups
and index buckets it touches, the snapshot a read holds, or the partition of the snapshot a
validate holds at once (``arrow_engine.validate.plan``) -- fits a memory budget
derived from the machine, and on Spark otherwise. A Spark master or Connect server given on
the command line means Spark. Work that does not fit is never attempted in memory. The choice
and its reason are logged and recorded in the commit metadata (``engine``), and ``show``
prints them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from spark_jobs.exceptions import BadInputError

__all__ = ["ENGINES", "AUTO", "SPARK", "ARROW", "EngineChoice", "memory_budget", "choose_engine",
           "IN_MEMORY_EXPANSION", "parse_size", "human_size", "budget_given", "needs_sizing", "BUDGET_SETTING"]

log = logging.getLogger("bucketindex.engine")

AUTO, SPARK, ARROW = "auto", "spark", "arrow"
ENGINES = (AUTO, SPARK, ARROW)
#: the user's override of the in-process budget, e.g. ``8g`` (the CLI's ``--memory-budget`` wins)
BUDGET_ENV = "BUCKETINDEX_ARROW_MEMORY_BUDGET"
#: share of physical memory the in-process engine may plan to hold
BUDGET_FRACTION = 0.25
#: decoded Arrow bytes per compressed Parquet byte, planned for (zstd on typical tables: 3-5x;
#: merges hold the old and the new version of a file group at once)
IN_MEMORY_EXPANSION = 6

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"4g"``, ``"512m"``, ``"1073741824"`` -> bytes; BadInputError otherwise."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in _UNITS else (t, "")
    try:
        value = float(num) * _UNITS[unit]
    except ValueError:
        raise BadInputError(f"memory budget {text!r} is not a size like 4g or 512m") from None
    if value <= 0:
        raise BadInputError(f"memory budget {text!r} must be positive")
    return int(value)


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a small machine
        return 4 << 30


def memory_budget(override: str | None = None) -> int:
    """Bytes the in-process engine may plan to hold: ``override``, else ``$BUCKETINDEX_ARROW_MEMORY_BUDGET``,
    else a quarter of physical memory (the rest is for the scheduler, other tasks and the page cache)."""
    chosen = override or os.environ.get(BUDGET_ENV)
    if chosen:
        return parse_size(chosen)
    return int(_physical_memory() * BUDGET_FRACTION)


#: how a user sets the budget, as errors name it
BUDGET_SETTING = f"--memory-budget (or ${BUDGET_ENV})"


def budget_given(override: str | None = None) -> bool:
    """Whether the user set the budget (``override``, the CLI's ``--memory-budget``, or the
    environment): then ``--engine arrow`` is held to it too (:func:`choose_engine`); the
    derived default only steers ``auto``."""
    return bool(override or os.environ.get(BUDGET_ENV))


def needs_sizing(requested: str | None, *, spark_requested: str | None, override: str | None) -> bool:
    """Whether an action must size its work before :func:`choose_engine`: under ``auto``, and
    under ``--engine arrow`` with a budget the user set (which it must honour or refuse)."""
    if spark_requested:
        return False
    return (requested or AUTO) == AUTO or (requested == ARROW and budget_given(override))


@dataclass(frozen=True)
class EngineChoice:
    engine: str  # spark | arrow
    reason: str
    #: bytes an Arrow run is held to (the budget it was chosen within: ``auto``, or ``--engine
    #: arrow`` with a budget the user set); None: not held to one (``--engine arrow`` alone, the
    #: user's call). The in-process upsert checks its exact figures against it once it has read
    #: the batch, and refuses before writing when they are over (``auto`` then runs Spark).
    #: Not recorded in the commit (:meth:`as_metadata`)
    budget: int | None = None

    def as_metadata(self) -> dict[str, str]:
        return {"name": self.engine, "reason": self.reason}


def human_size(n: float) -> str:
    """``n`` bytes as the engine's messages write sizes (``258 MiB``)."""
    return _human(n)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def choose_engine(*, requested: str | None, needed_bytes: int, spark_requested: str | None = None,
                  unsupported: str | None = None, budget: int | None = None, announce: bool = True,
                  budget_set: bool = False) -> EngineChoice:
    """The engine for one action.

    :param requested: ``auto`` (None means auto), ``spark`` or ``arrow``
    :param needed_bytes: the in-memory size the Arrow engine would hold (already expanded)
    :param spark_requested: why Spark is implied (``"--master yarn"``), if it is
    :param unsupported: why the Arrow engine cannot run this work, if it cannot
    :param announce: log the choice now; an upsert logs it with its first phase instead, so a bad
        batch still prints exactly one line (the error)
    :param budget_set: the user set ``budget`` (:func:`budget_given`): ``--engine arrow`` on work
        estimated over it is refused (BadInputError, exit 2, before anything is written) rather
        than run past the limit the same command set -- a contradiction in the command, which a
        retry would meet again, so not a resource failure (exit 1)
    """
    requested = requested or AUTO
    if requested not in ENGINES:
        raise BadInputError(f"--engine must be one of {', '.join(ENGINES)}, got {requested!r}")
    budget = memory_budget() if budget is None else budget
    if requested == SPARK:
        choice = EngineChoice(SPARK, "--engine spark")
    elif requested == ARROW:
        if spark_requested:
            raise BadInputError(f"--engine arrow runs in-process; {spark_requested} asks for Spark")
        if unsupported:
            from spark_jobs.exceptions import EngineUnsupportedError

            raise EngineUnsupportedError(f"--engine arrow cannot run this: {unsupported}; use --engine spark")
        if budget_set and needed_bytes > budget:
            raise BadInputError(f"--engine arrow would hold about {_human(needed_bytes)} in memory, over the "
                                f"{_human(budget)} budget set by {BUDGET_SETTING}: raise the budget, or use "
                                f"--engine auto or spark")
        choice = EngineChoice(ARROW, "--engine arrow" + (f", about {_human(needed_bytes)} in memory, within the "
                                                         f"{_human(budget)} budget" if budget_set else ""),
                              budget=budget if budget_set else None)
    elif spark_requested:
        choice = EngineChoice(SPARK, f"{spark_requested} given")
    elif unsupported:
        choice = EngineChoice(SPARK, f"the arrow engine cannot run this ({unsupported})")
    elif needed_bytes > budget:
        choice = EngineChoice(SPARK, f"needs about {_human(needed_bytes)} in memory, over the "
                                     f"{_human(budget)} budget")
    else:
        choice = EngineChoice(ARROW, f"needs about {_human(needed_bytes)} in memory, within the "
                                     f"{_human(budget)} budget", budget=budget)
    log.log(logging.INFO if announce else logging.DEBUG, "engine: %s (%s)", choice.engine, choice.reason)
    return choice
