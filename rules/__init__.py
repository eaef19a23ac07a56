"""LRP rules and the built-in composites (TOML files in ``composites/``), installed as ``onnx_lrp.rules``.

Every rule registers itself (``@register_rule(aliases=...)``) when its module is imported; this package imports
them all."""
from .rules import (RULES, AlphaBeta, Epsilon, Flat, Gamma, Gradient, GradientXInput, Group, LinearRule, Norm,
                    Pass, Rule, Term, WSquare, ZBox, ZPlus, make_rule, register_rule)
from .attnlrp import HoldGates, SignalTakeAll, SoftmaxRule, Uniform, Zero
from .recurrent import Recurrent
from .composite import Composite, Entry, NodeInfo, builtin_names, load_composite, parse_composite

__all__ = ["Composite", "Entry", "NodeInfo", "builtin_names", "load_composite", "parse_composite", "RULES",
           "AlphaBeta", "Epsilon", "Flat", "Gamma", "Gradient", "GradientXInput", "Group", "LinearRule", "Norm",
           "Pass", "Rule", "Term", "WSquare", "ZBox", "ZPlus", "make_rule", "register_rule", "Uniform", "HoldGates",
           "SignalTakeAll", "SoftmaxRule", "Zero", "Recurrent"]
