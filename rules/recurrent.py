"""The rule for recurrent layers (ONNX LSTM, GRU, RNN): LRP for LSTMs (Arras et al. 2017, "Explaining Recurrent
Neural Network Predictions in Sentiment Analysis"; Arras et al. 2019, "Explaining and Interpreting LSTMs").

It holds numbers and says what it does on a recurrent op (its ``families`` entry); how the relevance recurrence is
emitted (a backward Scan over time) lives beside the ops,
in ``onnx_lrp.lrp.ops.recurrent``. Per time step t (``stab(z) = z + eps (sign(z) + (z == 0))``; gates i, f, o, z, r
get no relevance; element-wise non-linearities pass relevance unchanged):

- LSTM (c_t = f ⊙ c_{t-1} + i ⊙ g, h_t = o ⊙ tanh(c_t), g = tanh(a), a = W_g x_t + R_g h_{t-1} + b_g):
  R_c += R_h (o ⊙ tanh(c): signal-take-all), R_{c_{t-1}} = f ⊙ c_{t-1} ⊙ R_c / stab(c_t),
  R_a = i ⊙ g ⊙ R_c / stab(c_t), R_{x_t} = x_t ⊙ W_g^T s, R_{h_{t-1}} += h_{t-1} ⊙ R_g^T s with
  s = R_a / stab(a).
- GRU (h_t = (1 - z) ⊙ n + z ⊙ h_{t-1}, n = tanh(a), a = W_n x_t + r ⊙ (R_n h_{t-1} + b) or W_n x_t + R_n (r ⊙
  h_{t-1}) + b): R_a = (1 - z) ⊙ n ⊙ R_h / stab(h_t), R_{h_{t-1}} = z ⊙ h_{t-1} ⊙ R_h / stab(h_t)
  + h_{t-1} ⊙ J_h^T s with s = R_a / stab(a) and the reset gate r held as a coefficient of its signal;
  R_{x_t} = x_t ⊙ W_n^T s.
- RNN (h_t = f(a), a = W x_t + R h_{t-1} + b): s = R_h / stab(a), R_{x_t} = x_t ⊙ W^T s,
  R_{h_{t-1}} = h_{t-1} ⊙ R^T s.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from onnx_lrp.lrp.families import Family, FamilyRule, family_table
from .base import Rule, register_rule


def _recurrence(rule, em, layer, r_outs):
    """The relevance recurrence over time, emitted by the op (``onnx_lrp.lrp.ops.recurrent``)."""
    return layer.op.propagate(em, layer, rule, r_outs)


@register_rule
@dataclass(frozen=True)
class Recurrent(Rule):
    """LSTM/GRU/RNN: epsilon on W x + R h + b, gate ⊙ signal -> all to the signal, c_t = f c + i g split as a sum by stab(c_t) (Arras et al. 2017, 2019)."""

    name: ClassVar[str] = "recurrent"
    families: ClassVar[Mapping[Family, FamilyRule]] = family_table({Family.RECURRENT: FamilyRule(_recurrence)})
    epsilon: float = 1e-6

    def __post_init__(self):
        if not self.epsilon >= 0:
            raise ValueError(f"recurrent rule needs epsilon >= 0 (got {self.epsilon})")


__all__ = ["Recurrent"]
