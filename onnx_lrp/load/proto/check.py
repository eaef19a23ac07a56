"""The checks a ``ModelProto`` passes before it is loaded: text fields are valid UTF-8, every initializer holds as
many values as its dimensions say, the data types and input shapes fit the op schemas (strict shape inference);
``light_proto`` is the model the ONNX checker reads (weights by type and shape only)."""
from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import shape_inference

from ...core.errors import InputError, ModelError
from .. import external


def check(model_bytes: bytes) -> None:
    """Run onnx.checker on serialized bytes (used by tests and ``rewrite``)."""
    onnx.checker.check_model(onnx.load_model_from_string(model_bytes), full_check=True)


def check_text(proto: onnx.ModelProto, name: str) -> None:
    """Names, op types and domains must be valid UTF-8 (protobuf hands invalid ones over as bytes)."""
    bad = _bad_text(proto, "model")
    if bad is not None:
        raise ModelError(f"{name}: {bad} is not valid UTF-8 text; the file is corrupt (re-export it)")
    for init in proto.graph.initializer:
        _check_tensor(init, name)


def _bad_text(msg, where: str) -> str | None:
    """The first string field (names, op types, domains, doc strings ...) that protobuf handed over as bytes."""
    for fd, value in msg.ListFields():
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
        if fd.type == fd.TYPE_STRING:
            if any(isinstance(v, bytes) for v in (value if repeated else [value])):
                return f"{where}.{fd.name}"
        elif fd.type == fd.TYPE_MESSAGE:
            for k, item in enumerate(value if repeated else [value]):
                label = getattr(item, "name", "") if fd.name in ("node", "input", "output", "initializer") else ""
                index = f"[{label if isinstance(label, str) and label else k}]" if repeated else ""
                found = _bad_text(item, f"{where}.{fd.name}{index}")
                if found:
                    return found
    return None


def _check_tensor(t: onnx.TensorProto, name: str) -> None:
    """The data of an initializer must hold exactly prod(dims) values (else every later read of it fails)."""
    if t.data_location == onnx.TensorProto.EXTERNAL or t.data_type in (onnx.TensorProto.STRING,
                                                                       onnx.TensorProto.UNDEFINED):
        return
    count = int(np.prod(list(t.dims), dtype=np.float64))
    if any(d < 0 for d in t.dims):
        raise ModelError(f"{name}: initializer {t.name!r} has a negative dimension {list(t.dims)}; the file is corrupt")
    try:
        np_dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
    except Exception:  # noqa: BLE001 - an unknown or sub-byte type: left to onnxruntime
        return
    if np_dtype.itemsize == 0 or t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return
    if t.HasField("raw_data"):
        have = len(t.raw_data) / np_dtype.itemsize
    else:
        fields = [f for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data") if
                  len(getattr(t, f))]
        have = len(getattr(t, fields[0])) if fields else 0
        if np_dtype.kind == "c":
            have /= 2
    if have != count:
        raise ModelError(f"{name}: initializer {t.name!r} holds {have:g} values for dimensions {list(t.dims)} "
                         f"({count}); the file is corrupt (re-export it)")


def light_proto(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with its large or external initializers as typed graph inputs (no data copied): what the ONNX
    checker and type checks read; the model itself is unchanged."""
    light = onnx.ModelProto()
    for f in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(light, f, getattr(proto, f))
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    g, src = light.graph, proto.graph
    g.name = src.name
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    names = {v.name for v in src.input}
    for init in src.initializer:
        small = int(np.prod(init.dims, dtype=np.float64)) <= external.LIGHT
        if init.data_location != onnx.TensorProto.EXTERNAL and small:
            g.initializer.append(init)
        elif init.name not in names:
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return light


def check_types(proto: onnx.ModelProto, name: str) -> None:
    """Refuse a standard op given a data type its schema does not allow (e.g. a Conv on int32: an input whose type
    was changed), ops whose input shapes contradict each other (a declared input size the rest of the graph was
    not exported for) and declared input shapes the graph cannot take (:func:`_refuse_declared_misfit`). Strict
    inference lists the error of each node; ops of other domains have no schema and pass."""
    light = _typed_light(proto)
    try:
        shape_inference.infer_shapes(light, check_type=True, strict_mode=True)
    except Exception as exc:  # onnx.shape_inference.InferenceError
        text = " ".join(str(exc).split())
        if "type" in text.lower() and ("typestr" in text or "Type Error" in text or "unsupported type" in text
                                       or "inconsistent type" in text or "type mismatch" in text.lower()):
            raise ModelError(f"{name}: {text[:300]}; the data types do not fit the ops (re-export the model)") \
                from None
        # a complaint about a node's input shapes; not one about its attributes (the op handlers name those
        # "malformed" more precisely), nor one from inside a function body's inference (onnx's own expansions,
        # e.g. MeanVarianceNormalization's, draw some on valid models)
        conflict = next((m for m in SHAPE_CONFLICT.finditer(str(exc))
                         if "Inference error" not in m.group(3) and "ttribute" not in m.group(3)), None)
        if conflict:
            op, node, why = conflict.groups()
            raise ModelError(f"{name}: the shapes do not fit at node {node} ({op}: {why.strip()}), from the "
                             f"declared input shape(s) {_declared(proto)}; give the shapes the model was exported "
                             "for (--input-shape NAME=DxD..., input_shapes=) or fix the export") from None
        _refuse_declared_misfit(light, exc, proto, name)


def _typed_light(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The main graph for strict inference: large initializers as typed inputs (no data copied), every node named
    (as the loader will name it), the outputs' declared shapes dropped."""
    light = onnx.ModelProto()
    light.ir_version = proto.ir_version
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    g = light.graph
    g.node.extend(proto.graph.node)
    for i, node in enumerate(g.node):  # so that the error names every node it lists (as the loader will)
        node.name = node.name or f"{node.op_type}_{i}"
    g.input.extend(proto.graph.input)
    # the declared shapes of the graph's outputs are annotations (onnxruntime only warns when they are wrong, and
    # some exporters write wrong ones: ddddocr's CRNN declares 1 x ? for a T x 1 x 8210 output): their types are
    # kept, their shapes are not held against the graph
    g.output.extend(_types_only(proto.graph.output))
    g.value_info.extend(proto.graph.value_info)
    names = {v.name for v in proto.graph.input}
    for init in proto.graph.initializer:
        if int(np.prod(init.dims, dtype=np.float64)) <= 4096:
            g.initializer.append(init)
        elif init.name not in names:
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return light


def _refuse_declared_misfit(light: onnx.ModelProto, exc: Exception, proto: onnx.ModelProto, name: str) -> None:
    """InputError when the first node strict inference fails on is a standard op that passes once the graph inputs
    are declared with other sizes (their rank kept, sizes unknown) or one axis fewer or more: the declared shapes
    are what the graph cannot take (a rank-3 image for a 2-D Conv). A node that fails whatever the inputs' shapes
    (a malformed attribute: the op handlers name it) or of another domain is left alone."""
    first = INFERENCE_ERROR.search(str(exc))
    if first is None:
        return
    op, node_name, why = first.group(1), first.group(2), " ".join(first.group(4).split())
    node = next((n for n in light.graph.node if n.name == node_name), None)
    if node is None or node.domain not in ("", "ai.onnx") or "Inference error" in why:
        return
    fits = next((change for change in (0, 1, -1) if _passes_with(light, proto, node_name, change)), None)
    if fits is None:
        return
    rank = {0: "", 1: "; it takes them with one axis more", -1: "; it takes them with one axis fewer"}[fits]
    raise InputError(f"{name}: the declared input shape(s) {_declared(proto)} do not fit the graph: node "
                     f"{node_name} ({op}) cannot take them ({why[:160]}{rank}); give the shapes the model was "
                     "exported for (--input-shape NAME=DxD..., input_shapes=) or fix the export")


def _passes_with(light: onnx.ModelProto, proto: onnx.ModelProto, node_name: str, change: int) -> bool:
    """Whether strict inference passes node ``node_name`` once every declared graph input (with a shape) has its
    rank changed by ``change`` and unknown sizes."""
    free = onnx.ModelProto()
    free.CopyFrom(light)
    declared = {v.name for v in proto.graph.input}
    for v in free.graph.input:
        if v.name not in declared or not v.type.HasField("tensor_type") or \
                not v.type.tensor_type.HasField("shape"):
            continue
        rank = len(v.type.tensor_type.shape.dim) + change
        if rank < 0:
            return False
        v.type.tensor_type.ClearField("shape")
        v.type.tensor_type.shape.dim.extend(onnx.TensorShapeProto.Dimension() for _ in range(rank))
    try:
        shape_inference.infer_shapes(free, check_type=True, strict_mode=True)
    except Exception as again:  # noqa: BLE001 - onnx.shape_inference.InferenceError
        return not any(m.group(2) == node_name for m in INFERENCE_ERROR.finditer(str(again)))
    return True


def check_recorded_sizes(proto: onnx.ModelProto, recorded: list, name: str) -> None:
    """Refuse a model whose declared inputs give a value other sizes than the exporter recorded for it (an input
    declared 17 x 17 in a graph exported for 16 x 16: a Reshape to a fixed size hides it from the ops' own checks,
    and the relevance model could not run). ``proto`` has no value_info; ``recorded`` is what the exporter wrote.
    A recorded shape that is only a permutation of the inferred one is a layout label, not a size (jax2onnx 0.17
    leaves NHWC shapes on values its layout pass made NCHW), and passes."""
    inferred = shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    got = {v.name: _static_dims(v) for v in inferred.graph.value_info}
    for v in recorded:
        want, have = _static_dims(v), got.get(v.name)
        if want is None or have is None or len(want) != len(have) or sorted(want) == sorted(have):
            continue
        raise ModelError(f"{name}: the declared input shape(s) {_declared(proto)} give {v.name} the shape "
                         f"{'x'.join(map(str, have))}, where the exporter recorded {'x'.join(map(str, want))} (the "
                         "graph was exported for another input size); declare the input size the model was exported "
                         "for, or re-export it for this one")


def _static_dims(v: onnx.ValueInfoProto) -> list | None:
    """The dimensions of a tensor value when all of them are known numbers, else None."""
    if not v.type.HasField("tensor_type") or not v.type.tensor_type.HasField("shape"):
        return None
    dims = v.type.tensor_type.shape.dim
    return [d.dim_value for d in dims] if all(d.HasField("dim_value") for d in dims) else None


def _types_only(values) -> list:
    """Copies of value infos with their element types and without their shapes."""
    out = []
    for v in values:
        w = onnx.ValueInfoProto()
        w.CopyFrom(v)
        if w.type.HasField("tensor_type"):
            w.type.tensor_type.ClearField("shape")
        out.append(w)
    return out


# strict shape inference's complaint about a node's input shapes (not a type left unknown after an earlier error)
SHAPE_CONFLICT = re.compile(r"\(op_type:(\w+), node name: ([^\n]*?)\): \[ShapeInferenceError\] ([^\n]*)")
INFERENCE_ERROR = re.compile(r"\(op_type:(\w+), node name: ([^\n]*?)\): \[(\w+)\] ([^\n]*)")


def _declared(proto: onnx.ModelProto) -> str:
    def dims(v):
        shape = v.type.tensor_type.shape
        return "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in shape.dim)
    inits = {t.name for t in proto.graph.initializer}
    return ", ".join(f"{v.name} {dims(v)}" for v in proto.graph.input if v.name not in inits)
