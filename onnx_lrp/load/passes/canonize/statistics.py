"""Statistics written out by hand (jax2onnx, Flax) brought to the forms the normalisation patterns read: a sum of
squares as ``ReduceSum(x * x)``, the fast variance as the two-pass one, a sum divided by its count as a mean."""
from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from ...builder import const, new_param, only_consumer, substitute
from .values import clip_bounds, scalar


def sum_square_written_out(graph: ir.Graph) -> int:
    """``ReduceSumSquare(x)`` becomes ``ReduceSum(x * x)`` (jax2onnx's ``sum(d ** 2)`` in a hand-written variance):
    the square and the sum the variance patterns read. Exact."""
    opset = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0))
    done = 0
    for node in list(graph):
        if node.op_type != "ReduceSumSquare" or node.domain not in ("", "ai.onnx") or node.inputs[0] is None:
            continue
        x = node.inputs[0]
        if opset >= 18:
            axes = node.inputs[1] if len(node.inputs) > 1 else None
        else:
            listed = node.attributes.get_ints("axes", None)
            axes = None if listed is None else new_param(graph, f"{node.name}/axes", np.array(listed, np.int64))
        square = ir.node("Mul", [x, x], name=f"{node.name}/square")
        sq = square.outputs[0]
        sq.name, sq.type, sq.shape = f"{node.name}/square_out", x.type, x.shape
        graph.insert_before(node, square)
        attrs = {k: a for k, a in node.attributes.items() if k in ("keepdims", "noop_with_empty_axes")}
        total = ir.node("ReduceSum", [square.outputs[0]] + ([axes] if axes is not None else []), attrs,
                        name=f"{node.name}/sum")
        substitute(graph, total, node.outputs[0], node, f"{node.name}/sum_out")
        graph.remove(node)
        done += 1
    return done


def _square_of(v: ir.Value | None) -> ir.Value | None:
    """``x`` when ``v`` is ``x * x`` or ``x ** 2``, else None."""
    p = v.producer() if v is not None else None
    if p is None or p.domain not in ("", "ai.onnx") or len(p.inputs) != 2:
        return None
    if p.op_type == "Mul" and p.inputs[0] is p.inputs[1]:
        return p.inputs[0]
    if p.op_type == "Pow" and scalar(p.inputs[1]) == 2.0:
        return p.inputs[0]
    return None


def _reduce_spec(node: ir.Node | None):
    """(input, axes, keepdims) of a ReduceMean with constant axes (input or attribute), else None."""
    if node is None or node.op_type != "ReduceMean" or node.domain not in ("", "ai.onnx") or not node.inputs:
        return None
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = const(node.inputs[1])
        if axes is None:
            return None
        axes = tuple(sorted(int(a) for a in np.asarray(axes).reshape(-1)))
    else:
        attr = node.attributes.get("axes")
        axes = tuple(sorted(attr.value)) if attr is not None else None
    return node.inputs[0], axes, node.attributes.get_int("keepdims", 1)


def two_pass_variance(graph: ir.Graph) -> int:
    """``max(mean(x * x) - mean(x) ** 2, 0)`` (Flax's fast variance in LayerNorm / GroupNorm, as jax2onnx writes it;
    also without the clamp) becomes ``mean((x - mean(x)) ** 2)``, reading the centred ``x - mean(x)`` the norm
    already computes: the statistic the norm-scale pattern knows (mathematically equal; no cancellation)."""
    done = 0
    for sub in list(graph):
        if sub.op_type != "Sub" or sub.domain not in ("", "ai.onnx") or len(sub.inputs) != 2:
            continue
        second = _reduce_spec(sub.inputs[0].producer() if sub.inputs[0] is not None else None)
        m = _square_of(sub.inputs[1])
        first = _reduce_spec(m.producer() if m is not None else None)
        if second is None or first is None or second[1:] != first[1:] or not first[2]:
            continue
        x = _square_of(second[0])
        if x is None or x is not first[0]:
            continue
        out, clamp = sub.outputs[0], None
        user = only_consumer(out)
        if user is not None and user.op_type in ("Max", "Relu", "Clip") and user.domain in ("", "ai.onnx"):
            lows = [scalar(v) for v in user.inputs if v is not out] if user.op_type == "Max" else (
                [0.0] if user.op_type == "Relu" else [(clip_bounds(user) or (None,))[0]])
            if len(lows) == 1 and lows[0] == 0.0 and (user.op_type != "Clip" or clip_bounds(user)[1] == math.inf):
                out, clamp = user.outputs[0], user
        centred = next((u.node.outputs[0] for u in x.uses() if u.node.op_type == "Sub" and u.idx == 0
                        and len(u.node.inputs) == 2 and u.node.inputs[1] is m), None)
        mean_node = m.producer()
        new = []
        if centred is None:
            d = ir.node("Sub", [x, m], name=f"{sub.name}/centred")
            new.append(d)
            centred = d.outputs[0]
            centred.name, centred.type, centred.shape = f"{sub.name}/centred_out", x.type, x.shape
        sq = ir.node("Mul", [centred, centred], name=f"{sub.name}/square")
        sq.outputs[0].name, sq.outputs[0].type, sq.outputs[0].shape = f"{sub.name}/square_out", x.type, x.shape
        red_inputs = [sq.outputs[0]] + list(mean_node.inputs[1:])
        red = ir.node("ReduceMean", red_inputs, {k: v for k, v in mean_node.attributes.items()},
                      name=f"{sub.name}/variance")
        for n in new + [sq]:
            graph.insert_before(sub, n)
        substitute(graph, red, out, sub, f"{sub.name}/variance_out")  # graph.sort() below puts them in order
        dead = [clamp, sub, sub.inputs[1].producer(), sub.inputs[0].producer(), second[0].producer()]
        for n in dead:
            if n is not None and n.graph is graph and not any(o.uses() or o.is_graph_output() for o in n.outputs):
                graph.remove(n, safe=True)
        done += 1
    if done:
        graph.sort()
    return done


def mean_from_sum(graph: ir.Graph) -> int:
    """``ReduceSum(x) / n`` (or ``* 1/n``) with n the number of summed elements becomes ``ReduceMean(x)``: an
    average pool (jax2onnx writes ``x.mean(axis)`` so), not a sum followed by an element-wise scaling."""
    opset = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0))
    done = 0
    for red in list(graph):
        if red.op_type != "ReduceSum" or red.domain not in ("", "ai.onnx"):
            continue
        x = red.inputs[0]
        nxt = only_consumer(red.outputs[0])
        if x is None or x.shape is None or nxt is None or nxt.op_type not in ("Div", "Mul"):
            continue
        if nxt.inputs[0] is not red.outputs[0] and nxt.op_type == "Div":
            continue
        k = const(nxt.inputs[1] if nxt.inputs[0] is red.outputs[0] else nxt.inputs[0])
        if k is None or k.size != 1:
            continue
        rank = len(x.shape)
        axes = const(red.inputs[1]) if len(red.inputs) > 1 and red.inputs[1] is not None else None
        if axes is None:
            if len(red.inputs) > 1 and red.inputs[1] is not None:
                continue
            if red.attributes.get_int("noop_with_empty_axes", 0):
                continue
            axes = np.arange(rank)
        axes = sorted({int(a) % rank for a in np.asarray(axes).reshape(-1)})
        dims = [x.shape[a] for a in axes]
        if not axes or any(not isinstance(d, int) for d in dims):
            continue
        n = float(np.prod(dims))
        scale = float(k.reshape(())) if nxt.op_type == "Mul" else 1.0 / float(k.reshape(()))
        if abs(scale * n - 1.0) > 1e-6:
            continue
        keep = red.attributes.get_int("keepdims", 1)
        if opset >= 18:
            mean = ir.node("ReduceMean", [x, new_param(graph, f"{red.name}/axes", np.array(axes, np.int64))],
                           {"keepdims": keep}, name=f"{red.name}/mean")
        else:
            mean = ir.node("ReduceMean", [x], {"keepdims": keep, "axes": ir.AttrInt64s("axes", axes)},
                           name=f"{red.name}/mean")
        substitute(graph, mean, nxt.outputs[0], red, f"{red.name}/mean_out")
        graph.remove(nxt)
        graph.remove(red)
        done += 1
    return done
