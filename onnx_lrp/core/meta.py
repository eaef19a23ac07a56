"""The facts the loader leaves on nodes and values for the rewriter (and one pass for a later one), as typed keys of
onnx_ir's ``meta`` stores: every key onnx-lrp writes is one constant here, with what it means and who writes it.

    BIAS.set(node, b)        # the loader folds a bias Add into the layer before it
    if BIAS.has(node): b = BIAS.get(node)

``meta`` is onnx_ir's per-object store (``ir.Node.meta``, ``ir.Value.meta``, ``ir.Model.meta``); it is never
serialised, so none of this reaches the relevance model's file.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar


if TYPE_CHECKING:
    import numpy as np
    import onnx_ir as ir

T = TypeVar("T")


class Key(Generic[T]):
    """One meta key: ``name`` is the string stored, ``doc`` what it means."""

    __slots__ = ("name", "doc")

    def __init__(self, name: str, doc: str):
        self.name, self.doc = name, doc

    def get(self, holder, default: T | None = None) -> T | None:
        """The fact on ``holder`` (a node, value or model), or ``default``."""
        return holder.meta.get(self.name, default)

    def has(self, holder) -> bool:
        return self.name in holder.meta

    def set(self, holder, value: T) -> None:
        holder.meta[self.name] = value

    def clear(self, holder) -> None:
        holder.meta.pop(self.name, None)

    def __repr__(self) -> str:
        return f"meta.Key({self.name!r})"


# ---------------------------------------------------------------------------------------------- values
#: a value computed from the inputs' shapes alone (masks, positions from a dynamic length): carries no relevance
#: (written by load.fold.mark_shape_only and the dynamic-quantization pass; read by core.graph.carries)
SHAPE_ONLY: Key[bool] = Key("lrp_shape_only", "computed from shapes alone: carries no relevance")
#: a value of unknown dtype computed from a relevance-carrying value (a custom-domain op): presumed to carry
#: (core.graph.mark_presumed)
PRESUMED_CARRY: Key[bool] = Key("lrp_presumed_carry", "unknown dtype, computed from a carrying value: carries")
#: a 1-D attention mask of one entry per batch row (onnxruntime's mask_index), between two steps of ort_fused
MASK_PER_ROW: Key[bool] = Key("lrp_mask_per_row", "a mask with one count per batch row")

#: a weight computed from block-quantized constants at rest (4- / 8-bit, DequantizeLinear with block_size): a
#: parameter whose float value this function returns (written by load.passes.block_quant; read by core.graph's
#: is_param / const)
PACKED_WEIGHT: "Key[Any]" = Key("lrp_packed_weight", "a weight dequantized at run time; its float value: call")

# ---------------------------------------------------------------------------------------------- nodes (canonizers)
#: on a linear layer: the bias of the Add after it, folded in (so that z+ / gamma / alpha-beta see one layer
#: ``x W + b``); written by load.passes.canonize, read by the linear ops
BIAS: "Key[np.ndarray]" = Key("lrp_bias", "the folded bias of the Add after this layer")
#: on a linear layer: that Add node (its output is the layer's output z)
BIAS_ADD: "Key[ir.Node]" = Key("lrp_bias_add", "the Add whose bias this layer absorbed")
#: on that Add: the layer that absorbed its bias (the Add then passes relevance on unchanged)
ABSORBED_BY: "Key[ir.Node]" = Key("lrp_absorbed_by", "the layer that absorbed this Add's bias")
#: on an element-wise affine Mul / Add per channel: the channel axis (the op is then of kind "batchnorm")
CHANNEL_AFFINE: Key[int] = Key("lrp_channel_affine", "a per-channel affine op on this axis")
#: on a reduction over the batch axis (batch statistics): why it couples the items (its op check refuses it)
COUPLES_ITEMS: Key[str] = Key("lrp_couples_items", "reduces over the batch axis: refused, with this reason")
#: on a Loop / Scan / If left in the graph: why it could not be made static (the rewriter's refusal)
CONTROL_FLOW_REASON: Key[str] = Key("lrp_control", "why this control-flow node stays")

#: on a node that dequantizes weights at rest (block_quant): constant folding leaves it (the weights stay 4-bit)
KEEP_PACKED: Key[bool] = Key("lrp_keep_packed", "dequantizes packed weights at run time: not folded")

# ---------------------------------------------------------------------------------------------- nodes (patterns)
#: on the node that heads a recognised pattern (lrp.patterns: a held scale, a gate, a non-linearity of one input)
PATTERN: Key[Any] = Key("lrp_pattern", "the pattern match this node heads")
#: on a node inside a recognised pattern: the pattern's name (it gets no relevance of its own)
INSIDE: Key[str] = Key("lrp_inside", "inside a recognised pattern of this name")
#: on a normalisation: its inverse scale emitted once per relevance graph, (emitter, value)
INV_SCALE: Key[tuple] = Key("lrp_inv_scale", "(emitter, value) of the inverse scale, emitted once")

# ---------------------------------------------------------------------------------------------- the model
#: on the loaded model: one line per deployed form brought back to float ops (int8, float16, fused ops)
DEPLOYED_FORMS: "Key[list[str]]" = Key("lrp_deployed", "what the loader undid of the deployed form")
#: on the loaded model: the past key/value inputs fed empty, name -> their dims (0 on the sequence axis, 1 for the
#: batch): what the deployed model is fed (load.passes.past_state; building.stages.deployed_model)
EMPTY_PAST: "Key[dict]" = Key("lrp_empty_past", "past inputs fed empty: name -> dims (batch 1)")

KEYS = (SHAPE_ONLY, PRESUMED_CARRY, MASK_PER_ROW, PACKED_WEIGHT, KEEP_PACKED, BIAS, BIAS_ADD, ABSORBED_BY,
        CHANNEL_AFFINE, COUPLES_ITEMS, CONTROL_FLOW_REASON, PATTERN, INSIDE, INV_SCALE, DEPLOYED_FORMS, EMPTY_PAST)

__all__ = ["Key", "KEYS"] + [k for k, v in dict(globals()).items() if isinstance(v, Key)]
