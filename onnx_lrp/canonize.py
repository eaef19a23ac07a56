"""Canonizers: rewrite a loaded graph into the form the rules expect (cf. zennit.canonizers).

- Identity and Dropout are dropped.
- ``auto_pad`` becomes explicit ``pads`` (static spatial shapes needed).
- BatchNormalization directly after a Conv/Gemm (its only consumer) is folded into that layer's parameters.
- An Add of a constant directly after a MatMul, a bias-less Gemm or a bias-less Conv is recorded as that layer's
  bias (``node.meta['lrp_bias_add']``), so that z+ / gamma / alpha-beta see one layer ``x W + b``.
- LayerNormalization gets its optional Mean and InvStdDev outputs: the relevance pass reads the scale the forward
  computed (and onnxruntime can still fuse the residual Add into SkipLayerNormalization).
"""
from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

_SPATIAL_OPS = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"}


def const(v: ir.Value | None) -> np.ndarray | None:
    if v is None or v.const_value is None:
        return None
    return v.const_value.numpy()


def _only_consumer(v: ir.Value) -> ir.Node | None:
    uses = list(v.uses())
    if len(uses) != 1 or v.is_graph_output():
        return None
    return uses[0].node


def _new_param(graph: ir.Graph, base: str, arr: np.ndarray) -> ir.Value:
    name, k = base, 0
    while name in graph.initializers:
        k += 1
        name = f"{base}_{k}"
    v = ir.Value(name=name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                 const_value=ir.tensor(arr, name=name))
    graph.register_initializer(v)
    return v


def to_initializer(graph: ir.Graph, out: ir.Value, arr: np.ndarray) -> ir.Value:
    """Replace a computed value by an initializer holding ``arr`` under the same name (its producer is left to
    the caller to remove)."""
    v = ir.Value(name=out.name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                 const_value=ir.tensor(arr, name=out.name))
    out.name = None
    out.replace_all_uses_with(v)
    graph.register_initializer(v)
    return v


def bypass(out: ir.Value, src: ir.Value) -> None:
    """Let the consumers of ``out`` read ``src``; a graph output keeps its name (``src`` takes it over)."""
    if out.is_graph_output():
        name = out.name
        out.name = None
        src.name = name
        out.replace_all_uses_with(src, replace_graph_outputs=True)
    else:
        out.replace_all_uses_with(src)


def drop_identities(graph: ir.Graph) -> None:
    for node in list(graph):
        if node.op_type not in ("Identity", "Dropout") or node.domain not in ("", "ai.onnx"):
            continue
        out, src = node.outputs[0], node.inputs[0]
        if node.op_type == "Dropout" and len(node.outputs) > 1 and list(node.outputs[1].uses()):
            continue
        if out.is_graph_output():
            if src.is_graph_input() or src.is_graph_output() or src.const_value is not None:
                continue  # the Identity keeps two graph names apart
        bypass(out, src)
        graph.remove(node)


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
        if x.shape is None or any(not isinstance(d, int) for d in list(x.shape)[2:]):
            continue  # left as is; the op handler reports it
        spatial = [int(d) for d in list(x.shape)[2:]]
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
        begins, ends = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dil):
            out = math.ceil(size / s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
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
        if layer is None or layer.op_type not in ("Conv", "Gemm") or _only_consumer(x) is not bn:
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
        w_val = _new_param(graph, f"{layer.name}/weight_bn", w_new.astype(dtype))
        b_val = _new_param(graph, f"{layer.name}/bias_bn", b_new.astype(dtype))
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
        add = _only_consumer(node.outputs[0])
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
        node.meta["lrp_bias_add"] = add
        node.meta["lrp_bias"] = np.ascontiguousarray(bias)
        add.meta["lrp_absorbed_by"] = node


def layernorm_statistics(graph: ir.Graph) -> None:
    """Give every LayerNormalization node its Mean and InvStdDev outputs (``node.outputs[2]`` is 1 / std)."""
    for node in list(graph):
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx") or len(node.outputs) >= 3:
            continue
        x = node.inputs[0]
        if x is None or x.shape is None:
            continue
        rank = len(x.shape)
        axis = node.attributes.get_int("axis", -1) % rank
        stash = ir.DataType(node.attributes.get_int("stash_type", 1))
        stat_shape = ir.Shape([x.shape[i] if i < axis else 1 for i in range(rank)])
        names = [o.name for o in node.outputs] + [f"{node.name or 'layernorm'}/mean", f"{node.name or 'layernorm'}/inv_std"][len(node.outputs) - 1:]
        inputs = list(node.inputs)
        while inputs and inputs[-1] is None:  # an empty optional bias ("") with the statistics outputs crashes
            inputs.pop()                      # onnxruntime 1.32's extended optimisations (segfault): drop it
        new = ir.node("LayerNormalization", inputs, {k: a for k, a in node.attributes.items()},
                      num_outputs=3, name=node.name)
        for i, (old_out, new_out) in enumerate(zip(list(node.outputs) + [None] * 3, new.outputs)):
            if old_out is not None:
                new_out.type, new_out.shape = old_out.type, old_out.shape
            else:
                new_out.type, new_out.shape = ir.TensorType(stash), stat_shape
        graph.insert_before(node, new)
        for old_out, new_out in zip(node.outputs, new.outputs):
            is_out = old_out.is_graph_output()
            old_out.replace_all_uses_with(new_out, replace_graph_outputs=is_out)
        graph.remove(node)
        for new_out, name in zip(new.outputs, names):
            new_out.name = name


def canonize(model: ir.Model) -> None:
    graph = model.graph
    drop_identities(graph)
    layernorm_statistics(graph)
    explicit_pads(graph)
    fold_batchnorm(graph)
    graph.sort()
    absorb_bias(graph)
