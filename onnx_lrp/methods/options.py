"""One frozen options dataclass per method, with captum's option names, each checked once when it is made (a bad
value is refused in one line naming the option and what it takes)."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from ..core.errors import InputError
from .integration import RULES

NT_TYPES = ("smoothgrad", "smoothgrad_sq", "vargrad")
DEFAULT_BUDGET = 2 * 2**30  # bytes: the memory one stacked run may take (the default, 2 GB)


def _int(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise InputError(f"{name} must be an int >= {low}, not {value!r}")
    return int(value)


def _per_input(check, name: str, value, *args):
    """``check(name, value, *args)`` on each value of a tuple or dict given per input (a model with several
    inputs; :mod:`.packing`), or on the value itself."""
    if isinstance(value, tuple):
        return tuple(check(name, v, *args) for v in value)
    if isinstance(value, dict):
        return {k: check(name, v, *args) for k, v in value.items()}
    return check(name, value, *args)


def _rows(value) -> int:
    """The number of rows of an array, or of the first of several given per input."""
    first = value[0] if isinstance(value, tuple) else next(iter(value.values())) if isinstance(value, dict) else value
    return int(np.shape(first)[0])


def _array_or_scalar(name: str, value):
    """A real scalar (float) or a numeric array, as given; anything else is refused."""
    if isinstance(value, (tuple, dict)):
        return _per_input(_array_or_scalar, name, value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    a = np.asarray(value)
    if a.dtype.kind not in "fiu" or not np.all(np.isfinite(a)):
        raise InputError(f"{name} must be a finite number or an array of numbers, not {type(value).__name__}")
    return a


@dataclass(frozen=True)
class RunSettings:
    """What runs every method: the explained output, the device and threads, and how many stacked rows one run
    takes (``internal_batch_size``, captum's name; None: as many as ``memory_budget`` allows)."""

    output: str | None = None
    device: str = "cpu"
    threads: int | None = None
    internal_batch_size: int | None = None
    memory_budget: int = DEFAULT_BUDGET

    def __post_init__(self):
        if self.internal_batch_size is not None:
            _int("internal_batch_size", self.internal_batch_size)
        _int("memory_budget", self.memory_budget)


@dataclass(frozen=True)
class GradientOptions:
    """``gradient`` (saliency): the gradient of the explained output's entry; ``abs=True``: its magnitude (captum's
    Saliency default; here the signed gradient is the default, as zennit's Gradient)."""

    abs: bool = False

    def __post_init__(self):
        if not isinstance(self.abs, bool):
            raise InputError(f"abs must be True or False, not {self.abs!r}")


@dataclass(frozen=True)
class InputXGradientOptions:
    """``gradient-x-input``: the gradient times the input (captum's InputXGradient); no options."""


@dataclass(frozen=True, eq=False)
class IntegratedGradientsOptions:
    """``integrated-gradients``: ``baselines`` (a number or an array broadcast to the input; None: 0 for a float
    input), ``n_steps`` points on the path, ``integration`` the rule (captum's ``method``). ``base``: ``"gradient"``
    (the true gradient, captum's IntegratedGradients), or an LRP composite's name whose modified gradient is
    integrated instead (zennit's ``IntegratedGradients(model, composite=...)``: the composite's relevance started
    from 1 at the target, ``base_options`` its rule parameters and ``start``)."""

    baselines: object = None
    n_steps: int = 50
    integration: str = "gausslegendre"
    base: str = "gradient"
    base_options: dict = field(default_factory=dict)

    def __post_init__(self):
        _int("n_steps", self.n_steps)
        if not isinstance(self.base, str) or not self.base:
            raise InputError(f"base must be 'gradient' or an LRP composite name, not {self.base!r}")
        if self.base in OPTIONS and self.base != "gradient":
            raise InputError(f"integrated-gradients integrates the gradient or a composite's modified gradient: "
                             f"give base='gradient' or an LRP composite name, not the method {self.base!r}")
        if not isinstance(self.base_options, dict):
            raise InputError(f"base_options must be a dict of the composite's parameters, not {self.base_options!r}")
        if self.base_options and self.base == "gradient":
            raise InputError("base_options are a composite's parameters: give base= an LRP composite name")
        if self.integration not in RULES:
            raise InputError(f"integration must be one of {', '.join(RULES)}, not {self.integration!r}")
        if self.integration != "gausslegendre" and self.n_steps < 2:
            raise InputError(f"integration {self.integration!r} needs n_steps >= 2, not {self.n_steps}")
        if self.baselines is not None:
            object.__setattr__(self, "baselines", _array_or_scalar("baselines", self.baselines))


@dataclass(frozen=True, eq=False)
class NoiseTunnelOptions:
    """``smoothgrad`` / ``vargrad`` (captum's NoiseTunnel): ``nt_samples`` noisy copies of the input with Gaussian
    noise of standard deviation ``stdevs`` (drawn with ``seed``, or given as ``noise``: samples x input shape), the
    ``base`` method run on them (``"gradient"``, ``"gradient-x-input"``, or an LRP composite's name) and their mean
    (smoothgrad), mean of squares (smoothgrad_sq) or variance (vargrad)."""

    nt_type: str = "smoothgrad"
    nt_samples: int | None = None  # None: noise's samples, else 5 (captum's default)
    stdevs: float = 1.0
    seed: int | None = None
    noise: object = None
    base: str = "gradient"
    base_options: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.nt_type not in NT_TYPES:
            raise InputError(f"nt_type must be one of {', '.join(NT_TYPES)}, not {self.nt_type!r}")
        if self.nt_samples is not None:
            _int("nt_samples", self.nt_samples)
        if isinstance(self.stdevs, bool) or not isinstance(self.stdevs, numbers.Real) or not self.stdevs >= 0:
            raise InputError(f"stdevs must be a number >= 0, not {self.stdevs!r}")
        if self.seed is not None:
            _int("seed", self.seed, low=0)
        if not isinstance(self.base, str) or not self.base:
            raise InputError(f"base must be a method or composite name, not {self.base!r}")
        if self.base in ("smoothgrad", "vargrad", "occlusion"):
            raise InputError(f"base {self.base!r} cannot be smoothed: give gradient, gradient-x-input, "
                             "integrated-gradients or an LRP composite name")
        if self.noise is not None:
            noise = _per_input(_optional_array, "noise", self.noise, "f", 1)
            if self.nt_samples is not None and self.nt_samples != _rows(noise):
                raise InputError(f"noise has {_rows(noise)} samples, nt_samples says {self.nt_samples}: give one "
                                 "of them (or the two alike)")
            object.__setattr__(self, "noise", noise)
        object.__setattr__(self, "nt_samples", 5 if self.noise is None and self.nt_samples is None else
                           int(self.nt_samples if self.noise is None else _rows(self.noise)))


def _window(shapes, strides, given_shapes, given_strides) -> tuple:
    """(window, strides) of one input as tuples of ints; ``given_*`` as the user wrote them (for the message)."""
    if isinstance(shapes, numbers.Integral):
        shapes = (shapes,)
    if not shapes or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 1 for s in shapes):
        raise InputError(f"sliding_window_shapes must be a tuple of ints >= 1 (one per input axis after the batch "
                         f"axis; a tuple of such tuples for several inputs), not {given_shapes!r}")
    strides = (strides,) * len(shapes) if isinstance(strides, numbers.Integral) else strides
    try:
        strides = tuple(_int("strides", s) for s in strides)
    except TypeError:
        raise InputError(f"strides must be an int or a tuple of ints, not {given_strides!r}") from None
    if len(strides) != len(shapes):
        raise InputError(f"strides has {len(strides)} entries, sliding_window_shapes {len(shapes)}: give one per "
                         "axis (or one int)")
    return tuple(int(s) for s in shapes), strides


@dataclass(frozen=True, eq=False)
class OcclusionOptions:
    """``occlusion`` (captum's Occlusion): windows of ``sliding_window_shapes`` (the input's shape without its batch
    axis) moved by ``strides`` (an int or one per axis) and filled with ``baselines`` (a number or an array). A model
    with several inputs: a tuple of windows (and of strides, baselines) with one per input, each input occluded
    while the others stay as given, as captum."""

    sliding_window_shapes: tuple = ()
    strides: object = 1
    baselines: object = 0.0

    def __post_init__(self):
        shapes = self.sliding_window_shapes
        if isinstance(shapes, (tuple, list)) and shapes and all(isinstance(w, (tuple, list)) for w in shapes):
            strides = self.strides if isinstance(self.strides, (tuple, list)) and len(self.strides) == len(shapes) \
                and not isinstance(self.strides[0], numbers.Integral) else (self.strides,) * len(shapes)
            pairs = [_window(w, st, self.sliding_window_shapes, self.strides) for w, st in zip(shapes, strides)]
            object.__setattr__(self, "sliding_window_shapes", tuple(w for w, _ in pairs))  # one per input
            object.__setattr__(self, "strides", tuple(st for _, st in pairs))
        else:
            shapes, strides = _window(shapes, self.strides, shapes, self.strides)
            object.__setattr__(self, "sliding_window_shapes", shapes)
            object.__setattr__(self, "strides", strides)
        object.__setattr__(self, "baselines", _array_or_scalar("baselines", self.baselines))


def _optional_array(name: str, value, kind: str, ndim: int):
    """``value`` as a finite array of ``kind`` ("f" float, "i" int) with at least ``ndim`` axes, or None."""
    if value is None:
        return None
    a = np.asarray(value)
    ok = a.dtype.kind == "f" if kind == "f" else a.dtype.kind in "iu"
    if not ok or a.ndim < ndim or a.size == 0 or (kind == "f" and not np.all(np.isfinite(a))):
        what = "float" if kind == "f" else "integer"
        raise InputError(f"{name} must be a finite {what} array with at least {ndim} axes, not {type(value).__name__}"
                         f"{'' if not hasattr(value, 'shape') else ' of shape ' + str(np.shape(value))}")
    return a


def _stdevs(value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
        raise InputError(f"stdevs must be a number >= 0, not {value!r}")
    return float(value)


@dataclass(frozen=True, eq=False)
class ExpectedGradientsOptions:
    """``expected-gradients`` / ``gradient-shap`` (captum's GradientShap): ``n_samples`` draws per item, each a
    baseline picked from the background set ``baselines`` (n x the input's shape after its batch axis), a point at
    ``alpha`` ~ U(0, 1) on the path from it to the input plus Gaussian noise of ``stdevs`` (0: none, Expected
    Gradients), and the mean of gradient x (noisy input - baseline). The draws come from ``seed``, or are given:
    ``baseline_indices`` (samples x batch, into the background set), ``alphas`` (samples x batch) and ``noise``
    (samples x the input's shape)."""

    baselines: object = None
    n_samples: int | None = None  # None: the given draws' samples, else 5 (captum's default)
    stdevs: float = 0.0
    seed: int | None = None
    baseline_indices: object = None
    alphas: object = None
    noise: object = None

    def __post_init__(self):
        if self.baselines is None:
            raise InputError("expected-gradients needs baselines=: a background set, n x the input's shape after its "
                             "batch axis (e.g. some training inputs)")
        object.__setattr__(self, "baselines", _per_input(_optional_array, "baselines", self.baselines, "f", 1))
        if self.seed is not None:
            _int("seed", self.seed, low=0)
        object.__setattr__(self, "stdevs", _stdevs(self.stdevs))
        given = {}
        for name, kind in (("baseline_indices", "i"), ("alphas", "f"), ("noise", "f")):
            a = _per_input(_optional_array, name, getattr(self, name), kind, 1) if name == "noise" else \
                _optional_array(name, getattr(self, name), kind, 1)
            object.__setattr__(self, name, a)
            if a is not None:
                given[name] = _rows(a)
        if self.alphas is not None and (np.any(self.alphas < 0) or np.any(self.alphas > 1)):
            raise InputError("alphas must lie in [0, 1] (the points on the path from the baseline to the input)")
        if self.baseline_indices is not None and (np.any(self.baseline_indices < 0) or
                                                  np.any(self.baseline_indices >= _rows(self.baselines))):
            raise InputError(f"baseline_indices must lie in [0, {_rows(self.baselines)}) (the background set's rows)")
        if self.n_samples is not None:
            given["n_samples"] = _int("n_samples", self.n_samples)
        if len(set(given.values())) > 1:
            raise InputError("the samples disagree: " + ", ".join(f"{k} {v}" for k, v in given.items()) +
                             "; give the same number of samples to each")
        object.__setattr__(self, "n_samples", next(iter(given.values()), 5))


INTERPOLATE_MODES = ("nearest", "bilinear", "none")


@dataclass(frozen=True)
class GradCamOptions:
    """``grad-cam`` (captum's LayerGradCam + LayerAttribution.interpolate): at the named tensor ``layer`` (N x C x
    spatial axes), the channels weighted by their mean gradient, summed, ReLU'd when ``relu_attributions``, and
    upsampled to the input's spatial axes by ``interpolate_mode`` (``"nearest"`` as captum's default,
    ``"bilinear"`` (linear on every axis, half-pixel centres), ``"none"``: the layer's own size)."""

    layer: str = ""
    relu_attributions: bool = False
    interpolate_mode: str = "nearest"

    def __post_init__(self):
        if not isinstance(self.layer, str) or not self.layer:
            raise InputError("grad-cam needs layer=: the name of a tensor N x C x H x W in the model (e.g. the last "
                             "convolution block's output)")
        if not isinstance(self.relu_attributions, bool):
            raise InputError(f"relu_attributions must be True or False, not {self.relu_attributions!r}")
        if self.interpolate_mode not in INTERPOLATE_MODES:
            raise InputError(f"interpolate_mode must be one of {', '.join(INTERPOLATE_MODES)}, not "
                             f"{self.interpolate_mode!r}")


@dataclass(frozen=True, eq=False)
class RiseOptions:
    """``rise``: ``n_masks`` random masks of ``cells`` cells per masked axis, each cell kept with ``probability``
    (drawn with ``seed``, or given as ``masks``: n_masks x the input's trailing axes), the masked-out entries filled
    with ``baselines``."""

    n_masks: int | None = None  # None: masks' count, else 2000
    probability: float = 0.5
    cells: int = 7
    seed: int | None = None
    masks: object = None
    baselines: object = 0.0

    def __post_init__(self):
        p = self.probability
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 < p <= 1:
            raise InputError(f"probability must be a number in (0, 1], not {p!r}")
        object.__setattr__(self, "probability", float(p))
        _int("cells", self.cells)
        if self.seed is not None:
            _int("seed", self.seed, low=0)
        masks = _optional_array("masks", self.masks, "f", 2)
        if masks is not None and (np.any(masks < 0) or np.any(masks > 1)):
            raise InputError("masks must lie in [0, 1] (1 keeps an entry, 0 fills it with the baseline)")
        object.__setattr__(self, "masks", masks)
        if self.n_masks is not None:
            _int("n_masks", self.n_masks)
            if masks is not None and self.n_masks != masks.shape[0]:
                raise InputError(f"masks has {masks.shape[0]} masks, n_masks says {self.n_masks}: give one of them")
        object.__setattr__(self, "n_masks", 2000 if masks is None and self.n_masks is None else
                           int(self.n_masks if masks is None else masks.shape[0]))
        object.__setattr__(self, "baselines", _array_or_scalar("baselines", self.baselines))


OPTIONS = {"gradient": GradientOptions, "gradient-x-input": InputXGradientOptions,
           "integrated-gradients": IntegratedGradientsOptions, "smoothgrad": NoiseTunnelOptions,
           "vargrad": NoiseTunnelOptions, "occlusion": OcclusionOptions,
           "expected-gradients": ExpectedGradientsOptions, "gradient-shap": ExpectedGradientsOptions,
           "grad-cam": GradCamOptions, "rise": RiseOptions}


def make_options(method: str, options: dict):
    """The method's options dataclass from keyword arguments; an unknown option is refused naming the known ones."""
    cls = OPTIONS[method]
    known = set(cls.__dataclass_fields__)
    unknown = set(options) - known
    if unknown:
        raise InputError(f"method {method!r} takes no option {', '.join(sorted(unknown))} (it takes: "
                         f"{', '.join(sorted(known)) or 'none'})")
    if method == "vargrad":
        if options.get("nt_type", "vargrad") != "vargrad":
            raise InputError("method 'vargrad' is nt_type 'vargrad'; use method 'smoothgrad' for other nt_types")
        options = {**options, "nt_type": "vargrad"}
    return cls(**options)


__all__ = ["RunSettings", "GradientOptions", "InputXGradientOptions", "IntegratedGradientsOptions",
           "NoiseTunnelOptions", "OcclusionOptions", "ExpectedGradientsOptions", "GradCamOptions",
           "RiseOptions", "OPTIONS", "NT_TYPES", "make_options"]
