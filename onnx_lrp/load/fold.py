"""Constants, names and shapes of a loaded model: constant folding (every node whose inputs are all parameters,
Shape/Size of static shapes, static parts of shapes), unique names, shape re-inference after rewrites, the marks of
values that carry no relevance (computed from shapes or integer inputs only) and the size check.

Evaluating nodes and inferring shapes is :mod:`onnx_lrp.load.proto`'s (the only package that imports onnx).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core import meta
from ..core.errors import ModelError
from .builder import to_initializer
from .proto.evaluate import eval_node
from .proto.opset import MIN_OPSET
from .proto.prepare import reinferred
from .proto.shapes import inferred_dims


# ops never folded: random or stateful, or whose value must stay an activation
NO_FOLD = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
_FOLD_LIMIT = 1 << 26  # elements; larger constant results stay in the graph
_FILL_LIMIT = 1 << 28  # ConstantOfShape: how IR <= 3 zoo models store weights (VGG19's fc6 has 103 M elements)
# a float weight's new layout: as many elements as the weight itself, folded at any size (onnxruntime-genai's tied
# float32 head: the embedding Gather reads Transpose(lm_head weight), 128256 x 2048 at LLaMA-3.2-1B's size)
_LAYOUT = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def fold_constants(model: ir.Model) -> int:
    """Replace every node whose inputs are all parameters (and Shape/Size of static shapes) by initializers."""
    graph = model.graph
    opset = model.opset_imports.get("", MIN_OPSET)
    outputs = {id(v) for v in graph.outputs}
    folded = 0
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or node.op_type in NO_FOLD or meta.KEEP_PACKED.get(node, False) or \
                _packed_dequantize(node):
            continue
        if any(id(o) in outputs for o in node.outputs) or any(
                a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            continue
        results = None
        if node.op_type in ("Shape", "Size") and node.inputs[0] is not None:
            shape = node.inputs[0].shape
            if shape is not None and shape.is_static():
                dims = np.array([int(d) for d in shape], dtype=np.int64)
                if node.op_type == "Size":
                    results = [np.array(int(np.prod(dims)), dtype=np.int64)]
                else:
                    start = node.attributes.get_int("start", 0)
                    end = node.attributes.get_int("end", len(dims))
                    results = [dims[start:end]]
        elif all(v is None or v.const_value is not None for v in node.inputs):
            results = eval_node(node, opset)
        elif node.op_type == "CastLike" and node.inputs[0] is not None and node.inputs[0].const_value is not None \
                and node.inputs[1] is not None and node.inputs[1].dtype is not None:
            # a constant cast to an activation's type (Attention's function body: its zero): still a constant
            try:
                results = [node.inputs[0].const_value.numpy().astype(node.inputs[1].dtype.numpy())]
            except Exception:
                results = None
        elif node.op_type in ("Gather", "Slice") and all(v is None or v.const_value is not None
                                                        for v in node.inputs[1:]):
            results = _static_part_of_shape(node, opset)
        limit = _FILL_LIMIT if node.op_type == "ConstantOfShape" else _FOLD_LIMIT
        if results is not None and _relaid_weight(node, results):
            limit = max(r.size for r in results)
        if results is None or any(r.size > limit or r.dtype == object for r in results):
            continue
        for out, arr in zip(node.outputs, results):
            to_initializer(graph, out, arr)
        graph.remove(node)
        folded += 1
    return folded


def _relaid_weight(node: ir.Node, results: list) -> bool:
    """A layout op on a float constant whose one result has the constant's elements (no growth)."""
    x = node.inputs[0] if node.op_type in _LAYOUT and node.inputs else None
    return x is not None and x.const_value is not None and len(results) == 1 and results[0].dtype.kind == "f" and \
        results[0].size == x.const_value.size


def _packed_dequantize(node: ir.Node) -> bool:
    """A DequantizeLinear of 4-bit weights: kept (the qdq pass makes it a packed weight, not a float copy)."""
    x = node.inputs[0] if node.op_type == "DequantizeLinear" and node.inputs else None
    return x is not None and x.dtype in (ir.DataType.INT4, ir.DataType.UINT4)


def _shape_dims(v: ir.Value | None, opset: int, depth: int = 0) -> list | None:
    """The dimensions (ints or symbols) a 1-D int64 value holds when it is a Shape, or a Gather/Slice with constant
    indices of one (onnxruntime's transpose optimiser writes ``Gather(Shape(x), perm)`` for ``Shape(Transpose(x))``)."""
    p = v.producer() if v is not None else None
    if p is None or depth > 8:
        return None
    if p.op_type == "Shape":
        if p.inputs[0] is None or p.inputs[0].shape is None:
            return None
        dims = list(p.inputs[0].shape)
        return dims[p.attributes.get_int("start", 0):p.attributes.get_int("end", len(dims))]
    if p.op_type in ("Gather", "Slice") and all(x is None or x.const_value is not None for x in p.inputs[1:]):
        dims = _shape_dims(p.inputs[0], opset, depth + 1)
        if dims is None:
            return None
        picked = eval_node(p, opset, {0: np.arange(len(dims), dtype=np.int64)})
        if picked is None or np.ndim(picked[0]) != 1:
            return None
        return [dims[int(i)] for i in picked[0]]
    return None


def _static_part_of_shape(node: ir.Node, opset: int) -> list[np.ndarray] | None:
    """Gather/Slice of a Shape whose selected dimensions are static (dynamic batch or sequence axes elsewhere):
    e.g. the head size GPT-2 reads from ``value.size(-1)``."""
    dims = _shape_dims(node.inputs[0], opset)
    if dims is None:
        return None
    picked = eval_node(node, opset, {0: np.arange(len(dims), dtype=np.int64)})
    if picked is None:
        return None
    chosen = [dims[int(i)] for i in np.ravel(picked[0])]
    if not all(isinstance(d, int) for d in chosen):
        return None
    return [np.array(chosen, dtype=np.int64).reshape(np.shape(picked[0]))]


def name_everything(graph: ir.Graph) -> None:
    seen: set[str] = set()
    for i, node in enumerate(graph):
        name = node.name or f"{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        node.name = name
        seen.add(name)
    taken = {v.name for v in graph.inputs} | {v.name for v in graph.initializers.values()}
    for node in graph:
        for j, out in enumerate(node.outputs):
            if not out.name or out.name in taken:
                out.name = f"{node.name}/out{j}" if not out.name else f"{out.name}__{node.name}"
            taken.add(out.name)


MAX_ITEM_ELEMENTS = 1 << 30  # elements of one batch item of any tensor


def check_sizes(graph: ir.Graph, name: str) -> None:
    """Refuse inputs with an empty non-batch axis and tensors whose static size per item is absurd (a corrupt
    dimension such as 2**30 would otherwise exhaust memory while the relevance graph is built)."""
    for v in list(graph.inputs) + [o for n in graph for o in n.outputs]:
        if v.shape is None:
            continue
        dims = [d for d in v.shape[1:] if isinstance(d, int)]
        if v in graph.inputs and any(d == 0 for d in dims):
            raise ModelError(f"{name}: input {v.name!r} has an empty axis (shape {list(v.shape)}); nothing to "
                             "explain (re-export with the real input size)")
        if int(np.prod(dims, dtype=np.float64)) > MAX_ITEM_ELEMENTS:
            producer = v.producer()
            where = f" (output of node {producer.name}, {producer.op_type})" if producer is not None else ""
            raise ModelError(f"{name}: tensor {v.name!r}{where} of shape {'x'.join(map(str, v.shape))} has more "
                             f"than {MAX_ITEM_ELEMENTS} elements per item; a dimension of the model is corrupt or too "
                             "large")


_ID_MOVES = ("Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten")  # token ids on their way to a lookup


_ID_MAPS = ("Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Where", "Clip", "Min", "Max", "Not", "And", "Or",
            "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal")  # element-wise maps of ids (position-wise)


def _one_const(v: ir.Value) -> bool:
    c = v.const_value
    return c is not None and int(np.prod(c.shape, dtype=np.int64)) == 1


def _is_int(v: ir.Value) -> bool:
    return v.dtype is not None and (v.dtype.is_integer() or v.dtype == ir.DataType.BOOL)


def mark_shape_only(graph: ir.Graph) -> int:
    """Mark values that carry no relevance although they are computed from the inputs: those computed only from
    the inputs' shapes (causal masks and position ids built from a dynamic sequence length) and those computed only
    from integer inputs (attention masks, lengths, positions counted from a mask) or from bool values (the output
    of a comparison, e.g. Keras' Masking), except embedding lookups of token ids (a Gather from a constant table
    at indices that are an integer input, cast, reshaped or mapped element-wise with one-element constants, as
    tf2onnx's Keras Embedding wraps negative ids). Like
    parameters, marked values carry no relevance (the value's ``meta['lrp_shape_only']``)."""
    only: set[int] = set()
    ids: set[int] = set()  # integer inputs, moved without arithmetic: a Gather of a table at them is a lookup
    for v in graph.inputs:
        if _is_int(v):
            only.add(id(v))
            ids.add(id(v))
    # values a loading pass marked (rotary cos/sin gathered at position ids): what is computed from them alone too
    only.update(id(o) for n in graph for o in n.outputs if meta.SHAPE_ONLY.get(o, False))
    marked = 0
    for node in graph:
        std = node.domain in ("", "ai.onnx")
        ins = [v for v in node.inputs if v is not None]
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            flag = False  # If/Loop/Scan: their subgraphs read outer values that are not among the node's inputs
        elif std and node.op_type in ("Shape", "Size", "EyeLike", "ConstantOfShape"):
            flag = True
        elif std and node.op_type == "Gather" and len(ins) == 2 and id(node.inputs[1]) in ids and \
                node.inputs[0].const_value is not None and node.attributes.get_int("axis", 0) == 0:
            flag = False  # an embedding lookup: the token's relevance arrives here
        else:
            flag = bool(ins) and all(v.const_value is not None or id(v) in only for v in ins) and \
                any(id(v) in only for v in ins)
        if std and node.op_type in _ID_MOVES and node.inputs and node.inputs[0] is not None and \
                id(node.inputs[0]) in ids and (_is_int(node.outputs[0]) or node.op_type == "Cast"):
            ids.add(id(node.outputs[0]))
        elif std and node.op_type in _ID_MAPS and any(id(v) in ids for v in ins) and all(
                id(v) in ids or _one_const(v) for v in ins) and node.outputs and all(_is_int(o) for o in node.outputs):
            ids.update(id(o) for o in node.outputs)  # tf2onnx's Embedding: ids < 0 wrapped, ids clipped
        # a comparison's or logic op's bool output (Keras' Masking: Cast(Not(Equal(x, 0)))) is piecewise constant:
        # it carries no relevance, nor do the floats computed from it alone
        logic = std and bool(node.outputs) and all(o.dtype == ir.DataType.BOOL for o in node.outputs)
        if (flag or logic) and node.op_type not in NO_FOLD:
            for o in node.outputs:
                only.add(id(o))
                if o.dtype is not None and o.dtype.is_floating_point():
                    meta.SHAPE_ONLY.set(o, True)
                    marked += 1
    return marked


def _incomplete(v: ir.Value) -> bool:
    return v.shape is None or any(not isinstance(d, int) for d in v.shape)


def refresh_shapes(model: ir.Model) -> int:
    """Re-run shape inference after folding: shapes computed by folded subgraphs (e.g. a Reshape whose target
    shape came from Shape/Gather/Concat) are static now. Only values whose shape was unknown or symbolic change."""
    todo = {o.name: o for n in model.graph for o in n.outputs if o.name and _incomplete(o)}
    if not todo:
        return 0
    changed = 0
    for name, dims in inferred_dims(model):
        v = todo.get(name)
        if v is None:
            continue
        if v.shape is not None and len(v.shape) == len(dims) and sum(isinstance(d, int) for d in dims) <= sum(
                isinstance(d, int) for d in v.shape):
            continue
        v.shape = ir.Shape(dims)
        changed += 1
    return changed


def reinfer_shapes(model: ir.Model) -> None:
    """Shape inference again after splitting ops that onnx's inference did not know (types copied by name)."""
    inferred = reinferred(model)
    if inferred is None:
        return
    known = {}
    for n in inferred.graph:
        for o in n.outputs:
            known[o.name] = o
    for n in model.graph:
        for o in n.outputs:
            k = known.get(o.name)
            if k is not None and k.shape is not None and (o.shape is None or o.type is None):
                o.shape, o.type = k.shape, k.type


__all__ = ["fold_constants", "refresh_shapes", "reinfer_shapes", "name_everything", "check_sizes", "mark_shape_only",
           "NO_FOLD", "MAX_ITEM_ELEMENTS"]
