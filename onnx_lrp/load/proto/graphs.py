"""Walking an onnx ``ModelProto``: every graph (subgraphs of If / Loop / Scan included) and every node."""
from __future__ import annotations

import onnx


def all_graphs(proto: onnx.ModelProto):
    """The main graph and every subgraph (If / Loop / Scan bodies, nested), each once; a graph's subgraphs are
    found before it is handed out, so its caller may edit its nodes."""
    stack = [proto.graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(a.graphs)
        yield g


def all_nodes(proto: onnx.ModelProto):
    """Every node of the main graph, its subgraphs (If/Loop/Scan bodies) and the model's local functions."""
    for f in proto.functions:
        yield from f.node
    for g in all_graphs(proto):
        yield from g.node
