"""Attribution methods beyond LRP on the same graph (issue 36): the gradient family (``gradient``,
``gradient-x-input``, ``integrated-gradients``, ``smoothgrad`` / ``vargrad``, ``expected-gradients`` /
``gradient-shap`` (:mod:`.expected`), ``grad-cam`` at a named tensor (:mod:`.gradcam`)) as the true-gradient
relevance graph run at stacked inputs (:mod:`.gradients`), and ``occlusion`` and ``rise`` (:mod:`.rise`) as batched
forwards of the original model (:mod:`.occlusion`); ``integrated-gradients`` and ``smoothgrad`` with ``base=`` an LRP
composite run its relevance model instead (:func:`.integration.integrated_relevance`, :mod:`.noise`). Options take
captum's names; each method's options are one frozen dataclass (:mod:`.options`).

    attribute(model, x, method="integrated-gradients", target=3, n_steps=32, baselines=0.0)

returns an array of ``x``'s shape (``grad-cam`` and ``rise`` with masks over the spatial axes: N x 1 x those axes,
as captum's LayerGradCam); for a model with several float inputs the gradient methods take and give a tuple (or a
dict by input name), as captum."""
from __future__ import annotations

import warnings

import numpy as np

from ..core.errors import InputError, LrpWarning
from ..run import launch
from . import budget, expected, gradcam, gradients, integration, noise, occlusion, rise
from .options import (OPTIONS, ExpectedGradientsOptions, GradCamOptions, GradientOptions, InputXGradientOptions,
                      IntegratedGradientsOptions, NoiseTunnelOptions, OcclusionOptions, RiseOptions, RunSettings,
                      make_options)

METHODS = tuple(OPTIONS)
GRADIENT_METHODS = {"gradient": gradients.gradient, "gradient-x-input": gradients.gradient_x_input,
                    "integrated-gradients": gradients.integrated_gradients,
                    "expected-gradients": expected.expected_gradients, "gradient-shap": expected.expected_gradients}
RUNNER_METHODS = {**GRADIENT_METHODS, "grad-cam": gradcam.grad_cam}  # run on self.engine, a GradientRunner
FORWARD_METHODS = {"occlusion": occlusion.occlusion, "rise": rise.rise}
_SETTINGS = tuple(RunSettings.__dataclass_fields__)


def _path_relevance(lrp, rows, targets):
    """The composite's relevance at points of the integration path: not conserved there (the start is 1 at any point
    of the path), so the conservation warning is not given."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LrpWarning)
        return lrp.explain(rows, target=targets).relevance


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
        if method in FORWARD_METHODS:
            self.engine = occlusion.Forward(model, self.settings)
        elif method == "grad-cam":
            self.engine = gradcam.LayerRunner(model, self.settings, self.options.layer)
        elif method == "integrated-gradients" and self.options.base != "gradient":
            self.engine = self._lrp(model, self.options.base, {"start": "one-hot", **self.options.base_options})
            self.base = _path_relevance
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
        lrp = self._lrp(model, options.base, dict(options.base_options))
        return lrp, lambda eng, rows, t: eng.explain(rows, target=t).relevance

    def _lrp(self, model, composite: str, keywords: dict):
        """The LRP runner of ``composite`` (its rule parameters and ``start`` in ``keywords``) with the settings."""
        return launch.runner(model, launch.ExplainOptions.from_keywords(
            composite, self.settings.device, output=self.settings.output, threads=self.settings.threads, **keywords))

    def attribute(self, x, target=None) -> np.ndarray:
        """The attribution of ``target`` (an int, one per item, or None: the arg-max at ``x``) for ``x``, in x's
        shape."""
        if self.method in FORWARD_METHODS:
            return self._occlusion(x, target)
        if self.base is not None and not isinstance(self.engine, gradients.GradientRunner):
            return self._over_composite(x, target)
        runner = self.engine if self.base is None else None
        if runner is None:
            xb, bare = self.noise_input(x)
            t = self._noise_targets(xb, target)
            options = self.engine.packed_options(self.method, self.options, xb)
            out = noise.smooth(lambda rows, tt: self.base(self.engine, rows, tt), xb, t, options)
            return self.engine.result(out, x, bare)
        xb, bare = runner.batch(x)
        t = runner.targets(xb, target)
        out = RUNNER_METHODS[self.method](runner, xb, t, runner.packed_options(self.method, self.options, xb))
        return runner.result(out, x, bare)

    def _over_composite(self, x, target):
        """SmoothGrad / VarGrad or Integrated Gradients over an LRP composite: its relevance at the noisy samples
        or the path's points, the attributed inputs moved (packed when several), the others held as given."""
        moved = self._moved(x)
        xb = moved.x
        t = self._noise_targets(xb, target, moved)
        options = moved.options(self.method, self.options, xb)

        def base(rows, tt):
            return moved.relevance(lambda feeds, t2: self.base(self.engine, feeds, t2), rows, tt)

        if self.method == "integrated-gradients":
            out = integration.integrated_relevance(base, xb, t, options, self._rows(xb))
        else:
            out = noise.smooth(base, xb, t, options)
        return moved.result(out, x)

    def _moved(self, x) -> noise.Moved:
        return noise.Moved(self.engine, x, f"{self.method} over composite {self.options.base!r}")

    def noise_input(self, x):
        """``x`` as the noise tunnel's base (or the composite of integrated-gradients) takes it (with its batch
        axis; several float inputs: packed) and whether it came without one."""
        if isinstance(self.engine, gradients.GradientRunner):
            return self.engine.batch(x)
        moved = self._moved(x)
        return moved.x, moved.bare

    def _rows(self, x: np.ndarray) -> int:
        """Stacked rows per run of the LRP base: ``internal_batch_size``, else as many as the memory budget allows."""
        if self.settings.internal_batch_size is not None:
            return self.settings.internal_batch_size
        return max(1, self.settings.memory_budget // (max(1, x[:1].nbytes) * budget.ROW_FACTOR))

    def _noise_targets(self, xb, target, moved: noise.Moved | None = None):
        if isinstance(self.engine, gradients.GradientRunner):
            return self.engine.targets(xb, target)
        t = self.engine.checked_targets(target, xb.shape[0])
        feeds = xb if moved is None else moved.feeds(xb)
        return t if np.all(t >= 0) else np.asarray(self.engine.explain(feeds).target, np.int64).reshape(-1)

    def _occlusion(self, x, target):
        a, bare = self.engine.prepared(x)
        if target is not None and np.any(np.asarray(target) < 0):
            raise InputError(f"target must be >= 0, not {target!r}")
        out = FORWARD_METHODS[self.method](self.engine, a, target, self.options)
        if isinstance(a, dict) and not isinstance(out, dict):  # rise: the one float input's map, the others held
            out = {occlusion.occluded(a)[0]: out}
        if isinstance(out, dict):
            return occlusion.in_form({k: v[0] if bare else v for k, v in out.items()}, x, self.engine.names)
        return out[0] if bare else out


def attribute(model, x, method: str = "integrated-gradients", target=None, **options) -> np.ndarray:
    """The attribution of ``target`` for ``x`` by ``method`` (one of :data:`METHODS`) with its options (captum's
    names: ``n_steps``, ``baselines``, ``integration``, ``nt_type``, ``nt_samples``, ``stdevs``, ``noise``, ``seed``,
    ``base``, ``sliding_window_shapes``, ``strides``, ``abs``, ``n_samples``, ``layer``, ``relu_attributions``;
    and ``base_options``, ``baseline_indices``, ``alphas``, ``interpolate_mode``, ``n_masks``, ``probability``,
    ``cells``, ``masks``)
    and the run settings (``output``, ``device``, ``threads``, ``internal_batch_size``, ``memory_budget``): an array
    of ``x``'s shape."""
    return Attributor(model, method, **options).attribute(x, target)


__all__ = ["attribute", "Attributor", "METHODS", "GradientOptions", "InputXGradientOptions",
           "IntegratedGradientsOptions", "NoiseTunnelOptions", "OcclusionOptions", "ExpectedGradientsOptions",
           "GradCamOptions", "RiseOptions", "RunSettings"]
