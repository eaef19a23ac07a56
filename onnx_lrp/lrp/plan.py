"""The plan of a rewrite: an op handler and a rule for every node (``plan``), nothing emitted yet; what the plan
refuses and why (``Plan.unsupported``, ``unsupported_hint``, ``check_bounds``, ``no_path``) and its rows for
``onnx-lrp inspect`` (``describe``)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from ..core import meta
from ..core.errors import InputError, LrpError, internal_error
from ..core.graph import ancestors, captured_values, carries, static_dims
from . import patterns
from .composite_check import check_composite
from .ops import REGISTRY
from .target import SOFTMAX, explained_value
from .vocabulary import LAYER_KINDS, Category, CompositeView, Kind, NodeInfo, RuleView


@dataclass
class Assignment:
    """One node's handler (``op``, None when there is none), its kind, its rule, and whether it is supported (else
    ``reason``), on the path to the explained tensor, a linear layer nearest an input (``first_linear``)."""

    node: ir.Node
    op: object
    rule: RuleView | None
    kind: Kind | str
    supported: bool
    reason: str = ""
    on_path: bool = True
    first_linear: bool = False


@dataclass
class Plan:
    """The explained tensor, the output it belongs to, one ``Assignment`` per node (in graph order)."""

    explained: ir.Value
    output: ir.Value
    assignments: list[Assignment] = field(default_factory=list)
    no_path: str | None = None  # why no relevance can reach any input (None: some input is reached)

    @property
    def unsupported(self) -> list[Assignment]:
        return [a for a in self.assignments if a.on_path and not a.supported]


_CONTROL_FLOW = {
    "Loop": "control flow: no relevance rule for a Loop (tf2onnx writes a Keras GRU/SimpleRNN so); export the "
            "recurrent layer unrolled (Keras: unroll=True) or as an ONNX LSTM/GRU/RNN op",
    "Scan": "control flow: no relevance rule for a Scan; export the recurrence unrolled or as an ONNX "
            "LSTM/GRU/RNN op",
    "If": "control flow: no relevance rule for an If; export the model for one fixed branch",
}


def relay_sources(node: ir.Node) -> list:
    """Values relevance relays to past the node's own inputs (``Op.relay_sources``)."""
    op = REGISTRY.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    return op.relay_sources(node) if op is not None else []


def _on_path(y: ir.Value) -> frozenset:
    """ids of the nodes relevance can reach from ``y``: through float activations, and from a DequantizeLinear to its
    QuantizeLinear's input (relay) and into what a Loop/Scan/If body reads by name (captured)."""
    return ancestors(y, follow=carries, inputs=lambda n: list(n.inputs) + relay_sources(n) + captured_values(n)).nodes


def plan(model: ir.Model, composite: CompositeView, output: str | None = None, explain_logits: bool = True) -> Plan:
    """Assign an op handler and a rule to every node; nothing is emitted."""
    graph = model.graph
    check_composite(composite, graph)
    patterns.annotate(graph)
    y, out = explained_value(graph, output, explain_logits)
    on_path = _on_path(y)
    result = Plan(explained=y, output=out)
    # linear layers reached from an input without crossing another linear layer are "first"; not through values
    # computed from the input's shape only (a zero initial state built from the batch size does not make the
    # recurrent map that reads it a first layer); int8 values of a QuantizeLinear -> DequantizeLinear pair do pass
    reached = {id(v) for v in graph.inputs}
    node = None
    try:
        for node in graph:
            result.assignments.append(_assign(node, composite, reached, id(node) in on_path))
    except LrpError:
        raise
    except Exception as exc:  # a bug (or a malformed node a check did not foresee): named by node
        raise internal_error(node, exc) from exc
    # float inputs only: relevance reaches an input iff a node on the path reads it (token inputs reach through
    # their embedding lookups, found by the rewrite itself, which refuses then)
    tokens = any(v.dtype is not None and v.dtype.is_integer() for v in graph.inputs)
    if not tokens and not any(a.on_path and any(v is not None and v.is_graph_input() and carries(v)
                                                for v in a.node.inputs) for a in result.assignments):
        result.no_path = no_path(result, list(graph))
    return result


def _assign(node: ir.Node, composite: CompositeView, reached: set, on_path: bool) -> Assignment:
    """The node's assignment; ``reached`` (ids of values computed from an input without a linear layer between)
    grows by the node's outputs where they are."""
    dispatcher = REGISTRY.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    op = dispatcher.resolve(node) if dispatcher is not None else None
    kind = op.kind if op is not None else Kind.UNKNOWN
    feeds = any(id(v) in reached for v in node.inputs if v is not None)
    first = feeds and kind in LAYER_KINDS
    if feeds and not first and kind != Kind.RECURRENT:  # a recurrent layer is linear in its input too
        reached.update(id(o) for o in node.outputs if not meta.SHAPE_ONLY.get(o, False))
    a = Assignment(node, op, None, kind, True, on_path=on_path, first_linear=first)
    if meta.ABSORBED_BY.has(node):  # relevance passes to the layer's output (the composite's identity rule)
        a.kind, a.rule = Kind.BIAS, composite.pass_rule()
        a.reason = "bias folded into " + meta.ABSORBED_BY.get(node).name
    elif meta.INSIDE.has(node):  # inside a recognised pattern (held scale, GELU/SiLU chain): no relevance
        a.kind, a.rule, a.reason = Kind.HELD, composite.pass_rule(), "inside a recognised " + meta.INSIDE.get(node)
    elif dispatcher is None and node.op_type in _CONTROL_FLOW and node.domain in ("", "ai.onnx"):
        a.supported, a.reason = False, meta.CONTROL_FLOW_REASON.get(node, _CONTROL_FLOW[node.op_type])
    elif dispatcher is None:
        a.supported, a.reason = False, "no handler for this op"
    else:
        reason = dispatcher.check(node) or (op.check(node) if op is not dispatcher else None)
        if reason:
            a.supported, a.reason = False, reason
        else:
            _assign_rule(a, composite)
    return a


def _assign_rule(a: Assignment, composite: CompositeView) -> None:
    """The composite's rule for a node whose handler accepts it, or why it is unsupported."""
    node, op = a.node, a.op
    rule = composite.rule_for(NodeInfo(node.name, node.op_type, a.kind, a.first_linear))
    if rule is None:
        a.supported, a.reason = False, f"composite {composite.name!r} assigns no rule to kind {str(a.kind)!r}"
        return
    a.rule = rule
    misfit = rule.fits(op)
    if misfit:
        a.supported, a.reason = False, misfit
    elif op.category in (Category.LINEAR, Category.ACTIVATION) and any(carries(o) for o in node.outputs) \
            and not op.relevance_values(node):
        a.supported, a.reason = False, ("no float activation among its inputs (parameters or "
                                        "integer tensors only): relevance cannot pass it")


def unsupported_hint(graph: ir.Graph, p: Plan, composite: CompositeView) -> str:
    """What to do about unsupported nodes, by why they are unsupported: the transformer composite when the graph has
    softmax attention."""
    full = "`onnx-lrp inspect MODEL` lists every node"
    bad = p.unsupported
    if bad and all(a.reason.startswith("malformed") for a in bad):
        return ("The model is malformed there (the ONNX checker lets it pass, onnxruntime would not run it): "
                f"re-export it; {full}.")
    softmax = any(a.on_path and a.node.op_type in SOFTMAX for a in p.assignments)
    bilinear = any(a.on_path and a.kind == Kind.BILINEAR for a in p.assignments)
    if (softmax or bilinear) and composite.name not in ("attnlrp", "cp-lrp"):
        what = "softmax attention" if softmax else "products of two activations"
        return (f"The graph has {what}: explain it with --composite attnlrp (or cp-lrp), whose rules cover them; "
                f"{full}.")
    if bad and all(a.reason.startswith("control flow:") for a in bad):
        return f"{full}."  # the reason says what to do
    if bad and all(a.op is None and a.kind == Kind.UNKNOWN for a in bad):
        return f"{full}; add a handler in onnx_lrp/lrp/ops (a composite can map only ops that have one)."
    return (f"{full}; give them a rule in a composite file (rule = \"pass\" only for element-wise ops that keep "
            "their input's relevance) or add a handler in onnx_lrp/lrp/ops.")


def check_bounds(p: Plan, composite: CompositeView) -> None:
    """ZBox needs the input's range (no silent default) and bounds that broadcast against one item of its input."""
    for a in p.assignments:
        if not (a.on_path and a.supported and a.rule.is_box):
            continue
        if a.rule.low is None or a.rule.high is None:
            raise InputError(f"composite {composite.name!r} applies zbox to node {a.node.name} ({a.node.op_type}) but "
                             "has no input bounds: give the lowest and highest value an input element can take "
                             "(command line: --mean/--std, the bounds then follow from them, or --low/--high; "
                             "Python: Explainer(..., low=, high=), for pixels in [0, 1] normalised with mean and "
                             "std per channel low = (0 - mean) / std, high = (1 - mean) / std; composite file: "
                             "low = ..., high = ...)")
        xs = a.op.relevance_values(a.node)
        dims = static_dims(xs[0]) if xs else None
        if not dims:
            continue
        item = tuple(1 if d is None else d for d in dims[1:])
        for what, bound in (("low", a.rule.low), ("high", a.rule.high)):
            shape = np.shape(bound)
            try:
                fits = np.broadcast_shapes(shape, item) == item and len(shape) <= len(item)
                # a flat list of several values would broadcast along the last axis, not the channels
                fits = fits and not (len(shape) == 1 and shape[0] > 1 and len(item) > 1)
            except ValueError:
                fits = False
            if not fits:
                chan = f", or one per channel shaped [{item[0]}, {', '.join(['1'] * (len(item) - 1))}]" \
                    if len(item) > 1 else f", or one per feature ({item[0]} values)"
                raise InputError(f"zbox bound {what} of shape {list(shape)} does not fit the input "
                                 f"{xs[0].name!r} of node {a.node.name} ({a.node.op_type}, one item "
                                 f"{'x'.join(map(str, item))}): give one value{chan}")


def no_path(p: Plan, forward_nodes: list) -> str:
    """Why no relevance reaches any input: the nodes on the way to the output that cut the float path."""
    wanted = ancestors(p.explained).nodes
    cuts = [n for n in forward_nodes if id(n) in wanted and not any(carries(o) for o in n.outputs)
            and any(carries(v) for v in n.inputs)]
    where = "; ".join(f"{n.name} ({n.op_type}) turns a float activation into "
                      f"{n.outputs[0].dtype.name.lower() if n.outputs[0].dtype else 'a non-float'} values"
                      for n in cuts[:3])
    return (f"no relevance path from any input to {p.explained.name!r}: it is not computed from a float input "
            f"through differentiable nodes{' (' + where + ')' if where else ''}; explain another output "
            "(--output) or an earlier tensor")


def describe(p: Plan) -> list[dict]:
    """One row per node for ``onnx-lrp inspect``."""
    rows = []
    for a in p.assignments:
        role = "activation" if any(carries(o) for o in a.node.outputs) else "parameter"
        rows.append(dict(name=a.node.name, op_type=a.node.op_type, kind=a.kind, role=role,
                         rule=(a.rule.name if a.rule is not None else "-"), supported=a.supported,
                         on_path=a.on_path, first_linear=a.first_linear, reason=a.reason))
    return rows


__all__ = ["Assignment", "Plan", "plan", "relay_sources", "unsupported_hint", "check_bounds", "no_path", "describe"]
