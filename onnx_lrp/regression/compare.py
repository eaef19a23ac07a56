"""Comparing two explanation sets of the same items, sample by sample: the metrics, the drifted samples, and how far
the deployed outputs of two machines are apart."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..core.brief import brief_repr
from ..core.errors import InputError
from ..run import deployed_gap as gaps
from .figures import sample_metrics
from .thresholds import DEFAULT_THRESHOLDS, KINDS, METRICS, Thresholds, drift


@dataclass
class Result:
    """One explanation set: relevance by input name, the explained output, targets, item names."""

    relevance: dict
    explained: np.ndarray
    targets: np.ndarray
    items: list
    outputs: dict = field(default_factory=dict)
    forward: np.ndarray | None = None  # the explained forward's explained output, where it differs from ``explained``

    @property
    def explained_forward(self) -> np.ndarray:
        return self.explained if self.forward is None else self.forward

    def __repr__(self) -> str:
        return brief_repr(self, ["relevance", "explained", "targets", "items", "outputs", "forward"])


@dataclass
class Sample:
    """One item of a comparison: its metrics, its drift by kind (``drift``: kind -> the metrics beyond their
    thresholds, or the changed prediction) and what of it fails the check (``failed``: the messages of the kinds
    in ``fail_on``; ``failed_kinds`` those kinds)."""

    item: str
    index: int
    target: int
    predicted_baseline: int
    predicted_current: int
    metrics: dict
    failed: list
    drift: dict = field(default_factory=dict)
    failed_kinds: tuple = ()

    @property
    def passed(self) -> bool:
        return not self.failed

    def __repr__(self) -> str:
        return brief_repr(self, ["item", "target", "predicted_baseline", "predicted_current", "metrics", "drift",
                                 "failed_kinds"])


@dataclass
class Comparison:
    samples: list
    thresholds: Thresholds

    @property
    def drifted(self) -> list:
        """The samples that fail the check (a drift of a kind in ``thresholds.fail_on``)."""
        return [s for s in self.samples if not s.passed]

    def drift_counts(self) -> dict:
        """Per kind of drift (:data:`KINDS`): how many samples show it, failing the check or not."""
        return {k: sum(k in s.drift for s in self.samples) for k in KINDS}

    def __repr__(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.drift_counts().items())
        return (f"Comparison(samples={len(self.samples)}, failing={len(self.drifted)}, drift: {counts}, "
                f"fail_on={list(self.thresholds.fail_on)})")

    @property
    def passed(self) -> bool:
        return not self.drifted

    def summary(self) -> dict:
        """Per metric over samples: mean, min, max (finite values; NaN when none)."""
        out = {}
        for name in METRICS:
            vals = np.array([s.metrics[name] for s in self.samples], dtype=np.float64)
            fin = vals[np.isfinite(vals)]
            out[name] = dict(mean=float(fin.mean()) if fin.size else math.nan,
                             min=float(vals.min()) if vals.size else math.nan,
                             max=float(vals.max()) if vals.size else math.nan)
            # the bad end: the largest value of a "max" metric, the smallest of a "min" metric; NaN counts as worst
            bad_high = METRICS[name][1] == "max"
            order = np.where(np.isnan(vals), -np.inf if not bad_high else np.inf, vals)
            k = (int(np.argmax(order)) if bad_high else int(np.argmin(order))) if vals.size else None
            out[name]["worst"] = float(vals[k]) if k is not None else math.nan
            out[name]["worst_item"] = self.samples[k].item if k is not None else None
            out[name]["p95"] = (float(np.percentile(fin, 95 if bad_high else 5)) if fin.size else math.nan)
        return out


def flat_relevance(relevance: dict, i: int) -> np.ndarray:
    return np.concatenate([np.asarray(relevance[k][i], np.float64).ravel() for k in sorted(relevance)])


def relevance_scale(relevance: np.ndarray) -> float:
    """What one item's relevance is divided by before it is compared (its shape, not its size): the sum of |r| (the
    relevance's sum where it is positive, as LRP's mostly is; never near zero where positive and negative relevance
    cancel); 1 for an all-zero or non-finite map. A harmless rescale of the model (the logit x 1.5, the relevance with
    it) leaves the normalised relevance as it was: the scale shows as output drift, ``output_diff``, instead; a bias
    that the relevance does not see leaves both."""
    v = float(np.sum(np.abs(relevance)))
    return v if np.isfinite(v) and v > 0.0 else 1.0


def compare(base: Result, cur: Result, th: Thresholds = DEFAULT_THRESHOLDS) -> Comparison:
    if sorted(base.relevance) != sorted(cur.relevance):
        raise InputError(f"the relevance is for inputs {', '.join(sorted(cur.relevance))} but the baseline has "
                         f"{', '.join(sorted(base.relevance))}; the model's inputs changed")
    n = len(base.items)
    for k in base.relevance:
        if base.relevance[k].shape != cur.relevance[k].shape:
            raise InputError(f"relevance of input {k!r} has shape {'x'.join(map(str, cur.relevance[k].shape))} but "
                             f"the baseline's is {'x'.join(map(str, base.relevance[k].shape))}")
    if base.explained.shape[0] != n or cur.explained.shape[0] != n:
        raise InputError("baseline and current explanations have different numbers of items")
    yb = base.explained.reshape(n, -1)
    yc = cur.explained.reshape(n, -1)
    if yb.shape != yc.shape:
        raise InputError(f"the explained output has {yc.shape[1]} entries per item but the baseline's has "
                         f"{yb.shape[1]}")
    # output_diff on the explained forward: deployed int8 outputs differ between CPUs (deployed_difference)
    fb = base.explained_forward.reshape(n, -1)
    fc = cur.explained_forward.reshape(n, -1)
    samples = []
    for i in range(n):
        r0, r = flat_relevance(base.relevance, i), flat_relevance(cur.relevance, i)
        m = sample_metrics(r0, r, fb[i], fc[i], th.topk_percent, scales=(relevance_scale(r0), relevance_scale(r)))
        # the predictions of the explained forward too: the same on every CPU (the deployed int8 outputs are not)
        pred = int(np.argmax(fb[i])), int(np.argmax(fc[i])) if np.all(np.isfinite(fc[i])) else -1
        kinds = drift(m, th, pred)
        failing = tuple(k for k in kinds if k in th.fail_on)
        samples.append(Sample(str(base.items[i]), i, int(base.targets[i]), pred[0], pred[1], m,
                              [msg for k in failing for msg in kinds[k]], kinds, failing))
    return Comparison(samples, th)


def deployed_difference(base: Result, cur: Result, step: float | None, machines: dict | None = None) -> dict | None:
    """How far the deployed outputs of the current run are from the baseline's (both stored as outputs), for
    models with a deployed run (``forward`` stored): int8 kernels compute differently on CPUs with and without
    VNNI, so a baseline from another machine can differ here while the explanation (compared on the explained
    forward) does not. None for float models."""
    if base.forward is None or base.explained.shape != cur.explained.shape:
        return None
    n = len(base.items)
    g = gaps.measure("", base.explained, cur.explained, step, n)
    return dict(max_abs=g.max_abs, item=str(base.items[g.item]) if n else None, index=g.index,
                tolerance=g.tolerance, differ=g.beyond, machines=machines or {})


def deployed_difference_message(d: dict, output: str) -> str:
    """One line for a deployed difference beyond the tolerance, with the int8 facts of both machines."""
    m = d.get("machines") or {}

    def fact(x):
        if not x:
            return "unknown"
        sat = x.get("int8_saturates")
        return ("int8 sums saturate" if sat else "int8 sums exact" if sat is False else "int8 unknown") + \
            f", onnxruntime {x.get('onnxruntime')}, flags {','.join(x.get('cpu_flags') or []) or '?'}"
    return (f"the deployed outputs differ from the baseline's by up to {d['max_abs']:.3g} on {output}[{d['index']}] "
            f"of {d['item']} (tolerance {d['tolerance']:.3g}): onnxruntime's int8 kernels compute differently on the "
            f"baseline's machine ({fact(m.get('baseline'))}) and this one ({fact(m.get('current'))}); the "
            "explanations are compared on the explained forward, which does not depend on the int8 kernels")


__all__ = ["Comparison", "Result", "Sample", "compare", "deployed_difference", "deployed_difference_message",
           "flat_relevance", "relevance_scale"]
