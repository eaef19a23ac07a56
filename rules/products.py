"""The rules for products of activations, gates and softmax: AttnLRP (Achtibat et al., ICML 2024), CP-LRP (Ali et
al., ICML 2022) and signal-take-all for gates (Arras et al., 2017).

Each says in its ``families`` table what it does on the ops with rules of their own (product, gate, softmax); the
steps (a product's transpose, CP-LRP's choice of the gate, the softmax's centring) live beside the ops, in
``onnx_lrp.lrp.ops.products``, ``.gates`` and ``.transformer``. The linear parts of a transformer (MatMul/Gemm with
constant weights, residual sums, the mean subtraction and affine part of LayerNorm) use ``Epsilon`` from
``rules.linear``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from onnx_lrp.lrp.families import Family, FamilyRule, always_exact, family_table
from .base import Rule, register_rule


def _exact_at_eps0(rule, op) -> bool:
    return rule.eps() == 0


def _share_all(rule, em, layer, r_outs):
    """Every activation factor shares the relevance (AttnLRP's uniform rule)."""
    return layer.op.share(em, layer, r_outs, layer.op.operands(layer.node), rule.eps(), "u")


def _share_all_grad(rule, em, layer, r_outs):
    return layer.op.share_grad(em, layer, r_outs, layer.op.operands(layer.node))


def _share_free(rule, em, layer, r_outs):
    """The factors that are no gate share the relevance (CP-LRP)."""
    return layer.op.share(em, layer, r_outs, layer.op.free_operands(layer.node), rule.eps(), "cp")


def _share_free_grad(rule, em, layer, r_outs):
    return layer.op.share_grad(em, layer, r_outs, layer.op.free_operands(layer.node))


def _gate_as_product(rule, em, layer, r_outs):
    """A gate as any product of two activations, with the rule's own product handler."""
    return layer.op.as_product(em, layer, rule, r_outs, grad=False)


def _gate_as_product_grad(rule, em, layer, r_outs):
    return layer.op.as_product(em, layer, rule, r_outs, grad=True)


GATE_AS_PRODUCT = FamilyRule(_gate_as_product, _exact_at_eps0, _gate_as_product_grad)


@register_rule(aliases=("half",))
@dataclass(frozen=True)
class Uniform(Rule):
    """R_a = a ⊙ J_a^T(R / (k·stab(z))) for each of the k activation factors of z = a·b, a@b (AttnLRP uniform rule, Achtibat et al. 2024, eq. 7)."""

    name: ClassVar[str] = "uniform"
    families: ClassVar[Mapping[Family, FamilyRule]] = family_table({
        Family.PRODUCT: FamilyRule(_share_all, _exact_at_eps0, _share_all_grad),
        Family.GATE: GATE_AS_PRODUCT,
    })
    epsilon: float = 1e-6


@register_rule(aliases=("cp-lrp", "hold-gates"))
@dataclass(frozen=True)
class HoldGates(Rule):
    """Gates held constant: R_v = v ⊙ J_v^T(R / stab(z)), R_gate = 0; of two gates the stronger (softmax > sigmoid > other) (CP-LRP, Ali et al. 2022)."""

    name: ClassVar[str] = "cp"
    families: ClassVar[Mapping[Family, FamilyRule]] = family_table({
        Family.PRODUCT: FamilyRule(_share_free, _exact_at_eps0, _share_free_grad),
        Family.GATE: GATE_AS_PRODUCT,
    })
    epsilon: float = 1e-6


def _take_all(rule, em, layer, r_outs):
    """The signal takes all: R_h = R_z, the gate gets none."""
    return layer.op.signal(em, layer, r_outs)


def _take_all_grad(rule, em, layer, r_outs):
    return layer.op.signal_grad(em, layer, r_outs)


@register_rule(aliases=("signal_take_all", "gate"))
@dataclass(frozen=True)
class SignalTakeAll(Rule):
    """z = h ⊙ g with g a sigmoid gate: R_h = R_z, R_g = 0 — the gate is a constant multiplier (signal-take-all, Arras et al. 2017)."""

    name: ClassVar[str] = "signal-take-all"
    families: ClassVar[Mapping[Family, FamilyRule]] = family_table({
        Family.GATE: FamilyRule(_take_all, always_exact, _take_all_grad)})


def _centred(rule, em, layer, r_outs):
    """AttnLRP's softmax rule: R_in = x ⊙ (R_out − softmax(x) ΣR_out)."""
    return layer.op.attn(em, layer, r_outs)


def _centred_grad(rule, em, layer, r_outs):
    return layer.op.attn_grad(em, layer, r_outs)


@register_rule(aliases=("attnlrp-softmax",))
@dataclass(frozen=True)
class SoftmaxRule(Rule):
    """R_in = x ⊙ (R_out − softmax(x) · Σ R_out), zero at masked (−inf / ≤ ½·finfo.min) logits (AttnLRP, Achtibat et al. 2024, eq. 13)."""

    name: ClassVar[str] = "softmax"
    families: ClassVar[Mapping[Family, FamilyRule]] = family_table({
        Family.SOFTMAX: FamilyRule(_centred, always_exact, _centred_grad)})


def _nothing(rule, em, layer, r_outs):
    """No relevance to any input (in either form)."""
    return [None] * len(layer.xs)


NOTHING = FamilyRule(_nothing, always_exact, _nothing)


@register_rule
@dataclass(frozen=True)
class Zero(Rule):
    """R_in = 0: no relevance passes (CP-LRP's softmax, whose output the attention product holds constant; Ali et al. 2022)."""

    name: ClassVar[str] = "zero"
    families: ClassVar[Mapping[Family, FamilyRule]] = family_table({
        Family.PRODUCT: NOTHING, Family.GATE: NOTHING, Family.SOFTMAX: NOTHING})


__all__ = ["Uniform", "HoldGates", "SignalTakeAll", "SoftmaxRule", "Zero", "GATE_AS_PRODUCT", "NOTHING"]
