"""int4 stays int4 at run time (building/transient_weights.py): in the relevance model of a stack of MatMulNBits
layers (4-bit, block 32), every DequantizeLinear has one consumer and sits right before it, waiting for that
consumer's activation, so a float weight lives only across the one product that reads it. The relevance equals
that of the build with one shared DequantizeLinear per weight and that of the float twin (the same weights
dequantized in numpy, plain MatMul), to float rounding; and the peak memory of the first explanation stays well below
the float weights' bytes (a shared build holds them all)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
from onnx_lrp.building import stages
from util import assert_close

H, LAYERS, BLOCK = 512, 8, 32
STATUS = Path("/proc/self/status")


def _stack(float_twin: bool = False) -> tuple[bytes, int]:
    """x -> LAYERS x (x + tanh(0.5 x W_i)), W_i 4-bit (MatMulNBits) or its float value; (model bytes, float
    bytes)."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    nb = H // BLOCK
    for i in range(LAYERS):
        q = rng.integers(0, 16, (H, nb * BLOCK)).astype(np.uint8)  # (N, K) as MatMulNBits stores it
        s = (0.002 + 0.004 * rng.random((H, nb))).astype(np.float32)
        w = ((q.reshape(H, nb, BLOCK).astype(np.float32) - 8) * s[:, :, None]).reshape(H, H).T
        # x * 0.5 first: onnxruntime fuses it into the product (a new node, numbered last), which made it run every
        # dequantization at the start before they waited for their activations
        nodes.append(helper.make_node("Mul", [x, "half"], [f"h{i}"], name=f"half{i}"))
        if float_twin:
            inits.append(numpy_helper.from_array(np.ascontiguousarray(w), f"w{i}"))
            nodes.append(helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        else:
            packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8).reshape(H, nb, BLOCK // 2)
            inits += [numpy_helper.from_array(packed, f"b{i}"), numpy_helper.from_array(s.reshape(-1), f"s{i}")]
            nodes.append(helper.make_node("MatMulNBits", [f"h{i}", f"b{i}", f"s{i}"], [f"m{i}"], domain="com.microsoft",
                                          name=f"mm{i}", K=H, N=H, bits=4, block_size=BLOCK, accuracy_level=0))
        nodes += [helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"act{i}"),
                  helper.make_node("Add", [x, f"t{i}"], [f"r{i}"], name=f"res{i}")]
        x = f"r{i}"
    inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    g = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", H])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", H])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString(), LAYERS * H * H * 4


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(1).standard_normal((2, H)).astype(np.float32)


@pytest.fixture(scope="module")
def transient():
    return onnx_lrp.Explainer(_stack()[0], composite="epsilon")


def test_every_dequantized_weight_has_one_consumer_right_after_it(transient):
    graph = onnx.load_model_from_string(transient.relevance_model.model_bytes).graph
    nodes = list(graph.node)
    dq = [i for i, n in enumerate(nodes) if n.op_type == "DequantizeLinear"]
    assert len(dq) == 2 * LAYERS  # the forward's product and the relevance's, per layer
    for i in dq:
        readers = [n for n in nodes if nodes[i].output[0] in n.input]
        assert len(readers) == 1 and nodes[i + 1] is readers[0], nodes[i].name
        # its scale waits for the consumer's activation: scale + Cast(Size(a) - Size(a)), a an input of the consumer
        producer = {o: n for n in nodes for o in n.output}
        add = producer[nodes[i].input[1]]
        size = producer[producer[producer[add.input[1]].input[0]].input[0]]
        assert add.op_type == "Add" and size.op_type == "Size" and size.input[0] in readers[0].input, nodes[i].name
    assert not any(n.op_type == "MatMulNBits" for n in nodes)
    assert sum(t.data_type == TensorProto.INT4 for t in graph.initializer) == LAYERS  # still 4-bit at rest


def test_relevance_equals_the_shared_build_and_the_float_twin(transient, x, monkeypatch):
    got = transient.explain(x, target=3)
    monkeypatch.setattr(stages, "make_transient", lambda model: 0)
    shared = onnx_lrp.Explainer(_stack()[0], composite="epsilon")
    assert sum(n.op_type == "DequantizeLinear" for n in
               onnx.load_model_from_string(shared.relevance_model.model_bytes).graph.node) == LAYERS
    want = shared.explain(x, target=3)
    twin = onnx_lrp.Explainer(_stack(float_twin=True)[0], composite="epsilon").explain(x, target=3)
    assert_close(got.relevance, want.relevance, rtol=1e-6)
    assert_close(got.relevance, twin.relevance, rtol=1e-5)
    assert_close(got.outputs[f"r{LAYERS - 1}"], twin.outputs[f"r{LAYERS - 1}"], rtol=1e-5)


def _status(key: str) -> int:
    return next(int(line.split()[1]) * 1024 for line in STATUS.read_text().splitlines() if line.startswith(key))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory read from /proc/self/status")
def test_first_explanation_peak_below_the_float_weights(x):
    model, float_bytes = _stack()
    ex = onnx_lrp.Explainer(model, composite="epsilon")
    before = _status("VmRSS:")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to VmRSS
    except OSError:
        pytest.skip("the peak cannot be reset here")
    ex.explain(x, target=3)
    extra = _status("VmHWM:") - before
    # shared DequantizeLinears (or copies run at the start) hold all LAYERS float weights (8 MiB) at once; transient
    # ones one or two
    assert extra < float_bytes / 2, f"{extra / 2**20:.1f} MiB above the build, float weights {float_bytes / 2**20} MiB"


def test_a_large_model_keeps_its_4bit_weights_in_the_graph(transient, x, monkeypatch):
    """A model handled as large (over external.LARGE bytes: in-memory tensors handed to onnxruntime as arrays) keeps
    its 4-bit weights packed in the graph (onnxruntime takes no 4-bit arrays from numpy) and explains alike."""
    from onnx_lrp.load import external

    monkeypatch.setattr(external, "LARGE", 1)
    monkeypatch.setattr(external, "IN_MEMORY_MIN", 4096)
    large = onnx_lrp.Explainer(_stack()[0], composite="epsilon")
    assert large.relevance_model.model_arrays  # the float constants (scales) handed over from memory
    assert not any(a.dtype.itemsize == 1 and a.dtype.kind == "V" for a in large.relevance_model.model_arrays.values())
    assert_close(large.explain(x, target=3).relevance, transient.explain(x, target=3).relevance, rtol=1e-6)
