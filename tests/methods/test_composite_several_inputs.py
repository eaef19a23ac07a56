"""SmoothGrad / VarGrad and Integrated Gradients over an LRP composite (``base=`` a composite name) on models with
several inputs: every float input moved (noise on each, the path from each one's baseline), integer inputs (masks)
fed as given. The reference is the LRP explainer itself run one sample (one point of the path) at a time: the mean
over the same explicit noise of its relevance, and the weighted sum over the steps of its relevance started from 1
(``start="one-hot"``) times (x - b); <= 1e-5 relative L2."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp import InputError
from onnx_lrp.methods import Attributor
from onnx_lrp.methods.integration import alphas_and_steps
from util import GOLDENS, make_model, node, rel_l2, to_bytes

TWO = str(GOLDENS / "methods" / "two_inputs.onnx")
RNG = np.random.default_rng(0)
U = RNG.normal(size=(2, 4)).astype(np.float32)
V = RNG.normal(size=(2, 2, 5)).astype(np.float32)
T = np.array([1, 0])
NOISE = (RNG.normal(0, 0.3, (3, 2, 4)).astype(np.float32), RNG.normal(0, 0.3, (3, 2, 2, 5)).astype(np.float32))


@pytest.fixture(scope="module")
def lrp():
    return onnx_lrp.Explainer(TWO, composite="epsilon")


def _one_by_one(lrp, feeds_per_sample, start=None) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a path point's relevance started from 1 is not conserved
        return [lrp.explain(f, target=T, start=start).relevance for f in feeds_per_sample]


@pytest.mark.parametrize("nt_type", ["smoothgrad", "vargrad"])
def test_noise_tunnel_over_a_composite_on_two_inputs(lrp, nt_type):
    method = "vargrad" if nt_type == "vargrad" else "smoothgrad"
    got = Attributor(TWO, method, base="epsilon", noise=NOISE, nt_samples=3).attribute({"u": U, "v": V}, T)
    rs = _one_by_one(lrp, [{"u": U + NOISE[0][i], "v": V + NOISE[1][i]} for i in range(3)])
    for k in "uv":
        r = np.array([x[k] for x in rs], np.float64)
        ref = r.mean(0) if nt_type == "smoothgrad" else (r * r).mean(0) - r.mean(0) ** 2
        assert got[k].shape == ref.shape and got[k].dtype == np.float32
        assert rel_l2(got[k], ref) <= 1e-5, (k, rel_l2(got[k], ref))


def test_integrated_gradients_over_a_composite_on_two_inputs(lrp):
    """IG over epsilon from baselines (0.1, -0.2), Gauss-Legendre, 5 steps: the slow loop over the steps; a tuple
    in gives a tuple out, a dict a dict; the Explainer gives the same and its outputs."""
    base = (0.1, -0.2)
    alphas, steps = alphas_and_steps("gausslegendre", 5)
    options = {"base": "epsilon", "n_steps": 5, "integration": "gausslegendre", "baselines": base}
    got = Attributor(TWO, "integrated-gradients", **options).attribute((U, V), T)
    assert isinstance(got, tuple) and len(got) == 2
    points = [{"u": base[0] + a * (U - base[0]), "v": base[1] + a * (V - base[1])} for a in alphas]
    rs = _one_by_one(lrp, [{k: p[k].astype(np.float32) for k in p} for p in points], start="one-hot")
    for i, (k, x) in enumerate((("u", U), ("v", V))):
        ref = sum(w * r[k].astype(np.float64) for w, r in zip(steps, rs)) * (x.astype(np.float64) - base[i])
        assert rel_l2(got[i], ref) <= 1e-5, (k, rel_l2(got[i], ref))
    res = onnx_lrp.Explainer(TWO, method="integrated-gradients", **options).explain({"v": V, "u": U}, target=T)
    assert sorted(res.relevance) == ["u", "v"] and np.array_equal(res.target, T)
    for i, k in enumerate("uv"):
        np.testing.assert_allclose(res.relevance[k], got[i], rtol=1e-6, atol=np.abs(got[i]).max() * 1e-6)


N, S, D, C = 2, 5, 4, 3
W = np.random.default_rng(0).standard_normal((D, C)).astype(np.float32)
MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int64)
X = np.random.default_rng(1).standard_normal((N, S, D)).astype(np.float32)


def masked() -> bytes:
    """y = sum_t (x * mask)[:, t] @ W + 0.1: the integer mask the model's first input."""
    nodes = [node("Cast", ["mask"], "m", to=1), node("Unsqueeze", ["m", "two"], "mu"), node("Mul", ["x", "mu"], "h"),
             node("ReduceSum", ["h", "one"], "s", keepdims=0), node("MatMul", ["s", "W"], "z"),
             node("Add", ["z", "b"], "y")]
    return to_bytes(make_model(nodes, {"mask": (["N", S], np.int64), "x": ["N", S, D]}, ["y"],
                               {"W": W, "b": np.full(C, 0.1, np.float32), "one": np.array([1], np.int64),
                                "two": np.array([2], np.int64)}))


def test_a_held_mask_reaches_every_noisy_copy():
    """One float input and an integer mask: SmoothGrad over epsilon is the mean of the LRP explainer's relevance
    at each noisy copy with the mask as given (zero at the padded steps); the mask is not attributed."""
    model = masked()
    noise = np.random.default_rng(2).normal(0, 0.5, (4, N, S, D)).astype(np.float32)
    ex = onnx_lrp.Explainer(model, method="smoothgrad", base="epsilon", noise=noise, nt_samples=4)
    assert ex.relevance_inputs == ["x"] and ex.held_inputs == ["mask"]
    got = ex.explain({"mask": MASK, "x": X}, target=[0, 2]).relevance
    lrp = onnx_lrp.Explainer(model, composite="epsilon")
    ref = np.mean([lrp.explain({"mask": MASK, "x": X + n}, target=[0, 2]).relevance for n in noise], axis=0)
    assert got.shape == X.shape and rel_l2(got, ref) <= 1e-5
    assert np.all(got[1, 3:] == 0) and np.any(got[0, 3:] != 0)
    ex1 = onnx_lrp.Explainer(model, method="smoothgrad", base="epsilon", noise=noise[:, 1], nt_samples=4)
    one = ex1.explain({"mask": MASK[1], "x": X[1]}, target=2).relevance  # an item without its batch axis
    assert one.shape == X.shape[1:]
    np.testing.assert_allclose(one, got[1], rtol=1e-6, atol=np.abs(got).max() * 1e-6)


def test_a_non_float_attributed_input_refused_in_one_line():
    """The noise moves the attributed inputs: a model whose only input is token ids is refused naming it."""
    ids = to_bytes(make_model([node("Gather", ["E", "ids"], "e"), node("ReduceSum", ["e", "one"], "y", keepdims=0)],
                              {"ids": (["N", 3], np.int64)}, ["y"],
                              {"E": np.ones((5, 2), np.float32), "one": np.array([1], np.int64)}))
    with pytest.raises(InputError) as exc:
        Attributor(ids, "smoothgrad", base="epsilon", nt_samples=2).attribute(np.zeros((1, 3), np.int64), 0)
    assert "smoothgrad over composite 'epsilon' moves the input" in str(exc.value) and "\n" not in str(exc.value)
