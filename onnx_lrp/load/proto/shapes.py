"""onnx's shape inference for the loader: the outputs of ops it leaves untyped filled in, and the shapes it infers
for an onnx_ir model (read by :mod:`onnx_lrp.load.fold`)."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import shape_inference

from .. import external


_SAME_SHAPE = {"GroupNormalization"}  # function ops whose output type and shape onnx's inference leaves unknown


def fill_same_shape(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Type and shape of the outputs of ops that keep their input's (where shape inference gives none), then
    inference again so that they reach the values downstream."""
    g = proto.graph
    typed = {v.name: v for v in list(g.input) + list(g.value_info) + list(g.output)
             if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}
    added = 0
    for node in g.node:
        if node.op_type in _SAME_SHAPE and node.domain in ("", "ai.onnx") and node.input and node.input[0] in typed \
                and node.output and node.output[0] not in typed:
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(typed[node.input[0]])
            vi.name = node.output[0]
            g.value_info.append(vi)
            added += 1
    if not added:
        return proto
    try:
        return shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception:
        return proto


def inferred_dims(model: ir.Model) -> list[tuple[str, list]]:
    """(value name, dims) for the values onnx's shape inference (with data propagation) gives a shape; large
    parameters only matter by their type and shape: they are passed as typed inputs, not as data."""
    with external.weightless(model):  # no weight serialised
        proto = ir.serde.serialize_model(model)
    keep = []
    for init in proto.graph.initializer:
        if int(np.prod(init.dims)) > 4096 or init.data_location == onnx.TensorProto.EXTERNAL:
            proto.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            keep.append(init)
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(keep)
    try:
        proto = shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception:
        return []
    found = []
    for vi in list(proto.graph.value_info) + list(proto.graph.output):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        found.append((vi.name, [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                for d in vi.type.tensor_type.shape.dim]))
    return found
