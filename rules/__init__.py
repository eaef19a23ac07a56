"""LRP rules and the built-in composites (TOML files in ``composites/``), installed as ``onnx_lrp.rules``."""
from .composite import Composite, Entry, NodeInfo, builtin_names, load_composite, parse_composite
from .rules import (RULES, AlphaBeta, Epsilon, Flat, Gamma, Gradient, Group, LinearRule, Norm, Pass, Rule, Term,
                    WSquare, ZBox, ZPlus, make_rule)

__all__ = ["Composite", "Entry", "NodeInfo", "builtin_names", "load_composite", "parse_composite", "RULES",
           "AlphaBeta", "Epsilon", "Flat", "Gamma", "Gradient", "Group", "LinearRule", "Norm", "Pass", "Rule", "Term",
           "WSquare", "ZBox", "ZPlus", "make_rule"]
