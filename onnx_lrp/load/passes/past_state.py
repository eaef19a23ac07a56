"""Decoders exported with a KV cache (optimum's ``text-generation-with-past``, onnxruntime-genai's model builder,
torch.onnx exports with ``past_key_values``): the past state fed empty.

The past key/value inputs (``past_key_values.<i>.key`` / ``.value``, ``past.<i>...``, ``past_key_<i>``, ...) stop
being inputs: each becomes a tensor of length 0 along its sequence axis (the batch taken from another input that
shares the batch dimension), so the model computes a prompt as its no-past export does. Where the past only meets
the new keys in a ``Concat`` along that axis the empty part is taken out of the ``Concat`` (a ``Concat`` left with
one input is that input); onnxruntime's GroupQueryAttention / MultiHeadAttention / Attention take an absent past as
empty and lose the input. The ``present.*`` outputs are dropped, and the nodes that only computed them.

Past state given by the caller (bound with ``constants=``) is a constant of the relevance model: it is held fixed
and gets no relevance (said in the load notes). :class:`KeptPast` (``BuildOptions(past_inputs=True)``, what the
Explainer builds when a past is given with the inputs) keeps the past inputs as inputs: the relevance model then
takes a past of any length and returns the relevance that reaches it (the part of the explained logit the past
holds); the ``present.*`` outputs stay.
"""
from __future__ import annotations

import re

import numpy as np
import onnx_ir as ir

from ...core import meta
from ..builder import MS, LoadPass, Report, bypass


# a KV cache's names (not the state of a recurrent or linear-attention op: past_state / present_state)
PAST = re.compile(r"^(past_key_values|past_key|past_value)([._/\-]|\d|$)|^past[._]?\d")
PRESENT = re.compile(r"^(present_key_values|present_key|present_value)([._/\-]|\d|$)|^present[._]?\d")
_SEQ = (r"past", r"seq", r"len|total", r"cache")  # names of a sequence dimension, in order of preference
# com.microsoft ops that take an absent past as empty: op type -> the indices of their past inputs
_ABSENT_IS_EMPTY = {"GroupQueryAttention": (3, 4), "MultiHeadAttention": (6, 7), "Attention": (4,)}


class EmptyPast(LoadPass):
    """Past key/value inputs fed empty (length 0 along their sequence axis), ``present.*`` outputs dropped."""

    def apply(self, model: ir.Model, report: Report) -> int:
        graph = model.graph
        given = [n for n in graph.initializers if PAST.match(n)]
        report.note(len(given), "{n} past key/value input(s) given: held constant (they get no relevance)")
        named = [v for v in graph.inputs if v.name and PAST.match(v.name) and v.dtype is not None and
                 v.dtype.is_floating_point()]
        if named and len(named) == len(graph.inputs):
            return 0  # nothing else to take the batch from: not a decoder's cache
        pasts = [(v, axes) for v in named for axes in [_axes(graph, v)] if axes is not None]
        if len(pasts) < len(named):  # a past of fixed length (no sequence axis to empty): left to the ops' refusals
            return 0
        presents = [v for v in graph.outputs if v.name and PRESENT.match(v.name)]
        if not pasts and not presents:
            return 0
        for v in presents:
            graph.outputs.remove(v)
        fed = {}
        for v, axes in pasts:
            dims = _deployed_dims(v, axes)
            if dims is not None:
                fed[v.name] = dims
            _empty(graph, v, axes)
        meta.EMPTY_PAST.set(model, fed)
        removed = _drop_dead(graph)
        report.note(len(pasts), "fed {n} past key/value input(s) empty (a prompt without KV cache)")
        report.note(len(presents), "dropped {n} present key/value output(s)")
        return len(pasts) + len(presents) + removed


class KeptPast(LoadPass):
    """Past key/value inputs kept as inputs (a past given at run time); the ``present.*`` outputs stay outputs (the
    forward's, as onnxruntime gives them)."""

    def apply(self, model: ir.Model, report: Report) -> int:
        graph = model.graph
        named = [v for v in graph.inputs if v.name and PAST.match(v.name)]
        if not named or len(named) == len(graph.inputs):
            return 0
        report.note(len(named), "kept {n} past key/value input(s) as inputs (a past given with the inputs)")
        return 0  # nothing rewritten


def _axes(graph: ir.Graph, past: ir.Value) -> tuple | None:
    """(batch axis of ``past`` or None, its sequence axis, the input sharing the batch, that input's batch axis), or
    None when no axis can be the sequence (a past of fixed length, unnamed dimensions, names that do not tell)."""
    dims = list(past.shape) if past.shape is not None else []
    if not dims or any(d is None or (not isinstance(d, int) and not str(d)) for d in dims):
        return None
    others = [v for v in graph.inputs if not (v.name and PAST.match(v.name)) and v.shape is not None]
    sym = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    batch = next(((i, v, j) for i in sym for v in others for j, d in enumerate(v.shape)
                  if not isinstance(d, int) and d is not None and str(d) == str(dims[i])), None)
    rest = [i for i in sym if batch is None or i != batch[0]]
    seq = rest[0] if len(rest) == 1 and batch is not None else _seq_by_name(rest, dims)
    if seq is None:
        return None
    if batch is None and len(rest) == 2:  # the batch named otherwise than in the other inputs
        ids = next((v for v in others if v.dtype is not None and not v.dtype.is_floating_point() and v.shape),
                   next((v for v in others if v.shape), None))  # token ids, else the first input with a batch
        if ids is not None:
            batch = (next(i for i in rest if i != seq), ids, 0)
    elif batch is None and len(rest) > 1:
        return None
    return (None, seq, None, 0) if batch is None else (batch[0], seq, batch[1], batch[2])


def _deployed_dims(past: ir.Value, axes: tuple) -> list | None:
    """The dims of ``past`` fed empty to the deployed model (batch 1, sequence 0); a dimension named otherwise (the
    builder's ``kv_cache_dim``) read from the fused attention or Concat that takes it; None where unknown."""
    bax, seq = axes[0], axes[1]
    dims = [0 if i == seq else 1 if i == bax else d for i, d in enumerate(past.shape)]
    for i, d in enumerate(dims):
        if isinstance(d, int):
            continue
        for use in past.uses():
            got = _dim_from(use.node, use.idx, i)
            if got is not None:
                dims[i] = got
                break
        if not isinstance(dims[i], int):
            return None
    return dims


def _dim_from(node: ir.Node, idx: int, axis: int) -> int | None:
    """The size ``node`` needs on ``axis`` of its input ``idx`` (a past): a Concat's other inputs' static size, or
    GroupQueryAttention's head size / kv heads ((B, N_kv, P, H))."""
    if node.op_type == "Concat":
        for v in node.inputs:
            if v is not None and v is not node.inputs[idx] and v.shape is not None and len(v.shape) > axis and \
                    isinstance(v.shape[axis], int):
                return v.shape[axis]
        return None
    if node.domain == MS and node.op_type == "GroupQueryAttention" and axis in (1, 3):
        a = {k: x.value for k, x in node.attributes.items()}
        n, nkv, q = int(a.get("num_heads", 0)), int(a.get("kv_num_heads", 0)), node.inputs[0]
        d = _width(q)
        if not n or not nkv or not isinstance(d, int):
            return None
        packed = len(node.inputs) < 2 or node.inputs[1] is None
        return nkv if axis == 1 else d // (n + 2 * nkv) if packed else d // n
    return None


def _width(v: ir.Value | None, depth: int = 0) -> int | None:
    """The last dimension of ``v``: its shape's, or a MatMulNBits' N (the contrib ops are not shape-inferred yet),
    through an Add / Mul of a bias or scale."""
    if v is None or depth > 3:
        return None
    if v.shape is not None and len(v.shape) and isinstance(v.shape[-1], int):
        return v.shape[-1]
    p = v.producer()
    if p is None:
        return None
    if p.op_type == "MatMulNBits" and "N" in p.attributes:
        return int(p.attributes["N"].value)
    if p.op_type == "MatMul" and len(p.inputs) > 1 and p.inputs[1] is not None and p.inputs[1].shape is not None \
            and len(p.inputs[1].shape) > 1 and isinstance(p.inputs[1].shape[-1], int):
        return p.inputs[1].shape[-1]  # a float16 / bfloat16 projection (not shape-inferred before the upcast)
    if p.op_type in ("Add", "Mul", "Cast", "Identity"):
        return next((w for w in (_width(x, depth + 1) for x in p.inputs) if w is not None), None)
    return None


def _seq_by_name(axes: list, dims: list) -> int | None:
    """The one axis among ``axes`` whose dimension's name says sequence (past, then seq, then len / total, then
    cache), or None."""
    for pattern in _SEQ:
        hit = [i for i in axes if re.search(pattern, str(dims[i]), re.I)]
        if len(hit) == 1:
            return hit[0]
    return None


def _empty(graph: ir.Graph, past: ir.Value, axes: tuple) -> None:
    """``past`` replaced by an empty tensor along its sequence axis; Concats and fused attention lose it."""
    bax, seq, ref, rax = axes
    for use in list(past.uses()):
        node, idx = use.node, use.idx
        if node.domain == MS and idx in _ABSENT_IS_EMPTY.get(node.op_type, ()):
            node.replace_input_with(idx, None)
        elif node.op_type == "Concat" and node.domain in ("", "ai.onnx") and _axis(node, past) == seq:
            _drop_concat_input(graph, node, idx)
    if not list(past.uses()):
        graph.inputs.remove(past)
        return
    empty = _empty_value(graph, past, bax, seq, ref, rax)
    past.replace_all_uses_with(empty)
    graph.inputs.remove(past)


def _axis(node: ir.Node, v: ir.Value) -> int | None:
    a = node.attributes.get("axis")
    r = len(v.shape) if v.shape is not None else None
    if a is None or r is None:
        return None
    return int(a.value) % r


def _drop_concat_input(graph: ir.Graph, node: ir.Node, idx: int) -> None:
    rest = [v for i, v in enumerate(node.inputs) if i != idx]
    if len(rest) == 1:
        bypass(node.outputs[0], rest[0])
        for i in range(len(node.inputs)):
            node.replace_input_with(i, None)
        graph.remove(node, safe=False)
        return
    new = ir.node("Concat", rest, attributes={"axis": node.attributes["axis"].value}, name=node.name)
    graph.insert_before(node, new)
    out = new.outputs[0]
    out.type, out.shape = node.outputs[0].type, node.outputs[0].shape
    name = node.outputs[0].name
    node.outputs[0].name = None
    out.name = name
    node.outputs[0].replace_all_uses_with(out, replace_graph_outputs=True)
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)
    graph.remove(node, safe=False)


def _empty_value(graph: ir.Graph, past: ir.Value, bax, seq: int, ref, rax: int) -> ir.Value:
    """ConstantOfShape of ``past``'s shape with 0 on the sequence axis and the batch from ``ref``'s."""
    dims = list(past.shape)
    dt = past.dtype.numpy()
    base = past.name

    def const(arr, name):
        v = ir.Value(name=f"{base}/empty/{name}", shape=ir.Shape(arr.shape),
                     type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)), const_value=ir.tensor(arr))
        graph.register_initializer(v)
        return v

    fixed = [0 if i == seq else (d if isinstance(d, int) else 1) for i, d in enumerate(dims)]
    if bax is None or ref is None:
        return const(np.zeros(fixed, dt), "value")
    # nodes are inserted at the front in reverse order of use
    parts = [const(np.asarray(fixed[:bax], np.int64), "head"), None, const(np.asarray(fixed[bax + 1:], np.int64),
                                                                            "tail")]
    shape_node = ir.node("Shape", [ref], attributes={"start": rax, "end": rax + 1}, name=f"{base}/empty/batch")
    cat = ir.node("Concat", [parts[0], shape_node.outputs[0], parts[2]], attributes={"axis": 0},
                  name=f"{base}/empty/shape")
    fill = ir.node("ConstantOfShape", [cat.outputs[0]], attributes={"value": ir.tensor(np.zeros(1, dt))},
                   name=f"{base}/empty/value")
    first = graph.node(0)
    for n, tag in ((shape_node, "batch"), (cat, "shape"), (fill, "value")):
        n.outputs[0].name = f"{base}/empty/{tag}"
        graph.insert_before(first, n)
    shape_node.outputs[0].type = cat.outputs[0].type = ir.TensorType(ir.DataType.INT64)
    shape_node.outputs[0].shape, cat.outputs[0].shape = ir.Shape([1]), ir.Shape([len(dims)])
    out = fill.outputs[0]
    out.type = past.type
    out.shape = ir.Shape([0 if i == seq else d for i, d in enumerate(dims)])
    return out


def _drop_dead(graph: ir.Graph) -> int:
    """Remove nodes none of whose outputs is read (the present state's producers)."""
    removed = 0
    for node in reversed(list(graph)):
        if node.outputs and all(not list(o.uses()) and not o.is_graph_output() for o in node.outputs):
            for i in range(len(node.inputs)):
                node.replace_input_with(i, None)
            graph.remove(node, safe=False)
            removed += 1
    return removed


__all__ = ["EmptyPast", "KeptPast", "PAST", "PRESENT"]
