"""onnxruntime's fused ops split back into standard ops: one table, op type -> split function (:data:`SPLIT`).

- **offline optimisation** (``SessionOptions.optimized_model_filepath``; ORT_ENABLE_BASIC/EXTENDED):
  ``com.microsoft`` FusedConv, FusedGemm, FusedMatMul, Gelu, BiasGelu, FastGelu, QuickGelu and
  SkipLayerNormalization become Conv + activation, Gemm + activation, Transpose + MatMul, the Erf / tanh GELU
  forms, Add + LayerNormalization.
- **the transformer optimiser**: onnxruntime's fused transformer ops (``onnxruntime.transformers.optimizer.optimize_model``) split back into the
standard ops a TorchScript export writes, so that the attnlrp / cp-lrp patterns (softmax, products of two
activations, detached norm scales) apply and the explanation is the unoptimised export's.

Each op keeps the exact semantics of onnxruntime's CPU kernel
(checked against it on random inputs in tests/test_fused.py; BiasAdd / BiasSplitGelu, CUDA-only, against numpy):

- ``Attention`` (packed QKV projection): ``MatMul(x, W_q) + b_q`` (likewise K, V, with the weight and bias sliced
  as constants; ``qkv_hidden_sizes`` honoured) -> Reshape/Transpose to heads -> ``MatMul(q, k^T)`` -> ``Div`` by
  sqrt(head size) (or ``Mul`` by ``scale``) -> ``Add`` of the mask bias and of ``attention_bias`` -> ``Softmax``
  -> ``MatMul(p, v)`` -> Transpose/Reshape. ``mask_index`` of shape (B) (end positions), (2B) (end and start),
  (B, T) (0/1 mask) or (B, S, T) become an additive bias of 0 / ``mask_filter_value``, ``unidirectional`` puts
  the lowest float above the diagonal (as the kernel does); computed from the integer mask and shapes only (it
  carries no relevance).
- ``MultiHeadAttention`` with separate 3-D query, key and value (optional bias, ``key_padding_mask`` as above,
  ``attention_bias``, ``unidirectional``): the same from the projections on.
- ``GroupQueryAttention`` on a prompt without past state: the same, K/V heads repeated as LLaMA's ``repeat_kv``,
  causal (within ``local_window_size``), keys after ``seqlens_k`` masked.
- ``EmbedLayerNormalization``: Gathers of the word, position (``position_ids`` or 0..S-1) and segment embeddings,
  their sum, ``LayerNormalization``; its integer ``mask_index`` output is the number of ones per row of the mask
  (zeros without a mask), its ``embedding_sum`` output the sum before the norm.
- ``SkipSimplifiedLayerNormalization`` / ``SimplifiedLayerNormalization``: ``Add`` (input + skip (+ bias)) and the
  RMS norm as a TorchScript export writes it (``gamma * (x * (1 / sqrt(mean(x^2) + eps)))``), whose scale the rules
  detach (LXT). The optimiser writes SimplifiedLayerNormalization in the default domain; the loader moves it here.
- ``RotaryEmbedding``: HF's ``x * cos + rotate_half(x) * sin`` (or interleaved pairs), cos/sin gathered from the
  caches at the position ids.
- ``BiasAdd`` and ``BiasSplitGelu`` (diffusion models): ``x + bias + skip``; ``left * gelu(right)`` of the halves
  of ``x + bias``.

Refused with one line naming the node: past/present key-value state, rotary attention (``do_rotary``), packed
or 4-D/5-D query/key/value layouts of MultiHeadAttention, 4-D masks, non-constant projection weights or biases,
inputs of unknown rank. Refused before anything is rewritten (:class:`RefuseUnsupported`): onnxruntime's NCHWc
layout (``com.microsoft.nchwc`` ops, written by ORT_ENABLE_ALL on x86: save with ORT_ENABLE_EXTENDED instead), ORT's
weight-only block quantization (MatMulNBits, MatMulBnb4, GatherBlockQuantized), quantized fused transformer ops
(QAttention, QEmbedLayerNormalization, QOrderedMatMul), fused attention ops other than those split here
(PackedAttention, DecoderMaskedMultiHeadAttention, SparseAttention, ...), fused activations other than the standard
ONNX ones.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import onnx_ir as ir

from ...core import meta
from ..builder import MS, Builder, LoadPass, Report, attr, const, take_over


_INT64 = ir.DataType.INT64


class _Refuse(Exception):
    pass


class _RefuseAs(_Refuse):
    """Refused with this whole message (not prefixed by the op type)."""


class _Unknown(_Refuse):
    """A rank the split needs is not known yet (shapes are inferred again and the node retried)."""


def _used(v: ir.Value | None) -> bool:
    return v is not None and (bool(list(v.uses())) or v.is_graph_output())


def _opt(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if len(node.inputs) > i else None


def _rank(v: ir.Value) -> int:
    if v.shape is None:
        raise _Unknown(f"input {v.name} of unknown rank")
    return len(v.shape)


def _fdtype(v: ir.Value) -> np.dtype:
    return v.dtype.numpy() if v.dtype is not None and v.dtype.is_floating_point() else np.dtype(np.float32)


def _i64(b, values, tag="ints") -> ir.Value:
    return b.const(np.asarray(values, np.int64), tag)


def _set(v: ir.Value, dtype: ir.DataType, shape=None) -> ir.Value:
    v.type = ir.TensorType(dtype)
    if shape is not None:
        v.shape = ir.Shape(shape)
    return v


def _positions(b, x: ir.Value, axis: int, tag: str) -> ir.Value:
    """0, 1, ..., x.shape[axis]-1 as int64 (from the shape only)."""
    n = _set(b.op("Shape", [x], tag=f"{tag}_len", start=axis, end=axis + 1), _INT64, [1])
    n0 = _set(b.op("Squeeze", [n, _i64(b, [0], "axis0")], tag=f"{tag}_n"), _INT64, [])
    return _set(b.op("Range", [b.const(np.array(0, np.int64), "zero"), n0, b.const(np.array(1, np.int64), "one")],
                     tag=tag), _INT64)


def _mask_bias(b, mask: ir.Value | None, causal: bool, q: ir.Value, kv: ir.Value, filt: float,
               dtype: np.dtype) -> ir.Value | None:
    """The additive attention bias of onnxruntime's CPU kernel: 0 where a key may be attended, ``filt`` elsewhere,
    of shape (B or 1, 1, S or 1, T); from the integer mask and the shapes only (it carries no relevance)."""
    if mask is None and not causal:
        return None
    j = _positions(b, kv, 1, "key_pos")  # (T,)
    allowed = None
    if mask is not None:
        r = _rank(mask)
        m = mask
        if m.dtype is not None and m.dtype != _INT64:
            m = _set(b.op("Cast", [m], tag="mask_i64", to=_INT64.value), _INT64, None)
        if r == 1:  # (B): end positions; (2B): end positions then start positions
            n = mask.shape[0]
            bdim = q.shape[0] if q.shape is not None else None
            if meta.MASK_PER_ROW.get(mask):  # EmbedLayerNormalization's mask_index: one count per batch row
                two = False
            elif bdim is None:
                raise _Unknown(f"input {q.name} of unknown batch size")
            elif isinstance(n, int) and isinstance(bdim, int) and n in (bdim, 2 * bdim):
                two = n == 2 * bdim
            elif n is not None and bdim is not None and str(n) == str(bdim):
                two = False
            else:  # onnxruntime tells (B) from (2B) by the length at run time; we must know it when splitting
                raise _Refuse(f"a 1-D mask of length {n} for a batch of {bdim} (a (B) or (2B) mask whose length "
                              "is not known to be either)")
            m2 = _set(b.op("Reshape", [m, _i64(b, [2, -1, 1, 1, 1] if two else [-1, 1, 1, 1], "mask_shape")],
                           tag="mask_pos"), _INT64)
            if two:
                end = _set(b.op("Gather", [m2, b.const(np.array(0, np.int64), "i0")], axis=0, tag="end"), _INT64)
                start = _set(b.op("Gather", [m2, b.const(np.array(1, np.int64), "i1")], axis=0, tag="start"),
                             _INT64)
                lo = _set(b.op("GreaterOrEqual", [j, start], tag="after_start"), ir.DataType.BOOL)
                hi = _set(b.op("Less", [j, end], tag="before_end"), ir.DataType.BOOL)
                allowed = _set(b.op("And", [lo, hi], tag="in_range"), ir.DataType.BOOL)
            else:
                allowed = _set(b.op("Less", [j, m2], tag="before_end"), ir.DataType.BOOL)
        elif r in (2, 3):  # (B, T) / (B, S, T): 0 masks a key
            pos = _set(b.op("Greater", [m, b.const(np.array(0, np.int64), "zero")], tag="mask_on"), ir.DataType.BOOL)
            allowed = _set(b.op("Unsqueeze", [pos, _i64(b, [1, 2] if r == 2 else [1], "axes")], tag="mask_4d"),
                           ir.DataType.BOOL)
        else:
            raise _Refuse(f"a mask of rank {r} (only (B), (2B), (B, T) and (B, S, T) are supported)")
    dt = ir.DataType.from_numpy(dtype)
    bias = None
    if allowed is not None:
        bias = _set(b.op("Where", [allowed, b.const(np.array(0, dtype), "open"), b.const(np.array(filt, dtype),
                                                                                          "filter")],
                         tag="mask_bias"), dt)
    if causal:  # onnxruntime sets the lowest float above the diagonal, whatever mask_filter_value is
        i = _positions(b, q, 1, "query_pos")
        i2 = _set(b.op("Unsqueeze", [i, _i64(b, [1], "axes")], tag="query_col"), _INT64)
        c = _set(b.op("LessOrEqual", [j, i2], tag="causal"), ir.DataType.BOOL)  # (S, T)
        open_ = bias if bias is not None else b.const(np.array(0, dtype), "open")
        bias = _set(b.op("Where", [c, open_, b.const(np.array(np.finfo(dtype).min, dtype), "causal_filter")],
                         tag="causal_bias"), dt)
    return bias


def _heads(b, v: ir.Value, n: int, h: int, perm, tag: str) -> ir.Value:
    r = b.op("Reshape", [v, _i64(b, [0, 0, n, h], "heads_shape")], tag=f"{tag}_heads")
    return b.op("Transpose", [r], perm=list(perm), tag=f"{tag}_t")


def _attend(b, node, q, k, v, n, hq, hv, scale, bias, attn_bias, like) -> ir.Value:
    """softmax(q k^T * scale + bias) v over heads, as a TorchScript export writes it; q, k, v of shape (B, S, .)."""
    dt = _fdtype(node.inputs[0])  # constants in the model's float type (float32 once float16 is upcast)
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
    return b.op("Reshape", [ct, _i64(b, [0, 0, n * hv], "merge_shape")], like=like, tag="merged")


def _common_attrs(node):
    n = int(attr(node, "num_heads", 0) or 0)
    if n <= 0:
        raise _Refuse("num_heads is missing")
    if int(attr(node, "do_rotary", 0) or 0):
        raise _Refuse("rotary attention (do_rotary=1)")
    if int(attr(node, "past_present_share_buffer", 0) or 0):
        raise _Refuse("a shared past/present buffer (KV cache)")
    return n, float(attr(node, "scale", 0.0) or 0.0), bool(int(attr(node, "unidirectional", 0) or 0)), \
        float(attr(node, "mask_filter_value", -10000.0))


def _attention(b, node) -> ir.Value:
    n, scale, causal, filt = _common_attrs(node)
    x, w, bias, mask = (_opt(node, i) for i in range(4))
    if _opt(node, 4) is not None or _opt(node, 6) is not None or any(_used(o) for o in node.outputs[1:]):
        raise _Refuse("past/present key-value state (KV cache); optimise the model without past inputs")
    if x.shape is not None and len(x.shape) != 3:  # onnxruntime's kernel requires rank 3
        raise _Refuse(f"input of rank {len(x.shape)} (want (batch, sequence, hidden))")
    wv = const(w)
    bv = const(bias) if bias is not None else None
    if wv is None or (bias is not None and bv is None):
        raise _Refuse("its QKV weight or bias is not a constant")
    sizes = list(attr(node, "qkv_hidden_sizes", []) or [])
    if not sizes:
        if wv.shape[1] % 3:
            raise _Refuse(f"QKV weight of width {wv.shape[1]} (not three equal parts)")
        sizes = [wv.shape[1] // 3] * 3
    if len(sizes) != 3 or sum(sizes) != wv.shape[1] or sizes[0] != sizes[1] or sizes[0] % n or sizes[2] % n:
        raise _Refuse(f"qkv_hidden_sizes {sizes} do not fit weight {list(wv.shape)} and {n} heads")
    cuts = np.cumsum([0] + sizes)
    proj = []
    for i, tag in enumerate("qkv"):
        y = b.op("MatMul", [x, b.const(np.ascontiguousarray(wv[:, cuts[i]:cuts[i + 1]]), f"w_{tag}")], tag=tag)
        if bv is not None:
            y = b.op("Add", [y, b.const(np.ascontiguousarray(bv[cuts[i]:cuts[i + 1]]), f"b_{tag}")], tag=f"{tag}_b")
        proj.append(y)
    mb = _mask_bias(b, mask, causal, x, x, filt, _fdtype(x))
    return _attend(b, node, *proj, n, sizes[0] // n, sizes[2] // n, scale, mb, _opt(node, 5), node.outputs[0])


def _mha(b, node) -> ir.Value:
    n, scale, causal, filt = _common_attrs(node)
    q, k, v, bias, mask, attn_bias = (_opt(node, i) for i in range(6))
    if any(_opt(node, i) is not None for i in range(6, 10)) or any(_used(o) for o in node.outputs[1:]):
        raise _Refuse("past/present key-value state (KV cache); optimise the model without past inputs")
    if k is None or v is None or _rank(q) != 3 or _rank(k) != 3 or _rank(v) != 3:
        raise _Refuse("packed or 4-D/5-D query/key/value (only separate (batch, sequence, hidden) inputs are "
                      "supported)")
    dq, dk, dv = (t.shape[2] for t in (q, k, v))
    if not all(isinstance(d, int) for d in (dq, dk, dv)) or dq != dk or dq % n or dv % n:
        raise _Refuse(f"hidden sizes q {dq}, k {dk}, v {dv} do not fit {n} heads")
    if bias is not None:
        bv = const(bias)
        if bv is None or bv.shape != (dq + dk + dv,):
            raise _Refuse("its bias is not a constant of length q + k + v hidden sizes")
        cuts = np.cumsum([0, dq, dk, dv])
        q, k, v = (b.op("Add", [t, b.const(np.ascontiguousarray(bv[cuts[i]:cuts[i + 1]]), f"b_{tag}")],
                        tag=f"{tag}_b") for i, (t, tag) in enumerate(zip((q, k, v), "qkv")))
    mb = _mask_bias(b, mask, causal, node.inputs[0], node.inputs[1], filt, _fdtype(node.inputs[0]))
    return _attend(b, node, q, k, v, n, dq // n, dv // n, scale, mb, attn_bias, node.outputs[0])


def _gqa(b, node) -> ir.Value:
    """GroupQueryAttention on a prompt without past state: causal (within ``local_window_size``), keys after
    ``seqlens_k[b]`` (the last valid index) masked, K/V heads repeated to the query heads as LLaMA's ``repeat_kv``
    (Expand + Reshape); present_key / present_value are K and V in (B, N_kv, S, H)."""
    n, nkv = int(attr(node, "num_heads", 0) or 0), int(attr(node, "kv_num_heads", 0) or 0)
    if n <= 0 or nkv <= 0 or n % nkv:
        raise _Refuse(f"num_heads {n} and kv_num_heads {nkv}")
    q, k, v, past_k, past_v, seqlens = (_opt(node, i) for i in range(6))
    if past_k is not None or past_v is not None:
        raise _Refuse("past key/value state (KV cache); only a prompt without past inputs is supported")
    if int(attr(node, "do_rotary", 0) or 0):
        raise _Refuse("rotary embedding inside the op (do_rotary=1)")
    if float(attr(node, "softcap", 0.0) or 0.0) or int(attr(node, "smooth_softmax", 0) or 0) or \
            _opt(node, 11) is not None or (len(node.outputs) > 3 and _used(node.outputs[3])):
        raise _Refuse("softcap, smooth softmax, head sinks or the QK output")
    if seqlens is None:
        raise _Refuse("no seqlens_k input")
    d = q.shape[-1] if _rank(q) == 3 else None
    if not isinstance(d, int):
        raise _Refuse("a query of unknown hidden size")
    if k is None:  # packed (B, S, (N + 2 N_kv) H)
        h = d // (n + 2 * nkv)
        cuts = np.cumsum([0, n * h, nkv * h, nkv * h])
        q, k, v = (b.op("Slice", [q, _i64(b, [cuts[i]], "start"), _i64(b, [cuts[i + 1]], "end"),
                                  _i64(b, [-1], "axis")], tag=tag) for i, tag in enumerate("qkv"))
    else:
        h = d // n
    dt = _fdtype(node.inputs[0])
    qh = _heads(b, q, n, h, (0, 2, 1, 3), "q")
    kh = _heads(b, k, nkv, h, (0, 2, 1, 3), "k")  # (B, N_kv, S, H): present_key
    vh = _heads(b, v, nkv, h, (0, 2, 1, 3), "v")
    for o, t in zip(node.outputs[1:3], (kh, vh)):
        if _used(o):
            take_over(o, t)
    g = n // nkv
    if g > 1:
        kh, vh = (b.op("Reshape", [b.op("Expand", [b.op("Unsqueeze", [t, _i64(b, [2], "axes")], tag=f"{tag}_5d"),
                                                   _i64(b, [1, 1, g, 1, 1], "groups")], tag=f"{tag}_groups"),
                                   _i64(b, [0, n, -1, h], "heads_shape")], tag=f"{tag}_repeated")
                  for t, tag in ((kh, "k"), (vh, "v")))
    kt = b.op("Transpose", [kh], perm=[0, 1, 3, 2], tag="k_t")
    s = b.op("MatMul", [qh, kt], tag="scores")
    scale = float(attr(node, "scale", 0.0) or 0.0)
    if scale:
        s = b.op("Mul", [s, b.const(np.array(scale, dt), "scale")], tag="scaled")
    else:
        s = b.op("Div", [s, b.const(np.array(math.sqrt(h), dt), "sqrt_head")], tag="scaled")
    if _opt(node, 10) is not None:
        s = b.op("Add", [s, node.inputs[10]], tag="attention_bias")
    # the mask, from shapes and the integer seqlens_k only: causal, in the window, not after the last valid key
    j = _positions(b, q, 1, "key_pos")
    i2 = _set(b.op("Unsqueeze", [_positions(b, q, 1, "query_pos"), _i64(b, [1], "axes")], tag="query_col"), _INT64)
    allowed = _set(b.op("LessOrEqual", [j, i2], tag="causal"), ir.DataType.BOOL)
    window = int(attr(node, "local_window_size", -1))
    if window > 0:
        lo = _set(b.op("Sub", [i2, b.const(np.array(window, np.int64), "window")], tag="window_start"), _INT64)
        allowed = _set(b.op("And", [allowed, _set(b.op("Greater", [j, lo], tag="in_window"), ir.DataType.BOOL)],
                            tag="allowed"), ir.DataType.BOOL)
    last = _set(b.op("Reshape", [b.op("Cast", [seqlens], to=_INT64.value, tag="seqlens"),
                                 _i64(b, [-1, 1, 1, 1], "mask_shape")], tag="last_key"), _INT64)
    valid = _set(b.op("LessOrEqual", [j, last], tag="valid_key"), ir.DataType.BOOL)
    allowed = _set(b.op("And", [allowed, valid], tag="allowed"), ir.DataType.BOOL)
    bias = b.op("Where", [allowed, b.const(np.array(0, dt), "open"), b.const(np.array(np.finfo(dt).min, dt),
                                                                               "filter")], tag="mask_bias")
    s = b.op("Add", [s, bias], tag="masked")
    p = b.op("Softmax", [s], axis=-1, tag="probs")
    ctx = b.op("Transpose", [b.op("MatMul", [p, vh], tag="context")], perm=[0, 2, 1, 3], tag="context_t")
    return b.op("Reshape", [ctx, _i64(b, [0, 0, n * h], "merge_shape")], like=node.outputs[0], tag="merged")


def _embed_layer_norm(b, node) -> ir.Value:
    ids, seg, word, pos, seg_emb, gamma, beta, mask, pos_ids = (_opt(node, i) for i in range(9))
    if ids.shape is not None and len(ids.shape) != 2:  # onnxruntime's kernel requires rank 2
        raise _Refuse(f"input_ids of rank {len(ids.shape)} (want (batch, sequence))")
    out = node.outputs[0]
    e = b.op("Gather", [word, ids], axis=0, tag="word_embedding")
    if pos_ids is None:
        pos_ids = _positions(b, ids, 1, "positions")
    p = b.op("Gather", [pos, pos_ids], axis=0, tag="position_embedding")
    s = b.op("Add", [e, p], tag="embedding_sum", like=out)
    if seg is not None and seg_emb is not None:
        s = b.op("Add", [s, b.op("Gather", [seg_emb, seg], axis=0, tag="segment_embedding")], like=out,
                 tag="embedding_sum")
    y = b.op("LayerNormalization", [s, gamma] + ([beta] if beta is not None else []), axis=-1,
             epsilon=float(attr(node, "epsilon", 1e-12)), like=out, tag="layernorm")
    if len(node.outputs) > 1 and _used(node.outputs[1]):
        if mask is not None:  # the number of ones per row (onnxruntime's CPU kernel)
            ones = b.op("Equal", [mask, b.const(np.array(1, mask.dtype.numpy() if mask.dtype else np.int32), "one")],
                        tag="mask_one")
            cnt = b.op("Cast", [ones], to=ir.DataType.INT32.value, tag="mask_int")
            mi = b.op("ReduceSum", [cnt, _i64(b, [1], "axis1")], keepdims=0, tag="mask_index")
        else:
            bsz = b.op("Shape", [ids], start=0, end=1, tag="batch")
            mi = b.op("ConstantOfShape", [bsz], value=ir.tensor(np.zeros(1, np.int32)), tag="mask_index")
        _set(mi, ir.DataType.INT32, [ids.shape[0]] if ids.shape is not None else None)
        meta.MASK_PER_ROW.set(mi, True)
        take_over(node.outputs[1], mi)
    if len(node.outputs) > 2 and _used(node.outputs[2]):
        take_over(node.outputs[2], s)
    return y


def _rms_norm(b, s: ir.Value, gamma: ir.Value, axes: list, eps: float, out: ir.Value) -> ir.Value:
    """``gamma * (s * (1 / sqrt(mean(s^2) + eps)))`` as a TorchScript export writes RMSNorm (LLaMA)."""
    dt = _fdtype(s)
    sq = b.op("Pow", [s, b.const(np.array(2.0, dt), "two")], like=s, tag="square")
    if b.graph.opset_imports.get("", 17) >= 18:
        ms = b.op("ReduceMean", [sq, _i64(b, axes, "axes")], keepdims=1, tag="mean_square")
    else:
        ms = b.op("ReduceMean", [sq], axes=list(axes), keepdims=1, tag="mean_square")
    rms = b.op("Sqrt", [b.op("Add", [ms, b.const(np.array(eps, dt), "eps")], tag="var_eps")], tag="rms")
    inv = b.op("Div", [b.const(np.array(1.0, dt), "one"), rms], tag="inv_rms")
    y = b.op("Mul", [s, inv], like=s, tag="normed")
    return b.op("Mul", [gamma, y], like=out, tag="scaled")


def _skip_simplified(b, node) -> ir.Value:
    x, skip, gamma, bias = (_opt(node, i) for i in range(4))
    if any(_used(o) for o in node.outputs[1:3]):
        raise _Refuse("its mean / inverse-std outputs are used")
    s = b.op("Add", [x, skip], like=x, tag="skip_sum")
    if bias is not None:
        s = b.op("Add", [s, bias], like=x, tag="bias")
    if len(node.outputs) > 3 and _used(node.outputs[3]):
        take_over(node.outputs[3], s)
    return _rms_norm(b, s, gamma, [-1], float(attr(node, "epsilon", 1e-12)), node.outputs[0])


def _simplified(b, node) -> ir.Value:
    """SimplifiedLayerNormalization (written by the optimiser in the default domain; the loader moves it here)."""
    x, gamma = node.inputs[0], node.inputs[1]
    if any(_used(o) for o in node.outputs[1:]):
        raise _Refuse("its inverse-std output is used")
    axis = int(attr(node, "axis", -1))
    axes = [-1] if axis == -1 else list(range(axis % _rank(x), _rank(x)))
    return _rms_norm(b, x, gamma, axes, float(attr(node, "epsilon", 1e-5)), node.outputs[0])


def _rotary(b, node) -> ir.Value:
    """RotaryEmbedding as HF's ``x * cos + rotate_half(x) * sin`` (pairs for ``interleaved``); cos and sin are
    gathered from the caches at the position ids (no relevance: they come from shapes or integer inputs)."""
    x, pos, cos_c, sin_c = (_opt(node, i) for i in range(4))
    if int(attr(node, "is_packed_batching", 0) or 0):
        raise _Refuse("packed batching")
    if float(attr(node, "scale", 1.0) or 1.0) != 1.0:
        raise _Refuse("a scale other than 1")
    if cos_c is None or sin_c is None or cos_c.shape is None or not isinstance(cos_c.shape[-1], int):
        raise _Refuse("cos/sin caches of unknown width")
    half = cos_c.shape[-1]
    rd = int(attr(node, "rotary_embedding_dim", 0) or 0) or 2 * half
    if rd != 2 * half:
        raise _Refuse(f"rotary_embedding_dim {rd} for caches of width {half}")
    r = _rank(x)
    out = node.outputs[0]
    n = int(attr(node, "num_heads", 0) or 0)
    if r == 3:  # (B, S, N*H) -> (B, S, N, H)
        d = x.shape[2]
        if not isinstance(d, int):
            raise _Refuse("a 3-D input of unknown hidden size")
        n = n or d // rd
        if d % n:
            raise _Refuse(f"hidden size {d} for {n} heads")
        xh, head = b.op("Reshape", [x, _i64(b, [0, 0, n, d // n], "heads_shape")], tag="heads"), d // n
    elif r == 4:  # (B, N, S, H)
        xh, head = x, x.shape[3]
        if not isinstance(head, int):
            raise _Refuse("a 4-D input of unknown head size")
    else:
        raise _Refuse(f"an input of rank {r}")
    if pos is None or pos.shape is None or len(pos.shape) not in (1, 2):
        raise _Refuse("position_ids that are not (B, S) or (1)")
    if len(pos.shape) == 1:  # an offset: positions offset + 0..S-1
        seq = _positions(b, x, 1 if r == 3 else 2, "seq_pos")
        pos = _set(b.op("Add", [seq, b.op("Cast", [pos], to=_INT64.value, tag="offset")], tag="positions"), _INT64)
    cos = b.op("Gather", [cos_c, pos], axis=0, tag="cos")  # (B, S, rd/2) or (S, rd/2)
    sin = b.op("Gather", [sin_c, pos], axis=0, tag="sin")
    axis = -2 if r == 3 else -3  # the heads axis: (.., S, 1, rd) for (B, S, N, H); (.., 1, S, rd) for (B, N, S, H)
    xr = xh if rd == head else b.op("Slice", [xh, _i64(b, [0], "start"), _i64(b, [rd], "end"), _i64(b, [-1], "axis")],
                                    tag="x_rot")
    if int(attr(node, "interleaved", 0) or 0):  # pairs (2i, 2i+1) rotate by angle i
        c = b.op("Unsqueeze", [cos, _i64(b, [axis - 1, -1], "axes")], tag="c")
        sn = b.op("Unsqueeze", [sin, _i64(b, [axis - 1, -1], "axes")], tag="s")
        pairs = b.op("Reshape", [xr, _i64(b, [0, 0, 0, half, 2], "pairs_shape")], tag="pairs")
        e = b.op("Slice", [pairs, _i64(b, [0], "s0"), _i64(b, [1], "e0"), _i64(b, [-1], "ax")], tag="even")
        o = b.op("Slice", [pairs, _i64(b, [1], "s1"), _i64(b, [2], "e1"), _i64(b, [-1], "ax")], tag="odd")
        re = b.op("Sub", [b.op("Mul", [e, c], tag="ec"), b.op("Mul", [o, sn], tag="os")], tag="rot_even")
        ro = b.op("Add", [b.op("Mul", [o, c], tag="oc"), b.op("Mul", [e, sn], tag="es")], tag="rot_odd")
        y = b.op("Reshape", [b.op("Concat", [re, ro], axis=-1, tag="rot_pairs"), _i64(b, [0, 0, 0, rd], "rot_shape")],
                 tag="rotated")
    else:
        c = b.op("Unsqueeze", [b.op("Concat", [cos, cos], axis=-1, tag="cos_full"), _i64(b, [axis], "axes")],
                 tag="c")
        sn = b.op("Unsqueeze", [b.op("Concat", [sin, sin], axis=-1, tag="sin_full"), _i64(b, [axis], "axes")],
                  tag="s")
        x1 = b.op("Slice", [xr, _i64(b, [0], "s0"), _i64(b, [half], "e0"), _i64(b, [-1], "ax")], tag="x1")
        x2 = b.op("Slice", [xr, _i64(b, [half], "s1"), _i64(b, [rd], "e1"), _i64(b, [-1], "ax")], tag="x2")
        rot = b.op("Concat", [b.op("Neg", [x2], tag="neg_x2"), x1], axis=-1, tag="rotate_half")
        y = b.op("Add", [b.op("Mul", [xr, c], tag="x_cos"), b.op("Mul", [rot, sn], tag="rot_sin")], tag="rotated")
    if rd != head:
        rest = b.op("Slice", [xh, _i64(b, [rd], "start"), _i64(b, [head], "end"), _i64(b, [-1], "axis")],
                    tag="x_pass")
        y = b.op("Concat", [y, rest], axis=-1, tag="with_pass")
    if r == 3:
        y = b.op("Reshape", [y, _i64(b, [0, 0, -1], "merge_shape")], tag="merged")
    y.type, y.shape = out.type, out.shape
    return y


def _bias_add(b, node) -> ir.Value:
    """BiasAdd (diffusion models): ``x + bias + skip``."""
    x, bias, skip = node.inputs[:3]
    y = b.op("Add", [x, bias], like=x, tag="bias")
    return b.op("Add", [y, skip], like=x, tag="skip_sum")


def _bias_split_gelu(b, node) -> ir.Value:
    """BiasSplitGelu (diffusion models' GEGLU): ``left * gelu(right)`` of the halves of ``x + bias`` (last axis)."""
    x, bias = node.inputs[:2]
    width = x.shape[-1] if _rank(x) else None
    if not isinstance(width, int) or width % 2:
        raise _Refuse(f"an input of last dimension {width} (want a known even size)")
    h = b.op("Add", [x, bias], like=x, tag="bias")
    left = b.op("Slice", [h, _i64(b, [0], "s0"), _i64(b, [width // 2], "e0"), _i64(b, [-1], "ax")], tag="left")
    right = b.op("Slice", [h, _i64(b, [width // 2], "s1"), _i64(b, [width], "e1"), _i64(b, [-1], "ax")], tag="right")
    return b.op("Mul", [left, _gelu_erf(b, right, node.outputs[0])], like=node.outputs[0], tag="geglu")


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


def _activation(b: Builder, y: ir.Value, name: str, params: list, like: ir.Value) -> ir.Value:
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


def _gelu_erf(b: Builder, x: ir.Value, like: ir.Value) -> ir.Value:
    """x * 0.5 * (1 + erf(x / sqrt 2)): one self-product the pattern matcher recognises (gelu-erf)."""
    h = b.op("Div", [x, b.const(np.array(math.sqrt(2.0), np.float32), "sqrt2")], like=like)
    e = b.op("Erf", [h], like=like)
    p = b.op("Add", [e, b.const(np.array(1.0, np.float32), "one")], like=like)
    half = b.op("Mul", [p, b.const(np.array(0.5, np.float32), "half")], like=like)
    return b.op("Mul", [x, half], like=like)


def _gelu_tanh(b: Builder, x: ir.Value, like: ir.Value) -> ir.Value:
    cube = b.op("Pow", [x, b.const(np.array(3.0, np.float32), "three")], like=like)
    inner = b.op("Add", [x, b.op("Mul", [cube, b.const(np.array(0.044715, np.float32), "c")], like=like)],
                 like=like)
    t = b.op("Tanh", [b.op("Mul", [inner, b.const(np.array(math.sqrt(2 / math.pi), np.float32), "k")], like=like)],
             like=like)
    half = b.op("Mul", [b.op("Add", [t, b.const(np.array(1.0, np.float32), "one")], like=like),
                        b.const(np.array(0.5, np.float32), "half")], like=like)
    return b.op("Mul", [x, half], like=like)


# ---------------------------------------------------------------------------------------------- ORT_ENABLE_EXTENDED
_CONV_KEYS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _fused_activation(node) -> str:
    act = attr(node, "activation", "")
    act = act.decode() if isinstance(act, bytes) else act
    if act and act not in _ACTIVATIONS:
        raise _RefuseAs(f"fused activation {act} has no standard ONNX op")
    return act


def _fused_conv(b, node) -> ir.Value:
    """FusedConv: Conv (+ the residual Z) + activation."""
    out, act = node.outputs[0], _fused_activation(node)
    params = list(attr(node, "activation_params", []) or [])
    attrs = {k: node.attributes[k].value for k in _CONV_KEYS if k in node.attributes}
    y = b.op("Conv", list(node.inputs[:3]), like=out, tag="conv", **attrs)
    if len(node.inputs) > 3 and node.inputs[3] is not None:  # Z: the fused residual sum
        y = b.op("Add", [y, node.inputs[3]], like=out, tag="sum")
    return _activation(b, y, act, params, out) if act else y


def _fused_gemm(b, node) -> ir.Value:
    """FusedGemm: Gemm + activation."""
    out, act = node.outputs[0], _fused_activation(node)
    params = [attr(node, "activation_alpha"), attr(node, "activation_beta"), attr(node, "activation_gamma")]
    if act == "Selu":
        params = [params[0], params[2]]
    attrs = {k: node.attributes[k].value for k in ("alpha", "beta", "transA", "transB") if k in node.attributes}
    y = b.op("Gemm", list(node.inputs), like=out, tag="gemm", **attrs)
    return _activation(b, y, act, params, out) if act else y


def _fused_matmul(b, node) -> ir.Value:
    """FusedMatMul: Transpose (or a transposed constant) + MatMul (* alpha)."""
    out = node.outputs[0]
    if attr(node, "transBatchA", 0) or attr(node, "transBatchB", 0):
        raise _RefuseAs("FusedMatMul with transBatchA/transBatchB")
    xs = []
    for v, key in zip(node.inputs[:2], ("transA", "transB")):
        if attr(node, key, 0):
            c = const(v)
            if c is not None:
                v = b.const(np.swapaxes(c, -1, -2).copy(), "weight_t")
            elif v.shape is None:
                raise _Refuse("an input of unknown rank")
            else:
                r = len(v.shape)
                v = b.op("Transpose", [v], perm=list(range(r - 2)) + [r - 1, r - 2], tag="t")
        xs.append(v)
    alpha = float(attr(node, "alpha", 1.0))
    if alpha != 1.0 and const(xs[1]) is not None:
        xs[1] = b.const((const(xs[1]) * alpha).astype(const(xs[1]).dtype), "weight_scaled")
        alpha = 1.0
    y = b.op("MatMul", xs, like=out, tag="matmul")
    if alpha != 1.0:
        y = b.op("Mul", [y, b.const(np.array(alpha, np.float32), "alpha")], like=out)
    return y


def _gelu(b, node) -> ir.Value:
    """Gelu, BiasGelu (+ bias), FastGelu (the tanh form), QuickGelu (x * sigmoid(alpha x))."""
    t, out = node.op_type, node.outputs[0]
    x = node.inputs[0]
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        x = b.op("Add", [x, node.inputs[1]], like=out, tag="bias")
    if t == "QuickGelu":
        alpha = float(attr(node, "alpha", 1.702))
        s = b.op("Sigmoid", [b.op("Mul", [x, b.const(np.array(alpha, np.float32), "alpha")], like=out)], like=out)
        return b.op("Mul", [x, s], like=out)
    return _gelu_tanh(b, x, out) if t == "FastGelu" else _gelu_erf(b, x, out)


def _skip_layer_norm(b, node) -> ir.Value:
    """SkipLayerNormalization: Add (input + skip (+ bias)) + LayerNormalization; its sum output is the Add."""
    out = node.outputs[0]
    if any(list(o.uses()) or o.is_graph_output() for o in node.outputs[1:3]):
        raise _RefuseAs("its mean / inverse-std outputs are used")
    ins = list(node.inputs) + [None] * 5
    s = b.op("Add", [ins[0], ins[1]], like=ins[0], tag="skip_sum")
    if ins[4] is not None:
        s = b.op("Add", [s, ins[4]], like=ins[0], tag="bias")
    ln_in = [s, ins[2]] + ([ins[3]] if ins[3] is not None else [])
    y = b.op("LayerNormalization", ln_in, like=out, tag="layernorm", axis=-1,
             epsilon=float(attr(node, "epsilon", 1e-12)))
    if len(node.outputs) > 3 and (list(node.outputs[3].uses()) or node.outputs[3].is_graph_output()):
        take_over(node.outputs[3], s)
    return y


# ---------------------------------------------------------------------------------------------- the table
# op type (com.microsoft) -> (split function, detach: the fused node is removed with its inputs' uses dropped)
SPLIT: dict[str, tuple[Callable, bool]] = {
    **{t: (_fused_conv if t == "FusedConv" else _fused_gemm, True) for t in ("FusedConv", "FusedGemm")},
    "FusedMatMul": (_fused_matmul, True), "SkipLayerNormalization": (_skip_layer_norm, True),
    **{t: (_gelu, True) for t in ("Gelu", "BiasGelu", "FastGelu", "QuickGelu")},
    "Attention": (_attention, False), "MultiHeadAttention": (_mha, False),
    "EmbedLayerNormalization": (_embed_layer_norm, False),
    "SkipSimplifiedLayerNormalization": (_skip_simplified, False),
    "SimplifiedLayerNormalization": (_simplified, False), "RotaryEmbedding": (_rotary, False),
    "BiasAdd": (_bias_add, False), "BiasSplitGelu": (_bias_split_gelu, False), "GroupQueryAttention": (_gqa, False),
}
HANDLED = tuple(SPLIT)


class RefuseUnsupported(LoadPass):
    """Changes nothing: refuses the onnxruntime forms that cannot be brought back (NCHWc layout, the ops of
    :data:`_REFUSED_MS`)."""

    def apply(self, model: ir.Model, report: Report) -> int:
        for node in model.graph:
            if node.domain == "com.microsoft.nchwc":
                report.refuse([(node, "onnxruntime NCHWc layout (ORT_ENABLE_ALL); save the optimised model with "
                                      "ORT_ENABLE_EXTENDED, or use the model before optimisation")])
            elif node.domain == MS and node.op_type in _REFUSED_MS:
                report.refuse([(node, _REFUSED_MS[node.op_type])])
        return 0


class SplitFused(LoadPass):
    """Every op of :data:`SPLIT` split into standard ops. A node whose split needs a rank that is not known yet (the
    optimiser writes no shapes after its contrib ops) is retried after ``reinfer(model)`` (shape inference over
    what was split so far)."""

    def __init__(self, reinfer: Callable[[ir.Model], None]):
        super().__init__()
        self.reinfer = reinfer

    def apply(self, model: ir.Model, report: Report) -> int:
        done = 0
        while True:
            n, refused, unknown = _split_pass(model.graph)
            done += n
            if not unknown or not n:
                report.refuse(refused + unknown)
                report.note(done, "split {n} onnxruntime fused op(s) into standard ops")
                return done
            self.reinfer(model)  # the refusals of this round are found again in the next


def _split_pass(graph: ir.Graph) -> tuple[int, list, list]:
    done, refused, unknown = 0, [], []
    for node in list(graph):
        if node.domain != MS or node.op_type not in SPLIT:
            continue
        split, detach = SPLIT[node.op_type]
        b = Builder(graph, node)
        try:
            y = split(b, node)
        except _Refuse as why:
            b.undo()
            msg = str(why) if isinstance(why, _RefuseAs) else f"{node.op_type} with {why}"
            (unknown if isinstance(why, _Unknown) else refused).append((node, msg))
            continue
        take_over(node.outputs[0], y)
        graph.remove(node, safe=detach)
        done += 1
    return done, refused, unknown


__all__ = ["HANDLED", "SPLIT", "RefuseUnsupported", "SplitFused"]
