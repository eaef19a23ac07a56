"""Resize (nearest and linear modes, constant scales or sizes): linear in x and separable, y = x x_1 A_1 ... x_k A_k
with one interpolation matrix A_ax (out x in) per resized axis, built here from the ONNX formulas; J^T s applies
each A_ax^T along its axis (a MatMul). Kind ``avgpool``: nearest copies, linear averages with weights >= 0.
"""
from __future__ import annotations

import math

import numpy as np

from ..graph import static_dims
from .base import LinearOp, Params, const, register

_TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


def _source(o: int, n_in: int, n_out: int, scale: float, mode: str) -> float:
    """The input coordinate of output position ``o`` (ONNX Resize's coordinate_transformation_mode), in float32
    as onnxruntime computes it (3 / 0.6f is 5, not 4.9999998)."""
    f = np.float32
    o, scale = f(o), f(scale)
    if mode == "half_pixel":
        return float((o + f(0.5)) / scale - f(0.5))
    if mode == "pytorch_half_pixel":
        return float((o + f(0.5)) / scale - f(0.5)) if n_out > 1 else 0.0
    if mode == "align_corners":
        return float(o * f(n_in - 1) / f(n_out - 1)) if n_out > 1 else 0.0
    return float(o / scale)  # asymmetric


def _nearest(xf: float, rounding: str) -> int:
    if rounding == "floor":
        return math.floor(xf)
    if rounding == "ceil":
        return math.ceil(xf)
    frac = xf - math.floor(xf)
    if frac == 0.5:
        return math.floor(xf) if rounding == "round_prefer_floor" else math.ceil(xf)
    return int(math.floor(xf + 0.5))


def interpolation_matrix(n_in: int, n_out: int, scale: float, mode: str, transform: str,
                         rounding: str) -> np.ndarray:
    """A (n_out x n_in): y[o] = sum_i A[o, i] x[i] along one axis, as onnxruntime computes it."""
    a = np.zeros((n_out, n_in))
    for o in range(n_out):
        xf = _source(o, n_in, n_out, scale, transform)
        if mode == "nearest":
            a[o, min(max(_nearest(xf, rounding), 0), n_in - 1)] = 1.0
        else:
            xf = min(max(xf, 0.0), n_in - 1.0)
            i0 = min(int(xf), n_in - 1)
            i1 = min(i0 + 1, n_in - 1)
            w1 = xf - i0
            a[o, i0] += 1.0 - w1
            a[o, i1] += w1
    return a


@register
class Resize(LinearOp):
    """Resize with mode nearest or linear; J^T s = s x_1 A_1^T ... (one MatMul per resized axis)."""

    kind = "avgpool"
    op_types = ("Resize",)
    has_params = False
    data_inputs = (0,)

    def _plan(self, node):
        """[(axis, A)] for every axis that changes, or a reason (str) why not."""
        attrs = node.attributes
        mode = attrs.get_string("mode", "nearest")
        transform = attrs.get_string("coordinate_transformation_mode", "half_pixel")
        if mode not in ("nearest", "linear"):
            return f"mode={mode} (only nearest and linear)"
        if transform not in _TRANSFORMS:
            return f"coordinate_transformation_mode={transform}"
        if attrs.get_int("antialias", 0):
            return "antialias=1"
        if attrs.get_string("keep_aspect_ratio_policy", "stretch") != "stretch":
            return "keep_aspect_ratio_policy other than stretch"
        dims = static_dims(node.inputs[0])
        if dims is None:
            return "rank unknown"
        rank = len(dims)
        axes = [int(a) % rank for a in attrs.get_ints("axes", list(range(rank)))]
        ins = list(node.inputs) + [None] * (4 - len(node.inputs))
        scales = const(ins[2]) if ins[2] is not None else None
        sizes = const(ins[3]) if ins[3] is not None else None
        if (ins[2] is not None and scales is None) or (ins[3] is not None and sizes is None):
            return "scales or sizes are not constants"
        scales = None if scales is None or scales.size == 0 else [float(s) for s in scales.reshape(-1)]
        sizes = None if sizes is None or sizes.size == 0 else [int(s) for s in sizes.reshape(-1)]
        if (scales is None) == (sizes is None) or len(scales or sizes) != len(axes):
            return "needs scales or sizes, one per resized axis"
        plan = []
        for k, ax in enumerate(axes):
            n_in = dims[ax]
            if scales is not None and scales[k] == 1.0:
                continue
            if n_in is None:
                return f"resized axis {ax} must be static"
            out = static_dims(node.outputs[0])
            n_out = out[ax] if out is not None and out[ax] is not None else (
                int(math.floor(n_in * scales[k])) if scales is not None else sizes[k])
            if sizes is not None and n_out == n_in:
                continue
            if n_out < 1:
                return f"axis {ax} resized to nothing"
            scale = scales[k] if scales is not None else n_out / n_in
            plan.append((ax, interpolation_matrix(n_in, n_out, scale, mode, transform,
                                                  attrs.get_string("nearest_mode", "round_prefer_floor"))))
        return plan

    def check(self, node):
        plan = self._plan(node)
        return plan if isinstance(plan, str) else None

    def params(self, node):
        return Params(None, None)

    def forward(self, em, node, xs, p):
        attrs = {k: a.value for k, a in node.attributes.items()}
        return em.op("Resize", xs[0], *node.inputs[1:], tag="z", **attrs)

    def transpose(self, em, node, s, p):
        rank = len(node.inputs[0].shape)
        for ax, a in self._plan(node):
            m = em.const(a, tag=f"interp{ax}", key=(node.name, "interp", ax))  # [out, in]: s_last @ A
            if ax == rank - 1:
                s = em.op("MatMul", s, m, tag=f"JTs{ax}")
                continue
            perm = list(range(rank))
            perm[ax], perm[-1] = perm[-1], perm[ax]
            t = em.op("Transpose", s, perm=perm, tag=f"s_swap{ax}")
            s = em.op("Transpose", em.op("MatMul", t, m, tag=f"JTs{ax}_last"), perm=perm, tag=f"JTs{ax}")
        return [s]
