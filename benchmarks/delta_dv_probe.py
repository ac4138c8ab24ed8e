"""Which Delta readers apply deletion vectors (issue 39 item 2: measured, not assumed).

Writes a tiny Delta table by hand whose one data file (4 rows) carries a deletion vector that
drops rows 1 and 3 -- inline (storage type ``i``, Z85) or in a DV file (``u``... is path-based:
``p`` here) -- in the form the Delta protocol gives ("Deletion Vector Format": the
RoaringBitmapArray portable serialization, magic 1681511377), with the ``deletionVectors``
reader feature, then reads it with each reader installed and prints what each returns:
the 2 live rows (applies DVs), all 4 (ignores them: wrong rows), or a refusal. The file is in
the root, then in a ``region=x`` directory (its ``add.path`` percent-encoded, as every
partitioned table's is). Measured (deltalake 1.6.6, Polars 2.1.0): ``to_pyarrow_table`` and
``to_pyarrow_dataset`` refuse, ``QueryBuilder`` applies them, Polars applies them on a plain
path and ignores them on the encoded one.

    python benchmarks/delta_dv_probe.py [--dir /tmp/dvprobe]

No bucketindex code is involved: this is the evidence for format.md §11's and §12's reader table.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import shutil
import struct
import uuid
import zlib
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85(data: bytes) -> str:
    """Z85 (the Delta protocol's inline DV encoding), zero-padded to a multiple of 4 bytes."""
    data = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i:i + 4], "big")
        chunk = []
        for _ in range(5):
            v, r = divmod(v, 85)
            chunk.append(_Z85[r])
        out.append("".join(reversed(chunk)))
    return "".join(out)


def roaring_array(rows: list[int]) -> bytes:
    """The Delta RoaringBitmapArray portable form of ``rows`` (all < 2**16, <= 4096 of them:
    one 32-bit bitmap, key 0, holding one array container)."""
    rows = sorted(rows)
    assert rows and rows[-1] < 2**16 and len(rows) <= 4096
    bitmap = struct.pack("<II", 12346, 1)  # SERIAL_COOKIE_NO_RUNCONTAINER, 1 container
    bitmap += struct.pack("<HH", 0, len(rows) - 1)  # key, cardinality - 1
    bitmap += struct.pack("<I", len(bitmap) + 4)  # offset of the container
    bitmap += struct.pack(f"<{len(rows)}H", *rows)
    return struct.pack("<i", 1681511377) + struct.pack("<q", 1) + struct.pack("<i", 0) + bitmap


def write_table(root: str, storage: str, directory: str = "") -> None:
    """The probe table; its file in ``directory`` (e.g. ``region=x``: its ``add.path`` is then
    percent-encoded, ``region%3Dx/part-0.parquet``, as a partitioned table's paths are)."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "_delta_log"))
    os.makedirs(os.path.join(root, directory), exist_ok=True)
    data = pa.table({"id": pa.array([0, 1, 2, 3], pa.int64()), "v": pa.array(["a", "b", "c", "d"])})
    rel = posixpath.join(directory, "part-0.parquet") if directory else "part-0.parquet"
    pq.write_table(data, os.path.join(root, rel))
    blob = roaring_array([1, 3])
    if storage == "i":
        dv = {"storageType": "i", "pathOrInlineDv": z85(blob), "sizeInBytes": len(blob), "cardinality": 2}
    else:
        path = os.path.join(root, f"deletion_vector_{uuid.uuid4()}.bin")
        with open(path, "wb") as f:  # format version 1, then size (BE), the DV, its CRC-32 (BE)
            f.write(b"\x01" + struct.pack(">i", len(blob)) + blob + struct.pack(">I", zlib.crc32(blob)))
        dv = {"storageType": "p", "pathOrInlineDv": "file://" + path, "offset": 1, "sizeInBytes": len(blob),
              "cardinality": 2}
    schema = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}},
                                           {"name": "v", "type": "string", "nullable": True, "metadata": {}}]}
    actions = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                      "writerFeatures": ["deletionVectors"]}},
        {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps(schema), "partitionColumns": [],
                      "configuration": {"delta.enableDeletionVectors": "true"}, "createdTime": 0}},
        {"add": {"path": quote(rel, safe="/"), "partitionValues": {},
                 "size": os.path.getsize(os.path.join(root, rel)),
                 "modificationTime": 0, "dataChange": True, "stats": json.dumps({"numRecords": 4}),
                 "deletionVector": dv}},
    ]
    with open(os.path.join(root, "_delta_log", f"{0:020d}.json"), "w") as f:
        f.write("".join(json.dumps(a) + "\n" for a in actions))


def readers(root: str) -> dict[str, object]:
    out: dict[str, object] = {}

    def attempt(name: str, fn: object) -> None:
        try:
            t = fn()  # type: ignore[operator]
            out[name] = sorted(t.column("id").to_pylist())
        except Exception as e:  # noqa: BLE001 - a refusal is a result
            out[name] = f"refused: {type(e).__name__}: {str(e).splitlines()[0][:120]}"

    import deltalake

    attempt(f"deltalake {deltalake.__version__} to_pyarrow_table",
            lambda: deltalake.DeltaTable(root).to_pyarrow_table())
    attempt(f"deltalake {deltalake.__version__} to_pyarrow_dataset",
            lambda: deltalake.DeltaTable(root).to_pyarrow_dataset().to_table())
    attempt(f"deltalake {deltalake.__version__} QueryBuilder (DataFusion)",
            lambda: pa.table(deltalake.QueryBuilder().register("t", deltalake.DeltaTable(root))
                             .execute("select * from t")))
    try:
        import polars as pl

        attempt(f"polars {pl.__version__} read_delta", lambda: pl.read_delta(root).to_arrow())
        attempt(f"polars {pl.__version__} scan_delta", lambda: pl.scan_delta(root).collect().to_arrow())
    except ImportError:
        pass
    try:
        import duckdb

        def duck() -> pa.Table:
            con = duckdb.connect()
            con.execute("LOAD delta")  # no network here: only if the extension is installed
            return con.execute(f"select * from delta_scan('{root}')").to_arrow_table()

        attempt(f"duckdb {duckdb.__version__} delta_scan", duck)
    except ImportError:
        pass
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp/dvprobe")
    args = p.parse_args()
    for storage, directory in (("i", ""), ("p", ""), ("i", "region=x")):
        root = os.path.join(args.dir, f"dv_{storage}_{directory.replace('=', '_')}")
        write_table(root, storage, directory)
        print(json.dumps({"storage": storage, "directory": directory, "want": [0, 2], "got": readers(root)}))


if __name__ == "__main__":
    main()
