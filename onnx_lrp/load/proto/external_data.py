"""A ``ModelProto``'s external data: every tensor whose data is in a file (initializers, node attribute tensors,
sparse tensors, in subgraphs and local functions too) checked against the model's folder; external Constant nodes
made initializers, attribute and sparse tensors read into the protobuf; and the folder the data paths are relative
to.

Where a data file may lie (:func:`resolve_location`): a model opened as ``OPENED/m.onnx`` has two folders, its *real
folder* ``REAL`` (the folder of ``realpath(OPENED/m.onnx)``: the model file's symlinks resolved) and ``OPENED``
(``realpath`` of the folder it was opened from). A tensor's ``location`` must be a relative path; the data file is
``realpath(REAL/location)`` or, when that does not exist, ``realpath(OPENED/location)`` (the Hugging Face cache:
``snapshots/<rev>/m.onnx`` and ``snapshots/<rev>/m.onnx.data`` are symlinks into ``blobs/``, as onnxruntime reads
them), and it is accepted only when that resolved file lies inside ``REAL``. The working directory never matters;
a data file that lies elsewhere, a missing one, or one shorter than a tensor's offset + length is refused in one line
naming the tensor and the path. Accepted locations are rewritten relative to ``REAL``, the folder every later reader
(onnx_ir, onnxruntime, ``rewrite``) resolves them against.
"""
from __future__ import annotations

import os
from pathlib import Path

import onnx

import onnx_ir as ir

from ...core.errors import ModelError
from .. import external
from .graphs import all_graphs

_A = onnx.AttributeProto


def external_tensors(proto: onnx.ModelProto):
    """Every initializer (main graph, subgraphs) whose data is in an external file."""
    for g in all_graphs(proto):
        for t in g.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                yield t


def _nodes_deep(nodes, where: str):
    """(node, where) for ``nodes`` and every node of their subgraphs, nested."""
    for node in nodes:
        yield node, where
        for a in node.attribute:
            for g in ([a.g] if a.type == _A.GRAPH else list(a.graphs) if a.type == _A.GRAPHS else []):
                yield from _nodes_deep(g.node, where)


def _sparse_parts(sparse: onnx.SparseTensorProto, label: str):
    yield f"{label} (values)", sparse.values
    yield f"{label} (indices)", sparse.indices


def _attribute_tensors(a: onnx.AttributeProto, label: str):
    if a.type == _A.TENSOR:
        yield label, a.t
    elif a.type == _A.TENSORS:
        yield from ((f"{label}[{k}]", t) for k, t in enumerate(a.tensors))
    elif a.type == _A.SPARSE_TENSOR:
        yield from _sparse_parts(a.sparse_tensor, label)
    elif a.type == _A.SPARSE_TENSORS:
        for k, s in enumerate(a.sparse_tensors):
            yield from _sparse_parts(s, f"{label}[{k}]")


def inlined_tensors(proto: onnx.ModelProto):
    """(label, tensor) of every tensor that is not an initializer: node attribute tensors (any TENSOR / TENSORS /
    SPARSE_TENSOR(S) attribute, in subgraphs and local functions, and the functions' attribute defaults) and the
    parts of sparse initializers. These are read into the protobuf when external (small: a ConstantOfShape's value;
    a Constant's external tensor became an initializer)."""
    for g in all_graphs(proto):
        for k, s in enumerate(g.sparse_initializer):
            yield from _sparse_parts(s, f"sparse initializer {s.values.name or k!r}")
    sources = [(proto.graph.node, "")] + [(f.node, f" of function {f.name!r}") for f in proto.functions]
    for nodes, where in sources:
        for node, at in _nodes_deep(nodes, where):
            for a in node.attribute:
                yield from _attribute_tensors(a, f"attribute {a.name!r} of node {node.name or node.op_type!r}{at}")
    for f in proto.functions:
        for a in f.attribute_proto:
            yield from _attribute_tensors(a, f"default of attribute {a.name!r} of function {f.name!r}")


def model_folders(path) -> tuple[Path, Path]:
    """(real folder, folder opened from) of a model file: the folder of its ``realpath``, and the ``realpath`` of
    the folder in the path as given."""
    path = os.path.abspath(os.fspath(path))
    return Path(os.path.realpath(path)).parent, Path(os.path.realpath(os.path.dirname(path)))


def _inside(path: str, root: Path) -> bool:
    root = str(root)
    return os.path.commonpath([path, root]) == root


def resolve_location(location: str, real: Path, opened: Path, what: str, name: str) -> Path:
    """The data file ``location`` names for ``what`` (module docstring: inside the model's real folder), or a
    one-line ModelError."""
    lexical = os.path.normpath(location) if location else ""
    if not location or os.path.isabs(location) or os.path.splitdrive(location)[0] or "\0" in location or \
            lexical == os.pardir or lexical.startswith(os.pardir + os.sep):
        raise ModelError(f"{name}: {what} points at external data {location!r} outside the model's folder {real}; "
                         "keep the data files beside the model")
    first, beside = os.path.join(real, location), os.path.join(opened, location)
    for candidate in dict.fromkeys([first, beside]):
        resolved = os.path.realpath(candidate)
        if _inside(resolved, real) and os.path.isfile(resolved):
            return Path(resolved)
    if os.path.lexists(first):
        raise ModelError(f"{name}: {what} points at external data {location!r} ({os.path.realpath(first)}), outside "
                         f"the model's folder {real} or not a file; keep the data files beside the model")
    if os.path.lexists(beside):
        raise ModelError(f"{name}: the external data file {location!r} of {what} is missing from the model's real "
                         f"folder {real} (the model file is a symlink into it); {beside} lies outside it: keep the "
                         "data files beside the model's real file")
    raise ModelError(f"{name}: the external data file {location!r} of {what} is missing from the model's folder "
                     f"{real}; keep the data files beside the model")


def _span(t: onnx.TensorProto, path: Path, size: int, what: str, name: str) -> tuple[int, int]:
    """(offset, length) of ``t``'s data in its file of ``size`` bytes, checked."""
    info = {e.key: e.value for e in t.external_data}
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else size - offset
    except ValueError:
        raise ModelError(f"{name}: {what} has an invalid external data offset or length; the file is corrupt "
                         "(re-export it)") from None
    if offset < 0 or length < 0 or offset + length > size:
        raise ModelError(f"{name}: {what} reads bytes {offset}..{offset + length} of {info.get('location')} "
                         f"({path}), which has {size}; the data file is truncated (copy it again)")
    return offset, length


def _relocate(t: onnx.TensorProto, location: str) -> None:
    for e in t.external_data:
        if e.key == "location" and e.value != location:
            e.value = location


def _inline(t: onnx.TensorProto, path: Path, offset: int, length: int) -> None:
    with open(path, "rb") as f:
        f.seek(offset)
        t.raw_data = f.read(length)
    del t.external_data[:]
    t.data_location = onnx.TensorProto.DEFAULT


def check_files(proto: onnx.ModelProto, path, name: str) -> int:
    """One-line ModelError unless every external tensor's data file lies inside the model's real folder (module
    docstring) and holds the bytes the tensor points at. Initializers keep their data in the file, their location
    rewritten relative to the real folder; attribute and sparse tensors get their bytes. Returns the external bytes
    of the initializers."""
    real, opened = model_folders(path)
    total, sizes = 0, {}
    tensors = [(f"initializer {t.name!r}", t, False) for t in external_tensors(proto)]
    tensors += [(what, t, True) for what, t in inlined_tensors(proto) if t.data_location == onnx.TensorProto.EXTERNAL]
    for what, t, inline in tensors:
        location = next((e.value for e in t.external_data if e.key == "location"), "")
        file = resolve_location(location, real, opened, what, name)
        if file not in sizes:
            sizes[file] = file.stat().st_size
        offset, length = _span(t, file, sizes[file], what, name)
        if inline:
            _inline(t, file, offset, length)
        else:
            _relocate(t, os.path.relpath(file, real))
            total += length
    return total


def refuse_external(proto: onnx.ModelProto, name: str) -> None:
    """A model given as bytes or a proto has no folder: an attribute or sparse tensor naming a data file is refused
    (it would be read from the working directory)."""
    for what, t in inlined_tensors(proto):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in t.external_data if e.key == "location"), "")
            raise ModelError(f"{name}: {what} points at external data {location!r}, but the model was given without "
                             "its file; pass the model's path")


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
    """The folder a model file's external data paths are relative to, its real folder; an onnx_ir model's, the one
    its external tensors read from (None for bytes and protos)."""
    if isinstance(source, (str, os.PathLike)):
        return model_folders(source)[0]
    if isinstance(source, ir.Model):
        return external.folder_of(source)
    return None
