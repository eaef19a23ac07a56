"""benchmarks/llama_graph.py: the LLaMA graph bench_llm writes directly (its 1b / 8b rows) is the graph torch.onnx
exports (benchmarks/llama_export.py: transformers' LlamaForCausalLM, TorchScript exporter, opset 17).

* With transformers (skipped without it; 5.x and 4.x, whose exports differ in the rotary table's nodes): at
  bench_llm's ``tiny`` shape, in float32, float16 and bfloat16, the direct graph given the exported model's weights
  is the export node for node: the same nodes in the same order (the exporter's order is deterministic, so the check
  is positional, not per-layer multisets), with the same names, op types, attributes and Constant tensors (type,
  shape, values), the same wiring (every input is the same node's output, or an initializer of the same type, shape
  and values), the same graph inputs and outputs; onnxruntime
  computes the same logits from both (float32, float16: bit for bit), and onnx-lrp's attnlrp relevance of both is
  the same (bit for bit).
* Always: the direct graph with its own drawn weights computes LLaMA as a numpy float64 transcription of the
  architecture does (RMSNorm, rotary embedding, grouped-query causal attention, SiLU MLP), within 3x the float32
  transcription's own distance from float64; the drawn weights do not depend on the thread count, their bfloat16
  rounding written as float32 is the bfloat16 model's weights upcast, and they have the export's scales.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnx_lrp
from util import ROOT, rel_l2

sys.path.insert(0, str(ROOT / "benchmarks"))
import llama_graph  # noqa: E402

TINY = (64, 128, 2, 4, 2, 256)  # bench_llm's "tiny": hidden, intermediate, layers, heads, kv heads, vocabulary
SHAPE = llama_graph.Shape(*TINY)
SEQ = 8


def _run(path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path))
    low = sess.get_inputs()[0].type == "tensor(float16)"
    return sess.run(None, {"embeds": x.astype(np.float16 if low else np.float32)})[0]


def _relevance(path, x: np.ndarray):
    with warnings.catch_warnings():  # float16 / bfloat16: the deployed forward's gap, said by onnx-lrp
        warnings.simplefilter("ignore", onnx_lrp.LrpWarning)
        e = onnx_lrp.Explainer(str(path), composite="attnlrp").explain(x, position=-1)
    return np.asarray(e.relevance), np.asarray(e.target)


# ---- against torch.onnx's export (transformers) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_llama():
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    import llama_export

    return torch, llama_export


@pytest.fixture(scope="module")
def exports(tmp_path_factory, torch_llama):
    """(exported, direct, x) per dtype, made once."""
    made = {}

    def get(dtype: str):
        if dtype not in made:
            made[dtype] = _export_and_write(tmp_path_factory.mktemp(dtype), torch_llama, dtype)
        return made[dtype]
    return get


def _export_and_write(tmp_path, torch_llama, dtype: str):
    torch, llama_export = torch_llama
    model, ids = llama_export.make_model(TINY, SEQ)
    model = model.to(getattr(torch, dtype))
    with torch.no_grad():
        emb = model.get_input_embeddings()(ids)
    exported = tmp_path / "export" / "llama.onnx"
    exported.parent.mkdir()
    llama_export.export(model, emb, exported)
    weights = {k: v.float().numpy() for k, v in model.state_dict().items()}
    freqs = model.model.rotary_emb.inv_freq.float().numpy()  # as torch computed and rounded it
    import transformers

    rope = "folded" if int(transformers.__version__.split(".")[0]) >= 5 else "computed"
    direct = llama_graph.write(tmp_path / "direct", SHAPE, SEQ, dtype, weights=weights, freqs=freqs, threads=2,
                               rope=rope)
    return exported, direct, emb.float().numpy()


def _tensor(t: onnx.TensorProto, folder: Path) -> tuple:
    a = onnx.numpy_helper.to_array(t, base_dir=str(folder))
    return t.data_type, tuple(t.dims), np.asarray(a, np.float64) if a.dtype.kind == "f" or a.dtype == \
        ml_dtypes.bfloat16 else a


def _same_tensor(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[1] == b[1] and np.array_equal(a[2], b[2])


def _differences(exported: Path, direct: Path) -> list:
    """Every way the two graphs differ (empty: node for node the same), up to 20. Values are matched through the
    nodes that write them (node k's outputs in one graph are node k's in the other), so the wiring is compared
    whatever the names; the names are compared too, except those of unscoped nodes (transformers 4's inv_freq
    Constant), which the exporter numbers by a global count."""
    a, b = (onnx.load(str(p), load_external_data=False) for p in (exported, direct))
    inits = [{t.name: _tensor(t, p.parent) for t in m.graph.initializer} for m, p in ((a, exported), (b, direct))]
    out = []
    if [(v.name, v.type) for v in a.graph.input] != [(v.name, v.type) for v in b.graph.input] or \
            [(v.name, v.type) for v in a.graph.output] != [(v.name, v.type) for v in b.graph.output]:
        out.append("graph inputs / outputs")
    if len(a.graph.node) != len(b.graph.node):
        out.append(f"{len(a.graph.node)} nodes exported, {len(b.graph.node)} written")
    same = {v.name: v.name for v in a.graph.input}
    for na, nb in zip(a.graph.node, b.graph.node):
        scoped = na.name.startswith("/") or nb.name.startswith("/")
        if (na.op_type, na.domain, len(na.output)) != (nb.op_type, nb.domain, len(nb.output)) or \
                scoped and (na.name, list(na.output)) != (nb.name, list(nb.output)):
            out.append(f"node {na.name} ({na.op_type}) vs {nb.name} ({nb.op_type})")
        same.update(zip(na.output, nb.output))
        if len(na.input) != len(nb.input):
            out.append(f"{na.name}: inputs")
        for x, y in zip(na.input, nb.input):
            if x in inits[0] or y in inits[1]:
                if not (x in inits[0] and y in inits[1] and _same_tensor(inits[0][x], inits[1][y])):
                    out.append(f"{na.name}: initializer {x} vs {y}")
            elif same.get(x) != y:
                out.append(f"{na.name}: input {x} vs {y}")
        out += _attribute_differences(na, nb, exported.parent, direct.parent)
    if [same.get(v.name) for v in a.graph.output] != [v.name for v in b.graph.output]:
        out.append("graph outputs written by other nodes")
    return out[:20]


def _attribute_differences(na, nb, folder_a: Path, folder_b: Path) -> list:
    attrs = [{t.name: t for t in n.attribute} for n in (na, nb)]
    if set(attrs[0]) != set(attrs[1]):
        return [f"{na.name}: attributes {sorted(attrs[0])} vs {sorted(attrs[1])}"]
    out = []
    for k in attrs[0]:
        x, y = attrs[0][k], attrs[1][k]
        same = x.type == y.type and (_same_tensor(_tensor(x.t, folder_a), _tensor(y.t, folder_b))
                                     if x.type == onnx.AttributeProto.TENSOR else
                                     onnx.helper.get_attribute_value(x) == onnx.helper.get_attribute_value(y))
        if not same:
            out.append(f"{na.name}: attribute {k}")
    return out


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_direct_graph_is_the_export(exports, dtype):
    exported, direct, x = exports(dtype)
    assert _differences(exported, direct) == []
    if dtype != "bfloat16":  # onnxruntime's CPU provider has no bfloat16 kernels
        np.testing.assert_array_equal(_run(direct, x), _run(exported, x))
    (r_exp, t_exp), (r_dir, t_dir) = _relevance(exported, x), _relevance(direct, x)
    np.testing.assert_array_equal(t_dir, t_exp)
    np.testing.assert_array_equal(r_dir, r_exp)
    assert np.abs(r_exp).sum() > 0


def test_a_wrong_graph_is_told_apart(tmp_path, exports):
    """The comparison sees a one-element change in a weight and in a Constant, and a changed attribute."""
    exported, direct, _ = exports("float32")
    model = ir.load(str(direct))
    w = model.graph.initializers["m.model.layers.1.mlp.up_proj.weight.T"]
    a = w.const_value.numpy().copy()
    a[3, 5] += 1e-3
    w.const_value = ir.tensor(a, name=w.name)
    node = next(n for n in model.graph if n.op_type == "Softmax")
    node.attributes["axis"] = ir.AttrInt64("axis", 3)
    mask = next(n for n in model.graph if n.op_type == "Constant" and len(n.attributes["value"].value.shape) == 4)
    m = mask.attributes["value"].value.numpy().copy()
    m[0, 0, 1, 0] = m[0, 0, 0, 1]  # position 1 no longer sees position 0
    mask.attributes["value"] = ir.AttrTensor("value", ir.tensor(m))
    ir.save(model, str(tmp_path / "changed.onnx"))
    found = _differences(exported, tmp_path / "changed.onnx")
    assert any("up_proj" in d for d in found) and any("Softmax" in d and "axis" in d for d in found)
    assert any(mask.name in d and "value" in d for d in found)


# ---- against a numpy transcription of LLaMA (no transformers) ------------------------------------------------------


def _weights(path) -> dict:
    return {k: v.const_value.numpy() for k, v in ir.load(str(path)).graph.initializers.items()}


def numpy_llama(w: dict, x: np.ndarray, shape, freqs: np.ndarray, dtype=np.float64) -> np.ndarray:
    """LLaMA's forward from its definition (RMSNorm, rotary embedding on q / k, causal grouped-query attention with
    each key-value head serving heads // kv query heads, SiLU-gated MLP, residuals), logits [seq, vocab]."""
    seq, dh, n_rep = x.shape[1], shape.head_dim, shape.heads // shape.kv
    f = lambda name: np.asarray(w[name], dtype)
    rms = lambda t, g: g * t / np.sqrt((t * t).mean(-1, keepdims=True) + shape.eps)
    angles = np.arange(seq, dtype=dtype)[:, None] * np.asarray(freqs, dtype)[None]
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))
    rope = lambda t: t * cos + np.concatenate([-t[..., dh // 2:], t[..., :dh // 2]], -1) * sin
    heads = lambda t, n: t.reshape(seq, n, dh).transpose(1, 0, 2)
    future = np.triu(np.ones((seq, seq), bool), 1)
    h = np.asarray(x[0], dtype)
    for i in range(shape.layers):
        p = f"m.model.layers.{i}."
        t = rms(h, f(p + "input_layernorm.weight"))
        q = rope(heads(t @ f(p + "self_attn.q_proj.weight.T"), shape.heads))
        k = np.repeat(rope(heads(t @ f(p + "self_attn.k_proj.weight.T"), shape.kv)), n_rep, axis=0)
        v = np.repeat(heads(t @ f(p + "self_attn.v_proj.weight.T"), shape.kv), n_rep, axis=0)
        s = np.where(future, -np.inf, q @ k.transpose(0, 2, 1) / np.sqrt(dh))
        prob = np.exp(s - s.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        h = h + (prob @ v).transpose(1, 0, 2).reshape(seq, -1) @ f(p + "self_attn.o_proj.weight.T")
        t = rms(h, f(p + "post_attention_layernorm.weight"))
        gate = t @ f(p + "mlp.gate_proj.weight.T")
        h = h + (gate / (1 + np.exp(-gate)) * (t @ f(p + "mlp.up_proj.weight.T"))) @ f(p + "mlp.down_proj.weight.T")
    return rms(h, f("m.model.norm.weight")) @ f("m.lm_head.weight.T")


def test_direct_graph_computes_llama(tmp_path):
    path = llama_graph.write(tmp_path, SHAPE, SEQ, "float32", seed=3)
    x = llama_graph.embeds(SHAPE, SEQ, seed=3)
    w, freqs = _weights(path), llama_graph.inv_freq(SHAPE)
    ref64, ref32 = numpy_llama(w, x, SHAPE, freqs), numpy_llama(w, x, SHAPE, freqs, np.float32)
    got = _run(path, x)[0]
    # onnxruntime in float32 against numpy in float64: as close as numpy's own float32 run (x 3), and never asked to be
    # closer than 8 float32 steps (relative): other CPUs' kernels (AVX2: 3.3e-7, numpy float32 here: 1.1e-7) sum in
    # other orders; a graph that computed something else would be off by orders of magnitude more
    assert rel_l2(got, ref64) <= max(3 * rel_l2(ref32, ref64), 8 * np.finfo(np.float32).eps)
    assert np.std(ref64) > 0.1  # not a degenerate forward


def test_drawn_weights(tmp_path):
    a = llama_graph.write(tmp_path / "a", SHAPE, SEQ, "bfloat16", seed=1, threads=1, external=True)
    b = llama_graph.write(tmp_path / "b", SHAPE, SEQ, "bfloat16", seed=1, threads=3, external=True)
    twin = llama_graph.write(tmp_path / "twin", SHAPE, SEQ, "float32", seed=1, round_to="bfloat16")
    assert (a.parent / "llama.onnx.data").read_bytes() == (b.parent / "llama.onnx.data").read_bytes()
    low, up = _weights(a), _weights(twin)
    assert low.keys() == up.keys() and len(low) == 9 * SHAPE.layers + 2
    for name, arr in low.items():
        assert arr.dtype == ml_dtypes.bfloat16 and up[name].dtype == np.float32
        np.testing.assert_array_equal(arr.astype(np.float32), up[name])
    q = up["m.model.layers.0.self_attn.q_proj.weight.T"]
    assert q.shape == (SHAPE.hidden, SHAPE.heads * SHAPE.head_dim)  # [in, out], as the exporter stores it
    assert abs(q.std() * SHAPE.hidden ** 0.5 / 0.5 - 1) < 0.05
    down = up["m.model.layers.1.mlp.down_proj.weight.T"]
    assert abs(down.std() * SHAPE.inter ** 0.5 / 0.5 - 1) < 0.05
    norm = up["m.model.norm.weight"]
    assert abs(norm.mean() - 1) < 0.05 and abs(norm.std() - 0.1) < 0.03
    other = _weights(llama_graph.write(tmp_path / "c", SHAPE, SEQ, "bfloat16", seed=2))
    assert not np.array_equal(other["m.lm_head.weight.T"].astype(np.float32), up["m.lm_head.weight.T"])
