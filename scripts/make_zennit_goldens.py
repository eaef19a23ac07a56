#!/usr/bin/env python
"""Golden zennit (0.5.1) references for the onnx-lrp parity tests.

Two sets:

* ``--small`` (committed, ``tests/goldens/``): a small CNN (Conv+BN folded by the canonizer, overlapping MaxPool,
  a residual sum, a channel concat, AvgPool followed by an unfolded BatchNorm, strided Conv, adaptive average pool,
  two Linear layers), exported with both torch exporters (``small_cnn_torchscript.onnx``, ``small_cnn_dynamo.onnx``)
  and zennit's relevances (start = one-hot at the target) for all six built-in composites, batch 1 and 4, arg-max
  and a given target (``small_cnn.npz``).
* ``--large`` (NOT committed, ``goldens_large/``, git-ignored): torchvision VGG16, ResNet18, ResNet50, DenseNet121
  and MobileNetV2 with random weights and randomised BatchNorm statistics/affine parameters (so BN folding is
  exercised), exported with both exporters, with zennit's relevances for all composites at batch 4 (arg-max and a
  given target; zennit explains each sample independently, so batch 1 compares against row 0). An exporter that
  fails is recorded with its error in ``goldens_large/status.json``.

Canonizers: VGG -> ``zennit.torchvision.VGGCanonizer``, ResNet -> ``ResNetCanonizer``, MobileNetV2 ->
``SequentialMergeBatchNorm`` plus a Sum module for its residual sums, DenseNet121 -> ``NamedMergeBatchNorm`` of its
adjacent Conv -> BN pairs (``SequentialMergeBatchNorm`` crashes on it); see ``large_model``. The model wrappers only
make zennit see, as modules, computations torchvision writes functionally; the computation is unchanged.

Usage::

    python scripts/make_zennit_goldens.py --small                 # rewrite tests/goldens/
    python scripts/make_zennit_goldens.py --large [--models resnet18,vgg16]

Needs torch, torchvision and zennit (``pip install onnx-lrp[reference]``); onnx-lrp itself never imports them.
"""
from __future__ import annotations

import argparse
import copy
import importlib.metadata
import io
import json
import sys
import time
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from torch import nn

import zennit
from zennit.canonizers import AttributeCanonizer, MergeBatchNorm, NamedMergeBatchNorm, SequentialMergeBatchNorm
from zennit.composites import (EpsilonAlpha2Beta1, EpsilonAlpha2Beta1Flat, EpsilonGammaBox, EpsilonPlus,
                               EpsilonPlusFlat, LayerMapComposite, layer_map_base)
from zennit.layer import Sum
from zennit.rules import Epsilon
from zennit.torchvision import ResNetCanonizer, VGGCanonizer

ROOT = Path(__file__).resolve().parents[1]
SMALL_DIR = ROOT / "tests" / "goldens"
LARGE_DIR = ROOT / "goldens_large"
EXPORTERS = ("torchscript", "dynamo")
BOX_LOW, BOX_HIGH = -3.0, 3.0  # EpsilonGammaBox bounds (given to onnx-lrp explicitly: ZBox has no default)
COMPOSITES = ("epsilon", "epsilon-plus", "epsilon-plus-flat", "epsilon-gamma-box", "epsilon-alpha2-beta1",
              "epsilon-alpha2-beta1-flat")
LARGE_MODELS = {"vgg16": 224, "resnet18": 96, "resnet50": 96, "densenet121": 96, "mobilenet_v2": 96}
SMALL_SIZE = 24
N_CLASSES_SMALL = 10


# "epsilon@0.01": onnx-lrp's epsilon composite with epsilon=0.01 (zennit: Epsilon(epsilon=0.01)). LRP-epsilon with
# the default epsilon=1e-6 is ill-conditioned (see ILL_CONDITIONED in tests/parity/test_zennit_parity.py); 0.01 much less so:
# this variant checks the epsilon rule itself closely on every model (VGG16 aside: MaxPool near-ties).
VARIANTS = COMPOSITES + ("epsilon@0.01",)


def variant_params(name: str) -> tuple[str, dict]:
    """(onnx-lrp composite, rule parameters) of a reference variant."""
    if "@" in name:
        comp, eps = name.split("@")
        return comp, {"epsilon": float(eps)}
    return name, {}


def zennit_composite(name: str, canonizers):
    """The zennit composite an onnx-lrp built-in composite (or a VARIANTS entry) reproduces."""
    if name.startswith("epsilon@") or name == "epsilon":
        eps = variant_params(name)[1].get("epsilon", 1e-6)
        return LayerMapComposite(layer_map=layer_map_base() + [(zennit.types.Linear, Epsilon(epsilon=eps))],
                                 canonizers=canonizers)
    if name == "epsilon-gamma-box":
        return EpsilonGammaBox(low=BOX_LOW, high=BOX_HIGH, canonizers=canonizers)
    cls = {"epsilon-plus": EpsilonPlus, "epsilon-plus-flat": EpsilonPlusFlat,
           "epsilon-alpha2-beta1": EpsilonAlpha2Beta1, "epsilon-alpha2-beta1-flat": EpsilonAlpha2Beta1Flat}[name]
    return cls(canonizers=canonizers)


# ------------------------------------------------------------------------------- exact batch-norm merging
# zennit 0.5.1's MergeBatchNorm folds a BN into the preceding layer and then turns the BN into an "identity" by
# setting running_mean=0, running_var=1, weight=1, bias=0 -- but it keeps the BN's eps, so the merged BN still
# computes x / sqrt(1 + eps), a factor 1 - 5e-6 per merged BN (eps=1e-5). zennit therefore explains a slightly
# different function than the model (ResNet50's output moves by ~1e-4 relative). For the well-conditioned rules this
# shows up as ~1e-5 relative differences; for LRP-epsilon on every layer (condition numbers of 1e3..1e5, denominators
# near zero) it alone moves zennit's own relevance by 1e-2. The ONNX model and onnx-lrp fold BN exactly, so the
# references are made with the merged BN computing the exact identity (eps = 0 while merged, restored afterwards).
# Set EXACT_BN_MERGE = False to reproduce stock zennit.
EXACT_BN_MERGE = True
# the stock methods kept on the class: loading this script twice (two test modules) must not wrap the patch in itself
# (the outer wrapper would then save the eps the inner one had already set to 0, and restore 0: the model's BNs would
# lose their eps for good)
_stock_register = MergeBatchNorm.__dict__.get("_stock_register", MergeBatchNorm.register)
_stock_remove = MergeBatchNorm.__dict__.get("_stock_remove", MergeBatchNorm.remove)
MergeBatchNorm._stock_register, MergeBatchNorm._stock_remove = _stock_register, _stock_remove


def _exact_register(self, linears, batch_norm):
    _stock_register(self, linears, batch_norm)
    self.batch_norm_eps = batch_norm.eps
    if EXACT_BN_MERGE:
        batch_norm.eps = 0.0


def _exact_remove(self):
    _stock_remove(self)
    self.batch_norm.eps = self.batch_norm_eps


MergeBatchNorm.register, MergeBatchNorm.remove = _exact_register, _exact_remove


# ------------------------------------------------------------------------------------------- residual sums
class SumCanonizer(AttributeCanonizer):
    """Gives the small model's ``Residual`` blocks a zennit ``Sum`` (so Norm applies to their residual sum), and
    MobileNetV2's residual InvertedResidual blocks a forward that adds through a ``Sum`` module: torchvision
    writes ``x + self.conv(x)``, which zennit would treat with the plain gradient while onnx-lrp (like zennit's own
    ResNetCanonizer) gives every sum of activations the Norm rule. Same computation."""

    def __init__(self):
        super().__init__(self._attribute_map)

    @staticmethod
    def _attribute_map(name, module):
        if type(module).__name__ == "InvertedResidual" and hasattr(module, "use_res_connect"):  # torchvision's
            if not module.use_res_connect:
                return None
            return {"forward": SumCanonizer._inverted_residual_forward.__get__(module), "canonizer_sum": Sum()}
        if isinstance(module, Residual):
            return {"canonizer_sum": Sum()}
        return None

    @staticmethod
    def _inverted_residual_forward(self, x):
        return self.canonizer_sum(torch.stack([x, self.conv(x)], dim=-1))


# ------------------------------------------------------------------------------------------- the small CNN
class Residual(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(ch, ch, 3, padding=1), nn.BatchNorm2d(ch), nn.ReLU(),
                                  nn.Conv2d(ch, ch, 3, padding=1), nn.BatchNorm2d(ch))
        self.relu = nn.ReLU()

    def forward(self, x):
        y = self.body(x)
        summer = getattr(self, "canonizer_sum", None)  # a zennit Sum, set by SumCanonizer while zennit explains
        out = x + y if summer is None else summer(torch.stack([x, y], dim=-1))
        return self.relu(out)


class Branches(nn.Module):
    """Two convolutions side by side, concatenated along the channels."""

    def __init__(self, cin, cout):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(cin, cout, 1), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU())

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], dim=1)


def small_model() -> nn.Module:
    torch.manual_seed(1234)
    m = nn.Sequential(OrderedDict(
        stem=nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),  # BN folded
        pool=nn.MaxPool2d(3, stride=2, padding=1),  # overlapping windows
        block=Residual(8),  # residual sum, downstream BN folded into both convs
        branches=Branches(8, 6),  # concat
        avg=nn.AvgPool2d(2),
        bn=nn.BatchNorm2d(12),  # after a pool: not folded, zennit Pass
        relu=nn.ReLU(),
        down=nn.Sequential(nn.Conv2d(12, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU()),
        gap=nn.AdaptiveAvgPool2d(1),
        flat=nn.Flatten(),
        fc1=nn.Linear(16, 32),
        relu_fc=nn.ReLU(),
        fc2=nn.Linear(32, N_CLASSES_SMALL),
    ))
    randomise_batchnorm(m, seed=99)
    return m.eval()


def small_canonizers():
    return [SequentialMergeBatchNorm(), SumCanonizer()]


# ------------------------------------------------------------------------------------- torchvision models
def randomise_batchnorm(model: nn.Module, seed: int) -> None:
    """Random running statistics and affine parameters, so folding BN into the convolutions matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                n = mod.num_features
                mod.running_mean.copy_(torch.rand(n, generator=g) * 0.4 - 0.2)
                mod.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
                mod.weight.copy_(torch.rand(n, generator=g) * 1.0 + 0.5)
                mod.bias.copy_(torch.rand(n, generator=g) * 0.4 - 0.2)


def large_model(name: str, bn_stats: str = "random"):
    """(model in eval mode, canonizer factory) for a torchvision architecture with random weights; ``bn_stats``:
    "random" (randomised BatchNorm statistics and affine parameters) or "torchvision" (its own initialisation:
    mean 0, variance 1, weight 1, bias 0)."""
    import torchvision
    torch.manual_seed({"vgg16": 1, "resnet18": 2, "resnet50": 3, "densenet121": 4, "mobilenet_v2": 5}[name])
    m = getattr(torchvision.models, name)(weights=None)
    if bn_stats == "random":
        randomise_batchnorm(m, seed=len(name))
    elif bn_stats != "torchvision":
        raise ValueError(f"bn_stats must be 'random' or 'torchvision', not {bn_stats!r}")
    if name == "vgg16":
        return m.eval(), lambda: [VGGCanonizer()]
    if name.startswith("resnet"):
        return m.eval(), lambda: [ResNetCanonizer()]
    if name == "densenet121":
        # torchvision's DenseNet.forward applies F.relu and F.adaptive_avg_pool2d functionally: zennit would give
        # them the plain gradient. Wrap them as nn.ReLU / nn.AdaptiveAvgPool2d modules (same computation) so that
        # zennit applies Pass / Norm, as onnx-lrp does to the exported Relu / GlobalAveragePool.
        wrapped = nn.Sequential(OrderedDict(features=m.features, relu=nn.ReLU(), pool=nn.AdaptiveAvgPool2d(1),
                                            flatten=nn.Flatten(), classifier=m.classifier))
        # BN merging: SequentialMergeBatchNorm walks the leaf modules in registration order, so it would pair each
        # dense layer's conv2 with the *next* layer's norm1 (a BN of the concatenation: 96 vs 32 channels) and
        # crash. The Conv -> BN pairs that are adjacent in the computation (conv0 -> norm0, and conv1 -> norm2 in
        # every dense layer; the ONNX exporters fold exactly these) are therefore merged by name. The BNs after a
        # concatenation (norm1 of every dense layer, the transitions' norm, norm5) stay unfolded on both sides and
        # get zennit's Pass, as onnx-lrp's "batchnorm" kind does.
        pairs = [(["features.conv0"], "features.norm0")] + [
            ([f"{n}.conv1"], f"{n}.norm2") for n, mod in wrapped.named_modules() if type(mod).__name__ == "_DenseLayer"]
        return wrapped.eval(), lambda: [NamedMergeBatchNorm(pairs)]
    if name == "mobilenet_v2":
        # MobileNetV2.forward applies F.adaptive_avg_pool2d functionally: wrapped as an nn.AdaptiveAvgPool2d module
        # (same computation) so zennit applies Norm. Its residual sums (x + self.conv(x)) get a zennit Sum module
        # through SumCanonizer, as zennit's ResNetCanonizer does for ResNet.
        wrapped = nn.Sequential(OrderedDict(features=m.features, pool=nn.AdaptiveAvgPool2d(1),
                                            flatten=nn.Flatten(), classifier=m.classifier))
        return wrapped.eval(), lambda: [SequentialMergeBatchNorm(), SumCanonizer()]
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(LARGE_MODELS)}")


# --------------------------------------------------------------------------------------- export and zennit
def export(model: nn.Module, x: torch.Tensor, exporter: str) -> bytes:
    """ONNX bytes from one of the two torch exporters, with a dynamic batch axis."""
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            buf = io.BytesIO()
            torch.onnx.export(model, (x,), buf, input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "N"}, "y": {0: "N"}}, opset_version=17, dynamo=False)
            return buf.getvalue()
        if exporter == "dynamo":
            batch = torch.export.Dim("N", min=1, max=1024)
            prog = torch.onnx.export(model, (x,), input_names=["x"], output_names=["y"],
                                     dynamic_shapes=({0: batch},), dynamo=True, verbose=False)
            return prog.model_proto.SerializeToString()
    raise ValueError(exporter)


def zennit_relevance(model: nn.Module, x: torch.Tensor, composite: str, canonizers, target=None,
                     capture=()) -> tuple[np.ndarray, np.ndarray, dict]:
    """zennit's relevance at the input (start: one-hot at the target: the arg-max, one class, or one per item), the
    targets, and the relevance arriving at the outputs of the modules named in ``capture`` (for per-layer
    debugging). ``x`` is cast to the model's dtype:
    the references are computed with a float64 copy of the model (``as_float64``), so that they hold the exact
    answer to ~1e-12 even where LRP-epsilon is ill-conditioned (the small set; the large set by default uses the
    float32 model, see --float64), and are stored as float32."""
    comp = zennit_composite(composite, canonizers)
    dtype = next(model.parameters()).dtype
    x = x.detach().clone().to(dtype).requires_grad_(True)
    captured, handles = {}, []
    modules = dict(model.named_modules())
    with comp.context(model) as modified:
        for name in capture:
            def hook(mod, inp, out, name=name):
                out.register_hook(lambda g: captured.__setitem__(name, g.detach().numpy().copy()))
            handles.append(modules[name].register_forward_hook(hook))
        try:
            out = modified(x)
        finally:
            for h in handles:
                h.remove()
        if target is None:
            t = out.argmax(1)
        else:  # one class for every item, or one per item
            t = torch.as_tensor(np.broadcast_to(np.asarray(target), (x.shape[0],)).copy(), dtype=torch.long)
        onehot = torch.zeros_like(out)
        onehot[torch.arange(x.shape[0]), t] = 1.0
        (grad,) = torch.autograd.grad(out, x, onehot)
    return grad.detach().numpy().astype(np.float32), t.numpy(), captured


def logits(model, x):
    with torch.no_grad():
        return model(x.to(next(model.parameters()).dtype)).numpy()


def pick_target(y: np.ndarray) -> int:
    """The 'given' class: never an arg-max, and the one whose logit is farthest from 0 in every sample (every
    composite ends with the epsilon rule on the last layer, which divides by that logit: a logit near 0 would make
    the comparison ill-conditioned from the first step)."""
    score = np.min(np.abs(y), axis=0)
    score[np.argmax(y, axis=1)] = -1.0
    return int(np.argmax(score))


def as_float64(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model).double().eval()


# --------------------------------------------------------------------------------------------- the sets
def make_small(out_dir: Path = SMALL_DIR) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    model = small_model()
    gen = torch.Generator().manual_seed(7)
    x4 = torch.randn(4, 3, SMALL_SIZE, SMALL_SIZE, generator=gen)
    status = {}
    for exporter in EXPORTERS:
        try:
            data = export(model, x4, exporter)
            (out_dir / f"small_cnn_{exporter}.onnx").write_bytes(data)
            status[exporter] = "ok"
        except Exception as exc:  # recorded, not fatal
            status[exporter] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    ref = as_float64(model)
    y = logits(ref, x4)
    given = pick_target(y)
    arrays = {"x": x4.numpy(), "logits": y.astype(np.float32), "given_target": np.array(given)}
    for comp in VARIANTS:
        for batch in (1, 4):
            for tname, target in (("argmax", None), ("given", given)):
                r, t, _ = zennit_relevance(ref, x4[:batch], comp, small_canonizers(), target)
                arrays[f"{comp}/b{batch}/{tname}"] = r
                arrays[f"{comp}/b{batch}/{tname}/target"] = t
    np.savez_compressed(out_dir / "small_cnn.npz", **arrays)
    meta = {"zennit": importlib.metadata.version("zennit"), "torch": torch.__version__, "exporters": status,
            "input": [4, 3, SMALL_SIZE, SMALL_SIZE], "box": [BOX_LOW, BOX_HIGH], "start": "one-hot",
            "reference_dtype": "float64", "exact_bn_merge": EXACT_BN_MERGE,
            "made_by": "scripts/make_zennit_goldens.py --small"}
    (out_dir / "small_cnn.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def make_large(models, out_dir: Path = LARGE_DIR, float64: bool = False, log=print) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    status_path = out_dir / "status.json"
    status = json.loads(status_path.read_text()) if status_path.exists() else {}
    for name in models:
        size = LARGE_MODELS[name]
        t0 = time.time()
        model, canon = large_model(name)
        gen = torch.Generator().manual_seed(11)
        x4 = torch.randn(4, 3, size, size, generator=gen)
        entry = {"input": [4, 3, size, size], "exporters": {}, "seconds": {},
                 "reference_dtype": "float64" if float64 else "float32"}
        for exporter in EXPORTERS:
            t1 = time.time()
            try:
                data = export(model, x4, exporter)
                (out_dir / f"{name}_{exporter}.onnx").write_bytes(data)
                entry["exporters"][exporter] = "ok"
            except Exception as exc:
                (out_dir / f"{name}_{exporter}.onnx").unlink(missing_ok=True)
                entry["exporters"][exporter] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            entry["seconds"][f"export_{exporter}"] = round(time.time() - t1, 1)
            log(f"{name} {exporter}: {entry['exporters'][exporter]} ({entry['seconds'][f'export_{exporter}']} s)")
        ref = as_float64(model) if float64 else model
        y = logits(ref, x4)
        given = pick_target(y)
        arrays = {"x": x4.numpy(), "logits": y.astype(np.float32), "given_target": np.array(given)}
        t1 = time.time()
        for comp in VARIANTS:
            for tname, target in (("argmax", None), ("given", given)):
                r, t, _ = zennit_relevance(ref, x4, comp, canon(), target)
                arrays[f"{comp}/b4/{tname}"] = r
                arrays[f"{comp}/b4/{tname}/target"] = t
        entry["seconds"]["zennit"] = round(time.time() - t1, 1)
        np.savez(out_dir / f"{name}.npz", **arrays)
        top2 = np.sort(y, axis=1)[:, -2:]
        entry["argmax_margin"] = float(np.min(top2[:, 1] - top2[:, 0]))
        entry["seconds"]["total"] = round(time.time() - t0, 1)
        log(f"{name}: zennit {entry['seconds']['zennit']} s, total {entry['seconds']['total']} s")
        status[name] = entry
        status_path.write_text(json.dumps(status, indent=1) + "\n")
    return status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="rewrite the committed goldens in tests/goldens/")
    ap.add_argument("--large", action="store_true", help="rebuild the torchvision goldens in goldens_large/")
    ap.add_argument("--models", default=",".join(LARGE_MODELS), help="comma-separated subset for --large")
    ap.add_argument("--float64", action="store_true",
                    help="--large: zennit in float64 (exact references, but 3-6x slower on CPU: depthwise float64 "
                         "convolutions are slow)")
    ap.add_argument("--out", type=Path, default=None, help="output directory (default: per set)")
    args = ap.parse_args(argv)
    if not (args.small or args.large):
        ap.error("give --small and/or --large")
    torch.set_grad_enabled(True)
    t0 = time.time()
    if args.small:
        print(json.dumps(make_small(args.out or SMALL_DIR)))
    if args.large:
        models = [m for m in args.models.split(",") if m]
        bad = [m for m in models if m not in LARGE_MODELS]
        if bad:
            ap.error(f"unknown model(s) {', '.join(bad)}; choose from {', '.join(LARGE_MODELS)}")
        make_large(models, args.out or LARGE_DIR, float64=args.float64)
    print(f"done in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
