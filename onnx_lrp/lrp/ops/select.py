"""Selections: ops whose output picks elements of an activation (by indices, by rank or by being the largest).

Relevance follows the transpose, as for the moves of ``shape.py``, with the op's own (run-time) indices:

- GatherElements / GatherND: J^T r = scatter-add r into zeros at the gathered positions;
- ScatterElements / ScatterND (reduction none or add): the data keeps r where it was not overwritten (all of r for
  add), the updates get r gathered back from where they were written;
- TopK: the values output routes r back to the picked positions (like a max pool); the indices carry nothing;
- Max / Min of several activations: winner takes all, as max pooling (ties split evenly); of one activation and
  constants (``Max(x, 0)`` is a Relu, ``Min(x, 6)`` a clip): an element-wise activation (Pass; Gradient = 1 where
  x is the extremum).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...core.graph import carries, const, is_param, static_dims
from .base import ActivationOp, LinearOp, Op, Params, ShapeOp, out_dims, rank_known, register
from ..vocabulary import Kind, Nonneg


def _indices_wrapped(em, idx: ir.Value, sizes: ir.Value, tag: str) -> ir.Value:
    """Negative indices made positive (ScatterND wants them in [0, size))."""
    return em.op("Where", em.op("Less", idx, em.scalar(0, np.int64), tag=f"{tag}_neg"),
                 em.op("Add", idx, sizes, tag=f"{tag}_plus"), idx, tag=tag)


@register
class GatherElements(ShapeOp):
    """out[..i..] = x[..idx[..i..]..] along ``axis``: J^T r = ScatterElements(zeros(x), idx, r, add)."""

    op_types = ("GatherElements",)
    data_inputs = (0,)

    check = rank_known

    def transpose(self, em, node, r_outs):
        x, idx = node.inputs[0], node.inputs[1]
        if not carries(x):  # a lookup in a constant table: the path ends
            return []
        axis = node.attributes.get_int("axis", 0) % len(x.shape)
        zeros = em.zeros_like(x, tag="zeros")
        return [em.op("ScatterElements", zeros, idx, r_outs[0], axis=axis, reduction="add", tag="r_in")]


@register
class GatherND(ShapeOp):
    """out = x[idx[..., :]] (batch_dims 0): J^T r = ScatterND(zeros(x), idx, r, add)."""

    op_types = ("GatherND",)
    data_inputs = (0,)

    def check(self, node):
        if node.attributes.get_int("batch_dims", 0) != 0:
            return "batch_dims > 0 (ScatterND has none); export without batched indices"
        dims = static_dims(node.inputs[1])
        if dims is None or dims[-1] is None:
            return "the last dimension of the indices must be static"
        return None

    def transpose(self, em, node, r_outs):
        x, idx = node.inputs[0], node.inputs[1]
        if not carries(x):
            return []
        k = static_dims(idx)[-1]
        sizes = em.op("Slice", em.shape_of(x, tag="x_shape"), em.ints([0]), em.ints([k]), tag="sizes")
        idx = _indices_wrapped(em, idx, sizes, "idx")
        return [em.op("ScatterND", em.zeros_like(x, tag="zeros"), idx, r_outs[0], reduction="add", tag="r_in")]


class _Scatter(ShapeOp):
    """z = x with ``updates`` written (none) or added (add) at the indices."""

    data_inputs = (0, 2)

    def check(self, node):
        red = node.attributes.get_string("reduction", "none")
        if red not in ("none", "add"):
            return f"reduction={red} (only none and add)"
        if node.inputs[0].shape is None:
            return "rank unknown"
        return None

    def transpose(self, em, node, r_outs):
        r = r_outs[0]
        x, idx, upd = node.inputs
        red = node.attributes.get_string("reduction", "none")
        out = []
        if carries(x):  # overwritten positions lose their relevance to the updates
            out.append(r if red == "add" else self.write(em, node, r, idx, em.zeros_like(upd, tag="upd_zeros")))
        if carries(upd):
            out.append(self.read(em, node, r, idx))
        return out


@register
class ScatterElements(_Scatter):
    op_types = ("ScatterElements",)

    def _axis(self, node):
        return node.attributes.get_int("axis", 0) % len(node.inputs[0].shape)

    def write(self, em, node, r, idx, values):
        return em.op("ScatterElements", r, idx, values, axis=self._axis(node), tag="r_kept")

    def read(self, em, node, r, idx):
        return em.op("GatherElements", r, idx, axis=self._axis(node), tag="r_upd")


@register
class ScatterND(_Scatter):
    op_types = ("ScatterND",)

    def check(self, node):
        dims = static_dims(node.inputs[1])
        if dims is None or dims[-1] is None:
            return "the last dimension of the indices must be static"
        return super().check(node)

    def _idx(self, em, node, idx):
        k = static_dims(idx)[-1]
        sizes = em.op("Slice", em.shape_of(node.inputs[0], tag="x_shape"), em.ints([0]), em.ints([k]), tag="sizes")
        return _indices_wrapped(em, idx, sizes, "idx")

    def write(self, em, node, r, idx, values):
        return em.op("ScatterND", r, self._idx(em, node, idx), values, tag="r_kept")

    def read(self, em, node, r, idx):
        return em.op("GatherND", r, self._idx(em, node, idx), tag="r_upd")


@register
class TopK(ShapeOp):
    """values = the k largest (smallest) along ``axis``, indices = where: J^T r = scatter-add r to those positions
    (like a max pool); the integer indices output carries no relevance."""

    op_types = ("TopK",)
    nonneg = Nonneg.INPUTS
    data_inputs = (0,)

    check = rank_known

    def transpose(self, em, node, r_outs):
        x = node.inputs[0]
        if not carries(x):
            return []
        axis = node.attributes.get_int("axis", -1) % len(x.shape)
        r = r_outs[0] if r_outs[0] is not None else em.zeros_like(node.outputs[0], tag="r_values_zero")
        return [em.op("ScatterElements", em.zeros_like(x, tag="zeros"), node.outputs[1], r, axis=axis,
                      reduction="add", tag="r_in")]


# ---------------------------------------------------------------------------------------------- Max / Min
class ExtremumOf(LinearOp):
    """Max / Min of several activations (and constants), winner takes all as in max pooling: each input gets the
    output's relevance where it attains the extremum, split evenly between ties; constants that win keep theirs."""

    kind = Kind.MAXPOOL
    has_params = False

    def __init__(self, op_type):
        self.op_types = (op_type,)

    def check(self, node):
        if any(v is not None and v.shape is None for v in node.inputs) or out_dims(node) is None:
            return "ranks unknown"
        return None

    def params(self, node):
        return Params(None, None)

    def forward(self, em, node, xs, p):
        idx = self.relevance_inputs(node)
        inputs = [xs[idx.index(j)] if j in idx else v for j, v in enumerate(node.inputs)]
        return em.op(node.op_type, *inputs, tag="z")

    def transpose(self, em, node, s, p):
        z = node.outputs[0]
        hits = {j: em.op("Cast", em.op("Equal", v, z, tag=f"is_ext{j}"), to=em.dtype.value, tag=f"hit{j}")
                for j, v in enumerate(node.inputs) if v is not None}
        ties = em.sum(list(hits.values()), tag="ties") if len(hits) > 1 else next(iter(hits.values()))
        share = em.div(s, ties, tag="s_per_tie")
        return [em.unbroadcast(em.mul(share, hits[j], tag=f"s{j}"), out_dims(node), node.inputs[j], tag=f"JTs{j}")
                for j in self.relevance_inputs(node)]


class ExtremumWithConstant(ActivationOp):
    """Max / Min of one activation and constants (same shape as the output): an element-wise activation; Pass
    passes the relevance as for Relu / Clip, the Gradient rule multiplies by 1 where x is the extremum."""

    def __init__(self, op_type):
        self.op_types = (op_type,)

    @property
    def data_inputs(self):
        return None

    def _x(self, node):
        return next(v for v in node.inputs if carries(v))

    def relevance_values(self, node):
        return [self._x(node)]

    def _wins(self, em, node):
        x = self._x(node)
        return em.op("Equal", x, node.outputs[0], tag="x_wins")

    def derivative(self, em, node):
        return em.op("Cast", self._wins(em, node), to=em.dtype.value, tag="dfdx")

    def pass_grad(self, em, node, g):
        consts = [const(v) for v in node.inputs if v is not None and is_param(v)]
        if not consts or any(np.any(c != 0) for c in consts):
            return None
        # Max(x, 0) = x [x > 0], Min(x, 0) = x [x < 0]: f(x) / x is the indicator
        x = self._x(node)
        cmp = "Greater" if node.op_type == "Max" else "Less"
        return em.op("Where", em.op(cmp, x, em.scalar(0.0), tag="x_kept"), g, em.scalar(0.0), tag="g_in"), x


class Extremum(Op):
    """Max / Min: one activation against constants (an activation) or several activations (winner takes all)."""

    def __init__(self, op_type):
        self.op_types = (op_type,)
        self.of_many = ExtremumOf(op_type)
        self.with_const = ExtremumWithConstant(op_type)
        self.kind = Kind.MAXPOOL
        self.nonneg = Nonneg.INPUTS

    def resolve(self, node):
        acts = [v for v in node.inputs if carries(v)]
        others_const = all(v is None or is_param(v) or v is acts[0] for v in node.inputs) if acts else False
        if len(acts) == 1 and others_const and static_dims(acts[0]) is not None and \
                static_dims(acts[0]) == out_dims(node) and None not in static_dims(acts[0]):
            return self.with_const
        return self.of_many



for _t in ("Max", "Min"):
    register(Extremum(_t))
