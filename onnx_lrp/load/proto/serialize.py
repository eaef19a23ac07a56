"""Between onnx_ir models and ONNX protobuf: a ``ModelProto`` lifted to an onnx_ir model (external tensors read
from their files when first used), and a model serialised as bytes, or as the parts onnxruntime receives for a
large one."""
from __future__ import annotations

import onnx
import onnx_ir as ir

from .. import external


def to_ir(proto: onnx.ModelProto, folder=None) -> ir.Model:
    """The onnx_ir model; external tensors read their files in ``folder`` (memory-mapped, when first used)."""
    return external.attach(ir.serde.deserialize_model(proto), folder)


def deserialize(model_bytes: bytes, folder=None) -> ir.Model:
    """An ``onnx_ir`` model from bytes written by :func:`serialize` (no checks, no canonization); ``folder``: where
    its external data is (:attr:`external.Parts.folder`)."""
    return to_ir(onnx.load_model_from_string(model_bytes), folder)


def min_ir_version(model_proto: onnx.ModelProto) -> int:
    return max(8, onnx.helper.find_min_ir_version_for(list(model_proto.opset_import), ignore_unknown=True))


def serialize(model: ir.Model) -> bytes:
    """The model as bytes, IR version set explicitly (onnxruntime 1.31 reads IR <= 13); external tensors stay
    references to their files."""
    return serialize_proto(ir.serde.serialize_model(model))


def serialize_proto(proto: onnx.ModelProto) -> bytes:
    proto.ir_version = min(min_ir_version(proto), 13)
    return proto.SerializeToString()


def serialize_parts(model: ir.Model, packed_file: bool = False) -> external.Parts:
    """The model as onnxruntime receives it: bytes alone for a small model; for one with external data or over
    1 GiB of weights, the graph, the folder of its data files and its large in-memory tensors (never one protobuf
    of every weight). ``packed_file``: large 4-bit weights made in memory go to a temporary file
    (:func:`external.split`)."""
    external.drop_unused(model)
    external.lower_upcasts(model)  # float16 / bfloat16 weights handed over in their type
    if external.is_large(model) or packed_file and external.packed_bytes(model) > external.PACKED_FILE_MIN:
        return external.split(model, serialize, packed_file)
    return external.Parts(serialize(model))
