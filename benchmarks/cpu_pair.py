"""What two cores give on this machine: one pure-Python CPU loop alone, then two side by side.

Why: ``spark_profile.py`` compares ``local[1]`` with ``local[2]`` (issue 38's 1.7x goal); on a
shared 2-vCPU VM the host may not give two busy processes twice the work of one, and then no
engine change can show the goal. Run it beside the comparison (docs/benchmarks.md "Session 51")::

    nice -n 10 python benchmarks/cpu_pair.py [ITERATIONS]
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time


def burn(n: int) -> float:
    t, x = time.perf_counter(), 0
    for i in range(n):
        x += i * i
    return time.perf_counter() - t


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30_000_000
    one = burn(n)
    with mp.Pool(2) as pool:
        t = time.perf_counter()
        pool.map(burn, [n, n])
        two = time.perf_counter() - t
    print(f"1 process: {one:.2f} s; 2 processes side by side: {two:.2f} s; throughput ratio {2 * one / two:.2f}x")


if __name__ == "__main__":
    main()
