"""QDQ static quantization (``onnxruntime.quantization.quantize_static(..., quant_format=QuantFormat.QDQ)``).

``DequantizeLinear`` of constant weights and biases is folded to float initializers (per-tensor, per-axis and
blocked scales; a ``QuantizeLinear`` of a float constant, as QAT exports write, is folded first); 4-bit (int4 /
uint4) weights stay 4-bit: their DequantizeLinear stays in the graph and its output is a parameter for the rules
(``meta.PACKED_WEIGHT``).
``QuantizeLinear -> DequantizeLinear`` on an activation stays in the graph, so the forward pass (outputs, and the
activations the rules see) is the quantized one; for relevance the pair is an identity (the handlers in
:mod:`onnx_lrp.lrp.ops.quantize`). com.microsoft QuantizeLinear / DequantizeLinear (``UseQDQContribOps``) on 8-bit
types are read as the onnx ops.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...core import meta
from ...core.errors import ModelError
from ...core.quantization import INT8, QRANGE, dequantize, qparams_misfit, relay_sources
from ..builder import MS, LoadPass, Report, attr, const, to_initializer


class StandardQdqDomain(LoadPass):
    """com.microsoft QuantizeLinear / DequantizeLinear -> the onnx ops (see :func:`standard_qdq_domain`)."""

    def apply(self, model: ir.Model, report: Report) -> int:
        opset = model.opset_imports.get("", "?")
        n = standard_qdq_domain(model.graph, opset if isinstance(opset, int) else 0)
        report.note(n, "read {n} com.microsoft QuantizeLinear/DequantizeLinear as the onnx ops")
        return n


class FoldWeightDequantize(LoadPass):
    """DequantizeLinear (and QuantizeLinear -> DequantizeLinear) of constants -> float initializers."""

    def apply(self, model: ir.Model, report: Report) -> int:
        n = fold_weight_dequantize(model.graph)
        report.note(n, "folded {n} DequantizeLinear of constants to float")
        return n


class RelayPairs(LoadPass):
    """Changes nothing: notes how many activation QuantizeLinear/DequantizeLinear pairs relay relevance."""

    def apply(self, model: ir.Model, report: Report) -> int:
        report.note(sum(1 for n in model.graph if relay_sources(n)),
                    "{n} activation QuantizeLinear/DequantizeLinear pair(s) pass relevance unchanged")
        return 0


def _fold_constant_quantize(graph: ir.Graph) -> int:
    """QuantizeLinear of a float constant (fake-quantized weights, e.g. PyTorch QAT exports) -> integer constant."""
    done = 0
    for node in list(graph):
        if node.op_type != "QuantizeLinear" or node.domain not in ("", "ai.onnx"):
            continue
        x, scale = const(node.inputs[0]), const(node.inputs[1])
        zp = const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        if x is None or scale is None or (len(node.inputs) > 2 and node.inputs[2] is not None and zp is None):
            continue
        out = node.outputs[0]
        qtype = zp.dtype if zp is not None else (out.dtype.numpy() if out.dtype is not None else np.dtype(np.uint8))
        if np.dtype(qtype) not in QRANGE or out.is_graph_output() or int(attr(node, "block_size", 0) or 0):
            continue
        lo, hi = QRANGE[np.dtype(qtype)]
        misfit = qparams_misfit(x, np.asarray(scale), None if zp is None else np.asarray(zp),
                                 int(attr(node, "axis", 1)), 0)
        if misfit:
            raise ModelError(f"node {node.name} (QuantizeLinear): {misfit}; the model is malformed (re-export it)")
        axis = int(attr(node, "axis", 1)) % max(x.ndim, 1)
        shape = [1] * x.ndim
        if np.asarray(scale).size > 1:
            shape[axis] = -1
        s = np.asarray(scale, np.float32).reshape(shape if np.asarray(scale).size > 1 else ())
        z = np.zeros((), np.float32) if zp is None else np.asarray(zp, np.float32).reshape(
            shape if np.asarray(zp).size > 1 else ())
        q = np.clip(np.rint(x.astype(np.float32) / s) + z, lo, hi).astype(qtype)
        to_initializer(graph, out, q)
        graph.remove(node)
        done += 1
    return done


def fold_weight_dequantize(graph: ir.Graph) -> int:
    """DequantizeLinear (and QuantizeLinear -> DequantizeLinear) of constants -> float initializers."""
    done = _fold_constant_quantize(graph)
    for node in list(graph):
        if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx") or meta.KEEP_PACKED.get(node):
            continue  # block_quant's packed weights stay packed
        x, scale = const(node.inputs[0]), const(node.inputs[1])
        zp = const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        if x is None or scale is None or (len(node.inputs) > 2 and node.inputs[2] is not None and zp is None):
            continue
        if node.inputs[0].dtype in (ir.DataType.INT4, ir.DataType.UINT4):
            _keep_packed(node, x, scale, zp)  # 4-bit weights stay 4-bit: a packed weight for the rules
            continue
        if x.dtype.kind not in "iu":
            continue  # float8 payloads: left to onnxruntime
        out = node.outputs[0]
        if out.is_graph_output():
            continue
        axis, block = int(attr(node, "axis", 1)), int(attr(node, "block_size", 0) or 0)
        misfit = qparams_misfit(x, scale, zp, axis, block)
        if misfit:
            raise ModelError(f"node {node.name} (DequantizeLinear): {misfit}; the model is malformed (re-export it)")
        arr = dequantize(x, scale, zp, axis, block)
        target = out.dtype.numpy() if out.dtype is not None else scale.dtype
        arr = arr.astype(target)
        to_initializer(graph, out, arr)
        graph.remove(node)
        done += 1
    return done


def _keep_packed(node: ir.Node, x, scale, zp) -> None:
    """A DequantizeLinear of constant 4-bit weights kept in the graph; its output a parameter whose float value is
    computed on demand (``meta.PACKED_WEIGHT``), as load.passes.block_quant's."""
    axis, block = int(attr(node, "axis", 1)), int(attr(node, "block_size", 0) or 0)
    misfit = qparams_misfit(x, scale, zp, axis, block)
    if misfit:
        raise ModelError(f"node {node.name} (DequantizeLinear): {misfit}; the model is malformed (re-export it)")
    meta.KEEP_PACKED.set(node, True)
    vals = list(node.inputs)
    meta.PACKED_WEIGHT.set(node.outputs[0], lambda: dequantize(
        vals[0].const_value.numpy(), vals[1].const_value.numpy(),
        vals[2].const_value.numpy() if len(vals) > 2 and vals[2] is not None else None, axis, block).astype(
        vals[1].const_value.numpy().dtype))


def standard_qdq_domain(graph: ir.Graph, opset: int) -> int:
    """com.microsoft QuantizeLinear / DequantizeLinear (quantize_static's ``UseQDQContribOps``) on 8-bit types (and
    int32 biases) -> the onnx ops (the same semantics from opset 13 on, per-axis scales included)."""
    done = 0
    if opset < 13:
        return 0
    for node in graph:
        if node.domain != MS or node.op_type not in ("QuantizeLinear", "DequantizeLinear") or \
                int(attr(node, "block_size", 0) or 0):
            continue
        q = node.outputs[0] if node.op_type == "QuantizeLinear" else node.inputs[0]
        zp = node.inputs[2] if len(node.inputs) > 2 else None
        dt = zp.dtype if zp is not None else q.dtype
        ok = INT8 + ((ir.DataType.INT32,) if node.op_type == "DequantizeLinear" else ())  # int32: biases
        if dt in ok or (dt is None and zp is None):
            node.domain = ""
            done += 1
    return done
