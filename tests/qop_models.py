"""Small float models (onnx.helper) and their static quantization by onnxruntime in both formats, for
tests/load/test_deployed.py: QuantFormat.QOperator (QLinearConv, QGemm, QLinearAdd, ...) and QuantFormat.QDQ from the
same float model and the same calibration data."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

logging.getLogger().setLevel(logging.ERROR)  # quantize_static's pre-processing advice


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "t", inputs, outputs,
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def cnn(seed: int = 0, pool: str = "GlobalAveragePool") -> onnx.ModelProto:
    """Conv+bias -> Relu -> MaxPool -> Conv -> Relu -> Add (residual) -> pool -> Flatten -> Gemm."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.4).astype(np.float32)
    w2 = (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32)
    k = 8 if pool == "GlobalAveragePool" else 8 * 2 * 2
    w3 = (rng.standard_normal((5, k)) * 0.3).astype(np.float32)
    inits = dict(w1=w1, b1=(rng.standard_normal(8) * 0.1).astype(np.float32), w2=w2,
                 b2=(rng.standard_normal(8) * 0.1).astype(np.float32), w3=w3,
                 b3=(rng.standard_normal(5) * 0.1).astype(np.float32))
    pool_node = (helper.make_node("GlobalAveragePool", ["s"], ["p"]) if pool == "GlobalAveragePool" else
                 helper.make_node("AveragePool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2]))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["m", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Add", ["m", "r2"], ["s"]),
             pool_node,
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)


def attention(seed: int = 0, d: int = 8) -> onnx.ModelProto:
    """One self-attention head with a residual and an MLP: MatMul, Transpose, Softmax, MatMul of two activations,
    Add residual, Relu MLP, ReduceMean over tokens, MatMul head."""
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)  # noqa: E731
    inits = dict(wq=w(d, d) / np.float32(np.sqrt(d)), wk=w(d, d), wv=w(d, d), w1=w(d, 2 * d), w2=w(2 * d, d),
                 wo=w(d, 3))
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]),
             helper.make_node("MatMul", ["x", "wk"], ["k"]), helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["a1"]),
             helper.make_node("Softmax", ["a1"], ["a"], axis=-1), helper.make_node("MatMul", ["a", "v"], ["o"]),
             helper.make_node("Add", ["x", "o"], ["h"]),
             helper.make_node("MatMul", ["h", "w1"], ["m0"]), helper.make_node("Relu", ["m0"], ["m1"]),
             helper.make_node("MatMul", ["m1", "w2"], ["m2"]), helper.make_node("Add", ["h", "m2"], ["h2"]),
             helper.make_node("ReduceMean", ["h2"], ["pooled"], axes=[1], keepdims=0),
             helper.make_node("MatMul", ["pooled", "wo"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, d])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], inits)


def quantize(model: onnx.ModelProto, calib: np.ndarray, out_dir: Path, name: str, **kw) -> dict[str, Path]:
    """The float model and its QOperator and QDQ quantizations (same calibration batch, same options)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": calib}])

        def get_next(self):
            return next(self.it, None)

    paths = {"float": out_dir / f"{name}.onnx"}
    onnx.save(model, str(paths["float"]))
    for fmt in ("QOperator", "QDQ"):
        paths[fmt] = out_dir / f"{name}.{fmt}.onnx"
        quantize_static(str(paths["float"]), str(paths[fmt]), Reader(), quant_format=getattr(QuantFormat, fmt), **kw)
    return paths
