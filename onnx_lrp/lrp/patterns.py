"""Graph pattern recognisers for exported transformers; they match on graph structure, never on node names.

Exporters write the same function in many ways: SiLU as ``x * Sigmoid(x)``, GELU as
``x * 0.5 * (1 + Erf(x / sqrt 2))`` or ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, LayerNorm and RMSNorm as
``ReduceMean/Sub/Pow/Sqrt/Div/Reciprocal`` chains. Two structural facts cover all of them:

- **element-wise function of one tensor** (``elementwise_root``): a value computed from a single activation ``x``
  through element-wise ops only (unary ops, and binary ops whose other operand is a constant or another element-wise
  function of the same ``x``). A ``Mul`` (or ``Div``) whose two operands are both element-wise functions of the
  same ``x`` is a non-linearity of ``x`` (SiLU, GELU, x^2, softsign ``x / (1 + |x|)``, ...), not a bilinear product
  or a quotient of two activations: it gets the identity rule, relevance goes straight to ``x``.
- **normalising scale** (``match_norm_scale``): ``Div(n, s)`` or ``Mul(n, r)`` where ``s`` (``1/r``) is computed by
  element-wise ops with constants from a reduction (``ReduceMean``, ``ReduceSum``, ``ReduceSumSquare``,
  ``ReduceL2``) of an element-wise function of ``n`` itself: the std of LayerNorm (``n = x - mean(x)``) or the root
  mean square of RMSNorm (``n = x``). LXT detaches the scale; so do we: the scale chain gets no relevance and the
  division is linear in ``n``.
- **gate** (``match_gate``): ``Mul(h, g)`` with ``g`` computed through ``Sigmoid`` / ``HardSigmoid`` (then moves,
  and element-wise ops with constants: ``2 * sigmoid(s)``, ``1 + sigmoid(s)``) and ``h`` NOT an element-wise
  function of the same tensor: squeeze-excitation ``h * sigmoid(fc(pool(h)))``, GLU ``a * sigmoid(b)``, LSTM gates
  ``i * tanh(g)``. Kind ``gate``; the composites give it signal-take-all (the gate is a constant multiplier that
  takes no relevance, Arras et al. 2017). ``x * hardsigmoid(x)`` (hard-swish) and ``x * sigmoid(x)`` (SiLU) are
  element-wise functions of one tensor, not gates (``match_self_product`` is tried first).

``annotate(graph)`` records matches in ``node.meta``: ``lrp_pattern`` (a ``Match``) on the node that carries the
pattern, ``lrp_inside`` (the pattern's name) on the nodes inside it that get no relevance (only those whose outputs
are used nowhere else). Every matcher returns ``(match, reason)``: a failed match says why.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from ..core import meta
from ..core.graph import carries, const


# element-wise ops of one tensor (every other input, if any, must be a constant)
UNARY = {"Sigmoid", "Tanh", "Erf", "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Gelu", "Softplus", "Softsign",
         "HardSigmoid", "HardSwish", "Mish", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Sin", "Cos",
         "Cast", "CastLike", "Identity", "Clip", "Sign", "Floor", "Ceil", "Round"}
BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}
REDUCE = {"ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2"}
# ops between a reduction and the scale that only rescale, shift or invert it (other operands constant)
SCALE_OPS = {"Sqrt", "Reciprocal", "Add", "Mul", "Div", "Pow", "Cast", "CastLike", "Identity", "Max", "Clip"}
# ops that move values without changing what they are (followed when looking for a gate's source)
MOVES = {"Reshape", "Transpose", "Cast", "Identity", "Dropout", "Squeeze", "Unsqueeze", "Expand", "Slice", "Gather",
         "Concat", "Flatten", "Tile", "Split", "Where"}
_MAX_DEPTH = 16


@dataclass
class Match:
    """A recognised pattern: its ``name``, the tensor relevance goes to (``source``) and the nodes inside it."""

    name: str
    source: ir.Value
    inside: list = field(default_factory=list)
    gate: ir.Value | None = None  # for ``gate`` matches: the factor held constant


def _shape(v):
    if v is None or v.shape is None:
        return None
    return tuple(d if isinstance(d, int) else str(d) for d in v.shape)


def _acts(node: ir.Node) -> list:
    return [v for v in node.inputs if carries(v)]


def elementwise_root(v: ir.Value, _depth: int = 0, _memo: dict | None = None) -> ir.Value:
    """The single activation ``v`` is an element-wise function of (``v`` itself when it is not one)."""
    memo = {} if _memo is None else _memo
    if id(v) in memo:
        return memo[id(v)]
    root = v
    p = v.producer()
    if p is not None and _depth < _MAX_DEPTH and p.domain in ("", "ai.onnx"):
        acts = _acts(p)
        others_const = all(carries(x) or x is None or x.const_value is not None for x in p.inputs)
        if p.op_type in UNARY and len(acts) == 1 and p.inputs[0] is acts[0] and others_const:
            root = elementwise_root(acts[0], _depth + 1, memo)
        elif p.op_type in BINARY and acts and others_const and (p.op_type != "Pow" or len(acts) == 1 and
                                                                  p.inputs[0] is acts[0]):
            roots = {id(r): r for r in (elementwise_root(a, _depth + 1, memo) for a in acts)}
            if len(roots) == 1:
                r = next(iter(roots.values()))
                # broadcasting against a constant may not change the root's shape
                if _shape(r) is not None and _shape(r) == _shape(v):
                    root = r
    memo[id(v)] = root
    return root


def _chain_nodes(v: ir.Value, *stops: ir.Value) -> list:
    """The nodes between ``stops`` (excluded) and ``v`` (its producer included), walking activation inputs."""
    seen, out, stack = set(), [], [v]
    stop_ids = {id(s) for s in stops}
    while stack:
        x = stack.pop()
        if x is None or id(x) in stop_ids:
            continue
        p = x.producer()
        if p is None or id(p) in seen:
            continue
        seen.add(id(p))
        out.append(p)
        stack.extend(a for a in _acts(p))
    return out


def match_self_product(node: ir.Node) -> tuple[Match | None, str]:
    """``Mul(f(x), g(x))`` / ``Div(f(x), g(x))``: a product or quotient of a tensor with a function of itself (SiLU,
    GELU, x^2, softsign ``x / (1 + |x|)`` as exporters write it out)."""
    if node.op_type not in ("Mul", "Div"):
        return None, f"{node.op_type} is neither Mul nor Div"
    acts = _acts(node)
    if len(acts) != 2:
        return None, "not a product of two activations"
    ra, rb = (elementwise_root(a) for a in acts)
    if ra is not rb:
        pa, pb = (r.producer() for r in (ra, rb))
        return None, (f"the factors are functions of different tensors ({ra.name} from "
                      f"{pa.op_type if pa else 'an input'}, {rb.name} from {pb.op_type if pb else 'an input'})")
    if _shape(ra) is None or _shape(ra) != _shape(node.outputs[0]):
        return None, "the product broadcasts the tensor to another shape (not element-wise)"
    name = _name_nonlinearity(node, ra)
    src = _argument_below(node, ra)
    return Match(name, src, _chain_nodes(node.outputs[0], src)[1:]), ""


def _argument_below(node: ir.Node, root: ir.Value) -> ir.Value:
    """Where the function of one tensor begins: its argument (the highest value both factors are computed from),
    or, when that is a layer's output after its bias Add (``node.meta['lrp_bias_add']``), the layer's output
    (the layer's rule absorbs the bias). Not ``root`` below an element-wise affine chain (a decomposed
    LayerNorm/GroupNorm's scale and shift before a SiLU/GELU): those are linear layers of their own (LRP-0 in
    attnlrp), not part of the non-linearity; held inside it, their relevance passed unchanged and the rules
    below divided it by values near zero."""
    a, b = node.inputs
    in_b = {id(v) for v in _down(b, root, [], set())}
    arg = next((v for v in _down(a, root, [], set()) if id(v) in in_b), None)
    if arg is None:
        return root
    p = arg.producer()
    if p is not None and p.op_type == "Add" and arg is not root:
        below = [v for v in p.inputs if v is not None and carries(v)]
        layer = below[0].producer() if len(below) == 1 else None
        if layer is not None and meta.BIAS_ADD.get(layer) is p:
            return below[0]
    return arg


# element-wise ops with f(0) = 0 (of their one activation input)
_ZERO_AT_ZERO = {"Tanh", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu", "Erf", "Softsign", "HardSwish",
                 "Mish", "Neg", "Abs", "Sin", "Identity", "Cast", "CastLike", "Sign", "Floor", "Ceil", "Round", "Sqrt",
                 "ThresholdedRelu", "Shrink"}


def vanishes_at_zero(v: ir.Value, root: ir.Value, _depth: int = 0) -> bool:
    """Whether ``v``, an element-wise function of ``root``, is provably 0 where ``root`` is 0 (x, c x, tanh(x),
    x * anything, ...). False when unsure: the caller then treats f(0) as non-zero."""
    if v is root:
        return True
    p = v.producer()
    if p is None or _depth > _MAX_DEPTH:
        return False
    acts = _acts(p)
    consts = [x for x in p.inputs if x is not None and not carries(x)]

    def zero_consts():
        return all(x.const_value is not None and not np.any(x.const_value.numpy()) for x in consts)

    if p.op_type in _ZERO_AT_ZERO and len(acts) == 1 and p.inputs[0] is acts[0]:
        return vanishes_at_zero(acts[0], root, _depth + 1)
    if p.op_type == "Mul":
        return any(vanishes_at_zero(a, root, _depth + 1) for a in acts)
    if p.op_type == "Div":  # n / c, or n / d(x) with d(0) != 0 (softsign: x / (1 + |x|))
        return bool(acts) and p.inputs[0] is acts[0] and vanishes_at_zero(acts[0], root, _depth + 1) and (
            len(acts) == 1 or nonzero_at_zero(p.inputs[1], root, _depth + 1))
    if p.op_type in ("Add", "Sub"):
        return bool(acts) and zero_consts() and all(vanishes_at_zero(a, root, _depth + 1) for a in acts)
    if p.op_type == "Pow" and len(acts) == 1 and p.inputs[0] is acts[0]:
        e = const(p.inputs[1])
        return e is not None and bool(np.all(e > 0)) and vanishes_at_zero(acts[0], root, _depth + 1)
    return False


# element-wise ops whose value is never 0
_POSITIVE = {"Exp", "Sigmoid", "Softplus"}


def nonzero_at_zero(v: ir.Value, root: ir.Value, _depth: int = 0) -> bool:
    """Whether ``v``, an element-wise function of ``root``, is provably non-zero where ``root`` is 0: ``c + f(x)``
    with c != 0 and f(0) = 0 (softsign's 1 + |x|), exp, sigmoid. False when unsure."""
    p = v.producer()
    if p is None or _depth > _MAX_DEPTH or v is root:
        return False
    acts = _acts(p)
    if p.op_type in _POSITIVE and len(acts) == 1:
        return True
    if p.op_type in ("Add", "Sub") and len(acts) == 1 and len(p.inputs) == 2:
        c = const(p.inputs[1] if p.inputs[0] is acts[0] else p.inputs[0])
        return c is not None and bool(np.all(c != 0)) and vanishes_at_zero(acts[0], root, _depth + 1)
    return False


def _down(v: ir.Value, root: ir.Value, out: list, seen: set, depth: int = 0) -> list:
    """The values of the element-wise chain from ``v`` down to ``root``, top-down (depth first)."""
    if id(v) in seen or depth > _MAX_DEPTH:
        return out
    seen.add(id(v))
    out.append(v)
    if v is root:
        return out
    p = v.producer()
    if p is not None:
        for a in _acts(p):
            _down(a, root, out, seen, depth + 1)
    return out


def function_argument(node: ir.Node) -> ir.Value | None:
    """For a self-product ``Mul(A, B)`` of one tensor: the highest value both factors are computed from (GELU's
    ``a`` in ``a * (1 + erf(a / sqrt 2))``, also when ``a`` is a layer's output after its bias Add)."""
    m = meta.PATTERN.get(node)
    if m is None or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    in_b = {id(v) for v in _down(b, m.source, [], set())}
    return next((v for v in _down(a, m.source, [], set()) if id(v) in in_b), None)


def _name_nonlinearity(node: ir.Node, root: ir.Value) -> str:
    ops = {n.op_type for n in _chain_nodes(node.outputs[0], root)}
    if "Sigmoid" in ops and ops <= {"Sigmoid", "Mul", "Cast"}:
        return "silu"
    if "Erf" in ops:
        return "gelu-erf"
    if "Tanh" in ops:
        return "gelu-tanh"
    return "elementwise"


def _scale_source(s: ir.Value) -> tuple[ir.Node | None, str, bool]:
    """Walk from a scale through SCALE_OPS to a reduction; returns (reduce node, reason, inverted)."""
    inverted = False
    v = s
    for _ in range(_MAX_DEPTH):
        p = v.producer()
        if p is None:
            return None, f"{v.name} is a graph input, not computed by a reduction", inverted
        if p.op_type in REDUCE:
            return p, "", inverted
        if p.op_type not in SCALE_OPS:
            return None, f"{p.name} ({p.op_type}) between the reduction and the scale is not a rescaling", inverted
        acts = _acts(p)
        if len(acts) != 1:
            return None, f"{p.name} ({p.op_type}) combines two activations", inverted
        if p.op_type == "Reciprocal":
            inverted = not inverted
        elif p.op_type == "Div" and p.inputs[1] is acts[0]:
            inverted = not inverted  # c / v
        elif p.op_type == "Pow":
            e = const(p.inputs[1])
            if e is None or p.inputs[0] is not acts[0]:
                return None, f"{p.name} (Pow) has a non-constant exponent", inverted
            if float(np.asarray(e).reshape(-1)[0]) < 0:
                inverted = not inverted
        v = acts[0]
    return None, "the chain from the scale to a reduction is too long", inverted


def _same(a: ir.Value, b: ir.Value, depth: int = 0) -> bool:
    """Whether two values compute the same thing (the same value, or the same ops on the same inputs)."""
    if a is b:
        return True
    if depth > 4 or a is None or b is None:
        return False
    ca, cb = const(a), const(b)
    if ca is not None or cb is not None:
        return ca is not None and cb is not None and ca.shape == cb.shape and bool(np.all(ca == cb))
    pa, pb = a.producer(), b.producer()
    if pa is None or pb is None or pa.op_type != pb.op_type or len(pa.inputs) != len(pb.inputs):
        return False
    if {k: v.value if not hasattr(v.value, "numpy") else None for k, v in pa.attributes.items()} != {
            k: v.value if not hasattr(v.value, "numpy") else None for k, v in pb.attributes.items()}:
        return False
    return all(_same(x, y, depth + 1) for x, y in zip(pa.inputs, pb.inputs))


def match_norm_scale(node: ir.Node) -> tuple[Match | None, str]:
    """``Div(n, s)`` / ``Mul(n, 1/s)`` with ``s`` a reduction of ``n`` (LayerNorm's std, RMSNorm's rms)."""
    if node.op_type not in ("Div", "Mul"):
        return None, f"{node.op_type} is neither Div nor Mul"
    acts = _acts(node)
    if len(acts) != 2 or any(v is None for v in node.inputs[:2]):
        return None, "not a product or quotient of two activations"
    candidates = [(node.inputs[0], node.inputs[1])] if node.op_type == "Div" else [
        (node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])]
    reasons = []
    for num, scale in candidates:
        red, why, inverted = _scale_source(scale)
        if red is None:
            reasons.append(f"scale {scale.name}: {why}")
            continue
        if inverted != (node.op_type == "Mul"):
            reasons.append(f"scale {scale.name} is {'inverted' if inverted else 'not inverted'} for a "
                           f"{node.op_type}")
            continue
        stat_in = red.inputs[0]
        base = elementwise_root(stat_in)
        n_root = elementwise_root(num)
        if not (base is n_root or _same(base, n_root) or base is num or _same(base, num)):
            reasons.append(f"the reduction {red.name} does not reduce the numerator {num.name}")
            continue
        kind = "rmsnorm-scale"
        p = n_root.producer()
        if p is not None and p.op_type == "Sub":
            sub_acts = _acts(p)
            if len(sub_acts) == 2 and sub_acts[1].producer() is not None and \
                    sub_acts[1].producer().op_type == "ReduceMean":
                kind = "layernorm-scale"
        inside = _chain_nodes(scale, n_root, base, num)
        # the numerator's own element-wise chain (e.g. a Cast) stays outside; only the scale's chain is held
        inside = [n for n in inside if not any(o is num for o in n.outputs)]
        return Match(kind, num, inside), ""
    return None, "; ".join(reasons)


GATE_OPS = ("Sigmoid", "HardSigmoid")
# element-wise ops with a constant other operand that keep a gate a gate (followed in both searches)
_CONST_AFFINE = ("Add", "Sub", "Mul", "Div")


def _through_const(p: ir.Node) -> ir.Value | None:
    """The single activation input of an Add/Sub/Mul/Div whose other operand is a constant (else None)."""
    if p.op_type not in _CONST_AFFINE or len(p.inputs) != 2:
        return None
    acts = _acts(p)
    if len(acts) != 1 or any(x is not acts[0] and (x is None or x.const_value is None) for x in p.inputs):
        return None
    if p.op_type == "Div" and p.inputs[0] is not acts[0]:
        return None  # c / g is no gate
    return acts[0]


def sigmoid_gate(v: ir.Value) -> ir.Node | None:
    """The Sigmoid / HardSigmoid node ``v`` is computed from through moves and constant rescalings, or None."""
    for _ in range(_MAX_DEPTH):
        p = v.producer()
        if p is None or p.domain not in ("", "ai.onnx"):
            return None
        if p.op_type in GATE_OPS:
            return p
        nxt = _through_const(p)
        if nxt is None and p.op_type in MOVES:
            acts = _acts(p)
            nxt = acts[0] if len(acts) == 1 else None
        if nxt is None:
            return None
        v = nxt
    return None


# ops a mixture-of-experts routing weight passes on its way from TopK to the expert product: renormalisation
# (``w / sum(w)``, a normalising scale), Softmax over the top-k logits, scattering into a dense [tokens, experts] gate
ROUTE_OPS = ("Softmax", "ScatterElements", "ScatterND")


def routing_path(v: ir.Value) -> list | None:
    """The nodes ``v`` is computed by from a TopK's values (Mixtral's router weights), TopK and a Softmax right
    before it included, or None: through moves, constant rescalings, Softmax, renormalisation by their own sum, and
    scatters into a constant tensor."""
    path = []
    for _ in range(_MAX_DEPTH):
        p = v.producer()
        if p is None or p.domain not in ("", "ai.onnx"):
            return None
        if p.op_type == "TopK":
            if v is not p.outputs[0]:
                return None
            path.append(p)
            before = p.inputs[0].producer() if p.inputs and p.inputs[0] is not None else None
            if before is not None and before.op_type == "Softmax" and len(_acts(before)) == 1:
                path.append(before)  # the router's softmax: feeds only the routing weights (held if so)
            return path
        nxt = _through_const(p)
        if nxt is None and (p.op_type in MOVES or p.op_type in ROUTE_OPS):
            acts = _acts(p)
            nxt = acts[0] if len(acts) == 1 else None
        inside = []
        if nxt is None and p.op_type in ("Div", "Mul"):
            m, _ = match_norm_scale(p)
            nxt, inside = (m.source, m.inside) if m is not None else (None, [])
        if nxt is None:
            return None
        path += [p] + [n for n in inside if n is not p]
        v = nxt
    return None


def routing_gate(v: ir.Value) -> ir.Node | None:
    """The TopK node whose values ``v`` is computed from (Mixtral's router weights; ``routing_path``), or None."""
    path = routing_path(v)
    return next((n for n in path if n.op_type == "TopK"), None) if path else None


def match_gate(node: ir.Node) -> tuple[Match | None, str]:
    """``Mul(h, g)``: a signal ``h`` times a sigmoid / hard-sigmoid gate ``g`` of another tensor, or times the
    top-k routing weights ``g`` of a mixture of experts (TopK values, renormalised, scattered or gathered)."""
    if node.op_type != "Mul":
        return None, f"{node.op_type} is not a Mul"
    acts = _acts(node)
    if len(acts) != 2 or acts[0] is acts[1]:
        return None, "not a product of two activations"
    gates = [g if (g := sigmoid_gate(a)) is not None else routing_gate(a) for a in acts]
    if gates[0] is not None and gates[1] is not None:
        return None, "both factors are gates"
    if gates[0] is None and gates[1] is None:
        return None, "no factor is computed by a Sigmoid or HardSigmoid, or is TopK routing weights"
    i = 0 if gates[0] is not None else 1
    if elementwise_root(acts[0]) is elementwise_root(acts[1]):
        return None, "the factors are element-wise functions of one tensor (not a gate)"
    routed = routing_path(acts[i]) if gates[i].op_type == "TopK" else None
    return Match("gate", acts[1 - i], routed or [], gate=acts[i]), ""


def _uses_within(node: ir.Node, allowed: set) -> bool:
    for o in node.outputs:
        if o.is_graph_output():
            return False
        if not carries(o):  # TopK's indices: they select, they carry no relevance
            continue
        for use in o.uses():
            if id(use.node) not in allowed:
                return False
    return True


def annotate(graph: ir.Graph) -> list[Match]:
    """Record every match in ``node.meta`` (idempotent); returns the matches."""
    matches, routers = [], []
    for node in graph:
        meta.PATTERN.clear(node)
        meta.INSIDE.clear(node)
    for node in graph:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Mul", "Div"):
            continue
        if len(_acts(node)) != 2:
            continue
        m, _ = match_norm_scale(node)
        if m is None:
            m, _ = match_self_product(node)
        if m is None and node.op_type == "Mul":
            m, _ = match_gate(node)
        if m is None:
            continue
        meta.PATTERN.set(node, m)
        if m.name != "gate":  # a gate's branch is not held: its nodes may feed other things
            matches.append(m)
        elif m.inside:  # ... but a MoE router's is, as far as it feeds only the routing weights
            routers.append(m)
    # inner nodes get no relevance when all their uses are inside their pattern (fixed point: inner-most first)
    for m in matches + routers:
        owner = next(n for n in graph if meta.PATTERN.get(n) is m)
        held = {id(owner)}
        changed = True
        while changed:
            changed = False
            for n in m.inside:
                if id(n) not in held and _uses_within(n, held):
                    held.add(id(n))
                    changed = True
        for n in m.inside:
            if id(n) in held and not meta.PATTERN.has(n):
                meta.INSIDE.set(n, "mixture-of-experts router" if m.name == "gate" else m.name)
    return matches


def gate_source(v: ir.Value) -> str | None:
    """What makes ``v`` a gate (an operand CP-LRP holds constant): 'softmax' or the non-linearity's name. The search
    follows moves and element-wise ops with a constant (TorchScript writes GELU as ``x * (1 + erf(x / sqrt 2)) *
    0.5``: the recognised GELU is the inner Mul, the gate's value the outer one)."""
    for _ in range(_MAX_DEPTH):
        p = v.producer()
        if p is None:
            return None
        if p.op_type in ("Softmax", "LogSoftmax"):
            return "softmax"
        m = meta.PATTERN.get(p)
        if isinstance(m, Match) and m.name in ("silu", "gelu-erf", "gelu-tanh", "elementwise"):
            return m.name
        if p.op_type in ("Sigmoid", "Tanh", "Relu", "Gelu", "Softplus", "HardSigmoid", "HardSwish", "Mish", "Elu"):
            return p.op_type.lower()
        nxt = _through_const(p)
        if nxt is not None:
            v = nxt
            continue
        if p.op_type not in MOVES:
            return None
        acts = _acts(p)
        if len(acts) != 1:
            return None
        v = acts[0]
    return None


def why(node: ir.Node) -> str:
    """Why a Mul/Div of two activations matched no pattern (for error messages and tests)."""
    m, r1 = match_norm_scale(node)
    if m is not None:
        return f"matches {m.name}"
    m, r2 = match_self_product(node)
    if m is not None:
        return f"matches {m.name}"
    return f"no normalising scale ({r1}); not a function of one tensor ({r2})"


__all__ = ["Match", "annotate", "elementwise_root", "vanishes_at_zero", "function_argument", "nonzero_at_zero",
           "match_self_product", "match_norm_scale", "match_gate",
           "sigmoid_gate", "gate_source", "why"]
