"""The rules of ``validate``, whichever engine runs it (Spark: :mod:`spark_jobs.jobs.validate`,
in-process: :mod:`spark_jobs.arrow_engine.validate`).

An engine reads the keys of every live row with its file group, and for the record index
every live index entry; what is a problem, how it is counted and which samples the report
shows is decided here, so both engines give the same report for the same snapshot:

* ``data_files_missing`` / ``reference_files_changed``: a file the snapshot reads is not on
  storage (or a reference file no longer has its recorded size); nothing else is checked then.
* ``index_files_unreadable`` (record index): an index file the snapshot reads is missing or
  is not an index file (truncated, overwritten), sampled as ``<path>: <why>``. Its bucket is
  left out of the record-index checks below (its entries cannot be known: every key would
  count as missing, or an older entry as pointing elsewhere); every other bucket is checked.
  ``bucketindex compact TABLE --rebuild-index --bucket N`` rebuilds it.
* ``damaged_files``: a file the snapshot reads (base, log, reference or index file, but those
  already ``index_files_unreadable``) whose bytes are wrong -- a Parquet page failing its
  checksum or not decoding, a footer that does not parse, an index file breaking its
  invariants -- sampled as ``"<path>: <why>"``; every file is read whole for it
  (``tasks.verify_files``). Nothing else is checked then either.
* ``row_count_mismatch``: a file group whose rows read differ from the ``num_rows`` its
  commit recorded (also one read from zero rows, or read and not in the view).
* ``duplicate_keys``: a key read more than once (per partition for the bucket index): one
  count per duplicated identity.
* ``rows_in_wrong_bucket`` (bucket index): a row whose file group is not its key's bucket.
* record index, per row of the full outer join of data rows and live entries on the key's
  fingerprint: ``keys_missing_from_index`` (a row without an entry),
  ``index_entries_without_row`` (an entry without a row; sampled as ``fp_hi:fp_lo``, signed),
  ``index_points_to_wrong_file`` (the entry names another partition or file group) and
  ``index_entries_in_wrong_bucket`` (the entry sits in a bucket its key does not hash to).
  Comparisons follow SQL's three-valued logic: a comparison with a null is not a finding.

A problem is ``{"count": N, "samples": [...]}``: the ``SAMPLES`` smallest sample values
(string order), so the report is the same on every run and on every engine.
"""

from __future__ import annotations

import shlex
from typing import Any, Iterable, Mapping

from spark_jobs.exceptions import IndexCorruptError
from spark_jobs.index.record_index import IndexFile
from spark_jobs.table.config import INDEX_BUCKET, INDEX_RECORD
from spark_jobs.table.layout import is_reference
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView

__all__ = [
    "SAMPLES", "KEY", "new_report", "finish", "check_files", "check_index_files", "files_to_verify", "add_damaged",
    "row_count_mismatches", "add_problem",
    "duplicate_identity", "fingerprint_sample", "RECORD_INDEX_CHECKS",
]

SAMPLES = 5
#: the record key column every engine reads (``spark_jobs.kernels.tasks.KEY``)
KEY = "_bi_key"
#: the record-index checks over the join of rows and entries, in report order
RECORD_INDEX_CHECKS = ("keys_missing_from_index", "index_entries_without_row", "index_points_to_wrong_file",
                       "index_entries_in_wrong_bucket")


def new_report(table: Table, view: FileSystemView) -> tuple[dict[str, Any], dict[str, Any]]:
    """The report before any row is read, and its (empty) ``problems``."""
    assert table.config is not None
    problems: dict[str, Any] = {}
    report: dict[str, Any] = {"rows": 0, "rows_expected": view.num_rows, "index_type": table.config.index_type,
                              "problems": problems}
    return report, problems


def finish(report: dict[str, Any]) -> dict[str, Any]:
    report["ok"] = not report["problems"]
    return report


def add_problem(problems: dict[str, Any], name: str, count: int, samples: Iterable[Any]) -> None:
    """Record ``name`` when ``count`` is positive; ``samples`` may be all of the values or
    already the smallest ``SAMPLES`` of them."""
    if count:
        problems[name] = {"count": int(count), "samples": sorted(samples)[:SAMPLES]}


def check_files(table: Table, view: FileSystemView, problems: dict[str, Any]) -> bool:
    """Every file the snapshot reads must be there: a data file deleted outside bucketindex is
    a finding naming the file (``data_files_missing``), not a crash of the scan after it.

    A reference bootstrap's files are read in place (format.md §5.3): each must also still
    have the size the bootstrap recorded (a file the user changed). True: a file is missing
    or changed, and reading the rows would fail or read other rows."""
    refs = [s for s in view.slices() if is_reference(s.path)]
    missing = table.missing_files(view, references=False)  # references: checked below, with their sizes
    if missing:
        problems["data_files_missing"] = {"count": len(missing), "samples": missing[:SAMPLES]}
    bad = []
    for s in refs:
        size = table.io.size(table.abs(s.path)) if table.io.exists(table.abs(s.path)) else None
        if size != s.size:
            bad.append(f"{table.abs(s.path)}: {'missing' if size is None else f'{size} bytes, recorded {s.size}'}")
    if bad:
        problems["reference_files_changed"] = {"count": len(bad), "samples": bad[:SAMPLES]}
    return bool(bad or missing)


def files_to_verify(view: FileSystemView, *, unreadable: Iterable[int] = ()) -> list[str]:
    """Every file of the snapshot, relative and sorted: what ``damaged_files`` reads whole --
    but the index files of the ``unreadable`` buckets (:func:`check_index_files` named them)."""
    skip = {rel for b in unreadable for rel in view.index_files.get(b, ())}
    return sorted(view.all_files() - skip)


def add_damaged(problems: dict[str, Any], damaged: Iterable[tuple[str, str]]) -> bool:
    """Record ``damaged_files`` from ``(path, why)`` pairs; True when there is one (the rows
    cannot be checked then: reading them fails, or reads other values)."""
    found = sorted(f"{path}: {why}" for path, why in damaged)
    add_problem(problems, "damaged_files", len(found), found)
    return bool(found)


def check_index_files(table: Table, view: FileSystemView, problems: dict[str, Any]) -> set[int]:
    """Open every record-index file the snapshot reads (its footer and metadata: what a lookup
    opens first): a missing or damaged one is the finding ``index_files_unreadable`` naming it,
    not a crash of the entries' read after it. Returns the buckets holding one, which the
    record-index checks leave out."""
    assert table.config is not None
    if table.config.index_type != INDEX_RECORD:
        return set()
    found: list[IndexCorruptError] = []
    for bucket, files in sorted(view.index_files.items()):
        for rel in files:
            try:
                IndexFile(table.io, table.abs(rel)).close()
            except IndexCorruptError as e:
                found.append(e)
    add_index_problems(problems, found)
    return {e.bucket for e in found}


def add_index_problems(problems: dict[str, Any], found: Iterable[IndexCorruptError]) -> None:
    """Add unreadable index files (``index_files_unreadable``) to the findings already there."""
    samples = [f"{e.path}: {e.why}" for e in found]
    if not samples:
        return
    old = problems.get("index_files_unreadable", {"count": 0, "samples": []})
    problems["index_files_unreadable"] = {"count": old["count"] + len(samples),
                                          "samples": sorted([*old["samples"], *samples])[:SAMPLES]}


def index_repair_hint(table_uri: str, report: Mapping[str, Any]) -> str | None:
    """The command that repairs the report's unreadable index files, if it found any."""
    if "index_files_unreadable" not in report.get("problems", {}):
        return None
    return f"bucketindex compact {shlex.quote(table_uri)} --rebuild-index"


def row_count_mismatches(view: FileSystemView, read: Mapping[tuple[str, str], int]) -> list[str]:
    """``"<part>/<fid>: expected N, read M"`` for every file group whose rows read (``read``:
    (partition, file id) -> rows) differ from the ``num_rows`` its commit recorded, including
    groups read from zero rows or not in the view; sorted."""
    expected = {(s.partition, s.file_id): s.num_rows for s in view.slices()}
    out = []
    for g in expected.keys() | read.keys():
        n, got = expected.get(g), int(read.get(g, 0))
        if n is None or n != got:
            out.append(f"{g[0]}/{g[1]}: expected {'none' if n is None else n}, read {got}")
    return sorted(out)


def duplicate_identity(index_type: str) -> list[str]:
    """The columns that identify a record: the key, and for the bucket index its partition."""
    return [KEY, "part"] if index_type == INDEX_BUCKET else [KEY]


def fingerprint_sample(fp_hi: int, fp_lo: int) -> str:
    """How an index entry without a row is named: its fingerprint as two signed 64-bit integers."""
    return f"{fp_hi}:{fp_lo}"
