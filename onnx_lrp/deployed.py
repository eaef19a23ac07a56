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
  com.microsoft QuantizeLinear / DequantizeLinear (``UseQDQContribOps``) on 8-bit types are read as the onnx ops.
- **QOperator static quantization** (``quantize_static(..., quant_format=QuantFormat.QOperator)``; most int8 models
  of the ONNX model zoo): QLinearConv, QLinearMatMul, QGemm, QLinearAdd, QLinearMul, QLinearAveragePool,
  QLinearGlobalAveragePool, QLinearConcat, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearReduceMean and
  QLinearWhere become ``DequantizeLinear -> float op -> QuantizeLinear(output scale, zero point)`` (constant weights
  dequantized to float, int32 biases to ``C * x_scale * w_scale``, QGemm's also ``* alpha``); standard ops that
  run on 8-bit tensors (MaxPool, Reshape, Transpose, Split, Gather of a quantized table, Pad, Resize, ...) are
  wrapped the same way with their input's scale (exact: they only select or move values). The result is the QDQ
  form: the forward pass is the quantized one (onnxruntime's outputs, up to a rounding tie in its integer kernels),
  and the relevance equals that of the same model quantized with QuantFormat.QDQ where both choose the same scales.
- **Dynamic quantization** (``quantize_dynamic``): ``DynamicQuantizeLinear -> ConvInteger / MatMulInteger -> Cast
  -> Mul(scales)`` becomes ``DequantizeLinear(DynamicQuantizeLinear(x)) -> Conv / MatMul`` with the weights
  dequantized to float. The activations stay dynamically quantized (the same uint8 values); the integer
  accumulation becomes a float one (outputs agree to float rounding, ~1e-6 relative per layer; in deep stacks a
  rounding can move a later DynamicQuantizeLinear value by one step: 0.5 % of max |y| on ddddocr's 21-layer CRNN).
  An int32 bias ``Cast(Floor(b / scales))`` (older quantize_dynamic) becomes the float bias plus its exact rounding,
  which takes no relevance; a static activation scale (QuantizeLinear, the scale product folded) is accepted too.
- **onnxruntime's fused dynamic quantization**: MatMulIntegerToFloat -> DequantizeLinear -> MatMul (+ bias);
  DynamicQuantizeMatMul -> DynamicQuantizeLinear -> DequantizeLinear -> MatMul (+ bias); DynamicQuantizeLSTM ->
  DynamicQuantizeLinear -> DequantizeLinear -> LSTM with the weights dequantized and transposed back to
  ``[dirs, 4h, in]``. The fused LSTM also requantizes the hidden state at every step, which a standard LSTM cannot:
  that state stays float (outputs within ~0.2 % of max |y| of onnxruntime's on the tested LSTM).
- **float16 / bfloat16** models: the whole graph is computed in float32 (Casts to float16, value types, graph inputs
  and outputs; initializers are read as float32 where used and stay in their type, ``onnx_lrp.external.Upcast``),
  so relevance is computed in float32 with the float16-rounded weights: no overflow to
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
(``com.microsoft.nchwc`` ops, written by ORT_ENABLE_ALL on x86: save with ORT_ENABLE_EXTENDED instead), QOperator
forms with no float counterpart here (QAttention, QEmbedLayerNormalization, QOrderedMatMul, channels_last pools,
non-constant weights or bias scales, 8-bit ops whose scale cannot be found or that mix scales; quantize with
QuantFormat.QDQ instead), ORT's weight-only block quantization (MatMulNBits, MatMulBnb4, GatherBlockQuantized),
ORT's fused attention ops other than those :mod:`onnx_lrp.fused` splits (PackedAttention,
DecoderMaskedMultiHeadAttention, SparseAttention, ...) and the cases it refuses (past/present key-value state,
packed QKV layouts), fused activations other than the standard ONNX ones, and ConvInteger / MatMulInteger whose
activation is not quantized by a (Dynamic)QuantizeLinear or whose output is not scaled by Cast -> Mul(scales).
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
    **{t: "quantized fused transformer op with no float counterpart here; quantize the float model with "
          "QuantFormat.QDQ instead" for t in ("QAttention", "QEmbedLayerNormalization", "QOrderedMatMul")},
    **{t: "onnxruntime's weight-only block quantization (int4 / blockwise); dequantize the weights to float or to "
          "QDQ (DequantizeLinear with block_size) instead" for t in ("MatMulNBits", "MatMulBnb4",
                                                                       "GatherBlockQuantized")},
    **{t: "onnxruntime's fused attention/embedding op; export the model without ORT's transformer optimiser"
       for t in ("PackedAttention", "PackedMultiHeadAttention", "DecoderAttention",
                 "DecoderMaskedMultiHeadAttention", "SparseAttention", "LongformerAttention")},
}

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


def _drop(graph: ir.Graph, nodes) -> None:
    """Remove nodes whose outputs are no longer read, detaching their inputs (so those lose these uses)."""
    for n in (nodes if isinstance(nodes, list) else [nodes]):
        for i in range(len(n.inputs)):
            n.replace_input_with(i, None)
        graph.remove(n, safe=False)


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
    """float16 / bfloat16 everywhere -> float32 (values, Cast targets, ConstantOfShape values; initializers read as
    float32 where used, kept in their type)."""
    graph = model.graph
    changed = 0

    def fix(v: ir.Value | None) -> None:
        nonlocal changed
        if v is None or v.type is None or not isinstance(v.type, ir.TensorType) or v.dtype not in _LOW_FLOATS:
            return
        v.type = ir.TensorType(ir.DataType.FLOAT)
        if v.const_value is not None:  # read as float32 where used; kept in its type (onnx_lrp.external.Upcast)
            from .external import Upcast

            v.const_value = Upcast(v.const_value)
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
        add, int_bias = None, None
        if cast is not None and cast.op_type == "Add":  # older quantize_dynamic: + Cast(Floor(bias / scales))
            add, int_bias = cast, [v for v in cast.inputs if v is not node.outputs[0]]
            int_bias = int_bias[0] if len(int_bias) == 1 else None
            cast = _only_consumer(add.outputs[0])
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
            elif const(s) is not None and const(a_scale) is not None and const(a_scale).size == 1 and \
                    float(const(a_scale).reshape(())) != 0:
                # a static activation scale: the product was folded to one constant
                w_scale = (np.asarray(const(s), np.float64) / np.asarray(const(a_scale), np.float64).reshape(())
                           ).astype(np.float32)
            if w_scale is None:
                why = "the scale product is not Mul(activation scale, constant weight scale)"
            elif add is not None:
                bias = _integer_bias(int_bias, s)
                if bias is None:
                    why = ("its int32 bias is not Cast(Floor(constant bias / scale product)) as quantize_dynamic "
                           "writes it")
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
            ins = [deq, wv]
            if add is not None:
                ins.append(b.const(bias[0].reshape(-1), tag="bias"))
            y = b.op("Conv", ins, like=mul.outputs[0], tag="conv", **attrs)
        else:
            y = b.op("MatMul", [deq, wv], like=mul.outputs[0], tag="matmul")
            if add is not None:
                y = b.op("Add", [y, b.const(bias[0], tag="bias")], like=mul.outputs[0], tag="bias_add")
        if add is not None:  # + (Floor(b / s) * s - b): the deployed bias exactly, the float bias in the layer
            qb = b.op("Mul", [_float_value(b.op("Cast", [int_bias], tag="bias_int", to=ir.DataType.FLOAT.value),
                                           int_bias.shape), s], tag="bias_quantized")
            corr = b.op("Sub", [_float_value(qb, int_bias.shape), b.const(bias[0], tag="bias_float")],
                        tag="bias_rounding")
            for v in (qb, corr):  # a rounding of the bias, below one accumulator step: no relevance, like a bias
                v.meta["lrp_shape_only"] = True
            y = b.op("Add", [y, _float_value(corr, int_bias.shape)], like=mul.outputs[0], tag="bias_exact")
        _take_over(mul.outputs[0], y)
        _drop(graph, [mul, cast] + ([add] if add is not None else []) + [node])
        if sp is not None and not any(list(o.uses()) for o in sp.outputs) and not any(
                o.is_graph_output() for o in sp.outputs):
            graph.remove(sp)
        done += 1
    return done, refused


# ---------------------------------------------------------------------------------------------- QOperator format
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
_INT8 = (ir.DataType.UINT8, ir.DataType.INT8)


def _ins(node: ir.Node, n: int) -> list:
    return list(node.inputs) + [None] * max(0, n - len(node.inputs))


def _float_value(v: ir.Value, shape) -> ir.Value:
    v.type = ir.TensorType(ir.DataType.FLOAT)
    v.shape = shape
    return v


def _deq(b: _Builder, x: ir.Value, s: ir.Value, z: ir.Value | None, axis: int | None = None, tag: str = "x"):
    """DequantizeLinear(x, s, z) as a node, or folded to a float initializer when x, s and z are constants."""
    xc, sc, zc = const(x), const(s), const(z)
    if xc is not None and sc is not None and (z is None or zc is not None):
        ax = 1 if axis is None else axis
        misfit = _qparams_misfit(xc, sc, zc, ax, 0)
        if misfit:
            raise ModelError(f"node {b.anchor.name} ({b.anchor.op_type}): {misfit}; the model is malformed "
                             "(re-export it)")
        return b.const(_dequantize(xc, sc, zc, ax, 0), tag=f"{tag}_dequantized")
    attrs = {"axis": axis} if axis is not None and (sc is None or sc.size > 1) else {}
    y = b.op("DequantizeLinear", [x, s] + ([z] if z is not None else []), tag=f"{tag}_dequantized", **attrs)
    return _float_value(y, x.shape)


def _requant(b: _Builder, y: ir.Value, s: ir.Value | None, z: ir.Value | None, out: ir.Value) -> None:
    """``out`` (the QLinear op's integer output) becomes QuantizeLinear(y, s, z); without ``s`` y itself (QGemm's
    float output)."""
    if s is None:
        _take_over(out, y)
        return
    if z is None:  # the default zero point 0 in the output's integer type
        dt = out.dtype.numpy() if out.dtype is not None else np.dtype(np.uint8)
        z = b.const(np.zeros((), dt), tag="zero_point")
    q = b.op("QuantizeLinear", [y, s, z], tag="requantized")
    if out.type is None:  # a com.microsoft op's output: onnx's shape inference left it untyped
        zc = const(z)
        q.type = ir.TensorType(ir.DataType.from_numpy(zc.dtype) if zc is not None else ir.DataType.UINT8)
    _take_over(out, q)


def _scalar(v: ir.Value | None) -> bool:
    c = const(v)
    return c is None or c.size == 1


def _qop_rewrite(b: _Builder, node: ir.Node, opset: int) -> str | None:
    """Rewrite one QLinearX node (see _QOP_STD/_QOP_MS); returns why not, or None when done."""
    t, out = node.op_type, node.outputs[0]
    attrs = {k: a.value for k, a in node.attributes.items()}
    fl = lambda v, shape=out.shape: _float_value(v, shape)  # noqa: E731
    if t == "QLinearConv":
        x, xs, xz, w, ws, wz, ys, yz, bias = _ins(node, 9)
        if const(w) is None or const(ws) is None or (bias is not None and (const(bias) is None or const(xs) is None)):
            return "its weight, weight scale, bias or input scale is not a constant"
        ins = [_deq(b, x, xs, xz), _deq(b, w, ws, wz, axis=0, tag="weight")]
        if bias is not None:
            s = (np.asarray(const(xs), np.float32).reshape(()) * np.asarray(const(ws), np.float32).reshape(-1))
            ins.append(b.const((const(bias).astype(np.float64) * s).astype(np.float32), tag="bias"))
        y = fl(b.op("Conv", ins, tag="conv", **attrs))
    elif t == "QLinearMatMul":
        a, as_, az, w, ws, wz, ys, yz = _ins(node, 8)
        y = fl(b.op("MatMul", [_deq(b, a, as_, az, axis=-2 if not _scalar(as_) else None, tag="a"),
                               _deq(b, w, ws, wz, axis=-1 if not _scalar(ws) else None, tag="b")], tag="matmul"))
    elif t == "QGemm":
        a, as_, az, w, ws, wz, c, ys, yz = _ins(node, 9)
        alpha, trans_b = float(attrs.get("alpha", 1.0)), int(attrs.get("transB", 0))
        ins = [_deq(b, a, as_, az, tag="a"), _deq(b, w, ws, wz, axis=0 if trans_b else 1, tag="b")]
        if c is not None:  # int32 bias added before the output scale alpha * a_scale * b_scale
            if const(c) is None or const(as_) is None or const(ws) is None:
                return "its bias C, input scale or weight scale is not a constant"
            s = alpha * np.asarray(const(as_), np.float64).reshape(()) * np.asarray(const(ws), np.float64).reshape(-1)
            ins.append(b.const((const(c).astype(np.float64) * s).astype(np.float32), tag="bias"))
        gattrs = {k: v for k, v in attrs.items() if k in ("alpha", "transA", "transB")}
        y = fl(b.op("Gemm", ins, tag="gemm", beta=1.0, **gattrs))
        _requant(b, y, ys, yz, out)
        return None
    elif t in ("QLinearAdd", "QLinearMul"):
        a, as_, az, c, cs, cz, ys, yz = _ins(node, 8)
        y = fl(b.op(t[7:], [_deq(b, a, as_, az, tag="a"), _deq(b, c, cs, cz, tag="b")], tag=t[7:].lower()))
    elif t in ("QLinearAveragePool", "QLinearGlobalAveragePool"):
        if int(attrs.pop("channels_last", 0)):
            return "channels_last=1 (NHWC) is not supported"
        x, xs, xz, ys, yz = _ins(node, 5)
        y = fl(b.op(t[7:], [_deq(b, x, xs, xz)], tag="pool", **attrs))
    elif t == "QLinearConcat":
        ys, yz = node.inputs[0], node.inputs[1]
        rest = list(node.inputs[2:])
        if len(rest) % 3:
            return "its inputs are not (tensor, scale, zero point) triples"
        xs = [_deq(b, rest[i], rest[i + 1], rest[i + 2], tag=f"x{i // 3}") for i in range(0, len(rest), 3)]
        y = fl(b.op("Concat", xs, tag="concat", axis=int(attrs.get("axis", 0))))
    elif t in ("QLinearSigmoid", "QLinearLeakyRelu"):
        x, xs, xz, ys, yz = _ins(node, 5)
        extra = {"alpha": float(attrs.get("alpha", 0.01))} if t == "QLinearLeakyRelu" else {}
        y = fl(b.op(t[7:], [_deq(b, x, xs, xz)], tag=t[7:].lower(), **extra))
    elif t == "QLinearSoftmax":
        x, xs, xz, ys, yz = _ins(node, 5)
        axis = int(attrs.get("axis", -1))
        rank = len(x.shape) if x.shape is not None else None
        if int(attrs.get("opset", 13)) < 13 and axis != -1 and (rank is None or axis != rank - 1):
            return (f"opset-{int(attrs.get('opset'))} softmax semantics over the flattened trailing axes "
                    f"(axis {axis} is not the last)")
        y = fl(b.op("Softmax", [_deq(b, x, xs, xz)], tag="softmax", axis=axis))
    elif t == "QLinearReduceMean":
        x, xs, xz, ys, yz = _ins(node, 5)
        axes, keep = attrs.get("axes"), int(attrs.get("keepdims", 1))
        xf = _deq(b, x, xs, xz)
        if axes is not None and opset >= 18:
            y = b.op("ReduceMean", [xf, b.const(np.asarray(list(axes), np.int64), "axes")], tag="mean", keepdims=keep)
        else:
            y = b.op("ReduceMean", [xf], tag="mean", keepdims=keep, **({"axes": list(axes)} if axes else {}))
        y = fl(y)
    elif t == "QLinearWhere":
        cond, x, xs, xz, w, ws, wz, ys, yz = _ins(node, 9)
        y = fl(b.op("Where", [cond, _deq(b, x, xs, xz, tag="x"), _deq(b, w, ws, wz, tag="y")], tag="where"))
    else:
        return "not a QOperator op"
    _requant(b, y, ys, yz, out)
    return None


def _direct8_qparams(v: ir.Value, node: ir.Node) -> tuple | None:
    """(scale, zero point) of an 8-bit input ``v`` of ``node`` (an op of _DIRECT8): from the QuantizeLinear that
    produced it, or for a quantized constant (an embedding table read by Gather) from the DequantizeLinear(s) that
    read the op's output, through further _DIRECT8 ops."""
    p = v.producer()
    if p is not None and p.op_type == "QuantizeLinear" and p.domain in ("", "ai.onnx") and p.outputs[0] is v:
        if int(_attr(p, "block_size", 0) or 0) or not _scalar(p.inputs[1]):
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
                    if not _scalar(c.inputs[1]):
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
        if not data or any(v is None or (v.dtype not in _INT8 and v.dtype is not None) for v in data):
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
        b = _Builder(graph, node)
        ins = list(node.inputs)
        for i in idx:
            if i < len(ins):
                ins[i] = _deq(b, ins[i], s, z, tag=f"in{i}")
        attrs = {k: a.value for k, a in node.attributes.items()}
        if node.op_type == "Pad" and attrs.get("mode", "constant") in ("constant", b"constant"):
            c = const(ins[2]) if len(ins) > 2 and ins[2] is not None else np.zeros((), np.float32)
            sc, zc = const(s), const(z) if z is not None else np.zeros((), np.float32)
            if c is None or sc is None or zc is None:
                refused.append((node, "Pad of an 8-bit tensor with a non-constant pad value or scale"))
                for n in b.nodes:
                    _drop(graph, n)
                continue
            pad = ((np.float32(c.reshape(())) - np.float32(zc.reshape(()))) * np.float32(sc.reshape(())))
            ins = ins[:2] + [b.const(np.asarray(pad, np.float32), "pad_value")] + ins[3:]
        new_outs = b.op(node.op_type, ins, tag=node.op_type.lower(), num_outputs=len(node.outputs), **attrs)
        new_outs = new_outs if isinstance(new_outs, list) else [new_outs]
        for i, (old, new) in enumerate(zip(node.outputs, new_outs)):
            if not list(old.uses()) and not old.is_graph_output():
                continue
            if node.op_type == "MaxPool" and i == 1:  # the indices
                _take_over(old, new)
            else:
                _float_value(new, old.shape)
                _requant(b, new, s, z, old)
        _drop(graph, node)
        done += 1
    return done, refused


def standard_qdq_domain(graph: ir.Graph, opset: int) -> int:
    """com.microsoft QuantizeLinear / DequantizeLinear (quantize_static's ``UseQDQContribOps``) on 8-bit types (and
    int32 biases) -> the onnx ops (the same semantics from opset 13 on, per-axis scales included)."""
    done = 0
    if opset < 13:
        return 0
    for node in graph:
        if node.domain != MS or node.op_type not in ("QuantizeLinear", "DequantizeLinear") or \
                int(_attr(node, "block_size", 0) or 0):
            continue
        q = node.outputs[0] if node.op_type == "QuantizeLinear" else node.inputs[0]
        zp = node.inputs[2] if len(node.inputs) > 2 else None
        dt = zp.dtype if zp is not None else q.dtype
        ok = _INT8 + ((ir.DataType.INT32,) if node.op_type == "DequantizeLinear" else ())  # int32: biases
        if dt in ok or (dt is None and zp is None):
            node.domain = ""
            done += 1
    return done


def qoperator_to_qdq(graph: ir.Graph, opset: int) -> tuple[int, list]:
    """QOperator quantization (QLinearConv, QGemm, QLinearAdd, ...) -> DequantizeLinear -> float op ->
    QuantizeLinear (constant weights and biases dequantized to float initializers); then the standard ops that run on
    8-bit activations are wrapped the same way (exact)."""
    done, refused = 0, []
    for node in list(graph):
        if not ((node.domain in ("", "ai.onnx") and node.op_type in _QOP_STD) or
                (node.domain == MS and node.op_type in _QOP_MS)):
            continue
        b = _Builder(graph, node)
        why = _qop_rewrite(b, node, opset)
        if why is not None:
            for n in reversed(b.nodes):
                _drop(graph, n)
            refused.append((node, f"{node.op_type}: {why}"))
            continue
        _drop(graph, node)
        done += 1
    if done:
        n, r = _sandwich_direct8(graph)
        done += n
        refused += r
    return done, refused


# ---------------------------------------------------------------------------------------------- ORT fused dynamic q
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
        b = _Builder(graph, node)
        if t == "DynamicQuantizeLSTM":
            x, w, r, bias, seq, h0, c0, peep, ws, wz, rs, rz = _ins(node, 12)
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
            xf = _float_value(b.op("DequantizeLinear", [q, s, z], tag="x_dequantized"), x.shape)
            ins = [xf, b.const(_lstm_weight(const(w), const(ws), const(wz)), "W"),
                   b.const(_lstm_weight(const(r), const(rs), const(rz)), "R"), bias, seq, h0, c0, peep]
            while ins and ins[-1] is None:
                ins.pop()
            attrs = {k: a.value for k, a in node.attributes.items()}
            outs = b.op("LSTM", ins, tag="lstm", num_outputs=len(node.outputs), **attrs)
            outs = outs if isinstance(outs, list) else [outs]
            for old, new in zip(node.outputs, outs):
                if list(old.uses()) or old.is_graph_output():
                    _take_over(old, new)
            _drop(graph, node)
            done += 1
            continue
        if t == "MatMulIntegerToFloat":
            a, w, as_, ws, az, wz, bias = _ins(node, 7)
            af = _deq(b, a, as_, az, tag="a")
        else:
            a, w, ws, wz, bias = _ins(node, 5)
            q, s, z = b.op("DynamicQuantizeLinear", [a], tag="a_quantized", num_outputs=3)
            q.type, q.shape = ir.TensorType(ir.DataType.UINT8), a.shape
            s.type, z.type = ir.TensorType(ir.DataType.FLOAT), ir.TensorType(ir.DataType.UINT8)
            s.shape = z.shape = ir.Shape([])
            af = _float_value(b.op("DequantizeLinear", [q, s, z], tag="a_dequantized"), a.shape)
        wf = _deq(b, w, ws, wz, axis=-1 if not _scalar(ws) else None, tag="b")
        y = _float_value(b.op("MatMul", [af, wf], tag="matmul"), out.shape)
        if bias is not None:
            y = _float_value(b.op("Add", [y, bias], tag="bias"), out.shape)
        _take_over(out, y)
        _drop(graph, node)
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
    from . import external, loader  # only the loader touches onnx

    try:
        with external.weightless(model):  # shapes only: no weight serialised
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
    notes = []
    n_std = standard_qdq_domain(graph, opset if isinstance(opset, int) else 0)
    if n_std:
        notes.append(f"read {n_std} com.microsoft QuantizeLinear/DequantizeLinear as the onnx ops")
    n_qop, r = qoperator_to_qdq(graph, opset if isinstance(opset, int) else 0)
    refused += r
    if n_qop:
        notes.append(f"rewrote {n_qop} QOperator-format op(s) as DequantizeLinear -> float op -> QuantizeLinear")
    n_dyn, r = split_fused_dynamic_quant(graph)
    refused += r
    if n_dyn:
        notes.append(f"split {n_dyn} onnxruntime fused dynamic-quantization op(s) into DynamicQuantizeLinear -> "
                     "DequantizeLinear -> float op")
    if not refused:
        if n_std or n_qop or n_dyn:
            _reinfer_shapes(model)
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
           "split_fused", "qoperator_to_qdq", "split_fused_dynamic_quant", "standard_qdq_domain", "DequantizeRelay",
           "QuantizeEnd", "FLOAT_TYPES"]
