"""onnxruntime's weight-only block quantization (onnxruntime-genai's int4 models, ``MatMulNBitsQuantizer``) as
standard ops, the weights staying 4- (or 8-) bit at rest:

- ``MatMulNBits`` (bits 4 or 8, any ``block_size``, zero points absent, packed uint8 or float, bias) ->
  ``DequantizeLinear(W, scales, zero_points, axis=0, block_size)`` -> ``MatMul`` (+ ``Add`` of the bias). W is
  the unpacked weight transposed to (K, N): int4 / int8 (``q - 2^(bits-1)``) without zero points, uint4 / uint8 with
  them; float zero points that are not whole numbers subtract ``zp * scale`` per block after the
  DequantizeLinear. ``g_idx`` other than the plain block order (act-order) is refused.
- ``GatherBlockQuantized`` (quantized and tied embeddings) -> ``DequantizeLinear`` of the table (blocks along the
  hidden axis) -> ``Gather``.

The dequantized weight is a parameter for the rules (``meta.PACKED_WEIGHT``: its float value on demand) and its
nodes are never folded (``meta.KEEP_PACKED``), so the relevance model holds the packed weights, not float copies.
DequantizeLinear with ``block_size`` needs opset 21: a model at a lower opset is raised to 21 (reductions' ``axes``
attributes become inputs; a model with GroupNormalization, whose meaning changed, gets float weights instead).

``accuracy_level`` 4 makes onnxruntime quantize the activations of MatMulNBits to 8 bits (x86, ARM): the explained
forward computes in float, and the gap to the deployed model is measured and said (run.deployed_gap).
"""
from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ...core import meta
from ...core.graph import const
from ...core.quantization import dequantize
from ..builder import MS, Builder, LoadPass, Report, attr, padded_inputs, take_over


ACCURACY_NOTE = "accuracy_level 4"  # in the note of models whose deployed MatMulNBits quantize their activations
_REDUCE = ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
           "ReduceLogSumExp", "ReduceSumSquare")
_INT = {(4, True): ir.DataType.INT4.numpy(), (4, False): ir.DataType.UINT4.numpy(), (8, True): np.int8, (8, False): np.uint8}


class Refused(Exception):
    pass


class BlockQuantized(LoadPass):
    """MatMulNBits -> DequantizeLinear (block_size) -> MatMul; GatherBlockQuantized -> DequantizeLinear -> Gather."""

    def apply(self, model: ir.Model, report: Report) -> int:
        graph = model.graph
        nodes = [n for n in graph if n.domain == MS and n.op_type in ("MatMulNBits", "GatherBlockQuantized")]
        if not nodes:
            return 0
        packed = _raise_opset(model)
        ctx = _Context(packed, {})
        done, refused, accurate = 0, [], 0
        for node in sorted(nodes, key=lambda x: x.op_type != "GatherBlockQuantized"):  # tables first: tied heads
            b = Builder(graph, node)
            try:
                y = (_matmul_nbits if node.op_type == "MatMulNBits" else _gather_block)(b, node, ctx)
            except Refused as why:
                b.undo()
                refused.append((node, f"{node.op_type} with {why}"))
                continue
            take_over(node.outputs[0], y)
            feeds = [v.producer() for v in node.inputs if v is not None and v.producer() is not None]
            read = [v for v in node.inputs if v is not None] + [v for n in feeds for v in n.inputs if v is not None]
            graph.remove(node, safe=True)  # its inputs no longer read by it
            _drop_dead(graph, feeds)
            _release_unread(graph, read)
            done += 1
            accurate += node.op_type == "MatMulNBits" and int(attr(node, "accuracy_level", 0) or 0) == 4
        report.refuse(refused)
        report.note(done, "{n} block-quantized op(s) (MatMulNBits, GatherBlockQuantized) as DequantizeLinear with "
                          "block_size" + (" (weights kept packed)" if packed else " (float weights: GroupNormalization "
                                                                                   "keeps the model below opset 21)"))
        report.note(accurate, "{n} MatMulNBits with " + ACCURACY_NOTE + ": onnxruntime quantizes their activations "
                              "to 8 bits, the explained forward computes in float")
        return done


def _drop_dead(graph: ir.Graph, nodes) -> None:
    """Remove the Reshapes (of a tied table) that fed a converted node and feed nothing now."""
    outputs = {id(v) for v in graph.outputs}
    for n in nodes:
        if n.op_type == "Reshape" and n.graph is graph and not any(o.uses() or id(o) in outputs for o in n.outputs):
            graph.remove(n, safe=True)


def _release_unread(graph: ir.Graph, values) -> None:
    """Remove the initializers among ``values`` nothing reads any more (the packed weights as the folder stored them,
    now converted), closing their files' memory maps: their pages would otherwise stay resident for the whole build
    (the folder's weight bytes again)."""
    for v in values:
        if v.name not in graph.initializers or graph.initializers[v.name] is not v or v.is_graph_output() or \
                any(node.graph is not None for node, _ in v.uses()):
            continue
        graph.initializers.pop(v.name)
        t = v.const_value
        if isinstance(t, ir.ExternalTensor):
            try:
                t.release()
            except BufferError:  # a converted constant still views it (scales taken as they are): closed when freed
                pass


def _raise_opset(model: ir.Model) -> bool:
    """The model at opset >= 21 (DequantizeLinear with block_size); False where that would change a node's meaning."""
    opset = model.opset_imports.get("", 21)
    if opset >= 21:
        return True
    if any(n.op_type == "GroupNormalization" and n.domain in ("", "ai.onnx") for n in model.graph):
        return False
    for n in list(model.graph):
        if n.op_type in _REDUCE and n.domain in ("", "ai.onnx") and "axes" in n.attributes and opset < 18:
            b = Builder(model.graph, n)
            rest = {k: a.value for k, a in n.attributes.items() if k != "axes"}
            y = b.op(n.op_type, [n.inputs[0], b.const(np.asarray(n.attributes["axes"].value, np.int64), "axes")],
                     like=n.outputs[0], tag="reduce", **rest)
            take_over(n.outputs[0], y)
            model.graph.remove(n, safe=False)
    model.opset_imports[""] = 21
    model.graph.opset_imports[""] = 21
    return True


def _unpack(data: np.ndarray, bits: int, count: int) -> np.ndarray:
    """(rows, bytes) uint8 -> (rows, count) values (4 bits: low nibble first)."""
    data = np.asarray(data, np.uint8)
    if bits == 8:
        return data[:, :count]
    out = np.empty((data.shape[0], data.shape[1] * 2), np.uint8)
    out[:, 0::2], out[:, 1::2] = data & 0x0F, data >> 4
    return out[:, :count]


@dataclass(frozen=True)
class _Context:
    """``packed``: weights kept packed (opset 21); ``tables``: the embedding tables converted so far, by content (a
    head tied to its embedding reads the table transposed instead of a second packed copy)."""
    packed: bool
    tables: dict


def _key(q: np.ndarray, s: np.ndarray, z, bits: int, block: int) -> str:
    """The content of a (rows, K) quantized weight (zero points absent: their default)."""
    z = np.full(s.shape, 2 ** (bits - 1), np.uint8) if z is None else z
    h = hashlib.sha256(repr((q.shape, s.shape, bits, block, str(z.dtype))).encode())
    for a in (q, s, z):
        h.update(memoryview(np.ascontiguousarray(a)).cast("B"))  # no bytes copy of a 1 GB table
    return h.hexdigest()


@dataclass(frozen=True)
class _Blocks:
    """How a weight is quantized: ``bits`` per value, blocks of ``block`` values along ``axis``."""
    bits: int
    axis: int
    block: int


def _weight(b, q: np.ndarray, s: np.ndarray, z, how: _Blocks, packed: bool, tag: str):
    """The dequantized weight of values ``q`` (unsigned), scales ``s`` and zero points ``z`` (None: 2^(bits-1);
    unsigned integers; floats), blocks along ``axis``; a packed weight (DequantizeLinear kept) or a float constant."""
    bits, axis, block = how.bits, how.axis, how.block
    if z is not None and z.dtype.kind == "f" and np.all(z == np.rint(z)) and z.min() >= 0 and z.max() < 2 ** bits:
        z = z.astype(np.uint8)
    if not packed:
        zf = (2 ** (bits - 1)) if z is None else z
        return b.const(dequantize(q, s, np.asarray(zf), axis, block).astype(s.dtype), tag)
    if z is None:
        ins = [b.const(_stored(q, bits, True), f"{tag}_q"), b.const(s, f"{tag}_scale")]
    elif z.dtype.kind == "f":
        ins = [b.const(_stored(q, bits, False), f"{tag}_q"), b.const(s, f"{tag}_scale")]
    else:
        ins = [b.const(_stored(q, bits, False), f"{tag}_q"), b.const(s, f"{tag}_scale"),
               b.const(_stored(z, bits, False), f"{tag}_zero_point")]
    w = b.op("DequantizeLinear", ins, tag=tag, axis=axis, block_size=block)
    w.type, w.shape = ir.TensorType(ir.DataType.from_numpy(s.dtype)), ir.Shape(q.shape)
    nodes = [w.producer()]
    if z is not None and z.dtype.kind == "f":  # (q - z) s = q s - z s, per block
        w, more = _minus_zero_times_scale(b, w, (z * s).astype(s.dtype), q.shape, axis, block)
        nodes += more
    for n in nodes:
        meta.KEEP_PACKED.set(n, True)
    vals = list(ins)
    zf = None if z is None or z.dtype.kind != "f" else z
    meta.PACKED_WEIGHT.set(w, _Shared(lambda: _value(vals, zf, bits, axis, block)))
    return w


def _stored(q: np.ndarray, bits: int, signed: bool):
    """Unsigned values ``q`` as the DequantizeLinear input stores them: int4 / int8 (``q - 2^(bits-1)``) when
    ``signed``, else uint4 / uint8; 4-bit ones packed two to a byte (:func:`_packed4`)."""
    if bits == 4:
        return _packed4(q, signed)
    return np.ascontiguousarray((q.astype(np.int16) - 128).astype(np.int8) if signed else q.astype(np.uint8))


def _packed4(q: np.ndarray, signed: bool) -> ir.PackedTensor:
    """Values 0..15 (``signed``: stored as ``q - 8``) as a 4-bit tensor packed as ONNX does (two to a byte, low
    nibble first, in row-major order), a few rows at a time: the build holds half a byte per weight (numpy's int4
    takes a byte) and no full-size temporary."""
    rows = q.shape[0] if q.ndim else 1
    flat = q.reshape(rows, -1)
    cols = flat.shape[1]
    out = np.empty((rows * cols + 1) // 2, np.uint8)
    step = max(2, _CHUNK // 8 // max(1, cols) // 2 * 2)  # an even number of rows: whole bytes per chunk
    for i in range(0, rows, step):
        v = flat[i:i + step].reshape(-1).astype(np.uint8)
        if signed:
            v = (v - np.uint8(8)) & np.uint8(0x0F)  # two's complement in the low nibble
        if v.size % 2:
            v = np.append(v, np.uint8(0)).astype(np.uint8)
        start = i * cols // 2
        out[start:start + v.size // 2] = v[0::2] | (v[1::2] << np.uint8(4))
    return ir.PackedTensor(out, ir.DataType.INT4 if signed else ir.DataType.UINT4, shape=ir.Shape(q.shape))


class _Shared:
    """A packed weight's float value on demand: the same array while a caller still holds it (the rules read a
    weight several times per layer), computed again once it is freed (no float copy outlives the build)."""

    def __init__(self, compute):
        self.compute, self.ref = compute, None

    def __call__(self) -> np.ndarray:
        arr = self.ref() if self.ref is not None else None
        if arr is None:
            arr = self.compute()
            self.ref = weakref.ref(arr)
        return arr


def _value(vals, zf, bits: int, axis: int, block: int) -> np.ndarray:
    """The float value of a packed weight (what its DequantizeLinear computes, then minus ``zf * scale`` for float
    zero points), from its constants, a few rows of blocks at a time (temporaries of about _CHUNK bytes)."""
    x, s = vals[0].const_value, vals[1].const_value.numpy()
    z = vals[2].const_value.numpy() if len(vals) > 2 else zf
    if axis == 1:  # (V, K), blocks along each row
        return _value_rows(x, s, z, block)
    k, n = (int(d) for d in x.shape)
    out = np.empty((k, n), s.dtype)
    nb = s.shape[0]
    step = max(1, _CHUNK // max(1, block * n * 4))
    for i in range(0, nb, step):
        j = min(nb, i + step)
        rows = slice(i * block, min(k, j * block))
        q = _rows(x, rows.start, rows.stop).astype(np.float32)
        m = q.shape[0]
        pad = (j - i) * block - m  # a last block shorter than block_size
        if pad:
            q = np.concatenate([q, np.zeros((pad, n), np.float32)])
        q = q.reshape(j - i, block, n)
        if z is not None:
            q -= np.asarray(z[i:j], np.float32)[:, None, :]
        q *= s[i:j].astype(np.float32)[:, None, :]
        out[rows] = q.reshape(-1, n)[:m]
    return out


def _value_rows(x: np.ndarray, s: np.ndarray, z, block: int) -> np.ndarray:
    """_value of a (V, K) weight with blocks along its rows (an embedding table), a few thousand rows at a time."""
    v, k = (int(d) for d in x.shape)
    nb = s.shape[1]
    out = np.empty((v, k), s.dtype)
    step = max(1, _CHUNK // max(1, nb * block * 4))
    for i in range(0, v, step):
        j = min(v, i + step)
        q = _rows(x, i, j).astype(np.float32)
        if nb * block != k:  # a last block shorter than block_size
            q = np.concatenate([q, np.zeros((j - i, nb * block - k), np.float32)], axis=1)
        q = q.reshape(j - i, nb, block)
        if z is not None:
            q -= np.asarray(z[i:j], np.float32)[:, :, None]
        q *= s[i:j].astype(np.float32)[:, :, None]
        out[i:j] = q.reshape(j - i, -1)[:, :k]
    return out


_CHUNK = 64 << 20  # bytes of float temporaries per step of _value


def _rows(t, i: int, j: int) -> np.ndarray:
    """Rows ``i:j`` of the 2-D constant ``t`` as numbers; of a 4-bit :class:`ir.PackedTensor` unpacked from its
    bytes for these rows only (no unpacked copy of the whole weight)."""
    if not isinstance(t, ir.PackedTensor):
        return t.numpy()[i:j]
    cols = int(t.shape[1])
    a, e = i * cols, j * cols
    data = np.asarray(t.numpy_packed()).reshape(-1)[a // 2:(e + 1) // 2]
    nib = np.empty(data.size * 2, np.uint8)
    nib[0::2], nib[1::2] = data & 0x0F, data >> 4
    nib = nib[a % 2:a % 2 + e - a]
    if t.dtype == ir.DataType.INT4:  # two's complement nibbles
        return ((nib ^ np.uint8(8)).astype(np.int8) - np.int8(8)).reshape(j - i, cols)
    return nib.reshape(j - i, cols)


def _minus_zero_times_scale(b, w, zs: np.ndarray, shape, axis: int, block: int):
    """``w - zs`` with ``zs`` (one value per block) repeated over the blocks of ``axis`` (0: (K, N); 1: (V, K))."""
    rows, cols = shape
    nb = zs.shape[axis]
    pad = nb * block - shape[axis]
    nodes = []
    if pad:
        w = b.op("Pad", [w, b.const(np.array([0, 0, pad, 0] if axis == 0 else [0, 0, 0, pad], np.int64), "pads")],
                 tag="w_pad")
        nodes.append(w.producer())
    split = [nb, block, cols] if axis == 0 else [rows, nb, block]
    z3 = zs[:, None, :] if axis == 0 else zs[:, :, None]
    w = b.op("Reshape", [w, b.const(np.array(split, np.int64), "blocks")], tag="w_blocks")
    d = b.op("Sub", [w, b.const(np.ascontiguousarray(z3), "zero_scaled")], tag="w_minus_zero")
    full = [nb * block, cols] if axis == 0 else [rows, nb * block]
    y = b.op("Reshape", [d, b.const(np.array(full, np.int64), "unblocked")], tag="w_full")
    nodes += [w.producer(), d.producer(), y.producer()]
    if pad:
        y = b.op("Slice", [y, b.const(np.array([0], np.int64), "start"), b.const(np.array([shape[axis]], np.int64),
                                                                                  "end"),
                           b.const(np.array([axis], np.int64), "axis")], tag="w_unpad")
        nodes.append(y.producer())
    y.type, y.shape = ir.TensorType(ir.DataType.from_numpy(zs.dtype)), ir.Shape(list(shape))
    return y, nodes


def _constants(node, idx) -> list:
    vals = padded_inputs(node, max(idx) + 1)
    out = []
    for i in idx:
        v = vals[i]
        c = _reshaped_const(v) if v is not None else None
        if v is not None and c is None:
            raise Refused(f"input {i} ({v.name}) that is not a constant")
        out.append(c)
    return out


def _reshaped_const(v: ir.Value):
    """The constant value of ``v``, also through a Reshape of a constant (onnxruntime-genai's tied int4 embedding
    reads the head's packed weights reshaped, a table too large for constant folding)."""
    c = const(v)
    node = v.producer()
    if c is None and node is not None and node.op_type == "Reshape" and node.domain in ("", "ai.onnx") \
            and len(node.inputs) >= 2 and node.inputs[0] is not None and node.inputs[1] is not None:
        data, shape = const(node.inputs[0]), const(node.inputs[1])
        if data is not None and shape is not None and not node.attributes.get_int("allowzero", 0):
            shape = [data.shape[j] if d == 0 else int(d) for j, d in enumerate(np.asarray(shape).reshape(-1))]
            return np.reshape(np.asarray(data), shape)
    return c


def _matmul_nbits(b, node, ctx: _Context) -> ir.Value:
    k, n = int(attr(node, "K", 0)), int(attr(node, "N", 0))
    bits, block = int(attr(node, "bits", 4)), int(attr(node, "block_size", 0) or 0)
    if bits not in (4, 8) or block < 16 or k <= 0 or n <= 0:
        raise Refused(f"bits {bits}, block_size {block}, K {k}, N {n} (4 or 8 bits, blocks of 16 or more)")
    bq, s, z, g = _constants(node, (1, 2, 3, 4))
    nb = -(-k // block)
    if g is not None and not np.array_equal(np.asarray(g).reshape(-1), np.arange(k) // block):
        raise Refused("g_idx in another order than the blocks (act-order); quantize without it")
    q = _unpack(np.asarray(bq).reshape(n, -1), bits, nb * block)[:, :k]
    s = np.asarray(s).reshape(n, nb)
    if z is not None:
        z = np.asarray(z).reshape(n, -1)
        z = z[:, :nb] if z.dtype.kind == "f" else _unpack(z, bits, nb)
    table = ctx.tables.get(_key(q, s, z, bits, block)) if ctx.packed else None
    if table is not None:  # tied to an embedding: its table, transposed
        w = b.op("Transpose", [table], perm=[1, 0], tag="tied_w")
        w.type, w.shape = table.type, ir.Shape([k, n])
        meta.KEEP_PACKED.set(w.producer(), True)
        meta.PACKED_WEIGHT.set(w, _Shared(lambda: meta.PACKED_WEIGHT.get(table)().T))  # a view: no 1 GB copy per read
    else:
        w = _weight(b, q.T, np.ascontiguousarray(s.T),  # q.T packed a few rows at a time (no transposed copy)
                    None if z is None else np.ascontiguousarray(z.T), _Blocks(bits, 0, block), ctx.packed, "w")
    y = b.op("MatMul", [node.inputs[0], w], like=node.outputs[0], tag="matmul")
    bias = padded_inputs(node, 6)[5]
    if bias is not None:
        y = b.op("Add", [y, bias], like=node.outputs[0], tag="bias")
    return y


def _gather_block(b, node, ctx: _Context) -> ir.Value:
    data, ids = node.inputs[0], node.inputs[1]
    dc, s, z = _constants(node, (0, 2, 3))
    if dc is None or dc.ndim != 2:
        raise Refused("data that is not a 2-D constant table")
    gax, qax = int(attr(node, "gather_axis", 0)), int(attr(node, "quantize_axis", 1))
    bits, block = int(attr(node, "bits", 4)), int(attr(node, "block_size", 128))
    if gax != 0 or qax % 2 != 1 or bits not in (4, 8):
        raise Refused(f"gather_axis {gax}, quantize_axis {qax}, bits {bits} (a table gathered on axis 0, blocks "
                      "along the last axis, 4 or 8 bits)")
    signed = dc.dtype == _INT[4, True] or dc.dtype == np.int8
    if dc.dtype == np.uint8 and bits == 4:
        q = _unpack(dc, 4, dc.shape[1] * 2)
    else:
        q = dc.astype(np.int16) + (2 ** (bits - 1) if signed else 0)  # unsigned, zero point shifted alike
    hidden = q.shape[1]
    s = np.asarray(s).reshape(q.shape[0], -1)
    if z is None:
        z = None if not signed else np.full(s.shape, 2 ** (bits - 1), np.uint8)
    elif z.dtype == np.uint8 and bits == 4 and dc.dtype == np.uint8:
        z = _unpack(z.reshape(q.shape[0], -1), 4, s.shape[1])
    else:
        z = z.astype(np.int16).reshape(s.shape) + (2 ** (bits - 1) if signed else 0)
    q = np.asarray(q, np.uint8)
    table = _weight(b, q, s, z, _Blocks(bits, 1, block), ctx.packed, "table")
    if table.shape is not None and list(table.shape) != [q.shape[0], hidden]:
        raise Refused("a table whose hidden size does not fit its blocks")
    if ctx.packed:
        ctx.tables[_key(q, s, z, bits, block)] = table
    return b.op("Gather", [table, ids], axis=0, like=node.outputs[0], tag="lookup")


__all__ = ["BlockQuantized", "ACCURACY_NOTE"]
