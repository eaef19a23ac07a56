"""Rules for products of activations: AttnLRP (Achtibat et al., ICML 2024), CP-LRP (Ali et al., ICML 2022) and
signal-take-all for gates (Arras et al., 2017).

They hold numbers only; how a product of activations, a softmax or a normalisation propagates them lives beside
the op, in ``onnx_lrp.ops.transformer``. The linear parts of a transformer (MatMul/Gemm with constant weights,
residual sums, the mean subtraction and affine part of LayerNorm) use ``Epsilon`` from ``rules.rules``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .rules import Rule


@dataclass(frozen=True)
class Uniform(Rule):
    """R_a = a ⊙ J_a^T(R / (k·stab(z))) for each of the k activation factors of z = a·b, a@b (AttnLRP uniform rule, Achtibat et al. 2024, eq. 7)."""

    name: ClassVar[str] = "uniform"
    epsilon: float = 1e-6


@dataclass(frozen=True)
class HoldGates(Rule):
    """Gates held constant: R_v = v ⊙ J_v^T(R / stab(z)), R_gate = 0; of two gates the stronger (softmax > sigmoid > other) (CP-LRP, Ali et al. 2022)."""

    name: ClassVar[str] = "cp"
    epsilon: float = 1e-6


@dataclass(frozen=True)
class SignalTakeAll(Rule):
    """z = h ⊙ g with g a sigmoid gate: R_h = R_z, R_g = 0 — the gate is a constant multiplier (signal-take-all, Arras et al. 2017)."""

    name: ClassVar[str] = "signal-take-all"


@dataclass(frozen=True)
class SoftmaxRule(Rule):
    """R_in = x ⊙ (R_out − softmax(x) · Σ R_out), zero at masked (−inf / ≤ ½·finfo.min) logits (AttnLRP, Achtibat et al. 2024, eq. 13)."""

    name: ClassVar[str] = "softmax"


@dataclass(frozen=True)
class Zero(Rule):
    """R_in = 0: no relevance passes (CP-LRP's softmax, whose output the attention product holds constant; Ali et al. 2022)."""

    name: ClassVar[str] = "zero"


TRANSFORMER_RULES = (Uniform, HoldGates, SignalTakeAll, SoftmaxRule, Zero)

__all__ = ["Uniform", "HoldGates", "SignalTakeAll", "SoftmaxRule", "Zero", "TRANSFORMER_RULES"]
