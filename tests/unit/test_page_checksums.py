"""Flipped bytes in a table's files are errors naming the file, never other values (issue 36
item 3): every Parquet file the table writes carries page checksums, every read verifies
them, and ``validate`` reads every file of the snapshot whole (``io.parquet``).

On 3fbacf9's code a flip in a data page of a zstd, dictionary-encoded file often decoded
into other values: ``read`` exited 0 with them and ``validate`` (keys only) exited 0."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.cli import main
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.dataset import dataset
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.unit.test_arrow_concurrent_writers import write_batch

pytestmark = pytest.mark.unit

REGIONS = ["eu west/1", "sã%o+paulo", "", None]
NAMES = ["alice", "bob o'brien", "carol/x", "dañ+%", ""]


def _rows(n: int, *, start: int = 0, ts: int = 0) -> list[dict]:
    rng = random.Random(start)
    return [{"id": f"k {i}/%+é", "region": REGIONS[i % len(REGIONS)], "ts": ts + i,
             "amount": round(rng.random() * 1000, 3), "name": NAMES[rng.randrange(len(NAMES))],
             "qty": rng.randrange(50)} for i in range(start, start + n)]


@pytest.fixture
def table(tmp_path: Path) -> str:
    """A merge-on-read table of several file groups per partition, with logs on some."""
    uri = str(tmp_path / "t")
    opts = dict(table=uri, record_key=["id"], precombine_field="ts", partition_field="region")
    arrow_upsert(UpsertOptions(source=write_batch(tmp_path / "b1.parquet", _rows(2400)), batch_id="b1",
                               target_file_rows=300, table_type="merge_on_read", **opts))
    arrow_upsert(UpsertOptions(source=write_batch(tmp_path / "b2.parquet", _rows(500, start=100, ts=10_000)),
                               batch_id="b2", **opts))
    return uri


def _offsets(path: str, rng: random.Random, n: int) -> list[int]:
    """``n`` offsets spread over the file: in every column chunk's dictionary page and data
    pages (the first bytes of each, then anywhere in it), and a few in the footer."""
    md = pq.ParquetFile(path).metadata
    size = Path(path).stat().st_size
    spots = []
    for g in range(md.num_row_groups):
        for c in range(md.num_columns):
            col = md.row_group(g).column(c)
            start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
            end = start + col.total_compressed_size
            spots.append(rng.randrange(start, min(start + 64, end)))  # a dictionary page when the chunk has one
            spots.append(rng.randrange(col.data_page_offset, end))
    footer = size - 8 - md.serialized_size
    spots += [rng.randrange(footer, size - 8) for _ in range(3)]
    return sorted(set(rng.sample(spots, min(n, len(spots)))))


def _flip(path: str, offset: int) -> bytes:
    data = Path(path).read_bytes()
    b = bytearray(data)
    b[offset] ^= 0x5A
    Path(path).write_bytes(bytes(b))
    return data


def _sorted(t: pa.Table) -> list[dict]:
    return t.sort_by("id").to_pylist()


@pytest.mark.parametrize("kind", ["base", "log"])
def test_flipped_bytes_are_named_never_read_as_other_values(table, tmp_path, capsys, kind):
    t = Table.load(table)
    slices = [s for s in t.view().slices() if s.logs]
    assert slices and len(t.view().slices()) > 4, "the fixture must give several file groups, some with logs"
    rel = slices[0].path if kind == "base" else slices[0].logs[0].path
    path = t.abs(rel)
    want = _sorted(read_arrow(table))
    out = tmp_path / "out.parquet"
    rng = random.Random(36)
    detected = 0
    for offset in _offsets(path, rng, 24):
        original = _flip(path, offset)
        try:
            capsys.readouterr()
            rc = main(["read", table, "--engine", "arrow", "--output", str(out)])
            err = capsys.readouterr().err
            if rc == 0:
                assert _sorted(pq.read_table(out)) == want, f"flip at {offset} of {rel}: read other values"
            else:
                assert rc == 1 and path in err and "Traceback" not in err, (offset, rc, err)
                assert len([ln for ln in err.splitlines() if ln.startswith("bucketindex:")]) == 1, err
            v = main(["validate", table, "--engine", "arrow"])
            report = capsys.readouterr().out
            if rc != 0:
                assert v == 1 and '"damaged_files"' in report and path in report, (offset, report)
                detected += 1
            else:  # the flip changed nothing a reader uses (a page header's own statistics)
                assert v == 0 or path in report, (offset, report)
        finally:
            Path(path).write_bytes(original)
    assert detected >= 8, f"only {detected} flips detected"  # the others hit page headers: same rows
    assert main(["validate", table, "--engine", "arrow"]) == 0


def test_dataset_scan_verifies_checksums(tmp_path):
    """``dataset()`` hands plain slices (a copy-on-write table's) to pyarrow's scanner: it
    verifies the pages too."""
    uri = str(tmp_path / "cow")
    arrow_upsert(UpsertOptions(table=uri, source=write_batch(tmp_path / "b.parquet", _rows(600)), record_key=["id"],
                               precombine_field="ts", partition_field="region"))
    t = Table.load(uri)
    path = t.abs(t.view().slices()[0].path)
    col = pq.ParquetFile(path).metadata.row_group(0).column(4)  # the last bytes of a column chunk: a data page
    _flip(path, col.data_page_offset + col.total_compressed_size - 20)
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        dataset(uri).to_table()


def test_files_without_checksums_still_read(table):
    """A file written before checksums existed has none: it reads, and validate passes."""
    t = Table.load(table)
    want = _sorted(read_arrow(table))
    for s in t.view().slices():
        for rel in s.files:
            p = t.abs(rel)
            rows = pq.read_table(p)
            pq.write_table(rows, p, compression="zstd", write_page_checksum=False)
    assert _sorted(read_arrow(table)) == want
    assert main(["validate", table, "--engine", "arrow"]) == 0


def test_damaged_index_file_is_a_finding(table, capsys):
    """Index files are Arrow IPC without checksums: validate decodes each whole and checks its
    invariants, and names a damaged one."""
    t = Table.load(table)
    rel = sorted(f for files in t.view().index_files.values() for f in files)[0]
    path = t.abs(rel)
    data = Path(path).read_bytes()
    digest = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(table).rglob("*") if p.is_file()}
    Path(path).write_bytes(data[: len(data) // 2])  # truncated
    capsys.readouterr()
    assert main(["validate", table, "--engine", "arrow"]) == 1
    out = capsys.readouterr().out
    # a file that no longer opens is index_files_unreadable (its bucket left out of the index
    # checks, the rest checked: tests/unit/test_index_repair.py), not also damaged_files
    report = json.loads(out)
    assert path in "".join(report["problems"]["index_files_unreadable"]["samples"]), report
    assert "damaged_files" not in report["problems"], report
    Path(path).write_bytes(data)
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(table).rglob("*") if p.is_file()} == digest
