"""Actions on the timeline (commit, rollback, and the table services of later releases).

Each action is a module; they share one write protocol (:class:`Transaction`) and one
conflict check (:mod:`.conflict`, whose matrix ``docs/format.md`` §4.5 documents).
"""

from spark_jobs.table.action.conflict import Conflict, WriteSet, find_conflict
from spark_jobs.table.action.rollback import repair, rollback
from spark_jobs.table.action.transaction import CommitConflict, Committed, Transaction

__all__ = ["CommitConflict", "Committed", "Conflict", "Transaction", "WriteSet", "find_conflict", "repair", "rollback"]
