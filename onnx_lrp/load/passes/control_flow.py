"""Control flow made static (:class:`ControlFlow`, a loading pass): ``Loop`` and ``Scan`` with a trip count known at load
time are unrolled, ``If`` with a constant condition is replaced by the branch it takes.

* ``Loop``: the trip count ``M`` must be a constant (tf2onnx computes it from the sequence input's static shape;
  the loader folds that chain first). The condition must be decidable at load time: it is evaluated per iteration
  from the part of the body it depends on (the iteration number, the initial condition and loop-carried values with
  constant initial values, e.g. tf2onnx's ``time < 7`` counter); the loop runs while it is true, at most ``M``
  times. The body is inlined once per iteration under fresh names ``<loop>/<k>/<name>`` with the iteration number
  as a constant, loop-carried values threaded from one copy to the next, references to outer-scope values kept;
  scan outputs are stacked along a new axis 0 (``Unsqueeze`` + ``Concat``). The loader's constant folding then makes
  per-iteration ``Gather``/``Slice`` by the iteration number static.
* ``Scan``: the scanned axis of every scan input must be static; per iteration the slice is a ``Gather`` at a
  constant index (reversed for ``scan_input_directions`` 1), scan outputs are stacked along their output axis
  (reversed for ``scan_output_directions`` 1).
* ``If``: a constant condition (after folding; an integer input such as a sample rate can be bound to a constant,
  ``Explainer(..., constants={"sr": 16000})``, and a shape check on a dynamic dimension folds once the input's
  shape is fixed, ``Explainer(..., input_shapes={"x": (1, 512)})``) inlines the taken branch.

Unrolling is bounded (``MAX_UNROLLED`` body nodes times iterations per node). A node that stays (dynamic trip
count, data-dependent condition, too large) gets ``node.meta['lrp_control']``: the one-line reason the rewriter
refuses it with. The pass uses graph helpers only; evaluating the condition's slice is given to it (``evaluate``,
built by :mod:`onnx_lrp.load.proto.evaluate`: only the proto package may run onnx's reference evaluator).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_ir as ir
from onnx_ir import _cloner  # private: onnx_ir's node copier with a value map (body inputs ->

#   this iteration's values; allow_outer_scope_values needs onnx-ir >= 0.1.16, the floor in setup.py)
from ...core import meta
from ...core.graph import captured_values, subgraphs
from ..builder import LoadPass, Names, Report, bypass, const


MAX_UNROLLED = 20000  # body nodes x iterations written for one Loop/Scan

# evaluate(nodes, inputs, outputs) -> run(arrays for the inputs) -> the outputs' values; None when the nodes cannot
# be evaluated (an input that is neither given nor a constant)
Evaluate = Callable[[list, list, list], "Callable[[list], list[np.ndarray]] | None"]

_WHAT_TO_DO = ("export with a fixed sequence length, or the recurrent layer unrolled (Keras: unroll=True) or as an "
               "ONNX LSTM/GRU/RNN op")


def _std(node: ir.Node) -> bool:
    return node.domain in ("", "ai.onnx")


def _count_nodes(g: ir.Graph) -> int:
    return sum(1 + sum(_count_nodes(s) for s in subgraphs(n)) for n in g)


def _param(graph: ir.Graph, names: Names, base: str, arr: np.ndarray | None = None,
           tensor: ir.TensorProtocol | None = None) -> ir.Value:
    name = names(base)
    t = tensor if tensor is not None else ir.tensor(arr, name=name)
    v = ir.Value(name=name, shape=ir.Shape(list(t.shape)), type=ir.TensorType(t.dtype), const_value=t)
    graph.register_initializer(v)
    return v


def _inline(graph: ir.Graph, anchor: ir.Node, body: ir.Graph, value_map: dict, prefix: str, names: Names,
            lifted: dict, created: list) -> list[ir.Value]:
    """Insert a copy of ``body``'s nodes before ``anchor`` (body inputs read ``value_map``; the new nodes are
    appended to ``created``); return the values its outputs map to."""
    vm = dict(value_map)
    for init in body.initializers.values():  # body constants become main-graph initializers, once per body
        if id(init) not in lifted:
            lifted[id(init)] = _param(graph, names, f"{anchor.name}/{init.name}", tensor=init.const_value)
        vm[init] = lifted[id(init)]
    cloner = _cloner.Cloner(attr_map={}, value_map=vm, metadata_props={}, allow_outer_scope_values=True)
    nodes = []
    for node in body:
        new = cloner.clone_node(node)
        new.name = names(f"{prefix}/{node.name or node.op_type}")
        for o in new.outputs:
            o.name = names(f"{prefix}/{o.name}" if o.name else f"{new.name}/out")
        nodes.append(new)
    if nodes:
        graph.insert_before(anchor, nodes)
        created += nodes
    return [vm.get(v, v) for v in body.outputs]


def _stack(graph: ir.Graph, anchor: ir.Node, values: list[ir.Value], axis: int, base: str, names: Names,
           like: ir.Value, created: list) -> ir.Value:
    """Concat of the values each unsqueezed at ``axis`` (a new axis of the stacked result)."""
    axes = _param(graph, names, f"{base}/axes", np.array([axis], dtype=np.int64))
    parts = []
    for k, v in enumerate(values):
        u = ir.Value(name=names(f"{base}/{k}"), type=v.type)
        created.append(ir.node("Unsqueeze", [v, axes], outputs=[u], name=names(f"{base}/unsqueeze{k}")))
        graph.insert_before(anchor, created[-1])
        parts.append(u)
    out = ir.Value(name=names(base), type=like.type)
    created.append(ir.node("Concat", parts, {"axis": axis}, outputs=[out], name=names(f"{base}/concat")))
    graph.insert_before(anchor, created[-1])
    return out


def _replace_outputs(graph: ir.Graph, node: ir.Node, values: list[ir.Value], names: Names, created: list) -> None:
    for out, v in zip(node.outputs, values):
        if out.is_graph_output() and (v.is_graph_input() or v.is_graph_output() or v.const_value is not None):
            # a graph output that is an input or a parameter itself: computed by an Identity, keeping its name
            copy = ir.Value(name=names(f"{node.name}/out"), type=v.type, shape=v.shape)
            created.append(ir.node("Identity", [v], outputs=[copy], name=copy.name))
            graph.insert_before(node, created[-1])
            v = copy
        if list(out.uses()) or out.is_graph_output():
            bypass(out, v)


class _Keep(Exception):
    """The node stays; the message is why."""


def _sweep(graph: ir.Graph, nodes: list[ir.Node]) -> None:
    """Remove those of ``nodes`` whose outputs nobody reads (the inlined condition, unused scan slices)."""
    alive = list(nodes)
    changed = True
    while changed:
        changed = False
        for n in list(alive):
            if all(not list(o.uses()) and not o.is_graph_output() for o in n.outputs):
                graph.remove(n, safe=True)
                alive.remove(n)
                changed = True


def _cond_slice(body: ir.Graph, n_carried: int) -> tuple[list[ir.Node], list[int]] | str:
    """The body nodes the condition output depends on, through loop-carried values (their indices returned too), or
    why it depends on something not known at load time."""
    ins = {id(v): i for i, v in enumerate(body.inputs)}
    carried, seen, picked = [], set(), set()
    stack = [body.outputs[0]]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if id(v) in ins:
            i = ins[id(v)]
            if i >= 2 and i - 2 not in carried:
                carried.append(i - 2)
                stack.append(body.outputs[1 + i - 2])
            continue
        p = v.producer()
        if p is None or p.graph is not body:
            if v.const_value is None:
                return f"the value {v.name!r} of the enclosing graph"
            continue
        picked.add(id(p))
        stack.extend(i for i in p.inputs if i is not None)
        stack.extend(captured_values(p))
    return [n for n in body if id(n) in picked], sorted(carried)


def _iterations(body: ir.Graph, c_in: ir.Value, initial: list, limit: int | None, bound: int, too_long: str,
                evaluate: Evaluate) -> int:
    """How many iterations a Loop with a condition runs: its condition evaluated per iteration (with the trip count
    ``limit``, if any, and at most ``bound``; ``too_long`` is the refusal beyond), from the constant initial values
    it depends on."""
    n_carried = len(initial)
    c0 = const(c_in)
    if c0 is None:
        raise _Keep(f"control flow: the Loop's initial condition is not a constant {_why_not_constant(c_in)}")
    sl = _cond_slice(body, n_carried)
    if isinstance(sl, str):
        raise _Keep(f"control flow: the Loop's condition depends on {sl} (a data-dependent while loop); "
                    f"{_WHAT_TO_DO}")
    nodes, carried = sl
    state = {}
    for j in carried:
        v = const(initial[j])
        if v is None:
            raise _Keep(f"control flow: the Loop's condition depends on the loop-carried value "
                        f"{body.inputs[2 + j].name!r}, which is not a constant (a data-dependent while loop); "
                        f"{_WHAT_TO_DO}")
        state[j] = v
    cond, k = bool(np.ravel(c0)[0]), 0
    cap = min(limit, bound + 1) if limit is not None else bound + 1
    run = evaluate(nodes, [body.inputs[0], body.inputs[1]] + [body.inputs[2 + j] for j in carried],
                   [body.outputs[0]] + [body.outputs[1 + j] for j in carried])
    if run is None:
        raise _Keep("control flow: the Loop's condition cannot be evaluated at load time; " + _WHAT_TO_DO)
    while cond and k < cap:
        res = run([np.array(k, dtype=np.int64), np.array(cond)] + [state[j] for j in carried])
        if res is None:
            raise _Keep("control flow: the Loop's condition cannot be evaluated at load time; " + _WHAT_TO_DO)
        cond = bool(np.ravel(res[0])[0])
        state = {j: r for j, r in zip(carried, res[1:])}
        k += 1
    if k > bound:
        raise _Keep(too_long)
    return k


def unroll_loop(graph: ir.Graph, node: ir.Node, evaluate: Evaluate, names: Names, created: list) -> None:
    body = node.attributes["body"].value
    m_in = node.inputs[0] if len(node.inputs) > 0 else None
    c_in = node.inputs[1] if len(node.inputs) > 1 else None
    initial = list(node.inputs[2:])
    n_carried = len(initial)
    n_scan = len(body.outputs) - 1 - n_carried
    trip = const(m_in)
    if m_in is not None and trip is None:
        raise _Keep(f"control flow: the Loop's trip count is not a constant {_why_not_constant(m_in)}")
    limit = int(np.ravel(trip)[0]) if trip is not None else None
    size = max(_count_nodes(body), 1)
    bound = MAX_UNROLLED // size
    too_long = (f"control flow: unrolling the Loop would write more than {bound} x {size} nodes (more than "
                f"{MAX_UNROLLED}); {_WHAT_TO_DO}")
    if limit is not None and limit > bound and c_in is None:
        raise _Keep(too_long)
    # how many iterations run: the condition, evaluated per iteration where it matters (tf2onnx gives a while loop
    # both a trip count and a counter condition)
    count = limit if c_in is None else _iterations(body, c_in, initial, limit, bound, too_long, evaluate)
    if count is None:
        raise _Keep(f"control flow: the Loop has neither a trip count nor a condition; {_WHAT_TO_DO}")
    if count == 0 and n_scan:
        raise _Keep("control flow: the Loop runs no iteration and has scan outputs (empty tensors); not unrolled")
    base = node.name or "Loop"
    true = _param(graph, names, f"{base}/cond", np.array(True))
    lifted: dict = {}
    current = list(initial)
    scans: list[list[ir.Value]] = [[] for _ in range(n_scan)]
    for k in range(count):
        vm = {body.inputs[0]: _param(graph, names, f"{base}/iteration{k}", np.array(k, dtype=np.int64)),
              body.inputs[1]: true}
        vm.update({body.inputs[2 + j]: current[j] for j in range(n_carried)})
        outs = _inline(graph, node, body, vm, f"{base}/{k}", names, lifted, created)
        current = outs[1:1 + n_carried]
        for s in range(n_scan):
            scans[s].append(outs[1 + n_carried + s])
    stacked = [_stack(graph, node, scans[s], 0, f"{base}/scan{s}", names, node.outputs[n_carried + s], created)
               for s in range(n_scan)]
    _replace_outputs(graph, node, current + stacked, names, created)
    graph.remove(node, safe=True)


def unroll_scan(graph: ir.Graph, node: ir.Node, names: Names, created: list) -> None:
    body = node.attributes["body"].value
    n_in = node.attributes.get_int("num_scan_inputs", 0)
    states = list(node.inputs[:len(node.inputs) - n_in])
    xs = list(node.inputs[len(node.inputs) - n_in:])
    n_state = len(states)
    n_out = len(body.outputs) - n_state
    in_axes = list(node.attributes.get_ints("scan_input_axes", [0] * n_in))
    in_dirs = list(node.attributes.get_ints("scan_input_directions", [0] * n_in))
    out_axes = list(node.attributes.get_ints("scan_output_axes", [0] * n_out))
    out_dirs = list(node.attributes.get_ints("scan_output_directions", [0] * n_out))
    lengths = set()
    for x, ax in zip(xs, in_axes):
        dims = list(x.shape) if x is not None and x.shape is not None else None
        d = dims[ax] if dims is not None and -len(dims) <= ax < len(dims) else None
        if not isinstance(d, int):
            raise _Keep(f"control flow: the Scan's sequence axis of {x.name!r} is not static; {_WHAT_TO_DO}")
        lengths.add(d)
    if len(lengths) != 1:
        raise _Keep("control flow: the Scan's inputs have different sequence lengths; the model is malformed")
    length = lengths.pop()
    size = max(_count_nodes(body), 1)
    if length * size > MAX_UNROLLED:
        raise _Keep(f"control flow: unrolling the Scan would write {length} x {size} nodes (more than "
                    f"{MAX_UNROLLED}); {_WHAT_TO_DO}")
    if length == 0 and n_out:
        raise _Keep("control flow: the Scan has an empty sequence and scan outputs (empty tensors); not unrolled")
    base = node.name or "Scan"
    lifted: dict = {}
    current = states
    scans: list[list[ir.Value]] = [[] for _ in range(n_out)]
    for t in range(length):
        vm = {body.inputs[j]: current[j] for j in range(n_state)}
        for i, (x, ax, rev) in enumerate(zip(xs, in_axes, in_dirs)):
            idx = _param(graph, names, f"{base}/step{t}/index{i}", np.array(length - 1 - t if rev else t,
                                                                           dtype=np.int64))
            sl = ir.Value(name=names(f"{base}/{t}/slice{i}"), type=x.type)
            g = ir.node("Gather", [x, idx], {"axis": ax}, outputs=[sl], name=names(f"{base}/{t}/gather{i}"))
            graph.insert_before(node, g)
            created.append(g)
            vm[body.inputs[n_state + i]] = sl
        outs = _inline(graph, node, body, vm, f"{base}/{t}", names, lifted, created)
        current = outs[:n_state]
        for s in range(n_out):
            scans[s].append(outs[n_state + s])
    stacked = [_stack(graph, node, scans[s][::-1] if out_dirs[s] else scans[s], out_axes[s], f"{base}/scan{s}",
                      names, node.outputs[n_state + s], created) for s in range(n_out)]
    _replace_outputs(graph, node, current + stacked, names, created)
    graph.remove(node, safe=True)


def _sources(v: ir.Value) -> tuple[list[ir.Value], list[ir.Value]]:
    """The graph inputs ``v`` is computed from: (those whose values it reads, those whose shapes only it reads
    through Shape/Size)."""
    values, shapes, seen, stack = [], [], set(), [(v, False)]
    while stack:
        u, by_shape = stack.pop()
        if u is None or (id(u), by_shape) in seen or u.const_value is not None:
            continue
        seen.add((id(u), by_shape))
        if u.is_graph_input():
            (shapes if by_shape else values).append(u)
            continue
        p = u.producer()
        if p is None:
            continue
        shape_op = _std(p) and p.op_type in ("Shape", "Size")
        stack.extend((i, by_shape or shape_op) for i in list(p.inputs) + captured_values(p))
    return values, shapes


def _fix_shapes(names: list[str]) -> str:
    """What to do about a shape check on dynamic input dimensions: fix them at load."""
    given = ", ".join(f"{n!r}: (SIZES)" for n in names)
    flags = " ".join(f"--input-shape {n}=AxB..." for n in names)
    return f"fix the input shapes (Explainer(..., input_shapes={{{given}}}), CLI {flags})"


def _why_not_constant(v: ir.Value) -> str:
    """Why ``v`` (a trip count or condition) is not known at load time, and what to do."""
    values, shapes = _sources(v)
    ints = sorted({u.name for u in values if u.dtype is not None and not u.dtype.is_floating_point()})
    if ints:
        return (f"(it depends on the integer input(s) {', '.join(ints)}); bind them to constants (Explainer(..., "
                f"constants={{{ints[0]!r}: VALUE}}), CLI --constant {ints[0]}=VALUE)")
    if not values and shapes:
        dyn = sorted({u.name for u in shapes})
        return (f"(it depends on a dynamic dimension of {', '.join(dyn)}: a dynamic sequence length); "
                f"{_fix_shapes(dyn)}, or {_WHAT_TO_DO}")
    return f"(it is computed from activations: a data-dependent loop); {_WHAT_TO_DO}"


def inline_if(graph: ir.Graph, node: ir.Node, names: Names, created: list) -> None:
    c = const(node.inputs[0])
    if c is None:
        values, shapes = _sources(node.inputs[0])
        ints = sorted({v.name for v in values if v.dtype is not None and not v.dtype.is_floating_point()})
        if ints:
            raise _Keep(f"control flow: the If's condition depends on the integer input(s) {', '.join(ints)}; bind "
                        f"them to constants (Explainer(..., constants={{{ints[0]!r}: VALUE}}), CLI --constant "
                        f"{ints[0]}=VALUE)")
        if not values and shapes:
            dyn = sorted({v.name for v in shapes})
            raise _Keep(f"control flow: the If's condition depends on dynamic dimensions of {', '.join(dyn)} (a "
                        f"shape check such as x.shape[0] == 1); {_fix_shapes(dyn)}")
        raise _Keep("control flow: the If's condition depends on activations (a data-dependent branch); export "
                    "the model for one fixed branch")
    branch = node.attributes["then_branch" if bool(np.ravel(c)[0]) else "else_branch"].value
    base = node.name or "If"
    outs = _inline(graph, node, branch, {}, f"{base}/{'then' if bool(np.ravel(c)[0]) else 'else'}", names, {},
                   created)
    _replace_outputs(graph, node, outs, names, created)
    graph.remove(node, safe=True)


class ControlFlow(LoadPass):
    """One round of :func:`unroll` (the pipeline folds constants between rounds); ``evaluate(model)`` builds the
    evaluator of a condition's slice."""

    def __init__(self, evaluate: Callable[[ir.Model], Evaluate]):
        super().__init__()
        self.evaluate = evaluate

    def apply(self, model: ir.Model, report: Report) -> int:
        return unroll(model, self.evaluate(model))


def unroll(model: ir.Model, evaluate: Evaluate) -> int:
    """Unroll every Loop/Scan and inline every If of the main graph that can be made static (see the module
    docstring); the others get ``meta.CONTROL_FLOW_REASON``. Returns how many were replaced."""
    graph = model.graph
    names = Names(graph)
    done = 0
    for node in list(graph):
        if not _std(node) or node.op_type not in ("Loop", "Scan", "If"):
            continue
        created: list[ir.Node] = []
        try:
            if node.op_type == "Loop":
                unroll_loop(graph, node, evaluate, names, created)
            elif node.op_type == "Scan":
                unroll_scan(graph, node, names, created)
            else:
                inline_if(graph, node, names, created)
            done += 1
        except _Keep as why:
            meta.CONTROL_FLOW_REASON.set(node, str(why))
        except Exception as exc:  # noqa: BLE001 - a body this code did not foresee: the node stays, refused
            meta.CONTROL_FLOW_REASON.set(node, f"control flow: the {node.op_type} could not be unrolled "
                                         f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]}); export it "
                                         "without control flow")
        _sweep(graph, created)  # on success the copies nobody reads (the condition), else all of them
    return done
