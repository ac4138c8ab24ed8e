"""``bootstrap --engine arrow`` and ``--engine spark``, the same table: one dataset bootstrapped
through each engine gives the same snapshot rows, the same index (entries per bucket, each at
the same file group) and the same file-group layout, in both modes (rewrite with the record,
bucket and global_simple indexes; reference). The dataset is the Arrow tests' (users' data:
Hive values with spaces, ``/``, ``%``, ``+``, non-ASCII, ``""`` and null; zone-aware
timestamps; decimals; duplicate keys resolved by a float precombine holding NaN and null).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.cli import main
from spark_jobs.index.record_index import merge_entries
from spark_jobs.table.reader import read_slice
from spark_jobs.table.table import Table
from tests.unit.test_bootstrap_arrow import CASES, expected, snapshot, write_dataset

pytestmark = pytest.mark.spark


def _index(uri: str) -> dict[int, list[tuple]]:
    """bucket -> its live entries (fingerprint, partition, file id), sorted."""
    t = Table.open(uri)
    view = t.view()
    out = {}
    for b, files in view.index_files.items():
        e = merge_entries(t.io, [t.abs(r) for r in files])
        out[b] = sorted(zip(e.fp_hi.view(np.int64).tolist(), e.fp_lo.view(np.int64).tolist(), e.targets()))
    return out


def _layout(uri: str) -> dict[tuple[str, str], tuple]:
    """(partition, file id) -> the keys of its live slice and whether it is a referenced file."""
    t = Table.open(uri)
    view = t.view()
    assert view.file_groups
    return {(s.partition, s.file_id): (frozenset(read_slice(t, s.path, [lf.path for lf in s.logs],
                                                            columns=["_bi_key"], schema=view.schema)
                                                 .column("_bi_key").to_pylist()), s.path.startswith("../"))
            for s in view.slices()}


#: the extended tier (``-m slow``) holds the rewrite cases of the global indexes: rewrite-bucket in the
#: default tier runs the same read-dedupe-upsert path, reference-record the other mode
EXTENDED = {("rewrite", "record"), ("rewrite", "global_simple")}


@pytest.mark.parametrize("mode,index", [pytest.param(*c, marks=pytest.mark.slow) if c in EXTENDED else c
                                        for c in CASES])
def test_both_engines_bootstrap_the_same_table(spark, tmp_path, capsys, mode, index):
    root = tmp_path / "dataset"
    rows = write_dataset(root)
    uris = {e: str(tmp_path / e) for e in ("spark", "arrow")}
    results = {}
    for engine, uri in uris.items():
        code = main(["bootstrap", uri, str(root), "--record-key", "id", "--partition-field", "region",
                     "--precombine-field", "ts", "--mode", mode, "--index", index, "--num-buckets", "4",
                     "--target-file-rows", "7", "--engine", engine])
        out, err = capsys.readouterr()
        assert code == 0, err
        results[engine] = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
        assert results[engine]["engine"]["name"] == engine
    assert results["spark"]["counts"] == results["arrow"]["counts"]
    assert snapshot(uris["spark"]) == snapshot(uris["arrow"]) == expected(rows)
    assert _layout(uris["spark"]) == _layout(uris["arrow"])
    if index == "record":
        assert _index(uris["spark"]) == _index(uris["arrow"])
        assert sum(len(v) for v in _index(uris["arrow"]).values()) == len(expected(rows))
    metas = {}
    for engine, uri in uris.items():
        t = Table.open(uri)
        [inst] = t.timeline.completed()
        metas[engine] = t.timeline.read_metadata(inst)
        assert run_validate(uri)["ok"]
    for k in ("schema", "num_buckets", "index_type", "bootstrap"):
        assert metas["spark"].get(k) == metas["arrow"].get(k), k
