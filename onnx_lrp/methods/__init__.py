"""Attribution methods beyond LRP on the same graph (issue 36): the gradient family (``gradient``,
``gradient-x-input``, ``integrated-gradients``, ``smoothgrad`` / ``vargrad``) as the true-gradient relevance graph
run at stacked inputs (:mod:`.gradients`), and ``occlusion`` as batched forwards of the original model
(:mod:`.occlusion`). Options take captum's names; each method's options are one frozen dataclass (:mod:`.options`).

    attribute(model, x, method="integrated-gradients", target=3, n_steps=32, baselines=0.0)

returns an array of ``x``'s shape."""
from __future__ import annotations

import numpy as np

from ..core.errors import InputError
from ..run import launch
from . import gradients, noise, occlusion
from .options import (OPTIONS, GradientOptions, InputXGradientOptions, IntegratedGradientsOptions,
                      NoiseTunnelOptions, OcclusionOptions, RunSettings, make_options)

METHODS = tuple(OPTIONS)
GRADIENT_METHODS = {"gradient": gradients.gradient, "gradient-x-input": gradients.gradient_x_input,
                    "integrated-gradients": gradients.integrated_gradients}
_SETTINGS = tuple(RunSettings.__dataclass_fields__)


class Attributor:
    """One method on one model, built once (the true-gradient relevance model, or the model's plain session):
    :meth:`attribute` explains any number of inputs with it."""

    def __init__(self, model, method: str = "integrated-gradients", **options):
        if method not in METHODS:
            raise InputError(f"unknown method {method!r}; the methods are {', '.join(METHODS)}")
        self.method = method
        self.settings = RunSettings(**{k: options.pop(k) for k in _SETTINGS if k in options})
        self.options = make_options(method, options)
        self.base = None
        if method == "occlusion":
            self.engine = occlusion.Forward(model, self.settings)
        elif method in GRADIENT_METHODS:
            self.engine = gradients.GradientRunner(model, self.settings)
        else:
            self.engine, self.base = self._base(model, self.options)

    def _base(self, model, options: NoiseTunnelOptions):
        """The noise tunnel's base: (engine, function(engine, rows, targets)) for a gradient method or a composite."""
        if options.base in GRADIENT_METHODS:
            base_options = make_options(options.base, dict(options.base_options))
            fn = GRADIENT_METHODS[options.base]
            return gradients.GradientRunner(model, self.settings), (
                lambda eng, rows, t: fn(eng, rows, t, base_options))
        if options.base in METHODS:
            raise InputError(f"base {options.base!r} cannot be smoothed: give gradient, gradient-x-input, "
                             "integrated-gradients or an LRP composite name")
        lrp = launch.runner(model, launch.ExplainOptions.from_keywords(
            options.base, self.settings.device, output=self.settings.output, threads=self.settings.threads,
            **dict(options.base_options)))
        return lrp, lambda eng, rows, t: eng.explain(rows, target=t).relevance

    def attribute(self, x, target=None) -> np.ndarray:
        """The attribution of ``target`` (an int, one per item, or None: the arg-max at ``x``) for ``x``, in x's
        shape."""
        if self.method == "occlusion":
            return self._occlusion(x, target)
        runner = self.engine if self.base is None else None
        if runner is None:
            xb, bare = self.noise_input(x)
            t = self._noise_targets(xb, target)
            out = noise.smooth(lambda rows, tt: self.base(self.engine, rows, tt), xb, t, self.options)
        else:
            xb, bare = runner.batch(x)
            t = runner.targets(xb, target)
            out = GRADIENT_METHODS[self.method](runner, xb, t, self.options)
        return out[0] if bare else out

    def noise_input(self, x):
        """``x`` as the noise tunnel's base takes it (with its batch axis) and whether it came without one."""
        if isinstance(self.engine, gradients.GradientRunner):
            return self.engine.batch(x)
        feeds = self.engine.checked_feeds(x)
        if len(feeds) != 1:
            raise InputError("smoothgrad takes a model with one input for now")
        a = next(iter(feeds.values()))
        if a.dtype.kind != "f":
            raise InputError(f"smoothgrad adds Gaussian noise: the input must be float, not {a.dtype}")
        return a, a.ndim != np.ndim(x)

    def _noise_targets(self, xb, target):
        if isinstance(self.engine, gradients.GradientRunner):
            return self.engine.targets(xb, target)
        t = self.engine.checked_targets(target, xb.shape[0])
        return t if np.all(t >= 0) else np.asarray(self.engine.explain(xb).target, np.int64).reshape(-1)

    def _occlusion(self, x, target):
        a, bare = self.engine.prepared(x)
        if target is not None and np.any(np.asarray(target) < 0):
            raise InputError(f"target must be >= 0, not {target!r}")
        out = occlusion.occlusion(self.engine, a, target, self.options)
        return out[0] if bare else out


def attribute(model, x, method: str = "integrated-gradients", target=None, **options) -> np.ndarray:
    """The attribution of ``target`` for ``x`` by ``method`` (one of :data:`METHODS`) with its options (captum's
    names: ``n_steps``, ``baselines``, ``integration``, ``nt_type``, ``nt_samples``, ``stdevs``, ``noise``, ``seed``,
    ``base``, ``sliding_window_shapes``, ``strides``, ``abs``) and the run settings (``output``, ``device``,
    ``threads``, ``internal_batch_size``, ``memory_budget``): an array of ``x``'s shape."""
    return Attributor(model, method, **options).attribute(x, target)


__all__ = ["attribute", "Attributor", "METHODS", "GradientOptions", "InputXGradientOptions",
           "IntegratedGradientsOptions", "NoiseTunnelOptions", "OcclusionOptions", "RunSettings"]
