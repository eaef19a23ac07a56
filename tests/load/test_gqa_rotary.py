"""GroupQueryAttention as onnxruntime-genai's model builder writes it: ``do_rotary`` (cos/sin caches,
``rotary_interleaved`` 0/1, partial rotary, ``position_ids``), packed QKV, past key/value graph inputs fed empty by
the loader, seqlens_k / total_sequence_length computed from the attention mask; and the simplified (RMS) norms.
Each against onnxruntime's own run of the contrib node (forward to float rounding); the relevance through the
rotary inside GQA equals the relevance through a separate RotaryEmbedding node before it."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
from onnx_lrp import load as loader
from util import assert_close, ort_session

B, S, NQ, NKV, H = 2, 5, 4, 2, 32
MAXLEN = 16
F = TensorProto.FLOAT




def _caches(rd: int):
    inv = 1.0 / (10000 ** (np.arange(0, rd, 2) / rd))
    ang = np.outer(np.arange(MAXLEN), inv)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _model(case: str, rd: int = H, interleaved: int = 0) -> onnx.ModelProto:
    """x (B, S, D) -> MatMul to q, k, v (or one packed QKV) -> GroupQueryAttention (do_rotary) with the past as graph
    inputs and the present as graph outputs (genai's layout), seqlens_k = sum(mask) - 1 and total = mask length
    computed in the graph as the builder does -> MatMul to logits."""
    rng = np.random.default_rng(3)
    d = 16
    w = {t: (0.5 * rng.standard_normal((d, n * H))).astype(np.float32) for t, n in (("q", NQ), ("k", NKV), ("v", NKV))}
    cos, sin = _caches(rd)
    inits = dict(cos_cache=cos, sin_cache=sin, wo=rng.standard_normal((NQ * H, 7)).astype(np.float32),
                 one=np.array([1], np.int64), i1=np.array(1, np.int32))
    mk = helper.make_node
    nodes = [mk("ReduceSum", ["attention_mask", "one"], ["msum"], keepdims=0),
             mk("Cast", ["msum"], ["msum32"], to=TensorProto.INT32), mk("Sub", ["msum32", "i1"], ["seqlens_k"]),
             mk("Shape", ["attention_mask"], ["mshape"], start=1, end=2),
             mk("Cast", ["mshape"], ["tot1"], to=TensorProto.INT32), mk("Squeeze", ["tot1"], ["total"])]
    if case == "packed":
        inits["wqkv"] = np.concatenate([w["q"], w["k"], w["v"]], 1)
        nodes.append(mk("MatMul", ["x", "wqkv"], ["qkv"]))
        qkv = ["qkv", "", ""]
    else:
        inits.update({f"w{t}": w[t] for t in "qkv"})
        nodes += [mk("MatMul", ["x", f"w{t}"], [t]) for t in "qkv"]
        qkv = ["q", "k", "v"]
    extra = ["position_ids"] if case == "positions" else []
    nodes.append(mk("GroupQueryAttention", qkv + ["past_key_values.0.key", "past_key_values.0.value", "seqlens_k",
                                                  "total", "cos_cache", "sin_cache"] + extra,
                    ["attn", "present.0.key", "present.0.value"], domain="com.microsoft", name="gqa",
                    num_heads=NQ, kv_num_heads=NKV, do_rotary=1, rotary_interleaved=interleaved))
    nodes.append(mk("MatMul", ["attn", "wo"], ["logits"]))
    ins = [_vi("x", F, ["batch_size", "sequence_length", d]), _vi("attention_mask", TensorProto.INT64,
                                                                  ["batch_size", "total_sequence_length"])]
    ins += [_vi(f"past_key_values.0.{t}", F, ["batch_size", NKV, "past_sequence_length", H]) for t in ("key", "value")]
    if extra:
        ins.append(_vi("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]))
    outs = [_vi("logits", F, ["batch_size", "sequence_length", 7])]
    outs += [_vi(f"present.0.{t}", F, ["batch_size", NKV, "total_sequence_length", H]) for t in ("key", "value")]
    g = helper.make_graph(nodes, "gqa", ins, outs, initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m


def _feeds(case: str):
    rng = np.random.default_rng(4)
    mask = np.ones((B, S), np.int64)
    if case == "padded":
        mask[1, 3:] = 0  # right padding: keys after the last valid one masked
    f = {"x": rng.standard_normal((B, S, 16)).astype(np.float32), "attention_mask": mask}
    if case == "positions":
        f["position_ids"] = np.array([[0, 1, 2, 3, 4], [2, 3, 4, 5, 6]], np.int64)
    return f


CASES = [("plain", H, 0), ("packed", H, 1), ("padded", H, 0), ("positions", H, 1), ("partial", H // 2, 0),
         ("partial", H // 2, 1)]


@pytest.mark.parametrize("case, rd, inter", CASES, ids=[f"{c}-rd{r}-i{i}" for c, r, i in CASES])
def test_gqa_rotary_with_empty_past_matches_onnxruntime(case, rd, inter):
    m = _model(case, rd, inter)
    feeds = _feeds(case)
    empty = np.zeros((B, NKV, 0, H), np.float32)
    ref = ort_session(m.SerializeToString()).run(None, {**feeds, "past_key_values.0.key": empty,
                                                     "past_key_values.0.value": empty})
    model = loader.load(m.SerializeToString())
    assert not [n for n in model.graph if n.domain == "com.microsoft"]
    assert [v.name for v in model.graph.outputs] == ["logits"]
    import onnx_ir as ir
    got = ort_session(ir.serde.serialize_model(model).SerializeToString(), optimise=False).run(None, feeds)
    assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)


def _twin_with_rotary_nodes(interleaved: int) -> onnx.ModelProto:
    """The "positions" model with the rotation as separate RotaryEmbedding nodes on q and k and GQA without
    do_rotary: the same function, another split."""
    m = _model("positions", H, interleaved)
    g = m.graph
    gqa = next(n for n in g.node if n.op_type == "GroupQueryAttention")
    rot = [helper.make_node("RotaryEmbedding", [t, "position_ids", "cos_cache", "sin_cache"], [f"{t}_rot"],
                            domain="com.microsoft", name=f"rot_{t}", num_heads=n, interleaved=interleaved)
           for t, n in (("q", NQ), ("k", NKV))]
    idx = list(g.node).index(gqa)
    for r in reversed(rot):
        g.node.insert(idx, r)
    new = helper.make_node("GroupQueryAttention", ["q_rot", "k_rot", "v"] + list(gqa.input[3:7]),
                           list(gqa.output), domain="com.microsoft", name="gqa", num_heads=NQ, kv_num_heads=NKV)
    g.node.remove(gqa)
    g.node.insert(idx + 2, new)
    return m


@pytest.mark.parametrize("interleaved", [1])
def test_gqa_rotary_relevance_equals_separate_rotary_nodes(interleaved):
    feeds = _feeds("positions")
    a = onnx_lrp.Explainer(_model("positions", H, interleaved).SerializeToString(), composite="attnlrp")
    b = onnx_lrp.Explainer(_twin_with_rotary_nodes(interleaved).SerializeToString(), composite="attnlrp")
    ra, rb = a.explain(feeds), b.explain(feeds)
    np.testing.assert_array_equal(ra.target, rb.target)
    assert a.relevance_inputs == b.relevance_inputs == ["x"]  # none for position_ids
    rel_a, rel_b = ra.relevance, rb.relevance
    assert np.abs(rel_b).max() > 1e-3
    assert_close(rel_a, rel_b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias", [True])
def test_simplified_norms_as_the_builder_writes_them_match_onnxruntime(bias):
    """SimplifiedLayerNormalization (default domain) -> SkipSimplifiedLayerNormalization (its sum output used by the
    next residual), as the genai builder chains them."""
    rng = np.random.default_rng(5)
    d = 16
    inits = {"g1": rng.standard_normal(d).astype(np.float32), "g2": rng.standard_normal(d).astype(np.float32),
             "w": rng.standard_normal((d, d)).astype(np.float32), "bb": rng.standard_normal(d).astype(np.float32)}
    mk = helper.make_node
    nodes = [mk("SimplifiedLayerNormalization", ["x", "g1"], ["n1"], axis=-1, epsilon=1e-5, stash_type=1, name="sln"),
             mk("MatMul", ["n1", "w"], ["h"]),
             mk("SkipSimplifiedLayerNormalization", ["h", "x", "g2"] + (["bb"] if bias else []),
                ["n2", "", "", "sum"], domain="com.microsoft", epsilon=1e-6, name="ssln"),
             mk("Add", ["n2", "sum"], ["y"])]
    g = helper.make_graph(nodes, "norms", [_vi("x", F, ["batch", "seq", d])], [_vi("y", F, ["batch", "seq", d])],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    x = (3 * rng.standard_normal((2, 4, d))).astype(np.float32)
    ref = ort_session(m.SerializeToString()).run(None, {"x": x})[0]
    e = onnx_lrp.Explainer(m.SerializeToString(), composite="attnlrp")
    got = e.explain({"x": x}, target=(3, 0))
    assert_close(got.forward["y"], ref, rtol=1e-5, atol=1e-6)
    assert np.isfinite(got.relevance).all()


def test_position_ids_carry_no_relevance():
    """cos/sin gathered at position_ids are positions, not token embeddings: position_ids 0..S-1 give the relevance
    of the model whose positions come from the sequence length, and no relevance of their own."""
    feeds = _feeds("positions")
    feeds["position_ids"] = np.tile(np.arange(S), (B, 1))
    a = onnx_lrp.Explainer(_model("positions").SerializeToString(), composite="attnlrp")
    b = onnx_lrp.Explainer(_model("plain").SerializeToString(), composite="attnlrp")
    assert a.relevance_inputs == ["x"]
    ra, rb = a.explain(feeds), b.explain({k: v for k, v in feeds.items() if k != "position_ids"})
    assert np.abs(rb.relevance).max() > 1e-3
    assert_close(ra.relevance, rb.relevance, rtol=1e-6, atol=1e-7)
