"""Integrated Gradients over a composite (``integrated-gradients`` with ``base=`` an LRP composite): the path
integral of the composite's modified gradient, as zennit 0.5.1's ``IntegratedGradients(model, composite=C,
n_iter=n)`` computes it, checked against zennit's results stored in tests/goldens/methods/ig_composite.npz
(scripts/make_ig_composite_goldens.py: EpsilonPlusFlat and EpsilonGammaBox on a small CNN, from a zero and a
constant baseline) within 1e-5 relative L2 or 3x zennit's own float32-vs-float64 distance."""
from __future__ import annotations

import json

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp import InputError
from onnx_lrp.methods import Attributor
from util import GOLDENS, cli, rel_l2

MODEL = GOLDENS / "methods" / "plain_cnn.onnx"
GOLD = np.load(GOLDENS / "methods" / "ig_composite.npz")
INDEX = json.loads(str(GOLD["index"]))
X, T = GOLD["x"], GOLD["target"]


def _options(case: dict) -> dict:
    """zennit's IntegratedGradients(n_iter=n) as onnx-lrp's options: riemann_right (alpha = k / n, k = 1..n)."""
    return dict(n_steps=case["n_steps"], integration="riemann_right", baselines=case["baselines"],
                base=case["composite"], base_options=case["params"])


@pytest.fixture(scope="module")
def attributors():
    return {k: Attributor(str(MODEL), "integrated-gradients", **_options(c)) for k, c in INDEX.items()}


@pytest.mark.parametrize("case", sorted(INDEX))
def test_ig_over_a_composite_is_zennits(case, attributors):
    got = attributors[case].attribute(X, T)
    ref = GOLD[f"{case}/ref"]
    assert got.shape == X.shape and got.dtype == np.float32
    assert rel_l2(got, ref) <= max(1e-5, 3 * INDEX[case]["f32_vs_f64"]), rel_l2(got, ref)


def test_the_explainer_and_the_cli_give_the_same(tmp_path, attributors):
    case = INDEX["epf"]
    ex = onnx_lrp.Explainer(str(MODEL), method="integrated-gradients", **_options(case))
    res = ex.explain(X, target=T)
    want = attributors["epf"].attribute(X, T)
    np.testing.assert_allclose(res.relevance, want, rtol=1e-6, atol=np.abs(want).max() * 1e-6)
    np.testing.assert_array_equal(res.target, T)
    np.save(tmp_path / "x.npy", X)
    r = cli("explain", MODEL, tmp_path / "x.npy", "--method", "integrated-gradients", "--base", "epsilon-plus-flat",
            "--n-steps", "8", "--integration", "riemann_right", "--target", "4,1", "-o", tmp_path / "r.npz")
    assert r.exit_code == 0, r.output
    with np.load(tmp_path / "r.npz") as z:
        np.testing.assert_allclose(z["relevance"], want, rtol=1e-6, atol=np.abs(want).max() * 1e-6)
    # the composite's rule parameters (--low/--high of EpsilonGammaBox) go to the base on the command line
    r = cli("explain", MODEL, tmp_path / "x.npy", "--method", "integrated-gradients", "--base", "epsilon-gamma-box",
            "--low", "-3", "--high", "3", "--n-steps", "8", "--integration", "riemann_right", "--target", "4,1",
            "-o", tmp_path / "b.npz")
    assert r.exit_code == 0, r.output
    with np.load(tmp_path / "b.npz") as z:
        assert rel_l2(z["relevance"], GOLD["egb/ref"]) <= max(1e-5, 3 * INDEX["egb"]["f32_vs_f64"])
    r = cli("explain", MODEL, tmp_path / "x.npy", "--method", "integrated-gradients", "--epsilon", "0.1",
            "-o", tmp_path / "c.npz")
    assert r.exit_code == 2 and "takes one only over a composite (--base COMPOSITE)" in r.stderr, r.stderr
    assert not (tmp_path / "c.npz").exists()


def test_chunked_runs_and_argmax_targets_give_the_same(attributors):
    """Two rows per run (the steps in many chunks) equal one run; target None is the arg-max at the input."""
    options = _options(INDEX["egb"])
    small = Attributor(str(MODEL), "integrated-gradients", internal_batch_size=2, **options)
    whole = attributors["egb"]
    np.testing.assert_allclose(small.attribute(X, T), whole.attribute(X, T), rtol=1e-6,
                               atol=np.abs(whole.attribute(X, T)).max() * 1e-6)
    y = onnx_lrp.Explainer(str(MODEL)).explain(X).target
    np.testing.assert_array_equal(whole.attribute(X, None), whole.attribute(X, y))


@pytest.mark.parametrize("options, words", [
    ({"base": "smoothgrad"}, "not the method 'smoothgrad'"),
    ({"base_options": {"epsilon": 0.1}}, "give base= an LRP composite name"),
    ({"base": "no-such-composite"}, "unknown composite 'no-such-composite'")])
def test_bad_bases_are_refused_in_one_line(options, words):
    with pytest.raises(InputError, match=words):
        Attributor(str(MODEL), "integrated-gradients", **options)


def test_rewrite_refuses_ig_over_a_composite(tmp_path):
    """The in-graph IG is the true gradient's: over a composite it is refused in one line, nothing written."""
    r = cli("rewrite", MODEL, "-o", tmp_path / "ig.onnx", "--method", "integrated-gradients", "--base", "epsilon")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "over composite 'epsilon'" in r.stderr, r.stderr
    assert not (tmp_path / "ig.onnx").exists()
