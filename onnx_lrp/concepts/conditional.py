"""Concept-conditional heatmaps of one item (CRP): the relevance at the input conditioned on K concepts (channel
groups, or masks) of a layer, with or without the relevance that bypasses the layer (``exclude_parallel``)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..core.brief import brief_repr
from ..core.errors import InputError
from ..core.interface import RELEVANCE_PREFIX
from .running import ConceptOptions, channel_axis_of, run_masked, run_seeded, shares_of, upper_pass


def parse_concepts(concepts, shares: np.ndarray, channels: int) -> list[list[int]]:
    """``"top:K"`` (the K channels with the largest shares, descending), an int, a list of ints (one concept
    each) or a list of lists (channels summed into one concept)."""
    if isinstance(concepts, str):
        m = re.fullmatch(r"top:(\d+)", concepts.strip())
        if not m or int(m.group(1)) < 1:
            raise InputError(f"concepts must be 'top:K' (K >= 1) or a list of channel lists, not {concepts!r}")
        k = min(int(m.group(1)), channels)
        return [[int(c)] for c in np.argsort(-shares, kind="stable")[:k]]
    if isinstance(concepts, (int, np.integer)) and not isinstance(concepts, bool):
        concepts = [[concepts]]
    try:
        groups = [[c] if isinstance(c, (int, np.integer)) else list(c) for c in concepts]
    except TypeError:
        raise InputError(f"concepts must be 'top:K' or a list of channel lists, not {concepts!r}") from None
    if not groups or any(not g for g in groups):
        raise InputError("concepts must name at least one channel per concept")
    for g in groups:
        for c in g:
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= int(c) < channels:
                raise InputError(f"channel {c!r} out of range: the layer has {channels} channels (0..{channels - 1})")
    return [[int(c) for c in g] for g in groups]


def channel_masks(groups: list[list[int]], shape: tuple, axis: int, dtype=np.float32) -> np.ndarray:
    """K masks broadcastable against a batch of the layer: ones at the concept's channels along ``axis``."""
    dims = [len(groups)] + [1] * (len(shape) - 1)
    dims[axis] = shape[axis]
    masks = np.zeros(dims, dtype=dtype)
    for k, g in enumerate(groups):
        idx = [k] + [0] * (len(shape) - 1)
        for c in g:
            idx[axis] = c
            masks[tuple(idx)] = 1
    return masks


def given_masks(masks: np.ndarray, shape: tuple, layer: str) -> np.ndarray:
    """Float masks K x (the layer's item shape, any axis 1 to broadcast): single neurons, regions, weights."""
    item = tuple(shape[1:])
    if masks.ndim != len(shape) or len(masks) < 1 or any(m not in (1, d) for m, d in zip(masks.shape[1:], item)):
        raise InputError(f"concept masks of shape {list(masks.shape)} do not fit {layer!r} (one item "
                         f"{'x'.join(map(str, item))}): give K x {'x'.join(map(str, item))}, axes of size 1 broadcast")
    if not np.all(np.isfinite(masks)):
        raise InputError("concept masks contain NaN or Inf")
    return masks


@dataclass(repr=False)
class ConceptExplanation:
    """What ``Explainer.explain_concepts`` returns for one item and K concepts.

    ``heatmaps``: K x the input item's shape (the relevance at the input conditioned on each concept);
    ``relevance_at``: by tensor name, K x that tensor's item shape (the conditioned layer itself: its relevance
    times each concept's mask); ``concepts``: the channels of each concept (None for masks given as an array);
    ``shares``: each concept's share of the relevance at the layer (its channels' shares summed; for given masks
    the masked relevance's sum over the absolute channel sums); ``channel_shares``: every channel's share (C);
    ``target``, ``logit``: the explained class and its value.
    """

    layer: str
    concepts: list
    heatmaps: np.ndarray
    relevance_at: dict
    shares: np.ndarray
    channel_shares: np.ndarray
    target: int
    logit: float
    exclude_parallel: bool = True
    init: str = "logit"
    x: np.ndarray | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return brief_repr(self, ["layer", "concepts", "heatmaps", "shares", "target", "logit", "relevance_at"])


def explain_concepts(ex, x, target=None, layer=None, concepts="top:6",
                     options: ConceptOptions = ConceptOptions()) -> ConceptExplanation:
    """Conditional heatmaps of one item for K concepts at ``layer`` (see :class:`ConceptExplanation`).

    ``concepts``: ``"top:K"``, channel lists (``[[35], [71, 2]]``), or a float array of K masks shaped like one item
    of the layer (axes of size 1 broadcast: ``K x C x 1 x 1`` per channel, ``K x C x H x W`` single neurons)."""
    record, init, batch_size = options.record, options.init, options.batch_size
    exclude_parallel = options.exclude_parallel
    up = upper_pass(ex, x, target, layer, init)
    if len(up["x"]) != 1:
        raise InputError(f"explain_concepts explains one item; got a batch of {len(up['x'])} (use concept_relevance "
                         "for shares of a batch)")
    rel, act = up["relevance"], up["activation"]
    axis = channel_axis_of(options.channel_axis, rel.ndim)
    channel_shares = shares_of(rel, axis)[0]
    groups, masks, shares = _concept_masks(concepts, rel, axis, channel_shares, layer)
    below = tuple(r for r in record if r != layer)
    base = act if init == "activation" else rel
    if init == "activation" or exclude_parallel:
        out = run_seeded(ex, layer, up["x"], up["input"], base * masks, below, batch_size)
    else:
        out = run_masked(ex, {layer: masks}, up, int(up["target"][0]), len(groups), below,
                         "one-hot" if init == "one-hot" else "logit", batch_size)
        if init == "abs":
            sign = np.sign(up["logit"][0])
            out = {k: v * sign for k, v in out.items()}
    relevance_at = {r: out[RELEVANCE_PREFIX + r] for r in below}
    if layer in record:
        relevance_at[layer] = base * masks
    relevance_at = {r: relevance_at[r] for r in record}
    heat = out[RELEVANCE_PREFIX + up["input"]]
    return ConceptExplanation(layer=layer, concepts=groups, heatmaps=heat, relevance_at=relevance_at,
                              shares=shares,
                              channel_shares=channel_shares, target=int(up["target"][0]),
                              logit=float(up["logit"][0]), exclude_parallel=bool(exclude_parallel), init=init,
                              x=up["x"][0])


def _concept_masks(concepts, rel: np.ndarray, axis: int, channel_shares: np.ndarray, layer: str):
    """(channels per concept, K masks, each concept's share of the relevance ``rel`` at the layer) for the
    ``concepts`` of :func:`explain_concepts`: channel groups, or masks given as a float array."""
    if isinstance(concepts, np.ndarray) and concepts.dtype.kind == "f":  # masks given: K x (broadcast) layer item
        masks = given_masks(concepts, rel.shape, layer).astype(rel.dtype)
        per = np.moveaxis(rel.astype(np.float64), axis, 1).reshape(1, rel.shape[axis], -1).sum(-1)
        shares = (rel * masks).reshape(len(masks), -1).sum(1) / (np.abs(per).sum() + 1e-10)
        return [None] * len(masks), masks, shares
    groups = parse_concepts(concepts, channel_shares, rel.shape[axis])
    masks = channel_masks(groups, rel.shape, axis, rel.dtype)
    return groups, masks, np.array([channel_shares[g].sum() for g in groups])


__all__ = ["ConceptExplanation", "explain_concepts", "parse_concepts", "channel_masks", "given_masks"]
