#!/usr/bin/env python
"""Cost of concept-conditional heatmaps: onnx-lrp's ``explain_concepts`` against zennit-crp 0.6's
``CondAttribution.generate`` on the same model (torchvision ResNet18, seeded random weights, 224x224, composite
EpsilonPlusFlat), K = 1, 8, 64 single-channel concepts at ``layer3.0.conv1``, exclude_parallel True and False,
batches of 16 on both sides.

onnx-lrp: one forward + the relevance down to the layer (batch 1), then K passes below it (batched, the forward
below the layer repeated per concept). zennit-crp: one forward of a batch of 16 copies, then one backward per batch
of 16 concepts (retain_graph). Times are the best of ``--repeat`` calls after one warm-up (the models' build is
timed separately). One thread each by default: on a shared, oversubscribed machine torch's OpenMP threads spin
(a 3x3 Conv measured 16x slower with 2 threads than with 1 here). The figures are indicative.

Usage: ``python benchmarks/bench_crp.py [--size 224] [--ks 1,8,64] [--threads 1]`` (needs torch, torchvision,
zennit and zennit-crp).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from timing import best
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from make_zennit_goldens import export, randomise_batchnorm  # noqa: E402

import onnx_lrp  # noqa: E402

MODULE, BATCH = "layer3.0.conv1", 16


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--ks", default="1,8,64")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import torchvision
    from crp.attribution import CondAttribution
    from zennit.composites import EpsilonPlusFlat
    from zennit.torchvision import ResNetCanonizer

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    randomise_batchnorm(model, 1)
    model.eval()
    x = np.random.default_rng(0).standard_normal((1, 3, args.size, args.size)).astype(np.float32)
    data = export(model, torch.from_numpy(x), "torchscript")
    layer = "/" + "/".join(["layer3", "layer3.0", "conv1", "Conv_output_0"])
    t0 = time.perf_counter()
    ex = onnx_lrp.Explainer(data, composite="epsilon-plus-flat", threads=args.threads)
    build_main = time.perf_counter() - t0
    target = int(np.argmax(ex.explain(x).outputs["y"]))
    rows = []
    attr = CondAttribution(model)
    for ep in (True, False):
        t0 = time.perf_counter()
        ex.explain_concepts(x, target, layer, concepts=[[0]], exclude_parallel=ep)
        build = time.perf_counter() - t0  # the concept models' build + one call
        for k in [int(v) for v in args.ks.split(",")]:
            groups = [[c] for c in range(k)]
            ours = best(lambda: ex.explain_concepts(x, target, layer, concepts=groups, exclude_parallel=ep,
                                                    batch_size=BATCH), args.repeat)
            conds = [{MODULE: [c], "y": [target]} for c in range(k)]
            composite = EpsilonPlusFlat(canonizers=[ResNetCanonizer()])

            def zennit_crp():
                xt = torch.from_numpy(x).requires_grad_(True)
                for _ in attr.generate(xt, conds, composite,
                                       batch_size=BATCH, exclude_parallel=ep, verbose=False):
                    pass

            theirs = best(zennit_crp, args.repeat)
            rows.append(dict(exclude_parallel=ep, K=k, onnx_lrp_s=round(ours, 3), zennit_crp_s=round(theirs, 3),
                             speedup=round(theirs / ours, 2), first_call_with_build_s=round(build, 2)))
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps(dict(model="resnet18", size=args.size, layer=MODULE, threads=args.threads,
                          explainer_build_s=round(build_main, 2), torch=torch.__version__)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
