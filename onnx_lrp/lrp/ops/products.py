"""Products of two activations (kind ``bilinear``): MatMul / Mul / Einsum of activations (attention scores, attention
x values, gated MLPs), with the steps their rules call: ``share`` / ``share_grad`` over the operands a rule chooses
(``operands``: AttnLRP's uniform rule; ``free_operands``: CP-LRP holds the gates, ``cp_shares``).

The op types register in ``onnx_lrp.lrp.ops.transformer`` (MatMul and Mul through one dispatcher with their linear
meanings, Einsum directly).
"""
from __future__ import annotations

import onnx_ir as ir

from ...core.emitter import Emitter
from ...core.graph import carries, static_dims
from .. import patterns
from ..families import Family
from .base import Rel, RuleOp, out_dims, stabilized
from ..vocabulary import Kind


def _swap_last(em: Emitter, v: ir.Value, rank: int, tag: str) -> ir.Value:
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    return em.op("Transpose", v, perm=perm, tag=tag)


def _einsum_terms(eq: str):
    lhs, out = eq.replace(" ", "").split("->")
    return lhs.split(","), out


class Product(RuleOp):
    """z = a @ b, a ⊙ b or einsum(a, b) with two activation operands (or one activation and a constant). Steps for the
    rules of family ``product`` (uniform, cp, zero): ``share`` / ``share_grad`` over the operands they choose
    (``operands``, or ``free_operands``: CP-LRP holds the gates)."""

    kind = Kind.BILINEAR
    family = Family.PRODUCT
    refusal = "a product of activations (use uniform, cp or zero)"

    def __init__(self, op_type):
        self.op_types = (op_type,)

    def relevance_inputs(self, node):
        return [i for i, v in enumerate(node.inputs[:2]) if carries(v)]

    def check(self, node):
        if len(node.inputs) != 2:
            return f"{len(node.inputs)} operands (two are supported)"
        for v in node.inputs:
            if static_dims(v) is None:
                return "operand rank unknown"
        if node.op_type == "MatMul" and any(len(v.shape) < 2 for v in node.inputs):
            return "1-D operand of a MatMul of activations"
        if node.op_type == "Einsum":
            eq = node.attributes.get_string("equation", "")
            if "->" not in eq or "..." in eq:
                return "einsum equation without an explicit output or with an ellipsis"
            ins, out = _einsum_terms(eq)
            for i, term in enumerate(ins):
                other = ins[1 - i]
                if any(c not in out and c not in other for c in term):
                    return f"index summed inside operand {i} alone ({eq})"
        return None

    # J^T of the product with respect to operand i, the others fixed
    def vjp(self, em: Emitter, node: ir.Node, s: ir.Value, i: int) -> ir.Value:
        a, b = node.inputs[0], node.inputs[1]
        zd = out_dims(node)
        x = node.inputs[i]
        if node.op_type == "Mul":
            g = em.mul(s, node.inputs[1 - i], tag=f"JTs{i}")
        elif node.op_type == "MatMul":
            if i == 0:
                g = em.op("MatMul", s, _swap_last(em, b, len(b.shape), "bT"), tag="JTs0")
            else:
                g = em.op("MatMul", _swap_last(em, a, len(a.shape), "aT"), s, tag="JTs1")
        else:  # Einsum
            ins, out = _einsum_terms(node.attributes.get_string("equation"))
            g = em.op("Einsum", s, node.inputs[1 - i], equation=f"{out},{ins[1 - i]}->{ins[i]}", tag=f"JTs{i}")
            return g
        xd = static_dims(x)
        if xd is not None and zd is not None and (len(xd) < len(zd) or any(
                d == 1 and e != 1 for d, e in zip(xd[::-1], zd[::-1]))):
            if node.op_type == "MatMul":
                g_dims = zd[:-2] + xd[-2:]
                g = em.unbroadcast(g, g_dims, x, tag=f"JTs{i}_sum")
            else:
                g = em.unbroadcast(g, zd, x, tag=f"JTs{i}_sum")
        return g

    def operands(self, node) -> list[int]:
        """The operands that carry relevance (uniform: all of them share it)."""
        return self.relevance_inputs(node)

    def free_operands(self, node) -> list[int]:
        """The operands that are no gate (CP-LRP), see ``cp_shares``."""
        return cp_shares(node, self.relevance_inputs(node))

    def share(self, em, layer, r_outs, among: list[int], eps: float, tag: str) -> list:
        """R_i = x_i ⊙ J_i^T(R / (k stab(z))) for the k operands ``among`` (None for the others)."""
        node = layer.node
        idx = self.relevance_inputs(node)
        r_out = r_outs[0]
        if r_out is None or not among:
            return [None] * len(idx)
        z = node.outputs[0]
        k = len(among)
        s = em.div(r_out, stabilized(em, z, eps, tag=f"{tag}_stab"), tag=f"{tag}_s")
        s = em.scale(s, 1.0 / k, tag=f"{tag}_s_k")
        got = {i: em.mul(node.inputs[i], self.vjp(em, node, s, i), tag=f"{tag}_r{i}") for i in among}
        return [got.get(i) for i in idx]

    def share_grad(self, em, layer, r_outs, among: list[int]) -> list:
        """g_i = J_i^T g / k for the k operands that share the relevance (LRP-0 limit of ``share``)."""
        node = layer.node
        idx = self.relevance_inputs(node)
        if r_outs[0] is None or not among:
            return [None] * len(idx)
        s = em.scale(r_outs[0].normalised(em, node.outputs[0]), 1.0 / len(among), tag="s_k")
        return [Rel(self.vjp(em, node, s, i), node.inputs[i]) if i in among else None for i in idx]


# how strongly an operand is a gate (CP-LRP holds the strongest): attention weights and sigmoid gates over
# smooth activations (a SiLU / GELU output that is multiplied by a sigmoid gate is that gate's signal)
_GATE_RANK = {"softmax": 3, "sigmoid": 2, "hardsigmoid": 2}


def cp_shares(node: ir.Node, idx: list[int]) -> list[int]:
    """The operands CP-LRP gives relevance: those that are no gate; when every operand is a gate, those that are
    the weakest gates (exactly one side is held when the two differ; both share when they are alike)."""
    ranks = {i: (None if (g := patterns.gate_source(node.inputs[i])) is None else _GATE_RANK.get(g, 1)) for i in idx}
    free = [i for i in idx if ranks[i] is None]
    if free or not idx:
        return free
    low = min(ranks.values())
    return [i for i in idx if ranks[i] == low]


class Einsum(Product):
    """Einsum of two operands: a product (of activations, or of an activation and a constant)."""

    def __init__(self):
        super().__init__("Einsum")


PRODUCT_MUL = Product("Mul")


__all__ = ["Product", "Einsum", "PRODUCT_MUL", "cp_shares"]
