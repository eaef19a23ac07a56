"""LRP rules and the built-in composites (TOML files in ``composites/``), installed as ``onnx_lrp.rules``."""
from .recurrent import Recurrent  # noqa: F401  (registers the rule "recurrent" in RULES)
from .composite import Composite, Entry, NodeInfo, builtin_names, load_composite, parse_composite
from .rules import (RULES, AlphaBeta, Epsilon, Flat, Gamma, Gradient, GradientXInput, Group, LinearRule, Norm,
                    Pass, Rule, Term, WSquare, ZBox, ZPlus, make_rule)
from .attnlrp import TRANSFORMER_RULES, HoldGates, SignalTakeAll, SoftmaxRule, Uniform, Zero
from .rules import RULE_ALIASES as _ALIASES

RULES.update({cls.name: cls for cls in TRANSFORMER_RULES})
_ALIASES.update({"cp-lrp": "cp", "hold-gates": "cp", "attnlrp-softmax": "softmax", "half": "uniform",
                 "signal_take_all": "signal-take-all", "gate": "signal-take-all"})

__all__ = ["Composite", "Entry", "NodeInfo", "builtin_names", "load_composite", "parse_composite", "RULES",
           "AlphaBeta", "Epsilon", "Flat", "Gamma", "Gradient", "GradientXInput", "Group", "LinearRule", "Norm",
           "Pass", "Rule", "Term",
           "WSquare", "ZBox", "ZPlus", "make_rule", "Uniform", "HoldGates", "SignalTakeAll", "SoftmaxRule",
           "Zero"]
