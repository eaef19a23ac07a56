"""Real exports through the selection and held-scale handlers (onnx_lrp/ops/select.py, norms.py, resize.py):
a small CNN with GroupNorm, InstanceNorm, bilinear and nearest upsampling, torch.maximum, topk and gather, exported
by TorchScript (opset 18) and dynamo (opset 21, GroupNormalization), against gradient x input of the same torch
network with the normalising std detached (scripts/make_selection_goldens.py): what attnlrp computes, LRP-0 with
LXT's held scale. Ops: Conv, GroupNormalization, InstanceNormalization, Relu, Resize, Max, TopK, GatherElements,
Gemm."""
from __future__ import annotations

import numpy as np
import pytest

import onnx_lrp
from util import GOLDENS, assert_close

GOLD = GOLDENS


@pytest.mark.parametrize("export", ["torchscript", "dynamo"])
def test_selection_cnn_attnlrp_equals_gradient_times_input(export):
    ref = np.load(GOLD / "selection_cnn.npz")
    ex = onnx_lrp.Explainer(str(GOLD / f"selection_cnn_{export}.onnx"), composite="attnlrp")
    res = ex.explain(ref["x"])
    assert_close(res.outputs["y"], ref["y"], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(res.target, ref["target"])
    rel, want = res.relevance, ref["relevance"]
    assert np.abs(rel - want).max() <= 1e-4 * np.abs(want).max()


def test_selection_cnn_cnn_composite_holds_the_norm_scale():
    """The CNN composites give the norms (kind ``layernorm``) the held-scale rule: on the dynamo export (one
    GroupNormalization op) the epsilon composite at epsilon = 0 is then LRP-0 with the std detached, the same gradient
    x input as attnlrp. (TorchScript writes GroupNorm's affine part as a Mul/Add after a reshape, which the CNN
    composites give BatchNorm's Pass, as zennit does.)"""
    ref = np.load(GOLD / "selection_cnn.npz")
    ex = onnx_lrp.Explainer(str(GOLD / "selection_cnn_dynamo.onnx"), composite="epsilon", epsilon=0.0)
    rel, want = ex.explain(ref["x"]).relevance, ref["relevance"]
    assert np.abs(rel - want).max() <= 1e-4 * np.abs(want).max()
    for export in ("torchscript", "dynamo"):
        flat = onnx_lrp.Explainer(str(GOLD / f"selection_cnn_{export}.onnx"), composite="epsilon-plus-flat")
        assert np.all(np.isfinite(flat.explain(ref["x"]).relevance))


def _twin(act_nodes):
    from util import make_model, node
    rng = np.random.default_rng(3)
    w1 = rng.normal(size=(4, 2, 3, 3)).astype(np.float32)
    w2 = rng.normal(size=(3, 4, 3, 3)).astype(np.float32)
    nodes = [node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1])] + act_nodes + [
        node("Conv", ["a", "w2"], ["k"]), node("GlobalAveragePool", ["k"], ["g"]), node("Flatten", ["g"], ["y"])]
    return make_model(nodes, {"x": [2, 2, 5, 5]}, ["y"], {"w1": w1, "w2": w2, "zero": np.array(0.0, np.float32),
                                                          "six": np.array(6.0, np.float32)}).SerializeToString()


@pytest.mark.parametrize("composite", ["epsilon-plus-flat", "epsilon-alpha2-beta1", "attnlrp"])
def test_max_min_with_constants_equal_relu_clip(composite):
    """Max(h, 0) is a Relu and Min(Max(h, 0), 6) a ReLU6 written with Max/Min (Keras Maximum/Minimum): the same
    relevance as the Relu / Clip forms under each composite."""
    from util import node
    x = np.random.default_rng(4).normal(size=(2, 2, 5, 5)).astype(np.float32)
    pairs = [([node("Max", ["h", "zero"], ["a"])], [node("Relu", ["h"], ["a"])]),
             ([node("Max", ["h", "zero"], ["m"]), node("Min", ["m", "six"], ["a"])],
              [node("Clip", ["h", "zero", "six"], ["a"])])]
    for written, op in pairs:
        r1 = onnx_lrp.Explainer(_twin(written), composite=composite).explain(x).relevance
        r2 = onnx_lrp.Explainer(_twin(op), composite=composite).explain(x).relevance
        np.testing.assert_allclose(r1, r2, rtol=1e-5, atol=1e-6 * np.abs(r2).max())


@pytest.mark.parametrize("composite", ["attnlrp", "cp-lrp"])
def test_attention_node_equals_its_torchscript_twin(composite):
    """dynamo writes scaled_dot_product_attention as one ONNX Attention node (opset 23); the loader inlines its
    ONNX function. The relevance equals the TorchScript export's (MatMul/Softmax at opset 18) of the same block."""
    import onnx

    assert "Attention" in {n.op_type for n in onnx.load(str(GOLD / "sdpa_opset23_dynamo.onnx")).graph.node}
    x = np.load(GOLD / "sdpa_x.npy")
    a = onnx_lrp.Explainer(str(GOLD / "sdpa_opset23_dynamo.onnx"), composite=composite).explain(x)
    b = onnx_lrp.Explainer(str(GOLD / "sdpa_opset18_torchscript.onnx"), composite=composite).explain(x)
    assert_close(a.outputs["y"], b.outputs["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(a.target, b.target)
    assert np.abs(a.relevance - b.relevance).max() <= 1e-5 * np.abs(b.relevance).max()
    assert np.abs(b.relevance).max() > 0


@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2"])
def test_reduce_norms_split_in_proportion(op):
    """LRP-0 through ReduceL1 / ReduceL2 (degree-1 homogeneous): R_i = |x_i| (L1), x_i^2 / ||x|| (L2) per item:
    conservative, from the formula."""
    from util import make_model, node
    m = make_model([node(op, ["x", "axes"], ["y"], keepdims=1)], {"x": [3, 5]}, ["y"],
                   {"axes": np.array([1], np.int64)}, opset=18)
    x = np.random.default_rng(5).normal(size=(3, 5)).astype(np.float32)
    res = onnx_lrp.Explainer(m.SerializeToString(), composite="attnlrp").explain(x)
    z = np.abs(x).sum(1, keepdims=True) if op == "ReduceL1" else np.sqrt((x * x).sum(1, keepdims=True))
    want = np.abs(x) if op == "ReduceL1" else x * x / z
    assert_close(res.relevance, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.relevance.sum(1), z[:, 0], rtol=1e-5)
