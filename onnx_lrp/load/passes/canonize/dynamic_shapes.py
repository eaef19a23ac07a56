"""Shape arithmetic exporters write for a dynamic batch, made static where it is exact (jax2onnx): Slice ends built
from the sliced axes' own lengths, ``Reduce(keepdims=0) -> Reshape -> Expand`` for ``keepdims=True``."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...builder import bypass, const, new_param, substitute
from .values import dim_of, same_dim, same_shape


def slice_to_the_end(graph: ir.Graph) -> int:
    """A Slice whose ``ends`` is a Concat of constants and the sliced axes' own lengths (jax2onnx: ``Concat(
    Gather(Shape(x), 0), 16, 16, 3)`` for ``x[:, 15:, :, :]`` with a dynamic batch: Flax's circular padding,
    ``jnp.pad`` reflect), or a constant plus such a Concat (``lax.dynamic_slice``: starts + sizes), gets constant
    ends, "to the end" (INT64_MAX) where the length was: the same slice for positive steps, and the op handler then
    needs no run-time bounds."""
    count = 0
    for node in list(graph):
        if node.op_type != "Slice" or len(node.inputs) < 3 or node.inputs[2] is None:
            continue
        x, ends = node.inputs[0], node.inputs[2]
        if ends.const_value is not None or x is None or x.shape is None or ends.producer() is None:
            continue
        cat, offsets = ends.producer(), None
        if cat.op_type == "Add" and len(cat.inputs) == 2:  # lax.dynamic_slice: ends = starts + sizes
            k = 0 if cat.inputs[0] is not None and cat.inputs[0].const_value is not None else 1
            if cat.inputs[k] is None or cat.inputs[k].const_value is None or cat.inputs[1 - k] is None:
                continue
            offsets = cat.inputs[k].const_value.numpy().reshape(-1)
            cat = cat.inputs[1 - k].producer()
            if cat is None:
                continue
        if cat.op_type != "Concat" or any(v is None for v in cat.inputs):
            continue
        rank = len(x.shape)
        n = len(cat.inputs)
        if offsets is None:
            offsets = np.zeros(n, np.int64)
        if offsets.size not in (1, n):
            continue
        offsets = np.broadcast_to(offsets, (n,))
        axes = const(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else np.arange(n)
        steps = const(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else np.ones(n)
        if axes is None or steps is None or len(axes) != n or len(steps) != n or np.any(steps <= 0):
            continue
        new = []
        for part, ax, off in zip(cat.inputs, axes, offsets):
            d = dim_of(part)
            if d is None or not -rank <= int(ax) < rank:
                break
            if isinstance(d, int) and part.const_value is not None:
                new.append(d + int(off))
            elif same_dim(d, x.shape[int(ax)]) and off >= 0:  # the length or beyond: clamped to the length
                new.append(np.iinfo(np.int64).max)
            else:
                break
        else:
            node.replace_input_with(2, new_param(graph, f"{node.name}_ends", np.array(new, np.int64)))
            count += 1
    return count


_REDUCE_KEEPDIMS = {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2",
                    "ReduceProd", "ReduceLogSumExp", "ReduceLogSum"}


def keepdims_broadcasts(graph: ir.Graph) -> int:
    """jax2onnx writes ``x.mean(axis, keepdims=True)`` (also inside a hand-written LayerNorm / ``jnp.var``) as
    ``Reduce(keepdims=0) -> Reshape(to the kept shape, from Shape(x)) -> Expand(to that same shape)``. The Expand to
    its own input's shape is dropped, and the Reshape to the reduction's keepdims shape becomes the same reduction
    with ``keepdims=1``: the form the normalisation patterns read. Exact rewrites (shapes compared dimension by
    dimension, symbols by name); the old reduction stays where something else (a Shape) reads it."""
    done = 0
    for node in list(graph):
        if node.op_type == "Expand" and node.domain in ("", "ai.onnx") and same_shape(node.inputs[0],
                                                                                      node.outputs[0]):
            bypass(node.outputs[0], node.inputs[0])
            graph.remove(node)
            done += 1
    opset = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0))
    taken = {n.name for n in graph}
    for node in list(graph):
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or node.inputs[0] is None:
            continue
        red = node.inputs[0].producer()
        if red is None or red.op_type not in _REDUCE_KEEPDIMS or red.domain not in ("", "ai.onnx") \
                or red.attributes.get_int("keepdims", 1) != 0 or red.inputs[0] is None or red.inputs[0].shape is None:
            continue
        x, rank = red.inputs[0], len(red.inputs[0].shape)
        with_axes_input = opset >= 18 or red.op_type == "ReduceSum"
        if with_axes_input:
            axes = const(red.inputs[1]) if len(red.inputs) > 1 and red.inputs[1] is not None else None
        else:
            axes = red.attributes.get_ints("axes", None)
        if axes is None or red.attributes.get_int("noop_with_empty_axes", 0):
            continue  # no axes (all of them, or none): not what jax2onnx writes here
        kept = {int(a) % rank for a in np.asarray(axes).reshape(-1)}
        want = [1 if i in kept else d for i, d in enumerate(x.shape)]
        out = node.outputs[0]
        if out.shape is None or len(out.shape) != rank or not all(
                (w == 1 and d == 1) if w == 1 else same_dim(w, d) for w, d in zip(want, out.shape)):
            continue
        attrs = {k: a for k, a in red.attributes.items() if k != "keepdims"}
        attrs["keepdims"] = ir.AttrInt64("keepdims", 1)
        base = f"{red.name}/keepdims" if f"{red.name}/keepdims" not in taken else f"{node.name}/keepdims"
        taken.add(base)
        new = ir.node(red.op_type, list(red.inputs), attrs, name=base)
        substitute(graph, new, out, node, f"{base}_out")
        graph.remove(node)
        if not list(red.outputs[0].uses()) and not red.outputs[0].is_graph_output():
            graph.remove(red)
        done += 1
    return done
