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


def _array_or_scalar(name: str, value):
    """A real scalar (float) or a numeric array, as given; anything else is refused."""
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
    input), ``n_steps`` points on the path, ``integration`` the rule (captum's ``method``)."""

    baselines: object = None
    n_steps: int = 50
    integration: str = "gausslegendre"

    def __post_init__(self):
        _int("n_steps", self.n_steps)
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
            noise = np.asarray(self.noise)
            if noise.dtype.kind != "f" or noise.ndim < 1 or not np.all(np.isfinite(noise)):
                raise InputError("noise must be a finite float array of samples x input shape")
            if self.nt_samples is not None and self.nt_samples != noise.shape[0]:
                raise InputError(f"noise has {noise.shape[0]} samples, nt_samples says {self.nt_samples}: give one "
                                 "of them (or the two alike)")
            object.__setattr__(self, "noise", noise)
        object.__setattr__(self, "nt_samples", 5 if self.noise is None and self.nt_samples is None else
                           int(self.nt_samples if self.noise is None else self.noise.shape[0]))


@dataclass(frozen=True, eq=False)
class OcclusionOptions:
    """``occlusion`` (captum's Occlusion): windows of ``sliding_window_shapes`` (the input's shape without its batch
    axis) moved by ``strides`` (an int or one per axis) and filled with ``baselines`` (a number or an array)."""

    sliding_window_shapes: tuple = ()
    strides: object = 1
    baselines: object = 0.0

    def __post_init__(self):
        shapes = self.sliding_window_shapes
        if isinstance(shapes, numbers.Integral):
            shapes = (shapes,)
        if not shapes or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 1
                                 for s in shapes):
            raise InputError(f"sliding_window_shapes must be a tuple of ints >= 1 (one per input axis after the "
                             f"batch axis), not {self.sliding_window_shapes!r}")
        object.__setattr__(self, "sliding_window_shapes", tuple(int(s) for s in shapes))
        strides = (self.strides,) * len(shapes) if isinstance(self.strides, numbers.Integral) else self.strides
        try:
            strides = tuple(_int("strides", s) for s in strides)
        except TypeError:
            raise InputError(f"strides must be an int or a tuple of ints, not {self.strides!r}") from None
        if len(strides) != len(shapes):
            raise InputError(f"strides has {len(strides)} entries, sliding_window_shapes {len(shapes)}: give one "
                             "per axis (or one int)")
        object.__setattr__(self, "strides", strides)
        object.__setattr__(self, "baselines", _array_or_scalar("baselines", self.baselines))


OPTIONS = {"gradient": GradientOptions, "gradient-x-input": InputXGradientOptions,
           "integrated-gradients": IntegratedGradientsOptions, "smoothgrad": NoiseTunnelOptions,
           "vargrad": NoiseTunnelOptions, "occlusion": OcclusionOptions}


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
           "NoiseTunnelOptions", "OcclusionOptions", "OPTIONS", "NT_TYPES", "make_options"]
