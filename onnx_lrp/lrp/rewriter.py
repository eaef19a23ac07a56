"""The rewriter: one reverse topological walk that appends relevance propagation to the forward graph (``rewrite``:
``plan`` -> ``check_bounds`` -> ``Walk``).

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

import onnx_ir as ir

from ..core.errors import UnsupportedError
from ..core.interface import ONE_HOT_INPUT, RELEVANCE_PREFIX, TARGET_INPUT, TARGET_OUTPUT
from ..rules.composite import Composite
from .ops import ActivationOp
from .plan import Plan, check_bounds, describe, plan, unsupported_hint
from .target import explained_value, whole_output
from .walk import Walk


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
    walk = Walk(model, p, relevance_at, ledger, trace)
    walk.backward()
    outputs = list(model.graph.outputs) + walk.input_relevance() + walk.watched_relevance() + walk.extra_outputs()
    model.graph.outputs.clear()
    model.graph.outputs.extend(outputs)
    return model


__all__ = ["rewrite", "plan", "describe", "check_bounds", "unsupported_hint", "explained_value", "whole_output", "Plan",
           "TARGET_INPUT", "ONE_HOT_INPUT", "TARGET_OUTPUT", "RELEVANCE_PREFIX", "ActivationOp"]
