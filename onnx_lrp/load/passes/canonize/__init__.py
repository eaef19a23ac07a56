"""The standard form: canonizers that rewrite what exporters write into the form the rules expect (cf.
zennit.canonizers), one module per kind; one pass, :class:`StandardForm`, runs them in the order of
:func:`canonize` (the last loading pass before folding).

- :mod:`.cleanup`: Identity and Dropout are dropped (not a Dropout in training mode: its op check refuses it); a
  Where with a constant all-true (all-false) condition is its first (second) branch; LayerNormalization loses an
  empty bias input.
- :mod:`.dynamic_shapes`: a Slice whose ends are a Concat of constants and the sliced axes' own lengths (jax2onnx,
  dynamic batch) gets constant ends; ``Reduce(keepdims=0) -> Reshape(kept shape) -> Expand(same shape)``
  (jax2onnx's ``keepdims=True``) becomes the reduction with ``keepdims=1``.
- :mod:`.statistics`: ``ReduceSumSquare(x)`` becomes ``ReduceSum(x * x)``; Flax's fast variance
  ``max(mean(x * x) - mean(x) ** 2, 0)`` becomes ``mean((x - mean(x)) ** 2)``; ``ReduceSum(x) / n`` over n elements
  becomes ``ReduceMean(x)`` (jax2onnx's mean).
- :mod:`.batch_coupling`: a reduction over the batch axis whose result returns to the items (batch statistics) is
  marked ``meta.COUPLES_ITEMS``: its op check refuses it.
- :mod:`.pads`: ``auto_pad`` becomes explicit ``pads`` (static spatial shapes needed, or stride 1 along a dynamic
  axis).
- :mod:`.channel_affine`: BatchNormalization directly after a Conv/Gemm (its only consumer) is folded into that
  layer's parameters. Per-channel constant scale/shift chains (Mul/Add/Sub/Div by a constant that varies along the
  layer's output channel axis only, in any order, also across a Transpose after a Conv: tf2onnx writes Keras
  BatchNormalization as Mul -> Add) directly after a Conv/Gemm/MatMul with constant weights are folded into that
  layer like a BatchNormalization. Those that cannot be folded (after a residual sum, a pool, at the input) are
  marked ``meta.CHANNEL_AFFINE``: they get BatchNormalization's kind ("batchnorm"), not "affine".
- :mod:`.bias`: an Add of a constant directly after a MatMul, a bias-less Gemm or a bias-less Conv is recorded as
  that layer's bias (``meta.BIAS``), so that z+ / gamma / alpha-beta see one layer ``x W + b``.
- :mod:`.activations`: ``Clip(x + 3, 0, 6) / 6`` (Keras' hard sigmoid written out) becomes ``HardSigmoid``, and
  ``x`` times it ``HardSwish``, as a PyTorch export writes them.
- :mod:`.recurrent`: LSTM / GRU / RNN with ``layout = 1`` (batch first; onnxruntime runs only ``layout = 0``)
  become Transposes around the same op with ``layout = 0``.
"""
from __future__ import annotations

import onnx_ir as ir

from ...builder import LoadPass, Report
from . import activations, batch_coupling, bias, channel_affine, cleanup, dynamic_shapes, pads, recurrent, statistics


class StandardForm(LoadPass):
    """The canonizers of this package, in the order of :func:`canonize`."""

    def apply(self, model: ir.Model, report: Report) -> int:
        canonize(model)
        return 1


def canonize(model: ir.Model) -> None:
    """Every canonizer on the model's main graph, in order: the rewrites, then the marks they leave for the rules."""
    graph = model.graph
    recurrent.recurrent_layout0(graph)
    cleanup.drop_identities(graph)
    dynamic_shapes.slice_to_the_end(graph)
    statistics.sum_square_written_out(graph)
    dynamic_shapes.keepdims_broadcasts(graph)
    cleanup.where_constant(graph)
    cleanup.layernorm_without_empty_bias(graph)
    activations.hard_sigmoid_written_out(graph)
    statistics.two_pass_variance(graph)
    pads.explicit_pads(graph)
    channel_affine.fold_batchnorm(graph)
    channel_affine.fold_channel_affine(graph)
    statistics.mean_from_sum(graph)
    graph.sort()
    channel_affine.mark_channel_affine(graph)
    bias.absorb_bias(graph)
    batch_coupling.mark_batch_coupling(graph)


__all__ = ["StandardForm", "canonize"]
