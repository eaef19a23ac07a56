"""Canonizers for models in the form they are deployed: quantized, float16, or rewritten by onnxruntime.

``canonize(model)`` runs inside :func:`onnx_lrp.loader.load` (after the first constant folding, before the
standard canonizers) and brings these forms back to what the rules expect, keeping the forward pass the deployed
one wherever the forward itself is what was deployed:

- **QDQ static quantization** (``onnxruntime.quantization.quantize_static(..., quant_format=QuantFormat.QDQ)``):
  ``DequantizeLinear`` of constant weights and biases is folded to float initializers (per-tensor, per-axis and
  blocked scales). ``QuantizeLinear -> DequantizeLinear`` on an activation stays in the graph, so the forward pass
  (outputs, and the activations the rules see) is the quantized one; for relevance the pair is an identity: the
  ``DequantizeLinear`` handler registered here passes its output relevance unchanged to the float tensor the
  ``QuantizeLinear`` read (:func:`relay_sources`; the rewriter follows it when it looks for the nodes on the path).
- **Dynamic quantization** (``quantize_dynamic``): ``DynamicQuantizeLinear -> ConvInteger / MatMulInteger -> Cast
  -> Mul(scales)`` becomes ``DequantizeLinear(DynamicQuantizeLinear(x)) -> Conv / MatMul`` with the weights
  dequantized to float. The activations stay dynamically quantized (the same uint8 values); the integer
  accumulation becomes a float one (outputs agree to float rounding, ~1e-6 relative).
- **float16 / bfloat16** models: the whole graph is upcast to float32 (initializers, Casts to float16, value types,
  graph inputs and outputs), so relevance is computed in float32 with the float16-rounded weights: no overflow to
  Inf, no NaN from float16 underflow in the stabilisers. Inputs are read as float32 (float16 arrays are upcast
  exactly); outputs are float32 and can differ from onnxruntime's float16 inference by float16 rounding of the
  activations.
- **onnxruntime offline optimisation** (``SessionOptions.optimized_model_filepath``; ORT_ENABLE_BASIC/EXTENDED):
  ``com.microsoft`` FusedConv, FusedGemm, FusedMatMul, Gelu, BiasGelu, FastGelu, QuickGelu and
  SkipLayerNormalization are split back into standard ops (Conv + activation, Gemm + activation, Transpose + MatMul,
  the Erf / tanh GELU forms, Add + LayerNormalization).
- **onnxruntime's transformer optimiser** (``onnxruntime.transformers.optimizer.optimize_model``): Attention,
  MultiHeadAttention, GroupQueryAttention (prompt, no past), EmbedLayerNormalization,
  (Skip)SimplifiedLayerNormalization, RotaryEmbedding, BiasAdd and BiasSplitGelu are split into the ops a
  TorchScript export writes (:mod:`onnx_lrp.fused`), with the contrib kernels' exact semantics.

Not supported (load stops with one line listing every such node): onnxruntime's NCHWc layout
(``com.microsoft.nchwc`` ops, written by ORT_ENABLE_ALL on x86: save with ORT_ENABLE_EXTENDED instead), the
QOperator quantization format (QLinearConv, QLinearMatMul, QGemm, ...; quantize with QuantFormat.QDQ instead),
ORT's fused dynamic-quantization ops (DynamicQuantizeMatMul, MatMulIntegerToFloat, MatMulNBits, DynamicQuantizeLSTM),
ORT's fused attention ops other than those above (PackedAttention, DecoderMaskedMultiHeadAttention, SparseAttention,
...) and the cases :mod:`onnx_lrp.fused` refuses (past/present key-value state, packed QKV layouts),
fused activations other than the standard ONNX ones, and ConvInteger / MatMulInteger outside the
``quantize_dynamic`` pattern.
"""
from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from . import fused
from .canonize import to_initializer
from .errors import ModelError, UnsupportedError
from .ops.base import FLOAT_TYPES, ShapeOp, carries, const, register

MS = "com.microsoft"
QUANTIZERS = ("QuantizeLinear", "DynamicQuantizeLinear")
_LOW_FLOATS = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)

# known deployed forms that cannot be brought back (op type -> why); matched in the com.microsoft domain
_REFUSED_MS = {
    **{t: "QOperator quantization format; quantize with QuantFormat.QDQ instead" for t in (
        "QLinearConv", "QLinearMatMul", "QGemm", "QLinearAdd", "QLinearMul", "QLinearAveragePool",
        "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax",
        "QLinearReduceMean", "QLinearWhere", "QAttention", "QEmbedLayerNormalization", "QOrderedMatMul")},
    **{t: "onnxruntime's fused dynamic quantization; quantize_dynamic's output before ORT optimisation is "
          "supported" for t in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulNBits",
                                "DynamicQuantizeLSTM", "MatMulBnb4", "GatherBlockQuantized")},
    **{t: "onnxruntime's fused attention/embedding op; export the model without ORT's transformer optimiser"
       for t in ("PackedAttention", "PackedMultiHeadAttention", "DecoderAttention",
                 "DecoderMaskedMultiHeadAttention", "SparseAttention", "LongformerAttention")},
}
_REFUSED_DEFAULT = {"QLinearConv": _REFUSED_MS["QLinearConv"], "QLinearMatMul": _REFUSED_MS["QLinearConv"]}

# activations a fused op may name, and how to build them (standard ONNX ops, all handled by the rules)
_ACTIVATIONS = {"Relu", "Tanh", "Sigmoid", "LeakyRelu", "HardSigmoid", "Clip", "Elu", "Selu", "ThresholdedRelu",
                "Softplus", "Softsign", "HardSwish"}


# ---------------------------------------------------------------------------------------------- relevance relay
def relay_sources(node: ir.Node) -> list:
    """For ``DequantizeLinear(QuantizeLinear(x))`` (or of ``DynamicQuantizeLinear(x)``) with ``x`` a float
    activation: ``[x]`` (relevance passes through the pair unchanged); ``[]`` for every other node."""
    if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx") or not node.inputs:
        return []
    q = node.inputs[0]
    p = q.producer() if q is not None else None
    if p is None or p.op_type not in QUANTIZERS or p.domain not in ("", "ai.onnx") or p.outputs[0] is not q:
        return []
    x = p.inputs[0]
    return [x] if carries(x) else []


@register
class DequantizeRelay(ShapeOp):
    """DequantizeLinear: relevance goes to the float input of the QuantizeLinear it undoes (an identity for LRP);
    a DequantizeLinear of anything else (an integer graph input) ends the relevance path, like a Cast from int."""

    op_types = ("DequantizeLinear",)

    def relevance_inputs(self, node):
        return []

    def relevance_values(self, node):
        return relay_sources(node)

    def transpose(self, em, node, r_outs):
        r = r_outs[0]
        src = relay_sources(node)
        if src and src[0].dtype is not None and src[0].dtype != em.dtype:
            r = em.op("Cast", r, to=src[0].dtype.value, tag="r_in")
        return [r] if src else []


@register
class QuantizeEnd(ShapeOp):
    """QuantizeLinear / DynamicQuantizeLinear: integer outputs carry no relevance (the DequantizeLinear after them
    relays it past them)."""

    op_types = QUANTIZERS

    def relevance_inputs(self, node):
        return []

    def relevance_values(self, node):
        return []

    def transpose(self, em, node, r_outs):
        return []


# ---------------------------------------------------------------------------------------------- helpers
class _Builder:
    """Adds standard nodes before an anchor node, with unique names, and constants as initializers."""

    def __init__(self, graph: ir.Graph, anchor: ir.Node):
        self.graph, self.anchor = graph, anchor
        self.base = anchor.name or anchor.op_type
        self.k = 0
        self.nodes: list[ir.Node] = []

    def _name(self, tag: str) -> str:
        self.k += 1
        return f"{self.base}/split/{tag}_{self.k}"

    def const(self, arr, tag: str = "c") -> ir.Value:
        arr = np.asarray(arr)
        name = self._name(tag)
        v = ir.Value(name=name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                     const_value=ir.tensor(arr, name=name))
        self.graph.register_initializer(v)
        return v

    def op(self, op_type: str, inputs, like: ir.Value | None = None, tag: str | None = None, num_outputs: int = 1,
           **attrs):
        outs = [ir.Value(name=self._name((tag or op_type.lower()) + (str(i) if num_outputs > 1 else "")))
                for i in range(num_outputs)]
        if like is not None:
            for o in outs:
                o.type, o.shape = like.type, like.shape
        node = ir.node(op_type, list(inputs), attributes=attrs or None, outputs=outs, name=self._name(op_type))
        self.graph.insert_before(self.anchor, node)
        self.nodes.append(node)
        return outs[0] if num_outputs == 1 else outs


def _take_over(old: ir.Value, new: ir.Value) -> None:
    """``new`` replaces ``old`` everywhere (graph outputs included) and takes its name."""
    name = old.name
    was_output = old.is_graph_output()
    if new.type is None:
        new.type = old.type
    if new.shape is None:
        new.shape = old.shape
    old.name = None
    new.name = name
    old.replace_all_uses_with(new, replace_graph_outputs=was_output)


def _attr(node: ir.Node, key: str, default=None):
    a = node.attributes.get(key)
    return default if a is None else a.value


def _node_dict(node: ir.Node, opset, reason: str) -> dict:
    return dict(name=node.name, op_type=node.op_type, domain=node.domain, opset=opset, reason=reason)


# ---------------------------------------------------------------------------------------------- dequantize weights
def _qparams_misfit(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int, block: int) -> str | None:
    """Why a (De)QuantizeLinear's scale / zero point do not fit its input (the checker lets them pass), or None."""
    if zp is not None and zp.size != scale.size or (zp is not None and scale.size > 1 and zp.shape != scale.shape):
        return f"zero point of shape {list(zp.shape)} for a scale of shape {list(scale.shape)}"
    if scale.size == 1:
        return None
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        return f"axis {axis} for an input of rank {x.ndim}"
    axis %= x.ndim
    if block:
        want = list(x.shape)
        want[axis] = -(-x.shape[axis] // block)
        return None if list(scale.shape) == want else f"blocked scale of shape {list(scale.shape)} (want {want})"
    if scale.ndim != 1 or scale.size != x.shape[axis]:
        return f"scale of shape {list(scale.shape)} for {x.shape[axis]} entries along axis {axis}"
    return None


def _dequantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int, block: int) -> np.ndarray:
    xf = x.astype(np.float32)
    zf = np.zeros((), np.float32) if zp is None else zp.astype(np.float32)
    s = scale.astype(np.float32)
    if s.ndim == 0 or s.size == 1:
        return ((xf - zf.reshape(())) * s.reshape(())).astype(np.float32) if zf.size == 1 else \
            ((xf - zf) * s.reshape(())).astype(np.float32)
    axis = axis % x.ndim
    if block:  # blocked quantization (opset 21): scale has x's shape with axis divided into blocks
        s = np.repeat(s, block, axis=axis)[tuple(slice(0, n) for n in x.shape)]
        zf = np.repeat(zf, block, axis=axis)[tuple(slice(0, n) for n in x.shape)] if zf.ndim else zf
        return ((xf - zf) * s).astype(np.float32)
    shape = [1] * x.ndim
    shape[axis] = -1
    return ((xf - (zf.reshape(shape) if zf.ndim else zf)) * s.reshape(shape)).astype(np.float32)


_QRANGE = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127), np.dtype(np.uint16): (0, 65535),
           np.dtype(np.int16): (-32768, 32767), np.dtype(np.int32): (-2 ** 31, 2 ** 31 - 1)}


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
        if np.dtype(qtype) not in _QRANGE or out.is_graph_output() or int(_attr(node, "block_size", 0) or 0):
            continue
        lo, hi = _QRANGE[np.dtype(qtype)]
        misfit = _qparams_misfit(x, np.asarray(scale), None if zp is None else np.asarray(zp),
                                 int(_attr(node, "axis", 1)), 0)
        if misfit:
            raise ModelError(f"node {node.name} (QuantizeLinear): {misfit}; the model is malformed (re-export it)")
        axis = int(_attr(node, "axis", 1)) % max(x.ndim, 1)
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
        if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
            continue
        x, scale = const(node.inputs[0]), const(node.inputs[1])
        zp = const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        if x is None or scale is None or (len(node.inputs) > 2 and node.inputs[2] is not None and zp is None):
            continue
        if x.dtype.kind not in "iu":
            continue  # float8 / int4 payloads: left to onnxruntime
        out = node.outputs[0]
        if out.is_graph_output():
            continue
        axis, block = int(_attr(node, "axis", 1)), int(_attr(node, "block_size", 0) or 0)
        misfit = _qparams_misfit(x, scale, zp, axis, block)
        if misfit:
            raise ModelError(f"node {node.name} (DequantizeLinear): {misfit}; the model is malformed (re-export it)")
        arr = _dequantize(x, scale, zp, axis, block)
        target = out.dtype.numpy() if out.dtype is not None else scale.dtype
        arr = arr.astype(target)
        to_initializer(graph, out, arr)
        graph.remove(node)
        done += 1
    return done


# ---------------------------------------------------------------------------------------------- float16
def upcast_low_precision(model: ir.Model) -> int:
    """float16 / bfloat16 everywhere -> float32 (values, initializers, Cast targets, ConstantOfShape values)."""
    graph = model.graph
    changed = 0

    def fix(v: ir.Value | None) -> None:
        nonlocal changed
        if v is None or v.type is None or not isinstance(v.type, ir.TensorType) or v.dtype not in _LOW_FLOATS:
            return
        v.type = ir.TensorType(ir.DataType.FLOAT)
        if v.const_value is not None:
            arr = v.const_value.numpy().astype(np.float32)
            v.const_value = ir.tensor(arr, name=v.name)
        changed += 1

    for v in list(graph.inputs) + list(graph.outputs) + list(graph.initializers.values()):
        fix(v)
    for node in graph:
        for v in node.outputs:
            fix(v)
        if node.op_type == "Cast" and node.attributes.get("to") is not None:
            to = node.attributes["to"].value
            if int(to) in (ir.DataType.FLOAT16.value, ir.DataType.BFLOAT16.value):
                node.attributes["to"] = ir.AttrInt64("to", ir.DataType.FLOAT.value)
                changed += 1
        elif node.op_type == "ConstantOfShape" and node.attributes.get("value") is not None:
            t = node.attributes["value"].value
            if t.dtype in _LOW_FLOATS:
                node.attributes["value"] = ir.AttrTensor("value", ir.tensor(t.numpy().astype(np.float32)))
                changed += 1
    return changed


# ---------------------------------------------------------------------------------------------- dynamic quant
def _only_consumer(v: ir.Value) -> ir.Node | None:
    uses = list(v.uses())
    if len(uses) != 1 or v.is_graph_output():
        return None
    return uses[0].node


def dequantize_integer_ops(graph: ir.Graph) -> tuple[int, list]:
    """quantize_dynamic's ConvInteger / MatMulInteger chains -> DequantizeLinear + float Conv / MatMul."""
    done, refused = 0, []
    for node in list(graph):
        if node.op_type not in ("ConvInteger", "MatMulInteger") or node.domain not in ("", "ai.onnx"):
            continue
        why = None
        a = node.inputs[0]
        qa = a.producer() if a is not None else None
        w, w_zp = const(node.inputs[1]), (const(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None
                                          else np.zeros((), np.int32))
        cast = _only_consumer(node.outputs[0])
        mul = _only_consumer(cast.outputs[0]) if cast is not None and cast.op_type == "Cast" else None
        if qa is None or qa.op_type not in QUANTIZERS or qa.outputs[0] is not a:
            why = "its activation input is not produced by DynamicQuantizeLinear / QuantizeLinear"
        elif w is None or w_zp is None:
            why = "its weight or weight zero point is not a constant"
        elif mul is None or mul.op_type != "Mul":
            why = "its output does not go through Cast -> Mul(scales) as quantize_dynamic writes it"
        if why is None:
            a_scale = qa.outputs[1] if qa.op_type == "DynamicQuantizeLinear" else qa.inputs[1]
            a_zp = qa.outputs[2] if qa.op_type == "DynamicQuantizeLinear" else (
                qa.inputs[2] if len(qa.inputs) > 2 else None)
            s = mul.inputs[1] if mul.inputs[0] is cast.outputs[0] else mul.inputs[0]
            sp = s.producer()
            w_scale = None
            if sp is not None and sp.op_type == "Mul":
                others = [v for v in sp.inputs if v is not a_scale]
                if len(others) == 1 and any(v is a_scale for v in sp.inputs):
                    w_scale = const(others[0])
            if w_scale is None:
                why = "the scale product is not Mul(activation scale, constant weight scale)"
        if why is not None:
            refused.append((node, f"{node.op_type} outside quantize_dynamic's pattern: {why}"))
            continue
        wf = w.astype(np.float32) - np.asarray(w_zp, np.float32).reshape(
            (-1,) + (1,) * (w.ndim - 1) if node.op_type == "ConvInteger" and np.asarray(w_zp).size > 1 else
            np.asarray(w_zp).shape)
        ws = np.asarray(w_scale, np.float32)
        if node.op_type == "ConvInteger" and ws.size > 1:
            ws = ws.reshape((-1,) + (1,) * (w.ndim - 1))
        wf = (wf * ws).astype(np.float32)
        b = _Builder(graph, node)
        deq = b.op("DequantizeLinear", [a, a_scale, a_zp], tag="x_dequantized")
        deq.type = ir.TensorType(ir.DataType.FLOAT)
        deq.shape = a.shape
        wv = b.const(wf, tag="weight")
        if node.op_type == "ConvInteger":
            attrs = {k: v.value for k, v in node.attributes.items()}
            y = b.op("Conv", [deq, wv], like=mul.outputs[0], tag="conv", **attrs)
        else:
            y = b.op("MatMul", [deq, wv], like=mul.outputs[0], tag="matmul")
        _take_over(mul.outputs[0], y)
        graph.remove([mul, cast, node], safe=False)
        if sp is not None and not any(list(o.uses()) for o in sp.outputs) and not any(
                o.is_graph_output() for o in sp.outputs):
            graph.remove(sp)
        done += 1
    return done, refused


# ---------------------------------------------------------------------------------------------- ORT fused ops
def _activation(b: _Builder, y: ir.Value, name: str, params: list, like: ir.Value) -> ir.Value:
    p = list(params) + [None] * 3
    if name in ("Relu", "Tanh", "Sigmoid", "Softsign", "HardSwish", "Softplus"):
        return b.op(name, [y], like=like)
    if name == "LeakyRelu":
        return b.op(name, [y], like=like, alpha=float(p[0] if p[0] is not None else 0.01))
    if name == "Elu":
        return b.op(name, [y], like=like, alpha=float(p[0] if p[0] is not None else 1.0))
    if name == "ThresholdedRelu":
        return b.op(name, [y], like=like, alpha=float(p[0] if p[0] is not None else 1.0))
    if name == "HardSigmoid":
        return b.op(name, [y], like=like, alpha=float(p[0] if p[0] is not None else 0.2),
                    beta=float(p[1] if p[1] is not None else 0.5))
    if name == "Selu":
        return b.op(name, [y], like=like, alpha=float(p[0] if p[0] is not None else 1.67326319217681884765625),
                    gamma=float(p[1] if p[1] is not None else 1.05070102214813232421875))
    if name == "Clip":
        lo = -np.inf if p[0] is None else p[0]
        hi = np.inf if p[1] is None else p[1]
        return b.op("Clip", [y, b.const(np.array(lo, np.float32), "min"), b.const(np.array(hi, np.float32), "max")],
                    like=like)
    raise KeyError(name)


def _gelu_erf(b: _Builder, x: ir.Value, like: ir.Value) -> ir.Value:
    """x * 0.5 * (1 + erf(x / sqrt 2)): one self-product the pattern matcher recognises (gelu-erf)."""
    h = b.op("Div", [x, b.const(np.array(math.sqrt(2.0), np.float32), "sqrt2")], like=like)
    e = b.op("Erf", [h], like=like)
    p = b.op("Add", [e, b.const(np.array(1.0, np.float32), "one")], like=like)
    half = b.op("Mul", [p, b.const(np.array(0.5, np.float32), "half")], like=like)
    return b.op("Mul", [x, half], like=like)


def _gelu_tanh(b: _Builder, x: ir.Value, like: ir.Value) -> ir.Value:
    cube = b.op("Pow", [x, b.const(np.array(3.0, np.float32), "three")], like=like)
    inner = b.op("Add", [x, b.op("Mul", [cube, b.const(np.array(0.044715, np.float32), "c")], like=like)],
                 like=like)
    t = b.op("Tanh", [b.op("Mul", [inner, b.const(np.array(math.sqrt(2 / math.pi), np.float32), "k")], like=like)],
             like=like)
    half = b.op("Mul", [b.op("Add", [t, b.const(np.array(1.0, np.float32), "one")], like=like),
                        b.const(np.array(0.5, np.float32), "half")], like=like)
    return b.op("Mul", [x, half], like=like)


def split_fused(graph: ir.Graph, opset) -> tuple[int, list]:
    """Split onnxruntime's com.microsoft fused ops back into standard ops."""
    done, refused = 0, []
    conv_keys = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
    for node in list(graph):
        if node.domain != MS:
            continue
        t = node.op_type
        out = node.outputs[0]
        b = _Builder(graph, node)
        try:
            if t in ("FusedConv", "FusedGemm"):
                act = _attr(node, "activation", "")
                act = act.decode() if isinstance(act, bytes) else act
                if act and act not in _ACTIVATIONS:
                    refused.append((node, f"fused activation {act} has no standard ONNX op"))
                    continue
                if t == "FusedConv":
                    params = list(_attr(node, "activation_params", []) or [])
                    attrs = {k: node.attributes[k].value for k in conv_keys if k in node.attributes}
                    y = b.op("Conv", list(node.inputs[:3]), like=out, tag="conv", **attrs)
                    if len(node.inputs) > 3 and node.inputs[3] is not None:  # Z: the fused residual sum
                        y = b.op("Add", [y, node.inputs[3]], like=out, tag="sum")
                else:
                    params = [_attr(node, "activation_alpha"), _attr(node, "activation_beta"),
                              _attr(node, "activation_gamma")]
                    if act == "Selu":
                        params = [params[0], params[2]]
                    attrs = {k: node.attributes[k].value for k in ("alpha", "beta", "transA", "transB")
                             if k in node.attributes}
                    y = b.op("Gemm", list(node.inputs), like=out, tag="gemm", **attrs)
                if act:
                    y = _activation(b, y, act, params, out)
            elif t == "FusedMatMul":
                if _attr(node, "transBatchA", 0) or _attr(node, "transBatchB", 0):
                    refused.append((node, "FusedMatMul with transBatchA/transBatchB"))
                    continue
                xs = []
                for v, key in zip(node.inputs[:2], ("transA", "transB")):
                    if _attr(node, key, 0):
                        c = const(v)
                        if c is not None:
                            v = b.const(np.swapaxes(c, -1, -2).copy(), "weight_t")
                        elif v.shape is None:
                            raise KeyError("rank")
                        else:
                            r = len(v.shape)
                            v = b.op("Transpose", [v], perm=list(range(r - 2)) + [r - 1, r - 2], tag="t")
                    xs.append(v)
                alpha = float(_attr(node, "alpha", 1.0))
                if alpha != 1.0 and const(xs[1]) is not None:
                    xs[1] = b.const((const(xs[1]) * alpha).astype(const(xs[1]).dtype), "weight_scaled")
                    alpha = 1.0
                y = b.op("MatMul", xs, like=out, tag="matmul")
                if alpha != 1.0:
                    y = b.op("Mul", [y, b.const(np.array(alpha, np.float32), "alpha")], like=out)
            elif t in ("Gelu", "BiasGelu", "FastGelu", "QuickGelu"):
                x = node.inputs[0]
                if len(node.inputs) > 1 and node.inputs[1] is not None:
                    x = b.op("Add", [x, node.inputs[1]], like=out, tag="bias")
                if t == "QuickGelu":
                    alpha = float(_attr(node, "alpha", 1.702))
                    s = b.op("Sigmoid", [b.op("Mul", [x, b.const(np.array(alpha, np.float32), "alpha")], like=out)],
                             like=out)
                    y = b.op("Mul", [x, s], like=out)
                elif t == "FastGelu":
                    y = _gelu_tanh(b, x, out)
                else:
                    y = _gelu_erf(b, x, out)
            elif t == "SkipLayerNormalization":
                if any(list(o.uses()) or o.is_graph_output() for o in node.outputs[1:3]):
                    refused.append((node, "its mean / inverse-std outputs are used"))
                    continue
                ins = list(node.inputs) + [None] * 5
                s = b.op("Add", [ins[0], ins[1]], like=ins[0], tag="skip_sum")
                if ins[4] is not None:
                    s = b.op("Add", [s, ins[4]], like=ins[0], tag="bias")
                ln_in = [s, ins[2]] + ([ins[3]] if ins[3] is not None else [])
                y = b.op("LayerNormalization", ln_in, like=out, tag="layernorm", axis=-1,
                         epsilon=float(_attr(node, "epsilon", 1e-12)))
                if len(node.outputs) > 3 and (list(node.outputs[3].uses()) or node.outputs[3].is_graph_output()):
                    _take_over(node.outputs[3], s)
            else:
                continue
        except KeyError:
            for n in b.nodes:
                graph.remove(n, safe=False)
            refused.append((node, f"{t} with an input of unknown rank"))
            continue
        _take_over(out, y)
        graph.remove(node, safe=True)
        done += 1
    return done, refused


# ---------------------------------------------------------------------------------------------- entry point
def _reinfer_shapes(model: ir.Model) -> None:
    """Shape inference again after splitting ops that onnx's inference did not know (types copied by name)."""
    from . import loader  # only the loader touches onnx

    try:
        proto = loader.prepare_proto(ir.serde.serialize_model(model), "model")
    except Exception:
        return
    inferred = loader.to_ir(proto)
    known = {}
    for n in inferred.graph:
        for o in n.outputs:
            known[o.name] = o
    for n in model.graph:
        for o in n.outputs:
            k = known.get(o.name)
            if k is not None and k.shape is not None and (o.shape is None or o.type is None):
                o.shape, o.type = k.shape, k.type


def canonize(model: ir.Model) -> list[str]:
    """Bring deployed forms back to standard float ops (see the module docstring); returns what was done."""
    graph = model.graph
    opset = model.opset_imports.get("", "?")
    refused = []
    for node in graph:
        if node.domain == "com.microsoft.nchwc":
            refused.append((node, "onnxruntime NCHWc layout (ORT_ENABLE_ALL); save the optimised model with "
                                  "ORT_ENABLE_EXTENDED, or use the model before optimisation"))
        elif node.domain == MS and node.op_type in _REFUSED_MS:
            refused.append((node, _REFUSED_MS[node.op_type]))
        elif node.domain in ("", "ai.onnx") and node.op_type in _REFUSED_DEFAULT:
            refused.append((node, _REFUSED_DEFAULT[node.op_type]))
    notes = []
    if not refused:
        n_up = upcast_low_precision(model)  # first: the splits below write float32 constants
        if n_up:
            notes.append(f"upcast float16/bfloat16 to float32 ({n_up} value(s))")
        n_fused, r = split_fused(graph, opset)
        refused += r
        n_tf, r = fused.split_transformer_ops(model)  # Attention, EmbedLayerNormalization, ... (onnx_lrp/fused.py)
        refused += r
        if n_fused or n_tf:
            notes.append(f"split {n_fused + n_tf} onnxruntime fused op(s) into standard ops")
            _reinfer_shapes(model)
        n_w = fold_weight_dequantize(graph)
        if n_w:
            notes.append(f"folded {n_w} DequantizeLinear of constants to float")
        n_int, r = dequantize_integer_ops(graph)
        refused += r
        if n_int:
            notes.append(f"rewrote {n_int} ConvInteger/MatMulInteger to DequantizeLinear + float ops")
        n_pairs = sum(1 for n in graph if relay_sources(n))
        if n_pairs:
            notes.append(f"{n_pairs} activation QuantizeLinear/DequantizeLinear pair(s) pass relevance unchanged")
    if refused:
        raise UnsupportedError([_node_dict(n, model.opset_imports.get(n.domain or "", "?"), why)
                                for n, why in refused],
                               "These deployed forms are not supported; see docs/ci-regression.md "
                               "(Deployed models) for the supported ones.")
    if notes:
        from .loader import fold_constants  # new constant chains (e.g. a Transpose of a dequantized weight)

        fold_constants(model)
    model.meta["lrp_deployed"] = notes
    return notes


__all__ = ["canonize", "relay_sources", "fold_weight_dequantize", "upcast_low_precision", "dequantize_integer_ops",
           "split_fused", "DequantizeRelay", "QuantizeEnd", "FLOAT_TYPES"]
