"""Which completed actions a pending action conflicts with: the one conflict check of every action.

An action plans on a snapshot (the commit sequence up to ``seq``) and, before it claims its
own sequence slot, asks :func:`find_conflict` about every entry completed after that
snapshot. The matrix of which actions may complete concurrently lives in
``docs/format.md`` (§4.5); :data:`MATRIX` is its executable form.

Write-set rules for two writes (``commit`` / ``bootstrap``), in order:

* **same batch id**: the batch is already applied; the later writer becomes a no-op;
* **layout**: a different bucket count in force (a ``rehash`` completed in between);
* **file groups**: the same ``(partition, file id)`` rewritten by both -- copy-on-write
  files are merged from the snapshot's version, so the later one would drop the earlier
  one's rows. For the bucket index the file id *is* the bucket, so this is "the same bucket
  of the same partition";
* **record keys** (record index): a key fingerprint in both commits' index deltas of the
  same bucket. Deltas hold inserts, moves and deletes; an in-place update writes no entry
  but rewrites the key's file group, which the previous rule catches. Together they close
  the hole where two writers insert one new key into two file groups (a duplicate);
* **new keys** (global_simple, which has no index to compare): both commits added keys.
  Conservative -- it cannot tell which keys -- but a retry re-tags and then succeeds;
* **decided without writing** (the pending action's ``reads``, format.md §4.5): a delete of
  a key absent from its snapshot, or a row dropped as stale against its stored row, writes
  nothing, so the rules above never see it -- yet a concurrent insert of that key (or delete
  of the stored row) makes the decision wrong in commit order. It conflicts when a commit
  since wrote one of its keys (record: its ``read`` index file shares a fingerprint with a
  delta of the same bucket), wrote one of its file groups (``read_groups``: the bucket
  index's groups, the groups holding a global_simple stale row), or added keys while it
  deleted absent ones (global_simple). Only the pending side's reads matter: a completed
  commit's decision stays right whatever commits after it;
* **schema**: both record a schema (created the table, or changed its schema: an ``alter``
  or an upsert with ``--schema-evolution``): the later one was validated against a schema
  the earlier one replaced, and would put it back (format.md "Schema evolution").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from spark_jobs.index.record_index import IndexEntries, IndexFile
from spark_jobs.io.filesystem import FileIO
from spark_jobs.table.commit import CommitMetadata
from spark_jobs.table.commit import parse as parse_commit
from spark_jobs.table.layout import TableLayout
from spark_jobs.table.timeline import Action

__all__ = ["Conflict", "WriteSet", "find_conflict", "MATRIX", "CHECK", "ALWAYS", "NEVER"]

CHECK, ALWAYS, NEVER = "check write sets", "always conflict", "never conflict"

#: (pending action, action completed after its snapshot) -> rule. Pairs not listed: NEVER.
MATRIX: dict[tuple[str, str], str] = {
    (Action.COMMIT, Action.COMMIT): CHECK,
    (Action.COMMIT, Action.BOOTSTRAP): CHECK,
    (Action.COMMIT, Action.REHASH): ALWAYS,  # the layout it routed with is gone
    (Action.COMMIT, Action.COMPACTION): NEVER,  # compaction folds only older deltas; ours stay newest
    (Action.COMMIT, Action.CLEAN): NEVER,  # clean keeps every file a pending writer's snapshot uses
    (Action.COMMIT, Action.ROLLBACK): NEVER,  # unless it rolled back this very instant (aborted)
    (Action.BOOTSTRAP, Action.COMMIT): CHECK,
    (Action.BOOTSTRAP, Action.BOOTSTRAP): ALWAYS,
    (Action.BOOTSTRAP, Action.REHASH): ALWAYS,
    (Action.REHASH, Action.COMMIT): ALWAYS,  # a rehash rewrites what it read: any write since is lost
    (Action.REHASH, Action.BOOTSTRAP): ALWAYS,
    (Action.REHASH, Action.REHASH): ALWAYS,
    (Action.REHASH, Action.COMPACTION): ALWAYS,
    (Action.COMPACTION, Action.REHASH): ALWAYS,
    (Action.COMPACTION, Action.COMPACTION): CHECK,  # the same index files folded twice
}


@dataclass(frozen=True)
class Conflict:
    """Why a pending action may not complete after ``instant``."""

    instant: str
    action: str
    reason: str
    #: the batch is already applied by ``instant`` (same batch id): nothing left to do
    already_applied: bool = False

    def __str__(self) -> str:
        return f"{self.reason} (concurrent {self.action} {self.instant})"


@dataclass(frozen=True)
class WriteSet:
    """What a pending action wrote, as far as other actions care (from its metadata)."""

    action: str
    batch_id: str | None = None
    file_groups: frozenset[tuple[str, str]] = frozenset()
    #: index bucket -> this action's delta file (relative path)
    index_deltas: dict[int, str] = field(default_factory=dict)
    num_buckets: int | None = None
    index_type: str | None = None
    adds_keys: bool = False
    #: index files this action replaces (compaction)
    index_removed: frozenset[str] = frozenset()
    #: the action records a schema: it created the table or changed its schema (format.md
    #: "Schema evolution"); a write that changes nothing of it records none
    changes_schema: bool = False
    #: what it decided without writing (``reads``): index bucket -> its ``read`` file (record),
    #: file groups (bucket, global_simple stale rows), deletes of absent keys (global_simple)
    read_index: dict[int, str] = field(default_factory=dict)
    read_groups: frozenset[tuple[str, str]] = frozenset()
    reads_absent: bool = False

    @classmethod
    def of(cls, action: str, meta: "Mapping[str, Any] | CommitMetadata") -> "WriteSet":
        commit = parse_commit(meta)
        return cls(
            action=action,
            batch_id=commit.batch_id,
            file_groups=commit.group_keys(),
            index_deltas=commit.index_deltas(),
            num_buckets=commit.num_buckets,
            index_type=commit.index_type,
            adds_keys=bool(commit.count("inserted") or commit.count("moved")),
            index_removed=frozenset(commit.removed_index_files),
            changes_schema=commit.schema is not None,
            read_index={int(f.bucket): f.path for f in commit.read_set.index},
            read_groups=commit.read_set.groups,
            reads_absent=commit.read_set.absent_keys,
        )


def find_conflict(mine: WriteSet, entry: dict[str, Any], io: FileIO, layout: TableLayout,
                  cache: dict[str, IndexEntries] | None = None) -> Conflict | None:
    """The conflict between pending ``mine`` and one completed sequence ``entry``, or None.

    ``cache`` keeps the pending action's own index entries between calls (one per entry).
    """
    action, inst = entry["action"], entry["instant"]
    rule = MATRIX.get((mine.action, action), NEVER)
    if rule == NEVER:
        return None
    if rule == ALWAYS:
        return Conflict(inst, action, f"a {action} completed after this {mine.action} planned")
    theirs = WriteSet.of(action, entry["metadata"])
    if mine.batch_id is not None and theirs.batch_id == mine.batch_id:
        return Conflict(inst, action, f"batch {mine.batch_id} was committed by another writer", already_applied=True)
    if mine.num_buckets and theirs.num_buckets and mine.num_buckets != theirs.num_buckets:
        return Conflict(inst, action, f"the bucket count changed from {mine.num_buckets} to {theirs.num_buckets}")
    both = mine.file_groups & theirs.file_groups
    if both:
        part, fid = sorted(both)[0]
        where = f"{part}/{fid}" if part else fid
        return Conflict(inst, action, f"{len(both)} file group(s) written by both, e.g. {where}")
    if mine.index_removed & theirs.index_removed:
        return Conflict(inst, action, "the same index files compacted by both")
    shared = 0
    for bucket in sorted(mine.index_deltas.keys() & theirs.index_deltas.keys()):
        own = _entries(io, layout.abs(mine.index_deltas[bucket]), cache)
        shared += _common_keys(own, _entries(io, layout.abs(theirs.index_deltas[bucket]), None))
    if shared:
        return Conflict(inst, action, f"{shared} record key(s) written by both")
    if mine.index_type == theirs.index_type == "global_simple" and mine.adds_keys and theirs.adds_keys:
        return Conflict(inst, action, "both added keys (global_simple cannot tell which: re-tagging)")
    read = mine.read_groups & theirs.file_groups
    if read:
        part, fid = min(read)
        where = f"{part}/{fid}" if part else fid
        return Conflict(inst, action, f"{len(read)} file group(s) this write decided rows on without writing were "
                                      f"written since, e.g. {where}")
    decided = 0
    for bucket in sorted(mine.read_index.keys() & theirs.index_deltas.keys()):
        own = _entries(io, layout.abs(mine.read_index[bucket]), cache)
        decided += _common_keys(own, _entries(io, layout.abs(theirs.index_deltas[bucket]), None))
    if decided:
        return Conflict(inst, action, f"{decided} record key(s) this write decided without writing (a delete of an "
                                      f"absent key, a stale row) were written since")
    if mine.reads_absent and theirs.adds_keys:
        return Conflict(inst, action, "this write deleted keys absent from its snapshot and the other added keys "
                                      "(global_simple cannot tell which: re-deciding)")
    if mine.changes_schema and theirs.changes_schema:
        # the later one evolved (or altered) a schema the earlier one replaced: it would put the
        # old columns back; the retry validates its batch again on the new schema
        return Conflict(inst, action, "both changed the table schema")
    return None


def _entries(io: FileIO, path: str, cache: dict[str, IndexEntries] | None) -> IndexEntries:
    if cache is not None and path in cache:
        return cache[path]
    with IndexFile(io, path) as f:
        e = f.entries()
    if cache is not None:
        cache[path] = e
    return e


def _common_keys(ea: IndexEntries, eb: IndexEntries) -> int:
    """How many key fingerprints (live or tombstone) two index files share (both sorted)."""
    if not len(ea) or not len(eb):
        return 0
    # both files are sorted by (fp_hi, fp_lo): match on the high word, confirm the low word
    pos = np.searchsorted(eb.fp_hi, ea.fp_hi)
    pos = np.minimum(pos, len(eb) - 1)
    cand = eb.fp_hi[pos] == ea.fp_hi
    exact = cand & (eb.fp_lo[pos] == ea.fp_lo)
    common = int(np.count_nonzero(exact))
    # rare: equal high words whose first match differs in the low word; walk that run
    for i in np.nonzero(cand & ~exact)[0].tolist():
        j = int(pos[i]) + 1
        while j < len(eb) and eb.fp_hi[j] == ea.fp_hi[i]:
            if eb.fp_lo[j] == ea.fp_lo[i]:
                common += 1
                break
            j += 1
    return common
