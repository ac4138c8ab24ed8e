"""benchmarks/scale.py at a tiny size: its oracle is right, it runs end to end, and it resumes.

The benchmark's figures are only worth what its oracle is: the expected state it keeps
incrementally (per-column sums of hashes, minus the rows a batch replaces, plus the batch's) must
equal the state recomputed from scratch, and must tell a wrong value or a lost row apart.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "scale.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale  # noqa: E402


def _apply(state: pa.Table, batch: pa.Table) -> pa.Table:
    """The batch applied by plain pyarrow: its keys leave the state, its non-deleted rows join it."""
    kept = state.filter(pc.invert(pc.is_in(state.column("id"), value_set=batch.column("id"))))
    live = batch.filter(pc.invert(batch.column("_deleted"))).drop_columns(["_deleted"])
    return pa.concat_tables([kept, live.select(kept.column_names)])


@pytest.mark.parametrize("keys", ["uuid", "order"])
def test_the_incremental_oracle_equals_a_recomputation_and_catches_a_wrong_value(tmp_path, keys):
    data = scale.Dataset(tmp_path, keys=keys, size=600, seed=5, file_rows=250)
    base = data.base()
    state = pa.concat_tables([pq.read_table(f) for f in base["files"]])
    con = scale.duck()
    assert scale.compare(scale.checksums(con, state, keys=keys), base["expected"])["ok"]
    for k, rows in enumerate([200, 100, 200], 1):
        b = data.batch(k, rows)
        batch = pq.read_table(b["path"])
        assert (b["updates"], b["inserts"], b["deletes"]) == (rows - rows // 2 - rows // 100, rows - rows // 2,
                                                             rows // 100)
        assert pc.sum(batch.column("_deleted")).as_py() == rows // 100
        state = _apply(state, batch)
        got = scale.checksums(con, state, keys=keys)
        assert scale.compare(got, b["expected"]) == {"rows": len(state), "expected_rows": len(state),
                                                     "columns_differing": [], "ok": True}
        found = scale.lookup(state, [s[0] for s in b["samples"]])
        assert scale.sample_verdict(found, b["samples"])["sampled_ok"]
        assert any(seq is None for _, seq in b["samples"])  # deleted keys are sampled too
    # one amount off by a cent, and one row lost: both seen
    amounts = state.column("amount").to_pylist()
    amounts[7] += type(amounts[7])("0.01")
    wrong = state.set_column(state.schema.get_field_index("amount"), "amount",
                             pa.array(amounts, state.schema.field("amount").type))
    assert scale.compare(scale.checksums(con, wrong, keys=keys), b["expected"])["columns_differing"] == ["amount"]
    lost = scale.compare(scale.checksums(con, state.slice(1), keys=keys), b["expected"])
    assert not lost["ok"] and lost["rows"] == len(state) - 1
    # the same seed makes the same data; a workdir holding other data is refused, not overwritten
    again = scale.Dataset(tmp_path / "again", keys=keys, size=600, seed=5, file_rows=250)
    assert again.base()["expected"] == base["expected"]
    with pytest.raises(SystemExit, match="use another --workdir"):
        scale.Dataset(tmp_path, keys=keys, size=600, seed=6, file_rows=250)


def test_scale_runs_end_to_end_reports_every_step_and_resumes_without_redoing_one(tmp_path):
    work = tmp_path / "work"
    cmd = [sys.executable, str(SCRIPT), "--workdir", str(work), "--sizes", "2000", "--batches", "200",
           "--batches-before-read", "1", "--file-rows", "1000", "--table-types", "merge_on_read", "--peers", ""]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["oracle_ok"] is True and res["failed_steps"] == []
    steps = {s["step"]: s for s in res["steps"]}
    assert list(steps) == ["build", "batch_01_200", "read_arrow_after_1", "read_duckdb_after_1", "compact",
                           "read_arrow_after_compact", "read_duckdb_after_compact", "validate"]
    batch = steps["batch_01_200"]
    assert batch["contender"] == "bucketindex_merge_on_read_record_uuid_flat" and batch["size"] == 2000
    assert batch["rc"] == 0 and batch["engine"] in ("arrow", "spark") and batch["engine_reason"]
    assert batch["counts"]["updated"] == 98 and batch["counts"]["inserted"] == 100 and batch["counts"]["deleted"] == 2
    assert {"tag_ms", "write_ms", "index_ms", "commit_ms", "total_ms"} <= set(batch["phases_ms"])
    assert batch["time_s"] > 0 and batch["peak_rss_mb"] > 0 and batch["written_bytes"] > 0
    assert batch["read_chars"] > 0 and batch["index_bytes_per_entry"] > 0
    assert batch["oracle_ok"] is True and batch["oracle"]["rows"] == 2000 + 100 - 2
    for name in ("build", "read_arrow_after_1", "read_duckdb_after_1", "read_arrow_after_compact",
                 "read_duckdb_after_compact"):
        assert steps[name]["oracle_ok"] is True, steps[name]
        assert steps[name]["oracle"]["columns_differing"] == []
    assert steps["read_duckdb_after_1"]["read_s"] > 0 and steps["validate"]["validate_ok"] is True
    # one batch of logs leaves nothing due under the default policy: recorded as no compaction (the
    # "after compact" reads then read the uncompacted table), with no engine chosen
    assert steps["compact"]["compacted"] is False and "engine" not in steps["compact"]
    # CPU seconds beside every in-process step's wall time (a loaded machine inflates the wall time)
    assert batch["cpu_s"] > 0 and steps["read_arrow_after_1"]["cpu_s"] > 0
    assert "| 2k | bucketindex_merge_on_read_record_uuid_flat |" in r.stdout  # the summary table
    lines = (work / "results.jsonl").read_text().splitlines()
    assert len(lines) == len(steps)
    # a second run finds every step done: nothing is run again, nothing appended
    r2 = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert " ..." not in r2.stdout
    assert json.loads(r2.stdout.strip().splitlines()[-1])["steps"] == res["steps"]
    assert (work / "results.jsonl").read_text().splitlines() == lines
    assert np.load(work / "data" / "uuid_2000" / "versions.npy").shape == (2100,)


def test_plot_scale_takes_medians_per_contender_and_batch_and_marks_failures(tmp_path):
    """benchmarks/plot_scale.py: the median of each contender's batches of one size at one table
    size, from a scale.py results file (steps of a failed build mark every batch size failed; a
    failed batch is not a point), with the CSV's rows for runs without a file (a results file
    wins for the same point); and a PNG drawn."""
    import plot_scale

    steps = [
        {"contender": "bucketindex_merge_on_read_record_uuid_flat", "size": 10**8, "step": s, "time_s": t, "rc": 0}
        for s, t in [("batch_01_1k", 8.0), ("batch_03_1k", 18.0), ("batch_05_1k", 9.0), ("batch_02_1M", 150.0)]
    ] + [
        {"contender": "delta_rs_uuid_flat", "size": 10**8, "step": "batch_01_1k", "time_s": 1269.0, "rc": 0},
        {"contender": "delta_rs_uuid_flat", "size": 10**8, "step": "batch_02_1M", "time_s": 9.0, "rc": "timeout"},
        {"contender": "pypaimon_uuid_flat", "size": 10**7, "step": "build", "time_s": 1200.0, "rc": "timeout"},
        {"contender": "bucketindex_merge_on_read_record_uuid_flat", "size": 10**6, "step": "read_duckdb_after_4",
         "time_s": 3.0, "rc": 0},
    ]
    results = tmp_path / "results.jsonl"
    results.write_text("\n".join(json.dumps(s) for s in steps) + "\n")
    medians = tmp_path / "m.csv"
    medians.write_text("# a comment\nsize,contender,batch,median_s,batches,load,run\n"
                       "100000000,bucketindex_merge_on_read,1000,99.0,1,1,older run\n"
                       "1000000,delta_rs,1000,11.35,4,5,1M run\n")
    points = plot_scale.points_from_medians(medians)
    points.update(plot_scale.points_from_results([results]))
    assert points[("bucketindex_merge_on_read", 1000, 10**8)] == 9.0  # median of 8, 18, 9; the file wins
    assert points[("bucketindex_merge_on_read", 10**6, 10**8)] == 150.0
    assert points[("delta_rs", 1000, 10**8)] == 1269.0
    assert points[("delta_rs", 10**6, 10**8)] is None  # failed batch
    assert points[("delta_rs", 1000, 10**6)] == 11.35  # from the CSV
    assert {points[("pypaimon", b, 10**7)] for b in (1000, 100_000, 10**6)} == {None}  # failed build
    assert not any(k[2] == 10**6 and k[0] == "bucketindex_merge_on_read" for k in points)  # reads are not batches
    out = tmp_path / "scale.png"
    plot_scale.plot(points, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
