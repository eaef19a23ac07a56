"""Opsets: the range onnx-lrp reads (:data:`MIN_OPSET` .. :data:`MAX_OPSET`), newer opsets relabelled where their ops
mean the same, ops defined by an ONNX function expanded, older opsets lifted to MIN_OPSET (onnx's version
converter)."""
from __future__ import annotations

import onnx
import onnx.inliner
from onnx import shape_inference

from ...core.errors import ModelError, UnsupportedError
from .graphs import all_nodes


MIN_OPSET = 17
MAX_OPSET = 23
# the highest opset the installed onnx knows: MAX_OPSET+1 .. KNOWN_OPSET are read as MAX_OPSET where every op means
# the same there (``relabel_newer_opset``); a higher one does not exist yet and is refused
KNOWN_OPSET = onnx.defs.onnx_opset_version()


def opset_of(proto: onnx.ModelProto) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0


def legacy_prelu_slopes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Opset <= 6 PRelu took a 1-D slope of C values per channel (axis 1, legacy broadcasting); from opset 7 it
    broadcasts from the last axis, so the converted model would apply it along W (or fail). Such slopes become
    [C, 1, ...] (the pytorch-converted PReLU models of the onnx wheel)."""
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in list(proto.graph.input) + list(proto.graph.value_info)
             if v.type.tensor_type.HasField("shape")}
    inits = {t.name: t for t in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type != "PRelu" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        slope, rank = inits.get(node.input[1]), ranks.get(node.input[0])
        if slope is None or len(slope.dims) != 1 or slope.dims[0] <= 1 or rank is None or rank < 3:
            continue
        arr = onnx.numpy_helper.to_array(slope)
        per_channel = onnx.numpy_helper.from_array(arr.reshape((-1,) + (1,) * (rank - 2)),
                                                   name=slope.name + "/per_channel")
        if per_channel.name not in inits:
            proto.graph.initializer.append(per_channel)
            inits[per_channel.name] = per_channel
        node.input[1] = per_channel.name
    return proto


# ops defined by an ONNX function and without a handler of their own: replaced by their function body (primitive
# ops with handlers) before anything else; Attention is how exporters write scaled dot-product attention from
# opset 23 on
EXPAND = ("Attention", "RotaryEmbedding", "Swish")


_EXPAND_DOMAIN = "lrp.expand"


def expand_function_ops(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """The nodes of the main graph whose op is in EXPAND, inlined as the function ONNX defines them by (for the
    node's attributes and input types); nodes whose input types are unknown stay (and are refused later)."""
    if not any(n.op_type in EXPAND and n.domain in ("", "ai.onnx") for n in proto.graph.node):
        return proto
    try:
        inferred = shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception:
        return proto
    g = inferred.graph
    types = {v.name: v.type for v in list(g.input) + list(g.value_info) + list(g.output)}
    for t in g.initializer:
        types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
    functions = []
    for k, node in enumerate(g.node):
        if node.op_type not in EXPAND or node.domain not in ("", "ai.onnx") or any(
                i and i not in types for i in node.input):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, "")
            if schema.has_context_dependent_function:
                body = onnx.FunctionProto.FromString(schema.get_context_dependent_function_with_opset_version(
                    opset, node.SerializeToString(),
                    [types[i].SerializeToString() if i else onnx.TypeProto().SerializeToString() for i in node.input]))
            elif schema.has_function:
                body = schema.get_function_with_opset_version(opset)
                body = onnx.FunctionProto.FromString(body) if isinstance(body, bytes) else body
            else:
                continue
        except Exception:
            continue
        body.domain, body.name = _EXPAND_DOMAIN, f"{node.op_type}_{k}"
        node.domain, node.op_type = _EXPAND_DOMAIN, body.name
        functions.append(body)
    if not functions:
        return proto
    inferred.functions.extend(functions)
    inferred.opset_import.append(onnx.helper.make_opsetid(_EXPAND_DOMAIN, 1))
    try:
        out = onnx.inliner.inline_local_functions(inferred)
    except Exception:
        return proto
    for i in [i for i, imp in enumerate(out.opset_import) if imp.domain == _EXPAND_DOMAIN][::-1]:
        del out.opset_import[i]
    return out


def _signature(schema):
    return ([(i.name, i.option, i.type_str) for i in schema.inputs],
            [(o.name, o.option, o.type_str) for o in schema.outputs])


def newer_op_reason(node: onnx.NodeProto, opset: int) -> str | None:
    """Why a default-domain node of a model at ``opset`` > MAX_OPSET cannot be read as the same op at MAX_OPSET,
    or None. It can when its schema is unchanged since an opset <= MAX_OPSET, or when the newer version only
    widened the type constraints and added attributes (the node must leave them at their defaults); the tensor
    types are checked against the older schema afterwards (``relabel_newer_opset``)."""
    try:
        new = onnx.defs.get_schema(node.op_type, opset, "")
    except Exception:
        return f"not an operator of opset {opset}"
    if new.since_version <= MAX_OPSET:
        return None
    try:
        old = onnx.defs.get_schema(node.op_type, MAX_OPSET, "")
    except Exception:
        return f"new in opset {new.since_version} (onnx-lrp knows opsets up to {MAX_OPSET})"
    changed = f"changed in opset {new.since_version} (onnx-lrp knows opsets up to {MAX_OPSET})"
    if _signature(new) != _signature(old):
        return f"{changed}: its inputs or outputs differ"
    for key, attr in old.attributes.items():
        other = new.attributes.get(key)
        if other is None or other.type != attr.type or other.default_value != attr.default_value:
            return f"{changed}: attribute {key} differs"
    added = [a.name for a in node.attribute if a.name not in old.attributes]
    if added:
        return f"{changed}: sets the newer attribute(s) {', '.join(added)}"
    old_types = {t.type_param_str: set(t.allowed_type_strs) for t in old.type_constraints}
    new_types = {t.type_param_str: set(t.allowed_type_strs) for t in new.type_constraints}
    if any(k not in new_types or not v <= new_types[k] for k, v in old_types.items()):
        return f"{changed}: its type constraints differ"
    return None


def relabel_newer_opset(proto: onnx.ModelProto, opset: int, name: str = "model") -> onnx.ModelProto:
    """A model importing an opset above MAX_OPSET, relabelled to MAX_OPSET when every default-domain op means the
    same there (``newer_op_reason``); else UnsupportedError listing every op that does not (one row per op)."""
    bad: dict[str, dict] = {}
    for node in all_nodes(proto):
        if node.domain not in ("", "ai.onnx") or node.op_type in bad:
            continue
        why = newer_op_reason(node, opset)
        if why:
            bad[node.op_type] = dict(name=node.name or node.output[0], op_type=node.op_type, domain="",
                                     opset=opset, reason=why)
    if bad:
        raise UnsupportedError(list(bad.values()), f"{name} imports opset {opset}; re-export it with opset "
                                                   f"{MAX_OPSET} or lower")
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    for imports in [proto.opset_import] + [f.opset_import for f in proto.functions]:
        for imp in imports:
            if imp.domain in ("", "ai.onnx"):
                imp.version = min(imp.version, MAX_OPSET)
    try:  # a tensor type the newer version added (float8e8m0, int2, ...) does not fit the older schema
        shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "unsupported type" in msg:
            raise ModelError(f"{name} imports opset {opset} and uses a tensor type onnx-lrp's opset {MAX_OPSET} "
                             f"does not know ({msg}); re-export it with opset {MAX_OPSET} or lower") from None
    return proto
