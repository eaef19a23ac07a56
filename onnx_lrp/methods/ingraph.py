"""An attribution method as ONE ONNX model for plain onnxruntime (``onnx-lrp rewrite --method ...``): the prediction
and the method's attribution in one run. The gradient family is the true-gradient relevance model
(:mod:`.gradients`) with the method around it in the graph: the input's points (Integrated Gradients' steps,
SmoothGrad's noisy samples, GradientSHAP's draws) stacked along the batch axis after the input itself (the target
is the model's arg-max at the input unless given), every point's gradient from one run, and the sums and means (in
float64) an output. ``grad-cam`` reads the gradient at a named tensor (:mod:`.ingraph_cam`); ``occlusion`` and
``rise`` are one batched forward of the original model (:mod:`.ingraph_forward`); the sampled methods are in
:mod:`.ingraph_sampled`.

Inputs: the model's inputs, ``lrp/target`` (int64 [N], -1: the arg-max) and the method's (``lrp/baselines``,
``lrp/noise``, ``lrp/baseline_indices``, ``lrp/alphas``, ``lrp/masks``: :data:`METHOD_INPUTS`; with several float
inputs the per-input ones as ``lrp/noise/<input>``, ``lrp/baselines/<input>``). Integer and bool inputs (attention
masks) are held: fed as given to every stacked copy (:mod:`.ingraph_inputs`). Outputs: the model's outputs at the
input, ``lrp/relevance/<input>`` per float input (the attribution) and ``lrp/target_used``. A model with
external data (or over 1 GiB of weights) is written as ``OUT`` + ``OUT.data`` (:func:`save_method_model`)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .. import load as loader
from ..core.errors import InputError
from ..load import external
from . import ingraph_cam, ingraph_forward, ingraph_sampled
from .ingraph_base import BASELINES_INPUT, batch_axis_free, gradient_model, integrated_gradients_model

IN_GRAPH = ("gradient", "gradient-x-input", "integrated-gradients", "smoothgrad", "vargrad", "expected-gradients",
            "gradient-shap", "grad-cam", "occlusion", "rise")
#: the inputs a method's model may take besides the model's and lrp/target
METHOD_INPUTS = {"integrated-gradients": ("lrp/baselines",), "smoothgrad": ("lrp/noise",), "vargrad": ("lrp/noise",),
                 "expected-gradients": ("lrp/baselines", "lrp/baseline_indices", "lrp/alphas", "lrp/noise"),
                 "gradient-shap": ("lrp/baselines", "lrp/baseline_indices", "lrp/alphas", "lrp/noise"),
                 "rise": ("lrp/masks",)}


def _checked(method: str, inputs: tuple, options: dict) -> dict:
    """What the methods' graphs cannot take, refused before anything is built; the options to build with."""
    if method not in IN_GRAPH:
        raise InputError(f"rewrite --method writes {', '.join(IN_GRAPH)}; {method!r} is none of them")
    wrong = [i for i in inputs if i != "baselines"]
    if wrong or (inputs and method not in ("integrated-gradients", "expected-gradients", "gradient-shap")):
        raise InputError(f"--baseline-input is for integrated-gradients, expected-gradients and gradient-shap, not "
                         f"{method}" if not wrong else f"inputs= takes 'baselines', not {wrong[0]!r}")
    if method == "integrated-gradients" and options.get("base", "gradient") != "gradient":
        raise InputError(f"rewrite --method integrated-gradients writes the true gradient into the graph; over "
                         f"composite {options['base']!r} it runs through `onnx-lrp explain --method`")
    if "baselines" in inputs and options.get("baselines") is not None:
        raise InputError("baselines are the input lrp/baselines here (--baseline-input); do not give them too")
    if "baselines" in inputs and method in ("expected-gradients", "gradient-shap"):
        options = {**options, "baselines": np.zeros((1, 1))}  # a placeholder: the background set is the input
    return options


def method_ir(model, method: str, inputs: tuple = (), **options) -> ir.Model:
    """``method`` (one of :data:`IN_GRAPH`) on ``model`` as one onnx_ir model (see the module); ``inputs``: the
    random parts or baselines that are graph inputs rather than constants (``"baselines"`` for
    integrated-gradients, expected-gradients and gradient-shap; the draws of the sampled methods are inputs unless
    ``seed`` or the arrays are given: :mod:`.ingraph_sampled`)."""
    from . import Attributor

    options = _checked(method, inputs, options)
    attributor = Attributor(model, method, **options)
    engine, opts = attributor.engine, attributor.options
    if method in ("occlusion", "rise"):
        return ingraph_forward.forward_model(model, engine, method, opts)
    if attributor.base is not None and opts.base not in ingraph_sampled.BASES:  # an LRP composite's SmoothGrad
        return ingraph_sampled.noise_tunnel_model(engine, opts)
    if method == "grad-cam":
        return ingraph_cam.grad_cam_model(engine, opts)
    if method not in ("gradient", "gradient-x-input"):
        for spec in engine.runner.inputs:
            if spec.name in engine.runner.relevance_inputs:
                batch_axis_free(spec.name, spec.dims)
    if method in ("smoothgrad", "vargrad"):
        return ingraph_sampled.noise_tunnel_model(engine, opts)
    if method in ("expected-gradients", "gradient-shap"):
        return ingraph_sampled.expected_gradients_model(engine, opts, "baselines" in inputs)
    if method == "integrated-gradients":
        return integrated_gradients_model(engine, opts, "baselines" in inputs)
    return gradient_model(engine, method, opts)


def method_parts(model, method: str, baseline_input: bool = False, **options) -> external.Parts:
    """The model of :func:`method_ir` as onnxruntime receives it: bytes alone, or for a model with external data
    (or over 1 GiB of weights) the graph, the folder of its data files and its large in-memory tensors."""
    return loader.serialize_parts(method_ir(model, method, ("baselines",) if baseline_input else (), **options))


def method_model(model, method: str, baseline_input: bool = False, **options) -> bytes:
    """``method`` on ``model`` as one ONNX model's bytes (see the module); a model whose weights do not fit in
    one file: :func:`save_method_model`."""
    parts = method_parts(model, method, baseline_input, **options)
    if parts.large:
        raise InputError("the method's model keeps its weights in external data: write it with "
                         "save_method_model(model, path, ...) (OUT + OUT.data)")
    return parts.model_bytes


def save_method_model(model, path, method: str, baseline_input: bool = False, **options) -> tuple[list, bool]:
    """Write ``method`` on ``model`` to ``path`` (and ``path.data`` for a model with external data or over 1 GiB
    of weights: its weights streamed from the model's data files), never over the model or its data files; returns
    (the written model's input names, whether it has ``path.data``)."""
    import os
    from pathlib import Path

    from ..core.files import guard_outputs

    ins = []
    if isinstance(model, (str, os.PathLike)) and Path(model).is_file():
        ins = [("the model", model), *(("the model's data file", f) for f in loader.data_files(Path(model)))]
    guard_outputs(ins, [("the output", path), ("the output's data file", Path(str(path) + ".data"))])
    written = method_ir(model, method, ("baselines",) if baseline_input else (), **options)
    names = [v.name for v in written.graph.inputs]
    parts = loader.serialize_parts(written)
    try:
        loader.save_parts(parts, path)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    return names, parts.large


__all__ = ["IN_GRAPH", "BASELINES_INPUT", "METHOD_INPUTS", "method_ir", "method_parts", "method_model",
           "save_method_model", "integrated_gradients_model", "gradient_model"]
