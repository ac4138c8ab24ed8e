"""The torture test (issue 27): random operation sequences over every action, checked after every step.

A *sequence* is plain JSON -- table settings plus 4-12 steps -- made by :func:`generate` from a
seed alone, so a failure found among a thousand sequences is replayed from its JSON (printed by
``benchmarks/torture.py``) with no random state, and shrunk (:func:`shrink`) to the fewest steps
and rows that still diverge. Why a generator of our own and not ``hypothesis``: the long run
must name every failing sequence by one seed and print it as a ready-to-run reproduction, and
the steps are slow (processes killed, writers racing), so shrinking is greedy and bounded.

What :func:`run_sequence` checks after every step (issue 27, "After every step"):

* ``read_arrow`` of the latest snapshot equals the oracle: the committed batches reduced by the
  documented write semantics (format.md §8), in **commit order** -- the oracle replays the
  timeline's entries and maps each commit's batch id back to the rows this run sent, so racing
  writers and kills after the commit point need no guessing. A batch must appear at most once;
  an entry naming no batch this run sent is a divergence;
* ``validate`` and ``shadow-compare`` (Arrow) pass;
* time travel to every retained instant equals the oracle's state at that sequence position,
  and an instant before the retained window is refused;
* no unexplained file: every file under the root is table metadata, or read by a retained
  snapshot, or named by a pending plan or a marker;
* nothing outside the root changed: a digest of the sequence's directory (a sibling whose name
  extends the table's, a reference bootstrap's dataset) except the table and the sources;
* on a table mirrored to Delta (format.md §11; from creation or by a ``mirror --enable`` step):
  versions 0..k with no gap, k below the sequence only after a kill, and every retained version
  read by ``deltalake`` equal to the oracle at that entry (copy-on-write) or to the snapshot's
  bases (merge-on-read, the read-optimized view); in the fresh view (:func:`_delta_fresh_steps`:
  logs as added files, dropped rows as deletion vectors) equal to the oracle read both by
  ``deltalake``'s ``QueryBuilder`` and by Polars, and the latest refused or equal through
  ``to_pyarrow_table``;
* on a table mirrored to Iceberg instead (format.md §12; half the mirrored sequences, drawn by
  :func:`_iceberg_steps`): metadata versions 0..k the same way, and every retained version read
  by pyiceberg (``StaticTable`` of that version's metadata, with its own file IO) equal to the
  oracle or the read-optimized view, with one snapshot per retained entry.

Kills run a step as a CLI subprocess with ``BUCKETINDEX_FAULT`` (:mod:`.faults`): a kill before
the commit point must leave the batch invisible, one after it visible. Overlaps start 2-3
writer processes (sometimes with a table service beside them) with a pause widening their
window: exit 0 means committed, exit 3 nothing visible. Spark steps (upsert, rehash,
bootstrap) go through the in-process CLI (``spark_jobs.cli.main``), which reuses the active
Spark session; this module imports no ``pyspark``. Rehash and bootstrap steps name their
engine (``--engine arrow|auto|spark``, :func:`_arrow_steps`) and the runner checks the CLI
ran on it.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import decimal
import hashlib
import io as _io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

__all__ = [
    "PARTITION_TYPES",
    "POST_COMMIT",
    "PRE_COMMIT",
    "Counts",
    "Divergence",
    "Storage",
    "generate",
    "replay_command",
    "run_sequence",
    "shrink",
    "uses_spark",
]

#: points of the commit protocol before the commit point: a kill there leaves nothing visible
PRE_COMMIT = ("after_requested", "before_complete", "after_conflict_check")
#: points after it: the write is visible, cleanup (markers, heartbeat, checkpoint) left to the next run
POST_COMMIT = ("after_complete", "checkpoint_before_write")
#: fault points (faults.POINTS) that each verb reaches on the Arrow engine
KILL_POINTS = {
    "upsert": PRE_COMMIT + POST_COMMIT,
    "compact": ("schedule_after_plan", "schedule_after_requested", "after_requested", "after_conflict_check",
                "after_complete"),
    "clean": ("clean_after_plan", "clean_after_delete"),
    "alter": ("after_requested", "after_conflict_check", "after_complete"),
    "rollback": ("rollback_after_delete",),
}
#: a mirrored table's Delta log write, after the commit point (format.md §11): a kill there
#: leaves Delta readers one version behind until the next commit or ``mirror --repair``
MIRROR_POINT = "after_commit_before_mirror"
#: a rollback's Delta log write, after its decision. A writer reaches it before its own commit
#: point when it first repairs a pending write, so for a killed upsert it counts as before the
#: commit point (and is not reached at all when there is nothing to repair)
ROLLBACK_MIRROR_POINT = "after_rollback_before_mirror"
#: where a killed upsert has not committed its batch
UPSERT_PRE_COMMIT = PRE_COMMIT + (ROLLBACK_MIRROR_POINT,)
#: archival's steps, after a checkpoint (format.md §3.5); reached only once 30 entries are old
#: enough, which the long sequences (``long_share``) are made for
ARCHIVE_POINTS = ("archive_after_copy", "archive_after_plans")
KILL_POINTS["mirror"] = PRE_COMMIT + ("after_complete", MIRROR_POINT)
#: where a forced rollback catches a live writer (before its commit point: it must lose)
FORCE_POINTS = PRE_COMMIT
ZONES = ("UTC", "Asia/Tokyo", "America/New_York", "Asia/Kolkata")
NOTES = ("", "plain", "a,b", "quote\"d", "ünï", None)
#: partition values like users': spaces, '/', '%', '+', non-ASCII, the literal "__NULL__", '=',
#: a value whose directory name is shortened (>200 bytes), and null (and "" beside it on a
#: mirrored table: :func:`_empty_beside_null`)
REGIONS = ("eu west", "a/b", "100%", "x+y", "são paulo", "日本", "__NULL__", "k=v", "é" * 110, None)
#: values a reference bootstrap's Hive directories carry (pyarrow infers their type: keep them text)
BOOT_REGIONS = ("eu west", "são paulo", "north")
#: the partition field's types a sequence can have (``generate(partition_type=...)``): text, the
#: default, or an integer or a date column -- the types the Delta fresh view accepts
#: (``delta.fresh_view_refusal``: their directory names hold no percent-escape)
PARTITION_TYPES = ("string", "int", "date")
#: each text partition value's stand-in in an integer or date sequence (:func:`_typed_partitions`):
#: zero, negatives, values past 32 bits; dates before the epoch, a leap day, 2038-01-19 (32-bit
#: seconds' end), the epoch itself. Null stays null; ``""`` (no such int or date) becomes null
TYPED_REGIONS: dict[str, dict[str, Any]] = {
    "int": {"eu west": 0, "a/b": -1, "100%": 7, "x+y": 2**40, "são paulo": 42, "日本": -2**31, "__NULL__": 100,
            "k=v": 3, "é" * 110: 10**15, "north": 5},
    "date": {"eu west": "2024-02-29", "a/b": "1969-12-31", "100%": "1970-01-01", "x+y": "2024-03-31",
             "são paulo": "2000-01-01", "日本": "2038-01-19", "__NULL__": "1900-01-01", "k=v": "2024-12-31",
             "é" * 110: "2099-12-31", "north": "2024-03-30"},
}
TABLE_TYPES = ("copy_on_write", "merge_on_read")
INDEXES = ("record", "bucket", "global_simple")
CLI = [sys.executable, "-m", "spark_jobs.cli"]
#: the engines a rehash or bootstrap step asks for (``--engine``): both verbs run on either
#: (issue 37); ``auto`` sizes the work and picks one, which on these small tables is Arrow.
#: Sequences without Spark draw from the first two only
STEP_ENGINES = ("arrow", "auto", "spark")
#: the share of sequences without Spark steps that get an Arrow rehash (somewhere after the
#: first step) and that start with an Arrow bootstrap (:func:`_arrow_steps`)
ARROW_REHASH_SHARE = 0.3
ARROW_BOOTSTRAP_SHARE = 0.25
DELTA_LOG = "_delta_log/"
#: what a Delta log holds (format.md §11): versions, Parquet checkpoints, the checkpoint pointer
DELTA_FILE = re.compile(r"^(\d{20}\.json|\d{20}\.checkpoint\.parquet|_last_checkpoint)$")
#: what the Iceberg projection writes (format.md §12): metadata versions, the version hint, and
#: pyiceberg's manifest lists (``snap-*.avro``) and manifests (``*-m<n>.avro``)
ICEBERG_FILE = re.compile(r"^metadata/(v\d+\.metadata\.json|version-hint\.text|snap-[^/]+\.avro|[^/]+-m\d+\.avro"
                          r"|deletes/[0-9a-f]+-deletes\.parquet)$")
#: a subprocess that is not done by then is stuck: a divergence, not a hang
PROCESS_TIMEOUT_S = 240


class Divergence(Exception):
    """The table disagreed with the oracle (or a check failed) after a step."""

    def __init__(self, step: int, check: str, detail: str, *, known: str | None = None) -> None:
        super().__init__(f"step {step}: {check}: {detail}" + (f" [known: {known}]" if known else ""))
        self.step, self.check, self.detail = step, check, detail
        #: a product bug already filed with a failing regression test (:data:`KNOWN`), or None
        self.known = known


#: product bugs the torture test found that are not fixed yet, each with its regression test
KNOWN: dict[str, str] = {}


@dataclass
class Counts:
    """What a run did; the benchmark prints these as its last line."""

    sequences: int = 0
    steps: int = 0
    kills: int = 0
    overlaps: int = 0
    divergences: int = 0
    #: Delta versions read back through ``deltalake`` and compared (mirrored sequences)
    delta_versions: int = 0
    #: of those, versions of the fresh view (deletion vectors) read by QueryBuilder and Polars
    delta_fresh_versions: int = 0
    #: Iceberg metadata versions read back through pyiceberg and compared
    iceberg_versions: int = 0
    #: sequences whose table archived sequence entries (format.md §3.5)
    archived: int = 0
    #: of the divergences, those of a known bug (:data:`KNOWN`)
    known: Counter = field(default_factory=Counter)
    actions: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"sequences": self.sequences, "steps": self.steps, "kills": self.kills, "overlaps": self.overlaps,
                "divergences": self.divergences, "known_divergences": dict(self.known),
                "delta_versions": self.delta_versions, "delta_fresh_versions": self.delta_fresh_versions,
                "iceberg_versions": self.iceberg_versions, "archived_sequences": self.archived,
                "actions": dict(sorted(self.actions.items()))}


@dataclass
class Storage:
    """Where sequences put their tables: a local directory, or a bucket of an S3-compatible server."""

    kind: str = "local"
    #: s3: ``s3://bucket`` (the server reached through the environment's ``AWS_*``)
    bucket: str | None = None

    def seq_uri(self, workdir: Path, name: str) -> str:
        """The sequence's own directory on the table's storage (the digest's scope)."""
        if self.kind == "s3":
            assert self.bucket is not None
            return f"{self.bucket}/{name}"
        return str(workdir / "store")

    def uri_query(self, wanted: bool) -> str:
        """The query a table URI carries when a sequence draws ``uri_options``: on S3, the store's
        settings and credentials from this process's ``AWS_*`` (which reach the same server), so
        every verb resolves them from the URI and must keep them out of what it writes and
        prints; a local path takes no query (``""``)."""
        if not wanted or self.kind != "s3":
            return ""
        env = os.environ
        options = {"endpoint_url": env.get("AWS_ENDPOINT_URL"), "region": env.get("AWS_REGION"),
                   "access_key_id": env.get("AWS_ACCESS_KEY_ID"), "secret_access_key": env.get("AWS_SECRET_ACCESS_KEY")}
        return "?" + urlencode({k: v for k, v in options.items() if v})


# -- the generator ----------------------------------------------------------------------


def _key_pool(rng: random.Random) -> list[str]:
    """~40 keys, so that steps collide: odd characters, non-ASCII, one 300-character key."""
    odd = ["k 01", "a/b", "50%", "x+y", "ключ", "日本語", "é+%/ ", "comma,key", "back\\slash", "~tilde",
           "__NULL__", "=eq", "L" * 281 + "-300-chars-long-key"]
    plain = [f"k{i:02d}" for i in range(27)]
    pool = odd + plain
    rng.shuffle(pool)
    return pool


def _at(rng: random.Random) -> str | None:
    if rng.random() < 0.1:
        return None
    base = dt.datetime(2024, 3, 30, 23, 0, tzinfo=dt.UTC)  # around a DST change somewhere
    return (base + dt.timedelta(minutes=rng.randint(-600, 600), microseconds=rng.randint(0, 999_999))).isoformat()


def _amount(rng: random.Random) -> str | None:
    return None if rng.random() < 0.1 else f"{rng.randint(-10**9, 10**9) / 100:.2f}"


class _Gen:
    """A rough model of the table while generating (the executor decides from the real table)."""

    def __init__(self, seed: int, *, spark: bool, kills: bool, overlaps: bool) -> None:
        self.rng = random.Random(seed)
        self.spark, self.kills, self.overlaps = spark, kills, overlaps
        self.keys = _key_pool(self.rng)
        self.where: dict[str, Any] = {}  # key -> last region generated for it
        self.n_batch = 0
        self.tick = 0

    def batch_id(self) -> str:
        self.n_batch += 1
        return f"b{self.n_batch:03d}"

    def rows(self, partitioned: bool) -> list[dict[str, Any]]:
        rng = self.rng
        self.tick += 3
        out: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 8)):
            if self.where and rng.random() < 0.6:
                key = rng.choice(sorted(self.where))
            else:
                key = rng.choice(self.keys)
            region = None
            if partitioned:
                region = self.where.get(key, rng.choice(REGIONS)) if rng.random() < 0.75 else rng.choice(REGIONS)
            # mostly newer than before, sometimes stale (lower than stored), sometimes tied
            ts = max(0, self.tick + rng.randint(-6, 3))
            row = {"id": key, "ts": ts, "amount": _amount(rng), "at": _at(rng), "note": rng.choice(NOTES),
                   "is_deleted": rng.random() < 0.2}
            if partitioned:
                row["region"] = region
            out.append(row)
            if not row["is_deleted"]:
                self.where[key] = region
            if rng.random() < 0.15:  # an in-batch duplicate: same identity, another (or the same) ts
                dup = dict(row, ts=ts + rng.choice([-1, 0, 0, 1]), amount=_amount(rng),
                           is_deleted=rng.random() < 0.2)
                out.append(dup)
        return out

    def upsert(self, settings: dict[str, Any], via: str) -> dict[str, Any]:
        return {"op": "upsert", "via": via, "batch_id": self.batch_id(), "zone": self.rng.choice(ZONES),
                "rows": self.rows(settings["partitioned"])}


def generate(seed: int, *, spark: bool = False, kills: bool = True, overlaps: bool = True,
             min_steps: int = 4, max_steps: int = 12, mirror_share: float = 0.25,
             long_share: float = 0.0, float_share: float = 0.3,
             uri_options_share: float = 0.5, iceberg_share: float = 0.5,
             delta_fresh_share: float = 0.5, partition_type: str = "string") -> dict[str, Any]:
    """A sequence from ``seed`` alone: settings and steps as JSON-ready dicts.

    ``spark`` adds Spark upserts, rehash (bucket and record indexes) and, as a first step,
    bootstrap; ``kills`` and ``overlaps`` add processes killed at fault points and racing writers.
    ``mirror_share`` of the sequences mirror their table to Delta (from creation, or turned on
    by a ``mirror --enable`` step), with kills between a commit and its Delta version;
    ``long_share`` of them run 40-48 steps with a checkpoint every 2 entries, so archival runs
    (and is killed). ``float_share`` of them store the precombine field ``ts`` as a double or
    a float, with NaN and -0.0 among its values (:func:`_float_precombine`). ``uri_options_share``
    of them name their table by a URI carrying its store's settings and credentials in the query
    (``settings["uri_options"]``: on S3 storage; a local path takes no query). These are drawn
    from a second random stream, so a seed's other steps are what they were before these
    options existed. ``iceberg_share`` of the mirrored sequences mirror to Iceberg instead of
    Delta (:func:`_iceberg_steps`, a stream of its own, drawn last); ``delta_fresh_share`` of
    the merge-on-read ones still mirrored to Delta publish its fresh view, unpartitioned
    (:func:`_delta_fresh_steps`, drawn after that) unless ``partition_type`` is ``int`` or
    ``date``: then every partition value is that type's stand-in for the text drawn
    (:func:`_typed_partitions`, no draw: the steps are otherwise what they were) and the
    Delta fresh view keeps the partitioning, which it accepts for those types.

    Rehash and bootstrap steps name their engine (``step["engine"]``: ``--engine arrow``,
    ``auto`` or ``spark``), drawn from a third stream (:func:`_arrow_steps`) as upserts name
    theirs (``via``): in Spark sequences any of the three, elsewhere Arrow rehash and bootstrap
    steps are added, so every seed's other steps stay what they were.
    """
    g = _Gen(seed, spark=spark, kills=kills, overlaps=overlaps)
    rng = g.rng
    index = rng.choice(INDEXES)
    settings = {"table_type": rng.choice(TABLE_TYPES), "index": index, "partitioned": rng.random() < 0.85,
                "num_buckets": rng.choice([1, 2, 4]), "checkpoint_interval": rng.choice([2, 3, 10]),
                "target_file_rows": rng.choice([3, 5, 100])}
    steps: list[dict[str, Any]] = []
    n = rng.randint(min_steps, max_steps)
    if spark and index != "global_simple" and rng.random() < 0.5:
        steps.append(_bootstrap_step(g, settings))
    else:
        steps.append(g.upsert(settings, "api"))
    altered = False

    def draw() -> None:
        nonlocal altered
        r = rng.random()
        last = steps[-1]
        if last.get("kill") and rng.random() < 0.5:  # repair: the same batch again, or an explicit rollback
            if last["op"] == "upsert" and rng.random() < 0.6:
                steps.append(dict(copy.deepcopy(last), kill=None, via="api"))
            else:
                steps.append({"op": "rollback", "kill": rng.choice(KILL_POINTS["rollback"]) if kills and
                              rng.random() < 0.3 else None})
            return
        if r < 0.30:
            steps.append(g.upsert(settings, rng.choice(["api", "api", "cli"])))
        elif r < 0.40 and spark:
            steps.append(g.upsert(settings, "spark"))
        elif r < 0.50 and kills:
            verb = rng.choice(["upsert", "upsert", "upsert", "compact", "clean", "alter"])
            point = rng.choice(KILL_POINTS[verb])
            if verb == "upsert":
                steps.append(dict(g.upsert(settings, "kill"), kill=point))
            else:
                steps.append(_service_step(g, settings, verb, kill=point))
        elif r < 0.58 and overlaps:
            steps.append(_overlap_step(g, settings))
        elif r < 0.63 and overlaps:
            steps.append(dict(g.upsert(settings, "forced"), point=rng.choice(FORCE_POINTS)))
        elif r < 0.75:
            steps.append(_service_step(g, settings, "compact"))
        elif r < 0.84:
            steps.append(_service_step(g, settings, "clean"))
        elif r < 0.88 and not altered:
            altered = True
            steps.append({"op": "alter"})
        elif r < 0.93 and spark and index != "global_simple":
            steps.append({"op": "rehash", "direction": rng.choice(["up", "down"])})
        elif r < 0.96 and g.n_batch:
            steps.append({"op": "retry", "of": rng.randint(1, g.n_batch)})  # a committed batch id again: a no-op
        else:
            steps.append(g.upsert(settings, "api"))

    while len(steps) < n:
        draw()
    ext = random.Random(f"torture-ext/{seed}")
    is_long = ext.random() < long_share
    if is_long:
        settings["checkpoint_interval"] = 2
        for _ in range(ext.randint(40, 48) - len(steps)):
            draw()
        for i, st in enumerate(steps):  # late kills aim at archival (about entry 34 on)
            if i >= 28 and st.get("kill") and st["op"] == "upsert" and ext.random() < 0.6:
                st["kill"] = ext.choice(ARCHIVE_POINTS)
    m = ext.random()
    on_from = None
    if m < mirror_share / 2:
        settings["mirror"] = "delta"
        on_from = 0
    elif m < mirror_share:
        on_from = ext.randint(1, len(steps))
        steps.insert(on_from, {"op": "mirror", "kill": ext.choice(KILL_POINTS["mirror"]) if kills and
                               ext.random() < 0.3 else None})
    if on_from is not None:
        for st in steps[on_from + 1:]:
            if st.get("kill") in PRE_COMMIT + POST_COMMIT and st["op"] == "upsert" and ext.random() < 0.35:
                st["kill"] = MIRROR_POINT
        # a rollback's Delta version: an explicit rollback killed there, or a writer killed in
        # the repair it runs first (right after a killed step, something is pending)
        for prev, st in zip(steps[on_from:], steps[on_from + 1:]):
            if st.get("kill") and (st["op"] == "rollback" or st["op"] == "upsert" and prev.get("kill")) \
                    and ext.random() < 0.4:
                st["kill"] = ROLLBACK_MIRROR_POINT
        _empty_beside_null(steps, ext)
    if ext.random() < uri_options_share:
        settings["uri_options"] = True
    seq = {"seed": seed, "settings": settings, "steps": steps}
    if ext.random() < float_share:  # drawn last: the draws above stay what they were
        _float_precombine(seq, ext)
    _arrow_steps(seq, g, spark=spark, long=is_long)
    _iceberg_steps(seq, iceberg_share)
    if partition_type not in PARTITION_TYPES:
        raise ValueError(f"partition_type {partition_type!r}: one of {PARTITION_TYPES}")
    _delta_fresh_steps(seq, delta_fresh_share, keep_partitions=partition_type != "string")
    _no_empty_beside_delta_references(seq)
    if partition_type != "string":
        _typed_partitions(seq, partition_type)
    return seq


def _typed_partitions(seq: dict[str, Any], kind: str) -> None:
    """Make the partition field ``region`` an integer (``int``, stored as int64) or a date
    (``date``, date32; ISO text in the JSON) column: every text value drawn becomes its stand-in
    (:data:`TYPED_REGIONS`, one value per text, so keys move between partitions as before) and
    ``""`` becomes null. A partitioned table's reference bootstrap becomes a rewrite one: the
    dataset carries a typed field as a column of its files (a Hive directory's type is what
    pyarrow infers: int32, or text for a date), and reference mode needs the partition field in
    the directories (refused in one line otherwise, since session 51). No draw: a seed's steps are
    otherwise what they were."""
    seq["settings"]["partition_type"] = kind
    values = TYPED_REGIONS[kind]
    if seq["settings"].get("partitioned"):
        for st in seq["steps"]:
            if st["op"] == "bootstrap" and st.get("mode") == "reference":
                st["mode"] = "rewrite"

    def typed(x: dict[str, Any]) -> None:
        for r in x.get("rows") or ():
            if isinstance(r.get("region"), str):
                r["region"] = values.get(r["region"])  # "" -> None

    _each_dict(seq["steps"], typed)


def _no_empty_beside_delta_references(seq: dict[str, Any]) -> None:
    """On a table mirrored to Delta that starts with a reference bootstrap, turn the ``""``
    partition values :func:`_empty_beside_null` drew back into null. There the partition field is
    a Delta partition column (the reference files lack it), which Delta readers read as null, so
    the projection refuses a commit holding ``""`` by design (a logged refusal, the log left at
    the version before: stale, never wrong; ``delta._add``) -- a gap with no kill, which the
    check would report. Found by a torture run (seed 445294747, issue 39 session 48). No draw:
    a seed's other steps are what they were."""
    s, steps = seq["settings"], seq["steps"]
    on_delta = s.get("mirror") == "delta" or any(
        st["op"] == "mirror" and st.get("projection", "delta") == "delta" for st in steps)
    if not on_delta or not any(st["op"] == "bootstrap" and st.get("mode") == "reference" for st in steps):
        return

    def empty_to_null(x: dict[str, Any]) -> None:
        for r in x.get("rows") or ():
            if r.get("region") == "":
                r["region"] = None

    _each_dict(steps, empty_to_null)


def _delta_fresh_steps(seq: dict[str, Any], share: float, *, keep_partitions: bool = False) -> None:
    """Project ``share`` of the merge-on-read sequences mirrored to Delta in the fresh view
    (``mirror --enable delta --view fresh``: logs as added files, dropped rows as deletion
    vectors, format.md §11). The Delta projection refuses that view for a string partition
    field (Polars ignores a vector on a percent-escaped path), and the generator's partition
    field ``region`` is text, so these sequences are unpartitioned (their keys keep spaces,
    ``/``, ``%``, ``+``, non-ASCII) and bootstrap by rewriting (a reference file's absolute path
    is refused too). A table mirrored from creation gets the view by an enable step right after
    its first step instead (creation takes no view), the kills around the projection kept. A
    stream of its own, drawn last: with ``share`` 0 a seed is what it was. ``keep_partitions``:
    the sequence's partition field will be an integer or a date (:func:`_typed_partitions`),
    which the view accepts, so a partitioned table stays partitioned (still no reference
    bootstrap)."""
    s, steps = seq["settings"], seq["steps"]
    enabling = [st for st in steps if st["op"] == "mirror" and st.get("projection", "delta") == "delta"]
    if s["table_type"] != "merge_on_read" or not (s.get("mirror") == "delta" or enabling) \
            or random.Random(f"torture-delta-fresh/{seq['seed']}").random() >= share:
        return
    if s.get("mirror") == "delta":
        del s["mirror"]
        steps.insert(1, {"op": "mirror", "kill": None, "view": "fresh"})
    for st in enabling:
        st["view"] = "fresh"
    if keep_partitions:
        for st in steps:
            if st["op"] == "bootstrap":
                st["mode"] = "rewrite"
        return
    s["partitioned"] = False

    def unpartition(x: dict[str, Any]) -> None:
        if x.get("op") == "bootstrap":
            x["mode"] = "rewrite"
        for r in x.get("rows") or ():
            if x.get("op") == "bootstrap":
                r["region"] = None
            else:
                r.pop("region", None)

    _each_dict(steps, unpartition)


def _iceberg_steps(seq: dict[str, Any], share: float) -> None:
    """Mirror ``share`` of the mirrored sequences to Iceberg instead of Delta: from creation
    (``settings["mirror"]``) or by the ``mirror --enable`` step (``step["projection"]``), the
    same kills around it. Iceberg holds UTC instants only (format.md §12 "Exact values": a
    zoned column is refused with one line), so these sequences send their ``at`` column in UTC.
    A stream of its own, drawn after everything else: a seed's steps are otherwise what they were."""
    s, steps = seq["settings"], seq["steps"]
    enabling = [st for st in steps if st["op"] == "mirror"]
    if not (s.get("mirror") or enabling) or random.Random(f"torture-iceberg/{seq['seed']}").random() >= share:
        return
    if s.get("mirror"):
        s["mirror"] = "iceberg"
    view = random.Random(f"torture-iceberg-view/{seq['seed']}")
    for st in enabling:
        st["projection"] = "iceberg"
        if s["table_type"] == "merge_on_read" and view.random() < 0.5:
            st["view"] = "fresh"  # every commit's rows: logs as data files, dropped rows as position deletes

    def utc(x: dict[str, Any]) -> None:
        if "zone" in x:
            x["zone"] = "UTC"

    _each_dict(steps, utc)


def _arrow_steps(seq: dict[str, Any], g: _Gen, *, spark: bool, long: bool) -> None:
    """Give each rehash and bootstrap step its engine, and add Arrow ones to sequences without Spark.

    From a stream of its own (seeded by the sequence's seed), drawn after everything else, so
    a seed's steps are what they were before these verbs had an Arrow engine, plus the engine
    names and added steps. A Spark sequence's rehash and bootstrap steps (drawn as before) ask
    for any engine (:data:`STEP_ENGINES`), so Arrow and Spark runs of one verb alternate on one
    table, as upserts' engines do. A sequence without Spark gets, on a bucketed table (not
    ``global_simple``: no bucket count to change, as for Spark), an Arrow or auto rehash
    somewhere after the first step, and some (short ones: a bootstrap's table takes no
    checkpoint interval, which long sequences need for archival) start with a bootstrap.
    """
    eng = random.Random(f"torture-engine/{seq['seed']}")
    choices = STEP_ENGINES if spark else STEP_ENGINES[:2]
    steps, s = seq["steps"], seq["settings"]
    if not spark and s["index"] != "global_simple":
        # the same draws whatever the other streams added (a mirror step): a seed's rows stay equal
        rehash, where, direction = eng.random() < ARROW_REHASH_SHARE, eng.random(), eng.choice(["up", "down"])
        if rehash:
            steps.insert(1 + int(where * len(steps)), {"op": "rehash", "direction": direction})
        if eng.random() < ARROW_BOOTSTRAP_SHARE and not long:
            boot = _bootstrap_step(g, s, rng=eng)
            if s.get("ts_type"):  # the dataset's ts column has the table's floating-point type
                for r in boot["rows"]:
                    r["ts"] = float(r["ts"])
            steps.insert(0, boot)
    for st in steps:
        if st["op"] in ("rehash", "bootstrap"):
            st["engine"] = eng.choice(choices)


#: the share of a floating-point sequence's ``ts`` values drawn as NaN
NAN_SHARE = 0.2
#: the spelling of NaN in a sequence's rows (standard JSON has none); :func:`_typed` reads it
NAN = "NaN"


def _float_precombine(seq: dict[str, Any], rng: random.Random) -> None:
    """Make ``ts`` a double or a float column (``settings["ts_type"]``) whose values include NaN
    (above every number, format.md §8) and -0.0 (equal to 0.0) beside the integers drawn: NaN
    stored then a number (stale), a number then NaN (wins), NaN then NaN (a tie), and in-batch
    duplicates with NaN on one side or both. Every copy of a batch id gets the same values
    (a retry, an overlap's two tries of one task carry the same rows)."""
    seq["settings"]["ts_type"] = rng.choice(["double", "float"])
    for bid in _batch_ids(seq):
        copies = _rows_of(seq, bid)
        values: list[Any] = []
        for r in copies[0]:
            ts = float(r["ts"])
            if rng.random() < NAN_SHARE:
                values.append(NAN)
            else:
                values.append(-0.0 if ts == 0 and rng.random() < 0.5 else ts)
        for rows in copies:
            for r, v in zip(rows, values):
                r["ts"] = v


def _each_dict(x: Any, fn: Callable[[dict[str, Any]], None]) -> None:
    """``fn`` on every dict nested in ``x`` (steps, their batches, their rows), parents before
    their children and in order: the generator's draws inside ``fn`` stay in a fixed order."""
    if isinstance(x, dict):
        fn(x)
        for v in x.values():
            if isinstance(v, (dict, list)):
                _each_dict(v, fn)
    elif isinstance(x, list):
        for v in x:
            _each_dict(v, fn)


def _empty_beside_null(steps: list[dict[str, Any]], ext: random.Random) -> None:
    """On a mirrored table, about half the null partition values become ``""`` (issue 36:
    Delta readers read an empty partition value as null, so the projection must keep them
    apart). Drawn from the second stream after everything else, so a seed's steps are
    otherwise what they were; every batch of the sequence, since enabling projects the
    whole history. A batch sent again (a repair, a second try of a task: the same batch id)
    gets the same rows."""
    decided: dict[tuple[Any, int], bool] = {}

    def null_to_empty(x: dict[str, Any]) -> None:
        for i, row in enumerate(x.get("rows") or ()):
            if "region" in row and row["region"] is None:
                key = (x.get("batch_id"), i)
                if key not in decided:
                    decided[key] = ext.random() < 0.5
                if decided[key]:
                    row["region"] = ""

    _each_dict(steps, null_to_empty)


def _bootstrap_step(g: _Gen, settings: dict[str, Any], *, rng: random.Random | None = None) -> dict[str, Any]:
    """A first step making the table from a dataset; ``rng``: a stream other than the generator's."""
    rng = rng or g.rng
    mode = "rewrite" if settings["index"] == "bucket" else rng.choice(["reference", "rewrite"])
    files: list[dict[str, Any]] = []
    keys = rng.sample(g.keys[:30], rng.randint(3, 10))
    for i, key in enumerate(keys):
        region = rng.choice(BOOT_REGIONS) if settings["partitioned"] else None
        g.where[key] = region
        files.append({"id": key, "region": region, "ts": rng.randint(0, 3), "amount": _amount(rng), "at": _at(rng)})
    return {"op": "bootstrap", "mode": mode, "rows": files}


def _service_step(g: _Gen, settings: dict[str, Any], verb: str, *, kill: str | None = None) -> dict[str, Any]:
    rng = g.rng
    if verb == "compact":
        kinds = _compactable(settings)
        if not kinds:  # nothing this table could ever compact (refused as bad input): a clean instead
            return {"op": "clean", "retain": rng.randint(1, 3), "kill": None}
        only = rng.choice(kinds + [None]) if len(kinds) == 2 else kinds[0]
        return {"op": "compact", "phase": rng.choice(["run", "run", "schedule", "execute"]),
                "only": only, "min": rng.randint(1, 2), "kill": kill}
    if verb == "clean":
        return {"op": "clean", "retain": rng.randint(1, 3), "kill": kill}
    return {"op": "alter", "kill": kill}


def _compactable(settings: dict[str, Any]) -> list[str]:
    """What ``compact --only`` may name on this table: data (merge-on-read logs), index (record-index deltas)."""
    return ((["data"] if settings["table_type"] == "merge_on_read" else [])
            + (["index"] if settings["index"] == "record" else []))


def _overlap_step(g: _Gen, settings: dict[str, Any]) -> dict[str, Any]:
    rng = g.rng
    writers = [dict(g.upsert(settings, "overlap"), max_retries=rng.choice([0, 1, 3]))
               for _ in range(rng.randint(2, 3))]
    if rng.random() < 0.15:  # two tries of one task: the same batch id, the same rows
        writers[-1] = dict(copy.deepcopy(writers[0]), max_retries=3)
    service = rng.choice([None, None, "compact", "clean"])
    if service == "compact" and not _compactable(settings):
        service = "clean"
    return {"op": "overlap", "writers": writers, "service": service, "pause": rng.choice([0.5, 1.0])}


# -- values and the oracle ------------------------------------------------------------------


def _value_order(v: Any) -> tuple:
    """Spark's ordering of one value (format.md §8): nulls lowest, NaN above every number (NaNs
    tie), -0.0 equal to 0.0, strings by their UTF-8 bytes. Written here, not imported: the
    oracle must not share the code it checks."""
    if v is None:
        return (0,)
    if isinstance(v, float):
        return (2,) if v != v else (1, v + 0.0)
    if isinstance(v, str):
        return (1, v.encode())
    return (1, v)


def _typed(row: dict[str, Any], partition_type: str = "string") -> dict[str, Any]:
    """A row as the table stores it: decimals, UTC timestamps, NaN (:data:`NAN`), and a date
    partition value (``partition_type``) as a date."""
    out = dict(row)
    if partition_type == "date" and isinstance(out.get("region"), str):
        out["region"] = dt.date.fromisoformat(out["region"])
    if out.get("ts") == NAN:
        out["ts"] = float("nan")
    if "amount" in out and out["amount"] is not None:
        out["amount"] = decimal.Decimal(out["amount"])
    if "at" in out and out["at"] is not None:
        out["at"] = dt.datetime.fromisoformat(out["at"]).astimezone(dt.UTC)
    return out


@dataclass
class _State:
    rows: dict[Any, dict[str, Any]]
    columns: list[str]


def _reduce(state: _State, batch: list[dict[str, Any]], columns: list[str], *, per_partition: bool,
            partitioned: bool) -> _State:
    """format.md §8 over typed rows: in-batch winner by (ts, the row in the table's column order
    then the delete flag), then applied when not lower than the stored row's ts (both in
    :func:`_value_order`'s order: NaN highest)."""
    def ident(r: dict[str, Any]) -> Any:
        return (r.get("region"), r["id"]) if per_partition and partitioned else r["id"]

    order = [c for c in columns if c != "is_deleted"] + ["is_deleted"]
    winners: dict[Any, dict[str, Any]] = {}
    for r in batch:
        k = ident(r)
        cur = winners.get(k)
        rank = (_value_order(r["ts"]), tuple(_value_order(r.get(c)) for c in order))
        if cur is None or rank > (_value_order(cur["ts"]), tuple(_value_order(cur.get(c)) for c in order)):
            winners[k] = r
    rows = dict(state.rows)
    for k, r in winners.items():
        stored = rows.get(k)
        if stored is not None and _value_order(stored["ts"]) > _value_order(r["ts"]):
            continue  # a late, older row: the stored one stays
        if r.get("is_deleted"):
            rows.pop(k, None)
        else:
            rows[k] = {c: r.get(c) for c in state.columns}
    return _State(rows, state.columns)


# -- running a sequence -------------------------------------------------------------------


def _quiet() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(_io.StringIO()))
    return stack


class _Runner:
    """One sequence on a fresh table: executes its steps and checks after each."""

    def __init__(self, seq: dict[str, Any], workdir: Path, storage: Storage, counts: Counts,
                 spark_master: str, log: Callable[[str], None] | None) -> None:
        from spark_jobs.io.filesystem import resolve

        self.seq, self.settings = seq, seq["settings"]
        #: the partition field's type (:data:`PARTITION_TYPES`)
        self.ptype: str = self.settings.get("partition_type", "string")
        self.workdir, self.storage, self.counts = workdir, storage, counts
        self.spark_master, self.log = spark_master, log
        self.sources = workdir / "sources"
        self.sources.mkdir(parents=True, exist_ok=True)
        self.base = storage.seq_uri(workdir, f"seq-{seq['seed']}-{os.getpid()}-{time.monotonic_ns() % 10**9}")
        self.uri = f"{self.base}/table" + storage.uri_query(bool(self.settings.get("uri_options")))
        self.dataset = f"{self.base}/dataset"
        self.io, self.base_path = resolve(self.base)
        _, self.root_path = resolve(self.uri)
        self.batches: dict[str, list[dict[str, Any]]] = {}
        self.states: list[_State] = [_State({}, [])]
        self.instants: list[str] = [""]
        self.step_no = 0
        self.last_outside: dict[str, str] = {}
        #: heartbeats a kill after the commit point left, which the next writer's repair removes
        self.crash_beats: set[str] = set()
        self.killed_now = self.repaired_now = False
        #: whether the table has archived sequence entries (counted once per sequence)
        self.archived = False
        #: a kill since the Delta log was last complete: it may lag the sequence until a commit
        self.delta_may_lag = False
        #: the same for the Iceberg projection's metadata versions
        self.iceberg_may_lag = False
        self.env = dict(os.environ)
        pp = self.env.get("PYTHONPATH", "")
        here = str(Path(__file__).resolve().parents[2])
        self.env["PYTHONPATH"] = here + (os.pathsep + pp if pp else "")
        self.env.pop("BUCKETINDEX_FAULT", None)
        self.env.pop("BUCKETINDEX_PAUSE", None)

    # -- setup ---------------------------------------------------------------------------
    def setup(self) -> None:
        s = self.settings
        if self.storage.kind == "local":
            Path(self.base_path).mkdir(parents=True, exist_ok=True)
        # a sibling whose name extends the table's: a prefix delete or listing would touch it
        self.io.write_bytes(f"{self.base_path}/table_sibling/keep.txt", b"not the table's")
        self.io.write_bytes(f"{self.base_path}/README", b"outside the table root")
        first = self.seq["steps"][0] if self.seq["steps"] else {}
        if first.get("op") == "bootstrap":
            self._write_dataset(first)
        elif s["checkpoint_interval"] != 10 or s.get("mirror"):  # else the first upsert creates it, as users do
            from spark_jobs.table import Table
            from spark_jobs.table.config import TableConfig

            Table.open(self.uri).create(TableConfig(
                record_key_fields=["id"], partition_fields=["region"] if s["partitioned"] else [],
                precombine_field="ts", index_type=s["index"], num_buckets=s["num_buckets"],
                table_type=s["table_type"], target_file_rows=s["target_file_rows"],
                checkpoint_interval=s["checkpoint_interval"], mirrors=[s["mirror"]] if s.get("mirror") else []))
        self.last_outside = self._outside_digest()

    def _write_dataset(self, step: dict[str, Any]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        by_dir: dict[str, list[dict[str, Any]]] = {}
        # an integer or date partition field is a column of the files (typed as the upserts'),
        # not a Hive directory whose type pyarrow would infer (int32, or text for a date)
        in_files = self.settings["partitioned"] and self.ptype != "string"
        for r in step["rows"]:
            d = f"region={quote(r['region'], safe='')}" if self.settings["partitioned"] and not in_files else ""
            by_dir.setdefault(d, []).append(r)
        cols = ("id", "region", "ts", "amount", "at") if in_files else ("id", "ts", "amount", "at")
        schema = pa.schema([("id", pa.string())] + ([("region", self._region_type())] if in_files else [])
                           + [("ts", self._ts_type()), ("amount", pa.decimal128(12, 2)),
                              ("at", pa.timestamp("us", tz="UTC"))])
        for i, (d, rows) in enumerate(sorted(by_dir.items())):
            typed = [_typed({c: r[c] for c in cols}, self.ptype) for r in rows]
            path = f"{self.dataset}/{d}/part-{i}.parquet" if d else f"{self.dataset}/part-{i}.parquet"
            from spark_jobs.io.filesystem import resolve

            fio, p = resolve(path)
            with fio.open_output_stream(p) as out:
                pq.write_table(pa.Table.from_pylist(typed, schema=schema), out)

    # -- sources -------------------------------------------------------------------------
    def _ts_type(self) -> Any:
        """The precombine column's type: bigint, or double/float in a sequence drawing NaN."""
        import pyarrow as pa

        return {"double": pa.float64(), "float": pa.float32()}.get(self.settings.get("ts_type", ""), pa.int64())

    def _region_type(self) -> Any:
        """The partition field's type: text, or int64 / date32 (:data:`PARTITION_TYPES`)."""
        import pyarrow as pa

        return {"int": pa.int64(), "date": pa.date32()}.get(self.ptype, pa.string())

    def _table_columns(self) -> list[str] | None:
        from spark_jobs.table import Table

        t = Table.open(self.uri)
        if t.config is None:
            return None
        schema = t.view().schema
        return None if schema is None else [n for n in schema.names if not n.startswith("_bi_")]

    def _source(self, step: dict[str, Any], name: str | None = None) -> str:
        """The batch's Parquet file, in the table's column order (``note`` only once the table has it)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = self._table_columns()
        if cols is None:
            cols = ["id"] + (["region"] if self.settings["partitioned"] else []) + ["ts", "amount", "at"]
        types = {"id": pa.string(), "region": self._region_type(), "ts": self._ts_type(),
                 "amount": pa.decimal128(12, 2),
                 "at": pa.timestamp("us", tz=step["zone"]), "note": pa.string(), "is_deleted": pa.bool_()}
        cols = cols + ["is_deleted"]
        sent = [{c: r.get(c) for c in cols} for r in step["rows"]]
        typed = [_typed(r, self.ptype) for r in sent]
        schema = pa.schema([(c, types[c]) for c in cols])
        path = self.sources / f"{name or step['batch_id']}-{self.step_no}.parquet"
        pq.write_table(pa.Table.from_pylist(typed, schema=schema), path)
        self.batches.setdefault(step["batch_id"], typed)
        return str(path)

    def _creating(self) -> bool:
        from spark_jobs.table import Table

        return Table.open(self.uri).config is None

    def _upsert_args(self, step: dict[str, Any], src: str) -> list[str]:
        s = self.settings
        args = ["upsert", self.uri, src, "--record-key", "id", "--precombine-field", "ts", "--delete-field",
                "is_deleted", "--batch-id", step["batch_id"], "--index", s["index"], "--table-type", s["table_type"]]
        if s["partitioned"]:
            args += ["--partition-field", "region"]
        if self._creating():  # fixed at creation; later the count in force may differ (rehash)
            args += ["--num-buckets", str(s["num_buckets"]), "--target-file-rows", str(s["target_file_rows"])]
        return args

    # -- executing -----------------------------------------------------------------------
    def cli(self, args: list[str]) -> tuple[int, str]:
        """The in-process CLI (reuses an active Spark session); returns (status, stderr), and
        keeps its stdout in ``last_out``."""
        from spark_jobs.cli import main

        out, err = _io.StringIO(), _io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(args)
            except SystemExit as e:  # argparse
                rc = int(e.code or 0)
        self.last_out = out.getvalue()
        return rc, err.getvalue()

    def must(self, args: list[str]) -> None:
        rc, err = self.cli(args)
        if rc != 0:
            raise Divergence(self.step_no, f"{args[0]} failed", f"exit {rc}: {err.strip()[-1500:]}")

    def popen(self, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        return subprocess.Popen(CLI + args, env={**self.env, **(env or {})}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=self.workdir)

    def wait(self, p: subprocess.Popen) -> tuple[int, str]:
        try:
            _, err = p.communicate(timeout=PROCESS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise Divergence(self.step_no, "process hung", " ".join(p.args[3:6]))
        return p.returncode, err

    def run_step(self, step: dict[str, Any]) -> None:
        op = step["op"]
        self.pre_seq = len(self.states) - 1
        kills = self.counts.kills
        self.killed_now = False
        # steps that run a writer's repair (format.md §4 step 3) or a rollback's
        self.repaired_now = op in ("rollback", "retry") or (op == "upsert" and step["via"] in ("api", "cli", "spark"))
        name = op if op != "upsert" else f"upsert_{step['via']}"
        if op in ("rehash", "bootstrap"):  # per engine asked for, as upserts per route
            name = f"{op}_{_engine(step)}"
        self.counts.actions[name] += 1
        self.counts.steps += 1
        getattr(self, f"do_{op}")(step)
        self.killed_now = self.counts.kills > kills

    def do_upsert(self, step: dict[str, Any]) -> None:
        via = step["via"]
        src = self._source(step)
        if via == "api":
            from spark_jobs.arrow_engine.upsert import run_upsert
            from spark_jobs.table.action.upsert import UpsertOptions

            s = self.settings
            creating = self._creating()
            with _quiet():
                run_upsert(UpsertOptions(table=self.uri, source=src, record_key=["id"], precombine_field="ts",
                                         partition_field="region" if s["partitioned"] else None,
                                         index=s["index"], table_type=s["table_type"], delete_field="is_deleted",
                                         batch_id=step["batch_id"],
                                         num_buckets=s["num_buckets"] if creating else None,
                                         target_file_rows=s["target_file_rows"] if creating else None))
        elif via == "cli":
            self.must(self._upsert_args(step, src) + ["--engine", "arrow"])
        elif via == "spark":
            self.must(self._upsert_args(step, src) + ["--engine", "spark", "--master", self.spark_master])
        elif via == "kill":
            self._killed_upsert(step, src)
        elif via == "forced":
            self._forced_rollback(step, src)
        else:  # pragma: no cover - generator and steps agree
            raise ValueError(f"unknown upsert via {via!r}")

    def _committed(self, batch_id: str) -> bool:
        from spark_jobs.table import Table

        return Table.load(self.uri).commit_for_batch(batch_id) is not None

    def _killed_upsert(self, step: dict[str, Any], src: str) -> None:
        point = step["kill"]
        was = self._committed(step["batch_id"])
        rc, err = self.wait(self.popen(self._upsert_args(step, src) + ["--engine", "arrow"],
                                       {"BUCKETINDEX_FAULT": point}))
        killed = rc == -signal.SIGKILL
        self.counts.kills += killed
        now = self._committed(step["batch_id"])
        if not killed and rc != 0:
            raise Divergence(self.step_no, "upsert failed", f"exit {rc}: {err.strip()[-1500:]}")
        if killed and point in UPSERT_PRE_COMMIT and now and not was:
            raise Divergence(self.step_no, "kill before the commit point", f"{point}: the batch is visible")
        if (killed and point not in UPSERT_PRE_COMMIT or not killed) and not now:
            raise Divergence(self.step_no, "write lost", f"{point} (killed={killed}): the batch is not visible")

    def _forced_rollback(self, step: dict[str, Any], src: str) -> None:
        from spark_jobs.table import Table

        point = step["point"]
        signals = self.workdir / f"signals-{self.step_no}"
        p = self.popen(self._upsert_args(step, src) + ["--engine", "arrow"],
                       {"BUCKETINDEX_PAUSE": f"{point}=4", "BUCKETINDEX_PAUSE_SIGNAL": str(signals)})
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while not (signals / point).exists():
            if p.poll() is not None:
                rc, err = self.wait(p)
                if rc == 0 and self._committed(step["batch_id"]):
                    return  # a batch already applied (a repeated id) never reaches the point: a no-op
                raise Divergence(self.step_no, "writer ended early", f"exit {rc}: {err.strip()[-1500:]}")
            if time.monotonic() > deadline:
                os.killpg(p.pid, signal.SIGKILL)
                raise Divergence(self.step_no, "writer never paused", point)
            time.sleep(0.05)
        pending = Table.load(self.uri).pending_for_batch(step["batch_id"])
        if pending is None:
            os.killpg(p.pid, signal.SIGKILL)
            raise Divergence(self.step_no, "no pending instant", f"batch {step['batch_id']} at {point}")
        self.must(["rollback", self.uri, pending.timestamp, "--force"])
        rc, err = self.wait(p)
        if rc != 3 or self._committed(step["batch_id"]):
            raise Divergence(self.step_no, "forced rollback", f"writer at {point} exited {rc} "
                             f"(committed={self._committed(step['batch_id'])}): {err.strip()[-800:]}")

    def do_retry(self, step: dict[str, Any]) -> None:
        bid = f"b{step['of']:03d}"
        if bid not in self.batches or not self._committed(bid):
            # never sent (shrunk away) or never committed (lost a race): nothing to repeat, and
            # no writer ran, so a killed process's leftovers still wait for the next one's repair
            self.repaired_now = False
            return
        from spark_jobs.table import Table

        before = Table.load(self.uri).timeline.reload().last_seq
        rows = [{k: (v.isoformat() if isinstance(v, dt.datetime) else str(v) if isinstance(v, decimal.Decimal)
                     else v) for k, v in r.items()} for r in self.batches[bid]]
        self.must(self._upsert_args({"batch_id": bid}, self._source({"batch_id": bid, "zone": "UTC",
                                                                      "rows": rows}, f"retry-{bid}"))
                  + ["--engine", "arrow"])
        after = Table.load(self.uri).timeline.reload()
        new = [after.entry(n) for n in range(before + 1, after.last_seq + 1)]
        if any(e["action"] == "commit" for e in new):
            raise Divergence(self.step_no, "idempotence", f"batch {bid} again made a commit")

    def do_overlap(self, step: dict[str, Any]) -> None:
        self.counts.overlaps += 1
        procs = []
        for i, w in enumerate(step["writers"]):
            src = self._source(w, f"{w['batch_id']}-w{i}")
            env = {"BUCKETINDEX_PAUSE": f"after_conflict_check={step['pause']}"}
            procs.append((w, self.popen(self._upsert_args(w, src) + ["--engine", "arrow", "--max-retries",
                                                                     str(w["max_retries"])], env)))
        service = None
        if step["service"] == "compact":
            kinds = _compactable(self.settings)
            only = ["--only", kinds[0]] if len(kinds) == 1 else []
            service = self.popen(["compact", self.uri, "--engine", "arrow", "--min-logs", "1", "--min-deltas", "1",
                                  *only])
        elif step["service"] == "clean":
            service = self.popen(["clean", self.uri, "--retain-commits", "1"])
        status: dict[str, list[int]] = {}
        for w, p in procs:
            rc, err = self.wait(p)
            if rc not in (0, 3):
                raise Divergence(self.step_no, "overlapping writer failed", f"exit {rc}: {err.strip()[-1500:]}")
            if rc == 3 and "conflict" not in err:
                raise Divergence(self.step_no, "exit 3 without a conflict", err.strip()[-800:])
            status.setdefault(w["batch_id"], []).append(rc)
        if service is not None:
            rc, err = self.wait(service)
            if rc != 0:
                raise Divergence(self.step_no, f"{step['service']} beside writers failed",
                                 f"exit {rc}: {err.strip()[-1500:]}")
        for bid, rcs in status.items():
            if (0 in rcs) != self._committed(bid):
                raise Divergence(self.step_no, "exit status vs timeline", f"batch {bid}: exits {rcs}, "
                                 f"committed={self._committed(bid)}")

    def _service_args(self, step: dict[str, Any]) -> list[str]:
        from spark_jobs.table import Table

        op = step["op"]
        if op == "clean":
            return ["clean", self.uri, "--retain-commits", str(step["retain"])]
        if op == "alter":
            return ["alter", self.uri, "--add-column", "note:string"]
        if op == "rollback":
            return ["rollback", self.uri]
        if op == "mirror":
            return ["mirror", self.uri, "--enable", step.get("projection", "delta"),
                    *(["--view", step["view"]] if step.get("view") else [])]
        args = ["compact", self.uri, "--engine", "arrow"]
        phase = step["phase"]
        if phase == "execute":
            plans = Table.load(self.uri).timeline.reload().pending(["compaction"])
            if plans:
                return args + ["--execute", plans[0].timestamp]
            phase = "run"
        if phase == "schedule":
            args.append("--schedule-only")
        args += ["--min-logs", str(step["min"]), "--min-deltas", str(step["min"])]
        if step.get("only"):
            args += ["--only", step["only"]]
        return args

    def _service(self, step: dict[str, Any]) -> None:
        from spark_jobs.table import Table

        if step["op"] in ("alter", "mirror") and self._table_columns() is None:
            return  # nothing committed yet: no schema to alter or project (refused as bad input)
        args = self._service_args(step)
        if not step.get("kill"):
            self.must(args)
            return
        if step["op"] == "rollback" and not Table.load(self.uri).timeline.reload().pending():
            self.must(args)
            return
        rc, err = self.wait(self.popen(args, {"BUCKETINDEX_FAULT": step["kill"]}))
        killed = rc == -signal.SIGKILL
        self.counts.kills += killed
        if not killed and rc != 0:
            raise Divergence(self.step_no, f"{args[0]} failed", f"exit {rc}: {err.strip()[-1500:]}")

    do_compact = do_clean = do_alter = do_rollback = do_mirror = _service

    def do_rehash(self, step: dict[str, Any]) -> None:
        from spark_jobs.table import Table

        t = Table.load(self.uri)
        n = t.num_buckets()
        m = n // 2 if step["direction"] == "down" and n % 2 == 0 else min(n * 2, 16)
        if m == n:
            return
        self.must(["rehash", self.uri, "--num-buckets", str(m), *self._engine_args(step)])
        self._check_engine(step)

    def _engine_args(self, step: dict[str, Any]) -> list[str]:
        """``--engine`` as the step asks (Spark: on this run's master, reusing its session)."""
        engine = _engine(step)
        return ["--engine", engine] + (["--master", self.spark_master] if engine == "spark" else [])

    def _check_engine(self, step: dict[str, Any]) -> None:
        """The engine the CLI reports having run is the one asked for (``auto`` on these small
        tables: Arrow), so the per-engine counts say what ran."""
        first = self.last_out.splitlines()[0] if self.last_out.strip() else "{}"
        ran = (json.loads(first).get("engine") or {}).get("name")
        want = "arrow" if _engine(step) == "auto" else _engine(step)
        if ran is not None and ran != want:
            raise Divergence(self.step_no, f"{step['op']} engine", f"asked for {_engine(step)}, ran on {ran}: "
                             f"{self.last_out.strip()[:800]}")

    def do_bootstrap(self, step: dict[str, Any]) -> None:
        s = self.settings
        args = ["bootstrap", self.uri, self.dataset, "--record-key", "id", "--precombine-field", "ts",
                "--index", s["index"], "--mode", step["mode"], "--num-buckets", str(s["num_buckets"]),
                "--table-type", s["table_type"], *self._engine_args(step)]
        if s["partitioned"]:
            args += ["--partition-field", "region"]
        if s.get("mirror"):
            args += ["--mirror", s["mirror"]]
        self.must(args)
        self._check_engine(step)
        from spark_jobs.table import Table

        cols = [c for c in Table.load(self.uri).view().schema.names if not c.startswith("_bi_")]
        self.batches["<bootstrap>"] = [dict(_typed({c: r.get(c) for c in cols}, self.ptype), is_deleted=False)
                                       for r in step["rows"]]

    # -- the oracle ----------------------------------------------------------------------
    def advance_oracle(self) -> Any:
        """Replay the timeline's new entries onto the oracle, in commit order."""
        from spark_jobs.table import Table

        t = Table.load(self.uri)
        tl = t.timeline.reload()
        per_partition = self.settings["index"] == "bucket"
        for n in range(len(self.states), tl.last_seq + 1):
            e = tl.entry(n)
            prev = self.states[-1]
            meta = e.get("metadata") or {}
            action = e["action"]
            state = prev
            if action in ("commit", "bootstrap"):
                if meta.get("schema"):  # a commit that sets the schema: added columns read as null
                    from spark_jobs.table.view import decode_schema

                    cols = [c for c in decode_schema(meta["schema"]).names if not c.startswith("_bi_")]
                    added = [c for c in cols if c not in prev.columns]
                    state = _State({k: {c: r.get(c) for c in cols} for k, r in prev.rows.items()}, cols)
                    if prev.columns and added != ["note"] and added:
                        raise Divergence(self.step_no, "schema", f"entry {n} added {added}")
                if meta.get("operation") not in ("alter_schema", "set_properties"):
                    bid = "<bootstrap>" if action == "bootstrap" else meta.get("batch_id")
                    if bid not in self.batches:
                        raise Divergence(self.step_no, "unknown commit", f"entry {n} ({action}) names batch {bid!r}")
                    if bid in self.applied:
                        raise Divergence(self.step_no, "batch applied twice", f"batch {bid} again at entry {n}")
                    self.applied.add(bid)
                    state = _reduce(state, self.batches[bid], state.columns,
                                    per_partition=per_partition, partitioned=self.settings["partitioned"])
            self.states.append(state)
            self.instants.append(e["instant"])
        return t

    applied: set[str]

    # -- checks --------------------------------------------------------------------------
    def check(self) -> None:
        from spark_jobs.arrow_engine import shadow_compare as shadow
        from spark_jobs.arrow_engine.validate import run_validate
        from spark_jobs.exceptions import BadInputError
        from spark_jobs.table import delta, iceberg
        from spark_jobs.table.reader import read_arrow
        from spark_jobs.table.shadow import ShadowOptions
        from spark_jobs.table.view import FileSystemView

        t = self.advance_oracle()
        tl = t.timeline
        last = tl.last_seq
        latest = read_arrow(self.uri)
        self._compare(latest, self.states[last], "latest snapshot")
        if last:
            report = run_validate(self.uri)
            if not report["ok"]:
                raise Divergence(self.step_no, "validate", json.dumps(report["problems"], default=str)[:1500])
            with _quiet():
                sc = shadow.run_shadow_compare(self.uri, ShadowOptions())
            if not sc["ok"]:
                raise Divergence(self.step_no, "shadow-compare",
                                 json.dumps({k: sc.get(k) for k in ("missing", "extra", "wrong_location",
                                                                     "duplicated", "samples")}, default=str)[:1500])
        kept = t.retained_from()
        first = max(1, kept["earliest_retained_seq"]) if kept else 1
        for n in range(first, last + 1):
            inst = self.instants[n]
            expect = max(k for k in range(1, last + 1) if self.instants[k] <= inst)
            self._compare(read_arrow(self.uri, inst), self.states[expect], f"as of {inst} (entry {n})")
        if first > 1:
            older = self.instants[first - 1]
            if max(k for k in range(1, last + 1) if self.instants[k] <= older) < first:
                try:
                    read_arrow(self.uri, older)
                except BadInputError:
                    pass
                else:
                    raise Divergence(self.step_no, "time travel past retention",
                                     f"as of {older} (entry {first - 1}) read, though clean kept from entry {first}")
        if self.killed_now:
            self.crash_beats |= set(t.io.list_names(t.layout.heartbeats))
        elif self.repaired_now:
            self.crash_beats = set()
        # the retained snapshots' views, built once: the audit and the Delta check both read them
        views = {n: FileSystemView.at_seq(tl, n) for n in range(first if last else 0, last + 1)}
        mirrored = delta.enabled(t, views[last].properties)
        on_iceberg = iceberg.enabled(t, views[last].properties)
        self._audit(t, views, mirrored=mirrored, on_iceberg=on_iceberg)
        self._check_delta(t, views, mirrored=mirrored)
        self._check_iceberg(t, views, on=on_iceberg)
        if not self.archived and tl.archives(refresh=True):
            self.archived = True
            self.counts.archived += 1
        now = self._outside_digest()
        if now != self.last_outside:
            changed = sorted(set(now.items()) ^ set(self.last_outside.items()))
            raise Divergence(self.step_no, "outside the table root", f"changed: {changed[:5]}")

    def _compare(self, table: Any, expected: _State, what: str) -> None:
        actual: dict[Any, dict[str, Any]] = {}
        per_partition = self.settings["index"] == "bucket" and self.settings["partitioned"]
        for r in table.to_pylist():
            k = (r.get("region"), r["id"]) if per_partition else r["id"]
            if k in actual:
                raise Divergence(self.step_no, f"{what}: duplicate", f"record {_short(k)} appears twice")
            actual[k] = _nan_equal(r)
        want = {k: _nan_equal(r) for k, r in expected.rows.items()}
        if actual == want:
            return
        missing = [k for k in want if k not in actual]
        extra = [k for k in actual if k not in want]
        wrong = [(k, actual[k], want[k]) for k in want if k in actual and actual[k] != want[k]]
        raise Divergence(self.step_no, f"{what} != oracle",
                         f"missing {_short(missing[:3])} extra {_short(extra[:3])} "
                         f"differ {_short(wrong[:2])} ({len(missing)}/{len(extra)}/{len(wrong)})")

    def _audit(self, t: Any, views: dict[int, Any], *, mirrored: bool, on_iceberg: bool) -> None:
        """Every file under the root is metadata, read by a retained snapshot (``views``), or
        named by a pending plan or a marker (format.md §1, §3.6, §4)."""
        import pyarrow.fs as pafs

        from spark_jobs.table.commit import parse as parse_commit

        tl = t.timeline
        explained: set[str] = set()
        for n, v in views.items():
            explained |= v.all_files()
            for files in v.index_files.values():
                explained.update(files)
            if n:  # a commit's ``read`` files stay until a clean's range covers it (format.md §4.5)
                explained.update(f.path for f in parse_commit(tl.entry(n)["metadata"]).read_set.index)
        pending = tl.pending()
        for inst in pending:
            if inst.action not in ("compaction", "clean", "rollback"):
                continue
            plan = tl.read_plan(inst)
            for g in plan.get("file_groups", []) or []:
                if isinstance(g, dict):
                    explained.update([g.get("base")] + list(g.get("logs") or []))
            for b in plan.get("index_buckets", []) or []:
                explained.update(b.get("files") or [])
            explained.update(plan.get("files") or [])  # a clean's doomed files, a rollback's target files
        marker_root = t.layout.markers
        marked_instants = [n for n in t.io.list_names(marker_root) if not n.startswith(".")]
        for ts in marked_instants:
            explained.update(t.marked_files(ts))
        pending_ts = {i.timestamp for i in pending}
        meta_dir = ".bucketindex/"
        root = self.root_path.rstrip("/")
        infos = t.io.fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        bad = []
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            rel = info.path[len(root) + 1:]
            name = rel.rsplit("/", 1)[-1]
            if rel.startswith(meta_dir):
                sub = rel[len(meta_dir):].split("/", 1)[0]
                if sub in ("timeline", "sequence", "checkpoints", "archive", "conflicts", "markers") \
                        or rel == ".bucketindex/table.json":
                    continue
                if sub == "heartbeats":
                    # a writer killed after its commit point leaves its beat (and markers) for
                    # the next writer's repair (format.md §4.3): allowed until a writer ran
                    if name in pending_ts or name in marked_instants or name in self.crash_beats:
                        continue
                    bad.append(rel + " (heartbeat of a finished instant)")
                    continue
                if sub == "index" and rel in explained:
                    continue
                bad.append(rel)
                continue
            if rel in explained or (rel.startswith(DELTA_LOG) and mirrored and DELTA_FILE.match(rel[len(DELTA_LOG):])) \
                    or (on_iceberg and ICEBERG_FILE.match(rel)):
                continue
            bad.append(rel)
        if bad:
            raise Divergence(self.step_no, "unexplained files", f"{len(bad)}: {_short(sorted(bad)[:4])}")

    def _versions_follow(self, present: list[int], last: int, what: str, *, may_lag: bool) -> bool:
        """A projection's versions against sequence entries 0..``last``: 0..k with no gap and none
        past the sequence; k below it only after a kill (the next commit fills the gap). Returns
        whether the projection may lag now (``may_lag``: it already might, from an earlier kill)."""
        if present != list(range(len(present))) or len(present) > last + 1:
            raise Divergence(self.step_no, f"{what} versions", f"{_short(present)} for sequence entries 0..{last}")
        if len(present) > last:
            return False
        if not (may_lag or self.killed_now):
            raise Divergence(self.step_no, f"{what} gap", f"versions 0..{len(present) - 1} for sequence "
                             f"entries 0..{last}, and no process was killed")
        return True

    def _check_delta(self, t: Any, views: dict[int, Any], *, mirrored: bool) -> None:
        """A mirrored table's Delta log (format.md §11): versions 0..k with no gap and none past
        the sequence; k below the sequence only after a kill (the next commit fills the gap); every
        retained version read by ``deltalake`` equals the oracle at that entry (copy-on-write) or
        the snapshot's bases (merge-on-read: the read-optimized view). In the fresh view (logs as
        added files, dropped rows as deletion vectors) every retained version equals the oracle
        at its entry (which ``read --as-of`` is held to above) read both by ``deltalake``'s
        ``QueryBuilder`` and by Polars' ``read_delta``, the readers that apply vectors; the
        latest, read by ``to_pyarrow_table`` (which cannot), is refused or equal, never wrong rows."""
        from spark_jobs.table import delta
        from tests.harness.delta_reads import (
            has_reference_files,
            published_names,
            query_delta,
            read_delta,
            read_optimized,
            sorted_rows,
        )

        if not mirrored:
            if t.io.list_names(delta.log_dir(t)):
                raise Divergence(self.step_no, "delta log", "a Delta log on a table that does not mirror")
            return
        tl = t.timeline
        last = tl.last_seq
        present = delta.versions_present(t)
        self.delta_may_lag = self._versions_follow(present, last, "delta log", may_lag=self.delta_may_lag)
        uri, opts = delta.reader_uri(t), delta.reader_storage_options(t)
        # a change of view rewrites every version: the latest snapshot's property holds for all
        fresh = self.settings["table_type"] == "merge_on_read" and \
            delta.mirror_view(t, "delta", views[max(views)].properties) == delta.VIEW_FRESH
        for v in range(max(1, min(views)), len(present)):
            view = views[v]
            got = (query_delta if fresh or has_reference_files(view) else read_delta)(uri, v, opts)
            self.counts.delta_versions += 1
            names = published_names(view)
            if got.column_names != names:
                raise Divergence(self.step_no, f"delta version {v} schema", f"{got.column_names} != {names}")
            if fresh:
                self._compare(got, self.states[v], f"delta fresh version {v} (QueryBuilder)")
                self._compare(_polars_delta(uri, v, opts), self.states[v], f"delta fresh version {v} (Polars)")
                self.counts.delta_fresh_versions += 1
            elif self.settings["table_type"] == "copy_on_write":
                self._compare(got, self.states[v], f"delta version {v}")
            elif sorted_rows(got, names) != sorted_rows(read_optimized(t, view), names):
                raise Divergence(self.step_no, f"delta version {v} != read-optimized view",
                                 f"{got.num_rows} rows read, the bases hold {view.num_rows}")

        if fresh and len(present) > 1:
            v = len(present) - 1
            try:
                plain = read_delta(uri, v, opts)
            except Exception:  # noqa: BLE001 - a reader that cannot apply vectors refuses: fine
                return
            self._compare(plain, self.states[v], f"delta fresh version {v} (to_pyarrow_table)")

    def _check_iceberg(self, t: Any, views: dict[int, Any], *, on: bool) -> None:
        """A table mirrored to Iceberg (format.md §12): metadata versions 0..k with no gap and none
        past the sequence, k below it only after a kill; the latest version holds one snapshot
        per retained entry (id = sequence number); every retained version, read by pyiceberg
        from its own metadata file with pyiceberg's own file IO, equals the oracle at that entry
        (copy-on-write; merge-on-read in the fresh view, format.md §12) or the snapshot's bases
        (merge-on-read: the read-optimized view)."""
        from spark_jobs.table import iceberg
        from spark_jobs.table.delta import mirror_view
        from tests.harness.delta_reads import published_names, read_optimized, sorted_rows

        if not on:
            if t.io.list_names(iceberg.metadata_dir(t)):
                raise Divergence(self.step_no, "iceberg metadata", "Iceberg metadata on a table that does not mirror")
            return
        from pyiceberg.table import StaticTable

        last = t.timeline.last_seq
        present = iceberg.versions_present(t)
        self.iceberg_may_lag = self._versions_follow(present, last, "iceberg", may_lag=self.iceberg_may_lag)
        props = _pyiceberg_properties(t)
        first = max(1, min(views))
        # a change of view rewrites every version: the latest snapshot's property holds for all
        exact = self.settings["table_type"] == "copy_on_write" or \
            mirror_view(t, "iceberg", views[max(views)].properties) == "fresh"
        if len(present) > 1:
            newest = StaticTable.from_metadata(iceberg.metadata_uri(t, len(present) - 1), properties=props)
            ids = [s.snapshot_id for s in newest.snapshots()]
            # a clean killed before it completed (its deletions may have begun) has moved the
            # retained window, but its snapshot expiry is part of its own version, written when
            # it completes: until then older snapshots may still be listed
            cleaning = any(i.action == "clean" for i in t.timeline.pending())
            if ids != list(range(first, len(present))) and not (
                    cleaning and ids and ids[0] <= first and ids == list(range(ids[0], len(present)))):
                raise Divergence(self.step_no, "iceberg snapshots", f"{_short(ids)} in version {len(present) - 1}, "
                                 f"retained entries {first}..{len(present) - 1}")
        for v in range(first, len(present)):
            view = views[v]
            got = StaticTable.from_metadata(iceberg.metadata_uri(t, v), properties=props).scan().to_arrow()
            self.counts.iceberg_versions += 1
            names = published_names(view)
            if got.column_names != names:
                raise Divergence(self.step_no, f"iceberg version {v} schema", f"{got.column_names} != {names}")
            if exact:
                self._compare(got, self.states[v], f"iceberg version {v}")
            elif sorted_rows(got, names) != sorted_rows(read_optimized(t, view), names):
                raise Divergence(self.step_no, f"iceberg version {v} != read-optimized view",
                                 f"{got.num_rows} rows read, the bases hold {view.num_rows}")

    def _outside_digest(self) -> dict[str, str]:
        import pyarrow.fs as pafs

        root = self.root_path.rstrip("/") + "/"
        out = {}
        base = self.base_path.rstrip("/")
        for info in self.io.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True)):
            if info.type != pafs.FileType.File or (info.path + "/").startswith(root):
                continue
            out[info.path[len(base) + 1:]] = hashlib.sha256(self.io.read_bytes(info.path)).hexdigest()
        return out


def _polars_delta(uri: str, version: int, opts: dict[str, str] | None) -> Any:
    """Delta version ``version`` read by Polars (``read_delta``, which applies deletion vectors),
    as a pyarrow table; a Polars string column read back as pyarrow's ``large_string`` is
    compared by value, so types do not matter here."""
    import polars as pl

    return pl.read_delta(uri, version=version, storage_options=opts).to_arrow()


def _pyiceberg_properties(t: Any) -> dict[str, str]:
    """pyiceberg's own file IO settings for the table's store (its ``s3.*`` properties), from
    the table's storage configuration: the reader must not borrow the projection's file IO."""
    from spark_jobs.io.filesystem import S3FileIO

    if not isinstance(t.io, S3FileIO):
        return {}
    v = t.io.config.values
    names = {"endpoint_url": "s3.endpoint", "region": "s3.region", "access_key_id": "s3.access-key-id",
             "secret_access_key": "s3.secret-access-key", "session_token": "s3.session-token"}
    env = {"endpoint_url": "AWS_ENDPOINT_URL", "region": "AWS_REGION", "access_key_id": "AWS_ACCESS_KEY_ID",
           "secret_access_key": "AWS_SECRET_ACCESS_KEY", "session_token": "AWS_SESSION_TOKEN"}
    got = {ours: v.get(ours) or os.environ.get(env[ours]) for ours in names}
    return {names[ours]: val for ours, val in got.items() if val}


def _nan_equal(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with NaN spelled :data:`NAN`: NaN is equal to itself in format.md §8's order, and
    a row read back holding it must compare equal to the oracle's."""
    return {c: NAN if isinstance(v, float) and v != v else v for c, v in row.items()}


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) < 600 else text[:600] + "..."


def run_sequence(seq: dict[str, Any], workdir: Path, *, storage: Storage | None = None,
                 counts: Counts | None = None, spark_master: str = "local[2]",
                 log: Callable[[str], None] | None = None) -> None:
    """Run ``seq`` on a fresh table under ``workdir``; raises :class:`Divergence` at the first failed check."""
    counts = counts if counts is not None else Counts()
    r = _Runner(seq, workdir, storage or Storage(), counts, spark_master, log)
    r.applied = set()
    counts.sequences += 1
    r.setup()
    for i, step in enumerate(seq["steps"]):
        r.step_no = i
        t0 = time.perf_counter()
        try:
            r.run_step(step)
        except Divergence:
            raise
        except Exception as e:
            raise Divergence(i, f"{step['op']} raised", f"{type(e).__name__}: {' '.join(str(e).split())[:1500]}") from e
        try:
            r.check()
        except Divergence:
            raise
        except Exception as e:
            raise Divergence(i, "check raised", f"{type(e).__name__}: {' '.join(str(e).split())[:1500]}") from e
        if log:
            how = _engine(step) if step["op"] in ("rehash", "bootstrap") else step.get("via", step.get("phase", ""))
            log(f"    step {i} {step['op']}/{how}: "
                f"{time.perf_counter() - t0:.1f} s with checks")
    shutil.rmtree(workdir, ignore_errors=True)
    if r.storage.kind == "s3":  # the server keeps objects in memory: a long run must not pile them up
        with contextlib.suppress(OSError):
            r.io.delete_dir(r.base_path)


def diverges(seq: dict[str, Any], workdir: Path, **kw: Any) -> Divergence | None:
    """The divergence of ``seq`` run afresh, or None."""
    if workdir.exists():
        shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    try:
        run_sequence(seq, workdir, **kw)
    except Divergence as d:
        return d
    return None


def shrink(seq: dict[str, Any], first: Divergence, workdir: Path, *, budget_s: float = 600,
           log: Callable[[str], None] | None = None, **kw: Any) -> tuple[dict[str, Any], Divergence]:
    """Greedily drop steps, then rows of batches, while the sequence still fails the same check.

    Kills and racing writers make some failures timing-dependent: what cannot be reproduced
    stays in, and the search stops after ``budget_s``."""
    deadline = time.monotonic() + budget_s
    best, why = copy.deepcopy(seq), first

    def same(candidate: dict[str, Any]) -> Divergence | None:
        d = diverges(candidate, workdir, counts=Counts(), **kw)
        return d if d is not None and d.check.split(" (")[0] == why.check.split(" (")[0] else None

    i = len(best["steps"]) - 1
    while i >= 0 and time.monotonic() < deadline:
        if i == 0 and best["steps"][0]["op"] == "bootstrap":
            i -= 1
            continue
        cand = copy.deepcopy(best)
        del cand["steps"][i]
        if cand["steps"]:
            d = same(cand)
            if d is not None:
                best, why = cand, d
                if log:
                    log(f"  shrunk to {len(best['steps'])} steps")
        i -= 1
    # rows: a batch id sent more than once (an overlap's two tries of one task, the same batch
    # again after a kill) carries the same rows each time, so its copies shrink in lockstep
    for bid in _batch_ids(best):
        j = len(_rows_of(best, bid)[0]) - 1
        while j >= 0 and len(_rows_of(best, bid)[0]) > 1 and time.monotonic() < deadline:
            cand = copy.deepcopy(best)
            for rows in _rows_of(cand, bid):
                if j < len(rows):  # copies are equal as generated; a hand-written one may differ
                    del rows[j]
            d = same(cand)
            if d is not None:
                best, why = cand, d
            j -= 1
    return best, why


def _engine(step: dict[str, Any]) -> str:
    """The engine a rehash or bootstrap step asks for; a step written before both verbs had an
    Arrow engine names none and ran on Spark."""
    return step.get("engine", "spark")


def uses_spark(seq: dict[str, Any]) -> bool:
    """Whether ``seq`` has a step that runs on Spark (its runner needs a Spark session)."""
    return any(s.get("via") == "spark" or s["op"] in ("rehash", "bootstrap") and _engine(s) == "spark"
               for s in seq["steps"])


def _senders(seq: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every step or racing writer that sends a batch (has ``rows``), in order."""
    for st in seq["steps"]:
        if "rows" in st:
            yield st
        yield from (w for w in st.get("writers", []) if "rows" in w)


def _batch_key(sender: dict[str, Any]) -> str:
    return sender.get("batch_id") or f"<{sender['op']}>"  # a bootstrap's files have no batch id


def _batch_ids(seq: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(_batch_key(st) for st in _senders(seq)))


def _rows_of(seq: dict[str, Any], batch_id: str) -> list[list[dict[str, Any]]]:
    """The row lists of every copy of ``batch_id`` in ``seq`` (the first one first)."""
    return [st["rows"] for st in _senders(seq) if _batch_key(st) == batch_id]


def replay_command(seq: dict[str, Any], *, storage: str = "local") -> str:
    """The shell command that replays ``seq`` (JSON inline, quoted for a POSIX shell)."""
    import shlex

    return (f"python benchmarks/torture.py --replay {shlex.quote(json.dumps(seq, ensure_ascii=False))}"
            + (f" --storage {storage}" if storage != "local" else ""))


def iter_seeds(seed: int, n: int) -> Iterator[int]:
    """The sequence seeds of a run: one per sequence, from the run's seed."""
    rng = random.Random(seed)
    for _ in range(n):
        yield rng.randrange(2**31)
