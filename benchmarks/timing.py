"""Timing helpers shared by the benchmark scripts (run as ``python benchmarks/X.py``: this folder is on sys.path).

Best-of times: on a shared machine the least disturbed run is the closest to the cost itself; two functions timed
alternately see the same machine state, so their ratio holds even when the machine is loaded."""
from __future__ import annotations

import time


def best(fn, repeat: int = 5, warmup: int = 1) -> float:
    """Best of ``repeat`` runs of ``fn()`` after ``warmup`` runs, in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def best_pair(fa, fb, repeat: int = 5) -> tuple[float, float]:
    """Best-of times of ``fa`` and ``fb`` run alternately (one warm-up run each), in seconds."""
    fa(), fb()
    ta, tb = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fa()
        t1 = time.perf_counter()
        fb()
        ta.append(t1 - t0)
        tb.append(time.perf_counter() - t1)
    return min(ta), min(tb)
