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


class RunClock:
    """The time an Explainer spends inside its onnxruntime run (``session.run_bound``) per ``explain`` call: the
    rest of the call is on the host (feeds, checks, the result). ``split(fn, repeat)`` times ``fn`` (an explain) and
    returns (wall, inside the run) of its fastest call."""

    def __init__(self, explainer):
        self.inside = 0.0
        session = explainer.session
        run = session.run_bound

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return run(*a, **k)
            finally:
                self.inside += time.perf_counter() - t0

        session.run_bound = timed

    def call(self, fn) -> tuple[float, float]:
        self.inside = 0.0
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0, self.inside


def profiled(model, feeds: dict, providers, runs: int = 3, warmup: int = 3, threads: int | None = None) -> dict:
    """onnxruntime's profile of ``model`` (bytes or a path) on ``feeds``: the mean wall time of a run
    (``model_run``), the summed node times (``Node`` events) and, where the CUDA provider reports them, the GPU
    kernel times (``Kernel`` events), per run, in ms; warm-up runs (cuDNN's algorithm search) left out. ``path``:
    the profile file, kept for inspection; ``cpu_nodes``: nodes a CUDA session ran on the CPU provider; ``copies``:
    the copies between host and device onnxruntime inserted (Memcpy nodes)."""
    import json
    import os
    import tempfile

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.log_severity_level = 3
    opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="onnx-lrp-prof-"), "p")
    if threads:
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model, sess_options=opts, providers=providers)
    for _ in range(warmup + runs):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    starts = [e["ts"] for e in events if e.get("name") == "model_run"]
    first = starts[warmup] if len(starts) > warmup else 0
    kept = [e for e in events if e.get("ts", 0) >= first]
    per = max(1, len(starts) - warmup)
    wall = [e["dur"] for e in kept if e.get("name") == "model_run"]
    nodes = sum(e["dur"] for e in kept if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"))
    kernels = [e["dur"] for e in kept if e.get("cat") == "Kernel"]
    placed = {e["name"][: -len("_kernel_time")]: e["args"].get("provider", "") for e in kept
              if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")}
    return {"run_ms": sum(wall) / max(1, len(wall)) / 1e3, "nodes_ms": nodes / per / 1e3,
            "kernels_ms": sum(kernels) / per / 1e3 if kernels else None, "path": path,
            "cpu_nodes": sorted(n for n, p in placed.items() if p == "CPUExecutionProvider" and "CUDA" in str(providers)),
            "copies": sorted(n for n in placed if n.startswith("Memcpy") or "memcpy" in n.lower())}
