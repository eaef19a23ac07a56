"""A ``ModelProto``'s external data: the tensors whose data is in files, those files checked (inside the model's
folder, long enough), external Constant nodes made initializers, and the folder the data paths are relative to."""
from __future__ import annotations

import os
from pathlib import Path

import onnx

from ...core.errors import ModelError
from .graphs import all_graphs


def external_tensors(proto: onnx.ModelProto):
    """Every initializer (main graph, subgraphs) whose data is in an external file."""
    for g in all_graphs(proto):
        for t in g.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                yield t


def check_files(proto: onnx.ModelProto, folder: Path, name: str) -> int:
    """One-line ModelError unless every external tensor's data file is inside ``folder`` and holds the bytes the
    tensor points at; returns the external bytes."""
    total = 0
    root = folder.resolve()
    sizes: dict[Path, int] = {}
    for t in external_tensors(proto):
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        path = (folder / location).resolve()
        if not location or os.path.isabs(location) or (root not in path.parents and path != root):
            raise ModelError(f"{name}: initializer {t.name!r} points at external data {location!r} outside the "
                             "model's folder; keep the data files beside the model")
        if path not in sizes:
            if not path.is_file():
                raise ModelError(f"{name}: the external data file {location} of initializer {t.name!r} is missing; "
                                 "keep the data files beside the model")
            sizes[path] = path.stat().st_size
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else sizes[path] - offset
        except ValueError:
            raise ModelError(f"{name}: initializer {t.name!r} has an invalid external data offset or length; the "
                             "file is corrupt (re-export it)") from None
        if offset < 0 or length < 0 or offset + length > sizes[path]:
            raise ModelError(f"{name}: initializer {t.name!r} reads bytes {offset}..{offset + length} of {location}, "
                             f"which has {sizes[path]}; the data file is truncated (copy it again)")
        total += length
    return total


def external_constants_to_initializers(proto: onnx.ModelProto) -> int:
    """A Constant node whose tensor is in an external file (torch.onnx writes large constants so, e.g. a LLaMA's
    rotary table exported with transformers 5) becomes an initializer of its output's name, in its graph: the data
    stays in its file and is checked, memory-mapped and handed to onnxruntime like every external weight (the checker
    cannot resolve an attribute's external file for a graph read without its data)."""
    moved = 0
    for g in all_graphs(proto):
        kept = []
        for node in g.node:
            value = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR),
                         None)
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1 and \
                    value is not None and value.data_location == onnx.TensorProto.EXTERNAL and len(node.output) == 1:
                t = onnx.TensorProto()
                t.CopyFrom(value)
                t.name = node.output[0]
                g.initializer.append(t)
                moved += 1
            else:
                kept.append(node)
        if len(kept) != len(g.node):
            del g.node[:]
            g.node.extend(kept)
    return moved


def data_folder(source) -> Path | None:
    """The folder a model file's external data paths are relative to (None for bytes and protos)."""
    if isinstance(source, (str, os.PathLike)):
        return Path(os.fspath(source)).resolve().parent
    return None
