"""The README's command-line examples, pasted in order into an empty directory, each exit 0.

A newcomer follows the README verbatim: the examples must be self-contained (they write their
own sample data), consistent with each other (the bootstrap fixes what the upserts then read
from the table) and true. The block is found by its marker comment, so editing the examples
edits this test. One JVM start (``bootstrap`` runs on Spark); every other line runs on the
in-process engine, which ``--engine auto`` picks for data this small.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark  # bootstrap starts a local Spark

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- readme-cli-examples:"


def readme_cli_examples() -> list[str]:
    """The command lines of the marked ```sh block (a line ending in ``\\`` continues)."""
    text = (ROOT / "README.md").read_text()
    assert text.count(MARKER) == 1, "the README's CLI example block is marked once"
    block = re.search(r"```sh\n(.*?)\n```", text[text.index(MARKER):], re.S)
    assert block is not None
    lines: list[str] = []
    pending = ""
    for raw in block.group(1).splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def test_the_examples_are_the_ones_a_newcomer_needs():
    lines = readme_cli_examples()
    verbs = [ln.split()[1] for ln in lines if ln.startswith("bucketindex ")]
    assert lines[0].startswith("python -m spark_jobs.sample_orders")  # the data first
    for verb in ("bootstrap", "upsert", "show", "read", "validate", "shadow-compare", "rollback", "compact", "clean"):
        assert verb in verbs
    # the upserts repeat none of what the bootstrap fixed: the table's are read from table.json
    for ln in lines:
        if ln.startswith("bucketindex upsert"):
            assert "--record-key" not in ln and "--precombine-field" not in ln and "--num-buckets" not in ln


def test_readme_cli_examples_run_in_order_in_an_empty_directory(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["TMPDIR"] = str(tmp_path)  # whatever a command leaves in the temp directory stays in the test's
    env["BUCKETINDEX_SPARK_LOG"] = str(tmp_path / "spark.log")
    for var in ("SPARK_REMOTE", "PYTHONPATH"):  # the installed package, as a newcomer has it
        env.pop(var, None)
    outputs = []
    for line in readme_cli_examples():
        p = subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"{line}\nexit {p.returncode}\n{p.stderr[-3000:]}"
        outputs.append((line, p.stdout))
    # what the lines say they do, they did
    upserts = [json.loads(out.strip().splitlines()[-1]) for line, out in outputs if line.startswith("bucketindex upsert")]
    first, rerun, second = upserts
    assert first["noop"] is False and first["batch_id"].startswith("auto-")
    assert first["counts"]["rows_in_batch"] == 7 and first["counts"]["keys_in_batch"] == 6  # one key twice
    assert rerun["noop"] is True and rerun["batch_id"] == first["batch_id"] and rerun["instant"] == first["instant"]
    assert second["noop"] is False and second["batch_id"] == "orders-2024-01-02"
    snapshot = pq.read_table(work / "snapshot.parquet").to_pylist()
    from spark_jobs.sample_orders import batches, legacy_orders

    expected: dict[str, dict] = {r["order_id"]: r for r in legacy_orders()}
    for day in sorted(batches()):  # the oracle: each batch reduced by key, the later updated_at wins
        for r in sorted(batches()[day], key=lambda r: r["updated_at"]):
            expected[r["order_id"]] = r
    live = {k: r for k, r in expected.items() if not r["is_deleted"]}
    got = {r["order_id"]: r for r in snapshot}
    assert set(got) == set(live)
    for k, r in live.items():
        assert (got[k]["amount"], got[k]["region"], got[k]["updated_at"]) == (r["amount"], r["region"], r["updated_at"])
