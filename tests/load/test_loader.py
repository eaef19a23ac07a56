"""Loader and canonizer behaviour: sources, external data, opset upgrades, constant folding, BatchNorm folding,
dropped no-ops, one-line errors, and the list of every unsupported node."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from util import add_probe, assert_close, make_model, node, run, to_bytes

import onnx_lrp
from onnx_lrp import load as loader
from onnx_lrp.core.graph import is_param

RNG = np.random.default_rng(99)


def rand(*shape, scale=0.5):
    return (scale * RNG.normal(size=shape)).astype(np.float32)


def small_cnn(opset=17):
    """Conv -> Relu -> MaxPool -> Flatten -> Gemm."""
    nodes = [node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["r"]),
             node("MaxPool", ["r"], ["m"], kernel_shape=[2, 2], strides=[2, 2]), node("Flatten", ["m"], ["f"]),
             node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    inits = {"w": rand(3, 2, 3, 3), "b": rand(3), "fw": rand(4, 12), "fb": rand(4)}
    return make_model(nodes, {"x": [2, 2, 4, 4]}, ["y"], inits, opset=opset)


def op_types(model):
    return [n.op_type for n in model.graph]


def forward_of_loaded(source, feeds):
    """Run the loaded (folded, canonized) model itself."""
    return run(loader.serialize(loader.load(source)), feeds)


X = RNG.normal(size=(2, 2, 4, 4)).astype(np.float32)


# ------------------------------------------------------------------------------------------- sources
def test_path_bytes_and_proto_give_the_same_relevance(tmp_path):
    model = small_cnn()
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path))
    results = [onnx_lrp.Explainer(src, composite="epsilon").explain(X).relevance
               for src in (path, str(path), path.read_bytes(), model)]
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    assert np.abs(results[0]).sum() > 0


def test_external_data(tmp_path):
    model = small_cnn()
    inline = to_bytes(model)  # save_model moves the tensors of ``model`` itself out
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.data", size_threshold=0)
    assert (tmp_path / "ext.data").stat().st_size > 0
    assert path.stat().st_size < len(inline) - 200  # the weights really are outside
    want = onnx_lrp.Explainer(inline, composite="epsilon-plus").explain(X)
    got = onnx_lrp.Explainer(path, composite="epsilon-plus").explain(X)
    np.testing.assert_array_equal(got.relevance, want.relevance)
    assert_close(got.outputs["y"], run(inline, {"x": X})[0], rtol=1e-6)
    # the data file is missing: a one-line ModelError naming the model file
    (tmp_path / "ext.data").rename(tmp_path / "moved.data")
    with pytest.raises(onnx_lrp.ModelError) as info:
        onnx_lrp.Explainer(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_constant_node_with_external_data(tmp_path):
    """A Constant node whose tensor lives in an external file (torch.onnx writes a large constant so: a LLaMA's
    rotary table exported with transformers 5) loads, explains as the same model with the constant inline, and its
    data file is checked like a weight's (before: "fails the ONNX checker: ... is not regular file")."""
    w = rand(4, 6)
    model = make_model([node("Constant", [], ["c"], value=numpy_helper.from_array(w, "c")),
                        node("MatMul", ["x", "c"], ["h"]), node("Relu", ["h"], ["y"])], {"x": ["N", 4]}, ["y"], {})
    inline = to_bytes(model)
    onnx.external_data_helper.convert_model_to_external_data(model, all_tensors_to_one_file=True, location="c.data",
                                                              size_threshold=0, convert_attribute=True)
    path = tmp_path / "const.onnx"
    onnx.save_model(model, str(path))
    assert (tmp_path / "c.data").stat().st_size == w.nbytes
    assert any(a.t.data_location == TensorProto.EXTERNAL for a in onnx.load(str(path), load_external_data=False)
               .graph.node[0].attribute)
    x = rand(3, 4)
    want = onnx_lrp.Explainer(inline, composite="epsilon").explain(x, target=1)
    got = onnx_lrp.Explainer(path, composite="epsilon").explain(x, target=1)
    np.testing.assert_array_equal(got.relevance, want.relevance)
    (tmp_path / "c.data").unlink()
    with pytest.raises(onnx_lrp.ModelError, match="c.data"):
        onnx_lrp.Explainer(path)


def test_external_data_without_lengths_is_rewritten(tmp_path):
    """External data entries may leave out "length" (the rest of the file; one file per tensor, as torch.onnx writes
    a model over 2 GB): the rewritten model copies each whole file and runs in plain onnxruntime (before: an internal
    KeyError in `rewrite`)."""
    import onnxruntime as ort

    model = small_cnn()
    path = tmp_path / "pertensor.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)
    proto = onnx.load(str(path), load_external_data=False)
    for t in proto.graph.initializer:
        kept = [(e.key, e.value) for e in t.external_data if e.key not in ("length", "offset")]
        del t.external_data[:]
        for k, v in kept:
            e = t.external_data.add()
            e.key, e.value = k, v
    onnx.save_model(proto, str(path))
    ex = onnx_lrp.Explainer(path, composite="epsilon-plus")
    want = ex.explain(X, target=1)
    out = tmp_path / "out" / "m.lrp.onnx"
    out.parent.mkdir()
    ex.save(out)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    feeds = {"x": X, "lrp/target": np.full(len(X), 1, np.int64), "lrp/one_hot": np.array(False)}
    got = sess.run(["lrp/relevance/x"], {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}})
    assert_close(got[0], want.relevance, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------------ opsets
def _old_opset_model(opset):
    """Ops whose signatures changed since ``opset`` (axes/split attributes, BN attributes, ...)."""
    if opset <= 11:
        squeeze = [node("Unsqueeze", ["p"], ["u"], axes=[1]), node("Squeeze", ["u"], ["q"], axes=[1])]
        reduce = [node("ReduceSum", ["q"], ["s"], axes=[3], keepdims=1)]
        split = [node("Split", ["s"], ["s1", "s2"], axis=1, split=[1, 2])]
        inits = {}
    else:
        squeeze = [node("Unsqueeze", ["p", "ax1"], ["u"]), node("Squeeze", ["u", "ax1"], ["q"])]
        reduce = [node("ReduceSum", ["q", "ax3"], ["s"], keepdims=1)]
        split = [node("Split", ["s", "sp"], ["s1", "s2"], axis=1)]
        inits = {"ax1": np.array([1], np.int64), "ax3": np.array([3], np.int64), "sp": np.array([1, 2], np.int64)}
    nodes = [node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             node("BatchNormalization", ["c", "s_", "b_", "m_", "v_"], ["n"]),
             node("Relu", ["n"], ["p"])] + squeeze + reduce + split + [
        node("ReduceMean", ["s1"], ["g1"], axes=[2, 3], keepdims=0),
        node("ReduceMean", ["s2"], ["g2"], axes=[2, 3], keepdims=0),
        node("Concat", ["g1", "g2"], ["g"], axis=1),
        node("Gemm", ["g", "fw", "fb"], ["y"])]
    inits.update({"w": rand(3, 2, 3, 3), "b": rand(3), "s_": rand(3) + 1, "b_": rand(3), "m_": rand(3),
                  "v_": np.abs(rand(3)) + 0.5, "fw": rand(3, 5), "fb": rand(5)})
    return make_model(nodes, {"x": [2, 2, 4, 4]}, ["y"], inits, opset=opset)


@pytest.mark.parametrize("opset", [9, 11, 13])
def test_old_opsets_are_upgraded(opset):
    model = _old_opset_model(opset)
    want = run(model, {"x": X})[0]
    loaded = loader.load(to_bytes(model))
    assert loaded.opset_imports[""] >= loader.MIN_OPSET
    assert_close(forward_of_loaded(to_bytes(model), {"x": X})[0], want, rtol=1e-5, atol=1e-6)
    res = onnx_lrp.Explainer(to_bytes(model), composite="epsilon").explain(X)
    assert_close(res.outputs["y"], want, rtol=1e-5, atol=1e-6)
    assert res.relevance.shape == X.shape and np.all(np.isfinite(res.relevance))


# ------------------------------------------------------------------------------------------ folding
def test_constant_nodes_and_shape_chains_are_folded():
    w = rand(3, 2, 3, 3)
    nodes = [
        helper.make_node("Constant", [], ["w"], name="const_w", value=numpy_helper.from_array(w)),
        node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        node("Shape", ["c"], ["shp"]),
        node("Gather", ["shp", "zero"], ["n"], axis=0),
        node("Unsqueeze", ["n", "ax0"], ["n1"]),
        node("Concat", ["n1", "minus1"], ["target_shape"], axis=0),
        node("Reshape", ["c", "target_shape"], ["y"]),
    ]
    inits = {"zero": np.array(0, np.int64), "ax0": np.array([0], np.int64), "minus1": np.array([-1], np.int64)}
    model = make_model(nodes, {"x": [2, 2, 4, 4]}, ["y"], inits)
    loaded = loader.load(to_bytes(model))
    assert op_types(loaded) == ["Conv", "Reshape"]
    conv, reshape = list(loaded.graph)
    assert is_param(conv.inputs[1]) and np.array_equal(conv.inputs[1].const_value.numpy(), w)
    assert is_param(reshape.inputs[1]) and list(reshape.inputs[1].const_value.numpy()) == [2, -1]
    assert_close(forward_of_loaded(to_bytes(model), {"x": X})[0], run(model, {"x": X})[0],
                               rtol=1e-6)


def test_constantofshape_cast_transpose_of_initializers_are_folded():
    w16 = rand(5, 32).astype(np.float16)  # stored (out, in) in float16
    nodes = [
        node("Cast", ["w16"], ["w32"], to=TensorProto.FLOAT),
        node("Transpose", ["w32"], ["wt"], perm=[1, 0]),
        helper.make_node("ConstantOfShape", ["bshape"], ["bias"], name="cos",
                         value=numpy_helper.from_array(np.array([0.25], np.float32))),
        node("Flatten", ["x"], ["f"]),
        node("MatMul", ["f", "wt"], ["h"]),
        node("Add", ["h", "bias"], ["y"]),
    ]
    model = make_model(nodes, {"x": [2, 2, 4, 4]}, ["y"], {"w16": w16, "bshape": np.array([5], np.int64)})
    loaded = loader.load(to_bytes(model))
    assert op_types(loaded) == ["Flatten", "MatMul", "Add"]
    mm = next(n for n in loaded.graph if n.op_type == "MatMul")
    assert is_param(mm.inputs[1]) and mm.inputs[1].const_value.numpy().shape == (32, 5)
    add = next(n for n in loaded.graph if n.op_type == "Add")
    assert np.all(add.inputs[1].const_value.numpy() == 0.25)
    assert mm.meta.get("lrp_bias") is not None  # the folded bias is absorbed into the MatMul layer
    assert_close(forward_of_loaded(to_bytes(model), {"x": X})[0], run(model, {"x": X})[0],
                               rtol=1e-6)


def test_dynamic_batch_shape_chain_still_explains():
    """With a symbolic batch the Shape chain cannot fold; the Reshape it feeds still passes relevance."""
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Shape", ["c"], ["shp"]),
             node("Gather", ["shp", "zero"], ["n"], axis=0), node("Unsqueeze", ["n", "ax0"], ["n1"]),
             node("Concat", ["n1", "minus1"], ["ts"], axis=0), node("Reshape", ["c", "ts"], ["f"]),
             node("Gemm", ["f", "fw"], ["y"])]
    inits = {"w": rand(3, 2, 3, 3), "zero": np.array(0, np.int64), "ax0": np.array([0], np.int64),
             "minus1": np.array([-1], np.int64), "fw": rand(48, 4)}
    dynamic = make_model(nodes, {"x": ["N", 2, 4, 4]}, ["y"], inits)
    static = make_model(nodes, {"x": [2, 2, 4, 4]}, ["y"], inits)
    assert "Shape" in op_types(loader.load(to_bytes(dynamic)))
    got = onnx_lrp.Explainer(to_bytes(dynamic), composite="epsilon").explain(X).relevance
    want = onnx_lrp.Explainer(to_bytes(static), composite="epsilon").explain(X).relevance
    assert_close(got, want, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------ BatchNorm folding
def _bn_inits(c, prefix="bn"):
    return {f"{prefix}_s": rand(c) + 1.0, f"{prefix}_b": rand(c), f"{prefix}_m": rand(c),
            f"{prefix}_v": np.abs(rand(c)) + 0.3}


def _bn(x, out, prefix="bn", **attrs):
    return node("BatchNormalization", [x, f"{prefix}_s", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"], [out],
                **attrs)


@pytest.mark.parametrize("bias,group", [(True, 1), (False, 1), (True, 2)], ids=["conv-bias", "conv-no-bias",
                                                                             "grouped-conv"])
def test_bn_folded_into_conv(bias, group):
    cout = 4 if group == 2 else 3
    inits = {"w": rand(cout, 2 // group, 3, 3), **_bn_inits(cout)}
    conv_in = ["x", "w"]
    if bias:
        inits["b"] = rand(cout)
        conv_in.append("b")
    nodes = [node("Conv", conv_in, ["c"], pads=[1, 1, 1, 1], strides=[2, 1], group=group),
             _bn("c", "n", epsilon=1e-3),
             node("Relu", ["n"], ["y"])]
    model = make_model(nodes, {"x": [2, 2, 4, 4]}, ["y"], inits)
    loaded = loader.load(to_bytes(model))
    assert op_types(loaded) == ["Conv", "Relu"]
    conv = next(iter(loaded.graph))
    assert len(conv.inputs) == 3 and is_param(conv.inputs[2])
    assert [o.name for o in loaded.graph.outputs] == ["y"]
    assert_close(forward_of_loaded(to_bytes(model), {"x": X})[0], run(model, {"x": X})[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_b,alpha,beta,with_c", [(0, 1.0, 1.0, True), (1, 0.5, 2.0, True), (1, 1.5, 1.0, False)])
def test_bn_folded_into_gemm(trans_b, alpha, beta, with_c):
    w = rand(4, 6) if trans_b else rand(6, 4)
    inits = {"w": w, **_bn_inits(4)}
    ins = ["x", "w"]
    if with_c:
        inits["c"] = rand(4)
        ins.append("c")
    nodes = [node("Gemm", ins, ["h"], transB=trans_b, alpha=alpha, beta=beta), _bn("h", "y")]
    model = make_model(nodes, {"x": [3, 6]}, ["y"], inits)
    x = RNG.normal(size=(3, 6)).astype(np.float32)
    loaded = loader.load(to_bytes(model))
    assert op_types(loaded) == ["Gemm"]
    assert [o.name for o in loaded.graph.outputs] == ["y"]  # the BN output's name is kept
    assert_close(forward_of_loaded(to_bytes(model), {"x": x})[0], run(model, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def test_bn_after_relu_is_left_unfolded():
    inits = {"w": rand(3, 2, 3, 3), "w2": rand(3, 3, 1, 1), **_bn_inits(3)}
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["r"]), _bn("r", "n"),
             node("Conv", ["n", "w2"], ["y"])]
    model = make_model(nodes, {"x": [2, 2, 4, 4]}, ["y"], inits)
    loaded = loader.load(to_bytes(model))
    assert op_types(loaded) == ["Conv", "Relu", "BatchNormalization", "Conv"]
    assert_close(forward_of_loaded(to_bytes(model), {"x": X})[0], run(model, {"x": X})[0],
                               rtol=1e-5, atol=1e-5)


def test_bn_not_folded_when_conv_output_has_two_consumers():
    inits = {"w": rand(3, 2, 3, 3), **_bn_inits(3)}
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), _bn("c", "n"), node("Add", ["n", "c"], ["y"])]
    model = make_model(nodes, {"x": [2, 2, 4, 4]}, ["y"], inits)
    loaded = loader.load(to_bytes(model))
    assert "BatchNormalization" in op_types(loaded)
    assert_close(forward_of_loaded(to_bytes(model), {"x": X})[0], run(model, {"x": X})[0],
                               rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ no-ops
def test_identity_and_dropout_are_dropped():
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Identity", ["c"], ["i"]),
             node("Dropout", ["i"], ["d"]), node("Relu", ["d"], ["r"]), node("Identity", ["r"], ["y"])]
    model = make_model(nodes, {"x": [2, 2, 4, 4]}, ["y"], {"w": rand(3, 2, 3, 3)})
    loaded = loader.load(to_bytes(model))
    assert op_types(loaded) == ["Conv", "Relu"]
    assert [o.name for o in loaded.graph.outputs] == ["y"]
    assert_close(forward_of_loaded(to_bytes(model), {"x": X})[0], run(model, {"x": X})[0],
                               rtol=1e-6)


# ------------------------------------------------------------------------------------------ errors
def _one_line_model_error(source, must_name=None):
    with pytest.raises(onnx_lrp.ModelError) as info:
        onnx_lrp.Explainer(source)
    msg = str(info.value)
    assert "\n" not in msg and msg.strip() == msg and msg
    if must_name is not None:
        assert str(must_name) in msg, msg
    return msg


def test_missing_file(tmp_path):
    _one_line_model_error(tmp_path / "nope.onnx", tmp_path / "nope.onnx")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    _one_line_model_error(path, path)


def test_garbage_file(tmp_path):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, size=4096, dtype=np.uint8).tobytes())
    _one_line_model_error(path, path)


def test_text_file(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a model\n" * 20)
    _one_line_model_error(path, path)


@pytest.mark.parametrize("fraction", [0.5, 0.9])
def test_truncated_file(tmp_path, fraction):
    data = to_bytes(small_cnn())
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[:int(len(data) * fraction)])
    _one_line_model_error(path, path)


def test_directory(tmp_path):
    _one_line_model_error(tmp_path, tmp_path)


def test_bad_bytes():
    _one_line_model_error(b"")
    _one_line_model_error(b"\x08\x07garbage-that-is-not-protobuf\xff\xff\xff")


def test_every_unsupported_node_is_listed():
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             node("Hardmax", ["c"], ["h1"], name="first_hardmax", axis=1),
             node("Relu", ["h1"], ["r"]),
             node("Hardmax", ["r"], ["h2"], name="second_hardmax", axis=-1),
             helper.make_node("MyOp", ["h2"], ["k"], name="custom_node", domain="com.example"),
             node("Flatten", ["k"], ["f"]), node("Gemm", ["f", "fw"], ["y"])]
    model = make_model(nodes, {"x": [2, 2, 4, 4]}, ["y"], {"w": rand(3, 2, 3, 3), "fw": rand(48, 4)},
                       extra_opsets=[("com.example", 1)])
    model.graph.value_info.extend([helper.make_tensor_value_info("k", TensorProto.FLOAT, [2, 3, 4, 4])])
    model.graph.ClearField("output")  # shape inference stops at the custom op: give the output's shape
    model.graph.output.extend([helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    with pytest.raises(onnx_lrp.UnsupportedError) as info:
        onnx_lrp.Explainer(to_bytes(model), composite="epsilon")
    msg = str(info.value)
    assert "\n" not in msg
    for name in ("first_hardmax", "second_hardmax", "custom_node"):
        assert name in msg, msg
    assert "Hardmax" in msg and "com.example" in msg
    assert len(info.value.nodes) == 3


def test_supported_model_with_probe_loads():
    """The probe used by the op tests survives loading unchanged (a Reshape, a MatMul, a Sum and an Expand)."""
    model = add_probe(small_cnn(), "y", np.ones((2, 4), np.float32), batch=2)
    loaded = loader.load(to_bytes(model))
    assert op_types(loaded)[-4:] == ["Reshape", "MatMul", "Sum", "Expand"]
