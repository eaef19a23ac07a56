"""What every split of a fused op uses: its refusals (:class:`Refuse`, :class:`RefuseAs`, :class:`Unknown`), optional
inputs and known ranks, int64 constants, typed new values, and position ranges computed from shapes alone."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir


INT64 = ir.DataType.INT64


class Refuse(Exception):
    pass


class RefuseAs(Refuse):
    """Refused with this whole message (not prefixed by the op type)."""


class Unknown(Refuse):
    """A rank the split needs is not known yet (shapes are inferred again and the node retried)."""


def used(v: ir.Value | None) -> bool:
    return v is not None and (bool(list(v.uses())) or v.is_graph_output())


def opt(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if len(node.inputs) > i else None


def rank(v: ir.Value) -> int:
    if v.shape is None:
        raise Unknown(f"input {v.name} of unknown rank")
    return len(v.shape)


def fdtype(v: ir.Value) -> np.dtype:
    return v.dtype.numpy() if v.dtype is not None and v.dtype.is_floating_point() else np.dtype(np.float32)


def i64(b, values, tag="ints") -> ir.Value:
    return b.const(np.asarray(values, np.int64), tag)


def typed(v: ir.Value, dtype: ir.DataType, shape=None) -> ir.Value:
    v.type = ir.TensorType(dtype)
    if shape is not None:
        v.shape = ir.Shape(shape)
    return v


def positions(b, x: ir.Value, axis: int, tag: str) -> ir.Value:
    """0, 1, ..., x.shape[axis]-1 as int64 (from the shape only)."""
    n = typed(b.op("Shape", [x], tag=f"{tag}_len", start=axis, end=axis + 1), INT64, [1])
    n0 = typed(b.op("Squeeze", [n, i64(b, [0], "axis0")], tag=f"{tag}_n"), INT64, [])
    return typed(b.op("Range", [b.const(np.array(0, np.int64), "zero"), n0, b.const(np.array(1, np.int64), "one")],
                      tag=tag), INT64)
