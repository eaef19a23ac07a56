"""onnxruntime's fused ops split back into standard ops: one table, op type -> split function (:data:`SPLIT`); the
splits live in :mod:`.attention` (Attention, MultiHeadAttention, GroupQueryAttention, RotaryEmbedding), :mod:`.norms`
(the fused layer norms) and :mod:`.fused_layers` (fused Conv / Gemm / MatMul, the GELU family, BiasAdd), sharing
:mod:`.split_tools`.

- **offline optimisation** (``SessionOptions.optimized_model_filepath``; ORT_ENABLE_BASIC/EXTENDED):
  ``com.microsoft`` FusedConv, FusedGemm, FusedMatMul, Gelu, BiasGelu, FastGelu, QuickGelu and
  SkipLayerNormalization become Conv + activation, Gemm + activation, Transpose + MatMul, the Erf / tanh GELU
  forms, Add + LayerNormalization.
- **the transformer optimiser**: onnxruntime's fused transformer ops
  (``onnxruntime.transformers.optimizer.optimize_model``) split back into the standard ops a TorchScript export
  writes, so that the attnlrp / cp-lrp patterns (softmax, products of two activations, detached norm scales) apply
  and the explanation is the unoptimised export's.

Each op keeps the exact semantics of onnxruntime's CPU kernel
(checked against it on random inputs in tests/load/test_fused.py; BiasAdd / BiasSplitGelu, CUDA-only, against numpy):

- ``Attention`` (packed QKV projection): ``MatMul(x, W_q) + b_q`` (likewise K, V, with the weight and bias sliced
  as constants; ``qkv_hidden_sizes`` honoured) -> Reshape/Transpose to heads -> ``MatMul(q, k^T)`` -> ``Div`` by
  sqrt(head size) (or ``Mul`` by ``scale``) -> ``Add`` of the mask bias and of ``attention_bias`` -> ``Softmax``
  -> ``MatMul(p, v)`` -> Transpose/Reshape. ``mask_index`` of shape (B) (end positions), (2B) (end and start),
  (B, T) (0/1 mask) or (B, S, T) become an additive bias of 0 / ``mask_filter_value``, ``unidirectional`` puts
  the lowest float above the diagonal (as the kernel does); computed from the integer mask and shapes only (it
  carries no relevance).
- ``MultiHeadAttention`` with separate 3-D query, key and value (optional bias, ``key_padding_mask`` as above,
  ``attention_bias``, ``unidirectional``): the same from the projections on.
- ``GroupQueryAttention`` on a prompt (past state absent, or past graph inputs fed empty by
  :mod:`..past_state`) or after a given past (put before the new K/V, the mask and rotary positions offset): the same, K/V heads repeated as LLaMA's ``repeat_kv``, causal (within
  ``local_window_size``), keys after ``seqlens_k`` masked, packed QKV sliced; ``do_rotary`` rotates q and k by the
  cos/sin caches at ``position_ids`` (or 0..S-1), ``rotary_interleaved`` and partial rotary as ``RotaryEmbedding``.
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

Refused with one line naming the node: past key-value state given to Attention / MultiHeadAttention, rotary attention (``do_rotary``) of
Attention / MultiHeadAttention, packed
or 4-D/5-D query/key/value layouts of MultiHeadAttention, 4-D masks, non-constant projection weights or biases,
inputs of unknown rank. Refused before anything is rewritten (:class:`RefuseUnsupported`): onnxruntime's NCHWc
layout (``com.microsoft.nchwc`` ops, written by ORT_ENABLE_ALL on x86: save with ORT_ENABLE_EXTENDED instead),
bitsandbytes' 4-bit MatMulBnb4 (MatMulNBits and GatherBlockQuantized are :mod:`..block_quant`'s), quantized fused
transformer ops (QAttention, QEmbedLayerNormalization, QOrderedMatMul), fused attention ops other than those split here
(PackedAttention, DecoderMaskedMultiHeadAttention, SparseAttention, ...), fused activations other than the standard
ONNX ones.
"""
from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from ...builder import MS, Builder, LoadPass, Report, take_over
from .attention import attention, gqa, mha, rotary
from .fused_layers import bias_add, bias_split_gelu, fused_conv, fused_gemm, fused_matmul, gelu
from .norms import embed_layer_norm, simplified, skip_layer_norm, skip_simplified
from .split_tools import Refuse, RefuseAs, Unknown


# known deployed forms that cannot be brought back (op type -> why); matched in the com.microsoft domain
_REFUSED_MS = {
    **{t: "quantized fused transformer op with no float counterpart here; quantize the float model with "
          "QuantFormat.QDQ instead" for t in ("QAttention", "QEmbedLayerNormalization", "QOrderedMatMul")},
    "MatMulBnb4": "bitsandbytes' 4-bit weights (NF4 / FP4); quantize with MatMulNBits (int4) or QDQ instead",
    **{t: "onnxruntime's fused attention/embedding op; export the model without ORT's transformer optimiser"
       for t in ("PackedAttention", "PackedMultiHeadAttention", "DecoderAttention",
                 "DecoderMaskedMultiHeadAttention", "SparseAttention", "LongformerAttention")},
}


# ---------------------------------------------------------------------------------------------- the table
# op type (com.microsoft) -> (split function, detach: the fused node is removed with its inputs' uses dropped)
SPLIT: dict[str, tuple[Callable, bool]] = {
    **{t: (fused_conv if t == "FusedConv" else fused_gemm, True) for t in ("FusedConv", "FusedGemm")},
    "FusedMatMul": (fused_matmul, True), "SkipLayerNormalization": (skip_layer_norm, True),
    **{t: (gelu, True) for t in ("Gelu", "BiasGelu", "FastGelu", "QuickGelu")},
    "Attention": (attention, False), "MultiHeadAttention": (mha, False),
    "EmbedLayerNormalization": (embed_layer_norm, False),
    "SkipSimplifiedLayerNormalization": (skip_simplified, False),
    "SimplifiedLayerNormalization": (simplified, False), "RotaryEmbedding": (rotary, False),
    "BiasAdd": (bias_add, False), "BiasSplitGelu": (bias_split_gelu, False), "GroupQueryAttention": (gqa, False),
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
        except Refuse as why:
            b.undo()
            msg = str(why) if isinstance(why, RefuseAs) else f"{node.op_type} with {why}"
            (unknown if isinstance(why, Unknown) else refused).append((node, msg))
            continue
        take_over(node.outputs[0], y)
        graph.remove(node, safe=detach)
        done += 1
    return done, refused, unknown


__all__ = ["HANDLED", "SPLIT", "RefuseUnsupported", "SplitFused"]
