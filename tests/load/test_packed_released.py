"""An int4 folder's packed weights as the folder stores them (MatMulNBits' and GatherBlockQuantized's initializers,
read from its external data file) are gone from the loaded model once converted to DequantizeLinear with block_size:
not held (nor their file's pages) through the rest of the build; the converted model still runs as the folder does."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import onnx_lrp
from onnx_lrp import load as loader
from util import GOLDENS

FOLDERS = ("llama_genai_int4", "qwen2_genai_int4")


@pytest.mark.parametrize("name", FOLDERS)
def test_converted_packed_initializers_are_dropped(name):
    path = GOLDENS / "llm" / name / "model.onnx"
    if not path.exists():
        pytest.skip(f"no {name} (scripts/make_llm_models.py makes it)")
    src = onnx.load(str(path), load_external_data=False)
    packed = {i for n in src.graph.node if n.op_type in ("MatMulNBits", "GatherBlockQuantized") for i in n.input[:4]}
    packed &= {t.name for t in src.graph.initializer}
    assert packed
    model = loader.load(str(path))
    left = packed & set(model.graph.initializers)
    assert not left, sorted(left)[:3]
    assert any(n.op_type == "DequantizeLinear" for n in model.graph)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", onnx_lrp.LrpWarning)
        res = onnx_lrp.Explainer(str(path)).explain_text("hello world")
    assert np.isfinite(np.asarray(res.relevance)).all()
