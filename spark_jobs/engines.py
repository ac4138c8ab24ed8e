"""Run an action on the engine chosen for it (``--engine auto|spark|arrow``).

The one entry point of every verb with two engines -- upsert, read, validate, shadow-compare,
compact: :func:`run` takes the verb's options dataclass (``spark_jobs.table.action.*``), sizes
the work, asks :func:`spark_jobs.table.action.engine.choose_engine`, and runs the in-process
Arrow engine or Spark. The CLI's verbs build the options, call it and print. A Spark session is only made (``spark()``) when Spark runs, so an Arrow run
starts no JVM and imports no ``pyspark``. When the Arrow engine finds, before writing
anything, that it cannot reproduce Spark's rules for this batch (``EngineUnsupportedError``),
``auto`` runs Spark instead and says why; ``--engine arrow`` fails with that line (exit 2).

A caller that must never start Spark in its own process -- the Airflow operators, whose process
is a worker -- passes ``decide`` (:data:`Decide`): its own engine decision over the verb's
sizing, made before anything is written; a Spark choice comes back as :class:`SubmitToSpark`
and the caller submits the job (spark-submit) itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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
    from spark_jobs.io.filesystem import FileIO
    from spark_jobs.table.action.bootstrap import BootstrapOptions
    from spark_jobs.table.action.compact import CompactOptions
    from spark_jobs.table.action.read import ReadOptions
    from spark_jobs.table.action.rehash import RehashOptions
    from spark_jobs.table.action.shadow_compare import ShadowCompareOptions
    from spark_jobs.table.action.validate import ValidateOptions

__all__ = ["run", "ReadResult", "upsert", "upsert_footprint", "precheck_upsert", "output_path", "VERBS", "bootstrap",
           "Decide", "SubmitToSpark", "DECIDABLE"]

log = logging.getLogger("bucketindex.engine")



#: ``decide(needed)``: a caller's own engine choice, given the verb's sizing ``needed()`` (bytes
#: the Arrow engine would hold; call it only to size, it reads the table); it logs the choice
Decide = Callable[[Callable[[], int]], EngineChoice]


@dataclass(frozen=True)
class SubmitToSpark:
    """What :func:`run` with ``decide`` returns when the work goes to Spark: nothing was run or
    written in this process; the caller submits the job. ``unsupported``: why the Arrow engine
    could not run it, when ``auto`` chose Arrow and the engine refused before writing."""

    choice: EngineChoice
    unsupported: str | None = None


def _arrow_or_submit(requested: str | None, run_arrow: Callable[[], Any], what: str) -> Any:
    """``run_arrow()``, or under ``auto`` a :class:`SubmitToSpark` when the Arrow engine finds,
    before writing anything, that it cannot run the work; under ``arrow`` that error is raised
    as it is (the caller words it in its own terms)."""
    try:
        return run_arrow()
    except EngineUnsupportedError as e:
        if (requested or AUTO) != AUTO:
            raise
        reason = " ".join(str(e).split())
        return SubmitToSpark(EngineChoice(SPARK, f"the arrow engine cannot run {what} ({reason})"), unsupported=reason)


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
    """Bytes the Arrow engine's process would hold at its peak for this upsert
    (:func:`spark_jobs.arrow_engine.upsert.needed_bytes`, calibrated on measured peaks): the
    process, the batch's rows and its decoded bytes (from the source's Parquet footers:
    :func:`spark_jobs.arrow_engine.source.batch_size`) times what the engine holds of them at
    once, and the largest file groups it may merge at once and an index bucket it may read, or
    every key of the table for ``global_simple``: an upper bound, so a batch ``auto`` runs
    in-process fits. The engine checks again with the exact decoded size once it has read the
    batch (a source whose footers under-state it: ``auto`` then runs Spark)."""
    from spark_jobs.arrow_engine.source import TEXT_ROW_BYTES, batch_size
    from spark_jobs.arrow_engine.upsert import needed_bytes, table_bytes
    from spark_jobs.io.filesystem import resolve
    from spark_jobs.table.table import Table

    sized = batch_size(opts.source, opts.source_format)
    if sized is None:  # not sizeable from its footers: its bytes on disk, decoded as planned elsewhere
        io, path = resolve(opts.source)
        try:
            on_disk = io.total_size(path)
        except (OSError, ValueError):
            on_disk = 0
        sized = (on_disk // TEXT_ROW_BYTES, on_disk * IN_MEMORY_EXPANSION)
    rows, batch = sized
    table = Table.open(opts.table)
    if table.config is None:
        return needed_bytes(rows=rows, batch_bytes=batch, table_bytes=0)
    view = table.view()
    return needed_bytes(rows=rows, batch_bytes=batch, table_bytes=table_bytes(
        index_type=table.config.index_type, view=view, num_buckets=table.num_buckets(view)))


def upsert(opts: UpsertOptions, *, spark: Callable[[], Any] | None = None,
           spark_requested: str | None = None, decide: Decide | None = None) -> Any:
    """Upsert one batch on the engine ``opts.engine`` asks for (default auto).

    :param spark: makes (or returns) the Spark session, called only when Spark runs
    :param spark_requested: why Spark is implied (``--master yarn``), if it is
    :param decide: see :func:`run`; the Arrow path then runs :func:`precheck_upsert` first (only
        there: a source the Spark job reads may be reachable from its environment only)
    """
    requested = opts.engine or AUTO
    if decide is not None:
        choice = decide(lambda: upsert_footprint(opts))
        if choice.engine != ARROW:
            return SubmitToSpark(choice)
        from spark_jobs.arrow_engine.upsert import run_upsert as run_in_process

        def arrow() -> dict[str, Any]:
            precheck_upsert(opts)
            return run_in_process(opts, choice=choice, announce=False)  # decide has logged the choice

        return _arrow_or_submit(requested, arrow, "this batch")
    budget = memory_budget(opts.memory_budget)
    sized = needs_sizing(requested, spark_requested=spark_requested, override=opts.memory_budget)
    needed = upsert_footprint(opts) if sized else 0
    choice = choose_engine(requested=requested, needed_bytes=needed, spark_requested=spark_requested,
                           budget=budget, announce=False,  # the action logs it with its first phase
                           budget_set=budget_given(opts.memory_budget))
    if choice.engine == ARROW:
        from spark_jobs.arrow_engine.upsert import run_upsert as run_arrow

        try:
            return run_arrow(opts, choice=choice)
        except EngineUnsupportedError as e:  # raised before anything is written
            if requested != AUTO:
                raise EngineUnsupportedError(f"--engine arrow cannot run this batch: {e}; use --engine spark") from e
            choice = EngineChoice(SPARK, f"the arrow engine cannot run this batch ({e})")
    if spark is None:
        from spark_jobs.jobs.session import get_spark

        def spark() -> Any:  # the Python API outside spark-submit: a local session
            return get_spark("local[*]", ui=False, datasource=False)

    from spark_jobs.jobs.upsert import run_upsert as run_spark

    return run_spark(spark(), opts, choice=choice)


@dataclass(frozen=True)
class ReadResult:
    """What :func:`run` of ``read`` gives back: the rows written to ``opts.output`` (``rows``),
    or the first rows to print -- as text (``text``: the Arrow engine) or as the Spark DataFrame
    (``frame``: its ``show`` prints them the way Spark users know)."""

    engine: str
    rows: int | None = None
    text: str | None = None
    frame: Any = None


def output_path(uri: str) -> "tuple[FileIO, str]":
    """The FileIO and path of ``read --output``; BadInputError (exit 2, before reading) when its
    directory does not exist or the path is a directory: the user names a place to write."""
    import pyarrow.fs as pafs

    from spark_jobs.exceptions import BadInputError
    from spark_jobs.io.filesystem import resolve

    io, path = resolve(uri)
    parent = path.rsplit("/", 1)[0] or "/"
    kind = io.fs.get_file_info(parent).type
    if kind == pafs.FileType.NotFound and io.scheme == "s3":  # an object store has no directories to create
        kind = pafs.FileType.Directory
    if kind == pafs.FileType.NotFound:
        raise BadInputError(f"--output {uri}: directory {parent} does not exist (create it first)")
    if kind != pafs.FileType.Directory:
        raise BadInputError(f"--output {uri}: {parent} is not a directory")
    if io.fs.get_file_info(path).type == pafs.FileType.Directory:
        raise BadInputError(f"--output {uri} is a directory; name the Parquet file to write")
    return io, path


def _once(spark: Callable[[], Any] | None) -> Callable[[], Any]:
    """The session factory, called at most once (a compaction that runs two plans on Spark
    shares one session); without one, a local session (the Python API outside spark-submit)."""
    made: list[Any] = []

    def get() -> Any:
        if not made:
            if spark is not None:
                made.append(spark())
            else:
                from spark_jobs.jobs.session import get_spark

                made.append(get_spark("local[*]", ui=False, datasource=False))
        return made[0]

    get.made = made  # type: ignore[attr-defined]
    return get


def _choose(opts: Any, spark_requested: str | None, needed: Callable[[], int]) -> EngineChoice:
    """The engine of one run: sized (``needed()``) only under auto or a budget the user set."""
    sized = needs_sizing(opts.engine, spark_requested=spark_requested, override=opts.memory_budget)
    return choose_engine(requested=opts.engine, needed_bytes=needed() if sized else 0,
                         spark_requested=spark_requested, budget=memory_budget(opts.memory_budget),
                         budget_set=budget_given(opts.memory_budget))


def _read(opts: "ReadOptions", spark: Callable[[], Any], spark_requested: str | None) -> ReadResult:
    from spark_jobs.table.table import Table
    from spark_jobs.table.timeline import resolve_as_of

    io, out = output_path(opts.output) if opts.output else (None, None)  # bad --output: exit 2, nothing read
    if opts.as_of is not None:  # a time before the first commit: one line naming it, still no JVM
        resolve_as_of(Table.load(opts.table).timeline, opts.as_of)

    def needed() -> int:
        from spark_jobs.arrow_engine.read import needed_bytes

        # printing reads the first slices only (one row more than shown: "only showing top N rows")
        view = Table.load(opts.table).view(opts.as_of)
        return needed_bytes(view, None if opts.output else max(opts.limit, 0) + 1)

    choice = _choose(opts, spark_requested, needed)
    if choice.engine == ARROW and not opts.output:
        from spark_jobs.arrow_engine.read import show

        return ReadResult(ARROW, text=show(opts.table, opts.as_of, opts.limit))
    if choice.engine == ARROW:
        from spark_jobs.io import parquet
        from spark_jobs.table.reader import read_arrow

        assert io is not None and out is not None
        t = read_arrow(opts.table, opts.as_of)
        try:
            parquet.write_table(t, out, filesystem=io.fs)  # the store's configured client, not one of pyarrow's
        except BaseException:
            io.delete(out)  # a torn output (a full disk) must not look like a snapshot
            raise
        return ReadResult(ARROW, rows=t.num_rows)
    from spark_jobs.jobs.read import read_table

    session = spark()
    df = read_table(session, opts.table, opts.as_of)
    if opts.output:  # written beside the output and moved into place: never torn
        from spark_jobs.jobs.read import write_one_parquet

        return ReadResult(SPARK, rows=write_one_parquet(session, df, opts.output))
    return ReadResult(SPARK, frame=df)


def _validate(opts: "ValidateOptions", spark: Callable[[], Any], spark_requested: str | None,
              decide: Decide | None = None) -> Any:
    budget = memory_budget(opts.memory_budget)

    def needed() -> int:  # partitioned to the budget: over it only if one partition is
        from spark_jobs.arrow_engine.validate import bounded_bytes
        from spark_jobs.table.table import Table

        table = Table.load(opts.table)
        return bounded_bytes(table, table.view(), budget)

    choice = decide(needed) if decide is not None else _choose(opts, spark_requested, needed)
    if decide is not None and choice.engine != ARROW:
        return SubmitToSpark(choice)
    if choice.engine == ARROW:
        from spark_jobs.arrow_engine.validate import run_validate as run_in_process

        return run_in_process(opts.table, memory_budget=budget)
    from spark_jobs.jobs.validate import run_validate

    return run_validate(spark(), opts.table)


def _shadow_compare(opts: "ShadowCompareOptions", spark: Callable[[], Any],
                    spark_requested: str | None) -> dict[str, Any]:
    from spark_jobs.table.table import Table

    table = Table.load(opts.table)
    assert table.config is not None
    opts.check_against(table.config.index_type)  # before a JVM starts: bad input is one line, nothing written
    touched: list[Any] = [None]

    def needed() -> int:
        from spark_jobs.arrow_engine.shadow_compare import needed_bytes
        from spark_jobs.table.shadow import touched_since

        # --since: the keys the commits after the instant touched (passed on, not computed twice)
        touched[0] = touched_since(table, opts.since) if opts.since is not None else None
        return needed_bytes(table, table.view(), opts.shadow, touched[0])

    if _choose(opts, spark_requested, needed).engine == ARROW:
        from spark_jobs.arrow_engine import shadow_compare as in_process

        return in_process.run_shadow_compare(opts.table, opts.shadow, touched=touched[0])
    from spark_jobs.jobs.shadow_compare import run_shadow_compare

    return run_shadow_compare(spark(), opts.table, opts.shadow)


def plan_bytes(uri: str, instant: str) -> int:
    """Bytes the Arrow engine holds to execute the compaction plan ``instant``
    (:func:`spark_jobs.arrow_engine.compact.needed_bytes`); 0 for a plan that is not pending
    (completed: a no-op; missing or cancelled: the run refuses it, writing nothing)."""
    from spark_jobs.arrow_engine.compact import needed_bytes
    from spark_jobs.table.table import Table
    from spark_jobs.table.timeline import Action

    table = Table.load(uri)
    tl = table.timeline.reload()
    inst = None if instant in tl.aborted else tl.find(instant)
    if inst is None or inst.is_completed or inst.action != Action.COMPACTION:
        return 0
    return needed_bytes(table, tl.read_plan(inst))


def _compact(opts: "CompactOptions", spark: Callable[[], Any], spark_requested: str | None,
             decide: Decide | None = None) -> Any:
    """Schedule and/or execute a compaction; auto sizes each plan it executes (a waiting one,
    then the new one). ``compact --rebuild-index`` is the CLI's own (in-process only).

    With ``decide``: executing one scheduled plan (``opts.execute``) only, decided before it is
    resumed (a plan resumed and then handed to Spark would look like a live writer to the job)."""
    from spark_jobs.table.action import compact as action

    if decide is not None:
        if opts.execute is None or opts.schedule_only:
            raise ValueError("run('compact', decide=...) executes one scheduled plan: set opts.execute")
        instant = opts.execute
        choice = decide(lambda: plan_bytes(opts.table, instant))
        if choice.engine != ARROW:
            return SubmitToSpark(choice)
        from spark_jobs.arrow_engine.compact import write_plan

        return action.run(opts.table, lambda table, plan: (write_plan, choice), instant=instant,
                          heartbeat_timeout_s=opts.heartbeat_timeout_s)

    budget = memory_budget(opts.memory_budget)
    # a fixed choice is checked before anything is written (--engine arrow with --master: exit 2)
    fixed = None if opts.schedule_only or ((opts.engine or AUTO) == AUTO and not spark_requested) else choose_engine(
        requested=opts.engine, needed_bytes=0, spark_requested=spark_requested, budget=budget)

    def pick(table, plan):  # type: ignore[no-untyped-def]
        """The engine of one plan."""
        if fixed is not None:
            choice = fixed
        else:
            from spark_jobs.arrow_engine.compact import needed_bytes

            choice = choose_engine(requested=AUTO, needed_bytes=needed_bytes(table, plan), budget=budget)
        if choice.engine == ARROW:
            from spark_jobs.arrow_engine.compact import write_plan

            return write_plan, choice
        from spark_jobs.jobs import compact as spark_compact

        return (lambda t, txn: spark_compact._execute(spark(), t, txn)), choice

    result = action.run(opts.table, pick, policy=opts.policy, schedule_only=opts.schedule_only,
                        instant=opts.execute, heartbeat_timeout_s=opts.heartbeat_timeout_s)
    if getattr(spark, "made", None):
        from spark_jobs.jobs.session import session_start_ms

        result["session_start_ms"] = session_start_ms()
    return result


def rehash_bytes(opts: "RehashOptions") -> int:
    """Bytes the Arrow engine holds to rehash as ``opts`` asks
    (:func:`spark_jobs.arrow_engine.rehash.needed_bytes`; 0 when there is nothing to do), after
    the action's own check of the count (BadInputError, nothing written)."""
    from spark_jobs.arrow_engine.rehash import needed_bytes
    from spark_jobs.table.action.rehash import check_rehash
    from spark_jobs.table.table import Table

    table = Table.load(opts.table)
    view = table.view()
    plan = check_rehash(table, view, opts.num_buckets, heartbeat_timeout_s=opts.heartbeat_timeout_s)
    return 0 if plan is None else needed_bytes(table, plan, view)


def _rehash(opts: "RehashOptions", spark: Callable[[], Any], spark_requested: str | None,
            decide: Decide | None = None) -> Any:
    """Rehash to ``opts.num_buckets``; auto sizes it by the largest units it holds at once
    (:func:`spark_jobs.arrow_engine.rehash.needed_bytes`), after the action has checked the
    count against the table (a bad count: exit 2 before any engine starts). With ``decide``:
    decided before the action repairs or writes anything."""
    from spark_jobs.table.action import rehash as action

    if decide is not None:
        choice = decide(lambda: rehash_bytes(opts))
        if choice.engine != ARROW:
            return SubmitToSpark(choice)
        from spark_jobs.arrow_engine.rehash import ArrowRehash

        return action.run(opts.table, opts.num_buckets, lambda table, plan, view: (ArrowRehash(), choice),
                          heartbeat_timeout_s=opts.heartbeat_timeout_s)

    budget = memory_budget(opts.memory_budget)
    sized = needs_sizing(opts.engine, spark_requested=spark_requested, override=opts.memory_budget)
    # a fixed choice is checked before anything is written (--engine arrow with --master: exit 2)
    fixed = None if sized else choose_engine(requested=opts.engine, needed_bytes=0, spark_requested=spark_requested,
                                             budget=budget)

    def pick(table, plan, view):  # type: ignore[no-untyped-def]
        choice = fixed
        if choice is None:
            from spark_jobs.arrow_engine.rehash import needed_bytes

            choice = choose_engine(requested=opts.engine, needed_bytes=needed_bytes(table, plan, view),
                                   budget=budget, budget_set=budget_given(opts.memory_budget))
        if choice.engine == ARROW:
            from spark_jobs.arrow_engine.rehash import ArrowRehash

            return ArrowRehash(), choice
        from spark_jobs.jobs.rehash import SparkRehash

        return SparkRehash(spark).started(), choice

    result = action.run(opts.table, opts.num_buckets, pick, heartbeat_timeout_s=opts.heartbeat_timeout_s)
    if getattr(spark, "made", None):
        from spark_jobs.jobs.session import session_start_ms

        result["session_start_ms"] = session_start_ms()
    return result


def bootstrap(opts: "BootstrapOptions", *, spark: Callable[[], Any] | None = None,
              spark_requested: str | None = None, decide: Decide | None = None) -> Any:
    """:func:`run` of ``bootstrap``."""
    return run("bootstrap", opts, spark=spark, spark_requested=spark_requested, decide=decide)


def bootstrap_footprint(prepared: Any) -> int:
    """Bytes the in-process bootstrap would hold at its peak. A rewrite bootstrap is one upsert of
    the whole dataset, so it is sized as :func:`upsert_footprint` sizes a batch (the calibrated
    :func:`spark_jobs.arrow_engine.upsert.needed_bytes` of the footers' rows and decoded bytes),
    and never below the listing's rule (:func:`spark_jobs.table.action.bootstrap.footprint`).
    Measured (docs/benchmarks.md "Scale", 10M rows): the listing's rule said 2,680 MiB for a
    rewrite that peaked at 7,083 MiB, above the 6,026 MiB budget; this estimate says 8,575 MiB,
    so ``auto`` hands it to Spark. A reference bootstrap keeps the listing's rule."""
    from spark_jobs.table.action import bootstrap as action

    planned = action.footprint(prepared.source, expansion=IN_MEMORY_EXPANSION)
    if prepared.mode != action.MODE_REWRITE:
        return planned
    import pyarrow as pa

    from spark_jobs.arrow_engine.source import parquet_size
    from spark_jobs.arrow_engine.upsert import needed_bytes
    from spark_jobs.io.filesystem import resolve

    source = prepared.source  # listed once, by prepare: a Hive layout's files too
    try:
        rows, decoded = parquet_size(resolve(source.uri)[0], [(f.path, f.size) for f in source.files])
    except (OSError, ValueError, pa.ArrowException):  # an unreadable footer: the scan refuses it
        return planned
    return max(planned, needed_bytes(rows=rows, batch_bytes=decoded, table_bytes=0))


def _bootstrap(opts: "BootstrapOptions", spark: Callable[[], Any], spark_requested: str | None,
               decide: Decide | None = None) -> Any:
    """Bootstrap a table on the engine ``opts.engine`` asks for (default auto): the dataset is
    sized from its listing (:func:`spark_jobs.table.action.bootstrap.footprint`) after the
    checks that need no engine, so a bad option or a rerun starts nothing.

    ``spark`` makes (or returns) the Spark session, called only when Spark runs;
    ``spark_requested``: why Spark is implied (``--master yarn``), if it is.
    """
    from spark_jobs.table.action import bootstrap as action

    requested = opts.engine or AUTO
    if decide is not None:  # the dataset is listed and checked (nothing written), then decided on
        prepared = action.prepare(opts)
        if prepared.noop is not None:
            return prepared.noop
        choice = decide(lambda: bootstrap_footprint(prepared))
        if choice.engine != ARROW:
            return SubmitToSpark(choice)
        from spark_jobs.arrow_engine.bootstrap import run_bootstrap as run_in_process

        return _arrow_or_submit(requested, lambda: run_in_process(opts, choice=choice, prepared=prepared), "it")
    budget = memory_budget(opts.memory_budget)  # a bad --memory-budget: exit 2 whatever the engine
    # a fixed choice that cannot hold (--engine arrow with --master) is refused before anything is read
    if requested != AUTO or spark_requested:
        choose_engine(requested=requested, needed_bytes=0, spark_requested=spark_requested, budget=budget,
                      announce=False)
    prepared = action.prepare(opts)
    if prepared.noop is not None:
        return prepared.noop
    sized = needs_sizing(requested, spark_requested=spark_requested, override=opts.memory_budget)
    needed = bootstrap_footprint(prepared) if sized else 0
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
    from spark_jobs.jobs.bootstrap import run_bootstrap as run_spark

    return run_spark(spark, opts, choice=choice, prepared=prepared)


#: the verbs with two engines, and how :func:`run` runs each
VERBS: dict[str, Callable[..., Any]] = {
    "upsert": lambda opts, spark, spark_requested, decide=None: upsert(opts, spark=spark,
                                                                       spark_requested=spark_requested, decide=decide),
    "read": _read,
    "validate": _validate,
    "shadow-compare": _shadow_compare,
    "compact": _compact,
    "rehash": _rehash,
    "bootstrap": _bootstrap,
}
#: the verbs :func:`run` can run with ``decide`` (what the Airflow operators run in a task)
DECIDABLE = ("upsert", "validate", "compact", "rehash", "bootstrap")


def run(verb: str, opts: Any, *, spark: Callable[[], Any] | None = None,
        spark_requested: str | None = None, decide: Decide | None = None) -> Any:
    """Run ``verb`` with its options on the engine ``opts.engine`` asks for (None: auto).

    :param opts: the verb's options dataclass (``UpsertOptions``, ``ReadOptions``,
        ``ValidateOptions``, ``ShadowCompareOptions``, ``CompactOptions``), already validated
    :param spark: makes (or returns) the Spark session, called only when Spark runs, and at
        most once; None: a local session
    :param spark_requested: why Spark is implied (``--master yarn``), if it is
    :param decide: for a caller whose process must never start Spark (an Airflow worker): the
        engine choice is ``decide(needed)``'s -- its own words and budget, logged by it, made
        before anything is written (``opts.engine`` ``spark``: without sizing) -- and a Spark
        choice is returned as :class:`SubmitToSpark` instead of run (``spark`` is never called;
        the caller submits the job). Under ``auto`` a batch the Arrow engine refuses before
        writing is a :class:`SubmitToSpark` too; under ``arrow`` its ``EngineUnsupportedError``
        is raised unworded. Verbs: :data:`DECIDABLE` (compact: ``opts.execute`` only).
    :returns: the verb's result: upsert, compact: the commit summary; validate, shadow-compare:
        the report; read: a :class:`ReadResult`
    """
    if verb not in VERBS:
        raise ValueError(f"{verb!r} is not a verb with two engines ({', '.join(VERBS)})")
    if getattr(opts, "VERB", verb) != verb:
        raise TypeError(f"{type(opts).__name__} are the options of {opts.VERB!r}, not {verb!r}")
    if decide is None:
        return VERBS[verb](opts, _once(spark), spark_requested)
    if verb not in DECIDABLE:
        raise ValueError(f"run({verb!r}, decide=...) is not supported ({', '.join(DECIDABLE)})")
    if (opts.engine or AUTO) == SPARK:  # nothing to size or read: the caller submits
        return SubmitToSpark(decide(lambda: 0))
    return VERBS[verb](opts, _never_spark, None, decide)


def _never_spark() -> Any:
    """The session factory under ``decide``: Spark is never started in the caller's process."""
    raise AssertionError("run(..., decide=...) must not start a Spark session")
