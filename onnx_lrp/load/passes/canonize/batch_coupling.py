"""Batch statistics written by hand: a reduction over the batch axis whose result returns to the items is marked
(its op check refuses it: per-item relevance is not defined)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ....core import meta
from ...builder import const


def _reduced_axes(node: ir.Node, rank: int) -> set[int] | None:
    """The axes a Reduce* node reduces (None when not constant)."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = const(node.inputs[1])
        if axes is None:
            return None
        axes = [int(a) for a in np.asarray(axes).reshape(-1)]
    else:
        axes = list(node.attributes.get_ints("axes", []))
    if not axes:
        return set() if node.attributes.get_int("noop_with_empty_axes", 0) else set(range(rank))
    return {a % rank for a in axes}


def mark_batch_coupling(graph: ir.Graph) -> int:
    """A reduction over the batch axis (a dimension named like a graph input's first one) whose result comes back
    into the items (a value computed from it has that batch dimension again: ``h - h.mean(axis=0)``, batch
    statistics written by hand) makes every item's output depend on the other items: its relevance would leak
    across items. The reduction is marked (``node.meta['lrp_couples_items']``) and its op check refuses it.
    A reduction whose result never returns to the items (an output explained as one whole) is not marked."""
    batch = {d.value for v in graph.inputs if v.shape is not None and len(v.shape) > 0
             for d in [v.shape[0]] if isinstance(d, ir.SymbolicDim) and d.value}
    if not batch:
        return 0
    origin: dict[int, ir.Node] = {}  # value id -> the batch reduction it is computed from
    marked = 0
    for node in graph:
        if node.op_type.startswith("Reduce") and node.domain in ("", "ai.onnx") and node.inputs \
                and node.inputs[0] is not None and node.inputs[0].shape is not None and len(node.inputs[0].shape):
            x = node.inputs[0]
            d0 = x.shape[0]
            axes = _reduced_axes(node, len(x.shape))
            if isinstance(d0, ir.SymbolicDim) and d0.value in batch and axes is not None and 0 in axes:
                for o in node.outputs:
                    origin[id(o)] = node
                continue
        src = next((origin[id(v)] for v in node.inputs if v is not None and id(v) in origin), None)
        if src is None:
            continue
        for o in node.outputs:
            origin[id(o)] = src
            d0 = o.shape[0] if o.shape is not None and len(o.shape) else None
            if isinstance(d0, ir.SymbolicDim) and d0.value in batch and not meta.COUPLES_ITEMS.has(src):
                meta.COUPLES_ITEMS.set(src, (
                    f"reduces over the batch axis ('{d0.value}', axis 0) and its result returns to the items at "
                    f"{node.name} ({node.op_type}): each item's output depends on the other items (batch "
                    "statistics), so per-item relevance is not defined; export the model in eval mode (running "
                    "statistics), or fix the batch to 1 (input_shapes / --input-shape) to explain one item at a time"))
                marked += 1
    return marked
