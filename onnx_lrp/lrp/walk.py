"""The walk that emits the relevance: one rule step per node on the path in reverse topological order, relevance
summed over each value's consumers (in gradient form where every part is), then the relevance outputs."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core import meta
from ..core.emitter import Emitter
from ..core.errors import InputError, LrpError, UnsupportedError, internal_error
from ..core.graph import carries, const, is_param, static_dims
from ..core.interface import ONE_HOT_INPUT, POSITION_INPUT, RELEVANCE_PREFIX, TARGET_INPUT, Step
from .engine import Layer, Rel
from .weight_bases import all_chunks
from .ledger import NO_LEDGER, Ledger
from .ops import REGISTRY
from .ops.transformer import token_relevance
from .plan import Assignment, Plan, no_path
from .target import start_relevance
from .vocabulary import INHERIT, Category, Kind


def _nonneg_analysis(graph: ir.Graph) -> dict[int, bool]:
    known: dict[int, bool] = {}

    def nonneg(v):
        if v is None:
            return True
        if is_param(v):
            arr = const(v)
            return arr.dtype.kind in "biu" or all_chunks(arr, lambda a: np.all(a >= 0))
        return known.get(id(v), False)

    for node in graph:
        op = REGISTRY.get(node.op_type)
        flag = op is not None and op.nonneg_output(node, [nonneg(v) for v in node.inputs])
        for o in node.outputs:
            known[id(o)] = bool(flag)
    return known


class Walk:
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
        r0, self.target_used, self.explained_value = start_relevance(em, graph, p.explained)
        self.steps: list = trace if trace is not None else []
        self.steps.append(Step("start", "-", "start", (r0.name,)))
        self.rel: dict[int, list[Rel]] = {id(p.explained): [Rel(r0)]}
        self.summed: dict[int, Rel] = {}
        self.as_r: dict[int, ir.Value] = {}
        # relevance known to vanish where the value does
        self.zero_where_zero: dict[int, bool] = {id(p.explained): False}
        self.by_node = {id(a.node): a for a in p.assignments}
        self.book = Ledger(em, ledger) if ledger is not None else NO_LEDGER
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
        """The rule of one node: the relevance of its outputs, summed, to its relevance inputs; the ledger books what
        enters and leaves (``NO_LEDGER``: nothing)."""
        grad = a.kind == Kind.BIAS or (a.op is not None and a.rule.gradient_form(a.op))
        # a linear rule's own step takes its relevance as it comes (``linear_rule``: in gradient form relative to z
        # it saves passes; else it multiplies it out once); the ledger books relevance as tensors
        takes_rel = self._takes_rel(a) and not self.book.active
        r_outs = [(self.total_rel if grad or takes_rel else self.total)(o, node.name) for o in node.outputs]
        if all(r is None for r in r_outs):
            return
        self.book.enter(node, a, r_outs)
        if a.kind == Kind.HELD:  # inside a recognised pattern: the relevance stays there
            r_ins = []
        elif a.kind == Kind.BIAS:
            r_ins = self._pass_through(node, r_outs[0])
        else:
            r_ins = self._rule_step(node, a, r_outs, grad)
        self.book.leave(node, r_ins)

    def _pass_through(self, node: ir.Node, r_out) -> list:
        """The Add folded into the preceding layer: its relevance passes to the layer's output as it is."""
        src = next(v for v in node.inputs if carries(v))
        self.rel.setdefault(id(src), []).append(r_out)
        self.zero_where_zero[id(src)] = False
        return [r_out]

    def _rule_step(self, node: ir.Node, a: Assignment, r_outs: list, grad: bool) -> list:
        """The rule's step (in gradient form when ``grad``): the relevance of the node's relevance inputs, given to
        them; none when the rule reads only the first output's relevance and none arrived there."""
        if not (a.op.category is Category.MOVE or a.op.multi_output) and r_outs[0] is None:
            return []
        layer = self._layer(node, a, grad)
        with self.em.scope(node.name):
            if grad:
                r_ins = a.rule.propagate_grad(self.em, layer, r_outs)
            else:
                r_ins = [None if r is None else r if isinstance(r, Rel) else Rel(r)
                         for r in a.rule.propagate(self.em, layer, r_outs)]
        self.steps.append(Step(node.name, node.op_type, a.rule.name if a.rule is not None else "-",
                               tuple(v.name for r in r_ins if r is not None for v in (r.value, r.ref)
                                     if v is not None and v.name.startswith("lrp/"))))
        self._give(node, a, layer.xs, r_ins)
        return r_ins

    def _layer(self, node: ir.Node, a: Assignment, grad: bool) -> Layer:
        """The node as its rule sees it: its relevance inputs, its output after a folded bias Add, and what the walk
        knows of the relevance around it."""
        xs = a.op.relevance_values(node)
        z = node.outputs[0]
        if a.op.category is Category.LINEAR and meta.BIAS_ADD.has(node):
            z = meta.BIAS_ADD.get(node).outputs[0]
        layer = Layer(node, a.op, xs, z, [self.nonneg.get(id(x), False) for x in xs])
        layer.relu_out = _relu_after(z, self.by_node, self.zero_where_zero)
        layer.zero_at_zero = self.zero_where_zero.get(id(z), False)
        if not grad and a.op.category is Category.LINEAR:
            layer.grad_out = frozenset(i for i, x in enumerate(xs) if self._gives_rel(x))
        elif grad and a.op.category is Category.ACTIVATION:
            layer.keep_ref = self._converted_below(node.inputs[0])
        return layer

    def _give(self, node: ir.Node, a: Assignment, xs: list, r_ins: list) -> None:
        """Each input's part of the relevance, and whether its relevance is known to vanish where it does."""
        rel, zero_where_zero = self.rel, self.zero_where_zero
        keeps = a.rule.zero_preserving(a.op, node)
        if keeps is INHERIT:
            keeps = all(zero_where_zero.get(id(o), False) for o in node.outputs if id(o) in rel)
        for x, r in zip(xs, r_ins):
            if r is not None:
                rel.setdefault(id(x), []).append(r)
                zero_where_zero[id(x)] = zero_where_zero.get(id(x), True) and bool(keeps or r.ref is x)

    @staticmethod
    def _takes_rel(a: Assignment) -> bool:
        """A linear rule on a linear op with one output, not in gradient form: ``linear_rule`` reads ``Rel``."""
        return a.kind != Kind.BIAS and a.op is not None and a.op.category is Category.LINEAR and \
            not a.op.multi_output and a.rule is not None and a.rule.linear and not a.rule.gradient_form(a.op) and \
            len(a.node.outputs) == 1

    def _gives_rel(self, x: ir.Value) -> bool:
        """Whether a linear step may give input x's relevance in gradient form, x J^T s: x feeds several layers
        (``_fork``), or x is the output of a linear layer whose own step takes it so (``_takes_rel``)."""
        if self._fork(x):
            return True
        node = x.producer()
        a = self.by_node.get(id(node)) if node is not None else None
        return a is not None and a.on_path and not self.book.active and self._takes_rel(a) and \
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
            if a.kind == Kind.BIAS:
                v = next(i for i in node.inputs if carries(i))
                continue
            if a.op.category is Category.ACTIVATION and a.rule is not None and a.rule.passes_through and \
                    len(node.outputs) == 1 and \
                    node.inputs and static_dims(node.inputs[0]) == static_dims(node.outputs[0]):
                v = node.inputs[0]
                continue
            return a.kind != Kind.HELD and a.rule is not None and not a.rule.gradient_form(a.op)
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
            raise UnsupportedError([], no_path(self.plan, self.forward_nodes))
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
        return [self.target_used, self.explained_value] + self.book.finish()


def _relu_after(z: ir.Value, by_node: dict, zero_where_zero: dict) -> ir.Value | None:
    """The output of a Relu that is z's only consumer, given Pass, when its relevance vanishes where it is zero:
    then stab(z) may be read as relu(z) + eps (exact: where z <= 0 the relevance is zero anyway)."""
    uses = list(z.uses())
    if len(uses) != 1 or z.is_graph_output():
        return None
    relu = uses[0].node
    a = by_node.get(id(relu))
    rectifier = REGISTRY.get(relu.op_type)
    if rectifier is None or not rectifier.zero_below_zero(relu) or a is None or a.rule is None or \
            not a.rule.passes_through:
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


__all__ = ["Walk"]
