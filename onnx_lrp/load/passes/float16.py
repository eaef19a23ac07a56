"""float16 / bfloat16 models: the whole graph computed in float32 (Casts to float16, value types, graph inputs and
outputs; initializers read as float32 where used and kept in their type, :class:`onnx_lrp.load.builder.Upcast`), so
relevance is computed in float32 with the float16-rounded weights: no overflow to Inf, no NaN from float16
underflow in the stabilisers. Inputs are read as float32 (float16 arrays are upcast exactly);
outputs are float32 and can differ from onnxruntime's float16 inference by float16 rounding of the activations.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..builder import LoadPass, Report, Upcast


_LOW_FLOATS = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


class UpcastLowPrecision(LoadPass):
    """float16 / bfloat16 everywhere -> float32 (values, Cast targets, ConstantOfShape values; initializers read as
    float32 where used)."""

    def apply(self, model: ir.Model, report: Report) -> int:
        n = upcast_low_precision(model)
        report.note(n, "upcast float16/bfloat16 to float32 ({n} value(s))")
        return n


def upcast_low_precision(model: ir.Model) -> int:
    """float16 / bfloat16 everywhere -> float32 (values, Cast targets, ConstantOfShape values; initializers read as
    float32 where used, kept in their type)."""
    graph = model.graph
    changed = 0

    def fix(v: ir.Value | None) -> None:
        nonlocal changed
        if v is None or v.type is None or not isinstance(v.type, ir.TensorType) or v.dtype not in _LOW_FLOATS:
            return
        v.type = ir.TensorType(ir.DataType.FLOAT)
        if v.const_value is not None:  # read as float32 where used, kept in its type
            v.const_value = Upcast(v.const_value)
        changed += 1

    for v in list(graph.inputs) + list(graph.outputs) + list(graph.initializers.values()):
        fix(v)
    for node in graph:
        for v in node.outputs:
            fix(v)
        if node.op_type == "Cast" and node.attributes.get("to") is not None:
            to = node.attributes["to"].value
            if int(to) in (ir.DataType.FLOAT16.value, ir.DataType.BFLOAT16.value):
                node.attributes["to"] = ir.AttrInt64("to", ir.DataType.FLOAT.value)
                changed += 1
        elif node.op_type == "ConstantOfShape" and node.attributes.get("value") is not None:
            t = node.attributes["value"].value
            if t.dtype in _LOW_FLOATS:
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(t.numpy().astype(np.float32)))
                changed += 1
    return changed
