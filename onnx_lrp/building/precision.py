"""Relevance in the model's precision: a float16 / bfloat16 model's finished relevance graph computed in its own
type, with float32 where stability needs it (as LXT runs AttnLRP in bfloat16).

The loader computes a float16 / bfloat16 model in float32 (:mod:`onnx_lrp.load.passes.float16`): right on the CPU,
where onnxruntime has no float16 kernels for most ops and would cast every op anyway. On CUDA that costs twice the
weights' memory traffic and the float32 matrix units. :func:`to_model_precision` rewrites the finished relevance
graph (forward + relevance, after the rewriter; the rewriter is untouched) so that:

* the forward and the relevance's matrix products (MatMul, Gemm, Conv, ...: the weights' traffic) compute in the
  model's type (``dtype``), the weights read in their type (no Cast);
* these stay float32 (:func:`float32_nodes`): the relevance's other nodes (the rewriter's ``lrp/`` nodes: every
  division and its stabiliser ``z + eps * sign(z)``, ``relu(z) + eps``, the LRP-0 guard, the products with the
  activations, the sums of relevance), softmax and log-softmax, the normalisations (LayerNormalization, RMS, batch /
  instance / group), the reductions (ReduceMean, ReduceSum, ...), exp / log / pow / sqrt / reciprocal, quantization
  ops, nodes with subgraphs, nodes whose constant inputs do not fit ``dtype``, and every node that writes a graph
  output (outputs stay float32). The relevance's elementwise nodes in float16 tripled the drift on LLaMA 0.1 B
  (float16, on the CPU: rel-L2 2.3e-3 vs the float32 twin instead of 8.3e-4; float32 throughout 7.8e-4);
* a Cast sits wherever a value crosses between the two (one per value and type).

:func:`wanted` decides where it applies: ``precision="model"`` always, ``"float32"`` never, ``"auto"`` (the default)
on CUDA only; where onnxruntime cannot start the graph (a missing bfloat16 kernel), the Explainer refuses ``"model"``
in one line and rebuilds ``"auto"`` in float32 with one warning. Verified structurally and by running float16 on the
CPU (onnxruntime casts there); not on a GPU yet.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core.relevance_model import PRECISIONS  # noqa: F401 (checked by BuildOptions; named here as before)
from ..load import reinfer_shapes
from ..load.builder import Upcast


LOW = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)

#: ops computed in float32 whatever the model's type
FLOAT32_OPS = frozenset({
    "Div", "Reciprocal", "Sqrt", "Pow", "Exp", "Log", "Softmax", "LogSoftmax", "Hardmax",
    "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
    "RMSNormalization", "BatchNormalization", "InstanceNormalization", "GroupNormalization", "LpNormalization",
    "MeanVarianceNormalization", "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceProd", "CumSum", "QuantizeLinear", "DequantizeLinear",
    "DynamicQuantizeLinear", "Loop", "Scan", "If", "Resize", "Upsample"})
#: the matrix products: relevance nodes of these compute in the model's type, the relevance's other nodes in float32
MATRIX_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "FusedMatMul"})
_MAX = {ir.DataType.FLOAT16: float(np.finfo(np.float16).max), ir.DataType.BFLOAT16: 3.38e38}


def wanted(precision: str, device: str) -> bool:
    """Whether to compute in the model's precision: ``"model"`` always, ``"auto"`` on CUDA (the CPU provider has no
    float16 / bfloat16 kernels: it would cast every op), ``"float32"`` never."""
    return precision == "model" or (precision == "auto" and device == "cuda")


def model_dtype(model: ir.Model) -> ir.DataType | None:
    """The type a float16 / bfloat16 model was written in (its weights kept in it), or None."""
    for v in model.graph.initializers.values():
        if isinstance(v.const_value, Upcast):
            return v.const_value.source.dtype
    return None


def _is_float(v: ir.Value | None) -> bool:
    return v is not None and v.type is not None and isinstance(v.type, ir.TensorType) and \
        v.dtype in (ir.DataType.FLOAT,) + LOW


def _fits(v: ir.Value, dtype: ir.DataType) -> bool:
    """A constant whose finite values are representable in ``dtype`` (no overflow to infinity)."""
    t = v.const_value
    if t is None or isinstance(t, Upcast):
        return True
    a = np.asarray(t.numpy(), np.float64)
    a = a[np.isfinite(a)]
    return not a.size or float(np.max(np.abs(a))) <= _MAX[dtype]


def float32_nodes(graph: ir.Graph, dtype: ir.DataType) -> set:
    """The nodes that compute in float32 (see the module's docstring)."""
    keep = set()
    outputs = set(graph.outputs)
    for node in graph:
        relevance = (node.name or "").startswith("lrp/")
        if node.op_type in FLOAT32_OPS or (relevance and node.op_type not in MATRIX_OPS) or \
                node.domain not in ("", "ai.onnx") or any(o in outputs for o in node.outputs) or \
                any(_is_float(x) and x.const_value is not None and not _fits(x, dtype) for x in node.inputs):
            keep.add(node)
    return keep


def to_model_precision(model: ir.Model, dtype: ir.DataType | None = None) -> int:
    """Rewrite the finished relevance model to compute in ``dtype`` (default: the model's own float16 / bfloat16;
    nothing for a float32 model) with float32 where stability needs it. Returns the nodes now computing in
    ``dtype`` (0: unchanged)."""
    dtype = dtype or model_dtype(model)
    graph = model.graph
    if dtype not in LOW or any(True for _ in graph.subgraphs()):
        return 0
    reinfer_shapes(model)  # the rewriter's values are typed by inference
    fill_types(graph)  # and where inference left one untyped, from its node (a value of unknown type gets no Cast)
    keep = float32_nodes(graph, dtype)
    low_nodes = [n for n in graph if n not in keep]
    for v in list(graph.initializers.values()):  # weights in their type (float32 nodes cast them where used)
        t = v.const_value
        if isinstance(t, Upcast) and not v.is_graph_output():
            v.const_value, v.type = t.source, ir.TensorType(t.source.dtype)
    for node in low_nodes:  # outputs, Cast targets and ConstantOfShape values in dtype
        for o in node.outputs:
            if o.type is not None and isinstance(o.type, ir.TensorType) and o.dtype == ir.DataType.FLOAT:
                o.type = ir.TensorType(dtype)
        to = node.attributes.get("to")
        if node.op_type == "Cast" and to is not None and int(to.value) == ir.DataType.FLOAT.value:
            node.attributes["to"] = ir.AttrInt64("to", dtype.value)
        value = node.attributes.get("value")
        if node.op_type == "ConstantOfShape" and value is not None and value.value.dtype == ir.DataType.FLOAT:
            node.attributes["value"] = ir.AttrTensor("value", _converted(value.value.numpy(), dtype))
    casts = _Casts(graph)
    for node in list(graph):
        want = ir.DataType.FLOAT if node in keep else dtype
        for i, x in enumerate(node.inputs):
            if _is_float(x) and x.dtype != want and not _type_input(node, i):
                node.replace_input_with(i, casts(x, want, node))
    return len(low_nodes)


_BOOL_OPS = frozenset({"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not", "And", "Or", "Xor",
                       "IsNaN", "IsInf"})
_INT64_OPS = frozenset({"Shape", "Size", "ArgMax", "ArgMin", "NonZero"})


def _output_type(node: ir.Node, index: int) -> ir.DataType | None:
    """The element type of ``node``'s output ``index`` from the node itself (its op and its typed inputs)."""
    op, known = node.op_type, [x.dtype for x in node.inputs if x is not None and x.type is not None]
    if op == "Cast":
        return ir.DataType(int(node.attributes["to"].value))
    if op == "CastLike":
        x = node.inputs[1] if len(node.inputs) > 1 else None
        return x.dtype if x is not None and x.type is not None else None
    if op in _INT64_OPS or (op in ("TopK", "MaxPool") and index == 1):
        return ir.DataType.INT64
    if op in _BOOL_OPS or (op == "Dropout" and index == 1):
        return ir.DataType.BOOL
    if op in ("ConstantOfShape", "Constant"):
        value = node.attributes.get("value")
        return value.value.dtype if value is not None else (ir.DataType.FLOAT if op == "ConstantOfShape" else None)
    if op == "Where":
        x = next((x for x in node.inputs[1:] if x is not None and x.type is not None), None)
        return x.dtype if x is not None else None
    if node.domain not in ("", "ai.onnx"):
        return None
    floats = [t for t in known if t in (ir.DataType.FLOAT,) + LOW]
    return floats[0] if floats else (known[0] if known else None)


def fill_types(graph: ir.Graph) -> int:
    """Type every untyped value a node of the main graph writes, in graph order, from its node (see
    :func:`_output_type`); returns how many were typed."""
    done = 0
    for node in graph:
        for i, o in enumerate(node.outputs):
            if o.type is None:
                t = _output_type(node, i)
                if t is not None:
                    o.type = ir.TensorType(t)
                    done += 1
    return done


def _type_input(node: ir.Node, index: int) -> bool:
    """An input whose float type is not the computation's: Cast reads any type, Shape and Size only the shape,
    CastLike's first input is converted to its second's type."""
    return node.op_type in ("Cast", "Shape", "Size") or (node.op_type == "CastLike" and index == 0)


def _converted(arr: np.ndarray, dtype: ir.DataType) -> ir.TensorProtocol:
    if dtype == ir.DataType.FLOAT16:
        return ir.tensor(np.asarray(arr, np.float32).astype(np.float16))
    import ml_dtypes  # onnx_ir's own dependency

    return ir.tensor(np.asarray(arr, np.float32).astype(ml_dtypes.bfloat16))


class _Casts:
    """One Cast (or converted constant) per value and type, placed before the first node that reads it."""

    def __init__(self, graph: ir.Graph):
        self.graph, self.made = graph, {}

    def __call__(self, x: ir.Value, to: ir.DataType, reader: ir.Node) -> ir.Value:
        key = (id(x), to)
        if key in self.made:
            return self.made[key]
        name = f"{x.name}/{to.name.lower()}"
        if x.const_value is not None and not isinstance(x.const_value, Upcast) and x.is_initializer() \
                and x.const_value.size <= 1 << 16:
            arr = x.const_value.numpy()
            out = ir.Value(name=name, shape=x.shape, type=ir.TensorType(to),
                           const_value=_converted(arr, to) if to in LOW else ir.tensor(np.asarray(arr, np.float32)))
            out.const_value.name = name
            self.graph.register_initializer(out)
        else:
            cast = ir.node("Cast", [x], attributes={"to": to.value}, name=f"lrp/precision/{name}")
            out = cast.outputs[0]
            out.name, out.type, out.shape = f"lrp/precision/{name}", ir.TensorType(to), x.shape
            self.graph.insert_before(reader, cast)
        self.made[key] = out
        return out


__all__ = ["PRECISIONS", "FLOAT32_OPS", "MATRIX_OPS", "wanted", "model_dtype", "float32_nodes",
           "to_model_precision", "fill_types"]
