"""The one mapping between a verb's options dataclass and its command line.

Each verb has one frozen, keyword-only options dataclass in its action module
(:class:`~spark_jobs.table.action.upsert.UpsertOptions`,
:class:`~spark_jobs.table.action.read.ReadOptions`, ...), validated once, when it is made
(``__post_init__``: BadInputError, one line, exit 2). Its fields that are command-line options
say so with :func:`option`; from those, :class:`VerbOptions` derives both directions:

* :meth:`VerbOptions.to_argv` -- the arguments of ``bucketindex VERB`` (what the Airflow hook
  hands spark-submit or a Spark Connect client);
* :meth:`VerbOptions.from_args` -- the options from the CLI parser's namespace.

So the CLI, the hook's command builder and the operators cannot disagree on a flag's name, its
form or its default: ``from_args(parse(to_argv(opts))) == opts`` (the round-trip tests).
Where the work runs (``--master``, ``--remote``, ``--driver-memory``) and the store's settings
(``--storage-option``, carried in the environment) are not a verb's options: they are not here.

Core module: imports nothing of an engine, argparse only for its namespace type.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, ClassVar, Iterable, TypeVar

from spark_jobs.exceptions import BadInputError
from spark_jobs.table.action.engine import ENGINES, parse_size

__all__ = ["option", "VerbOptions", "POSITIONAL", "VALUE", "CSV", "REPEAT", "SWITCH", "check_heartbeat_timeout",
           "check_max_retries", "check_engine", "check_choice"]

#: how a field appears on the command line
POSITIONAL, VALUE, CSV, REPEAT, SWITCH = "positional", "value", "csv", "repeat", "switch"
_META = "bucketindex.cli"

T = TypeVar("T", bound="VerbOptions")


def option(flag: str | None = None, *, form: str = VALUE, dest: str | None = None, **field_kwargs: Any) -> Any:
    """A dataclass field that is a command-line option of its verb.

    :param flag: ``--record-key``; None for a positional (``form=POSITIONAL``)
    :param form: VALUE (``--flag V``), CSV (``--flag a,b`` from a list), REPEAT (``--flag a --flag b``
        from a list), SWITCH (``--flag`` when True) or POSITIONAL
    :param dest: the parser's attribute (default: the flag's name with ``_``, or the field's name)
    """
    if (flag is None) != (form == POSITIONAL):
        raise TypeError("a positional has no flag, and an option needs one")
    meta = {"flag": flag, "form": form, "dest": dest}
    return dataclasses.field(metadata={_META: meta}, **field_kwargs)


def _text(value: Any) -> str:
    """A value as the parser reads it back: floats by ``repr`` (``0.1`` stays ``0.1``)."""
    return repr(value) if isinstance(value, float) else str(value)


class VerbOptions:
    """Mixin of the verbs' options dataclasses: :meth:`to_argv` and :meth:`from_args`."""

    #: the CLI verb (``bucketindex VERB``)
    VERB: ClassVar[str] = ""

    @classmethod
    def _cli_fields(cls) -> Iterable[tuple[dataclasses.Field, dict[str, Any]]]:
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            meta = f.metadata.get(_META)
            if meta is not None:
                dest = meta["dest"] or (meta["flag"].lstrip("-").replace("-", "_") if meta["flag"] else f.name)
                yield f, {**meta, "dest": dest}

    @staticmethod
    def _default(f: dataclasses.Field) -> Any:
        if f.default is not dataclasses.MISSING:
            return f.default
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            return f.default_factory()  # type: ignore[misc]
        return dataclasses.MISSING

    def to_argv(self, *, given: Iterable[str] = ()) -> list[str]:
        """The arguments of ``bucketindex VERB`` (the verb itself not included) that parse back
        to these options. An option at its default is left out -- the command says what differs
        -- unless its field is named in ``given`` (an operator's explicit ``source_format="parquet"``
        over a connection default). Positionals come first, options in field order."""
        keep = set(given)
        head: list[str] = []
        tail: list[str] = []
        for f, meta in self._cli_fields():
            value = getattr(self, f.name)
            form, flag = meta["form"], meta["flag"]
            if form == POSITIONAL:
                if value is not None:
                    head.append(str(value))
                continue
            if value is None or (value == self._default(f) and f.name not in keep):
                continue
            if form == SWITCH:
                if value:
                    tail.append(flag)
            elif form == CSV:
                tail += _pair(flag, ",".join(str(v) for v in value))
            elif form == REPEAT:
                for v in value:
                    tail += _pair(flag, _text(v))
            else:
                tail += _pair(flag, _text(value))
        return head + tail

    @classmethod
    def from_args(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
        """These options from the CLI parser's namespace (``overrides``: fields the caller sets,
        e.g. a table path made absolute). An option the parser left None takes the field's
        default, so the parser and the dataclass cannot disagree on one."""
        values: dict[str, Any] = {}
        for f, meta in cls._cli_fields():
            if not hasattr(args, meta["dest"]):
                continue
            value = getattr(args, meta["dest"])
            if value is None or (meta["form"] == REPEAT and value == []):
                default = cls._default(f)
                if default is not dataclasses.MISSING:
                    value = default
            values[f.name] = value
        values.update(overrides)
        return cls(**values)


def _pair(flag: str, text: str) -> list[str]:
    """``[flag, text]``, or ``[flag=text]`` when the text starts with ``-`` (argparse would take
    it for an option): a batch id or a column named ``-x`` must reach the job as given."""
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]


# -- the checks several verbs' options share (one line each, exit 2) -----------------------------
def check_heartbeat_timeout(value: float | None) -> None:
    """``--heartbeat-timeout``: positive seconds, or None for the default."""
    if value is not None and value <= 0:
        raise BadInputError(f"--heartbeat-timeout must be positive, got {value}")


def check_max_retries(value: int) -> None:
    """``--max-retries``: 0 or more."""
    if value < 0:
        raise BadInputError(f"--max-retries must be 0 or more, got {value}")


def check_engine(engine: str | None, memory_budget: str | None) -> None:
    """``--engine`` one of auto, spark, arrow (None: auto); ``--memory-budget`` a size."""
    if engine is not None and engine not in ENGINES:
        raise BadInputError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if memory_budget is not None:
        parse_size(memory_budget)


def check_choice(flag: str, value: Any, allowed: Iterable[str]) -> None:
    """A value of a closed set (None: not given)."""
    allowed = tuple(allowed)
    if value is not None and value not in allowed:
        raise BadInputError(f"{flag} must be one of {', '.join(allowed)}, got {value!r}")
