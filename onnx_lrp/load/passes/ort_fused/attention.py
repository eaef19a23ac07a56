"""onnxruntime's attention ops split into a TorchScript export's attention: ``Attention`` (packed QKV projection),
``MultiHeadAttention``, ``GroupQueryAttention`` (on a prompt or after a past), and ``RotaryEmbedding``; the masks of onnxruntime's CPU
kernel rebuilt as additive biases from the integer inputs and shapes alone."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ....core import meta
from ...builder import attr, const, take_over
from .split_tools import INT64, Refuse, Unknown, fdtype, i64, opt, positions, rank, typed, used


def _mask_bias(b, mask: ir.Value | None, causal: bool, q: ir.Value, kv: ir.Value, filt: float,
               dtype: np.dtype) -> ir.Value | None:
    """The additive attention bias of onnxruntime's CPU kernel: 0 where a key may be attended, ``filt`` elsewhere,
    of shape (B or 1, 1, S or 1, T); from the integer mask and the shapes only (it carries no relevance)."""
    if mask is None and not causal:
        return None
    j = positions(b, kv, 1, "key_pos")  # (T,)
    allowed = None
    if mask is not None:
        r = rank(mask)
        m = mask
        if m.dtype is not None and m.dtype != INT64:
            m = typed(b.op("Cast", [m], tag="mask_i64", to=INT64.value), INT64, None)
        if r == 1:  # (B): end positions; (2B): end positions then start positions
            n = mask.shape[0]
            bdim = q.shape[0] if q.shape is not None else None
            if meta.MASK_PER_ROW.get(mask):  # EmbedLayerNormalization's mask_index: one count per batch row
                two = False
            elif bdim is None:
                raise Unknown(f"input {q.name} of unknown batch size")
            elif isinstance(n, int) and isinstance(bdim, int) and n in (bdim, 2 * bdim):
                two = n == 2 * bdim
            elif n is not None and bdim is not None and str(n) == str(bdim):
                two = False
            else:  # onnxruntime tells (B) from (2B) by the length at run time; we must know it when splitting
                raise Refuse(f"a 1-D mask of length {n} for a batch of {bdim} (a (B) or (2B) mask whose length "
                             "is not known to be either)")
            m2 = typed(b.op("Reshape", [m, i64(b, [2, -1, 1, 1, 1] if two else [-1, 1, 1, 1], "mask_shape")],
                            tag="mask_pos"), INT64)
            if two:
                end = typed(b.op("Gather", [m2, b.const(np.array(0, np.int64), "i0")], axis=0, tag="end"), INT64)
                start = typed(b.op("Gather", [m2, b.const(np.array(1, np.int64), "i1")], axis=0, tag="start"),
                              INT64)
                lo = typed(b.op("GreaterOrEqual", [j, start], tag="after_start"), ir.DataType.BOOL)
                hi = typed(b.op("Less", [j, end], tag="before_end"), ir.DataType.BOOL)
                allowed = typed(b.op("And", [lo, hi], tag="in_range"), ir.DataType.BOOL)
            else:
                allowed = typed(b.op("Less", [j, m2], tag="before_end"), ir.DataType.BOOL)
        elif r in (2, 3):  # (B, T) / (B, S, T): 0 masks a key
            pos = typed(b.op("Greater", [m, b.const(np.array(0, np.int64), "zero")], tag="mask_on"), ir.DataType.BOOL)
            allowed = typed(b.op("Unsqueeze", [pos, i64(b, [1, 2] if r == 2 else [1], "axes")], tag="mask_4d"),
                            ir.DataType.BOOL)
        else:
            raise Refuse(f"a mask of rank {r} (only (B), (2B), (B, T) and (B, S, T) are supported)")
    dt = ir.DataType.from_numpy(dtype)
    bias = None
    if allowed is not None:
        bias = typed(b.op("Where", [allowed, b.const(np.array(0, dtype), "open"), b.const(np.array(filt, dtype),
                                                                                          "filter")],
                          tag="mask_bias"), dt)
    if causal:  # onnxruntime sets the lowest float above the diagonal, whatever mask_filter_value is
        i = positions(b, q, 1, "query_pos")
        i2 = typed(b.op("Unsqueeze", [i, i64(b, [1], "axes")], tag="query_col"), INT64)
        c = typed(b.op("LessOrEqual", [j, i2], tag="causal"), ir.DataType.BOOL)  # (S, T)
        open_ = bias if bias is not None else b.const(np.array(0, dtype), "open")
        bias = typed(b.op("Where", [c, open_, b.const(np.array(np.finfo(dtype).min, dtype), "causal_filter")],
                          tag="causal_bias"), dt)
    return bias


def _heads(b, v: ir.Value, n: int, h: int, perm, tag: str) -> ir.Value:
    r = b.op("Reshape", [v, i64(b, [0, 0, n, h], "heads_shape")], tag=f"{tag}_heads")
    return b.op("Transpose", [r], perm=list(perm), tag=f"{tag}_t")


@dataclass(frozen=True)
class _Heads:
    """The head layout of an attention op: ``n`` heads of query/key width ``hq`` and value width ``hv``; ``scale``
    (0: 1 / sqrt(hq))."""
    n: int
    hq: int
    hv: int
    scale: float


def _attend(b, node, qkv: tuple, heads: _Heads, bias, attn_bias) -> ir.Value:
    """softmax(q k^T * scale + bias) v over heads, as a TorchScript export writes it; q, k, v of shape (B, S, .);
    the result takes the place of the node's first output."""
    (q, k, v), n, hq, hv, scale, like = qkv, heads.n, heads.hq, heads.hv, heads.scale, node.outputs[0]
    dt = fdtype(node.inputs[0])  # constants in the model's float type (float32 once float16 is upcast)
    qh = _heads(b, q, n, hq, (0, 2, 1, 3), "q")
    kt = _heads(b, k, n, hq, (0, 2, 3, 1), "k")
    vh = _heads(b, v, n, hv, (0, 2, 1, 3), "v")
    s = b.op("MatMul", [qh, kt], tag="scores")
    if scale:
        s = b.op("Mul", [s, b.const(np.array(scale, dt), "scale")], tag="scaled")
    else:
        s = b.op("Div", [s, b.const(np.array(math.sqrt(hq), dt), "sqrt_head")], tag="scaled")
    if attn_bias is not None:
        s = b.op("Add", [s, attn_bias], tag="attention_bias")
    if bias is not None:
        s = b.op("Add", [s, bias], tag="masked")
    p = b.op("Softmax", [s], axis=-1, tag="probs")
    ctx = b.op("MatMul", [p, vh], tag="context")
    ct = b.op("Transpose", [ctx], perm=[0, 2, 1, 3], tag="context_t")
    return b.op("Reshape", [ct, i64(b, [0, 0, n * hv], "merge_shape")], like=like, tag="merged")


def _common_attrs(node):
    n = int(attr(node, "num_heads", 0) or 0)
    if n <= 0:
        raise Refuse("num_heads is missing")
    if int(attr(node, "do_rotary", 0) or 0):
        raise Refuse("rotary attention (do_rotary=1)")
    if int(attr(node, "past_present_share_buffer", 0) or 0):
        raise Refuse("a shared past/present buffer (KV cache)")
    return n, float(attr(node, "scale", 0.0) or 0.0), bool(int(attr(node, "unidirectional", 0) or 0)), \
        float(attr(node, "mask_filter_value", -10000.0))


def attention(b, node) -> ir.Value:
    n, scale, causal, filt = _common_attrs(node)
    x, w, bias, mask = (opt(node, i) for i in range(4))
    if opt(node, 4) is not None or opt(node, 6) is not None or any(used(o) for o in node.outputs[1:]):
        raise Refuse("past/present key-value state (KV cache); optimise the model without past inputs")
    if x.shape is not None and len(x.shape) != 3:  # onnxruntime's kernel requires rank 3
        raise Refuse(f"input of rank {len(x.shape)} (want (batch, sequence, hidden))")
    wv = const(w)
    bv = const(bias) if bias is not None else None
    if wv is None or (bias is not None and bv is None):
        raise Refuse("its QKV weight or bias is not a constant")
    sizes = list(attr(node, "qkv_hidden_sizes", []) or [])
    if not sizes:
        if wv.shape[1] % 3:
            raise Refuse(f"QKV weight of width {wv.shape[1]} (not three equal parts)")
        sizes = [wv.shape[1] // 3] * 3
    if len(sizes) != 3 or sum(sizes) != wv.shape[1] or sizes[0] != sizes[1] or sizes[0] % n or sizes[2] % n:
        raise Refuse(f"qkv_hidden_sizes {sizes} do not fit weight {list(wv.shape)} and {n} heads")
    cuts = np.cumsum([0] + sizes)
    proj = []
    for i, tag in enumerate("qkv"):
        y = b.op("MatMul", [x, b.const(np.ascontiguousarray(wv[:, cuts[i]:cuts[i + 1]]), f"w_{tag}")], tag=tag)
        if bv is not None:
            y = b.op("Add", [y, b.const(np.ascontiguousarray(bv[cuts[i]:cuts[i + 1]]), f"b_{tag}")], tag=f"{tag}_b")
        proj.append(y)
    mb = _mask_bias(b, mask, causal, x, x, filt, fdtype(x))
    return _attend(b, node, tuple(proj), _Heads(n, sizes[0] // n, sizes[2] // n, scale), mb, opt(node, 5))


def mha(b, node) -> ir.Value:
    n, scale, causal, filt = _common_attrs(node)
    q, k, v, bias, mask, attn_bias = (opt(node, i) for i in range(6))
    if any(opt(node, i) is not None for i in range(6, 10)) or any(used(o) for o in node.outputs[1:]):
        raise Refuse("past/present key-value state (KV cache); optimise the model without past inputs")
    if k is None or v is None or rank(q) != 3 or rank(k) != 3 or rank(v) != 3:
        raise Refuse("packed or 4-D/5-D query/key/value (only separate (batch, sequence, hidden) inputs are "
                     "supported)")
    dq, dk, dv = (t.shape[2] for t in (q, k, v))
    if not all(isinstance(d, int) for d in (dq, dk, dv)) or dq != dk or dq % n or dv % n:
        raise Refuse(f"hidden sizes q {dq}, k {dk}, v {dv} do not fit {n} heads")
    if bias is not None:
        bv = const(bias)
        if bv is None or bv.shape != (dq + dk + dv,):
            raise Refuse("its bias is not a constant of length q + k + v hidden sizes")
        cuts = np.cumsum([0, dq, dk, dv])
        q, k, v = (b.op("Add", [t, b.const(np.ascontiguousarray(bv[cuts[i]:cuts[i + 1]]), f"b_{tag}")],
                        tag=f"{tag}_b") for i, (t, tag) in enumerate(zip((q, k, v), "qkv")))
    mb = _mask_bias(b, mask, causal, node.inputs[0], node.inputs[1], filt, fdtype(node.inputs[0]))
    return _attend(b, node, (q, k, v), _Heads(n, dq // n, dv // n, scale), mb, attn_bias)


def _gqa_split(b, qkv: tuple, n: int, nkv: int, d: int) -> tuple:
    """(q, k, v, head size): as given, or sliced from a packed query (B, S, (N + 2 N_kv) H) when k is absent."""
    q, k, v = qkv
    if k is not None:
        return q, k, v, d // n
    h = d // (n + 2 * nkv)
    cuts = np.cumsum([0, n * h, nkv * h, nkv * h])
    q, k, v = (b.op("Slice", [q, i64(b, [cuts[i]], "start"), i64(b, [cuts[i + 1]], "end"), i64(b, [-1], "axis")],
                    tag=tag) for i, tag in enumerate("qkv"))
    return q, k, v, h


def gqa(b, node) -> ir.Value:
    """GroupQueryAttention: causal (within ``local_window_size``), keys after ``seqlens_k[b]`` (the last valid index)
    masked, ``do_rotary`` (the cos/sin caches at ``position_ids`` or, as onnxruntime derives them, past..past+S-1),
    K/V heads repeated to the query heads as LLaMA's ``repeat_kv`` (Expand + Reshape); present_key / present_value
    are K and V in (B, N_kv, S, H). A past (B, N_kv, P, H) is put before the new keys and values: onnxruntime reads
    its first ``seqlens_k[b] + 1 - S`` positions (the rest of a shared max-length buffer is masked)."""
    n, nkv = int(attr(node, "num_heads", 0) or 0), int(attr(node, "kv_num_heads", 0) or 0)
    if n <= 0 or nkv <= 0 or n % nkv:
        raise Refuse(f"num_heads {n} and kv_num_heads {nkv}")
    q, k, v, past_k, past_v, seqlens = (opt(node, i) for i in range(6))
    if (past_k is None) != (past_v is None) or any(p is not None and rank(p) != 4 for p in (past_k, past_v)):
        raise Refuse("a past key without its past value (or the reverse), or a past not (B, N_kv, P, H)")
    if float(attr(node, "softcap", 0.0) or 0.0) or int(attr(node, "smooth_softmax", 0) or 0) or \
            opt(node, 11) is not None or (len(node.outputs) > 3 and used(node.outputs[3])):
        raise Refuse("softcap, smooth softmax, head sinks or the QK output")
    if seqlens is None:
        raise Refuse("no seqlens_k input")
    d = q.shape[-1] if rank(q) == 3 else None
    if not isinstance(d, int):
        raise Refuse("a query of unknown hidden size")
    q, k, v, h = _gqa_split(b, (q, k, v), n, nkv, d)
    dt = fdtype(node.inputs[0])
    qh = _heads(b, q, n, h, (0, 2, 1, 3), "q")
    kh = _heads(b, k, nkv, h, (0, 2, 1, 3), "k")  # (B, N_kv, S, H): present_key
    vh = _heads(b, v, nkv, h, (0, 2, 1, 3), "v")
    past = None if past_k is None else _gqa_past(b, node.inputs[0], seqlens)
    if int(attr(node, "do_rotary", 0) or 0):
        qh, kh = _gqa_rotary(b, node, qh, kh, h, None if past is None else past.positions)
    if past is not None:
        if int(attr(node, "past_present_share_buffer", 0) or 0) and any(used(o) for o in node.outputs[1:3]):
            raise Refuse("a shared past/present buffer whose present outputs are read")
        kh, vh = (b.op("Concat", [p, t], axis=2, tag=f"{tag}_with_past") for p, t, tag in
                  ((past_k, kh, "k"), (past_v, vh, "v")))
    for o, t in zip(node.outputs[1:3], (kh, vh)):
        if used(o):
            take_over(o, t)
    g = n // nkv
    if g > 1:
        kh, vh = (b.op("Reshape", [b.op("Expand", [b.op("Unsqueeze", [t, i64(b, [2], "axes")], tag=f"{tag}_5d"),
                                                   i64(b, [1, 1, g, 1, 1], "groups")], tag=f"{tag}_groups"),
                                   i64(b, [0, n, -1, h], "heads_shape")], tag=f"{tag}_repeated")
                  for t, tag in ((kh, "k"), (vh, "v")))
    kt = b.op("Transpose", [kh], perm=[0, 1, 3, 2], tag="k_t")
    s = b.op("MatMul", [qh, kt], tag="scores")
    scale = float(attr(node, "scale", 0.0) or 0.0)
    if scale:
        s = b.op("Mul", [s, b.const(np.array(scale, dt), "scale")], tag="scaled")
    else:
        s = b.op("Div", [s, b.const(np.array(math.sqrt(h), dt), "sqrt_head")], tag="scaled")
    if opt(node, 10) is not None:
        s = b.op("Add", [s, node.inputs[10]], tag="attention_bias")
    if past is None:
        bias = _seqlens_bias(b, node, q, seqlens, dt)
    else:
        bias = _past_bias(b, node, past, past_k, seqlens, dt)
    s = b.op("Add", [s, bias], tag="masked")
    p = b.op("Softmax", [s], axis=-1, tag="probs")
    ctx = b.op("Transpose", [b.op("MatMul", [p, vh], tag="context")], perm=[0, 2, 1, 3], tag="context_t")
    return b.op("Reshape", [ctx, i64(b, [0, 0, n * h], "merge_shape")], like=node.outputs[0], tag="merged")


@dataclass(frozen=True)
class _Past:
    """Where a GroupQueryAttention's new tokens sit after its past: ``length`` (B, 1, 1, 1), the past positions
    onnxruntime reads (``seqlens_k + 1 - S``, at least 0), ``query`` (B, 1, S, 1) the new tokens' positions and
    ``positions`` (B, S) the same for the rotary caches (all int64, from integers and shapes only)."""
    length: ir.Value
    query: ir.Value
    positions: ir.Value


def _gqa_past(b, q: ir.Value, seqlens: ir.Value) -> _Past:
    last = typed(b.op("Reshape", [b.op("Cast", [seqlens], to=INT64.value, tag="seqlens"),
                                  i64(b, [-1, 1, 1, 1], "mask_shape")], tag="last_key"), INT64)
    s = typed(b.op("Shape", [q], start=1, end=2, tag="new_len"), INT64, [1])
    start = typed(b.op("Sub", [typed(b.op("Add", [last, b.const(np.array(1, np.int64), "one")], tag="total"), INT64),
                               s], tag="past_start"), INT64)
    length = typed(b.op("Max", [start, b.const(np.array(0, np.int64), "zero")], tag="past_len"), INT64)
    i = positions(b, q, 1, "query_pos")  # (S,)
    query = typed(b.op("Add", [length, b.op("Unsqueeze", [i, i64(b, [1], "axes")], tag="query_col")],
                       tag="query_at"), INT64)  # (B, 1, S, 1)
    pos = typed(b.op("Add", [b.op("Reshape", [length, i64(b, [-1, 1], "row_shape")], tag="past_row"), i],
                     tag="rotary_pos"), INT64)  # (B, S)
    return _Past(length, query, pos)


def _past_bias(b, node, past: _Past, past_k: ir.Value, seqlens: ir.Value, dt: np.dtype) -> ir.Value:
    """The additive mask over [past buffer (P), new keys (S)]: a past key is open below the past length, a new key
    j at position past + j; causal, within ``local_window_size``, not after ``seqlens_k``."""
    kv = b.op("Concat", [b.op("Shape", [past_k], start=2, end=3, tag="past_buf"),
                         b.op("Shape", [node.inputs[0]], start=1, end=2, tag="new_keys")], axis=0, tag="key_count")
    n = typed(b.op("ReduceSum", [kv], keepdims=0, tag="keys_n"), INT64, [])
    j = typed(b.op("Range", [b.const(np.array(0, np.int64), "zero"), n, b.const(np.array(1, np.int64), "one")],
                   tag="key_idx"), INT64)  # (T,)
    pb = typed(b.op("Shape", [past_k], start=2, end=3, tag="past_buf_len"), INT64, [1])
    is_past = typed(b.op("Less", [j, pb], tag="is_past"), ir.DataType.BOOL)
    new_at = typed(b.op("Add", [past.length, b.op("Sub", [j, pb], tag="new_idx")], tag="new_at"), INT64)
    key = typed(b.op("Where", [is_past, j, new_at], tag="key_at"), INT64)  # (B, 1, 1, T)
    read = typed(b.op("Or", [b.op("Not", [is_past], tag="is_new"), b.op("Less", [j, past.length], tag="past_read")],
                      tag="key_read"), ir.DataType.BOOL)
    allowed = typed(b.op("And", [read, b.op("LessOrEqual", [key, past.query], tag="causal")], tag="causal_read"),
                    ir.DataType.BOOL)
    window = int(attr(node, "local_window_size", -1))
    if window > 0:
        lo = typed(b.op("Sub", [past.query, b.const(np.array(window, np.int64), "window")], tag="window_start"), INT64)
        allowed = typed(b.op("And", [allowed, b.op("Greater", [key, lo], tag="in_window")], tag="windowed"),
                        ir.DataType.BOOL)
    last = typed(b.op("Reshape", [b.op("Cast", [seqlens], to=INT64.value, tag="seqlens"),
                                  i64(b, [-1, 1, 1, 1], "mask_shape")], tag="last_key"), INT64)
    allowed = typed(b.op("And", [allowed, b.op("LessOrEqual", [key, last], tag="valid_key")], tag="allowed"),
                    ir.DataType.BOOL)
    return b.op("Where", [allowed, b.const(np.array(0, dt), "open"), b.const(np.array(np.finfo(dt).min, dt),
                                                                               "filter")], tag="mask_bias")


def _gqa_rotary(b, node, qh: ir.Value, kh: ir.Value, head: int, after_past: ir.Value | None
                ) -> tuple[ir.Value, ir.Value]:
    """GroupQueryAttention's ``do_rotary``: q and k (B, N, S, H) rotated by the cos/sin caches (max length, rd/2)
    gathered at ``position_ids`` (B, S), else at ``after_past`` (B, S) (the positions after a past) or, on a prompt,
    0..S-1; the first rd of each head rotated."""
    cos_c, sin_c, pos = opt(node, 7), opt(node, 8), opt(node, 9)
    if cos_c is None or sin_c is None or cos_c.shape is None or not isinstance(cos_c.shape[-1], int):
        raise Refuse("do_rotary without cos/sin caches of known width")
    rd = 2 * cos_c.shape[-1]
    if rd > head:
        raise Refuse(f"cos/sin caches of width {rd // 2} for heads of size {head}")
    if pos is None:
        pos = positions(b, qh, 2, "seq_pos") if after_past is None else after_past
    elif pos.shape is None or len(pos.shape) != 2:
        raise Refuse("position_ids that are not (B, S)")
    else:
        pos = typed(b.op("Cast", [pos], to=INT64.value, tag="position_ids"), INT64)
    cos, sin = _angles(b, cos_c, sin_c, pos)  # (S, rd/2) or (B, S, rd/2)
    inter = bool(int(attr(node, "rotary_interleaved", 0) or 0))
    return tuple(_rotary_part(b, x, cos, sin, rd, head, inter, tag) for x, tag in ((qh, "q"), (kh, "k")))


def _rotary_part(b, xh: ir.Value, cos, sin, rd: int, head: int, interleaved: bool, tag: str) -> ir.Value:
    """(B, N, S, H) with its first ``rd`` of each head rotated (the rest passed through)."""
    xr = xh if rd == head else b.op("Slice", [xh, i64(b, [0], "start"), i64(b, [rd], "end"), i64(b, [-1], "axis")],
                                    tag=f"{tag}_rot_part")
    y = _rotate(b, xr, cos, sin, -3, rd, interleaved)
    if rd != head:
        rest = b.op("Slice", [xh, i64(b, [rd], "start"), i64(b, [head], "end"), i64(b, [-1], "axis")],
                    tag=f"{tag}_pass")
        y = b.op("Concat", [y, rest], axis=-1, tag=f"{tag}_with_pass")
    return y


def _seqlens_bias(b, node, q: ir.Value, seqlens: ir.Value, dt: np.dtype) -> ir.Value:
    """GroupQueryAttention's additive mask, from shapes and the integer seqlens_k only: causal, within
    ``local_window_size``, no key after the last valid one."""
    j = positions(b, q, 1, "key_pos")
    i2 = typed(b.op("Unsqueeze", [positions(b, q, 1, "query_pos"), i64(b, [1], "axes")], tag="query_col"), INT64)
    allowed = typed(b.op("LessOrEqual", [j, i2], tag="causal"), ir.DataType.BOOL)
    window = int(attr(node, "local_window_size", -1))
    if window > 0:
        lo = typed(b.op("Sub", [i2, b.const(np.array(window, np.int64), "window")], tag="window_start"), INT64)
        allowed = typed(b.op("And", [allowed, typed(b.op("Greater", [j, lo], tag="in_window"), ir.DataType.BOOL)],
                             tag="allowed"), ir.DataType.BOOL)
    last = typed(b.op("Reshape", [b.op("Cast", [seqlens], to=INT64.value, tag="seqlens"),
                                  i64(b, [-1, 1, 1, 1], "mask_shape")], tag="last_key"), INT64)
    valid = typed(b.op("LessOrEqual", [j, last], tag="valid_key"), ir.DataType.BOOL)
    allowed = typed(b.op("And", [allowed, valid], tag="allowed"), ir.DataType.BOOL)
    bias = b.op("Where", [allowed, b.const(np.array(0, dt), "open"), b.const(np.array(np.finfo(dt).min, dt),
                                                                               "filter")], tag="mask_bias")
    return bias


def rotary(b, node) -> ir.Value:
    """RotaryEmbedding as HF's ``x * cos + rotate_half(x) * sin`` (pairs for ``interleaved``); cos and sin are
    gathered from the caches at the position ids (no relevance: they come from shapes or integer inputs)."""
    x, pos, cos_c, sin_c = (opt(node, i) for i in range(4))
    if int(attr(node, "is_packed_batching", 0) or 0):
        raise Refuse("packed batching")
    if float(attr(node, "scale", 1.0) or 1.0) != 1.0:
        raise Refuse("a scale other than 1")
    if cos_c is None or sin_c is None or cos_c.shape is None or not isinstance(cos_c.shape[-1], int):
        raise Refuse("cos/sin caches of unknown width")
    half = cos_c.shape[-1]
    rd = int(attr(node, "rotary_embedding_dim", 0) or 0) or 2 * half
    if rd != 2 * half:
        raise Refuse(f"rotary_embedding_dim {rd} for caches of width {half}")
    r = rank(x)
    out = node.outputs[0]
    n = int(attr(node, "num_heads", 0) or 0)
    if r == 3:  # (B, S, N*H) -> (B, S, N, H)
        d = x.shape[2]
        if not isinstance(d, int):
            raise Refuse("a 3-D input of unknown hidden size")
        n = n or d // rd
        if d % n:
            raise Refuse(f"hidden size {d} for {n} heads")
        xh, head = b.op("Reshape", [x, i64(b, [0, 0, n, d // n], "heads_shape")], tag="heads"), d // n
    elif r == 4:  # (B, N, S, H)
        xh, head = x, x.shape[3]
        if not isinstance(head, int):
            raise Refuse("a 4-D input of unknown head size")
    else:
        raise Refuse(f"an input of rank {r}")
    if pos is None or pos.shape is None or len(pos.shape) not in (1, 2):
        raise Refuse("position_ids that are not (B, S) or (1)")
    if len(pos.shape) == 1:  # an offset: positions offset + 0..S-1
        seq = positions(b, x, 1 if r == 3 else 2, "seq_pos")
        pos = typed(b.op("Add", [seq, b.op("Cast", [pos], to=INT64.value, tag="offset")], tag="positions"), INT64)
    cos, sin = _angles(b, cos_c, sin_c, pos)  # (B, S, rd/2) or (S, rd/2)
    axis = -2 if r == 3 else -3  # the heads axis: (.., S, 1, rd) for (B, S, N, H); (.., 1, S, rd) for (B, N, S, H)
    xr = xh if rd == head else b.op("Slice", [xh, i64(b, [0], "start"), i64(b, [rd], "end"), i64(b, [-1], "axis")],
                                    tag="x_rot")
    y = _rotate(b, xr, cos, sin, axis, rd, bool(int(attr(node, "interleaved", 0) or 0)))
    if rd != head:
        rest = b.op("Slice", [xh, i64(b, [rd], "start"), i64(b, [head], "end"), i64(b, [-1], "axis")],
                    tag="x_pass")
        y = b.op("Concat", [y, rest], axis=-1, tag="with_pass")
    if r == 3:
        y = b.op("Reshape", [y, i64(b, [0, 0, -1], "merge_shape")], tag="merged")
    y.type, y.shape = out.type, out.shape
    return y


def _angles(b, cos_c: ir.Value, sin_c: ir.Value, pos: ir.Value) -> tuple[ir.Value, ir.Value]:
    """cos and sin gathered from the caches at the positions: marked as carrying no relevance (a lookup at position
    ids is not a token's embedding)."""
    out = []
    for c, tag in ((cos_c, "cos"), (sin_c, "sin")):
        v = b.op("Gather", [c, pos], axis=0, tag=tag)
        v.type = c.type
        meta.SHAPE_ONLY.set(v, True)
        out.append(v)
    return out[0], out[1]


def _rotate(b, xr: ir.Value, cos: ir.Value, sin: ir.Value, axis: int, rd: int, interleaved: bool) -> ir.Value:
    """``xr`` (the rotated part of each head, width ``rd``) rotated by the gathered angles: ``x * cos +
    rotate_half(x) * sin``, or by pairs (2i, 2i+1) when ``interleaved``; ``axis`` is the heads axis."""
    half = rd // 2
    if interleaved:  # pairs (2i, 2i+1) rotate by angle i
        c = b.op("Unsqueeze", [cos, i64(b, [axis - 1, -1], "axes")], tag="c")
        sn = b.op("Unsqueeze", [sin, i64(b, [axis - 1, -1], "axes")], tag="s")
        pairs = b.op("Reshape", [xr, i64(b, [0, 0, 0, half, 2], "pairs_shape")], tag="pairs")
        e = b.op("Slice", [pairs, i64(b, [0], "s0"), i64(b, [1], "e0"), i64(b, [-1], "ax")], tag="even")
        o = b.op("Slice", [pairs, i64(b, [1], "s1"), i64(b, [2], "e1"), i64(b, [-1], "ax")], tag="odd")
        re = b.op("Sub", [b.op("Mul", [e, c], tag="ec"), b.op("Mul", [o, sn], tag="os")], tag="rot_even")
        ro = b.op("Add", [b.op("Mul", [o, c], tag="oc"), b.op("Mul", [e, sn], tag="es")], tag="rot_odd")
        y = b.op("Reshape", [b.op("Concat", [re, ro], axis=-1, tag="rot_pairs"), i64(b, [0, 0, 0, rd], "rot_shape")],
                 tag="rotated")
    else:
        c = b.op("Unsqueeze", [b.op("Concat", [cos, cos], axis=-1, tag="cos_full"), i64(b, [axis], "axes")],
                 tag="c")
        sn = b.op("Unsqueeze", [b.op("Concat", [sin, sin], axis=-1, tag="sin_full"), i64(b, [axis], "axes")],
                  tag="s")
        x1 = b.op("Slice", [xr, i64(b, [0], "s0"), i64(b, [half], "e0"), i64(b, [-1], "ax")], tag="x1")
        x2 = b.op("Slice", [xr, i64(b, [half], "s1"), i64(b, [rd], "e1"), i64(b, [-1], "ax")], tag="x2")
        rot = b.op("Concat", [b.op("Neg", [x2], tag="neg_x2"), x1], axis=-1, tag="rotate_half")
        y = b.op("Add", [b.op("Mul", [xr, c], tag="x_cos"), b.op("Mul", [rot, sn], tag="rot_sin")], tag="rotated")
    return y
