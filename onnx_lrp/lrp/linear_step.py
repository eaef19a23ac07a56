"""The generic step of every linear rule, written once for every linear op and every rule given as groups of terms
(cf. zennit.core.BasicHook)::

    for each group g of the rule:
        z_g  = sum_k sign_k * f(xmod_k(x); wmod_k(w), bmod_k(b))        # op.forward
        s_g  = coef_g * mask_g * r_out / stab(z_g)
        r_in += sum_k sign_k * xmod_k(x) * J^T(s_g; wmod_k(w))           # op.transpose

``linear_rule`` runs it: ``LinearStep.collect`` gathers each group's terms into shared forwards, ``normalise``
divides by the group's denominator (``onnx_lrp.lrp.denominators``), ``transposes`` applies one transpose per
(input modifier, weight basis) (``onnx_lrp.lrp.weight_bases``).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core.emitter import Emitter
from ..core.graph import static_dims
from .denominators import denominator, masked_denominator
from .layer import Layer
from .ops import LinearOp, Params
from .ops.base import Rel
from .vocabulary import XMod, ZMask
from .weight_bases import Basis, beyond, channel_scale, definite_sign, same_bias, symmetric


class LinearStep:
    """One linear rule on one layer: terms collected per group into shared forwards (``collect``), each group's
    denominator and normalised relevance (``normalise``), then one transpose per (input modifier, weight basis)
    (``transposes``). Terms are grouped by (input modifier, basis) so that convolutions are shared."""

    def __init__(self, em: Emitter, layer: Layer, rule, rel: Rel):
        self.em, self.layer, self.rule = em, layer, rule
        self.rel, self._r_plain = rel, None  # the relevance of z (in gradient form where the rewriter gave it so)
        self.op: LinearOp = layer.op
        self.node = layer.node
        self.p0 = self.op.params(self.node)
        self.eps = rule.eps()
        self.basis = Basis(self.p0.w)
        self.b_orig = self.p0.b if self.p0.b is not None and np.any(self.p0.b) else None
        self.forwards: dict = {}  # (x key, basis key) -> f(x_mod; basis), without bias
        self.x_of: dict = {}      # x key -> (how, value)
        self.weights: dict = {}   # basis key -> Params
        self.exact_w: dict = {}   # group index -> {x key: the group's own weights on that input (its terms' sum)}
        self.masked: dict = {}    # mask -> r_out * [z > 0] / [z < 0], emitted once
        self.rests: list = []     # fused remainders (w, b, value) of masked denominators, shared up to a factor
        self.first_raw = None     # (Q, c, c z + Q) of the first masked group whose Q >= eps: the second reads it

    def forward(self, xkey, bkey) -> ir.Value:
        em, layer, op, node = self.em, self.layer, self.op, self.node
        forwards, weights = self.forwards, self.weights
        if (xkey, bkey) not in forwards and bkey == "W-" and xkey == (XMod.IDENTITY, id(None)):
            # f(x; W-) = f(x; W) - f(x; W+), f(x; W) = z - b: one convolution fewer (benign in the forward)
            zf = layer.z if self.b_orig is None else em.sub(
                layer.z, op.bias_const(em, node, self.b_orig, tag="b_orig"), tag="z_nobias")
            weights.setdefault("W+", self.basis.params("W+"))
            forwards[(xkey, bkey)] = em.sub(zf, self.forward(xkey, "W+"), tag="z_neg")
        if (xkey, bkey) not in forwards:
            how, value = self.x_of[xkey]
            xs = [layer.x_mod(em, i, how, value) for i in range(len(layer.xs))]
            forwards[(xkey, bkey)] = op.forward(em, node, xs, weights[bkey])
        return forwards[(xkey, bkey)]

    def collect(self, gi: int, group) -> tuple[dict, object, int]:
        """(combo, bias, sign) of a group: {(x key, basis key): coefficient in z_g}, its summed modified bias, and
        whether z_g is provably positive (1) or not (0)."""
        layer, p0, basis = self.layer, self.p0, self.basis
        combo: dict = {}
        exact_w = self.exact_w.setdefault(gi, {})
        bias = None
        sign = 1
        for k, term in enumerate(group.terms):
            if term.x == XMod.NEGATIVE and all(layer.nonneg):
                continue  # x- = 0 after a Relu: the term vanishes
            wm = term.w(p0.w) if p0.w is not None else None
            bm = term.b(p0.b) if (term.b is not None and p0.b is not None) else None
            if wm is not None and not np.any(wm) and (bm is None or not np.any(bm)):
                continue
            how = XMod.IDENTITY if term.x == XMod.POSITIVE and all(layer.nonneg) else term.x
            xkey = (how, id(term.x_value))
            self.x_of[xkey] = (how, term.x_value)
            if wm is not None:
                signed = wm if term.sign == 1.0 else wm * wm.dtype.type(term.sign)
                exact_w[xkey] = signed if xkey not in exact_w else exact_w[xkey] + signed
            parts = basis.decompose(term.w, wm) if wm is not None or p0.w is None else None
            if parts is None:  # not a combination of W and W+: its own weights
                bkey = ("own", gi, k)
                self.weights[bkey] = Params(wm.astype(p0.w.dtype), None, key=(term.w, term.tag))
                parts = {bkey: 1.0}
            else:
                for name in parts:
                    self.weights.setdefault(name, basis.params(name))
            for bkey, c in parts.items():
                combo[(xkey, bkey)] = combo.get((xkey, bkey), 0.0) + term.sign * c
            if bm is not None and np.any(bm):
                bias = term.sign * bm if bias is None else bias + term.sign * bm
            x_sign = {XMod.IDENTITY: 1 if all(layer.nonneg) else 0, XMod.POSITIVE: 1, XMod.NEGATIVE: -1,
                      XMod.ONES: 1, XMod.CONSTANT: definite_sign(term.x_value)}[how]
            t_sign = term.sign * x_sign * definite_sign(wm) if wm is not None else term.sign * x_sign
            b_sign = term.sign * definite_sign(bm)
            if t_sign <= 0 or b_sign <= 0:
                sign = 0
        combo = {k: c for k, c in combo.items() if c != 0}
        if combo and basis.mixed and len(layer.xs) == 1 and not layer.nonneg[0]:
            sym = symmetric(combo, self.x_of)
            if sym is not None and len(sym) < len(combo):
                combo = sym
                exact_w.clear()
                self.x_of[(XMod.IDENTITY, id(None))] = (XMod.IDENTITY, None)
                self.x_of[(XMod.ABS, id(None))] = (XMod.ABS, None)
                for _, bkey in combo:
                    self.weights.setdefault(bkey, basis.params(bkey))
        return combo, bias, sign

    def r_plain(self) -> ir.Value:
        """The relevance of z as a tensor: ``rel`` multiplied out once, where a group needs it."""
        if self._r_plain is None:
            self._r_plain = self.rel.as_relevance(self.em, tag="r_out")
        return self._r_plain

    def _of_z(self) -> bool:
        """Whether the relevance arrived in gradient form relative to z itself, R = z * g."""
        return self.rel.ref is not None and self.rel.ref is self.layer.z

    def normalise(self, gtag: str, group, combo: dict, bias, sign: int) -> tuple[ir.Value, float]:
        """(s_g, k): s_g = coef-free r_out * mask_g / (k stab(z_g)), k the factor the denominator was divided by
        (1 but where ``masked_denominator`` folds z's coefficient out), which the transposes' weights take. z_g
        from the shared forwards (f(x; W) for the unmodified input is the forward output minus its bias). Where z
        feeds only a Relu (``relu_out``) the relevance is zero wherever z <= 0, so a mask z > 0 needs no emitting
        (``linear_rule`` drops groups masked to z < 0)."""
        em, layer, node, eps = self.em, self.layer, self.node, self.eps
        mask = None if layer.relu_out is not None and group.mask == ZMask.POSITIVE else group.mask
        stab, k = None, 1.0
        kept = {1 if group.mask == ZMask.POSITIVE else -1}
        if group.mask is not None and eps and node.op_type == "Conv" and len(layer.xs) == 1 and \
                beyond(group, self.p0.w, self.p0.b, all(layer.nonneg)) <= kept:
            # z_g - z has the mask's sign: where the mask keeps, stab(z_g) = z_g +- eps, from z and one convolution
            stab, k = masked_denominator(self, gtag, combo, bias, eps if group.mask == ZMask.POSITIVE else -eps,
                                               unmasked=mask is None)
        if stab is None and mask is None and self._of_z() and eps and sign == 0 and layer.relu_out is None and \
                combo == {((XMod.IDENTITY, id(None)), "W"): 1.0} and same_bias(bias, self.b_orig):
            # R = z * g and z_g = z: s = z g / (z + eps sign(z)) = g |z| / (|z| + eps), zennit's stabiliser of either
            # sign without its passes (for z = 0 both are 0)
            mag = em.op("Abs", layer.z, tag=f"{gtag}_abs")
            ratio = em.div(mag, em.add(mag, em.scalar(eps), tag=f"{gtag}_stab"), tag=f"{gtag}_ratio")
            return em.mul(self.rel.value, ratio, tag=f"{gtag}_s"), k
        if stab is None:
            stab, k = denominator(self, gtag, combo, bias, sign), 1.0
        return em.div(self._masked_r(mask) if mask is not None else self.r_plain(), stab, tag=f"{gtag}_s"), k

    def _masked_r(self, mask: str) -> ir.Value:
        """r_out * [z > 0] (or [z < 0]), once per layer; exact where every denominator is finite and non-zero."""
        em, layer = self.em, self.layer
        if mask not in self.masked:
            other = ZMask.NEGATIVE if mask == ZMask.POSITIVE else ZMask.POSITIVE
            if self._of_z():  # R = z * g: R [z > 0] = max(z, 0) g, R [z < 0] = min(z, 0) g (equal where z = 0: 0)
                part = (em.positive_part if mask == ZMask.POSITIVE else em.negative)(layer.z, tag=f"z_{mask[:3]}")
                self.masked[mask] = em.mul(part, self.rel.value, tag=f"r_{mask[:3]}")
            elif other in self.masked and layer.zero_at_zero:  # r_out = 0 where z = 0: the complement by one Sub
                self.masked[mask] = em.sub(self.r_plain(), self.masked[other], tag=f"r_{mask[:3]}")
            else:
                # [z > 0] as clip(z * 2^126, 0, 1): 1 for every positive normal float, 0 for z <= 0 (a positive
                # denormal, |z| < 1.2e-38, would get a fraction); two light passes and a multiply instead of a
                # comparison and a Cast (slow in onnxruntime) or a Where (about 8x a Mul there)
                gain = em.scalar(2.0 ** 126 if mask == ZMask.POSITIVE else -2.0 ** 126)
                keep = em.op("Clip", em.mul(layer.z, gain, tag=f"{mask[:3]}_gain"), em.scalar(0.0),
                             em.scalar(1.0), tag=f"{mask[:3]}_mask")
                self.masked[mask] = em.mul(self.r_plain(), keep, tag=f"r_{mask[:3]}")
        return self.masked[mask]

    def transposes(self, groups_s: list) -> list[ir.Value]:
        """The relevance of each input: J^T is linear in the weight, so one transpose per group and input modifier
        with the group's own weights (as zennit's modified layer) where the groups are no more than the weight
        bases, else one per basis applied to the combined normalised relevance; times the modified input."""
        em, layer, op, node, weights = self.em, self.layer, self.op, self.node, self.weights
        per_x: dict = {}
        for s, coef, combo, gi in groups_s:
            for (xkey, bkey), c in combo.items():
                per_x.setdefault(xkey, {}).setdefault(gi, (s, coef, {}))[2][bkey] = c
        contributions: list[list[ir.Value]] = [[] for _ in layer.xs]
        for gi, (s, w) in self._fold_constant_inputs(per_x).items():
            contributions[0].append(op.transpose(em, node, s, Params(w, None, key=("folded", gi)))[0])
        for xkey, by_group in per_x.items():
            how, value = self.x_of[xkey]
            grads_sum: list[list[ir.Value]] = [[] for _ in layer.xs]
            bases = {b for _, _, bc in by_group.values() for b in bc}
            if len(by_group) <= len(bases) and all(weights[b].w is not None for b in bases):
                for gi, (s, coef, bc) in by_group.items():
                    pw = self._group_weights(bc, coef, self.exact_w.get(gi, {}).get(xkey), key=("group", gi, xkey))
                    for i, g in enumerate(op.transpose(em, node, s, pw)):
                        grads_sum[i].append(g)
            else:
                by_basis: dict = {}
                for s, coef, bc in by_group.values():
                    for bkey, c in bc.items():
                        by_basis.setdefault(bkey, []).append((coef * c, s))
                for bkey, uses in by_basis.items():
                    t = em.sum([em.scale(s, c, tag="t_part") for c, s in uses], tag="t")
                    for i, g in enumerate(op.transpose(em, node, t, weights[bkey])):
                        grads_sum[i].append(g)
            for i, gs in enumerate(grads_sum):
                g = em.sum(gs, tag=f"JTt{i}")
                if how == XMod.ONES:
                    contributions[i].append(g)
                elif how == XMod.IDENTITY and i in layer.grad_out:
                    contributions[i].append(Rel(g, layer.xs[i]))  # x J^T s, multiplied once x's parts are summed
                else:
                    contributions[i].append(em.mul(layer.x_mod(em, i, how, value), g, tag=f"r{i}"))
        out = []
        for i, parts in enumerate(contributions):
            if len(parts) == 1 and isinstance(parts[0], Rel):
                out.append(parts[0])
                continue
            parts = [p.as_relevance(em, tag=f"r{i}") if isinstance(p, Rel) else p for p in parts]
            out.append(em.sum(parts, tag=f"r_in{i}") if parts else em.zeros_like(layer.xs[i], tag=f"r_in{i}_zero"))
        return out

    def _fold_constant_inputs(self, per_x: dict) -> dict:
        """Constant modified inputs of a convolution that vary only along the channels (zbox's bounds l and h, scalar
        or per channel): c * J^T(s; W') = J^T(s; W' scaled per input channel by c), so every such input of a group
        folds into ONE transpose with the summed scaled weights and no multiply (zbox: 2 transposes instead of 3).
        Removes the folded inputs from ``per_x``; returns {group: (s, summed weights)}."""
        node, layer = self.node, self.layer
        if node.op_type != "Conv" or len(layer.xs) != 1 or node.attributes.get_int("group", 1) != 1:
            return {}
        folded: dict = {}
        for xkey in list(per_x):
            how, value = self.x_of[xkey]
            scale = channel_scale(value, static_dims(layer.xs[0])) if how == XMod.CONSTANT else None
            by_group = per_x[xkey]
            if scale is None or any(self.weights[b].w is None for _, _, bc in by_group.values() for b in bc) or \
                    len(by_group) > len({b for _, _, bc in by_group.values() for b in bc}):
                continue
            for gi, (s, coef, bc) in by_group.items():
                w = self._group_weights(bc, coef, self.exact_w.get(gi, {}).get(xkey), key=None).w
                w = w * scale.astype(w.dtype).reshape((1, -1) + (1,) * (w.ndim - 2))
                folded[gi] = (s, w if gi not in folded else folded[gi][1] + w)
            del per_x[xkey]
        return folded

    def _group_weights(self, bc: dict, coef: float, w_exact, key) -> Params:
        """The weights one group applies to one input: its terms' own modified weights where known (zennit's), else
        the combination of the bases (W- stays a basis of its own: transposing W and W+ apart and subtracting would
        cancel); the group's coefficient folded in."""
        if len(bc) == 1 and coef == 1.0 and list(bc.values()) == [1.0]:
            return self.weights[next(iter(bc))]  # a basis as it is: its constant is shared with the forward's
        if w_exact is None:
            for b, c in bc.items():
                part = self.weights[b].w if c == 1.0 else self.weights[b].w * self.weights[b].w.dtype.type(c)
                w_exact = part if w_exact is None else w_exact + part
        if coef != 1.0:
            w_exact = w_exact * w_exact.dtype.type(coef)
        return Params(w_exact, None, key=key)


def linear_rule(em: Emitter, layer: Layer, rule, r_out: "ir.Value | Rel") -> list:
    """The generic step of a linear rule (``rule.groups()``): per group collect its terms, normalise the relevance
    by the group's denominator; then the transposes. ``r_out`` may come in gradient form (a ``Rel``): relative to z
    itself, masks and epsilon's stabiliser of either sign use it (fewer passes); else it is multiplied out once."""
    step = LinearStep(em, layer, rule, r_out if isinstance(r_out, Rel) else Rel(r_out))
    groups_s = []  # per group: (s_g, coef_g, {(x key, basis key): coef}, group index)
    for gi, group in enumerate(rule.groups()):
        if layer.relu_out is not None and group.mask == ZMask.NEGATIVE:
            continue  # kept only where z < 0, where the relevance is zero already (z feeds only a Relu): s_g = 0
        combo, bias, sign = step.collect(gi, group)
        if not combo and bias is None:
            continue
        s, k = step.normalise(group.tag or f"g{gi}", group, combo, bias, sign)
        groups_s.append((s, group.coef / k, combo, gi))
    return step.transposes(groups_s)


__all__ = ["LinearStep", "linear_rule"]
