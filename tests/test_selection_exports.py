"""Real exports through the selection and held-scale handlers (onnx_lrp/ops/select.py, norms.py, resize.py):
a small CNN with GroupNorm, InstanceNorm, bilinear and nearest upsampling, torch.maximum, topk and gather, exported
by TorchScript (opset 18) and dynamo (opset 21, GroupNormalization), against gradient x input of the same torch
network with the normalising std detached (scripts/make_selection_goldens.py): what attnlrp computes, LRP-0 with
LXT's held scale. Ops: Conv, GroupNormalization, InstanceNormalization, Relu, Resize, Max, TopK, GatherElements,
Gemm."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import onnx_lrp

GOLD = Path(__file__).parent / "goldens"


@pytest.mark.parametrize("export", ["torchscript", "dynamo"])
def test_selection_cnn_attnlrp_equals_gradient_times_input(export):
    ref = np.load(GOLD / "selection_cnn.npz")
    ex = onnx_lrp.Explainer(str(GOLD / f"selection_cnn_{export}.onnx"), composite="attnlrp")
    res = ex.explain(ref["x"])
    np.testing.assert_allclose(res.outputs["y"], ref["y"], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(res.target, ref["target"])
    rel, want = res.relevance, ref["relevance"]
    assert np.abs(rel - want).max() <= 1e-4 * np.abs(want).max()


def test_selection_cnn_cnn_composite_names_the_norms():
    """The CNN composites give kind ``layernorm`` no rule: the norms are listed, nothing else."""
    with pytest.raises(onnx_lrp.UnsupportedError) as info:
        onnx_lrp.Explainer(str(GOLD / "selection_cnn_dynamo.onnx"), composite="epsilon-plus-flat")
    ops = {n["op_type"] for n in info.value.nodes}
    assert ops == {"GroupNormalization", "InstanceNormalization"}, info.value.nodes
