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
from functools import partial
import sys
from pathlib import Path

import numpy as np
import torch
from captum import attr as C

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "goldens" / "methods"
sys.path.insert(0, str(ROOT / "tests"))
from captum_nets import MLP, export as _export, seeded_cnn  # noqa: E402

RULES = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")


def _nets():
    cnn = seeded_cnn()
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


def _small(a: np.ndarray) -> np.ndarray:
    """A float32 array whose values are all float16 values, stored as float16 (the tests read it back as float32)."""
    if a.dtype == np.float32 and np.array_equal(a.astype(np.float16).astype(np.float32), a):
        return a.astype(np.float16)
    return a


def write_cases(path: Path, nets: dict, cases) -> None:
    """``nets``: name -> (module, x, t); ``cases(name, module, x, t)`` yields (case, method, options, reference):
    one npz with the inputs, targets, array options, references and a JSON index, as captum.npz."""
    arrays, index = {}, {}
    for name, (module, x, t) in nets.items():
        arrays[f"{name}/x"], arrays[f"{name}/target"] = _small(x), t
        for case, method, options, ref in cases(name, module, x, t):
            key = f"{name}/{case}"
            arrays.update({f"{key}/{k}": _small(v) for k, v in options.items() if isinstance(v, np.ndarray)})
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


def _model_nets() -> dict:
    """The parity models (tests/captum_nets.py): name -> (module, input, targets)."""
    from captum_nets import BertLike, LSTMNet, plain_cnn, resnet_small

    rng = np.random.default_rng(50)
    torch.manual_seed(51)
    bert, lstm = BertLike().eval(), LSTMNet().eval()
    return {"resnet": (resnet_small(52), _f16(rng.normal(size=(2, 3, 26, 26))), np.array([1, 3])),
            "bert": (bert, _f16(rng.normal(size=(2, 6, 8))), np.array([0, 2])),
            "lstm": (lstm, rng.normal(size=(2, 5, 4)).astype(np.float32), np.array([2, 1])),
            "plain_cnn": (plain_cnn(53), rng.normal(size=(2, 3, 8, 8)).astype(np.float32), np.array([4, 0]))}


def _f16(a) -> np.ndarray:
    """``a`` rounded to float16 (stored so, half the bytes), as float32."""
    return np.asarray(a, np.float16).astype(np.float32)


def _relu_output(onnx_bytes: bytes, prefix: str) -> str:
    """The name of the last Relu output under ``prefix`` in the exported graph (a stage's output)."""
    import onnx

    names = [n.output[0] for n in onnx.load_from_string(onnx_bytes).graph.node
             if n.op_type == "Relu" and n.output[0].startswith(prefix)]
    return names[-1]


def _gradient_cases(module, x, t, rng, rule):
    """captum's Saliency, InputXGradient, IntegratedGradients, NoiseTunnel and GradientShap on one model."""
    X, T = torch.tensor(x), torch.tensor(t)
    yield "saliency", "gradient", {}, _np(C.Saliency(module).attribute(X, target=T, abs=False))
    yield "ixg", "gradient-x-input", {}, _np(C.InputXGradient(module).attribute(X, target=T))
    base = _f16(rng.normal(scale=0.3, size=x.shape))
    ref = C.IntegratedGradients(module).attribute(X, baselines=torch.tensor(base), target=T, n_steps=16, method=rule)
    yield f"ig_{rule}", "integrated-gradients", {"baselines": base, "n_steps": 16, "integration": rule}, _np(ref)
    torch.manual_seed(54)
    drawn = torch.normal(0, torch.tensor(0.2).repeat((len(x) * 2,) + x.shape[1:])).numpy()
    torch.manual_seed(54)
    ref = C.NoiseTunnel(C.Saliency(module)).attribute(X, nt_type="smoothgrad", nt_samples=2, stdevs=0.2, target=T,
                                                      abs=False)
    noise = np.ascontiguousarray(drawn.reshape((len(x), 2) + x.shape[1:]).swapaxes(0, 1))
    yield "smoothgrad", "smoothgrad", {"noise": noise}, _np(ref)
    background = _f16(rng.normal(scale=0.5, size=(3,) + x.shape[1:]))
    yield ("gradient_shap", "gradient-shap") + gradient_shap_case(module, x, t, background, 2, 0.1, 55)


def _model_cases(name, module, x, t):
    """The cases of parity_models.npz for one model."""
    rng = np.random.default_rng(60)
    X, T = torch.tensor(x), torch.tensor(t)
    rules = {"resnet": "gausslegendre", "bert": "riemann_trapezoid", "lstm": "riemann_middle"}
    if name in rules:
        yield from _gradient_cases(module, x, t, rng, rules[name])
    if name == "resnet":
        onnx_bytes = (OUT / "resnet.onnx").read_bytes()
        stages = [(6, False, "nearest"), (4, True, "bilinear"), (5, False, "nearest")]  # 2, 7, 4 -> 26 pixels
        for k, (stage, relu, mode) in enumerate(stages):
            layer = _relu_output(onnx_bytes, f"/{stage}/")
            yield (f"grad_cam_{k}", "grad-cam") + grad_cam_case(module, module[stage], layer, x, t, relu, mode)
    windows = {"resnet": [((3, 13, 13), (3, 13, 13)), ((3, 10, 10), (1, 8, 8))], "bert": [((1, 8), (1, 8))],
               "lstm": [((1, 4), (1, 4)), ((2, 2), (1, 2))], "plain_cnn": []}[name]
    for k, (window, strides) in enumerate(windows):
        ref = C.Occlusion(module).attribute(X, sliding_window_shapes=window, strides=strides, baselines=0.1,
                                            target=T)
        yield f"occlusion_{k}", "occlusion", {"sliding_window_shapes": list(window), "strides": list(strides),
                                              "baselines": 0.1}, _np(ref)
    if name == "plain_cnn":
        yield from _zennit_cases(module, x, t)


def _zennit_cases(module, x, t):
    """zennit 0.5.1's SmoothGrad (of EpsilonPlusFlat, and of the gradient) with its noise stored (its last sample
    is no noise), IntegratedGradients (riemann_right from 0) and Occlusion (tiling windows filled with 0: zennit
    returns f(x occluded) on each window, onnx-lrp's (captum's) occlusion f(x) - that; stored as the latter). zennit's
    SmoothGrad of a composite starts from the target's logit (its attr_output the one-hot times the output), as LRP."""
    from zennit.attribution import IntegratedGradients, Occlusion, SmoothGrad, occlude_independent
    from zennit.composites import EpsilonPlusFlat

    X = torch.tensor(x)
    one_hot = torch.eye(5)[torch.tensor(t)]
    std = 0.1 * (X.amax((1, 2, 3), keepdim=True) - X.amin((1, 2, 3), keepdim=True))
    for case, composite in (("zennit_smoothgrad_epf", EpsilonPlusFlat()), ("zennit_smoothgrad", None)):
        torch.manual_seed(56)
        noise = np.stack([(torch.randn_like(X) * std).numpy() for _ in range(3)] + [np.zeros_like(x)])
        torch.manual_seed(56)
        with SmoothGrad(module, composite=composite, noise_level=0.1, n_iter=4) as attributor:
            _, ref = attributor(X, one_hot if composite is None else lambda out: out * one_hot)  # LRP: from the logit
        base = {"base": "epsilon-plus-flat"} if composite is not None else {}
        yield case, "smoothgrad", {"noise": noise, **base}, _np(ref)
    with IntegratedGradients(module, n_iter=8) as attributor:
        _, ref = attributor(X, one_hot)
    yield "zennit_ig", "integrated-gradients", {"n_steps": 8, "integration": "riemann_right", "baselines": 0.0}, \
        _np(ref)
    hide = partial(occlude_independent, fill_fn=torch.zeros_like, invert=True)  # the window filled, the rest kept
    with Occlusion(module, window=(3, 4, 4), stride=(3, 4, 4), occlusion_fn=hide) as attributor:
        _, ref = attributor(X, lambda out: out * one_hot)  # the score: the target's output
    with torch.no_grad():
        fx = module(X)[torch.arange(len(x)), torch.tensor(t)].numpy()
    yield "zennit_occlusion", "occlusion", {"sliding_window_shapes": [3, 4, 4], "strides": [3, 4, 4],
                                            "baselines": 0.0}, fx.reshape(-1, 1, 1, 1) - _np(ref)


def main_models() -> None:
    """The parity models exported to ONNX and parity_models.npz; the two-input model and two_inputs.npz."""
    nets = _model_nets()
    for name, (module, x, _) in nets.items():
        (OUT / f"{name}.onnx").write_bytes(_export(module, x))
    write_cases(OUT / "parity_models.npz", nets, _model_cases)
    main_two_inputs()


def main_two_inputs() -> None:
    """two_inputs.onnx (tests/captum_nets.TwoInputs) and two_inputs.npz: captum's Saliency, IntegratedGradients
    (a baseline per input: an array and a number), NoiseTunnel, GradientShap and Occlusion on both inputs at once,
    with the noise and draws stored per input (``<case>/<option>/<input>``)."""
    from captum_nets import TwoInputs, export_inputs

    torch.manual_seed(70)
    module = TwoInputs().eval()
    rng = np.random.default_rng(71)
    u, v = _f16(rng.normal(size=(2, 4))), _f16(rng.normal(size=(2, 2, 5)))
    t = np.array([0, 2])
    (OUT / "two_inputs.onnx").write_bytes(export_inputs(module, (u, v), ("u", "v")))
    X, T = (torch.tensor(u), torch.tensor(v)), torch.tensor(t)
    arrays = {"u": u, "v": v, "target": t}

    def store(case, refs, **options):
        arrays.update({f"{case}/ref/{k}": _np(r) for k, r in zip("uv", refs)})
        for name, value in options.items():
            arrays.update({f"{case}/{name}/{k}": np.asarray(a) for k, a in zip("uv", value)} if isinstance(
                value, tuple) else {f"{case}/{name}": np.asarray(value)})

    store("saliency", C.Saliency(module).attribute(X, target=T, abs=False))
    bu = _f16(rng.normal(size=u.shape))
    store("ig", C.IntegratedGradients(module).attribute(X, baselines=(torch.tensor(bu), 0.3), target=T, n_steps=8),
          baselines=(bu, np.float32(0.3)), n_steps=8)
    torch.manual_seed(72)
    noise = tuple(torch.normal(0, torch.tensor(0.2).repeat((2 * 3,) + a.shape[1:])).numpy() for a in (u, v))
    torch.manual_seed(72)
    ref = C.NoiseTunnel(C.Saliency(module)).attribute(X, nt_type="smoothgrad", nt_samples=3, stdevs=0.2, target=T,
                                                      abs=False)
    store("smoothgrad", ref, noise=tuple(n.reshape((2, 3) + n.shape[1:]).swapaxes(0, 1) for n in noise))
    background = (_f16(rng.normal(size=(4, 4))), _f16(rng.normal(size=(4, 2, 5))))
    # captum draws the background rows of each input apart (one np.random.choice per input); onnx_lrp draws one row
    # of the background set for all inputs: captum is fed the same rows for both here
    drawn_rows = rng.integers(0, 4, 6)
    choice, np.random.choice = np.random.choice, lambda n, size: drawn_rows.copy()
    try:
        torch.manual_seed(73)
        np.random.seed(73)
        ref = C.GradientShap(module).attribute(X, baselines=tuple(torch.tensor(b) for b in background), n_samples=3,
                                               stdevs=0.1, target=T)
    finally:
        np.random.choice = choice
    torch.manual_seed(73)
    drawn = tuple(torch.normal(0, torch.tensor(0.1).repeat((2 * 3,) + a.shape[1:])).numpy() for a in (u, v))
    np.random.seed(73)
    index, alphas = drawn_rows.reshape(2, 3).T, np.random.uniform(0.0, 1.0, 6).reshape(2, 3).T
    store("gradient_shap", ref, baselines=background, baseline_indices=index, alphas=alphas,
          noise=tuple(n.reshape((2, 3) + n.shape[1:]).swapaxes(0, 1) for n in drawn))
    # occlusion: a window, strides and baseline per input (test_methods_parity_models.py TWO_OCCLUSION)
    store("occlusion", C.Occlusion(module).attribute(X, sliding_window_shapes=((2,), (1, 3)), strides=((1,), (1, 2)),
                                                     baselines=(0.1, -0.2), target=T))
    np.savez_compressed(OUT / "two_inputs.npz", **{k: _small(np.asarray(a)) for k, a in arrays.items()})
    print(f"two inputs -> {OUT / 'two_inputs.npz'}")


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
