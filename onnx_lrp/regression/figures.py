"""The per-sample metrics of a regression check: how far a relevance map and an output are from their baseline.

Per sample, the relevance of all inputs flattened into one vector, in float64, divided by its sum of |r| (the
relevance's sum, where it is positive): the relevance metrics compare the explanation's shape, and a change of scale
(the logit and the relevance x 1.5) shows as ``output_diff`` only:

- ``output_diff``  max |y - y0| / max |y0| over the explained output (e.g. the logits) of the explained forward: the
  relative change of the prediction the relevance is computed on, the same on every CPU (upper threshold);
- ``cosine``       cosine similarity of the relevance vectors (lower threshold);
- ``rel_l2``       ||r/S - r0/S0|| / ||r0/S0||, S = sum |r| (the normalised relevance; upper threshold);
- ``spearman``     Spearman rank correlation of the relevance (ties get their average rank; lower threshold);
- ``topk_iou``     intersection over union of the top-k % most relevant features (largest relevance values, k from
  ``topk_percent``; lower threshold).
"""
from __future__ import annotations

import math

import numpy as np

from ..metrics import similarity


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    """||b - a|| / ||a|| (a: the baseline)."""
    na = float(np.linalg.norm(a))
    d = float(np.linalg.norm(b - a))
    if na == 0.0:
        return 0.0 if d == 0.0 else math.inf
    return d / na


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two relevance maps (:func:`onnx_lrp.metrics.similarity.spearman`).

    A constant map has no ranking (there the correlation is undefined: NaN); a regression check compares a map with
    its baseline, so two constant maps (e.g. all zero both times) count as the same ranking (1.0) and a constant map
    against a varying one as no agreement (0.0)."""
    rho = similarity.spearman(a, b)
    if not math.isnan(rho):
        return rho
    return 1.0 if _constant(a) and _constant(b) else 0.0


def _constant(a: np.ndarray) -> bool:
    a = np.asarray(a).ravel()
    return bool(np.all(a == a[0])) if a.size else True


def topk_count(n: int, percent: float) -> int:
    return max(1, min(n, int(round(n * percent / 100.0))))


def topk_iou(a: np.ndarray, b: np.ndarray, percent: float) -> float:
    """IoU of the index sets of the k largest values (ties broken by index, stably)."""
    k = topk_count(a.size, percent)
    ia = set(np.argsort(-a, kind="mergesort")[:k].tolist())
    ib = set(np.argsort(-b, kind="mergesort")[:k].tolist())
    return len(ia & ib) / len(ia | ib)


def output_diff(y0: np.ndarray, y: np.ndarray) -> float:
    y0, y = np.asarray(y0, np.float64).ravel(), np.asarray(y, np.float64).ravel()
    scale = float(np.max(np.abs(y0))) if y0.size else 0.0
    d = float(np.max(np.abs(y - y0))) if y0.size else 0.0
    if not math.isfinite(d):
        return math.inf
    return d / scale if scale > 0 else (0.0 if d == 0 else math.inf)


def sample_metrics(r0: np.ndarray, r: np.ndarray, y0: np.ndarray, y: np.ndarray, topk_percent: float,
                   scales: tuple[float, float] = (1.0, 1.0)) -> dict:
    """Every metric for one sample (relevance vectors flattened, float64); the relevance metrics on ``r0 / scales[0]``
    and ``r / scales[1]`` (their sums of |r|: :func:`onnx_lrp.regression.compare.relevance_scale`)."""
    r0 = np.asarray(r0, np.float64).ravel() / scales[0]
    r = np.asarray(r, np.float64).ravel() / scales[1]
    out = {"output_diff": output_diff(y0, y)}
    if not (np.all(np.isfinite(r)) and np.all(np.isfinite(r0))):
        out.update(cosine=math.nan, rel_l2=math.nan, spearman=math.nan, topk_iou=math.nan)
        return out
    out.update(cosine=cosine(r0, r), rel_l2=rel_l2(r0, r), spearman=spearman(r0, r),
               topk_iou=topk_iou(r0, r, topk_percent))
    return out


__all__ = ["cosine", "output_diff", "rel_l2", "sample_metrics", "spearman", "topk_count", "topk_iou"]
