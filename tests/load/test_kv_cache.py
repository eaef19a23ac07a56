"""Decoders exported with a KV cache: the past key/value inputs fed empty (length 0 along the sequence axis), the
``present.*`` outputs dropped; the relevance equals the no-past export's. A synthetic torch.onnx-like decoder layer
(past Concat'ed to the new keys, the past length read with Shape for the causal mask) against its twin without past
(optimum's exports of the tiny LLaMA / Qwen2 with and without past: tests/parity/test_genai_forms.py)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
from onnx_lrp import load as loader
from onnx_lrp.core import meta
from util import assert_close

D, N, H, V = 8, 2, 4, 11
PAST = ("past_key_values.0.key", "past_key_values.0.value")
PRESENT = ("present.0.key", "present.0.value")


def _weights():
    rng = np.random.default_rng(0)
    w = {k: (0.5 * rng.standard_normal((D, D))).astype(np.float32) for k in "qkvo"}
    w["lm"] = rng.standard_normal((D, V)).astype(np.float32)
    return w


def _decoder(past: bool) -> onnx.ModelProto:
    """One attention layer and an LM head; with ``past``: K/V = Concat(past, new) on the sequence axis, the causal mask
    offset by the past length (Shape(past)[2]), the present outputs as torch.onnx writes them."""
    mk = helper.make_node
    consts = dict(hs=np.array([0, 0, N, H], np.int64), ms=np.array([0, 0, D], np.int64),
                  sq=np.array(np.sqrt(H), np.float32), i2=np.array([2], np.int64), zero=np.array(0, np.int64),
                  one=np.array(1, np.int64), neg=np.array(-1e9, np.float32), fz=np.array(0, np.float32),
                  a1=np.array([1], np.int64))
    inits = [numpy_helper.from_array(v, "W" + k) for k, v in _weights().items()]
    inits += [numpy_helper.from_array(v, k) for k, v in consts.items()]
    nodes = []
    for t in "qkv":
        nodes += [mk("MatMul", ["x", "W" + t], [t + "p"]), mk("Reshape", [t + "p", "hs"], [t + "r"]),
                  mk("Transpose", [t + "r"], [t + "h"], perm=[0, 2, 1, 3])]
    if past:
        nodes += [mk("Concat", [PAST[0], "kh"], ["K"], axis=2), mk("Concat", [PAST[1], "vh"], ["Vv"], axis=-2),
                  mk("Shape", [PAST[0]], ["ps"]), mk("Gather", ["ps", "i2"], ["plen1"]),
                  mk("Squeeze", ["plen1"], ["plen"]), mk("Identity", ["K"], [PRESENT[0]]),
                  mk("Identity", ["Vv"], [PRESENT[1]])]
    else:
        nodes += [mk("Identity", ["kh"], ["K"]), mk("Identity", ["vh"], ["Vv"]), mk("Identity", ["zero"], ["plen"])]
    nodes += [mk("Shape", ["x"], ["xs"], start=1, end=2), mk("Squeeze", ["xs"], ["S"]), mk("Add", ["S", "plen"], ["T"]),
              mk("Range", ["zero", "T", "one"], ["j"]), mk("Range", ["zero", "S", "one"], ["i0"]),
              mk("Add", ["i0", "plen"], ["i1"]), mk("Unsqueeze", ["i1", "a1"], ["i"]),
              mk("LessOrEqual", ["j", "i"], ["ok"]), mk("Where", ["ok", "fz", "neg"], ["bias"]),
              mk("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]), mk("MatMul", ["qh", "Kt"], ["s0"]),
              mk("Div", ["s0", "sq"], ["s1"]), mk("Add", ["s1", "bias"], ["s2"]), mk("Softmax", ["s2"], ["p"], axis=-1),
              mk("MatMul", ["p", "Vv"], ["c"]), mk("Transpose", ["c"], ["ct"], perm=[0, 2, 1, 3]),
              mk("Reshape", ["ct", "ms"], ["cm"]), mk("MatMul", ["cm", "Wo"], ["o"]), mk("Add", ["o", "x"], ["h"]),
              mk("MatMul", ["h", "Wlm"], ["logits"])]
    for i, n in enumerate(nodes):
        n.name = f"n{i}_{n.op_type}"
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch_size", "sequence_length", D])]
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", V])]
    if past:
        ins += [helper.make_tensor_value_info(p, TensorProto.FLOAT, ["batch_size", N, "past_sequence_length", H])
                for p in PAST]
        outs += [helper.make_tensor_value_info(p, TensorProto.FLOAT, ["batch_size", N, "total_sequence_length", H])
                 for p in PRESENT]
    m = helper.make_model(helper.make_graph(nodes, "decoder", ins, outs, initializer=inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


@pytest.fixture(scope="module")
def pair():
    x = np.random.default_rng(1).standard_normal((2, 5, D)).astype(np.float32)
    return _decoder(True).SerializeToString(), _decoder(False).SerializeToString(), x


def test_past_inputs_fed_empty_and_present_outputs_dropped(pair):
    model = loader.load(pair[0])
    assert [v.name for v in model.graph.inputs] == ["x"] and [v.name for v in model.graph.outputs] == ["logits"]
    assert not [n for n in model.graph if n.op_type == "Concat" and any(
        v is not None and v.name in PAST for v in n.inputs)]
    notes = meta.DEPLOYED_FORMS.get(model)
    assert "fed 2 past key/value input(s) empty (a prompt without KV cache)" in notes
    assert "dropped 2 present key/value output(s)" in notes


def test_relevance_equals_the_no_past_export(pair):
    with_past, without, x = pair
    a = onnx_lrp.Explainer(with_past, composite="attnlrp").explain({"x": x})
    b = onnx_lrp.Explainer(without, composite="attnlrp").explain({"x": x})
    empty = np.zeros((2, N, 0, H), np.float32)
    ref = ort.InferenceSession(with_past, providers=["CPUExecutionProvider"]).run(
        ["logits"], {"x": x, PAST[0]: empty, PAST[1]: empty})[0]
    assert_close(a.outputs["logits"], ref, rtol=1e-6)  # the forward: onnxruntime's run with an empty past
    np.testing.assert_array_equal(a.target, b.target)
    assert_close(a.relevance, b.relevance, rtol=0, atol=1e-6)
    assert np.abs(b.relevance).max() > 0.1


def test_given_past_is_held_constant(pair):
    """Past state bound with ``constants=``: the forward is onnxruntime's with that past; it is said in the notes."""
    with_past, _, x = pair
    rng = np.random.default_rng(2)
    past = {p: rng.standard_normal((2, N, 3, H)).astype(np.float32) for p in PAST}
    model = loader.load(with_past, constants=past)
    assert "2 past key/value input(s) given: held constant (they get no relevance)" in \
        meta.DEPLOYED_FORMS.get(model)
    got = onnx_lrp.Explainer(with_past, composite="attnlrp", constants=past).explain({"x": x})
    ref = ort.InferenceSession(with_past, providers=["CPUExecutionProvider"]).run(["logits"], {"x": x, **past})[0]
    assert_close(got.outputs["logits"], ref, rtol=1e-6)


def test_past_with_its_own_dimension_names_and_fixed_past_left_alone(pair):
    """The batch named differently in the past than in the other inputs (the sequence axis told by its name); a
    past of fixed length has no axis to empty: left as an input (the fused ops' own refusals then apply)."""
    _, without, x = pair
    m = _decoder(True)
    for i in m.graph.input[1:]:
        i.type.tensor_type.shape.dim[0].dim_param, i.type.tensor_type.shape.dim[2].dim_param = "b", "past_len"
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    a = onnx_lrp.Explainer(m.SerializeToString(), composite="attnlrp").explain({"x": x})
    b = onnx_lrp.Explainer(without, composite="attnlrp").explain({"x": x})
    assert_close(a.relevance, b.relevance, rtol=0, atol=1e-6)
    for i in m.graph.input[1:]:
        i.type.tensor_type.shape.dim[2].dim_value = 3
    assert [v.name for v in loader.load(m.SerializeToString()).graph.inputs] == ["x", *PAST]


def test_past_given_as_an_input_is_refused_in_one_line_saying_what_to_do(pair):
    with_past, _, x = pair
    e = onnx_lrp.Explainer(with_past, composite="attnlrp")
    past = np.zeros((2, N, 3, H), np.float32)
    with pytest.raises(onnx_lrp.InputError, match=r"past is given for past_key_values.0.key but not for "
                       r"past_key_values.0.value: give the past of every layer") as info:
        e.explain({"x": x, PAST[0]: past})
    assert "\n" not in str(info.value)
