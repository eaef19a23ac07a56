"""Rules for products of activations: AttnLRP (Achtibat et al., ICML 2024), CP-LRP (Ali et al., ICML 2022) and
signal-take-all for gates (Arras et al., 2017).

Each says what it does on the ops that have rules of their own (``propagate_<family>``: product, gate, softmax);
the steps (a product's transpose, CP-LRP's choice of the gate, the softmax's centring) live beside the op, in
``onnx_lrp.lrp.ops.transformer``. The linear parts of a transformer (MatMul/Gemm with constant weights,
residual sums, the mean subtraction and affine part of LayerNorm) use ``Epsilon`` from ``rules.rules``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .rules import Rule, register_rule


@register_rule(aliases=("half",))
@dataclass(frozen=True)
class Uniform(Rule):
    """R_a = a ⊙ J_a^T(R / (k·stab(z))) for each of the k activation factors of z = a·b, a@b (AttnLRP uniform rule, Achtibat et al. 2024, eq. 7)."""

    name: ClassVar[str] = "uniform"
    epsilon: float = 1e-6

    def propagate_product(self, em, layer, r_outs):
        return layer.op.share(em, layer, r_outs, layer.op.operands(layer.node), self.eps(), "u")

    def gradient_form_product(self, op):
        return self.eps() == 0

    def propagate_grad_product(self, em, layer, r_outs):
        return layer.op.share_grad(em, layer, r_outs, layer.op.operands(layer.node))

    def propagate_gate(self, em, layer, r_outs):
        return layer.op.as_product(em, layer, self, r_outs, grad=False)

    def gradient_form_gate(self, op):
        return self.eps() == 0

    def propagate_grad_gate(self, em, layer, r_outs):
        return layer.op.as_product(em, layer, self, r_outs, grad=True)


@register_rule(aliases=("cp-lrp", "hold-gates"))
@dataclass(frozen=True)
class HoldGates(Rule):
    """Gates held constant: R_v = v ⊙ J_v^T(R / stab(z)), R_gate = 0; of two gates the stronger (softmax > sigmoid > other) (CP-LRP, Ali et al. 2022)."""

    name: ClassVar[str] = "cp"
    epsilon: float = 1e-6

    def propagate_product(self, em, layer, r_outs):
        return layer.op.share(em, layer, r_outs, layer.op.free_operands(layer.node), self.eps(), "cp")

    def propagate_grad_product(self, em, layer, r_outs):
        return layer.op.share_grad(em, layer, r_outs, layer.op.free_operands(layer.node))

    gradient_form_product = Uniform.gradient_form_product
    propagate_gate = Uniform.propagate_gate
    gradient_form_gate = Uniform.gradient_form_gate
    propagate_grad_gate = Uniform.propagate_grad_gate


@register_rule(aliases=("signal_take_all", "gate"))
@dataclass(frozen=True)
class SignalTakeAll(Rule):
    """z = h ⊙ g with g a sigmoid gate: R_h = R_z, R_g = 0 — the gate is a constant multiplier (signal-take-all, Arras et al. 2017)."""

    name: ClassVar[str] = "signal-take-all"

    def propagate_gate(self, em, layer, r_outs):
        return layer.op.signal(em, layer, r_outs)

    def gradient_form_gate(self, op):
        return True

    def propagate_grad_gate(self, em, layer, r_outs):
        return layer.op.signal_grad(em, layer, r_outs)


@register_rule(aliases=("attnlrp-softmax",))
@dataclass(frozen=True)
class SoftmaxRule(Rule):
    """R_in = x ⊙ (R_out − softmax(x) · Σ R_out), zero at masked (−inf / ≤ ½·finfo.min) logits (AttnLRP, Achtibat et al. 2024, eq. 13)."""

    name: ClassVar[str] = "softmax"

    def propagate_softmax(self, em, layer, r_outs):
        return layer.op.attn(em, layer, r_outs)

    def gradient_form_softmax(self, op):
        return True

    def propagate_grad_softmax(self, em, layer, r_outs):
        return layer.op.attn_grad(em, layer, r_outs)


@register_rule
@dataclass(frozen=True)
class Zero(Rule):
    """R_in = 0: no relevance passes (CP-LRP's softmax, whose output the attention product holds constant; Ali et al. 2022)."""

    name: ClassVar[str] = "zero"

    def propagate_product(self, em, layer, r_outs):
        return [None] * len(layer.xs)

    def gradient_form_product(self, op):
        return True

    propagate_gate = propagate_softmax = propagate_grad_product = propagate_grad_gate = propagate_grad_softmax = \
        propagate_product
    gradient_form_gate = gradient_form_softmax = gradient_form_product


__all__ = ["Uniform", "HoldGates", "SignalTakeAll", "SoftmaxRule", "Zero"]
