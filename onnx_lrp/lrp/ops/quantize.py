"""Quantization ops: the relevance handlers of QuantizeLinear / DequantizeLinear (the numpy facts of their
parameters, which the loader reads too, are :mod:`onnx_lrp.core.quantization`'s).

For relevance ``DequantizeLinear(QuantizeLinear(x))`` is an identity: the DequantizeLinear handler passes its
output relevance unchanged to the float tensor the QuantizeLinear read (:func:`relay_sources`; the rewriter follows
it when it looks for the nodes on the path); integer outputs of the quantizers carry none.
"""
from __future__ import annotations

from ...core.quantization import QUANTIZERS, relay_sources
from .base import ShapeOp, register


@register
class DequantizeRelay(ShapeOp):
    """DequantizeLinear: relevance goes to the float input of the QuantizeLinear it undoes (an identity for LRP);
    a DequantizeLinear of anything else (an integer graph input) ends the relevance path, like a Cast from int."""

    op_types = ("DequantizeLinear",)

    def relay_sources(self, node):
        return relay_sources(node)

    def relevance_inputs(self, node):
        return []

    def relevance_values(self, node):
        return relay_sources(node)

    def transpose(self, em, node, r_outs):
        r = r_outs[0]
        src = relay_sources(node)
        if src and src[0].dtype is not None and src[0].dtype != em.dtype:
            r = em.op("Cast", r, to=src[0].dtype.value, tag="r_in")
        return [r] if src else []


@register
class QuantizeEnd(ShapeOp):
    """QuantizeLinear / DynamicQuantizeLinear: integer outputs carry no relevance (the DequantizeLinear after them
    relays it past them)."""

    op_types = QUANTIZERS

    def relevance_inputs(self, node):
        return []

    def relevance_values(self, node):
        return []

    def transpose(self, em, node, r_outs):
        return []


__all__ = ["DequantizeRelay", "QuantizeEnd"]
