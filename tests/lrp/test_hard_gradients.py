"""HardSwish and HardSigmoid under the gradient rule (MobileNetV3's activations and squeeze-excitation gates): the true
gradient of a tiny net equals a float64 numpy oracle (central differences of the function written in numpy) on every
piece of the functions; and the gradient rule's refusal on an op without a derivative names the node and its op.

No conservation is asserted: a gradient is not relevance."""
from __future__ import annotations

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp import methods
from util import assert_close, make_model, node, to_bytes


def hard_sigmoid(x, alpha, beta):
    return np.clip(alpha * x + beta, 0.0, 1.0)


ORACLES = {
    "HardSwish": (lambda x: x * hard_sigmoid(x, 1 / 6, 0.5), {}),
    "HardSigmoid": (lambda x: hard_sigmoid(x, 0.2, 0.5), {"alpha": 0.2, "beta": 0.5}),
}
# every piece of both functions (HardSwish kinks at +-3, HardSigmoid(0.2, 0.5) at +-2.5), none within 0.1 of a kink
X = np.array([[-5.75, -4.5, -3.25, -2.75, -1.5, -0.25, 0.375, 1.25, 2.25, 2.875, 3.5, 5.25]], np.float32)
V = np.random.default_rng(3).standard_normal((12, 3)).astype(np.float32)


def _net(op, attrs):
    """y = act(x) @ V: x [N, 12] -> y [N, 3]; d y[k] / dx = f'(x) * V[:, k]."""
    return make_model([node(op, ["x"], ["a"], name="act", **attrs), node("MatMul", ["a", "v"], ["y"], name="readout")],
                      {"x": ["N", 12]}, ["y"], {"v": V})


@pytest.mark.parametrize("op", sorted(ORACLES))
def test_gradient_equals_float64_finite_differences(op):
    f, attrs = ORACLES[op]
    x = np.concatenate([X, -X[:, ::-1]])  # both signs of every piece
    h = 1e-6
    x64 = x.astype(np.float64)
    dfdx = (f(x64 + h) - f(x64 - h)) / (2 * h)  # exact on the linear / quadratic pieces up to rounding
    att = methods.Attributor(to_bytes(_net(op, attrs)), "gradient")
    for k in range(V.shape[1]):
        got = att.attribute(x, target=[k, k])
        want = dfdx * V[:, k].astype(np.float64)
        assert got.shape == x.shape
        assert_close(got, want, rtol=1e-6, atol=1e-8)
    flat = 1.0 if op == "HardSwish" else 0.2  # the slope of its linear piece: every piece was reached
    assert np.any(np.abs(dfdx) < 1e-9) and np.any(np.isclose(dfdx, flat))


def test_gradient_refusal_names_the_node_and_its_op():
    """Before: "the gradient rule is not implemented for Elu, Selu, Celu" for any op of that handler (HardSwish
    included). A refusal names the node and its own op; SiLU written out as x * sigmoid(x), once refused with an
    empty op name, now has its derivative (the gradient methods' function gradients): d/dx = s + x s (1 - s)."""
    elu = _net("Elu", {})
    with pytest.raises(onnx_lrp.UnsupportedError) as info:
        methods.Attributor(to_bytes(elu), "gradient")
    msg = str(info.value)
    assert "Elu" in msg and "[act]" in msg and "Selu" not in msg and "Celu" not in msg and "\n" not in msg
    assert "derivative of this element-wise op" in msg
    silu = make_model([node("Sigmoid", ["x"], ["s"], name="sig"), node("Mul", ["x", "s"], ["a"], name="silu"),
                       node("MatMul", ["a", "v"], ["y"], name="readout")], {"x": ["N", 12]}, ["y"], {"v": V})
    got = methods.attribute(to_bytes(silu), X, "gradient", target=1, abs=False)
    x64 = X.astype(np.float64)
    s64 = 1.0 / (1.0 + np.exp(-x64))
    assert_close(got, (s64 + x64 * s64 * (1.0 - s64)) * V[:, 1].astype(np.float64), rtol=1e-5, atol=1e-6)
