"""Speed of ``Explainer.explain`` on torchvision CNNs, as ratios measured in one run on this machine.

For each model, batch size and composite it prints:
  forward   plain onnxruntime run of the original model (same threads, same session options)
  explain   Explainer.explain (forward + relevance in one onnxruntime run)
  zennit    zennit on the PyTorch model with the same composite (when torch/zennit import)
and the ratios explain/forward (floors 2, 3, 4 forward passes; targets <= 2.6 for epsilon, <= 3.5 for
epsilon-plus-flat, <= 4.6 for epsilon-gamma-box, 5 on MobileNetV2)
and zennit/explain (target: >= 3). Each row also splits the explain call: ``run s`` inside onnxruntime's run
(the relevance model through IOBinding), ``host %`` the share outside it (feeds, checks, the result; goal <= 3 %
at ResNet50 batch 16), ``MiB in/out`` what crossed to / from the device per call (0 on the CPU). ``--profile`` adds
onnxruntime's profile of the plain forward and of the relevance model (mean run wall time and the summed node or,
on CUDA, kernel times per run; warm-up runs left out), ``--json PATH`` appends each row as a JSON line. With
``--memory`` it also prints the peak memory of one explain and of one
zennit attribution on the same model and batch (each in a fresh process: the rise of the resident set's high-water
mark over the resident set just before the call; for onnxruntime the first run, which sizes its arena).

    python benchmarks/bench_cnn.py [--models vgg16,resnet50,mobilenet_v2] [--batches 1,8] [--threads 2] [--memory]
    python benchmarks/bench_cnn.py --device cuda [--tf32] --batches 1,16,64     # onnxruntime-gpu

Each row also shows the pass-count floor of its rule (README "Speed": epsilon 2, epsilon-plus-flat 3,
epsilon-gamma-box 4 forward passes). On CUDA both the forward and onnx-lrp run with TF32 off unless --tf32.

torch, torchvision and zennit are needed to build the models (random weights) and for the zennit column.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from timing import RunClock, best as timed, best_pair as timed_pair, profiled

COMPOSITES = ("epsilon", "epsilon-plus-flat", "epsilon-gamma-box")
TARGETS = {"epsilon": 2.6, "epsilon-plus-flat": 3.5, "epsilon-gamma-box": 4.6}  # issue 18 (MobileNetV2 gamma: 5)
FLOORS = {"epsilon": 2, "epsilon-plus-flat": 3, "epsilon-gamma-box": 4}  # forward passes the rule needs at least


def target(arch: str, comp: str) -> float:
    return 5.0 if arch.startswith("mobilenet") and comp == "epsilon-gamma-box" else TARGETS[comp]


def build(name: str, path: str, size: int):
    import torch
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, 3, size, size)
    torch.onnx.export(model, x, path, input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}}, dynamo=False, opset_version=17)
    return model


def zennit_composite(name: str, arch: str):
    from zennit.canonizers import SequentialMergeBatchNorm
    from zennit.composites import EpsilonGammaBox, EpsilonPlusFlat, LayerMapComposite, layer_map_base
    from zennit.rules import Epsilon
    from zennit.torchvision import ResNetCanonizer, VGGCanonizer
    from zennit.types import Linear

    canon = [ResNetCanonizer()] if arch.startswith("resnet") else [VGGCanonizer()] if arch.startswith("vgg") \
        else [SequentialMergeBatchNorm()]
    if name == "epsilon":
        return LayerMapComposite(layer_map_base() + [(Linear, Epsilon())], canonizers=canon)
    if name == "epsilon-plus-flat":
        return EpsilonPlusFlat(canonizers=canon)
    return EpsilonGammaBox(low=-3.0, high=3.0, canonizers=canon)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_rise(fn) -> float:
    """MiB by which the resident set's high-water mark rises over the resident set during ``fn()`` (Linux: the
    mark is reset by writing 5 to /proc/self/clear_refs)."""
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) / 1024.0


def memory_probe(which: str, arch: str, comp: str, batch: int, path: str, size: int, threads: int) -> None:
    """One explain (``which`` = onnx-lrp) or one zennit attribution in this (fresh) process; prints the MiB."""
    x = np.random.default_rng(0).standard_normal((batch, 3, size, size)).astype(np.float32)
    if which == "onnx-lrp":
        import onnx_lrp

        box = {"low": -3.0, "high": 3.0} if comp == "epsilon-gamma-box" else {}
        ex = onnx_lrp.Explainer(path, composite=comp, threads=threads, **box)
        ex._culprits = lambda *a, **k: None  # random weights: no ledger model built to name non-conserving nodes
        print(f"{peak_rise(lambda: ex.explain(x)):.1f}")
        return
    import torch
    from zennit.attribution import Gradient

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    import torchvision

    model = getattr(torchvision.models, arch)(weights=None).eval()
    xt = torch.from_numpy(x).requires_grad_(True)
    with Gradient(model, zennit_composite(comp, arch)) as attr:
        def run():
            out = model(xt)
            attr(xt, torch.eye(out.shape[1])[out.argmax(1)])
        print(f"{peak_rise(run):.1f}")


def peak_mib(which: str, arch: str, comp: str, batch: int, path: str, size: int, threads: int) -> float:
    import subprocess

    cmd = [sys.executable, os.path.abspath(__file__), "--probe", which, "--models", arch, "--composites", comp,
           "--batches", str(batch), "--model-path", path, "--size", str(size), "--threads", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    try:
        return float(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"memory probe failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return float("nan")


def zennit_time(args, torch_model, comp: str, arch: str, x: np.ndarray) -> float:
    """Best-of time of zennit's attribution of the batch on the same device (CUDA: torch's TF32 as onnx-lrp's)."""
    import torch
    from zennit.attribution import Gradient

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        return float("nan")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    model = torch_model.cuda() if cuda else torch_model
    xt = (torch.from_numpy(x).cuda() if cuda else torch.from_numpy(x)).requires_grad_(True)
    eye = torch.eye(1000, device=xt.device)
    try:
        with Gradient(model, zennit_composite(comp, arch)) as attr:
            def run_zennit():
                out = model(xt)
                attr(xt, eye[out.argmax(1)] if out.shape[1] == 1000 else torch.eye(out.shape[1])[out.argmax(1)])
                if cuda:
                    torch.cuda.synchronize()
            return timed(run_zennit, max(1, args.repeat - 1))
    finally:
        if cuda:
            torch_model.cpu()
            torch.cuda.empty_cache()


def _kern(p: dict) -> float:
    """GPU kernel time per run where the provider reports kernels, else the summed node times."""
    return p["kernels_ms"] if p["kernels_ms"] is not None else p["nodes_ms"]


def profile_row(args, path: str, ex, x, providers) -> dict:
    """onnxruntime's profile of the plain forward and of the explainer's relevance model at this batch."""
    steer = {"lrp/target": np.full(len(x), -1, np.int64), "lrp/one_hot": np.array(False)}
    threads = args.threads if args.device == "cpu" else None
    return {"forward": profiled(path, {"x": x}, providers, threads=threads),
            "relevance": profiled(ex.relevance_model.model_bytes, {"x": x, **steer}, providers, threads=threads)}


def record(path: str, **row) -> None:
    import json

    with open(path, "a") as f:
        f.write(json.dumps(dict(part="bench_cnn", **row)) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="vgg16,resnet50,mobilenet_v2")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--composites", default=",".join(COMPOSITES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-zennit", action="store_true")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--tf32", action="store_true", help="CUDA: TF32 convolutions and matrix products")
    ap.add_argument("--memory", action="store_true", help="also the peak memory of explain and of zennit")
    ap.add_argument("--profile", action="store_true", help="onnxruntime's profile of the forward and the relevance model")
    ap.add_argument("--json", help="append each row as a JSON line to this file")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        memory_probe(args.probe, args.models, args.composites, int(args.batches), args.model_path, args.size,
                     args.threads)
        return 0

    import onnxruntime as ort

    import onnx_lrp

    try:
        import torch
        torch.set_num_threads(args.threads)
        have_zennit = not args.no_zennit
        import zennit  # noqa: F401
    except ImportError:
        have_zennit = False
    rows = []
    tmp = tempfile.mkdtemp(prefix="onnx-lrp-bench-")
    print(f"threads={args.threads} size={args.size} onnxruntime={ort.__version__} machine={os.cpu_count()} cpus "
          f"device={args.device}{' (TF32)' if args.device == 'cuda' and args.tf32 else ''}", flush=True)
    header = f"{'model':14s} {'batch':>5s} {'composite':20s} {'forward s':>10s} {'explain s':>10s} {'ratio':>6s} " \
             f"{'floor':>5s} " \
             f"{'target':>6s} {'zennit s':>9s} {'zennit/ours':>11s} {'run s':>8s} {'host %':>6s} {'MiB in/out':>11s}" + \
             (f" {'fwd ms':>7s} {'fwd kern':>8s} {'lrp ms':>7s} {'lrp kern':>8s}" if args.profile else "") + \
             (f" {'MiB ours':>9s} {'MiB zennit':>10s} {'mem':>5s}" if args.memory else "")
    providers = ["CPUExecutionProvider"]
    if args.device == "cuda":
        from onnx_lrp.run import runtime
        runtime.preload_cuda()
        providers = [("CUDAExecutionProvider", runtime.cuda_options(args.tf32))] + providers
    print(header)
    for arch in args.models.split(","):
        path = os.path.join(tmp, f"{arch}.onnx")
        torch_model = build(arch, path, args.size)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        plain = ort.InferenceSession(path, sess_options=opts, providers=providers)
        for comp in args.composites.split(","):
            box = {"low": -3.0, "high": 3.0} if comp == "epsilon-gamma-box" else {}  # inputs ~ N(0, 1)
            ex = onnx_lrp.Explainer(path, composite=comp, threads=args.threads, device=args.device,
                                    tf32=args.tf32, **box)
            # random weights do not conserve relevance: explain then warns and, to name the nodes, runs a ledger
            # model (built on the first call) for one item on every call; the timing here is of the relevance
            # itself, so the warning stays (its per-item sums are timed) but names no nodes
            ex._culprits = lambda *a, **k: None
            for batch in (int(b) for b in args.batches.split(",")):
                x = np.random.default_rng(0).standard_normal((batch, 3, args.size, args.size)).astype(np.float32)
                clock = RunClock(ex)
                calls = []
                t_fwd, t_exp = timed_pair(lambda: plain.run(None, {"x": x}),
                                          lambda: calls.append(clock.call(lambda: ex.explain(x))), args.repeat)
                wall, inside = min(calls[1:] or calls)
                moved = ex.last_transfer or {"to_device": 0, "to_host": 0}
                t_zen = zennit_time(args, torch_model, comp, arch, x) if have_zennit else float("nan")
                ratio = t_exp / t_fwd
                row = (arch, batch, comp, t_fwd, t_exp, ratio, target(arch, comp), t_zen, t_zen / t_exp)
                rows.append(row)
                split = f" {inside:8.3f} {100 * (wall - inside) / wall:6.2f} " \
                        f"{moved['to_device'] / 2**20:5.1f}/{moved['to_host'] / 2**20:<5.1f}"
                prof = profile_row(args, path, ex, x, providers) if args.profile else {}
                if prof:
                    split += f" {prof['forward']['run_ms']:7.2f} {_kern(prof['forward']):8.2f} " \
                             f"{prof['relevance']['run_ms']:7.2f} {_kern(prof['relevance']):8.2f}"
                if args.json:
                    record(args.json, arch=arch, batch=batch, composite=comp, device=args.device, tf32=args.tf32,
                           forward_s=t_fwd, explain_s=t_exp, ratio=ratio, target=target(arch, comp), zennit_s=t_zen,
                           run_s=inside, host_share=(wall - inside) / wall,
                           bytes_to_device=moved["to_device"], bytes_to_host=moved["to_host"],
                           profile={k: {kk: vv for kk, vv in v.items() if kk != "path"} for k, v in prof.items()},
                           profile_files={k: v["path"] for k, v in prof.items()})
                mem = ""
                if args.memory:
                    m_ours = peak_mib("onnx-lrp", arch, comp, batch, path, args.size, args.threads)
                    m_zen = peak_mib("zennit", arch, comp, batch, path, args.size, args.threads) \
                        if have_zennit else float("nan")
                    mem = f" {m_ours:9.0f} {m_zen:10.0f} {m_ours / m_zen:5.2f}"
                print(f"{arch:14s} {batch:5d} {comp:20s} {t_fwd:10.3f} {t_exp:10.3f} {ratio:6.2f} {FLOORS[comp]:5d} "
                      f"{target(arch, comp):6.1f} {t_zen:9.3f} {t_zen / t_exp:11.1f}" + split + mem, flush=True)
            del ex
    worst = max(rows, key=lambda r: r[5] / r[6])
    print(f"\nworst explain/forward relative to its target: {worst[0]} b{worst[1]} {worst[2]}: "
          f"{worst[5]:.2f} (target {worst[6]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
