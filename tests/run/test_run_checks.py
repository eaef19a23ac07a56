"""The run-time checks as outputs of the relevance graph (issue 29, point 1): the runner reads a few numbers per item
(``lrp/check/sum|peak/<input>``, ``lrp/check/finite``), never the relevance arrays, and judges exactly as the host
checks did.

References: numpy's float64 sums and maxima of the returned relevance (what ``conservation.per_item`` computed on the
host before), IEEE arithmetic for the finiteness probe, and float32 summation to show what the graph's float64 sums
protect against.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
from families import FAMILIES
from onnx_lrp import load as loader
from onnx_lrp.core.emitter import Emitter
from onnx_lrp.core.errors import InputError
from onnx_lrp.core.interface import CHECK_FINITE, CHECK_PEAK_PREFIX, CHECK_SUM_PREFIX, RELEVANCE_PREFIX
from onnx_lrp.lrp.rewriter import check_outputs
from onnx_lrp.run import binding, checks, conservation, runtime

RNG = np.random.default_rng(29)


def _first(rel):
    return next(iter(rel.values())) if isinstance(rel, dict) else rel


@pytest.mark.parametrize("fam", FAMILIES, ids=[f.name for f in FAMILIES])
def test_graph_sums_are_the_host_sums_and_decide_alike(fam):
    """Per item, the graph's float64 sum and peak of the input relevance equal numpy's float64 ones on the returned
    relevance (to float64 rounding), and the conservation decisions are the same."""
    ex = fam.explainer()
    feeds = fam.feeds()
    checked = ex.checked_feeds(feeds)
    res = ex.explain(feeds)
    merged = ex._run(checked, np.asarray(res.target).reshape(-1) if ex.relevance_model.sequence_rows is None else
                     np.full(len(res.target), -1), "logit",
                     None if ex.relevance_model.sequence_rows is None else np.asarray(res.position).reshape(-1))
    batch = len(np.asarray(merged["lrp/explained_value"]).reshape(-1))
    rel = [merged[RELEVANCE_PREFIX + n] for n in ex.relevance_inputs]
    want = conservation.per_item(rel, batch)
    got = ex.checks.item_sums(merged, batch)
    assert (want is None) == (got is None)
    if want is None:
        return
    scale = max(max(np.abs(np.asarray(r, np.float64)).sum() for r in rel), 1e-300)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-12 * scale)
    np.testing.assert_array_equal(got[1], want[1])
    starts = np.asarray(merged["lrp/explained_value"], np.float64).reshape(-1)
    np.testing.assert_array_equal(conservation.far(*got, starts), conservation.far(*want, starts))
    assert np.all(np.isfinite(merged[CHECK_FINITE]))


def _check_model(k: int = 6):
    """A graph whose 'relevance' output is its input r (float32 [N, k]) with the check outputs appended."""
    graph = ir.Graph([ir.Value(name="r", shape=ir.Shape(["N", k]), type=ir.TensorType(ir.DataType.FLOAT))], [], nodes=[],
                     name="g", opset_imports={"": 17})
    em = Emitter(graph, 17)
    rel = em.op("Identity", graph.inputs[0], tag="relevance")
    rel.name, rel.type, rel.shape = RELEVANCE_PREFIX + "r", ir.TensorType(ir.DataType.FLOAT), ir.Shape(["N", k])
    graph.outputs.extend([rel] + check_outputs(em, graph, [rel], [], rel))
    model = ir.Model(graph, ir_version=8)
    return runtime.Session(loader.serialize(model))


def test_the_graph_sums_in_float64_where_float32_loses_the_total():
    """A row that cancels to 1 (2^25 + 1 - 2^25): the graph's sum is exactly 1, in float64; a float32 sum of the
    same row is 0 (1 is below float32's spacing at 2^25), which would report the relevance as vanished (the
    message's sum and ratio). In a 3-entry row the peak test (1e6 x the start) trips as well, so that a float32 sum
    cannot flip a decision there; over ~10^5..10^6 entries (an image, an LLM's embeddings) it can, hence float64."""
    s = _check_model()
    big = float(2 ** 25)
    r = np.array([[big, 1.0, -big, 0.0, 0.0, 0.0], [0.5, 0.25, 0.25, 0.0, 0.0, 0.0]], np.float32)
    out = s.run({"r": r})
    sums, peaks = out[CHECK_SUM_PREFIX + "r"], out[CHECK_PEAK_PREFIX + "r"]
    assert sums.dtype == np.float64
    np.testing.assert_array_equal(sums, [1.0, 1.0])
    np.testing.assert_array_equal(peaks, [big, 0.5])
    assert r[0].sum(dtype=np.float32) == 0.0  # float32 loses the 1
    np.testing.assert_array_equal(sums, r.astype(np.float64).sum(1))


def test_the_finiteness_probe_sees_every_nan_and_inf_and_no_large_finite_value():
    s = _check_model(4)
    big = np.full((3, 4), np.finfo(np.float32).max, np.float32)  # a float32 sum of these overflows
    assert np.all(np.isfinite(s.run({"r": big})[CHECK_FINITE]))
    assert np.all(np.isfinite(s.run({"r": -big})[CHECK_FINITE]))
    for bad in (np.nan, np.inf, -np.inf):
        r = RNG.standard_normal((3, 4)).astype(np.float32)
        r[1, 2] = bad
        assert not np.all(np.isfinite(s.run({"r": r})[CHECK_FINITE])), bad
    r = np.ones((3, 4), np.float32)
    r[0, 0], r[2, 3] = np.inf, -np.inf  # +inf and -inf together: NaN, still not finite
    assert not np.all(np.isfinite(s.run({"r": r})[CHECK_FINITE]))


def _mlp(w=None):
    w = RNG.standard_normal((5, 3)).astype(np.float32) if w is None else w
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def test_explain_reads_no_relevance_array_and_scans_no_input_on_the_host(monkeypatch):
    """The happy path reads the check outputs only: the host helpers that read whole arrays are never called."""
    ex = onnx_lrp.Explainer(_mlp(), composite="epsilon")

    def refuse(*a, **k):
        raise AssertionError("a whole array was read on the host")

    monkeypatch.setattr(conservation, "per_item", refuse)
    monkeypatch.setattr(binding, "to_host", refuse)
    monkeypatch.setattr(checks, "refuse_non_finite", refuse)
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    res = ex.explain(x)
    assert res.relevance.shape == (4, 5)


def test_non_finite_inputs_and_relevance_are_still_refused_in_one_line():
    ex = onnx_lrp.Explainer(_mlp(), composite="epsilon")
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    x[1, 2] = np.nan
    with pytest.raises(InputError, match=r"input 'x' contains NaN or Inf \(1 NaN\); clean the data first"):
        ex.explain(x)
    x[1, 2] = -np.inf
    with pytest.raises(InputError, match="infinite values"):
        ex.explain(x)
    big = onnx_lrp.Explainer(_mlp(np.full((5, 3), 3e38, np.float32)), composite="epsilon", epsilon=0.0,
                             stabilizer=0.0)
    with pytest.raises(InputError, match="forward pass is already non-finite") as err:  # bad input: exit 2
        big.explain(np.ones((2, 5), np.float32))
    assert "\n" not in str(err.value)


def test_a_relevance_that_vanishes_is_still_warned_about():
    """The conservation warning from the graph's sums: a ReLU that kills every input relevance (all logits come
    from the bias) is flagged as vanished, as the host check did."""
    w = np.zeros((5, 3), np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                           helper.make_node("Add", ["h", "b"], ["y"], name="add")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                          [numpy_helper.from_array(w + 1e-6, "w"),
                           numpy_helper.from_array(np.full(3, 5.0, np.float32), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    ex = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ex.explain(np.ones((2, 5), np.float32))
    assert any("not conserved" in str(w.message) for w in caught)
