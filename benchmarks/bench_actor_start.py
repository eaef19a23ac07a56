"""Where a Ray actor's start goes, each part timed in a fresh Python process (best of --repeat):

  ray.data        importing Ray Data (every Ray Data actor does; not ours to cut)
  imports         the actor's onnx_lrp imports: onnx_lrp.ray + onnx_lrp.dataset, which run the relevance model through
                  onnx_lrp.run.runner (numpy + onnxruntime only)
  imports (old)   the same plus onnx_lrp.explainer (onnx_ir, onnx, sympy, the loader and rewriter), which actors
                  imported before the runner was split out of the Explainer
  unpickle        reading the payload (the relevance model's bytes and the plain data the run needs)
  session         opening the onnxruntime session on it (one thread, graph optimisation "all", cold)

    python benchmarks/bench_actor_start.py [--models digits,resnet18] [--repeat 5]

The Ray engine's whole start (actor processes, the first shard) is measured by bench_dataset.py ("ray (start)").
"""
from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import time, sys
t0 = time.perf_counter()
import {mods}
t1 = time.perf_counter()
if {payload!r}:
    import pickle
    from onnx_lrp.run.runner import Runner
    with open({payload!r}, "rb") as f:
        p = pickle.load(f)
    t2 = time.perf_counter()
    Runner.from_payload(p, threads=1)
    t3 = time.perf_counter()
else:
    t2 = t3 = t1
print(t1 - t0, t2 - t1, t3 - t2)
"""


def probe(mods: str, payload: str = "") -> list[float]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(mods=mods, payload=payload)], check=True,
                         capture_output=True, text=True, cwd=ROOT).stdout
    return [float(v) for v in out.split()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="digits,resnet18")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    import onnx_lrp

    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    best = {}
    for r in range(args.repeat):
        for label, mods in (("ray.data", "ray.data"), ("imports", "onnx_lrp.ray, onnx_lrp.dataset"),
                            ("imports (old)", "onnx_lrp.ray, onnx_lrp.dataset, onnx_lrp.explainer")):
            best[label] = min(best.get(label, 1e9), probe(mods)[0])
    print(f"{'':14s} {'seconds':>8s}")
    for label, t in best.items():
        print(f"{label:14s} {t:8.3f}")
    print(f"imports: {best['imports (old)'] / best['imports']:.1f}x faster than with onnx_lrp.explainer")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            if name == "digits":
                model = ROOT / "models" / "digits_cnn.onnx"
            elif name == "resnet18":
                sys.path.insert(0, str(ROOT / "benchmarks"))
                from bench_dataset import build_resnet18

                folder = Path(tempfile.gettempdir()) / "onnx_lrp_bench_dataset"
                folder.mkdir(exist_ok=True)
                model = build_resnet18(folder / "resnet18.onnx")
            else:
                raise SystemExit(f"unknown model {name}")
            path = os.path.join(tmp, f"{name}.pkl")
            payload = onnx_lrp.Explainer(model).payload()
            with open(path, "wb") as f:
                pickle.dump(payload, f)
            times = [probe("onnx_lrp.ray, onnx_lrp.dataset", path)[1:] for _ in range(args.repeat)]
            print(f"{name}: payload {os.path.getsize(path) / 1e6:.1f} MB, unpickle {min(t[0] for t in times):.3f} s, "
                  f"session {min(t[1] for t in times):.3f} s (best of {args.repeat})")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
