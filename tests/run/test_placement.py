"""No node of a relevance graph runs on the CPU provider in a CUDA session (issue 29, point 3), predicted on the
CPU by onnx_lrp.run.placement (onnxruntime's GetCpuPreferredNodes over its basic-optimised graph).

The predictor's reference: the placement onnxruntime 1.31 reported on an H200 for the MaxPool relevance that
onnx-lrp emitted before (Size -> Reshape -> ConstantOfShape: the Reshape on the CPU provider), and the rule as
onnxruntime's fallback_cpu_capability.cc states it. scripts/gpu_check.py placement compares the prediction with the
real placement on a GPU.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from families import FAMILIES
from onnx_lrp import load as loader
from onnx_lrp.run import placement
from util import ROOT

F = TensorProto.FLOAT


def _predict(nodes, inputs, outputs, inits=(), dtype=F):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, dtype, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, dtype, None) for n in outputs],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    m = onnx.shape_inference.infer_shapes(m)  # element types of the values, as onnxruntime's optimised model has
    return placement.predict(loader.deserialize(m.SerializeToString())).on_cpu


def test_the_maxpool_relevance_onnx_lrp_emitted_before_is_predicted_where_onnxruntime_put_it():
    """Size(x) -> Reshape(., [1]) -> ConstantOfShape: the Reshape reads only a host tensor and a small constant, so
    onnxruntime moves it to the CPU (as it did on the H200: lrp/maxpool/MaxPool/x_size1_node)."""
    nodes = [helper.make_node("Size", ["x"], ["n"], name="x_size"),
             helper.make_node("Reshape", ["n", "one"], ["n1"], name="x_size1"),
             helper.make_node("ConstantOfShape", ["n1"], ["z"], name="zeros"),
             helper.make_node("Add", ["z", "xf"], ["y"], name="add"),
             helper.make_node("Reshape", ["x", "flat"], ["xf"], name="x_flat")]
    assert _predict(nodes, [("x", ["N", 4])], ["y"], [("one", np.array([1], np.int64)),
                                                    ("flat", np.array([-1], np.int64))]) == ["x_size1"]


def test_shape_arithmetic_moves_to_the_cpu_and_a_shape_read_where_it_is_used_does_not():
    shape_in_place = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
                      helper.make_node("ConstantOfShape", ["s"], ["z"], name="zeros"),
                      helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")]
    assert _predict(shape_in_place, [("x", ["N", 4])], ["y", "z"]) == []
    arithmetic = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
                  helper.make_node("Gather", ["s", "i0"], ["n"], name="gather"),
                  helper.make_node("Concat", ["n", "m1"], ["t"], axis=0, name="concat"),
                  helper.make_node("Reshape", ["x", "t"], ["y"], name="reshape")]
    got = _predict(arithmetic, [("x", ["N", 4])], ["y"], [("i0", np.array([0], np.int64)),
                                                         ("m1", np.array([-1], np.int64))])
    assert got == ["gather", "concat"]
    # a node that also reads a device tensor stays on CUDA (onnxruntime copies the host tensor to it)
    # (a graph input counts as a host tensor: onnxruntime's rule)
    mixed = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Cast", ["s"], ["sf"], to=F, name="cast"),
             helper.make_node("Neg", ["x"], ["xn"], name="neg"),
             helper.make_node("Mul", ["sf", "xn"], ["y"], name="mul"),
             helper.make_node("Mul", ["sf", "x"], ["y2"], name="mul_input")]
    assert _predict(mixed, [("x", ["N", 4])], ["y", "y2"]) == ["cast", "mul_input"]
    # float16 never moves to the CPU
    half = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
            helper.make_node("Cast", ["s"], ["h"], to=TensorProto.FLOAT16, name="cast"),
            helper.make_node("Neg", ["h"], ["y"], name="neg")]
    assert _predict(half, [("x", ["N", 4])], ["y"]) == ["cast"]


@pytest.mark.parametrize("fam", FAMILIES, ids=[f.name for f in FAMILIES])
def test_no_relevance_node_of_a_family_is_predicted_on_the_cpu(fam):
    ex = fam.explainer()
    predicted = placement.predict_bytes(ex.relevance_model.model_bytes, ex.relevance_model.model_folder)
    assert predicted.relevance_nodes() == [], f"{fam.name}: {predicted.relevance_nodes()}"


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("ONNX_LRP_SLOW"), reason="torchvision exports (ONNX_LRP_SLOW=1)")
@pytest.mark.parametrize("arch", ["resnet50", "vgg16"])
@pytest.mark.parametrize("composite", ["epsilon-plus-flat", "epsilon-gamma-box"])
def test_no_relevance_node_of_resnet50_or_vgg16_is_predicted_on_the_cpu(arch, composite, tmp_path):
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import onnx_lrp
    from bench_cnn import build

    path = tmp_path / f"{arch}.onnx"
    build(arch, str(path), 224)
    box = {"low": -3.0, "high": 3.0} if composite == "epsilon-gamma-box" else {}
    ex = onnx_lrp.Explainer(path, composite=composite, **box)
    predicted = placement.predict_bytes(ex.relevance_model.model_bytes, ex.relevance_model.model_folder)
    assert predicted.relevance_nodes() == [] and predicted.no_kernel == []


def test_cpu_input_facts_follow_the_opset():
    assert placement.cpu_input_indices("Reshape", 17) == (1,)
    assert placement.cpu_input_indices("Unsqueeze", 11) == () and placement.cpu_input_indices("Unsqueeze", 13) == (1,)
    assert placement.cpu_input_indices("ReduceMax", 17) == () and placement.cpu_input_indices("ReduceMax", 18) == (1,)
    assert placement.cpu_input_indices("Add", 17) == ()
    assert ir.DataType.BFLOAT16 in placement.LOW_PRECISION
