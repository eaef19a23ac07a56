"""What is explained and where its relevance starts: the explained tensor (``explained_value``: an output, or the
logits of an output softmax), whether its rows are batch items (``whole_output``) and the start relevance at the
target (``start_relevance``: the inputs ``lrp/target``, ``lrp/one_hot``, ``lrp/position`` and the outputs
``lrp/target_used``, ``lrp/explained_value``)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ..core.emitter import Emitter
from ..core.errors import InputError
from ..core.graph import carries, static_dims
from ..core.interface import ONE_HOT_INPUT, POSITION_INPUT, TARGET_INPUT, TARGET_OUTPUT, VALUE_OUTPUT


SOFTMAX = ("Softmax", "LogSoftmax")


def explained_value(graph: ir.Graph, output: str | None, explain_logits: bool = True) -> tuple[ir.Value, ir.Value]:
    """(the tensor explained, the output it belongs to). Default output: the first float output computed from the
    inputs (an exporter may list an integer output, e.g. a token count, first). A softmax output is explained through
    its logits, also when a reshape follows it (an opset < 13 Softmax upgraded to Flatten -> Softmax -> Reshape)."""
    outs = list(graph.outputs)
    if output is None:
        out = next((o for o in outs if carries(o)), outs[0])
    else:
        match = [o for o in outs if o.name == output]
        if not match:
            raise InputError(f"model has no output {output!r}; its outputs are: {', '.join(o.name for o in outs)}")
        out = match[0]
    y = out
    if explain_logits:
        logits = _softmax_logits(out)
        if logits is not None:
            y = logits
    if not carries(y):
        why = "" if output is not None else "; no output is"
        if any(v.dtype is not None and not v.dtype.is_floating_point() for v in graph.inputs) and \
                not any(carries(v) for v in graph.inputs):
            why += (" (relevance starts at float inputs and at embedding lookups of token ids; values computed "
                    "only from other integer inputs, such as masks or integer images, carry none: feed a float "
                    "input)")
        raise InputError(f"output {out.name!r} is not a float tensor computed from the inputs; nothing to explain{why}")
    return y, out


def _leading(v: ir.Value):
    """The leading dimension: an int, a symbol's name, or None (unknown)."""
    if v.shape is None or len(v.shape) == 0:
        return None
    d = v.shape[0]
    return d if isinstance(d, int) else getattr(d, "value", None)


def whole_output(graph: ir.Graph, y: ir.Value) -> bool:
    """Whether the explained tensor ``y`` is explained as ONE item because its leading axis is provably not the
    inputs' batch axis: ``y`` has rank < 2, or a static leading size that differs from the static leading size of
    every float input (a Concat, Gather or Expand along axis 0, ReduceMax over all axes, a Flatten at axis 0). Its rows
    are then not batch items: the whole tensor is one item (one target) and every input gets the relevance of that
    one explanation. Unknown or symbolic leading sizes count as the batch."""
    if y.shape is None:
        return False
    if len(y.shape) < 2:
        return True
    lead = _leading(y)
    if not isinstance(lead, int):
        return False
    ins = [v for v in graph.inputs if carries(v)] or [v for v in graph.inputs if v.shape is not None and len(v.shape)]
    leads = [_leading(x) for x in ins if x.shape is not None and len(x.shape)]
    return bool(leads) and all(isinstance(d, int) for d in leads) and lead not in leads


_RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def _softmax_logits(out: ir.Value) -> ir.Value | None:
    """The input of the Softmax that produces ``out``, directly or through at most two reshapes."""
    v = out
    for _ in range(3):
        producer = v.producer()
        if producer is None:
            return None
        if producer.op_type in SOFTMAX:
            return producer.inputs[0] if carries(producer.inputs[0]) else None
        if producer.op_type not in _RESHAPES or not carries(producer.inputs[0]):
            return None
        v = producer.inputs[0]
    return None


def _flat_explained(em: Emitter, y: ir.Value, whole: bool) -> tuple[ir.Value, list]:
    """(y as [batch, entries], its dims as [batch, entries per position, ...]): per batch item, or the whole tensor
    as one item [1, size] (size read at run time where dimensions are dynamic)."""
    dims = static_dims(y)
    if dims is not None and 0 in dims:
        raise InputError(f"explained tensor {y.name!r} has no elements (shape {dims}); nothing to explain")
    if whole:
        if dims is None:
            raise InputError(f"explained tensor {y.name!r} has no batch axis (its leading axis is not the "
                             "inputs' batch axis) and is explained as one item, which needs a known rank; "
                             "run shape inference or explain an output with a batch axis")
        dims = [1, int(np.prod(dims)) if all(d is not None for d in dims) else None]
        flat = em.op("Reshape", y, em.ints([1, -1]), tag="y_flat")
    else:
        flat = em.op("Flatten", y, axis=1, tag="y_flat")
    if dims is None or len(dims) < 2:
        raise InputError(f"explained tensor {y.name!r} needs a known rank of at least 2 (the batch, then the "
                         "classes or the sequence positions); run shape inference")
    return flat, dims


@dataclass(frozen=True)
class _Explained:
    """The explained output ``y`` (N, T, C...) flattened per item (``flat``) of static ``dims`` (None: dynamic),
    ``width``: the flattened width (a value), ``chunk``: entries per position (None where the trailing axes are
    dynamic)."""
    y: ir.Value
    flat: ir.Value
    dims: list
    width: ir.Value
    chunk: int | None


def _sequence_target(em: Emitter, graph: ir.Graph, out: _Explained, target: ir.Value,
                     use_argmax: ir.Value) -> ir.Value:
    """The target of a sequence output (N, T, C...): a class at ``lrp/position`` (< 0: from the end), as an index
    into the output flattened per item."""
    y, flat, dims, width_v, chunk = out.y, out.flat, out.dims, out.width, out.chunk
    static_chunk = chunk is not None
    position = ir.Value(name=POSITION_INPUT, shape=ir.Shape(["lrp_batch"]), type=ir.TensorType(ir.DataType.INT64))
    graph.inputs.append(position)
    chunk_v = em.scalar(chunk, np.int64) if static_chunk else em.op(
        "ReduceProd", em.op("Shape", y, start=2, tag="trailing"), keepdims=0, tag="chunk")
    if dims[1] is not None and static_chunk:
        rows = em.scalar(dims[1], np.int64)
        row_of = em.const(np.arange(dims[1] * chunk, dtype=np.int64)[None] // chunk, tag="row_of", dtype=np.int64)
    else:
        width_n = em.op("Squeeze", width_v, tag="width_n")
        rows = em.scalar(dims[1], np.int64) if dims[1] is not None else em.op("Div", width_n, chunk_v, tag="rows")
        index = em.op("Range", em.scalar(0, np.int64), width_n, em.scalar(1, np.int64), tag="flat_index")
        row_of = em.op("Unsqueeze", em.op("Div", index, chunk_v, tag="row"), em.ints([0]), tag="row_of")
    from_end = em.op("Less", position, em.scalar(0, np.int64), tag="from_end")
    row = em.op("Where", from_end, em.add(position, rows, tag="position_wrapped"), position, tag="row")
    in_row = em.op("Equal", row_of, em.op("Unsqueeze", row, em.ints([1]), tag="row_1"), tag="in_row")
    argmax = em.op("ArgMax", em.op("Where", in_row, flat, em.scalar(-np.inf), tag="y_row"), axis=1,
                   keepdims=0, tag="argmax")
    given = em.add(em.op("Mul", row, chunk_v, tag="row_start"), target, tag="given")
    return em.op("Where", use_argmax, argmax, given, tag="target")


def start_relevance(em: Emitter, graph: ir.Graph, y: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(r0, target, y at the target): r0 = onehot(target) * y (or onehot alone), target = argmax where
    lrp/target < 0."""
    # plain graph inputs, no initializer defaults: onnxruntime warns about every initializer that is also an input
    # ("Initializer lrp/target appears in graph inputs"); the Explainer always feeds them
    target = ir.Value(name=TARGET_INPUT, shape=ir.Shape(["lrp_batch"]), type=ir.TensorType(ir.DataType.INT64))
    one_hot = ir.Value(name=ONE_HOT_INPUT, shape=ir.Shape([]), type=ir.TensorType(ir.DataType.BOOL))
    graph.inputs.extend([target, one_hot])
    whole = whole_output(graph, y)
    with em.scope("start"):
        flat, dims = _flat_explained(em, y, whole)
        # entries per position (axis 1) of a sequence output; read from y's shape where the trailing axes are dynamic
        static_chunk = all(d is not None for d in dims[2:])
        chunk = int(np.prod(dims[2:])) if static_chunk else None
        # a dynamic sequence length or trailing axes: the one-hot's width (and each entry's position) come from y
        width_v = em.ints([dims[1] * chunk]) if dims[1] is not None and static_chunk else em.op(
            "Shape", flat, start=1, end=2, tag="width")
        use_argmax = em.op("Less", target, em.scalar(0, np.int64), tag="use_argmax")
        if len(dims) < 3 or (len(dims) > 3 and all(d == 1 for d in dims[2:])):  # (N, C), or (N, C, 1, 1): classes
            argmax = em.op("ArgMax", flat, axis=1, keepdims=0, tag="argmax")
            chosen = em.op("Where", use_argmax, argmax, target, tag="target")
        else:
            chosen = _sequence_target(em, graph, _Explained(y, flat, dims, width_v, chunk), target, use_argmax)
        hot = em.op("OneHot", chosen, width_v, em.const(np.array([0, 1], dtype=np.int64),
                                                                 tag="onehot_values", dtype=np.int64),
                    axis=1, tag="onehot_int")  # int64 values: onnxruntime has no double OneHot
        hot = em.op("Cast", hot, to=em.dtype.value, tag="onehot")
        scale = em.op("Where", one_hot, em.scalar(1.0), flat, tag="start_scale")
        r0 = em.mul(hot, scale, tag="r0_flat")
        picked = em.op("ReduceSum", em.mul(hot, flat, tag="y_at_target"), em.ints([1]), keepdims=0,
                       tag="explained_value")
        r0 = em.reshape_like(r0, y, tag="r0")
    batch_shape = ir.Shape([1] if whole else ["lrp_batch"])
    _name_output(picked, VALUE_OUTPUT, em.dtype, batch_shape)
    _name_output(chosen, TARGET_OUTPUT, ir.DataType.INT64, batch_shape)
    return r0, chosen, picked


def _name_output(v: ir.Value, name: str, dtype: ir.DataType, shape: ir.Shape) -> None:
    v.name = name
    v.type = ir.TensorType(dtype)
    v.shape = shape


__all__ = ["SOFTMAX", "explained_value", "whole_output", "start_relevance"]
