"""Is the explanation faithful? Quantus 0.6's metrics on any ONNX model: ``onnx_lrp.evaluate(model, x, metric=...)``.

* ``region-perturbation`` (Samek et al. 2017) and ``pixel-flipping`` (Bach et al. 2015): the input is destroyed in
  the order of the relevance (MoRF: most relevant first, LeRF: least relevant first) and, beside it, in a seeded
  random order: the floor a faithful explanation must beat. Per item: AOPC (the mean drop of the target's score
  over the steps, unperturbed step included), ABPC = AOPC(MoRF) - AOPC(LeRF) = mean(LeRF - MoRF curve), the
  trapezoid AUC of Quantus' curve.
* ``faithfulness-correlation`` (Bhatt et al. 2020): Pearson correlation of the relevance of random subsets with
  the drop they cause; the floor is a random relevance scored on the same subsets.
* ``relevance-mass`` (Arras et al. 2022): the share of the relevance inside a mask; the floor is the mask's area.
* ``randomisation`` (Adebayo et al. 2018; Quantus' MPRT and EfficientMPRT): the model's parameters randomised
  top-down, cascading and seeded; per layer the Spearman rank correlation (and SSIM) of |relevance| with the
  original's, and eMPRT = (H(random) - H(original)) / H(original) of the relevance histograms' entropy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.errors import InputError, LrpError, internal_error
from . import correlation, perturbation, similarity


METRICS = ("region-perturbation", "pixel-flipping", "faithfulness-correlation", "randomisation", "relevance-mass")
PERTURBATION = ("region-perturbation", "pixel-flipping")
# Quantus 0.6's default for ``softmax`` in each metric's __call__: the perturbation curves use probabilities,
# faithfulness correlation logits
DEFAULT_PROB = {"region-perturbation": "softmax", "pixel-flipping": "softmax", "faithfulness-correlation": "logit",
                "randomisation": "softmax", "relevance-mass": "logit"}


@dataclass(frozen=True)
class EvaluateOptions:
    """How ``evaluate`` scores the explanations (see `evaluate` for each value), checked once when made:
    an unknown metric, baseline, score or order is refused in one line; ``prob`` None becomes the metric's Quantus
    default."""

    metric: str = "region-perturbation"
    patch: int = 8
    steps: int = 50
    orders: tuple | None = ("morf", "lerf")
    baseline: str = "black"
    prob: str | None = None
    seed: int = 0
    features_in_step: int | None = None
    runs: int = 100
    subset_size: int = 224
    layer_order: str = "top_down"
    bins: int = 100
    channels_last: bool | None = None

    def __post_init__(self):
        _check_choice("metric", self.metric, METRICS)
        _check_choice("baseline", self.baseline, perturbation.BASELINES)
        object.__setattr__(self, "prob", self.prob or DEFAULT_PROB.get(self.metric))
        _check_choice("prob", self.prob, ("softmax", "logit"))
        if self.metric in PERTURBATION:
            for o in self.all_orders():
                _check_choice("order", o, perturbation.ORDERS)

    def all_orders(self) -> list:
        """The perturbation orders given, the random one added (once)."""
        return list(dict.fromkeys([*(self.orders or ()), "random"]))


@dataclass
class Evaluation:
    """What ``evaluate`` returns. ``scores``: per-item arrays by name (``aopc/morf``, ``abpc``, ``correlation``,
    ...); ``curves``: per order the target's score after each step, N x (steps + 1), the unperturbed score first;
    ``quantus``: per order the curve as Quantus 0.6 returns it; ``layers``: the randomisation check per layer."""

    metric: str
    params: dict
    target: np.ndarray
    scores: dict = field(default_factory=dict)
    curves: dict = field(default_factory=dict)
    quantus: dict = field(default_factory=dict)
    layers: list = field(default_factory=list)
    calls: int = 0  # onnxruntime runs of the model's forward pass

    def mean(self, name: str) -> float:
        """The mean over the items (NaN items left out; NaN when all are)."""
        v = np.asarray(self.scores[name], np.float64)
        return float(v[np.isfinite(v)].mean()) if np.isfinite(v).any() else float("nan")

    def summary(self) -> dict:
        """The mean of every score over the items, and whether the explanation beats its random floor."""
        out = {k: self.mean(k) for k in self.scores}
        floor = {"region-perturbation": ("aopc/morf", "aopc/random"), "pixel-flipping": ("aopc/morf", "aopc/random"),
                 "faithfulness-correlation": ("correlation", "correlation/random"),
                 "relevance-mass": ("mass", "mass/random")}.get(self.metric)
        if floor and floor[0] in out and floor[1] in out:
            out["beats_random"] = bool(out[floor[0]] > out[floor[1]])
            if "abpc" in out:  # the printed ABPC must agree: the most relevant first must drop more than the least
                out["beats_random"] = out["beats_random"] and bool(out["abpc"] > 0)
        return out

    def verdict_basis(self) -> str:
        """The scores the verdict (``beats_random`` of `summary`) is based on, in words."""
        if self.metric in ("region-perturbation", "pixel-flipping"):
            return ("ABPC > 0 and AOPC (MoRF) above the random order's" if "abpc" in self.scores
                    else "AOPC (MoRF) above the random order's")
        return {"faithfulness-correlation": "the correlation above random relevance's",
                "relevance-mass": "the mass inside the mask above the mask's area"}.get(self.metric, "")

    def __repr__(self) -> str:
        """Short: the metric, the number of items, the mean of each score, whether it beats its random floor."""
        summ = self.summary()
        beats = summ.pop("beats_random", None)
        means = ", ".join(f"{k!r}: {v:.4g}" for k, v in list(summ.items())[:10])
        more = f", ... ({len(summ)} scores)" if len(summ) > 10 else ""
        return (f"Evaluation(metric={self.metric!r}, items={len(self.target)}, mean={{{means}{more}}}"
                + (f", beats_random={beats}" if beats is not None else "")
                + (f", layers={len(self.layers)}" if self.layers else "") + ")")

    def as_dict(self) -> dict:
        return {"metric": self.metric, "params": self.params, "target": self.target.tolist(),
                "summary": {k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                            for k, v in self.summary().items()},
                "verdict_on": self.verdict_basis(),
                "scores": {k: _listed(v) for k, v in self.scores.items()},
                "curves": {k: _listed(v) for k, v in self.curves.items()},
                "layers": [{k: _listed(v) for k, v in row.items()} for row in self.layers]}


def _listed(v):
    if isinstance(v, np.ndarray):
        return [None if isinstance(e, float) and not np.isfinite(e) else e for e in v.tolist()] \
            if v.ndim == 1 else [_listed(r) for r in v]
    return v


def _check_choice(name, value, choices):
    if value not in choices:
        raise InputError(f"unknown {name} {value!r}; use one of {', '.join(choices)}")


def _batch(x, spec) -> np.ndarray:
    """The input as the model's float type, with a batch axis."""
    if isinstance(x, dict):
        x = x.get(spec.name)
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise InputError(f"input {spec.name!r} has dtype {x.dtype}; the metrics need float inputs")
    if spec.dims and x.ndim == len(spec.dims) - 1:
        x = x[None]
    return np.ascontiguousarray(x.astype(spec.dtype, copy=False))


def _one_input(ex) -> str:
    if len(ex.inputs) != 1 or len(ex.relevance_inputs) != 1:
        raise InputError(f"the metrics need a model with one float input; this one has {len(ex.inputs)} input(s) "
                         f"({', '.join(i.name for i in ex.inputs)})")
    return ex.inputs[0].name


def evaluate(model, x, metric: str = "region-perturbation", target=None, relevance=None,
             composite="epsilon-plus-flat", patch: int = 8, steps: int = 50, orders=("morf", "lerf"),
             baseline: str = "black", prob: str | None = None, seed: int = 0, features_in_step: int | None = None,
             runs: int = 100, subset_size: int = 224, mask=None, layer_order: str = "top_down", bins: int = 100,
             channels_last: bool | None = None, device: str = "cpu", explainer=None, **explainer_kwargs
             ) -> Evaluation:
    """Score the explanations of ``x`` (N items of the model's one float input) with a Quantus 0.6 metric.

    ``relevance``: the explanation to score (default: computed with ``composite`` and ``explainer_kwargs``, or by
    ``explainer``); ``target``: the class per item (default: arg-max). ``prob``: ``softmax`` or ``logit`` scores
    (default: Quantus' for the metric: softmax for the perturbation curves, logit for faithfulness correlation).
    ``seed`` seeds the random ordering, the random subsets and the uniform baseline: a
    ``numpy.random.RandomState(seed)`` per order, the stream ``np.random.seed(seed)`` gives Quantus. Perturbation
    metrics: ``patch`` (region side), ``steps`` (regions replaced; for pixel flipping ``features_in_step`` defaults
    to features / steps), ``orders`` (the random order is always added), ``baseline`` (black = the item's minimum,
    white, mean, uniform in [0, 1)). ``mask``: the relevance-mass region (N x the input's shape, or broadcastable).
    ``channels_last``: images N x H x W x C are perturbed channel-first, as Quantus does (None: Quantus'
    ``infer_channel_first`` rule, channels last when the last axis is the smallest).
    """
    options = EvaluateOptions(metric, patch, steps, orders, baseline, prob, seed, features_in_step, runs,
                              subset_size, layer_order, bins, channels_last)
    try:
        explain = None
        if explainer is None or metric == "randomisation":  # the relevance model is built (again) here
            from ..run.launch import ExplainOptions

            spec = composite if explainer is None else explainer.relevance_model.source.composite_spec()
            explain = ExplainOptions.from_keywords(spec, device, **explainer_kwargs)
        return _evaluate(model, x, (target, relevance, mask), options, explainer, explain)
    except LrpError:
        raise
    except Exception as exc:  # a bug: one line, as everywhere in the API
        raise internal_error(None, exc) from exc


def _channels_last(x: np.ndarray, given: bool | None) -> bool:
    """Quantus' ``infer_channel_first`` for images: channels last when the last axis is the smallest."""
    if x.ndim != 4:
        return False
    if given is not None:
        return bool(given)
    return x.shape[3] < x.shape[1] and x.shape[3] < x.shape[2]


def _evaluate(model, x, given: tuple, options: EvaluateOptions, explainer, explain) -> Evaluation:
    """``given``: (target, relevance, mask) as the caller gave them; ``explain``: the options that build the
    relevance model (when ``explainer`` is None) and the randomised ones."""
    from ..run.launch import runner

    target, relevance, mask = given
    ex = explainer or runner(model, explain)
    name = _one_input(ex)
    x = _batch(x, ex.inputs[0])
    target, a = _explained(ex, x, target, relevance)
    o = options
    ev = Evaluation(o.metric, dict(metric=o.metric, composite=ex.composite_name, prob=o.prob, seed=o.seed,
                                   baseline=o.baseline), target)
    if o.metric == "randomisation":
        ev.params.update(layer_order=o.layer_order, bins=o.bins)
        _randomisation(ev, (model, ex, explain), x, target, a, o)
        return ev
    a = np.broadcast_to(a, x.shape)  # N x 1 x H x W over the channels, as Quantus' metrics do
    if o.metric == "relevance-mass":
        _relevance_mass(ev, x, a, mask)
        return ev
    from .forward import Forward  # loads the model with onnx: imported when a metric runs

    predict = Forward(model, ex.explained_tensor, name, ex.inputs[0].dims[0] if ex.inputs[0].dims else None,
                      prob=o.prob, device=ex.device)
    if _channels_last(x, o.channels_last):  # perturbed channel-first (as Quantus), fed to the model as it wants
        x, a = x.transpose(0, 3, 1, 2), a.transpose(0, 3, 1, 2)
        ev.params["channels_last"] = True
        predict = _Transposed(predict)
    if o.metric == "faithfulness-correlation":
        _faithfulness(ev, predict, x, a, target, o)
    else:
        _perturbation(ev, predict, x, a, target, o)
    ev.calls = predict.calls
    return ev


def _explained(ex, x: np.ndarray, target, relevance) -> tuple[np.ndarray, np.ndarray]:
    """(target per item, relevance): as given, or explained by ``ex``; checked against the input."""
    a = None if relevance is None else np.asarray(relevance, dtype=x.dtype)
    if a is None or target is None or np.ndim(target) == 0:  # both given per item: nothing to explain
        res = ex.explain(x, target=target)
        target, a = res.target, (res.relevance if a is None else a)
    target = np.asarray(target, np.int64)
    if target.shape != (len(x),):
        raise InputError(f"{target.size} targets for {len(x)} item(s); give one per item")
    a = attribution_layout(a, x.shape)
    if not np.all(np.isfinite(a)):
        raise InputError("the relevance holds NaN or Inf; it cannot be scored")
    return target, a


def _shape(shape) -> str:
    return "x".join(map(str, shape))


def attribution_layout(a: np.ndarray, x_shape: tuple) -> np.ndarray:
    """The relevance ``a`` in a layout that broadcasts to the input's shape ``x_shape``, as Quantus 0.6 takes it.

    Accepted: the input's shape; axes of length 1 where the input has more (N x 1 x H x W for N x C x H x W inputs:
    Quantus' own attribution layout, ``quantus.explain`` sums over the channels keeping the axis); fewer axes, whose
    place Quantus' ``expand_attribution_channel`` infers: the relevance's axes longer than 1 are the one run of
    consecutive axes of the input with those lengths (N x H x W for N x C x H x W becomes N x 1 x H x W). The
    perturbation metrics then broadcast it over the other axes (``np.broadcast_to``, as Quantus' metrics do);
    anything else is refused in one line.
    """
    n, item = x_shape[0], tuple(x_shape[1:])
    given = a.shape
    if a.ndim == 0 or a.shape[0] != n:
        raise InputError(f"relevance has shape {_shape(given)} for {n} item(s) of shape {_shape(item)}; give one "
                         "relevance per item")
    core = [d for d in a.shape[1:] if d != 1]
    if a.ndim < len(x_shape) and core:
        runs = [j for j in range(len(item) - len(core) + 1) if list(item[j:j + len(core)]) == core]
        if len(runs) == 1:
            at = range(runs[0], runs[0] + len(core))
            a = a.reshape((n, *[item[j] if j in at else 1 for j in range(len(item))]))
    if a.ndim != len(x_shape) or not core or any(d not in (1, x) for d, x in zip(a.shape[1:], item)):
        raise InputError(f"relevance has shape {_shape(given)}; the input has {_shape(x_shape)}: give the input's "
                         f"shape, or axes of length 1 where it broadcasts (N x 1 x H x W for N x C x H x W inputs, "
                         "as Quantus), or leave such axes out where their place is unique (N x H x W)")
    return a


def summed_like(r: np.ndarray, shape: tuple) -> np.ndarray:
    """``r`` (the input's shape) summed over the axes where ``shape`` has length 1 and ``r`` more, keeping them: the
    relevance of a randomised model in the layout the original was given in (``quantus.explain`` sums over the
    channels, keeping the axis)."""
    axes = tuple(k for k, (d, e) in enumerate(zip(shape, r.shape)) if d == 1 and e != 1)
    return r.sum(axis=axes, keepdims=True) if axes else r


def _relevance_mass(ev: Evaluation, x: np.ndarray, a: np.ndarray, mask) -> None:
    if mask is None:
        raise InputError("relevance-mass needs a mask (--mask FILE.npy: 1 inside the region, per item)")
    mask = np.asarray(mask)
    if mask.dtype.kind not in "biuf" or mask.ndim == 0:
        raise InputError(f"the mask is {'a 0-d array' if mask.ndim == 0 else f'of dtype {mask.dtype}'}; give a "
                         "numeric array of 0 and 1 (1 inside the region), one item's shape or one per item")
    if mask.dtype.kind == "f" and not np.all(np.isfinite(mask)):
        raise InputError("the mask holds NaN or infinite values; give 0 and 1 (1 inside the region)")
    try:
        s = np.broadcast_to(mask.astype(bool), x.shape)
    except ValueError:
        raise InputError(f"the mask has shape {'x'.join(map(str, mask.shape))}; it must broadcast to the "
                         f"input's {'x'.join(map(str, x.shape))}") from None
    ev.scores["mass"] = correlation.relevance_mass(perturbation.normalise_by_max(a), s)
    ev.scores["mass/random"] = s.reshape(len(x), -1).mean(axis=1)  # what relevance spread evenly puts inside


def _faithfulness(ev: Evaluation, predict, x, a, target, o: EvaluateOptions) -> None:
    ev.params.update(runs=o.runs, subset_size=o.subset_size)
    floor = np.random.default_rng(o.seed).standard_normal(a.shape).astype(a.dtype)
    case = perturbation.Scored(predict, x, perturbation.normalise_by_max(a), target)
    out = correlation.faithfulness_correlation(case, o.runs, o.subset_size, o.baseline, np.random.RandomState(o.seed),
                                               a_floor=floor)
    ev.scores["correlation"] = out["correlation"]
    ev.scores["correlation/random"] = out["correlation_floor"]


def _perturbation(ev: Evaluation, predict, x, a, target, o: EvaluateOptions) -> None:
    """Region perturbation or pixel flipping: the curves per order (the random order added) and their scores."""
    a_n = perturbation.normalise_by_max(a)
    orders = o.all_orders()
    rngs = {order: np.random.RandomState(o.seed) for order in orders}
    if ev.metric == "pixel-flipping":
        n_features = int(np.prod(x.shape[1:]))
        k = o.features_in_step or max(1, -(-n_features // max(1, o.steps)))
        while n_features % k:  # Quantus needs the step to divide the features
            k += 1
        ev.params.update(features_in_step=k, steps=n_features // k)
        ev.curves = perturbation.pixel_flipping(predict, x, a_n, target, orders, k, o.baseline, rngs)
    else:
        if x.ndim == 4 and not 1 <= o.patch <= min(x.shape[2:]):
            raise InputError(f"patch {o.patch} must be between 1 and the image's smaller side")
        ev.curves = perturbation.region_perturbation(perturbation.Scored(predict, x, a_n, target), orders, o.patch,
                                                     o.steps, o.baseline, rngs)
        ev.params.update(patch=o.patch, steps=next(iter(ev.curves.values())).shape[1] - 1)
    ev.params["orders"] = orders
    for order, curve in ev.curves.items():
        ev.quantus[order] = perturbation.quantus_curve(ev.metric, curve)
        ev.scores[f"aopc/{order}"] = perturbation.aopc(curve)
        ev.scores[f"auc/{order}"] = perturbation.trapezoid_auc(ev.quantus[order])
    if "morf" in ev.curves and "lerf" in ev.curves:
        ev.scores["abpc"] = ev.scores["aopc/morf"] - ev.scores["aopc/lerf"]


class _Transposed:
    """A channels-last model's forward pass fed channel-first arrays."""

    def __init__(self, forward):
        self.forward = forward

    @property
    def calls(self) -> int:
        return self.forward.calls

    def __call__(self, x):
        return self.forward(np.ascontiguousarray(x.transpose(0, 2, 3, 1)))


def _randomisation(ev, models: tuple, x, target, a, o: EvaluateOptions):
    """``models``: (the model as given, its runner, the options that build a randomised copy's)."""
    from ..run.launch import runner
    from ..run.runner import Runner
    from . import randomisation

    model, ex, explain = models
    if model is None or isinstance(model, Runner):
        raise InputError("the randomisation check rebuilds the relevance model: give the model (path or bytes)")
    channel_axis = 3 if _channels_last(x, o.channels_last) else 1
    bins = o.bins
    spatial = x.ndim == 4
    maps0 = a.sum(axis=channel_axis) if spatial else None
    h0 = np.array([similarity.discrete_entropy(ai, bins) for ai in a])
    ev.layers.append(dict(layer="original", spearman=np.ones(len(x)), ssim=np.ones(len(x)), entropy=h0))
    comp = ex.relevance_model.source.composite_spec()
    last = None
    explain = explain.with_composite(comp)
    for layer, randomised in randomisation.cascade(model, o.seed, o.layer_order):
        rex = runner(randomised, explain)
        ar = summed_like(rex.explain(x, target=target).relevance, a.shape)
        row = dict(layer=layer,
                   spearman=np.array([similarity.spearman(np.abs(a0), np.abs(a1)) for a0, a1 in zip(a, ar)]),
                   ssim=np.array([similarity.ssim(m0, m1) for m0, m1 in zip(maps0, ar.sum(axis=channel_axis))])
                   if spatial else np.full(len(x), np.nan),
                   entropy=np.array([similarity.discrete_entropy(ai, bins) for ai in ar]))
        ev.layers.append(row)
        last = row
    ev.scores["spearman/last"] = last["spearman"]
    ev.scores["ssim/last"] = last["ssim"]
    with np.errstate(divide="ignore", invalid="ignore"):
        ev.scores["emprt"] = (last["entropy"] - h0) / h0
