"""The one chunked-explain loop (onnx_lrp.run.batches): chunks, per-item targets, the item-by-item retry of a failing
chunk, merging, and the deployed-output gap counted over the whole run; against each item explained alone and
against the gap measured on the whole batch at once."""
from __future__ import annotations

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp.core.errors import InputError
from onnx_lrp.core.interface import FORWARD_PREFIX
from onnx_lrp.run import deployed_gap
from onnx_lrp.run.batches import explain_all, explain_chunks, merge, per_item, slices, stacked
from onnx_lrp.run.runner import Explanation
from util import ROOT, assert_close

DIGITS = ROOT / "models" / "digits_cnn.onnx"


@pytest.fixture(scope="module")
def digits():
    return onnx_lrp.Explainer(str(DIGITS)), np.load(ROOT / "models" / "samples" / "batch.npy")


def test_chunks_of_a_batch_give_what_each_item_alone_gives(digits):
    ex, x = digits
    targets = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    calls = []
    rel, outs, used = explain_all(ex, {"image": x}, targets, batch_size=3, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(3, 10), (6, 10), (9, 10), (10, 10)]  # after each chunk, in items
    np.testing.assert_array_equal(used, targets)
    assert list(rel) == ex.relevance_inputs and list(outs) == ex.output_names  # a float model: no forward entry
    for i, t in enumerate(targets):  # the reference: every item explained on its own
        alone = ex.explain(x[i:i + 1], target=t)
        assert_close(rel["image"][i:i + 1], alone.relevance, rtol=1e-5, atol=1e-7)
        for name in ex.output_names:
            assert_close(outs[name][i:i + 1], alone.outputs[name], rtol=1e-5, atol=1e-7)
    _, _, argmax = explain_all(ex, {"image": x}, None, batch_size=4)
    np.testing.assert_array_equal(argmax, np.argmax(ex.explain(x).outputs["logits"], axis=1))


def test_slices_and_stacked_runs_of_equal_shapes():
    arrays = {"a": np.arange(7), "b": np.arange(7) * 10}
    got = [(items, feeds["b"].tolist()) for items, feeds in slices(arrays, 3)]
    assert got == [([0, 1, 2], [0, 10, 20]), ([3, 4, 5], [30, 40, 50]), ([6], [60])]
    small, big, ints = np.zeros((2, 2), np.float32), np.zeros((3, 2), np.float32), np.zeros((2, 2), np.int64)
    items = [(10, {"x": small + 1}), (11, {"x": small + 2}), (12, {"x": small + 3}), (13, {"x": big}),
             (14, {"x": ints}), (15, {"x": small})]
    runs = list(stacked(items, 2))
    assert [idx for idx, _ in runs] == [[10, 11], [12], [13], [14], [15]]  # at most 2, a new run per shape/type
    np.testing.assert_array_equal(runs[0][1]["x"], np.stack([small + 1, small + 2]))
    assert runs[3][1]["x"].dtype == np.int64 and runs[2][1]["x"].shape == (1, 3, 2)


def test_per_item_targets():
    assert per_item(None, [2, 3]) is None and per_item(7, [2, 3]) == 7
    got = per_item([5, 6, 7, 8], [1, 3])
    assert got.dtype == np.int64 and got.tolist() == [6, 8]


class _Picky:
    """Explains x -> relevance x * 2; refuses any batch that holds a negative item (as onnxruntime refusing one bad
    item refuses its whole batch)."""

    def __init__(self):
        self.calls = []

    def explain(self, feeds, target=None, start=None):
        x = feeds["x"]
        self.calls.append((x[:, 0].tolist(), None if target is None else np.asarray(target).tolist(), start))
        if np.any(x < 0):
            raise InputError(f"item value {x[x < 0][0]:g} refused")
        return Explanation(relevance=x * 2, outputs={"y": x.sum(1)}, target=np.asarray(target, np.int64))


def test_a_failing_chunk_is_retried_item_by_item_and_failures_come_in_order():
    x = np.array([[0.0], [1.0], [-2.0], [3.0], [-4.0], [5.0]])
    ex, log = _Picky(), []
    chunks = explain_chunks(ex, slices({"x": x}, 3), target=[10, 11, 12, 13, 14, 15], start="one-hot",
                            failed=lambda i, msg: log.append(("failed", i, msg)))
    for c in chunks:
        log.append(("chunk", c.items, c.result.target.tolist()))
    assert log == [("chunk", [0], [10]), ("chunk", [1], [11]), ("failed", 2, "item value -2 refused"),
                   ("chunk", [3], [13]), ("failed", 4, "item value -4 refused"), ("chunk", [5], [15])]
    assert ex.calls[0] == ([0.0, 1.0, -2.0], [10, 11, 12], "one-hot")  # the whole chunk first, then item by item
    with pytest.raises(InputError, match="-2 refused"):  # without failed=: the error propagates
        list(explain_chunks(_Picky(), slices({"x": x}, 3), target=0))


def _deployed(x, lo):
    """An Explanation of items x (the first one numbered lo) whose deployed outputs differ from the forward."""
    forward = {"y": x * 1.0}
    deployed = {"y": x + np.where(np.arange(len(x))[:, None] + lo == 4, 0.5, 0.01)}
    gap = deployed_gap.measure("y", deployed["y"], forward["y"], None, len(x))
    return Explanation(relevance={"a": x, "b": -x}, outputs=deployed, forward=forward, deployed_gap=gap,
                       target=np.zeros(len(x), np.int64), position=np.arange(len(x)) + lo,
                       relevance_at={"t": x[:, :1]})


def test_merge_concatenates_and_counts_the_gap_over_the_whole_run():
    x = np.arange(18, dtype=np.float64).reshape(6, 3)

    class Deployed:
        relevance_inputs = ["a", "b"]
        explained_output = "y"

        def explain(self, feeds, target=None):
            return _deployed(feeds["x"], int(feeds["x"][0, 0]) // 3)

    ex = Deployed()
    m = merge(list(explain_chunks(ex, slices({"x": x}, 4))))
    assert isinstance(m, Explanation) and list(m.relevance) == ["a", "b"]
    np.testing.assert_array_equal(m.relevance["b"], -x)
    np.testing.assert_array_equal(m.forward["y"], x)
    np.testing.assert_array_equal(m.position, np.arange(6))
    np.testing.assert_array_equal(m.relevance_at["t"], x[:, :1])
    whole = deployed_gap.measure("y", m.outputs["y"], m.forward["y"], None, 6)  # the reference: one measurement
    worst = m.deployed_gap
    assert (worst.item, worst.index, worst.max_abs) == (whole.item, whole.index, whole.max_abs) == (4, 0, 0.5)
    rel, outs, _ = explain_all(ex, {"x": x}, batch_size=4)
    np.testing.assert_array_equal(outs[FORWARD_PREFIX + "y"], x)  # the explained forward beside the deployed output
    np.testing.assert_array_equal(outs["y"], m.outputs["y"])
    assert list(rel) == ["a", "b"]
