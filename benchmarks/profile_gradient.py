"""Where the gradient methods' time goes: onnxruntime's profiler on the gradient relevance model of a torchvision CNN.

The gradient of a ReLU CNN costs at least 2 forwards (a forward and a backward of the same products). This prints
the gradient's run and its parts in forwards of onnxruntime's plain forward at the same rows: the forward, the
backward's products (and how much the strided transposes, ``ConvTranspose``, take above their forward twins), the
ReLU masks, the max pool's indices and scatter, layout reorders, the rest; then the time per op type and tag.

    python benchmarks/profile_gradient.py --model resnet50 --rows 10 [--runs 3 --threads 2]

torch and torchvision build the model (random weights, as benchmarks/bench_cnn.py does).
"""
from __future__ import annotations

import argparse
import collections
import sys
import types

import numpy as np
from profile_cnn import model_path, profile, tag_of


def part_of(name: str, op: str) -> str:
    tag = tag_of(name)
    if "lrp/" not in name:
        return {"MaxPool": "max pool (indices)", "ReorderInput": "reorders", "ReorderOutput": "reorders"}.get(
            op, "forward")
    if op in ("Conv", "ConvTranspose", "MatMul", "Gemm") and tag.startswith("JTs"):
        return "backward products"
    if tag in ("y_up", "dfdx", "r_in", "y_pos") or tag.startswith("dfdx"):
        return "relu masks"
    if op in ("ScatterElements", "ConstantOfShape"):
        return "max pool (indices)"
    return "rest"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--rows", type=int, default=10, help="stacked rows per run (the methods' at a 2 GB budget: 10)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)

    from onnx_lrp.core.interface import ONE_HOT_INPUT, TARGET_INPUT
    from onnx_lrp.methods import Attributor

    path = model_path(args.model, args.size)
    x = np.random.default_rng(0).standard_normal((args.rows, 3, args.size, args.size)).astype(np.float32)
    grad = Attributor(path, "gradient", threads=args.threads).engine.runner  # its .relevance_model
    feeds = {"x": x, TARGET_INPUT: np.full(args.rows, 3, np.int64), ONE_HOT_INPUT: np.array(True)}
    nodes, _, run_us = profile(grad, feeds, args.runs, args.threads)
    with open(path, "rb") as f:
        plain = types.SimpleNamespace(relevance_model=types.SimpleNamespace(model_bytes=f.read()))
    _, _, fwd_us = profile(plain, {"x": x}, args.runs, args.threads)

    parts, by_op = collections.Counter(), collections.Counter()
    for e in nodes:
        name, op = e["name"][: -len("_kernel_time")], e["args"].get("op_name", "?")
        ms = e["dur"] / 1000.0 / args.runs
        parts[part_of(name, op)] += ms
        by_op[(op, tag_of(name) if "lrp/" in name else "(forward)")] += ms
    fwd = fwd_us / 1000
    print(f"{args.model} b{args.rows}: forward {fwd:.0f} ms, gradient {run_us / 1000:.0f} ms = "
          f"{run_us / fwd_us:.2f} forwards")
    for k, ms in parts.most_common():
        print(f"  {k:24s} {ms:8.1f} ms {ms / fwd:6.2f}")
    print(f"\n{'op type':18s} {'tag':28s} {'ms':>8s} {'forwards':>8s}")
    for (op, tag), ms in by_op.most_common(20):
        print(f"{op:18s} {tag:28s} {ms:8.1f} {ms / fwd:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
