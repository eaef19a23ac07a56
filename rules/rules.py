"""LRP rules as configuration of one generic step.

Every rule for a linear layer ``z = f(x; w, b)`` is a list of *groups*; each group is a list of *terms*
``(input modifier, weight modifier, bias modifier, sign)``. The engine (``onnx_lrp.propagate``) computes, per
group g::

    z_g   = sum_k sign_k * f(xmod_k(x); wmod_k(w), bmod_k(b))
    s_g   = coef_g * r_out * mask_g(z) / stab(z_g)
    r_in += sum_k sign_k * xmod_k(x) * f^T(s_g; wmod_k(w))

with zennit's stabiliser ``stab(z) = z + eps * (sign(z) + (z == 0))``. Rules hold numbers only; what a
convolution's or a matmul's transpose is lives beside the op, in ``onnx_lrp.ops``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, ClassVar

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
else:  # numpy is imported on first use: listing composites (`onnx-lrp composites`) does not need it
    class _LazyNumpy:
        def __getattr__(self, name):
            import numpy
            globals()["np"] = numpy
            return getattr(numpy, name)

    np = _LazyNumpy()

ArrayFn = Callable[["np.ndarray"], "np.ndarray"]


def _identity(a: np.ndarray) -> np.ndarray:
    return a


def _pos(a: np.ndarray) -> np.ndarray:
    return np.clip(a, 0, None)


def _neg(a: np.ndarray) -> np.ndarray:
    return np.clip(a, None, 0)


def _ones(a: np.ndarray) -> np.ndarray:
    return np.ones_like(a)


def _square(a: np.ndarray) -> np.ndarray:
    return a * a


@dataclass(frozen=True)
class Term:
    """One summand ``sign * f(xmod(x); wmod(w), bmod(b))`` of a group.

    ``x`` names the input modifier: ``identity``, ``positive``, ``negative``, ``ones``, or ``constant`` (then
    ``x_value`` holds the array, e.g. ZBox's bounds). ``b`` is None when the term carries no bias.
    """

    x: str = "identity"
    w: ArrayFn = _identity
    b: ArrayFn | None = _identity
    sign: float = 1.0
    x_value: object = None
    tag: str = ""


@dataclass(frozen=True)
class Group:
    """Terms sharing one denominator; ``mask`` keeps outputs whose forward z is ``positive``/``negative``."""

    terms: tuple[Term, ...]
    coef: float = 1.0
    mask: str | None = None
    tag: str = ""


class Rule:
    """Base of all rules; ``name`` is how composites refer to it."""

    name: ClassVar[str] = ""
    needs_params: ClassVar[bool] = False

    def params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


class LinearRule(Rule):
    """A rule for linear layers, given as groups of terms."""

    def groups(self) -> tuple[Group, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def eps(self) -> float:
        return float(getattr(self, "epsilon", None) if hasattr(self, "epsilon") else self.stabilizer)


@dataclass(frozen=True)
class Epsilon(LinearRule):
    """R_i = x_i sum_j w_ij R_j / stab(z_j)  (LRP-epsilon, Bach et al. 2015; epsilon = 0 is LRP-0)."""

    name: ClassVar[str] = "epsilon"
    epsilon: float = 1e-6

    def groups(self):
        return (Group((Term(),)),)


@dataclass(frozen=True)
class Norm(LinearRule):
    """R_i = x_i sum_j w_ij R_j / stab(z_j) with the layer's own weights, for sums and average pools (zennit Norm)."""

    name: ClassVar[str] = "norm"
    stabilizer: float = 1e-6

    def groups(self):
        return (Group((Term(),)),)


@dataclass(frozen=True)
class ZPlus(LinearRule):
    """R_i = sum_j (x_i+ w_ij+ + x_i- w_ij-) R_j / stab(z_j+), bias b+ (LRP-z+, Montavon et al. 2017; zennit)."""

    name: ClassVar[str] = "zplus"
    needs_params: ClassVar[bool] = True
    stabilizer: float = 1e-6

    def groups(self):
        return (Group((Term("positive", _pos, _pos, tag="pp"), Term("negative", _neg, None, tag="nn"))),)


@dataclass(frozen=True)
class AlphaBeta(LinearRule):
    """R = alpha R(x+w+ + x-w-) - beta R(x+w- + x-w+), alpha - beta = 1 (Bach et al. 2015; zennit)."""

    name: ClassVar[str] = "alpha-beta"
    needs_params: ClassVar[bool] = True
    alpha: float = 2.0
    beta: float = 1.0
    stabilizer: float = 1e-6

    def __post_init__(self):
        if self.alpha < 0 or self.beta < 0 or abs(self.alpha - self.beta - 1.0) > 1e-12:
            raise ValueError(f"alpha-beta rule needs alpha - beta = 1 and both >= 0 (got alpha={self.alpha}, "
                             f"beta={self.beta})")

    def groups(self):
        g_alpha = Group((Term("positive", _pos, _pos, tag="pp"), Term("negative", _neg, None, tag="nn")),
                        coef=self.alpha, tag="alpha")
        g_beta = Group((Term("positive", _neg, _neg, tag="pn"), Term("negative", _pos, None, tag="np")),
                       coef=-self.beta, tag="beta")
        return (g_alpha, g_beta) if self.beta != 0 else (g_alpha,)


@dataclass(frozen=True)
class Gamma(LinearRule):
    """R favours w+ (w + gamma w+) for positive outputs and w- for negative ones (Montavon et al. 2019; zennit)."""

    name: ClassVar[str] = "gamma"
    needs_params: ClassVar[bool] = True
    gamma: float = 0.25
    stabilizer: float = 1e-6

    def __post_init__(self):
        if not self.gamma >= 0:
            raise ValueError(f"gamma rule needs gamma >= 0 (got {self.gamma})")

    def groups(self):
        g = self.gamma

        def up(a):
            return a + g * _pos(a)

        def down(a):
            return a + g * _neg(a)

        pos_out = Group((Term("positive", up, up, tag="pu"), Term("negative", down, None, tag="nd")),
                        mask="positive", tag="pos")
        neg_out = Group((Term("positive", down, down, tag="pd"), Term("negative", up, None, tag="nu")),
                        mask="negative", tag="neg")
        return (pos_out, neg_out)


@dataclass(frozen=True)
class ZBox(LinearRule):
    """R_i = (x_i w_ij - l_i w_ij+ - h_i w_ij-) R_j / stab(z_j) for inputs in [low, high] (Montavon et al. 2017)."""

    name: ClassVar[str] = "zbox"
    needs_params: ClassVar[bool] = True
    low: object = None  # no default (as in zennit): the input's range must be given
    high: object = None
    stabilizer: float = 1e-6

    def __post_init__(self):
        if self.low is None or self.high is None:
            return  # refused when the rule is applied (onnx_lrp.rewriter.check_bounds), naming the composite
        if isinstance(self.low, (int, float)) and isinstance(self.high, (int, float)):  # without numpy
            if self.low > self.high:
                raise ValueError("zbox rule needs low <= high")
            return
        lo, hi = np.asarray(self.low, dtype=np.float64), np.asarray(self.high, dtype=np.float64)
        try:
            bad = bool(np.any(np.broadcast_arrays(lo, hi)[0] > np.broadcast_arrays(lo, hi)[1]))
        except ValueError:
            raise ValueError(f"zbox rule: low {lo.shape} and high {hi.shape} do not broadcast") from None
        if bad:
            raise ValueError("zbox rule needs low <= high")

    def groups(self):
        lo = np.asarray(self.low, dtype=np.float32)
        hi = np.asarray(self.high, dtype=np.float32)
        return (Group((Term(tag="x"),
                       Term("constant", _pos, _pos, sign=-1.0, x_value=lo, tag="low"),
                       Term("constant", _neg, _neg, sign=-1.0, x_value=hi, tag="high"))),)


@dataclass(frozen=True)
class Flat(LinearRule):
    """R_i = sum_j R_j / (number of inputs feeding j): weights set to 1, bias 0 (Lapuschkin et al. 2019; zennit)."""

    name: ClassVar[str] = "flat"
    needs_params: ClassVar[bool] = True
    stabilizer: float = 1e-6

    def groups(self):
        return (Group((Term("ones", _ones, None, tag="flat"),)),)


@dataclass(frozen=True)
class WSquare(LinearRule):
    """R_i = sum_j w_ij^2 R_j / stab(sum_i w_ij^2 + b_j^2) (Montavon et al. 2017; zennit squares the bias)."""

    name: ClassVar[str] = "wsquare"
    needs_params: ClassVar[bool] = True
    stabilizer: float = 1e-6

    def groups(self):
        return (Group((Term("ones", _square, _square, tag="w2"),)),)


@dataclass(frozen=True)
class Pass(Rule):
    """R_in = R_out: relevance passes an element-wise op unchanged (zennit Pass, LXT identity rule)."""

    name: ClassVar[str] = "pass"


@dataclass(frozen=True)
class Gradient(Rule):
    """R_in = J^T R_out: the op's own vector-Jacobian product (winner-takes-all at MaxPool, zennit's default)."""

    name: ClassVar[str] = "gradient"


@dataclass(frozen=True)
class GradientXInput(Rule):
    """R_x = x f'(x) R_y / f(x): gradient x input of y = f(x), for f(0) != 0 (LXT efficient mode's default)."""

    name: ClassVar[str] = "gradient-x-input"


RULES: dict[str, type[Rule]] = {cls.name: cls for cls in
                                (Epsilon, Norm, ZPlus, AlphaBeta, Gamma, ZBox, Flat, WSquare, Pass, Gradient,
                                 GradientXInput)}
RULE_ALIASES = {"alpha_beta": "alpha-beta", "alphabeta": "alpha-beta", "z-plus": "zplus", "w-square": "wsquare",
                "w2": "wsquare", "identity": "pass", "lrp0": "epsilon", "gxi": "gradient-x-input",
                "gradient_x_input": "gradient-x-input", "gradient*input": "gradient-x-input"}


def make_rule(name: str, **params) -> Rule:
    """Build a rule by name; unknown names and parameters raise ValueError naming the alternatives."""
    key = RULE_ALIASES.get(name.lower(), name.lower())
    if key not in RULES:
        raise ValueError(f"unknown rule {name!r}; known rules: {', '.join(sorted(RULES))}")
    cls = RULES[key]
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(params) - fields
    if unknown:
        raise ValueError(f"rule {key!r} takes no parameter {', '.join(sorted(unknown))}"
                         f" (it takes: {', '.join(sorted(fields)) or 'none'})")
    return cls(**params)


__all__ = ["Term", "Group", "Rule", "LinearRule", "Epsilon", "Norm", "ZPlus", "AlphaBeta", "Gamma", "ZBox",
           "Flat", "WSquare", "Pass", "Gradient", "GradientXInput", "RULES", "make_rule", "field"]
