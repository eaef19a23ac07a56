"""Deployed model forms (onnx_lrp.deployed): QDQ / dynamic quantization, float16, onnxruntime-optimised graphs.

References: numpy oracles of the epsilon rule on fake-quantized activations (QDQ pairs pass relevance unchanged),
onnxruntime's own forward pass of the deployed model, and the relevance of the equivalent float32 model.
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
from onnx_lrp import loader
from onnx_lrp.errors import UnsupportedError

ROOT = Path(__file__).resolve().parents[1]
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


def _ort(path_or_bytes, feeds, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    data = str(path_or_bytes) if isinstance(path_or_bytes, Path) else path_or_bytes
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "t", inputs, outputs,
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


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
    # forward: the quantized one, exactly as onnxruntime runs the deployed model
    np.testing.assert_array_equal(res.outputs["y"], _ort(m.SerializeToString(), {"x": x})[0])
    # oracle: LRP-0 on the fake-quantized activations, relevance unchanged across each Q/DQ pair
    xd = _fake_quant(x.astype(np.float64), sx, 128)
    h = xd @ w1
    hd = _fake_quant(np.maximum(h, 0), sh, 0)
    for i, t in enumerate(res.target):
        r_h = hd[i] * w2[:, t]                             # layer 2: R_j = a_j w_jt (y_t = z_t)
        r_x = xd[i] * (w1 @ np.where(h[i] != 0, r_h / h[i], 0))  # relu passes, layer 1: a_i w_ij R_j / z_j
        np.testing.assert_allclose(res.relevance[i], r_x, rtol=1e-4, atol=1e-5)


def test_qdq_demo_weights_folded_forward_quantized(variants):
    m = loader.load(variants["qdq"])
    dq = [n for n in m.graph if n.op_type == "DequantizeLinear"]
    assert dq, "activation Q/DQ pairs stay in the forward graph"
    assert all(n.inputs[0].const_value is None for n in dq), "every DequantizeLinear of a constant is folded"
    for n in m.graph:
        if n.op_type in ("Conv", "Gemm"):
            assert n.inputs[1].const_value is not None and n.inputs[1].dtype == onnx_lrp.ops.base.ir.DataType.FLOAT
    x = np.load(SAMPLES)
    ex = onnx_lrp.Explainer(variants["qdq"], composite="epsilon-plus-flat")
    res = ex.explain(x)
    ref = _ort(variants["qdq"], {"image": x})
    np.testing.assert_array_equal(res.outputs["logits"], ref[0])  # the deployed (quantized) forward, exactly
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
        np.testing.assert_allclose(r_in, r_out, rtol=1e-6, atol=1e-7)


def test_qoperator_format_is_refused(tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    if not DEMO.exists():
        pytest.skip("demo model missing")
    x = np.load(SAMPLES)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"image": x}])

        def get_next(self):
            return next(self.it, None)

    out = tmp_path / "qop.onnx"
    quantize_static(str(DEMO), str(out), Reader(), quant_format=QuantFormat.QOperator)
    with pytest.raises(UnsupportedError, match="QLinearConv.*QuantFormat.QDQ"):
        onnx_lrp.Explainer(out)


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
    ref = _ort(dst, {"x": x})[0]
    np.testing.assert_allclose(res.outputs["y"], ref, rtol=1e-5, atol=1e-5)
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
    np.testing.assert_allclose(res.relevance[0], xd[0] * wd[:, 2], rtol=1e-4, atol=1e-6)


def test_dynamic_demo_forward_matches_onnxruntime(variants):
    x = np.load(SAMPLES)
    ex = onnx_lrp.Explainer(variants["dynamic"])
    res = ex.explain(x)
    ref = _ort(variants["dynamic"], {"image": x})[0]
    np.testing.assert_allclose(res.outputs["logits"], ref, rtol=1e-5, atol=1e-4)
    names = {n.op_type for n in loader.load(variants["dynamic"]).graph}
    assert not names & {"ConvInteger", "MatMulInteger"} and "DynamicQuantizeLinear" in names


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
    res = ex.explain(x.astype(np.float16) if kind == "fp16io" else x, target=ref.target)
    assert res.relevance.dtype == np.float32 and np.all(np.isfinite(res.relevance))
    # fp16io: the caller's float16 input; fp16: the Cast at its input is upcast too, so the input is not rounded
    xin = x.astype(np.float16).astype(np.float32) if kind == "fp16io" else x
    ref2 = onnx_lrp.Explainer(_rounded_fp32(DEMO, tmp_path), composite="epsilon-plus-flat").explain(
        xin, target=ref.target)
    np.testing.assert_allclose(res.relevance, ref2.relevance, rtol=1e-4, atol=1e-6)
    # the deployed fp16 forward, within float16 rounding of the activations
    y16 = _ort(variants[kind], {"image": x.astype(np.float16) if kind == "fp16io" else x})[0].astype(np.float32)
    np.testing.assert_allclose(res.outputs["logits"], y16, rtol=0, atol=2e-2 * np.abs(y16).max())


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
        np.testing.assert_allclose(res.outputs["logits"], ref.outputs["logits"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(res.relevance, ref.relevance, rtol=1e-4, atol=1e-6)


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
        np.testing.assert_allclose(res.outputs["y"], ref.outputs["y"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(res.relevance, ref.relevance, rtol=1e-4, atol=1e-5)


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
    np.testing.assert_allclose(res.outputs["y"], ref, rtol=1e-6, atol=1e-6)
    wq = np.clip(np.round(w / ws), -128, 127) * ws
    np.testing.assert_allclose(res.relevance, x * wq[:, 1], rtol=1e-4, atol=1e-6)
