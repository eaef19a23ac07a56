"""Where the relevance pass spends its time: onnxruntime's profiler on the relevance model of a torchvision CNN.

Prints the time per emitted node kind (op type) and per emitted tag (``lrp/<node>/<tag>`` with the node left out),
the forward's share, the number of nodes onnxruntime ran, and the bytes the relevance nodes wrote; optionally saves
the relevance (``--save DIR``) so that two versions of the engine can be compared (``--compare DIR``).

    python benchmarks/profile_cnn.py --model resnet50 --batch 8 --composite epsilon-gamma-box [--runs 3]

torch and torchvision build the models (random weights, as benchmarks/bench_cnn.py does).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile

import numpy as np


def model_path(arch: str, size: int) -> str:
    cache = os.path.join(tempfile.gettempdir(), "onnx-lrp-profile")
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, f"{arch}_{size}.onnx")
    if not os.path.exists(path):
        sys.path.insert(0, os.path.dirname(__file__))
        from bench_cnn import build

        build(arch, path, size)
    return path


def tag_of(name: str) -> str:
    """``lrp/<node>/<tag>_node`` -> ``<tag>`` (numbers that make names unique dropped)."""
    parts = name.split("/")
    tag = parts[-1] if len(parts) > 2 else name
    tag = re.sub(r"(_node)?(_\d+)?$", "", tag)
    tag = re.sub(r"_node$", "", tag)
    return tag


def profile(ex, feeds: dict, runs: int, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="onnx-lrp-prof-"), "p")
    sess = ort.InferenceSession(ex.relevance_model.model_bytes, sess_options=opts, providers=["CPUExecutionProvider"])
    sess.run(None, feeds)  # warm-up (its events are dropped below)
    n_warm = None
    outs = None
    for _ in range(runs):
        outs = sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    runs_ev = [e for e in events if e.get("name") == "model_run"]
    first = runs_ev[1]["ts"] if len(runs_ev) > 1 else 0
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first]
    del n_warm
    names = [o.name for o in sess.get_outputs()]
    return nodes, dict(zip(names, outs)), sum(e["dur"] for e in runs_ev[1:]) / max(1, len(runs_ev) - 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--composite", default="epsilon-gamma-box")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--save", help="folder to save the relevance in (as <model>_b<batch>_<composite>.npy)")
    ap.add_argument("--compare", help="folder with saved relevance to compare against (rel-L2)")
    args = ap.parse_args(argv)

    import onnx_lrp
    from onnx_lrp.core.interface import ONE_HOT_INPUT, RELEVANCE_PREFIX, TARGET_INPUT

    path = model_path(args.model, args.size)
    box = {"low": -3.0, "high": 3.0} if args.composite == "epsilon-gamma-box" else {}
    ex = onnx_lrp.Explainer(path, composite=args.composite, threads=args.threads, **box)
    x = np.random.default_rng(0).standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32)
    feeds = ex._feeds(x)
    feeds.update({TARGET_INPUT: np.full(args.batch, -1, np.int64), ONE_HOT_INPUT: np.array(False)})
    nodes, outs, run_us = profile(ex, feeds, args.runs, args.threads)
    runs = args.runs
    emitted = sum(1 for n in onnx_lrp.load.to_ir(onnx_lrp.load.read_proto(ex.relevance_model.model_bytes)).graph
                  if n.name.startswith("lrp/"))

    by_op, by_tag = collections.Counter(), collections.Counter()
    count_op, out_bytes = collections.Counter(), collections.Counter()
    fwd = lrp = 0.0
    for e in nodes:
        name = e["name"][: -len("_kernel_time")]
        op = e["args"].get("op_name", "?")
        dur = e["dur"] / 1000.0 / runs
        is_lrp = name.startswith("lrp/") or "lrp/" in name
        if is_lrp:
            lrp += dur
            by_op[op] += dur
            count_op[op] += 1 / runs
            by_tag[tag_of(name)] += dur
            out_bytes[op] += int(e["args"].get("output_size", 0)) / runs
        else:
            fwd += dur
            by_op["(forward) " + op] += dur
            count_op["(forward) " + op] += 1 / runs
    total = fwd + lrp
    print(f"{args.model} b{args.batch} {args.composite}: run {run_us / 1000:.0f} ms, nodes {total:.0f} ms "
          f"(forward {fwd:.0f} ms, relevance {lrp:.0f} ms, ratio {total / fwd:.2f}); emitted nodes {emitted}; "
          f"relevance nodes run {sum(v for k, v in count_op.items() if not k.startswith('(')):.0f}; "
          f"relevance bytes written {sum(out_bytes.values()) / 2**20:.0f} MiB")
    print(f"{'op type':32s} {'ms':>8s} {'share':>6s} {'nodes':>6s} {'MiB out':>8s}")
    for op, ms in by_op.most_common(args.top):
        print(f"{op:32s} {ms:8.1f} {ms / total:6.1%} {count_op[op]:6.0f} {out_bytes[op] / 2**20:8.0f}")
    print(f"\n{'emitted tag':32s} {'ms':>8s} {'share':>6s}")
    for tag, ms in by_tag.most_common(args.top):
        print(f"{tag:32s} {ms:8.1f} {ms / total:6.1%}")
    key = f"{args.model}_b{args.batch}_{args.composite}"
    rel = outs[RELEVANCE_PREFIX + "x"]
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        np.save(os.path.join(args.save, key + ".npy"), rel)
    if args.compare:
        ref = np.load(os.path.join(args.compare, key + ".npy"))
        err = float(np.linalg.norm(rel - ref) / np.linalg.norm(ref))
        print(f"\nrelevance vs {args.compare}: rel-L2 {err:.2e}, max abs {float(np.abs(rel - ref).max()):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
