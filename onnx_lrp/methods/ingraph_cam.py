"""Grad-CAM in one graph (:mod:`.ingraph`): the true-gradient relevance model's gradient at the named tensor
``layer`` and the tensor's value, each channel weighted by its gradient's mean over the spatial axes, summed over
the channels, ReLU'd when ``relu_attributions``, and upsampled to the input's spatial axes as captum's
LayerAttribution.interpolate (nearest: torch's source index floor(i * in / out); bilinear: half-pixel centres),
written as gathers with constant indices and weights (float64): N x 1 x the input's spatial axes."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core.errors import InputError
from ..core.interface import RELEVANCE_PREFIX
from .gradcam import LayerRunner
from .ingraph_base import END, GradientGraph


def _layer_shape(gr: LayerRunner) -> tuple:
    """The layer's shape for one item of the input (one forward run of the original model)."""
    dims = gr.spec.dims[1:] if gr.spec.dims else None
    if not dims or any(not isinstance(d, int) or d < 1 for d in dims):
        raise InputError(f"rewrite --method grad-cam needs the input's shape after its batch axis fixed; "
                         f"{gr.spec.name!r} has {gr.spec.dims}: export the model with those sizes fixed")
    x = np.zeros((1,) + tuple(dims), gr.spec.dtype)
    held = {}
    for s in gr.runner.inputs:
        if s.name in gr.held_names:  # a mask of ones: the layer's shape does not depend on its values
            if not s.dims or any(not isinstance(d, int) or d < 1 for d in s.dims[1:]):
                raise InputError(f"rewrite --method grad-cam needs the held input {s.name!r}'s shape after its "
                                 f"batch axis fixed; it has {s.dims}: export the model with those sizes fixed")
            held[s.name] = np.ones((1,) + tuple(s.dims[1:]), s.dtype)
    shape = gr.forward.run({**gr.feeds(x), **held}, [gr.layer])[gr.layer].shape
    if len(shape) < 3:
        raise InputError(f"grad-cam: tensor {gr.layer!r} has shape {' x '.join(map(str, shape))}, not N x C x "
                         "spatial axes; name a convolution's (spatial) output")
    return tuple(dims), shape


def _axis_map(n: int, size: int, mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first source index, second source index, the second's weight) of each of ``size`` outputs from ``n``
    inputs, as :func:`onnx_lrp.methods.gradcam.upsample` resizes one axis."""
    if mode == "nearest":
        scale = np.float32(n) / np.float32(size)
        src = np.minimum(np.floor(np.arange(size, dtype=np.float32) * scale).astype(np.int64), n - 1)
        return src, src, np.zeros(size)
    src = np.clip((np.arange(size) + 0.5) * (n / size) - 0.5, 0, n - 1)
    i0 = np.floor(src).astype(np.int64)
    return i0, np.minimum(i0 + 1, n - 1), src - i0


def _upsample(w: GradientGraph, cam: ir.Value, layer: tuple, item: tuple, mode: str) -> ir.Value:
    """``cam`` (N x 1 x the layer's spatial axes, float64) resized axis by axis to the input's spatial axes."""
    em = w.em
    spatial = item[1:]
    if mode == "none":
        return cam
    if len(spatial) != len(layer) - 2:
        raise InputError(f"grad-cam: the layer has {len(layer) - 2} spatial axes, the input {len(spatial)}; give "
                         "interpolate_mode='none' or a layer with the input's spatial axes")
    for k, (n, size) in enumerate(zip(layer[2:], spatial)):
        if n == size:
            continue
        i0, i1, frac = _axis_map(n, size, mode)
        first = em.op("Gather", cam, em.const(i0, tag="index0"), axis=k + 2, tag="first")
        if mode == "nearest":
            cam = first
            continue
        second = em.op("Gather", cam, em.const(i1, tag="index1"), axis=k + 2, tag="second")
        shape = [1] * (len(layer) - k - 3)
        wt = em.const(frac.reshape([size] + shape), tag="weight", dtype=np.float64)
        cam = em.op("Add", em.op("Mul", first, em.op("Sub", em.const(np.array(1.0), dtype=np.float64, tag="one"),
                                                     wt)), em.op("Mul", second, wt), tag="resized")
    return cam


def grad_cam_model(gr: LayerRunner, options) -> ir.Model:
    """captum's LayerGradCam + LayerAttribution.interpolate (``options``:
    :class:`onnx_lrp.methods.options.GradCamOptions`) in one graph."""
    item, layer = _layer_shape(gr)
    w = GradientGraph(gr.runner)
    em = w.em
    values = {o.name: o for node in w.graph for o in node.outputs}
    act, grad = values.get(gr.layer), w.outputs.get(RELEVANCE_PREFIX + gr.layer)
    if act is None or grad is None:
        raise InputError(f"grad-cam: tensor {gr.layer!r} is not in the model as the methods load it (it may be "
                         "folded into a neighbour); name the tensor after it")
    with em.scope("method/grad_cam"):
        target = w.plain()
        shape = em.op("Shape", act, tag="layer_shape")
        by_channel = em.op("Concat", em.op("Slice", shape, em.ints([0]), em.ints([2])), em.ints([-1]), axis=0)
        a = em.op("Reshape", w.double(act), by_channel, tag="acts")
        g = em.op("Reshape", w.double(grad), by_channel, tag="grads")
        count = em.op("Cast", em.op("Slice", em.op("Shape", g), em.ints([2]), em.ints([3])), to=ir.DataType.DOUBLE)
        weights = em.op("Div", em.op("ReduceSum", g, em.ints([2]), keepdims=1), count, tag="weights")
        cam = em.op("ReduceSum", em.op("Mul", weights, a), em.ints([1]), keepdims=1, tag="cam")
        if options.relu_attributions:
            cam = em.op("Max", cam, em.const(np.array(0.0), dtype=np.float64, tag="zero"), tag="relu")
        one = em.op("Concat", em.op("Slice", shape, em.ints([0]), em.ints([1])), em.ints([1]),
                    em.op("Slice", shape, em.ints([2]), em.ints([END])), axis=0, tag="cam_shape")
        cam = _upsample(w, em.op("Reshape", cam, one, tag="cam_spatial"), layer, item, options.interpolate_mode)
        relevance = em.op("Cast", cam, to=w.dtype, tag="attribution")
    return w.finish(relevance, target, None)


__all__ = ["grad_cam_model"]
