"""Op kinds and the registry: each ONNX op type registers once, beside its kind's helpers.

- ``LinearOp``: linear in its activation input(s) given parameters (Conv, Gemm, MatMul with a constant,
  element-wise affine ops, sums, average pools; MaxPool as a piecewise-linear op). It knows its parameters, how
  to run itself with modified inputs/parameters (``forward``) and its transpose ``J^T s`` (``transpose``). The
  LRP rules (``onnx_lrp.lrp.engine``) are written once on top of these two.
- ``ShapeOp``: moves or copies elements (Reshape, Concat, Slice, ...); relevance follows its transpose.
- ``ActivationOp``: element-wise non-linearity of one tensor; the rules Pass (and, where given, Gradient).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ...core.emitter import Emitter  # noqa: F401
from ...core.graph import carries, static_dims
from ..families import Family
from ..vocabulary import Category, Kind, Nonneg


@dataclass(frozen=True)
class Params:
    """(Possibly modified) weight and bias of a layer; ``key`` names the modification for deduplication."""

    w: np.ndarray | None
    b: np.ndarray | None
    key: object = "orig"


class Op:
    kind: "Kind | str" = ""
    op_types: tuple[str, ...] = ()
    # how rules see the op (they dispatch on it, ``onnx_lrp.rules.Rule``): linear, move, activation, or own (the op
    # applies its rules itself)
    category: Category | None = None

    data_inputs: tuple[int, ...] | None = None  # the inputs that can carry relevance (None: every input)
    multi_output: bool = False  # relevance may reach any output, not only the first (e.g. LSTM's Y_h alone)
    # when the output is known to be >= 0: ALWAYS, INPUTS (when every input is), FIRST (when the data input is; the
    # others are shapes, indices or axes), None (never known)
    nonneg: Nonneg | None = None

    def relevance_inputs(self, node: ir.Node) -> list[int]:
        """Indices of the inputs relevance flows into (float activations among ``data_inputs``)."""
        idx = range(len(node.inputs)) if self.data_inputs is None else self.data_inputs
        return [i for i in idx if i < len(node.inputs) and carries(node.inputs[i])]

    def check(self, node: ir.Node) -> str | None:
        """Why this node cannot be handled, or None."""
        return None

    def relevance_values(self, node: ir.Node) -> list:
        """The values relevance flows into (by default the inputs named by ``relevance_inputs``)."""
        return [node.inputs[i] for i in self.relevance_inputs(node)]

    def resolve(self, node: ir.Node) -> "Op":
        """The op that handles this node (an op type can hold several kinds, e.g. Add of a constant or of two
        activations)."""
        return self

    def nonneg_output(self, node: ir.Node, inputs_nonneg: list[bool]) -> bool:
        """Whether the output is known to be >= 0, given which inputs are (see ``nonneg``)."""
        if self.nonneg is Nonneg.ALWAYS:
            return True
        if self.nonneg is Nonneg.INPUTS:
            return all(inputs_nonneg)
        if self.nonneg is Nonneg.FIRST:
            return all(inputs_nonneg[:1])
        return False

    def zero_below_zero(self, node: ir.Node) -> bool:
        """Whether the output is zero exactly where the input is <= 0 (Relu, Clip with min 0)."""
        return False

    def relay_sources(self, node: ir.Node) -> list:
        """Values that relevance relays to past this node's own inputs (DequantizeLinear of a QuantizeLinear: the
        float input of the pair); [] for most ops."""
        return []


class LinearOp(Op):
    """z = f(x; w, b), linear in x (one or more activation inputs) for fixed parameters."""

    category = Category.LINEAR
    has_params: bool = True

    def params(self, node: ir.Node) -> Params:
        raise NotImplementedError

    def forward(self, em: Emitter, node: ir.Node, xs: list, p: Params) -> ir.Value:
        """Emit f(xs; p) — the op run on modified inputs and parameters."""
        raise NotImplementedError

    def transpose(self, em: Emitter, node: ir.Node, s: ir.Value, p: Params) -> list:
        """Emit J^T s for each relevance input (the adjoint of ``forward`` in x)."""
        raise NotImplementedError

    def bias_const(self, em: Emitter, node: ir.Node, b: np.ndarray, tag: str) -> ir.Value:
        """A bias as a constant that broadcasts against the output (per output feature for dense layers)."""
        return em.const(b, tag=tag)


def rank_known(self, node: ir.Node) -> str | None:
    """An op check (``check = rank_known``) for ops whose transpose needs the rank of their data input."""
    return "rank unknown" if node.inputs[0].shape is None else None


class ShapeOp(Op):
    kind = Kind.SHAPE
    category = Category.MOVE

    def transpose(self, em: Emitter, node: ir.Node, r_outs: list) -> list:
        raise NotImplementedError


class ActivationOp(Op):
    """An element-wise function y = f(x). Where f(0) != 0 (``at_zero``: Sigmoid, Exp, Softplus, Clip(0.1, ...)) the
    node resolves to a copy of kind ``offset-activation``: the identity rule would give ``R_x = R_y`` although y does
    not vanish with x, and the next LRP-0/epsilon step divides it by x (f(x)/x is unbounded near x = 0)."""

    kind = Kind.ACTIVATION
    category = Category.ACTIVATION
    variant_kinds = (Kind.OFFSET_ACTIVATION,)  # kinds ``resolve`` can give a node (composites may match them)

    data_inputs = (0,)

    def at_zero(self, node: ir.Node) -> float:
        """f(0) (0.0 unless the op says otherwise)."""
        return 0.0

    def resolve(self, node: ir.Node) -> "Op":
        if self.kind == Kind.OFFSET_ACTIVATION or self.at_zero(node) == 0.0:
            return self
        variant = self.__dict__.get("_offset_variant")
        if variant is None:
            variant = copy.copy(self)
            variant.kind = Kind.OFFSET_ACTIVATION
            self._offset_variant = variant
        return variant

    def derivative(self, em: Emitter, node: ir.Node) -> ir.Value | None:
        """f'(x) for the Gradient rule, or None when not provided."""
        return None

    def has_derivative(self) -> bool:
        return type(self).derivative is not ActivationOp.derivative

    def has_pass_grad(self) -> bool:
        return type(self).pass_grad is not ActivationOp.pass_grad

    def pass_grad(self, em: Emitter, node: ir.Node, g: ir.Value):
        """The identity rule (Pass) in gradient form, R_x = f(x) ⊙ g = ref ⊙ g_x: ``(g_x, ref)`` when that needs no
        division (e.g. ``(g ⊙ [x > 0], x)`` for Relu), else None (then R = f(x) ⊙ g passes as it is)."""
        return None


class RuleOp(Op):
    """An op whose rules are written for it alone (products of activations, softmax, recurrent cells, ...): a rule
    that applies to it has an entry for the op's ``family`` in its ``families`` table (``onnx_lrp.lrp.families``),
    whose handlers call the op's own steps. ``refusal`` names the op for the rules that have none."""

    category = Category.OWN
    family: Family
    refusal: str = ""

    def fits(self, rule) -> str | None:
        """Exactly what the rule's ``propagate`` and ``propagate_grad`` will look up: the family's entry, and a
        ``propagate_grad`` handler where the entry claims gradient form."""
        entry = rule.families.get(self.family)
        if entry is None:
            return f"rule {rule.name} on {self.refusal}"
        if entry.gradient_form is not None and entry.propagate_grad is None:
            return f"rule {rule.name} on {self.refusal}: it claims gradient form without a propagate_grad handler"
        return None


def stabilized(em: Emitter, z: ir.Value, eps: float, tag: str = "stab") -> ir.Value:
    """zennit's ``z + eps (sign(z) + (z == 0))``; for eps = 0 (LRP-0) z with its exact zeros replaced by 1."""
    if eps:
        return em.stabilize(z, eps, tag=tag)
    return em.op("Where", em.op("Equal", z, em.scalar(0.0), tag=f"{tag}_zero"), em.scalar(1.0), z, tag=tag)


@dataclass(frozen=True)
class Rel:
    """The relevance of a tensor: ``value`` itself (``ref`` None), or in gradient form ``R = ref ⊙ value``."""

    value: ir.Value
    ref: ir.Value | None = None

    def as_relevance(self, em: Emitter, tag: str = "r") -> ir.Value:
        return self.value if self.ref is None else em.mul(self.ref, self.value, tag=tag)

    def normalised(self, em: Emitter, z: ir.Value, tag: str = "s") -> ir.Value:
        """s = R / z (zeros of z guarded): ``value`` itself when it is already the gradient form relative to z."""
        if self.ref is z:
            return self.value
        return em.div(self.as_relevance(em, tag=f"{tag}_r"), stabilized(em, z, 0.0, tag=f"{tag}_guard"), tag=tag)


def affine_out(em: Emitter, node: ir.Node, xhat: ir.Value, p: Params) -> ir.Value:
    """z = xhat * w + b of a normalisation (its per-channel affine part; w, b from ``p``, either may be None)."""
    if p.w is not None:
        xhat = em.mul(xhat, em.const(p.w, tag="w", key=(node.name, "w", p.key)), tag="xw")
    if p.b is not None and np.any(p.b):
        xhat = em.add(xhat, em.const(p.b, tag="b", key=(node.name, "b", p.key)), tag="z")
    return xhat


def affine_back(em: Emitter, node: ir.Node, s: ir.Value, p: Params) -> ir.Value:
    """The transpose of ``affine_out`` in xhat: s * w."""
    return s if p.w is None else em.mul(s, em.const(p.w, tag="w", key=(node.name, "w", p.key)), tag="sw")


REGISTRY: dict[str, Op] = {}


def register(op):
    """Register an op (a class, instantiated here, or an instance) under each of its op types."""
    inst = op() if isinstance(op, type) else op
    for t in inst.op_types:
        if t in REGISTRY:  # one handler per op type: where it means several things, one dispatcher resolves
            raise ValueError(f"op type {t} registered twice ({type(REGISTRY[t]).__name__}, {type(inst).__name__})")
        REGISTRY[t] = inst
    return op


def out_dims(node: ir.Node, i: int = 0):
    return static_dims(node.outputs[i])


def spatial_static(v: ir.Value) -> list[int] | None:
    dims = static_dims(v)
    if dims is None or any(d is None for d in dims[2:]):
        return None
    return [int(d) for d in dims[2:]]
