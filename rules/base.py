"""The rule interface (``Rule``: fits, propagate, gradient form, zero preservation) and the registry of rules by name.

A rule carries its behaviour, as zennit's hooks do, and dispatches on the op's ``category`` (``Category``):
``linear``, ``move``, ``activation``, or ``own`` (an op with rules of its own: products, gates, softmax, ...), where it
looks the op's family up in its ``families`` table (``onnx_lrp.lrp.families``). The engine reads what it must know of
a rule from its properties (``passes_through``, ``linear``, ``is_box``), never from its class. Composites name rules
by their registered names (``register_rule``, ``make_rule``).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping

from onnx_lrp.lrp.families import NO_FAMILIES, Family, FamilyRule
from onnx_lrp.lrp.vocabulary import INHERIT, Category, Kind, ZeroKeeping


RULES: dict[str, type["Rule"]] = {}
RULE_ALIASES: dict[str, str] = {}


def register_rule(cls=None, *, aliases: tuple[str, ...] = ()):
    """Class decorator: make a rule known by its ``name`` (and ``aliases``) to composites and ``make_rule``."""
    def add(rule_cls):
        for key in (rule_cls.name, *aliases):
            if key in RULES or key in RULE_ALIASES:
                raise ValueError(f"rule name {key!r} registered twice")
        RULES[rule_cls.name] = rule_cls
        RULE_ALIASES.update({alias: rule_cls.name for alias in aliases})
        return rule_cls
    return add(cls) if cls is not None else add


def engine():
    """The propagation steps (``onnx_lrp.lrp.engine``), imported on first use: listing composites needs no numpy."""
    from onnx_lrp.lrp import engine as steps
    return steps


class Rule:
    """Base of all rules; ``name`` is how composites refer to it.

    ``fits(op)`` says why it cannot apply to an op (checked for every node before anything is emitted),
    ``propagate`` / ``propagate_grad`` emit the relevance of the layer's inputs (as relevance, or as ``Rel`` in
    gradient form when ``gradient_form(op)``), ``zero_preserving(op, node)`` says whether that relevance vanishes
    where the input does. On an op with rules of its own each reads the entry of ``families`` for the op's family
    (a ``FamilyRule``); the op's ``fits`` refuses a rule without one."""

    name: ClassVar[str] = ""
    needs_params: ClassVar[bool] = False
    explodes_at_offset: ClassVar[bool] = False  # pass and gradient-x-input: refused together on f(0) != 0 with no f'
    # what the engine may know of a rule without knowing the rule (it never imports onnx_lrp.rules):
    passes_through: ClassVar[bool] = False  # the identity R_in = R_out (Pass): a Relu under it keeps zeros, ...
    linear: ClassVar[bool] = False  # given as groups of terms of the generic linear step (``LinearRule``)
    is_box: ClassVar[bool] = False  # reads the input's bounds ``low`` / ``high`` (ZBox), checked before emitting
    families: ClassVar[Mapping[Family, FamilyRule]] = NO_FAMILIES

    def params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def eps(self) -> float:
        """The stabiliser: ``epsilon``, else ``stabilizer``, else 1e-6."""
        return float(getattr(self, "epsilon", getattr(self, "stabilizer", 1e-6)))

    # ---------------------------------------------------------------------------------------------- fits
    def fits(self, op) -> str | None:
        if op.category is Category.OWN:
            return op.fits(self)
        if op.category is Category.MOVE:
            return self.fits_move(op)
        return self.fits_linear(op) if op.category is Category.LINEAR else self.fits_activation(op)

    def fits_move(self, op) -> str | None:
        return f"rule {self.name} on a shape op (use gradient)"

    def fits_linear(self, op) -> str | None:
        return f"rule {self.name} is not known to the engine"

    def fits_activation(self, op) -> str | None:
        if op.kind == Kind.OFFSET_ACTIVATION and not op.has_derivative() and self.explodes_at_offset:
            return ("element-wise function with f(0) != 0 (or not provably 0) and no known derivative: neither the "
                    "identity rule (it would explode) nor gradient-x-input applies; write it with ops onnx-lrp knows")
        return self.fits_linear(op)

    # ---------------------------------------------------------------------------------------------- emission
    def propagate(self, em, layer, r_outs: list) -> list:
        """Relevance for the layer's relevance inputs from the relevance of its outputs."""
        if layer.op.category is Category.MOVE:
            return engine().move(em, layer, r_outs)
        if layer.op.category is Category.OWN:
            return self.families[layer.op.family].propagate(self, em, layer, r_outs)
        return self.propagate_one(em, layer, r_outs[0])

    def propagate_one(self, em, layer, r_out) -> list:
        raise AssertionError(f"rule {self.name} on {layer.node.op_type} was not rejected when planning")

    def gradient_form(self, op) -> bool:
        """Whether the rule on this op is exact in gradient form, ``g_in = J^T g_out`` (see ``Rel``)."""
        if op.category is Category.MOVE:
            return True  # moves: the same transpose in both forms
        if op.category is Category.OWN:
            entry = self.families.get(op.family)
            return entry is not None and entry.gradient_form is not None and entry.gradient_form(self, op)
        return False

    def propagate_grad(self, em, layer, r_outs: list) -> list:
        """``propagate`` for rules with ``gradient_form``: takes and gives ``Rel``."""
        if layer.op.category is Category.MOVE:
            return engine().move_grad(em, layer, r_outs)
        if layer.op.category is Category.OWN:
            return self.families[layer.op.family].propagate_grad(self, em, layer, r_outs)
        raise AssertionError(f"rule {self.name} on {layer.node.op_type} claimed a gradient form it has no step for")

    def zero_preserving(self, op, node) -> "bool | ZeroKeeping":
        """Whether the relevance the rule gives the inputs is zero wherever the input value is zero: True, False, or
        ``INHERIT`` (as the relevance of the outputs: moves, max pools and Pass through a Relu)."""
        return INHERIT if op.category is Category.MOVE else False


def make_rule(name: str, **params) -> Rule:
    """Build a rule by name; unknown names and parameters raise ValueError naming the alternatives."""
    key = RULE_ALIASES.get(name.lower(), name.lower())
    if key not in RULES:
        raise ValueError(f"unknown rule {name!r}; known rules: {', '.join(sorted(RULES))}")
    cls = RULES[key]
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(params) - fields
    if unknown:
        raise ValueError(f"rule {key!r} takes no parameter {', '.join(sorted(unknown))}"
                         f" (it takes: {', '.join(sorted(fields)) or 'none'})")
    return cls(**params)


__all__ = ["RULES", "RULE_ALIASES", "register_rule", "engine", "Rule", "make_rule", "Family", "FamilyRule"]
