"""Flax (nnx) CNNs with pooling, crops and residual blocks as jax2onnx 0.17 writes them (issue 17), at opsets 17 and
23: LRP-0 (``epsilon`` with epsilon = 0 and stabilizer 0, started from the logit) equals JAX's own float64 gradient
x input on these piecewise-linear networks. The models and references are committed
(scripts/make_flax_twins.py), so no JAX is needed here.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import onnx_lrp
from test_framework_twins import LRP0, rel_l2

TWINS = Path(__file__).parent / "goldens" / "flax_twins"
NETS = ("pool_res_crop", "avg_proj_crop", "max_res_crop")
# LRP-0 on every linear layer, the unfoldable BatchNorms included (the built-in composites give kind "batchnorm"
# zennit's Pass, which is not gradient x input: preact_res is 32x off with `epsilon` at epsilon = 0): the framework
# twins' LRP-0 composite, whose last entry gives every other kind epsilon = 0
LRP0_ALL = LRP0


def _explain(net, opset, composite, **params):
    path = TWINS / f"{net}_op{opset}.onnx"
    assert onnx.load(str(path), load_external_data=False).opset_import[0].version == opset
    golden = np.load(TWINS / f"{net}.npz")
    res = onnx_lrp.Explainer(str(path), composite=composite, start="logit", **params).explain(
        golden["x"], target=golden["target"])
    return res, golden


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("net", NETS)
def test_flax_cnn_lrp0_equals_float64_gradient_x_input(net, opset):
    """The built-in ``epsilon`` composite at epsilon = 0, stabilizer 0 (every BatchNorm here is folded)."""
    res, golden = _explain(net, opset, "epsilon", epsilon=0.0, stabilizer=0.0)
    np.testing.assert_allclose(res.outputs["y"], golden["logits"], rtol=1e-4, atol=1e-5)
    assert rel_l2(res.relevance, golden["gxi"]).max() <= 1e-5


@pytest.mark.parametrize("opset", [17, 23])
def test_flax_preactivation_resnet_lrp0_on_its_batchnorms_equals_gradient_x_input(opset):
    """Pre-activation blocks: the BatchNorms after the residual sums cannot be folded; LRP-0 on them too (LRP0_ALL)
    is gradient x input."""
    res, golden = _explain("preact_res", opset, LRP0_ALL)
    np.testing.assert_allclose(res.outputs["y"], golden["logits"], rtol=1e-4, atol=1e-5)
    assert rel_l2(res.relevance, golden["gxi"]).max() <= 1e-5
