"""Similarity and complexity of explanations: Spearman rank correlation (the randomisation check's and the
regression checks'), SSIM (Wang et al. 2004, scikit-image's defaults) and the discrete entropy of Quantus'
EfficientMPRT."""
from __future__ import annotations

import numpy as np


def rankdata(a: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties get their average rank (scipy.stats.rankdata's default)."""
    a = np.asarray(a).ravel()
    order = np.argsort(a, kind="mergesort")
    sorted_a = a[order]
    starts = np.r_[True, sorted_a[1:] != sorted_a[:-1]]
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], a.size] - 1
    ranks = np.empty(a.size, np.float64)
    ranks[order] = ((first + last) / 2.0 + 1.0)[group]
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two arrays (flattened), ties at their average rank.

    NaN when either array is constant: it has no ranking, so the correlation is undefined (as scipy's and Quantus');
    a caller that gives a constant map a meaning says so itself (:func:`onnx_lrp.regression.figures.spearman`)."""
    ra, rb = rankdata(a), rankdata(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def _window_mean(a: np.ndarray, win: int) -> np.ndarray:
    """Mean over every win x win window lying inside the 2-D array (valid positions only)."""
    c = np.pad(np.cumsum(np.cumsum(a, axis=0), axis=1), ((1, 0), (1, 0)))
    s = c[win:, win:] - c[:-win, win:] - c[win:, :-win] + c[:-win, :-win]
    return s / (win * win)


def ssim(a: np.ndarray, b: np.ndarray, win: int = 7) -> float:
    """SSIM of two 2-D maps as ``skimage.metrics.structural_similarity`` computes it with its defaults (7 x 7
    uniform window, sample covariance, K1 = 0.01, K2 = 0.03, the border of half a window left out), with
    ``data_range`` = max - min over both maps, as Quantus' ``ssim`` passes it. NaN for maps under 7 x 7."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.ndim != 2 or a.shape != b.shape or min(a.shape) < win:
        return float("nan")
    data_range = float(abs(max(a.max(), b.max()) - min(a.min(), b.min())))
    if data_range == 0:
        return 1.0
    cov_norm = win * win / (win * win - 1.0)
    ux, uy = _window_mean(a, win), _window_mean(b, win)
    vx = cov_norm * (_window_mean(a * a, win) - ux * ux)
    vy = cov_norm * (_window_mean(b * b, win) - uy * uy)
    vxy = cov_norm * (_window_mean(a * b, win) - ux * uy)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return float(s.mean())


def discrete_entropy(a: np.ndarray, bins: int = 100) -> float:
    """Quantus' ``discrete_entropy``: the Shannon entropy (nats) of a histogram of ``a`` with ``bins`` equal bins."""
    hist, _ = np.histogram(np.asarray(a).ravel(), bins=bins)
    p = hist[hist > 0] / hist.sum()
    return float(-(p * np.log(p)).sum())
