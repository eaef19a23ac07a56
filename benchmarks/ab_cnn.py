"""Two versions of the engine on one torchvision CNN, timed alternately in one process against the plain forward.

On a shared machine wall-clock ratios from separate runs swing by 2x; here the relevance model of another checkout
(``--other``: a folder holding an ``onnx_lrp`` package, e.g. ``git archive main | tar -x -C /tmp/main``) and this
checkout's are built (each in its own process), then the plain forward, the other's model and this one's run in
turn, ``--runs`` rounds, best of each; it prints both ratios to the forward and the rel-L2 between the relevances.

    python benchmarks/ab_cnn.py --other /tmp/main --model mobilenet_v2 --batch 8 --composite epsilon [--runs 7]

torch and torchvision build the model (random weights, as benchmarks/bench_cnn.py does).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = """
import sys, warnings
warnings.simplefilter("ignore")
import onnx_lrp
path, comp, out = sys.argv[1:4]
box = {"low": -3.0, "high": 3.0} if comp == "epsilon-gamma-box" else {}
onnx_lrp.Explainer(path, composite=comp, threads=2, **box).save(out)  # large weights go beside it
"""


def build(tree: str, path: str, comp: str, out: str) -> None:
    env = dict(os.environ, PYTHONPATH=tree)
    subprocess.run([sys.executable, "-c", BUILD, path, comp, out], env=env, check=True, cwd=tree)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", required=True, help="folder with the other version's onnx_lrp package")
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--composite", default="epsilon")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args(argv)

    sys.path.insert(0, HERE)
    from profile_cnn import model_path

    path = model_path(args.model, args.size)
    tmp = tempfile.mkdtemp(prefix="onnx-lrp-ab-")
    try:
        return _compare(args, path, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # two relevance models: up to GBs (VGG16)


def _compare(args, path: str, tmp: str) -> int:
    import onnxruntime as ort

    from onnx_lrp.core.interface import ONE_HOT_INPUT, RELEVANCE_PREFIX, TARGET_INPUT

    files = {k: os.path.join(tmp, k, "model.onnx") for k in ("other", "this")}
    for f in files.values():
        os.makedirs(os.path.dirname(f))
    build(os.path.abspath(args.other), path, args.composite, files["other"])
    build(os.path.dirname(HERE), path, args.composite, files["this"])

    def session(src, relevance: bool):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        if relevance:  # as onnx_lrp.run.runtime.Session
            opts.add_session_config_entry("session.disable_quant_qdq", "1")
        return ort.InferenceSession(src, sess_options=opts, providers=["CPUExecutionProvider"])

    x = np.random.default_rng(0).standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32)
    feeds = {"x": x, TARGET_INPUT: np.full(args.batch, -1, np.int64), ONE_HOT_INPUT: np.array(False)}
    plain = session(path, False)
    sessions = {k: session(v, True) for k, v in files.items()}
    runs = {"forward": lambda: plain.run(None, {"x": x})}
    runs.update({k: (lambda s=s: s.run(None, feeds)) for k, s in sessions.items()})
    rel = {}
    for k, s in sessions.items():
        names = [o.name for o in s.get_outputs()]
        rel[k] = runs[k]()[names.index(RELEVANCE_PREFIX + "x")].astype(np.float64)
    runs["forward"]()
    times = {k: [] for k in runs}
    for _ in range(args.runs):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    err = np.linalg.norm(rel["this"] - rel["other"]) / max(np.linalg.norm(rel["other"]), 1e-30)
    print(f"{args.model} b{args.batch} {args.composite}: forward {best['forward'] * 1e3:.1f} ms; other "
          f"{best['other'] / best['forward']:.2f}x, this {best['this'] / best['forward']:.2f}x the forward; "
          f"relevance rel-L2 {err:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
