"""The op families with rules of their own and what a rule does on one: each rule's ``families`` table maps a
``Family`` to a ``FamilyRule``, which the rule's ``propagate`` / ``propagate_grad`` call and ``RuleOp.fits`` checks.

An op whose rules are written for it alone (a product of activations, a gate, a softmax, ...) is a
``onnx_lrp.lrp.ops.base.RuleOp`` naming its ``family``; a rule that applies to it says how in its table::

    def _take_all(rule, em, layer, r_outs):
        return layer.op.signal(em, layer, r_outs)

    class SignalTakeAll(Rule):
        families = family_table({Family.GATE: FamilyRule(_take_all, always_exact, _take_all_grad)})

A rule without an entry for an op's family is refused on that op when the rewriter plans, before anything is
emitted. This module imports nothing heavy: the rules read it when composites are only listed.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping


class Family(enum.Enum):
    """The families of ops with rules of their own (``RuleOp.family``); the value is the name messages use."""

    PRODUCT = "product"        # a product of two activations (onnx_lrp.lrp.ops.products.Product)
    GATE = "gate"              # a signal times a sigmoid gate (onnx_lrp.lrp.ops.gates.Gate)
    NORM_SCALE = "norm_scale"  # n / s with s the detached std or rms of n (onnx_lrp.lrp.ops.transformer.NormScale)
    SOFTMAX = "softmax"        # onnx_lrp.lrp.ops.transformer.Softmax
    RECURRENT = "recurrent"    # LSTM / GRU / RNN (onnx_lrp.lrp.ops.recurrent.Recurrent)


@dataclass(frozen=True)
class FamilyRule:
    """What one rule does on the ops of one family; each handler takes the rule first.

    ``propagate(rule, em, layer, r_outs) -> list``: the emitted relevance of ``layer.xs`` (None where an input gets
    none). ``gradient_form(rule, op) -> bool``: whether the rule is exact in gradient form on this op (absent: never),
    then ``propagate_grad(rule, em, layer, r_outs) -> list`` maps the ``Rel`` of the outputs to the ``Rel`` of each
    input (``onnx_lrp.lrp.ops.base.Rel``). The two come together: a claim of gradient form without its step (or a
    step nothing calls) is refused here."""

    propagate: Callable
    gradient_form: Callable | None = None
    propagate_grad: Callable | None = None

    def __post_init__(self):
        if (self.gradient_form is None) != (self.propagate_grad is None):
            raise TypeError("a FamilyRule gives gradient_form and propagate_grad together (or neither)")


def always_exact(rule, op) -> bool:
    """A ``gradient_form`` handler: the rule is exact in gradient form on every op of the family."""
    return True


def family_table(entries: Mapping[Family, FamilyRule]) -> Mapping[Family, FamilyRule]:
    """A rule's ``families`` table, read-only (a subclass extends it as ``family_table({**Base.families, ...})``)."""
    for family, entry in entries.items():
        if not isinstance(family, Family) or not isinstance(entry, FamilyRule):
            raise TypeError(f"a families table maps Family to FamilyRule (got {family!r}: {type(entry).__name__})")
    return MappingProxyType(dict(entries))


NO_FAMILIES: Mapping[Family, FamilyRule] = family_table({})


__all__ = ["Family", "FamilyRule", "always_exact", "family_table", "NO_FAMILIES"]
