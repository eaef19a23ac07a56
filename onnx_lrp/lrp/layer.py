"""A node as a rule step sees it (``Layer``): its relevance inputs, its output after a folded bias, what the
rewriter knows about the relevance around it, and its modified inputs (x+, x-, |x|, ones, bounds), emitted once."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core.emitter import Emitter
from ..core.graph import static_dims
from .vocabulary import XMod


class Layer:
    """A node as the rewriter sees it: its relevance inputs ``xs``, its output ``z`` (after a folded bias Add)."""

    def __init__(self, node: ir.Node, op, xs: list[ir.Value], z: ir.Value, nonneg: list[bool]):
        self.node, self.op, self.xs, self.z, self.nonneg = node, op, xs, z, nonneg
        self.relu_out: ir.Value | None = None  # set when z feeds only a Relu whose relevance vanishes at zeros
        self.zero_at_zero = False  # the relevance of z is known to be zero wherever z is
        # inputs whose relevance a linear rule may give in gradient form, Rel(J^T s, x): x feeds several layers, whose
        # parts are then summed before one multiply by x (the rewriter sets it where a step that reads relevance,
        # not its gradient form, converts the sum)
        self.grad_out: frozenset = frozenset()
        self.keep_ref = False  # an activation under Pass: its input's relevance is converted below (the rewriter)
        self._mods: dict = {}

    def x_mod(self, em: Emitter, i: int, how: str, value=None) -> ir.Value | None:
        """The modified input (None means 'ones', handled by the caller)."""
        x = self.xs[i]
        if how == XMod.IDENTITY or (how == XMod.POSITIVE and self.nonneg[i]):
            return x
        key = (i, how, id(value))
        if key not in self._mods:
            if how == XMod.POSITIVE:
                self._mods[key] = em.positive(x, tag=f"x{i}+")
            elif how == XMod.NEGATIVE:
                self._mods[key] = em.negative(x, tag=f"x{i}-")
            elif how == XMod.ABS:
                self._mods[key] = em.op("Abs", x, tag=f"x{i}_abs")
            elif how == XMod.ONES:
                dims = static_dims(x)
                if dims is not None and all(d is not None for d in dims[1:]):
                    self._mods[key] = em.const(np.ones([1] + dims[1:]), tag=f"x{i}_ones")
                else:
                    self._mods[key] = em.op("ConstantOfShape", em.shape_of(x), value=ir.tensor(
                        np.ones(1, dtype=em.np_dtype)), tag=f"x{i}_ones")
            elif how == XMod.CONSTANT:
                dims = static_dims(x)
                arr = np.asarray(value, dtype=em.np_dtype)
                if dims is None:
                    raise ValueError(f"node {self.node.name}: a constant-input rule needs the input's rank")
                dynamic = any(d is None for d in dims[1:])  # e.g. a dynamic time axis: expanded at run time
                target = tuple(1 if d is None else d for d in dims[1:])
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
                if dynamic:
                    self._mods[key] = em.op("Expand", self._mods[key], em.shape_of(x), tag=f"x{i}_bound_full")
            else:
                raise ValueError(f"unknown input modifier {how!r}")
        return self._mods[key]


__all__ = ["Layer"]
