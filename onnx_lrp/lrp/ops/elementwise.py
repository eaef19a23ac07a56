"""Element-wise non-linearities of one tensor: relevance passes (zennit Pass, LXT identity rule).

The Gradient rule multiplies by f'(x) where it is given here (piecewise-linear, piecewise-quadratic (HardSwish) and
smooth ops). Functions with
f(0) != 0 (``at_zero``: Sigmoid, HardSigmoid, Exp, Softplus, Cos, Clip with 0 outside [min, max]) are of kind
``offset-activation``: the identity rule is refused on them, the built-in composites give them
``gradient-x-input`` (R_x = x f'(x) R_y / f(x), which needs ``derivative``). As gates (``h * sigmoid(s)``) they
receive no relevance at all (``onnx_lrp.lrp.ops.gates.Gate``).
"""
from __future__ import annotations

import numpy as np

from ...core.graph import const
from .base import ActivationOp, register
from ..vocabulary import Kind, Nonneg


@register
class Relu(ActivationOp):
    op_types = ("Relu",)
    nonneg = Nonneg.ALWAYS

    def zero_below_zero(self, node):
        return True

    def pass_grad(self, em, node, g):  # relu(x) / x = [x > 0]
        return em.op("Where", em.op("Greater", node.inputs[0], em.scalar(0.0), tag="x_pos"), g, em.scalar(0.0),
                     tag="g_in"), node.inputs[0]

    def derivative(self, em, node):
        return em.op("Cast", em.op("Greater", node.inputs[0], em.scalar(0.0), tag="x_pos"), to=em.dtype.value,
                     tag="dfdx")


@register
class LeakyRelu(ActivationOp):
    op_types = ("LeakyRelu",)

    def derivative(self, em, node):
        alpha = node.attributes.get_float("alpha", 0.01)
        pos = em.op("Greater", node.inputs[0], em.scalar(0.0), tag="x_pos")
        return em.op("Where", pos, em.scalar(1.0), em.scalar(alpha), tag="dfdx")


@register
class Sigmoid(ActivationOp):
    op_types = ("Sigmoid",)
    nonneg = Nonneg.ALWAYS

    def at_zero(self, node):
        return 0.5

    def derivative(self, em, node):
        y = node.outputs[0]
        return em.mul(y, em.sub(em.scalar(1.0), y, tag="one_minus_y"), tag="dfdx")


@register
class Tanh(ActivationOp):
    op_types = ("Tanh",)

    def derivative(self, em, node):
        y = node.outputs[0]
        return em.sub(em.scalar(1.0), em.mul(y, y, tag="y2"), tag="dfdx")


@register
class HardSigmoid(ActivationOp):
    op_types = ("HardSigmoid",)
    nonneg = Nonneg.ALWAYS

    def at_zero(self, node):
        return min(max(node.attributes.get_float("beta", 0.5), 0.0), 1.0)

    def derivative(self, em, node):  # alpha where 0 < alpha x + beta < 1
        y = node.outputs[0]
        inside = em.op("And", em.op("Greater", y, em.scalar(0.0), tag="above"),
                       em.op("Less", y, em.scalar(1.0), tag="below"), tag="inside")
        return em.op("Where", inside, em.scalar(node.attributes.get_float("alpha", 0.2)), em.scalar(0.0),
                     tag="dfdx")


@register
class HardSwish(ActivationOp):
    """y = x * HardSigmoid(x) with alpha 1/6, beta 1/2 (MobileNetV3; a PyTorch export's x * hardsigmoid(x) is
    canonized to it): f(0) = 0."""

    op_types = ("HardSwish",)

    def derivative(self, em, node):  # 0 below -3, x / 3 + 1/2 up to 3, 1 above (torch's hardswish_backward)
        x = node.inputs[0]
        ramp = em.add(em.div(x, em.scalar(3.0), tag="x_3"), em.scalar(0.5), tag="ramp")
        low = em.op("Where", em.op("Less", x, em.scalar(-3.0), tag="below"), em.scalar(0.0), ramp, tag="low")
        return em.op("Where", em.op("Greater", x, em.scalar(3.0), tag="above"), em.scalar(1.0), low, tag="dfdx")


@register
class Exp(ActivationOp):
    op_types = ("Exp",)
    nonneg = Nonneg.ALWAYS

    def at_zero(self, node):
        return 1.0

    def derivative(self, em, node):
        return node.outputs[0]


@register
class Softplus(ActivationOp):
    op_types = ("Softplus",)
    nonneg = Nonneg.ALWAYS

    def at_zero(self, node):
        return float(np.log(2.0))

    def derivative(self, em, node):
        return em.op("Sigmoid", node.inputs[0], tag="dfdx")


@register
class Cos(ActivationOp):
    op_types = ("Cos",)

    def at_zero(self, node):
        return 1.0

    def derivative(self, em, node):
        return em.op("Neg", em.op("Sin", node.inputs[0], tag="sin"), tag="dfdx")


@register
class Clip(ActivationOp):
    op_types = ("Clip",)

    def check(self, node):
        for v in node.inputs[1:3]:
            if v is not None and const(v) is None:
                return "min/max are not constants"
        return None

    def at_zero(self, node):
        lo, hi = -np.inf, np.inf
        if len(node.inputs) > 1 and node.inputs[1] is not None and const(node.inputs[1]) is not None:
            lo = float(np.max(const(node.inputs[1])))
        elif "min" in node.attributes:
            lo = node.attributes.get_float("min", -np.inf)
        if len(node.inputs) > 2 and node.inputs[2] is not None and const(node.inputs[2]) is not None:
            hi = float(np.min(const(node.inputs[2])))
        elif "max" in node.attributes:
            hi = node.attributes.get_float("max", np.inf)
        return float(min(max(0.0, lo), hi))

    def zero_below_zero(self, node):
        """Clip with min exactly 0 (ReLU6)."""
        if len(node.inputs) < 2 or node.inputs[1] is None:
            return False
        lo = node.inputs[1].const_value
        return lo is not None and float(lo.numpy()) == 0.0

    def nonneg_output(self, node, inputs_nonneg):
        lo = const(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if lo is None:
            lo_attr = node.attributes.get_float("min", -np.inf) if "min" in node.attributes else -np.inf
            return lo_attr >= 0 or (inputs_nonneg and inputs_nonneg[0])
        return float(np.min(lo)) >= 0 or (inputs_nonneg and inputs_nonneg[0])

    def derivative(self, em, node):
        x = node.inputs[0]
        inside = em.op("Equal", x, node.outputs[0], tag="inside")
        return em.op("Cast", inside, to=em.dtype.value, tag="dfdx")


@register
class PRelu(ActivationOp):
    op_types = ("PRelu",)

    def check(self, node):
        return None if const(node.inputs[1]) is not None else "slope is not a constant"


register(type("OtherActivation", (ActivationOp,), {
    "op_types": ("Elu", "Selu", "Celu", "Softsign", "Gelu", "Mish", "ThresholdedRelu", "Shrink", "Erf", "Abs", "Neg",
                 "Sin"),
    "__doc__": "Smooth or piecewise element-wise non-linearities with f(0) = 0: Pass only.",
    "nonneg_output": lambda self, node, inputs_nonneg: node.op_type == "Abs"}))


@register
class LRN(ActivationOp):
    """Local response normalisation: treated as an element-wise op (Pass), as in zennit's AlexNet use."""

    kind = Kind.LRN
    op_types = ("LRN",)
    nonneg = Nonneg.INPUTS

