"""Write tests/goldens/methods/: two small torch models exported to ONNX (cnn.onnx: Conv, BatchNorm, ReLU, MaxPool;
mlp.onnx: Tanh, Sigmoid, an inner Softmax) and captum.npz: captum 0.9's Saliency, InputXGradient,
IntegratedGradients (every integration rule), NoiseTunnel (smoothgrad, smoothgrad_sq, vargrad; the noise stored)
and Occlusion on them, with the inputs, targets and baselines fed, and each case's options (JSON) — so that
tests/methods/test_methods_goldens.py checks onnx_lrp.methods without torch or captum.

    .venv/bin/pip install captum==0.9.0
    .venv/bin/python scripts/make_captum_goldens.py [phase1] [more] [models]   (none: all three)

``more`` writes captum_more.npz: captum's GradientShap (with noise) and expected gradients (GradientShap without
noise) with their draws stored, and LayerGradCam + LayerAttribution.interpolate, on the same two models.
``models`` writes the parity models and their references.

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


def _gshap_draws(x, n, stdev, background, seed):
    """The draws captum's GradientShap makes after torch.manual_seed(seed) and np.random.seed(seed) (noise, then
    baseline indices, then alphas), as onnx_lrp takes them: sample-major (captum's rows are item-major)."""
    b = len(x)
    torch.manual_seed(seed)
    noise = torch.normal(0, torch.tensor(stdev).repeat((b * n,) + x.shape[1:])).numpy()
    np.random.seed(seed)
    index = np.random.choice(len(background), n * b)
    alphas = np.random.uniform(0.0, 1.0, n * b)
    return {"noise": np.ascontiguousarray(noise.reshape((b, n) + x.shape[1:]).swapaxes(0, 1)),
            "baseline_indices": np.ascontiguousarray(index.reshape(b, n).T),
            "alphas": np.ascontiguousarray(alphas.reshape(b, n).T)}


def gradient_shap_case(module, x, t, background, n, stdev, seed):
    """(options with the draws, captum's GradientShap) for one input."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    ref = C.GradientShap(module).attribute(torch.tensor(x), baselines=torch.tensor(background), n_samples=n,
                                           stdevs=stdev, target=torch.tensor(t))
    draws = _gshap_draws(x, n, stdev, background, seed)
    if stdev == 0:
        del draws["noise"]
    return {"baselines": background, **draws}, _np(ref)


def grad_cam_case(module, layer, name, x, t, relu, mode):
    """(options, captum's LayerGradCam at ``layer`` interpolated to x's spatial axes)."""
    a = C.LayerGradCam(module, layer).attribute(torch.tensor(x), target=torch.tensor(t), relu_attributions=relu)
    ref = C.LayerAttribution.interpolate(a, tuple(x.shape[2:]), interpolate_mode=mode)
    return {"layer": name, "relu_attributions": relu, "interpolate_mode": mode}, _np(ref)


def _more_cases(name, module, x, t):
    """The cases of captum_more.npz (expected gradients / GradientShap, Grad-CAM) for one model."""
    background = np.random.default_rng(40).normal(scale=0.5, size=(6,) + x.shape[1:]).astype(np.float32)
    yield ("gradient_shap", "gradient-shap") + gradient_shap_case(module, x, t, background, 4, 0.2, 41)
    yield ("expected_gradients", "expected-gradients") + gradient_shap_case(module, x, t, background, 8, 0.0, 42)
    if name == "cnn":
        for k, (relu, mode) in enumerate([(False, "nearest"), (True, "bilinear")]):
            yield (f"grad_cam_{k}", "grad-cam") + grad_cam_case(module, module.conv2, "/conv2/Conv_output_0", x, t,
                                                                relu, mode)


def write_cases(path: Path, nets: dict, cases) -> None:
    """``nets``: name -> (module, x, t); ``cases(name, module, x, t)`` yields (case, method, options, reference):
    one npz with the inputs, targets, array options, references and a JSON index, as captum.npz."""
    arrays, index = {}, {}
    for name, (module, x, t) in nets.items():
        arrays[f"{name}/x"], arrays[f"{name}/target"] = x, t
        for case, method, options, ref in cases(name, module, x, t):
            key = f"{name}/{case}"
            arrays.update({f"{key}/{k}": v for k, v in options.items() if isinstance(v, np.ndarray)})
            arrays[f"{key}/ref"] = ref
            index[key] = {"method": method,
                          "options": {k: v for k, v in options.items() if not isinstance(v, np.ndarray)},
                          "arrays": sorted(k for k, v in options.items() if isinstance(v, np.ndarray))}
    arrays["index"] = np.array(json.dumps(index))
    np.savez_compressed(path, **arrays)
    print(f"{len(index)} cases -> {path}")


def main_more() -> None:
    """captum_more.npz on the models of cnn.onnx and mlp.onnx (as main() wrote them)."""
    nets = {name: (module, x, (np.arange(len(x)) % 4 + 1).astype(np.int64)) for name, (module, x) in _nets().items()}
    write_cases(OUT / "captum_more.npz", nets, _more_cases)


def main_models() -> None:
    raise NotImplementedError


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
    parts = sys.argv[1:] or ["phase1", "more", "models"]
    if "phase1" in parts:
        main()
    if "more" in parts:
        main_more()
    if "models" in parts:
        main_models()
