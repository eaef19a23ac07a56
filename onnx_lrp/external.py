"""Models of any size: weights stay in their external data files (memory-mapped), never in one protobuf.

One protobuf cannot exceed 2 GiB, and copying every weight into one doubles the memory. So a model file is read
without its external data (``onnx.load(..., load_external_data=False)``: only the graph); its data files are checked
here (present inside the model's folder, long enough); the ``onnx_ir`` model reads them memory-mapped
(``ExternalTensor``); checks and shape inference see the graph with the large weights as typed inputs
(:func:`light_proto`, :func:`weightless`); and onnxruntime gets :class:`Parts`: the graph as bytes, the folder its
external data lives in (``session.model_external_initializers_file_folder_path``) and the tensors onnx-lrp made in
memory (folded constants, modified weights), handed over without a copy (``add_external_initializers``).
:func:`save` writes ``MODEL`` + ``MODEL.data`` for such a model, streaming the weights from file to file.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from .errors import ModelError

LIGHT = 4096  # elements: initializers above this matter to checks and shape inference by type and shape only
MEMORY = "lrp-memory"  # the location of tensors onnxruntime receives from memory (add_external_initializers)
IN_MEMORY_MIN = 1 << 20  # bytes: in-memory tensors of a large model at least this big leave the protobuf
LARGE = 1 << 30  # bytes of initializers held in the protobuf from which a model is handled as large
_COPY_CHUNK = 1 << 26  # bytes copied at once by save()


def external_tensors(proto: onnx.ModelProto):
    """Every initializer (main graph, subgraphs) whose data is in an external file."""
    stack = [proto.graph]
    while stack:
        g = stack.pop()
        for t in g.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                yield t
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(a.graphs)


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
        if init.data_location != onnx.TensorProto.EXTERNAL and int(np.prod(init.dims, dtype=np.float64)) <= LIGHT:
            g.initializer.append(init)
        elif init.name not in names:
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return light


def attach(model: ir.Model, folder: Path | None) -> ir.Model:
    """Point the model's external tensors at ``folder`` (they read their file memory-mapped when first used)."""
    if folder is not None:
        ir.external_data.set_base_dir(model.graph, str(folder))
    return model


def _initializers(model: ir.Model):
    """Every (value, tensor) of an initializer of the main graph and its subgraphs."""
    for g in [model.graph] + list(model.graph.subgraphs()):
        for v in g.initializers.values():
            if v.const_value is not None:
                yield v, v.const_value


def _placeholder(t, location: str = MEMORY) -> ir.ExternalTensor:
    return ir.ExternalTensor(location, 0, t.nbytes, t.dtype, shape=t.shape, name=t.name or "")


@contextlib.contextmanager
def weightless(model: ir.Model, min_elements: int = LIGHT):
    """Within the block, every initializer with more than ``min_elements`` elements (or already on disk) is a
    data-less placeholder: serialising the model copies no weights (shape inference, checks)."""
    swapped = []
    for v, t in list(_initializers(model)):
        if isinstance(t, ir.ExternalTensor) or t.size > min_elements:
            swapped.append((v, t))
            v.const_value = _placeholder(t)
    try:
        yield model
    finally:
        for v, t in swapped:
            v.const_value = t


class Upcast(ir.LazyTensor):
    """A float16 / bfloat16 weight read as float32 where it is used (converted when read; only the last one read is
    kept: nothing holds a float32 copy of every weight); :func:`lower_upcasts` hands the weight over in its type."""

    _last: list = [None, None]  # (tensor, float32 array) of the last conversion: the checks of one node share it

    def __init__(self, source):
        super().__init__(self._convert, ir.DataType.FLOAT, source.shape, name=source.name)
        self.source = source

    def _convert(self):
        if Upcast._last[0] is not self:
            Upcast._last[:] = [None, None]  # the previous weight's copy goes before this one is made
            Upcast._last[:] = [self, np.asarray(self.source.numpy()).astype(np.float32)]
        return ir.tensor(Upcast._last[1])

    @staticmethod
    def forget() -> None:
        """Drop the last converted weight (the model is built)."""
        Upcast._last[:] = [None, None]


def drop_unused(model: ir.Model) -> int:
    """Remove initializers of the main graph that nothing reads any more (a bias folded into another, a weight
    replaced by its folded copy): not written, not loaded. Returns how many."""
    graph, dropped = model.graph, 0
    for v in list(graph.initializers.values()):
        # (a removed node may still list the value among its inputs: only nodes in a graph count)
        if not any(node.graph is not None for node, _ in v.uses()) and not v.is_graph_output() \
                and v not in graph.inputs:
            graph.initializers.pop(v.name)
            dropped += 1
    return dropped


def lower_upcasts(model: ir.Model) -> int:
    """Every :class:`Upcast` initializer of the main graph back in its own type, read through one Cast to float32
    (placed before its first use). onnxruntime's CPU provider has no float16 kernels for most ops: its constant
    folding turns the Cast into a float32 initializer at session creation and releases the float16 one (measured
    alternatives, a Cast per use with folding off, peak higher: README, "float16 / bfloat16"). Initializers that
    are graph outputs or read inside subgraphs become float32 tensors. Returns the Casts inserted."""
    graph, casts = model.graph, 0
    Upcast.forget()
    order = {id(node): k for k, node in enumerate(graph)}
    for v in list(graph.initializers.values()):
        t = v.const_value
        if not isinstance(t, Upcast):
            continue
        uses = list(v.uses())
        if v.is_graph_output() or any(node.graph is not graph for node, _ in uses):
            v.const_value = ir.tensor(np.array(t.numpy()), name=v.name)
            Upcast.forget()
            continue
        graph.initializers.pop(v.name)
        if not uses:
            continue
        low = ir.Value(name=f"{v.name}/{t.source.dtype.name.lower()}", shape=v.shape,
                       type=ir.TensorType(t.source.dtype), const_value=t.source)
        graph.register_initializer(low)
        cast = ir.node("Cast", [low], attributes={"to": ir.DataType.FLOAT}, name=f"lrp/upcast/{v.name}")
        graph.insert_before(min((node for node, _ in uses), key=lambda n: order[id(n)]), cast)
        out = cast.outputs[0]
        out.type, out.shape = ir.TensorType(ir.DataType.FLOAT), v.shape
        v.replace_all_uses_with(out)
        out.name = v.name  # the weight's name (tensor names the user gives, --relevance-at) stays
        casts += 1
    return casts


@dataclass
class Parts:
    """A model as onnxruntime receives it: the graph (``model_bytes``), the folder its external data files are in
    (None: none), and the tensors handed over from memory (name -> array)."""
    model_bytes: bytes
    folder: str | None = None
    arrays: dict = field(default_factory=dict)

    @property
    def large(self) -> bool:
        return self.folder is not None or bool(self.arrays)


def is_large(model: ir.Model) -> bool:
    """A model with external data, or with more than LARGE bytes of initializers."""
    total = 0
    for _, t in _initializers(model):
        if isinstance(t, ir.ExternalTensor):
            return True
        total += t.nbytes
    return total > LARGE


def split(model: ir.Model, serialize) -> Parts:
    """``model`` as :class:`Parts`: ``serialize(model) -> bytes`` writes the graph, external tensors stay
    references to their files, in-memory tensors of IN_MEMORY_MIN bytes or more become arrays."""
    folders, arrays, swapped = set(), {}, []
    for v, t in list(_initializers(model)):
        if isinstance(t, ir.ExternalTensor):
            folders.add(str(t.base_dir))
        elif t.nbytes >= IN_MEMORY_MIN:
            arrays[v.name] = np.ascontiguousarray(t.numpy())
            swapped.append((v, t))
            v.const_value = _placeholder(t)
    if len(folders) > 1:
        raise ModelError(f"the model's external data lies in several folders ({', '.join(sorted(folders))}); "
                         "keep the data files beside the model")
    try:
        data = serialize(model)
    finally:
        for v, t in swapped:
            v.const_value = t
    return Parts(data, folders.pop() if folders else None, arrays)


def save(parts: Parts, path, serialize_proto) -> None:
    """Write a large model as ``path`` + ``path.data`` (every external tensor's bytes copied there, in chunks),
    both via temporary files renamed at the end (no half-written output)."""
    path = Path(path)
    data_name = path.name + ".data"
    proto = onnx.load_model_from_string(parts.model_bytes)
    tmp_model = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp_data = path.with_name(f".{data_name}.tmp{os.getpid()}")
    try:
        with open(tmp_data, "wb") as out:
            for t in external_tensors(proto):
                info = {e.key: e.value for e in t.external_data}
                pad = (-out.tell()) % 4096  # page-aligned: onnxruntime can map each tensor
                out.write(b"\0" * pad)
                offset = out.tell()
                if info.get("location") == MEMORY:
                    out.write(memoryview(np.ascontiguousarray(parts.arrays[t.name])).cast("B"))
                else:
                    _copy_range(Path(parts.folder) / info["location"], int(info.get("offset", 0)),
                                int(info["length"]), out)
                del t.external_data[:]
                out.truncate()  # a trailing hole becomes part of the file
                for k, val in (("location", data_name), ("offset", str(offset)), ("length", str(out.tell() - offset))):
                    e = t.external_data.add()
                    e.key, e.value = k, val
        tmp_model.write_bytes(serialize_proto(proto))
        os.replace(tmp_data, path.with_name(data_name))
        os.replace(tmp_model, path)
    finally:
        for tmp in (tmp_model, tmp_data):
            if tmp.exists():
                tmp.unlink()


def _copy_range(src: Path, offset: int, length: int, out) -> None:
    """Copy ``length`` bytes of ``src`` from ``offset`` to ``out`` in chunks; all-zero chunks become holes of the
    file (sparse weights, e.g. pruned ones, take no disk)."""
    zeros = bytes(_COPY_CHUNK)
    with open(src, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            chunk = f.read(min(_COPY_CHUNK, left))
            if not chunk:
                raise ModelError(f"external data file {src} ended early; copy it again")
            if chunk == zeros[:len(chunk)]:
                out.seek(len(chunk), 1)
            else:
                out.write(chunk)
            left -= len(chunk)
