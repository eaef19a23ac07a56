"""Models of any size: weights stay in their external data files (memory-mapped), never in one protobuf.

One protobuf cannot exceed 2 GiB, and copying every weight into one doubles the memory. So a model file is read
without its external data (``onnx.load(..., load_external_data=False)``: only the graph; ``proto.check_files``
checks the data files: inside the model's folder, long enough); the ``onnx_ir`` model reads them memory-mapped
(``ExternalTensor``, :func:`attach`); checks and shape inference see the graph with the large weights as typed inputs
(``proto.light_proto``, :func:`weightless`); and onnxruntime gets :class:`Parts`: the graph as bytes, the folder its
external data lives in (``session.model_external_initializers_file_folder_path``) and the tensors onnx-lrp made in
memory (folded constants, modified weights), handed over without a copy (``add_external_initializers``).
``proto.save_large`` writes ``MODEL`` + ``MODEL.data`` for such a model, streaming the weights from file to file.
This module needs no ``onnx`` (``load/proto.py`` is the only one that imports it).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from ..errors import ModelError
from .build import Upcast

LIGHT = 4096  # elements: initializers above this matter to checks and shape inference by type and shape only
MEMORY = "lrp-memory"  # the location of tensors onnxruntime receives from memory (add_external_initializers)
IN_MEMORY_MIN = 1 << 20  # bytes: in-memory tensors of a large model at least this big leave the protobuf
LARGE = 1 << 30  # bytes of initializers held in the protobuf from which a model is handled as large


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
    (None: none), the tensors handed over from memory (name -> array), and whether onnxruntime may pre-pack the
    weights (a second, packed copy of every MatMul weight: about 18 % faster on BERT-base, twice the memory; off
    for models with over LARGE bytes of weights)."""
    model_bytes: bytes
    folder: str | None = None
    arrays: dict = field(default_factory=dict)
    prepack: bool = True

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
    folders, arrays, swapped, total = set(), {}, [], 0
    for v, t in list(_initializers(model)):
        total += t.nbytes
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
    return Parts(data, folders.pop() if folders else None, arrays, prepack=total <= LARGE)


