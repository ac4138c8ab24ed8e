"""``bucketindex``: table operations from the command line (DESIGN §4).

Exit status: 0 success, 1 a check found a problem, a resource ran out, or the table or its
store is at fault (a damaged or missing file, a full disk, access refused: one line naming
it), 2 bad usage or bad input (one line on stderr, nothing written), 3 a concurrent write
conflicted, the table was busy, or a rollback (or a rehash cancelling a compaction plan)
aborted the write (one line starting ``conflict:`` or naming the live writer; nothing
written; safe to retry with the same batch id). Verbs that need Spark start a local session (``--master`` to
change it), or use a running Spark Connect server (``--remote sc://HOST:PORT``, or the
``SPARK_REMOTE`` environment variable when neither option is given); ``show`` and
``rollback`` read and repair the table with the pure-Python core.
"""

from __future__ import annotations

import argparse
import atexit
import errno
import json
import logging
import os
import re
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Collection, Sequence

from spark_jobs.exceptions import (
    BadInputError,
    BucketIndexError,
    MissingDependencyError,
    RetryableError,
    StorageUnavailableError,
    TableCorruptError,
)
from spark_jobs.redaction import redact_uri
from spark_jobs.text import plural
from spark_jobs.vocabulary import AS_OF_FORMS, INDEX_TYPES, MIRRORS, TABLE_TYPES  # not the core: --help loads no pyarrow

if TYPE_CHECKING:
    from spark_jobs.table.action.compact import CompactOptions

__all__ = ["main", "build_parser"]

log = logging.getLogger("bucketindex")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(2, f"bucketindex: error: {message}\n")


_DRIVER_MEMORY_HELP = ("JVM heap for a local master, e.g. 8g (default: about a third of the machine's memory, "
                       "or $BUCKETINDEX_DRIVER_MEMORY)")


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


#: where a table may live, and where not: a store without a create-if-absent is refused when the
#: table is opened (``refuse_uncommittable_uri``), so the help offers only the stores that commit
TABLE_STORES = ("a local directory or a file:// or s3:// URI (s3a://, s3n:// alike); tables on hdfs://, gs:// "
                "or abfs:// are refused (no create-if-absent to commit with), though sources there can be read")
#: the positional TABLE of the verbs that work on an existing table
TABLE_HELP = f"the table: {TABLE_STORES}"

REMOTE_HELP = "run on this Spark Connect server instead of a Spark of our own (default: $SPARK_REMOTE unless --master)"


def _add_spark_options(parser: argparse.ArgumentParser) -> None:
    """Where a Spark verb runs: a master of its own (and its heap) or a Spark Connect server."""
    parser.add_argument("--master", help="Spark master (default local[*])")
    parser.add_argument("--driver-memory", help=_DRIVER_MEMORY_HELP)
    parser.add_argument("--remote", metavar="sc://HOST:PORT", help=REMOTE_HELP)


ENGINE_HELP = ("where the work runs: arrow in this process (no JVM), spark on a Spark session, or auto "
               "(default): arrow when the work fits the memory budget and arrow can run it, spark otherwise; "
               "--master or --remote mean spark")


def _add_engine_options(parser: argparse.ArgumentParser) -> None:
    """The engine choice (``spark_jobs.table.action.engine``) and the in-process memory budget."""
    parser.add_argument("--engine", choices=("auto", "spark", "arrow"), help=ENGINE_HELP)  # None: auto
    parser.add_argument("--memory-budget", metavar="SIZE",
                        help="bytes the arrow engine may hold, e.g. 4g (default: a quarter of physical memory, "
                             "or $BUCKETINDEX_ARROW_MEMORY_BUDGET)")


def _spark_requested(args: argparse.Namespace, submitted: bool) -> str | None:
    """Why Spark is implied for this run, if it is: under spark-submit, or a master, a Connect server
    or the driver's heap given."""
    if submitted:
        return "spark-submit"
    if getattr(args, "master", None):
        return f"--master {args.master}"
    if getattr(args, "remote", None):
        return f"--remote {args.remote}"
    if getattr(args, "driver_memory", None):
        return f"--driver-memory {args.driver_memory}"
    if os.environ.get("SPARK_REMOTE"):
        return "$SPARK_REMOTE"
    return None


class _NoArguments:
    """Stands for the parser of a verb this run does not parse (:func:`build_parser`'s ``verbs``):
    its arguments are not built. Each ``add_argument`` of argparse formats the argument once (a
    help formatter per call), so building all twelve verbs' ~170 arguments was 15-25 ms of every
    cold run; the verb itself is still registered, with its help, for ``--help`` and the
    ``invalid choice`` error."""

    def add_argument(self, *args: object, **kwargs: object) -> None:
        return None

    def add_mutually_exclusive_group(self, **kwargs: object) -> "_NoArguments":
        return self


class _Verbs:
    """The subparsers of :func:`build_parser`, building the arguments of ``verbs`` only (None: all)."""

    def __init__(self, sub: "argparse._SubParsersAction[_Parser]", verbs: Collection[str] | None) -> None:
        self.sub, self.verbs = sub, verbs

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        parser = self.sub.add_parser(name, **kwargs)
        return parser if self.verbs is None or name in self.verbs else _NoArguments()


def verb_of(argv: Sequence[str]) -> str | None:
    """The verb of a command line: its first word that is not an option (the program's own
    options, ``-v`` and ``-h``, take no value); None when it has none (``--help``)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(extra_verbs: dict[str, str] | None = None, *,
                 verbs: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; ``extra_verbs`` (name -> help) are verbs another layer runs, listed in ``--help``.

    ``verbs``: build the arguments of these verbs only (None: of every verb); every verb is
    listed either way. A run parses one verb (:func:`verb_of`), so :func:`main` builds that
    one's: what the parser accepts for it, and its help, are the same as the full parser's."""
    p = _Parser(prog="bucketindex", description="Upsertable lake tables with a record-level or bucket hash index.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = _Verbs(p.add_subparsers(dest="verb", required=True, parser_class=_Parser), verbs)

    up = sub.add_parser("upsert", help="upsert (and delete) a batch into a table, data + index in one commit",
                        description="Upsert (and delete) the rows of SOURCE into the table at TABLE: data files and "
                                    "index in one commit. The first upsert creates the table and fixes its record "
                                    "key, partition field, precombine field, index, bucket count and table type; "
                                    "later upserts read them from the table's table.json, so those options may be "
                                    "left out, and a given one that contradicts the table is refused (exit 2) "
                                    "before any engine starts.")
    up.add_argument("table", help=f"the table, created by the first upsert: {TABLE_STORES}")
    up.add_argument("source", help="the batch: a file, a directory of files (Hive-style partition directories "
                                   "included) or a glob, in --source-format")
    up.add_argument("--record-key", type=_csv, metavar="FIELD[,FIELD...]",
                    help="key field(s), comma-separated; required to create the table, read from the table after")
    up.add_argument("--precombine-field", metavar="FIELD",
                    help="among rows with the same key, in the batch and against the stored row, the highest value "
                         "wins (fixed at table creation; default none: the newest batch wins)")
    up.add_argument("--partition-field", metavar="FIELD",
                    help="partition the table by this column, one directory per value (fixed at table creation; "
                         "default unpartitioned)")
    up.add_argument("--index", choices=INDEX_TYPES,
                    help="record: a record-level index (a key lives in one partition); bucket: hash(key) %% N per "
                         "partition; global_simple: a scan of every key (fixed at table creation; default record)")
    up.add_argument("--num-buckets", type=int, metavar="N",
                    help="index buckets (record) or buckets per partition (bucket) of a new table (default 16, "
                         "bucket 8); an existing table's count in force must match (change it with `rehash`)")
    up.add_argument("--table-type", choices=TABLE_TYPES,
                    help="copy_on_write rewrites touched file groups; merge_on_read appends a log to them "
                         "(fixed at table creation; default merge_on_read, with automatic compaction; copy_on_write "
                         "when --mirror is given, whose projection is exact only for copy_on_write)")
    up.add_argument("--source-format", default="parquet", choices=("parquet", "json", "csv"),
                    help="how SOURCE is read (default parquet); a JSON or CSV batch's values are cast to the "
                         "table's column types")
    up.add_argument("--delete-field", metavar="FIELD",
                    help="the column that marks deletes (not stored): a boolean, true deletes; an integer, non-zero "
                         "deletes; or a string, true/t/yes/y/1 deletes and false/f/no/n/0 does not (any case, "
                         "spaces around ignored; any other string is refused); null never deletes")
    up.add_argument("--partial-update", action="store_true",
                    help="the batch may lack table columns: updated rows keep their stored values of those, "
                         "inserted rows get nulls, a key moving partitions takes its stored values along (the "
                         "record key, partition and precombine fields are still required); without it a "
                         "missing column is refused")
    up.add_argument("--batch-id", help="idempotence key: a batch id already committed makes the run a no-op "
                                       "(default: auto-<20 hex digits> derived from the table, SOURCE's files -- "
                                       "names, sizes, modification times -- and --source-format, --delete-field, "
                                       "--partial-update and --schema-evolution, so rerunning the same command on "
                                       "unchanged files is a no-op; name the batch to apply the same files again)")
    up.add_argument("--target-file-rows", type=int, metavar="N",
                    help="rows per data file before a new file group opens (fixed at table creation; default "
                         "100000)")
    up.add_argument("--max-retries", type=int, default=3,
                    help="re-tag and re-write a batch this often when concurrent commits conflict (default 3)")
    up.add_argument("--heartbeat-timeout", type=float,
                    help="seconds without a heartbeat before a pending write counts as abandoned (default 60)")
    up.add_argument("--shadow-index", choices=("global_simple", "bucket"),
                    help="tee: also tag the batch with this index, computed on the fly, and record where it "
                         "disagrees with the table's index in the commit metadata (`show` prints it); "
                         "what is written does not change")
    up.add_argument("--schema-evolution", metavar="MODE[,MODE]",
                    help="what the batch may change of the table's schema: none (default: a column the table "
                         "lacks is refused, a wider type is cast back); add-columns (such columns are added, "
                         "nullable); widen (a column widens to the batch's type: tinyint->smallint->int->bigint, "
                         "float->double, decimal precision up at the same scale, date->timestamp_ntz); all (both). "
                         "Never narrows, changes a kind or drops a column; older snapshots keep their schema")
    up.add_argument("--mirror", choices=MIRRORS,
                    help="delta: also write a Delta Lake log (_delta_log/) with every commit, so Delta readers "
                         "(deltalake, Spark, Trino, ...) read the table; iceberg: also write Iceberg metadata "
                         "(metadata/, needs pyiceberg), so Iceberg readers (pyiceberg, DuckDB, Trino, Spark, ...) "
                         "read it; fixed at table creation (turn one on later with `bucketindex mirror TABLE "
                         "--enable delta|iceberg`)")
    up.add_argument("--auto-compact", choices=("on", "off"),
                    help="merge-on-read: after the commit, compact the file groups this upsert touched that are "
                         "due (the rule of `compact`: 4 logs, or logs of a fifth of the base's bytes) and the "
                         "record-index buckets it wrote a delta to that are due, through a "
                         "scheduled compaction plan as `compact` runs it; a failure is logged and leaves the "
                         "upsert committed. Given when the upsert creates the table, it is the table's setting "
                         "(table.json); given later, it decides for this run. Default: the table's setting -- on "
                         "for a merge-on-read table created since merge-on-read became the default, off for "
                         "older tables. Runs on the engine the upsert ran on")
    up.add_argument("--auto-compact-max-groups", type=int, metavar="N",
                    help="at most N file groups per automatic compaction (default 4)")
    up.add_argument("--auto-compact-max-buckets", type=int, metavar="N",
                    help="record index: at most N index buckets (of those this upsert wrote a delta to that are "
                         "due: 10 deltas, or deltas of half the base's bytes) folded per automatic compaction, "
                         "most deltas first (default 4)")
    up.add_argument("--auto-compact-max-bytes", metavar="SIZE",
                    help="at most SIZE of bases and logs per automatic compaction, e.g. 512m (default 512m); "
                         "a larger group is left to `compact`")
    _add_spark_options(up)
    _add_engine_options(up)

    rd = sub.add_parser("read", help="read a snapshot",
                        description="Print the first --limit rows of a snapshot, or write it whole as one "
                                    "Parquet file (--output). --engine auto reads in this process (arrow, no JVM) "
                                    "when the file slices read -- every one with --output, else only the first "
                                    "ones, until they hold --limit rows -- fit the memory budget as decoded "
                                    "(their bytes x6), and on Spark otherwise; --master, --remote or $SPARK_REMOTE "
                                    "mean Spark.")
    rd.add_argument("table", help=TABLE_HELP)
    rd.add_argument("--as-of", metavar="INSTANT|TIME",
                    help=f"time travel: the snapshot right after the last commit whose instant is at or before "
                         f"INSTANT, or the one a reader saw at TIME (commits that completed after it are left "
                         f"out). Accepts {AS_OF_FORMS}")
    rd.add_argument("--output", help="write the snapshot as one Parquet file")
    rd.add_argument("--limit", type=int, default=20, help="rows to print without --output")
    _add_spark_options(rd)
    _add_engine_options(rd)

    sh = sub.add_parser("show", help="timeline, file groups, index buckets, pending work")
    sh.add_argument("table", help=TABLE_HELP)
    sh.add_argument("--json", action="store_true", help="machine-readable output")
    sh.add_argument("--plot", metavar="FILE.png",
                    help="draw the histogram of bucket sizes into FILE.png (needs matplotlib: the plot extra)")

    va = sub.add_parser("validate", help="full index <-> data check; exit 1 on any mismatch",
                        description="Check every live row against the index (and the row counts its commits "
                                    "recorded); print the JSON report, exit 1 on any problem. Both engines give "
                                    "the same report. In this process (arrow, no JVM) it holds at most the memory "
                                    "budget: a snapshot whose keys fit -- the key columns of the data files (a "
                                    "quarter of their bytes, x6 decoded) plus about 320 bytes per live row, twice "
                                    "that with the record index's entries -- is checked at once; a larger one in P "
                                    "partitions spilled to the temp dir ($TMPDIR; removed at the end), holding the "
                                    "largest file slice's keys and index bucket's entries plus a P-th of the rest. "
                                    "--engine auto checks in this process whenever that fits, and on Spark "
                                    "otherwise; --master, --remote or $SPARK_REMOTE mean Spark.")
    va.add_argument("table", help=TABLE_HELP)
    _add_spark_options(va)
    _add_engine_options(va)

    sc = sub.add_parser("shadow-compare", help="compare the index's answer for each key with the data (or another "
                                               "index type); exit 1 when mismatches exceed --max-mismatches",
                        description="Compare the index's answer for each key (all keys, or those the commits after "
                                    "--since touched) with the data or another index type; print the JSON report, "
                                    "exit 1 when mismatches exceed --max-mismatches. Both engines give the same "
                                    "report. --engine auto compares in this process (arrow, no JVM) when what it "
                                    "holds fits the memory budget -- with --since, the touched keys (about 320 "
                                    "bytes each, twice with the record index's entries) plus the largest file "
                                    "slice and index bucket read; without it, what validate holds -- and on Spark "
                                    "otherwise; --master, --remote or $SPARK_REMOTE mean Spark.")
    sc.add_argument("table", help=TABLE_HELP)
    sc.add_argument("--against", default="scan", choices=("scan", "global_simple", "bucket"),
                    help="the truth: a key scan of the data (default), or another index type computed on the fly")
    sc.add_argument("--since", metavar="INSTANT|TIME",
                    help="only keys touched by write actions after INSTANT (the previous report's instant; "
                         "leading digits of one also work), or not yet completed at TIME (an ISO-8601 time: "
                         "2026-11-25T09:24:00, 2026-11-25 09:24, 2026-11-25T09:24:00+01:00, ...Z, or a date; "
                         "no zone means UTC)")
    sc.add_argument("--sample-fraction", type=float, default=1.0, metavar="F",
                    help="compare a deterministic sample of about F of the keys, 0 < F <= 1 (default 1)")
    sc.add_argument("--max-mismatches", type=int, default=0, metavar="N",
                    help="exit 1 only when more than N keys mismatch (default 0)")
    sc.add_argument("--report", metavar="FILE", help="also write the JSON report here (a path or URI)")
    _add_spark_options(sc)
    _add_engine_options(sc)

    rb = sub.add_parser("rollback", help="roll back pending instants (all abandoned ones, or INSTANT)")
    rb.add_argument("table", help=TABLE_HELP)
    rb.add_argument("instant", nargs="?", help="the pending instant to roll back (17 digits, as `show` lists it; "
                                                "default: every abandoned one)")
    rb.add_argument("--force", action="store_true",
                    help="even if its writer looks alive (that writer then fails at its commit point, nothing visible)")
    rb.add_argument("--heartbeat-timeout", type=float,
                    help="seconds without a heartbeat before a pending write counts as abandoned (default 60)")
    co = sub.add_parser("compact", help="fold merge-on-read logs and record-index deltas into new base files "
                                        "(schedule, execute, or both)")
    co.add_argument("table", help=TABLE_HELP)
    mode = co.add_mutually_exclusive_group()
    mode.add_argument("--schedule-only", action="store_true",
                      help="only write the plan; its instant is the last line printed (pass it to --execute)")
    mode.add_argument("--execute", metavar="INSTANT", help="execute a scheduled plan (again, after a failure)")
    co.add_argument("--min-logs", type=int, default=None,
                    help="a file group is due with at least this many logs (default 4)")
    co.add_argument("--log-ratio", type=float, default=None,
                    help="... or with logs of at least this fraction of its base's bytes (default 0.2)")
    co.add_argument("--max-groups", type=int, help="at most this many file groups per plan (most log bytes first)")
    co.add_argument("--max-buckets", type=int,
                    help="at most this many record-index buckets per plan (most deltas first)")
    co.add_argument("--min-deltas", type=int, default=None,
                    help="a record-index bucket is due with at least this many deltas (default 10)")
    co.add_argument("--delta-ratio", type=float, default=None,
                    help="... or with deltas of at least this fraction of its base's bytes (default 0.5)")
    co.add_argument("--index-base-cap", type=int, default=None,
                    help="a new record-index base of more than this many entries is sealed: never rewritten "
                         "again, later compactions of its bucket start a new base (default 1000000)")
    co.add_argument("--only", choices=("data", "index"),
                    help="plan only data compaction (merge-on-read logs) or only index compaction (default both)")
    co.add_argument("--heartbeat-timeout", type=float,
                    help="seconds without a heartbeat before an attempt at the plan counts as dead (default 60)")
    co.add_argument("--rebuild-index", action="store_true",
                    help="repair the record index: rebuild its buckets (every one, or those of --bucket) from the "
                         "table's data instead of folding their files, as one compaction commit; for an index file "
                         "that is missing or damaged (validate's index_files_unreadable). Runs in-process")
    co.add_argument("--bucket", type=int, action="append", metavar="N",
                    help="with --rebuild-index: only this index bucket (repeat for more; default every bucket)")
    _add_spark_options(co)
    _add_engine_options(co)  # auto: arrow when the slices and index buckets a plan folds at once fit the budget
    cl = sub.add_parser("clean", help="delete file versions no retained snapshot reads (from a plan on the timeline)")
    cl.add_argument("table", help=TABLE_HELP)
    keep = cl.add_mutually_exclusive_group()
    keep.add_argument("--retain-commits", type=int, metavar="N",
                      help="keep the snapshots of the last N commits (default: the table's clean_retain_commits, 24)")
    keep.add_argument("--retain-hours", type=float, metavar="H", help="keep the snapshots of the last H hours")
    cl.add_argument("--dry-run", action="store_true", help="print what would be deleted; write nothing")
    cl.add_argument("--heartbeat-timeout", type=float,
                    help="seconds without a heartbeat before a pending write no longer holds clean back (default 60)")
    al = sub.add_parser("alter", help="add columns or widen column types: one commit recording the new schema, "
                                      "no data file rewritten",
                        description="Change the table's schema as a timeline action: added columns are nullable "
                                    "(files written before read them as null), a widened column reads older files' "
                                    "values widened. TYPE is a Spark simple type name: tinyint, smallint, int, "
                                    "bigint, float, double, decimal(P,S), string, boolean, binary, date, timestamp "
                                    "(zone-aware, stored in UTC), timestamp_ntz. Widening: tinyint->smallint->int->"
                                    "bigint, float->double, decimal(P,S)->decimal(Q,S) with Q>P, date->"
                                    "timestamp_ntz; anything else is refused (exit 2). Running the same alter again "
                                    "is a no-op. No JVM.")
    al.add_argument("table", help="the table's directory or URI")
    al.add_argument("--add-column", action="append", default=[], metavar="NAME:TYPE",
                    help="add a nullable column (repeat for several), e.g. --add-column discount:decimal(10,2)")
    al.add_argument("--widen-column", action="append", default=[], metavar="NAME:TYPE",
                    help="widen a column to TYPE (repeat for several), e.g. --widen-column qty:bigint")
    al.add_argument("--max-retries", type=int, default=3,
                    help="validate and commit again this often when a concurrent schema change conflicts "
                         "(default 3)")
    al.add_argument("--heartbeat-timeout", type=float,
                    help="seconds without a heartbeat before a pending write counts as abandoned (default 60)")
    rh = sub.add_parser("rehash", help="change the bucket count by a multiple (each bucket splits, no shuffle) "
                                       "or a divisor (buckets merge)")
    rh.add_argument("table", help=TABLE_HELP)
    rh.add_argument("--num-buckets", type=int, required=True, metavar="M",
                    help="the new count: a multiple or a divisor of the count in force (`show` suggests one)")
    rh.add_argument("--heartbeat-timeout", type=float,
                    help="seconds without a heartbeat before a pending write counts as abandoned (default 60)")
    _add_engine_options(rh)
    _add_spark_options(rh)
    bs = sub.add_parser("bootstrap", help="make a table of an existing Parquet dataset (Hive-style partition "
                                          "directories or flat): its files in place, or rewritten")
    bs.add_argument("table", help="the new table's directory or URI (it must not hold a table yet)")
    bs.add_argument("source", help="the dataset's root directory")
    bs.add_argument("--record-key", required=True, type=_csv, help="key field(s), comma-separated")
    bs.add_argument("--partition-field", help="the table's partition field (reference mode: a Hive directory field)")
    bs.add_argument("--precombine-field",
                    help="resolves duplicate keys in the dataset (the highest value wins); without it they are refused")
    bs.add_argument("--index", choices=("record", "bucket", "global_simple"), default="record",
                    help="index type (default record)")
    bs.add_argument("--mode", choices=("reference", "rewrite"),
                    help="reference: the dataset's files become the table's first file slices, in place (record "
                         "index only; the default for it); rewrite: every row is written into the table's layout "
                         "(the default, and the only mode, for the bucket and global_simple indexes)")
    bs.add_argument("--num-buckets", type=int, help="index buckets (record) or buckets per partition (bucket)")
    bs.add_argument("--table-type", choices=TABLE_TYPES,
                    help="default merge_on_read with automatic compaction (copy_on_write with --mirror), "
                         "as for upsert")
    bs.add_argument("--batch-id", help="idempotence key (default: derived from SOURCE, so a rerun is a no-op)")
    bs.add_argument("--target-file-rows", type=int, help="rewrite mode: rows per data file")
    bs.add_argument("--heartbeat-timeout", type=float,
                    help="seconds without a heartbeat before a pending write counts as abandoned (default 60)")
    bs.add_argument("--mirror", choices=MIRRORS,
                    help="also write a Delta Lake log (delta) or Iceberg metadata (iceberg) beside each commit, "
                         "from the bootstrap on (or turn it on later with `bucketindex mirror TABLE --enable ...`)")
    _add_engine_options(bs)  # auto: arrow when the dataset, decoded, fits the budget
    _add_spark_options(bs)
    mi = sub.add_parser("mirror", help="the Delta Lake or Iceberg projection of each commit: turn it on, or "
                                       "write versions a crash left out",
                        description="A table with the Delta projection gets _delta_log/<seq>.json after every "
                                    "commit (Delta version = commit sequence number); one with the Iceberg "
                                    "projection gets metadata/v<seq>.metadata.json (snapshot id = commit "
                                    "sequence number); merge-on-read tables show the read-optimized view "
                                    "(bases as of each file group's last compaction) unless --view fresh. "
                                    "--enable delta|iceberg turns one on and writes every version so far; "
                                    "--repair compares every version of each projection the table has with what "
                                    "the timeline projects and writes the missing ones, rewrites the damaged or "
                                    "outdated ones (and Delta checkpoints built from them).")
    mi.add_argument("table", help="the table's directory or URI")
    mig = mi.add_mutually_exclusive_group(required=True)
    mig.add_argument("--enable", choices=MIRRORS, help="turn the projection on (writes every version so far)")
    mi.add_argument("--view", metavar="{read_optimized,fresh}",
                    help="with --enable, for a merge-on-read table: read_optimized (default) publishes the bases "
                         "as of each file group's last compaction, readable by every reader; fresh publishes every "
                         "commit's rows: each log an added data file, the rows its merge drops position-delete "
                         "files (iceberg: pyiceberg, Polars, DuckDB through pyiceberg apply them) or deletion "
                         "vectors (delta: deltalake's QueryBuilder and Polars apply them, to_pyarrow_table refuses; "
                         "refused for a string or timestamp partition field). Changing it rewrites every version "
                         "in the new view")
    mig.add_argument("--repair", action="store_true",
                     help="check every version against the timeline: write missing ones, rewrite damaged ones")
    for verb in (up, rd, sh, va, sc, rb, co, cl, al, rh, bs, mi):
        verb.add_argument("--storage-option", action="append", default=[], type=_storage_option,
                          metavar="KEY=VALUE", help=STORAGE_OPTION_HELP)
    for name, text in (extra_verbs or {}).items():
        sub.sub.add_parser(name, help=text)
    return p


STORAGE_OPTION_HELP = ("a setting of the table's (and source's) object store, repeatable: endpoint_url, region, "
                       "access_key_id, secret_access_key, session_token, profile, addressing_style; over "
                       "$BUCKETINDEX_STORAGE_OPTIONS and AWS_* variables, under the URI's own query "
                       "(README, \"Object storage\")")


def _storage_option(text: str) -> tuple[str, str]:
    from spark_jobs.io.storage import parse_option

    try:
        return parse_option(text)
    except BadInputError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _spark(args: argparse.Namespace, submitted: bool):  # type: ignore[no-untyped-def]
    _allow_pandas()  # PySpark's Arrow conversions use pandas: pyarrow's shim must see it again
    from spark_jobs.jobs.session import get_spark  # lazy: only Spark verbs start a JVM

    if submitted:
        return get_spark(None, datasource=False)
    remote = args.remote = args.remote or (None if args.master else os.environ.get("SPARK_REMOTE"))
    if remote:  # Spark Connect: no JVM here, nothing to keep off the terminal
        if args.master or getattr(args, "driver_memory", None):
            raise BadInputError("--remote excludes --master and --driver-memory (the server has its own)")
        from spark_jobs.jobs.connect import release_on_exit

        spark = get_spark(remote=remote)
        release_on_exit(spark)
        return spark
    memory = getattr(args, "driver_memory", None)
    if args.verbose:
        return get_spark(args.master or "local[*]", driver_memory=memory, ui=False, datasource=False)
    # The JVM writes its start-up chatter and log4j output to stderr; send it to a log file
    # so the terminal shows our progress lines and, on bad input, exactly one error line.
    # Where: spark_jobs.home (deleted when the run succeeds, kept when it fails, see main).
    from spark_jobs.home import open_spark_log

    fd, log_path, owned = open_spark_log()
    _SPARK_LOG.append((log_path, owned))
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)  # inherited by the JVM that get_spark launches
        spark = get_spark(args.master or "local[*]", driver_memory=memory, ui=False, datasource=False)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
    log.debug("Spark's own log: %s", log_path)
    return spark


def cmd_upsert(args: argparse.Namespace, submitted: bool) -> int:
    from spark_jobs.engines import precheck_upsert, run
    from spark_jobs.table.action.upsert import UpsertOptions

    opts = UpsertOptions.from_args(args)
    precheck_upsert(opts)  # before a JVM starts
    result = run("upsert", opts, spark=lambda: _spark(args, submitted),
                 spark_requested=_spark_requested(args, submitted))
    print(json.dumps(result, sort_keys=True))
    return 0


def cmd_read(args: argparse.Namespace, submitted: bool) -> int:
    from spark_jobs.engines import run
    from spark_jobs.table.action.read import ReadOptions

    opts = ReadOptions.from_args(args)
    result = run("read", opts, spark=lambda: _spark(args, submitted),
                 spark_requested=_spark_requested(args, submitted))
    if result.text is not None:
        sys.stdout.write(result.text)
    elif result.frame is not None:
        result.frame.show(opts.limit, truncate=False)
    else:
        print(f"wrote {plural(result.rows, 'row')} to {redact_uri(opts.output)}")
    return 0


#: index buckets listed by ``show`` (those with the most deltas); ``--json`` has all of them
SHOW_BUCKETS = 8


def cmd_show(args: argparse.Namespace, submitted: bool) -> int:
    from spark_jobs.api import schema_history
    from spark_jobs.table.dataset import public_schema
    from spark_jobs.table.describe import describe
    from spark_jobs.table.schema import type_name
    from spark_jobs.table.table import Table

    table = Table.load(args.table)
    d = describe(table)
    # the columns users read (no _bi_*), in Spark's type names as `alter` takes them; and, per
    # listed entry, what it changed of the schema (an upsert's: schema evolution)
    d["schema"] = [{"name": f.name, "type": type_name(f.type), "nullable": f.nullable}
                   for f in public_schema(table.view().schema)]
    changed = {e.instant: list(e.schema_changes) for e in schema_history(table, limit=len(d["timeline"]))}
    for c in d["timeline"]:
        if changed.get(c["instant"]):
            c["schema_changes"] = changed[c["instant"]]
    if args.plot:  # first: a missing matplotlib is one error line, nothing else printed
        from spark_jobs.table.skew import plot_bucket_sizes

        plot_bucket_sizes(d["bucket_sizes"], args.plot, title=d["uri"])
    if args.json:
        print(json.dumps(d, indent=2, sort_keys=True))
        return 0
    c = d["config"]
    print(f"table      {d['uri']}")
    print(f"index      {c['index_type']} ({plural(c['num_buckets'], 'bucket')}), key {','.join(c['record_key_fields'])}"
          + (f", partitioned by {','.join(c['partition_fields'])}" if c["partition_fields"] else "")
          + (f", precombine {c['precombine_field']}" if c["precombine_field"] else ""))
    print(f"type       {c['table_type']}")
    print(f"schema     {plural(len(d['schema']), 'column')}")
    width = max((len(f["name"]) for f in d["schema"]), default=0)
    for f in d["schema"]:
        print(f"  {f['name']:<{width}}  {f['type']}" + ("" if f["nullable"] else " not null"))
    print(f"snapshot   {plural(d['rows'], 'row')} in {plural(d['file_groups'], 'file group')}, "
          f"{plural(len(d['partitions']), 'partition')}, "
          f"{_human_bytes(d['data_bytes'])} of base files")
    lg = d["logs"]
    if lg["files"] or c["table_type"] == "merge_on_read":
        print(f"logs       {plural(lg['files'], 'log file')}, {_human_bytes(lg['bytes'])}, in "
              f"{plural(lg['file_groups_with_logs'], 'file group')} (at most {lg['max_per_group']} per group)")
        for g in lg["largest"]:
            where = f"{g['partition']}/{g['file_id']}" if g["partition"] else g["file_id"]
            print(f"  {where}: {plural(g['logs'], 'log')}, {_human_bytes(g['log_bytes'])} on a "
                  f"{_human_bytes(g['base_bytes'])} base, {plural(g['rows'], 'row')}")
    print(f"index      {plural(len(d['index_buckets']), 'bucket')} with files, "
          f"{plural(sum(d['index_buckets'].values()), 'index file')}")
    idx = d["index_deltas"]
    if idx["total"]:
        print(f"  deltas: {idx['total']} ({_human_bytes(idx['bytes'])}), at most {idx['max_per_bucket']} per bucket "
              f"(`compact --only index` folds them)")
        most = sorted(idx["buckets"].items(), key=lambda kv: (-kv[1]["deltas"], int(kv[0])))[:SHOW_BUCKETS]
        for b, v in most:
            if v["deltas"]:
                print(f"    bucket {int(b):05d}: {plural(v['deltas'], 'delta')} ({_human_bytes(v['delta_bytes'])}) "
                      f"on {plural(v['bases'], 'base')}")
        if len(idx["buckets"]) > SHOW_BUCKETS:
            print(f"    ... {plural(len(idx['buckets']) - SHOW_BUCKETS, 'more bucket')} (`show --json` lists every one)")
    for p in d["compaction_plans"]:
        print(f"  compaction {p['instant']} {p['state']}: {plural(p['index_buckets'], 'index bucket')} "
              f"({plural(p['index_deltas'], 'delta')}), {plural(p['file_groups'], 'file group')} "
              f"({plural(p['logs'], 'log')}) -- `compact --execute {p['instant']}`")
    from spark_jobs.table.skew import format_bucket_sizes

    for line in format_bucket_sizes(d["bucket_sizes"], d["uri"]):
        print(line)
    if args.plot:
        print(f"plot       {args.plot}")
    cl = d["clean"]
    print(f"clean      retained from {cl.get('retained_from') or 'the first commit'}"
          + (f" (last clean {cl['last_clean']})" if cl.get("last_clean") else "")
          + f"; a clean now ({cl.get('policy')}) would delete {plural(cl.get('would_delete_files', 0), 'file')} "
            f"({_human_bytes(cl.get('would_delete_bytes', 0))})")
    ck = d["checkpoints"]
    print(f"history    {plural(d['completed_instants'], 'completed instant')}; checkpoint every {ck['interval']}: "
          + (f"latest at entry {ck['latest']} ({ck['entries_since']} since), " if ck["latest"] else "none yet, ")
          + f"{plural(ck['archived_entries'], 'entry')} archived in {plural(ck['archive_files'], 'file')}, "
            f"{ck['listed_entries']} listed")
    print(f"pending    {', '.join(d['pending']) or 'none'}")
    if d["writers"]:
        print("writers")
        for w in d["writers"]:
            print(f"  {w['instant']} {w['action']:<10} {w['state']:<9} batch={w['batch_id'] or '-'} "
                  f"{'alive' if w['alive'] else 'scheduled' if w.get('scheduled') else 'abandoned'} "
                  f"host={w['host'] or '?'} pid={w['pid'] or '?'} "
                  f"started={w['started'] or '?'} heartbeat={w['last_heartbeat'] or 'none'}")
    if d["conflicts"]:
        print("recent conflicts")
        for c in d["conflicts"]:
            print(f"  {c['instant']} batch={c['batch_id'] or '-'} {c['outcome']}: {c['reason']} "
                  f"(with {c['with_action']} {c['with']})")
    print("timeline")
    for c in d["timeline"]:
        counts = c["counts"]
        t = c["timings_ms"]
        phases = " ".join(f"{k[:-3]}={v}" for k, v in t.items() if k != "total_ms")
        cnt = (f" +{counts.get('inserted', 0)} ~{counts.get('updated', 0)} -{counts.get('deleted', 0)}" if counts else "")
        if "keys_in_batch" in counts:  # rows read (in-batch duplicates included) and distinct keys
            cnt += f" of {plural(counts.get('rows_in_batch', 0), 'row')}, {plural(counts['keys_in_batch'], 'key')}"
        if c["action"] == "rollback":
            print(f"  {c['instant']} rollback   of {c['rolled_back']}")
            continue
        if c.get("alter") is not None:  # bucketindex alter: a schema change, no data
            print(f"  {c['instant']} alter      {'; '.join(c['alter'].get('changes') or []) or 'no change'}")
            continue
        if c.get("properties") is not None:  # bucketindex mirror --enable: a table property, no data
            props = "; ".join(f"{k} = {','.join(v) if isinstance(v, list) else v}" for k, v in c["properties"].items())
            print(f"  {c['instant']} properties {props}")
            continue
        if c["action"] == "clean":
            print(f"  {c['instant']} clean      {plural(counts.get('files', 0), 'file')}, "
                  f"{_human_bytes(counts.get('bytes', 0))}")
            continue
        if c["action"] == "rehash":
            print(f"  {c['instant']} rehash     {counts.get('previous_num_buckets')} -> {counts.get('num_buckets')} "
                  f"buckets, {plural(counts.get('file_groups_written', 0), 'file group')}, "
                  f"{plural(counts.get('index_buckets', 0), 'index bucket')} written" + (f"  [{phases}]" if t else ""))
            continue
        if c["action"] == "compaction":
            engine = c.get("engine") or {}
            print(f"  {c['instant']} compaction {plural(counts.get('file_groups', 0), 'file group')}, "
                  f"{plural(counts.get('logs_folded', 0), 'log')} folded, "
                  f"{plural(counts.get('index_buckets', 0), 'index bucket')}, "
                  f"{plural(counts.get('index_deltas_folded', 0), 'delta')} folded"
                  + (f"  [{phases}]" if t else "")
                  + (f"  engine={engine['name']} ({engine.get('reason', '')})" if engine.get("name") else ""))
            continue
        start = f" +session start {c['session_start_ms']}ms" if c.get("session_start_ms") else ""
        engine = c.get("engine") or {}
        start += f"  engine={engine['name']} ({engine.get('reason', '')})" if engine.get("name") else ""
        print(f"  {c['instant']} {c['action']:<10}{cnt}  batch={c['batch_id'] or '-'}"
              + (f"  total={t.get('total_ms')}ms [{phases}]{start}" if t else ""))
        if c.get("schema_changes"):  # an upsert with --schema-evolution changed the table's schema
            print(f"  {'':<17} schema evolved: {'; '.join(c['schema_changes'])}")
        if c.get("shadow"):
            print(f"  {'':<17} {_shadow_line(c['shadow'])}")
        if c.get("bootstrap"):
            b = c["bootstrap"]
            bc = b.get("counts", {})
            print(f"  {'':<17} {b.get('mode')} bootstrap of {b.get('source')}: "
                  f"{plural(bc.get('files_referenced', 0), 'file')} referenced in place, {bc.get('files_rewritten', 0)} "
                  f"rewritten, {plural(bc.get('duplicate_keys', 0), 'duplicated key')} resolved")
    return 0


def _shadow_line(sh: dict) -> str:
    """One line for a commit's tee (``upsert --shadow-index``): counts, and sample keys when any disagree."""
    order = ("missing", "extra", "wrong_location")  # upsert's TEE_KINDS (the metadata's JSON sorts its keys)
    d = dict(sorted(sh.get("disagreements", {}).items(), key=lambda kv: (kv[0] not in order, order.index(kv[0])
                                                                          if kv[0] in order else 0, kv[0])))
    total = sum(d.values())
    line = (f"shadow {sh.get('shadow_index')}: {plural(sh.get('keys_compared', 0), 'key')} compared, "
            + (", ".join(f"{v} {k}" for k, v in d.items()) if total else "no disagreements"))
    samples = [f"{k} {', '.join(repr(x) for x in sh.get('samples', {}).get(k, []))}" for k in d
               if sh.get("samples", {}).get(k)]
    return line + (f" (e.g. {'; '.join(samples)})" if samples else "")


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def cmd_validate(args: argparse.Namespace, submitted: bool) -> int:
    from spark_jobs.engines import run
    from spark_jobs.table.action.validate import ValidateOptions

    opts = ValidateOptions.from_args(args)
    report = run("validate", opts, spark=lambda: _spark(args, submitted),
                 spark_requested=_spark_requested(args, submitted))
    print(json.dumps(report, indent=2, sort_keys=True))
    if not report["ok"]:
        missing = report["problems"].get("data_files_missing")
        files = (f" ({missing['count']} data files missing, e.g. {', '.join(missing['samples'][:3])})"
                 if missing else "")
        from spark_jobs.table.validation import index_repair_hint

        unreadable = report["problems"].get("index_files_unreadable")
        if unreadable:
            files += (f" ({plural(unreadable['count'], 'index file')} unreadable, e.g. {unreadable['samples'][0]}: "
                      f"rebuild with `{index_repair_hint(args.table, report)}`)")
        print(f"bucketindex: validate found problems: {', '.join(report['problems'])}{files}", file=sys.stderr)
        return EXIT_FINDING
    return 0


def cmd_shadow_compare(args: argparse.Namespace, submitted: bool) -> int:
    from spark_jobs.engines import run
    from spark_jobs.table.action.shadow_compare import ShadowCompareOptions
    from spark_jobs.table.shadow import write_report

    opts = ShadowCompareOptions.from_args(args)
    report = run("shadow-compare", opts, spark=lambda: _spark(args, submitted),
                 spark_requested=_spark_requested(args, submitted))
    print(json.dumps(report, indent=2, sort_keys=True))
    if opts.report:
        write_report(report, opts.report)
    if not report["ok"]:
        kinds = ", ".join(f"{k} {report[k]}" for k in ("missing", "wrong_location", "extra", "duplicated") if report[k])
        print(f"bucketindex: shadow-compare found {plural(report['mismatches'], 'mismatch')} "
              f"(more than {report['max_mismatches']}): {kinds}", file=sys.stderr)
        return EXIT_FINDING
    return 0


def cmd_rollback(args: argparse.Namespace, submitted: bool) -> int:
    from spark_jobs.table.action.rollback import RollbackOptions, rollback
    from spark_jobs.table.table import Table

    opts = RollbackOptions.from_args(args)
    done = rollback(Table.load(opts.table), opts.instant, force=opts.force, timeout_s=opts.heartbeat_timeout_s)
    print(f"rolled back {', '.join(done)}" if done else "nothing to roll back")
    return 0


def cmd_compact(args: argparse.Namespace, submitted: bool) -> int:
    from spark_jobs.engines import run
    from spark_jobs.table.action.compact import CompactOptions

    opts = CompactOptions.from_args(args)
    if opts.rebuild_index:
        return _rebuild_index(args, opts, submitted)
    result = run("compact", opts, spark=lambda: _spark(args, submitted),
                 spark_requested=_spark_requested(args, submitted))
    print(json.dumps(result, sort_keys=True))
    if result["instant"] is None:
        print("nothing to compact: no file group or index bucket is due")
    elif opts.schedule_only:
        print(result["instant"])  # the last line: scripts pass it to --execute
    return 0


def _rebuild_index(args: argparse.Namespace, opts: "CompactOptions", submitted: bool) -> int:
    """``compact --rebuild-index``: record-index buckets rebuilt from the data, in this process."""
    from spark_jobs.exceptions import EngineUnsupportedError

    spark_requested = _spark_requested(args, submitted)
    if spark_requested == "$SPARK_REMOTE":  # the environment's default for Spark verbs: no Spark runs here
        spark_requested = None
    if opts.engine == "spark" or spark_requested:
        raise EngineUnsupportedError(f"--rebuild-index runs in-process (the arrow engine), not on Spark "
                                     f"({'--engine spark' if opts.engine == 'spark' else spark_requested}): "
                                     f"drop that option")
    from spark_jobs.arrow_engine.compact import run_rebuild_index

    result = run_rebuild_index(opts.table, buckets=opts.bucket, index_base_cap=opts.index_base_cap,
                               heartbeat_timeout_s=opts.heartbeat_timeout_s)
    print(json.dumps(result, sort_keys=True))
    counts = result.get("counts", {})
    print(f"rebuilt {plural(len(result['buckets']), 'index bucket')} from the data at instant {result['instant']} "
          f"({plural(counts.get('index_entries', 0), 'entry')})")
    return 0


def cmd_clean(args: argparse.Namespace, submitted: bool) -> int:
    from spark_jobs.table.action.clean import CleanOptions, run_clean

    opts = CleanOptions.from_args(args)
    result = run_clean(opts.table, retain_commits=opts.retain_commits, retain_hours=opts.retain_hours,
                       dry_run=opts.dry_run, heartbeat_timeout_s=opts.heartbeat_timeout_s)
    print(json.dumps(result, sort_keys=True))
    verb = "would delete" if opts.dry_run else "deleted"
    if result["files"]:
        print(f"{verb} {plural(result['files'], 'file')} ({_human_bytes(result['bytes'] or 0)}); snapshots from instant "
              f"{result['earliest_retained']} on are retained ({result['policy']})")
    else:
        print(f"nothing to clean ({result['policy']})")
    return 0


def cmd_alter(args: argparse.Namespace, submitted: bool) -> int:
    from spark_jobs.table.action.alter import AlterOptions, run_alter

    opts = AlterOptions.from_args(args)
    result = run_alter(opts.table, add_columns=opts.add_columns, widen_columns=opts.widen_columns,
                       max_retries=opts.max_retries, heartbeat_timeout_s=opts.heartbeat_timeout_s)
    print(json.dumps(result, sort_keys=True))
    if result["noop"]:
        print("the table already has this schema: nothing to do")
    else:
        print(f"altered the schema at instant {result['instant']}: "
              f"{'; '.join(result['changes']) or 'no change (a concurrent alter made it)'}")
    return 0


def cmd_rehash(args: argparse.Namespace, submitted: bool) -> int:
    from spark_jobs.engines import run
    from spark_jobs.table.action.rehash import RehashOptions

    opts = RehashOptions.from_args(args)
    result = run("rehash", opts, spark=lambda: _spark(args, submitted), spark_requested=_spark_requested(args, submitted))
    print(json.dumps(result, sort_keys=True))
    if result["noop"]:
        print(f"the table already has {plural(opts.num_buckets, 'bucket')}: nothing to do")
    else:
        c = result["counts"]
        print(f"rehashed {result['previous_num_buckets']} -> {result['num_buckets']} buckets at instant "
              f"{result['instant']} on {result['engine']['name']} ({result['engine']['reason']}): "
              f"{plural(c['file_groups_written'], 'file group')}, {plural(c['index_buckets'], 'index bucket')} written")
    return 0


def cmd_mirror(args: argparse.Namespace, submitted: bool) -> int:
    from spark_jobs.table import delta, projection
    from spark_jobs.table.action.mirror import MirrorOptions
    from spark_jobs.table.config import MIRRORS
    from spark_jobs.table.table import Table

    opts = MirrorOptions.from_args(args)
    if opts.enable:
        from spark_jobs.table.action.mirror import enable_mirror

        # the commit's own post-commit hook writes the history, before enable_mirror's repair
        # (which then finds nothing to write): count what is there now and was not before
        writer = projection.module(opts.enable)
        before = set(writer.versions_present(Table.open(opts.table)))
        result = enable_mirror(opts.table, opts.enable, view=opts.view)
        result["written"] = sorted(set(writer.versions_present(Table.open(opts.table))) - before)
    else:
        table = Table.load(opts.table)
        enabled = [m for m in MIRRORS if m in delta.mirrors(table)]
        if not enabled:
            raise BadInputError(f"the table {opts.table} has no projection; turn one on with "
                                f"`bucketindex mirror {opts.table} --enable delta` (or iceberg)")
        for m in enabled:  # Delta first: a table with only a Delta log prints what it always did
            report = projection.module(m).verify_and_repair(table)
            print(json.dumps(report.as_dict(), sort_keys=True))
            if m == "delta":
                print(f"Delta log at version {report.version}: every version checked; "
                      f"{plural(len(report.written), 'missing version')} written, "
                      f"{plural(len(report.rewritten), 'damaged or outdated version')} rewritten, "
                      f"{plural(len(report.checkpoints), 'checkpoint')} rewritten")
            else:
                print(f"Iceberg metadata at version {report.version}: every version checked; "
                      f"{plural(len(report.written), 'missing version')} written, "
                      f"{plural(len(report.rewritten), 'damaged or outdated version')} rewritten")
        return 0
    print(json.dumps(result, sort_keys=True))
    fresh = " (fresh view)" if result.get("view") == "fresh" else ""
    print(f"{projection.NAMES[opts.enable]} at version {result['version']}{fresh}: "
          f"{plural(len(result['written']), 'version')} written")
    return 0


def cmd_bootstrap(args: argparse.Namespace, submitted: bool) -> int:
    from spark_jobs.engines import run
    from spark_jobs.io.filesystem import resolve
    from spark_jobs.table.action.bootstrap import BootstrapOptions

    opts = BootstrapOptions.from_args(args)  # bad options: one line, exit 2, before a JVM starts
    io, path = resolve(opts.source)
    if not io.exists(path):
        raise BadInputError(f"source {opts.source} does not exist")
    result = run("bootstrap", opts, spark=lambda: _spark(args, submitted),
                 spark_requested=_spark_requested(args, submitted))
    print(json.dumps(result, sort_keys=True))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, bool], int]] = {
    "alter": cmd_alter,
    "bootstrap": cmd_bootstrap,
    "mirror": cmd_mirror,
    "clean": cmd_clean,
    "compact": cmd_compact,
    "upsert": cmd_upsert,
    "read": cmd_read,
    "rehash": cmd_rehash,
    "show": cmd_show,
    "validate": cmd_validate,
    "shadow-compare": cmd_shadow_compare,
    "rollback": cmd_rollback,
}


#: the verbs whose in-process paths (the Arrow engine, the pure-Python core) never use pandas:
#: the program keeps pyarrow from loading it for them (:func:`_defer_pandas`); their Spark paths
#: allow it again before a session starts (:func:`_spark`)
PANDAS_FREE_VERBS = frozenset({"upsert", "read", "validate", "show", "compact", "rehash", "clean", "rollback"})

#: not empty once :func:`_defer_pandas` has kept pandas out of this process
_PANDAS_DEFERRED: list[bool] = []

#: the Spark log files this process opened (path, ours to delete): see :func:`main`
_SPARK_LOG: list[tuple[str, bool]] = []


def _defer_pandas() -> None:
    """Keep pyarrow from importing pandas in this process until something really asks for it.

    Why: pyarrow (tested with 26.0.1) loads pandas, about a third of a second of a cold
    ``bucketindex upsert``, though the Arrow engine never uses it, from two places that each try
    once per process and remember a failed import:

    * its lazy shim ``pyarrow.lib._pandas_api``, on the first Python-to-Arrow conversion
      (``pa.array``, ``pa.table``, a Python scalar given to a compute function): ``have_pandas``
      probes (``_check_import``, then ``_tried_importing_pandas``, ``_have_pandas``; not writable
      from Python);
    * its C++ side (``arrow::py::internal::InitPandasStaticData``: pandas' ``NaT``, ``NA``,
      ``Timestamp`` sentinels), on the first ``to_numpy`` of a non-zero-copy array, a type
      inference, or ``import pyarrow.dataset``.

    Both are made to try here, once, while a finder first on ``sys.meta_path`` makes ``import
    pandas`` raise ``ImportError`` (``sys.modules["pandas"] = None`` would not do: Cython's import
    returns that None, and the shim fails on it); then the finder is removed. The shim's probes
    (``is_data_frame``, ``is_series``, ...) then answer False without importing; its explicit uses
    (``to_pandas``, ``from_pandas``, ``_pandas_api.pd``) still import pandas when called
    (:func:`_allow_pandas`). What stays for the process: pyarrow's C++ conversion of Python
    objects does not recognise pandas' ``NaT``/``NA``/``Timestamp`` objects -- which is why this
    runs only in the ``bucketindex`` program's own process (``main(console=True)``), on verbs not
    sent to Spark, which never convert a pandas object; never in a user's program that imports
    the library and may pass pandas frames.

    A no-op when pandas is already loaded or pyarrow is not one with that shim (the attribute
    names are checked here); an error in the probes leaves pyarrow to import pandas when asked."""
    if "pandas" in sys.modules:
        return
    try:
        from pyarrow import lib
    except ImportError:  # no pyarrow: nothing to keep out
        return
    shim = getattr(lib, "_pandas_api", None)
    if shim is None or not hasattr(type(shim), "have_pandas"):  # on the type: on the shim it would probe
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    _PANDAS_DEFERRED.append(True)
    try:
        shim.have_pandas  # noqa: B018 - the shim's probe: it records that pandas is absent
        lib.array([None]).to_numpy(zero_copy_only=False)  # the C++ side's (type inference, to_numpy)
    except Exception:  # noqa: BLE001 - another pyarrow: whatever it did, pandas is imported when asked
        pass
    finally:
        sys.meta_path.remove(finder)


class _NoPandas:
    """A meta path finder for which pandas is not installed (:func:`_defer_pandas`)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas":
            raise ModuleNotFoundError("pandas is kept out of this process", name=name)
        return None


def _allow_pandas() -> None:
    """Before work that may use pandas (a Spark session: PySpark's Arrow conversions), let
    pyarrow's shim import it again (``_pandas_api.pd``, its explicit import), so that its
    pandas probes answer as in any program. A no-op when pyarrow is not loaded yet (it will
    look for pandas itself), when :func:`_defer_pandas` did not run (a program that calls
    :func:`main` keeps pyarrow as it is) or pandas is not installed."""
    if "pyarrow" not in sys.modules or not _PANDAS_DEFERRED:
        return
    _PANDAS_DEFERRED.clear()
    from pyarrow import lib

    try:
        getattr(lib, "_pandas_api").pd  # noqa: B009 - the shim's explicit import
    except Exception:  # noqa: BLE001 - no pandas installed, or another pyarrow: nothing to undo
        pass


def main(argv: list[str] | None = None, *, submitted: bool = False,
         extra_verbs: dict[str, str] | None = None, console: bool = False) -> int:
    """Run one verb; exit status as the module doc says. The Spark log a run opened
    (:mod:`spark_jobs.home`) is deleted when the run succeeds and kept, and named, when it fails.

    ``console``: this process is the ``bucketindex`` program itself (its console script or
    ``python -m``), not a program that imports the library: pyarrow is then kept from
    importing pandas, which the Arrow engine never uses (:func:`_defer_pandas`), and the process
    ends as soon as the verb's work and output are done (:func:`_end_process`)."""
    status = _run(argv, submitted=submitted, extra_verbs=extra_verbs, console=console)
    if console:
        _end_process(status)
    return status


def _end_process(status: int) -> None:
    """End the ``bucketindex`` program's own process now, with ``status``, skipping the
    interpreter's teardown when nothing is left for it to do.

    Why: after an Arrow verb, the teardown -- clearing every module's objects (pyarrow's ~500
    compute function wrappers, numpy's), the garbage collector's passes over them, Arrow's
    thread pools and allocator -- took 0.1 s of CPU, a quarter of a cold 200-row upsert's goal
    (issue 38), and does nothing a finished program needs: its files are written and closed,
    its commit is done. What the teardown would still do is done here: the ``atexit`` functions
    (logging's handlers flushed, temporary folders a verb registered removed) and standard output
    and error flushed. Not skipped, so the interpreter ends as usual:
    when Spark was loaded (a JVM or a Connect client releases itself in its ``atexit`` hooks), when
    another Python thread is still running (it would be waited for), under a tracer or coverage
    (their data is written at exit), or when flushing the output fails (the usual path reports it)."""
    if "pyspark" in sys.modules or "coverage" in sys.modules or sys.gettrace() is not None \
            or threading.active_count() > 1:
        return
    atexit._run_exitfuncs()  # what the program registered still runs (logging's shutdown among them)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(status)


def _run(argv: list[str] | None, *, submitted: bool, extra_verbs: dict[str, str] | None, console: bool) -> int:
    status = 1
    try:
        status = _main(argv, submitted=submitted, extra_verbs=extra_verbs, console=console)
        sys.stdout.flush()  # a reader that went away (`show | head`) is told here, not at the interpreter's exit
        return status
    except BrokenPipeError:
        _stdout_gone()
        return 1
    finally:
        while _SPARK_LOG:
            from spark_jobs.home import finish_spark_log

            path, owned = _SPARK_LOG.pop()
            if finish_spark_log(path, ok=status == 0, owned=owned) and status != 0:
                if sys.exc_info()[0] not in (None, SystemExit):  # a traceback follows: say where the JVM's side is
                    print(f"bucketindex: Spark's log of this run: {path}", file=sys.stderr)
                else:  # a handled failure stays one line; -v (no log file then) or the logs folder tell more
                    log.debug("Spark's log of this run: %s", path)


def _stdout_gone() -> None:
    """Standard output's reader closed it (``bucketindex show T | head``): stop without a
    traceback, as Python's documentation on SIGPIPE recommends -- point stdout at devnull so
    the interpreter's own flush at exit cannot raise again; the caller exits 1, the status a
    Python program that lost its output has (the work itself finished or stopped where it was)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # replaced by a test's capture: nothing to redirect
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _main(argv: list[str] | None = None, *, submitted: bool = False,
          extra_verbs: dict[str, str] | None = None, console: bool = False) -> int:
    line = sys.argv[1:] if argv is None else argv
    verb = verb_of(line)
    args = build_parser(extra_verbs, verbs=() if verb is None else (verb,)).parse_args(line)
    if console and args.verb in PANDAS_FREE_VERBS and getattr(args, "engine", None) != "spark" \
            and not _spark_requested(args, submitted):  # after parsing: --help does not load pyarrow
        _defer_pandas()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:  # the handler basicConfig made (or the embedding app's)
        if isinstance(handler, logging.StreamHandler) and type(handler.formatter) is logging.Formatter:
            handler.setFormatter(_RedactingFormatter(handler.formatter._fmt, handler.formatter.datefmt))
    # botocore's debug lines print each request's headers, a session token among them: never, even with -v
    for name in ("botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(name).setLevel(max(logging.INFO, logging.getLogger(name).getEffectiveLevel()))
    if hasattr(args, "storage_option"):  # this run's settings, carried to Spark tasks by the jobs
        from spark_jobs.io import storage

        storage.configure(dict(args.storage_option))
    if hasattr(args, "remote"):  # a Spark verb: a Connect server's tasks do not share our working directory
        for name in ("table", "source"):
            if getattr(args, name, None):
                setattr(args, name, _absolute(getattr(args, name)))
    try:
        if args.verb in COMMANDS:
            _check_table(args)
        return COMMANDS[args.verb](args, submitted)
    except BucketIndexError as e:  # one line; the exit status is the error class's (exceptions.py)
        print(error_line(args.verb, e), file=sys.stderr)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - only resource failures and a lost server are translated, the rest re-raised
        from spark_jobs.jobs.connect import is_connection_error
        from spark_jobs.resources import describe_resource_failure

        if is_connection_error(e):
            # a writer aborts its own instant on the way out, and a batch id is never applied twice
            print(f"bucketindex: the Spark Connect server went away: {_one_line(e)[:300]}; "
                  f"safe to retry with the same batch id", file=sys.stderr)
            return StorageUnavailableError.exit_code

        told = _told_apart(args, e)
        if told is not None:
            status, line = told
            print(redact_uri(line), file=sys.stderr)
            return status
        what = describe_resource_failure(e, master=_master(args, submitted),
                                         driver_memory=getattr(args, "driver_memory", None),
                                         table_root=_absolute(args.table) if getattr(args, "table", None) else None,
                                         output=getattr(args, "output", None))
        if what is None:
            raise
        log.debug("resource failure", exc_info=True)
        tail = "; nothing was committed (the write was rolled back)" if args.verb == "upsert" else ""
        print(redact_uri(f"bucketindex: {args.verb} failed: {what}{tail}"), file=sys.stderr)
        return EXIT_RESOURCE


#: a resource ran out or the store refused access: the environment's problem, not the input's
EXIT_RESOURCE = BucketIndexError.exit_code
#: a check (validate, shadow-compare) found a problem: what TableCorruptError is when a verb meets it
EXIT_FINDING = TableCorruptError.exit_code


def error_line(verb: str, e: BucketIndexError) -> str:
    """The one line an error of ours prints: bad input as ``error:``, a retryable condition as
    itself (it starts with ``conflict:`` or names the live writer), anything else as the verb's
    failure (a damaged table, a missing package)."""
    if isinstance(e, BadInputError):
        return f"bucketindex: error: {_one_line(e)}"
    if isinstance(e, RetryableError):
        return f"bucketindex: {_one_line(e)}"
    return f"bucketindex: {verb} failed: {_one_line(e)}"


def _check_table(args: argparse.Namespace) -> None:
    """Open the table before any work (and before a JVM starts): a table path that is a file
    is bad input (exit 2), damaged metadata (TableCorruptError) and a store that refuses to
    be read (OSError) fail here in a second with one line, not after a Spark session."""
    import pyarrow.fs as pafs

    from spark_jobs.io.filesystem import refuse_uncommittable_uri, resolve
    from spark_jobs.table.table import Table

    uri = getattr(args, "table", None)
    if not uri:
        return
    refuse_uncommittable_uri(uri)  # an hdfs://, gs:// or abfs:// table: one line, before its filesystem is built
    io, root = resolve(uri)
    try:
        kind = io.fs.get_file_info(root).type
    except NotADirectoryError:  # a path below a file
        kind = pafs.FileType.File
    if kind == pafs.FileType.File:
        raise BadInputError(f"table path {uri} is a file, not a table directory")
    Table.open(uri)  # parses table.json and the sequence entries after the last checkpoint


#: errno values that mean the store refused access: the store's (or its owner's) problem, not the input's
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}
#: the patterns below classify a failed run's error text: kept as strings and compiled by ``re``'s
#: cache on the first failure, so a run that succeeds compiles none of them (issue 38)
_TEMP_NAME = r"/\.[^/]+\.[0-9a-f]{32}\.tmp$"
_CORRUPT_IN_TASK = r"(?:Table|Index)CorruptError: ([^\n]+)"
_UNAVAILABLE_IN_TASK = r"StorageUnavailableError: ([^\n]+)"
_MISSING_DEPENDENCY_IN_TASK = r"MissingDependencyError: ([^\n]+)"
_MISSING = r"PATH_NOT_FOUND|FileNotFoundError|No such file or directory"
#: Spark's own Parquet scan of a table file whose bytes are wrong (a page failing its checksum,
#: verified as the session's ``parquet.page.verify-checksum.enabled`` asks, or not decoding)
_SPARK_FAILED_FILE = r"FAILED_READ_FILE[.\w]*\] Encountered error while reading file (\S+?)\.?(?:\s|$)"
_SPARK_DAMAGE = r"CRC checksum verification failed|ParquetDecodingException|could not verify page integrity"


def _told_apart(args: argparse.Namespace, e: BaseException) -> tuple[int, str] | None:
    """Exit status and one line for failures that are not resources but surface as an engine's
    exception: a damaged or missing table file (1), storage that refused access (1: the
    store's problem, not the input's). None: not one of those."""
    text = f"{type(e).__name__}: {e}"
    m = re.search(_CORRUPT_IN_TASK, text)
    if m:
        return TableCorruptError.exit_code, (f"bucketindex: {args.verb} failed: {m.group(1).strip()}"
                                             + _nothing_committed(args))
    m = re.search(_SPARK_FAILED_FILE, text)
    if m and re.search(_SPARK_DAMAGE, text):
        from urllib.parse import unquote

        from spark_jobs.io.parquet import damaged_file_error

        uri = m.group(1)
        path = unquote(uri.removeprefix("file://")) if uri.startswith("file:") else uri  # Spark's URI-encoded name
        why = re.search(_SPARK_DAMAGE, text).group(0)  # type: ignore[union-attr]
        return TableCorruptError.exit_code, (
            f"bucketindex: {args.verb} failed: {_one_line(damaged_file_error(path, ValueError(why)))}"
            + _nothing_committed(args))
    m = re.search(_UNAVAILABLE_IN_TASK, text)
    if m:  # a task's store stopped answering: retryable, whatever engine error wraps it
        return StorageUnavailableError.exit_code, f"bucketindex: {m.group(1).strip()}"
    from spark_jobs.io.filesystem import is_unreachable

    if is_unreachable(e):  # pyarrow's client could not reach the store: retryable, not the input's fault
        return StorageUnavailableError.exit_code, (
            f"bucketindex: {args.verb} failed: the store did not answer ({_one_line(e)[:300]}); "
            f"nothing was committed, safe to retry")
    m = re.search(_MISSING_DEPENDENCY_IN_TASK, text)
    if m:
        return MissingDependencyError.exit_code, f"bucketindex: {args.verb} failed: {m.group(1).strip()}"
    from spark_jobs.jobs.hadoop_fs import CONNECTOR, is_missing_filesystem  # no pyspark import

    if is_missing_filesystem(text):  # Spark's own reader or writer handed a path on a store it cannot open
        return MissingDependencyError.exit_code, (
            f"bucketindex: {args.verb} failed: Spark cannot open this store's paths: it needs {CONNECTOR} "
            f"on its classpath (e.g. --packages org.apache.hadoop:hadoop-aws:<Spark's Hadoop version>)"
            + _nothing_committed(args))
    if re.search(_MISSING, text) and getattr(args, "table", None):
        missing = _missing_files(args.table)
        if missing:
            from spark_jobs.table.reader import missing_file_error

            more = f" ({len(missing)} files are missing)" if len(missing) > 1 else ""
            return TableCorruptError.exit_code, (
                f"bucketindex: {args.verb} failed: {_one_line(missing_file_error(missing[0]))}{more}"
                + _nothing_committed(args))
    from spark_jobs.resources import first_os_error

    err = first_os_error(e)
    if err is not None and err.errno in _DENIED:
        where = str(err.filename or getattr(args, "table", None) or "?")
        if re.search(_TEMP_NAME, where):  # FileIO's temp file for an atomic create: name the directory
            where = where.rsplit("/", 1)[0]
        return EXIT_RESOURCE, (
            f"bucketindex: {args.verb} failed: permission denied on {where} ({err.strerror or 'denied'}): "
            f"the store refused access; grant this user access to the table's files and run again"
            + _nothing_committed(args))
    return None


def _nothing_committed(args: argparse.Namespace) -> str:
    return "; nothing was committed" if args.verb == "upsert" else ""


def _missing_files(uri: str) -> list[str]:
    """The latest snapshot's files missing on storage (asked only after a read failed)."""
    from spark_jobs.table.table import Table

    try:
        table = Table.load(uri)
        return table.missing_files(table.view())
    except Exception:  # noqa: BLE001 - a diagnosis must not replace the error it explains
        return []


def _master(args: argparse.Namespace, submitted: bool) -> str | None:
    if not submitted:  # a Spark Connect URL: the server's resources, never a local driver's
        return getattr(args, "remote", None) or getattr(args, "master", None) or "local[*]"
    try:  # under spark-submit the master is the session's
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        return active.conf.get("spark.master") if active is not None else None
    except Exception:  # noqa: BLE001 - the JVM may be gone; then say nothing about the master
        return None


def _absolute(uri: str) -> str:
    """A plain relative path made absolute (URIs with a scheme are left alone)."""
    from urllib.parse import urlparse

    scheme = urlparse(uri).scheme
    return os.path.abspath(uri) if (scheme == "" or len(scheme) == 1) and not os.path.isabs(uri) else uri


def _one_line(e: BaseException) -> str:
    """An error as the one line the CLI prints: whitespace folded, a URI's secrets redacted (an
    error may quote a URI as given, or a store's error text may)."""
    return redact_uri(" ".join(str(e).split()))


class _RedactingFormatter(logging.Formatter):
    """Every log line of a run -- its own and its libraries' (pyarrow's errors, a traceback with
    ``-v``) -- with a URI's secrets redacted (:func:`~spark_jobs.io.storage.redact_uri`)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_uri(super().format(record))



if __name__ == "__main__":
    sys.exit(main(console=True))
