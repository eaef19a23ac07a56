"""onnxruntime-genai folders in every precision the model builder writes, for the CPU and for CUDA (the tiny LLaMA
and Qwen2 (QKV biases, tied embeddings) of tests/goldens/llm/, made by scripts/make_llm_models.py): each explains, each generates, and what differs from the
deployed run is said.

References, none of them onnx-lrp's:

* the relevance of a float16 / bfloat16 folder is the relevance of the float32 folder's graph with its weights
  rounded to float16 / bfloat16 in numpy (its *twin*: the loader upcasts the weights exactly, so the explained
  forward computes the same float32 function) to float32 rounding; and the float32 folder's own relevance within
  10 u max|R| (u: the type's unit roundoff, 2^-11 for float16, 2^-8 for bfloat16). Why 10 u: every weight carries a
  relative rounding error of at most u, and the relevance at the prompt is, to first order, multilinear in the ten
  weight tensors on each path (the embedding, per layer the QKV, output, gate / up and down projections, the head):
  its relative change is at most about 10 u (measured: 3.9 u for float16, 2.4 u for bfloat16);
* the CUDA int4 folder (MatMulNBits with float16 scales) is the CPU int4 folder's graph carrying its weights (the
  same 4-bit codes, the scales upcast exactly): the same float32 function;
* onnxruntime-genai's own greedy ids on the CPU (<arch>_cuda.npz) and, where it cannot generate, onnxruntime's own
  prompt runs (the whole sequence each step, the past empty) of the deployed file or of the bfloat16 twin;
* the deployed gap against onnxruntime's own run of the deployed file on the prompt.
"""
from __future__ import annotations

import functools
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, load, numpy_helper

import onnx_lrp
from onnx_lrp.run import generation
from onnx_lrp.run.generation import Decoder
from util import GOLDENS, assert_close, cli

pytest.importorskip("tokenizers")

LLM = GOLDENS / "llm"
PROMPT = "the cat sat on the mat and the dog"
N = 4
U = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def _need(*names):
    missing = [n for n in names if not (LLM / n).exists()]
    if missing:
        pytest.skip(f"no {missing[0]} in {LLM} (scripts/make_llm_models.py makes it)")


@functools.lru_cache(maxsize=None)
def _ids() -> np.ndarray:
    _need("llama.npz")
    return np.load(LLM / "llama.npz")["prompt_ids"].astype(np.int64)


def _feeds(names, ids) -> dict:
    ids = np.asarray(ids, np.int64)[None]
    fill = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(ids.shape[1])[None]}
    return {k: v for k, v in fill.items() if k in names}


@functools.lru_cache(maxsize=None)
def _explained(source):
    """(relevance per prompt token, the Explanation, the explainer, the warnings) of the last position's arg-max
    logit (``source``: a folder name in LLM, or model bytes)."""
    if isinstance(source, str):
        _need(source)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ex = onnx_lrp.Explainer(str(LLM / source) if isinstance(source, str) else source, composite="attnlrp",
                                start="logit")
        res = ex.explain(_feeds([s.name for s in ex.inputs], _ids()))
    return np.asarray(res.relevance, np.float64)[0], res, ex, [str(w.message) for w in said]


def _bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (round to nearest even) -> float32."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def _as_float32(t) -> np.ndarray:
    if t.data_type == TensorProto.BFLOAT16:  # raw 16-bit patterns: the high half of a float32
        bits = np.frombuffer(t.raw_data, np.uint16) if t.raw_data else np.asarray(t.int32_data, np.uint16)
        return (bits.astype(np.uint32) << 16).view(np.float32).reshape(tuple(t.dims))
    return numpy_helper.to_array(t).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _twin(graph_of: str, precision: str | None = None, weights_of: str | None = None) -> bytes:
    """``graph_of``'s model (float32) with its float weights rounded to ``precision``, or with ``weights_of``'s
    initializers (of the same names) upcast to float32."""
    _need(graph_of, *(weights_of,) * (weights_of is not None))
    m = load(str(LLM / graph_of / "model.onnx"))
    other = {} if weights_of is None else {t.name: t for t in load(str(LLM / weights_of / "model.onnx")).graph.initializer}
    for t in m.graph.initializer:
        if t.name in other and other[t.name].data_type != TensorProto.UINT8:
            t.CopyFrom(numpy_helper.from_array(_as_float32(other[t.name]), t.name))
        elif t.name in other:
            t.CopyFrom(other[t.name])
        elif precision is not None and t.data_type == TensorProto.FLOAT:
            a = numpy_helper.to_array(t)
            a = a.astype(np.float16).astype(np.float32) if precision == "float16" else _bfloat16(a)
            t.CopyFrom(numpy_helper.from_array(a, t.name))
    return m.SerializeToString()


FLOAT_FORMS = [("llama_genai_fp16", "float16"), ("llama_genai_fp16_cuda", "float16"),
               ("llama_genai_bf16_cuda", "bfloat16"), ("qwen2_genai_fp16_cuda", "float16"),
               ("qwen2_genai_bf16_cuda", "bfloat16")]
ARCHS = ("llama", "qwen2")


def _arch(folder: str) -> str:
    return folder.split("_")[0]


@pytest.mark.parametrize("folder,precision", FLOAT_FORMS)
def test_a_low_precision_folder_explains_as_its_float32_twin(folder, precision):
    rel, res, _, _ = _explained(folder)
    fp32_folder = f"{_arch(folder)}_genai_fp32"
    twin, twin_res, _, _ = _explained(_twin(fp32_folder, precision))
    assert int(res.target[0]) == int(twin_res.target[0])
    assert_close(rel, twin, rtol=1e-5, atol=1e-5 * np.abs(twin).max())
    fp32 = _explained(fp32_folder)[0]
    assert np.abs(rel - fp32).max() <= 10 * U[precision] * np.abs(fp32).max()
    assert np.abs(rel - fp32).max() > 0  # the weights are rounded: a relevance of its own


def test_the_cuda_int4_folder_explains_as_the_cpu_graph_with_its_weights(arch="llama"):
    """(LLaMA: its CPU int4 folder is quantized as the CUDA one, symmetric in blocks of 32; Qwen2's CPU folder is
    asymmetric in blocks of 16, so its CUDA folder's codes do not fit that graph: generation and the gap check it.)"""
    rel, res, _, _ = _explained(f"{arch}_genai_int4_cuda")
    twin, twin_res, _, _ = _explained(_twin(f"{arch}_genai_int4", weights_of=f"{arch}_genai_int4_cuda"))
    assert int(res.target[0]) == int(twin_res.target[0])
    assert_close(rel, twin, rtol=1e-5, atol=1e-5 * np.abs(twin).max())


@pytest.mark.parametrize("folder", ["llama_genai_fp16", "llama_genai_fp16_cuda", "llama_genai_int4_cuda",
                                    "qwen2_genai_fp16_cuda", "qwen2_genai_int4_cuda"])
def test_the_gap_to_the_deployed_float16_run_is_measured_and_said(folder):
    _, res, ex, said = _explained(folder)
    session = ort.InferenceSession(str(LLM / folder / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = _feeds([i.name for i in session.get_inputs()], _ids())
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = np.zeros((1, 2, 0, 16), np.float16)
    deployed = session.run(["logits"], feeds)[0].astype(np.float64)
    forward = np.asarray(res.forward["logits"], np.float64)
    gap = res.deployed_gap
    assert gap is not None and "float16" in ex.deployed_kinds
    assert_close(gap.max_abs, np.abs(deployed - forward).max(), rtol=1e-6)
    assert_close(np.asarray(res.outputs["logits"], np.float64), deployed)  # the outputs are the deployed ones
    assert gap.beyond and any("computes in float16" in w and f"{gap.max_abs:.3g}" in w for w in said)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_bfloat16_folder_says_in_one_line_that_its_gap_is_not_measured(arch):
    _, res, ex, said = _explained(f"{arch}_genai_bf16_cuda")
    line = ("onnxruntime cannot run the deployed model as written on this CPU: MatMul (node "
            "'/model/layers.0/attn/qkv_proj/MatMul') has no CPU kernel for bfloat16; the explained forward is its "
            "float32 upcast, the gap is not measured here")
    assert ex.deployed_note.startswith(line) and "\n" not in ex.deployed_note
    assert any(w.startswith(line) for w in said)
    assert res.deployed_gap is None and res.outputs is res.forward


def _prompt_runs(model, n: int) -> list:
    """Greedy ids of onnxruntime's prompt runs: each step the whole sequence, the past empty (``model``: a path or
    bytes)."""
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ids, out = list(_ids()), []
    for _ in range(n):
        feeds = _feeds([i.name for i in session.get_inputs()], ids)
        for i in session.get_inputs():
            if i.name.startswith("past_key_values"):
                feeds[i.name] = np.zeros((1, 2, 0, 16), np.float16 if "float16" in i.type else np.float32)
        out.append(int(np.argmax(session.run(["logits"], feeds)[0][0, -1])))
        ids.append(out[-1])
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_folders_generate_onnxruntime_genais_ids_on_the_cpu(arch):
    _need(f"{arch}_cuda.npz", f"{arch}_genai_fp16_cuda", f"{arch}_genai_int4_cuda")
    ref = np.load(LLM / f"{arch}_cuda.npz")
    for precision in ("fp16", "int4"):
        dec = Decoder(LLM / f"{arch}_genai_{precision}_cuda")
        assert dec.greedy(list(_ids()), 8) == ref[f"genai_{precision}_cuda_generated"].tolist()
        assert dec.note is None  # the deployed file through its KV cache


def test_the_cpu_float16_folder_generates_through_its_cache_with_memory_reuse_off():
    """onnxruntime's buffer planner fails on the builder's CPU float16 graph from the second cached step (it
    declares the repeated keys / values with the new tokens' length); the same kernels without memory reuse give
    the ids of the deployed file's own prompt runs."""
    _need("llama_genai_fp16")
    dec = Decoder(LLM / "llama_genai_fp16")
    assert dec.greedy(list(_ids()), 8) == _prompt_runs(str(LLM / "llama_genai_fp16" / "model.onnx"), 8)
    assert "memory reuse off" in dec.note and "cached step 2" in dec.note


def test_a_cached_step_that_keeps_failing_decodes_without_the_cache(monkeypatch):
    _need("llama_genai_fp32", "llama.npz")
    dec = Decoder(LLM / "llama_genai_fp32")
    real = generation.runtime.Session.run

    def no_past(self, feeds, outputs=None):  # every session of the file fails once the past is not empty
        if any(k.startswith("past_key_values") and np.shape(v)[2] for k, v in feeds.items()):
            raise onnx_lrp.ModelError("onnxruntime cannot run the deployed model itself on this input: refused")
        return real(self, feeds, outputs)

    monkeypatch.setattr(generation.runtime.Session, "run", no_past)
    assert dec.greedy(list(_ids()), 8) == np.load(LLM / "llama.npz")["genai_fp32_generated"].tolist()
    assert "fails on its cached step 2" in dec.note and "without the cache" in dec.note


def test_a_bfloat16_folder_generates_with_its_float32_upcast_and_says_so(tmp_path, monkeypatch):
    _, _, ex, _ = _explained("llama_genai_bf16_cuda")
    gen = ex.explain_generation(PROMPT, N)
    assert gen.generated == _prompt_runs(_twin("llama_genai_fp32", "bfloat16"), N)
    assert gen.decoded.startswith("onnxruntime cannot run the deployed model as written on this CPU: MatMul") and \
        "the generated ids are its float32 upcast's" in gen.decoded
    assert gen.predicted == gen.generated and gen.relevance.shape == (N, len(_ids()) + N - 1)
    monkeypatch.chdir(tmp_path)
    r = cli("explain", str(LLM / "llama_genai_bf16_cuda"), "--text", PROMPT, "--generate", "2", "--no-html",
            "-o", "g.npz")
    assert r.exit_code == 0, r.output
    assert "  decoded: onnxruntime cannot run the deployed model as written on this CPU" in r.output
    assert np.load(tmp_path / "g.npz")["generated"].tolist() == gen.generated[:2]
