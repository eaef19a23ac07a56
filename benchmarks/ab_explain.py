"""Two versions of onnx-lrp's ``Explainer.explain`` in ONE process, timed alternately against the plain forward.

On a shared machine wall-clock figures from separate runs swing by 2x; here the other version's package (``--other``:
a folder holding its ``onnx_lrp``, ``rules`` and ``cli`` folders, e.g. ``git archive house | tar -x -C /tmp/house``)
is imported under another name beside this checkout's, both build an Explainer of the same model, and the forward,
the other's explain and this one's run in turn, ``--runs`` rounds, best of each. It prints both explain times and
ratios to the forward, the share of this version's call spent outside onnxruntime's run, and whether the relevance
is bit-identical (else its rel-L2).

    python benchmarks/ab_explain.py --other /tmp/house --model resnet50 --batch 16 --composite epsilon-plus-flat
    python benchmarks/ab_explain.py --other /tmp/house --model bert --batch 1          # BERT-base (onnx.helper; batch 1)

torch and torchvision build the CNNs (random weights, as benchmarks/bench_cnn.py does).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def import_other(folder: str, name: str = "onnx_lrp_other"):
    """The other version's package under ``name`` (its rules/ and cli/ folders mapped in as an install maps them)."""
    root = Path(folder).resolve()
    spec = importlib.util.spec_from_file_location(name, root / "onnx_lrp" / "__init__.py",
                                                  submodule_search_locations=[str(root / "onnx_lrp"), str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def model_and_input(args) -> tuple[str, np.ndarray, str]:
    tmp = Path(tempfile.mkdtemp(prefix="onnx-lrp-ab-"))
    rng = np.random.default_rng(0)
    if args.model == "bert":
        from bench_transformer import build_helper_bert

        path = tmp / "bert.onnx"
        build_helper_bert(path, args.layers, args.seq)
        return str(path), rng.standard_normal((args.batch, args.seq, 768)).astype(np.float32), "attnlrp"
    from bench_cnn import build

    path = tmp / f"{args.model}.onnx"
    build(args.model, str(path), args.size)
    x = rng.standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32)
    return str(path), x, args.composite


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", required=True, help="folder with the other version's onnx_lrp, rules and cli")
    ap.add_argument("--model", default="resnet50", help="a torchvision CNN, or bert")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--composite", default="epsilon-plus-flat")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import onnxruntime as ort

    import onnx_lrp
    from timing import RunClock

    other = import_other(args.other)
    path, x, composite = model_and_input(args)
    box = {"low": -3.0, "high": 3.0} if composite == "epsilon-gamma-box" else {}
    ours = onnx_lrp.Explainer(path, composite=composite, threads=args.threads, **box)
    theirs = other.Explainer(path, composite=composite, threads=args.threads, **box)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
    plain = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
    name = plain.get_inputs()[0].name
    clock = RunClock(ours)
    times = {"forward": [], "other": [], "this": []}
    splits = []
    res_ours = res_theirs = None
    for i in range(args.runs + 1):
        t0 = time.perf_counter()
        plain.run(None, {name: x})
        t1 = time.perf_counter()
        res_theirs = theirs.explain(x)
        t2 = time.perf_counter()
        clock.inside = 0.0
        t3 = time.perf_counter()
        res_ours = ours.explain(x)
        t4 = time.perf_counter()
        if i:  # the first round warms up
            times["forward"].append(t1 - t0)
            times["other"].append(t2 - t1)
            times["this"].append(t4 - t3)
            splits.append((t4 - t3, clock.inside))
    best = {k: min(v) for k, v in times.items()}
    wall, inside = min(splits)
    a, b = np.asarray(res_ours.relevance), np.asarray(res_theirs.relevance)
    same = a.tobytes() == b.tobytes()
    err = float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))
    print(f"{args.model} b{args.batch} {composite} threads={args.threads} load={os.getloadavg()[0]:.1f}: forward "
          f"{best['forward']:.3f} s; explain other {best['other']:.3f} s ({best['other'] / best['forward']:.2f}x), "
          f"this {best['this']:.3f} s ({best['this'] / best['forward']:.2f}x), this/other "
          f"{best['this'] / best['other']:.3f}; this call outside onnxruntime's run {100 * (wall - inside) / wall:.2f} %"
          f"; relevance {'bit-identical' if same else f'rel-L2 {err:.2e}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
