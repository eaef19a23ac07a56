"""BatchNormalization and per-channel constant scale/shift chains (Mul/Add/Sub/Div, tf2onnx's Keras BatchNorm) folded
into the Conv/Gemm/MatMul with constant weights they follow; those that cannot be folded marked as BatchNorm-like."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ....core import meta
from ...builder import bypass, const, new_param, only_consumer


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
        channels = _output_channels(layer, w)
        if channels is None:
            continue
        chain, scale, shift = _affine_chain(layer, *channels)
        if not chain:
            continue
        if layer.op_type == "MatMul" and chain[-1].outputs[0].is_graph_output():
            continue  # the new bias Add would have to take over the output's name: left as it is
        params = _folded_params(layer, w, channels[0], scale, shift)
        if params is None:
            continue
        _replace_chain(graph, layer, chain, *params, w.dtype)
        folded += len(chain)
    return folded


def _output_channels(layer: ir.Node, w: np.ndarray) -> tuple[int, int, int] | None:
    """(number of channels, rank, channel axis) of a Conv / Gemm / MatMul's output, or None (a MatMul whose weight
    is not 2-D or whose output rank is unknown)."""
    if layer.op_type == "Conv":
        return w.shape[0], w.ndim, 1
    if layer.op_type == "Gemm":
        trans_b = layer.attributes.get_int("transB", 0)
        return (w.shape[0] if trans_b else w.shape[1]), 2, 1
    y = layer.outputs[0]
    if w.ndim != 2 or y.shape is None:
        return None
    rank = len(y.shape)
    return w.shape[1], rank, rank - 1


def _affine_chain(layer: ir.Node, n: int, rank: int, axis: int) -> tuple[list, np.ndarray, np.ndarray]:
    """(the element-wise per-channel ops after ``layer``, each the only consumer of the one before, and their
    combined scale and shift per channel). A Transpose after a Conv moves the channel axis, a Squeeze of a unit
    axis (tf2onnx's Conv1D) drops it; both stay in the graph."""
    scale, shift = np.ones(n), np.zeros(n)
    chain, v = [], layer.outputs[0]
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
    return chain, scale, shift


def _folded_params(layer: ir.Node, w: np.ndarray, n: int, scale: np.ndarray, shift: np.ndarray):
    """(the layer's new weight, or None where it stays as it is, and its new bias) with the chain's ``scale`` and
    ``shift`` folded in; None when the layer's bias does not fit its channels. A Gemm's alpha and beta are folded in
    too (and set to 1)."""
    b = const(layer.inputs[2]) if len(layer.inputs) > 2 and layer.inputs[2] is not None else None
    dtype = w.dtype
    # an unscaled chain (a bias Add) keeps the weight as it is: no copy of a large model's weights
    keep_w = bool(np.all(scale == 1)) and (layer.op_type != "Gemm" or layer.attributes.get_float("alpha", 1.0) == 1)
    scale_w = scale.astype(dtype)  # scaled in the weight's type: no float64 copy of the weight
    if layer.op_type == "Conv":
        if b is not None and b.size not in (1, n):
            return None
        w_new = None if keep_w else w * scale_w.reshape((-1,) + (1,) * (w.ndim - 1))
        b0 = np.broadcast_to(b.reshape(-1), (n,)) if b is not None else np.zeros(n)
    elif layer.op_type == "Gemm":
        if b is not None and b.size not in (1, n):
            return None
        trans_b = layer.attributes.get_int("transB", 0)
        alpha = layer.attributes.get_float("alpha", 1.0)
        beta = layer.attributes.get_float("beta", 1.0)
        w_new = None if keep_w else alpha * (w * scale_w[:, None] if trans_b else w * scale_w[None, :])
        b0 = beta * np.broadcast_to(b.reshape(-1), (n,)) if b is not None else np.zeros(n)
        layer.attributes["alpha"] = ir.AttrFloat32("alpha", 1.0)
        layer.attributes["beta"] = ir.AttrFloat32("beta", 1.0)
    else:
        w_new, b0 = None if keep_w else w * scale_w[None, :], np.zeros(n)
    return w_new, b0 * scale + shift


def _replace_chain(graph: ir.Graph, layer: ir.Node, chain: list, w_new: np.ndarray | None, b_new: np.ndarray,
                   dtype: np.dtype) -> None:
    """The chain's ops removed, the layer given the new weight and bias (a MatMul: an Add of the bias after it,
    unless the bias is zero)."""
    y = layer.outputs[0]
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
