"""What the canonizers read off values: one dimension a 1-element int64 value holds, equal dimensions and shapes
(symbols compared by name), a constant float scalar, a Clip's constant bounds."""
from __future__ import annotations

import math

import onnx_ir as ir

from ...builder import const


def dim_of(v: ir.Value | None):
    """The one dimension (an int or a symbol) a 1-element int64 value holds: a constant, ``Shape(x, start, end)``
    of one axis, or ``Gather(Shape(x), [i])`` (jax2onnx writes a dynamic batch size so); None otherwise."""
    if v is None:
        return None
    if v.const_value is not None:
        arr = v.const_value.numpy()
        return int(arr.reshape(-1)[0]) if arr.size == 1 else None
    p = v.producer()
    if p is None:
        return None
    if p.op_type == "Shape" and p.inputs[0] is not None and p.inputs[0].shape is not None:
        dims = list(p.inputs[0].shape)
        picked = dims[p.attributes.get_int("start", 0):p.attributes.get_int("end", len(dims))]
        return picked[0] if len(picked) == 1 else None
    if (p.op_type == "Gather" and p.inputs[1] is not None and p.inputs[1].const_value is not None
            and p.inputs[0].producer() is not None and p.inputs[0].producer().op_type == "Shape"
            and p.attributes.get_int("axis", 0) == 0):
        shape = p.inputs[0].producer()
        x, idx = shape.inputs[0], p.inputs[1].const_value.numpy().reshape(-1)
        if x is None or x.shape is None or idx.size != 1 or shape.attributes.get_int("start", 0) != 0 \
                or "end" in shape.attributes:
            return None
        dims = list(x.shape)
        return dims[int(idx[0])] if -len(dims) <= int(idx[0]) < len(dims) else None
    return None


def same_dim(a, b) -> bool:
    """Equal dimensions: the same int, or the same named symbol (ONNX: one name, one length)."""
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    return a is not None and b is not None and a.value is not None and a.value == b.value


def same_shape(a: ir.Value | None, b: ir.Value | None) -> bool:
    return (a is not None and b is not None and a.shape is not None and b.shape is not None
            and len(a.shape) == len(b.shape) and all(same_dim(x, y) for x, y in zip(a.shape, b.shape)))


def scalar(v: ir.Value | None) -> float | None:
    k = const(v)
    return float(k.reshape(())) if k is not None and k.size == 1 and k.dtype.kind == "f" else None


def clip_bounds(node: ir.Node) -> tuple[float, float] | None:
    """(low, high) of a Clip with constant bounds (opset >= 11 inputs or opset 6 attributes), else None."""
    if node.op_type != "Clip" or node.domain not in ("", "ai.onnx"):
        return None
    if len(node.inputs) > 1:
        lo = scalar(node.inputs[1]) if node.inputs[1] is not None else -math.inf
        hi = scalar(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else math.inf
        return None if lo is None or hi is None else (lo, hi)
    return node.attributes.get_float("min", -math.inf), node.attributes.get_float("max", math.inf)
