"""True gradients the ``gradient`` rule's LRP forms do not give, for the gradient methods: LayerNormalization's and
functions of one tensor written out by the exporter (GELU, SiLU, ...).

The true gradient of LayerNormalization, RMSNormalization and SimplifiedLayerNormalization for the gradient
methods: through the normalising mean and scale, not with the scale held (the ``gradient`` rule's LRP form).

With ``xhat = center(x) / std(x)`` over the normalised axes (``center`` the identity for the RMS forms),
``y = gamma xhat + beta`` and ``g = gamma r`` (``r`` the gradient at ``y``), the gradient at ``x`` is

    inv_std * (center(g) - xhat * mean(g * xhat))

exactly, epsilon included (it sits inside ``std``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core import meta
from ..lrp.ops.base import affine_back
from ..lrp.ops.transformer import ElementwiseOfOne
from ..rules.base import Rule

NORM_OPS = ["LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"]


@dataclass(frozen=True)
class TrueNormGradient(Rule):
    """J^T r of LayerNormalization (and its RMS forms) through the mean and the scale."""

    name: ClassVar[str] = "true-norm-gradient"

    def fits_linear(self, op) -> str | None:
        if set(op.op_types) & set(NORM_OPS):
            return None
        return "its true gradient is written for LayerNormalization and its RMS forms only"

    def propagate_one(self, em, layer, r_out) -> list:
        op, node = layer.op, layer.node
        x = node.inputs[0]
        inv = op.inv_scale(em, node)
        xhat = em.mul(op._center(em, node, x, "tg_xc"), inv, tag="tg_xhat")
        g = affine_back(em, node, r_out, op.params(node))
        proj = em.reduce_mean(em.mul(g, xhat, tag="tg_gx"), op.axes(node), "tg_proj")
        centred = op._center(em, node, g, "tg_gc")
        return [em.mul(em.sub(centred, em.mul(xhat, proj, tag="tg_xp"), tag="tg_diff"), inv, tag="r_in")]

    def zero_preserving(self, op, node):
        return False




# ------------------------------------------------------------------------------- functions of one tensor
#: d/da of element-wise functions of one argument, as a function of (emitter, a, f(a)); a Pow with a constant
#: exponent, Add / Sub / Mul / Div of two tensors and Neg are handled apart (tangent).
_DERIVATIVES = {
    "Erf": lambda em, a, y: em.mul(em.scalar(1.1283791670955126), em.op("Exp", em.neg(em.mul(a, a))), tag="derf"),
    "Tanh": lambda em, a, y: em.sub(em.scalar(1.0), em.mul(y, y), tag="dtanh"),
    "Sigmoid": lambda em, a, y: em.mul(y, em.sub(em.scalar(1.0), y), tag="dsigmoid"),
    "Exp": lambda em, a, y: y,
    "Sqrt": lambda em, a, y: em.div(em.scalar(0.5), y, tag="dsqrt"),
    "Abs": lambda em, a, y: em.op("Sign", a, tag="dabs"),
    "Relu": lambda em, a, y: em.op("Cast", em.op("Greater", a, em.scalar(0.0)), to=_float_type(em), tag="drelu"),
}


def _float_type(em) -> int:
    import onnx_ir as ir
    return int(ir.DataType.from_numpy(em.np_dtype))


class Tangent:
    """Forward-mode derivative d v / d source of the values between ``source`` and a node's output: None for a
    value that does not depend on the source (its derivative 0)."""

    def __init__(self, em, source, node):
        self.em, self.source, self.node, self.memo = em, source, node, {}

    def of(self, v):
        if v is None or v is self.source:
            return None if v is None else self.em.scalar(1.0)
        if id(v) not in self.memo:
            self.memo[id(v)] = self._emit(v)
        return self.memo[id(v)]

    def _emit(self, v):
        p = v.producer()
        if p is None:
            return None
        ds = [self.of(u) for u in p.inputs]
        if all(d is None for d in ds):
            return None
        em, op, ins = self.em, p.op_type, list(p.inputs)
        if op in ("Add", "Sub"):
            a, b = ds[0], ds[1]
            if b is None:
                return a
            b = b if op == "Add" else em.neg(b)
            return b if a is None else em.add(a, b, tag="t_sum")
        if op == "Mul":
            parts = [em.mul(d, ins[1 - k]) for k, d in enumerate(ds) if d is not None]
            return parts[0] if len(parts) == 1 else em.add(parts[0], parts[1], tag="t_prod")
        if op == "Div":
            out = None if ds[0] is None else em.div(ds[0], ins[1])
            if ds[1] is not None:
                q = em.mul(em.div(v, ins[1]), ds[1])
                out = em.neg(q) if out is None else em.sub(out, q, tag="t_quot")
            return out
        if op in ("Neg", "Identity"):
            return ds[0] if op == "Identity" else em.neg(ds[0])
        if op == "Pow" and ds[1] is None:
            e = ins[1]
            return em.mul(ds[0], em.mul(e, em.op("Pow", ins[0], em.sub(e, em.scalar(1.0, _np(e)))), tag="dpow"))
        if op in _DERIVATIVES and len(ins) == 1:
            return em.mul(ds[0], _DERIVATIVES[op](em, ins[0], v), tag="t_chain")
        raise _refuse(self.em, self.node, f"the true gradient through {op} inside this function of one tensor is "
                      "not written")


def _np(v):
    import numpy as np
    return np.dtype(v.dtype.numpy()) if v.dtype is not None else None


def _refuse(em, node, reason: str):
    from ..core.errors import UnsupportedError
    return UnsupportedError([{"name": node.name, "op_type": node.op_type, "domain": node.domain,
                              "opset": em.opset, "reason": reason}], "Use occlusion (forwards only) or LRP.")


class FunctionGradient:
    """A mixin of the true-gradient rule (before ``Gradient`` in its bases): on a function of one tensor written out
    by the exporter (GELU as ``x * 0.5 * (1 + Erf(x / sqrt 2))``, SiLU, softsign: the node LRP takes as one
    activation) its derivative, emitted in forward mode through the function's nodes."""

    def fits_activation(self, op) -> str | None:
        if isinstance(op, ElementwiseOfOne):
            return None
        return super().fits_activation(op)

    def propagate_one(self, em, layer, r_out) -> list:
        if not isinstance(layer.op, ElementwiseOfOne):
            return super().propagate_one(em, layer, r_out)
        node = layer.node
        d = Tangent(em, meta.PATTERN.get(node).source, node).of(node.outputs[0])
        return [None if d is None or r_out is None else em.mul(r_out, d, tag="r_in")]

__all__ = ["TrueNormGradient", "FunctionGradient", "Tangent", "NORM_OPS"]
