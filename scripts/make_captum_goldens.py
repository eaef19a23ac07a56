"""Write tests/goldens/methods/: two small torch models exported to ONNX (cnn.onnx: Conv, BatchNorm, ReLU, MaxPool;
mlp.onnx: Tanh, Sigmoid, an inner Softmax) and captum.npz: captum 0.9's Saliency, InputXGradient,
IntegratedGradients (every integration rule), NoiseTunnel (smoothgrad, smoothgrad_sq, vargrad; the noise stored)
and Occlusion on them, with the inputs, targets and baselines fed, and each case's options (JSON) — so that
tests/methods/test_methods_goldens.py checks onnx_lrp.methods without torch or captum.

    .venv/bin/pip install captum==0.9.0
    .venv/bin/python scripts/make_captum_goldens.py

vargrad's reference is captum run in float64 (its float32 E[a^2] - E[a]^2 cancels); every other case is float32.
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch
from captum import attr as C

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "goldens" / "methods"
sys.path.insert(0, str(ROOT / "tests"))
from captum_nets import CNN, MLP, export as _export  # noqa: E402

RULES = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")


def _nets():
    torch.manual_seed(10)
    cnn = CNN().eval()
    with torch.no_grad():
        cnn.bn.running_mean.uniform_(-0.5, 0.5)
        cnn.bn.running_var.uniform_(0.5, 2.0)
        cnn.bn.weight.uniform_(0.5, 1.5)
        cnn.bn.bias.uniform_(-0.3, 0.3)
    torch.manual_seed(12)
    mlp = MLP().eval()
    rng = np.random.default_rng(20)
    return {"cnn": (cnn, rng.normal(size=(2, 3, 8, 8)).astype(np.float32)),
            "mlp": (mlp, rng.normal(size=(3, 10)).astype(np.float32))}


def _np(t) -> np.ndarray:
    return t.detach().numpy()


def _cases(module, x, t, rng):
    """(case name, method, options (arrays stored beside), captum's result) for one model."""
    X, T = torch.tensor(x), torch.tensor(t)
    yield "saliency", "gradient", {}, _np(C.Saliency(module).attribute(X, target=T, abs=False))
    yield "saliency_abs", "gradient", {"abs": True}, _np(C.Saliency(module).attribute(X, target=T, abs=True))
    yield "ixg", "gradient-x-input", {}, _np(C.InputXGradient(module).attribute(X, target=T))
    base = rng.normal(scale=0.3, size=x.shape).astype(np.float32)
    for rule in RULES:
        ref = C.IntegratedGradients(module).attribute(X, baselines=torch.tensor(base), target=T, n_steps=12,
                                                      method=rule)
        yield f"ig_{rule}", "integrated-gradients", {"baselines": base, "n_steps": 12, "integration": rule}, _np(ref)
    for nt in ("smoothgrad", "smoothgrad_sq", "vargrad"):
        torch.manual_seed(11)
        drawn = torch.normal(0, torch.tensor(0.2).repeat((len(x) * 4,) + x.shape[1:])).numpy()
        noise = np.ascontiguousarray(drawn.reshape((len(x), 4) + x.shape[1:]).swapaxes(0, 1))  # captum: item-major
        net = copy.deepcopy(module).double() if nt == "vargrad" else module
        torch.manual_seed(11)
        ref = C.NoiseTunnel(C.Saliency(net)).attribute(X.to(next(net.parameters()).dtype), nt_type=nt, nt_samples=4,
                                                       stdevs=0.2, target=T, abs=False)
        method, extra = ("vargrad", {}) if nt == "vargrad" else ("smoothgrad", {"nt_type": nt})
        yield nt, method, {"noise": noise, **extra}, _np(ref).astype(np.float32)
    windows = [((3, 3, 3), (1, 2, 2)), ((1, 4, 4), (1, 4, 4)), ((3, 5, 3), (2, 3, 2))] if x.ndim == 4 else \
        [((2,), (1,)), ((3,), (2,))]
    for k, (window, strides) in enumerate(windows):
        ref = C.Occlusion(module).attribute(X, sliding_window_shapes=window, strides=strides, baselines=0.25,
                                            target=T)
        yield f"occlusion_{k}", "occlusion", {"sliding_window_shapes": list(window), "strides": list(strides),
                                              "baselines": 0.25}, _np(ref)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    arrays, index = {}, {}
    for name, (module, x) in _nets().items():
        (OUT / f"{name}.onnx").write_bytes(_export(module, x))
        t = (np.arange(len(x)) % 4 + 1).astype(np.int64)
        arrays[f"{name}/x"], arrays[f"{name}/target"] = x, t
        rng = np.random.default_rng(30)
        for case, method, options, ref in _cases(module, x, t, rng):
            key = f"{name}/{case}"
            plain = {}
            for k, v in options.items():
                if isinstance(v, np.ndarray):
                    arrays[f"{key}/{k}"] = v
                else:
                    plain[k] = v
            arrays[f"{key}/ref"] = ref
            index[key] = {"method": method, "options": plain, "arrays": sorted(k for k, v in options.items()
                                                                               if isinstance(v, np.ndarray))}
    arrays["index"] = np.array(json.dumps(index))
    np.savez_compressed(OUT / "captum.npz", **arrays)
    print(f"{len(index)} cases -> {OUT}")


if __name__ == "__main__":
    main()
