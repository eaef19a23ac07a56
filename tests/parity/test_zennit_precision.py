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

The parity set (issue 28: ResNet18, ResNet50, MobileNetV2, DenseNet121, VGG16; torchvision's initialisation and
randomised BatchNorm statistics; epsilon-plus-flat and epsilon-gamma-box; batch 1 and 8 at 224 x 224, slow; ResNet18
at 64 x 64 in the default suite) computes both distances in the test, and leaves out the items where a max-pool
near-tie makes float32 itself ill-conditioned (``near_ties``).
"""
from __future__ import annotations

import functools
import importlib.util

import numpy as np
import pytest

import onnx_lrp
from util import ROOT, rel_l2_items

SCRIPT = ROOT / "scripts" / "make_zennit_goldens.py"


@functools.cache
def _script():
    for name in ("torch", "torchvision", "zennit"):
        pytest.importorskip(name, reason=f"{name} is not installed (pip install onnx-lrp[reference])")
    spec = importlib.util.spec_from_file_location("make_zennit_goldens_precision", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
        out[comp] = (rel_l2_items(res.relevance, r64).max(), rel_l2_items(r32, r64).max(), rel_l2_items(stock64, r64).max(),
                     rel_l2_items(res.relevance, stock64).max())
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


# ------------------------------------------------- the parity set: both distances computed here (issue 28)
# Criterion: onnx-lrp's rel-L2 distance to zennit's float64 relevance (exact BatchNorm merge, built here, not
# stored) at most max(3 x zennit's own float32 distance to it, FLOOR), per batch size and composite, over the items
# that are well-conditioned in float32 (``near_ties``).
#
# Two things made onnx-lrp look 40-600x worse than zennit's float32 in the table, neither of them in
# onnx-lrp's arithmetic (per node: the relevance model run in float64 differs from zennit float64 by 4e-7 on
# ResNet50, onnxruntime's float32 run of it from the float64 run by 5e-7 without and 8e-7 with its layout
# optimisations, zennit's float32 by 5.5e-7):
# * stock zennit 0.5.1 keeps the BN's eps in a merged BatchNorm (x / sqrt(1 + eps) per merged BN) and so explains
#   another function: against it onnx-lrp is 1e-4..2e-3 off (the fast test's last assertion);
# * a max-pool window whose two largest inputs differ by less than float32's rounding of them: which one wins (and
#   gets all the relevance) is decided by rounding, in any float32 engine. zennit's float32 and onnx-lrp round the
#   forward differently, so on such an item one of them can move a window's relevance and the other not (ResNet18,
#   64 x 64, item 1: inputs 0.69805535 and 0.69805529 in float64, onnxruntime's NCHWc convolution rounds them the
#   other way round: 3.5e-4 where zennit's float32 is 2e-7 and onnx-lrp without layout optimisations 3e-7).
FACTOR, FLOOR = 3.0, 1e-5
WELL_CONDITIONED = ("epsilon-plus-flat", "epsilon-gamma-box")


def near_ties(model, ref, x, r_at: dict) -> np.ndarray:
    """Per item, whether some max-pool window that carries relevance (at least 1e-3 of the layer's largest, zennit
    float64 ``r_at[module name]``) has two largest inputs (float64) closer, relative to the larger, than twice the float32 forward's typical (median) relative error
    at that layer: float32 rounding decides its winner. Modules are torch's MaxPool2d (ResNet, DenseNet, VGG)."""
    import torch
    import torch.nn.functional as F

    pools = [k for k, m in ref.named_modules() if isinstance(m, torch.nn.MaxPool2d)]
    ins = {32: {}, 64: {}}
    for bits, net in ((32, model), (64, ref)):
        mods = dict(net.named_modules())
        hooks = [mods[k].register_forward_hook(lambda m, i, o, k=k, d=ins[bits]: d.__setitem__(k, i[0].detach()))
                 for k in pools]
        with torch.no_grad():
            net(x.to(next(net.parameters()).dtype))
        for h in hooks:
            h.remove()
    tied = np.zeros(len(x), dtype=bool)
    for k in pools:
        pool, a64 = dict(ref.named_modules())[k], ins[64][k]
        # float32's error at this layer relative to the values: a high quantile over the entries that matter
        big = a64.abs() > 1e-2 * a64.abs().flatten(1).max(1).values.reshape(-1, 1, 1, 1)
        ratio = ((ins[32][k].double() - a64).abs() / a64.abs().clamp_min(1e-30)).where(big, torch.nan)
        err = np.nanquantile(ratio.flatten(1).numpy(), QUANTILE, axis=1)
        pad = pool.padding if isinstance(pool.padding, int) else pool.padding[0]
        cols = F.unfold(F.pad(a64, [pad] * 4, value=-np.inf), pool.kernel_size, stride=pool.stride)
        top = torch.topk(cols.reshape(len(x), a64.shape[1], -1, cols.shape[-1]), 2, dim=2).values
        gap = ((top[:, :, 0] - top[:, :, 1]) / top[:, :, 0].abs().clamp_min(1e-30)).numpy().reshape(len(x), -1)
        r = np.abs(r_at[k]).reshape(len(x), -1)
        carries = r > 1e-3 * r.max(axis=1, keepdims=True)
        tied |= np.any(carries & (gap <= TIE_FACTOR * err[:, None]), axis=1)
    return tied


QUANTILE, TIE_FACTOR = 0.5, 2.0


def both_distances(name, bn_stats, size, batch, composites=WELL_CONDITIONED, exporter="torchscript", exact=True,
                   **lrp_params):
    """{(composite, batch size): (onnx-lrp vs zennit float64, zennit float32 vs zennit float64, near-tie items)},
    per item (arrays), for batch 1 (the first item alone: onnxruntime may pick other kernels) and ``batch``."""
    import torch

    s = _script()
    model, canon = s.large_model(name, bn_stats=bn_stats)
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(11))
    data = s.export(model, x, exporter)
    ref = s.as_float64(model)
    pools = [k for k, m in ref.named_modules() if isinstance(m, torch.nn.MaxPool2d)]
    out = {}
    for comp in composites:
        params = dict(low=s.BOX_LOW, high=s.BOX_HIGH) if comp == "epsilon-gamma-box" else {}
        params.update(lrp_params)  # a deliberate deviation (the sharpness check)
        s.EXACT_BN_MERGE = exact
        try:
            r64, t, r_at = s.zennit_relevance(ref, x, comp, canon(), capture=pools)
            r32, _, _ = s.zennit_relevance(model, x, comp, canon(), target=t)
        finally:
            s.EXACT_BN_MERGE = True
        tied = near_ties(model, ref, x, r_at)
        ex = onnx_lrp.Explainer(data, composite=comp, start="one-hot", **params)
        for b in sorted({1, batch}):
            r = ex.explain(x[:b].numpy(), target=t[:b]).relevance
            out[(comp, b)] = (rel_l2_items(r, r64[:b]), rel_l2_items(r32[:b], r64[:b]), tied[:b])
    return out


def _outside(dist) -> dict:
    """The cases whose worst well-conditioned item is further from zennit float64 than the bound."""
    bad = {}
    for key, (ours, theirs, tied) in dist.items():
        a, b = ours[~tied].max(initial=0), theirs[~tied].max(initial=0)
        if not a <= max(FACTOR * b, FLOOR):
            bad[key] = f"onnx-lrp {a:.2e} > max({FACTOR:g} x zennit float32 {b:.2e}, {FLOOR:g})"
    return bad


def _conditioned(dist) -> bool:
    """Near-ties are rare on a well-conditioned case (ResNet18 at 64 x 64: 1 item in 24; ResNet50 at 224 x 224: 2 in
    8): at most a quarter of the items. VGG16 at 224 x 224 has them on 6 of 8 items (its five max-pools: every item
    has windows within 1.1e-6; zennit's float32 is up to 3.5e-4 off there), DenseNet121 with randomised statistics on
    all (its unfolded BatchNorms under Pass are ill-conditioned as well: zennit float32 9e-2 off)."""
    return all(4 * int(tied.sum()) <= len(tied) for _, _, tied in dist.values())


def _outside_all_items(dist) -> dict:
    """An ill-conditioned case: the worst item of all, within 3x of zennit float32's worst (both round near-ties)."""
    bad = {}
    for key, (ours, theirs, _) in dist.items():
        if not ours.max() <= max(FACTOR * theirs.max(), FLOOR):
            bad[key] = f"onnx-lrp {ours.max():.2e} > max({FACTOR:g} x zennit float32 {theirs.max():.2e}, {FLOOR:g})"
    return bad


@pytest.mark.parametrize("bn_stats", ["random", "torchvision"])
def test_resnet18_small_within_3x_of_zennit_float32(bn_stats):
    """The fast version (64 x 64, batch 1 and 4): ResNet18 with randomised BatchNorm statistics and with
    torchvision's own initialisation, epsilon-plus-flat and epsilon-gamma-box."""
    dist = both_distances("resnet18", bn_stats, 64, 4)
    assert _conditioned(dist) and not _outside(dist), dist
    if bn_stats == "random":
        # item 1 has a max-pool near-tie (which onnxruntime's layout optimisations round the other way): left out
        assert list(np.flatnonzero(dist[("epsilon-plus-flat", 4)][2])) == [1], dist
        # sharpness: onnx-lrp with gamma 0.2501 instead of zennit's 0.25 (a deviation of the size the issue
        # measured, ~1e-4) fails the check
        nudged = both_distances("resnet18", bn_stats, 64, 4, composites=("epsilon-gamma-box",), gamma=0.2501)
        assert _outside(nudged), nudged


@pytest.mark.slow  # 224 x 224, batch 1 and 8: ~1-5 min per model on 2 cores (zennit in float64)
@pytest.mark.parametrize("bn_stats", ["random", "torchvision"])
@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2", "densenet121", "vgg16"])
def test_parity_set_within_3x_of_zennit_float32(name, bn_stats):
    if name == "vgg16" and bn_stats == "torchvision":
        pytest.skip("VGG16 has no BatchNorm: one case")
    dist = both_distances(name, bn_stats, 224, 8)
    assert not (_outside(dist) if _conditioned(dist) else _outside_all_items(dist)), dist


# at this initialisation the logits are ~1e-9: the last layer's epsilon absorbs 99.9 % of the start (warned, rightly)
@pytest.mark.filterwarnings("ignore:relevance not conserved")
def test_mobilenet_v2_as_built_zennit_takes_the_gradient_at_its_functional_ops():
    """torchvision's MobileNetV2 as built (default initialisation, epsilon-plus-flat, 64 x 64): zennit and onnx-lrp
    disagree entirely (rel-L2 ~1) because torchvision applies the global average pool (``F.adaptive_avg_pool2d``) and
    the residual sums (``x + self.conv(x)``) as functions, which zennit cannot hook: it propagates the plain gradient
    there, not the composite's Norm rule. Checked with a numpy oracle of Norm on the pool step, R_in = x R_out /
    (HW (z + eps sign z)): onnx-lrp's step is it, zennit's is the gradient R_out / HW. With those two made modules
    (same computation) zennit agrees with onnx-lrp within 3x of its own float32 distance (ReLU6 under Pass, the
    depthwise transposes and the folded BatchNorms included)."""
    import onnx
    import torch
    import torchvision
    from collections import OrderedDict

    s = _script()
    torch.manual_seed(5)
    raw = torchvision.models.mobilenet_v2(weights=None).eval()
    modules = torch.nn.Sequential(OrderedDict(features=raw.features, pool=torch.nn.AdaptiveAvgPool2d(1),
                                              flatten=torch.nn.Flatten(), classifier=raw.classifier)).eval()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(11))
    data = s.export(raw, x, "torchscript")
    pool = next(n for n in onnx.load_from_string(data).graph.node if n.op_type == "GlobalAveragePool")
    ex = onnx_lrp.Explainer(data, composite="epsilon-plus-flat", start="one-hot",
                            relevance_at=[pool.input[0], pool.output[0]])
    with torch.no_grad():
        feat = raw.features(x).double().numpy()
    z = feat.mean(axis=(2, 3), keepdims=True)
    hw = feat.shape[2] * feat.shape[3]

    def canon(sums):
        from zennit.canonizers import SequentialMergeBatchNorm
        return lambda: [SequentialMergeBatchNorm()] + ([s.SumCanonizer()] if sums else [])

    built64, t, at = s.zennit_relevance(s.as_float64(raw), x, "epsilon-plus-flat", canon(False)(),
                                        capture=["features", "classifier.0"])
    res = ex.explain(x.numpy(), target=t)
    r_out = np.asarray(res.relevance_at[pool.output[0]], np.float64).reshape(z.shape)
    stab = hw * (z + 1e-6 * np.where(z >= 0, 1.0, -1.0))
    assert rel_l2_items(res.relevance_at[pool.input[0]], feat * r_out / stab).max() < 1e-5  # onnx-lrp: Norm
    z_out = at["classifier.0"].reshape(z.shape).astype(np.float64)
    assert rel_l2_items(at["features"], np.broadcast_to(z_out / hw, feat.shape)).max() < 1e-6  # zennit as built: gradient
    assert rel_l2_items(at["features"], feat * z_out / stab).min() > 0.5
    assert rel_l2_items(res.relevance, built64).min() > 0.5
    # the functional ops as modules: agreement within 3x of zennit's own float32 distance (floor 1e-5)
    ref64, t, _ = s.zennit_relevance(s.as_float64(modules), x, "epsilon-plus-flat", canon(True)())
    ref32, _, _ = s.zennit_relevance(modules, x, "epsilon-plus-flat", canon(True)(), target=t)
    ours = rel_l2_items(ex.explain(x.numpy(), target=t).relevance, ref64).max()
    assert ours <= max(FACTOR * rel_l2_items(ref32, ref64).max(), FLOOR), (ours, rel_l2_items(ref32, ref64))
