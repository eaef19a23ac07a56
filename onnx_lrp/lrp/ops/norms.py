"""InstanceNormalization and GroupNormalization with the normalising scale held constant (as LayerNormalization in
``transformer.py``, LXT's detached std): linear in x, y = w_c * center_g(x) / std_g(x) + b_c, where g runs over
the groups of channels (one channel per group for InstanceNormalization) and the spatial positions.
"""
from __future__ import annotations

import onnx_ir as ir

from ...core import meta
from ...core.emitter import Emitter
from ...core.graph import const, is_param, static_dims
from .base import LinearOp, Params, affine_back, affine_out, register
from ..vocabulary import Kind


@register
class GroupNorm(LinearOp):
    """InstanceNormalization / GroupNormalization, normalising scale held constant (kind ``layernorm``)."""

    kind = Kind.LAYERNORM
    op_types = ("InstanceNormalization", "GroupNormalization")
    data_inputs = (0,)

    def groups(self, node) -> int:
        if node.op_type == "InstanceNormalization":
            return static_dims(node.inputs[0])[1]
        return node.attributes.get_int("num_groups", 0)

    def check(self, node):
        dims = static_dims(node.inputs[0])
        if dims is None or len(dims) < 2 or dims[1] is None:
            return "rank or number of channels unknown"
        for v in node.inputs[1:3]:
            if v is None or not is_param(v):
                return "scale or bias is not a constant"
        channels, g = dims[1], self.groups(node)
        if g <= 0 or channels % g:
            return f"num_groups={g} does not divide the {channels} channels"
        if const(node.inputs[1]).size != channels or const(node.inputs[2]).size != channels:
            return "scale and bias must have one value per channel (GroupNormalization-21)"
        return None

    def params(self, node):
        dims = static_dims(node.inputs[0])
        shape = [dims[1]] + [1] * (len(dims) - 2)

        return Params(const(node.inputs[1]).reshape(shape), const(node.inputs[2]).reshape(shape))

    def _grouped(self, em, node, v, tag):
        return em.op("Reshape", v, em.ints([0, self.groups(node), -1]), tag=tag)

    def _center(self, em, v, tag):
        return em.sub(v, em.reduce_mean(v, [2], f"{tag}_mean"), tag=tag)

    def inv_scale(self, em: Emitter, node: ir.Node) -> ir.Value:
        """1 / std per item and group of the forward input ([N, G, 1]), computed once per node."""
        cached = meta.INV_SCALE.get(node)
        if cached is not None and cached[0] is em:
            return cached[1]
        d = self._center(em, self._grouped(em, node, node.inputs[0], "xg"), "xc")
        inv = em.inv_std(d, [2], node.attributes.get_float("epsilon", 1e-5))
        meta.INV_SCALE.set(node, (em, inv))
        return inv

    def forward(self, em, node, xs, p):
        xg = self._center(em, self._grouped(em, node, xs[0], "g"), "c")
        y = em.reshape_like(em.mul(xg, self.inv_scale(em, node), tag="xhat_g"), node.inputs[0], tag="xhat")
        return affine_out(em, node, y, p)

    def transpose(self, em, node, s, p):
        s = affine_back(em, node, s, p)
        sg = self._center(em, self._grouped(em, node, s, "sg"), "sc")
        return [em.reshape_like(em.mul(sg, self.inv_scale(em, node), tag="JTs_g"), node.inputs[0], tag="JTs")]
