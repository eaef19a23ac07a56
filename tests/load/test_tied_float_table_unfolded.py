"""onnxruntime-genai's tied float32 head at full size: the embedding Gather reads Transpose(lm_head weight), 128256 x
2048 elements at LLaMA-3.2-1B's size, over the constant-folding limit. A layout op on a float weight is folded at any
size (here with the limit lowered to force the case): the lookup is an embedding lookup again, not a path the
relevance cannot start from (the 1B fp32 folder was refused: "no relevance path from any input to 'logits'")."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
from onnx_lrp.load import fold
from util import GOLDENS, assert_close, ort_session, rel_l2


def _tied(vocab: int = 24, hidden: int = 8) -> tuple:
    rng = np.random.default_rng(4)
    w = rng.normal(size=(hidden, vocab)).astype(np.float32)  # lm_head weight (hidden, vocab); the table is its transpose
    nodes = [helper.make_node("Transpose", ["W"], ["table"], perm=[1, 0], name="tie"),
             helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("Tanh", ["e"], ["r"], name="act"),
             helper.make_node("MatMul", ["r", "W"], ["logits"], name="head")]
    g = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])],
                          initializer=[numpy_helper.from_array(w, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString(), w


def test_tied_float_table_read_through_an_unfolded_transpose(monkeypatch):
    model, w = _tied()
    ids = np.array([[1, 5, 23, 5]], np.int64)
    ref = ort_session(model).run(None, {"ids": ids})[0]
    monkeypatch.setattr(fold, "_FOLD_LIMIT", 16)  # the table (192 elements) is "too large to fold"
    ex = onnx_lrp.Explainer(model, composite="epsilon", epsilon=1e-9)
    res = ex.explain({"ids": ids}, target=3, position=-1)
    assert_close(res.forward["logits"], ref, rtol=1e-6, atol=1e-6)
    # LRP-epsilon through a per-position Tanh and one product: the last token's relevance is its whole logit
    # (conservation), every other token's zero (the head reads only its own position)
    expected = np.array([[0, 0, 0, ref[0, -1, 3]]])
    assert_close(np.asarray(res.relevance, np.float64), expected, rtol=1e-5, atol=1e-6)
    rel = onnx.load_model_from_string(ex.relevance_model.model_bytes).graph
    assert not any(n.name == "tie" for n in rel.node)


def test_genai_tied_fp32_folder_over_the_folding_limit(monkeypatch):
    """The real builder folder (Qwen2, tied embeddings: its table is Transpose(lm_head.MatMul.weight)): with the table
    over the limit the relevance is the same as with it folded under it."""
    path = GOLDENS / "llm" / "qwen2_genai_fp32" / "model.onnx"
    if not path.exists():
        pytest.skip("no qwen2_genai_fp32 (scripts/make_llm_models.py makes it)")
    ids = np.array([[3, 17, 42, 8, 99]], np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}

    def explained():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", onnx_lrp.LrpWarning)
            e = onnx_lrp.Explainer(str(path), composite="attnlrp", start="logit")
            return e.explain({k: v for k, v in feeds.items() if k in [s.name for s in e.inputs]})

    folded = explained()
    monkeypatch.setattr(fold, "_FOLD_LIMIT", 16)
    relaid = explained()
    assert np.array_equal(np.asarray(relaid.target), np.asarray(folded.target))
    assert rel_l2(np.asarray(relaid.relevance, np.float64), np.asarray(folded.relevance, np.float64)) <= 1e-6
    assert_close(relaid.forward["logits"], folded.forward["logits"], rtol=1e-6, atol=1e-6)
