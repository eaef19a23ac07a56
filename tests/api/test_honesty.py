"""Every answer is right or refused (issue 9): structural honesty (no path cut silently), numeric honesty (no NaN/Inf
returned, the first node named), ZBox without silent bounds, and the malformed models the fuzzer found (each
refused with an LrpError, never another exception).

References: a numpy LRP-epsilon of a one-layer model (the relevance when nothing is wrong), the conservation of
LRP-0 on a linear model, the forward computed in numpy.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from util import IR_VERSION, assert_close, make_model, node

import onnx_lrp
from onnx_lrp import InputError, ModelError, NumericError, UnsupportedError

RNG = np.random.default_rng(5)
W1 = RNG.standard_normal((4, 4)).astype(np.float32)
W2 = RNG.standard_normal((3, 4)).astype(np.float32)
X = RNG.standard_normal((2, 4)).astype(np.float32)


def with_custom_op(domain, op_type):
    """Gemm -> <domain>::<op_type> -> Gemm; shape inference cannot type the custom op's output."""
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1, name="g1"),
             helper.make_node(op_type, ["h"], ["i"], domain=domain, name="custom"),
             helper.make_node("Gemm", ["i", "w2", "b2"], ["y"], transB=1, name="g2")]
    inits = [numpy_helper.from_array(a, n) for n, a in
             (("w", W1), ("b", np.zeros(4, np.float32)), ("w2", W2), ("b2", np.zeros(3, np.float32)))]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    model.ir_version = IR_VERSION
    return model.SerializeToString()


# ------------------------------------------------------------------------------------------ structural honesty
@pytest.mark.parametrize("domain,op_type", [("com.microsoft", "Inverse"), ("com.example", "Foo")])
def test_an_op_of_unknown_output_type_is_refused_not_cut(domain, op_type):
    """Before: the custom op's output had no dtype, so relevance stopped there (an all-zero map, no error)."""
    with pytest.raises(UnsupportedError) as err:
        onnx_lrp.Explainer(with_custom_op(domain, op_type), composite="epsilon")
    assert f"1 x {domain}::{op_type} (opset 1) [custom]: no handler for this op" in str(err.value)
    assert [n["name"] for n in err.value.nodes] == ["custom"]


def test_a_custom_op_mapped_in_no_composite_is_listed_by_plan():
    from onnx_lrp import load as loader
    from onnx_lrp.lrp import rewriter
    from onnx_lrp.rules.composite import load_composite
    p = rewriter.plan(loader.load(with_custom_op("com.example", "Foo")), load_composite("epsilon"))
    assert [a.node.name for a in p.unsupported] == ["custom"]
    assert all(a.on_path for a in p.assignments)


def test_no_path_from_any_input_is_refused_naming_the_cut():
    """The output depends on the input only through an integer cast: nothing can be explained (before: zeros)."""
    m = make_model([node("Cast", ["x"], "xi", to=TensorProto.INT64), node("Cast", ["xi"], "xf", to=TensorProto.FLOAT),
                    node("Gemm", ["xf", "w", "b"], "y", transB=1)], {"x": ["N", 4]}, ["y"],
                   {"w": W2, "b": np.zeros(3, np.float32)})
    with pytest.raises(UnsupportedError, match=r"no relevance path from any input to 'y'.*Cast_xi \(Cast\) turns a "
                                               r"float activation into int64"):
        onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon")


# ------------------------------------------------------------------------------------------- numeric honesty
def gemm_model(w, b, beta=1.0):
    return make_model([node("Gemm", ["x", "w", "b"], "y", transB=1, beta=beta)], {"x": ["N", w.shape[1]]}, ["y"],
                      {"w": w, "b": b}).SerializeToString()


def test_finite_results_are_unchanged_by_the_check():
    """The check costs one reduction and changes nothing: LRP-epsilon of one Gemm from the formula."""
    b = np.full(3, 0.5, np.float32)
    res = onnx_lrp.Explainer(gemm_model(W2, b), composite="epsilon").explain(X, start="one-hot", target=1)
    z = X.astype(np.float64) @ W2.T.astype(np.float64) + b
    stab = z[:, 1] + 1e-6 * (np.sign(z[:, 1]) + (z[:, 1] == 0))
    assert_close(res.relevance, X * W2[1] / stab[:, None], rtol=1e-4, atol=1e-6)


def test_relevance_overflow_with_a_finite_forward_names_the_node_and_rule():
    """x = (3e38, -3e38), w = (1, 1), b = 0.5: the forward is 0.5, but x_i w_i / z overflows float32."""
    m = gemm_model(np.ones((1, 2), np.float32), np.array([0.5], np.float32))
    ex = onnx_lrp.Explainer(m, composite="epsilon")
    x = np.array([[1.0, 2.0], [3e38, -3e38]], np.float32)
    np.testing.assert_allclose(ex.explain(x[:1]).outputs["y"], [[3.5]])  # a finite item is fine
    with pytest.raises(NumericError, match=r"relevance 'lrp/relevance/x' for batch item 1: first at node Gemm_y "
                                           r"\(Gemm\) under rule 'epsilon'; its forward values are finite"):
        ex.explain(x, start="one-hot")


def test_a_nan_weight_names_the_first_non_finite_forward_node():
    w = W1.copy()
    w[2, 1] = np.nan
    m = make_model([node("Gemm", ["x", "w1", "b1"], "h", transB=1), node("Relu", ["h"], "a"),
                    node("Gemm", ["a", "w2", "b2"], "y", transB=1)], {"x": ["N", 4]}, ["y"],
                   {"w1": w, "b1": np.zeros(4, np.float32), "w2": W2, "b2": np.zeros(3, np.float32)})
    # a forward pass already non-finite comes from what was given (here a NaN weight): bad input, exit 2 (issue 37)
    with pytest.raises(InputError, match=r"non-finite \(NaN/Inf\) output 'y' for batch item 0: the forward pass "
                                           r"is already non-finite at node Gemm_h \(Gemm, output 'h'\)"):
        onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon").explain(X)


def test_gemm_beta_nan_is_refused():
    """Before: relevance NaN, returned without a word."""
    with pytest.raises(UnsupportedError, match="Gemm_y.*alpha or beta is not finite"):
        onnx_lrp.Explainer(gemm_model(W2, np.ones(3, np.float32), beta=float("nan")), composite="epsilon")


# ------------------------------------------------------------------------------------------------- ZBox bounds
def conv_model(channels=3):
    w = RNG.standard_normal((2, channels, 3, 3)).astype(np.float32)
    return make_model([node("Conv", ["x", "w"], "c", pads=[1, 1, 1, 1]), node("Relu", ["c"], "r"),
                       node("GlobalAveragePool", ["r"], "g"), node("Flatten", ["g"], "y")],
                      {"x": ["N", channels, 4, 4]}, ["y"], {"w": w}).SerializeToString()


def test_zbox_needs_bounds_and_they_must_fit_the_channels():
    with pytest.raises(InputError, match=r"composite 'epsilon-gamma-box' applies zbox to node Conv_c \(Conv\) but "
                                         r"has no input bounds: .*--mean/--std.*low = \(0 - mean\) / std"):
        onnx_lrp.Explainer(conv_model(), composite="epsilon-gamma-box")
    with pytest.raises(InputError, match="has no input bounds"):
        onnx_lrp.Explainer(conv_model(), composite="epsilon-gamma-box", low=0.0)  # both are needed
    with pytest.raises(InputError, match=r"zbox bound low of shape \[2, 1, 1\] does not fit .* one per channel "
                                         r"shaped \[3, 1, 1\]"):
        onnx_lrp.Explainer(conv_model(), composite="epsilon-gamma-box", low=np.zeros((2, 1, 1)), high=1.0)
    x = RNG.uniform(0, 1, (2, 3, 4, 4)).astype(np.float32)
    model = conv_model()
    per_channel = onnx_lrp.Explainer(model, composite="epsilon-gamma-box", low=np.zeros((3, 1, 1)),
                                     high=np.ones((3, 1, 1))).explain(x).relevance
    scalar = onnx_lrp.Explainer(model, composite="epsilon-gamma-box", low=0.0, high=1.0).explain(x).relevance
    assert np.abs(scalar).sum() > 0
    assert_close(per_channel, scalar, rtol=1e-5, atol=1e-7)
    # a flat list is one value per channel, as --low a,b,c (shaped [3, 1, 1], not broadcast along the width)
    flat = onnx_lrp.Explainer(model, composite="epsilon-gamma-box", low=[0.0, 0.0, 0.0], high=[1.0] * 3)
    assert_close(flat.explain(x).relevance, per_channel, rtol=1e-6)


@pytest.mark.parametrize("params,message", [
    ({"epsilon": "abc"}, "epsilon must be a number, not str 'abc'"),
    ({"epsilon": float("nan")}, "epsilon must be finite"),
    ({"epsilon": True}, "epsilon must be a number, not bool"),
])
def test_rule_parameters_are_type_checked(params, message):
    with pytest.raises(InputError, match=message):
        onnx_lrp.Explainer(gemm_model(W2, np.ones(3, np.float32)), composite="epsilon", **params)


# -------------------------------------------------------------------------------- malformed models and inputs
def test_empty_batch_is_refused():
    with pytest.raises(InputError, match=r"the batch is empty \(0 items\)"):
        onnx_lrp.Explainer(gemm_model(W2, np.ones(3, np.float32)), composite="epsilon").explain(X[:0])


def test_relevance_at_a_graph_input_equals_its_relevance():
    ex = onnx_lrp.Explainer(gemm_model(W2, np.ones(3, np.float32)), composite="epsilon", relevance_at=["x"])
    res = ex.explain(X)
    np.testing.assert_array_equal(res.relevance_at["x"], res.relevance)


def _edit(model_bytes, edit):
    m = onnx.load_model_from_string(model_bytes)
    edit(m)
    return m.SerializeToString()


def _attr(name, value, i=0):
    def edit(m):
        n = m.graph.node[i]
        for a in list(n.attribute):
            if a.name == name:
                n.attribute.remove(a)
        n.attribute.append(helper.make_attribute(name, value))
    return edit


@pytest.mark.parametrize("case,edit,error,message", [
    ("conv group 0 (was ZeroDivisionError)", _attr("group", 0), UnsupportedError, "malformed: group=0"),
    ("conv group 7 (was 'cannot reshape')", _attr("group", 7), UnsupportedError, "do not split into group=7"),
    ("conv strides 0", _attr("strides", [0, 0]), UnsupportedError, r"malformed: strides=\[0, 0\]"),
    ("conv kernel larger than the input", _attr("pads", [0, 0, 0, 0]),
     None, None),
    ("conv input of int32 (was IndexError)", lambda m: setattr(m.graph.input[0].type.tensor_type, "elem_type",
                                                                TensorProto.INT32),
     ModelError, "Conv_c.*unsupported type: tensor\\(int32\\)"),
    ("input rank changed", lambda m: m.graph.input[0].type.tensor_type.shape.dim.pop(),
     ModelError, r"the shapes do not fit at node Conv_c \(Conv: Number of spatial dimensions in the weight tensor "
                 r"\(2\) does not match .* declared input shape\(s\) x Nx3x4"),
    ("dimension 2**30 (was MemoryError)", lambda m: setattr(m.graph.input[0].type.tensor_type.shape.dim[2],
                                                            "dim_value", 2 ** 30),
     ModelError, "more than 1073741824 elements per item"),
    ("empty input axis (was ZeroDivisionError)", lambda m: setattr(m.graph.input[0].type.tensor_type.shape.dim[2],
                                                                   "dim_value", 0),
     ModelError, "has an empty axis"),
])
def test_malformed_models_found_by_the_fuzzer_are_refused(case, edit, error, message):
    if error is None:  # pads 0 on a 4x4 input is fine (3x3 kernel); on 2x2 it is not
        x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
        assert np.isfinite(onnx_lrp.Explainer(_edit(conv_model(), edit), composite="epsilon").explain(x).relevance).all()
        small = _edit(conv_model(), lambda m: (edit(m), [setattr(m.graph.input[0].type.tensor_type.shape.dim[a],
                                                                 "dim_value", 2) for a in (2, 3)]))
        with pytest.raises(UnsupportedError, match=r"kernel \[3, 3\] larger than the padded input \[2, 2\]"):
            onnx_lrp.Explainer(small, composite="epsilon")
        return
    with pytest.raises(error, match=message):
        onnx_lrp.Explainer(_edit(conv_model(), edit), composite="epsilon").explain(
            RNG.standard_normal((1, 3, 4, 4)).astype(np.float32))


def test_a_wrong_declared_output_shape_is_not_held_against_the_graph():
    """An exporter's stale graph-output annotation (ddddocr's CRNN declares 1 x ? for its T x 1 x C output;
    onnxruntime only warns) is not a shape conflict: the model is explained, and the relevance is LRP-0's on a linear model,
    x * W[:, target] (the conflict check is for declared inputs the graph does not fit)."""
    w = RNG.standard_normal((4, 6)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
         helper.make_node("Reshape", ["h", "shape"], ["y"], name="rs")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "M"])],  # wrong: y is N x 6 x 1
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([0, 6, 1], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = IR_VERSION
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    res = onnx_lrp.Explainer(model.SerializeToString(), composite="epsilon", epsilon=0.0, stabilizer=0.0).explain(
        x, target=2)
    assert_close(res.relevance, x * w[:, 2], rtol=1e-5, atol=1e-6)


def test_pool_window_larger_than_the_input_is_refused():
    """kernel_shape = 2**30 on a length-8 axis (was a numpy 'negative dimensions' ValueError)."""
    m = make_model([node("AveragePool", ["x"], "p", kernel_shape=[2 ** 30], strides=[1]),
                    node("Flatten", ["p"], "y")], {"x": ["N", 2, 8]}, ["y"])
    with pytest.raises(UnsupportedError, match="AveragePool_p.*kernel_shape .* larger than the padded input"):
        onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon")


def test_invalid_utf8_name_is_refused():
    """A flipped byte in a node name (was an onnx_ir SerdeError while serializing)."""
    data = conv_model().replace(b"Relu_r", b"Rel\xfe_r")
    with pytest.raises(ModelError, match=r"model.graph.node\[1\].name is not valid UTF-8"):
        onnx_lrp.Explainer(data, composite="epsilon")


@pytest.mark.parametrize("bias_shape", [(3,), (1, 2)])
def test_gemm_bias_of_the_wrong_size_is_refused(bias_shape):
    """Was a numpy broadcast ValueError inside Gemm.params."""
    m = make_model([node("Gemm", ["x", "w", "b"], "y", transB=1)], {"x": ["N", 4]}, ["y"],
                   {"w": W1, "b": np.ones(bias_shape, np.float32)})
    with pytest.raises(UnsupportedError, match=r"Gemm_y.*malformed: C of shape"):
        onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon")


def test_layernorm_without_bias_runs_with_attnlrp():
    """LayerNormalization(x, scale, "") with its statistics exposed crashed onnxruntime (segfault, found by the
    fuzzer); conservation of the identity-like chain checks the result: LRP through MatMul (epsilon) and LayerNorm
    (std detached: linear in x) sums to the output up to the bias-free stabiliser."""
    g = np.abs(RNG.standard_normal(4)).astype(np.float32) + 0.5
    m = make_model([node("MatMul", ["x", "wq"], "q"), node("LayerNormalization", ["q", "g", ""], "ln", axis=-1),
                    node("ReduceSum", ["ln", "axes"], "y", keepdims=0)],
                   {"x": ["N", 3, 4]}, ["y"], {"wq": W1, "g": g, "axes": np.array([2], dtype=np.int64)}, opset=18)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    res = onnx_lrp.Explainer(m.SerializeToString(), composite="attnlrp").explain(x, target=1)
    assert np.isfinite(res.relevance).all() and res.relevance.shape == x.shape
    y = res.outputs["y"][np.arange(2), res.target]
    np.testing.assert_allclose(res.relevance.reshape(2, -1).sum(1), y, rtol=1e-3, atol=1e-4)


def test_inspect_exits_1_when_no_path_reaches_an_input(tmp_path):
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main
    m = make_model([node("Cast", ["x"], "xi", to=TensorProto.INT64), node("Cast", ["xi"], "xf", to=TensorProto.FLOAT),
                    node("Gemm", ["xf", "w", "b"], "y", transB=1)], {"x": ["N", 4]}, ["y"],
                   {"w": W2, "b": np.zeros(3, np.float32)})
    onnx.save(m, str(tmp_path / "m.onnx"))
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "m.onnx"), "--composite", "epsilon"])
    assert res.exit_code == 1 and "no relevance path from any input to 'y'" in res.stderr, res.output


def test_output_rows_that_are_not_the_items_are_refused_in_one_line():
    """An output whose first axis is not the batch at run time (ICLabel: batch / 4; here a Reshape pairs items):
    onnxruntime rejects the start of the relevance graph; the error says why instead of blaming the input."""
    m = make_model([node("Reshape", ["x", "shape"], "pairs"), node("MatMul", ["pairs", "w"], "y")],
                   {"x": ["N", 4]}, ["y"], {"shape": np.array([-1, 8], np.int64),
                                             "w": np.ones((8, 3), np.float32)})
    ex = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon")
    with pytest.raises(InputError, match="first axis does not follow the inputs' batch axis") as err:
        ex.explain(np.ones((4, 4), np.float32))
    assert "\n" not in str(err.value)
