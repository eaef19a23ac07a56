"""Fix-ups of what exporters and older IR versions write, before the checks: initializers listed among the graph
inputs (IR <= 3), negative dimensions (paddle2onnx), onnxruntime contrib ops written in the default domain."""
from __future__ import annotations

import onnx


def initializers_not_inputs(proto: onnx.ModelProto) -> onnx.ModelProto:
    """IR <= 3 exporters list every initializer among the graph inputs (an input with a default value): those are
    parameters, taken with their stored value, so the only inputs left are the ones the caller must feed."""
    inits = {t.name for t in proto.graph.initializer}
    if not any(v.name in inits for v in proto.graph.input):
        return proto
    kept = [v for v in proto.graph.input if v.name not in inits]
    if not kept:
        return proto  # every input has a default: nothing would be left to explain; the plan says so
    proto = onnx.ModelProto.FromString(proto.SerializeToString()) if proto.ByteSize() < (1 << 31) - 1 else proto
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    proto.ir_version = max(proto.ir_version, 4)  # IR >= 4 lets initializers stand alone
    return proto


def negative_dims_dynamic(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Some exporters (paddle2onnx) write a dynamic dimension as ``dim_value: -1``; make it a named dynamic one."""
    def negative(vs):
        return any(d.HasField("dim_value") and d.dim_value < 0 for v in vs if v.type.HasField("tensor_type")
                   for d in v.type.tensor_type.shape.dim)

    if not negative(list(proto.graph.input) + list(proto.graph.output) + list(proto.graph.value_info)):
        return proto
    proto = onnx.ModelProto.FromString(proto.SerializeToString()) if proto.ByteSize() < (1 << 31) - 1 else proto
    values = list(proto.graph.input) + list(proto.graph.output) + list(proto.graph.value_info)
    for v in values:
        if not v.type.HasField("tensor_type") or not v.type.tensor_type.HasField("shape"):
            continue
        for i, d in enumerate(v.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value < 0:
                d.dim_param = f"{v.name}_dim{i}"  # dim_value and dim_param are one field: this clears the -1
    return proto


# onnxruntime contrib ops that its transformer optimiser writes in the default domain, where the ONNX checker rejects
# them: moved to com.microsoft, where the ort_fused pass splits them into standard ops
DEFAULT_DOMAIN_CONTRIB = ("SimplifiedLayerNormalization",)


def contrib_to_ms_domain(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` with :data:`DEFAULT_DOMAIN_CONTRIB` nodes of the main graph in com.microsoft (or
    ``proto`` itself when it has none)."""
    if not any(n.op_type in DEFAULT_DOMAIN_CONTRIB and n.domain in ("", "ai.onnx") for n in proto.graph.node):
        return proto
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    for n in proto.graph.node:
        if n.op_type in DEFAULT_DOMAIN_CONTRIB and n.domain in ("", "ai.onnx"):
            n.domain = "com.microsoft"
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return proto
