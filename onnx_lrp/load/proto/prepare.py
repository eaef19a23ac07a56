"""Check, upgrade and shape-infer a ``ModelProto``: the sequence every model goes through before it becomes an
onnx_ir model, and again (shapes only) after the loading passes split ops."""
from __future__ import annotations

import re

import onnx
import onnx_ir as ir
from onnx import shape_inference, version_converter

from ...core.errors import ModelError
from .. import external
from .check import check_recorded_sizes, check_text, check_types, light_proto
from .fixups import contrib_to_ms_domain
from .opset import (KNOWN_OPSET, MAX_OPSET, MIN_OPSET, expand_function_ops, legacy_prelu_slopes, opset_of,
                    relabel_newer_opset)
from .serialize import to_ir
from .shapes import fill_same_shape


def prepare_proto(proto: onnx.ModelProto, name: str = "model") -> onnx.ModelProto:
    """Check the model, lift it to MIN_OPSET, infer shapes."""
    if len(proto.graph.node) == 0:
        raise ModelError(f"{name}: the graph has no nodes; is this the right file?")
    check_text(proto, name)
    proto = contrib_to_ms_domain(proto)
    try:
        onnx.checker.check_model(light_proto(proto))  # weights by type and shape: no 2 GiB limit
    except Exception as exc:
        raise ModelError(f"{name} fails the ONNX checker: {str(exc).splitlines()[0]}") from None
    opset = opset_of(proto)
    if opset == 0:
        raise ModelError(f"{name} imports no default-domain opset; re-export it with a standard exporter")
    if opset > KNOWN_OPSET:
        raise ModelError(f"{name} imports opset {opset}, which does not exist yet: the installed onnx "
                         f"{onnx.__version__} knows opsets up to {KNOWN_OPSET} (onnx-lrp reads {MAX_OPSET + 1}-"
                         f"{KNOWN_OPSET} as {MAX_OPSET} where the ops are unchanged); re-export the model with opset "
                         f"{MAX_OPSET} or lower")
    proto = expand_function_ops(proto, opset)
    if opset > MAX_OPSET:
        proto = relabel_newer_opset(proto, opset, name)
    if opset < 7:
        proto = legacy_prelu_slopes(proto)
    if opset < MIN_OPSET:
        try:
            proto = version_converter.convert_version(proto, MIN_OPSET)
        except Exception as exc:
            raise ModelError(f"{name}: cannot convert opset {opset} to {MIN_OPSET} ({str(exc).splitlines()[0]}); "
                             f"re-export the model with opset >= {MIN_OPSET}") from None
    try:
        shape_inference.infer_shapes(proto, check_type=False, strict_mode=True, data_prop=False)
    except Exception as exc:
        if "existing shape differ" in str(exc):
            # the exporter's value_info contradicts the ops (jax2onnx 0.17 leaves NHWC shapes on values its layout
            # pass made NCHW): drop the intermediate shapes and infer them from the ops
            recorded = list(proto.graph.value_info)
            proto = onnx.ModelProto.FromString(proto.SerializeToString())
            del proto.graph.value_info[:]
            check_recorded_sizes(proto, recorded, name)
        elif "Incompatible dimensions" in str(exc):  # e.g. a declared input size the graph's weights do not fit
            where = " ".join(str(exc).split())
            first = re.search(r"\(op_type:[^)]*\): \[ShapeInferenceError\] Incompatible dimensions[^(]*", where)
            where = first.group(0).strip() if first else where
            raise ModelError(f"{name}: shape inference finds the graph inconsistent ({where[:200]}); the declared "
                             "input shapes do not fit the rest of the graph: fix them (--input-shape) or re-export "
                             "the model") from None
    try:
        proto = shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise ModelError(f"{name}: shape inference failed ({str(exc).splitlines()[0]})") from None
    check_types(proto, name)
    return fill_same_shape(proto)


def reinferred(model: ir.Model) -> ir.Model | None:
    """The model through :func:`prepare_proto` again (shape inference over ops split since), or None."""
    try:
        with external.weightless(model):  # shapes only: no weight serialised
            proto = prepare_proto(ir.serde.serialize_model(model), "model")
    except Exception:
        return None
    return to_ir(proto)
