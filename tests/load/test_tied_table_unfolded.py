"""onnxruntime-genai's tied int4 embedding at full size: GatherBlockQuantized reads the head's MatMulNBits weight
through a Reshape too large for constant folding (LLaMA-3.2-1B: 128256 x 1024 bytes). It is read through the Reshape
(here with the folding limit lowered to force that case): the forward equals onnxruntime's run of the original and the
relevance model holds the packed table once, with no Reshape of it left."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
from onnx_lrp.load import fold
from util import assert_close, ort_session


def test_tied_table_read_through_an_unfolded_reshape(monkeypatch):
    vocab, k, block = 24, 32, 16
    rng = np.random.default_rng(9)
    nb = k // block
    q = rng.integers(0, 16, (vocab, k)).astype(np.uint8)
    s = (0.05 + 0.1 * rng.random((vocab, nb))).astype(np.float32)
    w = ((q.reshape(vocab, nb, block).astype(np.float32) - 8) * s[:, :, None]).reshape(vocab, k).T  # (K, N)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    inits = [numpy_helper.from_array(packed.reshape(vocab, nb, block // 2), "B"),
             numpy_helper.from_array(s, "scales"), numpy_helper.from_array(np.array([vocab, k // 2], np.int64), "shp")]
    nodes = [helper.make_node("Reshape", ["B", "shp"], ["table"], name="tie"),
             helper.make_node("GatherBlockQuantized", ["table", "ids", "scales"], ["e"], domain="com.microsoft",
                              name="embed", gather_axis=0, quantize_axis=1, block_size=block, bits=4),
             helper.make_node("Tanh", ["e"], ["r"], name="act"),
             helper.make_node("MatMulNBits", ["r", "B", "scales"], ["logits"], domain="com.microsoft", name="head",
                              K=k, N=vocab, bits=4, block_size=block, accuracy_level=0)]
    g = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    ids = np.array([[1, 5, 23, 5]], np.int64)
    ref = ort_session(m.SerializeToString()).run(None, {"ids": ids})[0]
    assert_close(ref, np.tanh(w.T[ids]) @ w, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(fold, "_FOLD_LIMIT", 16)  # the table is "too large to fold"
    ex = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=1e-6)
    res = ex.explain({"ids": ids})
    assert_close(res.forward["logits"], ref, rtol=1e-5, atol=1e-5)
    rel = onnx.load_model_from_string(ex.relevance_model.model_bytes).graph
    assert not any(n.op_type in ("Reshape", "GatherBlockQuantized", "MatMulNBits") and n.name == "tie"
                   for n in rel.node)
    # one packed table: 4-bit (vocab, k), or its rows as MatMulNBits keeps them (building.transient_weights)
    four = [t for t in rel.initializer if t.data_type in (TensorProto.INT4, TensorProto.UINT4) or
            t.data_type == TensorProto.UINT8 and list(t.dims) == [vocab, nb, block // 2]]
    assert len(four) == 1 and list(four[0].dims) in ([vocab, k], [vocab, nb, block // 2]), \
        [(t.name, t.dims) for t in four]
