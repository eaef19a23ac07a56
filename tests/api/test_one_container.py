"""One container from explain to disk: the npz ``onnx-lrp explain -o`` writes is ``Explanation.arrays()`` of the
API's explain of the same inputs (bitwise), and ``Explanation.concat`` of chunks is each chunk's fields laid end to
end (bitwise) and the whole batch's explanation (to float32 resolution)."""
from __future__ import annotations

import numpy as np
from click.testing import CliRunner

import onnx_lrp
from onnx_lrp.cli.main import main
from onnx_lrp.run import deployed_gap
from onnx_lrp.run.batches import explain_chunks, merge, slices
from onnx_lrp.run.explanation import Explanation
from util import ROOT, assert_close

DIGITS = ROOT / "models" / "digits_cnn.onnx"
BATCH = ROOT / "models" / "samples" / "batch.npy"
RELU_TENSOR = "/classifier/classifier.2/Relu_output_0"


def _cli(*args):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res


def test_the_npz_written_is_the_api_explanations_arrays_bitwise(tmp_path):
    x = np.load(BATCH)
    out = tmp_path / "rel.npz"
    _cli("explain", DIGITS, BATCH, "-o", out, "--target", "3", "--relevance-at", RELU_TENSOR)
    names = [f"batch.npy[{i}]" for i in range(len(x))]
    want = onnx_lrp.Explainer(str(DIGITS), relevance_at=[RELU_TENSOR]).explain(x, target=3).arrays(items=names)
    assert sorted(want) == ["items", "outputs", "outputs/logits", "outputs/probabilities", "relevance",
                            f"relevance_at/{RELU_TENSOR}", "targets"]
    with np.load(out, allow_pickle=False) as z:
        assert list(z.files) == list(want)  # the same arrays, in the same order
        for k, v in want.items():
            assert z[k].dtype == v.dtype and z[k].shape == v.shape, k
            np.testing.assert_array_equal(z[k], v, err_msg=k)
        assert z["targets"].tolist() == [3] * len(x)


def test_the_npy_written_is_the_api_relevance_bitwise(tmp_path):
    x = np.load(BATCH)[:4]
    np.save(tmp_path / "four.npy", x)
    _cli("explain", DIGITS, tmp_path / "four.npy", "-o", tmp_path / "rel.npy")
    got = np.load(tmp_path / "rel.npy")
    want = onnx_lrp.Explainer(str(DIGITS)).explain(x).relevance
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_concat_of_chunks_is_each_chunk_end_to_end_and_the_whole_batch():
    x = np.load(BATCH)
    ex = onnx_lrp.Explainer(str(DIGITS), relevance_at=[RELU_TENSOR])
    chunks = list(explain_chunks(ex, slices({"image": x}, 4), target=list(range(10))))
    m = merge(chunks)
    assert isinstance(m, Explanation) and m.batched and m.forward is m.outputs and m.deployed_gap is None
    parts = [c.result for c in chunks]
    for name in ("relevance", "target", "explained_value"):  # the reference: the chunks' own arrays, in order
        np.testing.assert_array_equal(getattr(m, name), np.concatenate([getattr(p, name) for p in parts]))
    for k in ex.output_names:
        np.testing.assert_array_equal(m.outputs[k], np.concatenate([p.outputs[k] for p in parts]))
    np.testing.assert_array_equal(m.relevance_at[RELU_TENSOR],
                                  np.concatenate([p.relevance_at[RELU_TENSOR] for p in parts]))
    np.testing.assert_array_equal(m.inputs["image"], x)
    whole = ex.explain(x, target=list(range(10)))  # the whole batch at once: the same up to float32 rounding
    np.testing.assert_array_equal(m.target, whole.target)
    assert_close(m.relevance, whole.relevance, rtol=1e-5, atol=1e-7)
    a, b = m.arrays(), whole.arrays()
    assert list(a) == list(b)
    for k in a:
        assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_concat_keeps_several_inputs_as_a_dict_and_names_the_worst_gap_over_the_run():
    x = np.arange(12, dtype=np.float64).reshape(6, 2)

    def part(lo, hi):
        xs, forward = x[lo:hi], {"y": x[lo:hi] * 1.0}
        deployed = {"y": xs + np.where(np.arange(lo, hi)[:, None] == 4, 0.5, 0.01)}
        gap = deployed_gap.measure("y", deployed["y"], forward["y"], None, hi - lo)
        return Explanation(relevance={"a": xs, "b": -xs}, outputs=deployed, forward=forward, deployed_gap=gap,
                           target=np.zeros(hi - lo, np.int64), explained_output="y",
                           ledger={"entering": np.ones(3), "leaving": np.full(3, 2.0)})

    m = Explanation.concat([part(0, 3), part(3, 6)])  # the items before each part count it
    whole = deployed_gap.measure("y", m.outputs["y"], m.forward["y"], None, 6)  # the reference: one measurement
    assert (m.deployed_gap.item, m.deployed_gap.max_abs) == (whole.item, whole.max_abs) == (4, 0.5)
    np.testing.assert_array_equal(m.relevance["b"], -x)
    np.testing.assert_array_equal(m.forward["y"], x)
    np.testing.assert_array_equal(m.ledger["leaving"], np.full(3, 4.0))  # summed over the batch, as one call's
    assert list(m.arrays()) == ["relevance/a", "relevance/b", "outputs", "targets"]
