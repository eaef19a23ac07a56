"""The denominators of the generic linear step: stab(z_g) of each group of a rule, formed from the layer's own
output z and the forwards its terms share where the algebra allows (zennit's stabiliser ``z + eps (sign(z) +
(z == 0))``, with the shortcuts a group's provable sign gives). Each reads and extends the state of one
``onnx_lrp.lrp.linear_step.LinearStep`` (``step``: its forwards, weight bases, shared remainders)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core.emitter import Emitter
from .ops import Params
from .ops.base import stabilized
from .vocabulary import XMod
from .weight_bases import weight_ratio


def weighted_sum(em: Emitter, items: dict, tag: str) -> ir.Value:
    """sum coef * value over {key: (coef, value)} with scalar multiplies only where needed."""
    parts = [em.scale(v, c, tag=f"{tag}_part") for c, v in items.values() if c != 0]
    return em.sum(parts, tag=tag)


def masked_denominator(step, gtag: str, combo: dict, bias, eps_signed: float, unmasked: bool):
    """stab(z_g) of a masked group whose z_g - z has the mask's sign: z_g + eps (mask z > 0) or z_g - eps (z < 0).

    Written as c z + Q, Q = f(x'; W_rest, b_rest + eps) one convolution (shared, up to a factor, with the other
    group: gamma's two groups are z + Q and (1 + g) z - Q), clipped to [eps, inf) or (-inf, -eps] so that it is
    non-zero where the mask drops (where it keeps, the clip does nothing: z_g has the sign of z there). Returns
    (stab, k): where z feeds only a rectifier (one group) and c != 1 (gamma on an input of either sign: c = 1 +
    gamma / 2), the denominator is written c (z + Q / c): Q / c is the convolution with its weights and bias
    divided by c, z + Q / c its one consumer, which onnxruntime fuses into it, and k = c goes to the transposes'
    weights (a multiply and an add fewer per such layer). (None, 1) when the remainder reads more than one
    modified input."""
    em, layer = step.em, step.layer
    found = _remainder(step, combo, bias, eps_signed)
    if found is None:
        return None, 1.0
    c_id, w_rest, b_rest, xkey = found
    dtype = np.dtype(em.np_dtype)
    q, factor = _shared_remainder(step, w_rest, b_rest)
    how, value = step.x_of[xkey]
    big = float(np.finfo(dtype).max)
    if q is None and unmasked and eps_signed > 0 and c_id > 0 and c_id != 1.0:
        w_rest, b_rest = w_rest / dtype.type(c_id), b_rest / dtype.type(c_id)
        q = step.op.forward(em, step.node, [layer.x_mod(em, 0, how, value)],
                            Params(w_rest, b_rest, key=("rest", gtag)))
        step.rests.append((w_rest, b_rest, q))
        raw = em.add(layer.z, q, tag=f"{gtag}_z")
        return em.op("Clip", raw, em.scalar(abs(eps_signed) / c_id), em.scalar(big), tag=f"{gtag}_stab"), c_id
    if q is None:
        q = step.op.forward(em, step.node, [layer.x_mod(em, 0, how, value)],
                            Params(w_rest, b_rest, key=("rest", gtag)))
        step.rests.append((w_rest, b_rest, q))
    nonneg_q = factor == 1.0 and bool(np.all(w_rest >= 0)) and bool(np.all(b_rest > 0)) and (
        how in (XMod.POSITIVE, XMod.ABS) or (how == XMod.IDENTITY and all(layer.nonneg)))
    if unmasked and c_id == 1.0 and nonneg_q and layer.relu_out is not layer.z:
        return em.add(layer.relu_out, q, tag=f"{gtag}_stab"), 1.0  # relu(z) + Q: Q >= eps, z_g + eps where z > 0
    first = step.first_raw
    if first is not None and first[0] is q and factor == -1.0 and eps_signed < 0 and c_id >= 1.0:
        # gamma's second group (1 + g) z - Q as (2 + g) z - (z + Q) from the first group's sum: Q then feeds one Add,
        # which onnxruntime fuses into Q's convolution (one pass fewer). Exact to a few roundings where the mask
        # keeps (z < 0, Q >= eps: |(2 + g) z| + |z + Q| <= 3 |(1 + g) z - Q|, no cancellation)
        raw = em.sub(em.scale(layer.z, c_id + first[1], tag=f"{gtag}_zc"), first[2], tag=f"{gtag}_z")
        return em.op("Clip", raw, em.scalar(-big), em.scalar(eps_signed), tag=f"{gtag}_stab"), 1.0
    zc = em.scale(layer.z, c_id, tag=f"{gtag}_zc") if c_id else None
    if zc is not None and abs(factor) == 1.0:
        raw = (em.add if factor == 1.0 else em.sub)(zc, q, tag=f"{gtag}_z")
        if factor == 1.0 and c_id == 1.0 and nonneg_q and eps_signed > 0 and step.first_raw is None:
            step.first_raw = (q, c_id, raw)
    else:
        raw = weighted_sum(em, {"q": (factor, q)} | ({"z": (1.0, zc)} if zc is not None else {}), tag=f"{gtag}_z")
    lo, hi = (abs(eps_signed), big) if eps_signed > 0 else (-big, eps_signed)
    return em.op("Clip", raw, em.scalar(lo), em.scalar(hi), tag=f"{gtag}_stab"), 1.0


def _remainder(step, combo: dict, bias, eps_signed: float):
    """(c, W_rest, b_rest, x key) with z_g +- eps = c z + f(x'; W_rest, b_rest) (eps in b_rest), or None when the
    remainder reads more than one modified input."""
    em, weights = step.em, step.weights
    ident = ((XMod.IDENTITY, id(None)), "W")
    c_id = combo.get(ident, 0.0)
    rest = {k: c for k, c in combo.items() if k != ident}
    if len({xk for xk, _ in rest}) != 1:
        return None
    w_rest, xkey = None, None
    for (xk, bkey), c in rest.items():
        part = weights[bkey].w if c == 1.0 else weights[bkey].w * weights[bkey].w.dtype.type(c)
        w_rest, xkey = (part if w_rest is None else w_rest + part), xk
    dtype = np.dtype(em.np_dtype)
    b_rest = np.zeros(w_rest.shape[0], dtype=dtype) if bias is None else np.asarray(bias, dtype=dtype)
    if step.b_orig is not None and c_id:
        b_rest = b_rest - dtype.type(c_id) * step.b_orig.astype(dtype)
    b_rest = b_rest + dtype.type(eps_signed)
    return c_id, w_rest, b_rest, xkey


def _shared_remainder(step, w_rest, b_rest) -> tuple:
    """(Q, factor): a remainder another group of the layer emitted whose weights and bias are ``factor`` times these
    (gamma's two groups: Q and -Q), or (None, 1.0)."""
    for w_prev, b_prev, v_prev in step.rests:
        r = weight_ratio(w_rest, w_prev)
        if r is not None and np.allclose(b_rest, r * b_prev, rtol=1e-6, atol=1e-7 * float(np.abs(b_prev).max())):
            return v_prev, r
    return None, 1.0


def denominator(step, gtag: str, combo: dict, bias, sign: int) -> ir.Value:
    """stab(z_g) for any group (zennit's stabiliser, with the shortcuts its sign allows)."""
    em, layer, op, node, eps = step.em, step.layer, step.op, step.node, step.eps
    ident = ((XMod.IDENTITY, id(None)), "W")
    # z_g = sum of f(x'; W') (+ b') with a positive sign (z+: x+ W+ and x- W-): b' + eps ride on the first
    # convolution as its bias (two passes fewer; zennit's conv(x', W', b') + eps rounds once more, ~1e-7 relative)
    fold_eps = bool(eps) and sign > 0 and node.op_type == "Conv" and bool(combo) and ident not in combo \
        and all(c == 1.0 for c in combo.values()) and len(step.rule.groups()) == 1
    items = {}
    for n, (key, c) in enumerate(combo.items()):
        if fold_eps and n == 0:
            how, value = step.x_of[key[0]]
            pw = step.weights[key[1]]
            b_eps = np.full(pw.w.shape[0], eps, dtype=pw.w.dtype)
            if bias is not None:
                b_eps = b_eps + np.asarray(bias, dtype=pw.w.dtype)
            items[key] = (c, op.forward(em, node, [layer.x_mod(em, i, how, value) for i in range(len(layer.xs))],
                                        Params(pw.w, b_eps, key=(pw.key, "eps", gtag))))
            bias = None
        elif key == ident:
            items[key] = (c, layer.z)
            shift = -c * step.b_orig if step.b_orig is not None else None
            if shift is not None:
                bias = shift if bias is None else bias + shift
        else:
            items[key] = (c, step.forward(*key))
    if bias is not None and not np.any(bias):
        bias = None  # e.g. epsilon's own bias, already in z: z_g is z itself
    z = weighted_sum(em, items, tag=f"{gtag}_z") if items else None
    if bias is not None:
        bconst = op.bias_const(em, node, bias, tag=f"{gtag}_b")
        z = em.add(z, bconst, tag=f"{gtag}_zb") if z is not None else bconst
    if len(items) == 1 and ident in items and items[ident][0] == 1.0 and bias is None \
            and layer.relu_out is not None and eps:
        # z feeds only a Relu and the relevance is zero where relu(z) is: stab(z) = relu(z) + eps there
        if layer.relu_out is not layer.z:
            return em.add(layer.relu_out, em.scalar(eps), tag=f"{gtag}_stab")
        return em.relu_plus(layer.z, eps, tag=f"{gtag}_stab")  # a Clip(0, max) follows: from z itself
    if sign > 0 and eps:
        return z if fold_eps else em.add(z, em.scalar(eps), tag=f"{gtag}_stab")
    return stabilized(em, z, eps, tag=f"{gtag}_stab")


__all__ = ["masked_denominator", "denominator", "weighted_sum"]
