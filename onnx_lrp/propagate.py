"""The generic LRP step, written once for every linear op and every rule (cf. zennit.core.BasicHook)::

    for each group g of the rule:
        z_g  = sum_k sign_k * f(xmod_k(x); wmod_k(w), bmod_k(b))        # op.forward
        s_g  = coef_g * mask_g * r_out / stab(z_g)
        r_in += sum_k sign_k * xmod_k(x) * J^T(s_g; wmod_k(w))           # op.transpose
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .graph import Emitter, static_dims
from .ops import ActivationOp, LinearOp, Params, ShapeOp
from .rules.rules import Gradient, LinearRule, Pass, Rule, _identity


class Layer:
    """A node as the rewriter sees it: its relevance inputs ``xs``, its output ``z`` (after a folded bias Add)."""

    def __init__(self, node: ir.Node, op, xs: list[ir.Value], z: ir.Value, nonneg: list[bool]):
        self.node, self.op, self.xs, self.z, self.nonneg = node, op, xs, z, nonneg
        self._mods: dict = {}

    def x_mod(self, em: Emitter, i: int, how: str, value=None) -> ir.Value | None:
        """The modified input (None means 'ones', handled by the caller)."""
        x = self.xs[i]
        if how == "identity" or (how == "positive" and self.nonneg[i]):
            return x
        key = (i, how, id(value))
        if key not in self._mods:
            if how == "positive":
                self._mods[key] = em.positive(x, tag=f"x{i}+")
            elif how == "negative":
                self._mods[key] = em.negative(x, tag=f"x{i}-")
            elif how == "ones":
                dims = static_dims(x)
                if dims is not None and all(d is not None for d in dims[1:]):
                    self._mods[key] = em.const(np.ones([1] + dims[1:]), tag=f"x{i}_ones")
                else:
                    self._mods[key] = em.op("ConstantOfShape", em.shape_of(x), value=ir.tensor(
                        np.ones(1, dtype=em.np_dtype)), tag=f"x{i}_ones")
            elif how == "constant":
                dims = static_dims(x)
                arr = np.asarray(value, dtype=em.np_dtype)
                if dims is None or any(d is None for d in dims[1:]):
                    raise ValueError(f"node {self.node.name}: a constant-input rule needs static input dims")
                target = tuple(dims[1:])
                if arr.ndim == len(dims):
                    if arr.shape[0] != 1:
                        raise ValueError(f"node {self.node.name}: bounds have a batch dimension of {arr.shape[0]};"
                                         " give them per sample (shape of one input)")
                    arr = arr[0]
                try:
                    arr = np.broadcast_to(arr, target)
                except ValueError:
                    raise ValueError(f"node {self.node.name}: bounds of shape {np.shape(value)} do not broadcast to "
                                     f"the input shape {target}") from None
                self._mods[key] = em.const(arr[None], tag=f"x{i}_bound")
            else:
                raise ValueError(f"unknown input modifier {how!r}")
        return self._mods[key]


def _is_identity_term(term) -> bool:
    return term.x == "identity" and term.w is _identity and (term.b is _identity)


def linear_rule(em: Emitter, layer: Layer, rule: LinearRule, r_out: ir.Value) -> list[ir.Value]:
    op: LinearOp = layer.op
    node = layer.node
    p0 = op.params(node)
    eps = rule.eps()
    contributions: list[list[ir.Value]] = [[] for _ in layer.xs]
    for gi, group in enumerate(rule.groups()):
        gtag = group.tag or f"g{gi}"
        terms = []
        for term in group.terms:
            if term.x == "negative" and all(layer.nonneg):
                continue  # x- = 0 after a Relu: the term vanishes
            w = term.w(p0.w) if p0.w is not None else None
            b = term.b(p0.b) if (term.b is not None and p0.b is not None) else None
            if p0.w is not None and not np.any(w) and (b is None or not np.any(b)):
                continue
            if w is not None and w.dtype != p0.w.dtype:
                w = w.astype(p0.w.dtype)
            key = "orig" if (term.w is _identity and term.b in (_identity,)) else (term.w, term.b, term.tag)
            terms.append((term, Params(w, b, key)))
        if not terms:
            continue
        # denominator
        zs = []
        for term, p in terms:
            if _is_identity_term(term):
                zk = layer.z
            else:
                xs = [layer.x_mod(em, i, term.x, term.x_value) for i in range(len(layer.xs))]
                zk = op.forward(em, node, xs, p)
            zs.append(em.scale(zk, term.sign, tag=f"{gtag}_z_signed"))
        z = em.sum(zs, tag=f"{gtag}_z")
        s = em.div(r_out, em.stabilize(z, eps, tag=f"{gtag}_stab"), tag=f"{gtag}_s")
        if group.mask is not None:
            cmp = "Greater" if group.mask == "positive" else "Less"
            keep = em.op(cmp, layer.z, em.scalar(0.0), tag=f"{gtag}_mask")
            s = em.op("Where", keep, s, em.scalar(0.0), tag=f"{gtag}_s_masked")
        s = em.scale(s, group.coef, tag=f"{gtag}_s_coef")
        for term, p in terms:
            grads = op.transpose(em, node, s, p)
            for i, g in enumerate(grads):
                if term.x == "ones":
                    r = g
                else:
                    r = em.mul(layer.x_mod(em, i, term.x, term.x_value), g, tag=f"{gtag}_r{i}")
                contributions[i].append(em.scale(r, term.sign, tag=f"{gtag}_r{i}_signed"))
    out = []
    for i, parts in enumerate(contributions):
        out.append(em.sum(parts, tag=f"r_in{i}") if parts else em.zeros_like(layer.xs[i], tag=f"r_in{i}_zero"))
    return out


def apply_rule(em: Emitter, layer: Layer, rule: Rule, r_outs: list) -> list[ir.Value]:
    """Relevance for the layer's relevance inputs from the relevance of its outputs."""
    op = layer.op
    if isinstance(op, ShapeOp):
        return op.transpose(em, layer.node, r_outs)
    r_out = r_outs[0]
    if isinstance(rule, Pass):
        return [r_out]
    if isinstance(rule, Gradient):
        if isinstance(op, LinearOp):
            return op.transpose(em, layer.node, r_out, op.params(layer.node))
        if isinstance(op, ActivationOp):
            d = op.derivative(em, layer.node)
            return [em.mul(r_out, d, tag="r_in")]
    if isinstance(rule, LinearRule) and isinstance(op, LinearOp):
        return linear_rule(em, layer, rule, r_out)
    raise AssertionError(f"rule {rule.name} on {layer.node.op_type} was not rejected when planning")


def rule_fits(op, rule: Rule) -> str | None:
    """Why a rule cannot apply to an op (checked for every node before anything is emitted)."""
    if isinstance(op, ShapeOp):
        return None if isinstance(rule, (Gradient, Pass)) else f"rule {rule.name} on a shape op (use gradient)"
    if isinstance(rule, Pass):
        return None
    if isinstance(rule, Gradient):
        if isinstance(op, LinearOp):
            return None
        if isinstance(op, ActivationOp) and type(op).derivative is not ActivationOp.derivative:
            return None
        return f"the gradient rule is not implemented for {', '.join(op.op_types[:3])} (use pass)"
    if isinstance(rule, LinearRule):
        if not isinstance(op, LinearOp):
            return f"rule {rule.name} needs a linear op (use pass)"
        if rule.needs_params and not op.has_params:
            return f"rule {rule.name} needs parameters; this {op.kind} has none (use norm or epsilon)"
        return None
    return f"rule {rule.name} is not known to the engine"
