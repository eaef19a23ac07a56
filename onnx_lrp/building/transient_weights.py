"""Packed weights dequantized where they are used, one float copy at a time.

A block-quantized (int4) weight stays packed in the relevance model: its ``DequantizeLinear`` (and, for float zero
points or a tied head, the few nodes after it: ``meta.KEEP_PACKED``) computes the float weight at run time. The
forward's MatMul and the relevance graph's products both read that float weight; with one shared
``DequantizeLinear`` its output would live from the forward until its last use in the backward, so every layer's
float weight would be alive at once (the peak: the float model, 8x the 4-bit weights).

This pass gives every consumer of a packed weight its own copy of the nodes that dequantize it, placed right before
that consumer and made to wait for the consumer's activation (its scale plus a zero computed from that activation's
size), so a float weight lives only across the one product that reads it. onnxruntime keeps the copies apart and runs
such a model in the order of its nodes where it can (:mod:`onnx_lrp.run.runtime`: no common subexpression
elimination, ``ExecutionOrder.PRIORITY_BASED``, no CPU memory arena, for models with ``block_size``). Each copy
dequantizes the same packed constants: the values are bit for bit the shared ones.
"""
from __future__ import annotations

import onnx_ir as ir

from ..core import meta


def _packed(node: ir.Node | None) -> bool:
    return node is not None and bool(meta.KEEP_PACKED.get(node, False))


def make_transient(model: ir.Model) -> int:
    """Give every consumer of a packed weight its own dequantizing nodes, right before it (in place); the shared
    originals left without consumers are removed. Returns the number of consumers served."""
    graph = model.graph
    outputs = {id(v) for v in graph.outputs}
    served = 0
    for node in list(graph):
        if _packed(node):
            continue
        for i, v in enumerate(node.inputs):
            if v is None or not _packed(v.producer()) or id(v) in outputs:
                continue
            copies: list[ir.Node] = []
            tag = f"{node.name or node.op_type}_{i}"
            node.replace_input_with(i, _copy(v, tag, copies))
            graph.insert_before(node, _tied(copies, _activation(node), tag) + copies)
            served += 1
    if served:
        _drop_unused(graph, outputs)
    return served


def _copy(v: ir.Value, tag: str, copies: list) -> ir.Value:
    """A copy of ``v`` computed by copies of its packed producers (in ``copies``, in order); other inputs shared."""
    node = v.producer()
    if not _packed(node):
        return v
    inputs = [None if x is None else _copy(x, tag, copies) for x in node.inputs]
    attrs = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
    new = ir.Node(node.domain, node.op_type, inputs, attributes=attrs, num_outputs=len(node.outputs),
                  name=f"{node.name}/for/{tag}", version=node.version)
    for old, out in zip(node.outputs, new.outputs):
        out.name = f"{old.name}/for/{tag}"
        out.type, out.shape = old.type, old.shape
        if meta.PACKED_WEIGHT.has(old):
            meta.PACKED_WEIGHT.set(out, meta.PACKED_WEIGHT.get(old))
    meta.KEEP_PACKED.set(new, True)
    copies.append(new)
    return new.outputs[v.index()]


def _activation(node: ir.Node) -> ir.Value | None:
    """An input of ``node`` computed at run time (not a constant, not a packed weight): what its copy waits for."""
    for v in node.inputs:
        if v is not None and v.const_value is None and not _packed(v.producer()) and v.producer() is not None:
            return v
    return None


def _tied(copies: list, act: ir.Value | None, tag: str) -> list:
    """Make the copies wait for ``act``: the scale of each DequantizeLinear plus a zero computed from ``act``'s size
    (``Size(act) - Size(act)``, exact whatever ``act`` holds). onnxruntime's order otherwise runs a node as soon as its
    inputs exist: every copy, reading constants only, would run at the start (its float weight alive until its
    consumer runs, the peak of a shared one). Returns the nodes to insert before the copies."""
    if act is None:
        return []
    made: list[ir.Node] = []
    for dq in copies:
        if dq.op_type != "DequantizeLinear" or len(dq.inputs) < 2 or dq.inputs[1] is None or dq.inputs[1].dtype is None:
            continue
        scale = dq.inputs[1]
        size = ir.Node("", "Size", [act], name=f"{dq.name}/wait/size")
        zero = ir.Node("", "Sub", [size.outputs[0], size.outputs[0]], name=f"{dq.name}/wait/zero")
        cast = ir.Node("", "Cast", [zero.outputs[0]], attributes=[ir.AttrInt64("to", scale.dtype.value)],
                       name=f"{dq.name}/wait/cast")
        add = ir.Node("", "Add", [scale, cast.outputs[0]], name=f"{dq.name}/wait/scale")
        for n, dtype, shape in ((size, ir.DataType.INT64, []), (zero, ir.DataType.INT64, []),
                                (cast, scale.dtype, []), (add, scale.dtype, scale.shape)):
            n.outputs[0].name = n.name
            n.outputs[0].type = ir.TensorType(dtype)
            n.outputs[0].shape = ir.Shape(shape) if isinstance(shape, list) else shape
        dq.replace_input_with(1, add.outputs[0])
        made += [size, zero, cast, add]
    return made


def _drop_unused(graph: ir.Graph, outputs: set) -> None:
    """Remove the packed nodes nothing reads any more (consumers first)."""
    for node in reversed(list(graph)):
        if _packed(node) and not any(o.uses() or id(o) in outputs for o in node.outputs):
            graph.remove(node, safe=True)


__all__ = ["make_transient"]
