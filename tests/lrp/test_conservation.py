"""Conservation and LRP-0 = gradient x input on a small multi-layer CNN built with onnx.helper.

The network: Conv -> Relu -> MaxPool(3x3, stride 2) -> [Conv -> Relu] + [Conv] (residual Add) -> AveragePool
-> Concat with a GlobalAveragePool branch -> Flatten -> Gemm -> Relu -> Gemm.

1. With zero biases and epsilon -> 0, every rule on the linear layers (norm on sums and average pools, gradient
   on max pools and shape ops, pass on activations) conserves relevance: sum R_in = sum R_out, also at every
   intermediate tensor asked for with ``relevance_at``.
2. LRP-0 (epsilon ~ 0 on every linear layer, biases included) on this ReLU network equals gradient x input; the
   gradient is computed by central finite differences of a float64 numpy forward of the same network.
"""
from __future__ import annotations

import numpy as np
import pytest
from util import assert_close, conv_matrix, make_model, node, run, to_bytes

import onnx_lrp
from onnx_lrp.rules import parse_composite

BATCH = 2
X_SHAPE = [BATCH, 3, 11, 11]
N_OUT = 5
HIDDEN = 24


def _params(zero_bias: bool, seed=0):
    rng = np.random.default_rng(seed)

    def w(*s):
        return (rng.normal(size=s) / np.sqrt(np.prod(s[1:]))).astype(np.float32)

    def b(n):
        return np.zeros(n, np.float32) if zero_bias else (0.3 * rng.normal(size=n)).astype(np.float32)

    return {"w1": w(4, 3, 3, 3), "b1": b(4), "w2": w(4, 4, 3, 3), "b2": b(4), "w3": w(4, 4, 3, 3), "b3": b(4),
            "w4": w(HIDDEN, 20), "b4": b(HIDDEN), "w5": w(HIDDEN, N_OUT), "b5": b(N_OUT)}  # w4: transB=1


def cnn(zero_bias: bool):
    p = _params(zero_bias)
    nodes = [
        node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1"),  # 11 -> 9 (no padding: every window full)
        node("Relu", ["c1"], ["a1"], name="relu1"),
        node("MaxPool", ["a1"], ["m1"], name="pool1", kernel_shape=[3, 3], strides=[2, 2]),  # 9 -> 4
        node("Conv", ["m1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        node("Relu", ["c2"], ["a2"], name="relu2"),
        node("Conv", ["m1", "w3", "b3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
        node("Add", ["a2", "c3"], ["s"], name="residual"),
        node("AveragePool", ["s"], ["p2"], name="pool2", kernel_shape=[2, 2], strides=[2, 2]),  # 4 -> 2
        node("GlobalAveragePool", ["m1"], ["g"], name="gap"),  # [N, 4, 1, 1]
        node("Flatten", ["p2"], ["f1"], name="flatten1"),  # [N, 16]
        node("Flatten", ["g"], ["f2"], name="flatten2"),  # [N, 4]
        node("Concat", ["f1", "f2"], ["f"], name="concat", axis=1),  # [N, 20]
    ]
    nodes += [
        node("Gemm", ["f", "w4", "b4"], ["h"], name="fc1", transB=1),
        node("Relu", ["h"], ["a4"], name="relu4"),
        node("Gemm", ["a4", "w5", "b5"], ["y"], name="fc2"),
    ]
    return make_model(nodes, {"x": X_SHAPE}, ["y"], p), p


# ------------------------------------------------------------------------- numpy float64 forward (the reference)
def np_forward(p):
    """The network in float64 numpy (convolutions as dense matrices built from their definition)."""
    mats = {k: conv_matrix(p[w], sp, pads=pads)[0] for k, w, sp, pads in
            [("c1", "w1", [11, 11], None), ("c2", "w2", [4, 4], [1, 1, 1, 1]), ("c3", "w3", [4, 4], [1, 1, 1, 1])]}
    f64 = {k: v.astype(np.float64) for k, v in p.items()}

    def conv(v, k, b):
        n = v.shape[0]
        out = v.reshape(n, -1) @ mats[k].T
        side = int(round(np.sqrt(out.shape[1] // b.size)))
        return out.reshape(n, b.size, side, side) + b[None, :, None, None]

    def relu(v):
        return np.maximum(v, 0)

    def pool(v, k, s, reduce):
        h = (v.shape[2] - k) // s + 1
        out = np.empty(v.shape[:2] + (h, h))
        for i in range(h):
            for j in range(h):
                out[:, :, i, j] = reduce(v[:, :, i * s:i * s + k, j * s:j * s + k], axis=(2, 3))
        return out

    def forward(x):
        x = x.astype(np.float64)
        n = x.shape[0]
        a1 = relu(conv(x, "c1", f64["b1"]))
        m1 = pool(a1, 3, 2, np.max)
        a2 = relu(conv(m1, "c2", f64["b2"]))
        s = a2 + conv(m1, "c3", f64["b3"])
        p2 = pool(s, 2, 2, np.mean)
        g = m1.mean(axis=(2, 3))
        f = np.concatenate([p2.reshape(n, -1), g.reshape(n, -1)], axis=1)
        h = relu(f @ f64["w4"].T + f64["b4"])
        return h @ f64["w5"] + f64["b5"]

    return forward


def _composite(rule: str, params: str = "") -> object:
    return parse_composite(f"""
[[rules]]
match = {{ kind = ["activation"] }}
rule = "pass"
[[rules]]
match = {{ kind = ["sum", "avgpool"] }}
rule = "norm"
stabilizer = 1e-9
[[rules]]
match = {{ kind = ["maxpool", "shape"] }}
rule = "gradient"
[[rules]]
match = {{ kind = ["convolution", "dense", "affine"] }}
rule = "{rule}"
{params}
""", source=f"conservation-{rule}")


RULES = {
    "epsilon": 'epsilon = 1e-9',
    "zplus": 'stabilizer = 1e-9',
    "alpha-beta": 'alpha = 2.0\nbeta = 1.0\nstabilizer = 1e-9',
    "alpha-beta-1-0": 'alpha = 1.0\nbeta = 0.0\nstabilizer = 1e-9',
    "gamma": 'gamma = 0.25\nstabilizer = 1e-9',
    "flat": 'stabilizer = 1e-9',
    "wsquare": 'stabilizer = 1e-9',
    "norm": 'stabilizer = 1e-9',
}
INTERMEDIATE = ["f", "m1", "a1"]  # cuts: every path from the input to y crosses each


@pytest.fixture(scope="module")
def model_zero_bias():
    model, p = cnn(zero_bias=True)
    x = np.random.default_rng(10).normal(size=X_SHAPE).astype(np.float32)
    return to_bytes(model), p, x


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("start", ["one-hot", "logit"])
def test_conservation(model_zero_bias, rule, start):
    model, _, x = model_zero_bias
    name = "alpha-beta" if rule.startswith("alpha-beta") else rule
    ex = onnx_lrp.Explainer(model, composite=_composite(name, RULES[rule]), relevance_at=INTERMEDIATE, start=start)
    res = ex.explain(x)
    y = res.outputs["y"]
    target = y.argmax(1)
    np.testing.assert_array_equal(res.target, target)
    r0 = np.ones(BATCH) if start == "one-hot" else y[np.arange(BATCH), target].astype(np.float64)
    for where, r in [("input", res.relevance)] + [(k, res.relevance_at[k]) for k in INTERMEDIATE]:
        r = r.reshape(BATCH, -1).astype(np.float64)
        total, scale = r.sum(1), np.abs(r).sum(1)
        assert np.all(np.abs(total - r0) <= 1e-4 * np.maximum(scale, np.abs(r0))), \
            f"{rule}: sum R at {where} = {total}, want {r0}"
        assert np.all(scale > 0)


def test_biases_break_conservation():
    """The same check fails with biases (the property the test above asserts is not vacuous)."""
    model, _ = cnn(zero_bias=False)
    x = np.random.default_rng(10).normal(size=X_SHAPE).astype(np.float32)
    res = onnx_lrp.Explainer(to_bytes(model), composite=_composite("epsilon", RULES["epsilon"]),
                             start="one-hot").explain(x)
    assert np.max(np.abs(res.relevance.reshape(BATCH, -1).sum(1) - 1.0)) > 1e-2


def _grad_fd(forward, x, target, h=1e-6):
    """d y[target] / d x by central differences, every coordinate at once (stacked along the batch)."""
    x = x.astype(np.float64).reshape(BATCH, -1)
    d = x.shape[1]
    eye = h * np.eye(d)
    grads = np.empty_like(x)
    for b in range(BATCH):
        up = (x[b][None] + eye).reshape((d,) + tuple(X_SHAPE[1:]))
        down = (x[b][None] - eye).reshape((d,) + tuple(X_SHAPE[1:]))
        grads[b] = (forward(up)[:, target[b]] - forward(down)[:, target[b]]) / (2 * h)
    return grads.reshape(X_SHAPE)


@pytest.mark.parametrize("epsilon", ["0.0", "1e-9"], ids=["gradient-form", "relevance-form"])
@pytest.mark.parametrize("zero_bias", [True, False], ids=["zero-bias", "bias"])
def test_lrp0_equals_gradient_times_input(zero_bias, epsilon):
    model, p = cnn(zero_bias)
    x = np.random.default_rng(20).normal(size=X_SHAPE).astype(np.float32)
    forward = np_forward(p)
    y64 = forward(x)
    assert_close(run(model, {"x": x})[0], y64, rtol=1e-4, atol=1e-5)  # the reference is the model
    composite = _composite("epsilon", f"epsilon = {epsilon}")  # 0: relevance travels in gradient form
    res = onnx_lrp.Explainer(to_bytes(model), composite=composite).explain(x)  # start = the logit value
    target = res.target
    np.testing.assert_array_equal(target, y64.argmax(1))
    gxi = _grad_fd(forward, x, target) * x.astype(np.float64)
    err = np.linalg.norm(res.relevance - gxi) / np.linalg.norm(gxi)
    assert err < 1e-4, f"LRP-0 vs gradient x input: relative L2 error {err:.2e}"
    if zero_bias:  # and then LRP-0 conserves: sum R = f(x)
        np.testing.assert_allclose(res.relevance.reshape(BATCH, -1).sum(1), y64[np.arange(BATCH), target],
                                   rtol=1e-4)
