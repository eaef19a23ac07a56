"""The engine's vocabulary (onnx_lrp/lrp/vocabulary.py, issue 33): each word is an enum member, and each member
round-trips through what writes it out (composite TOML, the JSON rows of ``onnx-lrp inspect``, the ledger's rows,
the messages that name a kind, the emitted tensor names); the rules' properties, which the engine reads instead of
their classes, say what the rules are."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from util import make_model, node, to_bytes

import onnx_lrp
from onnx_lrp import load as loader
from onnx_lrp.core.errors import InputError
from onnx_lrp.lrp import rewriter
from onnx_lrp.lrp.composite_check import check_composite, known_kinds
from onnx_lrp.lrp.ops import REGISTRY
from onnx_lrp.lrp.ops.base import ActivationOp, Op
from onnx_lrp.lrp.vocabulary import INHERIT, Category, Kind, NodeInfo, Nonneg, XMod, ZMask
from onnx_lrp.rules import RULES, LinearRule, Pass, ZBox, builtin_names, load_composite, make_rule, parse_composite
from onnx_lrp.rules.composite import NodeInfo as ComposedNodeInfo

# the walk's own kinds: no op handler gives them, and a composite cannot match them (the planner assigns them)
WALK_KINDS = {Kind.BIAS, Kind.HELD, Kind.UNKNOWN}


def _mlp() -> bytes:
    """x -> MatMul -> Add(bias) -> Relu -> Softplus -> Gemm: the kinds dense, bias, activation, offset-activation."""
    rng = np.random.default_rng(0)
    f = np.float32
    return to_bytes(make_model(
        [node("MatMul", ["x", "W1"], "h"), node("Add", ["h", "b1"], "hb"), node("Relu", ["hb"], "r"),
         node("Softplus", ["r"], "s"), node("Gemm", ["s", "W2", "b2"], "y")], {"x": [1, 4]}, ["y"],
        {"W1": rng.standard_normal((4, 5)).astype(f), "b1": rng.standard_normal(5).astype(f),
         "W2": rng.standard_normal((5, 3)).astype(f), "b2": rng.standard_normal(3).astype(f)}))


# the words the plan gives _mlp's nodes under the built-in composite "epsilon" (in graph order)
MLP_ROWS = [("MatMul", "dense", "epsilon"), ("Add", "bias", "pass"), ("Relu", "activation", "pass"),
            ("Softplus", "offset-activation", "gradient-x-input"), ("Gemm", "dense", "epsilon")]


def _ops() -> list:
    """Every op handler: the registered ones, what they resolve to, and every Op subclass."""
    found, stack = list(REGISTRY.values()), [Op]
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return found


def _composite(*entries: tuple[str | None, str]) -> str:
    """A composite's TOML text: (kind or None for every node, rule) per entry."""
    text = 'name = "t"\n'
    for kind, rule in entries:
        text += "[[rules]]\n" + (f'match = {{ kind = "{kind}" }}\n' if kind else "") + f'rule = "{rule}"\n'
    return text


# ---------------------------------------------------------------------------------------------- op words
def test_every_op_kind_is_a_kind_and_every_kind_names_ops():
    """The kinds op handlers give (composites may match them) are exactly the Kind members but the walk's own."""
    assert known_kinds() == {k.value for k in Kind} - WALK_KINDS
    for op in _ops():
        kind = getattr(op, "kind", "")
        assert kind == "" or isinstance(kind, Kind), (op, kind)
        for variant in getattr(op, "variant_kinds", ()):
            assert isinstance(variant, Kind), (op, variant)


def test_every_op_category_and_nonneg_is_a_member():
    """Rules dispatch on ``Op.category`` (a Category), the walk's sign analysis reads ``Op.nonneg`` (a Nonneg)."""
    ops = _ops()  # a dispatcher (Add: of a constant or of two activations) has none: it resolves to an op that has
    assert [op for op in ops if not (op.category is None or isinstance(op.category, Category))] == []
    assert {op.category for op in ops} == set(Category) | {None}
    assert [op for op in _ops() if not (op.nonneg is None or isinstance(op.nonneg, Nonneg))] == []
    assert {op.nonneg for op in _ops()} == set(Nonneg) | {None}


def test_offset_activation_is_the_resolved_kind_of_functions_with_f0_nonzero():
    """ActivationOp.resolve gives a node with f(0) != 0 the kind OFFSET_ACTIVATION (a copy), else keeps its own."""
    p = rewriter.plan(loader.load(_mlp()), load_composite("epsilon"))
    by_type = {a.node.op_type: a for a in p.assignments}
    assert by_type["Softplus"].kind is Kind.OFFSET_ACTIVATION and by_type["Relu"].kind is Kind.ACTIVATION
    assert isinstance(by_type["Softplus"].op, ActivationOp) and by_type["Softplus"].op is not REGISTRY["Softplus"]
    assert REGISTRY["Softplus"].kind is Kind.ACTIVATION  # the registered handler itself is unchanged


# ---------------------------------------------------------------------------------------------- serialised
@pytest.mark.parametrize("kind", sorted(known_kinds()))
def test_each_kind_round_trips_through_composite_toml(kind):
    """A kind written in a composite file is accepted and matches exactly the nodes of that Kind member."""
    comp = parse_composite(_composite((kind, "pass")))
    check_composite(comp)  # refuses kinds no node can have
    member = Kind(kind)
    assert comp.rule_for(NodeInfo("n", "Op", member)) is comp.entries[0].rule
    assert comp.rule_for(NodeInfo("n", "Op", kind)) is comp.entries[0].rule  # as read back from text
    others = [k for k in Kind if k is not member]
    assert all(comp.rule_for(NodeInfo("n", "Op", k)) is None for k in others)


def test_a_misspelt_kind_is_refused_with_the_member_it_meant():
    with pytest.raises(InputError, match=r"convolutoin.*did you mean convolution"):
        check_composite(parse_composite(_composite(("convolutoin", "pass"))))
    assert ComposedNodeInfo is NodeInfo  # the composite matches what the engine hands it


def test_plan_rows_write_kinds_as_their_words():
    """``onnx-lrp inspect --json`` rows: kinds serialise as their words and read back as the same members."""
    p = rewriter.plan(loader.load(_mlp()), load_composite("epsilon"))
    rows = json.loads(json.dumps(rewriter.describe(p)))
    assert [(r["op_type"], r["kind"], r["rule"]) for r in rows] == MLP_ROWS
    assert [Kind(r["kind"]) for r in rows] == [a.kind for a in p.assignments]
    assert all(type(r["kind"]) is str for r in rows)


def test_ledger_rows_name_the_walks_kinds():
    """The ledger (``onnx-lrp trace``) writes each node's kind as its word; the folded bias is its own row."""
    ex = onnx_lrp.Explainer(_mlp(), composite="epsilon", ledger=True)
    rows = ex.relevance_model.ledger_rows
    assert [(r.op_type, str(r.kind), r.rule) for r in rows] == MLP_ROWS[::-1]  # the walk runs backwards
    assert json.loads(json.dumps([r.kind for r in rows])) == [k for _, k, _ in MLP_ROWS[::-1]]
    sinks = {r.op_type: r.sinks for r in rows}
    assert sinks["Gemm"] == "bias" and sinks["Add"] == "" and sinks["MatMul"] == "bias"


def test_the_messages_name_kinds_that_a_composite_accepts():
    """The refusal of pass on an offset-activation names the kind to match and the rule to give it: pasted into a
    composite, both are accepted and the node is then explained with that rule."""
    model = loader.load(_mlp())
    p = rewriter.plan(model, parse_composite(_composite(("dense", "epsilon"), (None, "pass"))))
    bad = {a.node.op_type: a.reason for a in p.unsupported}
    assert list(bad) == ["Softplus"]
    kind, rule = re.search(r'give kind "([^"]+)" the rule "([^"]+)"', bad["Softplus"]).groups()
    assert Kind(kind) is Kind.OFFSET_ACTIVATION
    fixed = parse_composite(_composite(("dense", "epsilon"), (kind, rule), (None, "pass")))
    check_composite(fixed)
    p = rewriter.plan(loader.load(_mlp()), fixed)
    assert not p.unsupported
    assert {a.node.op_type: a.rule.name for a in p.assignments}["Softplus"] == "gradient-x-input"
    # a kind with no entry: named by its word, not by the enum's repr
    p = rewriter.plan(loader.load(_mlp()), parse_composite(_composite(("dense", "epsilon"), ("activation", "pass"))))
    reasons = {a.node.op_type: a.reason for a in p.unsupported}
    assert reasons == {"Softplus": "composite 't' assigns no rule to kind 'offset-activation'"}


def test_masks_and_input_modifiers_name_the_emitted_tensors():
    """gamma's two groups keep z > 0 and z < 0 (ZMask) and read x+ / x- (XMod): the relevance graph names what it
    emits for each mask by the mask's word."""
    comp = parse_composite(_composite(("dense", "gamma"), ("offset-activation", "gradient-x-input"), (None, "pass")))
    model = rewriter.rewrite(loader.load(_mlp()), comp)
    tags = {v.name.rsplit("/", 1)[-1] for n in model.graph for v in n.outputs if v.name.startswith("lrp/")}
    assert {f"r_{m.value[:3]}" for m in ZMask} <= tags
    groups = make_rule("gamma").groups()
    assert [g.mask for g in groups] == [ZMask.POSITIVE, ZMask.NEGATIVE]
    assert {t.x for g in groups for t in g.terms} == {XMod.POSITIVE, XMod.NEGATIVE}


def test_every_linear_rule_speaks_the_vocabulary():
    for cls in RULES.values():
        if not issubclass(cls, LinearRule):
            continue
        rule = cls(low=0.0, high=1.0) if cls is ZBox else cls()
        for g in rule.groups():
            assert g.mask is None or isinstance(g.mask, ZMask), (cls, g.mask)
            assert all(isinstance(t.x, XMod) for t in g.terms), (cls, [t.x for t in g.terms])


# ---------------------------------------------------------------------------------------------- rule properties
def _builtin_rules() -> list:
    return [e.rule for name in builtin_names() if name != "auto" for e in load_composite(name).entries]


def test_rule_properties_say_what_the_rules_are():
    """The engine reads ``passes_through``, ``linear`` and ``is_box`` instead of isinstance: they hold exactly for
    Pass, the linear rules and ZBox, over every rule of every built-in composite and every registered rule."""
    rules = _builtin_rules() + [cls(low=0.0, high=1.0) if cls is ZBox else cls() for cls in RULES.values()]
    for rule in rules:
        assert rule.passes_through == isinstance(rule, Pass), rule
        assert rule.linear == isinstance(rule, LinearRule), rule
        assert rule.is_box == isinstance(rule, ZBox), rule
    builtin = _builtin_rules()
    assert any(r.passes_through for r in builtin) and any(r.linear and not r.is_box for r in builtin)
    assert any(r.is_box for r in builtin) and any(not (r.passes_through or r.linear) for r in builtin)


def test_the_composites_pass_rule_is_pass():
    """What the planner gives folded bias Adds and held nodes (rows show "pass")."""
    for name in builtin_names():
        if name == "auto":
            continue
        rule = load_composite(name).pass_rule()
        assert isinstance(rule, Pass) and rule.name == "pass" and rule.passes_through


def test_zero_preserving_inherits_through_relu_and_moves():
    p = rewriter.plan(loader.load(_mlp()), load_composite("epsilon"))
    a = {x.node.op_type: x for x in p.assignments}
    assert Pass().zero_preserving(a["Relu"].op, a["Relu"].node) is INHERIT
    assert Pass().zero_preserving(a["Softplus"].op, a["Softplus"].node) is False
    assert make_rule("gradient-x-input").zero_preserving(a["Softplus"].op, a["Softplus"].node) is True
    assert make_rule("epsilon").zero_preserving(a["Gemm"].op, a["Gemm"].node) is True
    assert make_rule("flat").zero_preserving(a["Gemm"].op, a["Gemm"].node) is False
    assert make_rule("gradient").zero_preserving(REGISTRY["Reshape"], None) is INHERIT
