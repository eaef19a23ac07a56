"""The engine's vocabulary: every word the planner, the walk, the ops and the rules exchange, as an enum.

``Family`` (``onnx_lrp.lrp.families``) names the op families with rules of their own; here are the rest:

- ``Category``: how rules see an op (they dispatch on it): linear, move, activation, or own;
- ``Kind``: what a node is for composites (``match = { kind = "convolution" }``), ``onnx-lrp inspect`` and the
  ledger; the walk's own kinds (``BIAS``: an Add folded into the layer before it, ``HELD``: inside a recognised
  pattern, ``UNKNOWN``: no handler) among them;
- ``Nonneg``: when an op's output is known to be >= 0;
- ``XMod`` and ``ZMask``: a linear rule's input modifier (``Term.x``) and output mask (``Group.mask``);
- ``INHERIT``: what ``Rule.zero_preserving`` says when the relevance it gives vanishes where its output's does;
- ``NodeInfo``, ``RuleView``, ``CompositeView``: what the engine reads of a node, a rule and a composite (it never
  imports ``onnx_lrp.rules``: the rules import the engine, not the other way).

Words that are written out (composite TOML, JSON rows, messages, emitted tensor names) are ``StrEnum`` members: they
equal, hash, format and serialise as their value, so texts and files stay byte-identical. This module imports
nothing heavy: the rules read it when composites are only listed.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class Category(enum.Enum):
    """How rules see an op (``Op.category``); they dispatch on it."""

    LINEAR = "linear"          # linear in its activation input(s) given parameters (``LinearOp``)
    MOVE = "move"              # moves or copies elements (``ShapeOp``)
    ACTIVATION = "activation"  # an element-wise function of one tensor (``ActivationOp``)
    OWN = "own"                # applies its rules itself, by its ``Family`` (``RuleOp``)


class Kind(enum.StrEnum):
    """What a node is (``Op.kind``, ``Assignment.kind``): the word composites match and rows show."""

    CONVOLUTION = "convolution"
    DENSE = "dense"
    AFFINE = "affine"
    BATCHNORM = "batchnorm"
    SUM = "sum"
    AVGPOOL = "avgpool"
    MAXPOOL = "maxpool"
    SHAPE = "shape"
    ACTIVATION = "activation"
    OFFSET_ACTIVATION = "offset-activation"  # an element-wise f with f(0) != 0: no identity rule
    LRN = "lrn"
    NORMALIZATION = "normalization"
    LAYERNORM = "layernorm"
    SOFTMAX = "softmax"
    GATE = "gate"
    BILINEAR = "bilinear"
    RECURRENT = "recurrent"
    # the walk's own kinds (no op handler gives them)
    BIAS = "bias"        # an Add whose bias the layer before it absorbed: relevance passes to that layer's output
    HELD = "held"        # inside a recognised pattern (a held scale, a GELU/SiLU chain): no relevance of its own
    UNKNOWN = "unknown"  # no handler for the op


#: the kinds of the layers a composite's ``first_linear`` can mark (and that own their parameters in the ledger)
LAYER_KINDS = frozenset({Kind.CONVOLUTION, Kind.DENSE})


class Nonneg(enum.Enum):
    """When an op's output is known to be >= 0 (``Op.nonneg``; None: never known)."""

    ALWAYS = "always"
    INPUTS = "inputs"  # when every input is
    FIRST = "first"    # when the data input is (the others are shapes, indices or axes)


class XMod(enum.StrEnum):
    """A linear rule's input modifier (``Term.x``): the value is the name tags and messages use."""

    IDENTITY = "identity"
    POSITIVE = "positive"
    NEGATIVE = "negative"
    ABS = "abs"
    ONES = "ones"
    CONSTANT = "constant"  # the term's ``x_value`` (ZBox's bounds)


class ZMask(enum.StrEnum):
    """The outputs a group of a linear rule keeps (``Group.mask``): where the forward z is positive / negative."""

    POSITIVE = "positive"
    NEGATIVE = "negative"


class ZeroKeeping(enum.Enum):
    """``Rule.zero_preserving``'s third answer beside True and False."""

    INHERIT = "inherit"  # as the relevance of the outputs (moves, max pools, Pass through a Relu)


INHERIT = ZeroKeeping.INHERIT


# ---------------------------------------------------------------------------------------------- what the engine reads
@dataclass(frozen=True)
class NodeInfo:
    """What a composite may match on."""

    name: str
    op_type: str
    kind: str
    first_linear: bool = False


class RuleView(Protocol):
    """What the planner and the walk read of a rule (``onnx_lrp.rules.Rule``): its properties, never its class."""

    name: str
    passes_through: bool  # the identity R_in = R_out (Pass)
    linear: bool          # groups of terms of the generic linear step (LinearRule): ``linear_rule`` reads ``Rel``
    is_box: bool          # reads the input's bounds ``low`` / ``high`` (ZBox)

    def fits(self, op) -> str | None: ...

    def gradient_form(self, op) -> bool: ...

    def propagate(self, em, layer, r_outs: list) -> list: ...

    def propagate_grad(self, em, layer, r_outs: list) -> list: ...

    def zero_preserving(self, op, node) -> "bool | ZeroKeeping": ...


class CompositeView(Protocol):
    """What the planner reads of a composite (``onnx_lrp.rules.Composite``)."""

    name: str
    source: str
    entries: tuple

    def rule_for(self, info: NodeInfo) -> RuleView | None: ...

    def pass_rule(self) -> RuleView: ...


__all__ = ["Category", "Kind", "LAYER_KINDS", "Nonneg", "XMod", "ZMask", "ZeroKeeping", "INHERIT", "NodeInfo",
           "RuleView", "CompositeView"]
