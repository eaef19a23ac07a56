"""LRP rules as configuration of one generic step.

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

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar


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

    ``x`` names the input modifier: ``identity``, ``positive``, ``negative``, ``ones``, or ``constant`` (then
    ``x_value`` holds the array, e.g. ZBox's bounds). ``b`` is None when the term carries no bias.
    """

    x: str = "identity"
    w: WeightMod = IDENTITY
    b: WeightMod | None = IDENTITY
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


RULES: dict[str, type["Rule"]] = {}
RULE_ALIASES: dict[str, str] = {}


def register_rule(cls=None, *, aliases: tuple[str, ...] = ()):
    """Class decorator: make a rule known by its ``name`` (and ``aliases``) to composites and ``make_rule``."""
    def add(rule_cls):
        for key in (rule_cls.name, *aliases):
            if key in RULES or key in RULE_ALIASES:
                raise ValueError(f"rule name {key!r} registered twice")
        RULES[rule_cls.name] = rule_cls
        RULE_ALIASES.update({alias: rule_cls.name for alias in aliases})
        return rule_cls
    return add(cls) if cls is not None else add


def _engine():
    """The propagation steps (``onnx_lrp.lrp.engine``), imported on first use: listing composites needs no numpy."""
    from ..lrp import engine as propagate
    return propagate


class Rule:
    """Base of all rules; ``name`` is how composites refer to it.

    A rule carries its behaviour, as zennit's hooks do: ``fits(op)`` says why it cannot apply to an op (checked for
    every node before anything is emitted), ``propagate`` / ``propagate_grad`` emit the relevance of the layer's
    inputs (as relevance, or as ``Rel`` in gradient form when ``gradient_form(op)``), ``zero_preserving(op, node)``
    says whether that relevance vanishes where the input does. Each dispatches on the op's ``category``:
    ``linear``, ``move``, ``activation``, or ``own`` (the op applies its rules itself: products, softmax, ...)."""

    name: ClassVar[str] = ""
    needs_params: ClassVar[bool] = False
    explodes_at_offset: ClassVar[bool] = False  # pass and gradient-x-input: refused together on f(0) != 0 with no f'

    def params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def eps(self) -> float:
        """The stabiliser: ``epsilon``, else ``stabilizer``, else 1e-6."""
        return float(getattr(self, "epsilon", getattr(self, "stabilizer", 1e-6)))

    # ---------------------------------------------------------------------------------------------- fits
    def fits(self, op) -> str | None:
        if op.category == "own":
            return op.fits(self)
        if op.category == "move":
            return self.fits_move(op)
        return self.fits_linear(op) if op.category == "linear" else self.fits_activation(op)

    def fits_move(self, op) -> str | None:
        return f"rule {self.name} on a shape op (use gradient)"

    def fits_linear(self, op) -> str | None:
        return f"rule {self.name} is not known to the engine"

    def fits_activation(self, op) -> str | None:
        if op.kind == "offset-activation" and not op.has_derivative() and self.explodes_at_offset:
            return ("element-wise function with f(0) != 0 (or not provably 0) and no known derivative: neither the "
                    "identity rule (it would explode) nor gradient-x-input applies; write it with ops onnx-lrp knows")
        return self.fits_linear(op)

    # ---------------------------------------------------------------------------------------------- emission
    def propagate(self, em, layer, r_outs: list) -> list:
        """Relevance for the layer's relevance inputs from the relevance of its outputs."""
        if layer.op.category == "move":
            return _engine().move(em, layer, r_outs)
        if layer.op.category == "own":
            return self.propagate_own(em, layer, r_outs)
        return self.propagate_one(em, layer, r_outs[0])

    def propagate_own(self, em, layer, r_outs: list) -> list:
        """On an op with rules of its own (``onnx_lrp.lrp.ops.RuleOp``): the rule's hook for the op's family."""
        return getattr(self, "propagate_" + layer.op.family)(em, layer, r_outs)

    def propagate_one(self, em, layer, r_out) -> list:
        raise AssertionError(f"rule {self.name} on {layer.node.op_type} was not rejected when planning")

    def gradient_form(self, op) -> bool:
        """Whether the rule on this op is exact in gradient form, ``g_in = J^T g_out`` (see ``Rel``)."""
        if op.category == "move":
            return True  # moves: the same transpose in both forms
        if op.category == "own":
            hook = getattr(self, "gradient_form_" + op.family, None)
            return hook is not None and hook(op)
        return False

    def propagate_grad(self, em, layer, r_outs: list) -> list:
        """``propagate`` for rules with ``gradient_form``: takes and gives ``Rel``."""
        if layer.op.category == "move":
            return _engine().move_grad(em, layer, r_outs)
        return getattr(self, "propagate_grad_" + layer.op.family)(em, layer, r_outs)

    def zero_preserving(self, op, node) -> "bool | str":
        """Whether the relevance the rule gives the inputs is zero wherever the input value is zero: True, False, or
        "inherit" (as the relevance of the outputs: moves, max pools and Pass through a Relu)."""
        return "inherit" if op.category == "move" else False


def _held_scale(rule, em, layer, r_outs):
    """Epsilon / norm on a normalisation with its scale held (``NormScale``): R_n = z R / stab(z)."""
    return layer.op.held_scale(em, layer, r_outs, rule.eps())


def _held_scale_grad_form(rule, op):
    return rule.eps() == 0


def _held_scale_grad(rule, em, layer, r_outs):
    return layer.op.held_scale_grad(em, layer, r_outs)


class LinearRule(Rule):
    """A rule for linear layers, given as groups of terms. ``plain``: one group of the unmodified layer (epsilon,
    norm), which for epsilon = 0 is exact in gradient form (LRP-0 = gradient x input)."""

    plain: ClassVar[bool] = False

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
        if layer.op.category != "linear":
            return super().propagate_one(em, layer, r_out)
        return _engine().linear_rule(em, layer, self, r_out)

    def gradient_form(self, op):
        if op.category == "linear":
            return self.plain and self.eps() == 0
        return super().gradient_form(op)

    def propagate_grad(self, em, layer, r_outs):
        if layer.op.category == "linear":
            return _engine().linear_grad(em, layer, r_outs)
        return super().propagate_grad(em, layer, r_outs)

    def zero_preserving(self, op, node):
        return all(t.x in ("identity", "positive", "negative") for g in self.groups() for t in g.terms)


@register_rule(aliases=("lrp0",))
@dataclass(frozen=True)
class Epsilon(LinearRule):
    """R_i = x_i sum_j w_ij R_j / stab(z_j)  (LRP-epsilon, Bach et al. 2015; epsilon = 0 is LRP-0)."""

    name: ClassVar[str] = "epsilon"
    plain: ClassVar[bool] = True
    propagate_norm_scale = _held_scale
    gradient_form_norm_scale = _held_scale_grad_form
    propagate_grad_norm_scale = _held_scale_grad
    epsilon: float = 1e-6

    def groups(self):
        return (Group((Term(),)),)

@register_rule
@dataclass(frozen=True)
class Norm(LinearRule):
    """R_i = x_i sum_j w_ij R_j / stab(z_j) with the layer's own weights, for sums and average pools (zennit Norm)."""

    name: ClassVar[str] = "norm"
    plain: ClassVar[bool] = True
    propagate_norm_scale = _held_scale
    gradient_form_norm_scale = _held_scale_grad_form
    propagate_grad_norm_scale = _held_scale_grad
    stabilizer: float = 1e-6

    def groups(self):
        return (Group((Term(),)),)

@register_rule(aliases=("z-plus",))
@dataclass(frozen=True)
class ZPlus(LinearRule):
    """R_i = sum_j (x_i+ w_ij+ + x_i- w_ij-) R_j / stab(z_j+), bias b+ (LRP-z+, Montavon et al. 2017; zennit)."""

    name: ClassVar[str] = "zplus"
    needs_params: ClassVar[bool] = True
    stabilizer: float = 1e-6

    def groups(self):
        return (Group((Term("positive", POSITIVE, POSITIVE, tag="pp"), Term("negative", NEGATIVE, None, tag="nn"))),)


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
        g_alpha = Group((Term("positive", POSITIVE, POSITIVE, tag="pp"), Term("negative", NEGATIVE, None, tag="nn")),
                        coef=self.alpha, tag="alpha")
        g_beta = Group((Term("positive", NEGATIVE, NEGATIVE, tag="pn"), Term("negative", POSITIVE, None, tag="np")),
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

        pos_out = Group((Term("positive", up, up, tag="pu"), Term("negative", down, None, tag="nd")),
                        mask="positive", tag="pos")
        neg_out = Group((Term("positive", down, down, tag="pd"), Term("negative", up, None, tag="nu")),
                        mask="negative", tag="neg")
        return (pos_out, neg_out)


@register_rule
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
            return  # refused when the rule is applied (onnx_lrp.lrp.rewriter.check_bounds), naming the composite
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
                       Term("constant", POSITIVE, POSITIVE, sign=-1.0, x_value=lo, tag="low"),
                       Term("constant", NEGATIVE, NEGATIVE, sign=-1.0, x_value=hi, tag="high"))),)


@register_rule
@dataclass(frozen=True)
class Flat(LinearRule):
    """R_i = sum_j R_j / (number of inputs feeding j): weights set to 1, bias 0 (Lapuschkin et al. 2019; zennit)."""

    name: ClassVar[str] = "flat"
    needs_params: ClassVar[bool] = True
    stabilizer: float = 1e-6

    def groups(self):
        return (Group((Term("ones", ONES, None, tag="flat"),)),)


@register_rule(aliases=("w-square", "w2"))
@dataclass(frozen=True)
class WSquare(LinearRule):
    """R_i = sum_j w_ij^2 R_j / stab(sum_i w_ij^2 + b_j^2) (Montavon et al. 2017; zennit squares the bias)."""

    name: ClassVar[str] = "wsquare"
    needs_params: ClassVar[bool] = True
    stabilizer: float = 1e-6

    def groups(self):
        return (Group((Term("ones", SQUARE, SQUARE, tag="w2"),)),)


@register_rule(aliases=("identity",))
@dataclass(frozen=True)
class Pass(Rule):
    """R_in = R_out: relevance passes an element-wise op unchanged (zennit Pass, LXT identity rule)."""

    name: ClassVar[str] = "pass"
    explodes_at_offset: ClassVar[bool] = True

    def fits_move(self, op):
        return None

    def fits_linear(self, op):
        return None

    def fits_activation(self, op):
        if op.kind == "offset-activation":
            return super().fits_activation(op) or (
                "identity rule (pass) on a function with f(0) != 0: R_x = R_y explodes when the next layer "
                "divides it by x ~ 0; give kind \"offset-activation\" the rule \"gradient-x-input\" "
                "(x * sigmoid(s) gates are recognised and need none)")
        return None

    def propagate_one(self, em, layer, r_out):
        return [r_out]

    def propagate_norm_scale(self, em, layer, r_outs):
        return [r_outs[0]]

    def gradient_form(self, op):
        if op.category == "activation":
            return op.has_pass_grad()
        return super().gradient_form(op)

    def propagate_grad(self, em, layer, r_outs):
        if layer.op.category == "activation":
            return _engine().pass_grad(em, layer, r_outs)
        return super().propagate_grad(em, layer, r_outs)

    def zero_preserving(self, op, node):
        if op.category != "move" and op.zero_below_zero(node):
            return "inherit"  # zero exactly where the input is <= 0
        return super().zero_preserving(op, node)


@register_rule
@dataclass(frozen=True)
class Gradient(Rule):
    """R_in = J^T R_out: the op's own vector-Jacobian product (winner-takes-all at MaxPool, zennit's default)."""

    name: ClassVar[str] = "gradient"

    def fits_move(self, op):
        return None

    def fits_linear(self, op):
        return None

    def fits_activation(self, op):
        if op.has_derivative():
            return None
        return f"the gradient rule is not implemented for {', '.join(op.op_types[:3])} (use pass)"

    def propagate_one(self, em, layer, r_out):
        return _engine().gradient(em, layer, r_out)

    def propagate_norm_scale(self, em, layer, r_outs):
        return layer.op.held_scale_gradient(em, layer, r_outs)

    def propagate_softmax(self, em, layer, r_outs):
        return layer.op.gradient(em, layer, r_outs)

    def gradient_form(self, op):
        return op.kind == "maxpool" or super().gradient_form(op)

    def propagate_grad(self, em, layer, r_outs):
        return _engine().move_grad(em, layer, r_outs)

    def zero_preserving(self, op, node):
        return "inherit" if op.kind == "maxpool" else super().zero_preserving(op, node)


@register_rule(aliases=("gxi", "gradient_x_input", "gradient*input"))
@dataclass(frozen=True)
class GradientXInput(Rule):
    """R_x = x f'(x) R_y / f(x): gradient x input of y = f(x), for f(0) != 0 (LXT efficient mode's default)."""

    name: ClassVar[str] = "gradient-x-input"
    explodes_at_offset: ClassVar[bool] = True

    def fits_linear(self, op):
        return "rule gradient-x-input needs an element-wise function with a known derivative (use pass or epsilon)"

    def fits_activation(self, op):
        if op.has_derivative():
            return None
        return super().fits_activation(op)

    def propagate_one(self, em, layer, r_out):
        if layer.op.category != "activation":
            return super().propagate_one(em, layer, r_out)
        return _engine().gradient_x_input(em, layer, r_out)

    def gradient_form(self, op):
        return op.category == "activation" or super().gradient_form(op)

    def propagate_grad(self, em, layer, r_outs):
        if layer.op.category == "activation":
            return _engine().gradient_x_input_grad(em, layer, r_outs)
        return super().propagate_grad(em, layer, r_outs)

    def zero_preserving(self, op, node):
        return True  # R_x = x ...


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


__all__ = ["WeightMod", "IDENTITY", "POSITIVE", "NEGATIVE", "ONES", "SQUARE", "register_rule", "Term", "Group", "Rule",
           "LinearRule", "Epsilon", "Norm", "ZPlus", "AlphaBeta", "Gamma", "ZBox",
           "Flat", "WSquare", "Pass", "Gradient", "GradientXInput", "RULES", "make_rule", "field"]
