"""An int4 LLM's memory (docs/llm-precisions.md, "Memory and time"), on the tiny onnxruntime-genai int4 folders of
tests/goldens/llm with the bounds lowered:

* its 4-bit weights go to a private temporary file instead of ``model_bytes`` (load/external.py, PACKED_FILE_MIN):
  the relevance and outputs equal those of the build that keeps them in the protobuf, the graph holds no 4-bit
  bytes, the folder is removed with the explainer, and a saved relevance model (``rewrite``) is self-contained;
* the deployed model is not run beside it over DEPLOYED_PACKED_MAX bytes of 4-bit weights on the CPU (one warning,
  the explained forward's float32 outputs) unless ``deployed=True``, which gives the deployed outputs and gap as
  before."""
from __future__ import annotations

import gc
import pickle
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnx_lrp
from onnx_lrp.building import stages
from onnx_lrp.load import external
from onnx_lrp.run.runner import Runner
from util import GOLDENS, assert_close

FOLDER = GOLDENS / "llm" / "llama_genai_int4"
IDS = np.array([[1, 5, 9, 22, 7, 3]], np.int64)
FEEDS = {"input_ids": IDS, "attention_mask": np.ones_like(IDS)}


def _explainer(**options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the accuracy_level 4 gap, said by the tests that need it
        return onnx_lrp.Explainer(str(FOLDER), **options)


def _explained(ex):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ex.explain(FEEDS, position=-1)


@pytest.fixture(scope="module")
def in_protobuf():
    ex = _explainer()
    return ex, _explained(ex)


@pytest.fixture(scope="module")
def own_file():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(external, "PACKED_FILE_MIN", 0)
        ex = _explainer()
    return ex, _explained(ex)


def _int4(model_bytes: bytes) -> list:
    """(name, external location or None) of every 4-bit initializer of a serialised graph."""
    graph = onnx.load_model_from_string(model_bytes).graph
    out = []
    for t in graph.initializer:
        if t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
            where = {e.key: e.value for e in t.external_data}.get("location")
            out.append((t.name, where if t.data_location == onnx.TensorProto.EXTERNAL else None))
    return out


def test_int4_weights_leave_the_graph_and_the_results_stay(in_protobuf, own_file):
    (a, ra), (b, rb) = in_protobuf, own_file
    inline, moved = _int4(a.relevance_model.model_bytes), _int4(b.relevance_model.model_bytes)
    assert inline and all(where is None for _, where in inline)  # the default below the bound: in the protobuf
    assert sorted(n for n, _ in moved) == sorted(n for n, _ in inline)
    assert all(where == external.PACKED_FILE for _, where in moved)
    folder = Path(b.relevance_model.model_folder)
    assert folder != FOLDER.resolve() and (folder / external.PACKED_FILE).is_file()
    assert len(b.relevance_model.model_bytes) < len(a.relevance_model.model_bytes)
    # the relevance model reads the golden folder's own tensors mapped from its file, and its 4-bit ones from its own
    assert_close(rb.relevance, ra.relevance, rtol=1e-6)
    for name in ra.outputs:
        assert_close(rb.outputs[name], ra.outputs[name], rtol=1e-6)
    assert_close(rb.forward["logits"], ra.forward["logits"], rtol=1e-6)


def test_its_own_folder_is_removed_with_the_explainer():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(external, "PACKED_FILE_MIN", 0)
        ex = _explainer()
    folder = Path(ex.relevance_model.model_folder)
    assert folder.is_dir()
    payload = pickle.loads(pickle.dumps(ex.payload()))  # a Ray worker's copy reads the same folder ...
    again = Runner.from_payload(payload)
    assert_close(_explained(again).relevance, _explained(ex).relevance, rtol=1e-6)
    del again, payload
    gc.collect()
    assert folder.is_dir()  # ... and does not remove it
    del ex
    gc.collect()
    assert not folder.exists()


@pytest.mark.parametrize("computed_weights", [False, True])
def test_a_saved_relevance_model_is_self_contained(own_file, tmp_path, computed_weights):
    ex, res = own_file
    out = tmp_path / "relevance.onnx"
    ex.save(out, computed_weights)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["relevance.onnx", "relevance.onnx.data"]
    proto = onnx.load(str(out), load_external_data=False)
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"relevance.onnx.data"}
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    feeds = {**FEEDS, "lrp/target": np.array([-1], np.int64), "lrp/one_hot": np.array(False),
             "lrp/position": np.array([-1], np.int64)}
    feeds = {i.name: feeds[i.name] for i in sess.get_inputs()}
    logits, = sess.run(["logits"], feeds)
    assert_close(logits, res.forward["logits"], rtol=1e-5)


def _said(**options):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ex = onnx_lrp.Explainer(str(FOLDER), **options)
    return ex, [str(w.message) for w in said if "not run beside" in str(w.message)]


def test_the_deployed_model_over_the_bound_is_not_run_beside_unless_forced(in_protobuf, monkeypatch):
    default, res = in_protobuf
    assert default.deployed is not None and res.deployed_gap is not None  # below the bound: run beside, the gap said
    monkeypatch.setattr(stages, "DEPLOYED_PACKED_MAX", 0)
    ex, lines = _said()
    assert len(lines) == 1 and "4-bit weights" in lines[0] and "deployed=True" in lines[0] and "\n" not in lines[0]
    assert ex.deployed is None and ex.deployed_session is None
    plain = _explained(ex)
    np.testing.assert_array_equal(plain.outputs["logits"], plain.forward["logits"])  # the float32 forward's
    assert plain.deployed_gap is None
    assert_close(plain.relevance, res.relevance, rtol=1e-6)
    forced, lines = _said(deployed=True)
    assert not lines and forced.deployed is not None
    again = _explained(forced)
    assert_close(again.outputs["logits"], res.outputs["logits"], rtol=1e-6)  # the deployed outputs, as before
    assert not np.array_equal(again.outputs["logits"], again.forward["logits"])  # 8-bit activations: they differ
    assert again.deployed_gap is not None
    assert abs(again.deployed_gap.max_abs - res.deployed_gap.max_abs) <= 1e-6 * np.abs(res.forward["logits"]).max()


def test_deployed_false_never_runs_it_and_a_wrong_value_is_refused():
    ex, lines = _said(deployed=False)
    assert not lines and ex.deployed is None and ex.deployed_session is None
    with pytest.raises(onnx_lrp.InputError, match="deployed must be 'auto', True or False"):
        onnx_lrp.BuildOptions(deployed="yes")


def test_a_generation_decodes_through_the_deployed_model_under_the_bounds(monkeypatch):
    """Not run beside, with its weights in their own file: greedy decoding still runs the deployed folder with its
    KV cache (onnxruntime-genai's own greedy ids), and each row is that step explained alone."""
    pytest.importorskip("tokenizers")
    monkeypatch.setattr(stages, "DEPLOYED_PACKED_MAX", 0)
    monkeypatch.setattr(external, "PACKED_FILE_MIN", 0)
    ex = _explainer()
    assert ex.deployed is None and Path(ex.relevance_model.model_folder).name.startswith("onnx-lrp-weights-")
    ref = np.load(GOLDENS / "llm" / "llama.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gen = ex.explain_generation("the cat sat on the mat and the dog", 3)
    assert gen.prompt_ids == ref["prompt_ids"].tolist()
    assert gen.generated == ref["genai_int4_generated"].tolist()[:3]
    ids = gen.prompt_ids + gen.generated[:2]
    feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = ex.explain(feeds, target=gen.generated[2], position=len(ids) - 1)
    rel = np.asarray(alone.relevance)[0]
    rel = rel.sum(axis=-1) if rel.ndim > 1 else rel
    assert np.abs(rel).max() > 0.01
    assert_close(gen.relevance[2, :len(ids)], rel, rtol=1e-5, atol=1e-5)
