"""Building a relevance model: ``build(model, composite, options) -> RelevanceModel``, the pipeline from an ONNX model
to the one graph that computes the forward pass and the relevance (:mod:`.stages`: load, choose the composite,
rewrite, precision, serialise), with the automatic composite (:mod:`.auto_composite`), the float16 / bfloat16
precision pass (:mod:`.precision`) and computed weights (:mod:`.computed_weights`).

Public as ``onnx_lrp.build_relevance_model`` (with ``onnx_lrp.BuildOptions``).
"""
from __future__ import annotations

import gc
import weakref

from ..core.relevance_model import BuildOptions, BuildSource, RelevanceModel
from ..load import external
from . import stages


def build(model, composite="auto", options: BuildOptions = BuildOptions()) -> RelevanceModel:
    """The relevance model of ``model`` (a path, bytes, an onnx ModelProto or an onnx_ir model) under ``composite``
    (a built-in name, a TOML file, a :class:`onnx_lrp.rules.composite.Composite`, or "auto": the one that fits the
    network) with ``options`` (:class:`onnx_lrp.core.relevance_model.BuildOptions`). Only
    :class:`onnx_lrp.LrpError` escapes."""
    with stages.only_lrp_errors("building the relevance model",
                                hint="; the model (or a dimension of it) is too large for this machine"):
        forward = stages.load(model, options)
        composite, reason = stages.choose(composite, forward, options)
        deployed = stages.deployed_model(model, forward, options)
        what = stages.explained(forward, options)
        trace, ledger_rows = stages.rewrite(forward, composite, options)
        names = stages.interface(forward, what)
        model_precision, low_bytes = stages.precision(forward, options)
        parts = stages.serialise(forward)
        packed_bytes = external.packed_bytes(forward)
        relevance_model = RelevanceModel(
            model_bytes=parts.model_bytes, model_folder=parts.folder, model_arrays=parts.arrays,
            model_prepack=parts.prepack,
            inputs=what.inputs, relevance_inputs=names.relevance_inputs, relevance_at=tuple(options.relevance_at),
            explained_output=names.explained_output, explained_tensor=names.explained_tensor,
            output_names=names.output_names, whole=what.whole, sequence_rows=names.sequence_rows,
            sequence_rows_from=what.sequence_rows_from, output_step=what.step,
            trace=trace, ledger_rows=ledger_rows,
            deployed=stages.deployed_kept(deployed, parts.prepack, low_bytes, options, packed_bytes),
            composite_name=composite.name, composite_reason=reason, model_precision=model_precision,
            forward_nodes=what.nodes,
            source=BuildSource(model, composite, options, stages.composite_by_name(composite)))
        if parts.keep is not None:  # its own weights file: removed when the relevance model is collected
            weakref.finalize(relevance_model, parts.keep.release)
        del forward, what  # nothing of the onnx_ir graph outlives the build
        if parts.folder is not None:
            gc.collect()  # the graph's cycles hold its memory-mapped weights: unmapped before onnxruntime maps them
        return relevance_model

__all__ = ["build", "BuildOptions", "RelevanceModel"]
