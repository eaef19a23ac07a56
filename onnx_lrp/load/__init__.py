"""Loading: a model as exporters and deployments write it -> an ``onnx_ir.Model`` in the form the rules expect.

``load(source)`` reads and checks the model (:mod:`.proto`, the only package that imports onnx), names every node,
folds constants (:mod:`.fold`), then runs the passes (:mod:`.passes`, one module per deployed or exported form) in
the order below; the passes edit the graph with :mod:`.builder`. The result: checked, at opset >= MIN_OPSET,
shape-inferred, every constant-foldable subgraph folded into initializers (a value is a *parameter* or carries an
activation), static control flow unrolled, deployed forms brought back, canonized.
"""
from __future__ import annotations

import os

import onnx_ir as ir

from ..core import meta
from ..core.graph import mark_presumed
from .builder import Report
from .fold import check_sizes, fold_constants, mark_shape_only, name_everything, refresh_shapes, reinfer_shapes
from .passes import (block_quant, canonize, control_flow, dynamic_quant, float16, ort_fused, past_state, qdq,
                     qoperator)
from .proto.check import check
from .proto.digest import data_files, model_sha256, parts_sha256
from .proto.external_data import data_folder
from .proto.evaluate import condition_evaluator
from .proto.inputs import bind_constants, fix_input_shapes
from .proto.opset import MAX_OPSET, MIN_OPSET, opset_of
from .proto.prepare import prepare_proto
from .proto.read import read, read_proto
from .proto.save import save_bytes, save_parts
from .proto.serialize import deserialize, serialize, serialize_parts, to_ir


# decoders exported with a KV cache: the past fed empty, the present dropped (before anything reads the past)
STATE = [past_state.EmptyPast()]
# deployed forms, first stage: read and rewrite the quantized forms (nothing else runs if one is refused)
QUANTIZED = [ort_fused.RefuseUnsupported(), block_quant.BlockQuantized(), qdq.StandardQdqDomain(),
             qoperator.QOperatorToQdq(), dynamic_quant.SplitFusedDynamicQuant()]
# second stage: float16 first (the splits write float32 constants), then the fused ops, then the weights
FLOAT16 = [float16.UpcastLowPrecision()]
FUSED = [ort_fused.SplitFused(reinfer_shapes)]
WEIGHTS = [qdq.FoldWeightDequantize(), dynamic_quant.DequantizeIntegerOps(), qdq.RelayPairs()]


def load(source, name: str | None = None, constants: dict | None = None,
         input_shapes: dict | None = None, past_inputs: bool = False) -> ir.Model:
    """Read, check, upgrade, shape-infer, fold constants, unroll static control flow and canonize a model.
    ``constants`` binds graph inputs to fixed values (they stop being inputs); ``input_shapes`` fixes dynamic
    dimensions of graph inputs (input name -> sizes); ``past_inputs`` keeps a decoder's past key/value inputs as
    inputs (else they are fed empty)."""
    if name is None:
        name = str(source) if isinstance(source, (str, os.PathLike)) else "model"
    model = read(source, name, constants, input_shapes)
    name_everything(model.graph)
    fold_constants(model)
    unroll_control_flow(model)  # static Loop/Scan unrolled, If with a constant condition inlined
    deployed_forms(model, past_inputs)  # Q/DQ, QOperator, dynamic quant, float16, ORT fused ops
    canonize.StandardForm()(model)
    fold_constants(model)  # canonization can expose new constant chains
    model.graph.sort()
    # re-inferred shapes can make more Shape/Gather chains static (a channel split after a shuffle's reshape), and
    # folding them can fix more shapes: repeat while something changes
    fixpoint([RefreshAndFold()], 16, model)
    check_sizes(model.graph, name)
    mark_shape_only(model.graph)
    mark_presumed(model.graph)  # custom ops of unknown output type: presumed to carry relevance (then refused)
    return model


def _run(model: ir.Model, passes: list, report: Report) -> bool:
    """Run ``passes`` in order, their notes and refusals to ``report``; whether any changed the model."""
    return any([bool(p.apply(model, report)) for p in passes])


def deployed_forms(model: ir.Model, past_inputs: bool = False) -> list[str]:
    """Bring deployed forms back to standard float ops; one error listing every refused node. Returns the notes.
    ``past_inputs``: a decoder's past key/value inputs stay inputs (else fed empty)."""
    report = Report()
    if _run(model, [past_state.KeptPast()] if past_inputs else STATE, report):
        reinfer_shapes(model)
    if _run(model, QUANTIZED, report) and not report.refused:
        reinfer_shapes(model)
    if not report.refused:
        _run(model, FLOAT16, report)
        if _run(model, FUSED, report):
            reinfer_shapes(model)
        _run(model, WEIGHTS, report)
    report.raise_refusals(model)
    if report.notes:
        fold_constants(model)  # new constant chains (e.g. a Transpose of a dequantized weight)
    meta.DEPLOYED_FORMS.set(model, report.notes)
    return report.notes


def unroll_control_flow(model: ir.Model) -> int:
    """Unroll Loop/Scan and inline If where they are static, folding constants between rounds (an unrolled loop
    can expose a nested one with a now-constant trip count)."""
    unroll = UnrollRound()
    fixpoint([unroll], 8, model)
    return unroll.total


def fixpoint(passes: list, steps: int, model: ir.Model) -> bool:
    """Run ``passes`` in order, again while a round modifies the model, at most ``steps`` rounds (onnx_ir's
    PassManager); the error a pass raises comes out as itself (not wrapped in onnx_ir's PassError). Whether any
    round modified the model."""
    try:
        return ir.passes.PassManager(passes, steps=steps)(model).modified
    except ir.passes.PassError as exc:
        cause: BaseException = exc
        while isinstance(cause, ir.passes.PassError) and cause.__cause__ is not None:
            cause = cause.__cause__
        if cause is exc:
            raise
        raise cause from None


class RefreshAndFold(ir.passes.InPlacePass):
    """One round of the last fixpoint: shapes re-inferred; if that changed any, constants folded; modified when
    both changed something."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, bool(refresh_shapes(model)) and bool(fold_constants(model)))


class UnrollRound(ir.passes.InPlacePass):
    """One round of control-flow unrolling: static Loop/Scan unrolled and constant If inlined, then constants
    folded, shapes refreshed and constants folded again; modified when something was unrolled (``total``: how
    many over all rounds)."""

    def __init__(self):
        super().__init__()
        self.unroll = control_flow.ControlFlow(condition_evaluator)
        self.total = 0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not any(n.op_type in ("Loop", "Scan", "If") for n in model.graph):
            return ir.passes.PassResult(model, False)
        done = self.unroll.apply(model, Report())
        if done:
            self.total += done
            fold_constants(model)
            refresh_shapes(model)
            fold_constants(model)
        return ir.passes.PassResult(model, bool(done))


__all__ = ["load", "deployed_forms", "unroll_control_flow", "read_proto", "prepare_proto", "to_ir", "serialize",
           "deserialize", "check", "save_bytes", "bind_constants", "fix_input_shapes", "fold_constants",
           "refresh_shapes", "mark_shape_only", "opset_of", "MIN_OPSET", "MAX_OPSET", "serialize_parts", "save_parts",
           "data_files", "model_sha256", "parts_sha256", "data_folder", "fixpoint"]
