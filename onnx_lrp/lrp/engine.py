"""The LRP steps the rules call, written once for every op (``onnx_lrp.rules`` decides what applies to an op and
calls them): ``linear_rule`` (every rule given as groups of terms, ``onnx_lrp.lrp.linear_step``), ``linear_grad``,
``move`` / ``move_grad``, ``gradient``, ``gradient_x_input`` / ``gradient_x_input_grad`` and ``pass_grad``.

Relevance travels in one of two forms (``Rel``): as itself, or in *gradient form* ``R = ref ⊙ g`` (LXT's
efficient mode). Rules that are exact in gradient form (LRP-0 on linear ops, moves, AttnLRP's uniform and softmax
rules) take and give ``g``: ``g_in = J^T g_out`` needs no division and no multiplication by the input, so chains
of them cost one transpose per layer. Any other rule reads ``R`` (one multiply converts). This module does not
import the rules.
"""
from __future__ import annotations

import onnx_ir as ir

from ..core.emitter import Emitter
from .layer import Layer
from .linear_step import linear_rule
from .ops.base import Rel
from .vocabulary import Category


def move(em: Emitter, layer: Layer, r_outs: list) -> list:
    """Moves (reshapes, slices, ...): the op's transpose of the relevance."""
    return layer.op.transpose(em, layer.node, r_outs)


def move_grad(em: Emitter, layer: Layer, r_outs: list) -> list:
    """A move, or the Gradient rule on a max pool, in gradient form: the same transpose of ``g`` when every output's
    relevance is in gradient form relative to that output, else of the relevance itself."""
    op, node = layer.op, layer.node
    grad = all(r is None or r.ref is o for r, o in zip(r_outs, node.outputs))
    vals = [None if r is None else (r.value if grad else r.as_relevance(em, tag="r_out")) for r in r_outs]
    if op.category is Category.MOVE:
        ins = op.transpose(em, node, vals)
    else:
        ins = op.transpose(em, node, vals[0], op.params(node))
    return [None if v is None else Rel(v, x if grad else None) for v, x in zip(ins, layer.xs)]


def gradient(em: Emitter, layer: Layer, r_out: ir.Value) -> list:
    """R_in = J^T R_out: the op's transpose (linear ops) or f'(x) R_out (element-wise functions)."""
    op = layer.op
    if op.category is Category.LINEAR:
        return op.transpose(em, layer.node, r_out, op.params(layer.node))
    return [em.mul(r_out, op.derivative(em, layer.node), tag="r_in")]


def gradient_x_input(em: Emitter, layer: Layer, r_out: ir.Value) -> list:
    """R_x = x f'(x) R_y / f(x)."""
    g = Rel(r_out).normalised(em, layer.node.outputs[0], tag="g_out")
    return [em.mul(layer.xs[0], em.mul(g, layer.op.derivative(em, layer.node), tag="g_in"), tag="r_in")]


def gradient_x_input_grad(em: Emitter, layer: Layer, r_outs: list) -> list:
    """g_x = f'(x) g_y (g_y = R_y / y)."""
    node = layer.node
    g = r_outs[0].normalised(em, node.outputs[0], tag="g_out")
    return [Rel(em.mul(g, layer.op.derivative(em, node), tag="g_in"), node.inputs[0])]


def pass_grad(em: Emitter, layer: Layer, r_outs: list) -> list:
    """R_x = R_y through an element-wise function, in gradient form where the op gives one."""
    op, node = layer.op, layer.node
    r = r_outs[0]
    if r.ref is not None and layer.keep_ref:
        return [r]  # R_x = R_y = ref * g as it is: the step below multiplies it out (as it would R_y)
    got = op.pass_grad(em, node, r.value) if r.ref is node.outputs[0] else None
    return [Rel(*got) if got is not None else Rel(r.as_relevance(em, tag="r_in"))]


def linear_grad(em: Emitter, layer: Layer, r_outs: list) -> list:
    """LRP-0 on a linear op in gradient form: g_x = J^T (R / z)."""
    op, node = layer.op, layer.node
    s = r_outs[0].normalised(em, layer.z)
    return [Rel(g, x) for g, x in zip(op.transpose(em, node, s, op.params(node)), layer.xs)]


__all__ = ["Layer", "Rel", "linear_rule", "linear_grad", "move", "move_grad", "gradient", "gradient_x_input",
           "gradient_x_input_grad", "pass_grad"]
