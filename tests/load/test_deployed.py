"""Deployed model forms (onnx_lrp/load/passes/): QDQ / dynamic quantization, float16, onnxruntime-optimised graphs.

References: numpy oracles of the epsilon rule on fake-quantized activations (QDQ pairs pass relevance unchanged),
onnxruntime's own forward pass of the deployed model, and the relevance of the equivalent float32 model.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
import qop_models
from onnx_lrp import load as loader
from onnx_lrp.core.errors import UnsupportedError
from util import ROOT, assert_close

DEMO = ROOT / "models" / "digits_cnn.onnx"
SAMPLES = ROOT / "models" / "samples" / "batch.npy"
logging.getLogger().setLevel(logging.ERROR)  # quantize_static's pre-processing advice


def _builder():
    spec = importlib.util.spec_from_file_location("build_deployed_variants", ROOT / "models" /
                                                  "build_deployed_variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def variants(tmp_path_factory):
    if not DEMO.exists():
        pytest.skip("models/digits_cnn.onnx is missing (python models/build_digits.py)")
    return _builder().build_all(tmp_path_factory.mktemp("deployed"))


# onnxruntime's int8 kernels compute differently per CPU: on x86 without VNNI (AVX2; AVX-512 without VNNI) its u8s8
# kernels add pairs of 8-bit products in 16-bit registers that saturate at 32767, with VNNI (and on ARM) they are exact.
# A test never asserts what one ISA computes: it compares the explained forward (``res.forward``, the float path)
# with onnxruntime's exact paths, which every CPU computes alike (EXACT_INT8: int8 products summed exactly, the
# session option that switches x86's u8s8 kernels to u8u8; AS_WRITTEN: Q/DQ pairs run as written, not fused), and
# ``res.outputs`` (the deployed model's, as onnxruntime runs the file on this machine) with a plain session.
EXACT_INT8 = {"session.x64quantprecision": "1"}
AS_WRITTEN = {"session.disable_quant_qdq": "1"}


def _ort(path_or_bytes, feeds, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL, config=None):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    data = str(path_or_bytes) if isinstance(path_or_bytes, Path) else path_or_bytes
    try:
        return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    except ort.capi.onnxruntime_pybind11_state.NotImplemented:
        if config is not EXACT_INT8:
            raise
        # com.microsoft QGemm has no kernel for the u8 weights EXACT_INT8 converts its s8 weights to (seen on this
        # VNNI CPU): the plain session; the QGemm tests hold on the AVX2 path too (run under qemu -cpu Haswell)
        return _ort(path_or_bytes, feeds, level)


_model = qop_models._model  # an onnx.helper model, ir_version 10


def _fake_quant(x, scale, zp, lo=0, hi=255):
    return (np.clip(np.round(x / scale) + zp, lo, hi) - zp) * scale


# ---------------------------------------------------------------------------------------------- QDQ
def test_qdq_pairs_pass_relevance_unchanged_numpy_oracle():
    """x -> Q/DQ -> Gemm(W1) -> Relu -> Q/DQ -> Gemm(W2): LRP-epsilon (eps -> 0) from a numpy oracle on the
    fake-quantized activations, with relevance passing each Q/DQ pair unchanged."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((6, 5)).astype(np.float32)
    w2 = rng.standard_normal((5, 3)).astype(np.float32)
    sx, zx, sh, zh = np.float32(0.02), np.uint8(128), np.float32(0.05), np.uint8(0)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("MatMul", ["xd", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("QuantizeLinear", ["hr", "sh", "zh"], ["hq"]),
             helper.make_node("DequantizeLinear", ["hq", "sh", "zh"], ["hd"]),
             helper.make_node("MatMul", ["hd", "w2"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
               dict(w1=w1, w2=w2, sx=sx, zx=zx, sh=sh, zh=zh))
    x = rng.uniform(-1, 1, (4, 6)).astype(np.float32)
    ex = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=1e-9)
    res = ex.explain(x, target=[0, 1, 2, 0])
    # forward: the quantized one, exactly as onnxruntime runs the graph as written; outputs: the deployed model's
    np.testing.assert_array_equal(res.forward["y"], _ort(m.SerializeToString(), {"x": x}, config=AS_WRITTEN)[0])
    np.testing.assert_array_equal(res.outputs["y"], _ort(m.SerializeToString(), {"x": x})[0])
    # oracle: LRP-0 on the fake-quantized activations, relevance unchanged across each Q/DQ pair
    xd = _fake_quant(x.astype(np.float64), sx, 128)
    h = xd @ w1
    hd = _fake_quant(np.maximum(h, 0), sh, 0)
    for i, t in enumerate(res.target):
        r_h = hd[i] * w2[:, t]                             # layer 2: R_j = a_j w_jt (y_t = z_t)
        r_x = xd[i] * (w1 @ np.where(h[i] != 0, r_h / h[i], 0))  # relu passes, layer 1: a_i w_ij R_j / z_j
        assert_close(res.relevance[i], r_x, rtol=1e-4, atol=1e-5)


def test_qdq_demo_weights_folded_forward_quantized(variants):
    m = loader.load(variants["qdq"])
    dq = [n for n in m.graph if n.op_type == "DequantizeLinear"]
    assert dq, "activation Q/DQ pairs stay in the forward graph"
    assert all(n.inputs[0].const_value is None for n in dq), "every DequantizeLinear of a constant is folded"
    for n in m.graph:
        if n.op_type in ("Conv", "Gemm"):
            assert n.inputs[1].const_value is not None and n.inputs[1].dtype == onnx_lrp.lrp.ops.base.ir.DataType.FLOAT
    x = np.load(SAMPLES)
    ex = onnx_lrp.Explainer(variants["qdq"], composite="epsilon-plus-flat")
    res = ex.explain(x)
    # the explained forward is the quantized one as written, exactly (every CPU: float kernels on both sides)
    np.testing.assert_array_equal(res.forward["logits"], _ort(variants["qdq"], {"image": x}, config=AS_WRITTEN)[0])
    # the outputs are the deployed model's, as onnxruntime's int8 kernels compute them on this CPU (they saturate on
    # AVX2: up to 1.0, 5 steps, on the demo batch; docs/ci-regression.md)
    np.testing.assert_array_equal(res.outputs["logits"], _ort(variants["qdq"], {"image": x})[0])
    assert res.deployed_gap is not None and res.deployed_gap.step > 0
    assert res.deployed_gap.beyond == (np.abs(res.outputs["logits"] - res.forward["logits"]).max() > 1.001 *
                                       res.deployed_gap.step)
    assert np.all(np.isfinite(res.relevance))


def test_qdq_pair_relevance_is_identity(variants):
    """relevance at the float tensor a QuantizeLinear reads equals the relevance at its DequantizeLinear's output."""
    x = np.load(SAMPLES)[:4]
    m = loader.load(variants["qdq"])
    pairs = [n for n in m.graph if n.op_type == "DequantizeLinear" and n.inputs[0].producer() is not None
             and n.inputs[0].producer().inputs[0].producer() is not None]
    assert len(pairs) >= 3
    names = []
    for pair in pairs[:3]:
        names += [pair.inputs[0].producer().inputs[0].name, pair.outputs[0].name]
    ex = onnx_lrp.Explainer(variants["qdq"], composite="epsilon-plus-flat", relevance_at=tuple(names))
    res = ex.explain(x)
    for q_in, dq_out in zip(names[::2], names[1::2]):
        r_in, r_out = res.relevance_at[q_in], res.relevance_at[dq_out]
        assert np.abs(r_out).sum() > 0
        assert_close(r_in, r_out, rtol=1e-6, atol=1e-7)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _step(path, out="y"):
    """The quantization step of the model's output (the scale of the DequantizeLinear that writes it)."""
    m = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == out)
    return float(inits[dq.input[1]])


_SOFTMAX_OUT = {"TensorQuantOverrides": {"a": [{"scale": np.array(1 / 256, np.float32),
                                                "zero_point": np.array(-128, np.int8)}]}}


@pytest.mark.parametrize("kind,per_channel", [("cnn", False), ("cnn", True), ("attention", False)])
def test_qoperator_equals_qdq_and_onnxruntime(tmp_path, kind, per_channel):
    """The same float model, calibration batch and options quantized by onnxruntime in the QOperator format
    (QLinearConv, QGemm, QLinearAdd, QLinearGlobalAveragePool, QLinearMatMul, QLinearSoftmax, 8-bit MaxPool /
    Flatten / Transpose) and in the QDQ format: after the rewrite both give the same relevance, and the forward pass
    is onnxruntime's on the QOperator model (within one output quantization step; exact on the CPUs measured)."""
    rng = np.random.default_rng(5)
    shape = (3, 8, 8) if kind == "cnn" else (4, 8)
    model = qop_models.cnn() if kind == "cnn" else qop_models.attention()
    extra = {} if kind == "cnn" else dict(extra_options=_SOFTMAX_OUT)  # QLinearSoftmax's fixed 1/256 output scale
    paths = qop_models.quantize(model, rng.standard_normal((16,) + shape).astype(np.float32), tmp_path, kind,
                                per_channel=per_channel, **extra)
    ops = {n.op_type for n in onnx.load(str(paths["QOperator"])).graph.node}
    want = {"QLinearConv", "QGemm", "QLinearAdd", "QLinearGlobalAveragePool", "MaxPool"} if kind == "cnn" else {
        "QLinearMatMul", "QLinearSoftmax", "QLinearAdd", "Transpose"}
    assert want <= ops, ops
    assert not {n.op_type for n in loader.load(paths["QOperator"]).graph} & {"QLinearConv", "QLinearMatMul", "QGemm"}
    x = rng.standard_normal((4,) + shape).astype(np.float32)
    comps = ("epsilon-plus-flat", "epsilon") if kind == "cnn" else ("attnlrp",)
    for comp in comps:
        res = {f: onnx_lrp.Explainer(p, composite=comp).explain(x, target=[0, 1, 2, 0]) for f, p in paths.items()}
        y = res["QOperator"].forward["y"]
        ref = _ort(paths["QOperator"], {"x": x}, config=EXACT_INT8)[0]  # exact int8 sums: every CPU alike
        assert np.abs(y - ref).max() <= 1.001 * _step(paths["QOperator"])  # requantization rounds ties apart
        np.testing.assert_array_equal(y, res["QDQ"].forward["y"])
        np.testing.assert_array_equal(res["QOperator"].outputs["y"], _ort(paths["QOperator"], {"x": x})[0])
        assert np.all(np.isfinite(res["QOperator"].relevance))
        assert _rel(res["QOperator"].relevance, res["QDQ"].relevance) <= 1e-5
        # the quantized model's explanation is near the float model's, not equal to it
        assert 1e-4 < _rel(res["QOperator"].relevance, res["float"].relevance) < 1.0


def test_qoperator_mlp_numpy_oracle(tmp_path):
    """QGemm -> (Relu folded into the output range) -> QGemm, per-channel int8: LRP-0 (epsilon -> 0) from a numpy
    oracle built from the QOperator file's integers: weights (Wq - zp) * w_scale, int32 bias C * x_scale * w_scale,
    fake-quantized activations, relevance passing each quantize/dequantize unchanged."""
    rng = np.random.default_rng(10)
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                   dict(w1=rng.standard_normal((5, 6)).astype(np.float32),
                        b1=(rng.standard_normal(5) * 0.3).astype(np.float32),
                        w2=rng.standard_normal((3, 5)).astype(np.float32),
                        b2=(rng.standard_normal(3) * 0.3).astype(np.float32)))
    paths = qop_models.quantize(model, rng.standard_normal((32, 6)).astype(np.float32), tmp_path, "mlp",
                                per_channel=True)
    q = onnx.load(str(paths["QOperator"]))
    assert [n.op_type for n in q.graph.node] == ["QuantizeLinear", "QGemm", "QGemm", "DequantizeLinear"]
    c = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in q.graph.initializer}
    x = rng.standard_normal((4, 6)).astype(np.float32)
    res = onnx_lrp.Explainer(paths["QOperator"], composite="epsilon", epsilon=1e-9).explain(x, target=[0, 1, 2, 0])
    np.testing.assert_array_equal(res.outputs["y"], _ort(paths["QOperator"], {"x": x})[0])

    def fq(v, name):  # int8 fake quantization with the file's activation scale and zero point
        s, z = c[f"{name}_scale"], c[f"{name}_zero_point"]
        return (np.clip(np.round(v / s) + z, -128, 127) - z) * s

    def layer(k, a, a_name):
        w = (c[f"w{k}_quantized"] - c[f"w{k}_zero_point"][:, None]) * c[f"w{k}_scale"][:, None]
        return w, a @ w.T + c[f"b{k}_quantized"] * c[f"{a_name}_scale"] * c[f"w{k}_scale"]

    xd = fq(x.astype(np.float64), "x")
    w1, h = layer(1, xd, "x")
    hd = fq(h, "h")
    w2, z2 = layer(2, hd, "h")
    y = fq(z2, "y")
    assert_close(res.outputs["y"], y, rtol=1e-6, atol=1e-6)
    for i, t in enumerate(res.target):
        r_h = hd[i] * w2[t] / z2[i, t] * y[i, t]               # start at the output value; Q/DQ pass it unchanged
        r_x = xd[i] * (w1.T @ np.where(h[i] != 0, r_h / h[i], 0))
        assert_close(res.relevance[i], r_x, rtol=1e-4, atol=1e-6)


def test_qoperator_quantized_embedding_table(tmp_path):
    """QOperator Gather of an int8 embedding table at token ids -> QLinearMatMul -> ReduceMean: the table is
    dequantized (scale from the DequantizeLinear that reads the Gather), relevance per token from the numpy oracle
    R_i = (e_i . W[:, t]) / z_it * hq_it / T with e, W, hq from the file's integers (epsilon -> 0)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    rng = np.random.default_rng(11)
    nodes = [helper.make_node("Gather", ["table", "x"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["y"], axes=[1], keepdims=0)]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.INT64, ["N", 5])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
               dict(table=rng.standard_normal((10, 8)).astype(np.float32),
                    w=rng.standard_normal((8, 3)).astype(np.float32)))
    ids = rng.integers(0, 10, (16, 5)).astype(np.int64)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": ids}])

        def get_next(self):
            return next(self.it, None)

    src, dst = tmp_path / "emb.onnx", tmp_path / "emb.qop.onnx"
    onnx.save(m, str(src))
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QOperator)
    q = onnx.load(str(dst))
    assert [n.op_type for n in q.graph.node][:2] == ["Gather", "QLinearMatMul"]
    c = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in q.graph.initializer}
    x = ids[:3]
    res = onnx_lrp.Explainer(dst, composite="epsilon", epsilon=1e-9).explain(x, target=1)
    np.testing.assert_array_equal(res.outputs["y"], _ort(dst, {"x": x})[0])
    e = (c["table_quantized"] - c["table_zero_point"]) * c["table_scale"]
    w = (c["w_quantized"] - c["w_zero_point"]) * c["w_scale"]
    z = e[x] @ w
    hq = (np.clip(np.round(z / c["h_scale"]) + c["h_zero_point"], -128, 127) - c["h_zero_point"]) * c["h_scale"]
    oracle = (e[x] @ w[:, 1]) / z[..., 1] * hq[..., 1] / 5
    assert_close(res.relevance, oracle, rtol=1e-4, atol=1e-6)


def test_qdq_contrib_domain_ops(tmp_path):
    """quantize_static(..., UseQDQContribOps=True) writes com.microsoft QuantizeLinear / DequantizeLinear: read as
    the onnx ops, the model's relevance and outputs equal those of the same quantization with the onnx ops, and the
    outputs are onnxruntime's."""
    rng = np.random.default_rng(15)
    calib = rng.standard_normal((16, 3, 8, 8)).astype(np.float32)
    std = qop_models.quantize(qop_models.cnn(), calib, tmp_path, "std")["QDQ"]
    contrib = qop_models.quantize(qop_models.cnn(), calib, tmp_path, "ms",
                                  extra_options={"UseQDQContribOps": True})["QDQ"]
    assert {n.domain for n in onnx.load(str(contrib)).graph.node if n.op_type == "DequantizeLinear"} == {
        "com.microsoft"}
    x = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
    a = onnx_lrp.Explainer(std).explain(x)
    b = onnx_lrp.Explainer(contrib).explain(x, target=a.target)
    np.testing.assert_array_equal(b.forward["y"], _ort(contrib, {"x": x}, config=AS_WRITTEN)[0])
    np.testing.assert_array_equal(b.forward["y"], a.forward["y"])
    np.testing.assert_array_equal(b.outputs["y"], _ort(contrib, {"x": x})[0])
    assert _rel(b.relevance, a.relevance) <= 1e-6


def test_qoperator_ops_match_onnxruntime(tmp_path):
    """QLinearAveragePool, QLinearConcat, QLinearSigmoid, QLinearLeakyRelu, QLinearMul, 8-bit Pad / Reshape /
    Slice: the rewritten forward equals onnxruntime's on the QOperator model within one quantization step, and the
    relevance is finite and reaches the input."""
    rng = np.random.default_rng(6)
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("LeakyRelu", ["c"], ["l"], alpha=0.1),
             helper.make_node("Mul", ["s", "l"], ["m"]), helper.make_node("Concat", ["m", "c"], ["k"], axis=1),
             helper.make_node("Pad", ["k", "pads"], ["pd"]),
             helper.make_node("AveragePool", ["pd"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "shape"], ["f"]), helper.make_node("Gemm", ["f", "w2"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                   dict(w=w, pads=np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), shape=np.array([-1, 72], np.int64),
                        w2=(rng.standard_normal((72, 3)) * 0.2).astype(np.float32)))
    paths = qop_models.quantize(model, rng.standard_normal((16, 3, 6, 6)).astype(np.float32), tmp_path, "ops",
                                op_types_to_quantize=["Conv", "Sigmoid", "LeakyRelu", "Mul", "Concat", "Pad",
                                                      "AveragePool", "Reshape", "Gemm"])
    ops = {n.op_type for n in onnx.load(str(paths["QOperator"])).graph.node}
    assert {"QLinearAveragePool", "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearMul", "Pad",
            "Reshape"} <= ops, ops
    x = rng.standard_normal((5, 3, 6, 6)).astype(np.float32)
    res = onnx_lrp.Explainer(paths["QOperator"], composite="attnlrp").explain(x, target=1)  # Mul of two activations
    ref = _ort(paths["QOperator"], {"x": x}, config=EXACT_INT8)[0]  # exact int8 sums: every CPU alike
    assert np.abs(res.forward["y"] - ref).max() <= 1.001 * _step(paths["QOperator"])
    assert np.all(np.isfinite(res.relevance)) and np.abs(res.relevance).sum() > 0


@pytest.mark.parametrize("float_out", [False, True])
def test_qgemm_alpha_bias_and_float_output(float_out):
    """QGemm with alpha != 1, an int32 bias C (added before the output scale alpha * a_scale * b_scale), per-column
    weight scales, and without y_scale (float output): the rewritten forward equals onnxruntime's kernel."""
    rng = np.random.default_rng(14)
    ms = "com.microsoft"
    ins = ["xq", "sx", "zx", "wq", "sw", "zw", "c"] + ([] if float_out else ["sy", "zy"])
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("QGemm", ins, ["yq" if not float_out else "y"], domain=ms, alpha=0.5, transB=1)]
    if not float_out:
        nodes.append(helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"]))
    inits = dict(sx=np.array(0.02, np.float32), zx=np.array(7, np.uint8),
                 wq=rng.integers(-127, 128, (4, 6)).astype(np.int8), sw=np.array([0.01, 0.02, 0.03, 0.015], np.float32),
                 zw=np.zeros(4, np.int8), c=rng.integers(-2000, 2000, 4).astype(np.int32),
                 sy=np.array(0.01, np.float32), zy=np.array(128, np.uint8))
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)])
    m.ir_version = 10
    x = rng.uniform(-1, 1, (3, 6)).astype(np.float32)
    res = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon").explain(x, target=1)
    ref = _ort(m.SerializeToString(), {"x": x}, config=EXACT_INT8)[0]
    np.testing.assert_allclose(res.forward["y"], ref, rtol=1e-5, atol=1e-6 if float_out else 1.001 * 0.01)
    assert np.all(np.isfinite(res.relevance)) and np.abs(res.relevance).sum() > 0


@pytest.mark.parametrize("opset", [17, 18])
def test_qlinear_where_and_reduce_mean(opset):
    """QLinearWhere (onnxruntime's kernel as reference) and QLinearReduceMean (no CPU kernel in onnxruntime: the
    numpy formula of the contrib-op spec, mean of the dequantized input requantized), opset 17 (axes attribute) and
    18 (axes input)."""
    rng = np.random.default_rng(13)
    ms = "com.microsoft"
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("Greater", ["x", "zero"], ["c"]),
             helper.make_node("QLinearWhere", ["c", "xq", "s", "z", "kq", "s2", "z2", "s", "z"], ["wq"], domain=ms),
             helper.make_node("QLinearReduceMean", ["wq", "s", "z", "s2", "z2"], ["rq"], domain=ms, axes=[1],
                              keepdims=0),
             helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["w"]),
             helper.make_node("DequantizeLinear", ["rq", "s2", "z2"], ["y"])]
    inits = dict(s=np.array(0.05, np.float32), z=np.array(128, np.uint8), s2=np.array(0.03, np.float32),
                 z2=np.array(120, np.uint8), zero=np.array(0, np.float32),
                 kq=rng.integers(0, 256, (3, 5, 4)).astype(np.uint8))
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 5, 4])],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(ms, 1)])
    m.ir_version = 10
    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    with pytest.warns(onnx_lrp.LrpWarning, match="cannot run the deployed model as written.*QLinearReduceMean"):
        ex = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", output="y")
    res = ex.explain(x, target=1)
    assert res.outputs is res.forward and res.deployed_gap is None  # nothing deployed to compare with
    where_only = onnx.helper.make_model(helper.make_graph(
        nodes[:3] + [nodes[4]], "w", g.input, [g.output[1]], initializer=g.initializer),
        opset_imports=m.opset_import, ir_version=10)
    w_ref = _ort(where_only.SerializeToString(), {"x": x})[0]
    np.testing.assert_array_equal(res.outputs["w"], w_ref)
    y_ref = (np.clip(np.round(w_ref.mean(axis=1) / np.float32(0.03)) + 120, 0, 255) - 120) * np.float32(0.03)
    assert_close(res.outputs["y"], y_ref, rtol=0, atol=1e-6)
    # relevance reaches x only where the condition took x (the other branch is a constant)
    assert np.all(res.relevance[x <= 0] == 0) and np.abs(res.relevance[x > 0]).sum() > 0


def test_qoperator_unsupported_forms_listed_at_once(tmp_path):
    """QLinearAveragePool with channels_last=1 and a QAttention: one error naming both."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("QLinearAveragePool", ["xq", "s", "z", "s", "z"], ["pq"], domain="com.microsoft",
                              kernel_shape=[2, 2], channels_last=1),
             helper.make_node("QAttention", ["pq"], ["aq"], domain="com.microsoft", num_heads=1),
             helper.make_node("DequantizeLinear", ["aq", "s", "z"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 2])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])],
                         initializer=[numpy_helper.from_array(np.array(0.1, np.float32), "s"),
                                      numpy_helper.from_array(np.array(0, np.uint8), "z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    with pytest.raises(UnsupportedError) as e:
        onnx_lrp.Explainer(m.SerializeToString())
    msg = str(e.value)
    assert "channels_last" in msg and "QAttention" in msg and "\n" not in msg


# ---------------------------------------------------------------------------------------------- dynamic
def test_dynamic_quantization_numpy_oracle(tmp_path):
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Add", ["z", "b"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], dict(w=w, b=b))
    src, dst = tmp_path / "f.onnx", tmp_path / "d.onnx"
    onnx.save(m, str(src))
    quantize_dynamic(str(src), str(dst))
    assert {n.op_type for n in onnx.load(str(dst)).graph.node} >= {"DynamicQuantizeLinear", "MatMulInteger"}
    x = rng.uniform(-1, 2, (1, 8)).astype(np.float32)  # batch of one: the activation range is the item's own
    ex = onnx_lrp.Explainer(dst, composite="epsilon", epsilon=1e-9)
    res = ex.explain(x, target=2)
    ref = _ort(dst, {"x": x}, config=EXACT_INT8)[0]
    assert_close(res.forward["y"], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(res.outputs["y"], _ort(dst, {"x": x})[0])
    # oracle: DynamicQuantizeLinear's uint8 fake-quant of x, weights dequantized from the file's int8 values
    lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
    scale = np.float32((hi - lo) / 255)
    zp = np.clip(np.round(-lo / scale), 0, 255)
    xd = _fake_quant(x.astype(np.float64), scale, zp)
    q = onnx.load(str(dst))
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    wq = next(v for k, v in inits.items() if v.dtype in (np.int8, np.uint8) and v.shape == (8, 4))
    wname = next(k for k, v in inits.items() if v is wq)
    ws = inits[wname.replace("_quantized", "_scale")]
    wzp = inits[wname.replace("_quantized", "_zero_point")]
    wd = (wq.astype(np.float64) - wzp) * ws
    assert_close(res.relevance[0], xd[0] * wd[:, 2], rtol=1e-4, atol=1e-6)


def test_dynamic_conv_with_integer_bias(tmp_path):
    """Older quantize_dynamic (ddddocr's captcha CRNN): ConvInteger + Cast(Floor(bias / (x_scale * w_scale)))
    -> Cast -> Mul(x_scale * w_scale). The forward is onnxruntime's (to float rounding); the relevance is that of the
    float Conv with the dequantized weight and the float bias on the fake-quantized input (the bias's rounding,
    below one accumulator step, takes no relevance)."""
    rng = np.random.default_rng(9)
    wq = rng.integers(-127, 128, (4, 2, 3, 3)).astype(np.int8)
    ws, bias = np.float32(0.01), (rng.standard_normal(4) * 0.5).astype(np.float32)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("ConvInteger", ["xq", "wq", "xz", "wz"], ["acc"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["xs", "ws"], ["s_bias"]), helper.make_node("Div", ["b", "s_bias"], ["bd"]),
             helper.make_node("Floor", ["bd"], ["bf"]), helper.make_node("Cast", ["bf"], ["bi"], to=TensorProto.INT32),
             helper.make_node("Reshape", ["bi", "bshape"], ["br"]), helper.make_node("Add", ["acc", "br"], ["accb"]),
             helper.make_node("Cast", ["accb"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]), helper.make_node("Mul", ["accf", "s"], ["c"])]
    head = [helper.make_node("GlobalAveragePool", ["c"], ["p"]), helper.make_node("Flatten", ["p"], ["y"])]
    m = _model(nodes + head, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
               dict(wq=wq, wz=np.array(0, np.int8), ws=ws, b=bias, bshape=np.array([1, 4, 1, 1], np.int64)))
    x = rng.uniform(-1, 2, (1, 2, 5, 5)).astype(np.float32)
    res = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=1e-9).explain(x, target=2)
    assert_close(res.forward["y"], _ort(m.SerializeToString(), {"x": x}, config=EXACT_INT8)[0],
                               rtol=1e-5, atol=1e-5)
    lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
    scale = np.float32((hi - lo) / 255)
    xq = _fake_quant(x, scale, np.clip(np.round(-lo / scale), 0, 255)).astype(np.float32)
    ref_m = _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])] + head, m.graph.input,
                   m.graph.output, dict(w=(wq.astype(np.float32) * ws), b=bias))
    ref = onnx_lrp.Explainer(ref_m.SerializeToString(), composite="epsilon", epsilon=1e-9).explain(xq, target=2)
    assert np.all(np.isfinite(res.relevance)) and _rel(res.relevance, ref.relevance) <= 1e-4


def test_matmul_integer_static_scale():
    """MatMulInteger outside quantize_dynamic: a static QuantizeLinear input, the scale product folded to one
    constant S. Weight S / x_scale * (Wq - zp); relevance from the numpy oracle xd * Wd[:, t]."""
    rng = np.random.default_rng(12)
    wq = rng.integers(-127, 128, (6, 3)).astype(np.int8)
    sx, big_s = np.float32(0.02), np.float32(0.02 * 0.015)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("MatMulInteger", ["xq", "wq", "zx", "wz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "S"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
               dict(sx=sx, zx=np.uint8(100), wq=wq, wz=np.int8(3), S=big_s))
    x = rng.uniform(-1, 1, (2, 6)).astype(np.float32)
    res = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=1e-9).explain(x, target=2)
    assert_close(res.forward["y"], _ort(m.SerializeToString(), {"x": x}, config=EXACT_INT8)[0],
                               rtol=1e-5, atol=1e-6)
    xd = _fake_quant(x.astype(np.float64), sx, 100)
    wd = (wq.astype(np.float64) - 3) * (big_s / sx)
    assert_close(res.relevance, xd * wd[:, 2], rtol=1e-4, atol=1e-7)


def test_dynamic_demo_forward_matches_onnxruntime(variants):
    x = np.load(SAMPLES)
    ex = onnx_lrp.Explainer(variants["dynamic"])
    res = ex.explain(x)
    ref = _ort(variants["dynamic"], {"image": x}, config=EXACT_INT8)[0]  # exact int8 sums: every CPU alike
    np.testing.assert_allclose(res.forward["logits"], ref, rtol=1e-5, atol=1e-4)
    # outputs: the deployed model's on this CPU (AVX2 saturates: item 4 differs by 2.83 on the demo batch)
    np.testing.assert_array_equal(res.outputs["logits"], _ort(variants["dynamic"], {"image": x})[0])
    names = {n.op_type for n in loader.load(variants["dynamic"]).graph}
    assert not names & {"ConvInteger", "MatMulInteger"} and "DynamicQuantizeLinear" in names


def test_ort_fused_dynamic_quantization_split_back(tmp_path):
    """quantize_dynamic's output optimised by onnxruntime (ORT_ENABLE_EXTENDED) holds MatMulIntegerToFloat and
    DynamicQuantizeMatMul: split back, the forward is onnxruntime's and the relevance equals that of the same
    quantize_dynamic model before the optimisation."""
    from onnxruntime.quantization import quantize_dynamic

    src, dyn, fused = tmp_path / "f.onnx", tmp_path / "d.onnx", tmp_path / "d.ort.onnx"
    onnx.save(qop_models.attention(), str(src))
    quantize_dynamic(str(src), str(dyn))
    _builder().build_ort_optimized(dyn, fused)
    ops = {n.op_type for n in onnx.load(str(fused)).graph.node}
    assert {"MatMulIntegerToFloat", "DynamicQuantizeMatMul"} <= ops, ops
    x = np.random.default_rng(7).standard_normal((1, 4, 8)).astype(np.float32)  # one item: one dynamic range
    ref = onnx_lrp.Explainer(dyn, composite="attnlrp").explain(x, target=2)
    res = onnx_lrp.Explainer(fused, composite="attnlrp").explain(x, target=2)
    assert_close(res.forward["y"], _ort(fused, {"x": x}, config=EXACT_INT8)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(res.outputs["y"], _ort(fused, {"x": x})[0])
    assert np.all(np.isfinite(res.relevance)) and _rel(res.relevance, ref.relevance) <= 1e-5


def test_dynamic_quantize_lstm(tmp_path):
    """quantize_dynamic of a bidirectional LSTM writes DynamicQuantizeLSTM ([dirs, in, 4h] int8 weights): it becomes
    DynamicQuantizeLinear -> DequantizeLinear -> LSTM. Reference: a float LSTM model holding the file's weights
    dequantized and transposed in numpy, fed the input fake-quantized as DynamicQuantizeLinear does. The forward
    differs from onnxruntime's by the fused op's per-step requantization of the hidden state (measured 0.16 % of
    max |y|; the float model differs by 1 %)."""
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(8)
    h, i, t = 6, 5, 7
    inits = dict(W=(rng.standard_normal((2, 4 * h, i)) * 0.5).astype(np.float32),
                 R=(rng.standard_normal((2, 4 * h, h)) * 0.5).astype(np.float32),
                 B=(rng.standard_normal((2, 8 * h)) * 0.1).astype(np.float32),
                 wo=rng.standard_normal((2 * h, 3)).astype(np.float32), sh=np.array([t, 1, 2 * h], np.int64))
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y", "Yh"], hidden_size=h, direction="bidirectional"),
             helper.make_node("Transpose", ["Y"], ["Yt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["Yt", "sh"], ["Yr"]), helper.make_node("MatMul", ["Yr", "wo"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [t, 1, i])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [t, 1, 3])], inits)
    src, dst = tmp_path / "lstm.onnx", tmp_path / "lstm.q.onnx"
    onnx.save(m, str(src))
    quantize_dynamic(str(src), str(dst), op_types_to_quantize=["LSTM"], per_channel=True)
    q = onnx.load(str(dst))
    lstm = next(n for n in q.graph.node if n.op_type == "DynamicQuantizeLSTM")
    arr = {t_.name: numpy_helper.to_array(t_) for t_ in q.graph.initializer}
    x = rng.standard_normal((t, 1, i)).astype(np.float32)
    with pytest.warns(onnx_lrp.LrpWarning, match="round differently.*requantized recurrent state"):
        res = onnx_lrp.Explainer(dst, composite="epsilon").explain(x, target=1)
    np.testing.assert_array_equal(res.outputs["y"], _ort(dst, {"x": x})[0])  # the deployed model's on this CPU
    y_ort = _ort(dst, {"x": x}, config=EXACT_INT8)[0]  # exact int8 sums: every CPU alike
    assert np.abs(res.forward["y"] - y_ort).max() <= 5e-3 * np.abs(y_ort).max()
    assert res.deployed_gap.beyond and res.deployed_gap.max_abs == np.abs(res.outputs["y"] - res.forward["y"]).max()
    # reference float model: W = ((Wq - zp) * scale) transposed to [dirs, 4h, in]; x fake-quantized (uint8)

    def deq(name_q, name_s, name_z):
        s, z = arr[name_s].astype(np.float64), arr[name_z].astype(np.float64)
        shape = (-1, 1, 1) if s.ndim == 1 else (s.shape[0], 1, s.shape[1])
        return np.transpose((arr[name_q] - z.reshape(shape)) * s.reshape(shape), (0, 2, 1)).astype(np.float32)

    ref_inits = dict(inits, W=deq(lstm.input[1], lstm.input[8], lstm.input[9]),
                     R=deq(lstm.input[2], lstm.input[10], lstm.input[11]))
    ref_model = _model(nodes, m.graph.input, m.graph.output, ref_inits)
    lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
    scale = np.float32((hi - lo) / 255)
    xq = _fake_quant(x, scale, np.clip(np.round(-lo / scale), 0, 255)).astype(np.float32)
    ref = onnx_lrp.Explainer(ref_model.SerializeToString(), composite="epsilon").explain(xq, target=1)
    assert_close(res.forward["y"], ref.outputs["y"], rtol=1e-5, atol=1e-5)
    assert np.all(np.isfinite(res.relevance)) and _rel(res.relevance, ref.relevance) <= 1e-4


# ---------------------------------------------------------------------------------------------- float16
def _rounded_fp32(path_fp32, tmp_path):
    """The float32 model with every weight rounded to float16 (the independent reference for fp16 models)."""
    m = onnx.load(str(path_fp32))
    for init in m.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            a = numpy_helper.to_array(init).astype(np.float16).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(a, init.name))
    out = tmp_path / "rounded.onnx"
    onnx.save(m, str(out))
    return out


@pytest.mark.parametrize("kind", ["fp16", "fp16io"])
def test_float16_relevance_in_float32(variants, tmp_path, kind):
    proto = onnx.load(str(variants[kind]))
    assert any(t.data_type == TensorProto.FLOAT16 for t in proto.graph.initializer)
    x = np.load(SAMPLES)
    ref = onnx_lrp.Explainer(_rounded_fp32(DEMO, tmp_path), composite="epsilon-plus-flat").explain(x)
    ex = onnx_lrp.Explainer(variants[kind], composite="epsilon-plus-flat")
    assert all(s.dtype == np.float32 for s in ex.inputs)  # upcast, documented
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        res = ex.explain(x.astype(np.float16) if kind == "fp16io" else x, target=ref.target)
    assert res.relevance.dtype == np.float32 and np.all(np.isfinite(res.relevance))
    # fp16io: the caller's float16 input; fp16: the Cast at its input is upcast too, so the input is not rounded
    xin = x.astype(np.float16).astype(np.float32) if kind == "fp16io" else x
    ref2 = onnx_lrp.Explainer(_rounded_fp32(DEMO, tmp_path), composite="epsilon-plus-flat").explain(
        xin, target=ref.target)
    assert_close(res.relevance, ref2.relevance, rtol=1e-4, atol=1e-6)
    # outputs: the deployed fp16 forward; the explained (float32) forward is within float16 rounding of it, and the
    # gap reported is the difference of the two (beyond 1e-4 of max |y|: float16 rounds at ~1e-3)
    y16 = _ort(variants[kind], {"image": x.astype(np.float16) if kind == "fp16io" else x})[0]
    np.testing.assert_array_equal(res.outputs["logits"], y16)
    np.testing.assert_allclose(res.forward["logits"], y16.astype(np.float32), rtol=0, atol=2e-2 * np.abs(y16).max())
    gap = np.abs(res.forward["logits"] - y16.astype(np.float64))
    assert res.deployed_gap.max_abs == gap.max()
    beyond = gap.max() > 1e-4 * np.abs(y16.astype(np.float64)).max()  # the criterion of float outputs
    assert res.deployed_gap.beyond == beyond
    assert [str(w.message) for w in said if w.category is onnx_lrp.LrpWarning and "float16" in str(w.message)] == (
        [res.deployed_gap.message()] if beyond else [])


def test_float16_tiny_stabiliser_stays_finite():
    """A float16 layer whose outputs are ~1e-8 (float16 underflows to 0 there): relevance stays finite because it
    is computed in float32; conservation (epsilon -> 0, no bias) holds."""
    w = (np.eye(4) * 1e-4).astype(np.float16)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["N", 4])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["N", 4])], dict(w=w))
    x = np.array([[1e-4, 2e-4, -3e-4, 5e-5]], np.float32)
    res = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=1e-12).explain(
        x, target=1, start="one-hot")
    assert np.all(np.isfinite(res.relevance))
    np.testing.assert_allclose(res.relevance.sum(), 1.0, rtol=1e-3)


# ---------------------------------------------------------------------------------------------- ORT optimised
def test_ort_extended_fused_ops_split_back(variants):
    proto = onnx.load(str(variants["ort"]))
    assert {n.op_type for n in proto.graph.node if n.domain == "com.microsoft"} >= {"FusedConv", "FusedGemm"}
    assert not [n for n in loader.load(variants["ort"]).graph if n.domain == "com.microsoft"]
    x = np.load(SAMPLES)
    for comp in ("epsilon-plus-flat", "epsilon-alpha2-beta1"):
        ref = onnx_lrp.Explainer(DEMO, composite=comp).explain(x)
        res = onnx_lrp.Explainer(variants["ort"], composite=comp).explain(x)
        assert_close(res.outputs["logits"], ref.outputs["logits"], rtol=1e-5, atol=1e-5)
        assert_close(res.relevance, ref.relevance, rtol=1e-4, atol=1e-6)


def test_ort_transformer_fusions_split_back(tmp_path):
    """MatMul + bias + erf-GELU + MatMul(transposed weight): ORT writes BiasGelu / Gelu / FusedMatMul; split back,
    the relevance equals the original graph's."""
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((8, 16)).astype(np.float32)
    b1 = rng.standard_normal(16).astype(np.float32)
    w2t = rng.standard_normal((5, 16)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Div", ["h1", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["h1", "e1"], ["g0"]),
             helper.make_node("Mul", ["g0", "half"], ["g"]),
             helper.make_node("Transpose", ["w2t"], ["w2"], perm=[1, 0]),
             helper.make_node("MatMul", ["g", "w2"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
               dict(w1=w1, b1=b1, w2t=w2t, sqrt2=np.array(np.sqrt(2), np.float32), one=np.array(1, np.float32),
                    half=np.array(0.5, np.float32)))
    src, dst = tmp_path / "g.onnx", tmp_path / "g.ort.onnx"
    onnx.save(m, str(src))
    _builder().build_ort_optimized(src, dst)
    fused = {n.op_type for n in onnx.load(str(dst)).graph.node if n.domain == "com.microsoft"}
    assert fused & {"Gelu", "BiasGelu", "FastGelu", "FusedMatMul"}, fused
    x = rng.standard_normal((3, 8)).astype(np.float32)
    for comp in ("epsilon", "attnlrp"):
        ref = onnx_lrp.Explainer(src, composite=comp).explain(x)
        res = onnx_lrp.Explainer(dst, composite=comp).explain(x)
        assert_close(res.outputs["y"], ref.outputs["y"], rtol=1e-5, atol=1e-5)
        assert_close(res.relevance, ref.relevance, rtol=1e-4, atol=1e-5)


def test_ort_enable_all_nchwc_is_refused(tmp_path):
    if not DEMO.exists():
        pytest.skip("demo model missing")
    out = _builder().build_ort_optimized(DEMO, tmp_path / "all.onnx", level="all")
    if not any(n.domain == "com.microsoft.nchwc" for n in onnx.load(str(out)).graph.node):
        pytest.skip("this CPU's ORT_ENABLE_ALL wrote no NCHWc ops")
    with pytest.raises(UnsupportedError, match="NCHWc.*ORT_ENABLE_EXTENDED"):
        onnx_lrp.Explainer(out)


def test_fake_quantized_float_weights_fold(tmp_path):
    """Float weights -> QuantizeLinear -> DequantizeLinear (QAT-style exports, per-channel int8): folded to the
    fake-quantized float weights; relevance from the numpy oracle x * Wq[:, t] (single layer, no bias)."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    ws = (np.abs(w).max(0) / 127).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], axis=1),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=1),
             helper.make_node("MatMul", ["x", "wd"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
               dict(w=w, ws=ws, wz=np.zeros(3, np.int8)))
    x = rng.standard_normal((2, 6)).astype(np.float32)
    res = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=1e-9).explain(x, target=1)
    # the graph as written (onnxruntime's optimiser may turn weight-only DQ -> MatMul into a dynamically quantized
    # MatMul; onnx-lrp runs Q/DQ as written)
    ref = _ort(m.SerializeToString(), {"x": x}, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)[0]
    assert_close(res.outputs["y"], ref, rtol=1e-6, atol=1e-6)
    wq = np.clip(np.round(w / ws), -128, 127) * ws
    assert_close(res.relevance, x * wq[:, 1], rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------- deployed gap
def test_gap_cause_is_the_onnxruntime_path_that_closes_it(monkeypatch):
    """onnx_lrp.run.deployed_gap.cause runs the deployed model again with onnxruntime's exact int8 sums, with Q/DQ as written, and
    with both; the first that brings it within the tolerance names the cause (a fake session stands for a CPU whose
    int8 kernels saturate: on a VNNI CPU no real model can show it)."""
    from onnx_lrp.run import deployed_gap as gaps

    forward = np.array([[14.81, -4.0, -2.6]])

    class FakeSession:
        def __init__(self, model, device, deployed=False, config=None):
            self.config = config or {}

    class FakeRunner:
        deployed, device = b"model", "cpu"

        def __init__(self, kinds, closes):
            self.deployed_kinds, self.closes = kinds, closes

        def deployed_outputs(self, feeds, session):
            exact = all(session.config.get(k) == "1" for k in self.closes)
            return {"y": forward + (0 if exact else 0.2 * np.array([[-1, 1, 1]]))}

    monkeypatch.setattr(gaps.runtime, "Session", FakeSession)
    g = gaps.measure("y", forward + 0.2 * np.array([[-1, 1, 1]]), forward, 0.05, 1)
    assert g.beyond and g.max_abs == pytest.approx(0.2) and g.tolerance == pytest.approx(1.001 * 0.05)
    assert gaps.cause(FakeRunner(("int8",), ["session.x64quantprecision"]), {}, forward, g) == gaps.SATURATE
    assert gaps.cause(FakeRunner(("int8",), ["session.disable_quant_qdq"]), {}, forward, g) == gaps.QDQ_FUSED
    assert gaps.cause(FakeRunner(("int8",), ["session.x64quantprecision", "session.disable_quant_qdq"]), {},
                      forward, g) == gaps.BOTH
    assert gaps.cause(FakeRunner(("int8",), ["never"]), {}, forward, g) == gaps.ROUNDING
    assert gaps.cause(FakeRunner(("float16",), []), {}, forward, g) == gaps.FLOAT16
    msg = dataclasses.replace(g, reason=gaps.SATURATE).message()
    assert msg.startswith("int8 kernels of this CPU saturate")
    assert re.search(r"by up to 0\.2 on y\[\d\] of item 0 ", msg)
    assert "one output quantization step, 0.05" in msg and "\n" not in msg


def test_cli_says_the_gap_once_in_explain_trace_and_snapshot(variants, tmp_path, run_cli):
    """float16 deployed outputs differ from the float32 explained forward beyond 1e-4 of max |y| on every CPU: explain
    prints one warning line (the largest gap of the run) and the JSON summary holds it; trace and snapshot say it in
    their report (the commands in-process: conftest's run_cli)."""
    def run(*args):
        return run_cli(*args, cwd=tmp_path)

    x = np.load(SAMPLES)
    ex = onnx_lrp.Explainer(variants["fp16io"])
    parts = [ex.explain(x[lo:lo + 4]) for lo in range(0, len(x), 4)]  # the CLI's chunks, float32 as it reads them
    deployed = np.concatenate([r.outputs["logits"] for r in parts])
    gap = np.abs(deployed.astype(np.float64) - np.concatenate([r.forward["logits"] for r in parts]))
    assert gap.max() > 1e-4 * np.abs(deployed.astype(np.float64)).max()
    code, out, err = run("explain", variants["fp16io"], SAMPLES, "-o", tmp_path / "r.npz", "--batch-size", "4",
                         "--json")
    assert code == 0, err
    said = [line for line in err.splitlines() if "differs from the deployed one" in line]
    assert len(said) == 1 and said[0].startswith("onnx-lrp: warning: the deployed model computes in float16")
    summary = json.loads(out)
    assert summary["deployed_gap"]["max_abs"] == pytest.approx(gap.max()) and summary["deployed_gap"]["beyond"]
    assert f"of batch.npy[{int(np.argmax(gap.max(axis=1)))}] " in said[0]  # counted over the whole run, not per chunk
    with np.load(tmp_path / "r.npz") as z:  # the written outputs are the deployed model's
        np.testing.assert_array_equal(z["outputs"], deployed)
    code, out, err = run("trace", variants["fp16io"], SAMPLES, "--item", "3")
    assert code == 0 and sum("differs from the deployed one" in line for line in out.splitlines()) == 1, out + err
    code, out, err = run("snapshot", variants["fp16io"], SAMPLES, "-o", tmp_path / "b.npz")
    assert code == 0 and sum(line.startswith("note: the deployed model computes in float16")
                             for line in out.splitlines()) == 1, out + err


def test_payload_carries_the_deployed_model(variants):
    """A Runner from an Explainer's payload (a Ray actor's) runs the deployed model too: the same outputs, explained
    forward and gap as the Explainer; float models carry none."""
    from onnx_lrp.run.runner import Runner

    x = np.load(SAMPLES)[:4]
    ex = onnx_lrp.Explainer(variants["dynamic"])
    run = Runner.from_payload(ex.payload(), threads=1)
    a, b = ex.explain(x), run.explain(x)
    np.testing.assert_array_equal(b.outputs["logits"], _ort(variants["dynamic"], {"image": x})[0])
    np.testing.assert_array_equal(b.forward["logits"], a.forward["logits"])
    np.testing.assert_array_equal(b.relevance, a.relevance)
    assert b.deployed_gap.max_abs == a.deployed_gap.max_abs
    plain = onnx_lrp.Explainer(DEMO)
    assert plain.deployed is None and Runner.from_payload(plain.payload()).explain(x).deployed_gap is None
