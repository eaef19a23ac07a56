"""The rules reach the ops with rules of their own through one table per rule (``Rule.families``: ``Family`` ->
``FamilyRule``), and ``RuleOp.fits`` checks exactly what ``propagate`` / ``propagate_grad`` will call.

Property checked on one small model per family (product of activations, gate, softmax, held normalising scale,
LSTM), for every registered rule (and its epsilon = 0 form, where the rule's gradient form is taken): the rule either
explains the model with finite relevance (its table has the family), or the Explainer refuses it before emitting, in
one line naming the node, the op type and the rule (its table has no entry). A handler missing behind a successful
``fits`` would surface as an internal error instead, and fail here.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from util import explain, make_model, node, to_bytes

import onnx_lrp
from onnx_lrp.lrp.families import Family, FamilyRule, always_exact, family_table
from onnx_lrp.lrp.ops import REGISTRY
from onnx_lrp.lrp.ops.base import RuleOp
from onnx_lrp.lrp.ops.gates import GATE
from onnx_lrp.lrp.ops.products import PRODUCT_MUL
from onnx_lrp.lrp.ops.transformer import NORM_SCALE
from onnx_lrp.rules import RULES, Entry, Epsilon, Zero, load_composite

B = 2


def _product(rng):
    return [node("MatMul", ["a", "b"], ["y"], name="prod")], {"a": (B, 2, 3), "b": (B, 3, 4)}, {}, (B, 2, 4), "MatMul"


def _gate(rng):
    return [node("Sigmoid", ["b"], ["sg"]), node("Mul", ["a", "sg"], ["y"], name="gate")], \
        {"a": (B, 4), "b": (B, 4)}, {}, (B, 4), "Mul"


def _softmax(rng):  # a dense layer after it: an output softmax would be explained through its logits
    return [node("Softmax", ["x"], ["p"], name="sm", axis=-1), node("MatMul", ["p", "w"], ["y"])], {"x": (B, 5)}, \
        {"w": rng.normal(size=(5, 3)).astype(np.float32)}, (B, 3), "Softmax"


def _norm_scale(rng):  # RMSNorm written out: x * 1 / sqrt(mean(x^2) + eps), the scale held
    nodes = [node("Pow", ["x", "two"], ["x2"]), node("ReduceMean", ["x2"], ["ms"], axes=[-1]),
             node("Add", ["ms", "eps"], ["me"]), node("Sqrt", ["me"], ["rms"]), node("Reciprocal", ["rms"], ["inv"]),
             node("Mul", ["x", "inv"], ["n"], name="scale"), node("Mul", ["gamma", "n"], ["y"])]
    inits = {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32),
             "gamma": rng.normal(size=6).astype(np.float32)}
    return nodes, {"x": (B, 3, 6)}, inits, (B, 3, 6), "Mul"


def _lstm(rng):
    t, i, h = 3, 4, 5
    inits = {"W": rng.normal(size=(1, 4 * h, i)).astype(np.float32) * 0.5,
             "R": rng.normal(size=(1, 4 * h, h)).astype(np.float32) * 0.5, "zero": np.array([0], np.int64)}
    nodes = [node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),  # batch first at the input, as exporters write it
             node("LSTM", ["xt", "W", "R"], ["", "yh"], name="lstm", hidden_size=h),
             node("Squeeze", ["yh", "zero"], ["y"])]
    return nodes, {"x": (B, t, i)}, inits, (B, h), "LSTM"


def _model(family):
    """The family's model with a skip input added to its output (``out = y + skip``): relevance reaches an input
    also under a rule that passes none (zero). (model, node name, op type, feeds)"""
    rng = np.random.default_rng(26)  # the same model and inputs on every call
    nodes, inputs, inits, y_shape, op_type = BUILD[family](rng)
    model = make_model(nodes + [node("Add", ["y", "skip"], ["out"])], {**inputs, "skip": y_shape}, ["out"],
                       inits=inits)
    name = NODE[family]
    feeds = {k: rng.normal(size=shape).astype(np.float32) + (1 if family is Family.NORM_SCALE else 0)
             for k, shape in {**inputs, "skip": y_shape}.items()}
    return model, name, op_type, feeds


NODE = {Family.PRODUCT: "prod", Family.GATE: "gate", Family.SOFTMAX: "sm", Family.NORM_SCALE: "scale",
        Family.RECURRENT: "lstm"}
BUILD = {Family.PRODUCT: _product, Family.GATE: _gate, Family.SOFTMAX: _softmax, Family.NORM_SCALE: _norm_scale,
         Family.RECURRENT: _lstm}


def _rules():
    """Every registered rule with its defaults, and at epsilon = 0 where it has an epsilon (its gradient form)."""
    out = []
    for name in sorted(RULES):
        cls = RULES[name]
        out.append(pytest.param(cls(), id=name))
        if "epsilon" in {f.name for f in dataclasses.fields(cls)}:
            out.append(pytest.param(cls(epsilon=0.0), id=f"{name}-eps0"))
    return out


def test_every_op_with_rules_of_its_own_has_a_model_here():
    ops = [PRODUCT_MUL, GATE, NORM_SCALE, REGISTRY["Softmax"], REGISTRY["LSTM"]]
    assert {op.family for op in ops} == set(Family) == set(BUILD)

    def subclasses(cls):
        return {cls} | {s for c in cls.__subclasses__() for s in subclasses(c)}
    assert {op.family for op in ops} == {c.family for c in subclasses(RuleOp) - {RuleOp}}


@pytest.mark.filterwarnings("ignore::onnx_lrp.LrpWarning")  # conservation is not what this test is about
@pytest.mark.parametrize("family", list(Family), ids=lambda f: f.value)
@pytest.mark.parametrize("rule", _rules())
def test_a_rule_explains_a_family_iff_its_table_has_it(rule, family):
    model, name, op_type, feeds = _model(family)
    base = load_composite("attnlrp")
    comp = dataclasses.replace(base, name="probe", entries=(Entry({"name": name}, rule),) + base.entries)
    if family not in rule.families:
        with pytest.raises(onnx_lrp.UnsupportedError) as info:
            onnx_lrp.Explainer(to_bytes(model), composite=comp)
        text = str(info.value)
        assert "\n" not in text
        assert f"{op_type} (opset 17) [{name}]" in text and f"rule {rule.name} on " in text, text
        return
    res = onnx_lrp.Explainer(to_bytes(model), composite=comp).explain(feeds)
    assert all(np.all(np.isfinite(r)) for r in res.relevance.values())


@pytest.mark.filterwarnings("ignore::onnx_lrp.LrpWarning")
def test_a_new_rule_adds_a_family_handler_and_keeps_its_base_handlers():
    """A subclass of epsilon that also says what it does on a softmax (nothing passes, as Zero): on the softmax model
    it gives Zero's relevance, on the held scale epsilon's."""
    def nothing(rule, em, layer, r_outs):
        return [None] * len(layer.xs)

    @dataclasses.dataclass(frozen=True)
    class EpsilonOrNothing(Epsilon):
        families = family_table({**Epsilon.families, Family.SOFTMAX: FamilyRule(nothing, always_exact, nothing)})

    base = load_composite("attnlrp")

    def relevance(family, rule):
        model, name, _, feeds = _model(family)
        comp = dataclasses.replace(base, name="probe", entries=(Entry({"name": name}, rule),) + base.entries)
        return explain(model, feeds, comp).relevance

    nothing_passed = relevance(Family.SOFTMAX, EpsilonOrNothing())
    assert not np.any(nothing_passed["x"]) and np.any(nothing_passed["skip"])
    for family, like in ((Family.SOFTMAX, Zero()), (Family.NORM_SCALE, Epsilon())):
        got, want = relevance(family, EpsilonOrNothing()), relevance(family, like)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    with pytest.raises(onnx_lrp.UnsupportedError, match=r"\[prod\]: rule epsilon on a product"):
        relevance(Family.PRODUCT, EpsilonOrNothing())


def test_tables_take_families_and_gradient_form_comes_with_its_step():
    def step(rule, em, layer, r_outs):
        return []

    with pytest.raises(TypeError, match="together"):
        FamilyRule(step, always_exact)
    with pytest.raises(TypeError, match="together"):
        FamilyRule(step, None, step)
    with pytest.raises(TypeError, match="Family to FamilyRule"):
        family_table({"softmax": FamilyRule(step)})  # a family by its name: the contract is the constant
    with pytest.raises(TypeError):
        Zero.families[Family.PRODUCT] = FamilyRule(step)  # read-only: a subclass builds its own table
