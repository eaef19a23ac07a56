"""onnxruntime's fused layers and activations split into standard ops: FusedConv / FusedGemm (+ activation),
FusedMatMul (transposes, alpha), the GELU family (Gelu, BiasGelu, FastGelu, QuickGelu) and the diffusion models'
BiasAdd and BiasSplitGelu."""
from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from ...builder import Builder, attr, const
from .split_tools import Refuse, RefuseAs, i64, rank


# activations a fused op may name, and how to build them (standard ONNX ops, all handled by the rules)
_ACTIVATIONS = {"Relu", "Tanh", "Sigmoid", "LeakyRelu", "HardSigmoid", "Clip", "Elu", "Selu", "ThresholdedRelu",
                "Softplus", "Softsign", "HardSwish"}


def _activation(b: Builder, y: ir.Value, name: str, params: list, like: ir.Value) -> ir.Value:
    p = list(params) + [None] * 3
    if name in ("Relu", "Tanh", "Sigmoid", "Softsign", "HardSwish", "Softplus"):
        return b.op(name, [y], like=like)
    if name == "LeakyRelu":
        return b.op(name, [y], like=like, alpha=float(p[0] if p[0] is not None else 0.01))
    if name == "Elu":
        return b.op(name, [y], like=like, alpha=float(p[0] if p[0] is not None else 1.0))
    if name == "ThresholdedRelu":
        return b.op(name, [y], like=like, alpha=float(p[0] if p[0] is not None else 1.0))
    if name == "HardSigmoid":
        return b.op(name, [y], like=like, alpha=float(p[0] if p[0] is not None else 0.2),
                    beta=float(p[1] if p[1] is not None else 0.5))
    if name == "Selu":
        return b.op(name, [y], like=like, alpha=float(p[0] if p[0] is not None else 1.67326319217681884765625),
                    gamma=float(p[1] if p[1] is not None else 1.05070102214813232421875))
    if name == "Clip":
        lo = -np.inf if p[0] is None else p[0]
        hi = np.inf if p[1] is None else p[1]
        return b.op("Clip", [y, b.const(np.array(lo, np.float32), "min"), b.const(np.array(hi, np.float32), "max")],
                    like=like)
    raise KeyError(name)


def _gelu_erf(b: Builder, x: ir.Value, like: ir.Value) -> ir.Value:
    """x * 0.5 * (1 + erf(x / sqrt 2)): one self-product the pattern matcher recognises (gelu-erf)."""
    h = b.op("Div", [x, b.const(np.array(math.sqrt(2.0), np.float32), "sqrt2")], like=like)
    e = b.op("Erf", [h], like=like)
    p = b.op("Add", [e, b.const(np.array(1.0, np.float32), "one")], like=like)
    half = b.op("Mul", [p, b.const(np.array(0.5, np.float32), "half")], like=like)
    return b.op("Mul", [x, half], like=like)


def _gelu_tanh(b: Builder, x: ir.Value, like: ir.Value) -> ir.Value:
    cube = b.op("Pow", [x, b.const(np.array(3.0, np.float32), "three")], like=like)
    inner = b.op("Add", [x, b.op("Mul", [cube, b.const(np.array(0.044715, np.float32), "c")], like=like)],
                 like=like)
    t = b.op("Tanh", [b.op("Mul", [inner, b.const(np.array(math.sqrt(2 / math.pi), np.float32), "k")], like=like)],
             like=like)
    half = b.op("Mul", [b.op("Add", [t, b.const(np.array(1.0, np.float32), "one")], like=like),
                        b.const(np.array(0.5, np.float32), "half")], like=like)
    return b.op("Mul", [x, half], like=like)


_CONV_KEYS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _fused_activation(node) -> str:
    act = attr(node, "activation", "")
    act = act.decode() if isinstance(act, bytes) else act
    if act and act not in _ACTIVATIONS:
        raise RefuseAs(f"fused activation {act} has no standard ONNX op")
    return act


def fused_conv(b, node) -> ir.Value:
    """FusedConv: Conv (+ the residual Z) + activation."""
    out, act = node.outputs[0], _fused_activation(node)
    params = list(attr(node, "activation_params", []) or [])
    attrs = {k: node.attributes[k].value for k in _CONV_KEYS if k in node.attributes}
    y = b.op("Conv", list(node.inputs[:3]), like=out, tag="conv", **attrs)
    if len(node.inputs) > 3 and node.inputs[3] is not None:  # Z: the fused residual sum
        y = b.op("Add", [y, node.inputs[3]], like=out, tag="sum")
    return _activation(b, y, act, params, out) if act else y


def fused_gemm(b, node) -> ir.Value:
    """FusedGemm: Gemm + activation."""
    out, act = node.outputs[0], _fused_activation(node)
    params = [attr(node, "activation_alpha"), attr(node, "activation_beta"), attr(node, "activation_gamma")]
    if act == "Selu":
        params = [params[0], params[2]]
    attrs = {k: node.attributes[k].value for k in ("alpha", "beta", "transA", "transB") if k in node.attributes}
    y = b.op("Gemm", list(node.inputs), like=out, tag="gemm", **attrs)
    return _activation(b, y, act, params, out) if act else y


def fused_matmul(b, node) -> ir.Value:
    """FusedMatMul: Transpose (or a transposed constant) + MatMul (* alpha)."""
    out = node.outputs[0]
    if attr(node, "transBatchA", 0) or attr(node, "transBatchB", 0):
        raise RefuseAs("FusedMatMul with transBatchA/transBatchB")
    xs = []
    for v, key in zip(node.inputs[:2], ("transA", "transB")):
        if attr(node, key, 0):
            c = const(v)
            if c is not None:
                v = b.const(np.swapaxes(c, -1, -2).copy(), "weight_t")
            elif v.shape is None:
                raise Refuse("an input of unknown rank")
            else:
                r = len(v.shape)
                v = b.op("Transpose", [v], perm=list(range(r - 2)) + [r - 1, r - 2], tag="t")
        xs.append(v)
    alpha = float(attr(node, "alpha", 1.0))
    if alpha != 1.0 and const(xs[1]) is not None:
        xs[1] = b.const((const(xs[1]) * alpha).astype(const(xs[1]).dtype), "weight_scaled")
        alpha = 1.0
    y = b.op("MatMul", xs, like=out, tag="matmul")
    if alpha != 1.0:
        y = b.op("Mul", [y, b.const(np.array(alpha, np.float32), "alpha")], like=out)
    return y


def gelu(b, node) -> ir.Value:
    """Gelu, BiasGelu (+ bias), FastGelu (the tanh form), QuickGelu (x * sigmoid(alpha x))."""
    t, out = node.op_type, node.outputs[0]
    x = node.inputs[0]
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        x = b.op("Add", [x, node.inputs[1]], like=out, tag="bias")
    if t == "QuickGelu":
        alpha = float(attr(node, "alpha", 1.702))
        s = b.op("Sigmoid", [b.op("Mul", [x, b.const(np.array(alpha, np.float32), "alpha")], like=out)], like=out)
        return b.op("Mul", [x, s], like=out)
    return _gelu_tanh(b, x, out) if t == "FastGelu" else _gelu_erf(b, x, out)


def bias_add(b, node) -> ir.Value:
    """BiasAdd (diffusion models): ``x + bias + skip``."""
    x, bias, skip = node.inputs[:3]
    y = b.op("Add", [x, bias], like=x, tag="bias")
    return b.op("Add", [y, skip], like=x, tag="skip_sum")


def bias_split_gelu(b, node) -> ir.Value:
    """BiasSplitGelu (diffusion models' GEGLU): ``left * gelu(right)`` of the halves of ``x + bias`` (last axis)."""
    x, bias = node.inputs[:2]
    width = x.shape[-1] if rank(x) else None
    if not isinstance(width, int) or width % 2:
        raise Refuse(f"an input of last dimension {width} (want a known even size)")
    h = b.op("Add", [x, bias], like=x, tag="bias")
    left = b.op("Slice", [h, i64(b, [0], "s0"), i64(b, [width // 2], "e0"), i64(b, [-1], "ax")], tag="left")
    right = b.op("Slice", [h, i64(b, [width // 2], "s1"), i64(b, [width], "e1"), i64(b, [-1], "ax")], tag="right")
    return b.op("Mul", [left, _gelu_erf(b, right, node.outputs[0])], like=node.outputs[0], tag="geglu")
