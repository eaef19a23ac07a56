"""Model parameter randomisation (Adebayo et al. 2018; Quantus' MPRT and EfficientMPRT): the ORIGINAL model's
parameters are re-drawn layer by layer, top-down and cascading, and the relevance model is rebuilt from the
randomised model through the loader (``onnx_lrp.load``), so that every weight the rules derive (W+, |W|, BatchNorm
folded into a convolution, ...) follows the randomised ones.

A layer is a node with parameters: Conv, ConvTranspose, Gemm, MatMul (with the bias Add after it),
BatchNormalization, InstanceNormalization, LayerNormalization. Values are drawn as PyTorch's ``reset_parameters``
draws them (what Quantus' ``get_random_layer_generator`` calls): weights and biases uniform in +-1/sqrt(fan_in),
normalisation scales 1, shifts and running means 0, running variances 1; each layer from its own seeded generator.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .. import load
from ..core.errors import InputError


LINEAR = ("Conv", "ConvTranspose", "Gemm", "MatMul")
NORMS = ("BatchNormalization", "InstanceNormalization", "LayerNormalization")


def _param(v) -> bool:
    return v is not None and v.const_value is not None and v.producer() is None and v.dtype is not None \
        and v.dtype.is_floating_point()


def _bias_add(node):
    """The Add right after a MatMul that adds a parameter (a Linear layer exported as MatMul + Add), if any."""
    uses = list(node.outputs[0].uses()) if node.outputs else []
    if len(uses) != 1:
        return None
    user = uses[0][0] if isinstance(uses[0], tuple) else uses[0].node
    if user.op_type == "Add" and any(_param(v) for v in user.inputs):
        return user
    return None


def parameter_layers(graph) -> list:
    """The nodes with parameters, in graph order (bottom-up)."""
    layers = []
    for node in graph:
        if node.op_type in LINEAR + NORMS and any(_param(v) for v in node.inputs[1:] if v is not None):
            layers.append(node)
        elif node.op_type == "MatMul" and _param(node.inputs[0]):
            layers.append(node)
    return layers


def _fan_in(node, index: int, shape: tuple) -> int:
    if node.op_type in ("Conv", "ConvTranspose"):
        return int(np.prod(shape[1:])) if len(shape) > 1 else 1
    if node.op_type == "Gemm":
        trans = node.attributes.get("transB")
        trans_b = bool(trans.value) if trans is not None else False
        if len(shape) == 2:
            return int(shape[1] if trans_b else shape[0])
        return 1
    return int(shape[-2] if index == 1 and len(shape) >= 2 else shape[-1])


def _redraw(node, rng) -> list[str]:
    """New values for the parameters of one layer; returns their names."""
    names = []
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    bound_shape = tuple(weight.const_value.shape) if _param(weight) else None
    for index, v in enumerate(node.inputs):
        if not _param(v) or (index == 0 and node.op_type != "MatMul"):
            continue
        old = v.const_value.numpy()
        if node.op_type in NORMS:
            new = np.full(old.shape, 0.0 if index in (2, 3) else 1.0)  # scale / var 1, bias / mean 0
        else:
            fan_in = _fan_in(node, index, tuple(old.shape) if index != 2 or bound_shape is None else bound_shape)
            bound = 1.0 / np.sqrt(max(fan_in, 1))
            new = rng.uniform(-bound, bound, size=old.shape)
        v.const_value = ir.tensor(new.astype(old.dtype), name=v.name)
        names.append(v.name)
    add = _bias_add(node) if node.op_type == "MatMul" else None
    if add is not None:
        fan_in = _fan_in(node, 1, bound_shape) if bound_shape else 1
        for v in add.inputs:
            if _param(v):
                old = v.const_value.numpy()
                bound = 1.0 / np.sqrt(max(fan_in, 1))
                v.const_value = ir.tensor(rng.uniform(-bound, bound, size=old.shape).astype(old.dtype), name=v.name)
                names.append(v.name)
    return names


def cascade(model, seed: int = 42, order: str = "top_down"):
    """Yield ``(layer name, ir.Model)``: the model with one more layer randomised each time (cascading), top-down
    (output first) or bottom-up. The same ir.Model object is edited further after each yield: build from it before
    asking for the next."""
    if order not in ("top_down", "bottom_up"):
        raise InputError(f"unknown layer order {order!r}; use top_down or bottom_up")
    ir_model = load.to_ir(load.read_proto(model), load.data_folder(model))
    layers = parameter_layers(ir_model.graph)
    if not layers:
        raise InputError("the model has no layers with parameters (Conv, Gemm, MatMul, normalisations with "
                         "initializer weights) to randomise")
    if order == "top_down":
        layers = layers[::-1]
    for i, node in enumerate(layers):
        _redraw(node, np.random.default_rng([seed, i]))
        yield node.name or node.op_type, ir_model
