"""The deployed forms of one decoder explain alike: optimum's export with past like the one without; onnxruntime-genai's
fp32 folder (GroupQueryAttention with past and do_rotary, SkipSimplifiedLayerNormalization) like optimum's export
without past and like LXT on the Hugging Face model it was built from; its int4 folder (MatMulNBits, GatherBlockQuantized) like its float twin (the same weights
dequantized in numpy, activations not quantized), with the 4-bit weights kept packed in the relevance model. Two
architectures: a LLaMA with grouped-query attention and a Qwen2 with QKV biases and tied embeddings
(tests/goldens/llm/, made by scripts/make_llm_models.py); skipped where a model is not there."""
from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
from onnx_lrp.run import deployed_gap
from util import GOLDENS, assert_close, rel_l2

LLM = GOLDENS / "llm"
ARCHS = ("llama", "qwen2")


def _need(*paths):
    missing = [p for p in paths if not p.exists()]
    if missing:
        pytest.skip(f"no {missing[0].name} in {LLM} (scripts/make_llm_models.py makes it)")


def _refs(arch: str) -> dict:
    _need(LLM / f"{arch}.npz")
    return dict(np.load(LLM / f"{arch}.npz"))


@functools.lru_cache(maxsize=None)
def _explained(source, arch: str):
    """attnlrp relevance per prompt token of the last position's arg-max logit (start="logit", as LXT seeds it), the
    logits and the relevance model (``source``: a path, or model bytes)."""
    ids = _refs(arch)["prompt_ids"].astype(np.int64)[None]
    with warnings.catch_warnings():  # int4 with accuracy_level 4: the deployed gap, said
        warnings.simplefilter("ignore", onnx_lrp.LrpWarning)
        e = onnx_lrp.Explainer(source if isinstance(source, bytes) else str(source), composite="attnlrp",
                               start="logit")
        names = [s.name for s in e.inputs]
        fill = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(ids.shape[1])[None]}
        res = e.explain({k: v for k, v in fill.items() if k in names})
    return np.asarray(res.relevance, np.float64)[0], int(np.asarray(res.target).reshape(-1)[0]), \
        np.asarray(res.forward["logits"]), e.relevance_model, res.deployed_gap


@pytest.mark.parametrize("arch", ARCHS)
def test_genai_fp32_explains_like_optimum_without_past(arch):
    genai, optimum = LLM / f"{arch}_genai_fp32" / "model.onnx", LLM / f"{arch}_optimum_nopast.onnx"
    _need(genai, optimum)
    a, b = _explained(genai, arch), _explained(optimum, arch)
    assert a[1] == b[1]
    assert rel_l2(a[0], b[0]) <= 1e-5, rel_l2(a[0], b[0])
    refs = _refs(arch)
    if "genai_fp32_logits" in refs:  # the explained forward is onnxruntime-genai's own
        g = refs["genai_fp32_logits"].reshape(a[2].shape[-2:])[-1]
        assert_close(a[2][0, -1], g, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_optimum_with_past_explains_like_without(arch):
    """optimum's text-generation-with-past export: the past fed empty, the present dropped; the relevance equals the
    export without past (<= 1e-6)."""
    past, nopast = LLM / f"{arch}_optimum_past.onnx", LLM / f"{arch}_optimum_nopast.onnx"
    _need(past, nopast)
    a, b = _explained(past, arch), _explained(nopast, arch)
    assert a[1] == b[1]
    assert_close(a[0], b[0], rtol=0, atol=1e-6)
    assert_close(a[2], b[2], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_genai_fp32_matches_lxt(arch):
    genai = LLM / f"{arch}_genai_fp32" / "model.onnx"
    _need(genai)
    refs = _refs(arch)
    rel, target = _explained(genai, arch)[:2]
    assert target == int(refs["lxt_target"])
    own = rel_l2(refs["lxt_relevance32"], refs["lxt_relevance64"])  # LXT's own float32 distance to float64
    assert rel_l2(rel, refs["lxt_relevance64"]) <= max(1e-5, 3 * own)


def float_twin(path) -> bytes:
    """The int4 model with every MatMulNBits a MatMul (+ Add) and every GatherBlockQuantized a Gather of the weights
    dequantized here in numpy ((q - zero point) * scale per block; zero point 2^(bits-1) when absent)."""
    m = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    for node in m.graph.node:  # the tied embedding's table: a Reshape of the head's packed weight
        if node.op_type == "Constant" and node.attribute[0].name == "value":
            inits[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        elif node.op_type == "Reshape" and all(i in inits for i in node.input):
            inits[node.output[0]] = inits[node.input[0]].reshape(inits[node.input[1]])
    arr = inits.__getitem__
    nodes, new_inits = [], []
    for node in m.graph.node:
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        if node.op_type == "MatMulNBits":
            k, n, bits, bs = a["K"], a["N"], a.get("bits", 4), a["block_size"]
            q = _unpack(arr(node.input[1]).reshape(n, -1), bits)
            nb = -(-k // bs)
            s = arr(node.input[2]).reshape(n, nb).astype(np.float32)
            z = _zeros(node, arr, (n, nb), bits)
            w = ((q[:, :nb * bs].reshape(n, nb, bs) - z[:, :, None]) * s[:, :, None]).reshape(n, -1)[:, :k]
            new_inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T), node.name + "/W"))
            out = node.output[0]
            bias = node.input[5] if len(node.input) > 5 and node.input[5] else None
            nodes.append(helper.make_node("MatMul", [node.input[0], node.name + "/W"],
                                          [out + "/mm" if bias else out], name=node.name))
            if bias:
                nodes.append(helper.make_node("Add", [out + "/mm", bias], [out], name=node.name + "/bias"))
        elif node.op_type == "GatherBlockQuantized":
            bits, bs = a.get("bits", 4), a.get("block_size", 128)
            data = arr(node.input[0])
            q = _unpack(data, bits) if data.dtype == np.uint8 else data.astype(np.float32) + 2 ** (bits - 1)
            v, hidden = q.shape
            s = arr(node.input[2]).reshape(v, -1).astype(np.float32)
            z = _zeros(node, arr, s.shape, bits)
            table = ((q.reshape(v, -1, bs) - z[:, :, None]) * s[:, :, None]).reshape(v, hidden)
            new_inits.append(numpy_helper.from_array(table.astype(np.float32), node.name + "/table"))
            nodes.append(helper.make_node("Gather", [node.name + "/table", node.input[1]], [node.output[0]],
                                          name=node.name, axis=0))
        else:
            nodes.append(node)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    m.graph.initializer.extend(new_inits)
    return m.SerializeToString()


def _unpack(b: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return b.astype(np.float32)
    out = np.empty(b.shape[:-1] + (2 * b.shape[-1],), np.float32)
    out[..., 0::2], out[..., 1::2] = b & 0x0F, b >> 4
    return out


def _zeros(node, arr, shape, bits) -> np.ndarray:
    if len(node.input) > 3 and node.input[3]:
        z = arr(node.input[3])
        if z.dtype == np.uint8:
            return _unpack(z.reshape(shape[0], -1), bits)[:, :shape[1]]
        return z.reshape(shape).astype(np.float32)
    return np.full(shape, 2 ** (bits - 1), np.float32)


@pytest.mark.parametrize("arch", ARCHS)
def test_genai_int4_explains_like_its_float_twin_with_weights_kept_packed(arch):
    int4 = LLM / f"{arch}_genai_int4" / "model.onnx"
    _need(int4)
    a = _explained(int4, arch)
    b = _explained(float_twin(int4), arch)
    assert a[1] == b[1]
    assert rel_l2(a[0], b[0]) <= 1e-5, rel_l2(a[0], b[0])
    # int4 stays int4: the relevance model's initializers within 1.2x the folder's weights
    m = onnx.load(str(int4))
    folder = sum(_nbytes(t) for t in m.graph.initializer)
    rm = a[3]
    held = sum(_nbytes(t) for t in onnx.load_from_string(rm.model_bytes).graph.initializer) + \
        sum(x.nbytes for x in rm.model_arrays.values())
    assert held <= 1.2 * folder, (held, folder)
    # accuracy_level 4 (the builder's CPU default, the LLaMA's): the deployed model runs beside, its past fed empty,
    # and its gap (int8 activations) is measured and said
    levels = {helper.get_attribute_value(x) for n in m.graph.node if n.op_type == "MatMulNBits" for x in n.attribute
              if x.name == "accuracy_level"}
    gap = a[4]
    assert (gap is not None) == (4 in levels)
    if gap is not None and gap.beyond:
        assert gap.reason == deployed_gap.INT8_ACTIVATIONS


def _nbytes(t: onnx.TensorProto) -> int:
    size = int(np.prod(t.dims)) if t.dims else 1
    if t.data_type in (TensorProto.INT4, TensorProto.UINT4):
        return (size + 1) // 2
    return size * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
