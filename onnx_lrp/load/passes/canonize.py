"""The standard form: canonizers that rewrite what exporters write into the form the rules expect (cf.
zennit.canonizers); one pass, :class:`StandardForm`, runs them in order (the last loading pass before folding).

- Identity and Dropout are dropped (not a Dropout in training mode: its op check refuses it).
- A Slice whose ends are a Concat of constants and the sliced axes' own lengths (jax2onnx, dynamic batch) gets
  constant ends.
- ``ReduceSumSquare(x)`` becomes ``ReduceSum(x * x)``.
- ``Reduce(keepdims=0) -> Reshape(kept shape) -> Expand(same shape)`` (jax2onnx's ``keepdims=True``) becomes the
  reduction with ``keepdims=1``; a Where with a constant all-true (all-false) condition is its first (second) branch.
- A reduction over the batch axis whose result returns to the items (batch statistics) is marked
  ``node.meta['lrp_couples_items']``: its op check refuses it.
- ``auto_pad`` becomes explicit ``pads`` (static spatial shapes needed, or stride 1 along a dynamic axis).
- BatchNormalization directly after a Conv/Gemm (its only consumer) is folded into that layer's parameters.
- Per-channel constant scale/shift chains (Mul/Add/Sub/Div by a constant that varies along the layer's output
  channel axis only, in any order, also across a Transpose after a Conv: tf2onnx writes Keras BatchNormalization
  as Mul -> Add) directly after a Conv/Gemm/MatMul with constant weights are folded into that layer like a
  BatchNormalization. Those that cannot be folded (after a residual sum, a pool, at the input) are marked
  ``node.meta['lrp_channel_affine']``: they get BatchNormalization's kind ("batchnorm"), not "affine".
- An Add of a constant directly after a MatMul, a bias-less Gemm or a bias-less Conv is recorded as that layer's
  bias (``node.meta['lrp_bias_add']``), so that z+ / gamma / alpha-beta see one layer ``x W + b``.
- ``Clip(x + 3, 0, 6) / 6`` (Keras' hard sigmoid written out) becomes ``HardSigmoid``, and ``x`` times it
  ``HardSwish``, as a PyTorch export writes them.
- Flax's fast variance ``max(mean(x * x) - mean(x) ** 2, 0)`` becomes ``mean((x - mean(x)) ** 2)``.
- ``ReduceSum(x) / n`` over n elements becomes ``ReduceMean(x)`` (jax2onnx's mean).
- LSTM / GRU / RNN with ``layout = 1`` (batch first; onnxruntime runs only ``layout = 0``) become Transposes around
  the same op with ``layout = 0``.
"""
from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from ...core import meta
from ..builder import LoadPass, Report, bypass, const, new_param, only_consumer, substitute


_SPATIAL_OPS = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"}


def drop_identities(graph: ir.Graph) -> None:
    for node in list(graph):
        if node.op_type not in ("Identity", "Dropout") or node.domain not in ("", "ai.onnx"):
            continue
        out, src = node.outputs[0], node.inputs[0]
        if node.op_type == "Dropout" and len(node.outputs) > 1 and list(node.outputs[1].uses()):
            continue
        if node.op_type == "Dropout" and _training(node):
            continue  # random masks on every run: kept, so that its op check refuses it (not explained as eval)
        if out.is_graph_output():
            if src.is_graph_input() or src.is_graph_output() or src.const_value is not None:
                continue  # the Identity keeps two graph names apart
        bypass(out, src)
        graph.remove(node)


def _training(node: ir.Node) -> bool:
    """A Dropout whose ``training_mode`` input is true or not a constant (jax2onnx writes nnx.Dropout with
    ``deterministic=False`` as a constant true)."""
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return False
    mode = node.inputs[2].const_value
    return mode is None or bool(np.any(mode.numpy()))


def _dim_of(v: ir.Value | None):
    """The one dimension (an int or a symbol) a 1-element int64 value holds: a constant, ``Shape(x, start, end)``
    of one axis, or ``Gather(Shape(x), [i])`` (jax2onnx writes a dynamic batch size so); None otherwise."""
    if v is None:
        return None
    if v.const_value is not None:
        arr = v.const_value.numpy()
        return int(arr.reshape(-1)[0]) if arr.size == 1 else None
    p = v.producer()
    if p is None:
        return None
    if p.op_type == "Shape" and p.inputs[0] is not None and p.inputs[0].shape is not None:
        dims = list(p.inputs[0].shape)
        picked = dims[p.attributes.get_int("start", 0):p.attributes.get_int("end", len(dims))]
        return picked[0] if len(picked) == 1 else None
    if (p.op_type == "Gather" and p.inputs[1] is not None and p.inputs[1].const_value is not None
            and p.inputs[0].producer() is not None and p.inputs[0].producer().op_type == "Shape"
            and p.attributes.get_int("axis", 0) == 0):
        shape = p.inputs[0].producer()
        x, idx = shape.inputs[0], p.inputs[1].const_value.numpy().reshape(-1)
        if x is None or x.shape is None or idx.size != 1 or shape.attributes.get_int("start", 0) != 0 \
                or "end" in shape.attributes:
            return None
        dims = list(x.shape)
        return dims[int(idx[0])] if -len(dims) <= int(idx[0]) < len(dims) else None
    return None


def _same_dim(a, b) -> bool:
    """Equal dimensions: the same int, or the same named symbol (ONNX: one name, one length)."""
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    return a is not None and b is not None and a.value is not None and a.value == b.value


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
            d = _dim_of(part)
            if d is None or not -rank <= int(ax) < rank:
                break
            if isinstance(d, int) and part.const_value is not None:
                new.append(d + int(off))
            elif _same_dim(d, x.shape[int(ax)]) and off >= 0:  # the length or beyond: clamped to the length
                new.append(np.iinfo(np.int64).max)
            else:
                break
        else:
            node.replace_input_with(2, new_param(graph, f"{node.name}_ends", np.array(new, np.int64)))
            count += 1
    return count


def _same_shape(a: ir.Value | None, b: ir.Value | None) -> bool:
    return (a is not None and b is not None and a.shape is not None and b.shape is not None
            and len(a.shape) == len(b.shape) and all(_same_dim(x, y) for x, y in zip(a.shape, b.shape)))


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
        if node.op_type == "Expand" and node.domain in ("", "ai.onnx") and _same_shape(node.inputs[0],
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
                (w == 1 and d == 1) if w == 1 else _same_dim(w, d) for w, d in zip(want, out.shape)):
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


def where_constant(graph: ir.Graph) -> int:
    """``Where(c, a, b)`` with a constant condition that is true (false) everywhere and ``a`` (``b``) already of the
    output's shape is ``a`` (``b``): jax2onnx guards ``jnp.var``'s divisor ``n - ddof > 0`` so, with NaN otherwise."""
    done = 0
    for node in list(graph):
        if node.op_type != "Where" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 3:
            continue
        c = const(node.inputs[0])
        if c is None or c.size == 0 or not (np.all(c) or not np.any(c)):
            continue
        pick = node.inputs[1] if np.all(c) else node.inputs[2]
        if pick is None or not _same_shape(pick, node.outputs[0]) or pick.dtype != node.outputs[0].dtype:
            continue
        bypass(node.outputs[0], pick)
        graph.remove(node)
        done += 1
    return done


def _reduced_axes(node: ir.Node, rank: int) -> set[int] | None:
    """The axes a Reduce* node reduces (None when not constant)."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = const(node.inputs[1])
        if axes is None:
            return None
        axes = [int(a) for a in np.asarray(axes).reshape(-1)]
    else:
        axes = list(node.attributes.get_ints("axes", []))
    if not axes:
        return set() if node.attributes.get_int("noop_with_empty_axes", 0) else set(range(rank))
    return {a % rank for a in axes}


def mark_batch_coupling(graph: ir.Graph) -> int:
    """A reduction over the batch axis (a dimension named like a graph input's first one) whose result comes back
    into the items (a value computed from it has that batch dimension again: ``h - h.mean(axis=0)``, batch
    statistics written by hand) makes every item's output depend on the other items: its relevance would leak
    across items. The reduction is marked (``node.meta['lrp_couples_items']``) and its op check refuses it.
    A reduction whose result never returns to the items (an output explained as one whole) is not marked."""
    batch = {d.value for v in graph.inputs if v.shape is not None and len(v.shape) > 0
             for d in [v.shape[0]] if isinstance(d, ir.SymbolicDim) and d.value}
    if not batch:
        return 0
    origin: dict[int, ir.Node] = {}  # value id -> the batch reduction it is computed from
    marked = 0
    for node in graph:
        if node.op_type.startswith("Reduce") and node.domain in ("", "ai.onnx") and node.inputs \
                and node.inputs[0] is not None and node.inputs[0].shape is not None and len(node.inputs[0].shape):
            x = node.inputs[0]
            d0 = x.shape[0]
            axes = _reduced_axes(node, len(x.shape))
            if isinstance(d0, ir.SymbolicDim) and d0.value in batch and axes is not None and 0 in axes:
                for o in node.outputs:
                    origin[id(o)] = node
                continue
        src = next((origin[id(v)] for v in node.inputs if v is not None and id(v) in origin), None)
        if src is None:
            continue
        for o in node.outputs:
            origin[id(o)] = src
            d0 = o.shape[0] if o.shape is not None and len(o.shape) else None
            if isinstance(d0, ir.SymbolicDim) and d0.value in batch and not meta.COUPLES_ITEMS.has(src):
                meta.COUPLES_ITEMS.set(src, (
                    f"reduces over the batch axis ('{d0.value}', axis 0) and its result returns to the items at "
                    f"{node.name} ({node.op_type}): each item's output depends on the other items (batch "
                    "statistics), so per-item relevance is not defined; export the model in eval mode (running "
                    "statistics), or fix the batch to 1 (input_shapes / --input-shape) to explain one item at a time"))
                marked += 1
    return marked


def explicit_pads(graph: ir.Graph) -> None:
    for node in graph:
        if node.op_type not in _SPATIAL_OPS:
            continue
        auto = node.attributes.get_string("auto_pad", "NOTSET")
        if auto in ("NOTSET", ""):
            continue
        x = node.inputs[0]
        if auto == "VALID":
            nd = len(x.shape) - 2 if x.shape is not None else len(node.attributes.get_ints("kernel_shape", []))
            node.attributes["pads"] = ir.AttrInt64s("pads", [0] * (2 * nd))
            node.attributes.pop("auto_pad")
            continue
        if x.shape is None:
            continue  # left as is; the op handler reports it
        spatial = [d if isinstance(d, int) else None for d in list(x.shape)[2:]]
        nd = len(spatial)
        if node.op_type in ("Conv", "ConvTranspose"):
            w = const(node.inputs[1])
            kernel = list(node.attributes.get_ints("kernel_shape", w.shape[2:] if w is not None else []))
        else:
            kernel = list(node.attributes.get_ints("kernel_shape"))
        strides = list(node.attributes.get_ints("strides", [1] * nd))
        dil = list(node.attributes.get_ints("dilations", [1] * nd))
        if node.op_type == "ConvTranspose":
            continue  # ConvTranspose's auto_pad refers to its output; handled by its op
        if any(size is None and s != 1 for size, s in zip(spatial, strides)):
            continue  # a dynamic axis with stride > 1: its padding depends on the length; the op handler reports it
        begins, ends = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dil):
            # stride 1: the output keeps the length and the total padding is (k - 1) d whatever the length
            out = math.ceil(size / s) if size is not None else None
            total = (k - 1) * d if size is None else max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            if auto == "SAME_UPPER":
                begins.append(small)
                ends.append(total - small)
            else:
                begins.append(total - small)
                ends.append(small)
        node.attributes["pads"] = ir.AttrInt64s("pads", begins + ends)
        node.attributes.pop("auto_pad")


def fold_batchnorm(graph: ir.Graph) -> int:
    """Fold BatchNormalization into a directly preceding Conv or Gemm with constant weights."""
    folded = 0
    for bn in list(graph):
        if bn.op_type != "BatchNormalization" or bn.attributes.get_int("training_mode", 0):
            continue
        x = bn.inputs[0]
        layer = x.producer()
        if layer is None or layer.op_type not in ("Conv", "Gemm") or only_consumer(x) is not bn:
            continue
        if len(bn.outputs) > 1 and any(list(o.uses()) for o in bn.outputs[1:]):
            continue
        scale, shift, mean, var = (const(v) for v in bn.inputs[1:5])
        w = const(layer.inputs[1])
        if any(a is None for a in (scale, shift, mean, var, w)):
            continue
        eps = bn.attributes.get_float("epsilon", 1e-5)
        if len({scale.shape, shift.shape, mean.shape, var.shape}) != 1 or scale.ndim != 1 or w.ndim < 2:
            continue  # malformed: left to BatchNormalization's own check, which names it
        a = (scale / np.sqrt(var + eps)).astype(np.float64)
        b = const(layer.inputs[2]) if len(layer.inputs) > 2 and layer.inputs[2] is not None else None
        n_out = w.shape[0] if layer.op_type == "Conv" or layer.attributes.get_int("transB", 0) else w.shape[1]
        if a.shape != (n_out,) or (b is not None and (b.size not in (1, n_out) or (
                layer.op_type == "Conv" and b.shape != (n_out,)))):
            continue
        if layer.op_type == "Conv":
            if w.shape[0] != a.shape[0]:
                continue
            w_new = w * a.reshape((-1,) + (1,) * (w.ndim - 1))
            b0 = b if b is not None else np.zeros(w.shape[0])
        else:
            if layer.attributes.get_int("transA", 0):
                continue
            alpha = layer.attributes.get_float("alpha", 1.0)
            beta = layer.attributes.get_float("beta", 1.0)
            trans_b = layer.attributes.get_int("transB", 0)
            w_new = alpha * (w * a[:, None] if trans_b else w * a[None, :])
            b0 = beta * np.broadcast_to(b.reshape(-1), a.shape) if b is not None else np.zeros(a.shape)
            layer.attributes["alpha"] = ir.AttrFloat32("alpha", 1.0)
            layer.attributes["beta"] = ir.AttrFloat32("beta", 1.0)
        b_new = (b0 - mean) * a + shift
        dtype = w.dtype
        w_val = new_param(graph, f"{layer.name}/weight_bn", w_new.astype(dtype))
        b_val = new_param(graph, f"{layer.name}/bias_bn", b_new.astype(dtype))
        layer.replace_input_with(1, w_val)
        if len(layer.inputs) > 2:
            layer.replace_input_with(2, b_val)
        else:
            layer.resize_inputs(3)
            layer.replace_input_with(2, b_val)
        bypass(bn.outputs[0], x)
        graph.remove(bn)
        folded += 1
    return folded


_CHAIN_OPS = ("Mul", "Add", "Sub", "Div")


def _per_channel(k: np.ndarray, rank: int, axis: int, n: int | None) -> np.ndarray | None:
    """``k`` as one value per channel (length ``n``) when it broadcasts against a rank-``rank`` tensor along
    ``axis`` only (a scalar counts), without enlarging the tensor; else None."""
    if k.ndim > rank or (k.dtype.kind != "f"):
        return None
    padded = (1,) * (rank - k.ndim) + tuple(k.shape)
    if any(d != 1 for i, d in enumerate(padded) if i != axis):
        return None
    if n is None:
        return k.reshape(-1).astype(np.float64)
    if padded[axis] not in (1, n):
        return None
    return np.broadcast_to(k.reshape(-1), (n,)).astype(np.float64)


def _chain_step(node: ir.Node, v: ir.Value, rank: int, axis: int, n: int | None):
    """For an element-wise op with ``v`` as its activation and a per-channel constant: (scale, shift) of the map
    ``v -> node(v)`` per channel, else None."""
    if node.op_type not in _CHAIN_OPS or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    if node.inputs[0] is v and node.inputs[1] is not v:
        i = 0
    elif node.inputs[1] is v and node.inputs[0] is not v:
        i = 1
    else:
        return None
    k = const(node.inputs[1 - i])
    if k is None:
        return None
    k = _per_channel(k, rank, axis, n)
    if k is None:
        return None
    one, zero = np.ones_like(k), np.zeros_like(k)
    t = node.op_type
    if t == "Mul":
        return k, zero
    if t == "Add":
        return one, k
    if t == "Sub":
        return (one, -k) if i == 0 else (-one, k)
    if i == 1 or np.any(k == 0):  # c / x is not affine; x / 0 is left to the runtime
        return None
    return 1.0 / k, zero


def _squeezed_axes(node: ir.Node, rank: int) -> set[int] | None:
    """The axes (non-negative) a ``Squeeze`` node with constant axes removes from a rank-``rank`` input, else None
    (another op, axes unknown, or the output is a graph output)."""
    if node.op_type != "Squeeze" or node.domain not in ("", "ai.onnx") or node.outputs[0].is_graph_output():
        return None
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = const(node.inputs[1])
    else:
        attr = node.attributes.get("axes")
        axes = None if attr is None else np.asarray(attr.as_ints())
    if axes is None or axes.size == 0 or node.inputs[0].shape is None:
        return None
    axes = {int(a) % rank for a in np.asarray(axes).reshape(-1)}
    return axes if all(node.inputs[0].shape[a] == 1 for a in axes) else None


def fold_channel_affine(graph: ir.Graph) -> int:
    """Fold per-channel constant Mul/Add/Sub/Div chains into the Conv/Gemm/MatMul (constant weights) they follow."""
    folded = 0
    for layer in list(graph):
        if layer.op_type not in ("Conv", "Gemm", "MatMul") or layer.domain not in ("", "ai.onnx"):
            continue
        w = const(layer.inputs[1]) if len(layer.inputs) > 1 else None
        if w is None or w.dtype.kind != "f" or const(layer.inputs[0]) is not None:
            continue
        y = layer.outputs[0]
        if layer.op_type == "Conv":
            n, rank, axis = w.shape[0], w.ndim, 1
        elif layer.op_type == "Gemm":
            trans_b = layer.attributes.get_int("transB", 0)
            n, rank, axis = (w.shape[0] if trans_b else w.shape[1]), 2, 1
        else:
            if w.ndim != 2 or y.shape is None:
                continue
            n, rank = w.shape[1], len(y.shape)
            axis = rank - 1
        scale, shift = np.ones(n), np.zeros(n)
        chain, v = [], y
        while True:
            nxt = only_consumer(v)
            if nxt is None:
                break
            if (nxt.op_type == "Transpose" and layer.op_type == "Conv" and nxt.domain in ("", "ai.onnx")
                    and not nxt.outputs[0].is_graph_output()):
                perm = list(nxt.attributes.get_ints("perm", list(range(rank))[::-1]))
                axis, v = perm.index(axis), nxt.outputs[0]
                continue
            squeezed = _squeezed_axes(nxt, rank) if layer.op_type == "Conv" else None
            if squeezed is not None:  # tf2onnx's Conv1D: Conv on N x C x 1 x W, then Squeeze of the 1
                if axis in squeezed:
                    break
                axis, rank, v = axis - sum(a < axis for a in squeezed), rank - len(squeezed), nxt.outputs[0]
                continue
            step = _chain_step(nxt, v, rank, axis, n)
            if step is None:
                break
            k_scale, k_shift = step
            scale, shift = scale * k_scale, shift * k_scale + k_shift
            chain.append(nxt)
            v = nxt.outputs[0]
        if not chain:
            continue
        if layer.op_type == "MatMul" and chain[-1].outputs[0].is_graph_output():
            continue  # the new bias Add would have to take over the output's name: left as it is
        b = const(layer.inputs[2]) if len(layer.inputs) > 2 and layer.inputs[2] is not None else None
        dtype = w.dtype
        # an unscaled chain (a bias Add) keeps the weight as it is: no copy of a large model's weights
        keep_w = bool(np.all(scale == 1)) and (layer.op_type != "Gemm" or layer.attributes.get_float("alpha", 1.0) == 1)
        scale_w = scale.astype(dtype)  # scaled in the weight's type: no float64 copy of the weight
        if layer.op_type == "Conv":
            if b is not None and b.size not in (1, n):
                continue
            w_new = None if keep_w else w * scale_w.reshape((-1,) + (1,) * (w.ndim - 1))
            b0 = np.broadcast_to(b.reshape(-1), (n,)) if b is not None else np.zeros(n)
        elif layer.op_type == "Gemm":
            if b is not None and b.size not in (1, n):
                continue
            alpha = layer.attributes.get_float("alpha", 1.0)
            beta = layer.attributes.get_float("beta", 1.0)
            w_new = None if keep_w else alpha * (w * scale_w[:, None] if trans_b else w * scale_w[None, :])
            b0 = beta * np.broadcast_to(b.reshape(-1), (n,)) if b is not None else np.zeros(n)
            layer.attributes["alpha"] = ir.AttrFloat32("alpha", 1.0)
            layer.attributes["beta"] = ir.AttrFloat32("beta", 1.0)
        else:
            w_new, b0 = None if keep_w else w * scale_w[None, :], np.zeros(n)
        b_new = b0 * scale + shift
        if w_new is not None:
            layer.replace_input_with(1, new_param(graph, f"{layer.name}/weight_folded", w_new.astype(dtype)))
        for node in chain:
            data = next(x for x in node.inputs if const(x) is None)
            bypass(node.outputs[0], data)
            graph.remove(node)
        if layer.op_type in ("Conv", "Gemm"):
            b_val = new_param(graph, f"{layer.name}/bias_folded", b_new.astype(dtype))
            if len(layer.inputs) < 3:
                layer.resize_inputs(3)
            layer.replace_input_with(2, b_val)
        elif np.any(b_new):
            b_val = new_param(graph, f"{layer.name}/bias_folded", b_new.astype(dtype))
            add = ir.node("Add", [y, b_val], name=f"{layer.name}/bias_add")
            add.outputs[0].type, add.outputs[0].shape = y.type, y.shape
            add.outputs[0].name = f"{y.name}/biased"
            for use in list(y.uses()):
                if use.node is not add:
                    use.node.replace_input_with(use.idx, add.outputs[0])
            graph.insert_after(layer, add)
        folded += len(chain)
    return folded


def mark_channel_affine(graph: ir.Graph) -> None:
    """Mark element-wise ops of an activation with a per-channel (not scalar) constant that could not be folded:
    an unfolded BatchNormalization written as Mul/Add, which gets BatchNormalization's kind. The channel axis is
    axis 1 (NCHW, N x C) or the last one (NHWC, N x T x C)."""
    for node in graph:
        if node.op_type not in _CHAIN_OPS or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        acts = [v for v in node.inputs if const(v) is None]
        if len(acts) != 1 or acts[0].shape is None:
            continue
        k = const(node.inputs[1] if node.inputs[0] is acts[0] else node.inputs[0])
        rank = len(acts[0].shape)
        if k is None or rank < 2 or k.size <= 1 or k.ndim > rank:
            continue
        axis = rank - k.ndim + int(np.argmax(k.shape))
        if axis not in (1, rank - 1) or _chain_step(node, acts[0], rank, axis, None) is None:
            continue
        if node.op_type in ("Add", "Sub") and _sum_of_linear(acts[0]):
            continue  # the bias of x W + h U (a Keras LSTM cell written out): its share is absorbed, as a bias's
        meta.CHANNEL_AFFINE.set(node, axis)


def _sum_of_linear(v: ir.Value) -> bool:
    """``v`` is a sum of outputs of linear layers with constant weights (MatMul/Gemm/Conv), e.g. ``x W + h U``."""
    p = v.producer()
    if p is None or p.op_type not in ("Add", "Sum") or p.domain not in ("", "ai.onnx"):
        return False
    for i in p.inputs:
        q = i.producer() if i is not None else None
        if q is None or q.op_type not in ("MatMul", "Gemm", "Conv") or len(q.inputs) < 2 or const(q.inputs[1]) is None:
            return False
    return True


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


def _scalar(v: ir.Value | None) -> float | None:
    k = const(v)
    return float(k.reshape(())) if k is not None and k.size == 1 and k.dtype.kind == "f" else None


def _clip_bounds(node: ir.Node) -> tuple[float, float] | None:
    """(low, high) of a Clip with constant bounds (opset >= 11 inputs or opset 6 attributes), else None."""
    if node.op_type != "Clip" or node.domain not in ("", "ai.onnx"):
        return None
    if len(node.inputs) > 1:
        lo = _scalar(node.inputs[1]) if node.inputs[1] is not None else -math.inf
        hi = _scalar(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else math.inf
        return None if lo is None or hi is None else (lo, hi)
    return node.attributes.get_float("min", -math.inf), node.attributes.get_float("max", math.inf)


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
        k = _scalar(b)
        if k is None and node.op_type == "Mul":
            a, k = b, _scalar(a)
        if k is None or k == 0 or a is None or a.producer() is None:
            continue
        scale = k if node.op_type == "Mul" else 1.0 / k
        clip = a.producer()
        bounds = _clip_bounds(clip)
        if bounds is None or bounds[0] != 0.0 or not math.isfinite(bounds[1]) or abs(bounds[1] * scale - 1) > 1e-6:
            continue
        x, shift = clip.inputs[0], 0.0
        add = x.producer() if x is not None else None
        if add is not None and add.op_type in ("Add", "Sub") and add.domain in ("", "ai.onnx"):
            c = [_scalar(v) for v in add.inputs]
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


def _square_of(v: ir.Value | None) -> ir.Value | None:
    """``x`` when ``v`` is ``x * x`` or ``x ** 2``, else None."""
    p = v.producer() if v is not None else None
    if p is None or p.domain not in ("", "ai.onnx") or len(p.inputs) != 2:
        return None
    if p.op_type == "Mul" and p.inputs[0] is p.inputs[1]:
        return p.inputs[0]
    if p.op_type == "Pow" and _scalar(p.inputs[1]) == 2.0:
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
            lows = [_scalar(v) for v in user.inputs if v is not out] if user.op_type == "Max" else (
                [0.0] if user.op_type == "Relu" else [(_clip_bounds(user) or (None,))[0]])
            if len(lows) == 1 and lows[0] == 0.0 and (user.op_type != "Clip" or _clip_bounds(user)[1] == math.inf):
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


class StandardForm(LoadPass):
    """The canonizers of this module, in order (see the module docstring)."""

    def apply(self, model: ir.Model, report: Report) -> int:
        canonize(model)
        return 1


def layernorm_without_empty_bias(graph: ir.Graph) -> None:
    """LayerNormalization(x, scale, "") -> LayerNormalization(x, scale): the same op (the bias is optional), but the
    empty input name crashes onnxruntime 1.32's optimisations (a segfault, found by the fuzzer)."""
    for node in list(graph):
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        inputs = list(node.inputs)
        if len(inputs) < 3 or inputs[-1] is not None:
            continue
        while inputs and inputs[-1] is None:
            inputs.pop()
        new = ir.node("LayerNormalization", inputs, {k: a for k, a in node.attributes.items()},
                      num_outputs=len(node.outputs), name=node.name)
        for old_out, new_out in zip(node.outputs, new.outputs):
            new_out.type, new_out.shape = old_out.type, old_out.shape
        graph.insert_before(node, new)
        names = [o.name for o in node.outputs]
        for old_out, new_out in zip(node.outputs, new.outputs):
            old_out.replace_all_uses_with(new_out, replace_graph_outputs=old_out.is_graph_output())
        graph.remove(node)
        for new_out, name in zip(new.outputs, names):
            new_out.name = name


def canonize(model: ir.Model) -> None:
    graph = model.graph
    recurrent_layout0(graph)
    drop_identities(graph)
    slice_to_the_end(graph)
    sum_square_written_out(graph)
    keepdims_broadcasts(graph)
    where_constant(graph)
    layernorm_without_empty_bias(graph)
    hard_sigmoid_written_out(graph)
    two_pass_variance(graph)
    explicit_pads(graph)
    fold_batchnorm(graph)
    fold_channel_affine(graph)
    mean_from_sum(graph)
    graph.sort()
    mark_channel_affine(graph)
    absorb_bias(graph)
    mark_batch_coupling(graph)
