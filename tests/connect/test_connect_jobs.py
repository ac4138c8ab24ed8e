"""The classic tier's oracle, retry and crash tests, unchanged, over Spark Connect.

The test functions are imported from tests/spark, so both tiers run the same bodies and
assertions; here ``spark`` is a Connect session and the crash tests' CLI writers run with
``--remote`` (their tasks run in the server's Python workers, and a crash point inside a
task kills the writer -- the CLI process -- not the shared server).

Kept: every oracle test (record, bucket, global_simple, time travel, composite keys), the
idempotent retry, the crash at each step of a commit for the record index plus the
bucket index's task-side crash, and the crash during rollback.
"""

from __future__ import annotations

import pytest

from tests.spark.test_retry_and_crash import (  # noqa: F401 - collected here with this tier's fixtures
    test_crash_during_rollback_resumes,
    test_killed_writer_leaves_old_snapshot_and_next_run_repairs,
    test_same_batch_id_twice_is_one_commit,
)
from tests.spark.test_upsert_oracle import (  # noqa: F401
    test_composite_key_and_unpartitioned,
    test_random_batches_match_oracle,
    test_time_travel_reads_each_snapshot,
)

pytestmark = [pytest.mark.connect, pytest.mark.timeout(600)]
