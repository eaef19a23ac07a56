"""The relevance model's interface: the names of the inputs and outputs the rewriter adds
(onnx_lrp/lrp/rewriter.py) and the records of its walk (the steps, the ledger's rows). Written by the rewriter, fed
and read by the runner (onnx_lrp/run/runner.py); imports nothing, so that a process that only runs a built relevance
model (a Ray actor) needs neither onnx_ir nor the rewriter."""
from __future__ import annotations

from dataclasses import dataclass


TARGET_INPUT = "lrp/target"
POSITION_INPUT = "lrp/position"  # only for outputs of rank >= 3: the index along axis 1 (< 0: from the end)
ONE_HOT_INPUT = "lrp/one_hot"
TARGET_OUTPUT = "lrp/target_used"
VALUE_OUTPUT = "lrp/explained_value"  # the explained tensor at the target (the logit, also behind a softmax), [N]
RELEVANCE_PREFIX = "lrp/relevance/"
LEDGER_ENTERING = "lrp/ledger/entering"
LEDGER_LEAVING = "lrp/ledger/leaving"
# the run-time checks computed in the graph (onnx_lrp.lrp.rewriter.check_outputs), read by the runner instead of the
# relevance arrays: per relevance input, the float64 sum and the largest |entry| of each row (batch item), and one
# float64 probe that is finite exactly when the inputs, the explained output and every returned relevance are
# (float32 data: exactly; float64 data: a non-finite probe may be an overflow, which the runner confirms on the arrays)
CHECK_SUM_PREFIX = "lrp/check/sum/"
CHECK_PEAK_PREFIX = "lrp/check/peak/"
CHECK_FINITE = "lrp/check/finite"
# the explained forward's outputs beside the deployed ones in a dict of outputs (onnx_lrp.run.batches.explain_all)
FORWARD_PREFIX = "lrp/forward/"


@dataclass(frozen=True)
class Step:
    """One node of the relevance walk, for locating where relevance first became non-finite: the relevance values
    it emitted for its inputs (in walk order: the output's side first)."""

    node: str
    op_type: str
    rule: str
    values: tuple  # names of emitted relevance tensors (gradient-form factors included)


@dataclass
class LedgerRow:
    """One row of the conservation ledger (:mod:`onnx_lrp.lrp.ledger`), what the table shows beside the numbers: the
    node, its rule and where absorbed relevance can go."""

    name: str
    op_type: str
    kind: str
    rule: str
    sinks: str  # what may absorb relevance at this node (bias, parameters, integer inputs, ...); "" = nothing
