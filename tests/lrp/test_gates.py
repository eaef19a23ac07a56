"""Gates, functions with f(0) != 0, LRP-0 and LayerNorm in CNNs (issue 9 points 2-4 and 6, issue 10 family 4).

- A signal times a sigmoid / hard-sigmoid gate of another tensor (squeeze-excitation ``h * sigmoid(fc(pool(h)))``)
  is kind ``gate``; every built-in composite gives it signal-take-all (Arras et al. 2017): ``R_h = R_z``,
  ``R_gate = 0``. Checked against a numpy oracle on a hand-built SE block and on TorchScript exports of
  torchvision's own ``SqueezeExcitation`` (conservation with zero biases).
- Element-wise functions with f(0) != 0 (Sigmoid, HardSigmoid, Exp, Softplus, Cos, Clip(0.1, ...)) are kind
  ``offset-activation``: the identity rule is refused on them (one line naming node and op), the built-in
  composites give them ``gradient-x-input`` (``R_x = x f'(x) R_y / f(x)``): numpy oracle, and gradient x input of the
  whole net under attnlrp (LXT's efficient mode).
- ``epsilon=0`` is LRP-0 everywhere (the Norm stabiliser of sums and average pools goes to 0 with it): gradient x
  input from torch autograd on a ReLU CNN with residual sums and average pools.
"""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from util import GOLDENS, assert_close, make_model, node, to_bytes

import onnx_lrp
from onnx_lrp import load as loader
from onnx_lrp.lrp import rewriter
from onnx_lrp.rules import load_composite, parse_composite

CNN = ["epsilon", "epsilon-plus", "epsilon-plus-flat", "epsilon-gamma-box", "epsilon-alpha2-beta1",
       "epsilon-alpha2-beta1-flat"]
ALL = CNN + ["attnlrp", "cp-lrp"]
BOX = {"low": -4.0, "high": 4.0}


def _kw(composite):
    return BOX if composite == "epsilon-gamma-box" else {}


def _kinds(model_bytes, composite="epsilon"):
    p = rewriter.plan(loader.load(model_bytes), load_composite(composite))
    return {a.node.name: (a.kind, a.rule.name if a.rule is not None else None, a.reason) for a in p.assignments}


# ------------------------------------------------------------------------------------------ numpy helpers
def _conv_matrix(w, hw, pad):
    """The dense matrix of a stride-1 2-D convolution (no bias) on a [C, H, W] input, rows = output elements."""
    co, ci, kh, kw = w.shape
    h, wd = hw
    ho, wo = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    m = np.zeros((co, ho, wo, ci, h, wd))
    for o in range(co):
        for i in range(ho):
            for j in range(wo):
                for c in range(ci):
                    for a in range(kh):
                        for b in range(kw):
                            y, x = i + a - pad, j + b - pad
                            if 0 <= y < h and 0 <= x < wd:
                                m[o, i, j, c, y, x] = w[o, c, a, b]
    return m.reshape(co * ho * wo, ci * h * wd)


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


# ------------------------------------------------------------------------------------------ the SE block
N, C, S = 2, 3, 5


def _se_model(rng, gate_op="Sigmoid"):
    """x -> conv (no bias) -> relu = h; g = gate(conv(relu(conv(gap(h))))); z = h * g; y = W flatten(z) (no bias)."""
    p = {"w1": rng.normal(size=(4, C, 3, 3)).astype(np.float32) * 0.5,
         "f1": rng.normal(size=(2, 4, 1, 1)).astype(np.float32), "fb1": rng.normal(size=2).astype(np.float32),
         "f2": rng.normal(size=(4, 2, 1, 1)).astype(np.float32), "fb2": rng.normal(size=4).astype(np.float32),
         "wd": rng.normal(size=(3, 4 * S * S)).astype(np.float32) * 0.3, "bd": np.zeros(3, np.float32)}
    gate_attrs = {"alpha": 1.0 / 6, "beta": 0.5} if gate_op == "HardSigmoid" else {}
    nodes = [node("Conv", ["x", "w1"], ["pre"], name="conv1", pads=[1, 1, 1, 1]),
             node("Relu", ["pre"], ["h"], name="relu1"),
             node("GlobalAveragePool", ["h"], ["pooled"], name="se_pool"),
             node("Conv", ["pooled", "f1", "fb1"], ["s1"], name="se_fc1"),
             node("Relu", ["s1"], ["s1r"], name="se_relu"),
             node("Conv", ["s1r", "f2", "fb2"], ["s2"], name="se_fc2"),
             node(gate_op, ["s2"], ["g"], name="se_gate", **gate_attrs),
             node("Mul", ["h", "g"], ["z"], name="se_mul"),
             node("Flatten", ["z"], ["zf"], name="flatten"),
             node("Gemm", ["zf", "wd", "bd"], ["y"], name="dense", transB=1)]
    return make_model(nodes, {"x": ["N", C, S, S]}, ["y"], p), p


def _se_forward(x, p, gate_op):
    m1 = _conv_matrix(p["w1"].astype(np.float64), (S, S), 1)
    pre = x.reshape(len(x), -1) @ m1.T
    h = np.maximum(pre, 0)
    pooled = h.reshape(len(x), 4, -1).mean(axis=2)
    s1 = np.maximum(pooled @ p["f1"][:, :, 0, 0].T + p["fb1"], 0)
    s2 = s1 @ p["f2"][:, :, 0, 0].T + p["fb2"]
    g = _sigmoid(s2) if gate_op == "Sigmoid" else np.clip(s2 / 6 + 0.5, 0, 1)
    z = (h.reshape(len(x), 4, -1) * g[:, :, None]).reshape(len(x), -1)
    y = z @ p["wd"].T.astype(np.float64)
    return m1, pre, h, z, y


@pytest.mark.parametrize("gate_op", ["Sigmoid", "HardSigmoid"])
def test_se_block_signal_take_all_lrp0_oracle(gate_op):
    """LRP-0 with the gate as a constant multiplier: R_z = z W_t, R_h = R_z, R_gate = 0, R_x = x (M^T (R_h / pre))."""
    rng = np.random.default_rng(3)
    model, p = _se_model(rng, gate_op)
    x = rng.normal(size=(N, C, S, S)).astype(np.float32)
    kinds = _kinds(to_bytes(model))
    assert kinds["se_mul"][:2] == ("gate", "signal-take-all")
    assert kinds["se_gate"][0] == "offset-activation"  # f(0) = 0.5, but as a gate it receives nothing
    ex = onnx_lrp.Explainer(to_bytes(model), composite="epsilon", epsilon=0.0, relevance_at=["h", "z", "g", "s2"])
    res = ex.explain(x)
    m1, pre, h, z, y = _se_forward(x.astype(np.float64), p, gate_op)
    t = res.target
    r_z = z * p["wd"][t].astype(np.float64)                      # LRP-0 at the bias-free dense layer
    r_pre = r_z                                                   # signal-take-all, then Pass at the Relu
    s = np.divide(r_pre, pre, out=np.zeros_like(pre), where=pre != 0)
    r_x = x.reshape(N, -1) * (s @ m1)
    assert_close(res.outputs["y"], y, rtol=1e-5, atol=1e-6)
    assert_close(res.relevance_at["z"].reshape(N, -1), r_z, rtol=1e-4, atol=1e-6)
    assert_close(res.relevance_at["h"].reshape(N, -1), r_z, rtol=1e-4, atol=1e-6)
    assert not np.any(res.relevance_at["g"]) and not np.any(res.relevance_at["s2"])
    assert_close(res.relevance.reshape(N, -1), r_x, rtol=1e-4, atol=1e-5)
    # conservation: no biases on the signal path
    np.testing.assert_allclose(res.relevance.reshape(N, -1).sum(1), y[np.arange(N), t], rtol=1e-4)


@pytest.mark.parametrize("composite", ALL)
def test_se_block_every_composite_holds_the_gate(composite):
    """Every built-in composite: the signal takes the whole relevance of the gated product (none vanishes into the
    gate, none is lost: cp-lrp used to class both factors as gates and return zeros)."""
    rng = np.random.default_rng(4)
    model, p = _se_model(rng)
    x = rng.normal(size=(N, C, S, S)).astype(np.float32)
    res = onnx_lrp.Explainer(to_bytes(model), composite=composite, relevance_at=["h", "z", "g"],
                             **_kw(composite)).explain(x)
    r_z, r_h = (res.relevance_at[k].reshape(N, -1).astype(np.float64) for k in ("z", "h"))
    assert np.all(np.isfinite(res.relevance)) and np.any(res.relevance)
    np.testing.assert_allclose(r_h, r_z, rtol=1e-5, atol=1e-6 * np.abs(r_z).max())
    assert not np.any(res.relevance_at["g"])
    y_t = res.outputs["y"][np.arange(N), res.target]
    np.testing.assert_allclose(r_z.sum(1), y_t, rtol=1e-4)  # the dense layer has no bias


def test_gate_needs_a_different_tensor():
    """x * sigmoid(x) (SiLU) and x * hardsigmoid(x) (hard-swish) are functions of one tensor, not gates."""
    for gate in ("Sigmoid", "HardSigmoid"):
        m = make_model([node(gate, ["x"], ["g"]), node("Mul", ["x", "g"], ["y"], name="act")], {"x": [N, 4]}, ["y"])
        kind, rule, _ = _kinds(to_bytes(m))["act"]
        assert (kind, rule) == ("activation", "pass")


# ------------------------------------------------------------------------------------------ real exports
def _export(module, x, opset=17):
    import torch
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), x, buf, input_names=["x"], output_names=["y"], opset_version=opset,
                          dynamic_axes={"x": {0: "batch"}}, dynamo=False)
    return buf.getvalue()


def _torch_se_net(scale_activation, activation, bias):
    import torch
    from torchvision.ops import SqueezeExcitation
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=bias), activation(),
        SqueezeExcitation(8, 4, scale_activation=scale_activation),
        torch.nn.Conv2d(8, 8, 3, padding=1, bias=bias), activation(),
        SqueezeExcitation(8, 2, activation=torch.nn.SiLU, scale_activation=scale_activation),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4, bias=bias))
    return net


@pytest.mark.parametrize("scale_activation,activation", [("Sigmoid", "SiLU"), ("Hardsigmoid", "Hardswish"),
                                                         ("Sigmoid", "ReLU")])
def test_torchvision_squeeze_excitation_export(scale_activation, activation):
    """torchvision's SqueezeExcitation exported by TorchScript: its Mul is a gate under every composite; with zero
    biases on the signal path LRP-0 (epsilon composite, epsilon 0) conserves the logit exactly."""
    import torch
    net = _torch_se_net(getattr(torch.nn, scale_activation), getattr(torch.nn, activation), bias=False)
    x = torch.randn(2, 3, 8, 8)
    data = _export(net, x)
    kinds = _kinds(data)
    gates = [k for k, v in kinds.items() if v[0] == "gate"]
    assert len(gates) == 2, kinds
    xs = x.numpy()
    with torch.no_grad():
        y = net(x).numpy()
    res = onnx_lrp.Explainer(data, composite="epsilon", epsilon=0.0).explain(xs)
    y_t = y[np.arange(2), res.target]
    np.testing.assert_allclose(res.relevance.reshape(2, -1).sum(1), y_t, rtol=1e-4)
    for comp in ALL:
        r = onnx_lrp.Explainer(data, composite=comp, **_kw(comp)).explain(xs).relevance
        sums = r.reshape(2, -1).sum(1)
        assert np.all(np.isfinite(r)) and np.all(np.abs(sums) < 10 * np.abs(y_t) + 1e-3), (comp, sums, y_t)
        assert np.any(r), comp


def _written_out():
    import torch

    class HardSigmoid(torch.nn.Module):  # Keras' hard_sigmoid: relu6(x + 3) / 6 (tf2onnx: Add, Clip, Mul by 1/6)
        def __init__(self, *_, div=False, **__):
            super().__init__()
            self.div = div

        def forward(self, x):
            return torch.nn.functional.relu6(x + 3) / 6 if self.div else torch.nn.functional.relu6(x + 3) * (1 / 6)

    class HardSwish(torch.nn.Module):  # Keras' hard_swish: x * hard_sigmoid(x)
        def __init__(self, *_, **__):
            super().__init__()
            self.gate = HardSigmoid(div=True)

        def forward(self, x):
            return x * self.gate(x)

    return HardSigmoid, HardSwish


def test_hard_sigmoid_written_out_is_the_op():
    """A squeeze-excitation net whose hard sigmoid and hard swish are written out as Keras writes them
    (``relu6(x + 3) * (1/6)``, ``x * (relu6(x + 3) / 6)``: Add, Clip, Mul/Div) gets the kinds and the relevance of
    the same net with HardSigmoid / HardSwish ops, under every composite (before: the SE products were refused by
    the CNN composites: no gate)."""
    import onnx
    import torch
    hard_sigmoid, hard_swish = _written_out()
    ops = _torch_se_net(torch.nn.Hardsigmoid, torch.nn.Hardswish, bias=True)
    written = _torch_se_net(hard_sigmoid, hard_swish, bias=True)
    written.load_state_dict(ops.state_dict())
    x = torch.randn(2, 3, 8, 8)
    data_ops, data_written = _export(ops, x), _export(written, x)
    assert {"Clip"} <= {n.op_type for n in onnx.load_from_string(data_written).graph.node}
    kinds = lambda d: sorted(v[:2] for v in _kinds(d).values())  # noqa: E731
    assert kinds(data_written) == kinds(data_ops)
    for comp in ALL:
        a = onnx_lrp.Explainer(data_ops, composite=comp, **_kw(comp)).explain(x.numpy(), target=1)
        b = onnx_lrp.Explainer(data_written, composite=comp, **_kw(comp)).explain(x.numpy(), target=1)
        assert_close(b.outputs["y"], a.outputs["y"], rtol=1e-5, atol=1e-6)
        assert np.any(a.relevance), comp
        err = np.linalg.norm(b.relevance - a.relevance) / np.linalg.norm(a.relevance)
        assert err < 1e-5, (comp, err)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["efficientnet_b0", "mobilenet_v3_small", "regnet_y_400mf", "convnext_tiny"])
def test_torchvision_se_nets(name):
    """EfficientNet-B0, MobileNetV3-small, RegNetY-400MF (random weights, BatchNorm statistics from random inputs):
    finite relevance of the order of the logit under the CNN composites, attnlrp and cp-lrp (before: refused by the
    CNN composites, 1e10-1e12 x the logit under attnlrp, all zeros under cp-lrp). ConvNeXt-tiny (LayerNorm, GELU):
    before refused by the CNN composites."""
    import torch
    import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(8, 3, 96, 96))
    x = torch.randn(2, 3, 96, 96)
    data = _export(model, x)
    for comp in ("epsilon-plus-flat", "epsilon-gamma-box", "attnlrp", "cp-lrp"):
        res = onnx_lrp.Explainer(data, composite=comp, **_kw(comp)).explain(x.numpy())
        y_t = res.outputs["y"][np.arange(2), res.target]
        sums = res.relevance.reshape(2, -1).astype(np.float64).sum(1)
        assert np.all(np.isfinite(res.relevance)) and np.any(res.relevance), comp
        assert np.all(np.abs(sums) < 20 * np.abs(y_t)), (comp, sums, y_t)


# ------------------------------------------------------------------------------------------ f(0) != 0
F0 = {  # op, attributes, f, f'
    "Sigmoid": ({}, _sigmoid, lambda a: _sigmoid(a) * (1 - _sigmoid(a))),
    "HardSigmoid": ({"alpha": 0.2, "beta": 0.5}, lambda a: np.clip(0.2 * a + 0.5, 0, 1),
                    lambda a: np.where((0.2 * a + 0.5 > 0) & (0.2 * a + 0.5 < 1), 0.2, 0.0)),
    "Exp": ({}, np.exp, np.exp),
    "Softplus": ({}, lambda a: np.log1p(np.exp(a)), _sigmoid),
    "Cos": ({}, np.cos, lambda a: -np.sin(a)),
}


def _mlp(op, attrs, rng):
    p = {"w1": rng.normal(size=(6, 4)).astype(np.float32), "b1": rng.normal(size=6).astype(np.float32),
         "w2": rng.normal(size=(3, 6)).astype(np.float32), "b2": np.zeros(3, np.float32)}
    nodes = [node("Gemm", ["x", "w1", "b1"], ["pre"], name="fc1", transB=1), node(op, ["pre"], ["a"], name="act",
                                                                                   **attrs),
             node("Gemm", ["a", "w2", "b2"], ["y"], name="fc2", transB=1)]
    return make_model(nodes, {"x": ["N", 4]}, ["y"], p), {k: v.astype(np.float64) for k, v in p.items()}


@pytest.mark.parametrize("op", sorted(F0))
def test_offset_activation_gradient_x_input_oracle(op):
    """R_pre = pre f'(pre) R_a / f(pre), also where pre ~ 0 (the identity rule's f(pre)/pre would explode there)."""
    attrs, f, df = F0[op]
    rng = np.random.default_rng(5)
    model, p = _mlp(op, attrs, rng)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    x[0] = np.linalg.lstsq(p["w1"], -p["b1"], rcond=None)[0][:4].astype(np.float32)  # some pre-activations ~ 0
    assert _kinds(to_bytes(model))["act"][:2] == ("offset-activation", "gradient-x-input")
    res = onnx_lrp.Explainer(to_bytes(model), composite="epsilon", epsilon=0.0).explain(x)
    pre = x.astype(np.float64) @ p["w1"].T + p["b1"]
    a = f(pre)
    t = res.target
    r_a = a * p["w2"][t]                                         # LRP-0, zero bias
    r_pre = pre * df(pre) * np.divide(r_a, a, out=np.zeros_like(a), where=a != 0)
    r_x = x * ((r_pre / pre) @ p["w1"])                          # LRP-0 at fc1 (R_pre is proportional to pre)
    assert np.all(np.isfinite(res.relevance))
    np.testing.assert_allclose(res.relevance, r_x, rtol=2e-4, atol=1e-5 * np.abs(r_x).max())


def test_attnlrp_on_offset_activation_is_gradient_x_input():
    """attnlrp (LXT's efficient mode: gradient x input for functions it does not patch) on x -> Gemm -> Sigmoid ->
    Gemm: R_x = x * dy_t/dx."""
    rng = np.random.default_rng(6)
    model, p = _mlp("Sigmoid", {}, rng)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    res = onnx_lrp.Explainer(to_bytes(model), composite="attnlrp").explain(x)
    pre = x.astype(np.float64) @ p["w1"].T + p["b1"]
    grad = (_sigmoid(pre) * (1 - _sigmoid(pre)) * p["w2"][res.target]) @ p["w1"]
    assert_close(res.relevance, x * grad, rtol=1e-4, atol=1e-6)


def test_identity_rule_on_offset_activation_is_refused():
    model, _ = _mlp("Sigmoid", {}, np.random.default_rng(7))
    everything_pass = parse_composite('[[rules]]\nmatch = { kind = ["activation", "offset-activation"] }\n'
                                      'rule = "pass"\n[[rules]]\nrule = "epsilon"\n', source="pass-all")
    with pytest.raises(onnx_lrp.UnsupportedError) as info:
        onnx_lrp.Explainer(to_bytes(model), composite=everything_pass)
    msg = str(info.value)
    assert "act" in msg and "Sigmoid" in msg and "f(0) != 0" in msg and "gradient-x-input" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("op,inputs,attrs,kind", [
    ("Sigmoid", [], {}, "offset-activation"), ("Exp", [], {}, "offset-activation"),
    ("Softplus", [], {}, "offset-activation"), ("Cos", [], {}, "offset-activation"),
    ("HardSigmoid", [], {}, "offset-activation"),
    ("Clip", [("lo", 0.1)], {}, "offset-activation"), ("Clip", [("lo", -2.0), ("hi", -1.0)], {}, "offset-activation"),
    ("Clip", [("lo", 0.0), ("hi", 6.0)], {}, "activation"), ("Tanh", [], {}, "activation"),
    ("Relu", [], {}, "activation"), ("Elu", [], {}, "activation"), ("LeakyRelu", [], {}, "activation"),
    ("HardSwish", [], {}, "activation"), ("Softsign", [], {}, "activation"), ("Erf", [], {}, "activation"),
    ("Selu", [], {}, "activation"), ("Celu", [], {}, "activation")])
def test_offset_kind_by_value_at_zero(op, inputs, attrs, kind):
    inits = {k: np.array(v, np.float32) for k, v in inputs}
    m = make_model([node(op, ["x"] + list(inits), ["y"], name="f", **attrs), node("Add", ["y", "x"], ["z"])],
                   {"x": [N, 4]}, ["z"], inits)
    assert _kinds(to_bytes(m))["f"][0] == kind


# ------------------------------------------------------------------------------------------ epsilon = 0
def test_epsilon_zero_zeroes_the_norm_stabilizer_unless_given():
    comp = load_composite("epsilon-plus-flat")
    norms = [e.rule for e in comp.with_params(epsilon=0.0).entries if e.rule.name == "norm"]
    assert norms and all(r.stabilizer == 0.0 for r in norms)
    norms = [e.rule for e in comp.with_params(epsilon=0.0, stabilizer=1e-3).entries if e.rule.name == "norm"]
    assert all(r.stabilizer == 1e-3 for r in norms)
    norms = [e.rule for e in comp.with_params(epsilon=1e-3).entries if e.rule.name == "norm"]
    assert all(r.stabilizer == 1e-6 for r in norms)
    own = parse_composite('[[rules]]\nrule = "norm"\nstabilizer = 1e-3\n[[rules]]\nrule = "epsilon"\n', source="own")
    assert own.with_params(epsilon=0.0).entries[0].rule.stabilizer == 1e-3  # set in the composite: kept


def _relu_resnet():
    import torch
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.c2 = nn.Conv2d(8, 8, 3, padding=1)
            self.c3 = nn.Conv2d(8, 8, 1)
            self.pool = nn.AvgPool2d(2)
            self.mp = nn.MaxPool2d(2)
            self.fc = nn.Linear(8 * 2 * 2, 5)

        def forward(self, x):
            a = torch.relu(self.bn(self.c1(x)))
            b = torch.relu(self.c2(a) + a)            # residual sum
            c = self.pool(b) + self.c3(self.pool(a))   # average pools, another sum
            d = self.mp(torch.relu(c))
            return self.fc(d.flatten(1))

    torch.manual_seed(1)
    net = Net()
    with torch.no_grad():
        net.bn.running_mean.normal_(0, 0.2)
        net.bn.running_var.uniform_(0.5, 1.5)
    return net.eval()


def test_epsilon_zero_is_gradient_x_input_on_relu_cnn():
    """LRP-0 (epsilon = 0, no stabiliser given) = gradient x input of torch autograd on the same weights, to 1e-6
    of the largest |relevance|; before, the Norm rule's stabiliser 1e-6 stayed on sums and average pools."""
    import torch
    net = _relu_resnet()
    x = torch.randn(3, 3, 8, 8, dtype=torch.float32)
    data = _export(net, x)
    for composite in ("epsilon", "epsilon-plus-flat"):
        res = onnx_lrp.Explainer(data, composite=composite, epsilon=0.0).explain(x.numpy(), target=2)
        if composite != "epsilon":
            continue  # z+ / flat on convolutions: only checked to run
        net64 = _relu_resnet().double()
        xx = x.double().requires_grad_(True)
        y = net64(xx)[:, 2]
        (g,) = torch.autograd.grad(y.sum(), xx)
        want = (xx * g).detach().numpy()
        err = np.abs(res.relevance - want).max() / np.abs(want).max()
        assert err < 1e-6, err


def test_cli_epsilon_zero(tmp_path):
    """--epsilon 0 on the command line is the same LRP-0."""
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main
    net = _relu_resnet()
    import torch
    x = torch.randn(2, 3, 8, 8)
    path = tmp_path / "net.onnx"
    path.write_bytes(_export(net, x))
    np.save(tmp_path / "x.npy", x.numpy())
    out = tmp_path / "r.npy"
    r = CliRunner().invoke(main, ["explain", str(path), str(tmp_path / "x.npy"), "--composite", "epsilon",
                                  "--epsilon", "0", "--target", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    want = onnx_lrp.Explainer(path.read_bytes(), composite="epsilon", epsilon=0.0).explain(x.numpy(), target=1)
    np.testing.assert_array_equal(np.load(out), want.relevance)


# ------------------------------------------------------------------------------------------ cp-lrp on GeGLU
GEGLU = GOLDENS / "geglu"


@pytest.mark.parametrize("composite", ["attnlrp", "cp-lrp"])
@pytest.mark.parametrize("act", ["erf", "tanh"])
def test_geglu_torchscript_matches_lxt(act, composite):
    """A Gemma3-like GeGLU block exported by TorchScript at opset 18 (GELU written out as x (1 + erf(x/sqrt2)) 0.5
    or its tanh form) against LXT's own Gemma3 MLP forwards (scripts/make_geglu_goldens.py): cp-lrp finds the gate
    through the constant Mul (before: relative L2 0.69), attnlrp applies the uniform rule."""
    d = np.load(GEGLU / "geglu.npz")
    ex = onnx_lrp.Explainer(str(GEGLU / f"geglu_{act}_torchscript18.onnx"), composite=composite)
    res = ex.explain(d["embeds"][None], target=int(d[f"{act}_target"]))
    assert_close(res.outputs["logits"][0], d[f"{act}_logits"], rtol=1e-5, atol=1e-5)
    want = d[f"{act}_{composite}"].astype(np.float64)
    err = np.linalg.norm(res.relevance[0] - want) / np.linalg.norm(want)
    assert err <= 1e-4, err


# ------------------------------------------------------------------------------------------ ConvNeXt
def _tiny_convnext():
    import torch
    from torchvision.models.convnext import CNBlock, LayerNorm2d
    torch.manual_seed(2)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 2, stride=2), LayerNorm2d(16, eps=1e-6),
        CNBlock(16, layer_scale=0.5, stochastic_depth_prob=0.0),
        CNBlock(16, layer_scale=0.5, stochastic_depth_prob=0.0),
        torch.nn.AdaptiveAvgPool2d(1), LayerNorm2d(16, eps=1e-6), torch.nn.Flatten(1), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for mod in net.modules():
            if isinstance(mod, torch.nn.LayerNorm):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.normal_(0, 0.1)
    return net.eval()


def _lxt_reference(net, x, target):
    """Gradient x input with LayerNorm's std detached and the identity rule on GELU (LXT's efficient mode)."""
    import torch
    import torch.nn.functional as F
    ln, gelu = F.layer_norm, F.gelu

    def layer_norm(v, shape, weight=None, bias=None, eps=1e-5):
        dims = tuple(range(-len(shape), 0))
        c = v - v.mean(dims, keepdim=True)
        out = c / torch.sqrt((c * c).mean(dims, keepdim=True) + eps).detach()
        return out * weight + bias

    def identity_gelu(v, approximate="none"):
        ratio = torch.where(v == 0, torch.full_like(v, 0.5), gelu(v, approximate=approximate) / v)
        return v * ratio.detach()

    F.layer_norm, F.gelu = layer_norm, identity_gelu
    try:
        xx = x.clone().requires_grad_(True)
        net(xx)[:, target].sum().backward()
        return (xx * xx.grad).detach().numpy()
    finally:
        F.layer_norm, F.gelu = ln, gelu


def test_convnext_blocks_under_cnn_composites():
    """torchvision's ConvNeXt blocks (LayerNorm2d, depthwise conv, Linear, erf-GELU written out, layer scale):
    every CNN composite assigns LayerNorm the held-scale rule (before: refused); the epsilon composite at epsilon 0
    and attnlrp equal LXT's gradient x input with std detached and the identity rule on GELU."""
    import torch
    net = _tiny_convnext()
    x = torch.randn(2, 3, 16, 16)
    data = _export(net, x)
    kinds = _kinds(data, "epsilon-plus-flat")
    assert any(v[0] == "layernorm" and v[1] == "epsilon" for v in kinds.values()), kinds
    want = _lxt_reference(net, x, 1)
    for comp in ("epsilon", "attnlrp"):
        res = onnx_lrp.Explainer(data, composite=comp, **({"epsilon": 0.0} if comp == "epsilon" else {})).explain(
            x.numpy(), target=1)
        err = np.linalg.norm(res.relevance - want) / np.linalg.norm(want)
        assert err < 1e-4, (comp, err)
    for comp in CNN:
        res = onnx_lrp.Explainer(data, composite=comp, **_kw(comp)).explain(x.numpy())
        y_t = res.outputs["y"][np.arange(2), res.target]
        sums = res.relevance.reshape(2, -1).sum(1)
        assert np.all(np.isfinite(res.relevance)) and np.all(np.abs(sums) < 20 * np.abs(y_t) + 1e-3), (comp, sums)


def test_self_product_with_offset_is_not_given_the_identity_rule():
    """(x + 1) * sigmoid(x) is a function of x with f(0) = 0.5: refused (no identity rule, no known derivative);
    SiLU, hard-swish and the written-out GELUs vanish at 0 and keep the identity rule."""
    half = np.array(0.5, np.float32)
    one = np.array(1.0, np.float32)
    r2 = np.array(1 / np.sqrt(2), np.float32)
    cases = {
        "offset": ([node("Add", ["x", "one"], ["xp"]), node("Sigmoid", ["x"], ["s"]),
                    node("Mul", ["xp", "s"], ["y"], name="f")], False),
        "silu": ([node("Sigmoid", ["x"], ["s"]), node("Mul", ["x", "s"], ["y"], name="f")], True),
        "gelu": ([node("Mul", ["x", "r2"], ["xs"]), node("Erf", ["xs"], ["e"]), node("Add", ["e", "one"], ["e1"]),
                  node("Mul", ["x", "e1"], ["xe"], name="f"), node("Mul", ["xe", "half"], ["y"])], True),
    }
    for name, (nodes, ok) in cases.items():
        nodes = [node("Gemm", ["x0", "w", "b"], ["x"], name="fc", transB=1)] + nodes
        inits = {"w": np.eye(4, dtype=np.float32), "b": np.zeros(4, np.float32), "one": one, "half": half, "r2": r2}
        m = make_model(nodes, {"x0": [N, 4]}, ["y"], inits)
        kind = _kinds(to_bytes(m), "attnlrp")["f"][0]
        assert kind == ("activation" if ok else "offset-activation"), name
        for comp in ("attnlrp", "epsilon"):
            if ok:
                onnx_lrp.Explainer(to_bytes(m), composite=comp)
            else:
                with pytest.raises(onnx_lrp.UnsupportedError, match="f.*f\\(0\\) != 0"):
                    onnx_lrp.Explainer(to_bytes(m), composite=comp)


def test_softsign_written_out_is_an_activation():
    """torch exports nn.Softsign as x / (1 + |x|): a quotient of a tensor by a function of itself, an element-wise
    activation with f(0) = 0 (identity rule), not a quotient of two activations. Its relevance equals that of the
    ONNX Softsign op and an LRP-epsilon oracle with the identity rule on the activation; (x + 1) / (1 + |x|)
    (f(0) = 1) is refused, not given the identity rule."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Softsign(), torch.nn.Linear(6, 3)).eval()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(1, 4),), f, input_names=["x"], output_names=["y"], opset_version=17,
                          dynamo=False, dynamic_axes={"x": {0: "n"}})
    exported = f.getvalue()
    kinds = _kinds(exported)
    div = next(k for k in kinds if "Div" in k)
    assert kinds[div][:2] == ("activation", "pass"), kinds[div]
    p = {k: v.detach().numpy().astype(np.float64) for k, v in net.state_dict().items()}
    twin = make_model([node("Gemm", ["x", "w1", "b1"], ["pre"], transB=1), node("Softsign", ["pre"], ["a"]),
                       node("Gemm", ["a", "w2", "b2"], ["y"], transB=1)], {"x": ["N", 4]}, ["y"],
                      {"w1": p["0.weight"].astype(np.float32), "b1": p["0.bias"].astype(np.float32),
                       "w2": p["2.weight"].astype(np.float32), "b2": p["2.bias"].astype(np.float32)})
    x = np.random.default_rng(8).normal(size=(3, 4)).astype(np.float32)
    for comp in ("epsilon", "attnlrp"):
        got = onnx_lrp.Explainer(exported, composite=comp).explain(x, target=1)
        ref = onnx_lrp.Explainer(to_bytes(twin), composite=comp).explain(x, target=1)
        assert_close(got.relevance, ref.relevance, rtol=1e-5, atol=1e-7, err_msg=comp)

    def eps_rule(w, b, a, r, eps=1e-6):  # zennit's epsilon: z + eps (sign(z) + (z == 0))
        z = a @ w.T + b
        return a * ((r / (z + eps * (np.sign(z) + (z == 0)))) @ w)
    xd = x.astype(np.float64)
    pre = xd @ p["0.weight"].T + p["0.bias"]
    a = pre / (1 + np.abs(pre))
    r_y = np.zeros((3, 3))
    r_y[:, 1] = (a @ p["2.weight"].T + p["2.bias"])[:, 1]
    oracle = eps_rule(p["0.weight"], p["0.bias"], xd, eps_rule(p["2.weight"], p["2.bias"], a, r_y))
    got = onnx_lrp.Explainer(exported, composite="epsilon").explain(x, target=1)
    np.testing.assert_allclose(got.relevance, oracle, rtol=1e-4, atol=1e-6 * np.abs(oracle).max())

    one = np.array(1.0, np.float32)
    offset = make_model([node("Gemm", ["x0", "w", "b"], ["x"], name="fc", transB=1), node("Abs", ["x"], ["ax"]),
                         node("Add", ["one", "ax"], ["d"]), node("Add", ["x", "one"], ["n"]),
                         node("Div", ["n", "d"], ["y"], name="f")], {"x0": [N, 4]}, ["y"],
                        {"w": np.eye(4, dtype=np.float32), "b": np.zeros(4, np.float32), "one": one})
    assert _kinds(to_bytes(offset))["f"][0] == "offset-activation"
    with pytest.raises(onnx_lrp.UnsupportedError, match="f.*f\\(0\\) != 0"):
        onnx_lrp.Explainer(to_bytes(offset), composite="epsilon")


@pytest.mark.parametrize("left,right,gets", [("Sigmoid", "Tanh", "b"),     # LSTM: i * tanh(g) -> the tanh
                                             ("Softmax", "Relu", "b"),     # cp-lrp: the softmax is held
                                             ("Relu", "Tanh", "both")])    # alike gates share
def test_cp_holds_exactly_one_side(left, right, gets):
    """cp-lrp on a product of two gate-like factors holds the stronger gate (softmax > sigmoid > others); the
    relevance is conserved in every case (before: both held, all zeros)."""
    rng = np.random.default_rng(8)
    m = make_model([node(left, ["a"], ["fa"]), node(right, ["b"], ["fb"]), node("Mul", ["fa", "fb"], ["y"])],
                   {"a": [N, 5], "b": [N, 5]}, ["y"])
    a, b = np.abs(rng.normal(size=(2, N, 5))).astype(np.float32) + 0.1  # no zero output (LRP gives z = 0 nothing)
    res = onnx_lrp.Explainer(to_bytes(m), composite="cp-lrp", start="one-hot").explain({"a": a, "b": b})
    ra, rb = res.relevance["a"], res.relevance["b"]
    assert np.all(np.isfinite(ra)) and np.all(np.isfinite(rb))
    if gets == "b":
        assert not np.any(ra) and np.any(rb)
        np.testing.assert_allclose(rb.sum(1), 1.0, rtol=1e-5)  # start one-hot: R = 1 at the target
    else:
        np.testing.assert_allclose(ra.sum(1) + rb.sum(1), 1.0, rtol=1e-5)
        np.testing.assert_allclose(ra.sum(1), 0.5, rtol=1e-5)


def test_unrolled_lstm_cell_gates():
    """torch.nn.LSTMCell unrolled over 3 steps (TorchScript): every product of activations (f * c, i * g,
    o * tanh(c)) is a gate with the sigmoid side held (Arras et al. 2017); with zero biases and zero initial states
    every built-in composite conserves the logit (the linear maps have no bias, the cell-state sum is a sum)."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = torch.nn.LSTMCell(4, 6, bias=False)
            self.fc = torch.nn.Linear(6, 3, bias=False)

        def forward(self, x):
            h = torch.zeros(x.shape[0], 6)
            c = torch.zeros(x.shape[0], 6)
            for k in range(3):
                h, c = self.cell(x[:, k], (h, c))
            return self.fc(h)

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 3, 4)
    data = _export(net, x)
    kinds = [v[0] for n, v in _kinds(data).items() if n.endswith("Mul") or "/Mul_" in n]
    assert kinds.count("gate") == 8, kinds  # the first step's f * c multiplies a constant zero state
    with torch.no_grad():
        y = net(x).numpy()
    for comp in ALL:
        res = onnx_lrp.Explainer(data, composite=comp, **_kw(comp)).explain(x.numpy())
        np.testing.assert_allclose(res.relevance.reshape(2, -1).sum(1), y[np.arange(2), res.target], rtol=1e-3)
