"""Perturbation curves as Quantus 0.6 defines them: pixel flipping (Bach et al. 2015) and region perturbation
(Samek et al. 2017), with AOPC, ABPC and the trapezoid AUC.

Pure numpy: ``predict(x) -> scores [N, classes]`` is given. Every step perturbs the whole batch (every order of
every item) and calls ``predict`` once. The orderings and baselines follow quantus/metrics/faithfulness/
pixel_flipping.py and region_perturbation.py and quantus/helpers/utils.py exactly (the same argsort calls, the
same padding and block order, the baseline computed from the array being perturbed at each step, and the RNG
draws Quantus makes), so that with the same predictions the curves are the same numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.errors import InputError


BASELINES = ("black", "white", "mean", "uniform")
ORDERS = ("morf", "lerf", "random")


@dataclass(frozen=True)
class Scored:
    """What a metric scores: ``predict(x) -> scores [N, classes]``, the inputs ``x``, their relevance ``a`` (one
    item's shape or broadcastable to it) and the explained ``target`` per item."""
    predict: Callable[[np.ndarray], np.ndarray]
    x: np.ndarray
    a: np.ndarray
    target: np.ndarray


def normalise_by_max(a: np.ndarray) -> np.ndarray:
    """Quantus' default ``normalise_by_max``: a / max|a| over the whole batch (all zeros stay zeros)."""
    if np.all(a == 0.0):
        return a
    return np.divide(a, np.max(np.abs(a), axis=tuple(range(a.ndim)), keepdims=True))


def baseline_fill(arr2d: np.ndarray, baseline: str, rng) -> np.ndarray:
    """The replacement value per item (N,) computed from the array being perturbed (N x F), as Quantus'
    ``get_baseline_dict(batched=True)``, which draws its uniform values on every call whatever the baseline."""
    uniform = rng.uniform(low=0.0, high=1.0, size=arr2d.shape[0])
    if baseline == "black":
        return arr2d.min(axis=1)
    if baseline == "white":
        return arr2d.max(axis=1)
    if baseline == "mean":
        return arr2d.mean(axis=1)
    if baseline == "uniform":
        return uniform
    raise InputError(f"unknown baseline {baseline!r}; use one of {', '.join(BASELINES)}")


def replace(arr2d: np.ndarray, indices: np.ndarray, baseline: str, rng) -> np.ndarray:
    """A copy of ``arr2d`` (N x F) with ``indices`` (N x I) set to the baseline of each item."""
    fill = baseline_fill(arr2d, baseline, rng)
    out = arr2d.copy()
    out[np.arange(arr2d.shape[0])[:, None], indices] = np.full(indices.shape, fill[:, None])
    return out


def feature_order(a2d: np.ndarray, order: str, rng) -> np.ndarray:
    """Feature indices per item, most relevant first (morf), least relevant first (lerf) or a random permutation."""
    if order == "morf":
        return np.argsort(-a2d, axis=1)
    if order == "lerf":
        return np.argsort(a2d, axis=1)
    if order == "random":
        return np.array([rng.permutation(a2d.shape[1]) for _ in range(a2d.shape[0])])
    raise InputError(f"unknown order {order!r}; use one of {', '.join(ORDERS)}")


def _pick(scores: np.ndarray, target: np.ndarray) -> np.ndarray:
    return scores[np.arange(len(target)), target]


def _predict_orders(predict, arrays: list[np.ndarray], target: np.ndarray) -> list[np.ndarray]:
    """One ``predict`` call for the arrays of all orders (each N x ...): the score at the target per item."""
    scores = predict(np.concatenate(arrays, axis=0))
    n = len(target)
    return [_pick(scores[i * n:(i + 1) * n], target) for i in range(len(arrays))]


def pixel_flipping(predict, x: np.ndarray, a: np.ndarray, target: np.ndarray, orders=("morf",),
                   features_in_step: int = 1, baseline: str = "black", rngs: dict | None = None) -> dict:
    """Quantus' PixelFlipping: the features are replaced ``features_in_step`` at a time in the given order; returns
    ``{order: scores [N, n_steps + 1]}`` with the unperturbed score first (Quantus returns columns 1:)."""
    n = x.shape[0]
    a2d = np.broadcast_to(a, x.shape).reshape(n, -1)
    n_features = a2d.shape[1]
    if features_in_step < 1 or n_features % features_in_step:
        raise InputError(f"features_in_step {features_in_step} must divide the {n_features} features of an item "
                         "(Quantus' condition); choose another --steps")
    rngs = rngs or {}
    idx = {o: feature_order(a2d, o, rngs.get(o, np.random)) for o in orders}
    current = {o: x.copy() for o in orders}
    first = _pick(predict(x), target)
    curves = {o: [first] for o in orders}
    for step in range(math.ceil(n_features / features_in_step)):
        for o in orders:
            ix = idx[o][:, step * features_in_step:(step + 1) * features_in_step]
            current[o] = replace(current[o].reshape(n, -1), ix, baseline, rngs.get(o, np.random)).reshape(x.shape)
        for o, s in zip(orders, _predict_orders(predict, [current[o] for o in orders], target)):
            curves[o].append(s)
    return {o: np.stack(c, axis=1) for o, c in curves.items()}


def padding_size(dim: int, patch: int) -> tuple[int, int]:
    """Quantus' ``get_padding_size``: split the padding to a multiple of the patch, the larger half after."""
    modulo = dim % patch
    if modulo == 0:
        return 0, 0
    total = patch - modulo
    return math.floor(total / 2), math.ceil(total / 2)


def block_indices(shape: tuple, patch: int) -> np.ndarray:
    """Flat indices (per item) of each non-overlapping patch of a padded N x C x H x W array, all channels,
    patches in row-major order: [blocks, C * patch * patch] (Quantus' ``get_block_indices``)."""
    _, c, h, w = shape
    grid = np.arange(c * h * w).reshape(c, h // patch, patch, w // patch, patch)
    return grid.transpose(1, 3, 0, 2, 4).reshape((h // patch) * (w // patch), c * patch * patch)


def region_perturbation(case: Scored, orders=("morf", "lerf"), patch: int = 8, steps: int = 100,
                        baseline: str = "black", rngs: dict | None = None) -> dict:
    """Quantus' RegionPerturbation: patches ordered by their summed relevance (all channels), replaced one per step;
    returns ``{order: scores [N, steps + 1]}`` with the unperturbed score first (Quantus returns
    score[0] - score[1:])."""
    predict, x, a, target = case.predict, case.x, case.a, case.target
    if x.ndim != 4:
        raise InputError(f"region perturbation needs images N x C x H x W; this input has shape "
                         f"{'x'.join(map(str, x.shape))} (use --metric pixel-flipping)")
    n = x.shape[0]
    a = np.broadcast_to(a, x.shape)
    ph, pw = padding_size(x.shape[2], patch), padding_size(x.shape[3], patch)
    pad = ((0, 0), (0, 0), ph, pw)
    a_pad = np.pad(a, pad, mode="constant")
    blocks = block_indices(a_pad.shape, patch)
    att_sums = np.stack([a_pad.reshape(n, -1)[:, b].sum(axis=-1) for b in blocks], -1)  # N x blocks
    rngs = rngs or {}
    order_of = {}
    for o in orders:
        if o == "random":
            rng = rngs.get(o, np.random)
            order_of[o] = np.array([rng.permutation(len(blocks)) for _ in range(n)])
        else:
            order_of[o] = feature_order(att_sums, o, None)
    x_pad = np.pad(x, pad, mode="edge")
    current = {o: x_pad.copy() for o in orders}
    first = _pick(predict(x), target)
    curves = {o: [first] for o in orders}
    h, w = x_pad.shape[2:]
    for step in range(min(steps, len(blocks))):
        for o in orders:
            ix = blocks[order_of[o][:, step]]  # N x C*patch*patch
            current[o] = replace(current[o].reshape(n, -1), ix, baseline, rngs.get(o, np.random)).reshape(x_pad.shape)
        crops = [current[o][:, :, ph[0]:h - ph[1], pw[0]:w - pw[1]] for o in orders]
        for o, s in zip(orders, _predict_orders(predict, crops, target)):
            curves[o].append(s)
    return {o: np.stack(c, axis=1) for o, c in curves.items()}


def aopc(curve: np.ndarray) -> np.ndarray:
    """Samek et al. 2017, eq. 12 per item: the mean over k = 0..L of f(x^(0)) - f(x^(k)) (curve: N x (L + 1))."""
    return (curve[:, :1] - curve).mean(axis=1)


def trapezoid_auc(values: np.ndarray) -> np.ndarray:
    """Quantus' ``calculate_auc(batched=True)``: the composite trapezoid rule, dx = 1, per row."""
    return np.trapezoid(values, dx=1, axis=1)


def quantus_curve(metric: str, curve: np.ndarray) -> np.ndarray:
    """What Quantus returns for a curve with the unperturbed score first: pixel flipping the scores after each step,
    region perturbation the drop f(x) - f(x^(k)) after each."""
    if metric == "pixel-flipping":
        return curve[:, 1:]
    return curve[:, :1] - curve[:, 1:]
