"""Ops that move, select or copy elements; relevance follows their transpose (always conservative for moves).

Reshape-like -> Reshape back; Transpose -> inverse permutation; Concat <-> Split; Slice/Gather -> scatter-add
into zeros; Pad -> Slice (reflect/edge/wrap: scatter-add of the copies); Expand -> sum over the broadcast axes;
Cast -> Cast back.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...core.graph import carries, const, static_dims
from .base import ShapeOp, rank_known, register
from ..vocabulary import Nonneg


@register
class ReshapeLike(ShapeOp):
    """Reshape, Flatten, Squeeze, Unsqueeze: J^T r = reshape(r, shape(x))."""

    op_types = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
    nonneg = Nonneg.FIRST

    data_inputs = (0,)

    def transpose(self, em, node, r_outs):
        return [em.reshape_like(r_outs[0], node.inputs[0], tag="r_in")]


@register
class Transpose(ShapeOp):
    op_types = ("Transpose",)
    nonneg = Nonneg.INPUTS

    data_inputs = (0,)

    def transpose(self, em, node, r_outs):
        rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
        perm = list(node.attributes.get_ints("perm", list(reversed(range(rank or 0)))))
        inv = [int(i) for i in np.argsort(perm)]
        return [em.op("Transpose", r_outs[0], perm=inv, tag="r_in")]

    def check(self, node):
        if "perm" not in node.attributes and node.inputs[0].shape is None:
            return "default perm with unknown rank"
        return None


@register
class Identity(ShapeOp):
    """Cast between float types (and Identity/Dropout left in place): relevance passes, cast back."""

    op_types = ("Cast", "Identity", "Dropout", "CastLike")

    def nonneg_output(self, node, inputs_nonneg):
        return node.op_type in ("Cast", "Identity") and all(inputs_nonneg)

    def relevance_inputs(self, node):
        if not carries(node.inputs[0]) or not carries(node.outputs[0]):
            return []  # a cast to an integer type ends the relevance path
        return [0]

    def check(self, node):
        if node.op_type == "Dropout" and len(node.inputs) > 2 and node.inputs[2] is not None:
            mode = const(node.inputs[2])
            if mode is None or bool(np.any(mode)):
                return ("training_mode is set: the model drops random activations on every run; export it in eval "
                        "mode (PyTorch: model.eval(); Flax nnx: model.eval() or Dropout(deterministic=True))")
        return None

    def transpose(self, em, node, r_outs):
        r = r_outs[0]
        if not self.relevance_inputs(node):
            return []
        if node.inputs[0].dtype != node.outputs[0].dtype:
            r = em.op("Cast", r, to=node.inputs[0].dtype.value, tag="r_in")
        return [r]


def _axis(node, rank):
    return node.attributes.get_int("axis", 0) % rank


@register
class Concat(ShapeOp):
    """J^T r = split r along the axis into the inputs' sizes (static)."""

    op_types = ("Concat",)
    nonneg = Nonneg.INPUTS

    def check(self, node):
        x = node.inputs[0]
        if any(v is None for v in node.inputs):
            return "malformed: an input is missing (empty name)"
        if x.shape is None or len(x.shape) == 0:
            return "rank unknown"
        if any(v is None or v.shape is None for v in node.inputs):
            return "rank unknown"
        if any(len(v.shape) != len(x.shape) for v in node.inputs):
            return "malformed: inputs of different ranks"
        return None

    def transpose(self, em, node, r_outs):
        rank = len(node.inputs[0].shape)
        ax = _axis(node, rank)
        sizes = [static_dims(v)[ax] for v in node.inputs]
        if sum(d is None for d in sizes) == 1:  # one size known at run time (a class token and dynamic patches)
            return [p for p, v in zip(_parts_around(em, r_outs[0], sizes, ax), node.inputs) if carries(v)]
        if any(d is None for d in sizes):  # several: cut one part after the other at sizes read at run time
            return [p for p, v in zip(_parts_in_turn(em, r_outs[0], node.inputs, sizes, ax), node.inputs)
                    if carries(v)]
        parts = em.op_multi("Split", [r_outs[0], em.ints(sizes)], len(sizes), axis=ax, tag="r_part")
        return [p for p, v in zip(parts, node.inputs) if carries(v)]


def _parts_in_turn(em, r, inputs: list, sizes: list, ax: int) -> list:
    """r cut along ``ax`` into parts as long as ``inputs`` are, one after the other: each cut reads its length
    straight from a Shape (the bounds a CUDA Slice takes on the host), so no size is added up on the host (a
    Concat of Shapes would run on the CPU in a CUDA session, after a device synchronisation)."""
    parts, rest = [], r
    for i, (v, size) in enumerate(zip(inputs, sizes)):
        if i == len(inputs) - 1:
            parts.append(rest)
            break
        n = em.ints([size]) if size is not None else em.op("Shape", v, start=ax, end=ax + 1, tag="size")
        parts.append(em.op("Slice", rest, em.ints([0]), n, em.ints([ax]), tag="r_part"))
        rest = em.op("Slice", rest, n, em.ints([2 ** 63 - 1]), em.ints([ax]), tag="r_rest")
    return parts


def _parts_around(em, r, sizes: list, ax: int) -> list:
    """r cut along ``ax`` into parts of ``sizes`` where one size is unknown: constant bounds from the start for
    the parts before it, from the end for the parts after it (no size computed at run time)."""
    unknown = sizes.index(None)
    end_all = 2 ** 63 - 1
    parts = []
    for i, size in enumerate(sizes):
        if i < unknown:
            lo = sum(sizes[:i])
            bounds = (lo, lo + size)
        elif i == unknown:
            after = sum(sizes[i + 1:])
            bounds = (sum(sizes[:i]), -after if after else end_all)
        else:
            from_end = sum(sizes[i:])
            bounds = (-from_end, -from_end + size if -from_end + size < 0 else end_all)
        parts.append(em.op("Slice", r, em.ints([bounds[0]]), em.ints([bounds[1]]), em.ints([ax]), tag="r_part"))
    return parts


@register
class Split(ShapeOp):
    """J^T (r_1, ..., r_k) = concat(r_i, zeros where an output got no relevance)."""

    op_types = ("Split",)
    nonneg = Nonneg.INPUTS

    data_inputs = (0,)

    check = rank_known

    def transpose(self, em, node, r_outs):
        ax = _axis(node, len(node.inputs[0].shape))
        parts = [r if r is not None else em.zeros_like(out, tag="r_zero") for r, out in zip(r_outs, node.outputs)]
        return [em.op("Concat", *parts, axis=ax, tag="r_in")]


def scatter_axis(em, r, x_like_shape, axis, idx, tag):
    """Scatter-add r's slices along ``axis`` into zeros of shape ``x_like_shape`` at positions ``idx``
    (``x_like_shape``: the rank and either the target shape, "value", or zeros of it, "zeros")."""
    shape = [1] * x_like_shape["rank"]
    shape[axis] = len(idx)
    ind = em.const(np.asarray(idx, dtype=np.int64).reshape(shape), tag=f"{tag}_idx", dtype=np.int64)
    ind = em.op("Expand", ind, em.shape_of(r, tag=f"{tag}_rshape"), tag=f"{tag}_idx_full")
    zeros = x_like_shape.get("zeros")
    if zeros is None:
        zeros = em.op("ConstantOfShape", x_like_shape["value"], value=ir.tensor(np.zeros(1, dtype=em.np_dtype)),
                      tag=f"{tag}_zeros")
    return em.op("ScatterElements", zeros, ind, r, axis=axis, reduction="add", tag=tag)


def zeros_along(em, r, rank: int, axis: int, k: int, n: int, tag: str):
    """Zeros shaped like ``r`` (of ``rank``) but ``n`` long along ``axis`` (where ``r`` is ``k`` long): ``r``'s zeros padded or
    cut along the axis by constants. Built from ``r``'s own shape, not from a shape computed with Shape arithmetic
    (such nodes run on the CPU in a CUDA session, each after a device synchronisation; run/placement.py)."""
    zeros = em.zeros_like(r, tag=f"{tag}_zeros_r")
    if n > k:
        pads = [0] * (2 * rank)
        pads[rank + axis] = n - k
        return em.op("Pad", zeros, em.ints(pads), tag=f"{tag}_zeros")
    if n < k:
        return em.op("Slice", zeros, em.ints([0]), em.ints([n]), em.ints([axis]), tag=f"{tag}_zeros")
    return zeros


def _keeps_all(start, end, step) -> bool:
    """A slice that keeps every element whatever the axis length (tf2onnx lists the batch axis so, with an end of
    INT_MAX or 1e9, for Keras Cropping2D and strided slices; no real axis is that long)."""
    return int(step) == 1 and int(start) in (0, -(2 ** 63)) and int(end) >= 10 ** 9


@register
class Slice(ShapeOp):
    """J^T r = r scattered back to the sliced positions, zeros elsewhere (any steps, constant bounds)."""

    op_types = ("Slice",)
    nonneg = Nonneg.FIRST

    data_inputs = (0,)

    def _plan(self, node):
        dims = static_dims(node.inputs[0])
        starts, ends = const(node.inputs[1]), const(node.inputs[2])
        rank = len(dims)
        axes = const(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else np.arange(
            len(starts))
        steps = const(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else np.ones(
            len(starts), dtype=np.int64)
        plan = []
        for st, en, ax, sp in zip(starts, ends, axes, steps):
            ax = int(ax) % rank
            n = dims[ax]
            if _keeps_all(st, en, sp):
                continue
            if n is None:  # a dynamic axis: the kept indices are found at run time (None), unless nothing is cut
                if not (int(st) == 0 and int(sp) == 1 and int(en) >= np.iinfo(np.int32).max):
                    plan.append((ax, None, (int(st), int(en), int(sp))))
                continue
            idx = list(range(n)[int(st):int(en):int(sp)])  # Python's clamping is ONNX's
            if idx != list(range(n)):
                plan.append((ax, idx, n))
        return plan

    def check(self, node):
        if any(len(node.inputs) > i and node.inputs[i] is not None and const(node.inputs[i]) is None
               for i in (1, 2, 3, 4)):
            return "starts/ends/axes/steps are not constants"
        dims = static_dims(node.inputs[0])
        if dims is None:
            return "rank unknown"
        return None

    def transpose(self, em, node, r_outs):
        r = r_outs[0]
        x = node.inputs[0]
        dims = static_dims(x)
        plan = self._plan(node)
        for j in reversed(range(len(plan))):
            ax, idx, n = plan[j]
            if idx is None:  # dynamic axis: the forward's own Slice of arange(size) gives the kept indices
                size = em.op("Shape", x, start=ax, end=ax + 1, tag="x_size")
                ramp = em.op("Range", em.scalar(0, np.int64), em.op("Squeeze", size, tag="x_size0"),
                             em.scalar(1, np.int64), tag="ramp")
                st, en, sp = n
                kept = em.op("Slice", ramp, em.ints([st]), em.ints([en]), em.ints([0]), em.ints([sp]), tag="kept")
                ind = em.op("Reshape", kept, em.ints([-1 if a == ax else 1 for a in range(len(dims))]),
                            tag="kept_axis")
                ind = em.op("Expand", ind, em.shape_of(r, tag="r_shape_k"), tag="kept_full")
                zeros = self._zeros_restored(em, node, x, plan[:j])
                r = em.op("ScatterElements", zeros, ind, r, axis=ax, reduction="add", tag="r_unslice")
                continue
            # zeros shaped like r with this axis restored to n
            zeros = zeros_along(em, r, len(dims), ax, len(idx), n, tag="r_unslice")
            r = scatter_axis(em, r, {"rank": len(dims), "zeros": zeros}, ax, idx, tag="r_unslice")
        return [r]

    def _zeros_restored(self, em, node, x, remaining: list):
        """Zeros shaped like the relevance once the axes not in ``remaining`` are restored: x's zeros sliced by the
        forward's own constant bounds along the ``remaining`` axes."""
        zeros = em.zeros_like(x, tag="x_zeros")
        for ax, idx, n in remaining:
            if idx is not None and not idx:
                st, en, sp = 0, 0, 1
            else:
                st, en, sp = n if idx is None else (idx[0], idx[-1] + (1 if idx[-1] >= idx[0] else -1),
                                                    idx[1] - idx[0] if len(idx) > 1 else 1)
            if idx is not None and en < 0:  # a reversed slice that reaches index 0
                en = -(2 ** 63)
            zeros = em.op("Slice", zeros, em.ints([st]), em.ints([en]), em.ints([ax]), em.ints([sp]),
                          tag="x_zeros_sliced")
        return zeros


class Gather(ShapeOp):
    """Gather with constant indices from an activation: J^T r = scatter-add r into zeros at the indices."""

    op_types = ("Gather",)
    nonneg = Nonneg.FIRST

    data_inputs = (0,)

    def check(self, node):
        if const(node.inputs[1]) is None:
            return "indices are not constant (an embedding lookup needs the integer-input handling)"
        dims = static_dims(node.inputs[0])
        if dims is None or dims[_axis(node, len(dims))] is None:
            return "the gathered dimension must be static"
        return None

    def transpose(self, em, node, r_outs):
        x = node.inputs[0]
        dims = static_dims(x)
        ax = _axis(node, len(dims))
        n = dims[ax]
        idx = const(node.inputs[1]).astype(np.int64)
        flat = np.where(idx < 0, idx + n, idx).reshape(-1)
        x_shape = em.shape_of(x, tag="x_shape")
        r = index_axis_as_one(em, r_outs[0], x, x_shape, ax, idx.ndim, len(flat))
        return [scatter_axis(em, r, {"rank": len(dims), "value": x_shape}, ax, list(flat), tag="r_in")]


_COPY_PADS = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}  # ONNX mode -> numpy.pad mode (same indices)


def index_axis_as_one(em, r, x, x_shape, ax: int, index_rank: int, count: int):
    """The relevance of a Gather's output (x's axis ``ax`` replaced by the index's ``index_rank`` axes) with those
    axes as one axis of ``count`` entries (-1: unknown): nothing for a 1-D index, else a Reshape that copies the
    leading axes (0) and names the trailing ones where they are static; only else a shape computed from x's (which
    onnxruntime runs on the CPU in a CUDA session)."""
    if index_rank == 1:
        return r
    tail = (static_dims(x) or [None] * len(x.shape))[ax + 1:]
    if all(d is not None for d in tail):
        return em.op("Reshape", r, em.ints([0] * ax + [count] + list(tail)), tag="r_flat_idx")
    head = em.op("Slice", x_shape, em.ints([0]), em.ints([ax]), tag="head")
    tail = em.op("Slice", x_shape, em.ints([ax + 1]), em.ints([len(x.shape)]), tag="tail")
    shape = em.op("Concat", head, em.ints([count]), tail, axis=0, tag="r_shape3")
    return em.op("Reshape", r, shape, tag="r_flat_idx")


def index_ramp(em, x, ax, tag):
    """arange(n) (int64) with n the length of ``x`` along ``ax`` at run time, as CumSum of ones: a Range would need
    n as a scalar, and onnxruntime's shape inference (data propagation) sees Gather/Squeeze of a static Shape as a
    1-D tensor and rejects it as Range's limit."""
    ones = em.op("ConstantOfShape", em.op("Shape", x, start=ax, end=ax + 1, tag=f"{tag}_n"),
                 value=ir.tensor(np.ones(1, dtype=np.int64)), tag=f"{tag}_ones")
    return em.op("Sub", em.op("CumSum", ones, em.scalar(0, np.int64), tag=f"{tag}_cumsum"), em.scalar(1, np.int64),
                 tag=tag)


def scatter_runtime(em, r, x, ax, idx, tag):
    """Scatter-add r's slices along ``ax`` into zeros shaped like ``x`` at positions ``idx`` (a 1-D int64 value
    computed at run time)."""
    rank = len(x.shape)
    ind = em.op("Reshape", idx, em.ints([-1 if a == ax else 1 for a in range(rank)]), tag=f"{tag}_idx_axis")
    ind = em.op("Expand", ind, em.shape_of(r, tag=f"{tag}_rshape"), tag=f"{tag}_idx_full")
    shape = em.op("ScatterElements", em.shape_of(r, tag=f"{tag}_rshape2"), em.ints([ax]),
                  em.op("Shape", x, start=ax, end=ax + 1, tag=f"{tag}_n"), axis=0, tag=f"{tag}_shape")
    zeros = em.op("ConstantOfShape", shape, value=ir.tensor(np.zeros(1, dtype=em.np_dtype)), tag=f"{tag}_zeros")
    return em.op("ScatterElements", zeros, ind, r, axis=ax, reduction="add", tag=tag)


@register
class Pad(ShapeOp):
    """Pad. Constant mode: J^T r = r with the padding sliced off. Modes reflect / edge / wrap copy input elements
    into the border (separably per axis, output j <- input idx(j)): J^T r scatter-adds r back along each padded axis,
    every input element receiving the relevance of all its copies (zennit: the gradient of ReflectionPad2d)."""

    op_types = ("Pad",)

    data_inputs = (0,)

    def _axes(self, node):
        rank = len(node.inputs[0].shape)
        if len(node.inputs) > 3 and node.inputs[3] is not None:
            return [int(a) % rank for a in const(node.inputs[3])]
        return list(range(rank))

    def _pads(self, node):
        """(axes, begin, end) of a constant pads input; begin and end are None when the pads are computed at run
        time (torch's pad-to-a-multiple on a dynamic size)."""
        axes = self._axes(node)
        pads = const(node.inputs[1])
        if pads is None:
            return axes, None, None
        pads = pads.astype(np.int64).reshape(-1)
        return axes, pads[:len(axes)], pads[len(axes):]

    def check(self, node):
        mode = node.attributes.get_string("mode", "constant")
        if mode != "constant" and mode not in _COPY_PADS:
            return f"mode={mode} (only constant, reflect, edge and wrap)"
        if len(node.inputs) > 3 and node.inputs[3] is not None and const(node.inputs[3]) is None:
            return "axes are not constant"
        if node.inputs[0].shape is None:
            return "rank unknown"
        pads = const(node.inputs[1])
        if pads is None:
            dims = static_dims(node.inputs[1])
            if dims is None or len(dims) != 1 or dims[0] not in (2 * len(self._axes(node)), None):
                return "pads computed at run time must be a 1-D tensor of 2 values per padded axis"
        elif mode != "constant" and np.any(pads < 0):
            return f"negative pads with mode={mode}"
        return None

    def transpose(self, em, node, r_outs):
        if node.attributes.get_string("mode", "constant") != "constant":
            return [self._unpad_copies(em, node, r_outs[0])]
        rank = len(node.inputs[0].shape)
        axes, begin, end = self._pads(node)
        r = r_outs[0]
        if begin is None:
            return [self._unpad_runtime(em, node, r, rank, axes)]
        if np.any(begin < 0) or np.any(end < 0):  # negative pads crop: their transpose pads with zeros
            neg = np.zeros(2 * rank, dtype=np.int64)  # full-rank pads: the axes input needs opset 18
            for a, b, e in zip(axes, begin, end):
                neg[a], neg[rank + a] = max(-b, 0), max(-e, 0)
            r = em.op("Pad", r, em.ints(neg), tag="r_uncrop")
            begin, end = np.maximum(begin, 0), np.maximum(end, 0)
        starts = [int(b) for b in begin]
        ends = [-int(e) if e > 0 else np.iinfo(np.int64).max for e in end]
        return [em.op("Slice", r, em.ints(starts), em.ints(ends), em.ints(axes), tag="r_in")]

    def _unpad_runtime(self, em, node, r, rank, axes):
        """Constant mode with pads known at run time: zeros where the forward cropped (negative pads), then the
        padding sliced off."""
        k = len(axes)
        pads = em.op("Cast", node.inputs[1], to=ir.DataType.INT64.value, tag="pads")
        zero = em.scalar(0, np.int64)
        neg = em.op("Max", em.op("Neg", pads, tag="pads_neg"), zero, tag="crop")
        if axes != list(range(rank)):  # full-rank pads for the uncrop (the axes input needs opset 18)
            neg = em.op("ScatterElements", em.ints([0] * (2 * rank)), em.ints(axes + [rank + a for a in axes]), neg,
                        axis=0, tag="crop_full")
        r = em.op("Pad", r, neg, tag="r_uncrop")
        pos = em.op("Max", pads, zero, tag="pad")
        starts = em.op("Slice", pos, em.ints([0]), em.ints([k]), tag="starts")
        sizes = em.op("Gather", em.shape_of(r, tag="r_shape"), em.ints(axes), axis=0, tag="sizes")
        ends = em.op("Sub", sizes, em.op("Slice", pos, em.ints([k]), em.ints([2 * k]), tag="pad_end"), tag="ends")
        return em.op("Slice", r, starts, ends, em.ints(axes), tag="r_in")

    def _unpad_copies(self, em, node, r):
        """reflect / edge / wrap: per padded axis, scatter-add r at the source index of every output position
        (numpy.pad of arange(n) for a static axis and constant pads; else the same Pad run on arange(n) at run
        time)."""
        x = node.inputs[0]
        mode = node.attributes.get_string("mode")
        dims = static_dims(x)
        axes, begin, end = self._pads(node)
        for i in reversed(range(len(axes))):
            ax = axes[i]
            if begin is not None and begin[i] == 0 and end[i] == 0:
                continue
            n = dims[ax]
            if n is not None and begin is not None:
                idx = np.pad(np.arange(n), (int(begin[i]), int(end[i])), mode=_COPY_PADS[mode])
                zeros = zeros_along(em, r, len(dims), ax, len(idx), n, tag="r_unpad")
                r = scatter_axis(em, r, {"rank": len(dims), "zeros": zeros}, ax, list(idx), tag="r_unpad")
                continue
            if begin is not None:
                be = em.ints([int(begin[i]), int(end[i])])
            else:
                pads = em.op("Cast", node.inputs[1], to=ir.DataType.INT64.value, tag="pads")
                be = em.op("Gather", pads, em.ints([i, len(axes) + i]), axis=0, tag=f"pads{ax}")
            idx = em.op("Pad", index_ramp(em, x, ax, tag="ramp"), be, mode=mode, tag="src_idx")
            r = scatter_runtime(em, r, x, ax, idx, tag="r_unpad")
        return r


@register
class Expand(ShapeOp):
    """J^T r = r summed over the broadcast axes (Expand, Tile-free broadcasting)."""

    op_types = ("Expand",)
    nonneg = Nonneg.FIRST

    data_inputs = (0,)

    def check(self, node):
        if static_dims(node.inputs[0]) is None or static_dims(node.outputs[0]) is None:
            return "ranks unknown"
        return None

    def transpose(self, em, node, r_outs):
        return [em.unbroadcast(r_outs[0], static_dims(node.outputs[0]), node.inputs[0], tag="r_in")]


@register
class ReverseSequence(ShapeOp):
    """Reverses the first ``sequence_lens[b]`` steps of each batch row (tf2onnx's backward LSTM direction): a
    permutation that is its own inverse, so J^T r = ReverseSequence(r) with the same lengths."""

    op_types = ("ReverseSequence",)

    data_inputs = (0,)

    def transpose(self, em, node, r_outs):
        return [em.op("ReverseSequence", r_outs[0], node.inputs[1], tag="r_in",
                      batch_axis=node.attributes.get_int("batch_axis", 1),
                      time_axis=node.attributes.get_int("time_axis", 0))]


@register
class DepthSpace(ShapeOp):
    """DepthToSpace (DCR, CRD) and SpaceToDepth: a reshape, a transpose and a reshape; J^T r undoes them
    (reshape r to the transposed shape, inverse permutation, reshape to x)."""

    op_types = ("DepthToSpace", "SpaceToDepth")
    nonneg = Nonneg.INPUTS

    data_inputs = (0,)

    def _steps(self, node):
        """(shape after the first reshape, permutation) with N left as 0 (copied)."""
        n, c, h, w = static_dims(node.inputs[0])
        b = node.attributes.get_int("blocksize", 1)
        if node.op_type == "SpaceToDepth":
            return [0, c, h // b, b, w // b, b], [0, 3, 5, 1, 2, 4]
        if node.attributes.get_string("mode", "DCR") == "CRD":
            return [0, c // (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3]
        return [0, b, b, c // (b * b), h, w], [0, 3, 4, 1, 5, 2]

    def check(self, node):
        dims = static_dims(node.inputs[0])
        if dims is None or len(dims) != 4 or any(d is None for d in dims[1:]):
            return "needs a 4-D input with static channels and spatial dimensions"
        return None

    def transpose(self, em, node, r_outs):
        split, perm = self._steps(node)
        moved = [split[p] for p in perm]  # the shape after the transpose
        r = em.op("Reshape", r_outs[0], em.ints(moved), tag="r_split")
        r = em.op("Transpose", r, perm=[int(i) for i in np.argsort(perm)], tag="r_unperm")
        return [em.reshape_like(r, node.inputs[0], tag="r_in")]
