"""onnxruntime's fused normalisations split into standard ops: ``EmbedLayerNormalization`` (embeddings, their sum,
LayerNormalization), ``SkipLayerNormalization`` (Add + LayerNormalization) and the simplified (RMS) norms as a
TorchScript export writes LLaMA's RMSNorm."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ....core import meta
from ...builder import attr, take_over
from .split_tools import Refuse, RefuseAs, fdtype, i64, opt, positions, rank, typed, used


def embed_layer_norm(b, node) -> ir.Value:
    ids, seg, word, pos, seg_emb, gamma, beta, mask, pos_ids = (opt(node, i) for i in range(9))
    if ids.shape is not None and len(ids.shape) != 2:  # onnxruntime's kernel requires rank 2
        raise Refuse(f"input_ids of rank {len(ids.shape)} (want (batch, sequence))")
    out = node.outputs[0]
    e = b.op("Gather", [word, ids], axis=0, tag="word_embedding")
    if pos_ids is None:
        pos_ids = positions(b, ids, 1, "positions")
    p = b.op("Gather", [pos, pos_ids], axis=0, tag="position_embedding")
    s = b.op("Add", [e, p], tag="embedding_sum", like=out)
    if seg is not None and seg_emb is not None:
        s = b.op("Add", [s, b.op("Gather", [seg_emb, seg], axis=0, tag="segment_embedding")], like=out,
                 tag="embedding_sum")
    y = b.op("LayerNormalization", [s, gamma] + ([beta] if beta is not None else []), axis=-1,
             epsilon=float(attr(node, "epsilon", 1e-12)), like=out, tag="layernorm")
    if len(node.outputs) > 1 and used(node.outputs[1]):
        if mask is not None:  # the number of ones per row (onnxruntime's CPU kernel)
            ones = b.op("Equal", [mask, b.const(np.array(1, mask.dtype.numpy() if mask.dtype else np.int32), "one")],
                        tag="mask_one")
            cnt = b.op("Cast", [ones], to=ir.DataType.INT32.value, tag="mask_int")
            mi = b.op("ReduceSum", [cnt, i64(b, [1], "axis1")], keepdims=0, tag="mask_index")
        else:
            bsz = b.op("Shape", [ids], start=0, end=1, tag="batch")
            mi = b.op("ConstantOfShape", [bsz], value=ir.tensor(np.zeros(1, np.int32)), tag="mask_index")
        typed(mi, ir.DataType.INT32, [ids.shape[0]] if ids.shape is not None else None)
        meta.MASK_PER_ROW.set(mi, True)
        take_over(node.outputs[1], mi)
    if len(node.outputs) > 2 and used(node.outputs[2]):
        take_over(node.outputs[2], s)
    return y


def _rms_norm(b, s: ir.Value, gamma: ir.Value, axes: list, eps: float, out: ir.Value) -> ir.Value:
    """``gamma * (s * (1 / sqrt(mean(s^2) + eps)))`` as a TorchScript export writes RMSNorm (LLaMA)."""
    dt = fdtype(s)
    sq = b.op("Pow", [s, b.const(np.array(2.0, dt), "two")], like=s, tag="square")
    if b.graph.opset_imports.get("", 17) >= 18:
        ms = b.op("ReduceMean", [sq, i64(b, axes, "axes")], keepdims=1, tag="mean_square")
    else:
        ms = b.op("ReduceMean", [sq], axes=list(axes), keepdims=1, tag="mean_square")
    rms = b.op("Sqrt", [b.op("Add", [ms, b.const(np.array(eps, dt), "eps")], tag="var_eps")], tag="rms")
    inv = b.op("Div", [b.const(np.array(1.0, dt), "one"), rms], tag="inv_rms")
    y = b.op("Mul", [s, inv], like=s, tag="normed")
    return b.op("Mul", [gamma, y], like=out, tag="scaled")


def skip_simplified(b, node) -> ir.Value:
    x, skip, gamma, bias = (opt(node, i) for i in range(4))
    if any(used(o) for o in node.outputs[1:3]):
        raise Refuse("its mean / inverse-std outputs are used")
    s = b.op("Add", [x, skip], like=x, tag="skip_sum")
    if bias is not None:
        s = b.op("Add", [s, bias], like=x, tag="bias")
    if len(node.outputs) > 3 and used(node.outputs[3]):
        take_over(node.outputs[3], s)
    return _rms_norm(b, s, gamma, [-1], float(attr(node, "epsilon", 1e-12)), node.outputs[0])


def simplified(b, node) -> ir.Value:
    """SimplifiedLayerNormalization (written by the optimiser in the default domain; the loader moves it here)."""
    x, gamma = node.inputs[0], node.inputs[1]
    if any(used(o) for o in node.outputs[1:]):
        raise Refuse("its inverse-std output is used")
    axis = int(attr(node, "axis", -1))
    axes = [-1] if axis == -1 else list(range(axis % rank(x), rank(x)))
    return _rms_norm(b, x, gamma, axes, float(attr(node, "epsilon", 1e-5)), node.outputs[0])


def skip_layer_norm(b, node) -> ir.Value:
    """SkipLayerNormalization: Add (input + skip (+ bias)) + LayerNormalization; its sum output is the Add."""
    out = node.outputs[0]
    if any(list(o.uses()) or o.is_graph_output() for o in node.outputs[1:3]):
        raise RefuseAs("its mean / inverse-std outputs are used")
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
