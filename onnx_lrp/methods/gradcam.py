"""Grad-CAM (Selvaraju et al. 2017) at a named tensor, as captum's LayerGradCam followed by
LayerAttribution.interpolate: the gradient of the explained entry at the tensor ``layer`` (N x C x spatial axes)
from the true-gradient relevance graph (its ``relevance_at``), the tensor's value from the original model in plain
onnxruntime, each channel weighted by its mean gradient over the spatial axes, summed over the channels, ReLU'd
when ``relu_attributions``, and upsampled to the input's spatial axes: N x 1 x the input's spatial axes."""
from __future__ import annotations

import numpy as np

from .. import load
from ..core.errors import InputError
from ..core.interface import RELEVANCE_PREFIX
from ..run import runtime
from .gradients import GradientRunner
from .options import RunSettings
from .rise import upsample_linear


class LayerRunner(GradientRunner):
    """The true-gradient relevance model that also returns the gradient at ``layer``, and the original model
    returning ``layer``'s value."""

    def __init__(self, model, settings: RunSettings, layer: str):
        self.layer = layer
        self.forward = _layer_session(model, layer, settings)
        try:
            super().__init__(model, settings, relevance_at=(layer,))
        except InputError as exc:
            if str(exc).startswith("no tensor named"):
                raise InputError(f"grad-cam: tensor {layer!r} is not in the model as the methods load it (it may be "
                                 "folded into a neighbour, e.g. a Conv's output before a BatchNorm); name the tensor "
                                 "after it") from None
            raise
        if self.packing is not None:
            raise InputError(f"grad-cam takes a model with one input; this one has {len(self.packing.names)} "
                             f"({', '.join(self.packing.names)})")

    def layer_values(self, rows: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(``layer``'s value, the gradient of each row's target entry at it), in chunks of rows."""
        step = self.rows_per_run(rows)
        acts, grads = [], []
        for i in range(0, len(rows), step):
            part = rows[i:i + step]
            grads.append(self.run(part, targets[i:i + step], i)[RELEVANCE_PREFIX + self.layer])
            acts.append(self.forward.run(self.feeds(part, i), [self.layer])[self.layer])
        a, g = np.concatenate(acts), np.concatenate(grads)
        if a.shape != g.shape or a.ndim < 3:
            raise InputError(f"grad-cam: tensor {self.layer!r} has shape {' x '.join(map(str, a.shape))}, not N x C x "
                             "spatial axes; name a convolution's (spatial) output")
        return a.astype(np.float64), g.astype(np.float64)


def _layer_session(model, layer: str, settings: RunSettings):
    """The original model, with ``layer`` as its one output, in a plain onnxruntime session."""
    ir_model = load.to_ir(load.read_proto(model), load.data_folder(model))
    graph = ir_model.graph
    value = next((o for n in graph for o in n.outputs if o.name == layer), None)
    if value is None:
        raise InputError(f"grad-cam: layer {layer!r} is not a tensor of the model; give the name of a node's output "
                         "(N x C x H x W), e.g. the last convolution block's")
    if value.shape is not None and len(value.shape) < 3:
        raise InputError(f"grad-cam: tensor {layer!r} has shape {value.shape}, not N x C x spatial axes; name a "
                         "convolution's (spatial) output")
    graph.outputs.clear()
    graph.outputs.append(value)
    parts = load.serialize_parts(ir_model)
    return runtime.Session(parts.model_bytes, settings.device, settings.threads, deployed=True,
                           external=runtime.ExternalData(parts.folder, parts.arrays, parts.prepack))


def resize_nearest(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    """torch's ``interpolate(mode="nearest")`` along one axis: source index floor(i * in / out) (float32 scale)."""
    n = a.shape[axis]
    if n == size:
        return a
    scale = np.float32(n) / np.float32(size)
    src = np.minimum(np.floor(np.arange(size, dtype=np.float32) * scale).astype(int), n - 1)
    return np.take(a, src, axis=axis)


def upsample(cam: np.ndarray, shape: tuple, mode: str) -> np.ndarray:
    """``cam`` (N x 1 x spatial) resized to the spatial ``shape`` axis by axis."""
    if mode == "none":
        return cam
    if len(shape) != cam.ndim - 2:
        raise InputError(f"grad-cam: the layer has {cam.ndim - 2} spatial axes, the input {len(shape)}; give "
                         "interpolate_mode='none' or a layer with the input's spatial axes")
    for k, size in enumerate(shape):
        cam = resize_nearest(cam, k + 2, size) if mode == "nearest" else upsample_linear(cam, k + 2, size)
    return cam


def grad_cam(gr: LayerRunner, x: np.ndarray, targets: np.ndarray, options) -> np.ndarray:
    """captum's LayerGradCam (weights: the gradient's mean over the spatial axes) then interpolate."""
    acts, grads = gr.layer_values(x, targets)
    spatial = tuple(range(2, acts.ndim))
    weights = grads.mean(axis=spatial, keepdims=True)
    cam = (weights * acts).sum(axis=1, keepdims=True)
    if options.relu_attributions:
        cam = np.maximum(cam, 0.0)
    out = upsample(cam, x.shape[2:], options.interpolate_mode)
    return out.astype(x.dtype)


__all__ = ["LayerRunner", "grad_cam", "upsample", "resize_nearest"]
