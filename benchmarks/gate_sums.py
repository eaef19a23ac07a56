"""Relevance sums of squeeze-excitation CNNs (gated by Sigmoid / HardSigmoid), per composite.

For each torchvision model (random weights, TorchScript export at opset 17, cached under --cache) and composite it
prints the explained logit, the relevance sum, their ratio and whether the relevance is finite; a refused model
prints the one-line error. With ``start=logit`` the relevance should sum to the same order as the logit (the rest
goes to biases); sums of 1e31 or NaN mean an exploding rule.

    python benchmarks/gate_sums.py [--models efficientnet_b0,mobilenet_v3_small,regnet_y_400mf]
                                   [--composites epsilon-plus-flat,epsilon-gamma-box,attnlrp,cp-lrp]

torch and torchvision are needed to export the models (once).
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np

MODELS = ("efficientnet_b0", "mobilenet_v3_small", "regnet_y_400mf")
COMPOSITES = ("epsilon-plus-flat", "epsilon-gamma-box", "attnlrp", "cp-lrp")


def export(name: str, path: str, size: int = 224) -> None:
    import torch
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    # BatchNorm statistics from random inputs (cumulative average): at torchvision's initial statistics the signal
    # of these deep nets dies out (logits ~1e-14), which says nothing about the rules
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(8, 3, size, size))
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, torch.randn(1, 3, size, size), path, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}}, opset_version=17, dynamo=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--composites", default=",".join(COMPOSITES))
    ap.add_argument("--cache", default="/tmp/onnx_lrp_gate_models")
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args(argv)
    import onnx_lrp

    os.makedirs(args.cache, exist_ok=True)
    x = np.random.default_rng(0).normal(size=(args.batch, 3, 224, 224)).astype(np.float32)
    print(f"{'model':20s} {'composite':20s} {'logit':>10s} {'rel. sum':>12s} {'ratio':>10s}")
    for name in args.models.split(","):
        path = os.path.join(args.cache, f"{name}.onnx")
        if not os.path.exists(path):
            export(name, path)
        for comp in args.composites.split(","):
            kw = {"low": -3.0, "high": 3.0} if comp == "epsilon-gamma-box" else {}
            try:
                res = onnx_lrp.Explainer(path, composite=comp, **kw).explain(x)
            except onnx_lrp.LrpError as exc:
                print(f"{name:20s} {comp:20s} refused: {str(exc).splitlines()[0][:150]}")
                continue
            logit = res.outputs["logits"][np.arange(len(x)), res.target]
            sums = res.relevance.reshape(len(x), -1).astype(np.float64).sum(axis=1)
            for lg, s in zip(logit, sums):
                print(f"{name:20s} {comp:20s} {lg:10.4g} {s:12.4g} {s / lg:10.3g}"
                      f"{'' if np.isfinite(s) else '  NON-FINITE'}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
