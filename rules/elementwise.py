"""The rules that read no weights: pass (the identity, for element-wise functions, moves and held scales),
gradient (the op's own vector-Jacobian product) and gradient-x-input (for functions with f(0) != 0)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from onnx_lrp.lrp.families import Family, FamilyRule, family_table
from onnx_lrp.lrp.vocabulary import INHERIT, Category, Kind
from .base import Rule, engine, register_rule


def _unchanged(rule, em, layer, r_outs):
    """Pass on a normalisation with its scale held: R_n = R."""
    return [r_outs[0]]


def _held_scale_gradient(rule, em, layer, r_outs):
    """The gradient rule on a normalisation with its scale held: J^T R = R / s."""
    return layer.op.held_scale_gradient(em, layer, r_outs)


def _softmax_gradient(rule, em, layer, r_outs):
    """The gradient rule on a softmax: J^T R = y ⊙ (R − Σ y R)."""
    return layer.op.gradient(em, layer, r_outs)


@register_rule(aliases=("identity",))
@dataclass(frozen=True)
class Pass(Rule):
    """R_in = R_out: relevance passes an element-wise op unchanged (zennit Pass, LXT identity rule)."""

    name: ClassVar[str] = "pass"
    explodes_at_offset: ClassVar[bool] = True
    passes_through: ClassVar[bool] = True
    families: ClassVar[Mapping[Family, FamilyRule]] = family_table({Family.NORM_SCALE: FamilyRule(_unchanged)})

    def fits_move(self, op):
        return None

    def fits_linear(self, op):
        return None

    def fits_activation(self, op):
        if op.kind == Kind.OFFSET_ACTIVATION:
            return super().fits_activation(op) or (
                "identity rule (pass) on a function with f(0) != 0: R_x = R_y explodes when the next layer "
                f"divides it by x ~ 0; give kind \"{Kind.OFFSET_ACTIVATION}\" the rule \"gradient-x-input\" "
                "(x * sigmoid(s) gates are recognised and need none)")
        return None

    def propagate_one(self, em, layer, r_out):
        return [r_out]

    def gradient_form(self, op):
        if op.category is Category.ACTIVATION:
            return op.has_pass_grad()
        return super().gradient_form(op)

    def propagate_grad(self, em, layer, r_outs):
        if layer.op.category is Category.ACTIVATION:
            return engine().pass_grad(em, layer, r_outs)
        return super().propagate_grad(em, layer, r_outs)

    def zero_preserving(self, op, node):
        if op.category is not Category.MOVE and op.zero_below_zero(node):
            return INHERIT  # zero exactly where the input is <= 0
        return super().zero_preserving(op, node)


@register_rule
@dataclass(frozen=True)
class Gradient(Rule):
    """R_in = J^T R_out: the op's own vector-Jacobian product (winner-takes-all at MaxPool, zennit's default)."""

    name: ClassVar[str] = "gradient"
    families: ClassVar[Mapping[Family, FamilyRule]] = family_table({
        Family.NORM_SCALE: FamilyRule(_held_scale_gradient), Family.SOFTMAX: FamilyRule(_softmax_gradient)})

    def fits_move(self, op):
        return None

    def fits_linear(self, op):
        return None

    def fits_activation(self, op):
        if op.has_derivative():
            return None
        if len(op.op_types) == 1:
            what = op.op_types[0]
        elif op.op_types:  # one handler for several ops: the node's op type is in the line's prefix
            what = "this element-wise op"
        else:  # onnx_lrp.lrp.ops.transformer.ElementwiseOfOne, on the pattern's Mul or Div
            what = "this function of one tensor written as a product (x * sigmoid(x), a GELU chain, x / (1 + |x|))"
        return f"the gradient rule needs the derivative of {what}, which onnx-lrp does not have (use pass)"

    def propagate_one(self, em, layer, r_out):
        return engine().gradient(em, layer, r_out)

    def gradient_form(self, op):
        return op.kind == Kind.MAXPOOL or super().gradient_form(op)

    def propagate_grad(self, em, layer, r_outs):
        return engine().move_grad(em, layer, r_outs)

    def zero_preserving(self, op, node):
        return INHERIT if op.kind == Kind.MAXPOOL else super().zero_preserving(op, node)


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
        if layer.op.category is not Category.ACTIVATION:
            return super().propagate_one(em, layer, r_out)
        return engine().gradient_x_input(em, layer, r_out)

    def gradient_form(self, op):
        return op.category is Category.ACTIVATION or super().gradient_form(op)

    def propagate_grad(self, em, layer, r_outs):
        if layer.op.category is Category.ACTIVATION:
            return engine().gradient_x_input_grad(em, layer, r_outs)
        return super().propagate_grad(em, layer, r_outs)

    def zero_preserving(self, op, node):
        return True  # R_x = x ...


__all__ = ["Pass", "Gradient", "GradientXInput"]
