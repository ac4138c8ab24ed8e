"""Sizing Spark to the machine and the data, and naming what ran out when it fails.

Kept free of ``pyspark`` (and of Airflow) so the CLI, the Airflow hook and the jobs share
one set of rules: the hook derives ``--driver-memory`` for a local-mode spark-submit with
the same function the CLI uses for its own session.

Why derive at all: Spark's defaults are a 1 GiB driver heap and 200 shuffle partitions.
In local mode the driver heap is also the executors' heap, so a 10M-row load dies with
``OutOfMemoryError`` on a machine with 24 GiB free, while a 200-row batch pays for 200
empty shuffle tasks per shuffle. Neither default fits any size a user runs.
"""

from __future__ import annotations

import errno
import math
import os
import re

__all__ = [
    "DRIVER_MEMORY_ENV",
    "local_driver_memory",
    "is_local_master",
    "shuffle_partitions",
    "describe_resource_failure",
    "is_out_of_memory",
]

#: the user's override of the derived local-mode heap, e.g. ``8g`` (the CLI's ``--driver-memory`` wins)
DRIVER_MEMORY_ENV = "BUCKETINDEX_DRIVER_MEMORY"
#: share of physical memory the local-mode JVM heap may take; the rest is for the Python
#: workers (Arrow UDFs hold a file group or an index bucket each), the page cache and the OS
LOCAL_HEAP_FRACTION = 0.35
MIN_HEAP_MB, MAX_HEAP_MB = 1024, 32 * 1024
#: bytes of shuffled input per task we aim for; AQE coalesces smaller partitions further
TARGET_PARTITION_BYTES = 64 * 1024 * 1024
MAX_SHUFFLE_PARTITIONS = 2000


def _physical_memory_mb() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1024 * 1024))
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a small machine
        return 4096


def local_driver_memory(override: str | None = None) -> str:
    """The JVM heap for local mode: ``override``, else ``$BUCKETINDEX_DRIVER_MEMORY``, else
    about a third of physical memory (1-32 GiB), as a Spark size string (``"8g"``, ``"1536m"``)."""
    chosen = override or os.environ.get(DRIVER_MEMORY_ENV)
    if chosen:
        if not re.fullmatch(r"\d+[kmgtKMGT]?", chosen.strip()):
            from spark_jobs.exceptions import BadInputError

            raise BadInputError(f"driver memory {chosen!r} is not a size like 4g or 1536m")
        return chosen.strip().lower()
    mb = int(_physical_memory_mb() * LOCAL_HEAP_FRACTION)
    mb = max(MIN_HEAP_MB, min(MAX_HEAP_MB, mb))
    return f"{mb // 1024}g" if mb % 1024 == 0 else f"{mb}m"


def is_local_master(master: str | None) -> bool:
    return master is None or master == "local" or master.startswith("local[")


def shuffle_partitions(input_bytes: int, cores: int) -> int:
    """Shuffle partitions for ``input_bytes`` of input: ~64 MiB each, at least one per core.

    A starting point only: jobs run with adaptive execution, which merges partitions that
    turn out small, so erring high costs little and erring low costs a spill.
    """
    by_size = math.ceil(max(0, input_bytes) / TARGET_PARTITION_BYTES)
    return max(1, cores, min(MAX_SHUFFLE_PARTITIONS, by_size))


_OOM = re.compile(r"OutOfMemoryError|Java heap space|GC overhead limit exceeded")
_PY_MEM = re.compile(r"(Python worker exited unexpectedly|worker crashed|MemoryError|killed by signal 9|"
                     r"exit code 137|SIGKILL)")
_LOST = re.compile(r"(ExecutorLostFailure|Executor (heartbeat )?lost|Lost executor|"
                   r"Container killed by YARN for exceeding memory|OOMKilled)")
_JVM_GONE = re.compile(r"(Py4JNetworkError|Answer from Java side is empty|"
                       r"Error while sending or receiving)")
_DISK = re.compile(r"No space left on device")


#: the words of a thread this process could not start: its stack is memory it could not map
#: (an address-space limit) or a process limit -- a resource of the machine, never the input's
_NO_THREAD = "can't start new thread"
#: Arrow's thread pool could not start a thread (pthread_create: EAGAIN under an address-space
#: or thread limit); pyarrow raises it as an ArrowException whose text says so
_NO_ARROW_THREAD = "Failed to launch worker thread"


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says this process ran out of memory: a ``MemoryError`` (pyarrow's
    ``ArrowMemoryError`` is one: ``realloc of size ... failed``), an ``OSError`` ENOMEM anywhere
    in its cause chain, or a thread that could not start. Readers that turn a library's errors
    into bad input (exit 2) ask first: memory is a resource (exit 1), and Airflow retries it."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno == errno.ENOMEM):
            return True
        if isinstance(e, RuntimeError) and _NO_THREAD in str(e):
            return True
        if _NO_ARROW_THREAD in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def describe_resource_failure(error: BaseException, *, master: str | None = None,
                              driver_memory: str | None = None, table_root: str | None = None,
                              output: str | None = None) -> str | None:
    """One line naming what ran out and the setting to raise, or None when ``error`` is not a
    resource failure (then it is a bug or bad input and keeps its own message).

    ``table_root`` (a local path or a URI) and ``output`` (a file the driver writes, e.g.
    ``read --output``) let a full disk be told apart: the table's storage, the driver's
    disk, or Spark's local dir each need a different disk freed.
    """
    text = f"{type(error).__name__}: {error}"
    local = is_local_master(master)
    if _DISK.search(text) or _errno(error) in (errno.ENOSPC, errno.EDQUOT):
        return _describe_disk_full(error, text, table_root=table_root, output=output)
    if is_out_of_memory(error):  # raised in this process (a Spark worker's arrives as text, below)
        from spark_jobs.table.action.engine import BUDGET_SETTING

        return (f"out of memory: this process could not allocate memory ({_first_line(error)}); the in-process "
                f"Arrow engine plans to hold at most {BUDGET_SETTING}: set it below the memory this process may "
                f"use (--engine auto then runs larger work on Spark), or give the process more memory")
    if _OOM.search(text):
        if local:
            return ("out of memory: the Spark driver JVM ran out of heap (local mode runs the executors "
                    "in it); raise --driver-memory (or $BUCKETINDEX_DRIVER_MEMORY), e.g. --driver-memory "
                    f"{_double(local_driver_memory(driver_memory))}")
        return ("out of memory: a Spark JVM ran out of heap; raise spark.executor.memory (or "
                "spark.driver.memory if the driver failed)")
    if _LOST.search(text):
        return ("an executor was lost (killed or out of memory); raise spark.executor.memory and "
                "spark.executor.memoryOverhead, or check the cluster manager's log for why it was killed")
    if _PY_MEM.search(text):
        return ("a Python worker died (usually out of memory: it holds one file group or one index bucket); "
                "raise the machine's free memory or spark.executor.memoryOverhead, or lower "
                "--target-file-rows / raise --num-buckets so each task holds less")
    if _JVM_GONE.search(text):
        return ("the Spark driver JVM stopped responding (it usually died of memory exhaustion); raise "
                "--driver-memory (or $BUCKETINDEX_DRIVER_MEMORY) and see the Spark log for the cause")
    return None


def _first_line(error: BaseException) -> str:
    return ((str(error).strip().splitlines() or [""])[0][:200] or type(error).__name__)


#: a local filesystem with less free space than this counts as the one that filled up
FULL_BELOW_BYTES = 1024 * 1024


def first_os_error(error: BaseException, *, with_filename: bool = False) -> OSError | None:
    """The first OSError in ``error``'s cause chain (with a file name, if asked): engines and
    pyarrow wrap the errno that says what failed -- a full disk, a denied directory."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and (isinstance(e.filename, str) if with_filename else e.errno is not None):
            return e
        e = e.__cause__ or e.__context__
    return None


def _errno(error: BaseException) -> int | None:
    e = first_os_error(error)
    return e.errno if e is not None else None


def _filename(error: BaseException) -> str | None:
    """The file name an OSError in ``error``'s cause chain carries (FileIO names the file it wrote)."""
    e = first_os_error(error, with_filename=True)
    return e.filename if e is not None else None


def _local_path(uri: str | None) -> str | None:
    if not uri:
        return None
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return os.path.abspath(uri) if "://" not in uri else None


def _free_bytes(path: str) -> int | None:
    """Free bytes on the filesystem of ``path`` (or of its nearest existing parent)."""
    try:
        st = os.statvfs(_existing(path))
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def _existing(path: str) -> str:
    p = path
    while p and not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p or "/"


def _spark_local_dir() -> str:
    """Where a local Spark writes shuffle and spill files: ``$SPARK_LOCAL_DIRS`` or the temp dir."""
    import tempfile

    return (os.environ.get("SPARK_LOCAL_DIRS") or tempfile.gettempdir()).split(",")[0]


def _same_disk(a: str, b: str) -> bool:
    try:
        return os.stat(_existing(a)).st_dev == os.stat(_existing(b)).st_dev
    except OSError:
        return False


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _describe_disk_full(error: BaseException, text: str, *, table_root: str | None, output: str | None) -> str:
    """Which disk filled up. Spark's errors rarely name the file, so: the file an OSError
    names, else the table root named in the message, else a local table whose filesystem
    has (almost) no space left, else Spark's scratch space -- the one disk a job writes
    that is neither the table nor an output."""
    name = _filename(error)
    out = _local_path(output)
    if out is not None and (name is None or _inside(os.path.abspath(name), out)):
        return (f"out of disk: the driver's disk holding the output {output} is full; free space there or "
                f"write the output elsewhere")
    root = _local_path(table_root)
    free = _free_bytes(root) if root else None
    local_dir = _spark_local_dir()
    local_free = _free_bytes(local_dir)
    # a task's error rarely names its file: the table's disk when it is the (nearly) full one
    guess_table = root is not None and name is None and free is not None and (
        free < FULL_BELOW_BYTES or (local_free is not None and free < local_free))
    on_table = (name is not None and root is not None and _inside(os.path.abspath(name), root)) or \
        (table_root is not None and table_root.rstrip("/") in text) or guess_table
    if on_table and root is not None and name is None and _same_disk(root, local_dir):
        return (f"out of disk: the disk holding both the table ({table_root}) and Spark's local dir "
                f"({local_dir}, spark.local.dir) is full; free space there or move either to a larger disk")
    if on_table:
        left = f", {free} bytes free" if free is not None else ""
        return (f"out of disk: the table's storage is full ({table_root}{left}); free space there or move "
                f"the table to a larger disk")
    if name is not None:
        return (f"out of disk: the disk holding {name} is full (on the driver's machine); free space there")
    return ("out of disk: Spark could not write shuffle or spill files; free space under "
            "spark.local.dir (default /tmp) or point spark.local.dir at a larger disk")


def _double(size: str) -> str:
    m = re.fullmatch(r"(\d+)([kmgt]?)", size)
    return f"{int(m.group(1)) * 2}{m.group(2)}" if m else size
