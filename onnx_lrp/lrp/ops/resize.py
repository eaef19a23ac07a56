"""Resize (nearest and linear modes): linear in x and separable, y = x x_1 A_1 ... x_k A_k with one interpolation
matrix A_ax (out x in) per resized axis; J^T s applies each A_ax^T along its axis (a MatMul). Kind ``avgpool``:
nearest copies, linear averages with weights >= 0.

A static axis with constant scales or sizes gets A_ax built here from the ONNX formulas. A dynamic axis (its length
known only at run time: YOLO / PP-OCR FPNs exported with dynamic H x W), or scales / sizes computed at run time, get
A_ax at run time from the forward op itself: the same Resize applied to the identity matrix I_n (n = the axis length
read from the input) along its second axis gives A_ax^T, column by column, exactly as onnxruntime interpolates.
Nearest needs no matrix there: the same Resize of arange(n) gives the source index of every output position and
J^T scatter-adds by it (O(n)); so does a static nearest axis whose matrix would be large (audio lengths).
"""
from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from ...core.graph import const, static_dims
from .base import LinearOp, Params, register
from .shape import index_ramp, scatter_axis, scatter_runtime
from ..vocabulary import Kind, Nonneg


_TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
_RUNTIME_ONLY = ("half_pixel_symmetric",)  # transforms whose matrix is only built at run time (by the op itself)


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


# nearest along an axis whose matrix would hold more entries than this scatter-adds by source index instead (O(n))
_MATRIX_LIMIT = 1 << 22


def nearest_indices(n_in: int, n_out: int, scale: float, transform: str, rounding: str) -> np.ndarray:
    """The input index each output position of a nearest Resize copies, along one axis."""
    return np.array([min(max(_nearest(_source(o, n_in, n_out, scale, transform), rounding), 0), n_in - 1)
                     for o in range(n_out)], dtype=np.int64)


def interpolation_matrix(n_in: int, n_out: int, scale: float, mode: str, transform: str,
                         rounding: str) -> np.ndarray:
    """A (n_out x n_in): y[o] = sum_i A[o, i] x[i] along one axis, as onnxruntime computes it."""
    a = np.zeros((n_out, n_in))
    if mode == "nearest":
        a[np.arange(n_out), nearest_indices(n_in, n_out, scale, transform, rounding)] = 1.0
        return a
    for o in range(n_out):
        xf = min(max(_source(o, n_in, n_out, scale, transform), 0.0), n_in - 1.0)
        i0 = min(int(xf), n_in - 1)
        i1 = min(i0 + 1, n_in - 1)
        w1 = xf - i0
        a[o, i0] += 1.0 - w1
        a[o, i1] += w1
    return a


@register
class Resize(LinearOp):
    """Resize with mode nearest or linear; J^T s = s x_1 A_1^T ... (one MatMul per resized axis)."""

    kind = Kind.AVGPOOL
    op_types = ("Resize",)
    nonneg = Nonneg.INPUTS
    has_params = False
    data_inputs = (0,)

    def _plan(self, node):
        """[(axis, A)] for every axis that changes, or a reason (str) why not. A is a numpy matrix (static axis,
        constant scales or sizes) or ``("scales" | "sizes", k)``: built at run time from entry k of that input."""
        attrs = node.attributes
        mode = attrs.get_string("mode", "nearest")
        transform = attrs.get_string("coordinate_transformation_mode", "half_pixel")
        if mode not in ("nearest", "linear"):
            return f"mode={mode} (only nearest and linear)"
        if transform not in _TRANSFORMS + _RUNTIME_ONLY:
            return f"coordinate_transformation_mode={transform}"
        # antialias (linear: a wider triangle filter, weights >= 0) and half_pixel_symmetric: no numpy formula
        # here, the matrix is the op's own response to I_n
        runtime = bool(attrs.get_int("antialias", 0)) or transform in _RUNTIME_ONLY
        if attrs.get_string("keep_aspect_ratio_policy", "stretch") != "stretch":
            return "keep_aspect_ratio_policy other than stretch"
        dims = static_dims(node.inputs[0])
        if dims is None:
            return "rank unknown"
        rank = len(dims)
        axes = [int(a) % rank for a in attrs.get_ints("axes", list(range(rank)))]
        ins = list(node.inputs) + [None] * (4 - len(node.inputs))
        given = [(i, v) for i, v in ((2, ins[2]), (3, ins[3])) if v is not None and not _empty(v)]
        if len(given) != 1:
            return "needs scales or sizes (exactly one of them)"
        which, v = given[0]
        kind = "scales" if which == 2 else "sizes"
        values = const(v)
        if values is None:  # computed at run time: every listed axis gets its matrix at run time
            vd = static_dims(v)
            if vd is None or len(vd) != 1 or vd[0] not in (len(axes), None):
                return f"{kind} computed at run time must be 1-D with one entry per resized axis"
            return [(ax, (kind, k)) for k, ax in enumerate(axes)]
        values = [float(x) for x in values.reshape(-1)]
        if len(values) != len(axes):
            return f"needs {kind}, one per resized axis"
        scales = values if kind == "scales" else None
        sizes = [int(x) for x in values] if kind == "sizes" else None
        plan = []
        for k, ax in enumerate(axes):
            n_in = dims[ax]
            if scales is not None and scales[k] == 1.0:
                continue
            if n_in is None or runtime:  # the length is known at run time only, or no formula here
                if not (sizes is not None and n_in is not None and sizes[k] == n_in):
                    plan.append((ax, (kind, k)))
                continue
            out = static_dims(node.outputs[0])
            n_out = out[ax] if out is not None and out[ax] is not None else (
                int(math.floor(n_in * scales[k])) if scales is not None else sizes[k])
            if sizes is not None and n_out == n_in:
                continue
            if n_out < 1:
                return f"axis {ax} resized to nothing"
            scale = scales[k] if scales is not None else n_out / n_in
            rounding = attrs.get_string("nearest_mode", "round_prefer_floor")
            if mode == "nearest" and n_in * n_out > _MATRIX_LIMIT:
                plan.append((ax, ("index", nearest_indices(n_in, n_out, scale, transform, rounding))))
                continue
            plan.append((ax, interpolation_matrix(n_in, n_out, scale, mode, transform, rounding)))
        return plan

    def check(self, node):
        plan = self._plan(node)
        return plan if isinstance(plan, str) else None

    def params(self, node):
        return Params(None, None)

    def forward(self, em, node, xs, p):
        attrs = {k: a.value for k, a in node.attributes.items()}
        return em.op("Resize", xs[0], *node.inputs[1:], tag="z", **attrs)

    def _runtime_matrix(self, em, node, ax, kind, k):
        """A_ax (out x in) at run time: the node's own Resize of I_n along its second axis is A_ax^T."""
        x = node.inputs[0]
        n = em.op("Shape", x, start=ax, end=ax + 1, tag=f"n{ax}")
        eye = em.op("EyeLike", em.op("ConstantOfShape", em.op("Concat", n, n, axis=0, tag=f"nn{ax}"),
                                     value=ir.tensor(np.zeros(1, dtype=em.np_dtype)), tag=f"zeros{ax}"),
                    tag=f"eye{ax}")
        entry = em.op("Slice", node.inputs[2 if kind == "scales" else 3], em.ints([k]), em.ints([k + 1]),
                      tag=f"{kind}{ax}")
        attrs = {key: a.value for key, a in node.attributes.items() if key != "axes"}
        if kind == "scales":
            one = em.const(np.ones(1, dtype=np.float32), tag="one", key=("resize_one",))
            scales = em.op("Concat", one, entry, axis=0, tag=f"scales{ax}")
            at = em.op("Resize", eye, None, scales, tag=f"interpT{ax}", **attrs)
        else:
            at = em.op("Resize", eye, None, None, em.op("Concat", n, entry, axis=0, tag=f"sizes{ax}"),
                       tag=f"interpT{ax}", **attrs)
        return em.op("Transpose", at, perm=[1, 0], tag=f"interp{ax}")

    def _runtime_indices(self, em, node, ax, kind, k):
        """Nearest: the source index of every output position, from the node's own Resize of arange(n) (as float32,
        exact below 2^24) along the second axis of a [1, n] tensor."""
        x = node.inputs[0]
        ramp = em.op("Cast", index_ramp(em, x, ax, tag=f"ramp{ax}"), to=ir.DataType.FLOAT.value,
                     tag=f"ramp{ax}_f")  # float32 whatever the model's type
        ramp = em.op("Unsqueeze", ramp, em.ints([0]), tag=f"ramp{ax}_2d")
        entry = em.op("Slice", node.inputs[2 if kind == "scales" else 3], em.ints([k]), em.ints([k + 1]),
                      tag=f"{kind}{ax}")
        attrs = {key: a.value for key, a in node.attributes.items() if key != "axes"}
        if kind == "scales":
            one = em.const(np.ones(1, dtype=np.float32), tag="one", key=("resize_one",))
            src = em.op("Resize", ramp, None, em.op("Concat", one, entry, axis=0, tag=f"scales{ax}"),
                        tag=f"src{ax}_f", **attrs)
        else:
            src = em.op("Resize", ramp, None, None, em.op("Concat", em.ints([1]), entry, axis=0, tag=f"sizes{ax}"),
                        tag=f"src{ax}_f", **attrs)
        return em.op("Cast", em.op("Reshape", src, em.ints([-1]), tag=f"src{ax}_flat"), to=ir.DataType.INT64.value,
                     tag=f"src{ax}")

    def transpose(self, em, node, s, p):
        rank = len(node.inputs[0].shape)
        nearest = node.attributes.get_string("mode", "nearest") == "nearest"
        for ax, a in self._plan(node):
            if isinstance(a, tuple) and a[0] == "index":  # a large static axis: scatter-add by source index
                shape = em.op("ScatterElements", em.shape_of(s, tag=f"s_shape{ax}"), em.ints([ax]),
                              em.ints([int(static_dims(node.inputs[0])[ax])]), axis=0, tag=f"in_shape{ax}")
                s = scatter_axis(em, s, {"rank": rank, "value": shape}, ax, list(a[1]), tag=f"JTs{ax}")
                continue
            if isinstance(a, tuple) and nearest:  # a dynamic axis: O(n) scatter-add, no n x n_out matrix
                s = scatter_runtime(em, s, node.inputs[0], ax, self._runtime_indices(em, node, ax, *a),
                                     tag=f"JTs{ax}")
                continue
            if isinstance(a, tuple):
                m = self._runtime_matrix(em, node, ax, *a)
            else:
                m = em.const(a, tag=f"interp{ax}", key=(node.name, "interp", ax))  # [out, in]: s_last @ A
            if ax == rank - 1:
                s = em.op("MatMul", s, m, tag=f"JTs{ax}")
                continue
            perm = list(range(rank))
            perm[ax], perm[-1] = perm[-1], perm[ax]
            t = em.op("Transpose", s, perm=perm, tag=f"s_swap{ax}")
            s = em.op("Transpose", em.op("MatMul", t, m, tag=f"JTs{ax}_last"), perm=perm, tag=f"JTs{ax}")
        return [s]


def _empty(v) -> bool:
    """An input given as a tensor with no elements (exporters write empty scales next to sizes)."""
    c = const(v)
    if c is not None:
        return c.size == 0
    return static_dims(v) == [0]
