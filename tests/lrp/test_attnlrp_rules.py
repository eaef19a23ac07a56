"""The transformer rules against numpy oracles written from the AttnLRP / CP-LRP equations, on single-op models.

A probe ``<reshape(out, [1, -1]), c>`` follows the op under test and gets the gradient rule, so the relevance
entering the op's output is exactly R = batch * c (c has the output's full shape, batch included); the op gets the attnlrp (or cp-lrp) rule.
Equations (Achtibat et al., AttnLRP, ICML 2024; Ali et al., CP-LRP, ICML 2022), stab = zennit's stabiliser:

- uniform (eq. 7), z = f(a, b) bilinear, k activation factors:   R_a = a ⊙ J_a^T (R / (k stab(z)))
- CP-LRP, attention weights A = softmax(S) held constant:        R_V = V ⊙ A^T (R / stab(A V)),  R_S = 0
- softmax (eq. 13):                                              R_x = x ⊙ (R − softmax(x) Σ R), 0 where x = −inf
- identity rule (eq. 9) on x·sigmoid(x), GELU (erf, tanh):       R_x = R
- LayerNorm / RMSNorm, std held constant (LXT):                  R_x = x ⊙ J^T (R / stab(y)),
  J^T s = (s γ − mean(s γ)) / std  (RMS: s γ / rms)
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from util import explain_probe, make_model, node, run, stab, to_bytes

import onnx_lrp
from onnx_lrp.rules import Entry, Gradient, load_composite

BATCH = 2
EPS = 1e-9  # the built-in composites' epsilon (LXT's efficient mode: epsilon -> 0)
RNG = np.random.default_rng(2024)


def composite(name="attnlrp"):
    base = load_composite(name)
    return dataclasses.replace(base, entries=(Entry({"name": "probe*"}, Gradient()),) + base.entries)


def probed(model, out, out_shape, feeds, name="attnlrp", c=None, **kw):
    """``util.explain_probe`` under the composite ``name`` with output relevance ``c`` (default: normal, seeded)."""
    c = RNG.normal(size=(BATCH,) + tuple(out_shape)).astype(np.float32) if c is None else c
    return explain_probe(model, out, c, composite(name), feeds, BATCH, **kw)


def f64(a):
    return np.asarray(a, dtype=np.float64)


def close(got, want, tol=2e-5):
    got, want = f64(got), f64(want)
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err < tol, f"relative L2 error {err:.2e}"


# ------------------------------------------------------------------------------------------ products
def test_matmul_of_two_activations_uniform():
    a = RNG.normal(size=(BATCH, 2, 5, 3)).astype(np.float32)
    b = RNG.normal(size=(BATCH, 2, 3, 4)).astype(np.float32)
    m = make_model([node("MatMul", ["a", "b"], ["y"])], {"a": a.shape, "b": b.shape}, ["y"])
    res, R = probed(m, "y", (2, 5, 4), {"a": a, "b": b})
    z = f64(a) @ f64(b)
    s = R / (2 * stab(z, EPS))
    close(res.relevance["a"], f64(a) * (s @ np.swapaxes(f64(b), -1, -2)))
    close(res.relevance["b"], f64(b) * (np.swapaxes(f64(a), -1, -2) @ s))
    # the uniform rule conserves what reaches the product
    total = f64(res.relevance["a"]).sum() + f64(res.relevance["b"]).sum()
    np.testing.assert_allclose(total, R.sum(), rtol=1e-4)


def test_matmul_broadcast_batch_of_one_operand():
    a = RNG.normal(size=(BATCH, 3, 5, 3)).astype(np.float32)
    b = RNG.normal(size=(BATCH, 1, 3, 4)).astype(np.float32)  # broadcast over heads
    m = make_model([node("MatMul", ["a", "b"], ["y"])], {"a": a.shape, "b": b.shape}, ["y"])
    res, R = probed(m, "y", (3, 5, 4), {"a": a, "b": b})
    s = R / (2 * stab(f64(a) @ f64(b), EPS))
    close(res.relevance["b"], f64(b) * (np.swapaxes(f64(a), -1, -2) @ s).sum(1, keepdims=True))


def test_mul_of_two_activations_halves():
    a = RNG.normal(size=(BATCH, 4, 6)).astype(np.float32)
    b = RNG.normal(size=(BATCH, 4, 1)).astype(np.float32)  # gating broadcast along the last axis
    m = make_model([node("Mul", ["a", "b"], ["y"])], {"a": a.shape, "b": b.shape}, ["y"])
    res, R = probed(m, "y", (4, 6), {"a": a, "b": b})
    z = f64(a) * f64(b)
    s = R / (2 * stab(z, EPS))
    close(res.relevance["a"], f64(a) * s * f64(b))
    close(res.relevance["b"], (f64(b) * s * f64(a)).sum(-1, keepdims=True))
    close(res.relevance["a"], np.broadcast_to(R / 2, a.shape), tol=1e-4)  # z / stab(z) = 1 up to eps


def test_einsum_scores_uniform():
    q = RNG.normal(size=(BATCH, 2, 4, 3)).astype(np.float32)
    k = RNG.normal(size=(BATCH, 2, 5, 3)).astype(np.float32)
    m = make_model([node("Einsum", ["q", "k"], ["y"], equation="bhqd,bhkd->bhqk")], {"q": q.shape, "k": k.shape},
                   ["y"], opset=17)
    res, R = probed(m, "y", (2, 4, 5), {"q": q, "k": k})
    s = R / (2 * stab(np.einsum("bhqd,bhkd->bhqk", f64(q), f64(k)), EPS))
    close(res.relevance["q"], f64(q) * np.einsum("bhqk,bhkd->bhqd", s, f64(k)))
    close(res.relevance["k"], f64(k) * np.einsum("bhqk,bhqd->bhkd", s, f64(q)))


def test_cp_lrp_holds_attention_weights():
    S = RNG.normal(size=(BATCH, 2, 4, 4)).astype(np.float32)
    V = RNG.normal(size=(BATCH, 2, 4, 3)).astype(np.float32)
    m = make_model([node("Softmax", ["S"], ["A"], axis=-1), node("MatMul", ["A", "V"], ["y"])],
                   {"S": S.shape, "V": V.shape}, ["y"])
    res, R = probed(m, "y", (2, 4, 3), {"S": S, "V": V}, name="cp-lrp")
    A = np.exp(f64(S) - f64(S).max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)
    close(res.relevance["V"], f64(V) * (np.swapaxes(A, -1, -2) @ (R / stab(A @ f64(V), EPS))))
    assert np.all(res.relevance["S"] == 0)
    # AttnLRP on the same model: half through the softmax
    res2, R2 = probed(m, "y", (2, 4, 3), {"S": S, "V": V}, c=(R / BATCH).astype(np.float32))
    s = R2 / (2 * stab(A @ f64(V), EPS))
    RA = A * (s @ np.swapaxes(f64(V), -1, -2))
    close(res2.relevance["S"], f64(S) * (RA - A * RA.sum(-1, keepdims=True)), tol=1e-4)


# ------------------------------------------------------------------------------------------ softmax
def test_softmax_rule_with_masked_logits():
    x = RNG.normal(size=(BATCH, 3, 6)).astype(np.float32)
    mask = np.tril(np.ones((3, 6), dtype=bool))[None]
    low = np.float32(np.finfo(np.float32).min)
    m = make_model([node("Where", ["mask", "x", "minus_inf"], ["xm"]),
                    node("Where", ["mask2", "xm", "low"], ["xl"]),
                    node("Softmax", ["xl"], ["y"], axis=-1)],
                   {"x": x.shape}, ["y"],
                   inits={"mask": mask, "minus_inf": np.array(-np.inf, dtype=np.float32),
                          "mask2": np.concatenate([np.ones((1, 3, 5), bool), np.zeros((1, 3, 1), bool)], -1),
                          "low": np.array(low)})
    res, R = probed(m, "y", (3, 6), {"x": x})
    logits = np.where(mask, f64(x), -np.inf)
    logits[..., -1] = float(low)
    y = np.exp(logits - logits.max(-1, keepdims=True))
    y /= y.sum(-1, keepdims=True)
    keep = np.isfinite(logits) & (logits > float(low) / 2)
    Rx = np.where(keep, np.where(keep, logits, 0.0) * (R - y * R.sum(-1, keepdims=True)), 0.0)
    # relevance follows the Where selections back to x: only unmasked logits keep any
    want = np.where(mask & np.concatenate([np.ones((1, 3, 5), bool), np.zeros((1, 3, 1), bool)], -1), Rx, 0.0)
    assert np.all(np.isfinite(res.relevance))
    close(res.relevance, want)


# ------------------------------------------------------------------------------------------ identity rule
def _silu(x):
    return [node("Sigmoid", [x], ["sg"]), node("Mul", [x, "sg"], ["y"])]


def _gelu_erf(x):
    return [node("Div", [x, "sqrt2"], ["xd"]), node("Erf", ["xd"], ["e"]), node("Add", ["e", "one"], ["e1"]),
            node("Mul", [x, "e1"], ["xe"]), node("Mul", ["xe", "half"], ["y"])]


def _gelu_tanh(x):
    return [node("Pow", [x, "three"], ["x3"]), node("Mul", ["x3", "c044"], ["x3c"]), node("Add", [x, "x3c"], ["in"]),
            node("Mul", ["in", "k"], ["ink"]), node("Tanh", ["ink"], ["t"]), node("Add", ["t", "one"], ["t1"]),
            node("Mul", ["half", x], ["hx"]), node("Mul", ["hx", "t1"], ["y"])]


CONSTS = {"sqrt2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32),
          "half": np.array(0.5, np.float32), "three": np.array(3.0, np.float32),
          "c044": np.array(0.044715, np.float32), "k": np.array(np.sqrt(2 / np.pi), np.float32)}


@pytest.mark.parametrize("build,name", [(_silu, "silu"), (_gelu_erf, "gelu-erf"), (_gelu_tanh, "gelu-tanh")])
def test_self_products_get_the_identity_rule(build, name):
    from onnx_lrp import load as loader
    from onnx_lrp.lrp import patterns
    x = RNG.normal(size=(BATCH, 7)).astype(np.float32)
    # the non-linearity follows a linear layer, as in an MLP: x -> h = x W -> act(h)
    w = RNG.normal(size=(7, 5)).astype(np.float32)
    nodes = [node("MatMul", ["x", "w"], ["h"])] + build("h")
    m = make_model(nodes, {"x": x.shape}, ["y"], inits={"w": w, **CONSTS})
    g = loader.load(to_bytes(m)).graph
    found = patterns.annotate(g)
    assert [f.name for f in found] == [name]
    res, R = probed(m, "y", (5,), {"x": x})
    h = f64(x) @ f64(w)
    if name == "gelu-erf":  # the trailing Mul by 0.5 is outside the product: epsilon there, R * y / stab(y)
        y = f64(run(m, {"x": x})[0])  # float32's y (1 + erf saturates to 0 for h < -5.5)
        R = R * y / stab(y, EPS)
    close(res.relevance, f64(x) * ((R / stab(h, EPS)) @ f64(w).T), tol=1e-4)  # R_h = R (identity), epsilon


def test_product_of_two_different_tensors_is_not_a_self_product():
    from onnx_lrp import load as loader
    from onnx_lrp.lrp import patterns
    m = make_model([node("Sigmoid", ["b"], ["sg"]), node("Mul", ["a", "sg"], ["y"], name="gate")],
                   {"a": (BATCH, 4), "b": (BATCH, 4)}, ["y"])
    g = loader.load(to_bytes(m)).graph
    assert patterns.annotate(g) == []
    gate = next(n for n in g if n.name == "gate")
    reason = patterns.why(gate)
    assert "functions of different tensors" in reason and "no normalising scale" in reason
    assert patterns.match_gate(gate)[0].gate.name == "sg"  # ... but a signal times a sigmoid gate
    a, b = RNG.normal(size=(2, BATCH, 4)).astype(np.float32)
    res, R = probed(m, "y", (4,), {"a": a, "b": b})
    close(res.relevance["a"], np.broadcast_to(R, a.shape), tol=1e-4)  # signal-take-all: the signal gets all
    assert not np.any(res.relevance["b"])  # the gate is a constant multiplier


def test_division_of_two_unrelated_activations_is_rejected_with_reason():
    m = make_model([node("Div", ["a", "b"], ["y"], name="ratio")], {"a": (1, 4), "b": (1, 4)}, ["y"])
    with pytest.raises(onnx_lrp.UnsupportedError, match="ratio.*not a normalisation.*graph input"):
        onnx_lrp.Explainer(to_bytes(m), composite="attnlrp")


# ------------------------------------------------------------------------------------------ normalisations
def ln_oracle(x, g, b, R, eps_ln, centered=True):
    x = f64(x)
    d = x - x.mean(-1, keepdims=True) if centered else x
    inv = 1 / np.sqrt((d * d).mean(-1, keepdims=True) + eps_ln)
    y = d * inv * g + b
    s = R / stab(y, EPS) * g
    if centered:
        s = s - s.mean(-1, keepdims=True)
    return x * s * inv


def _ln_inits(h):
    return {"gamma": RNG.normal(size=h).astype(np.float32), "beta": RNG.normal(size=h).astype(np.float32)}


def test_layernormalization_op_holds_the_std():
    x = RNG.normal(size=(BATCH, 3, 6)).astype(np.float32) * 2 + 1
    inits = _ln_inits(6)
    m = make_model([node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)],
                   {"x": x.shape}, ["y"], inits=inits)
    res, R = probed(m, "y", (3, 6), {"x": x})
    close(res.relevance, ln_oracle(x, inits["gamma"], inits["beta"], R, 1e-5))


def _decomposed_ln():
    return [node("ReduceMean", ["x"], ["mu"], axes=[-1]), node("Sub", ["x", "mu"], ["d"]),
            node("Pow", ["d", "two"], ["d2"]), node("ReduceMean", ["d2"], ["var"], axes=[-1]),
            node("Add", ["var", "eps"], ["ve"]), node("Sqrt", ["ve"], ["std"]), node("Div", ["d", "std"], ["n"]),
            node("Mul", ["n", "gamma"], ["ng"]), node("Add", ["ng", "beta"], ["y"])]


def _decomposed_rms():
    return [node("Pow", ["x", "two"], ["x2"]), node("ReduceMean", ["x2"], ["ms"], axes=[-1]),
            node("Add", ["ms", "eps"], ["me"]), node("Sqrt", ["me"], ["rms"]), node("Reciprocal", ["rms"], ["inv"]),
            node("Mul", ["x", "inv"], ["n"]), node("Mul", ["gamma", "n"], ["y"])]


@pytest.mark.parametrize("build,centered,kind", [(_decomposed_ln, True, "layernorm-scale"),
                                                 (_decomposed_rms, False, "rmsnorm-scale")])
def test_decomposed_norms_hold_the_scale(build, centered, kind):
    from onnx_lrp import load as loader
    from onnx_lrp.lrp import patterns
    x = RNG.normal(size=(BATCH, 3, 6)).astype(np.float32) * 2 + 1
    inits = _ln_inits(6)
    inits.update(two=np.array(2.0, np.float32), eps=np.array(1e-5, np.float32))
    m = make_model(build(), {"x": x.shape}, ["y"], inits=inits, opset=17)
    g = loader.load(to_bytes(m)).graph
    assert [f.name for f in patterns.annotate(g)] == [kind]
    res, R = probed(m, "y", (3, 6), {"x": x})
    beta = inits["beta"] if centered else np.zeros(6)
    close(res.relevance, ln_oracle(x, inits["gamma"], beta, R, 1e-5, centered))


def test_rmsnormalization_op():
    x = RNG.normal(size=(BATCH, 3, 6)).astype(np.float32) + 0.5
    gamma = RNG.normal(size=6).astype(np.float32)
    m = make_model([node("RMSNormalization", ["x", "gamma"], ["y"], axis=-1, epsilon=1e-6)], {"x": x.shape}, ["y"],
                   inits={"gamma": gamma}, opset=23)
    try:
        res, R = probed(m, "y", (3, 6), {"x": x})
    except onnx_lrp.LrpError as exc:  # an onnxruntime without opset 23
        pytest.skip(f"RMSNormalization not runnable here: {exc}")
    close(res.relevance, ln_oracle(x, gamma, np.zeros(6), R, 1e-6, centered=False))


# ------------------------------------------------------------------------------------------ masks and lookups
def test_where_tile_trilu_follow_their_transpose():
    x = RNG.normal(size=(BATCH, 3, 4)).astype(np.float32)
    cond = RNG.random(size=(1, 3, 8)) > 0.4
    m = make_model([node("Tile", ["x", "reps"], ["t"]), node("Trilu", ["t"], ["u"], upper=1),
                    node("Where", ["cond", "u", "zero"], ["y"])], {"x": x.shape}, ["y"],
                   inits={"reps": np.array([1, 1, 2], np.int64), "cond": cond, "zero": np.array(0.0, np.float32)})
    res, R = probed(m, "y", (3, 8), {"x": x})
    r = np.where(cond, R, 0.0)
    r = np.triu(r)
    want = r[..., :4] + r[..., 4:]
    close(res.relevance, want)


def test_gather_with_computed_indices_scatters_back():
    x = RNG.normal(size=(BATCH, 5, 3)).astype(np.float32)
    idx = np.array([4, 0, 4, -1], dtype=np.int64)  # repeated and negative indices
    m = make_model([node("Gather", ["x", "idx"], ["y"], axis=1)], {"x": x.shape, "idx": ((4,), np.int64)}, ["y"])
    res, R = probed(m, "y", (4, 3), {"x": x, "idx": idx})
    want = np.zeros(x.shape)
    np.add.at(want, (slice(None), idx % 5), R)
    close(res.relevance, want)


def test_token_ids_get_relevance_per_token():
    table = RNG.normal(size=(11, 4)).astype(np.float32)
    w = RNG.normal(size=(4, 3)).astype(np.float32)
    m = make_model([node("Gather", ["table", "ids"], ["e"]), node("MatMul", ["e", "w"], ["y"])],
                   {"ids": ((BATCH, 5), np.int64)}, ["y"], inits={"table": table, "w": w})
    ids = RNG.integers(0, 11, size=(BATCH, 5))
    res, R = probed(m, "y", (5, 3), {"ids": ids})
    e = f64(table)[ids]
    Re = e * ((R / stab(e @ f64(w), EPS)) @ f64(w).T)
    assert res.relevance.shape == ids.shape
    close(res.relevance, Re.sum(-1))


# ------------------------------------------------------------------------------------------ sequence targets
def test_sequence_target_defaults_to_last_position():
    x = RNG.normal(size=(BATCH, 4, 5)).astype(np.float32)
    m = make_model([node("Mul", ["x", "two"], ["y"])], {"x": x.shape}, ["y"], inits={"two": np.array(2.0, np.float32)})
    ex = onnx_lrp.Explainer(to_bytes(m), composite="attnlrp")
    y = 2 * f64(x)
    res = ex.explain(x)
    want_c = y[:, -1].argmax(-1)
    np.testing.assert_array_equal(res.position, [3, 3])
    np.testing.assert_array_equal(res.target, want_c)
    want = np.zeros_like(y)
    want[np.arange(BATCH), 3, want_c] = y[np.arange(BATCH), 3, want_c]
    close(res.relevance, want, tol=1e-5)
    res = ex.explain(x, target=(1, 2))
    np.testing.assert_array_equal(res.position, [1, 1])
    np.testing.assert_array_equal(res.target, [2, 2])
    assert np.count_nonzero(res.relevance) == BATCH and np.all(res.relevance[:, 1, 2] != 0)
    res = ex.explain(x, position=[0, 2])
    np.testing.assert_array_equal(res.target, [y[0, 0].argmax(), y[1, 2].argmax()])
    with pytest.raises(onnx_lrp.InputError, match="position"):
        ex.explain(x, position=4)
    with pytest.raises(onnx_lrp.InputError, match="out of range"):
        ex.explain(x, target=5)
