"""Saved relevance models with stored vs computed modified weights: file size, onnxruntime load time, explain time.

    python benchmarks/bench_saved_model.py MODEL.onnx [--composite NAME ...] [--batch 1] [--repeat 5]

Prints, per composite, the size of each file relative to the model, the load time (InferenceSession creation,
which folds the computed weights) and the run time per batch, and the largest relevance difference between the
two files. A ResNet18 export: see README (Quickstart) for the torch.onnx.export call.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import onnxruntime as ort

import onnx_lrp


def _load(path):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    t = time.perf_counter()
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return sess, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--composite", action="append", default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    size0 = os.path.getsize(args.model)
    for comp in args.composite or ["epsilon-plus-flat", "epsilon-gamma-box"]:
        ex = onnx_lrp.Explainer(args.model, composite=comp)
        spec = ex.inputs[0]
        shape = [args.batch] + [d or 1 for d in spec.dims[1:]]
        x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
        feeds = {spec.name: x, "lrp/target": np.full(args.batch, -1, np.int64), "lrp/one_hot": np.array(False)}
        with tempfile.TemporaryDirectory() as tmp:
            rows, rels = [], []
            for label, computed in (("stored", False), ("computed", True)):
                path = os.path.join(tmp, f"{label}.onnx")
                counts = ex.save(path, computed_weights=computed)
                sess, t_load = _load(path)
                name = f"lrp/relevance/{spec.name}"
                rels.append(sess.run([name], feeds)[0])
                times = []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    sess.run([name], feeds)
                    times.append(time.perf_counter() - t)
                rows.append((label, os.path.getsize(path) / size0, t_load, float(np.median(times)), counts))
            diff = float(np.max(np.abs(rels[0] - rels[1])) / (np.max(np.abs(rels[0])) or 1.0))
        print(f"{os.path.basename(args.model)} {comp} (model {size0 / 2**20:.1f} MiB, batch {args.batch}):")
        for label, ratio, t_load, t_run, counts in rows:
            extra = f"  {counts}" if counts else ""
            print(f"  {label:<8} size {ratio:5.2f}x model  load {t_load:6.2f} s  explain {t_run * 1e3:8.1f} ms{extra}")
        print(f"  max |relevance difference| / max |relevance| = {diff:.2e}")


if __name__ == "__main__":
    main()
