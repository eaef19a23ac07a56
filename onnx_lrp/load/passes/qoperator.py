"""QOperator static quantization (``quantize_static(..., quant_format=QuantFormat.QOperator)``; most int8 models of
the ONNX model zoo) brought to the QDQ form.

QLinearConv, QLinearMatMul, QGemm, QLinearAdd, QLinearMul, QLinearAveragePool, QLinearGlobalAveragePool,
QLinearConcat, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearReduceMean and QLinearWhere become
``DequantizeLinear -> float op -> QuantizeLinear(output scale, zero point)`` (constant weights dequantized to float,
int32 biases to ``C * x_scale * w_scale``, QGemm's also ``* alpha``); standard ops that run on 8-bit tensors
(MaxPool, Reshape, Transpose, Split, Gather of a quantized table, Pad, Resize, ...) are wrapped the same way with
their input's scale (exact: they only select or move values). The forward pass is the quantized one
(onnxruntime's outputs, up to a rounding tie in its integer kernels), and the relevance equals that of the same
model quantized with QuantFormat.QDQ where both choose the same scales.

Refused: QOperator forms with no float counterpart here (channels_last pools, non-constant weights or bias scales,
8-bit ops whose scale cannot be found or that mix scales; quantize with QuantFormat.QDQ instead).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...core.quantization import INT8
from ..builder import MS, Builder, LoadPass, Report, as_float, attr, const, drop, padded_inputs, per_tensor, take_over


class QOperatorToQdq(LoadPass):
    """QLinearX ops -> DequantizeLinear -> X -> QuantizeLinear (see :func:`qoperator_to_qdq`)."""

    def apply(self, model: ir.Model, report: Report) -> int:
        opset = model.opset_imports.get("", "?")
        n, refused = qoperator_to_qdq(model.graph, opset if isinstance(opset, int) else 0)
        report.refuse(refused)
        report.note(n, "rewrote {n} QOperator-format op(s) as DequantizeLinear -> float op -> QuantizeLinear")
        return n


# QLinearX ops (onnx domain: QLinearConv, QLinearMatMul; com.microsoft: the rest) -> DequantizeLinear -> X -> Quantize
_QOP_STD = ("QLinearConv", "QLinearMatMul")


_QOP_MS = ("QGemm", "QLinearAdd", "QLinearMul", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearConcat",
           "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "QLinearReduceMean", "QLinearWhere")


# standard ops that run directly on 8-bit tensors in the QOperator format (output quantized like the input): they
# select, move or compare elements, so DequantizeLinear -> op -> QuantizeLinear(same scale) is exact (Resize in a
# linear mode interpolates: then up to a rounding tie)
_DIRECT8 = {"Reshape": (0,), "Flatten": (0,), "Transpose": (0,), "Squeeze": (0,), "Unsqueeze": (0,),
            "Identity": (0,), "MaxPool": (0,), "Split": (0,), "Slice": (0,), "Gather": (0,), "GatherElements": (0,),
            "GatherND": (0,), "Expand": (0,), "Tile": (0,), "DepthToSpace": (0,), "SpaceToDepth": (0,),
            "ReduceMax": (0,), "ReduceMin": (0,), "Pad": (0,), "Resize": (0,), "Concat": None}


def _qop_rewrite(b: Builder, node: ir.Node, opset: int) -> str | None:
    """Rewrite one QLinearX node (see _QOP_STD/_QOP_MS); returns why not, or None when done."""
    attrs = {k: a.value for k, a in node.attributes.items()}
    if node.op_type in ("QLinearConv", "QLinearMatMul", "QGemm"):
        done = _qop_linear(b, node, attrs)
    else:
        done = _qop_elementwise(b, node, attrs, opset)
    if isinstance(done, str):
        return done
    y, ys, yz = done
    b.requantize(as_float(y, node.outputs[0].shape), ys, yz, node.outputs[0])
    return None


def _qop_linear(b: Builder, node: ir.Node, attrs: dict) -> tuple | str:
    """The float layer of a QLinearConv, QLinearMatMul or QGemm on dequantized inputs (int32 biases scaled to float),
    with the output's scale and zero point: ``(y, y_scale, y_zero_point)``; or why not."""
    t = node.op_type
    if t == "QLinearConv":
        x, xs, xz, w, ws, wz, ys, yz, bias = padded_inputs(node, 9)
        if const(w) is None or const(ws) is None or (bias is not None and (const(bias) is None or const(xs) is None)):
            return "its weight, weight scale, bias or input scale is not a constant"
        ins = [b.dequantize(x, xs, xz), b.dequantize(w, ws, wz, axis=0, tag="weight")]
        if bias is not None:
            s = (np.asarray(const(xs), np.float32).reshape(()) * np.asarray(const(ws), np.float32).reshape(-1))
            ins.append(b.const((const(bias).astype(np.float64) * s).astype(np.float32), tag="bias"))
        return b.op("Conv", ins, tag="conv", **attrs), ys, yz
    if t == "QLinearMatMul":
        a, as_, az, w, ws, wz, ys, yz = padded_inputs(node, 8)
        return b.op("MatMul", [b.dequantize(a, as_, az, axis=-2 if not per_tensor(as_) else None, tag="a"),
                               b.dequantize(w, ws, wz, axis=-1 if not per_tensor(ws) else None, tag="b")],
                    tag="matmul"), ys, yz
    a, as_, az, w, ws, wz, c, ys, yz = padded_inputs(node, 9)  # QGemm
    alpha, trans_b = float(attrs.get("alpha", 1.0)), int(attrs.get("transB", 0))
    ins = [b.dequantize(a, as_, az, tag="a"), b.dequantize(w, ws, wz, axis=0 if trans_b else 1, tag="b")]
    if c is not None:  # int32 bias added before the output scale alpha * a_scale * b_scale
        if const(c) is None or const(as_) is None or const(ws) is None:
            return "its bias C, input scale or weight scale is not a constant"
        s = alpha * np.asarray(const(as_), np.float64).reshape(()) * np.asarray(const(ws), np.float64).reshape(-1)
        ins.append(b.const((const(c).astype(np.float64) * s).astype(np.float32), tag="bias"))
    gattrs = {k: v for k, v in attrs.items() if k in ("alpha", "transA", "transB")}
    return b.op("Gemm", ins, tag="gemm", beta=1.0, **gattrs), ys, yz


def _qop_elementwise(b: Builder, node: ir.Node, attrs: dict, opset: int) -> tuple | str:
    """The float op of the other QLinearX ops (element-wise, pools, Concat, Softmax, ReduceMean, Where) on
    dequantized inputs, with the output's scale and zero point: ``(y, y_scale, y_zero_point)``; or why not."""
    t = node.op_type
    if t in ("QLinearAdd", "QLinearMul"):
        a, as_, az, c, cs, cz, ys, yz = padded_inputs(node, 8)
        y = b.op(t[7:], [b.dequantize(a, as_, az, tag="a"), b.dequantize(c, cs, cz, tag="b")], tag=t[7:].lower())
    elif t in ("QLinearAveragePool", "QLinearGlobalAveragePool"):
        if int(attrs.pop("channels_last", 0)):
            return "channels_last=1 (NHWC) is not supported"
        x, xs, xz, ys, yz = padded_inputs(node, 5)
        y = b.op(t[7:], [b.dequantize(x, xs, xz)], tag="pool", **attrs)
    elif t == "QLinearConcat":
        ys, yz = node.inputs[0], node.inputs[1]
        rest = list(node.inputs[2:])
        if len(rest) % 3:
            return "its inputs are not (tensor, scale, zero point) triples"
        xs = [b.dequantize(rest[i], rest[i + 1], rest[i + 2], tag=f"x{i // 3}") for i in range(0, len(rest), 3)]
        y = b.op("Concat", xs, tag="concat", axis=int(attrs.get("axis", 0)))
    elif t in ("QLinearSigmoid", "QLinearLeakyRelu"):
        x, xs, xz, ys, yz = padded_inputs(node, 5)
        extra = {"alpha": float(attrs.get("alpha", 0.01))} if t == "QLinearLeakyRelu" else {}
        y = b.op(t[7:], [b.dequantize(x, xs, xz)], tag=t[7:].lower(), **extra)
    elif t == "QLinearSoftmax":
        x, xs, xz, ys, yz = padded_inputs(node, 5)
        axis = int(attrs.get("axis", -1))
        rank = len(x.shape) if x.shape is not None else None
        if int(attrs.get("opset", 13)) < 13 and axis != -1 and (rank is None or axis != rank - 1):
            return (f"opset-{int(attrs.get('opset'))} softmax semantics over the flattened trailing axes "
                    f"(axis {axis} is not the last)")
        y = b.op("Softmax", [b.dequantize(x, xs, xz)], tag="softmax", axis=axis)
    elif t == "QLinearReduceMean":
        x, xs, xz, ys, yz = padded_inputs(node, 5)
        axes, keep = attrs.get("axes"), int(attrs.get("keepdims", 1))
        xf = b.dequantize(x, xs, xz)
        if axes is not None and opset >= 18:
            y = b.op("ReduceMean", [xf, b.const(np.asarray(list(axes), np.int64), "axes")], tag="mean", keepdims=keep)
        else:
            y = b.op("ReduceMean", [xf], tag="mean", keepdims=keep, **({"axes": list(axes)} if axes else {}))
    elif t == "QLinearWhere":
        cond, x, xs, xz, w, ws, wz, ys, yz = padded_inputs(node, 9)
        y = b.op("Where", [cond, b.dequantize(x, xs, xz, tag="x"), b.dequantize(w, ws, wz, tag="y")], tag="where")
    else:
        return "not a QOperator op"
    return y, ys, yz


def _direct8_qparams(v: ir.Value, node: ir.Node) -> tuple | None:
    """(scale, zero point) of an 8-bit input ``v`` of ``node`` (an op of _DIRECT8): from the QuantizeLinear that
    produced it, or for a quantized constant (an embedding table read by Gather) from the DequantizeLinear(s) that
    read the op's output, through further _DIRECT8 ops."""
    p = v.producer()
    if p is not None and p.op_type == "QuantizeLinear" and p.domain in ("", "ai.onnx") and p.outputs[0] is v:
        if int(attr(p, "block_size", 0) or 0) or not per_tensor(p.inputs[1]):
            return None
        return p.inputs[1], (p.inputs[2] if len(p.inputs) > 2 else None)
    if const(v) is None:
        return None
    found, todo, seen = [], [node], set()
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        for o in n.outputs:
            for u in o.uses():
                c = u.node
                if c.op_type == "DequantizeLinear" and c.domain in ("", "ai.onnx") and u.idx == 0:
                    if not per_tensor(c.inputs[1]):
                        return None
                    found.append((c.inputs[1], c.inputs[2] if len(c.inputs) > 2 else None))
                elif c.op_type in _DIRECT8 and c.domain in ("", "ai.onnx"):
                    todo.append(c)
                else:
                    return None
    if not found or any(not _same_qparams(found[0], f) for f in found[1:]):
        return None
    return found[0]


def _same_qparams(p: tuple, q: tuple) -> bool:
    def same(a, b):
        if a is b:
            return True
        ca, cb = const(a), const(b)
        return ca is not None and cb is not None and ca.size == cb.size == 1 and float(ca.reshape(())) == float(
            cb.reshape(())) and ca.dtype == cb.dtype
    return same(p[0], q[0]) and (p[1] is q[1] or (p[1] is not None and q[1] is not None and same(p[1], q[1])))


def _sandwich_direct8(graph: ir.Graph) -> tuple[int, list]:
    """Standard ops on 8-bit activations (Reshape, MaxPool, Gather, ...) -> DequantizeLinear -> op (float) ->
    QuantizeLinear with the input's scale and zero point: exact, and every DequantizeLinear then follows a
    QuantizeLinear (the QDQ form whose pairs relay relevance)."""
    done, refused = 0, []
    for node in list(graph):
        if node.op_type not in _DIRECT8 or node.domain not in ("", "ai.onnx") or not node.inputs:
            continue
        idx = _DIRECT8[node.op_type] or tuple(range(len(node.inputs)))
        data = [node.inputs[i] for i in idx if i < len(node.inputs)]
        if not data or any(v is None or (v.dtype not in INT8 and v.dtype is not None) for v in data):
            continue
        qps = [_direct8_qparams(v, node) for v in data]
        if all(q is None for q in qps):
            continue  # not a quantized activation (e.g. raw image bytes): integer arithmetic stays as it is
        if any(q is None for q in qps):
            refused.append((node, f"{node.op_type} on 8-bit tensors whose scale and zero point cannot be found"))
            continue
        if any(not _same_qparams(qps[0], q) for q in qps[1:]):
            refused.append((node, f"{node.op_type} of 8-bit tensors with different scales; requantize them to one"))
            continue
        s, z = qps[0]
        b = Builder(graph, node)
        ins = list(node.inputs)
        for i in idx:
            if i < len(ins):
                ins[i] = b.dequantize(ins[i], s, z, tag=f"in{i}")
        attrs = {k: a.value for k, a in node.attributes.items()}
        if node.op_type == "Pad" and attrs.get("mode", "constant") in ("constant", b"constant"):
            c = const(ins[2]) if len(ins) > 2 and ins[2] is not None else np.zeros((), np.float32)
            sc, zc = const(s), const(z) if z is not None else np.zeros((), np.float32)
            if c is None or sc is None or zc is None:
                refused.append((node, "Pad of an 8-bit tensor with a non-constant pad value or scale"))
                for n in b.nodes:
                    drop(graph, n)
                continue
            pad = ((np.float32(c.reshape(())) - np.float32(zc.reshape(()))) * np.float32(sc.reshape(())))
            ins = ins[:2] + [b.const(np.asarray(pad, np.float32), "pad_value")] + ins[3:]
        new_outs = b.op(node.op_type, ins, tag=node.op_type.lower(), num_outputs=len(node.outputs), **attrs)
        new_outs = new_outs if isinstance(new_outs, list) else [new_outs]
        for i, (old, new) in enumerate(zip(node.outputs, new_outs)):
            if not list(old.uses()) and not old.is_graph_output():
                continue
            if node.op_type == "MaxPool" and i == 1:  # the indices
                take_over(old, new)
            else:
                as_float(new, old.shape)
                b.requantize(new, s, z, old)
        drop(graph, node)
        done += 1
    return done, refused


def qoperator_to_qdq(graph: ir.Graph, opset: int) -> tuple[int, list]:
    """QOperator quantization (QLinearConv, QGemm, QLinearAdd, ...) -> DequantizeLinear -> float op ->
    QuantizeLinear (constant weights and biases dequantized to float initializers); then the standard ops that run on
    8-bit activations are wrapped the same way (exact)."""
    done, refused = 0, []
    for node in list(graph):
        if not ((node.domain in ("", "ai.onnx") and node.op_type in _QOP_STD) or
                (node.domain == MS and node.op_type in _QOP_MS)):
            continue
        b = Builder(graph, node)
        why = _qop_rewrite(b, node, opset)
        if why is not None:
            for n in reversed(b.nodes):
                drop(graph, n)
            refused.append((node, f"{node.op_type}: {why}"))
            continue
        drop(graph, node)
        done += 1
    if done:
        n, r = _sandwich_direct8(graph)
        done += n
        refused += r
    return done, refused
