"""Running the concept relevance models: the relevance down to a layer for a batch (:func:`upper_pass`), the
channels' shares of it, and the masked and seeded models on copies of one item, in batches."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import InputError, NumericError
from ..core.interface import ONE_HOT_INPUT, POSITION_INPUT, RELEVANCE_PREFIX, TARGET_INPUT, TARGET_OUTPUT, VALUE_OUTPUT
from .models import models_of
from .variants import MASK_PREFIX, SEED_PREFIX


INITS = ("logit", "abs", "one-hot", "activation")


def _one_input(ex, x) -> tuple[str, np.ndarray]:
    feeds = ex.checked_feeds(x)
    if len(feeds) != 1:
        raise InputError("concepts need a model with one input; this one has "
                         f"{len(feeds)} ({', '.join(feeds)})")
    name, arr = next(iter(feeds.items()))
    return name, arr


def _finite(out: dict, what: str) -> dict:
    for k, a in out.items():
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise NumericError(f"non-finite (NaN/Inf) values in {k!r} of the {what}; nothing was returned")
    return out


def _start_feeds(sess, targets, init: str) -> dict:
    feeds = {TARGET_INPUT: targets.astype(np.int64), ONE_HOT_INPUT: np.array(init == "one-hot")}
    if POSITION_INPUT in sess.input_names:
        feeds[POSITION_INPUT] = np.full(len(targets), -1, dtype=np.int64)
    return {k: v for k, v in feeds.items() if k in sess.input_names}


@dataclass(frozen=True)
class ConceptOptions:
    """How the concepts of one item are explained (:func:`onnx_lrp.concepts.explain_concepts`,
    :func:`onnx_lrp.concepts.concept_graph`; the Explainer's methods of the same names take them as keywords),
    checked once when made."""

    exclude_parallel: bool = True  # zennit-crp's default: skip connections do not leak the concept
    record: tuple = ()  # tensors whose conditional relevance is returned too (one name may be a str)
    init: str = "logit"  # the start relevance (INITS)
    channel_axis: int = 1
    batch_size: int = 16  # concepts per run of a concept relevance model
    width: tuple = (5, 2)  # concept_graph: concepts kept per level
    layers: tuple | None = None  # concept_graph: the layers it descends through (None: every layer)
    abs_norm: bool = True  # concept_graph: shares of the absolute relevance

    def __post_init__(self):
        record = [self.record] if isinstance(self.record, str) else self.record
        object.__setattr__(self, "record", tuple(dict.fromkeys(record)))
        b = self.batch_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise InputError(f"batch_size must be a positive int, not {b!r}")
        w = self.width
        if not isinstance(w, (list, tuple)) or not w or any(
                isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in w):
            raise InputError(f"width must be a list of positive ints (concepts kept per level), not {w!r}")


def upper_pass(ex, x, target, layer: str, init: str = "logit") -> dict:
    """Forward and relevance down to ``layer`` for a batch: ``relevance`` (at the layer), ``activation``,
    ``target``, ``logit`` (the explained value per item)."""
    if init not in INITS:
        raise InputError(f"init must be one of {', '.join(INITS)}, not {init!r}")
    sess = models_of(ex).upper(layer)
    name, arr = _one_input(ex, x)
    targets = ex.checked_targets(target, len(arr))
    out = _finite(sess.run({name: arr, **_start_feeds(sess, targets, init)}), "relevance down to " + layer)
    rel = out[RELEVANCE_PREFIX + layer]
    logit = out[VALUE_OUTPUT]
    if init == "abs":  # start from |logit|: every rule is linear, so the relevance only flips its sign
        rel = rel * np.sign(logit).reshape((-1,) + (1,) * (rel.ndim - 1))
    return dict(relevance=rel, activation=out[layer], target=out[TARGET_OUTPUT], logit=logit, input=name, x=arr)


def shares_of(rel: np.ndarray, channel_axis: int = 1, abs_norm: bool = True) -> np.ndarray:
    """Per item and channel: the relevance summed over every other axis, divided by the sum of its absolute values
    over the channels (+1e-10) when ``abs_norm`` (zennit-crp's ``ChannelConcept.attribute``)."""
    axis = channel_axis_of(channel_axis, rel.ndim)
    moved = np.moveaxis(rel.astype(np.float64), axis, 1).reshape(rel.shape[0], rel.shape[axis], -1)
    per = moved.sum(-1)
    if abs_norm:
        per = per / (np.abs(per).sum(-1, keepdims=True) + 1e-10)
    return per


def channel_axis_of(channel_axis, ndim: int) -> int:
    if isinstance(channel_axis, bool) or not isinstance(channel_axis, (int, np.integer)):
        raise InputError(f"channel_axis must be an int, not {channel_axis!r}")
    axis = int(channel_axis) + (ndim if channel_axis < 0 else 0)
    if not 1 <= axis < ndim:
        raise InputError(f"channel_axis {channel_axis} does not fit a layer of rank {ndim} (axis 0 is the batch)")
    return axis


def concept_relevance(ex, x, target=None, layer=None, channel_axis: int = 1, abs_norm: bool = True) -> np.ndarray:
    """Per item, the share of each channel of ``layer`` in the relevance: N x C."""
    up = upper_pass(ex, x, target, layer)
    return shares_of(up["relevance"], channel_axis, abs_norm)


def _batched(n: int, batch_size: int):
    for lo in range(0, n, batch_size):
        yield lo, min(n, lo + batch_size)


def run_seeded(ex, layer: str, x1: np.ndarray, name: str, seeds: np.ndarray, record=(), batch_size: int = 16):
    """The seeded model for K seeds at ``layer`` on one item ``x1`` (1 x ...), repeated per batch: relevance at
    the input and at ``record``, K x ..."""
    sess = models_of(ex).seeded(layer, tuple(record))
    parts = []
    for lo, hi in _batched(len(seeds), batch_size):
        xs = np.repeat(x1, hi - lo, axis=0) if len(x1) == 1 else x1[lo:hi]
        parts.append(_finite(sess.run({name: xs, SEED_PREFIX + layer: seeds[lo:hi].astype(xs.dtype)}),
                             "relevance below " + layer))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def run_masked(ex, masks: dict, up: dict, target: int, count: int, record=(), init: str = "logit",
               batch_size: int = 16):
    """The masked model on ``count`` copies of the one item of ``up`` (:func:`upper_pass`: its ``x`` fed to its
    ``input``) with the masks (name -> K x ...) at their tensors."""
    x1, name = up["x"], up["input"]
    names = tuple(masks)
    sess = models_of(ex).masked(names, tuple(record))
    parts = []
    for lo, hi in _batched(count, batch_size):
        feeds = {name: np.repeat(x1, hi - lo, axis=0)}
        feeds.update(_start_feeds(sess, np.full(hi - lo, target, dtype=np.int64), init))
        for n, m in masks.items():
            feeds[MASK_PREFIX + n] = m[lo:hi] if len(m) > 1 else m
        parts.append(_finite(sess.run(feeds), "masked relevance"))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


__all__ = ["ConceptOptions", "INITS", "upper_pass", "shares_of", "channel_axis_of", "concept_relevance", "run_seeded", "run_masked"]
