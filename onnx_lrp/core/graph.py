"""Facts of onnx_ir values and nodes that every stage reads: which values carry relevance, static shapes, constants,
subgraphs and the values they capture, what lies upstream of a value."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import onnx_ir as ir

from . import meta


Dim = "int | None"

FLOAT_TYPES = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16}


def is_param(v: ir.Value | None) -> bool:
    """A constant, or a weight dequantized at run time from block-quantized constants (``meta.PACKED_WEIGHT``)."""
    return v is not None and (v.const_value is not None or meta.PACKED_WEIGHT.has(v))


def is_float(v: ir.Value | None) -> bool:
    """A float tensor (not a sequence or optional of tensors)."""
    return v is not None and v.dtype in FLOAT_TYPES and (v.type is None or isinstance(v.type, ir.TensorType))


def carries(v: ir.Value | None) -> bool:
    """A value carries relevance when it is a float activation: not a parameter, and not computed from the inputs'
    shapes alone (``loader.mark_shape_only``: masks and positions built from a dynamic sequence length). A value
    whose dtype shape inference could not tell (a custom-domain op) carries when it is computed from a carrying
    value (``mark_presumed``): an op we cannot see into must not cut the path silently."""
    if v is None or is_param(v) or meta.SHAPE_ONLY.get(v, False):
        return False
    if v.dtype is None:
        return bool(meta.PRESUMED_CARRY.get(v, False))
    return is_float(v)


def mark_presumed(graph: ir.Graph) -> int:
    """Mark outputs of unknown dtype of nodes with a relevance-carrying input as carrying (graph sorted)."""
    marked = 0
    for node in graph:
        if any(carries(v) for v in node.inputs):
            for o in node.outputs:
                if o.dtype is None and o.const_value is None:
                    meta.PRESUMED_CARRY.set(o, True)
                    marked += 1
    return marked


def static_dims(v: ir.Value) -> list | None:
    """The shape of a value as a list of ints and None (unknown or symbolic dims), or None if rank unknown."""
    if v is None or v.shape is None:
        return None
    return [d if isinstance(d, int) else None for d in v.shape]


def captured_values(node: ir.Node) -> list[ir.Value]:
    """Values of enclosing graphs that the subgraphs of ``node`` (Loop/Scan/If bodies) read by name: inputs of
    the node as much as its listed ones (a Keras GRU exported by tf2onnx reads the sequence so)."""
    defined: set[int] = set()
    used: list[ir.Value] = []
    stack = subgraphs(node)
    while stack:
        g = stack.pop()
        defined.update(id(v) for v in g.inputs)
        defined.update(id(v) for v in g.initializers.values())
        for n in g:
            defined.update(id(o) for o in n.outputs)
            used.extend(v for v in n.inputs if v is not None)
            stack.extend(subgraphs(n))
    out, seen = [], set()
    for v in used:
        if id(v) not in defined and id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def unique_name(base: str, taken: set) -> str:
    """``base``, or ``base_k`` with the smallest k that is not in ``taken``; added to ``taken``."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def subgraphs(node: ir.Node) -> list[ir.Graph]:
    """The graphs held by ``node``'s attributes (If branches, Loop/Scan bodies)."""
    subs = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            subs.append(attr.value)
        elif attr.type == ir.AttributeType.GRAPHS:
            subs.extend(attr.value)
    return subs


def const(v: ir.Value | None) -> np.ndarray | None:
    """The value's constant array (a packed weight's dequantized value), or None when it is computed."""
    if v is not None and v.const_value is None and meta.PACKED_WEIGHT.has(v):
        return meta.PACKED_WEIGHT.get(v)()
    return None if v is None or v.const_value is None else v.const_value.numpy()


@dataclass(frozen=True)
class Upstream:
    """What lies upstream of a value (``ancestors``): ids of the nodes and of the values reached."""

    nodes: frozenset
    values: frozenset


def ancestors(v: ir.Value, follow: Callable[[ir.Value], bool] = lambda u: True,
              inputs: Callable[[ir.Node], Iterable] = lambda n: n.inputs) -> Upstream:
    """The nodes and values ``v`` is computed from, walking backwards from ``v``'s producer.

    ``inputs(node)`` lists what a node reads (its inputs by default; a caller may add relayed or captured values),
    ``follow(u)`` says whether the walk passes an input ``u`` (e.g. ``carries``: only float activations). ``values``
    holds ``v`` and every followed input of a reached node (graph inputs among them), ``nodes`` the producers of
    those (``v``'s first)."""
    nodes: set[int] = set()
    values = {id(v)}
    stack = [v.producer()] if v.producer() is not None else []
    while stack:
        n = stack.pop()
        if id(n) in nodes:
            continue
        nodes.add(id(n))
        for u in inputs(n):
            if u is not None and follow(u):
                values.add(id(u))
                if u.producer() is not None:
                    stack.append(u.producer())
    return Upstream(frozenset(nodes), frozenset(values))
