"""Run an action on the engine chosen for it (``--engine auto|spark|arrow``).

The one entry point the CLI, the Airflow hook and the operators share: it sizes the work,
asks :func:`spark_jobs.table.action.engine.choose_engine`, and runs the in-process Arrow
engine or Spark. A Spark session is only made (``spark()``) when Spark runs, so an Arrow run
starts no JVM and imports no ``pyspark``. When the Arrow engine finds, before writing
anything, that it cannot reproduce Spark's rules for this batch (``EngineUnsupportedError``),
``auto`` runs Spark instead and says why; ``--engine arrow`` fails with that line (exit 2).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from spark_jobs.exceptions import EngineUnsupportedError
from spark_jobs.table.action.engine import (
    ARROW,
    AUTO,
    IN_MEMORY_EXPANSION,
    SPARK,
    EngineChoice,
    budget_given,
    choose_engine,
    memory_budget,
    needs_sizing,
)
from spark_jobs.table.action.upsert import UpsertOptions

if TYPE_CHECKING:
    from spark_jobs.table.action.bootstrap import BootstrapOptions
from spark_jobs.table.config import INDEX_GLOBAL_SIMPLE, INDEX_RECORD

__all__ = ["upsert", "upsert_footprint", "precheck_upsert", "bootstrap"]

log = logging.getLogger("bucketindex.engine")

#: in-memory bytes per live key a global_simple tag holds (key text, partition, file id)
KEY_BYTES = 96
#: in-memory bytes per record-index entry a lookup holds (fingerprints, location codes)
INDEX_ENTRY_BYTES = 64


def precheck_upsert(opts: UpsertOptions) -> None:
    """Every check of an upsert that needs only metadata, before any engine (or JVM) starts -- the
    CLI, the Airflow operator: a bad option or batch costs a second, not a Spark session's start.
    BadInputError (exit 2) for a source that does not exist (a glob: that matches no file); options against ``table.json`` and
    the buckets in force, or a new table without a record key (the driver's own
    :func:`~spark_jobs.table.action.upsert.resolve_config`, so the two cannot disagree); and,
    from the Parquet footers of a flat source, the named fields missing from it, a reserved column
    name and the batch's columns against the table's (the engines' own column rules; the
    validation checks again)."""
    from spark_jobs.arrow_engine.source import require_source
    from spark_jobs.table.action.upsert import check_source_columns, resolve_config
    from spark_jobs.table.schema import check_batch_schema, check_timestamp_units, footer_schema
    from spark_jobs.table.table import Table

    require_source(opts.source)
    cfg, view = resolve_config(opts, Table.open(opts.table))
    # from the footers of a flat Parquet source, read once; anything not cheap and sure (other
    # formats, Hive directories, globs, unreadable files) is left to the engine's validation,
    # which applies the same functions
    batch = footer_schema(opts.source) if opts.source_format == "parquet" else None
    if batch is None:
        return
    if opts.source_df is None:
        # the delete field's type needs Spark's name for it: passed as acceptable here, checked by the engine
        check_source_columns(cfg=cfg, delete_field=opts.delete_field, columns=batch.names, delete_type="boolean")
    check_timestamp_units(batch, source=opts.source)  # Spark's reader would refuse them less helpfully
    if view is not None and view.schema is not None:
        check_batch_schema(batch=batch, config=cfg, table_schema=view.schema, record_key=cfg.record_key_fields,
                           delete_field=opts.delete_field, partial_update=opts.partial_update,
                           schema_evolution=opts.schema_evolution)


def upsert_footprint(opts: UpsertOptions) -> int:
    """Bytes the Arrow engine would hold at its peak for this upsert: the batch, plus the largest
    file groups it may rewrite at once (one per merge thread) and an index bucket it may read,
    or every key of the table for ``global_simple``: an upper bound, so a batch ``auto`` runs
    in-process fits."""
    from spark_jobs.io.filesystem import resolve
    from spark_jobs.table.table import Table

    io, path = resolve(opts.source)
    try:
        batch = io.total_size(path) * IN_MEMORY_EXPANSION
    except (OSError, ValueError):
        batch = 0
    table = Table.open(opts.table)
    if table.config is None:
        return batch
    view = table.view()
    from spark_jobs.arrow_engine.upsert import THREADS

    # the engine merges up to THREADS file groups at once: the largest ones, at worst
    largest = sorted((s.total_size for s in view.file_groups.values()), reverse=True)[:THREADS]
    groups = sum(largest) * IN_MEMORY_EXPANSION
    cfg = table.config
    if cfg.index_type == INDEX_GLOBAL_SIMPLE:
        tag = view.num_rows * KEY_BYTES
    elif cfg.index_type == INDEX_RECORD:
        tag = view.num_rows // max(1, table.num_buckets(view)) * INDEX_ENTRY_BYTES
    else:
        tag = 0
    return batch + groups + tag


def upsert(opts: UpsertOptions, *, spark: Callable[[], Any] | None = None,
           spark_requested: str | None = None) -> dict[str, Any]:
    """Upsert one batch on the engine ``opts.engine`` asks for (default auto).

    :param spark: makes (or returns) the Spark session, called only when Spark runs
    :param spark_requested: why Spark is implied (``--master yarn``), if it is
    """
    requested = opts.engine or AUTO
    budget = memory_budget(opts.memory_budget)
    sized = needs_sizing(requested, spark_requested=spark_requested, override=opts.memory_budget)
    needed = upsert_footprint(opts) if sized else 0
    choice = choose_engine(requested=requested, needed_bytes=needed, spark_requested=spark_requested,
                           budget=budget, announce=False,  # the action logs it with its first phase
                           budget_set=budget_given(opts.memory_budget))
    if choice.engine == ARROW:
        from spark_jobs.arrow_engine.upsert import run_upsert as run_arrow

        try:
            return run_arrow(opts, choice=choice, prepared=prepared)
        except EngineUnsupportedError as e:  # raised before anything is written
            if requested != AUTO:
                raise EngineUnsupportedError(f"--engine arrow cannot run this batch: {e}; use --engine spark") from e
            choice = EngineChoice(SPARK, f"the arrow engine cannot run this batch ({e})")
    if spark is None:
        from spark_jobs.jobs.session import get_spark

        def spark() -> Any:  # the Python API outside spark-submit: a local session
            return get_spark("local[*]", ui=False)

    from spark_jobs.jobs.upsert import run_upsert as run_spark

    return run_spark(spark(), opts, choice=choice)


def bootstrap(opts: "BootstrapOptions", *, spark: Callable[[], Any] | None = None,
              spark_requested: str | None = None) -> dict[str, Any]:
    """Bootstrap a table on the engine ``opts.engine`` asks for (default auto): the dataset is
    sized from its listing (:func:`spark_jobs.table.action.bootstrap.footprint`) after the
    checks that need no engine, so a bad option or a rerun starts nothing.

    :param spark: makes (or returns) the Spark session, called only when Spark runs
    :param spark_requested: why Spark is implied (``--master yarn``), if it is
    """
    from spark_jobs.table.action import bootstrap as action

    requested = opts.engine or AUTO
    budget = memory_budget(opts.memory_budget)  # a bad --memory-budget: exit 2 whatever the engine
    # a fixed choice that cannot hold (--engine arrow with --master) is refused before anything is read
    if requested != AUTO or spark_requested:
        choose_engine(requested=requested, needed_bytes=0, spark_requested=spark_requested, budget=budget,
                      announce=False)
    prepared = action.prepare(opts)
    if prepared.noop is not None:
        return prepared.noop
    sized = needs_sizing(requested, spark_requested=spark_requested, override=opts.memory_budget)
    needed = action.footprint(prepared.source, expansion=IN_MEMORY_EXPANSION) if sized else 0
    choice = choose_engine(requested=requested, needed_bytes=needed, spark_requested=spark_requested,
                           budget=budget, budget_set=budget_given(opts.memory_budget))
    if choice.engine == ARROW:
        from spark_jobs.arrow_engine.bootstrap import run_bootstrap as run_arrow

        try:
            return run_arrow(opts, choice=choice, prepared=prepared)
        except EngineUnsupportedError as e:  # raised before anything is written
            if requested != AUTO:
                raise EngineUnsupportedError(f"--engine arrow cannot run this bootstrap: {e}; "
                                             f"use --engine spark") from e
            choice = EngineChoice(SPARK, f"the arrow engine cannot run this bootstrap ({e})")
            log.info("engine: %s (%s)", choice.engine, choice.reason)
    if spark is None:
        from spark_jobs.jobs.session import get_spark

        def spark() -> Any:  # the Python API outside spark-submit: a local session
            return get_spark("local[*]", ui=False)

    from spark_jobs.jobs.bootstrap import run_bootstrap as run_spark

    return run_spark(spark, opts, choice=choice, prepared=prepared)
