"""Models of any size: weights stay in their external data files (memory-mapped), never in one protobuf.

One protobuf cannot exceed 2 GiB, and copying every weight into one doubles the memory. So a model file is read
without its external data (``onnx.load(..., load_external_data=False)``: only the graph;
``proto.external_data.check_files`` checks the data files: inside the model's real folder, long enough); the ``onnx_ir``
model reads them memory-mapped (``ExternalTensor``, :func:`attach`); checks and shape inference see the graph with
the large weights as typed inputs (``proto.check.light_proto``, :func:`weightless`); and onnxruntime gets
:class:`Parts`: the graph as bytes, the folder its external data lives in
(``session.model_external_initializers_file_folder_path``) and the tensors onnx-lrp made in memory (folded
constants, modified weights), handed over without a copy (``add_external_initializers``). ``proto.save.save_large``
writes ``MODEL`` + ``MODEL.data`` for such a model, streaming the weights from file to file. This module needs no
``onnx`` (the package ``load/proto/`` is the only one that imports it).
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from ..core.errors import ModelError
from .builder import Upcast


LIGHT = 4096  # elements: initializers above this matter to checks and shape inference by type and shape only
MEMORY = "lrp-memory"  # the location of tensors onnxruntime receives from memory (add_external_initializers)
IN_MEMORY_MIN = 1 << 20  # bytes: in-memory tensors of a large model at least this big leave the protobuf
LARGE = 1 << 30  # bytes of initializers held in the protobuf from which a model is handled as large
TIED_MIN = 1 << 18  # bytes: float16 / bfloat16 weights from this size are cast where used (lower_upcasts) ...
TIED_MODEL_MIN = 256 << 20  # ... in models with at least this many bytes of them (below: one folded Cast, faster)
#: bytes of 4-bit weights made in memory (load.passes.block_quant) from which a relevance model's go to a file of
#: its own (:func:`split` with ``packed_file``) instead of its protobuf: onnxruntime takes no 4-bit arrays from
#: memory, and in the protobuf they would be held twice (the bytes, then onnxruntime's copy)
PACKED_FILE_MIN = 64 << 20
PACKED_FILE = "lrp-packed-weights.bin"  # that file's name in its private temporary folder


def attach(model: ir.Model, folder: Path | None) -> ir.Model:
    """Point the model's external tensors at ``folder`` (they read their file memory-mapped when first used)."""
    if folder is not None:
        ir.external_data.set_base_dir(model.graph, str(folder))
    return model


def folder_of(model: ir.Model) -> Path | None:
    """The folder an onnx_ir model's external tensors (initializers and attribute tensors, subgraphs too) read their
    files from (:func:`attach`), or None when it has none; several folders: one-line ModelError."""
    tensors = [t for _, t in _initializers(model)]
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for a in node.attributes.values():
            if a.type == ir.AttributeType.TENSOR:
                tensors.append(a.value)
            elif a.type == ir.AttributeType.TENSORS:
                tensors.extend(a.value)
    folders = {str(t.base_dir) for t in tensors if isinstance(t, ir.ExternalTensor) and t.location != MEMORY}
    if len(folders) > 1:
        raise ModelError(f"the model's external data lies in several folders ({', '.join(sorted(folders))}); "
                         "keep the data files beside the model")
    return Path(folders.pop()).absolute() if folders else None


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


def low_precision_bytes(model: ir.Model) -> int:
    """Bytes of the float16 / bfloat16 weights kept in their type (:class:`Upcast` initializers)."""
    return sum(t.source.nbytes for _, t in _initializers(model) if isinstance(t, Upcast))


def lower_upcasts(model: ir.Model, tied: bool | None = None) -> int:
    """Every :class:`Upcast` initializer of the main graph back in its own type, read as float32 through a Cast.

    onnxruntime's CPU provider has no float16 / bfloat16 kernels for most ops, and its constant folding turns a Cast
    of an initializer into a float32 initializer at session creation (a float32 copy of every weight: 3.2-3.5x the
    float16 bytes at the peak); a Cast whose inputs are all initializers runs first even without folding. ``tied``
    (the default): each use gets its own Cast, tied to the data flow of its node (:func:`_tied_cast`), so onnxruntime
    converts the weight when the node is about to run and frees the float32 copy after it: one or two weights exist
    in float32 at a time (README, "float16 / bfloat16"). It costs a conversion of every weight per use and run
    (explain ~2.3x slower on a 0.8 GB float16 MLP), so ``tied=None`` ties only in models with TIED_MODEL_MIN bytes
    of float16 / bfloat16 weights or more. Uses without a computed input (a node of constants only), weights under
    TIED_MIN bytes and ``tied=False`` share one Cast placed before the first use. Initializers that are graph
    outputs or read inside subgraphs become float32 tensors. Returns the Casts inserted."""
    graph, casts = model.graph, 0
    if tied is None:
        tied = low_precision_bytes(model) >= TIED_MODEL_MIN
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
        name = v.name
        shared = []
        for k, (node, index) in enumerate(uses):
            data = _computed_input(node, v) if tied and t.source.nbytes >= TIED_MIN else None
            if data is None:
                shared.append((node, index))
                continue
            out = _tied_cast(graph, node, low, data, f"lrp/upcast/{name}/{k}")
            node.replace_input_with(index, out)
            casts += 1
        if shared:
            cast = ir.node("Cast", [low], attributes={"to": ir.DataType.FLOAT}, name=f"lrp/upcast/{name}")
            graph.insert_before(min((node for node, _ in shared), key=lambda n: order[id(n)]), cast)
            out = cast.outputs[0]
            out.type, out.shape = ir.TensorType(ir.DataType.FLOAT), v.shape
            for node, index in shared:
                node.replace_input_with(index, out)
            casts += 1
        v.name = None
        # the weight's name (tensor names the user gives, --relevance-at) stays on the float32 value of its first use
        first = uses[0][0].inputs[uses[0][1]]
        first.name = name
    return casts


def _computed_input(node: ir.Node, weight: ir.Value) -> ir.Value | None:
    """The first tensor input of ``node`` computed at run time (not a constant, not ``weight``, not strings), or
    None."""
    for x in node.inputs:
        if x is not None and x is not weight and x.const_value is None and not x.is_initializer() and (
                x.type is None or isinstance(x.type, ir.TensorType) and x.dtype != ir.DataType.STRING):
            return x
    return None


def _tied_cast(graph: ir.Graph, node: ir.Node, low: ir.Value, data: ir.Value, base: str) -> ir.Value:
    """``low`` read as float32 for ``node``, after ``data`` (one of its computed inputs) exists:
    ``Cast(Reshape(low, Where(flag, shape, shape)))`` with ``flag`` = bool(first element of ``data``). The Reshape
    is zero-copy and the shape equals the weight's, but it depends on ``data``: onnxruntime can neither fold the
    Cast nor run it before ``node``'s inputs exist, and the float32 copy is freed after ``node``."""
    dims = np.array(tuple(low.const_value.shape), np.int64)  # an initializer's shape is static

    def const(arr, tag, shared=True):
        name = f"lrp/upcast/{tag}" if shared else f"{base}/{tag}"
        if name in graph.initializers:
            return graph.initializers[name]
        arr = np.asarray(arr)
        c = ir.Value(name=name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                     const_value=ir.tensor(arr, name=name))
        graph.register_initializer(c)
        return c

    def op(op_type, inputs, tag, dtype, shape, **attrs):
        n = ir.node(op_type, inputs, attributes=attrs or None, name=f"{base}/{tag}_node")
        o = n.outputs[0]
        o.name, o.type = f"{base}/{tag}", ir.TensorType(dtype) if dtype is not None else None
        o.shape = ir.Shape(shape) if shape is not None and dtype is not None else None
        graph.insert_before(node, n)
        return o

    flat = op("Reshape", [data, const(np.array([-1], np.int64), "minus_one")], "flat", data.dtype, [None])
    first = op("Slice", [flat, const(np.array([0], np.int64), "zero"), const(np.array([1], np.int64), "one")],
               "first", data.dtype, [1])
    flag = op("Cast", [first], "flag", ir.DataType.BOOL, [1], to=ir.DataType.BOOL)
    shape = const(dims, "shape", shared=False)
    tied = op("Where", [flag, shape, shape], "shape_tied", ir.DataType.INT64, [len(dims)])
    low_tied = op("Reshape", [low, tied], "tied", low.dtype, None)  # no static shape: not a no-op to remove
    return op("Cast", [low_tied], "float32", ir.DataType.FLOAT, None, to=ir.DataType.FLOAT)


@dataclass
class Parts:
    """A model as onnxruntime receives it: the graph (``model_bytes``), the folder its external data files are in
    (None: none), the tensors handed over from memory (name -> array), and whether onnxruntime may pre-pack the
    weights (a second, packed copy of every MatMul weight: about 18 % faster on BERT-base, twice the memory; off
    for models with over LARGE bytes of weights)."""
    model_bytes: bytes
    folder: str | None = None
    arrays: dict = field(default_factory=dict)
    prepack: bool = True
    #: the :class:`TempFolder` that ``folder`` is (a relevance model's own 4-bit weights file): keep it as long as a
    #: session or a reader may open the folder; None: ``folder`` is the model's own
    keep: object = None

    @property
    def large(self) -> bool:
        return self.folder is not None or bool(self.arrays)


def packed_bytes(model: ir.Model) -> int:
    """Bytes of the 4-bit tensors held in memory (not in a file)."""
    return sum(t.nbytes for _, t in _initializers(model)
               if not isinstance(t, ir.ExternalTensor) and t.dtype.bitwidth < 8)


def is_large(model: ir.Model) -> bool:
    """A model with external data, or with more than LARGE bytes of initializers."""
    total = 0
    for _, t in _initializers(model):
        if isinstance(t, ir.ExternalTensor):
            return True
        total += t.nbytes
    return total > LARGE


def split(model: ir.Model, serialize, packed_file: bool = False) -> Parts:
    """``model`` as :class:`Parts`: ``serialize(model) -> bytes`` writes the graph, external tensors stay
    references to their files, in-memory tensors of IN_MEMORY_MIN bytes or more become arrays. 4-bit tensors in
    memory stay packed in the protobuf; with ``packed_file``, when they hold over PACKED_FILE_MIN bytes, they go to a
    file in a private temporary folder instead (:func:`_to_own_file`; ``Parts.keep`` owns it)."""
    folders, arrays, swapped, total, packed, on_disk = set(), {}, [], 0, [], []
    for v, t in list(_initializers(model)):
        total += t.nbytes
        if isinstance(t, ir.ExternalTensor):
            folders.add(str(t.base_dir))
            on_disk.append((v, t))
        elif t.nbytes >= IN_MEMORY_MIN and t.dtype.bitwidth >= 8:
            arrays[v.name] = np.ascontiguousarray(t.numpy())
            swapped.append((v, t))
            v.const_value = _placeholder(t)
        elif t.dtype.bitwidth < 8:
            packed.append((v, t))
    if len(folders) > 1:
        raise ModelError(f"the model's external data lies in several folders ({', '.join(sorted(folders))}); "
                         "keep the data files beside the model")
    folder, keep = folders.pop() if folders else None, None
    if packed_file and packed_bytes(model) > PACKED_FILE_MIN:
        keep = TempFolder()
        folder = keep.path
        swapped += _to_own_file(packed, on_disk, arrays, folder)
    try:
        data = serialize(model)
    finally:
        for v, t in swapped:
            v.const_value = t
    return Parts(data, folder, arrays, prepack=total <= LARGE, keep=keep)


def _to_own_file(packed: list, on_disk: list, arrays: dict, path: str) -> list:
    """onnxruntime reads external data from one folder, ``path``: the ``packed`` (value, tensor) pairs' bytes go to
    ``path``/PACKED_FILE at page-aligned offsets (onnxruntime maps them), and so do the model's own external tensors
    (``on_disk``) that numpy cannot hold (4-bit, bfloat16); the others become ``arrays`` mapped from their files (no
    copy). The values point at their new places; returns the (value, tensor) pairs swapped."""
    swapped, written = [], []
    for v, t in on_disk:
        if t.dtype.bitwidth >= 8 and np.dtype(t.dtype.numpy()).kind in "biuf":
            arrays[v.name] = t.numpy()  # memory-mapped from the model's own file
            swapped.append((v, t))
            v.const_value = _placeholder(t)
        else:
            written.append((v, t))
    with open(Path(path, PACKED_FILE), "wb") as out:
        for v, t in packed + written:
            out.write(b"\0" * ((-out.tell()) % 4096))
            offset = out.tell()
            out.write(t.tobytes())
            swapped.append((v, t))
            v.const_value = ir.ExternalTensor(PACKED_FILE, offset, out.tell() - offset, t.dtype, shape=t.shape,
                                              name=t.name or v.name or "", base_dir=path)
    return swapped


class TempFolder:
    """A private temporary folder (``path``), removed with everything in it when this object is collected, by
    :meth:`release`, or at exit. ``weakref.finalize(owner, folder.release)`` keeps it as long as ``owner``."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="onnx-lrp-weights-")
        self._remove = weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True)

    def release(self) -> None:
        self._remove()

    def __reduce__(self):  # a copy in another process (Ray) reads the folder; the process that made it removes it
        return (str, (self.path,))
