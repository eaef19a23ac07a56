"""onnxruntime's transformer-optimizer ops (onnx_lrp/load/passes/ort_fused/) split back into standard ops.

References: onnxruntime's own com.microsoft CPU kernels (each split graph's forward, run with ORT's graph
optimisations off so that ORT cannot fuse it again, equals the contrib op on random inputs: every mask form, causal,
mask_filter_value, scale, qkv_hidden_sizes, attention_bias), and the unoptimised export: the committed tiny BERT
(tests/goldens/transformers, random weights) optimised in the test by ``optimize_model(model_type="bert")`` at
opt_level 0/1/2, with MultiHeadAttention and with the raw 2-D mask, explains like the TorchScript export it came
from (attnlrp and cp-lrp, <= 1e-5 relative L2) and like LXT's golden.
"""
from __future__ import annotations

import collections
import logging
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
from onnx_lrp import load as loader
from onnx_lrp.core.errors import UnsupportedError
from util import GOLDENS, assert_close, rel_l2

TRANSFORMERS = GOLDENS / "transformers"
F32_MIN = float(np.finfo(np.float32).min)
B, S, D, N = 2, 5, 8, 2


def _run(model, feeds, optimise=True):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimise:  # ORT's own fusions would turn the split graph back into Attention
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model if isinstance(model, (bytes, str)) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _contrib(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "t", inputs, outputs, initializer=[numpy_helper.from_array(v, k)
                                                                     for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m


def _split(m):
    """The model as onnx-lrp loads it (contrib ops split), back as ONNX bytes."""
    model = loader.load(m.SerializeToString())
    assert not [n for n in model.graph if n.domain == "com.microsoft"]
    return ir.serde.serialize_model(model).SerializeToString()


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _check(m, feeds, atol=1e-5):
    ref = _run(m, feeds)
    got = _run(_split(m), feeds, optimise=False)
    for r, g in zip(ref, got):
        assert r.dtype == g.dtype and r.shape == g.shape
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=atol)
    return ref


# ---------------------------------------------------------------------------------------------- Attention
_RNG = np.random.default_rng(0)
_MASKS = {
    "none": None,
    "end": np.array([3, 0], np.int32),  # (B): keys from the end position on are masked; 0 masks a whole row
    "end-start": np.array([4, 5, 1, 2], np.int32),  # (2B): end positions, then start positions
    "2d": np.array([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0]], np.int32),  # (B, T), a row all masked
    "3d": _RNG.integers(0, 2, (B, S, S)).astype(np.int32),  # (B, S, T)
}


@pytest.mark.parametrize("filt", [None, F32_MIN, -50.0])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("mask", list(_MASKS))
def test_attention_matches_onnxruntime(mask, causal, filt):
    rng = np.random.default_rng(1)
    x = (3 * rng.standard_normal((B, S, D))).astype(np.float32)  # scores far apart: the mask values matter
    w = rng.standard_normal((D, 3 * D)).astype(np.float32)
    b = rng.standard_normal(3 * D).astype(np.float32)
    mk = _MASKS[mask]
    attrs = dict(num_heads=N, unidirectional=causal) | ({} if filt is None else dict(mask_filter_value=filt))
    ins, feeds = [_vi("x", TensorProto.FLOAT, x.shape)], {"x": x}
    if mk is not None:
        ins.append(_vi("m", TensorProto.INT32, mk.shape))
        feeds["m"] = mk
    node = helper.make_node("Attention", ["x", "w", "b"] + (["m"] if mk is not None else []), ["y"],
                            domain="com.microsoft", name="att", **attrs)
    _check(_contrib([node], ins, [_vi("y", TensorProto.FLOAT, x.shape)], dict(w=w, b=b)), feeds)


def test_attention_scale_sizes_and_bias_match_onnxruntime():
    """qkv_hidden_sizes with a narrower V, an explicit scale and an additive attention_bias (B, N, S, T)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((B, S, D)).astype(np.float32)
    w = rng.standard_normal((D, 8 + 8 + 4)).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32)
    ab = rng.standard_normal((B, N, S, S)).astype(np.float32)
    node = helper.make_node("Attention", ["x", "w", "b", "", "", "ab"], ["y"], domain="com.microsoft", name="att",
                            num_heads=N, qkv_hidden_sizes=[8, 8, 4], scale=0.3)
    m = _contrib([node], [_vi("x", TensorProto.FLOAT, x.shape), _vi("ab", TensorProto.FLOAT, ab.shape)],
                 [_vi("y", TensorProto.FLOAT, [B, S, 4])], dict(w=w, b=b))
    _check(m, {"x": x, "ab": ab})


# ---------------------------------------------------------------------------------------------- MultiHeadAttention
@pytest.mark.parametrize("mask", ["none", "end", "2d", "3d", "causal"])
def test_multihead_attention_matches_onnxruntime(mask):
    """Separate query (B, S, D), key / value (B, L, D); bias; key_padding_mask (B), (B, L), (B, S, L)."""
    rng = np.random.default_rng(3)
    L = S if mask == "causal" else 6
    q, k, v = (rng.standard_normal((B, n, D)).astype(np.float32) * 2 for n in (S, L, L))
    bias = rng.standard_normal(3 * D).astype(np.float32)
    mk = {"none": None, "causal": None, "end": np.array([4, 1], np.int32),
          "2d": rng.integers(0, 2, (B, L)).astype(np.int32), "3d": rng.integers(0, 2, (B, S, L)).astype(np.int32)}[mask]
    ins = [_vi(n, TensorProto.FLOAT, t.shape) for n, t in zip("qkv", (q, k, v))]
    feeds = dict(q=q, k=k, v=v)
    if mk is not None:
        ins.append(_vi("m", TensorProto.INT32, mk.shape))
        feeds["m"] = mk
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "bias"] + (["m"] if mk is not None else []), ["y"],
                            domain="com.microsoft", name="mha", num_heads=N, unidirectional=int(mask == "causal"))
    _check(_contrib([node], ins, [_vi("y", TensorProto.FLOAT, q.shape)], dict(bias=bias)), feeds)


# ---------------------------------------------------------------------------------------------- embeddings, norms
@pytest.mark.parametrize("segment", [True, False])
@pytest.mark.parametrize("positions", [True, False])
def test_embed_layer_normalization_matches_onnxruntime(segment, positions):
    """Output, integer mask_index (ones per row; zeros without a mask) and embedding_sum."""
    rng = np.random.default_rng(4)
    V, P = 11, 9
    inits = dict(word=rng.standard_normal((V, D)).astype(np.float32), pos=rng.standard_normal((P, D)).astype(
        np.float32), seg=rng.standard_normal((2, D)).astype(np.float32),
        gamma=rng.standard_normal(D).astype(np.float32), beta=rng.standard_normal(D).astype(np.float32))
    feeds = {"ids": rng.integers(0, V, (B, S)).astype(np.int32),
             "mask": np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]], np.int32)}
    ins = [_vi("ids", TensorProto.INT32, [B, S])]
    names = ["ids", "", "word", "pos", "", "gamma", "beta", "mask"]
    if segment:
        feeds["segs"] = rng.integers(0, 2, (B, S)).astype(np.int32)
        ins.append(_vi("segs", TensorProto.INT32, [B, S]))
        names[1], names[4] = "segs", "seg"
    ins.append(_vi("mask", TensorProto.INT32, [B, S]))
    if positions:
        feeds["pids"] = rng.integers(0, P, (B, S)).astype(np.int32)
        ins.append(_vi("pids", TensorProto.INT32, [B, S]))
        names.append("pids")
    node = helper.make_node("EmbedLayerNormalization", names, ["y", "mask_index", "esum"], domain="com.microsoft",
                            name="eln", epsilon=1e-5)
    outs = [_vi("y", TensorProto.FLOAT, [B, S, D]), _vi("mask_index", TensorProto.INT32, [B]),
            _vi("esum", TensorProto.FLOAT, [B, S, D])]
    ref = _check(_contrib([node], ins, outs, inits), feeds)
    np.testing.assert_array_equal(ref[1], [3, 4])
    # without a mask the mask_index is zeros
    names2 = names[:7] + ([""] + names[8:] if positions else [])
    node2 = helper.make_node("EmbedLayerNormalization", names2, ["y", "mask_index"], domain="com.microsoft",
                             name="eln", epsilon=1e-5)
    feeds.pop("mask")
    ref = _check(_contrib([node2], [i for i in ins if i.name != "mask"], outs[:2], inits), feeds)
    np.testing.assert_array_equal(ref[1], [0, 0])


@pytest.mark.parametrize("bias", [True, False])
def test_skip_simplified_layer_normalization_matches_onnxruntime(bias):
    """RMS norm of input + skip (+ bias), and the sum output (index 3)."""
    rng = np.random.default_rng(5)
    x, skip = (rng.standard_normal((B, S, D)).astype(np.float32) for _ in range(2))
    inits = dict(gamma=rng.standard_normal(D).astype(np.float32), b=rng.standard_normal(D).astype(np.float32))
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"] + (["b"] if bias else []),
                            ["y", "", "", "sum"], domain="com.microsoft", name="ssln", epsilon=1e-6)
    m = _contrib([node], [_vi("x", TensorProto.FLOAT, x.shape), _vi("skip", TensorProto.FLOAT, x.shape)],
                 [_vi("y", TensorProto.FLOAT, x.shape), _vi("sum", TensorProto.FLOAT, x.shape)], inits)
    _check(m, {"x": x, "skip": skip})


# ---------------------------------------------------------------------------------------------- refusals
def test_attention_with_past_state_is_refused_in_one_line():
    rng = np.random.default_rng(6)
    w, b = rng.standard_normal((D, 3 * D)).astype(np.float32), np.zeros(3 * D, np.float32)
    node = helper.make_node("Attention", ["x", "w", "b", "", "past"], ["y", "present"], domain="com.microsoft",
                            name="att_kv", num_heads=N, unidirectional=1)
    mha = helper.make_node("MultiHeadAttention", ["y"], ["z"], domain="com.microsoft", name="mha_packed",
                           num_heads=N)
    m = _contrib([node, mha], [_vi("x", TensorProto.FLOAT, [B, S, D]), _vi("past", TensorProto.FLOAT,
                                                                             [2, B, N, 3, D // N])],
                 [_vi("z", TensorProto.FLOAT, [B, S, D])], dict(w=w, b=b))
    with pytest.raises(UnsupportedError) as info:
        loader.load(m.SerializeToString())
    msg = str(info.value)
    assert "\n" not in msg and "att_kv" in msg and "past/present" in msg  # every unsupported node at once
    assert "mha_packed" in msg and "packed" in msg


# ---------------------------------------------------------------------------------------------- real models
def _optimized(tmp_path, case, tag, model_type="bert", src=TRANSFORMERS, **opts):
    pytest.importorskip("onnxruntime.transformers.optimizer")
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    o = FusionOptions(model_type)
    if opts.pop("raw_mask", False):
        o.use_raw_attention_mask(True)
    o.use_multi_head_attention = opts.pop("mha", False)
    level = opts.pop("opt_level", 0)
    logging.getLogger("onnxruntime").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = optimize_model(str(src / f"{case}.onnx"), model_type=model_type, num_heads=4, hidden_size=16,
                           opt_level=level, use_gpu=False, optimization_options=o)
    dst = tmp_path / f"{case}_{tag}.onnx"
    m.save_model_to_file(str(dst))
    return dst, collections.Counter(n.op_type for n in onnx.load(str(dst)).graph.node
                                    if n.domain == "com.microsoft" or n.op_type == "SimplifiedLayerNormalization")


_BERT_VARIANTS = {  # (options, contrib ops the optimiser must have written)
    "level0": (dict(opt_level=0), {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization"}),
    "level1": (dict(opt_level=1), {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization"}),
    "level2": (dict(opt_level=2), {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization"}),
    "mha": (dict(mha=True), {"MultiHeadAttention", "EmbedLayerNormalization"}),
    "raw-mask": (dict(raw_mask=True), {"Attention", "EmbedLayerNormalization"}),
}


@pytest.fixture(scope="module")
def bert_reference():
    """The unoptimised TorchScript export (dynamic batch and sequence), explained on a right-padded batch."""
    path = TRANSFORMERS / "bert_ids_torchscriptdyn.onnx"
    if not path.exists():
        pytest.skip("no BERT golden export")
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 64, (3, 7)).astype(np.int64)
    mask = np.ones((3, 7), np.int64)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    ref = {c: onnx_lrp.Explainer(path, composite=c).explain(feeds) for c in ("attnlrp", "cp-lrp")}
    return feeds, ref


@pytest.mark.parametrize("variant", list(_BERT_VARIANTS))
def test_optimized_bert_explains_like_the_export(variant, bert_reference, tmp_path):
    feeds, ref = bert_reference
    opts, want = _BERT_VARIANTS[variant]
    dst, ops = _optimized(tmp_path, "bert_ids_torchscriptdyn", variant, **dict(opts))
    assert want <= set(ops), ops  # the optimiser really fused attention and embeddings
    assert_close(_run(str(dst), feeds)[0], ref["attnlrp"].outputs["logits"], rtol=1e-5, atol=1e-5)
    for comp, r0 in ref.items():
        res = onnx_lrp.Explainer(dst, composite=comp).explain(feeds)
        assert_close(res.outputs["logits"], r0.outputs["logits"], rtol=1e-5, atol=1e-5)
        assert np.all(np.isfinite(res.relevance))
        assert rel_l2(res.relevance, r0.relevance) <= 1e-5, (comp, rel_l2(res.relevance, r0.relevance))


def test_optimized_bert_matches_lxt(tmp_path):
    """The optimised model against LXT's golden relevance (tests/parity/test_transformers.py's tolerance)."""
    g = np.load(TRANSFORMERS / "bert.npz")
    dst, ops = _optimized(tmp_path, "bert_ids_torchscriptdyn", "lxt", opt_level=1)
    assert "Attention" in ops
    res = onnx_lrp.Explainer(dst, composite=str(g["composite"])).explain(
        {"input_ids": g["input_ids"], "attention_mask": g["attention_mask"]})
    np.testing.assert_allclose(res.outputs["logits"], g["logits"], rtol=1e-4, atol=1e-4)
    assert rel_l2(res.relevance, g["relevance_tokens"]) <= 1e-3


def test_optimized_bert_mask_index_is_the_deployed_forward(bert_reference, tmp_path):
    """ORT's mask_index (ones per row, keys from there on masked) assumes right padding: on a left-padded batch the
    optimised model computes something else than the export, and onnx-lrp explains what the optimised model
    computes (its forward equals onnxruntime's run of the optimised file)."""
    feeds, _ = bert_reference
    left = {"input_ids": feeds["input_ids"], "attention_mask": feeds["attention_mask"][:, ::-1].copy()}
    dst, _ = _optimized(tmp_path, "bert_ids_torchscriptdyn", "left", opt_level=1)
    deployed = _run(str(dst), left)[0]
    export = _run(str(TRANSFORMERS / "bert_ids_torchscriptdyn.onnx"), left)[0]
    assert np.abs(deployed - export).max() > 1e-2  # the optimised model itself differs on left padding
    res = onnx_lrp.Explainer(dst, composite="attnlrp").explain(left)
    assert_close(res.outputs["logits"], deployed, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout,interleaved,positions,partial", [
    ("4d", 0, "ids", False), ("4d", 1, "ids", False), ("3d", 0, "ids", False), ("3d", 1, "offset", False),
    ("4d", 0, "offset", False), ("3d", 0, "ids", True), ("3d", 1, "ids", True)])
def test_rotary_embedding_matches_onnxruntime(layout, interleaved, positions, partial):
    """(B, N, S, H) and (B, S, N*H) inputs, half-rotation and interleaved pairs, position ids (B, S) or an offset (1),
    rotary_embedding_dim below the head size (the rest passes)."""
    rng = np.random.default_rng(8)
    h, n, p = 8, 2, 16
    rd = 4 if partial else h
    ang = np.arange(p)[:, None] / (10000 ** (np.arange(0, rd, 2) / rd))[None]
    inits = dict(cos=np.cos(ang).astype(np.float32), sin=np.sin(ang).astype(np.float32))
    x = rng.standard_normal((B, n, S, h) if layout == "4d" else (B, S, n * h)).astype(np.float32)
    pos = rng.integers(0, p, (B, S)).astype(np.int64) if positions == "ids" else np.array([3], np.int64)
    attrs = dict(interleaved=interleaved) | (dict(num_heads=n, rotary_embedding_dim=rd) if partial else {})
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft",
                            name="rot", **attrs)
    m = _contrib([node], [_vi("x", TensorProto.FLOAT, x.shape), _vi("pos", TensorProto.INT64, pos.shape)],
                 [_vi("y", TensorProto.FLOAT, x.shape)], inits)
    _check(m, {"x": x, "pos": pos})


_OTHERS = {  # export, optimiser model type, opt_level, (contrib) ops the optimiser must have written
    "llama-level0": ("llama_ids_torchscriptdyn", "gpt2", 0, {"RotaryEmbedding", "SkipSimplifiedLayerNormalization",
                                                             "SimplifiedLayerNormalization"}),
    "llama-level1": ("llama_ids_torchscriptdyn", "gpt2", 1, {"SkipSimplifiedLayerNormalization",
                                                             "SimplifiedLayerNormalization"}),
    "gpt2-level1": ("gpt2_ids_torchscriptdyn", "gpt2", 1, {"SkipLayerNormalization", "FastGelu"}),
    "vit-level2": ("vit_image_torchscript", "vit", 2, {"SkipLayerNormalization", "BiasGelu"}),
}
_REFS: dict = {}


@pytest.mark.parametrize("variant", list(_OTHERS))
def test_optimized_llama_gpt2_vit_explain_like_the_export(variant, tmp_path):
    """LLaMA (RMS norms, rotary embeddings, grouped-query attention left unfused), GPT-2 and ViT: the optimiser
    fuses their norms, GELUs and rotary embeddings (not their attention: these exports' attention patterns are not
    the ones it matches); the relevance equals the export's."""
    case, model_type, level, want = _OTHERS[variant]
    if not (TRANSFORMERS / f"{case}.onnx").exists():
        pytest.skip("no golden export")
    g = np.load(TRANSFORMERS / f"{case.split('_')[0]}.npz")
    feeds = {"image": g["image"]} if "image" in case else {"input_ids": g["input_ids"]}
    dst, ops = _optimized(tmp_path, case, variant, model_type=model_type, opt_level=level)
    assert want <= set(ops), ops
    for comp in ("attnlrp", "cp-lrp"):
        if (case, comp) not in _REFS:
            _REFS[case, comp] = onnx_lrp.Explainer(TRANSFORMERS / f"{case}.onnx", composite=comp).explain(feeds)
        r0 = _REFS[case, comp]
        res = onnx_lrp.Explainer(dst, composite=comp).explain(feeds)
        name = list(r0.outputs)[0]
        assert_close(res.outputs[name], r0.outputs[name], rtol=1e-5, atol=1e-5)
        assert rel_l2(res.relevance, r0.relevance) <= 1e-5, (comp, rel_l2(res.relevance, r0.relevance))


def test_optimized_float16_bert_is_upcast_then_split(tmp_path, bert_reference):
    """optimize_model -> convert_float_to_float16 (the usual GPU deployment): upcast before the split, so the split's
    float32 constants fit; outputs equal onnxruntime's float16 run to float16 rounding, relevance the float32
    export's to the float16 rounding of the weights (a wrong mask or scale would be off by O(1))."""
    feeds, ref = bert_reference
    dst, ops = _optimized(tmp_path, "bert_ids_torchscriptdyn", "fp32", opt_level=1)
    from onnxruntime.transformers.onnx_model import OnnxModel

    m = OnnxModel(onnx.load(str(dst)))
    m.convert_float_to_float16(keep_io_types=True)
    half = tmp_path / "bert_fp16.onnx"
    m.save_model_to_file(str(half))
    inits = onnx.load(str(half)).graph.initializer
    assert "Attention" in ops and any(i.data_type == TensorProto.FLOAT16 for i in inits)
    res = onnx_lrp.Explainer(half, composite="attnlrp").explain(feeds)
    np.testing.assert_allclose(res.outputs["logits"], _run(str(half), feeds)[0], rtol=1e-2, atol=1e-3)
    assert np.all(np.isfinite(res.relevance))
    assert rel_l2(res.relevance, ref["attnlrp"].relevance) <= 5e-3


def test_bias_add_and_bias_split_gelu_numpy_oracle():
    """BiasAdd and BiasSplitGelu (diffusion models; onnxruntime has CUDA kernels only): ContribOperators.md's
    formulas in numpy, x + bias + skip and left * gelu(right) of the halves of x + bias."""
    from math import erf

    rng = np.random.default_rng(9)
    x, skip = (rng.standard_normal((B, S, D)).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal(D).astype(np.float32)
    nodes = [helper.make_node("BiasAdd", ["x", "bias", "skip"], ["a"], domain="com.microsoft", name="badd"),
             helper.make_node("BiasSplitGelu", ["a", "bias"], ["y"], domain="com.microsoft", name="bsg")]
    m = _contrib(nodes, [_vi("x", TensorProto.FLOAT, x.shape), _vi("skip", TensorProto.FLOAT, x.shape)],
                 [_vi("y", TensorProto.FLOAT, [B, S, D // 2])], dict(bias=bias))
    a = x.astype(np.float64) + bias + skip + bias
    left, right = a[..., :D // 2], a[..., D // 2:]
    ref = left * 0.5 * right * (1 + np.vectorize(erf)(right / np.sqrt(2)))
    got = _run(_split(m), {"x": x, "skip": skip}, optimise=False)[0]
    assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_optimized_hf_vit_attention_explains_like_the_export(tmp_path):
    """transformers 4.26's ViT (scripts/make_fused_exports.py): the optimiser fuses its attention (no mask) into
    Attention; the relevance equals the export's."""
    src = GOLDENS / "fused"
    if not (src / "vit_hf426.onnx").exists():
        pytest.skip("no vit_hf426.onnx (python scripts/make_fused_exports.py)")
    dst, ops = _optimized(tmp_path, "vit_hf426", "opt", model_type="vit", src=src, opt_level=1)
    assert {"Attention", "SkipLayerNormalization"} <= set(ops), ops
    x = np.random.default_rng(10).standard_normal((2, 3, 32, 32)).astype(np.float32)
    for comp in ("attnlrp", "cp-lrp"):
        r0 = onnx_lrp.Explainer(src / "vit_hf426.onnx", composite=comp).explain(x)
        res = onnx_lrp.Explainer(dst, composite=comp).explain(x)
        assert_close(res.outputs["logits"], r0.outputs["logits"], rtol=1e-5, atol=1e-5)
        assert rel_l2(res.relevance, r0.relevance) <= 1e-5, (comp, rel_l2(res.relevance, r0.relevance))


def test_attention_dynamic_batch_mask_forms():
    """A 1-D mask whose length is the input's symbolic batch is (B); one of another symbolic length cannot be told
    from (2B) when splitting: refused in one line naming the node."""
    rng = np.random.default_rng(11)
    w, b = rng.standard_normal((D, 3 * D)).astype(np.float32), rng.standard_normal(3 * D).astype(np.float32)
    x = rng.standard_normal((3, S, D)).astype(np.float32)
    for mask_dim, ok in (("batch", True), ("n", False)):
        node = helper.make_node("Attention", ["x", "w", "b", "m"], ["y"], domain="com.microsoft", name="att_dyn",
                                num_heads=N)
        m = _contrib([node], [_vi("x", TensorProto.FLOAT, ["batch", S, D]), _vi("m", TensorProto.INT32, [mask_dim])],
                     [_vi("y", TensorProto.FLOAT, ["batch", S, D])], dict(w=w, b=b))
        if ok:
            _check(m, {"x": x, "m": np.array([2, 5, 0], np.int32)})
        else:
            with pytest.raises(UnsupportedError, match="att_dyn.*1-D mask of length n"):
                loader.load(m.SerializeToString())


@pytest.mark.parametrize("case", ["full", "padded", "window", "packed", "mqa"])
def test_group_query_attention_prompt_matches_onnxruntime(case):
    """A prompt without past state: causal, keys after seqlens_k masked (right padding), local window, packed QKV,
    one KV head; output and present_key / present_value against the kernel."""
    rng = np.random.default_rng(12)
    n, nkv, h = 4, (1 if case == "mqa" else 2), 8
    q = (2 * rng.standard_normal((B, S, n * h))).astype(np.float32)
    k = (2 * rng.standard_normal((B, S, nkv * h))).astype(np.float32)
    v = rng.standard_normal((B, S, nkv * h)).astype(np.float32)
    seqlens = np.array([S - 1, 2 if case == "padded" else S - 1], np.int32)
    feeds = {"sl": seqlens, "tot": np.array(S, np.int32)}
    if case == "packed":
        feeds["q"] = np.concatenate([q, k, v], -1)
        ins, names = [_vi("q", TensorProto.FLOAT, feeds["q"].shape)], ["q", "", ""]
    else:
        feeds.update(q=q, k=k, v=v)
        ins, names = [_vi(x, TensorProto.FLOAT, feeds[x].shape) for x in "qkv"], ["q", "k", "v"]
    ins += [_vi("sl", TensorProto.INT32, [B]), _vi("tot", TensorProto.INT32, [])]
    node = helper.make_node("GroupQueryAttention", names + ["", "", "sl", "tot"], ["y", "pk", "pv"],
                            domain="com.microsoft", name="gqa", num_heads=n, kv_num_heads=nkv,
                            local_window_size=2 if case == "window" else -1)
    outs = [_vi("y", TensorProto.FLOAT, [B, S, n * h]), _vi("pk", TensorProto.FLOAT, [B, nkv, S, h]),
            _vi("pv", TensorProto.FLOAT, [B, nkv, S, h])]
    _check(_contrib([node], ins, outs, {}), feeds)


