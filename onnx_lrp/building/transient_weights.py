"""Packed weights dequantized where they are used, one float copy at a time.

A block-quantized (int4) weight stays packed in the relevance model: its ``DequantizeLinear`` (and, for float zero
points or a tied head, the few nodes after it: ``meta.KEEP_PACKED``) computes the float weight at run time. The
forward's MatMul and the relevance graph's products both read that float weight; with one shared
``DequantizeLinear`` its output would live from the forward until its last use in the backward, so every layer's
float weight would be alive at once (the peak: the float model, 8x the 4-bit weights).

This pass gives every consumer of a packed weight its own copy of the nodes that dequantize it, placed right before
that consumer, so a float weight lives only across the one product that reads it. onnxruntime runs such a model in
the order of its nodes (:func:`onnx_lrp.run.runtime` sets ``ExecutionOrder.PRIORITY_BASED`` and keeps common
subexpression elimination from merging the copies again, for models with ``block_size``). Each copy dequantizes the
same packed constants: the values are bit for bit the shared ones.
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
            node.replace_input_with(i, _copy(v, f"{node.name or node.op_type}_{i}", copies))
            graph.insert_before(node, copies)
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


def _drop_unused(graph: ir.Graph, outputs: set) -> None:
    """Remove the packed nodes nothing reads any more (consumers first)."""
    for node in reversed(list(graph)):
        if _packed(node) and not any(o.uses() or id(o) in outputs for o in node.outputs):
            graph.remove(node, safe=True)


__all__ = ["make_transient"]
