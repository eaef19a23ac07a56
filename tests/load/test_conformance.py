"""Every model of the installed onnx wheel's backend test data through ``Explainer`` (tests/conformance.py):
explained (forward equal to the shipped expected outputs, finite relevance) or refused with an LrpError; never
another exception, a graph onnxruntime rejects, wrong outputs or non-finite relevance.

Default run: the node, simple, pytorch-converted and pytorch-operator models with epsilon-plus-flat and attnlrp,
the light (classic zoo) models with epsilon-plus-flat; their attnlrp run is slow-marked (large weights).
``python tests/conformance.py`` prints the table per folder and the main refusal reasons.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from util import IR_VERSION, assert_close, make_model, node

import conformance
import onnx_lrp
from onnx_lrp import load as loader

# outcomes known to be "other" and owned elsewhere: attnlrp's softmax rule on scores masked with -inf (0 * -inf in
# R = x (R_out - s sum R_out)) gives NaN relevance; the run-time non-finite check turns it into an error
KNOWN_OTHER = {
    ("test_attention_causal_boolmask_nan_robustness_expanded", "attnlrp"),
    ("test_attention_23_boolmask_fullymasked_row_nan_robustness_expanded", "attnlrp"),
    ("test_attention_4d_causal_nonpad_negative_offset_structural_empty_expanded", "attnlrp"),
    ("test_attention_23_fullymasked_qk_matmul_output_mode3_zero_expanded", "attnlrp"),
    ("test_attention_24_fullymasked_qk_matmul_output_mode3_zero_expanded", "attnlrp"),
    ("test_attention_24_qk_matmul_output_mode3_softmax_precision_expanded", "attnlrp"),
    ("test_attention_local_window_gqa_rank4_mask_expanded", "attnlrp"),
    # the same seven as Attention nodes (expanded by the loader into the same function body)
    ("test_attention_causal_boolmask_nan_robustness", "attnlrp"),
    ("test_attention_23_boolmask_fullymasked_row_nan_robustness", "attnlrp"),
    ("test_attention_4d_causal_nonpad_negative_offset_structural_empty", "attnlrp"),
    ("test_attention_23_fullymasked_qk_matmul_output_mode3_zero", "attnlrp"),
    ("test_attention_24_fullymasked_qk_matmul_output_mode3_zero", "attnlrp"),
    ("test_attention_24_qk_matmul_output_mode3_softmax_precision", "attnlrp"),
    ("test_attention_local_window_gqa_rank4_mask", "attnlrp"),
    # Sqrt of negative inputs: the expected forward output itself holds NaN, so does the relevance
    ("test_operator_sqrt", "epsilon-plus-flat"), ("test_operator_sqrt", "attnlrp"),
}

# once broken (a relevance graph onnxruntime could not run, or refused for opset > 23): now explained
MUST_EXPLAIN = ["test_concat_2d_axis_0", "test_concat_3d_axis_negative_3", "test_gather_0", "test_expand_dim_changed",
                "test_reduce_max_default_axes_keepdims_random", "test_transpose_default", "test_flatten_axis0",
                "test_unsqueeze_axis_0", "test_reshape_reordered_all_dims", "test_relu", "test_gather_elements_0",
                "test_gathernd_example_float32", "test_scatter_elements_with_axis", "test_scatternd",
                "test_top_k", "test_max_two_inputs", "test_min_two_inputs", "test_scatter_elements_with_duplicate_indices",
                "test_reduce_min_default_axes_keepdims_random", "test_identity", "test_scan9_scalar",
                "test_transpose_all_permutations_3",
                "test_depthtospace_crd_mode_example", "test_spacetodepth_example",
                # softsign written out; Resize with run-time scales / sizes, antialias, half_pixel_symmetric; Pad
                # with run-time pads
                "test_softsign_expanded_ver18", "test_resize_upsample_scales_linear",
                "test_resize_upsample_sizes_nearest", "test_resize_downsample_scales_linear_antialias",
                "test_resize_upsample_scales_linear_half_pixel_symmetric", "test_constant_pad"]
# once refused (reflect / edge Pad, Softsign written out as x / (1 + |x|), opset-6 per-channel PReLU slopes that the
# opset converter left 1-D): now explained, forward equal to the shipped expected output
MUST_EXPLAIN_CONVERTED = ["test_ReflectionPad2d", "test_ReplicationPad2d", "test_Softsign", "test_PReLU_1d_multiparam",
                          "test_PReLU_2d_multiparam", "test_PReLU_3d_multiparam"]
# explained with attnlrp only (products of activations): Attention / RotaryEmbedding / Swish nodes, inlined as
# their ONNX function by the loader
MUST_EXPLAIN_ATTNLRP = ["test_attention_4d", "test_attention_4d_gqa", "test_attention_3d_with_past_and_present",
                        "test_attention_4d_causal", "test_rotary_embedding", "test_swish"]

_cache: dict = {}


def _results(folder: str, composite: str):
    key = (folder, composite)
    if key not in _cache:
        if folder not in _cache:
            _cache[folder] = conformance.all_cases((folder,))
        _cache[key] = conformance.sweep(_cache[folder], composites=(composite,))
    return _cache[key]


def _check(results):
    print("\n" + conformance.summary(results))
    bad = [o for o in results if o.status == "other" and (o.case, o.composite) not in KNOWN_OTHER]
    assert not bad, "; ".join(f"{o.folder}/{o.case} [{o.composite}]: {o.detail[:200]}" for o in bad[:10])
    for o in results:
        if o.status == "refused":
            assert o.detail and "\n" not in o.detail, o


FAST = [(f, c) for f in ("node", "simple", "pytorch-converted", "pytorch-operator") for c in conformance.COMPOSITES]


@pytest.mark.parametrize("folder,composite", FAST, ids=[f"{f}-{c}" for f, c in FAST])
def test_conformance(folder, composite):
    results = _results(folder, composite)
    assert len(results) > 20
    _check(results)
    if folder == "node":
        status = {o.case: o.status for o in results}
        must = MUST_EXPLAIN + (MUST_EXPLAIN_ATTNLRP if composite == "attnlrp" else [])
        missing = [n for n in must if status.get(n) != "explained"]
        assert not missing, f"not explained with {composite}: {missing}"
        newer = [c for c in _cache["node"] if loader.opset_of(c.model) > loader.MAX_OPSET]
        assert sum(status[c.name] == "explained" for c in newer) >= 50  # opsets 24-28 read at opset 23
    if folder == "pytorch-converted":
        status = {o.case: o.status for o in results}
        missing = [n for n in MUST_EXPLAIN_CONVERTED if status.get(n) != "explained"]
        assert not missing, f"not explained with {composite}: {missing}"


def test_conformance_light_cnn():
    _check(_results("light", "epsilon-plus-flat"))


@pytest.mark.slow
def test_conformance_light_attnlrp():
    _check(_results("light", "attnlrp"))


# -------------------------------------------------------------------------------- newer opsets, one op each
def _at_opset(nodes, opset, x_type=TensorProto.FLOAT, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", x_type, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = IR_VERSION
    return m


@pytest.mark.parametrize("opset", [24, 25, 28])
def test_newer_opset_relabelled(opset):
    """Relu (unchanged since 14) and Reshape/Cast (newer versions only widen the types) at opsets 24-28: read at
    opset 23, LRP-0 = gradient x input."""
    shape = onnx.numpy_helper.from_array(np.array([2, 3], np.int64), "shape")
    m = _at_opset([node("Cast", ["x"], ["c"], to=TensorProto.FLOAT), node("Relu", ["c"], ["r"]),
                   node("Reshape", ["r", "shape"], ["y"])], opset, inits=[shape])
    x = np.array([[1.0, -2.0, 3.0], [-1.0, 5.0, 0.5]], np.float32)
    res = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=0.0, stabilizer=0.0).explain(x)
    np.testing.assert_array_equal(res.outputs["y"], np.maximum(x, 0))
    want = np.zeros_like(x)
    want[[0, 1], [2, 1]] = [3.0, 5.0]  # the arg-max's own value (identity path)
    np.testing.assert_array_equal(res.relevance, want)


def test_newer_opset_changed_ops_listed_at_once():
    """Ops whose newer version is not the opset-23 op (new ops without a function body, or a newer attribute set)
    are all listed."""
    axis = onnx.numpy_helper.from_array(np.array(1, np.int64), "axis")
    m = _at_opset([node("CumProd", ["x", "axis"], ["s"]), node("Cast", ["s"], ["y"], to=TensorProto.FLOAT,
                                                                round_mode="up")], 26, inits=[axis])
    with pytest.raises(onnx_lrp.UnsupportedError) as info:
        onnx_lrp.Explainer(m.SerializeToString())
    msg = str(info.value)
    assert "CumProd" in msg and "new in opset 26" in msg and "Cast" in msg and "round_mode" in msg
    assert "2 unsupported" in msg and "\n" not in msg


def test_swish_opset24_is_inlined():
    """Swish (new in opset 24, an ONNX function) is inlined as x * sigmoid(alpha x) and explained by attnlrp as
    SiLU (identity rule): the target's output value lands on its own input element, nothing elsewhere."""
    m = _at_opset([node("Swish", ["x"], ["y"], alpha=1.0)], 24)
    x = np.array([[1.0, -2.0, 3.0], [-1.0, 5.0, 0.5]], np.float32)
    res = onnx_lrp.Explainer(m.SerializeToString(), composite="attnlrp").explain(x)
    y = x / (1 + np.exp(-x))
    assert_close(res.outputs["y"], y, rtol=1e-6)
    want = np.zeros_like(x)
    want[[0, 1], [2, 1]] = y[[0, 1], [2, 1]]
    assert_close(res.relevance, want, rtol=1e-6, atol=1e-7)


def test_newer_opset_new_type_refused():
    """A tensor type that only the newer op version allows (float8e8m0 through Identity-25) is refused."""
    g = helper.make_graph([node("Cast", ["x"], ["q"], to=TensorProto.FLOAT8E8M0), node("Identity", ["q"], ["p"]),
                           node("Cast", ["p"], ["y"], to=TensorProto.FLOAT)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 25)])
    m.ir_version = IR_VERSION
    with pytest.raises(onnx_lrp.LrpError) as info:
        onnx_lrp.Explainer(m.SerializeToString())
    assert "float8e8m0" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("opset", [onnx.defs.onnx_opset_version() + 1, 99])
def test_opset_that_does_not_exist_yet_is_refused(opset):
    """Opsets above the installed onnx's highest are not read as opset 23 (nobody knows what their ops mean): one
    line naming the opset and the known ones; the highest known one is still read (test_newer_opset_relabelled)."""
    m = _at_opset([node("Relu", ["x"], ["y"])], opset)
    with pytest.raises(onnx_lrp.ModelError) as info:
        onnx_lrp.Explainer(m.SerializeToString())
    msg = str(info.value)
    assert f"imports opset {opset}, which does not exist yet" in msg and "\n" not in msg
    assert f"knows opsets up to {onnx.defs.onnx_opset_version()}" in msg and "opset 23 or lower" in msg


# ------------------------------------------------------------------------------ outputs without a batch axis
def test_output_without_batch_axis_is_one_item():
    """Concat along axis 0 of two [2, 3] inputs: the [4, 3] output has no batch axis; it is explained as one item:
    with LRP-0 the relevance is gradient x input of its maximum (which sits in exactly one input)."""
    m = make_model([node("Concat", ["x", "u"], ["c"], axis=0), node("Relu", ["c"], ["y"])],
                   {"x": [2, 3], "u": [2, 3]}, ["y"])
    x = np.array([[1.0, -2.0, 3.0], [-1.0, 5.0, 0.5]], np.float32)
    u = np.array([[0.5, 7.0, -3.0], [2.0, 1.0, 0.25]], np.float32)
    ex = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=0.0, stabilizer=0.0)
    res = ex.explain({"x": x, "u": u})
    assert res.target.tolist() == [2 * 3 + 1]  # the flat index of 7.0 in the [4, 3] output
    np.testing.assert_array_equal(res.relevance["x"], np.zeros_like(x))
    want = np.zeros_like(u)
    want[0, 1] = 7.0
    np.testing.assert_array_equal(res.relevance["u"], want)
    res = ex.explain({"x": x, "u": u}, target=4)  # 5.0 at x[1, 1]
    assert float(res.relevance["x"][1, 1]) == 5.0 and float(np.abs(res.relevance["u"]).sum()) == 0.0
