"""Precision on well-conditioned CNNs (issue 17): torchvision ResNets with random weights and random BatchNorm
statistics (scripts/make_zennit_goldens.py builds them), explained by onnx-lrp in float32 and by zennit in float64.

The criterion: onnx-lrp's relative L2 distance to zennit's float64 relevance is at most 3x zennit's own float32
distance to it (float32 is what both compute in; more than that would be digits lost by onnx-lrp).

Why the issue measured 1.2e-5..4.7e-4 against 1e-6..5e-5 for zennit's own float32: stock zennit 0.5.1 merges a
BatchNorm into the convolution before it and keeps the BN as x / sqrt(1 + eps) (its running statistics reset, its eps
kept), so stock zennit explains a network whose every merged BN scales by 1 - 5e-6: a reference off by as much as
onnx-lrp seemed to be, in float32 and float64 alike. With the merge made exact (eps = 0 while merged, as the goldens
are made: ``EXACT_BN_MERGE``) onnx-lrp is as close to float64 as zennit's float32 (measured, 2 samples at 96 px:
ResNet18 epsilon-plus-flat 1.07e-5 vs zennit 1.16e-5, epsilon@0.01 1.68e-4 vs 1.81e-4; ResNet50 1.04e-6 vs
1.44e-6, 1.23e-4 vs 1.49e-4); the first test shows the gap lies in the reference.
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import onnx_lrp

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_zennit_goldens.py"


@functools.cache
def _script():
    for name in ("torch", "torchvision", "zennit"):
        pytest.importorskip(name, reason=f"{name} is not installed (pip install onnx-lrp[reference])")
    spec = importlib.util.spec_from_file_location("make_zennit_goldens_precision", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rel_l2(a, b) -> np.ndarray:
    a = np.asarray(a, np.float64).reshape(len(a), -1)
    b = np.asarray(b, np.float64).reshape(len(b), -1)
    return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)


def _distances(name, size, n, exporter, composites, exact=True):
    """{composite: (onnx-lrp vs zennit float64, zennit float32 vs zennit float64, stock-merge float64 vs exact
    float64)} per sample (max over the samples)."""
    import torch

    s = _script()
    model, canon = s.large_model(name)
    x = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(11))
    data = s.export(model, x, exporter)
    ref = s.as_float64(model)
    out = {}
    for comp in composites:
        c, params = s.variant_params(comp)
        if c == "epsilon-gamma-box":
            params = dict(low=s.BOX_LOW, high=s.BOX_HIGH)
        s.EXACT_BN_MERGE = True
        r64, t, _ = s.zennit_relevance(ref, x, comp, canon())
        r32, _, _ = s.zennit_relevance(model, x, comp, canon(), target=None)
        s.EXACT_BN_MERGE = False
        stock64, _, _ = s.zennit_relevance(ref, x, comp, canon())
        s.EXACT_BN_MERGE = True
        res = onnx_lrp.Explainer(data, composite=c, start="one-hot", **params).explain(x.numpy(), target=t)
        out[comp] = (rel_l2(res.relevance, r64).max(), rel_l2(r32, r64).max(), rel_l2(stock64, r64).max(),
                     rel_l2(res.relevance, stock64).max())
    return out


def _assert_within_3x(dist):
    bad = {c: f"onnx-lrp {d[0]:.2e} > 3 x zennit float32 {d[1]:.2e}" for c, d in dist.items() if not d[0] <= 3 * d[1]}
    assert not bad, bad


@pytest.mark.slow  # ~20 s of CPU: torch export and four zennit runs
def test_resnet18_float32_digits_as_zennit_float32_and_stock_zennit_was_off():
    """ResNet18 (TorchScript export: BN folded by torch), one sample at 64 px: within 3x of zennit's float32 on
    epsilon-plus-flat and epsilon@0.01. Against stock zennit's float64 (merged BN kept as x / sqrt(1 + eps))
    onnx-lrp is ~1e-5..1e-4 off, as the issue measured; that is the distance between stock and exact zennit, not
    onnx-lrp's: onnx-lrp's distance to the exact reference is > 10x smaller."""
    dist = _distances("resnet18", 64, 1, "torchscript", ["epsilon-plus-flat", "epsilon@0.01"])
    _assert_within_3x(dist)
    ours, _, stock_vs_exact, ours_vs_stock = dist["epsilon@0.01"]
    assert stock_vs_exact > 10 * ours and abs(ours_vs_stock - stock_vs_exact) < 0.1 * stock_vs_exact, dist


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnets_float32_digits_as_zennit_float32(name, exporter):
    _assert_within_3x(_distances(name, 96, 2, exporter, ["epsilon-plus-flat", "epsilon-alpha2-beta1",
                                                         "epsilon-gamma-box", "epsilon@0.01"]))
