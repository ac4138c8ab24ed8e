"""Rehash on both engines: one table (copied) rehashed by ``bucketindex rehash --engine spark`` and
``--engine arrow`` -- a split, then a merge -- gets the same snapshot (rows), the same index
(entries per bucket, with their locations), the same file-group layout and the same counts;
both equal the oracle and pass ``validate``."""

from __future__ import annotations

import json
import posixpath
import shutil

import pytest

from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.cli import main
from spark_jobs.index.record_index import merge_entries
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_arrow_oracle_rehash import _batches, _upsert, assert_layout

pytestmark = pytest.mark.spark


def _index(uri: str) -> dict[int, set]:
    """Every live index entry per bucket: (fingerprint, partition, file id)."""
    t = Table.load(uri)
    out = {}
    for b, files in t.view().index_files.items():
        e = merge_entries(t.io, [t.abs(f) for f in files])
        out[b] = {(int(h), int(lo), e.locations[int(loc)]) for h, lo, loc in zip(e.fp_hi, e.fp_lo, e.loc)}
    return out


def _groups(uri: str) -> dict:
    """File groups as (directory of the base, live rows, logs): everything but the names, which
    carry each run's instant."""
    view = Table.load(uri).view()
    return {k: (posixpath.dirname(s.path), s.num_rows, len(s.logs)) for k, s in view.file_groups.items()}


@pytest.mark.parametrize("index,table_type", [("bucket", "merge_on_read"), ("record", "copy_on_write")])
def test_spark_and_arrow_rehash_give_the_same_table(spark, tmp_path, capsys, index, table_type):
    per_partition = index == "bucket"
    ident = "region" if per_partition else None
    batches = _batches(seed=17, per_partition=per_partition)
    built = str(tmp_path / "built")
    for i in range(3):
        _upsert(built, tmp_path, batches, i, **({"index": index, "num_buckets": 2, "table_type": table_type}
                                               if i == 0 else {}))
    expected = reduce_batches(batches[:3], partition=ident)
    on = {e: str(tmp_path / e) for e in ("spark", "arrow")}
    for uri in on.values():
        shutil.copytree(built, uri)
    for m in (8, 4):  # a split, then a merge
        counts = {}
        for engine, uri in on.items():
            capsys.readouterr()
            assert main(["rehash", uri, "--num-buckets", str(m), "--engine", engine]) == 0
            res = json.loads(capsys.readouterr().out.strip().splitlines()[0])
            assert res["engine"]["name"] == engine
            counts[engine] = res["counts"]
            assert rows_by_identity(read_arrow(uri).to_pylist(), partition=ident) == expected
            assert_layout(uri, m)
            assert run_validate(uri)["ok"]
        assert counts["spark"] == counts["arrow"]
        assert _groups(on["spark"]) == _groups(on["arrow"])
        assert _index(on["spark"]) == _index(on["arrow"])
        assert sorted(read_arrow(on["spark"]).to_pylist(), key=repr) == sorted(read_arrow(on["arrow"]).to_pylist(),
                                                                               key=repr)
