"""Activations written out as element-wise ops made the op a PyTorch export writes: Keras' ``relu6(x + 3) / 6`` as
HardSigmoid, and ``x`` times it as HardSwish."""
from __future__ import annotations

import math

import onnx_ir as ir

from ...builder import only_consumer, substitute
from .values import clip_bounds, scalar


def hard_sigmoid_written_out(graph: ir.Graph) -> int:
    """``Clip(x + b, 0, h) * s`` with ``h * s = 1`` (Keras' ``relu6(x + 3) / 6`` as tf2onnx writes it, also with Div
    by ``1/s``, or without ``+ b``) becomes ``HardSigmoid(x, alpha=s, beta=b*s)``, and ``x * HardSigmoid(x)`` with
    alpha 1/6, beta 1/2 becomes ``HardSwish(x)``: the ops a PyTorch export writes, so that a squeeze-excitation gate
    is a gate and hard-swish an activation whoever exported it."""
    done = 0
    for node in list(graph):
        if node.op_type not in ("Mul", "Div") or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        a, b = node.inputs
        k = scalar(b)
        if k is None and node.op_type == "Mul":
            a, k = b, scalar(a)
        if k is None or k == 0 or a is None or a.producer() is None:
            continue
        scale = k if node.op_type == "Mul" else 1.0 / k
        clip = a.producer()
        bounds = clip_bounds(clip)
        if bounds is None or bounds[0] != 0.0 or not math.isfinite(bounds[1]) or abs(bounds[1] * scale - 1) > 1e-6:
            continue
        x, shift = clip.inputs[0], 0.0
        add = x.producer() if x is not None else None
        if add is not None and add.op_type in ("Add", "Sub") and add.domain in ("", "ai.onnx"):
            c = [scalar(v) for v in add.inputs]
            if add.op_type == "Add" and (c[0] is None) != (c[1] is None):
                x, shift = (add.inputs[0], c[1]) if c[1] is not None else (add.inputs[1], c[0])
            elif add.op_type == "Sub" and c[0] is None and c[1] is not None:
                x, shift = add.inputs[0], -c[1]
        if x is None or x.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16):
            continue
        hs = ir.node("HardSigmoid", [x], {"alpha": float(scale), "beta": float(shift * scale)},
                     name=f"{node.name}/hardsigmoid")
        substitute(graph, hs, node.outputs[0], node, f"{node.name}/hardsigmoid_out")
        graph.remove(node, safe=True)
        for dead in (clip, add):  # the written-out chain, where nothing else reads it
            if dead is not None and dead.graph is graph and not any(o.uses() or o.is_graph_output()
                                                                    for o in dead.outputs):
                graph.remove(dead, safe=True)
        done += 1
        # x * HardSigmoid(x) with torch's constants is HardSwish
        mul = only_consumer(hs.outputs[0])
        if (mul is None or mul.op_type != "Mul" or abs(scale - 1 / 6) > 1e-6 or abs(shift * scale - 0.5) > 1e-6
                or {id(v) for v in mul.inputs} != {id(x), id(hs.outputs[0])}):
            continue
        swish = ir.node("HardSwish", [x], name=f"{mul.name}/hardswish")
        substitute(graph, swish, mul.outputs[0], mul, f"{mul.name}/hardswish_out")
        graph.remove(mul, safe=True)
        graph.remove(hs, safe=True)
    return done
