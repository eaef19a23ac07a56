"""Packed weights dequantized where they are used, one float copy at a time.

A block-quantized (int4) weight stays packed in the relevance model: its ``DequantizeLinear`` (and, for float zero
points or a tied head, the few nodes after it: ``meta.KEEP_PACKED``) computes the float weight at run time. The
forward's MatMul and the relevance graph's products both read that float weight; with one shared
``DequantizeLinear`` its output would live from the forward until its last use in the backward, so every layer's
float weight would be alive at once (the peak: the float model, 8x the 4-bit weights).

This pass gives every consumer of a packed weight its own copy of the nodes that dequantize it, placed right before
that consumer and made to wait for the consumer's activation (its scale plus a zero computed from that activation's
size), so a float weight lives only across the one product that reads it. onnxruntime keeps the copies apart and runs
such a model in the order of its nodes where it can (:mod:`onnx_lrp.run.runtime`: no common subexpression
elimination, ``ExecutionOrder.PRIORITY_BASED``, no CPU memory arena, for models with ``block_size``). Each copy
dequantizes the same packed constants: the values are bit for bit the shared ones.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core import meta


def _packed(node: ir.Node | None) -> bool:
    return node is not None and bool(meta.KEEP_PACKED.get(node, False))


def make_transient(model: ir.Model) -> int:
    """Give every consumer of a packed weight its own dequantizing nodes, right before it (in place); the shared
    originals left without consumers are removed. Returns the number of consumers served."""
    graph = model.graph
    head_in_rows(model)
    outputs = {id(v) for v in graph.outputs}
    served = 0
    for node in list(graph):
        if _packed(node):
            continue
        for i, v in enumerate(node.inputs):
            if v is None or not _packed(v.producer()) or id(v) in outputs:
                continue
            copies: list[ir.Node] = []
            tag = f"{node.name or node.op_type}_{i}"
            node.replace_input_with(i, _copy(v, tag, copies))
            graph.insert_before(node, _tied(copies, _activation(node), tag) + copies)
            served += 1
    if served:
        _drop_unused(graph, outputs)
    return served


def _copy(v: ir.Value, tag: str, copies: list) -> ir.Value:
    """A copy of ``v`` computed by copies of its packed producers (in ``copies``, in order); other inputs shared."""
    node = v.producer()
    if not _packed(node):
        return v
    inputs = [None if x is None else _copy(x, tag, copies) for x in node.inputs]
    attrs = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
    new = ir.Node(node.domain, node.op_type, inputs, attributes=attrs, num_outputs=len(node.outputs),
                  name=f"{node.name}/for/{tag}", version=node.version)
    for old, out in zip(node.outputs, new.outputs):
        out.name = f"{old.name}/for/{tag}"
        out.type, out.shape = old.type, old.shape
        if meta.PACKED_WEIGHT.has(old):
            meta.PACKED_WEIGHT.set(out, meta.PACKED_WEIGHT.get(old))
    meta.KEEP_PACKED.set(new, True)
    copies.append(new)
    return new.outputs[v.index()]


def _activation(node: ir.Node) -> ir.Value | None:
    """An input of ``node`` computed at run time (not a constant, not a packed weight): what its copy waits for."""
    for v in node.inputs:
        if v is not None and v.const_value is None and not _packed(v.producer()) and v.producer() is not None:
            return v
    return None


def _tied(copies: list, act: ir.Value | None, tag: str) -> list:
    """Make the copies wait for ``act``: the scale of each DequantizeLinear plus a zero computed from ``act``'s size
    (``Size(act) - Size(act)``, exact whatever ``act`` holds). onnxruntime's order otherwise runs a node as soon as its
    inputs exist: every copy, reading constants only, would run at the start (its float weight alive until its
    consumer runs, the peak of a shared one). Returns the nodes to insert before the copies."""
    if act is None:
        return []
    made: list[ir.Node] = []
    for dq in copies:
        if dq.op_type != "DequantizeLinear" or len(dq.inputs) < 2 or dq.inputs[1] is None or dq.inputs[1].dtype is None:
            continue
        scale = dq.inputs[1]
        size = ir.Node("", "Size", [act], name=f"{dq.name}/wait/size")
        zero = ir.Node("", "Sub", [size.outputs[0], size.outputs[0]], name=f"{dq.name}/wait/zero")
        cast = ir.Node("", "Cast", [zero.outputs[0]], attributes=[ir.AttrInt64("to", scale.dtype.value)],
                       name=f"{dq.name}/wait/cast")
        add = ir.Node("", "Add", [scale, cast.outputs[0]], name=f"{dq.name}/wait/scale")
        for n, dtype, shape in ((size, ir.DataType.INT64, []), (zero, ir.DataType.INT64, []),
                                (cast, scale.dtype, []), (add, scale.dtype, scale.shape)):
            n.outputs[0].name = n.name
            n.outputs[0].type = ir.TensorType(dtype)
            n.outputs[0].shape = ir.Shape(shape) if isinstance(shape, list) else shape
        dq.replace_input_with(1, add.outputs[0])
        made += [size, zero, cast, add]
    return made


def _drop_unused(graph: ir.Graph, outputs: set) -> None:
    """Remove the packed nodes nothing reads any more (consumers first)."""
    for node in reversed(list(graph)):
        if _packed(node) and not any(o.uses() or id(o) in outputs for o in node.outputs):
            graph.remove(node, safe=True)




# -- the head: its 4-bit rows, never a float copy ------------------------------------------------------------------
# The output layer of an LLM (the vocabulary head, V x K) is the largest weight, and the relevance starts at one
# logit: its backward product s W^T reads only the rows of W whose column of s is not zero (one per explained
# item). A packed head (signed 4-bit, no zero points) is kept once, as onnxruntime's MatMulNBits stores it (N, blocks,
# block / 2 bytes, two values per byte, low nibble first): the forward is MatMulNBits (accuracy_level 0: float
# compute, no float copy of W), the backward gathers the rows named by the nonzero columns of s and dequantizes only
# those. Exact: the columns of s left out are zeros, so the product is the same sum up to its order.

MS = "com.microsoft"


def head_in_rows(model: ir.Model) -> int:
    """Rewrite the products of every packed head (a packed weight whose forward MatMul gives a graph output) as above
    (in place). Returns the number of heads rewritten."""
    graph = model.graph
    outputs = {id(v) for v in graph.outputs}
    done, stale = 0, []
    for node in list(graph):
        if node.op_type != "DequantizeLinear" or not _packed(node) or node.graph is not graph:
            continue
        plan = _head_plan(node, outputs)
        if plan is None:
            continue
        w, rows, fwd, back, lookups = plan
        rows["b"] = _init(graph, f"{node.name}/rows", rows["b"])
        rows["s"] = _init(graph, f"{node.name}/row_scales", rows["s"])
        zp = None if rows["z"] is None else _init(graph, f"{node.name}/zero_points", _packed_zero(rows["z"]))
        if rows["z"] is not None:
            rows["z"] = _init(graph, f"{node.name}/row_zero_points", rows["z"])
        for mm in fwd:
            flat = _init(graph, f"{node.name}/scales_flat", rows["s"].const_value.numpy().reshape(-1))
            y = _node(graph, mm, MS, "MatMulNBits", [mm.inputs[0], rows["b"], flat] + ([zp] if zp is not None else []),
                      mm.outputs[0], K=rows["k"], N=rows["n"], bits=4, block_size=rows["block"], accuracy_level=0)
            model.opset_imports.setdefault(MS, 1)
            graph.opset_imports.setdefault(MS, 1)
            _take_over(mm, y)
        for gemm in back:
            _take_over(gemm, _rows_product(graph, gemm, rows))
        for gather in lookups:
            _take_over(gather, _lookup(graph, gather, rows))
        done += 1
        stale.extend(v for v in node.inputs if v is not None)
    if done:
        _drop_unused(graph, outputs)
        for v in stale:  # the 4-bit constants the rows replace (a tied table still looked up elsewhere keeps them)
            if v.is_initializer() and not v.uses() and not v.is_graph_input() and not v.is_graph_output():
                graph.initializers.pop(v.name, None)
    return done


def _head_plan(dq: ir.Node, outputs: set):
    """(W, its rows as MatMulNBits keeps them, the forward MatMuls, the backward Gemms, the table lookups) of a packed
    head read by DequantizeLinear ``dq`` (directly: (K, N) blocks along axis 0; or transposed: a tied (V, K) table,
    blocks along axis 1, also looked up by Gathers), or None where it is not one."""
    axis, block = dq.attributes.get_int("axis", 1), dq.attributes.get_int("block_size", 0)
    consts = [None if v is None else v.const_value for v in dq.inputs]
    if any(v is not None and c is None for v, c in zip(dq.inputs, consts)) or block <= 0 or axis not in (0, 1):
        return None
    q, scale, zero = (consts + [None])[:3]
    signed = q.dtype == ir.DataType.INT4 and zero is None
    if not (signed or q.dtype == ir.DataType.UINT4 and zero is not None) or scale.dtype != ir.DataType.FLOAT \
            or len(q.shape) != 2:
        return None
    w, lookups = dq.outputs[0], []
    if axis == 1:  # a tied table (V, K): the head reads it transposed, the embedding gathers its rows
        tr = [u.node for u in w.uses() if u.node.op_type == "Transpose" and _packed(u.node)]
        lookups = [u.node for u in w.uses() if u.node.op_type == "Gather" and u.idx == 0
                   and u.node.attributes.get_int("axis", 0) == 0]
        if len(tr) != 1:
            return None
        w = tr[0].outputs[0]
    fwd = [u.node for u in w.uses() if u.node.op_type == "MatMul" and u.idx == 1 and _gives_output(u.node, outputs)]
    back = [u.node for u in w.uses() if u.node.op_type == "Gemm" and u.idx == 1
            and u.node.attributes.get_int("transB", 0) == 1 and u.node.attributes.get_int("transA", 0) == 0
            and u.node.attributes.get_float("alpha", 1.0) == 1.0 and len(u.node.inputs) == 2]
    if not fwd or not back or len(fwd) + len(back) != len(w.uses()) or any(
            n.outputs[0].dtype not in (None, ir.DataType.FLOAT) for n in fwd + back + lookups):
        return None
    vals = q.numpy().astype(np.int16) + (8 if signed else 0)  # unsigned, zero point 8 (MatMulNBits' default) or given
    s, z = scale.numpy(), None if signed else zero.numpy().astype(np.uint8)
    if axis == 0:
        vals, s, z = vals.T, s.T, None if z is None else z.T
    n, k = vals.shape
    if k % block or block % 2 or s.shape != (n, k // block):
        return None
    u = vals.astype(np.uint8).reshape(n, k // block, block)
    rows = {"b": (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8), "s": np.ascontiguousarray(s), "n": n, "k": k,
            "block": block, "z": None if z is None else np.ascontiguousarray(z)}
    return w, rows, fwd, back, lookups


def _packed_zero(z: np.ndarray) -> np.ndarray:
    """(N, blocks) zero points as MatMulNBits reads them: two per byte, low nibble first."""
    if z.shape[1] % 2:
        z = np.concatenate([z, np.zeros((z.shape[0], 1), np.uint8)], axis=1)
    return (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)


_PASS_THROUGH = ("Reshape", "Identity", "Add", "Squeeze", "Unsqueeze")


def _gives_output(node: ir.Node, outputs: set) -> bool:
    """Whether ``node``'s output is a graph output, directly or through at most two reshapes or a bias."""
    v = node.outputs[0]
    for _ in range(3):
        if id(v) in outputs:
            return True
        nxt = [u.node for u in v.uses() if u.node.op_type in _PASS_THROUGH]
        if len(nxt) != 1:
            return False
        v = nxt[0].outputs[0]
    return id(v) in outputs


class _Ops:
    """Nodes made before ``at`` (default domain), named after it."""

    def __init__(self, graph: ir.Graph, at: ir.Node):
        self.graph, self.at, self.made = graph, at, []

    def __call__(self, op_type, *inputs, **attrs) -> ir.Value:
        n = ir.Node("", op_type, list(inputs), attributes=[_attr(k, v) for k, v in attrs.items()],
                    name=f"{self.at.name}/rows/{len(self.made)}_{op_type}")
        n.outputs[0].name = n.name
        self.made.append(n)
        return n.outputs[0]

    def c(self, arr, tag: str) -> ir.Value:
        return _init(self.graph, f"{self.at.name}/rows/{tag}", np.asarray(arr))

    def done(self, y: ir.Value, like: ir.Value) -> ir.Value:
        self.graph.insert_before(self.at, self.made)
        y.type, y.shape = like.type, like.shape
        return y


def _rows(op: _Ops, rows: dict, ids: ir.Value) -> ir.Value:
    """The float rows ``ids`` (n,) of the packed weight: (n, K)."""
    k, block = rows["k"], rows["block"]
    q = op("Gather", rows["b"], ids, axis=0)  # (n, blocks, block / 2) bytes
    lo = op("Unsqueeze", op("BitwiseAnd", q, op.c(np.uint8(15), "low")), op.c([-1], "last"))
    hi = op("Unsqueeze", op("BitShift", q, op.c(np.uint8(4), "four"), direction="RIGHT"), op.c([-1], "last_hi"))
    vals = op("Cast", op("Reshape", op("Concat", lo, hi, axis=-1), op.c([-1, k // block, block], "blocks")),
              to=ir.DataType.FLOAT.value)
    zero = op.c(np.float32(8), "eight") if rows["z"] is None else op("Unsqueeze", op(
        "Cast", op("Gather", rows["z"], ids, axis=0), to=ir.DataType.FLOAT.value), op.c([-1], "last_z"))
    scales = op("Unsqueeze", op("Gather", rows["s"], ids, axis=0), op.c([-1], "last_s"))
    return op("Reshape", op("Mul", op("Sub", vals, zero), scales), op.c([-1, k], "rows"))


def _rows_product(graph: ir.Graph, gemm: ir.Node, rows: dict) -> ir.Value:
    """``s W^T`` (Gemm(s, W, transB=1)) from the rows of W at the nonzero columns of ``s`` (M, N): (M, K)."""
    op, s = _Ops(graph, gemm), gemm.inputs[0]
    hot = op("Not", op("Equal", op("ReduceMax", op("Abs", s), op.c([0], "axes0"), keepdims=0),
                       op.c(np.float32(0), "zero")))
    cols = op("Reshape", op("NonZero", hot), op.c([-1], "flat"))
    return op.done(op("MatMul", op("Gather", s, cols, axis=1), _rows(op, rows, cols)), gemm.outputs[0])


def _lookup(graph: ir.Graph, gather: ir.Node, rows: dict) -> ir.Value:
    """Gather(table, ids) from the packed rows: only the looked-up rows dequantized."""
    op, ids = _Ops(graph, gather), gather.inputs[1]
    flat = _rows(op, rows, op("Reshape", ids, op.c([-1], "ids_flat")))
    shape = op("Concat", op("Shape", ids), op.c([rows["k"]], "hidden"), axis=0)
    return op.done(op("Reshape", flat, shape), gather.outputs[0])


def _attr(name: str, value) -> ir.Attr:
    if isinstance(value, str):
        return ir.AttrString(name, value)
    return ir.AttrInt64(name, int(value))


def _init(graph: ir.Graph, name: str, arr: np.ndarray) -> ir.Value:
    v = ir.Value(name=name, shape=ir.Shape(list(arr.shape)), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                 const_value=ir.tensor(arr, name=name))
    graph.register_initializer(v)
    return v


def _node(graph: ir.Graph, at: ir.Node, domain: str, op_type: str, inputs: list, like: ir.Value, **attrs) -> ir.Value:
    n = ir.Node(domain, op_type, inputs, attributes=[_attr(k, v) for k, v in attrs.items()],
                name=f"{at.name}/{op_type}", version=1 if domain else None)
    graph.insert_before(at, n)
    y = n.outputs[0]
    y.name, y.type, y.shape = f"{like.name}/{op_type}", like.type, like.shape
    return y


def _take_over(old: ir.Node, y: ir.Value) -> None:
    """``y`` in place of ``old``'s output (also as a graph output, under its name); ``old`` removed."""
    v = old.outputs[0]
    name = v.name
    v.replace_all_uses_with(y, replace_graph_outputs=True)
    v.name, y.name = f"{name}/replaced", name
    old.graph.remove(old, safe=True)


__all__ = ["make_transient", "head_in_rows"]
