"""Facts about the machine a benchmark ran on, for its JSON line and docs/benchmarks.md."""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["cpu_model", "mem_total_gb", "machine"]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_total_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, object]:
    """The versions and the machine a benchmark's JSON line records, in one place for every script."""
    import os

    import numpy as np
    import pyarrow as pa

    return {"python": platform.python_version(), "pyarrow": pa.__version__, "numpy": np.__version__,
            "cpu_count": os.cpu_count(), "cpu_model": cpu_model(), "mem_gb": mem_total_gb()}
