"""The torture test's Delta fresh view on the moto S3 server (issue 39): one random sequence whose
table lives in a bucket, partitioned by an integer field and published in the Delta fresh view
(logs as added files, the rows their merge drops as inline deletion vectors).

The sequence (``generate(389, max_steps=9, delta_fresh_share=1.0, partition_type="int")``):
record index, merge-on-read, 2 buckets, checkpoints every 3 entries, its table named by a URI
carrying the store's settings and credentials in its query (``uri_options``); an upsert, then
``mirror --enable delta --view fresh`` killed between its commit point and its Delta version (a
gap the next commit fills), an upsert, a compaction, racing writers, a clean, an upsert; keys
with a 300-character one, ``é+%/ ``, ``x+y``, ``~tilde``; partition values 0, -1, 7, -2**31,
2**40, 10**15 and null. After every step the harness (``tests.harness.torture``) checks the table
against the oracle and every retained Delta version read from S3 by ``deltalake``'s
``QueryBuilder`` and Polars (with the store's options) against the oracle at its entry; a
divergence fails the test. In the CI tier (``tests/conftest.py`` ``CI_TIER``: 130 s on 2 shared
cores); the default run keeps the same checks on local disk (``tests/unit/test_torture.py``).
"""

from __future__ import annotations

import json

import pytest

from tests.harness import torture
from tests.harness.torture import Divergence, generate, run_sequence

SEED = 389


def test_the_delta_fresh_view_of_an_int_partitioned_table_on_s3_matches_the_oracle(s3, bucket, tmp_path):
    seq = generate(SEED, max_steps=9, delta_fresh_share=1.0, partition_type="int")
    s = seq["settings"]
    assert (s["table_type"], s["partitioned"], s["partition_type"], s.get("uri_options")) == (
        "merge_on_read", True, "int", True)
    assert [(st.get("view"), st.get("kill")) for st in seq["steps"] if st["op"] == "mirror"] == [
        ("fresh", torture.MIRROR_POINT)]
    counts = torture.Counts()
    storage = torture.Storage(kind="s3", bucket=bucket)
    try:
        run_sequence(seq, tmp_path / "run", storage=storage, counts=counts)
    except Divergence as d:
        pytest.fail(f"seed {SEED} on S3 diverged: {d}\nsequence: {json.dumps(seq, ensure_ascii=False)}\n"
                    f"replay: {torture.replay_command(seq, storage='s3')}")
    assert counts.steps == len(seq["steps"]) and counts.kills >= 1
    # the enabling step was killed before its versions: from the next step on, every retained
    # version was read through both readers
    assert counts.delta_fresh_versions >= len(seq["steps"]) - 2, counts.as_dict()
