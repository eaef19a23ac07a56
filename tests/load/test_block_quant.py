"""onnxruntime's weight-only block quantization: MatMulNBits (4 and 8 bits, blocks 16..256, zero points absent, packed
or float, bias, accuracy_level) and GatherBlockQuantized, loaded as DequantizeLinear (block_size) of weights kept
packed. The forward against onnxruntime's run of the original node (accuracy_level 0); the relevance against the
float twin (MatMul / Gather of the same weights dequantized in numpy); the relevance model holds 4-bit weights."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
from onnx_lrp import load as loader
from util import assert_close, ort_session

F = TensorProto.FLOAT




def _pack4(q: np.ndarray) -> np.ndarray:
    """(rows, even count) values 0..15 -> (rows, count/2) bytes, low nibble first (onnxruntime's layout)."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)


def nbits_layer(k: int, n: int, bits: int, block: int, zp: str, bias: bool, seed: int = 0, accuracy: int = 0):
    """A MatMulNBits node's constant inputs, its attributes and the float weight (K, N) and bias it computes."""
    rng = np.random.default_rng(seed)
    nb = -(-k // block)
    q = rng.integers(0, 2 ** bits, (n, nb * block)).astype(np.uint8)
    s = (0.02 + 0.1 * rng.random((n, nb))).astype(np.float32)
    inits = {"B": (_pack4(q) if bits == 4 else q).reshape(n, nb, block * bits // 8), "scales": s.reshape(-1)}
    if zp == "packed":
        z = rng.integers(0, 2 ** bits, (n, nb)).astype(np.uint8)
        zz = np.zeros((n, nb + nb % 2), np.uint8)
        zz[:, :nb] = z
        inits["zero_points"] = (_pack4(zz) if bits == 4 else z).reshape(-1)
        zf = z.astype(np.float32)
    elif zp == "float":
        zf = (rng.random((n, nb)) * 2 ** bits).astype(np.float32)
        inits["zero_points"] = zf.reshape(-1)
    else:
        zf = np.full((n, nb), 2 ** (bits - 1), np.float32)
    w = ((q.reshape(n, nb, block).astype(np.float32) - zf[:, :, None]) * s[:, :, None]).reshape(n, -1)[:, :k].T
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    if bias:
        inits["bias"] = b
    names = ["B", "scales", "zero_points" if zp != "none" else ""] + (["", "bias"] if bias else [])
    attrs = dict(K=k, N=n, bits=bits, block_size=block, accuracy_level=accuracy)
    return inits, names, attrs, np.ascontiguousarray(w), b


def _model(nodes, inits, ins, outs, opset=21):
    g = helper.make_graph(nodes, "nbits", ins, outs, initializer=[numpy_helper.from_array(v, k)
                                                                   for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m


def _nbits_model(k, n, bits, block, zp, bias, accuracy=0, opset=21):
    inits, names, attrs, w, b = nbits_layer(k, n, bits, block, zp, bias, accuracy=accuracy)
    node = helper.make_node("MatMulNBits", ["a"] + names, ["y"], domain="com.microsoft", name="mm", **attrs)
    ins = [helper.make_tensor_value_info("a", F, ["batch", "seq", k])]
    outs = [helper.make_tensor_value_info("y", F, ["batch", "seq", n])]
    return _model([node], inits, ins, outs, opset), w, b


CASES = [(64, 8, 4, 32, "none", False), (64, 8, 4, 16, "packed", True), (96, 8, 4, 64, "packed", False),
         (48, 6, 4, 32, "float", True), (256, 4, 4, 256, "float", False), (64, 8, 8, 32, "none", True),
         (80, 8, 8, 16, "packed", False), (128, 8, 4, 128, "none", False)]


@pytest.mark.parametrize("k, n, bits, block, zp, bias", CASES,
                         ids=[f"K{c[0]}-N{c[1]}-b{c[2]}-bs{c[3]}-zp_{c[4]}{'-bias' if c[5] else ''}" for c in CASES])
def test_matmul_nbits_forward_matches_onnxruntime(k, n, bits, block, zp, bias):
    m, w, b = _nbits_model(k, n, bits, block, zp, bias)
    a = np.random.default_rng(1).standard_normal((2, 3, k)).astype(np.float32)
    ref = ort_session(m.SerializeToString()).run(None, {"a": a})[0]
    model = loader.load(m.SerializeToString())
    assert not [x for x in model.graph if x.domain == "com.microsoft"]
    dq = [x for x in model.graph if x.op_type == "DequantizeLinear"]
    assert len(dq) == 1 and dq[0].attributes["block_size"].value == block
    packed = dq[0].inputs[0].const_value.numpy()
    assert packed.dtype in (ml_dtypes.int4, ml_dtypes.uint4, np.int8, np.uint8)
    assert packed.dtype.itemsize * 8 >= bits and (bits == 8) == (packed.dtype in (np.int8, np.uint8))
    got = ort_session(ir.serde.serialize_model(model).SerializeToString(), optimise=False).run(None, {"a": a})[0]
    assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert_close(got, a @ w + (0 if b is None else b), rtol=1e-5, atol=1e-5)  # and the numpy oracle


def initializer_bytes(relevance_model) -> dict:
    """Bytes of the relevance model's initializers by element type (its graph, and the arrays handed over)."""
    m = onnx.load_from_string(relevance_model.model_bytes)
    out: dict = {}
    for t in m.graph.initializer:
        size = int(np.prod(t.dims)) if t.dims else 1
        bits = 4 if t.data_type in (TensorProto.INT4, TensorProto.UINT4) else \
            8 * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        out[t.data_type] = out.get(t.data_type, 0) + size * bits // 8
    for a in relevance_model.model_arrays.values():
        out["arrays"] = out.get("arrays", 0) + a.nbytes
    return out


def _two_layers(packed: bool, zp: str, bits: int = 4):
    """x -> MatMulNBits (32 -> 64, bias) -> Relu -> MatMulNBits (64 -> 16) -> logits, or its float twin."""
    l1 = nbits_layer(32, 64, bits, 16, zp, True, seed=2)
    l2 = nbits_layer(64, 16, bits, 32, zp, False, seed=3)
    ins = [helper.make_tensor_value_info("x", F, ["batch", "seq", 32])]
    outs = [helper.make_tensor_value_info("logits", F, ["batch", "seq", 16])]
    if packed:
        inits = {f"l1_{k}": v for k, v in l1[0].items()} | {f"l2_{k}": v for k, v in l2[0].items()}
        nodes = [helper.make_node("MatMulNBits", ["x"] + [f"l1_{x}" if x else "" for x in l1[1]], ["h"],
                                  domain="com.microsoft", name="mm1", **l1[2]),
                 helper.make_node("Relu", ["h"], ["r"], name="relu"),
                 helper.make_node("MatMulNBits", ["r"] + [f"l2_{x}" if x else "" for x in l2[1]], ["logits"],
                                  domain="com.microsoft", name="mm2", **l2[2])]
    else:
        inits = {"w1": l1[3], "b1": l1[4], "w2": l2[3]}
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"], name="mm1"),
                 helper.make_node("Add", ["h0", "b1"], ["h"], name="b1"),
                 helper.make_node("Relu", ["h"], ["r"], name="relu"),
                 helper.make_node("MatMul", ["r", "w2"], ["logits"], name="mm2")]
    return _model(nodes, inits, ins, outs)


@pytest.mark.parametrize("zp, bits", [("none", 4), ("float", 4), ("packed", 8)])
def test_matmul_nbits_relevance_equals_the_float_twin_with_weights_kept_packed(zp, bits):
    x = np.random.default_rng(4).standard_normal((2, 3, 32)).astype(np.float32)
    a = onnx_lrp.Explainer(_two_layers(True, zp, bits).SerializeToString(), composite="epsilon", epsilon=1e-6)
    b = onnx_lrp.Explainer(_two_layers(False, zp, bits).SerializeToString(), composite="epsilon", epsilon=1e-6)
    ra, rb = a.explain({"x": x}), b.explain({"x": x})
    np.testing.assert_array_equal(ra.target, rb.target)
    assert_close(ra.forward["logits"], rb.forward["logits"], rtol=1e-5, atol=1e-5)
    assert np.abs(rb.relevance).max() > 1e-2
    assert_close(ra.relevance, rb.relevance, rtol=1e-4, atol=1e-5)
    size = initializer_bytes(a.relevance_model)
    weights = (32 * 64 + 64 * 16) * bits // 8  # the packed weights themselves
    floats = size.get(TensorProto.FLOAT, 0) + size.get("arrays", 0)
    assert floats < 4 * (32 * 64 + 64 * 16) / 4, size  # no float copy of a weight matrix
    assert sum(v for k, v in size.items() if k in (TensorProto.INT4, TensorProto.UINT4, TensorProto.INT8,
                                                      TensorProto.UINT8)) >= weights


def _embedding(kind: str, vocab: int = 24, k: int = 32, block: int = 16):
    """GatherBlockQuantized's inputs as onnxruntime-genai writes a quantized (tied) embedding: uint8 bytes of two
    4-bit values (zero points packed alike, or absent: 8), or an int4 table; and the float table they mean."""
    rng = np.random.default_rng(5)
    nb = k // block
    s = (0.05 + 0.1 * rng.random((vocab, nb))).astype(np.float32)
    if kind == "int4":
        q = rng.integers(-8, 8, (vocab, k))
        table = (q.reshape(vocab, nb, block) * s[:, :, None]).reshape(vocab, k)
        return {"data": q.astype(ml_dtypes.int4), "scales": s}, table.astype(np.float32)
    q = rng.integers(0, 16, (vocab, k)).astype(np.uint8)
    inits = {"data": _pack4(q), "scales": s}
    z = np.full((vocab, nb), 8, np.uint8)
    if kind == "zp":
        z = rng.integers(0, 16, (vocab, nb)).astype(np.uint8)
        inits["zero_points"] = _pack4(z)
    table = ((q.reshape(vocab, nb, block).astype(np.float32) - z[:, :, None]) * s[:, :, None]).reshape(vocab, k)
    return inits, table.astype(np.float32)


def _embedding_model(kind: str, packed: bool):
    """ids -> (GatherBlockQuantized | Gather) -> Relu -> MatMul -> logits."""
    inits, table = _embedding(kind)
    w = np.random.default_rng(6).standard_normal((32, 10)).astype(np.float32)
    if packed:
        names = ["data", "ids", "scales"] + (["zero_points"] if "zero_points" in inits else [])
        look = helper.make_node("GatherBlockQuantized", names, ["e"], domain="com.microsoft", name="embed",
                                gather_axis=0, quantize_axis=1, block_size=16, bits=4)
    else:
        inits = {"table": table}
        look = helper.make_node("Gather", ["table", "ids"], ["e"], name="embed", axis=0)
    nodes = [look, helper.make_node("Relu", ["e"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w"], ["logits"], name="head")]
    ins = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])]
    outs = [helper.make_tensor_value_info("logits", F, ["batch", "seq", 10])]
    return _model(nodes, inits | {"w": w}, ins, outs), table


@pytest.mark.parametrize("kind", ["uint8", "zp", "int4"])
def test_gather_block_quantized_forward_and_token_relevance(kind):
    m, table = _embedding_model(kind, True)
    ids = np.array([[3, 0, 23, 7, 7]], np.int64)
    ref = ort_session(m.SerializeToString()).run(None, {"ids": ids})[0]
    w = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "w"))
    assert_close(ref, np.maximum(table[ids], 0) @ w, rtol=1e-5, atol=1e-5)  # onnxruntime means the numpy table
    a = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=1e-6)
    b = onnx_lrp.Explainer(_embedding_model(kind, False)[0].SerializeToString(), composite="epsilon", epsilon=1e-6)
    ra, rb = a.explain({"ids": ids}), b.explain({"ids": ids})
    assert_close(ra.forward["logits"], ref, rtol=1e-5, atol=1e-5)
    assert ra.relevance.shape == ids.shape and np.abs(rb.relevance).max() > 1e-2
    assert_close(ra.relevance, rb.relevance, rtol=1e-5, atol=1e-6)
    assert TensorProto.FLOAT not in initializer_bytes(a.relevance_model) or \
        initializer_bytes(a.relevance_model)[TensorProto.FLOAT] < table.nbytes // 2


def test_accuracy_level_4_gap_is_measured_and_said_with_an_empty_kv_cache():
    """MatMulNBits with accuracy_level 4 (int8 activations in onnxruntime's kernel) in a decoder-like graph with a past
    input: the deployed model runs with its past fed empty, its gap to the float forward is measured, and where it is
    beyond the tolerance it is said with its cause."""
    from onnx_lrp.core.errors import LrpWarning
    from onnx_lrp.run import deployed_gap

    inits, names, attrs, w, _ = nbits_layer(64, 8, 4, 32, "none", False, accuracy=4)
    nodes = [helper.make_node("MatMulNBits", ["x"] + names, ["logits"], domain="com.microsoft", name="mm", **attrs),
             helper.make_node("Reshape", ["logits", "heads"], ["k"], name="k_heads"),
             helper.make_node("Concat", ["past_key_values.0.key", "k"], ["present.0.key"], axis=2, name="cat")]
    inits["heads"] = np.array([0, 2, -1, 4], np.int64)
    ins = [helper.make_tensor_value_info("x", F, ["batch_size", "sequence_length", 64]),
           helper.make_tensor_value_info("past_key_values.0.key", F, ["batch_size", 2, "past_sequence_length", 4])]
    outs = [helper.make_tensor_value_info("logits", F, ["batch_size", "sequence_length", 8]),
            helper.make_tensor_value_info("present.0.key", F, ["batch_size", 2, "total_sequence_length", 4])]
    m = _model(nodes, inits, ins, outs)
    x = (4 * np.random.default_rng(7).standard_normal((1, 2, 64))).astype(np.float32)
    e = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=1e-6)
    assert e.relevance_model.deployed is not None and "int8-activations" in e.relevance_model.deployed.kinds
    with pytest.warns(LrpWarning, match="accuracy_level 4") if _int8_path(m, x) else _nothing():
        res = e.explain(x, target=(1, 0))
    ref = ort_session(m.SerializeToString()).run(["logits"], {"x": x, "past_key_values.0.key": np.zeros((1, 2, 0, 4),
                                                                                                    np.float32)})[0]
    gap = res.deployed_gap
    assert_close(res.outputs["logits"], ref, rtol=0, atol=0)  # the outputs are the deployed model's
    assert_close(res.forward["logits"], x @ w, rtol=1e-5, atol=1e-5)  # the explained forward is the float one
    assert gap.max_abs == pytest.approx(np.abs(ref - res.forward["logits"]).max(), rel=1e-6)
    if gap.beyond:
        assert gap.reason == deployed_gap.INT8_ACTIVATIONS


def _int8_path(m, x) -> bool:
    """Whether this CPU's MatMulNBits kernel with accuracy_level 4 differs from float beyond 1e-4 of the output."""
    empty = np.zeros((1, 2, 0, 4), np.float32)
    y4 = ort_session(m.SerializeToString()).run(["logits"], {"x": x, "past_key_values.0.key": empty})[0]
    for n in m.graph.node:
        for a in n.attribute:
            if a.name == "accuracy_level":
                a.i = 0
    y0 = ort_session(m.SerializeToString()).run(["logits"], {"x": x, "past_key_values.0.key": empty})[0]
    for n in m.graph.node:
        for a in n.attribute:
            if a.name == "accuracy_level":
                a.i = 4
    return bool(np.abs(y4 - y0).max() > 1e-4 * np.abs(y4).max())


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_opset_below_21_is_raised_with_reduction_axes_as_inputs():
    """onnxruntime-genai writes its int4 models at opset 14: the model is raised to 21 for DequantizeLinear's
    block_size, a ReduceMean's ``axes`` attribute (opset < 18) becoming an input; the forward is unchanged."""
    inits, names, attrs, w, _ = nbits_layer(64, 8, 4, 32, "packed", False)
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], keepdims=1, name="mean"),
             helper.make_node("Sub", ["x", "mean"], ["centred"], name="centre"),
             helper.make_node("MatMulNBits", ["centred"] + names, ["y"], domain="com.microsoft", name="mm", **attrs)]
    m = _model(nodes, inits, [helper.make_tensor_value_info("x", F, ["batch", 64])],
               [helper.make_tensor_value_info("y", F, ["batch", 8])], opset=14)
    x = np.random.default_rng(8).standard_normal((3, 64)).astype(np.float32)
    ref = ort_session(m.SerializeToString()).run(None, {"x": x})[0]
    model = loader.load(m.SerializeToString())
    assert model.opset_imports[""] >= 21
    assert all("axes" not in n.attributes for n in model.graph if n.op_type == "ReduceMean")
    got = ort_session(ir.serde.serialize_model(model).SerializeToString(), optimise=False).run(None, {"x": x})[0]
    assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_head_tied_to_a_quantized_embedding_reads_the_same_packed_table():
    """onnxruntime-genai's tied embeddings: GatherBlockQuantized reads the head's MatMulNBits weight (reshaped); the
    relevance model holds that packed table once, and the forward is onnxruntime's."""
    vocab, k, block = 24, 32, 16
    inits, names, attrs, w, _ = nbits_layer(k, vocab, 4, block, "packed", False, seed=9)
    inits["table_shape"] = np.array([vocab, k // 2], np.int64)
    inits["scales"], inits["zero_points"] = inits["scales"].reshape(vocab, -1), inits["zero_points"].reshape(vocab, -1)
    nodes = [helper.make_node("Reshape", ["B", "table_shape"], ["table"], name="tie"),
             helper.make_node("GatherBlockQuantized", ["table", "ids", "scales", "zero_points"], ["e"],
                              domain="com.microsoft", name="embed", gather_axis=0, quantize_axis=1, block_size=block,
                              bits=4),
             helper.make_node("Relu", ["e"], ["r"], name="relu"),
             helper.make_node("MatMulNBits", ["r"] + names, ["logits"], domain="com.microsoft", name="head", **attrs)]
    m = _model(nodes, inits, [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
               [helper.make_tensor_value_info("logits", F, ["batch", "seq", vocab])])
    ids = np.array([[1, 5, 23, 5]], np.int64)
    ref = ort_session(m.SerializeToString()).run(None, {"ids": ids})[0]
    assert_close(ref, np.maximum(w.T[ids], 0) @ w, rtol=1e-5, atol=1e-5)  # the table is the head's weight
    e = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=1e-6)
    res = e.explain({"ids": ids})
    assert_close(res.forward["logits"], ref, rtol=1e-5, atol=1e-5)
    size = initializer_bytes(e.relevance_model)
    # one packed table (and its zero points): 4-bit, or its rows as MatMulNBits keeps them (building.transient_weights)
    assert size.get(TensorProto.UINT4, 0) + size.get(TensorProto.UINT8, 0) < 1.5 * vocab * k // 2, size


@pytest.mark.parametrize("signed", [True, False])
def test_qdq_int4_weights_stay_packed(signed):
    """A QDQ model with 4-bit weights (DequantizeLinear of int4 / uint4 with block_size, as onnxruntime's
    MatMul4BitsQuantizer writes in QDQ format): the weights stay 4-bit in the relevance model, which explains like
    the float twin."""
    rng = np.random.default_rng(10)
    k, n, block = 32, 8, 16
    s = (0.01 + 0.1 * rng.random((k // block, n))).astype(np.float32)
    if signed:
        q, z = rng.integers(-8, 8, (k, n)), np.zeros((k // block, n), np.int64)
        tensors = [helper.make_tensor("wq", TensorProto.INT4, [k, n], q.reshape(-1).tolist())]
    else:
        q, z = rng.integers(0, 16, (k, n)), rng.integers(0, 16, (k // block, n))
        tensors = [helper.make_tensor("wq", TensorProto.UINT4, [k, n], q.reshape(-1).tolist()),
                   helper.make_tensor("wz", TensorProto.UINT4, list(z.shape), z.reshape(-1).tolist())]
    w = ((q - np.repeat(z, block, 0)) * np.repeat(s, block, 0)).astype(np.float32)
    dq = helper.make_node("DequantizeLinear", ["wq", "ws"] + ([] if signed else ["wz"]), ["w"], axis=0,
                          block_size=block, name="dq")
    nodes = [dq, helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"])]
    ins, outs = [helper.make_tensor_value_info("x", F, ["b", k])], [helper.make_tensor_value_info("y", F, ["b", n])]
    g = helper.make_graph(nodes, "qdq4", ins, outs, initializer=tensors + [numpy_helper.from_array(s, "ws")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    twin = _model([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"])],
                  {"w": w}, ins, outs)
    x = rng.standard_normal((2, k)).astype(np.float32)
    a = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=1e-6)
    ra, rb = a.explain(x), onnx_lrp.Explainer(twin.SerializeToString(), composite="epsilon", epsilon=1e-6).explain(x)
    assert_close(ra.forward["y"], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
    assert_close(ra.relevance, rb.relevance, rtol=1e-5, atol=1e-6)
    size = initializer_bytes(a.relevance_model)
    assert size.get(TensorProto.INT4 if signed else TensorProto.UINT4, 0) >= k * n // 2
    assert size.get(TensorProto.FLOAT, 0) < k * n * 4 // 2, size  # no float copy of the weight
