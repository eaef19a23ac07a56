"""Write tests/goldens/methods/real_*: the real torch classes of issue 36's parity (torchvision's ``resnet18``, a
transformers ``BertForSequenceClassification``, an ``nn.LSTM`` classifier) with seeded random weights, exported by
torch.onnx's TorchScript exporter (``dynamo=False``, opset 17, the exporter optimum uses), and real_methods.npz: captum
0.9's Saliency, InputXGradient, IntegratedGradients, NoiseTunnel(Saliency), GradientShap, expected gradients
(GradientShap without noise), LayerGradCam + LayerAttribution.interpolate and Occlusion on them, with every random
part stored, and captum's own float32-to-float64 distance per case — so that
tests/methods/test_methods_real_exports.py checks onnx_lrp.methods on them without torch.

    /work/llmenv/bin/pip install captum==0.9.0      # an environment with torch, torchvision, transformers, captum
    /work/llmenv/bin/python scripts/make_real_method_goldens.py

ResNet18's convolutions and its head (11.7 M weights) are not stored: each is drawn from a counter-based generator
(``unit`` of tests/methods/test_methods_real_exports.py) times a stored scale per output channel (the exporter
folds each BatchNorm into the convolution before it: the scale is the BatchNorm's, times the draw's bound); the test
puts them back. The noise of NoiseTunnel and GradientShap is what captum draws after ``torch.manual_seed``: the
script checks it by recomputing captum's result from the stored noise with captum's Saliency.
"""
from __future__ import annotations

import ast
import copy
import io
import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from captum import attr as C
from onnx import numpy_helper
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "goldens" / "methods"


def _test_function(name: str):
    """A function of the test file (without importing it: no pytest here), so that both draw the same weights."""
    tree = ast.parse((ROOT / "tests" / "methods" / "test_methods_real_exports.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = {"np": np}
    exec(compile(ast.Module([node], []), "test_methods_real_exports.py", "exec"), scope)
    return scope[name]


unit = _test_function("unit")
DRAWN = 4096  # weights with more entries are drawn by ``unit`` and not stored
ULP_DRAWS = 6  # inputs a few float32 steps away on which captum's float32 result is recomputed


# ------------------------------------------------------------------------------------------------- the models
def resnet18() -> nn.Module:
    """torchvision's resnet18(weights=None), its big weights ``unit`` draws, BatchNorm statistics and affine drawn."""
    import torchvision

    torch.manual_seed(80)
    net = torchvision.models.resnet18(weights=None).eval()
    with torch.no_grad():
        for k, (name, p) in enumerate(net.named_parameters()):
            if p.numel() > DRAWN:
                bound = np.float32(np.sqrt(6.0 / p[0].numel()))  # He-uniform
                p.copy_(torch.from_numpy(unit(1000 + k, tuple(p.shape)) * bound))
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.2)
                m.bias.uniform_(-0.1, 0.1)
    return net


class BertEmbeds(nn.Module):
    """BertForSequenceClassification called as captum attributes BERT: at ``inputs_embeds`` (the word embeddings'
    output), the attention mask beside; returns the logits."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, inputs_embeds, attention_mask):
        return self.bert(inputs_embeds=inputs_embeds, attention_mask=attention_mask).logits


def bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(81)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=3, max_position_embeddings=64)
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():  # away from the initialisation's identity LayerNorms and zero biases
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.uniform_(0.6, 1.4)
            elif name.endswith("bias"):
                p.uniform_(-0.1, 0.1)
    return BertEmbeds(model).eval(), model


class LSTMClassifier(nn.Module):
    """nn.LSTM (batch first) -> the last step's output -> Linear."""

    def __init__(self, features=6, hidden=12, classes=4):
        super().__init__()
        self.lstm, self.fc = nn.LSTM(features, hidden, batch_first=True), nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc(self.lstm(x)[0][:, -1])


def export(module, xs: tuple, names: tuple, dynamic: dict) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(torch.as_tensor(x) for x in xs), f, input_names=list(names),
                          output_names=["logits"], opset_version=17, dynamo=False,
                          dynamic_axes={**dynamic, "logits": {0: "N"}})
    return onnx.load_from_string(f.getvalue())


def export_dynamo(module, x) -> tuple[onnx.ModelProto, dict]:
    """torch.onnx's default exporter (dynamo, opset 18; it folds each BatchNorm too), without the nodes' metadata
    (source stack traces); and each top-level module's last Relu output (by the nodes' name scopes)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, (torch.as_tensor(x),), dynamo=True, input_names=["x"],
                                    output_names=["logits"], dynamic_shapes=({0: torch.export.Dim("N")},),
                                    verbose=False)
    model, stages = program.model_proto, {}
    for node in model.graph.node:
        scopes = [p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"]
        if node.op_type == "Relu" and scopes:
            stages[ast.literal_eval(scopes[0])[1]] = node.output[0]
        del node.metadata_props[:]
        node.doc_string = ""
    return model, stages


def strip_drawn(model: onnx.ModelProto, module: nn.Module, seeds: dict) -> dict:
    """Take out of ``model`` every initializer a ``unit`` draw times a scale per output channel gives (the folded
    convolutions, the head): {name: (seed, shape, scale)}; the test rebuilds them from these."""
    params = {name: p.detach().numpy() for name, p in module.named_parameters() if name in seeds}
    stripped, kept = {}, []
    for init in model.graph.initializer:
        a = numpy_helper.to_array(init)
        match = None
        for name, p in params.items():
            if p.shape != a.shape or name in {v[3] for v in stripped.values()}:
                continue
            u = unit(seeds[name], a.shape).reshape(len(a), -1).astype(np.float64)
            scale = ((a.reshape(len(a), -1) * u).sum(1) / (u * u).sum(1)).astype(np.float32)
            rebuilt = unit(seeds[name], a.shape) * scale.reshape((-1,) + (1,) * (a.ndim - 1))
            if np.abs(rebuilt - a).max() <= 1e-6 * np.abs(a).max():
                match = (seeds[name], list(a.shape), scale, name)
                break
        if match is None:
            kept.append(init)
        else:
            stripped[init.name] = match
    assert len(stripped) == len(params), (len(stripped), len(params))
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return {k: v[:3] for k, v in stripped.items()}


# ------------------------------------------------------------------------------------------------- the cases
def _np(t) -> np.ndarray:
    return t.detach().numpy()


def _f16(a) -> np.ndarray:
    """``a`` rounded to float16 values (stored as float16: half the bytes), as float32."""
    return np.asarray(a, np.float16).astype(np.float32)


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


class Case:
    """One model under captum: ``run(make, **kw)`` is captum's result in float32 and float64 (the float64 twin of
    the module and of every tensor given), with extra forward arguments (the attention mask) held."""

    def __init__(self, module, x, t, extra=()):
        self.module, self.x, self.t, self.extra = module, x, t, tuple(extra)
        self.module64 = copy.deepcopy(module).double()

    def _one(self, make, module, dtype, x, seed, kw):
        args = {k: torch.tensor(v, dtype=dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
                for k, v in kw.items()}
        if self.extra:
            args["additional_forward_args"] = tuple(torch.tensor(e) for e in self.extra)
        if seed is not None:
            torch.manual_seed(seed)
            np.random.seed(seed)
        return _np(make(module).attribute(torch.tensor(x, dtype=dtype), target=torch.tensor(self.t), **args))

    def run(self, make, seed=None, ulps=True, **kw):
        """(float32 result, float64 result, their distance, the float32 result's largest distance over ULP_DRAWS
        inputs a few float32 steps away: a ReLU at 0 within float32 rounding at a point of the path flips there, as
        it may between torch's and onnxruntime's kernels)."""
        ref = self._one(make, self.module, torch.float32, self.x, seed, kw)
        ref64 = self._one(make, self.module64, torch.float64, self.x, seed, kw)
        rng, dulp = np.random.default_rng(110), 0.0
        for _ in range(ULP_DRAWS if ulps else 0):
            step = np.float32(2.0 ** -21) * rng.choice(np.array([-1, 1], np.float32), self.x.shape)
            x = (self.x * (1 + step)).astype(np.float32)  # each entry ~4 float32 steps away
            dulp = max(dulp, _rel(self._one(make, self.module, torch.float32, x, seed, kw), ref))
        return ref, ref64.astype(np.float32), _rel(ref, ref64), dulp


def _noise(x, n, stdev, seed):
    """The noise captum's NoiseTunnel / GradientShap draw after torch.manual_seed(seed), sample-major (captum's rows
    are item-major) as onnx_lrp takes it."""
    torch.manual_seed(seed)
    drawn = torch.normal(0, torch.tensor(stdev).repeat((len(x) * n,) + x.shape[1:])).numpy()
    return np.ascontiguousarray(drawn.reshape((len(x), n) + x.shape[1:]).swapaxes(0, 1))


def _check_noise(case: Case, noise, ref, nt_type):
    """captum's NoiseTunnel result recomputed from the stored noise with captum's Saliency: the noise is captum's."""
    grads = np.stack([_np(C.Saliency(case.module).attribute(
        torch.tensor(case.x + e), target=torch.tensor(case.t), abs=False,
        additional_forward_args=tuple(torch.tensor(a) for a in case.extra) or None)) for e in noise])
    mine = {"smoothgrad": grads.mean(0), "smoothgrad_sq": (grads ** 2).mean(0),
            "vargrad": (grads ** 2).mean(0) - grads.mean(0) ** 2}[nt_type]
    assert _rel(mine, ref) < 1e-5, (nt_type, _rel(mine, ref))


def gradient_cases(case: Case, background, nt: int, shap_n: int):
    """(name, method, options, reference, (captum's float32-to-float64 distance, its distance a few float32 steps
    from x)) of every gradient method."""
    x = case.x
    ref, ref64, d, u = case.run(C.Saliency, abs=False)
    yield "saliency", "gradient", {}, ref, (d, u)
    ref, ref64, d, u = case.run(C.InputXGradient)
    yield "ixg", "gradient-x-input", {}, ref, (d, u)
    for rule in ("gausslegendre", "riemann_trapezoid"):
        ref, ref64, d, u = case.run(C.IntegratedGradients, baselines=0.0, n_steps=16, method=rule)
        yield f"ig_{rule}", "integrated-gradients", {"baselines": 0.0, "n_steps": 16, "integration": rule}, ref, (d, u)
    noise = _noise(x, nt, 0.1, 90)
    for nt_type in ("smoothgrad", "smoothgrad_sq", "vargrad"):
        ref, ref64, d, u = case.run(lambda m: C.NoiseTunnel(C.Saliency(m)), seed=90, nt_type=nt_type, nt_samples=nt,
                                 stdevs=0.1, abs=False)
        _check_noise(case, noise, ref, nt_type)
        method, extra = ("vargrad", {}) if nt_type == "vargrad" else ("smoothgrad", {"nt_type": nt_type})
        # vargrad's E[g^2] - E[g]^2 cancels in float32: captum's float64 result is the reference
        yield nt_type, method, {"noise": noise, **extra, "ref64": nt_type == "vargrad"}, \
            (ref64 if nt_type == "vargrad" else ref), (d, u)
    for name, method, stdev, seed in (("gradient_shap", "gradient-shap", 0.1, 91),
                                      ("expected_gradients", "expected-gradients", 0.0, 92)):
        ref, ref64, d, u = case.run(C.GradientShap, seed=seed, baselines=background, n_samples=shap_n, stdevs=stdev)
        draws = _shap_draws(x, shap_n, stdev, len(background), seed)
        yield name, method, {"baselines": background, **draws}, ref, (d, u)


def _shap_draws(x, n, stdev, rows, seed):
    """The draws captum's GradientShap makes after torch.manual_seed(seed) and np.random.seed(seed): noise, then
    the background rows, then the alphas; sample-major."""
    b = len(x)
    draws = {"noise": _noise(x, n, stdev, seed)} if stdev else {}
    np.random.seed(seed)
    index = np.random.choice(rows, n * b)
    alphas = np.random.uniform(0.0, 1.0, n * b)
    return {**draws, "baseline_indices": np.ascontiguousarray(index.reshape(b, n).T),
            "alphas": np.ascontiguousarray(alphas.reshape(b, n).T)}


def occlusion_cases(case: Case, windows):
    for k, (window, strides) in enumerate(windows):
        ref, ref64, d, u = case.run(C.Occlusion, ulps=False, sliding_window_shapes=window, strides=strides,
                                    baselines=0.0)
        yield f"occlusion_{k}", "occlusion", {"sliding_window_shapes": list(window), "strides": list(strides),
                                              "baselines": 0.0}, ref, (d, u)


def grad_cam_cases(case: Case, model: onnx.ModelProto):
    """LayerGradCam at the outputs of layer3 and layer4 (the last Relu of each), interpolated to 64 x 64."""
    for k, (stage, relu, mode) in enumerate((("layer3", False, "nearest"), ("layer4", True, "bilinear"))):
        layer = [n.output[0] for n in model.graph.node if n.op_type == "Relu" and
                 n.output[0].startswith(f"/{stage}/")][-1]

        def make(m, stage=stage, relu=relu, mode=mode):
            class Cam:
                def attribute(self, x, target, **_):
                    a = C.LayerGradCam(m, getattr(m, stage)).attribute(x, target=target, relu_attributions=relu)
                    return C.LayerAttribution.interpolate(a, tuple(x.shape[2:]), interpolate_mode=mode)
            return Cam()
        ref, ref64, d, u = case.run(make)
        yield f"grad_cam_{k}", "grad-cam", {"layer": layer, "relu_attributions": relu, "interpolate_mode": mode}, \
            ref, (d, u)


# ------------------------------------------------------------------------------------------------- main
def main() -> None:
    rng = np.random.default_rng(100)
    arrays, index = {}, {}

    def stored_array(key, v):
        """The key ``v`` is stored under: an equal array stored before (the noise shared by smoothgrad, its square
        and vargrad), else ``key``; float32 arrays of float16 values as float16."""
        for k, a in arrays.items():
            if a.shape == v.shape and np.array_equal(a.astype(v.dtype), v) and k.endswith(key.rsplit("/", 1)[1]):
                return k
        arrays[key] = v.astype(np.float16) if v.dtype == np.float32 and np.array_equal(
            v.astype(np.float16).astype(np.float32), v) else v
        return key

    def store(net, model, case, cases, drawn=None, feeds=None):
        onnx.save(model, OUT / f"real_{net}.onnx")
        arrays[f"{net}/x"], arrays[f"{net}/target"] = case.x.astype(np.float16), case.t
        for name, value in (feeds or {}).items():
            arrays[f"{net}/feed/{name}"] = value
        info = {"inputs": [i.name for i in model.graph.input], "feeds": sorted(feeds or {}), "drawn": {}}
        for name, (seed, shape, scale) in (drawn or {}).items():
            arrays[f"{net}/drawn/{name}"] = scale
            info["drawn"][name] = {"seed": seed, "shape": shape}
        index[net] = info
        with torch.no_grad():
            arrays[f"{net}/logits"] = _np(case.module(torch.tensor(case.x), *map(torch.tensor, case.extra)))
        for key, method, options, ref, (dist, dulp) in cases:
            key = f"{net}/{key}"
            stored = {k: stored_array(f"{key}/{k}", v) for k, v in options.items() if isinstance(v, np.ndarray)}
            arrays[f"{key}/ref"] = ref.astype(np.float32)
            index[key] = {"method": method, "f64_distance": dist, "ulp_distance": dulp, "ref": f"{key}/ref",
                          "ref64": bool(options.pop("ref64", False)),
                          "options": {k: v for k, v in options.items() if not isinstance(v, np.ndarray)},
                          "arrays": stored}
            print(f"{key:34s} {method:22s} captum f32 vs f64 {dist:.1e}, steps from x {dulp:.1e}", flush=True)

    # ResNet18, 2 x 3 x 64 x 64
    net = resnet18()
    x = _f16(rng.normal(size=(2, 3, 64, 64)))
    seeds = {name: 1000 + k for k, (name, p) in enumerate(net.named_parameters()) if p.numel() > DRAWN}
    model = export(net, (x,), ("x",), {"x": {0: "N"}})
    drawn = strip_drawn(model, net, seeds)
    case = Case(net, x, np.array([3, 417]))
    background = _f16(rng.normal(scale=0.5, size=(3,) + x.shape[1:]))
    cases = [*gradient_cases(case, background, 2, 2), *grad_cam_cases(case, model),
             *occlusion_cases(case, [((3, 16, 16), (3, 16, 16))])]
    store("resnet18", model, case, cases, drawn)
    # the same network through the dynamo exporter: the same references, Grad-CAM at its names of the same tensors
    model, stages = export_dynamo(net, x)
    drawn = strip_drawn(model, net, seeds)
    onnx.save(model, OUT / "real_resnet18_dynamo.onnx")
    index["resnet18_dynamo"] = {**index["resnet18"], "same_as": "resnet18", "drawn": {}}
    for name, (seed, shape, scale) in drawn.items():
        arrays[f"resnet18_dynamo/drawn/{name}"] = scale
        index["resnet18_dynamo"]["drawn"][name] = {"seed": seed, "shape": shape}
    for case_name in ("saliency", "ig_gausslegendre", "gradient_shap", "vargrad", "grad_cam_0", "grad_cam_1",
                      "occlusion_0"):
        entry = json.loads(json.dumps(index[f"resnet18/{case_name}"]))
        if entry["method"] == "grad-cam":
            stage = {"grad_cam_0": "layer3", "grad_cam_1": "layer4"}[case_name]
            entry["options"]["layer"] = stages[stage]
        index[f"resnet18_dynamo/{case_name}"] = entry

    # BERT: 2 sequences of 8 tokens, the second padded after 5
    wrapper, hf = bert()
    ids = torch.tensor(rng.integers(1, 100, (2, 8)))
    mask = np.array([[1] * 8, [1] * 5 + [0] * 3], np.int64)
    with torch.no_grad():
        x = _f16(hf.bert.embeddings.word_embeddings(ids).numpy())
    model = export(wrapper, (x, mask), ("inputs_embeds", "attention_mask"),
                   {"inputs_embeds": {0: "N", 1: "T"}, "attention_mask": {0: "N", 1: "T"}})
    case = Case(wrapper, x, np.array([0, 2]), extra=(mask,))
    background = _f16(rng.normal(scale=0.02, size=(3,) + x.shape[1:]))
    cases = [*gradient_cases(case, background, 3, 3), *occlusion_cases(case, [((1, 32), (1, 32))])]
    store("bert", model, case, cases, feeds={"attention_mask": mask})

    # LSTM classifier: 2 sequences of 10 steps of 6 features
    torch.manual_seed(82)
    lstm = LSTMClassifier().eval()
    x = _f16(rng.normal(size=(2, 10, 6)))
    model = export(lstm, (x,), ("x",), {"x": {0: "N"}})
    case = Case(lstm, x, np.array([1, 3]))
    background = _f16(rng.normal(scale=0.5, size=(4,) + x.shape[1:]))
    cases = [*gradient_cases(case, background, 4, 4), *occlusion_cases(case, [((1, 6), (1, 6)), ((3, 2), (2, 2))])]
    store("lstm", model, case, cases)

    arrays["index"] = np.array(json.dumps(index))
    np.savez_compressed(OUT / "real_methods.npz", **arrays)
    sizes = sum(p.stat().st_size for p in OUT.glob("real_*"))
    print(f"{len(index)} entries -> {OUT / 'real_methods.npz'}; real_* {sizes / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
