"""Reading a model: a path, bytes, a ``ModelProto`` or an onnx_ir model -> a ``ModelProto`` (external data checked,
not loaded), then fixed up, its inputs bound or sized as the caller asks, prepared and lifted to onnx_ir."""
from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx_ir as ir

from ...core.errors import ModelError
from .external_data import check_files, data_folder, external_constants_to_initializers, refuse_external
from .fixups import initializers_not_inputs, negative_dims_dynamic
from .inputs import bind_constants, fix_input_shapes
from .prepare import prepare_proto
from .serialize import to_ir


def read_proto(source) -> onnx.ModelProto:
    """A ModelProto from a path, bytes or a ModelProto, with external data; one-line errors."""
    if isinstance(source, onnx.ModelProto):
        refuse_external(source, "model")
        return source
    if isinstance(source, ir.Model):  # its external tensors read from the folder they were attached to
        proto, folder = ir.serde.serialize_model(source), data_folder(source)
        if folder is None:
            refuse_external(proto, "model")
        else:
            check_files(proto, folder / "model.onnx", f"model (data in {folder})")
        return proto
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise ModelError("model bytes are empty; pass the content of an .onnx file")
        try:
            proto = onnx.load_model_from_string(bytes(source))
        except Exception as exc:  # protobuf DecodeError and friends
            raise ModelError(f"model bytes are not a valid ONNX model ({type(exc).__name__}); "
                             "check that the file is complete") from None
        refuse_external(proto, "model bytes")
        return proto
    if not isinstance(source, (str, os.PathLike)):
        raise ModelError(f"model must be a path, bytes or an onnx.ModelProto, not {type(source).__name__}")
    path = Path(os.fspath(source))
    if not path.exists():
        raise ModelError(f"model file {path} not found; check the path")
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.onnx"))  # an export folder: name its model file
        hint = f" ({path / 'model.onnx'})" if "model.onnx" in found else \
            f" (in it: {', '.join(found[:4])})" if found else ""
        raise ModelError(f"model path {path} is a directory; give the .onnx file{hint}")
    if path.stat().st_size == 0:
        raise ModelError(f"model file {path} is empty; re-export the model")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"model file {path} is not a valid ONNX model ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'cannot parse'}); it may be truncated or "
                         "not an ONNX file") from None
    external_constants_to_initializers(proto)
    # external data: checked against the model's real folder, never the working directory; initializers' data stays
    # in its files (memory-mapped by the onnx_ir model, read by onnxruntime), attribute and sparse tensors read in
    check_files(proto, path, f"model file {path}")
    return proto


def read(source, name: str, constants: dict | None = None, input_shapes: dict | None = None) -> ir.Model:
    """Read, fix up, bind ``constants``, fix ``input_shapes``, check, upgrade and shape-infer a model; as onnx_ir."""
    proto = negative_dims_dynamic(initializers_not_inputs(read_proto(source)))
    proto = prepare_proto(fix_input_shapes(bind_constants(proto, constants, name), input_shapes, name), name)
    try:
        return to_ir(proto, data_folder(source))
    except Exception as exc:  # onnx_ir.serde.SerdeError: a field it cannot read (e.g. a corrupt attribute)
        cause = exc
        while cause.__cause__ is not None:
            cause = cause.__cause__
        raise ModelError(f"{name}: the model cannot be read ({type(cause).__name__}: "
                         f"{' '.join(str(cause).split())[:150]}); the file is corrupt (re-export it)") from None
