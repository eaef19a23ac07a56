"""The default composite fits the network (``composite="auto"``, the API's and the command line's default).

A network whose activations on the explained path are all ReLU-like (Relu, ReLU6 = Clip(x, 0, 6), max(x, 0)), or
that has none, gets ``epsilon-plus-flat`` (zennit's EpsilonPlusFlat). Any other activation (SiLU/Swish, GELU,
hard-swish, Mish, Tanh, softmax attention) gets ``attnlrp``: LRP-0 on the linear layers (gradient form), the
identity rule on element-wise non-linearities with f(0) = 0, gates held as constant multipliers. Squeeze-excitation
gates alone (ReLU + sigmoid gates: RegNetY) keep epsilon-plus-flat. Measured on timm CNNs with random weights and
zero biases, 64 x 64 (docs/trust.md): relevance sum / logit under epsilon-plus-flat 0.75 (EfficientNet-B0), 0.98
(MobileNetV3), attnlrp 1.0; pixel flipping (mean logit drop, 8 steps of 1/16 of the pixels) 0.37 / 0.33 vs attnlrp
10.9 / 2.7 (a random order: 0.26 / 0.13).
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx_ir as ir

from ..core import meta
from ..core.errors import InputError
from ..lrp.vocabulary import Kind
from ..rules.composite import Composite, load_composite


RELU_COMPOSITE = "epsilon-plus-flat"
OTHER_COMPOSITE = "attnlrp"
_NONLINEAR_KINDS = (Kind.ACTIVATION, Kind.OFFSET_ACTIVATION, Kind.GATE, Kind.HELD, Kind.SOFTMAX, Kind.BILINEAR)


def _const(v: ir.Value | None) -> np.ndarray | None:
    if v is None or v.name == "":
        return None
    c = v.const_value
    return None if c is None else np.asarray(c.numpy())


def relu_like(node: ir.Node) -> bool:
    """Relu, a Clip with lower bound >= 0 (ReLU6), Max(x, c >= 0)."""
    t = node.op_type
    if t in ("Relu", "ThresholdedRelu"):
        return True
    if t == "Clip":
        lo = _const(node.inputs[1]) if len(node.inputs) > 1 else None
        if lo is None and "min" in node.attributes:
            lo = np.asarray(node.attributes["min"].as_float())
        return lo is not None and lo.size == 1 and float(lo) >= 0
    if t == "Max" and len(node.inputs) == 2:
        cs = [_const(v) for v in node.inputs]
        return sum(c is not None for c in cs) == 1 and all(c is None or (c.size == 1 and float(c) >= 0) for c in cs)
    return False


def other_nonlinearities(plan) -> Counter:
    """Op types of the non-ReLU-like non-linear nodes on the explained path. Squeeze-excitation gates (a gate Mul
    and the sigmoid that only feeds gates) scale the path and do not count: RegNetY stays a ReLU network."""
    kind = {id(a.node): a.kind for a in plan.assignments}
    found = Counter()
    for a in plan.assignments:
        if not a.on_path or a.kind not in _NONLINEAR_KINDS or a.kind == Kind.GATE or relu_like(a.node):
            continue
        users = [u.node for o in a.node.outputs for u in o.uses()]
        if a.kind in (Kind.OFFSET_ACTIVATION, Kind.HELD) and users and all(kind.get(id(n)) == Kind.GATE for n in users):
            continue  # the sigmoid of a gate
        if meta.INSIDE.has(a.node):
            continue  # a member of a recognised pattern: counted once, at its head
        pattern = meta.PATTERN.get(a.node)
        found[getattr(pattern, "name", None) or a.node.op_type] += 1
    return found


def choose(model: ir.Model, output: str | None = None, explain_logits: bool = True) -> tuple[str, str]:
    """(composite name, why) for the loaded, canonized ``model``."""
    from ..lrp import rewriter  # the plan: kinds per node

    plan = rewriter.plan(model, load_composite(RELU_COMPOSITE), output, explain_logits)
    other = other_nonlinearities(plan)
    if not other:
        return RELU_COMPOSITE, "auto: ReLU-like activations"
    ops = ", ".join(f"{n} x {op}" for op, n in other.most_common(3)) + (", ..." if len(other) > 3 else "")
    return OTHER_COMPOSITE, f"auto: non-ReLU non-linearities ({ops})"


def resolve(composite: Composite, model: ir.Model, output: str | None = None,
            explain_logits: bool = True) -> tuple[Composite, str]:
    """``composite`` itself, or for ``auto`` the chosen built-in with the parameters given to ``auto``; and why."""
    if not is_auto(composite):
        return composite, ""
    name, why = choose(model, output, explain_logits)
    try:
        chosen = load_composite(name).with_params(**dict(composite.pending))
    except ValueError as exc:
        raise InputError(f"{why} chose composite {name}: {exc}; give --composite (composite=...) explicitly") from None
    return chosen, why


def is_auto(composite: Composite) -> bool:
    return composite.source == "auto" and not composite.entries


__all__ = ["OTHER_COMPOSITE", "RELU_COMPOSITE", "choose", "is_auto", "other_nonlinearities", "relu_like", "resolve"]
