"""Quantization as numbers: which ops quantize, the 8-bit types, the integer ranges, dequantizing a tensor and
checking its parameters, and the float tensor a DequantizeLinear(QuantizeLinear(x)) pair relays relevance to. Read by
the loader's deployed-form passes and by the relevance handlers of the quantization ops."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .graph import carries


QUANTIZERS = ("QuantizeLinear", "DynamicQuantizeLinear")
INT8 = (ir.DataType.UINT8, ir.DataType.INT8)  # the 8-bit types of quantized activations


def relay_sources(node: ir.Node) -> list:
    """For ``DequantizeLinear(QuantizeLinear(x))`` (or of ``DynamicQuantizeLinear(x)``) with ``x`` a float
    activation: ``[x]`` (relevance passes through the pair unchanged); ``[]`` for every other node."""
    if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx") or not node.inputs:
        return []
    q = node.inputs[0]
    p = q.producer() if q is not None else None
    if p is None or p.op_type not in QUANTIZERS or p.domain not in ("", "ai.onnx") or p.outputs[0] is not q:
        return []
    x = p.inputs[0]
    return [x] if carries(x) else []


def qparams_misfit(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int, block: int) -> str | None:
    """Why a (De)QuantizeLinear's scale / zero point do not fit its input (the checker lets them pass), or None."""
    if zp is not None and zp.size != scale.size or (zp is not None and scale.size > 1 and zp.shape != scale.shape):
        return f"zero point of shape {list(zp.shape)} for a scale of shape {list(scale.shape)}"
    if scale.size == 1:
        return None
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        return f"axis {axis} for an input of rank {x.ndim}"
    axis %= x.ndim
    if block:
        want = list(x.shape)
        want[axis] = -(-x.shape[axis] // block)
        return None if list(scale.shape) == want else f"blocked scale of shape {list(scale.shape)} (want {want})"
    if scale.ndim != 1 or scale.size != x.shape[axis]:
        return f"scale of shape {list(scale.shape)} for {x.shape[axis]} entries along axis {axis}"
    return None


def dequantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int, block: int) -> np.ndarray:
    xf = x.astype(np.float32)
    zf = np.zeros((), np.float32) if zp is None else zp.astype(np.float32)
    s = scale.astype(np.float32)
    if s.ndim == 0 or s.size == 1:
        return ((xf - zf.reshape(())) * s.reshape(())).astype(np.float32) if zf.size == 1 else \
            ((xf - zf) * s.reshape(())).astype(np.float32)
    axis = axis % x.ndim
    if block:  # blocked quantization (opset 21): scale has x's shape with axis divided into blocks
        s = np.repeat(s, block, axis=axis)[tuple(slice(0, n) for n in x.shape)]
        zf = np.repeat(zf, block, axis=axis)[tuple(slice(0, n) for n in x.shape)] if zf.ndim else zf
        return ((xf - zf) * s).astype(np.float32)
    shape = [1] * x.ndim
    shape[axis] = -1
    return ((xf - (zf.reshape(shape) if zf.ndim else zf)) * s.reshape(shape)).astype(np.float32)


QRANGE = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127), np.dtype(np.uint16): (0, 65535),
           np.dtype(np.int16): (-32768, 32767), np.dtype(np.int32): (-2 ** 31, 2 ** 31 - 1)}


__all__ = ["QUANTIZERS", "INT8", "QRANGE", "relay_sources", "qparams_misfit", "dequantize"]
