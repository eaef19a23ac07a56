"""Speed and memory of onnx_lrp.methods, as ratios measured in one run on this machine (issue 36, point 4).

On a torchvision ResNet50 (random weights, BatchNorm statistics drawn), batch 1, 224 x 224, it times:
  ig            Attributor "integrated-gradients", 32 steps (stacked along the batch axis, chunked to the budget)
  32 gradients  32 separate gradient calls (one onnxruntime run each): the cost IG is held to (target <= 1.2x)
  captum ig     captum 0.9's IntegratedGradients, 32 steps, on the same CPU threads (target: ours >= 3x faster)
  smoothgrad    16 noisy samples of the gradient, against 16 gradient calls and captum's NoiseTunnel(Saliency)
  occlusion     windows 3 x 16 x 16, stride 8 (729 windows) as batched forwards, against captum's Occlusion
                (target: ours >= 2x faster)
and the floor of each ratio against captum: onnxruntime's plain forward of the same model per row, at the rows per
run the method stacks, times the forwards the method cannot do without (a gradient is a forward and a backward of
the same products: 2 forwards; occlusion 1 per window): the ratio a method with no overhead at all would reach.
Then the peak memory of building an Attributor and its first IG call (the rise of the resident set's high-water mark,
reset just before) against --memory-budget (default 2 GB: what the built model and one stacked run may take), with
the rows per run the budget gave.

    python benchmarks/bench_methods.py                       # ResNet50, batch 1
    python benchmarks/bench_methods.py --small               # ResNet18 at 64 x 64, windows 3 x 8 x 8 stride 4
    python benchmarks/bench_methods.py --threads 4 --memory-budget 1024

torch, torchvision and captum are needed (to build the model and for the reference columns).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from bench_cnn import build  # the same torchvision export as the CNN benchmark
from timing import best

MiB = 2**20


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def peak_rise(fn) -> float:
    """MiB the resident set's high-water mark rises above the resident set during ``fn()`` (Linux: the mark is
    reset through /proc/self/clear_refs first; NaN where it cannot be)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return float("nan")
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) / 1024


def row(name: str, ours: float, ref: float, ref_name: str, goal: str) -> str:
    return f"  {name:<12} {ours:>9.3f} s   {ref_name:<14} {ref:>9.3f} s   ratio {ours / ref:>6.2f}   {goal}"


def windows(size: int, window: int, stride: int) -> int:
    return ((size - window) // stride + 1) ** 2


def forward_per_row(path: str, x: np.ndarray, rows: int, threads: int, repeat: int) -> float:
    """Seconds per row of a plain onnxruntime session of the model (its default optimisations) at ``rows`` rows."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: np.repeat(x, rows, axis=0)}
    return best(lambda: sess.run(None, feed), repeat) / rows


def floor(floor_s: float, ref: float) -> str:
    return f"   floor {floor_s / ref:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="ResNet18 at 64 x 64: a quick run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--memory-budget", type=int, default=2048, metavar="MB")
    args = ap.parse_args()
    import torch
    from captum import attr as C

    from onnx_lrp.methods import Attributor

    torch.set_num_threads(args.threads)
    arch, size, window, stride = ("resnet18", 64, 8, 4) if args.small else ("resnet50", 224, 16, 8)
    budget = args.memory_budget * MiB
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{arch}.onnx")
        module = build(arch, path, size)
        x = np.random.default_rng(0).normal(size=(1, 3, size, size)).astype(np.float32)
        X, settings = torch.tensor(x), dict(threads=args.threads, memory_budget=budget)
        t = int(module(X).argmax())
        # first: a fresh Attributor's build and first IG call (onnxruntime's arena grows in it)
        peak = peak_rise(lambda: Attributor(path, "integrated-gradients", n_steps=32, baselines=0.0,
                                            **settings).attribute(x, t))
        ig = Attributor(path, "integrated-gradients", n_steps=32, baselines=0.0, **settings)
        grad = Attributor(path, "gradient", **settings)
        sg = Attributor(path, "smoothgrad", nt_samples=16, stdevs=0.1, seed=0, **settings)
        occ = Attributor(path, "occlusion", sliding_window_shapes=(3, window, window), strides=stride, **settings)
        rows = ig.engine.rows_per_run(x)
        r = args.repeat
        t_ig = best(lambda: ig.attribute(x, t), r)
        t_grad = best(lambda: grad.attribute(x, t), r)
        t_captum_ig = best(lambda: C.IntegratedGradients(module).attribute(X, target=t, n_steps=32), r)
        t_sg = best(lambda: sg.attribute(x, t), r)
        t_captum_sg = best(lambda: C.NoiseTunnel(C.Saliency(module)).attribute(
            X, nt_type="smoothgrad", nt_samples=16, stdevs=0.1, target=t, abs=False), r)
        t_occ = best(lambda: occ.attribute(x, t), max(1, r - 1))
        fwd_row = forward_per_row(path, x, rows, args.threads, r)  # the floor: onnxruntime's forward alone
        fwd_occ = forward_per_row(path, x, min(16, windows(size, window, stride)), args.threads, r)
        with torch.no_grad():  # captum's forwards one window at a time: slow, timed once without a warm-up
            t_captum_occ = best(lambda: C.Occlusion(module).attribute(
                X, sliding_window_shapes=(3, window, window), strides=stride, target=t), 1, warmup=0)
    n_win = windows(size, window, stride)
    print(f"{arch}, batch 1, {size} x {size}, {args.threads} threads, best of {r} (onnx_lrp vs the reference):")
    print(row("ig 32", t_ig, 32 * t_grad, "32 gradients", "goal <= 1.2"))
    print(row("ig 32", t_ig, t_captum_ig, "captum ig", "goal <= 0.33 (>= 3x faster)")
          + floor(64 * fwd_row, t_captum_ig))
    print(row("smoothgrad16", t_sg, 16 * t_grad, "16 gradients", "goal <= 1.2"))
    print(row("smoothgrad16", t_sg, t_captum_sg, "captum nt", "goal <= 0.33") + floor(32 * fwd_row, t_captum_sg))
    print(row("occlusion", t_occ, t_captum_occ, "captum occ", f"goal <= 0.5 ({n_win} windows)")
          + floor(n_win * fwd_occ, t_captum_occ))
    print(f"  onnxruntime's forward alone: {fwd_row * 1e3:.1f} ms per row at {rows} rows, {fwd_occ * 1e3:.1f} ms at "
          f"{min(16, n_win)} (floor: a gradient >= 2 forwards, an occluded window >= 1)")
    print(f"  peak memory, IG built and run once: {peak:.0f} MiB (budget {args.memory_budget} MiB: "
          f"{'within' if peak <= args.memory_budget else 'OVER'}; {rows} rows per run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
