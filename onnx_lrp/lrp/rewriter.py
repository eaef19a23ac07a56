"""The rewriter: one reverse topological walk that appends relevance propagation to the forward graph (``rewrite``:
``plan`` -> ``check_bounds`` -> ``Walk``).

The result is ONE model: its outputs are the original outputs, then ``lrp/relevance/<input>`` for every float
graph input (and for the tensors asked for with ``relevance_at``), then ``lrp/target_used`` (the explained index
per batch item, into the output flattened per item) and ``lrp/explained_value`` (the explained tensor at the target:
the logit, also for a softmax output), then the run-time checks (``check_outputs``: a few numbers per item, so that
the runner never reads the relevance arrays to check them). Inputs steer it (required: initializer defaults would make onnxruntime warn on
every load): ``lrp/target`` (int64 [batch]; -1 = arg-max), ``lrp/one_hot`` (bool scalar; true: start from 1 at the
target, false: from the target's output value) and, for sequence outputs (N, T, C...), ``lrp/position`` (int64
[batch]; the index along T, negative counts from the end; -1 is the last position, as for a causal LM): then
``lrp/target`` is a class at that position.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core.emitter import Emitter
from ..core.errors import UnsupportedError
from ..core.interface import (
    CHECK_FINITE,
    CHECK_PEAK_PREFIX,
    CHECK_SUM_PREFIX,
    ONE_HOT_INPUT,
    POSITION_INPUT,
    RELEVANCE_PREFIX,
    TARGET_INPUT,
    TARGET_OUTPUT,
)
from .ops import ActivationOp
from .plan import Plan, check_bounds, describe, plan, unsupported_hint
from .target import explained_value, whole_output
from .vocabulary import CompositeView
from .walk import Walk


def rewrite(model: ir.Model, composite: CompositeView, output: str | None = None, relevance_at=(),
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
    walk = Walk(model, p, relevance_at, ledger, trace)
    walk.backward()
    forward_outputs = list(model.graph.outputs)
    inputs, watched = walk.input_relevance(), walk.watched_relevance()
    outputs = forward_outputs + inputs + watched + walk.extra_outputs()
    outputs += check_outputs(walk.em, model.graph, inputs, watched, p.output)
    model.graph.outputs.clear()
    model.graph.outputs.extend(outputs)
    return model


def check_outputs(em: Emitter, graph: ir.Graph, relevance: list, watched: list, explained: ir.Value) -> list:
    """The run-time checks as small outputs (names in :mod:`onnx_lrp.core.interface`), so that the runner reads a
    few numbers per item instead of the relevance arrays:

    * ``lrp/check/sum/<input>`` and ``lrp/check/peak/<input>``: per row (batch item) of each input's relevance, its
      sum in float64 (the conservation check's ratios: a float32 sum can cancel to nothing where the float64 one
      does not) and its largest |entry| (exact in any precision);
    * ``lrp/check/finite`` ([1], float64): the sum of the float inputs, of the explained output and of every returned
      relevance in float64: NaN or infinite exactly when one of their entries is (a float64 sum of at most 2^64
      values of magnitude <= 3.4e38 cannot overflow; for float64 data the runner confirms a non-finite probe on the
      arrays). A sum carries NaN and infinities through; a maximum need not.
    """
    f64 = ir.DataType.DOUBLE.value
    outputs, totals = [], []
    with em.scope("check"):
        for r in relevance:
            name = r.name[len(RELEVANCE_PREFIX):]
            rows = _rows(em, r)
            sums = em.op("ReduceSum", em.op("Cast", rows, to=f64, tag="rows64"), em.ints([1]), keepdims=0,
                         tag="row_sums")
            peaks = _reduce_max(em, em.op("Abs", rows, tag="rows_abs"), tag="row_peaks")
            lead = [r.shape[0] if r.shape is not None and len(r.shape) else 1]
            outputs += [_named(sums, CHECK_SUM_PREFIX + name, ir.DataType.DOUBLE, lead),
                        _named(peaks, CHECK_PEAK_PREFIX + name, r.dtype, lead)]
            totals.append(em.op("ReduceSum", sums, keepdims=0, tag="total"))
        steer = (TARGET_INPUT, ONE_HOT_INPUT, POSITION_INPUT)
        checked = [v for v in graph.inputs if v.name not in steer and _floating(v)] + watched + \
            ([explained] if _floating(explained) else [])
        for v in checked:
            totals.append(em.op("ReduceSum", em.op("Cast", v, to=f64, tag="all64"), keepdims=0, tag="total"))
        probe = em.sum(totals, tag="finite_sum") if totals else em.const(np.zeros(()), tag="nothing", dtype=np.float64)
        probe = em.op("Reshape", probe, em.ints([1]), tag="finite")
    return outputs + [_named(probe, CHECK_FINITE, ir.DataType.DOUBLE, [1])]


def _floating(v: ir.Value) -> bool:
    return v.type is not None and isinstance(v.type, ir.TensorType) and v.dtype.is_floating_point()


def _rows(em: Emitter, r: ir.Value) -> ir.Value:
    """``r`` as [rows, entries]: one row per item of its leading axis (a scalar: one row of one entry)."""
    if r.shape is not None and len(r.shape) == 0:
        return em.op("Reshape", r, em.ints([1, 1]), tag="rows")
    return em.op("Flatten", r, axis=1, tag="rows")


def _reduce_max(em: Emitter, x: ir.Value, tag: str) -> ir.Value:
    """The maximum of each row of a [rows, entries] tensor (the axes an input from opset 18)."""
    if em.opset >= 18:
        return em.op("ReduceMax", x, em.ints([1]), keepdims=0, tag=tag)
    return em.op("ReduceMax", x, axes=[1], keepdims=0, tag=tag)


def _named(v: ir.Value, name: str, dtype: ir.DataType, dims: list) -> ir.Value:
    v.name = name
    v.type = ir.TensorType(dtype)
    v.shape = ir.Shape(dims)
    return v


__all__ = ["rewrite", "check_outputs", "plan", "describe", "check_bounds", "unsupported_hint", "explained_value", "whole_output", "Plan",
           "TARGET_INPUT", "ONE_HOT_INPUT", "TARGET_OUTPUT", "RELEVANCE_PREFIX", "ActivationOp"]
