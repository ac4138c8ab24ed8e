"""The FileIO contract, one suite over the local disk and an S3-compatible store.

What the table format relies on from its storage (docs/format.md §10): create-if-absent (the
commit point: the first writer's content stays, the second gets InstantExistsError), atomic
replace, reads, listings (names only, sorted, a missing directory is empty), deletes that
tolerate missing files, sizes, and a confined FileIO that never writes outside its root. Then
the race the commit protocol stands on: 8 processes, each with its own FileIO built by
``resolve``, on 25 commit slots -- exactly one winner per slot -- and several processes
creating the same table. On S3 also the 409 ``ConditionalRequestConflict`` answer (retry the
same key), and the stores a table cannot live on, refused when it is opened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from spark_jobs.exceptions import PathEscapeError, StorageUnavailableError, UnsupportedStorageError
from spark_jobs.io.filesystem import (
    FileIO,
    HadoopFileIO,
    InstantExistsError,
    LocalFileIO,
    S3FileIO,
    UncommittableFileIO,
    refuse_uncommittable,
    resolve,
)

#: names as users' data makes them: spaces, %, +, non-ASCII
ROOT = Path(__file__).resolve().parents[2]
NAMES = ["a file", "b%20c", "c+d", "é ü 東京"]
SLOTS = 25
RACERS = 8


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> tuple[FileIO, str, str]:  # type: ignore[no-untyped-def]
    """(FileIO, root path inside it, root URI) of an empty place on one backend."""
    if request.param == "local":
        uri = str(tmp_path / "store")
    else:
        uri = f"{request.getfixturevalue('bucket')}/store"
    io, root = resolve(uri)
    assert isinstance(io, LocalFileIO if request.param == "local" else S3FileIO)
    return io, root, uri


def test_create_if_absent_keeps_the_first_writers_content(store):
    io, root, _ = store
    path = f"{root}/.bucketindex/sequence/00000000000000000001"
    io.create_exclusive(path, b"first")
    with pytest.raises(InstantExistsError):
        io.create_exclusive(path, b"second")
    assert io.read_bytes(path) == b"first"
    # no temp file of either attempt is left beside it
    assert io.list_names(f"{root}/.bucketindex/sequence") == ["00000000000000000001"]


def test_write_atomic_replaces_and_reads_back(store):
    io, root, _ = store
    path = f"{root}/.bucketindex/{NAMES[3]}.json"
    io.write_atomic(path, b"one")
    assert io.read_bytes(path) == b"one"
    io.write_atomic(path, b"two, longer")
    assert io.read_bytes(path) == b"two, longer"
    assert io.list_names(f"{root}/.bucketindex") == [f"{NAMES[3]}.json"]
    with pytest.raises(FileNotFoundError):
        io.read_bytes(f"{root}/.bucketindex/absent.json")


def test_exists_and_list_names(store):
    io, root, _ = store
    assert not io.exists(f"{root}/d/{NAMES[0]}")
    assert io.list_names(f"{root}/d") == []  # a missing directory lists empty
    for name in reversed(NAMES):
        io.write_atomic(f"{root}/d/{name}", name.encode())
    io.write_atomic(f"{root}/d/sub dir/deep", b"x")
    for name in NAMES:
        assert io.exists(f"{root}/d/{name}")
    assert not io.exists(f"{root}/d/a fil")  # a prefix of a name is not a file
    # names only (no paths), sorted, a sub-directory by its name, not its files
    assert io.list_names(f"{root}/d") == sorted([*NAMES, "sub dir"])
    assert io.list_names(f"{root}/d/sub dir") == ["deep"]


def test_deletes_tolerate_missing_files_and_sizes_add_up(store):
    io, root, _ = store
    sizes = {name: 10 + i for i, name in enumerate(NAMES)}
    for name, n in sizes.items():
        io.write_atomic(f"{root}/g/{name}", b"x" * n)
    assert io.total_size(f"{root}/g") == sum(sizes.values())
    assert io.total_size(f"{root}/g/{NAMES[1]}") == sizes[NAMES[1]]
    io.delete(f"{root}/g/never there")  # a rollback resumes over deletes already done
    io.delete(f"{root}/nowhere/at all")
    io.delete(f"{root}/g/{NAMES[0]}")
    assert not io.exists(f"{root}/g/{NAMES[0]}")
    io.delete(f"{root}/g/{NAMES[0]}")  # twice: still fine
    io.delete_many([f"{root}/g/{NAMES[1]}", f"{root}/g/missing", f"{root}/g/{NAMES[2]}"])
    assert io.list_names(f"{root}/g") == [NAMES[3]]
    assert io.total_size(f"{root}/g") == sizes[NAMES[3]]
    io.delete_many([])


def test_confined_refuses_every_write_outside_its_root(store):
    io, root, _ = store
    table = f"{root}/table"
    confined = io.confined(table)
    confined.write_atomic(f"{table}/inside", b"ok")
    outside = [f"{root}/other", f"{root}/table-sibling/x", f"{table}/../escape", "/tmp/x" if root.startswith("/")
               else "another-bucket/x"]
    for path in outside:
        for attempt in (lambda: confined.write_atomic(path, b"no"), lambda: confined.create_exclusive(path, b"no"),
                        lambda: confined.write_bytes(path, b"no"), lambda: confined.delete(path),
                        lambda: confined.delete_many([path])):
            with pytest.raises(PathEscapeError):
                attempt()
    # nothing was written or deleted
    assert io.list_names(root) == ["table"]
    assert io.read_bytes(f"{table}/inside") == b"ok"
    assert not io.exists(f"{root}/escape")


# -- the race: 8 processes, 25 slots; several processes creating one table ----------------------
#: one writer process: its own FileIO (``resolve``); told "ready" once built, it waits for "go",
#: tries every slot, then creates the table; a bare interpreter (no pytest), so 8 start quickly
RACER = r"""
import json, sys
from spark_jobs.io.filesystem import InstantExistsError, resolve
from spark_jobs.table.config import TableConfig
from spark_jobs.table.table import Table

uri, worker, slots = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
io, root = resolve(uri)
table = Table.open(uri + "/table")
io.exists(root + "/warm-up")  # connections open before the race, not during it
print("ready", flush=True)
sys.stdin.readline()
won = []
for slot in range(slots):
    try:
        io.create_exclusive(f"{root}/slots/{slot:03d}", f"worker {worker}".encode())
        won.append(slot)
    except InstantExistsError:
        pass
try:
    created = table.create(TableConfig(record_key_fields=["id"], num_buckets=4, partition_fields=["region"]))
    created = created.to_json().decode()
except BaseException as e:
    created = f"ERROR {type(e).__name__}: {e}"
print(json.dumps({"worker": worker, "won": won, "created": created}), flush=True)
"""


def test_eight_processes_racing_on_25_slots_one_winner_each(store):
    io, root, uri = store
    procs = [subprocess.Popen([sys.executable, "-c", RACER, uri, str(w), str(SLOTS)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT) for w in range(RACERS)]
    try:
        for p in procs:  # all built and connected: then all go at once
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * RACERS
    winners: dict[int, list[int]] = {}
    for r in results:
        for slot in r["won"]:
            winners.setdefault(slot, []).append(r["worker"])
    assert sorted(winners) == list(range(SLOTS)), "every slot has a winner"
    assert all(len(w) == 1 for w in winners.values()), {s: w for s, w in winners.items() if len(w) != 1}
    for slot, (worker,) in winners.items():  # the winner's content, never a loser's
        assert io.read_bytes(f"{root}/slots/{slot:03d}") == f"worker {worker}".encode()
    assert io.list_names(f"{root}/slots") == [f"{s:03d}" for s in range(SLOTS)]
    # the table: one config, every creator got it back, none failed
    configs = {r["created"] for r in results}
    assert len(configs) == 1 and not next(iter(configs)).startswith("ERROR"), configs
    assert io.read_bytes(f"{root}/table/.bucketindex/table.json").decode() == next(iter(configs))


# -- S3: a 409 ConditionalRequestConflict is retried on the same key -----------------------------
def answer_409_first(io: S3FileIO, monkeypatch, times: int = 1) -> list[dict]:  # type: ignore[no-untyped-def]
    """Wrap the real client's ``put_object``: the first ``times`` calls answer 409 as S3 does when
    another conditional put on the key is in flight; then the real store answers."""
    from botocore.exceptions import ClientError

    real = io.client.put_object
    calls: list[dict] = []

    def put_object(**kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs)
        if len(calls) <= times:
            raise ClientError({"Error": {"Code": "ConditionalRequestConflict", "Message": "in flight"},
                               "ResponseMetadata": {"HTTPStatusCode": 409}}, "PutObject")
        return real(**kwargs)

    monkeypatch.setattr(io.client, "put_object", put_object)
    return calls


def test_a_409_is_retried_on_the_same_key_then_succeeds(bucket, monkeypatch):
    io, root = resolve(f"{bucket}/t")
    calls = answer_409_first(io, monkeypatch)
    io.create_exclusive(f"{root}/slot", b"mine")
    assert len(calls) == 2
    assert {c["Key"] for c in calls} == {"t/slot"} and all(c["IfNoneMatch"] == "*" for c in calls)
    assert io.read_bytes(f"{root}/slot") == b"mine"


def test_a_409_then_the_key_taken_is_instant_exists(bucket, monkeypatch):
    io, root = resolve(f"{bucket}/t")
    io.create_exclusive(f"{root}/slot", b"theirs")  # the conflicting put won
    calls = answer_409_first(io, monkeypatch)
    with pytest.raises(InstantExistsError):
        io.create_exclusive(f"{root}/slot", b"mine")
    assert [c["Key"] for c in calls] == ["t/slot", "t/slot"]
    assert io.read_bytes(f"{root}/slot") == b"theirs"


def test_409_forever_is_retryable_and_writes_nothing(bucket, monkeypatch):
    io, root = resolve(f"{bucket}/t")
    monkeypatch.setattr(io, "CONFLICT_RETRIES", 2)
    calls = answer_409_first(io, monkeypatch, times=100)
    with pytest.raises(StorageUnavailableError, match="409"):
        io.create_exclusive(f"{root}/slot", b"mine")
    assert len(calls) == 3 and {c["Key"] for c in calls} == {"t/slot"}
    assert not io.exists(f"{root}/slot")


# -- stores a table cannot live on: refused when opened, nothing written --------------------------
@pytest.mark.parametrize("uri", ["hdfs://namenode:8020/lake/orders", "gs://lake/orders", "gcs://lake/orders",
                                 "abfs://c@acct.dfs.core.windows.net/orders", "abfss://c@acct.dfs.core.windows.net/o"])
def test_table_open_refuses_stores_without_create_if_absent(uri):
    from spark_jobs.table.table import Table

    started = time.monotonic()
    with pytest.raises(UnsupportedStorageError, match="not supported") as e:
        Table.open(uri)
    assert uri in str(e.value) and "\n" not in str(e.value)
    assert time.monotonic() - started < 5, "refused by its scheme, without reaching for the store"


def test_refusal_with_the_real_fileio_classes(tmp_path):
    """The classes ``resolve`` builds for HDFS, GCS and Azure, over the local disk (no libhdfs or
    cloud credentials here): a table is refused before anything is written, and their
    create-if-absent is a refusal too, never a NotImplementedError."""
    local = pafs.LocalFileSystem()
    target = str(tmp_path / "t" / "slot")
    for io, scheme in ((HadoopFileIO(local), "hdfs"), (UncommittableFileIO(local, "gs"), "gs"),
                       (UncommittableFileIO(local, "abfs"), "abfs")):
        assert not io.supports_exclusive_create
        with pytest.raises(UnsupportedStorageError, match=f"tables on {scheme}://"):
            refuse_uncommittable(io, f"{scheme}://x/t")
        with pytest.raises(UnsupportedStorageError):
            io.create_exclusive(target, b"x")
        # still a reader: a source there is read like any other
        (tmp_path / "src").mkdir(exist_ok=True)
        (tmp_path / "src" / "part.parquet").write_bytes(b"PAR1")
        assert io.list_names(str(tmp_path / "src")) == ["part.parquet"]
    assert not os.path.exists(target)


def test_cli_on_an_hdfs_table_is_one_line_exit_2_nothing_written(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_jobs.cli import main as cli

    src = tmp_path / "b.parquet"
    pq.write_table(pa.table({"id": ["a"], "ts": [1]}), src)
    before = sorted(Path(tmp_path).rglob("*"))
    for argv in (["upsert", "hdfs://namenode:8020/lake/orders", str(src), "--record-key", "id", "--engine", "arrow"],
                 ["show", "hdfs://namenode:8020/lake/orders"], ["validate", "gs://lake/orders", "--engine", "arrow"]):
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("bucketindex: error: tables on "), err
    assert sorted(Path(tmp_path).rglob("*")) == before
