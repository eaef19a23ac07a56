"""Recurrent layers in batch-first layout (``layout = 1``; onnxruntime runs only ``layout = 0``) become Transposes
around the same op with ``layout = 0``."""
from __future__ import annotations

import onnx_ir as ir

from ...builder import bypass


def recurrent_layout0(graph: ir.Graph) -> int:
    """LSTM/GRU/RNN with layout=1 -> Transpose, the op with layout=0, Transpose (the same function)."""
    count = 0
    for node in list(graph):
        if node.op_type not in ("LSTM", "GRU", "RNN") or node.domain not in ("", "ai.onnx") \
                or node.attributes.get_int("layout", 0) != 1:
            continue
        base = node.name or node.op_type
        for i in (0, 5, 6):  # X [B, T, I] -> [T, B, I]; initial states [B, D, H] -> [D, B, H]
            if i < len(node.inputs) and node.inputs[i] is not None:
                src = node.inputs[i]
                t = ir.Value(name=f"{base}/layout0_in{i}", type=src.type,
                             shape=None if src.shape is None else ir.Shape([src.shape[k] for k in (1, 0, 2)]))
                graph.insert_before(node, ir.node("Transpose", [node.inputs[i]], {"perm": [1, 0, 2]}, outputs=[t],
                                                  name=f"{base}/layout0_in{i}"))
                node.replace_input_with(i, t)
        for i, perm in ((0, [2, 0, 1, 3]), (1, [1, 0, 2]), (2, [1, 0, 2])):  # back to batch first
            if i >= len(node.outputs):
                continue
            out = node.outputs[i]
            if not list(out.uses()) and not out.is_graph_output():
                continue
            t = ir.Value(name=f"{base}/layout1_out{i}", type=out.type, shape=out.shape)
            bypass(out, t)  # the consumers (and a graph output's name) move to t
            out.name = f"{base}/layout0_out{i}"
            if out.shape is not None:  # out = t transposed back: dims[perm[k]] = t dims[k]
                inv = [perm.index(k) for k in range(len(perm))]
                out.shape = ir.Shape([t.shape[j] for j in inv])
            graph.insert_after(node, ir.node("Transpose", [out], {"perm": perm}, outputs=[t],
                                             name=f"{base}/layout1_out{i}"))
        node.attributes["layout"] = ir.AttrInt64("layout", 0)
        count += 1
    return count
