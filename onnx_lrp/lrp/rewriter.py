"""The rewriter: one reverse topological walk that appends relevance propagation to the forward graph.

The result is ONE model: its outputs are the original outputs, then ``lrp/relevance/<input>`` for every float
graph input (and for the tensors asked for with ``relevance_at``), then ``lrp/target_used`` (the explained index
per batch item, into the output flattened per item) and ``lrp/explained_value`` (the explained tensor at the target:
the logit, also for a softmax output). Inputs steer it (required: initializer defaults would make onnxruntime warn on
every load): ``lrp/target`` (int64 [batch]; -1 = arg-max), ``lrp/one_hot`` (bool scalar; true: start from 1 at the
target, false: from the target's output value) and, for sequence outputs (N, T, C...), ``lrp/position`` (int64
[batch]; the index along T, negative counts from the end; -1 is the last position, as for a causal LM): then
``lrp/target`` is a class at that position.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from ..core import meta
from ..core.emitter import Emitter
from ..core.errors import InputError, LrpError, UnsupportedError, internal_error
from ..core.graph import captured_values, carries, is_param, static_dims
from ..core.interface import (
    ONE_HOT_INPUT,
    POSITION_INPUT,
    RELEVANCE_PREFIX,
    TARGET_INPUT,
    TARGET_OUTPUT,
    VALUE_OUTPUT,
    Step,
)
from ..rules.base import Rule
from ..rules.composite import Composite, NodeInfo
from ..rules.elementwise import Pass
from ..rules.linear import LinearRule, ZBox
from . import patterns
from .composite_check import check_composite
from .engine import Layer, Rel, all_chunks
from .ledger import Ledger
from .ops import REGISTRY, ActivationOp
from .ops.transformer import token_relevance


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


def _leading(v: ir.Value):
    """The leading dimension: an int, a symbol's name, or None (unknown)."""
    if v.shape is None or len(v.shape) == 0:
        return None
    d = v.shape[0]
    return d if isinstance(d, int) else getattr(d, "value", None)


def whole_output(graph: ir.Graph, y: ir.Value) -> bool:
    """Whether the explained tensor ``y`` is explained as ONE item because its leading axis is provably not the
    inputs' batch axis: ``y`` has rank < 2, or a static leading size that differs from the static leading size of
    every float input (a Concat, Gather or Expand along axis 0, ReduceMax over all axes, a Flatten at axis 0). Its rows
    are then not batch items: the whole tensor is one item (one target) and every input gets the relevance of that
    one explanation. Unknown or symbolic leading sizes count as the batch."""
    if y.shape is None:
        return False
    if len(y.shape) < 2:
        return True
    lead = _leading(y)
    if not isinstance(lead, int):
        return False
    ins = [v for v in graph.inputs if carries(v)] or [v for v in graph.inputs if v.shape is not None and len(v.shape)]
    leads = [_leading(x) for x in ins if x.shape is not None and len(x.shape)]
    return bool(leads) and all(isinstance(d, int) for d in leads) and lead not in leads


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
        # relay: DequantizeLinear -> its QuantizeLinear's input; captured: what a Loop/Scan/If body reads by name
        for v in list(n.inputs) + _relay_sources(n) + captured_values(n):
            if v is not None and v.producer() is not None and carries(v):
                stack.append(v.producer())
    return seen


def _relay_sources(node: ir.Node) -> list:
    op = REGISTRY.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    return op.relay_sources(node) if op is not None else []


def plan(model: ir.Model, composite: Composite, output: str | None = None, explain_logits: bool = True) -> Plan:
    """Assign an op handler and a rule to every node; nothing is emitted."""
    graph = model.graph
    check_composite(composite, graph)
    patterns.annotate(graph)
    y, out = explained_value(graph, output, explain_logits)
    on_path = _ancestors(y)
    result = Plan(explained=y, output=out)
    # linear layers reached from an input without crossing another linear layer are "first"; not through values
    # computed from the input's shape only (a zero initial state built from the batch size does not make the
    # recurrent map that reads it a first layer); int8 values of a QuantizeLinear -> DequantizeLinear pair do pass
    reached = {id(v) for v in graph.inputs}
    node = None
    try:
        for node in graph:
            dispatcher = REGISTRY.get(node.op_type) if node.domain in ("", "ai.onnx") else None
            op = dispatcher.resolve(node) if dispatcher is not None else None
            kind = op.kind if op is not None else "unknown"
            feeds = any(id(v) in reached for v in node.inputs if v is not None)
            first = feeds and kind in ("convolution", "dense")
            if feeds and not first and kind != "recurrent":  # a recurrent layer is linear in its input too
                reached.update(id(o) for o in node.outputs if not meta.SHAPE_ONLY.get(o, False))
            a = Assignment(node, op, None, kind, True, on_path=id(node) in on_path, first_linear=first)
            if meta.ABSORBED_BY.has(node):
                a.kind, a.rule, a.reason = "bias", Pass(), "bias folded into " + meta.ABSORBED_BY.get(node).name
            elif meta.INSIDE.has(node):  # inside a recognised pattern (held scale, GELU/SiLU chain): no relevance
                a.kind, a.rule, a.reason = "held", Pass(), "inside a recognised " + meta.INSIDE.get(node)
            elif dispatcher is None and node.op_type in _CONTROL_FLOW and node.domain in ("", "ai.onnx"):
                a.supported, a.reason = False, meta.CONTROL_FLOW_REASON.get(node, _CONTROL_FLOW[node.op_type])
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
                        misfit = rule.fits(op)
                        if misfit:
                            a.supported, a.reason = False, misfit
                        elif op.category in ("linear", "activation") and any(carries(o) for o in node.outputs) \
                                and not op.relevance_values(node):
                            a.supported, a.reason = False, ("no float activation among its inputs (parameters or "
                                                            "integer tensors only): relevance cannot pass it")
            result.assignments.append(a)
    except LrpError:
        raise
    except Exception as exc:  # a bug (or a malformed node a check did not foresee): named by node
        raise internal_error(node, exc) from exc
    # float inputs only: relevance reaches an input iff a node on the path reads it (token inputs reach through
    # their embedding lookups, found by the rewrite itself, which refuses then)
    tokens = any(v.dtype is not None and v.dtype.is_integer() for v in graph.inputs)
    if not tokens and not any(a.on_path and any(v is not None and v.is_graph_input() and carries(v)
                                                for v in a.node.inputs) for a in result.assignments):
        result.no_path = _no_path(graph, result, list(graph))
    return result


def unsupported_hint(graph: ir.Graph, p: Plan, composite: Composite) -> str:
    """What to do about unsupported nodes, by why they are unsupported: the transformer composite when the graph has
    softmax attention."""
    full = "`onnx-lrp inspect MODEL` lists every node"
    bad = p.unsupported
    if bad and all(a.reason.startswith("malformed") for a in bad):
        return ("The model is malformed there (the ONNX checker lets it pass, onnxruntime would not run it): "
                f"re-export it; {full}.")
    softmax = any(a.on_path and a.node.op_type in _SOFTMAX for a in p.assignments)
    bilinear = any(a.on_path and a.kind == "bilinear" for a in p.assignments)
    if (softmax or bilinear) and composite.name not in ("attnlrp", "cp-lrp"):
        what = "softmax attention" if softmax else "products of two activations"
        return (f"The graph has {what}: explain it with --composite attnlrp (or cp-lrp), whose rules cover them; "
                f"{full}.")
    if bad and all(a.reason.startswith("control flow:") for a in bad):
        return f"{full}."  # the reason says what to do
    if bad and all(a.op is None and a.kind == "unknown" for a in bad):
        return f"{full}; add a handler in onnx_lrp/ops (a composite can map only ops that have one)."
    return (f"{full}; give them a rule in a composite file (rule = \"pass\" only for element-wise ops that keep "
            "their input's relevance) or add a handler in onnx_lrp/ops.")


def check_bounds(p: Plan, composite: Composite) -> None:
    """ZBox needs the input's range (no silent default) and bounds that broadcast against one item of its input."""
    for a in p.assignments:
        if not (a.on_path and a.supported and isinstance(a.rule, ZBox)):
            continue
        if a.rule.low is None or a.rule.high is None:
            raise InputError(f"composite {composite.name!r} applies zbox to node {a.node.name} ({a.node.op_type}) but "
                             "has no input bounds: give both the lowest and highest input value (Python: "
                             "Explainer(..., low=0.0, high=1.0); command line: --low/--high, or --mean/--std for "
                             "images; composite file: low = ..., high = ...)")
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


def _nonneg_analysis(graph: ir.Graph) -> dict[int, bool]:
    known: dict[int, bool] = {}

    def nonneg(v):
        if v is None:
            return True
        if is_param(v):
            arr = v.const_value.numpy()
            return arr.dtype.kind in "biu" or all_chunks(arr, lambda a: np.all(a >= 0))
        return known.get(id(v), False)

    for node in graph:
        op = REGISTRY.get(node.op_type)
        flag = op is not None and op.nonneg_output(node, [nonneg(v) for v in node.inputs])
        for o in node.outputs:
            known[id(o)] = bool(flag)
    return known


def _start_relevance(em: Emitter, graph: ir.Graph, y: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(r0, target, y at the target): r0 = onehot(target) * y (or onehot alone), target = argmax where
    lrp/target < 0."""
    # plain graph inputs, no initializer defaults: onnxruntime warns about every initializer that is also an input
    # ("Initializer lrp/target appears in graph inputs"); the Explainer always feeds them
    target = ir.Value(name=TARGET_INPUT, shape=ir.Shape(["lrp_batch"]), type=ir.TensorType(ir.DataType.INT64))
    one_hot = ir.Value(name=ONE_HOT_INPUT, shape=ir.Shape([]), type=ir.TensorType(ir.DataType.BOOL))
    graph.inputs.extend([target, one_hot])
    whole = whole_output(graph, y)
    with em.scope("start"):
        dims = static_dims(y)
        if dims is not None and 0 in dims:
            raise InputError(f"explained tensor {y.name!r} has no elements (shape {dims}); nothing to explain")
        if whole:  # one item: the whole tensor as [1, size] (size read at run time where dimensions are dynamic)
            if dims is None:
                raise InputError(f"explained tensor {y.name!r} has no batch axis (its leading axis is not the "
                                 "inputs' batch axis) and is explained as one item, which needs a known rank; "
                                 "run shape inference or explain an output with a batch axis")
            dims = [1, int(np.prod(dims)) if all(d is not None for d in dims) else None]
            flat = em.op("Reshape", y, em.ints([1, -1]), tag="y_flat")
        else:
            flat = em.op("Flatten", y, axis=1, tag="y_flat")
        if dims is None or len(dims) < 2:
            raise InputError(f"explained tensor {y.name!r} needs a known rank of at least 2 (the batch, then the "
                             "classes or the sequence positions); run shape inference")
        # entries per position (axis 1) of a sequence output; read from y's shape where the trailing axes are dynamic
        static_chunk = all(d is not None for d in dims[2:])
        chunk = int(np.prod(dims[2:])) if static_chunk else None
        # a dynamic sequence length or trailing axes: the one-hot's width (and each entry's position) come from y
        width_v = em.ints([dims[1] * chunk]) if dims[1] is not None and static_chunk else em.op(
            "Shape", flat, start=1, end=2, tag="width")
        use_argmax = em.op("Less", target, em.scalar(0, np.int64), tag="use_argmax")
        if len(dims) < 3:
            argmax = em.op("ArgMax", flat, axis=1, keepdims=0, tag="argmax")
            chosen = em.op("Where", use_argmax, argmax, target, tag="target")
        else:  # sequence outputs (N, T, C...): the target is a class at lrp/position (< 0: from the end)
            position = ir.Value(name=POSITION_INPUT, shape=ir.Shape(["lrp_batch"]),
                                type=ir.TensorType(ir.DataType.INT64))
            graph.inputs.append(position)
            chunk_v = em.scalar(chunk, np.int64) if static_chunk else em.op(
                "ReduceProd", em.op("Shape", y, start=2, tag="trailing"), keepdims=0, tag="chunk")
            if dims[1] is not None and static_chunk:
                rows = em.scalar(dims[1], np.int64)
                row_of = em.const(np.arange(dims[1] * chunk, dtype=np.int64)[None] // chunk, tag="row_of",
                                  dtype=np.int64)
            else:
                width_n = em.op("Squeeze", width_v, tag="width_n")
                rows = em.scalar(dims[1], np.int64) if dims[1] is not None else em.op("Div", width_n, chunk_v,
                                                                                       tag="rows")
                index = em.op("Range", em.scalar(0, np.int64), width_n, em.scalar(1, np.int64), tag="flat_index")
                row_of = em.op("Unsqueeze", em.op("Div", index, chunk_v, tag="row"), em.ints([0]), tag="row_of")
            from_end = em.op("Less", position, em.scalar(0, np.int64), tag="from_end")
            row = em.op("Where", from_end, em.add(position, rows, tag="position_wrapped"), position, tag="row")
            in_row = em.op("Equal", row_of, em.op("Unsqueeze", row, em.ints([1]), tag="row_1"), tag="in_row")
            argmax = em.op("ArgMax", em.op("Where", in_row, flat, em.scalar(-np.inf), tag="y_row"), axis=1,
                           keepdims=0, tag="argmax")
            given = em.add(em.op("Mul", row, chunk_v, tag="row_start"), target, tag="given")
            chosen = em.op("Where", use_argmax, argmax, given, tag="target")
        hot = em.op("OneHot", chosen, width_v, em.const(np.array([0, 1], dtype=np.int64),
                                                                 tag="onehot_values", dtype=np.int64),
                    axis=1, tag="onehot_int")  # int64 values: onnxruntime has no double OneHot
        hot = em.op("Cast", hot, to=em.dtype.value, tag="onehot")
        scale = em.op("Where", one_hot, em.scalar(1.0), flat, tag="start_scale")
        r0 = em.mul(hot, scale, tag="r0_flat")
        picked = em.op("ReduceSum", em.mul(hot, flat, tag="y_at_target"), em.ints([1]), keepdims=0,
                       tag="explained_value")
        r0 = em.reshape_like(r0, y, tag="r0")
    batch_shape = ir.Shape([1] if whole else ["lrp_batch"])
    picked.name = VALUE_OUTPUT
    picked.type = ir.TensorType(em.dtype)
    picked.shape = batch_shape
    chosen.name = TARGET_OUTPUT
    chosen.type = ir.TensorType(ir.DataType.INT64)
    chosen.shape = batch_shape
    return r0, chosen, picked


def rewrite(model: ir.Model, composite: Composite, output: str | None = None, relevance_at=(),
            explain_logits: bool = True, ledger: list | None = None, trace: list | None = None) -> ir.Model:
    """Append the relevance graph to ``model`` (in place) and return it.

    ``ledger``: a list to receive one :class:`onnx_lrp.lrp.ledger.LedgerRow` per node; the model then also outputs the
    relevance sums entering and leaving each node (``lrp/ledger/entering``, ``lrp/ledger/leaving``).
    ``trace`` (a list) receives one ``Step`` per node of the walk (the start relevance first): the tensors the
    numeric-honesty diagnosis reads.
    """
    p = plan(model, composite, output, explain_logits)
    if p.unsupported:
        nodes = [dict(name=a.node.name, op_type=a.node.op_type, domain=a.node.domain,
                      opset=model.opset_imports.get(a.node.domain or "", "?"), reason=a.reason) for a in p.unsupported]
        raise UnsupportedError(nodes, unsupported_hint(model.graph, p, composite))
    check_bounds(p, composite)
    walk = _Walk(model, p, relevance_at, ledger, trace)
    walk.backward()
    outputs = list(model.graph.outputs) + walk.input_relevance() + walk.watched_relevance() + walk.extra_outputs()
    model.graph.outputs.clear()
    model.graph.outputs.extend(outputs)
    return model


class _Walk:
    """The reverse topological walk that emits the relevance: ``backward`` (one rule step per node on the path,
    relevance summed over each value's consumers), then the relevance outputs (``input_relevance`` for the graph
    inputs, ``watched_relevance`` for ``relevance_at``, ``extra_outputs``: target, explained value, ledger)."""

    def __init__(self, model: ir.Model, p: Plan, relevance_at, ledger: list | None, trace: list | None):
        graph = self.graph = model.graph
        self.plan = p
        values = {v.name: v for v in graph.inputs}
        for node in graph:
            for o in node.outputs:
                values[o.name] = o
        missing = [n for n in relevance_at if n not in values]
        if missing:
            raise InputError(f"no tensor named {', '.join(missing)} in the model; `onnx-lrp inspect` lists the "
                             "tensors")
        self.values = values
        self.watch = {id(values[n]): n for n in relevance_at}
        self.nonneg = _nonneg_analysis(graph)
        dtype = p.explained.dtype if p.explained.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE) else \
            ir.DataType.FLOAT
        em = self.em = Emitter(graph, model.opset_imports.get("", 17), dtype=dtype)
        self.forward_nodes = list(graph)
        r0, self.target_used, self.explained_value = _start_relevance(em, graph, p.explained)
        self.steps: list = trace if trace is not None else []
        self.steps.append(Step("start", "-", "start", (r0.name,)))
        self.rel: dict[int, list[Rel]] = {id(p.explained): [Rel(r0)]}
        self.summed: dict[int, Rel] = {}
        self.as_r: dict[int, ir.Value] = {}
        # relevance known to vanish where the value does
        self.zero_where_zero: dict[int, bool] = {id(p.explained): False}
        self.by_node = {id(a.node): a for a in p.assignments}
        self.book = Ledger(em, ledger) if ledger is not None else None
        self.reached = 0

    # ---------------------------------------------------------------------------------------------- sums
    def total_rel(self, v: ir.Value, scope_name: str) -> Rel | None:
        """The relevance of v summed over its consumers: in gradient form when every part is, relative to one
        tensor; else as relevance (gradient-form parts converted, one multiply per reference tensor)."""
        em = self.em
        parts = self.rel.get(id(v))
        if not parts:
            return None
        if id(v) not in self.summed:
            by_ref: dict[int, list[Rel]] = {}
            for part in parts:
                by_ref.setdefault(id(part.ref) if part.ref is not None else 0, []).append(part)
            with em.scope(scope_name):
                if len(by_ref) == 1 and 0 not in by_ref:
                    self.summed[id(v)] = Rel(em.sum([q.value for q in parts], tag="g_out"), parts[0].ref)
                else:
                    terms = []
                    for key, group in by_ref.items():
                        g = em.sum([q.value for q in group], tag="g_out" if key else "r_parts")
                        terms.append(Rel(g, group[0].ref).as_relevance(em, tag="r_part"))
                    self.summed[id(v)] = Rel(em.sum(terms, tag="r_out"))
        return self.summed[id(v)]

    def total(self, v: ir.Value, scope_name: str) -> ir.Value | None:
        r = self.total_rel(v, scope_name)
        if r is None:
            return None
        if id(v) not in self.as_r:
            with self.em.scope(scope_name):
                self.as_r[id(v)] = r.as_relevance(self.em, tag="r_out")
        return self.as_r[id(v)]

    # ---------------------------------------------------------------------------------------------- the walk
    def backward(self) -> None:
        current = None
        try:
            for node in reversed(self.forward_nodes):
                current = node
                a = self.by_node[id(node)]
                if a.on_path:
                    self.step(node, a)
        except LrpError:
            raise
        except MemoryError:
            raise InputError(f"out of memory while building the relevance of node {current.name} "
                             f"({current.op_type}); the model (or a dimension of it) is too large for this "
                             "machine") from None
        except Exception as exc:  # a bug: named by node, never a bare traceback
            raise internal_error(current, exc) from exc

    def step(self, node: ir.Node, a: Assignment) -> None:
        """The rule of one node: the relevance of its outputs, summed, to its relevance inputs."""
        em, book, rel, zero_where_zero = self.em, self.book, self.rel, self.zero_where_zero
        grad = a.kind == "bias" or (a.op is not None and a.rule.gradient_form(a.op))
        # a linear rule's own step takes its relevance as it comes (``linear_rule``: in gradient form relative to z
        # it saves passes; else it multiplies it out once); the ledger books relevance as tensors
        takes_rel = self._takes_rel(a) and book is None
        r_outs = [(self.total_rel if grad or takes_rel else self.total)(o, node.name) for o in node.outputs]
        if all(r is None for r in r_outs):
            return
        if book is not None:
            book.enter(node, a, r_outs, a.op.category == "linear" and (
                meta.BIAS.has(node) or meta.BIAS_ADD.has(node) or len(node.inputs) > 2))
        if a.kind == "held":
            return
        if a.kind == "bias":  # the Add folded into the preceding layer: relevance passes to the layer's output
            src = next(v for v in node.inputs if carries(v))
            rel.setdefault(id(src), []).append(r_outs[0])
            if book is not None:
                book.leave(node, r_outs[:1])
            zero_where_zero[id(src)] = False
            return
        xs = a.op.relevance_values(node)
        z = node.outputs[0]
        if a.op.category == "linear" and meta.BIAS_ADD.has(node):
            z = meta.BIAS_ADD.get(node).outputs[0]
        layer = Layer(node, a.op, xs, z, [self.nonneg.get(id(x), False) for x in xs])
        if not (a.op.category == "move" or a.op.multi_output) and r_outs[0] is None:
            return
        layer.relu_out = _relu_after(z, self.by_node, zero_where_zero)
        layer.zero_at_zero = zero_where_zero.get(id(z), False)
        if not grad and a.op.category == "linear":
            layer.grad_out = frozenset(i for i, x in enumerate(xs) if self._gives_rel(x))
        elif grad and a.op.category == "activation":
            layer.keep_ref = self._converted_below(node.inputs[0])
        with em.scope(node.name):
            if grad:
                r_ins = a.rule.propagate_grad(em, layer, r_outs)
            else:
                r_ins = [None if r is None else r if isinstance(r, Rel) else Rel(r)
                         for r in a.rule.propagate(em, layer, r_outs)]
        if book is not None:
            book.leave(node, r_ins)
        self.steps.append(Step(node.name, node.op_type, a.rule.name if a.rule is not None else "-",
                               tuple(v.name for r in r_ins if r is not None for v in (r.value, r.ref)
                                     if v is not None and v.name.startswith("lrp/"))))
        keeps = a.rule.zero_preserving(a.op, node)
        if keeps == "inherit":
            keeps = all(zero_where_zero.get(id(o), False) for o in node.outputs if id(o) in rel)
        for x, r in zip(xs, r_ins):
            if r is not None:
                rel.setdefault(id(x), []).append(r)
                zero_where_zero[id(x)] = zero_where_zero.get(id(x), True) and bool(keeps or r.ref is x)

    @staticmethod
    def _takes_rel(a: Assignment) -> bool:
        """A linear rule on a linear op with one output, not in gradient form: ``linear_rule`` reads ``Rel``."""
        return a.kind != "bias" and a.op is not None and a.op.category == "linear" and not a.op.multi_output and \
            isinstance(a.rule, LinearRule) and not a.rule.gradient_form(a.op) and len(a.node.outputs) == 1

    def _gives_rel(self, x: ir.Value) -> bool:
        """Whether a linear step may give input x's relevance in gradient form, x J^T s: x feeds several layers
        (``_fork``), or x is the output of a linear layer whose own step takes it so (``_takes_rel``)."""
        if self._fork(x):
            return True
        node = x.producer()
        a = self.by_node.get(id(node)) if node is not None else None
        return a is not None and a.on_path and self.book is None and self._takes_rel(a) and \
            len({id(u.node) for u in x.uses()}) == 1

    def _fork(self, x: ir.Value) -> bool:
        """Whether x feeds several nodes on the relevance path and its summed relevance is multiplied out by a step
        that reads relevance (``_converted_below``): then each linear consumer gives x J^T s in gradient form and
        the sum takes one multiply by x instead of one per consumer (a residual block's input: 2 -> 1)."""
        users = {id(u.node) for u in x.uses() if id(u.node) in self.by_node and self.by_node[id(u.node)].on_path}
        return len(users) > 1 and self._converted_below(x)

    def _converted_below(self, v: ir.Value) -> bool:
        """Whether relevance in gradient form arriving at v is multiplied out at v's own size: v is a graph input, or
        made by a step that reads relevance, past folded bias Adds and element-wise activations under Pass (which
        pass it on as it is, ``Layer.keep_ref``). False where a gradient-form step (an LRP-0 linear layer, a move)
        would carry it further."""
        for _ in range(64):
            node = v.producer()
            if node is None:
                return True
            a = self.by_node.get(id(node))
            if a is None or not a.on_path or a.op is None:
                return False
            if a.kind == "bias":
                v = next(i for i in node.inputs if carries(i))
                continue
            if a.op.category == "activation" and isinstance(a.rule, Pass) and len(node.outputs) == 1 and \
                    node.inputs and static_dims(node.inputs[0]) == static_dims(node.outputs[0]):
                v = node.inputs[0]
                continue
            return a.kind != "held" and a.rule is not None and not a.rule.gradient_form(a.op)
        return False

    # ---------------------------------------------------------------------------------------------- outputs
    def input_relevance(self) -> list[ir.Value]:
        """``lrp/relevance/<input>`` for every graph input that carries relevance (token ids: per token)."""
        em, graph = self.em, self.graph
        outputs = []
        for x in [v for v in graph.inputs if v.name not in (TARGET_INPUT, ONE_HOT_INPUT, POSITION_INPUT)]:
            if not carries(x):
                if x.dtype is None or not x.dtype.is_integer():
                    continue
                with em.scope(f"input/{x.name}"):  # token ids: relevance at their embedding lookups, per token
                    r = token_relevance(em, graph, x, lambda v: self.total(v, f"input/{x.name}"))
                if r is None:
                    continue
                self.reached += 1
                with em.scope(f"input/{x.name}"):
                    r = em.op("Identity", r, tag="relevance")
                r.name = RELEVANCE_PREFIX + x.name
                r.type = ir.TensorType(em.dtype)
                r.shape = x.shape
                outputs.append(r)
                continue
            r = self.total(x, f"input/{x.name}")
            self.reached += r is not None
            with em.scope(f"input/{x.name}"):
                r = r if r is not None else em.zeros_like(x)
                if x.shape is not None and len(x.shape) == 0:  # a scalar input: its one relevance as a scalar too
                    r = em.op("Reshape", r, em.ints([]), tag="r_scalar")
                if x.dtype != em.dtype:  # a float input of another precision than the relevance graph
                    r = em.op("Cast", r, to=x.dtype.value, tag="r_cast")
                r = em.op("Identity", _rank0_like(em, r, x), tag="relevance")
            _name_output(r, RELEVANCE_PREFIX + x.name, x)
            outputs.append(r)
        if not self.reached:
            raise UnsupportedError([], _no_path(graph, self.plan, self.forward_nodes))
        self.produced = {o.name for o in list(graph.outputs) + outputs}
        return outputs

    def watched_relevance(self) -> list[ir.Value]:
        """``lrp/relevance/<tensor>`` for the tensors of ``relevance_at``."""
        em, produced = self.em, self.produced
        outputs = []
        for vid, name in self.watch.items():
            v = self.values[name]
            if v.is_graph_input():  # the input's own relevance output already is this tensor's relevance
                if RELEVANCE_PREFIX + name not in produced:
                    raise InputError(f"relevance at {name!r}: this graph input carries no relevance (not a float "
                                     "activation); name a tensor from `onnx-lrp inspect`")
                continue
            if RELEVANCE_PREFIX + name in produced:
                continue  # named twice
            produced.add(RELEVANCE_PREFIX + name)
            r = self.total(v, f"at/{name}")
            with em.scope(f"at/{name}"):
                r = em.op("Identity", _rank0_like(em, r if r is not None else em.zeros_like(v), v), tag="relevance")
            _name_output(r, RELEVANCE_PREFIX + name, v)
            outputs.append(r)
        return outputs

    def extra_outputs(self) -> list[ir.Value]:
        """The target used, the explained value and the ledger's sums."""
        outputs = [self.target_used, self.explained_value]
        if self.book is not None:
            outputs.extend(self.book.finish())
        return outputs


def _no_path(graph: ir.Graph, p: Plan, forward_nodes: list) -> str:
    """Why no relevance reaches any input: the nodes on the way to the output that cut the float path."""
    wanted: set[int] = set()
    stack = [p.explained.producer()] if p.explained.producer() is not None else []
    while stack:
        n = stack.pop()
        if id(n) in wanted:
            continue
        wanted.add(id(n))
        stack.extend(v.producer() for v in n.inputs if v is not None and v.producer() is not None)
    cuts = [n for n in forward_nodes if id(n) in wanted and not any(carries(o) for o in n.outputs)
            and any(carries(v) for v in n.inputs)]
    where = "; ".join(f"{n.name} ({n.op_type}) turns a float activation into "
                      f"{n.outputs[0].dtype.name.lower() if n.outputs[0].dtype else 'a non-float'} values"
                      for n in cuts[:3])
    return (f"no relevance path from any input to {p.explained.name!r}: it is not computed from a float input "
            f"through differentiable nodes{' (' + where + ')' if where else ''}; explain another output "
            "(--output) or an earlier tensor")


def _relu_after(z: ir.Value, by_node: dict, zero_where_zero: dict) -> ir.Value | None:
    """The output of a Relu that is z's only consumer, given Pass, when its relevance vanishes where it is zero:
    then stab(z) may be read as relu(z) + eps (exact: where z <= 0 the relevance is zero anyway)."""
    uses = list(z.uses())
    if len(uses) != 1 or z.is_graph_output():
        return None
    relu = uses[0].node
    a = by_node.get(id(relu))
    rectifier = REGISTRY.get(relu.op_type)
    if rectifier is None or not rectifier.zero_below_zero(relu) or a is None or not isinstance(a.rule, Pass):
        return None
    out = relu.outputs[0]
    if not zero_where_zero.get(id(out), False):
        return None
    return out if relu.op_type == "Relu" else z  # a Clip(0, max): the caller takes relu(z) itself


def _rank0_like(em: Emitter, r: ir.Value, like: ir.Value) -> ir.Value:
    """The relevance of a scalar (rank-0) tensor as a scalar: the emitted constants are [1]-shaped, and broadcasting
    with them makes a rank-0 relevance [1]."""
    if like.shape is None or len(like.shape) != 0:
        return r
    return em.op("Reshape", r, em.ints([], tag="scalar_shape"), tag="r_scalar")


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
