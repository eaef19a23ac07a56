"""A constant Add after a linear layer recorded as that layer's bias, so that z+ / gamma / alpha-beta see one layer
``x W + b``."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ....core import meta
from ...builder import const, only_consumer


def absorb_bias(graph: ir.Graph) -> None:
    """Record ``Add(layer(x), b)`` with constant b as the bias of MatMul / bias-less Gemm / bias-less Conv."""
    for node in graph:
        if node.op_type not in ("MatMul", "Gemm", "Conv"):
            continue
        if node.op_type == "MatMul" and const(node.inputs[1]) is None:
            continue
        if node.op_type in ("Gemm", "Conv") and len(node.inputs) > 2 and node.inputs[2] is not None:
            continue
        w = const(node.inputs[1])
        if w is None:
            continue
        add = only_consumer(node.outputs[0])
        if add is None or add.op_type != "Add":
            continue
        other = add.inputs[1] if add.inputs[0] is node.outputs[0] else add.inputs[0]
        b = const(other)
        if b is None:
            continue
        if node.op_type == "Conv":
            n_out, shape = w.shape[0], node.outputs[0].shape
            if shape is None or b.ndim > len(shape):
                continue
            padded = (1,) * (len(shape) - b.ndim) + tuple(b.shape)
            if any(d != 1 for i, d in enumerate(padded) if i != 1) or padded[1] not in (1, n_out):
                continue
            bias = np.broadcast_to(b.reshape(-1), (n_out,))
        else:
            trans_b = node.op_type == "Gemm" and node.attributes.get_int("transB", 0)
            n_out = w.shape[0] if trans_b else w.shape[-1]
            if b.size not in (1, n_out) or (b.ndim > 1 and any(d != 1 for d in b.shape[:-1])):
                continue
            bias = np.broadcast_to(b.reshape(-1), (n_out,))
        meta.BIAS_ADD.set(node, add)
        meta.BIAS.set(node, np.ascontiguousarray(bias))
        meta.ABSORBED_BY.set(add, node)
