"""Models with several inputs behind the Explainer's face and on the command line: ``Explainer(model, method=M)``
explains a dict by input name (or a tuple in the model's order) and returns a relevance per attributed input, as
LRP's Explanation holds it; ``explain MODEL x.npz --method M`` writes ``relevance/<input>`` per input. Checked
against the Attributor and captum 0.9's attributions stored in tests/goldens/methods/two_inputs.npz
(scripts/make_captum_goldens.py), and integer inputs (masks) held against a numpy oracle."""
from __future__ import annotations

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp import InputError
from onnx_lrp.methods import Attributor
from util import GOLDENS, cli, make_model, node, rel_l2, stored_options

MODEL = GOLDENS / "methods" / "two_inputs.onnx"
TWO = np.load(GOLDENS / "methods" / "two_inputs.npz")
TOL = 1e-5
CASES = {"saliency": "gradient", "ig": "integrated-gradients", "smoothgrad": "smoothgrad",
         "gradient_shap": "gradient-shap", "occlusion": "occlusion"}
#: the occlusion options scripts/make_captum_goldens.py gave captum: one window, strides and baseline per input
OCCLUSION = {"sliding_window_shapes": ((2,), (1, 3)), "strides": ((1,), (1, 2)), "baselines": (0.1, -0.2)}


def _f32(a):
    return a.astype(np.float32) if a.dtype == np.float16 else a


U, V, T = _f32(TWO["u"]), _f32(TWO["v"]), TWO["target"]


def _options(case) -> dict:
    """The case's options from two_inputs.npz: ``<case>/<option>/<input>`` as a tuple (u, v), else the value."""
    if case == "occlusion":
        return OCCLUSION
    return stored_options(TWO, case)


@pytest.mark.parametrize("case", sorted(CASES))
def test_explainer_takes_several_inputs_as_the_attributor_and_captum(case):
    method, options = CASES[case], _options(case)
    ex = onnx_lrp.Explainer(str(MODEL), method=method, **options)
    res = ex.explain({"v": V, "u": U}, target=T)
    assert ex.relevance_inputs == ["u", "v"] and ex.held_inputs == []
    assert isinstance(res.relevance, dict) and sorted(res.relevance) == ["u", "v"]
    assert sorted(res.inputs) == ["u", "v"] and np.array_equal(res.target, T)
    ref = Attributor(str(MODEL), method, **options).attribute((U, V), T)
    for got, want, name in zip((res.relevance["u"], res.relevance["v"]), ref, "uv"):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=np.abs(want).max() * 1e-6)
        captum = TWO[f"{case}/ref/{name}"]
        assert rel_l2(got, captum) <= (4e-6 if case == "occlusion" else TOL), (name, rel_l2(got, captum))
    as_tuple = ex.explain((U, V), target=T)
    assert all(np.array_equal(as_tuple.relevance[k], res.relevance[k]) for k in "uv")
    if case in ("saliency", "occlusion"):  # one item without its batch axis: every field without one
        one = ex.explain({"u": U[1], "v": V[1]}, target=int(T[1]))
        assert not one.batched and one.relevance["v"].shape == V.shape[1:]
        np.testing.assert_allclose(one.relevance["v"], res.relevance["v"][1], rtol=1e-6,
                                   atol=np.abs(res.relevance["v"]).max() * 1e-6)


def test_a_missing_input_is_refused_naming_the_inputs():
    ex = onnx_lrp.Explainer(str(MODEL), method="gradient")
    with pytest.raises(InputError, match="2 inputs \\(u, v\\)"):
        ex.explain({"u": U}, target=0)
    with pytest.raises(InputError, match="2 inputs"):
        ex.explain(U, target=0)


@pytest.fixture(scope="module")
def uv_npz(tmp_path_factory):
    path = tmp_path_factory.mktemp("inputs") / "uv.npz"
    np.savez(path, u=U, v=V)
    return path


@pytest.mark.parametrize("method, flags, options", [
    ("gradient", [], {}),
    ("integrated-gradients", ["--n-steps", "6", "--baselines", "0.25"], {"n_steps": 6, "baselines": 0.25}),
    ("occlusion", ["--sliding-window-shapes", "2;1,3", "--strides", "1;1,2", "--baselines", "0.1"],
     {"sliding_window_shapes": ((2,), (1, 3)), "strides": ((1,), (1, 2)), "baselines": 0.1})])
def test_cli_writes_a_relevance_per_input_as_the_api(tmp_path, uv_npz, method, flags, options):
    out = tmp_path / "rel.npz"
    r = cli("explain", MODEL, uv_npz, "--method", method, "--target", "1", "-o", out, *flags)
    assert r.exit_code == 0, r.output
    ref = onnx_lrp.Explainer(str(MODEL), method=method, **options).explain({"u": U, "v": V}, target=1)
    with np.load(out) as z:
        assert {"relevance/u", "relevance/v", "outputs", "targets"} <= set(z.files) and "relevance" not in z.files
        for k in "uv":
            np.testing.assert_allclose(z[f"relevance/{k}"], ref.relevance[k], rtol=1e-6,
                                       atol=np.abs(ref.relevance[k]).max() * 1e-6)
        np.testing.assert_array_equal(z["targets"], [1, 1])


def test_cli_refuses_an_npy_output_for_several_inputs(tmp_path, uv_npz):
    r = cli("explain", MODEL, uv_npz, "--method", "gradient", "-o", tmp_path / "rel.npy")
    assert r.exit_code == 2 and "write an .npz to hold a relevance per input" in r.stderr
    assert not (tmp_path / "rel.npy").exists()


def _masked_linear():
    """y = (x * float(m)) @ W + b: a float input x and an integer mask m (held, not attributed)."""
    rng = np.random.default_rng(5)
    w, b = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    nodes = [node("Cast", ["m"], "mf", to=1), node("Mul", ["x", "mf"], "xm"), node("MatMul", ["xm", "W"], "h"),
             node("Add", ["h", "b"], "y")]
    model = make_model(nodes, {"x": ["N", 4], "m": (["N", 4], np.int64)}, ["y"], {"W": w, "b": b})
    return model.SerializeToString(), w


@pytest.mark.parametrize("method", ["gradient", "gradient-x-input", "integrated-gradients"])
def test_integer_inputs_are_held_not_attributed(method):
    model, w = _masked_linear()
    rng = np.random.default_rng(6)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    m = np.array([[1, 1, 0, 1], [0, 1, 1, 1], [1, 0, 0, 1]], np.int64)
    t = np.array([0, 2, 1])
    ex = onnx_lrp.Explainer(model, method=method, n_steps=4) if method == "integrated-gradients" else \
        onnx_lrp.Explainer(model, method=method)
    assert ex.relevance_inputs == ["x"] and ex.held_inputs == ["m"]
    res = ex.explain({"x": x, "m": m}, target=t)
    lrp = onnx_lrp.Explainer(model).explain({"x": x, "m": m}, target=t)
    assert isinstance(res.relevance, np.ndarray) and isinstance(lrp.relevance, np.ndarray)  # one input: as LRP's
    grad = w[:, t].T * m  # the gradient of y[t] w.r.t. x; the model is linear in x: IG from 0 is gradient x input
    want = grad if method == "gradient" else grad * x
    np.testing.assert_allclose(res.relevance, want, rtol=1e-5, atol=1e-6)
    assert sorted(res.inputs) == ["m", "x"] and np.array_equal(res.inputs["m"], m)


def test_cli_with_a_held_mask_writes_what_lrp_writes(tmp_path):
    """A float input and an integer mask: the .npz holds the same arrays by name as LRP's (one relevance)."""
    model, w = _masked_linear()
    (tmp_path / "m.onnx").write_bytes(model)
    x = np.random.default_rng(7).normal(size=(2, 4)).astype(np.float32)
    m = np.array([[1, 0, 1, 1], [1, 1, 0, 1]], np.int64)
    np.savez(tmp_path / "xm.npz", x=x, m=m)
    for name, flags in (("lrp", []), ("grad", ["--method", "gradient"])):
        r = cli("explain", tmp_path / "m.onnx", tmp_path / "xm.npz", "--target", "2", "-o", tmp_path / f"{name}.npz",
                *flags)
        assert r.exit_code == 0, r.output
    with np.load(tmp_path / "lrp.npz") as a, np.load(tmp_path / "grad.npz") as b:
        assert sorted(a.files) == sorted(b.files) and "relevance" in b.files
        np.testing.assert_allclose(b["relevance"], np.broadcast_to(w[:, 2], x.shape) * m, rtol=1e-5, atol=1e-6)
