"""The rewriter: one reverse topological walk that appends relevance propagation to the forward graph.

The result is ONE model: its outputs are the original outputs, then ``lrp/relevance/<input>`` for every float
graph input (and for the tensors asked for with ``relevance_at``), then ``lrp/target_used`` (the explained index
per batch item, into the output flattened per item). Optional inputs steer it: ``lrp/target`` (int64 [batch]; -1 =
arg-max, the default), ``lrp/one_hot`` (bool scalar; start from 1 at the target instead of the target's output
value, the default) and, for sequence outputs (N, T, C...), ``lrp/position`` (int64 [batch]; the index along T,
negative counts from the end; default -1, the last position, as for a causal LM): then ``lrp/target`` is a class
at that position.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from . import patterns
from .deployed import relay_sources
from .errors import InputError, UnsupportedError
from .graph import Emitter, static_dims
from .ops import PRESERVES_NONNEG, REGISTRY, ActivationOp, LinearOp, ShapeOp, carries, is_param
from .ops.elementwise import nonneg_output
from .ops.transformer import token_relevance
from .propagate import Layer, Rel, apply_rule, apply_rule_grad, gradient_form, rule_fits, zero_preserving
from .rules.composite import Composite, NodeInfo
from .rules.rules import Pass, Rule

TARGET_INPUT = "lrp/target"
POSITION_INPUT = "lrp/position"  # only for outputs of rank >= 3: the index along axis 1 (< 0: from the end)
ONE_HOT_INPUT = "lrp/one_hot"
TARGET_OUTPUT = "lrp/target_used"
RELEVANCE_PREFIX = "lrp/relevance/"
_SOFTMAX = ("Softmax", "LogSoftmax")


@dataclass
class Assignment:
    node: ir.Node
    op: object
    rule: Rule | None
    kind: str
    supported: bool
    reason: str = ""
    on_path: bool = True
    first_linear: bool = False


@dataclass
class Plan:
    explained: ir.Value
    output: ir.Value
    assignments: list[Assignment] = field(default_factory=list)

    @property
    def unsupported(self) -> list[Assignment]:
        return [a for a in self.assignments if a.on_path and not a.supported]


def explained_value(graph: ir.Graph, output: str | None, explain_logits: bool = True) -> tuple[ir.Value, ir.Value]:
    """(the tensor explained, the output it belongs to). Default output: the first float output computed from the
    inputs (an exporter may list an integer output, e.g. a token count, first). A softmax output is explained through
    its logits, also when a reshape follows it (an opset < 13 Softmax upgraded to Flatten -> Softmax -> Reshape)."""
    outs = list(graph.outputs)
    if output is None:
        out = next((o for o in outs if carries(o)), outs[0])
    else:
        match = [o for o in outs if o.name == output]
        if not match:
            raise InputError(f"model has no output {output!r}; its outputs are: {', '.join(o.name for o in outs)}")
        out = match[0]
    y = out
    if explain_logits:
        logits = _softmax_logits(out)
        if logits is not None:
            y = logits
    if not carries(y):
        why = "" if output is not None else "; no output is"
        if any(v.dtype is not None and not v.dtype.is_floating_point() for v in graph.inputs) and \
                not any(carries(v) for v in graph.inputs):
            why += (" (relevance starts at float inputs and at embedding lookups of token ids; values computed "
                    "only from other integer inputs, such as masks or integer images, carry none: feed a float "
                    "input)")
        raise InputError(f"output {out.name!r} is not a float tensor computed from the inputs; nothing to explain{why}")
    return y, out


_RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def _softmax_logits(out: ir.Value) -> ir.Value | None:
    """The input of the Softmax that produces ``out``, directly or through at most two reshapes."""
    v = out
    for _ in range(3):
        producer = v.producer()
        if producer is None:
            return None
        if producer.op_type in _SOFTMAX:
            return producer.inputs[0] if carries(producer.inputs[0]) else None
        if producer.op_type not in _RESHAPES or not carries(producer.inputs[0]):
            return None
        v = producer.inputs[0]
    return None


def _ancestors(y: ir.Value) -> set[int]:
    """ids of nodes whose outputs flow into y."""
    seen: set[int] = set()
    stack = [y.producer()] if y.producer() is not None else []
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        for v in list(n.inputs) + relay_sources(n):  # relay: DequantizeLinear -> its QuantizeLinear's input
            if v is not None and v.producer() is not None and carries(v):
                stack.append(v.producer())
    return seen


def plan(model: ir.Model, composite: Composite, output: str | None = None, explain_logits: bool = True) -> Plan:
    """Assign an op handler and a rule to every node; nothing is emitted."""
    graph = model.graph
    patterns.annotate(graph)
    y, out = explained_value(graph, output, explain_logits)
    on_path = _ancestors(y)
    result = Plan(explained=y, output=out)
    # linear layers reached from an input without crossing another linear layer are "first"
    reached = {id(v) for v in graph.inputs}
    for node in graph:
        dispatcher = REGISTRY.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        op = dispatcher.resolve(node) if dispatcher is not None else None
        kind = op.kind if op is not None else "unknown"
        feeds = any(id(v) in reached for v in node.inputs if v is not None)
        first = feeds and kind in ("convolution", "dense")
        if feeds and not first:
            reached.update(id(o) for o in node.outputs)
        a = Assignment(node, op, None, kind, True, on_path=id(node) in on_path, first_linear=first)
        if "lrp_absorbed_by" in node.meta:
            a.kind, a.rule, a.reason = "bias", Pass(), "bias folded into " + node.meta["lrp_absorbed_by"].name
        elif "lrp_inside" in node.meta:  # inside a recognised pattern (held scale, GELU/SiLU chain): no relevance
            a.kind, a.rule, a.reason = "held", Pass(), "inside a recognised " + node.meta["lrp_inside"]
        elif dispatcher is None:
            a.supported, a.reason = False, "no handler for this op"
        else:
            reason = dispatcher.check(node) or (op.check(node) if op is not dispatcher else None)
            if reason:
                a.supported, a.reason = False, reason
            else:
                rule = composite.rule_for(NodeInfo(node.name, node.op_type, kind, first))
                if rule is None:
                    a.supported, a.reason = False, f"composite {composite.name!r} assigns no rule to kind {kind!r}"
                else:
                    a.rule = rule
                    misfit = rule_fits(op, rule)
                    if misfit:
                        a.supported, a.reason = False, misfit
        result.assignments.append(a)
    return result


def _nonneg_analysis(graph: ir.Graph) -> dict[int, bool]:
    known: dict[int, bool] = {}

    def nonneg(v):
        if v is None:
            return True
        if is_param(v):
            arr = v.const_value.numpy()
            return arr.dtype.kind in "biu" or bool(np.all(arr >= 0))
        return known.get(id(v), False)

    for node in graph:
        ins = [nonneg(v) for v in node.inputs]
        if node.op_type in PRESERVES_NONNEG:
            flag = all(ins[:1]) if node.op_type in ("Reshape", "Gather", "Slice", "Expand", "Squeeze",
                                                    "Unsqueeze", "Pad") else all(ins)
        else:
            flag = nonneg_output(node, ins)
        for o in node.outputs:
            known[id(o)] = bool(flag)
    return known


def _start_relevance(em: Emitter, graph: ir.Graph, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """r0 = onehot(target) * y (or onehot alone), target = argmax where lrp/target < 0."""
    target = ir.Value(name=TARGET_INPUT, shape=ir.Shape(["lrp_batch"]), type=ir.TensorType(ir.DataType.INT64),
                      const_value=ir.tensor(np.array([-1], dtype=np.int64), name=TARGET_INPUT))
    one_hot = ir.Value(name=ONE_HOT_INPUT, shape=ir.Shape([]), type=ir.TensorType(ir.DataType.BOOL),
                       const_value=ir.tensor(np.array(False), name=ONE_HOT_INPUT))
    graph.inputs.extend([target, one_hot])
    graph.register_initializer(target)
    graph.register_initializer(one_hot)
    with em.scope("start"):
        flat = em.op("Flatten", y, axis=1, tag="y_flat")
        dims = static_dims(y)
        if dims is None or len(dims) < 2 or any(d is None for d in dims[2:]) or (len(dims) == 2 and dims[1] is None):
            raise InputError(f"explained tensor {y.name!r} needs static dimensions after the first two (the batch "
                             "and, for sequence outputs, the sequence length may be dynamic)")
        chunk = int(np.prod(dims[2:]))  # entries per position (axis 1) of a sequence output
        # a dynamic sequence length: the one-hot's width (and each entry's position) come from y's shape
        width_v = em.ints([dims[1] * chunk]) if dims[1] is not None else em.op("Shape", flat, start=1, end=2,
                                                                                tag="width")
        use_argmax = em.op("Less", target, em.scalar(0, np.int64), tag="use_argmax")
        if len(dims) < 3:
            argmax = em.op("ArgMax", flat, axis=1, keepdims=0, tag="argmax")
            chosen = em.op("Where", use_argmax, argmax, target, tag="target")
        else:  # sequence outputs (N, T, C...): the target is a class at lrp/position (< 0: from the end)
            position = ir.Value(name=POSITION_INPUT, shape=ir.Shape(["lrp_batch"]),
                                type=ir.TensorType(ir.DataType.INT64),
                                const_value=ir.tensor(np.array([-1], dtype=np.int64), name=POSITION_INPUT))
            graph.inputs.append(position)
            graph.register_initializer(position)
            if dims[1] is not None:
                rows = em.scalar(dims[1], np.int64)
                row_of = em.const(np.arange(dims[1] * chunk, dtype=np.int64)[None] // chunk, tag="row_of",
                                  dtype=np.int64)
            else:
                width_n = em.op("Squeeze", width_v, tag="width_n")
                rows = em.op("Div", width_n, em.scalar(chunk, np.int64), tag="rows")
                index = em.op("Range", em.scalar(0, np.int64), width_n, em.scalar(1, np.int64), tag="flat_index")
                row_of = em.op("Unsqueeze", em.op("Div", index, em.scalar(chunk, np.int64), tag="row"),
                               em.ints([0]), tag="row_of")
            from_end = em.op("Less", position, em.scalar(0, np.int64), tag="from_end")
            row = em.op("Where", from_end, em.add(position, rows, tag="position_wrapped"), position, tag="row")
            in_row = em.op("Equal", row_of, em.op("Unsqueeze", row, em.ints([1]), tag="row_1"), tag="in_row")
            argmax = em.op("ArgMax", em.op("Where", in_row, flat, em.scalar(-np.inf), tag="y_row"), axis=1,
                           keepdims=0, tag="argmax")
            given = em.add(em.op("Mul", row, em.scalar(chunk, np.int64), tag="row_start"), target, tag="given")
            chosen = em.op("Where", use_argmax, argmax, given, tag="target")
        hot = em.op("OneHot", chosen, width_v, em.const(np.array([0, 1], dtype=np.int64),
                                                                 tag="onehot_values", dtype=np.int64),
                    axis=1, tag="onehot_int")  # int64 values: onnxruntime has no double OneHot
        hot = em.op("Cast", hot, to=em.dtype.value, tag="onehot")
        scale = em.op("Where", one_hot, em.scalar(1.0), flat, tag="start_scale")
        r0 = em.mul(hot, scale, tag="r0_flat")
        r0 = em.reshape_like(r0, y, tag="r0")
    chosen.name = TARGET_OUTPUT
    chosen.type = ir.TensorType(ir.DataType.INT64)
    chosen.shape = ir.Shape(["lrp_batch"])
    return r0, chosen


def rewrite(model: ir.Model, composite: Composite, output: str | None = None, relevance_at=(),
            explain_logits: bool = True) -> ir.Model:
    """Append the relevance graph to ``model`` (in place) and return it."""
    graph = model.graph
    p = plan(model, composite, output, explain_logits)
    if p.unsupported:
        nodes = [dict(name=a.node.name, op_type=a.node.op_type, domain=a.node.domain,
                      opset=model.opset_imports.get(a.node.domain or "", "?"), reason=a.reason) for a in p.unsupported]
        raise UnsupportedError(nodes, "Map them to a supported rule in a composite file (e.g. rule = \"pass\" for an "
                                      "element-wise op), or add a handler in onnx_lrp/ops.")
    values = {v.name: v for v in graph.inputs}
    for node in graph:
        for o in node.outputs:
            values[o.name] = o
    missing = [n for n in relevance_at if n not in values]
    if missing:
        raise InputError(f"no tensor named {', '.join(missing)} in the model; `onnx-lrp inspect` lists the tensors")
    watch = {id(values[n]): n for n in relevance_at}
    nonneg = _nonneg_analysis(graph)
    dtype = p.explained.dtype if p.explained.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE) else ir.DataType.FLOAT
    em = Emitter(graph, model.opset_imports.get("", 17), dtype=dtype)
    forward_nodes = list(graph)
    r0, target_used = _start_relevance(em, graph, p.explained)
    rel: dict[int, list[Rel]] = {id(p.explained): [Rel(r0)]}
    summed: dict[int, Rel] = {}
    as_r: dict[int, ir.Value] = {}
    zero_where_zero: dict[int, bool] = {id(p.explained): False}  # relevance known to vanish where the value does
    by_node = {id(a.node): a for a in p.assignments}

    def total_rel(v: ir.Value, scope_name: str) -> Rel | None:
        """The relevance of v summed over its consumers: in gradient form when every part is, relative to one
        tensor; else as relevance (gradient-form parts converted, one multiply per reference tensor)."""
        parts = rel.get(id(v))
        if not parts:
            return None
        if id(v) not in summed:
            by_ref: dict[int, list[Rel]] = {}
            for part in parts:
                by_ref.setdefault(id(part.ref) if part.ref is not None else 0, []).append(part)
            with em.scope(scope_name):
                if len(by_ref) == 1 and 0 not in by_ref:
                    summed[id(v)] = Rel(em.sum([q.value for q in parts], tag="g_out"), parts[0].ref)
                else:
                    terms = []
                    for key, group in by_ref.items():
                        g = em.sum([q.value for q in group], tag="g_out" if key else "r_parts")
                        terms.append(Rel(g, group[0].ref).as_relevance(em, tag="r_part"))
                    summed[id(v)] = Rel(em.sum(terms, tag="r_out"))
        return summed[id(v)]

    def total(v: ir.Value, scope_name: str) -> ir.Value | None:
        r = total_rel(v, scope_name)
        if r is None:
            return None
        if id(v) not in as_r:
            with em.scope(scope_name):
                as_r[id(v)] = r.as_relevance(em, tag="r_out")
        return as_r[id(v)]

    for node in reversed(forward_nodes):
        a = by_node[id(node)]
        if not a.on_path:
            continue
        grad = a.kind == "bias" or gradient_form(a.op, a.rule)
        r_outs = [(total_rel if grad else total)(o, node.name) for o in node.outputs]
        if all(r is None for r in r_outs):
            continue
        if a.kind == "held":
            continue
        if a.kind == "bias":  # the Add folded into the preceding layer: relevance passes to the layer's output
            src = next(v for v in node.inputs if carries(v))
            rel.setdefault(id(src), []).append(r_outs[0])
            zero_where_zero[id(src)] = False
            continue
        xs = a.op.relevance_values(node)
        z = node.outputs[0]
        if isinstance(a.op, LinearOp) and "lrp_bias_add" in node.meta:
            z = node.meta["lrp_bias_add"].outputs[0]
        layer = Layer(node, a.op, xs, z, [nonneg.get(id(x), False) for x in xs])
        if not isinstance(a.op, ShapeOp) and r_outs[0] is None:
            continue
        layer.relu_out = _relu_after(z, by_node, zero_where_zero)
        with em.scope(node.name):
            if grad:
                r_ins = apply_rule_grad(em, layer, a.rule, r_outs)
            else:
                r_ins = [None if r is None else Rel(r) for r in apply_rule(em, layer, a.rule, r_outs)]
        keeps = zero_preserving(a.op, a.rule, node)
        if keeps == "inherit":
            keeps = all(zero_where_zero.get(id(o), False) for o in node.outputs if id(o) in rel)
        for x, r in zip(xs, r_ins):
            if r is not None:
                rel.setdefault(id(x), []).append(r)
                zero_where_zero[id(x)] = zero_where_zero.get(id(x), True) and bool(keeps or r.ref is x)

    outputs = list(graph.outputs)
    for x in [v for v in graph.inputs if v.name not in (TARGET_INPUT, ONE_HOT_INPUT, POSITION_INPUT)]:
        if not carries(x):
            if x.dtype is None or not x.dtype.is_integer():
                continue
            with em.scope(f"input/{x.name}"):  # token ids: relevance at their embedding lookups, per token
                r = token_relevance(em, graph, x, lambda v: total(v, f"input/{x.name}"))
            if r is None:
                continue
            with em.scope(f"input/{x.name}"):
                r = em.op("Identity", r, tag="relevance")
            r.name = RELEVANCE_PREFIX + x.name
            r.type = ir.TensorType(em.dtype)
            r.shape = x.shape
            outputs.append(r)
            continue
        r = total(x, f"input/{x.name}")
        with em.scope(f"input/{x.name}"):
            r = em.op("Identity", r if r is not None else em.zeros_like(x), tag="relevance")
        _name_output(r, RELEVANCE_PREFIX + x.name, x)
        outputs.append(r)
    for vid, name in watch.items():
        v = values[name]
        r = total(v, f"at/{name}")
        with em.scope(f"at/{name}"):
            r = em.op("Identity", r if r is not None else em.zeros_like(v), tag="relevance")
        _name_output(r, RELEVANCE_PREFIX + name, v)
        outputs.append(r)
    outputs.append(target_used)
    graph.outputs.clear()
    graph.outputs.extend(outputs)
    return model


def _relu_after(z: ir.Value, by_node: dict, zero_where_zero: dict) -> ir.Value | None:
    """The output of a Relu that is z's only consumer, given Pass, when its relevance vanishes where it is zero:
    then stab(z) may be read as relu(z) + eps (exact: where z <= 0 the relevance is zero anyway)."""
    uses = list(z.uses())
    if len(uses) != 1 or z.is_graph_output():
        return None
    relu = uses[0].node
    a = by_node.get(id(relu))
    if not _is_rectifier(relu) or a is None or not isinstance(a.rule, Pass):
        return None
    out = relu.outputs[0]
    if not zero_where_zero.get(id(out), False):
        return None
    return out if relu.op_type == "Relu" else z  # a Clip(0, max): the caller takes relu(z) itself


def _is_rectifier(node: ir.Node) -> bool:
    """Relu, or Clip with min exactly 0 (ReLU6): zero exactly where its input is <= 0."""
    if node.op_type == "Relu":
        return True
    if node.op_type != "Clip" or len(node.inputs) < 2 or node.inputs[1] is None:
        return False
    lo = node.inputs[1].const_value
    return lo is not None and float(lo.numpy()) == 0.0


def _name_output(r: ir.Value, name: str, like: ir.Value) -> None:
    r.name = name
    r.type = ir.TensorType(like.dtype)
    r.shape = like.shape


def describe(p: Plan) -> list[dict]:
    """One row per node for ``onnx-lrp inspect``."""
    rows = []
    for a in p.assignments:
        role = "activation" if any(carries(o) for o in a.node.outputs) else "parameter"
        rows.append(dict(name=a.node.name, op_type=a.node.op_type, kind=a.kind, role=role,
                         rule=(a.rule.name if a.rule is not None else "-"), supported=a.supported,
                         on_path=a.on_path, first_linear=a.first_linear, reason=a.reason))
    return rows


__all__ = ["rewrite", "plan", "describe", "Plan", "TARGET_INPUT", "ONE_HOT_INPUT", "TARGET_OUTPUT",
           "RELEVANCE_PREFIX", "ActivationOp"]
