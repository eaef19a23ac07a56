"""LRP rules and the built-in composites (TOML files in ``composites/``), installed as ``onnx_lrp.rules``.

``base`` holds the rule interface and the registry, ``linear`` the rules for linear layers (groups of terms),
``elementwise`` pass / gradient / gradient-x-input, ``products`` the rules for products, gates and softmax,
``recurrent`` the LSTM rule, ``composite`` the composites. Every rule registers itself (``@register_rule(aliases=...)``)
when its module is imported; this package imports them all."""
from .base import RULES, Rule, make_rule, register_rule
from .linear import AlphaBeta, Epsilon, Flat, Gamma, Group, LinearRule, Norm, Term, WSquare, ZBox, ZPlus
from .elementwise import Gradient, GradientXInput, Pass
from .products import HoldGates, SignalTakeAll, SoftmaxRule, Uniform, Zero
from .recurrent import Recurrent
from .composite import Composite, Entry, NodeInfo, builtin_names, load_composite, parse_composite

__all__ = ["Composite", "Entry", "NodeInfo", "builtin_names", "load_composite", "parse_composite", "RULES",
           "AlphaBeta", "Epsilon", "Flat", "Gamma", "Gradient", "GradientXInput", "Group", "LinearRule", "Norm",
           "Pass", "Rule", "Term", "WSquare", "ZBox", "ZPlus", "make_rule", "register_rule", "Uniform", "HoldGates",
           "SignalTakeAll", "SoftmaxRule", "Zero", "Recurrent"]
