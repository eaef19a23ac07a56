"""Faithfulness correlation (Bhatt et al. 2020) and relevance mass accuracy (Arras et al. 2022), as Quantus 0.6
defines them (quantus/metrics/faithfulness/faithfulness_correlation.py, localisation/relevance_mass_accuracy.py).

Pure numpy; ``predict(x) -> scores [N, classes]`` is given and called once per run for the whole batch.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import InputError
from .perturbation import Scored, replace


def pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation per row of two N x K arrays (float64); NaN where a row is constant."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    da = a - a.mean(axis=1, keepdims=True)
    db = b - b.mean(axis=1, keepdims=True)
    den = np.sqrt((da * da).sum(axis=1) * (db * db).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip((da * db).sum(axis=1) / den, -1.0, 1.0)


def faithfulness_correlation(case: Scored, runs: int = 100, subset_size: int = 224, baseline: str = "black",
                             rng=None, a_floor=None) -> dict:
    """Per run, ``subset_size`` random features of each item are set to the baseline; the correlation (Pearson, per
    item) between the relevance summed over them and the drop of the target's score. The random subsets are drawn
    as Quantus draws them (``rng.choice`` per item, then the baseline's uniform draw), so a ``RandomState(seed)``
    reproduces Quantus run after ``np.random.seed(seed)``. Returns ``{"correlation": [N], "att_sums": [N, runs],
    "deltas": [N, runs]}``, with ``"correlation_floor"`` for ``a_floor`` (another relevance, e.g. random, scored on
    the same subsets and the same predictions)."""
    predict, x, a, target = case.predict, case.x, case.a, case.target
    rng = rng if rng is not None else np.random
    n = x.shape[0]
    a2d = np.broadcast_to(a, x.shape).reshape(n, -1)
    n_features = a2d.shape[1]
    if not 0 < subset_size < n_features:
        raise InputError(f"subset size {subset_size} must be between 1 and the {n_features - 1} features of an item "
                         "less one; give a smaller --subset-size")
    rows = np.arange(n)
    y0 = predict(x)[rows, target]
    x2d = x.reshape(n, -1)
    floor2d = None if a_floor is None else np.broadcast_to(a_floor, x.shape).reshape(n, -1)
    deltas, sums, floor_sums = [], [], []
    for _ in range(runs):
        ix = np.stack([rng.choice(n_features, subset_size, replace=False) for _ in range(n)], axis=0)
        xp = replace(x2d, ix, baseline, rng).reshape(x.shape)
        deltas.append(y0 - predict(xp)[rows, target])
        sums.append(a2d[rows[:, None], ix].sum(axis=-1))
        if floor2d is not None:
            floor_sums.append(floor2d[rows[:, None], ix].sum(axis=-1))
    sums, deltas = np.stack(sums, axis=1), np.stack(deltas, axis=1)
    out = {"correlation": pearson(sums, deltas), "att_sums": sums, "deltas": deltas}
    if floor2d is not None:
        out["correlation_floor"] = pearson(np.stack(floor_sums, axis=1), deltas)
    return out


def relevance_mass(a: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The share of the relevance inside the mask per item: sum(R * s) / sum(R) (NaN for an empty mask)."""
    n = a.shape[0]
    s = np.broadcast_to(np.asarray(mask).astype(bool), a.shape).reshape(n, -1)
    a2d = a.reshape(n, -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (a2d * s).sum(-1) / a2d.sum(-1)
    out = np.asarray(out, dtype=np.float64)
    out[s.sum(-1) == 0] = np.nan
    return out
