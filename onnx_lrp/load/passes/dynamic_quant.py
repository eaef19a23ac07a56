"""Dynamic quantization (``quantize_dynamic``) and onnxruntime's fused forms of it, brought to float ops on
dynamically quantized activations.

- ``DynamicQuantizeLinear -> ConvInteger / MatMulInteger -> Cast -> Mul(scales)`` becomes
  ``DequantizeLinear(DynamicQuantizeLinear(x)) -> Conv / MatMul`` with the weights dequantized to float. The
  activations stay dynamically quantized (the same uint8 values); the integer accumulation becomes a float one
  (outputs agree to float rounding, ~1e-6 relative per layer; in deep stacks a rounding can move a later
  DynamicQuantizeLinear value by one step: 0.5 % of max |y| on ddddocr's 21-layer CRNN). An int32 bias
  ``Cast(Floor(b / scales))`` (older quantize_dynamic) becomes the float bias plus its exact rounding, which takes
  no relevance; a static activation scale (QuantizeLinear, the scale product folded) is accepted too.
- onnxruntime's fused dynamic quantization: MatMulIntegerToFloat -> DequantizeLinear -> MatMul (+ bias);
  DynamicQuantizeMatMul -> DynamicQuantizeLinear -> DequantizeLinear -> MatMul (+ bias); DynamicQuantizeLSTM ->
  DynamicQuantizeLinear -> DequantizeLinear -> LSTM with the weights dequantized and transposed back to
  ``[dirs, 4h, in]``. The fused LSTM also requantizes the hidden state at every step, which a standard LSTM
  cannot: that state stays float (outputs within ~0.2 % of max |y| of onnxruntime's on the tested LSTM).

Refused: ConvInteger / MatMulInteger whose activation is not quantized by a (Dynamic)QuantizeLinear or whose output
is not scaled by Cast -> Mul(scales).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ...core import meta
from ...core.quantization import QUANTIZERS
from ..builder import (
    MS,
    Builder,
    LoadPass,
    Report,
    as_float,
    const,
    drop,
    only_consumer,
    padded_inputs,
    per_tensor,
    take_over,
)


class SplitFusedDynamicQuant(LoadPass):
    """onnxruntime's fused dynamic quantization -> the quantize_dynamic form (see
    :func:`split_fused_dynamic_quant`)."""

    def apply(self, model: ir.Model, report: Report) -> int:
        n, refused = split_fused_dynamic_quant(model.graph)
        report.refuse(refused)
        report.note(n, "split {n} onnxruntime fused dynamic-quantization op(s) into DynamicQuantizeLinear -> "
                       "DequantizeLinear -> float op")
        return n


class DequantizeIntegerOps(LoadPass):
    """quantize_dynamic's ConvInteger / MatMulInteger chains -> DequantizeLinear + float Conv / MatMul."""

    def apply(self, model: ir.Model, report: Report) -> int:
        n, refused = dequantize_integer_ops(model.graph)
        report.refuse(refused)
        report.note(n, "rewrote {n} ConvInteger/MatMulInteger to DequantizeLinear + float ops")
        return n


def _same_product(u: ir.Value, v: ir.Value) -> bool:
    """``u`` and ``v`` are one value, or two Mul of the same two inputs (a value, or equal constants)."""
    if u is v:
        return True
    pu, pv = u.producer(), v.producer()
    if pu is None or pv is None or pu.op_type != "Mul" or pv.op_type != "Mul":
        return False

    def key(x):
        c = const(x)
        return ("c", c.dtype.str, c.shape, c.tobytes()) if c is not None else ("v", id(x))
    return sorted(map(key, pu.inputs)) == sorted(map(key, pv.inputs))


def _integer_bias(v: ir.Value | None, s: ir.Value) -> tuple[np.ndarray, list] | None:
    """``Reshape(Cast(Floor(Div(b, s)), int32), shape)`` (quantize_dynamic's bias quantized with the dynamic scale
    product ``s``) -> (the float bias ``b`` in the Reshape's shape, the chain's nodes from the last), or None."""
    chain, shape = [], None
    n = v.producer() if v is not None else None
    while n is not None and n.op_type in ("Reshape", "Cast", "Floor", "Round"):
        if n.op_type == "Reshape":
            shape = const(n.inputs[1])
            if shape is None:
                return None
        chain.append(n)
        n = n.inputs[0].producer()
    if n is None or n.op_type != "Div" or not _same_product(n.inputs[1], s) or const(n.inputs[0]) is None or not chain:
        return None
    chain.append(n)
    b = np.asarray(const(n.inputs[0]), np.float32)
    return (b.reshape([int(d) for d in shape]) if shape is not None else b), chain


@dataclass
class _IntegerChain:
    """quantize_dynamic's chain around one ConvInteger / MatMulInteger: the quantized activation ``a`` (its scale and
    zero point), the constant weight ``w`` (zero point ``w_zp``, scale ``w_scale``), ``Cast -> Mul(s)`` after it
    (``sp``: the Mul that forms the scale product ``s``) and, from older quantize_dynamic, ``Add(int_bias)`` before
    the Cast with the float ``bias`` it quantizes."""

    a: ir.Value
    a_scale: ir.Value
    a_zp: ir.Value | None
    w: np.ndarray
    w_zp: np.ndarray
    w_scale: np.ndarray
    cast: ir.Node
    mul: ir.Node
    s: ir.Value
    sp: ir.Node | None
    add: ir.Node | None = None
    int_bias: ir.Value | None = None
    bias: np.ndarray | None = None


def _integer_chain(node: ir.Node) -> _IntegerChain | str:
    """The chain around ``node`` (a ConvInteger / MatMulInteger), or why it is not quantize_dynamic's."""
    a = node.inputs[0]
    qa = a.producer() if a is not None else None
    w, w_zp = const(node.inputs[1]), (const(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None
                                      else np.zeros((), np.int32))
    cast = only_consumer(node.outputs[0])
    add, int_bias = None, None
    if cast is not None and cast.op_type == "Add":  # older quantize_dynamic: + Cast(Floor(bias / scales))
        add, int_bias = cast, [v for v in cast.inputs if v is not node.outputs[0]]
        int_bias = int_bias[0] if len(int_bias) == 1 else None
        cast = only_consumer(add.outputs[0])
    mul = only_consumer(cast.outputs[0]) if cast is not None and cast.op_type == "Cast" else None
    if qa is None or qa.op_type not in QUANTIZERS or qa.outputs[0] is not a:
        return "its activation input is not produced by DynamicQuantizeLinear / QuantizeLinear"
    if w is None or w_zp is None:
        return "its weight or weight zero point is not a constant"
    if mul is None or mul.op_type != "Mul":
        return "its output does not go through Cast -> Mul(scales) as quantize_dynamic writes it"
    a_scale = qa.outputs[1] if qa.op_type == "DynamicQuantizeLinear" else qa.inputs[1]
    a_zp = qa.outputs[2] if qa.op_type == "DynamicQuantizeLinear" else (qa.inputs[2] if len(qa.inputs) > 2 else None)
    s = mul.inputs[1] if mul.inputs[0] is cast.outputs[0] else mul.inputs[0]
    sp = s.producer()
    w_scale = None
    if sp is not None and sp.op_type == "Mul":
        others = [v for v in sp.inputs if v is not a_scale]
        if len(others) == 1 and any(v is a_scale for v in sp.inputs):
            w_scale = const(others[0])
    elif const(s) is not None and const(a_scale) is not None and const(a_scale).size == 1 and \
            float(const(a_scale).reshape(())) != 0:
        # a static activation scale: the product was folded to one constant
        w_scale = (np.asarray(const(s), np.float64) / np.asarray(const(a_scale), np.float64).reshape(())
                   ).astype(np.float32)
    if w_scale is None:
        return "the scale product is not Mul(activation scale, constant weight scale)"
    chain = _IntegerChain(a, a_scale, a_zp, w, w_zp, w_scale, cast, mul, s, sp, add, int_bias)
    if add is not None:
        bias = _integer_bias(int_bias, s)
        if bias is None:
            return "its int32 bias is not Cast(Floor(constant bias / scale product)) as quantize_dynamic writes it"
        chain.bias = bias[0]
    return chain


def _float_layer(graph: ir.Graph, node: ir.Node, c: _IntegerChain) -> None:
    """Replace the chain by DequantizeLinear(a) -> Conv / MatMul with the float weight (+ the bias, exactly)."""
    w = c.w
    wf = w.astype(np.float32) - np.asarray(c.w_zp, np.float32).reshape(
        (-1,) + (1,) * (w.ndim - 1) if node.op_type == "ConvInteger" and np.asarray(c.w_zp).size > 1 else
        np.asarray(c.w_zp).shape)
    ws = np.asarray(c.w_scale, np.float32)
    if node.op_type == "ConvInteger" and ws.size > 1:
        ws = ws.reshape((-1,) + (1,) * (w.ndim - 1))
    wf = (wf * ws).astype(np.float32)
    out = c.mul.outputs[0]
    b = Builder(graph, node)
    deq = b.op("DequantizeLinear", [c.a, c.a_scale, c.a_zp], tag="x_dequantized")
    deq.type = ir.TensorType(ir.DataType.FLOAT)
    deq.shape = c.a.shape
    wv = b.const(wf, tag="weight")
    if node.op_type == "ConvInteger":
        attrs = {k: v.value for k, v in node.attributes.items()}
        ins = [deq, wv]
        if c.add is not None:
            ins.append(b.const(c.bias.reshape(-1), tag="bias"))
        y = b.op("Conv", ins, like=out, tag="conv", **attrs)
    else:
        y = b.op("MatMul", [deq, wv], like=out, tag="matmul")
        if c.add is not None:
            y = b.op("Add", [y, b.const(c.bias, tag="bias")], like=out, tag="bias_add")
    if c.add is not None:  # + (Floor(b / s) * s - b): the deployed bias exactly, the float bias in the layer
        shape = c.int_bias.shape
        qb = b.op("Mul", [as_float(b.op("Cast", [c.int_bias], tag="bias_int", to=ir.DataType.FLOAT.value), shape),
                          c.s], tag="bias_quantized")
        corr = b.op("Sub", [as_float(qb, shape), b.const(c.bias, tag="bias_float")], tag="bias_rounding")
        for v in (qb, corr):  # a rounding of the bias, below one accumulator step: no relevance, like a bias
            meta.SHAPE_ONLY.set(v, True)
        y = b.op("Add", [y, as_float(corr, shape)], like=out, tag="bias_exact")
    take_over(out, y)
    drop(graph, [c.mul, c.cast] + ([c.add] if c.add is not None else []) + [node])
    sp = c.sp
    if sp is not None and not any(list(o.uses()) for o in sp.outputs) and not any(
            o.is_graph_output() for o in sp.outputs):
        graph.remove(sp)


def dequantize_integer_ops(graph: ir.Graph) -> tuple[int, list]:
    """quantize_dynamic's ConvInteger / MatMulInteger chains -> DequantizeLinear + float Conv / MatMul."""
    done, refused = 0, []
    for node in list(graph):
        if node.op_type not in ("ConvInteger", "MatMulInteger") or node.domain not in ("", "ai.onnx"):
            continue
        chain = _integer_chain(node)
        if isinstance(chain, str):
            refused.append((node, f"{node.op_type} outside quantize_dynamic's pattern: {chain}"))
            continue
        _float_layer(graph, node, chain)
        done += 1
    return done, refused


def _lstm_weight(w: np.ndarray, s: np.ndarray, z: np.ndarray | None) -> np.ndarray:
    """DynamicQuantizeLSTM's [dirs, in, 4h] integer weight with per-direction ([dirs]) or per-channel ([dirs, 4h])
    scale / zero point -> the float [dirs, 4h, in] weight of a standard LSTM."""
    s = np.asarray(s, np.float32)
    z = np.zeros_like(s) if z is None else np.asarray(z, np.float32)
    shape = (-1, 1, 1) if s.ndim == 1 else (s.shape[0], 1, s.shape[1])
    wf = (w.astype(np.float32) - z.reshape(shape)) * s.reshape(shape)
    return np.ascontiguousarray(np.transpose(wf, (0, 2, 1))).astype(np.float32)


def split_fused_dynamic_quant(graph: ir.Graph) -> tuple[int, list]:
    """onnxruntime's fused dynamic quantization -> the quantize_dynamic form the rest handles: MatMulIntegerToFloat
    -> DequantizeLinear + MatMul (+ Add bias); DynamicQuantizeMatMul -> DynamicQuantizeLinear -> DequantizeLinear
    -> MatMul (+ Add bias); DynamicQuantizeLSTM -> DynamicQuantizeLinear -> DequantizeLinear -> LSTM with the
    weights dequantized (the hidden state, which the fused op also requantizes every step, stays float)."""
    done, refused = 0, []
    for node in list(graph):
        if node.domain != MS or node.op_type not in ("MatMulIntegerToFloat", "DynamicQuantizeMatMul",
                                                      "DynamicQuantizeLSTM"):
            continue
        t, out = node.op_type, node.outputs[0]
        b = Builder(graph, node)
        if t == "DynamicQuantizeLSTM":
            x, w, r, bias, seq, h0, c0, peep, ws, wz, rs, rz = padded_inputs(node, 12)
            if any(const(v) is None for v in (w, r, ws, rs)) or any(
                    v is not None and const(v) is None for v in (wz, rz)):
                refused.append((node, f"{t}: its weights, scales or zero points are not constants"))
                continue
            if const(w).ndim != 3 or const(r).ndim != 3 or const(ws).ndim not in (1, 2) or const(rs).ndim not in (1, 2):
                refused.append((node, f"{t}: weights of rank {const(w).ndim} / scales of rank {const(ws).ndim}"))
                continue
            q, s, z = b.op("DynamicQuantizeLinear", [x], tag="x_quantized", num_outputs=3)
            q.type, q.shape = ir.TensorType(ir.DataType.UINT8), x.shape
            s.type, z.type = ir.TensorType(ir.DataType.FLOAT), ir.TensorType(ir.DataType.UINT8)
            s.shape = z.shape = ir.Shape([])
            xf = as_float(b.op("DequantizeLinear", [q, s, z], tag="x_dequantized"), x.shape)
            ins = [xf, b.const(_lstm_weight(const(w), const(ws), const(wz)), "W"),
                   b.const(_lstm_weight(const(r), const(rs), const(rz)), "R"), bias, seq, h0, c0, peep]
            while ins and ins[-1] is None:
                ins.pop()
            attrs = {k: a.value for k, a in node.attributes.items()}
            outs = b.op("LSTM", ins, tag="lstm", num_outputs=len(node.outputs), **attrs)
            outs = outs if isinstance(outs, list) else [outs]
            for old, new in zip(node.outputs, outs):
                if list(old.uses()) or old.is_graph_output():
                    take_over(old, new)
            drop(graph, node)
            done += 1
            continue
        if t == "MatMulIntegerToFloat":
            a, w, as_, ws, az, wz, bias = padded_inputs(node, 7)
            af = b.dequantize(a, as_, az, tag="a")
        else:
            a, w, ws, wz, bias = padded_inputs(node, 5)
            q, s, z = b.op("DynamicQuantizeLinear", [a], tag="a_quantized", num_outputs=3)
            q.type, q.shape = ir.TensorType(ir.DataType.UINT8), a.shape
            s.type, z.type = ir.TensorType(ir.DataType.FLOAT), ir.TensorType(ir.DataType.UINT8)
            s.shape = z.shape = ir.Shape([])
            af = as_float(b.op("DequantizeLinear", [q, s, z], tag="a_dequantized"), a.shape)
        wf = b.dequantize(w, ws, wz, axis=-1 if not per_tensor(ws) else None, tag="b")
        y = as_float(b.op("MatMul", [af, wf], tag="matmul"), out.shape)
        if bias is not None:
            y = as_float(b.op("Add", [y, bias], tag="bias"), out.shape)
        take_over(out, y)
        drop(graph, node)
        done += 1
    return done, refused
