"""Gates (kind ``gate``): a Mul that ``onnx_lrp.lrp.patterns.match_gate`` recognises as a signal times a sigmoid /
hard-sigmoid of another tensor (squeeze-excitation, GLU, LSTM-like gates written with plain ops). Rules:
``signal-take-all`` (the gate is a constant multiplier: ``R_h = R_z`` summed over broadcast axes, ``R_g = 0``; Arras
et al. 2017), and ``uniform``, ``cp``, ``zero`` as on any product of two activations (``Gate.as_product``).
"""
from __future__ import annotations

from ...core import meta
from ...core.graph import static_dims
from ..families import Family
from .base import Rel, RuleOp
from .products import PRODUCT_MUL
from ..vocabulary import Kind


class Gate(RuleOp):
    """z = h ⊙ g with g a sigmoid / hard-sigmoid gate (``patterns.match_gate``); ``layer.xs`` is [h, g]. Steps for the
    rules of family ``gate``: ``signal`` / ``signal_grad`` (signal-take-all), ``as_product`` (uniform, cp, zero: as on
    any product)."""

    kind = Kind.GATE
    family = Family.GATE
    refusal = "a gated product (use signal-take-all, uniform, cp or zero)"
    op_types = ()

    def relevance_values(self, node):
        m = meta.PATTERN.get(node)
        return [m.source, m.gate]

    def _index(self, node, v):
        return next(i for i, u in enumerate(node.inputs[:2]) if u is v)

    def signal_grad(self, em, layer, r_outs):
        """signal-take-all: g_h = J_h^T g (the gate held: g ⊙ gate, summed over broadcast axes), nothing to g."""
        node = layer.node
        if r_outs[0] is None:
            return [None, None]
        h, r = layer.xs[0], r_outs[0]
        if r.ref is not node.outputs[0]:  # relevance in hand: R_h = R_z, no division by z
            return [Rel(self.signal(em, layer, [r.as_relevance(em, tag="r_out")])[0]), None]
        return [Rel(PRODUCT_MUL.vjp(em, node, r.value, self._index(node, h)), h), None]

    def signal(self, em, layer, r_outs):
        """signal-take-all: R_h = R_z (summed over broadcast axes), R_g = 0."""
        node = layer.node
        r = r_outs[0]
        if r is None:
            return [None, None]
        h = layer.xs[0]
        zd, hd = static_dims(node.outputs[0]), static_dims(h)
        if hd is not None and zd is not None and hd != zd:
            r = em.unbroadcast(r, zd, h, tag="r_sum")
        return [r, None]

    def as_product(self, em, layer, rule, r_outs, grad):
        """uniform / cp on the two factors, as for any product of activations (cp holds the gate)."""
        node = layer.node
        if r_outs[0] is None:
            return [None, None]
        idx = PRODUCT_MUL.relevance_inputs(node)
        plain = type(layer)(node, PRODUCT_MUL, [node.inputs[i] for i in idx], layer.z, layer.nonneg)
        got = rule.propagate_grad(em, plain, r_outs) if grad else rule.propagate(em, plain, r_outs)
        by_value = {id(node.inputs[i]): r for i, r in zip(idx, got)}
        return [by_value.get(id(x)) for x in layer.xs]


GATE = Gate()


__all__ = ["Gate", "GATE"]
