"""Graphs as other exporters write them give the same relevance as the plain graph of the same network.

- tf2onnx style: NHWC input, Transpose to NCHW, Conv with auto_pad=SAME_UPPER, MaxPool SAME, MatMul + Add bias,
  Softmax at the output; the reference is the same network written NCHW with explicit pads and Gemm.
- Caffe2 / model-zoo style: an opset-7 model (BatchNormalization with spatial, Dropout, Softmax) upgraded by the
  loader; the reference is the same network written at opset 17.
"""
from __future__ import annotations

import numpy as np
import pytest
from util import assert_close, make_model, node

import onnx_lrp

RNG = np.random.default_rng(11)
W = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)
B = RNG.standard_normal(8).astype(np.float32) * 0.1
SCALE, SHIFT = RNG.uniform(0.5, 1.5, 8).astype(np.float32), RNG.standard_normal(8).astype(np.float32) * 0.1
MEAN, VAR = RNG.standard_normal(8).astype(np.float32) * 0.1, RNG.uniform(0.5, 1.5, 8).astype(np.float32)
WD = RNG.standard_normal((8 * 4 * 4, 5)).astype(np.float32) * 0.1
BD = RNG.standard_normal(5).astype(np.float32) * 0.1
BN = {"s": SCALE, "t": SHIFT, "m": MEAN, "v": VAR}


def nchw_reference():
    nodes = [node("Conv", ["x", "w", "b"], "c", pads=[1, 1, 1, 1]), node("BatchNormalization", ["c", "s", "t", "m", "v"], "n"),
             node("Relu", ["n"], "r"), node("MaxPool", ["r"], "p", kernel_shape=[2, 2], strides=[2, 2]),
             node("Transpose", ["p"], "ph", perm=[0, 2, 3, 1]), node("Flatten", ["ph"], "f"),
             node("Gemm", ["f", "wd", "bd"], "y")]
    return make_model(nodes, {"x": ["N", 3, 8, 8]}, ["y"], {"w": W, "b": B, "wd": WD, "bd": BD, **BN})


def tf2onnx_style():
    nodes = [node("Transpose", ["x_nhwc"], "x", perm=[0, 3, 1, 2]),
             node("Conv", ["x", "w", "b"], "c", auto_pad="SAME_UPPER"),
             node("BatchNormalization", ["c", "s", "t", "m", "v"], "n", epsilon=1e-5),
             node("Relu", ["n"], "r"), node("MaxPool", ["r"], "p", kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
             node("Transpose", ["p"], "ph", perm=[0, 2, 3, 1]), node("Reshape", ["ph", "shape"], "f"),
             node("MatMul", ["f", "wd"], "mm"), node("Add", ["mm", "bd"], "logits"), node("Softmax", ["logits"], "y", axis=-1)]
    return make_model(nodes, {"x_nhwc": ["N", 8, 8, 3]}, ["y"],
                      {"w": W, "b": B, "wd": WD, "bd": BD, "shape": np.array([-1, 128], np.int64), **BN}, opset=13)


@pytest.mark.parametrize("composite", ["epsilon", "epsilon-plus-flat", "epsilon-gamma-box", "epsilon-alpha2-beta1"])
def test_tf2onnx_style_graph_matches_the_nchw_network(composite):
    x = RNG.standard_normal((3, 3, 8, 8)).astype(np.float32)
    box = {"low": -3.0, "high": 3.0} if composite == "epsilon-gamma-box" else {}
    ref = onnx_lrp.Explainer(nchw_reference().SerializeToString(), composite=composite, **box).explain(x)
    tf = onnx_lrp.Explainer(tf2onnx_style().SerializeToString(), composite=composite, **box).explain(
        x.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(tf.target, ref.target)
    assert_close(tf.relevance.transpose(0, 3, 1, 2), ref.relevance, rtol=2e-4, atol=1e-6)


def caffe2_style(opset):
    bn_attrs = {"spatial": 1, "epsilon": 1e-5} if opset < 9 else {"epsilon": 1e-5}
    nodes = [node("Conv", ["x", "w", "b"], "c", pads=[1, 1, 1, 1]),
             node("BatchNormalization", ["c", "s", "t", "m", "v"], "n", **bn_attrs), node("Relu", ["n"], "r"),
             node("MaxPool", ["r"], "p", kernel_shape=[2, 2], strides=[2, 2]), node("Dropout", ["p"], "d"),
             node("Flatten", ["d"], "f", axis=1), node("Gemm", ["f", "wd", "bd"], "g", transB=1),
             node("Softmax", ["g"], "y", axis=1)]
    return make_model(nodes, {"x": [1, 3, 8, 8]}, ["y"], {"w": W, "b": B, "wd": WD.T.copy(), "bd": BD, **BN},
                      opset=opset)


@pytest.mark.parametrize("opset", [7, 9, 11])
def test_old_opset_model_is_upgraded_and_explained_like_opset_17(opset):
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    old = onnx_lrp.Explainer(caffe2_style(opset).SerializeToString(), composite="epsilon-plus-flat").explain(x)
    new = onnx_lrp.Explainer(caffe2_style(17).SerializeToString(), composite="epsilon-plus-flat").explain(x)
    assert_close(old.relevance, new.relevance, rtol=1e-5, atol=1e-7)
    assert np.all(np.isfinite(old.relevance))
