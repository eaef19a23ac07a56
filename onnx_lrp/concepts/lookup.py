"""Looking up tensors of the canonized forward graph for concepts: the layers (Conv/Gemm/MatMul outputs), a tensor by
name and the nearest layers upstream of a layer."""
from __future__ import annotations

import difflib

import onnx_ir as ir

from ..core.errors import InputError
from ..core.graph import carries, is_param


LAYER_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def layer_names(graph: ir.Graph) -> list[str]:
    """The outputs of the graph's layers (Conv, ConvTranspose, Gemm, MatMul with a weight), in graph order."""
    return [n.outputs[0].name for n in graph if n.op_type in LAYER_OPS and n.domain in ("", "ai.onnx")
            and carries(n.outputs[0]) and any(v is not None and is_param(v) for v in n.inputs[1:])]


def listing(names: list[str], limit: int = 30) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def tensor_values(graph: ir.Graph) -> list[ir.Value]:
    """Every tensor :func:`find_tensor` accepts (a float activation computed from the inputs, of known rank), in
    graph order."""
    return [o for n in graph for o in n.outputs if carries(o) and o.shape is not None]


def tensor_names(graph: ir.Graph) -> list[str]:
    return [v.name for v in tensor_values(graph)]


def closest(name: str, names: list[str], layers: list[str], limit: int = 5) -> str:
    """``names`` nearest to ``name`` for a refusal, in one line: those containing it (case aside), layers first, else
    difflib's closest; with none close, the layers (at most ``limit``)."""
    low = name.lower()
    near = [n for n in names if low and low in n.lower()]
    ratio = lambda n: difflib.SequenceMatcher(None, low, n.lower()).ratio()  # noqa: E731
    near = sorted(near, key=lambda n: (n not in layers, -ratio(n)))
    near = near or difflib.get_close_matches(name, names, n=limit, cutoff=0.5)
    if near:
        return f"the closest: {', '.join(near[:limit])}" + (f" ({len(near)} contain {name!r})" if len(near) > limit
                                                             else "")
    return f"its layers (Conv/Gemm/MatMul outputs): {listing(layers, limit)}"


def find_tensor(graph: ir.Graph, name: str, what: str = "layer") -> ir.Value:
    """The value computed by a node under ``name``; an InputError listing the layers when there is none."""
    if not isinstance(name, str):
        raise InputError(f"{what} must be a tensor name (a string), not {name!r}")
    for node in graph:
        for o in node.outputs:
            if o.name == name:
                if not carries(o):
                    raise InputError(f"{what} {name!r} is not a float activation computed from the inputs; the "
                                     f"model's layers are: {listing(layer_names(graph))}")
                if o.shape is None:
                    raise InputError(f"{what} {name!r} has no known rank (shape inference could not reach it); "
                                     f"name another tensor; the model's layers are: {listing(layer_names(graph))}")
                return o
    raise InputError(f"no tensor named {name!r} in the model; "
                     f"{closest(name, tensor_names(graph), layer_names(graph))} (`onnx-lrp concepts MODEL "
                     "--list-layers` lists every tensor accepted)")


def input_layers(graph: ir.Graph, name: str, layers: list[str] | None = None) -> list[str]:
    """The nearest layers upstream of the layer ``name`` (through any non-layer node: activations, pooling, sums,
    skip connections), as zennit-crp's ``ModelGraph.find_input_layers``; ``layers``: the tensors that count as
    layers (default: :func:`layer_names`)."""
    wanted = set(layers if layers is not None else layer_names(graph))
    found: list[str] = []
    seen: set[int] = set()

    def search(node):
        for v in node.inputs:
            if v is None or not carries(v) or v.producer() is None:
                continue
            if v.name in wanted:
                if v.name not in found:
                    found.append(v.name)
            elif id(v) not in seen:
                seen.add(id(v))
                search(v.producer())

    search(find_tensor(graph, name).producer())
    return found


__all__ = ["LAYER_OPS", "layer_names", "listing", "tensor_values", "tensor_names", "closest", "find_tensor",
           "input_layers"]
