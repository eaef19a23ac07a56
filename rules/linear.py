"""The rules for linear layers (epsilon, norm, z+, alpha-beta, gamma, ZBox, flat, w²), each given as data: groups of
terms of one generic step.

Every rule for a linear layer ``z = f(x; w, b)`` is a list of *groups*; each group is a list of *terms*
``(input modifier, weight modifier, bias modifier, sign)``. The engine (``onnx_lrp.lrp.engine``) computes, per
group g::

    z_g   = sum_k sign_k * f(xmod_k(x); wmod_k(w), bmod_k(b))
    s_g   = coef_g * r_out * mask_g(z) / stab(z_g)
    r_in += sum_k sign_k * xmod_k(x) * f^T(s_g; wmod_k(w))

with zennit's stabiliser ``stab(z) = z + eps * (sign(z) + (z == 0))``. Rules hold numbers only; what a
convolution's or a matmul's transpose is lives beside the op, in ``onnx_lrp.lrp.ops``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Mapping

from onnx_lrp.lrp.families import Family, FamilyRule, family_table
from onnx_lrp.lrp.vocabulary import Category, XMod, ZMask
from .base import Rule, engine, register_rule


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


@dataclass(frozen=True)
class WeightMod:
    """A named weight (or bias) modifier: ``fn`` maps the array. The engine shares convolutions between terms whose
    modifiers are the plain ones (``IDENTITY``, ``POSITIVE``, ``NEGATIVE``), which it recognises by ``name``."""

    name: str
    fn: ArrayFn

    def __call__(self, a: np.ndarray) -> np.ndarray:
        return self.fn(a)


IDENTITY = WeightMod("identity", lambda a: a)
POSITIVE = WeightMod("positive", lambda a: np.clip(a, 0, None))
NEGATIVE = WeightMod("negative", lambda a: np.clip(a, None, 0))
ONES = WeightMod("ones", lambda a: np.ones_like(a))
SQUARE = WeightMod("square", lambda a: a * a)


@dataclass(frozen=True)
class Term:
    """One summand ``sign * f(xmod(x); wmod(w), bmod(b))`` of a group.

    ``x`` names the input modifier (``XMod``): ``identity``, ``positive``, ``negative``, ``ones``, or ``constant``
    (then ``x_value`` holds the array, e.g. ZBox's bounds). ``b`` is None when the term carries no bias.
    """

    x: XMod = XMod.IDENTITY
    w: WeightMod = IDENTITY
    b: WeightMod | None = IDENTITY
    sign: float = 1.0
    x_value: object = None
    tag: str = ""


@dataclass(frozen=True)
class Group:
    """Terms sharing one denominator; ``mask`` (``ZMask``) keeps outputs whose forward z is positive / negative."""

    terms: tuple[Term, ...]
    coef: float = 1.0
    mask: ZMask | None = None
    tag: str = ""


def _held_scale(rule, em, layer, r_outs):
    """Epsilon / norm on a normalisation with its scale held (``NormScale``): R_n = z R / stab(z)."""
    return layer.op.held_scale(em, layer, r_outs, rule.eps())


def _held_scale_grad_form(rule, op):
    return rule.eps() == 0


def _held_scale_grad(rule, em, layer, r_outs):
    return layer.op.held_scale_grad(em, layer, r_outs)


# epsilon and norm on a normalisation whose scale is held: as on the linear map n -> n / s it is
HELD_SCALE = FamilyRule(_held_scale, _held_scale_grad_form, _held_scale_grad)


class LinearRule(Rule):
    """A rule for linear layers, given as groups of terms. ``plain``: one group of the unmodified layer (epsilon,
    norm), which for epsilon = 0 is exact in gradient form (LRP-0 = gradient x input)."""

    plain: ClassVar[bool] = False
    linear: ClassVar[bool] = True

    def groups(self) -> tuple[Group, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def eps(self) -> float:
        return float(getattr(self, "epsilon", None) if hasattr(self, "epsilon") else self.stabilizer)

    def fits_linear(self, op):
        if self.needs_params and not op.has_params:
            return f"rule {self.name} needs parameters; this {op.kind} has none (use norm or epsilon)"
        return None

    def fits_activation(self, op):
        return f"rule {self.name} needs a linear op (use pass)"

    def propagate_one(self, em, layer, r_out):
        if layer.op.category is not Category.LINEAR:
            return super().propagate_one(em, layer, r_out)
        return engine().linear_rule(em, layer, self, r_out)

    def gradient_form(self, op):
        if op.category is Category.LINEAR:
            return self.plain and self.eps() == 0
        return super().gradient_form(op)

    def propagate_grad(self, em, layer, r_outs):
        if layer.op.category is Category.LINEAR:
            return engine().linear_grad(em, layer, r_outs)
        return super().propagate_grad(em, layer, r_outs)

    def zero_preserving(self, op, node):
        return all(t.x in (XMod.IDENTITY, XMod.POSITIVE, XMod.NEGATIVE) for g in self.groups() for t in g.terms)


class PlainRule(LinearRule):
    """One group of the unmodified layer (epsilon, norm): exact in gradient form at epsilon = 0 (LRP-0 = gradient x
    input), and on a normalisation with its scale held as on the linear map n -> n / s it is (``HELD_SCALE``)."""

    plain: ClassVar[bool] = True
    families: ClassVar[Mapping[Family, FamilyRule]] = family_table({Family.NORM_SCALE: HELD_SCALE})

    def groups(self):
        return (Group((Term(),)),)


@register_rule(aliases=("lrp0",))
@dataclass(frozen=True)
class Epsilon(PlainRule):
    """R_i = x_i sum_j w_ij R_j / stab(z_j)  (LRP-epsilon, Bach et al. 2015; epsilon = 0 is LRP-0)."""

    name: ClassVar[str] = "epsilon"
    epsilon: float = 1e-6


@register_rule
@dataclass(frozen=True)
class Norm(PlainRule):
    """R_i = x_i sum_j w_ij R_j / stab(z_j) with the layer's own weights, for sums and average pools (zennit Norm)."""

    name: ClassVar[str] = "norm"
    stabilizer: float = 1e-6


@register_rule(aliases=("z-plus",))
@dataclass(frozen=True)
class ZPlus(LinearRule):
    """R_i = sum_j (x_i+ w_ij+ + x_i- w_ij-) R_j / stab(z_j+), bias b+ (LRP-z+, Montavon et al. 2017; zennit)."""

    name: ClassVar[str] = "zplus"
    needs_params: ClassVar[bool] = True
    stabilizer: float = 1e-6

    def groups(self):
        return (Group((Term(XMod.POSITIVE, POSITIVE, POSITIVE, tag="pp"),
                       Term(XMod.NEGATIVE, NEGATIVE, None, tag="nn"))),)


@register_rule(aliases=("alpha_beta", "alphabeta"))
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
        g_alpha = Group((Term(XMod.POSITIVE, POSITIVE, POSITIVE, tag="pp"),
                         Term(XMod.NEGATIVE, NEGATIVE, None, tag="nn")),
                        coef=self.alpha, tag="alpha")
        g_beta = Group((Term(XMod.POSITIVE, NEGATIVE, NEGATIVE, tag="pn"),
                        Term(XMod.NEGATIVE, POSITIVE, None, tag="np")),
                       coef=-self.beta, tag="beta")
        return (g_alpha, g_beta) if self.beta != 0 else (g_alpha,)


@register_rule
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
        up = WeightMod(f"w+{g}w+", lambda a: a + g * np.clip(a, 0, None))
        down = WeightMod(f"w+{g}w-", lambda a: a + g * np.clip(a, None, 0))

        pos_out = Group((Term(XMod.POSITIVE, up, up, tag="pu"), Term(XMod.NEGATIVE, down, None, tag="nd")),
                        mask=ZMask.POSITIVE, tag="pos")
        neg_out = Group((Term(XMod.POSITIVE, down, down, tag="pd"), Term(XMod.NEGATIVE, up, None, tag="nu")),
                        mask=ZMask.NEGATIVE, tag="neg")
        return (pos_out, neg_out)


@register_rule
@dataclass(frozen=True)
class ZBox(LinearRule):
    """R_i = (x_i w_ij - l_i w_ij+ - h_i w_ij-) R_j / stab(z_j) for inputs in [low, high] (Montavon et al. 2017)."""

    name: ClassVar[str] = "zbox"
    needs_params: ClassVar[bool] = True
    is_box: ClassVar[bool] = True
    low: object = None  # no default (as in zennit): the input's range must be given
    high: object = None
    stabilizer: float = 1e-6

    def __post_init__(self):
        if self.low is None or self.high is None:
            return  # refused when the rule is applied (onnx_lrp.lrp.plan.check_bounds), naming the composite
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
                       Term(XMod.CONSTANT, POSITIVE, POSITIVE, sign=-1.0, x_value=lo, tag="low"),
                       Term(XMod.CONSTANT, NEGATIVE, NEGATIVE, sign=-1.0, x_value=hi, tag="high"))),)


@register_rule
@dataclass(frozen=True)
class Flat(LinearRule):
    """R_i = sum_j R_j / (number of inputs feeding j): weights set to 1, bias 0 (Lapuschkin et al. 2019; zennit)."""

    name: ClassVar[str] = "flat"
    needs_params: ClassVar[bool] = True
    stabilizer: float = 1e-6

    def groups(self):
        return (Group((Term(XMod.ONES, ONES, None, tag="flat"),)),)


@register_rule(aliases=("w-square", "w2"))
@dataclass(frozen=True)
class WSquare(LinearRule):
    """R_i = sum_j w_ij^2 R_j / stab(sum_i w_ij^2 + b_j^2) (Montavon et al. 2017; zennit squares the bias)."""

    name: ClassVar[str] = "wsquare"
    needs_params: ClassVar[bool] = True
    stabilizer: float = 1e-6

    def groups(self):
        return (Group((Term(XMod.ONES, SQUARE, SQUARE, tag="w2"),)),)


__all__ = ["WeightMod", "IDENTITY", "POSITIVE", "NEGATIVE", "ONES", "SQUARE", "Term", "Group", "LinearRule",
           "HELD_SCALE", "PlainRule", "Epsilon", "Norm", "ZPlus", "AlphaBeta", "Gamma", "ZBox", "Flat", "WSquare"]
