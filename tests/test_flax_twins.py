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

TWINS = Path(__file__).parent / "goldens" / "flax_twins"
NETS = ("pool_res_crop", "avg_proj_crop", "max_res_crop")


def rel_l2(a, b) -> np.ndarray:
    a = np.asarray(a, np.float64).reshape(len(a), -1)
    b = np.asarray(b, np.float64).reshape(len(b), -1)
    return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("net", NETS)
def test_flax_cnn_lrp0_equals_float64_gradient_x_input(net, opset):
    path = TWINS / f"{net}_op{opset}.onnx"
    assert onnx.load(str(path), load_external_data=False).opset_import[0].version == opset
    golden = np.load(TWINS / f"{net}.npz")
    res = onnx_lrp.Explainer(str(path), composite="epsilon", epsilon=0.0, stabilizer=0.0,
                             start="logit").explain(golden["x"], target=golden["target"])
    np.testing.assert_allclose(res.outputs["y"], golden["logits"], rtol=1e-4, atol=1e-5)
    assert rel_l2(res.relevance, golden["gxi"]).max() <= 1e-5
