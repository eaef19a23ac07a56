"""Every LRP rule against a numpy oracle written from the rule's formula, on single-layer models.

A probe ``<reshape(layer(x), [1, -1]), c>`` is appended to the layer and gets the gradient rule, so the relevance
entering the layer's output is exactly R = batch * c (both signs); the layer gets the rule under test.

The formulas (zennit 0.5.1 semantics; layer z = x @ W.T + b, W: (out, in); for a convolution W is the dense
matrix of the convolution built from the (modified) kernel, and @ W its transpose; stab is zennit's stabilizer
stab(z) = z + eps * (sign(z) + (z == 0)), eps = 1e-6 unless given):

- epsilon:     R_in = x * ((R / stab(x W^T + b, eps)) W)
- zplus:       z = x+ W+^T + x- W-^T + b+,  s = R / stab(z),  R_in = x+ (s W+) + x- (s W-)
- alpha-beta:  z_a = x+ W+^T + x- W-^T + b+,  z_b = x+ W-^T + x- W+^T + b-,
               R_in = alpha (x+ (s_a W+) + x- (s_a W-)) - beta (x+ (s_b W-) + x- (s_b W+)),  s_. = R / stab(z_.)
- gamma:       W^u = W + g W+, W^d = W + g W-, same for b; out = x W^T + b (the ORIGINAL output);
               s_p = R / stab(x+ W^u^T + x- W^d^T + b^u) [out > 0], s_n = R / stab(x+ W^d^T + x- W^u^T + b^d) [out < 0],
               R_in = x+ (s_p W^u) + x- (s_p W^d) + x+ (s_n W^d) + x- (s_n W^u)
- zbox:        z = x W^T - l W+^T - h W-^T (the bias cancels), s = R / stab(z),  R_in = x (s W) - l (s W+) - h (s W-)
- wsquare:     s = R / stab(1 (W^2)^T + b^2),  R_in = s W^2  (zennit squares the bias too)
- flat:        W -> 1 (kernel of ones), bias -> 0:  s = R / stab(1 W_1^T),  R_in = s W_1
- norm (sums and average pools, no parameters):  R_in_k = x_k * (R / stab(sum_k x_k)) (transposed through the op)
- pass:        R_in = R_out
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from util import assert_close, conv_matrix, dyadic, explain_probe, make_model, node, probe_explainer, run, stab

from onnx_lrp.rules import parse_composite

BATCH = 2
_P = np.random.default_rng(4321)


def W(*shape):
    return dyadic(_P, shape)


def pos(a):
    return np.clip(a, 0, None)


def neg(a):
    return np.clip(a, None, 0)


# ------------------------------------------------------------------------------------------------ the oracle
def o_epsilon(M, K, b, x, R, eps=1e-6):
    A = M(K)
    return x * ((R / stab(x @ A.T + b, eps)) @ A)


def o_zplus(M, K, b, x, R, eps=1e-6):
    P, N = M(pos(K)), M(neg(K))
    s = R / stab(pos(x) @ P.T + neg(x) @ N.T + pos(b), eps)
    return pos(x) * (s @ P) + neg(x) * (s @ N)


def o_alpha_beta(M, K, b, x, R, alpha, beta, eps=1e-6):
    P, N = M(pos(K)), M(neg(K))
    sa = R / stab(pos(x) @ P.T + neg(x) @ N.T + pos(b), eps)
    sb = R / stab(pos(x) @ N.T + neg(x) @ P.T + neg(b), eps)
    ra = pos(x) * (sa @ P) + neg(x) * (sa @ N)
    rb = pos(x) * (sb @ N) + neg(x) * (sb @ P)
    return alpha * ra - beta * rb


def o_gamma(M, K, b, x, R, g, eps=1e-6):
    out = x @ M(K).T + b
    U, D = M(K + g * pos(K)), M(K + g * neg(K))
    bu, bd = b + g * pos(b), b + g * neg(b)
    sp = R / stab(pos(x) @ U.T + neg(x) @ D.T + bu, eps) * (out > 0)
    sn = R / stab(pos(x) @ D.T + neg(x) @ U.T + bd, eps) * (out < 0)
    return pos(x) * (sp @ U) + neg(x) * (sp @ D) + pos(x) * (sn @ D) + neg(x) * (sn @ U)


def o_zbox(M, K, b, x, R, low, high, eps=1e-6):
    A, P, N = M(K), M(pos(K)), M(neg(K))
    lo, hi = np.broadcast_to(low, x.shape), np.broadcast_to(high, x.shape)
    s = R / stab(x @ A.T - lo @ P.T - hi @ N.T, eps)
    return x * (s @ A) - lo * (s @ P) - hi * (s @ N)


def o_wsquare(M, K, b, x, R, eps=1e-6):
    A2 = M(K ** 2)
    s = R / stab(np.ones_like(x) @ A2.T + b ** 2, eps)
    return s @ A2


def o_flat(M, K, b, x, R, eps=1e-6):
    A1 = M(np.ones_like(K))
    s = R / stab(np.ones_like(x) @ A1.T, eps)
    return s @ A1


# ------------------------------------------------------------------------------------------------ the layers
@dataclass
class Layer:
    id: str
    nodes: list
    x_shape: list
    inits: dict
    kernel: np.ndarray  # the parameter the rules modify, float64
    bias: np.ndarray  # per output unit of the dense form (zeros when none)
    mat: object  # kernel -> dense matrix (out, in) for one sample
    relu_first: bool = False  # the layer's input is relu(x) (a Relu with the pass rule in front)


def dense_layer(id, x_shape, B, C=None, alpha=1.0, beta=1.0, trans_b=0, relu_first=False):
    inits = {"B": B} if C is None else {"B": B, "C": C}
    attrs = dict(alpha=alpha, beta=beta, transB=trans_b)
    xin = "r" if relu_first else "x"
    nodes = ([node("Relu", ["x"], ["r"])] if relu_first else []) + [node("Gemm", [xin] + list(inits), ["y"],
                                                                         name="layer", **attrs)]
    K = alpha * (B.astype(np.float64) if trans_b else B.astype(np.float64).T)
    n_out = K.shape[0]
    b = np.zeros(n_out) if C is None else np.broadcast_to(beta * C.astype(np.float64).reshape(-1), (n_out,))
    return Layer(id, nodes, x_shape, inits, K, b, lambda k: k, relu_first)


def matmul_bias_layer(id, x_shape, w, b=None):
    nodes = [node("MatMul", ["x", "w"], ["h" if b is not None else "y"], name="layer")]
    inits = {"w": w}
    if b is not None:
        nodes.append(node("Add", ["h", "b"], ["y"], name="bias_add"))
        inits["b"] = b
    bias = np.zeros(w.shape[1]) if b is None else b.astype(np.float64)
    return Layer(id, nodes, x_shape, inits, w.astype(np.float64).T, bias, lambda k: k)


def conv_layer(id, x_shape, w, b=None, relu_first=False, **attrs):
    inits = {"w": w} if b is None else {"w": w, "b": b}
    xin = "r" if relu_first else "x"
    nodes = ([node("Relu", ["x"], ["r"])] if relu_first else []) + [node("Conv", [xin] + list(inits), ["y"],
                                                                         name="layer", **attrs)]
    geo = dict(strides=attrs.get("strides"), pads=attrs.get("pads"), dilations=attrs.get("dilations"),
               group=attrs.get("group", 1))
    _, out_sp = conv_matrix(w, x_shape[2:], **geo)
    n_sp = int(np.prod(out_sp))
    bias = np.zeros(w.shape[0] * n_sp) if b is None else np.repeat(b.astype(np.float64), n_sp)
    cache = {}

    def mat(k):
        key = k.tobytes()
        if key not in cache:
            cache[key] = conv_matrix(k, x_shape[2:], **geo)[0]
        return cache[key]

    return Layer(id, nodes, x_shape, inits, w.astype(np.float64), bias, mat, relu_first)


def _one_signed_output(w):
    """Weights whose first output unit has no negative weight: after a Relu its beta-group (x+ W-) denominator is
    exactly 0, the case where subtracting separately transposed W and W+ cancels catastrophically."""
    w = w.copy()
    w[..., 0] = np.abs(w[..., 0]) if w.ndim == 2 else w[..., 0]
    return w


LAYERS = [
    dense_layer("gemm_bias", [BATCH, 6], W(6, 5), W(5)),
    dense_layer("gemm_alpha_beta_transB", [BATCH, 6], W(5, 6), W(1, 5), alpha=0.5, beta=2.0, trans_b=1),
    dense_layer("gemm_nobias", [BATCH, 6], W(6, 5)),
    dense_layer("relu_gemm_bias", [BATCH, 6], W(6, 5), W(5), relu_first=True),
    matmul_bias_layer("matmul_add_bias", [BATCH, 6], W(6, 4), W(4)),
    matmul_bias_layer("matmul_nobias", [BATCH, 6], W(6, 4)),
    conv_layer("conv2d_bias_pads", [BATCH, 3, 5, 5], W(4, 3, 3, 3), W(4), pads=[1, 1, 1, 1]),
    conv_layer("conv2d_stride_asym", [BATCH, 3, 6, 5], W(2, 3, 2, 3), W(2), strides=[2, 2], pads=[0, 1, 1, 0]),
    conv_layer("conv2d_groups_nobias", [BATCH, 4, 5, 5], W(4, 2, 3, 3), group=2, dilations=[1, 2],
               pads=[1, 2, 1, 2]),
    conv_layer("conv1d_bias", [BATCH, 3, 9], W(2, 3, 3), W(2), strides=[2]),
    conv_layer("relu_conv2d_bias", [BATCH, 3, 5, 5], W(4, 3, 3, 3), W(4), relu_first=True, pads=[1, 0, 1, 2]),
    dense_layer("relu_gemm_zero_denominator", [BATCH, 6], _one_signed_output(W(6, 5)), relu_first=True),
    conv_layer("relu_conv_zero_denominator", [BATCH, 2, 4, 4], np.concatenate([np.abs(W(1, 2, 2, 2)), W(2, 2, 2, 2)]),
               relu_first=True),
]

# zbox bounds: scalar, and per input channel / feature (x lies in [-2, 2])
ZBOX_SCALAR = (-2.5, 2.5)


def per_channel_bounds(layer):
    c = layer.x_shape[1]
    lo = -2.0 - 0.25 * np.arange(c)
    hi = 2.0 + 0.5 * np.arange(c)
    shape = (c,) + (1,) * (len(layer.x_shape) - 2)
    return lo.reshape(shape), hi.reshape(shape)


def _toml_array(a):
    a = np.asarray(a)
    if a.ndim == 0:
        return repr(float(a))
    return "[" + ", ".join(_toml_array(v) for v in a) + "]"


RULES = [
    ("epsilon", {}, lambda M, K, b, x, R, L: o_epsilon(M, K, b, x, R)),
    ("epsilon", {"epsilon": 0.25}, lambda M, K, b, x, R, L: o_epsilon(M, K, b, x, R, 0.25)),
    ("zplus", {}, lambda M, K, b, x, R, L: o_zplus(M, K, b, x, R)),
    ("alpha-beta", {"alpha": 2.0, "beta": 1.0}, lambda M, K, b, x, R, L: o_alpha_beta(M, K, b, x, R, 2.0, 1.0)),
    ("alpha-beta", {"alpha": 1.0, "beta": 0.0}, lambda M, K, b, x, R, L: o_alpha_beta(M, K, b, x, R, 1.0, 0.0)),
    ("gamma", {"gamma": 0.25}, lambda M, K, b, x, R, L: o_gamma(M, K, b, x, R, 0.25)),
    ("gamma", {"gamma": 1.5, "stabilizer": 0.1}, lambda M, K, b, x, R, L: o_gamma(M, K, b, x, R, 1.5, 0.1)),
    ("zbox", {"low": ZBOX_SCALAR[0], "high": ZBOX_SCALAR[1]},
     lambda M, K, b, x, R, L: o_zbox(M, K, b, x, R, *ZBOX_SCALAR)),
    ("zbox", "per-channel", None),
    ("flat", {}, lambda M, K, b, x, R, L: o_flat(M, K, b, x, R)),
    ("wsquare", {}, lambda M, K, b, x, R, L: o_wsquare(M, K, b, x, R)),
    ("wsquare", {"stabilizer": 0.5}, lambda M, K, b, x, R, L: o_wsquare(M, K, b, x, R, 0.5)),
]


def _composite(rule, params, match_kind=None):
    lines = ['[[rules]]', 'match = { name = "probe*" }', 'rule = "gradient"', '']
    if match_kind:
        lines += ['[[rules]]', f'match = {{ kind = {match_kind!r} }}'.replace("'", '"'), 'rule = "pass"', '']
    lines += ['[[rules]]', f'rule = "{rule}"'] + [f"{k} = {_toml_array(v)}" for k, v in params.items()]
    return parse_composite("\n".join(lines) + "\n", source=f"oracle-{rule}")


def _probed(nodes, inputs, inits, out, composite, feeds, rng):
    """``util.explain_probe`` of the model of ``nodes`` with dyadic output relevance: (Explanation, R entering
    ``out``, the output)."""
    model = make_model(nodes, inputs, [out], inits)
    y = run(model, feeds)[0]
    c = dyadic(rng, y.shape)
    res, R = explain_probe(model, out, c, composite, feeds if len(feeds) > 1 else next(iter(feeds.values())), BATCH)
    return res, R, y


def _close(got, want, what):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, what
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err < 2e-5, f"{what}: relative L2 error {err:.2e}"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=what)


@pytest.mark.parametrize("rule,params,oracle", RULES,
                         ids=[f"{r}-{'-'.join(f'{k}{v}' for k, v in p.items()) if isinstance(p, dict) else p}"
                              for r, p, _ in RULES])
@pytest.mark.parametrize("layer", LAYERS, ids=[lay.id for lay in LAYERS])
def test_linear_rule_oracle(layer: Layer, rule, params, oracle):
    rng = np.random.default_rng(11)
    if params == "per-channel":
        lo, hi = per_channel_bounds(layer)
        params = {"low": lo, "high": hi}

        def oracle(M, K, b, x, R, L):
            shape = L.x_shape[1:]
            return o_zbox(M, K, b, x, R, np.broadcast_to(lo, shape).reshape(-1), np.broadcast_to(hi, shape).reshape(-1))
    composite = _composite(rule, params, match_kind="activation" if layer.relu_first else None)
    x = dyadic(rng, layer.x_shape)
    res, R, y = _probed(layer.nodes, {"x": layer.x_shape}, layer.inits, "y", composite, {"x": x}, rng)
    xin = pos(x) if layer.relu_first else x
    x2 = xin.reshape(BATCH, -1).astype(np.float64)
    R2 = R.reshape(BATCH, -1)
    # the oracle's dense layer reproduces onnxruntime's forward (checks the oracle itself)
    assert_close(x2 @ layer.mat(layer.kernel).T + layer.bias, y.reshape(BATCH, -1), rtol=1e-5,
                               atol=1e-5)
    want = oracle(layer.mat, layer.kernel, layer.bias, x2, R2, layer).reshape(layer.x_shape)
    _close(res.relevance, want, f"{rule} {params} on {layer.id}")


# ------------------------------------------------------------------------------ parameter-free ops: norm
def avgpool_matrix(channels, in_sp, k, strides, pads, include_pad):
    """Average pool as a dense matrix: window sums (a depthwise conv with a kernel of ones) over the count."""
    ones = np.ones((channels, 1) + tuple(k))
    A, out_sp = conv_matrix(ones, in_sp, strides=strides, pads=pads, group=channels)
    counts = np.full(A.shape[0], float(np.prod(k))) if include_pad else A.sum(axis=1)
    return A / counts[:, None], out_sp


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("stabilizer", [1e-6, 0.25])
def test_norm_on_average_pool(include_pad, stabilizer):
    rng = np.random.default_rng(3)
    shape, k, st, pads = [BATCH, 2, 6, 7], [3, 3], [2, 2], [1, 0, 1, 1]
    nodes = [node("AveragePool", ["x"], ["y"], kernel_shape=k, strides=st, pads=pads, count_include_pad=include_pad)]
    x = dyadic(rng, shape)
    composite = _composite("norm", {"stabilizer": stabilizer})
    res, R, y = _probed(nodes, {"x": shape}, {}, "y", composite, {"x": x}, rng)
    A, _ = avgpool_matrix(2, shape[2:], k, st, pads, include_pad)
    x2, R2 = x.reshape(BATCH, -1).astype(np.float64), R.reshape(BATCH, -1)
    assert_close(x2 @ A.T, y.reshape(BATCH, -1), rtol=1e-5, atol=1e-6)
    want = x2 * ((R2 / stab(x2 @ A.T, stabilizer)) @ A)
    _close(res.relevance, want.reshape(shape), f"norm on AveragePool(count_include_pad={include_pad})")


@pytest.mark.parametrize("shapes", [([BATCH, 3, 4], [BATCH, 3, 4]), ([BATCH, 3, 4], [BATCH, 1, 4]),
                                    ([BATCH, 3, 4], [4])], ids=["same", "bcast", "rank"])
@pytest.mark.parametrize("stabilizer", [1e-6, 0.25])
def test_norm_on_add_of_activations(shapes, stabilizer):
    rng = np.random.default_rng(5)
    nodes = [node("Add", ["x", "u"], ["y"])]
    feeds = {"x": dyadic(rng, shapes[0]), "u": dyadic(rng, shapes[1])}
    composite = _composite("norm", {"stabilizer": stabilizer})
    res, R, y = _probed(nodes, {"x": shapes[0], "u": shapes[1]}, {}, "y", composite, feeds, rng)
    x, u = feeds["x"].astype(np.float64), feeds["u"].astype(np.float64)
    s = R / stab(x + u, stabilizer)
    r_u = u * s
    r_u = r_u.sum(axis=tuple(range(r_u.ndim - u.ndim))).sum(
        axis=tuple(i for i, d in enumerate(u.shape) if d == 1), keepdims=True).reshape(u.shape)
    _close(res.relevance["x"], x * s, "norm on Add, first input")
    _close(res.relevance["u"], r_u, "norm on Add, broadcast input")


def test_norm_on_sum_of_three():
    rng = np.random.default_rng(6)
    shape = [BATCH, 5]
    nodes = [node("Sum", ["x", "u", "v"], ["y"])]
    feeds = {k: dyadic(rng, shape) for k in ("x", "u", "v")}
    res, R, y = _probed(nodes, {k: shape for k in feeds}, {}, "y", _composite("norm", {}), feeds, rng)
    z = sum(v.astype(np.float64) for v in feeds.values())
    for k, v in feeds.items():
        _close(res.relevance[k], v * R / stab(z), f"norm on Sum, input {k}")


@pytest.mark.parametrize("op", ["Relu", "Tanh", "LeakyRelu", "Elu", "HardSwish"])  # f(0) = 0; Sigmoid: test_gates
def test_pass_on_activations(op):
    rng = np.random.default_rng(8)
    shape = [BATCH, 3, 4]
    x = dyadic(rng, shape)
    res, R, y = _probed([node(op, ["x"], ["y"])], {"x": shape}, {}, "y", _composite("pass", {}), {"x": x}, rng)
    np.testing.assert_array_equal(res.relevance, R.astype(np.float32))


def _conv_act_conv(act, rectified, w1, b1, w2, b2):
    """Nodes and initializers of [Relu ->] Conv(w1, b1, pads 1) -> Relu or ReLU6 (Clip 0..6) -> Conv(w2, b2)."""
    inits = {"w1": w1, "b1": b1, "w2": w2, "b2": b2, "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    xin = "r0" if rectified else "x"
    nodes = ([node("Relu", ["x"], ["r0"])] if rectified else []) + [
        node("Conv", [xin, "w1", "b1"], ["z1"], name="conv1", pads=[1, 1, 1, 1]),
        node(act, ["z1"] + (["lo", "hi"] if act == "Clip" else []), ["a1"], name="act1"),
        node("Conv", ["a1", "w2", "b2"], ["y"], name="conv2")]
    return nodes, inits


@pytest.mark.parametrize("act", ["Relu", "Clip"])
@pytest.mark.parametrize("first_relu", [False, True])
def test_gamma_before_a_rectifier(act, first_relu):
    """Gamma on a convolution whose output feeds only a Relu (or ReLU6) followed by a gamma layer: the relevance
    reaching it is zero wherever z <= 0, which the engine uses (no negative group, no mask, relu(z) + Q); the
    numpy oracle computes both groups with their masks. The input is of both signs (or rectified)."""
    rng = np.random.default_rng(5)
    w1, b1, w2, b2 = W(4, 3, 3, 3), W(4), W(2, 4, 3, 3), W(2)
    x_shape = [BATCH, 3, 6, 6]
    nodes, inits = _conv_act_conv(act, first_relu, w1, b1, w2, b2)
    composite = _composite("gamma", {"gamma": 0.25}, match_kind="activation")
    x = dyadic(rng, x_shape)
    model = make_model(nodes, {"x": x_shape}, ["y"], inits)
    c = dyadic(rng, run(model, {"x": x})[0].shape)
    ex = probe_explainer(model, "y", c, composite, BATCH)
    res, R = ex.explain(x), BATCH * c.astype(np.float64)
    m1, _ = conv_matrix(w1, [6, 6], pads=[1, 1, 1, 1])
    m2, _ = conv_matrix(w2, [6, 6])
    xin = (pos(x) if first_relu else x).reshape(BATCH, -1).astype(np.float64)
    rep = lambda b, m: np.repeat(b.astype(np.float64), m.shape[0] // len(b))  # noqa: E731
    z1 = xin @ m1.T + rep(b1, m1)
    a1 = np.clip(z1, 0, 6 if act == "Clip" else None)
    def dense(k):
        return conv_matrix(k, [6, 6], pads=[1, 1, 1, 1])[0] if k.shape == w1.shape else conv_matrix(k, [6, 6])[0]

    r_a1 = o_gamma(dense, w2.astype(np.float64), rep(b2, m2), a1, R.reshape(BATCH, -1), 0.25)
    assert np.any(r_a1 != 0) and np.any(z1 < 0)  # the shortcut has something to skip, and relevance to pass
    want = o_gamma(dense, w1.astype(np.float64), rep(b1, m1), xin, r_a1, 0.25).reshape(x_shape)
    _close(res.relevance, want, f"gamma before {act} (rectified input: {first_relu})")
    graph = onnx.load_from_string(ex.relevance_model.model_bytes).graph
    emitted = {n.output[0].split("/")[-1] for n in graph.node if n.output[0].startswith("lrp/conv1/")}
    assert "pos_s" in emitted and not any(t.startswith("neg_") for t in emitted), emitted  # no group masked to z1 < 0
    if not first_relu:
        # an input of both signs: the denominator c z + Q (c = 1 + gamma / 2) is written c (z + Q / c), the forward z
        # added to Q / c without a multiply, and Q / c read by that Add alone (onnxruntime fuses it into Q's conv)
        assert "pos_zc" not in emitted, sorted(emitted)
        add = next(n for n in graph.node if n.output[0] == "lrp/conv1/pos_z")
        q = [v for v in add.input if v != "z1"]
        assert add.op_type == "Add" and "z1" in add.input and len(q) == 1, add
        assert [n.output[0] for n in graph.node if q[0] in n.input] == ["lrp/conv1/pos_z"]


@pytest.mark.parametrize("act", ["Relu", "Clip"])
@pytest.mark.parametrize("rule,rectified", [("epsilon", False), ("zplus", True), ("zplus", False)])
def test_biased_conv_before_a_rectifier(act, rule, rectified):
    """A biased convolution whose output feeds only a Relu (or ReLU6), then another layer of the same rule: the
    engine writes epsilon's denominator as relu(z) + eps (its own bias is in z already: no sign passes) and z+'s as
    conv(x+, W+) + conv(x-, W-) with b+ + eps as the first one's bias; the numpy oracle computes zennit's
    formulas on the dense matrices. Negative biases give z < 0 and relevance that must vanish there. The input is
    rectified (one z+ term, as after a ReLU in ResNet) or of both signs (MobileNetV2's linear bottlenecks)."""
    rng = np.random.default_rng(11)
    w1, b1, w2, b2 = W(4, 3, 3, 3), W(4), W(2, 4, 3, 3), W(2)
    b1[0], b1[1] = -abs(b1[0]) - 0.5, abs(b1[1]) + 0.5  # a bias of each sign
    x_shape = [BATCH, 3, 6, 6]
    nodes, inits = _conv_act_conv(act, rectified, w1, b1, w2, b2)
    composite = _composite(rule, {}, match_kind="activation")
    x = dyadic(rng, x_shape)
    model = make_model(nodes, {"x": x_shape}, ["y"], inits)
    c = dyadic(rng, run(model, {"x": x})[0].shape)
    ex = probe_explainer(model, "y", c, composite, BATCH)
    res, R = ex.explain(x), BATCH * c.astype(np.float64)
    m1, _ = conv_matrix(w1, [6, 6], pads=[1, 1, 1, 1])
    m2, _ = conv_matrix(w2, [6, 6])
    rep = lambda b, m: np.repeat(b.astype(np.float64), m.shape[0] // len(b))  # noqa: E731
    xin = (pos(x) if rectified else x).reshape(BATCH, -1).astype(np.float64)
    z1 = xin @ m1.T + rep(b1, m1)
    a1 = np.clip(z1, 0, 6 if act == "Clip" else None)
    oracle = o_epsilon if rule == "epsilon" else o_zplus
    r_a1 = oracle(lambda k: k, m2, rep(b2, m2), a1, R.reshape(BATCH, -1))
    assert np.any(r_a1 != 0) and np.any(z1 < 0) and (act == "Relu" or np.any(z1 > 6))
    want = oracle(lambda k: k, m1, rep(b1, m1), xin, r_a1).reshape(x_shape)
    _close(res.relevance, want, f"{rule} on a biased conv before {act}")
    graph = onnx.load_from_string(ex.relevance_model.model_bytes).graph
    emitted = {n.output[0].split("/")[-1]: n for n in graph.node if n.output[0].startswith("lrp/conv1/")}
    assert not any(t.startswith("g0_stab_gain") or t == "g0_zb" for t in emitted), sorted(emitted)
    if rule == "zplus":  # z+ = conv(x+, W+) + b+ + eps from one convolution whose bias is b+ + eps
        conv = emitted["z"]
        b_eps = next(onnx.numpy_helper.to_array(t) for t in graph.initializer if t.name == conv.input[2])
        np.testing.assert_array_equal(b_eps, pos(b1) + np.float32(1e-6))


@pytest.mark.parametrize("strides", [[1, 1], [2, 2]])
def test_flat_transpose_sums_channels_first(strides):
    """Flat on a convolution: every (output, input) channel pair holds the kernel of ones, so the transpose sums the
    output channels first and transposes one channel (a ConvTranspose / Conv with cin x cout times fewer products);
    the relevance equals the numpy oracle's, and the emitted graph transposes a single channel."""
    rng = np.random.default_rng(12)
    layer = conv_layer("flat_conv", [BATCH, 3, 7, 7], W(5, 3, 3, 3), W(5), strides=strides, pads=[1, 1, 1, 1])
    x = dyadic(rng, layer.x_shape)
    model = make_model(layer.nodes, {"x": layer.x_shape}, ["y"], layer.inits)
    c = dyadic(rng, run(model, {"x": x})[0].shape)
    ex = probe_explainer(model, "y", c, _composite("flat", {}), BATCH)
    res, R = ex.explain(x), BATCH * c.astype(np.float64)
    want = o_flat(layer.mat, layer.kernel, layer.bias, x.reshape(BATCH, -1).astype(np.float64), R.reshape(BATCH, -1))
    _close(res.relevance, want.reshape(layer.x_shape), f"flat, strides {strides}")
    graph = onnx.load_from_string(ex.relevance_model.model_bytes).graph
    jts = [n for n in graph.node if n.output[0] == "lrp/layer/JTs"]
    assert len(jts) == 1 and jts[0].op_type in ("Conv", "ConvTranspose"), [n.output[0] for n in graph.node]
    kernel = next(onnx.numpy_helper.to_array(t) for t in graph.initializer if t.name == jts[0].input[1])
    assert kernel.shape[:2] == (1, 1), kernel.shape


@pytest.mark.parametrize("bounds", ["scalar", "per-channel", "per-pixel"])
def test_zbox_folds_channel_bounds_into_one_transpose(bounds):
    """zbox on a convolution: R = x J^T(s; W) - l J^T(s; W+) - h J^T(s; W-). Bounds constant along the spatial axes
    (scalar, or per channel as from --mean/--std) fold into the weights of ONE transpose (2 in all instead of 3);
    bounds that vary per pixel keep their own. The relevance equals the numpy oracle's either way."""
    rng = np.random.default_rng(13)
    layer = conv_layer("box_conv", [BATCH, 3, 6, 6], W(4, 3, 3, 3), W(4), strides=[2, 2], pads=[1, 1, 1, 1])
    if bounds == "scalar":
        lo, hi = np.float32(-2.5), np.float32(2.5)
    elif bounds == "per-channel":
        lo, hi = per_channel_bounds(layer)
    else:
        lo = -2.0 - 0.125 * np.arange(3 * 36, dtype=np.float64).reshape(3, 6, 6)
        hi = -lo
    x = dyadic(rng, layer.x_shape)
    model = make_model(layer.nodes, {"x": layer.x_shape}, ["y"], layer.inits)
    c = dyadic(rng, run(model, {"x": x})[0].shape)
    ex = probe_explainer(model, "y", c, _composite("zbox", {"low": lo, "high": hi}), BATCH)
    res, R = ex.explain(x), BATCH * c.astype(np.float64)
    shape = layer.x_shape[1:]
    want = o_zbox(layer.mat, layer.kernel, layer.bias, x.reshape(BATCH, -1).astype(np.float64), R.reshape(BATCH, -1),
                  np.broadcast_to(lo, shape).reshape(-1), np.broadcast_to(hi, shape).reshape(-1))
    _close(res.relevance, want.reshape(layer.x_shape), f"zbox, {bounds} bounds")
    graph = onnx.load_from_string(ex.relevance_model.model_bytes).graph
    ops = [n.op_type for n in graph.node if n.output[0].startswith("lrp/layer/JTs")]
    assert len(ops) == (3 if bounds == "per-pixel" else 2), ops


@pytest.mark.parametrize("gamma", [0.25, 1.5])
def test_gamma_second_group_reads_the_first(gamma):
    """Gamma on a biased convolution of a rectified input whose output feeds no Relu (ResNet's last conv of a block):
    the group masked to z < 0 writes (1 + g) z - Q as (2 + g) z - (z + Q) from the other group's sum, so Q's
    convolution feeds one Add (which onnxruntime fuses into it). The relevance equals the numpy oracle's (biases of
    both signs give z of both signs), and the emitted Q is read once."""
    rng = np.random.default_rng(14)
    b = W(4)
    b[0], b[1] = -abs(b[0]) - 0.5, abs(b[1]) + 0.5
    layer = conv_layer("gamma_conv", [BATCH, 3, 6, 6], W(4, 3, 3, 3), b, relu_first=True, pads=[1, 1, 1, 1])
    x = dyadic(rng, layer.x_shape)
    model = make_model(layer.nodes, {"x": layer.x_shape}, ["y"], layer.inits)
    y = run(model, {"x": x})[0]
    assert np.any(y > 0) and np.any(y < 0)
    c = dyadic(rng, y.shape)
    ex = probe_explainer(model, "y", c, _composite("gamma", {"gamma": gamma}, match_kind="activation"), BATCH)
    res, R = ex.explain(x), BATCH * c.astype(np.float64)
    want = o_gamma(layer.mat, layer.kernel, layer.bias, pos(x).reshape(BATCH, -1).astype(np.float64),
                   R.reshape(BATCH, -1), gamma)
    _close(res.relevance, want.reshape(layer.x_shape), f"gamma {gamma} on a conv of a rectified input")
    graph = onnx.load_from_string(ex.relevance_model.model_bytes).graph
    by_out = {n.output[0]: n for n in graph.node}
    assert list(by_out["lrp/layer/neg_z"].input)[1] == "lrp/layer/pos_z", by_out["lrp/layer/neg_z"].input
    readers = [n.output[0] for n in graph.node if "lrp/layer/z" in n.input]
    assert readers == ["lrp/layer/pos_z"], readers


@pytest.mark.parametrize("rule", ["epsilon", "zplus", "gamma"])
def test_fork_sums_in_gradient_form(rule):
    """A residual block, h = relu(conv_a(relu(x))); y = conv_d(relu(conv_c(relu(conv_b(h))) + h)), with the rule on
    every convolution and epsilon on the sum: h feeds conv_b and the sum, and its two relevance parts h J^T s are
    summed before one multiply by h (not h x each, then a sum). The relevance equals the numpy oracle's, which
    computes each part as zennit does; one Mul of the relevance graph reads h."""
    rng = np.random.default_rng(15)
    sp, pads = [5, 5], [1, 1, 1, 1]
    ws = {k: (W(3, 3, 3, 3), W(3)) for k in "abc"}
    ws["d"] = (W(2, 3, 3, 3), W(2))
    inits = {f"w{k}": w for k, (w, _) in ws.items()} | {f"b{k}": b for k, (_, b) in ws.items()}
    nodes = [node("Relu", ["x"], ["h0"]),
             node("Conv", ["h0", "wa", "ba"], ["za"], name="conv_a", pads=pads), node("Relu", ["za"], ["h"]),
             node("Conv", ["h", "wb", "bb"], ["zb"], name="conv_b", pads=pads), node("Relu", ["zb"], ["g1"]),
             node("Conv", ["g1", "wc", "bc"], ["zc"], name="conv_c", pads=pads),
             node("Add", ["zc", "h"], ["sum"], name="add"), node("Relu", ["sum"], ["y2"]),
             node("Conv", ["y2", "wd", "bd"], ["y"], name="conv_d", pads=pads)]
    params = {"gamma": 0.25} if rule == "gamma" else {}
    text = "\n".join(['[[rules]]', 'match = { name = "probe*" }', 'rule = "gradient"', '',
                      '[[rules]]', 'match = { kind = "activation" }', 'rule = "pass"', '',
                      '[[rules]]', 'match = { kind = "sum" }', 'rule = "epsilon"', '',
                      '[[rules]]', f'rule = "{rule}"'] + [f"{k} = {v}" for k, v in params.items()]) + "\n"
    composite = parse_composite(text, source=f"oracle-fork-{rule}")
    x_shape = [BATCH, 3] + sp
    x = dyadic(rng, x_shape)
    model = make_model(nodes, {"x": x_shape}, ["y"], inits)
    c = dyadic(rng, run(model, {"x": x})[0].shape)
    ex = probe_explainer(model, "y", c, composite, BATCH)
    res, R = ex.explain(x), BATCH * c.astype(np.float64)

    mat = lambda k: conv_matrix(k, sp, pads=pads)[0]  # noqa: E731
    rep = lambda b: np.repeat(b.astype(np.float64), np.prod(sp))  # noqa: E731
    def step(k, x_in, r):
        w, b = (a.astype(np.float64) for a in ws[k])
        if rule == "gamma":
            return o_gamma(mat, w, rep(b), x_in, r, 0.25)
        return (o_epsilon if rule == "epsilon" else o_zplus)(mat, w, rep(b), x_in, r)
    fwd = lambda k, x_in: x_in @ mat(ws[k][0].astype(np.float64)).T + rep(ws[k][1])  # noqa: E731
    h0 = pos(x.reshape(BATCH, -1).astype(np.float64))
    h = pos(fwd("a", h0))
    g1 = pos(fwd("b", h))
    zc = fwd("c", g1)
    y2 = pos(zc + h)
    r_y2 = step("d", y2, R.reshape(BATCH, -1))
    s_add = r_y2 / stab(zc + h)
    r_h = step("b", h, step("c", g1, zc * s_add)) + h * s_add
    assert np.any(r_y2 != 0) and np.all(np.abs(zc + h) > 1e-3)  # relevance to pass; no tie near zero in the sum
    _close(res.relevance, step("a", h0, r_h).reshape(x_shape), f"{rule} on a residual block")
    graph = onnx.load_from_string(ex.relevance_model.model_bytes).graph
    readers = [n.output[0] for n in graph.node if n.op_type == "Mul" and "h" in n.input and n.output[0].startswith("lrp/")]
    assert len(readers) == 1, readers


@pytest.mark.parametrize("rule", ["epsilon", "gamma"])
def test_relevance_of_z_in_gradient_form(rule):
    """conv1 (the rule) -> conv2 (epsilon) with no rectifier between (a linear bottleneck, or a block's last conv
    before its sum): conv2 gives conv1's output z1 the relevance z1 J^T s in gradient form, and conv1's step uses it:
    epsilon's stabiliser of either sign as s = g |z1| / (|z1| + eps) (no sign passes), gamma's masks as
    max(z1, 0) g and min(z1, 0) g (no mask passes). The relevance equals the numpy oracle's (zennit's formulas)."""
    rng = np.random.default_rng(16)
    sp, pads = [5, 5], [1, 1, 1, 1]
    (w1, b1), (w2, b2) = (W(4, 3, 3, 3), W(4)), (W(2, 4, 3, 3), W(2))
    nodes = [node("Relu", ["x"], ["h0"]),
             node("Conv", ["h0", "w1", "b1"], ["z1"], name="conv1", pads=pads),
             node("Conv", ["z1", "w2", "b2"], ["y"], name="conv2", pads=pads)]
    x_shape = [BATCH, 3] + sp
    x = dyadic(rng, x_shape)
    model = make_model(nodes, {"x": x_shape}, ["y"], {"w1": w1, "b1": b1, "w2": w2, "b2": b2})
    c = dyadic(rng, run(model, {"x": x})[0].shape)
    text = "\n".join(['[[rules]]', 'match = { name = "probe*" }', 'rule = "gradient"', '',
                      '[[rules]]', 'match = { kind = "activation" }', 'rule = "pass"', '',
                      '[[rules]]', 'match = { name = "conv2" }', 'rule = "epsilon"', '',
                      '[[rules]]', f'rule = "{rule}"'] + (["gamma = 0.25"] if rule == "gamma" else [])) + "\n"
    ex = probe_explainer(model, "y", c, parse_composite(text, source=f"oracle-z-{rule}"), BATCH)
    res, R = ex.explain(x), BATCH * c.astype(np.float64)
    mat = lambda k: conv_matrix(k, sp, pads=pads)[0]  # noqa: E731
    rep = lambda b: np.repeat(b.astype(np.float64), np.prod(sp))  # noqa: E731
    h0 = pos(x.reshape(BATCH, -1).astype(np.float64))
    z1 = h0 @ mat(w1.astype(np.float64)).T + rep(b1)
    assert np.any(z1 > 0) and np.any(z1 < 0)
    r_z1 = o_epsilon(mat, w2.astype(np.float64), rep(b2), z1, R.reshape(BATCH, -1))
    want = o_gamma(mat, w1.astype(np.float64), rep(b1), h0, r_z1, 0.25) if rule == "gamma" else \
        o_epsilon(mat, w1.astype(np.float64), rep(b1), h0, r_z1)
    _close(res.relevance, want.reshape(x_shape), f"{rule} on conv1 -> conv2")
    emitted = {n.output[0].split("/")[-1] for n in onnx.load_from_string(ex.relevance_model.model_bytes).graph.node
               if n.output[0].startswith("lrp/conv1/")}
    if rule == "epsilon":
        assert "g0_ratio" in emitted and not any(t.startswith("g0_stab_gain") for t in emitted), sorted(emitted)
    else:
        assert {"z_pos", "z_neg"} <= emitted and not any(t.endswith("_mask") for t in emitted), sorted(emitted)
