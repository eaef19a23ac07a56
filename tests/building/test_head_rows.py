"""The vocabulary head of an int4 LLM is never dequantized whole (building/transient_weights.head_in_rows): its 4-bit
rows are kept once, as onnxruntime's MatMulNBits stores them; the forward is MatMulNBits (accuracy_level 0) and the
backward dequantizes only the rows of the explained logits (a tied embedding only the looked-up rows). The relevance,
the logits and the explained value equal those of the build that dequantizes the whole head (DequantizeLinear ->
MatMul / Gemm) to float rounding, for one item and for a batch whose targets repeat; the tiny onnxruntime-genai int4
folders of tests/goldens/llm (a LLaMA with its own head, symmetric; a Qwen2 with a tied head and zero points)."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import onnx_lrp
from onnx_lrp.building import transient_weights
from util import GOLDENS, assert_close

ARCHS = ("llama", "qwen2")
IDS = np.array([[5, 17, 42, 7, 99, 3], [8, 8, 120, 33, 4, 250]], np.int64)


def _folder(arch: str):
    path = GOLDENS / "llm" / f"{arch}_genai_int4"
    if not (path / "model.onnx").exists():
        pytest.skip(f"no {path.name} (scripts/make_llm_models.py makes it)")
    return str(path)


def _build(arch: str, whole_head: bool, monkeypatch) -> onnx_lrp.Explainer:
    with monkeypatch.context() as m:
        if whole_head:
            m.setattr(transient_weights, "head_in_rows", lambda model: 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", onnx_lrp.LrpWarning)  # accuracy_level 4: the deployed gap, said
            return onnx_lrp.Explainer(_folder(arch), composite="attnlrp", start="logit")


def _explain(ex: onnx_lrp.Explainer, target):
    names = [s.name for s in ex.inputs]
    fill = {"input_ids": IDS, "attention_mask": np.ones_like(IDS), "position_ids": np.tile(np.arange(6), (2, 1))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", onnx_lrp.LrpWarning)
        return ex.explain({k: v for k, v in fill.items() if k in names}, target=target)


@pytest.fixture(scope="module", params=ARCHS)
def pair(request):
    mp = pytest.MonkeyPatch()
    try:
        yield request.param, _build(request.param, False, mp), _build(request.param, True, mp)
    finally:
        mp.undo()


def test_no_float_copy_of_the_head_and_its_4bit_rows_held_once(pair):
    arch, rows, whole = pair
    g = onnx.load_model_from_string(rows.relevance_model.model_bytes).graph
    vocab = int(np.asarray(_explain(rows, [1, 2]).forward["logits"]).shape[-1])
    dims = {t.name: list(t.dims) for t in g.initializer}
    # no DequantizeLinear of a vocab-sized weight left: the head's float copy is gone, forward and backward
    assert not [n.name for n in g.node if n.op_type == "DequantizeLinear" and vocab in dims.get(n.input[0], [])]
    assert [n.op_type for n in g.node if n.domain == "com.microsoft"] == ["MatMulNBits"]
    rows_b = [t for t in g.initializer if t.data_type == TensorProto.UINT8 and t.dims[:1] == [vocab] and len(t.dims) == 3]
    assert len(rows_b) == 1  # the head's bytes once (tied: also the embedding's)
    assert not [t.name for t in g.initializer if t.data_type in (TensorProto.INT4, TensorProto.UINT4)
                and vocab in t.dims]
    g0 = onnx.load_model_from_string(whole.relevance_model.model_bytes).graph
    dims0 = {t.name: list(t.dims) for t in g0.initializer}
    assert [n for n in g0.node if n.op_type == "DequantizeLinear" and vocab in dims0.get(n.input[0], [])]  # the control


@pytest.mark.parametrize("target", [[1, 2], [7, 7]], ids=["two-targets", "same-target"])
def test_relevance_equals_the_whole_head_build(pair, target):
    arch, rows, whole = pair
    a, b = _explain(rows, target), _explain(whole, target)
    assert list(np.asarray(a.target).reshape(-1)) == target == list(np.asarray(b.target).reshape(-1))
    assert_close(np.asarray(a.relevance), np.asarray(b.relevance), rtol=1e-5, atol=1e-6)
    assert_close(np.asarray(a.forward["logits"]), np.asarray(b.forward["logits"]), rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(a.relevance)).max() > 0
