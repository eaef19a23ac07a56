"""Control flow made static (onnx_lrp/load/passes/control_flow.py): Loop/Scan with a static trip count unrolled, If with a constant
condition inlined, inputs bound to constants.

Real exports (tests/goldens/recurrent_twins, scripts/make_recurrent_twins.py): Keras GRU (reset_after=True) and
SimpleRNN as tf2onnx writes them without unroll (a Loop whose body reads the sequence by name), the same Keras
layers with unroll=True, and the PyTorch twins with the Keras weights (one ONNX GRU/RNN op), plus Keras LSTM (an
ONNX LSTM op either way). Hand-built models (onnx.helper) check the mechanics against the same computation written
out step by step.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
from onnx_lrp.core.errors import InputError, UnsupportedError

from recurrent_oracle import lrp_op, stab  # noqa: E402
from util import GOLDENS, IR_VERSION, assert_close, explain, rel_l2_items, to_bytes  # noqa: E402

TWINS = GOLDENS / "recurrent_twins"
COMPOSITES = ("epsilon", "epsilon-plus-flat", "epsilon-gamma-box", "epsilon-alpha2-beta1", "attnlrp", "cp-lrp")


def twin(path, comp="epsilon", **kw):
    """(relevance, first output) of a recurrent twin for class 0 of the stored input (box bounds -4, 4)."""
    res = explain(path, np.load(TWINS / "recurrent_twins.npz")["x"], comp, 0, box=(-4.0, 4.0), **kw)
    return res.relevance, next(iter(res.outputs.values()))


# ------------------------------------------------------------------------------------ Keras exports (tf2onnx)
@pytest.mark.parametrize("kind", ("gru", "rnn"))
def test_keras_loop_export_has_a_loop_and_is_explained(kind):
    """The committed exports are what the test is about: a Loop in the non-unrolled export, none in the others."""
    ops = {n: {x.op_type for x in onnx.load(TWINS / f"{kind}_b_{n}.onnx").graph.node}
           for n in ("loop", "unrolled", "torch")}
    assert "Loop" in ops["loop"] and "Loop" not in ops["unrolled"] and {"GRU": "gru", "RNN": "rnn"}.get(
        next(iter(ops["torch"] & {"GRU", "RNN"}))) == kind
    from onnx_lrp import load as loader
    graph = loader.load(TWINS / f"{kind}_b_loop.onnx").graph
    assert not any(n.op_type == "Loop" for n in graph) and sum(n.op_type == "Tanh" for n in graph) == 7


@pytest.mark.parametrize("kind", ("gru", "rnn"))
@pytest.mark.parametrize("comp", COMPOSITES)
def test_loop_unrolled_equals_keras_unroll_true(kind, comp):
    """The Loop unrolled at load time gets the same relevance as Keras' own unroll=True export of the same weights
    (with biases), for every built-in composite; the forward equals Keras'."""
    g = np.load(TWINS / "recurrent_twins.npz")
    r_loop, y_loop = twin(TWINS / f"{kind}_b_loop.onnx", comp)
    r_unr, y_unr = twin(TWINS / f"{kind}_b_unrolled.onnx", comp)
    assert_close(y_loop, g[f"{kind}_b"], rtol=1e-4, atol=1e-5)
    assert np.all(np.isfinite(r_loop))
    assert rel_l2_items(r_loop, r_unr).max() <= 1e-6


def _oracle(kind, bias, eps, target=0):
    """LRP of head(rnn(x)[:, -1]) from the torch twin's op weights: epsilon on the head, then the LSTM-LRP oracle."""
    m = onnx.load(TWINS / f"{kind}_{bias}_torch.onnx")
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in m.graph.node
                   if n.op_type == "Constant"})
    node = next(n for n in m.graph.node if n.op_type in ("GRU", "RNN", "LSTM"))
    w, r, b = (consts[n] for n in node.input[1:4])
    lbr = next((a.i for a in node.attribute if a.name == "linear_before_reset"), 0)
    gemm = next(n for n in m.graph.node if n.op_type == "Gemm")
    wh, bh = consts[gemm.input[1]].astype(np.float64), consts[gemm.input[2]].astype(np.float64)
    x = np.load(TWINS / "recurrent_twins.npz")["x"].transpose(1, 0, 2).astype(np.float64)
    op, H, (T, B) = node.op_type, r.shape[-1], x.shape[:2]
    zeros, c = np.zeros((1, B, H)), (np.zeros((1, B, H)) if node.op_type == "LSTM" else None)
    y = lrp_op(op, x, w, r, b, zeros, c, np.zeros((T, 1, B, H)), zeros, c, eps=eps, lbr=lbr)[0]
    z = y[-1, 0] @ wh.T + bh
    r_out = np.zeros_like(z)
    r_out[:, target] = z[:, target]
    ry = np.zeros((T, 1, B, H))
    ry[-1, 0] = y[-1, 0] * ((r_out / stab(z, eps)) @ wh)
    return lrp_op(op, x, w, r, b, zeros, c, ry, zeros, c, eps=eps, lbr=lbr)[3].transpose(1, 0, 2), z


@pytest.mark.parametrize("kind", ("gru", "rnn", "lstm"))
@pytest.mark.parametrize("bias", ("zb", "b"))
def test_keras_exports_against_the_oracle_and_the_torch_op(kind, bias):
    """LRP-0 (epsilon 0): the torch op, the Keras Loop (unrolled at load time) and the LSTM op Keras' LSTM becomes
    match the numpy LSTM-LRP oracle. Known difference, asserted so that it cannot grow silently: with biases, the
    written-out Keras GRU differs at time step 0 only (its reset gate r multiplies U h0 + b_hh = b_hh, a value of
    shapes and constants, so relevance r b_hh / a R_a enters the gate; the GRU op counts it as bias)."""
    oracle, z = _oracle(kind, bias, 0.0)
    g = np.load(TWINS / "recurrent_twins.npz")
    assert_close(z, g[f"{kind}_{bias}"], rtol=1e-4, atol=1e-5)
    r_torch, _ = twin(TWINS / f"{kind}_{bias}_torch.onnx", epsilon=0.0)
    r_loop, _ = twin(TWINS / f"{kind}_{bias}_loop.onnx", epsilon=0.0)
    assert rel_l2_items(r_torch, oracle).max() <= 1e-5
    if kind == "gru" and bias == "b":
        assert rel_l2_items(r_loop[:, 1:], oracle[:, 1:]).max() <= 1e-5
        assert 1e-5 < rel_l2_items(r_loop, oracle).max() < 3e-3
    else:
        assert rel_l2_items(r_loop, oracle).max() <= 1e-5
    if bias == "zb":  # conservation: no biases, LRP-0
        np.testing.assert_allclose(r_loop.sum(axis=(1, 2)), g[f"{kind}_zb"][:, 0], rtol=1e-5)


@pytest.mark.parametrize("kind,bias", (("gru", "zb"), ("rnn", "b"), ("lstm", "b")))
def test_flax_scan_export_equals_the_keras_export(kind, bias):
    """The Flax cell with the same weights run by jax.lax.scan, exported by jax2onnx as a Loop (unrolled at load
    time): the forward equals Keras', the relevance equals the Keras unroll=True export's (GRU and SimpleRNN: the same
    ops; LSTM: Flax has one MatMul per gate and its bias on the hidden map, so epsilon enters elsewhere: <= 1e-4)."""
    g = np.load(TWINS / "recurrent_twins.npz")
    ops = {n.op_type for n in onnx.load(TWINS / f"{kind}_{bias}_flax.onnx").graph.node}
    assert "Loop" in ops
    for comp, kw in (("epsilon", {"epsilon": 0.0}), ("epsilon-plus-flat", {}), ("attnlrp", {})):
        r_flax, y = twin(TWINS / f"{kind}_{bias}_flax.onnx", comp, **kw)
        r_keras, _ = twin(TWINS / f"{kind}_{bias}_unrolled.onnx", comp, **kw)
        assert_close(y, g[f"{kind}_{bias}"], rtol=1e-4, atol=1e-5)
        assert rel_l2_items(r_flax, r_keras).max() <= (1e-4 if kind == "lstm" else 1e-6), comp


def test_keras_lstm_op_equals_the_torch_lstm_op():
    """Keras' LSTM (an ONNX LSTM op via tf2onnx) and nn.LSTM with the same weights: the same relevance."""
    for comp in ("epsilon", "attnlrp"):
        r_keras, _ = twin(TWINS / "lstm_b_loop.onnx", comp)
        r_torch, _ = twin(TWINS / "lstm_b_torch.onnx", comp)
        assert rel_l2_items(r_keras, r_torch).max() <= 1e-6, comp


# ------------------------------------------------------------------------------------------- hand-built models
T, F, H, C = 4, 3, 2, 3
RNG = np.random.default_rng(0)
PARAMS = {"W": RNG.normal(size=(F, H)).astype(np.float32), "U": RNG.normal(size=(H, H)).astype(np.float32),
          "P": RNG.normal(size=(F, H)).astype(np.float32), "Wo": RNG.normal(size=(H, C)).astype(np.float32),
          "Wo2": RNG.normal(size=(T * H, C)).astype(np.float32)}


def _model(nodes, inputs, inits, extra=()):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", C])],
                              [numpy_helper.from_array(v, k) for k, v in {**PARAMS, **inits}.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = IR_VERSION
    return m


def _head(final, stacked_nth):
    """y = final @ Wo + flatten(stacked [N, T, H]) @ Wo2."""
    return [helper.make_node("Flatten", [stacked_nth], ["flat"], axis=1),
            helper.make_node("MatMul", [final, "Wo"], ["y1"]), helper.make_node("MatMul", ["flat", "Wo2"], ["y2"]),
            helper.make_node("Add", ["y1", "y2"], ["y"])]


X_IN = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", T, F])


def _step(k, h, xt, tag):
    """h' = Relu(x_t W + h U)."""
    return [helper.make_node("MatMul", [xt, "W"], [f"xw{tag}"]), helper.make_node("MatMul", [h, "U"], [f"hu{tag}"]),
            helper.make_node("Add", [f"xw{tag}", f"hu{tag}"], [f"a{tag}"]),
            helper.make_node("Relu", [f"a{tag}"], [f"h{tag}"])]


def written_out(reverse=False):
    """The recurrence written out by hand: h0 = x[:, 0] P; h_{k+1} = Relu(x[:, k] W + h_k U)."""
    nodes = [helper.make_node("Gather", ["x", "zero"], ["x0"], axis=1), helper.make_node("MatMul", ["x0", "P"], ["h"])]
    inits = {"zero": np.array(0, np.int64), "axes1": np.array([1], np.int64)}
    h, outs = "h", []
    for k in range(T):
        t = T - 1 - k if reverse else k
        inits[f"i{k}"] = np.array(t, np.int64)
        nodes.append(helper.make_node("Gather", ["x", f"i{k}"], [f"x{k}t"], axis=1))
        nodes += _step(k, h, f"x{k}t", str(k))
        h = f"h{k}"
        nodes.append(helper.make_node("Unsqueeze", [h, "axes1"], [f"u{k}"]))
        outs.append(f"u{k}")
    order = outs[::-1] if reverse else outs
    nodes.append(helper.make_node("Concat", order, ["stacked"], axis=1))
    return _model(nodes + _head(h, "stacked"), [X_IN], inits)


def loop_model(trip=T, dynamic=False, cond_counter=False, nested_if=False):
    """The same recurrence as a Loop: the body reads x by name (outer scope) at the iteration number, h is carried,
    h is also a scan output (stacked on a new axis 0, then transposed to [N, T, H]). ``cond_counter``: a while
    loop on a carried int counter (tf2onnx's form) with a trip count larger than needed. ``nested_if``: the carried
    state starts as a zero constant and the body picks ``x_t P`` at iteration 0 by an If on the iteration number
    (its branches read the body's ``xt`` and ``h_in``)."""
    body_nodes = [helper.make_node("Gather", ["x", "it"], ["xt"], axis=1)]
    if nested_if:
        then_g = helper.make_graph([helper.make_node("MatMul", ["xt", "P"], ["first_h"])], "then", [],
                                   [helper.make_tensor_value_info("first_h", TensorProto.FLOAT, ["N", H])])
        else_g = helper.make_graph([helper.make_node("Identity", ["h_in"], ["same_h"])], "else", [],
                                   [helper.make_tensor_value_info("same_h", TensorProto.FLOAT, ["N", H])])
        body_nodes += [helper.make_node("Equal", ["it", "zero"], ["is_first"]),
                       helper.make_node("If", ["is_first"], ["h_use"], name="pick", then_branch=then_g,
                                        else_branch=else_g)]
    body_nodes += _step(0, "h_use" if nested_if else "h_in", "xt", "_b")
    body_nodes += [helper.make_node("Identity", ["h_b"], ["h_out"]), helper.make_node("Identity", ["h_b"], ["h_scan"])]
    b_in = [helper.make_tensor_value_info("it", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["N", H])]
    b_out = [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["N", H]),
             helper.make_tensor_value_info("h_scan", TensorProto.FLOAT, ["N", H])]
    inits = {"zero": np.array(0, np.int64), "true": np.array(True)}
    loop_in = ["M", "true", "h"]
    if cond_counter:
        b_in.append(helper.make_tensor_value_info("n_in", TensorProto.INT32, []))
        b_out.insert(2, helper.make_tensor_value_info("n_out", TensorProto.INT32, []))
        body_nodes += [helper.make_node("Add", ["n_in", "one"], ["n_out"]),
                       helper.make_node("Less", ["n_out", "limit"], ["c_out"])]
        inits.update(one32=np.array(1, np.int32), limit=np.array(T, np.int32), n0=np.array(0, np.int32))
        loop_in.append("n0")
    else:
        body_nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    body = helper.make_graph(body_nodes, "body", b_in, b_out,
                             [numpy_helper.from_array(np.array(1, np.int32), "one")] if cond_counter else [])
    if cond_counter:  # the body's own constant "one" and the outer "one32" both work; use the body's
        body.node[-2].input[1] = "one"
    nodes = [helper.make_node("Gather", ["x", "zero"], ["x0"], axis=1), helper.make_node("MatMul", ["x0", "P"], ["h"])]
    if dynamic:
        nodes += [helper.make_node("Shape", ["x"], ["shp"]), helper.make_node("Gather", ["shp", "one64"], ["M"])]
        inits["one64"] = np.array(1, np.int64)
    else:
        inits["M"] = np.array(trip, np.int64)
    if nested_if:  # the initial state is a zero constant, replaced at iteration 0
        loop_in[2] = "h_zero"
        inits["h_zero"] = np.zeros((1, H), np.float32)
    outs = ["h_last"] + (["n_last"] if cond_counter else []) + ["scan"]
    nodes.append(helper.make_node("Loop", loop_in, outs, name="the_loop", body=body))
    nodes.append(helper.make_node("Transpose", ["scan"], ["stacked"], perm=[1, 0, 2]))
    x_in = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T" if dynamic else T, F])
    return _model(nodes + _head("h_last", "stacked"), [x_in], inits)


def scan_model(reverse=False):
    """The same recurrence as a Scan over axis 1 of x, the stacked output on axis 1."""
    body = helper.make_graph(
        _step(0, "h_in", "xt", "_b") + [helper.make_node("Identity", ["h_b"], ["h_out"]),
                                        helper.make_node("Identity", ["h_b"], ["h_scan"])], "body",
        [helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["N", H]),
         helper.make_tensor_value_info("xt", TensorProto.FLOAT, ["N", F])],
        [helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["N", H]),
         helper.make_tensor_value_info("h_scan", TensorProto.FLOAT, ["N", H])])
    nodes = [helper.make_node("Gather", ["x", "zero"], ["x0"], axis=1), helper.make_node("MatMul", ["x0", "P"], ["h"]),
             helper.make_node("Scan", ["h", "x"], ["h_last", "stacked"], name="the_scan", body=body,
                              num_scan_inputs=1, scan_input_axes=[1], scan_output_axes=[1],
                              scan_input_directions=[int(reverse)], scan_output_directions=[int(reverse)])]
    return _model(nodes + _head("h_last", "stacked"), [X_IN], {"zero": np.array(0, np.int64)})


XS = RNG.normal(size=(3, T, F)).astype(np.float32)


def _run(model, comp="epsilon", **kw):
    res = onnx_lrp.Explainer(to_bytes(model), composite=comp, **kw).explain(XS, target=1)
    return res.relevance, res.outputs["y"]


@pytest.mark.parametrize("make", (loop_model, lambda: loop_model(trip=2 ** 62, cond_counter=True),
                                  lambda: loop_model(nested_if=True), scan_model, lambda: scan_model(reverse=True)),
                         ids=("loop", "while-counter", "if-in-loop", "scan", "scan-reverse"))
def test_unrolled_control_flow_equals_the_written_out_recurrence(make):
    """Loop (outer-scope read of x at the iteration number, carried h, scan output; also as a while loop on a
    carried counter with a huge trip count as tf2onnx writes while loops, and with an If on the iteration number
    inside) and Scan (also reversed) explained = the recurrence written out by hand: same forward as
    onnxruntime on the original model, same relevance (epsilon, LRP-0), and LRP-0 conserves (no biases)."""
    import onnxruntime as ort
    model = make()
    reverse = any(n.op_type == "Scan" and any(a.name == "scan_input_directions" and a.ints[0] for a in n.attribute)
                  for n in model.graph.node)
    ref = written_out(reverse)
    y_ort = ort.InferenceSession(to_bytes(model), providers=["CPUExecutionProvider"]).run(["y"], {"x": XS})[0]
    for comp, kw in (("epsilon", {}), ("epsilon", {"epsilon": 0.0}), ("epsilon-plus-flat", {})):
        r, y = _run(model, comp, **kw)
        r_ref, y_ref = _run(ref, comp, **kw)
        assert_close(y, y_ort, rtol=1e-5, atol=1e-6)
        assert_close(y_ref, y_ort, rtol=1e-5, atol=1e-6)
        assert rel_l2_items(r, r_ref).max() <= 1e-6, (comp, kw)
        if kw:
            np.testing.assert_allclose(r.sum(axis=(1, 2)), y[:, 1], rtol=1e-5)


def test_dynamic_trip_count_is_refused_in_one_line_with_the_other_unsupported_nodes():
    """A Loop whose trip count is a dynamic sequence length: refused naming the Loop and what to do, listed together
    with another unsupported node (a custom op on the path), not one at a time."""
    m = loop_model(dynamic=True)
    n = len(m.graph.node)
    m.graph.node[n - 1].input[1] = "y2c"  # y = y1 + custom(y2)
    m.graph.node.insert(n - 1, helper.make_node("Mystery", ["y2"], ["y2c"], name="mystery", domain="custom.x"))
    m.opset_import.append(helper.make_opsetid("custom.x", 1))
    with pytest.raises(UnsupportedError) as info:
        onnx_lrp.Explainer(to_bytes(m), composite="epsilon")
    msg = str(info.value)
    assert "\n" not in msg and "the_loop" in msg and "mystery" in msg and "custom.x::Mystery" in msg
    assert "trip count is not a constant" in msg and "fixed sequence length" in msg and "unroll=True" in msg


def test_too_long_loop_is_refused():
    from onnx_lrp.load.passes.control_flow import MAX_UNROLLED
    with pytest.raises(UnsupportedError) as info:
        onnx_lrp.Explainer(to_bytes(loop_model(trip=MAX_UNROLLED)), composite="epsilon")
    assert "would write" in str(info.value) and "the_loop" in str(info.value)


def _if_model(cond_nodes, cond_inputs=(), inits=None):
    """y = If(cond, then: relu(x) @ A, else: x @ B) with x [N, 4]; the branches read x and A/B by name."""
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["rx"]), helper.make_node("MatMul", ["rx", "A"],
                                                                                          ["t_out"])],
                               "then", [], [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, ["N", 2])])
    else_g = helper.make_graph([helper.make_node("MatMul", ["x", "B"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, ["N", 2])])
    nodes = list(cond_nodes) + [helper.make_node("If", ["cond"], ["y"], name="the_if", then_branch=then_g,
                                                 else_branch=else_g)]
    rng = np.random.default_rng(1)
    params = {"A": rng.normal(size=(4, 2)).astype(np.float32), "B": rng.normal(size=(4, 2)).astype(np.float32)}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])]
                              + list(cond_inputs), [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                              [numpy_helper.from_array(v, k) for k, v in {**params, **(inits or {})}.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = IR_VERSION
    return m, params


def test_if_on_a_static_shape_is_inlined():
    """TorchScript's `if x.dim() == 2`: the condition folds to true, the then-branch is inlined; relevance equals
    that of the branch alone (relu(x) @ A: LRP-0 = gradient x input)."""
    m, p = _if_model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Size", ["s"], ["rank"]),
                      helper.make_node("Equal", ["rank", "two"], ["cond"])], inits={"two": np.array(2, np.int64)})
    x = np.random.default_rng(2).normal(size=(5, 4)).astype(np.float32)
    res = onnx_lrp.Explainer(to_bytes(m), composite="epsilon", epsilon=0.0).explain(x, target=1)
    assert_close(res.outputs["y"], np.maximum(x, 0) @ p["A"], rtol=1e-5)
    assert_close(res.relevance, np.maximum(x, 0) * p["A"][:, 1], rtol=1e-5, atol=1e-7)


def test_if_on_an_integer_input_needs_a_constant():
    """silero-vad's `if sr == 16000`: refused naming the input and how to bind it; bound, the branch is taken and the
    input disappears from the model's inputs (also from the command line: --constant sr=8000)."""
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [])
    m, p = _if_model([helper.make_node("Equal", ["sr", "rate"], ["cond"])], [sr],
                     inits={"rate": np.array(16000, np.int64)})
    with pytest.raises(UnsupportedError) as info:
        onnx_lrp.Explainer(to_bytes(m), composite="epsilon")
    assert "integer input(s) sr" in str(info.value) and "constants={'sr'" in str(info.value) \
        and "--constant sr=" in str(info.value)
    x = np.random.default_rng(3).normal(size=(2, 4)).astype(np.float32)
    for rate, want in ((16000, np.maximum(x, 0) @ p["A"]), (8000, x @ p["B"])):
        ex = onnx_lrp.Explainer(to_bytes(m), composite="epsilon", constants={"sr": rate})
        assert [i.name for i in ex.inputs] == ["x"]
        assert_close(ex.explain(x).outputs["y"], want, rtol=1e-5)
    with pytest.raises(InputError, match="model's inputs are x, sr"):
        onnx_lrp.Explainer(to_bytes(m), constants={"rate": 1})
    with pytest.raises(InputError, match="must be a number"):
        onnx_lrp.Explainer(to_bytes(m), constants={"sr": 1.5})


def test_cli_constant_option(tmp_path):
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [])
    m, _ = _if_model([helper.make_node("Equal", ["sr", "rate"], ["cond"])], [sr],
                     inits={"rate": np.array(16000, np.int64)})
    path = tmp_path / "m.onnx"
    path.write_bytes(to_bytes(m))
    runner = CliRunner()
    bad = runner.invoke(main, ["inspect", str(path), "-c", "epsilon"])
    assert bad.exit_code == 1 and "--constant sr=" in bad.output
    ok = runner.invoke(main, ["inspect", str(path), "-c", "epsilon", "--constant", "sr=16000"])
    assert ok.exit_code == 0, ok.output
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    out = runner.invoke(main, ["explain", str(path), str(tmp_path / "x.npy"), "-c", "epsilon", "--constant", "sr=8000",
                               "-o", str(tmp_path / "r.npy")])
    assert out.exit_code == 0, out.output
    assert np.load(tmp_path / "r.npy").shape == (2, 4)
    wrong = runner.invoke(main, ["inspect", str(path), "--constant", "sr"])
    assert wrong.exit_code == 2 and "NAME=VALUE" in wrong.output


def test_onnx_backend_loop_with_its_trip_count_bound(monkeypatch):
    """onnx's own test_loop11 (trip count and condition are graph inputs; the body slices a constant by the
    iteration number and accumulates into y): refused naming the input to bind; bound to the test's values, the
    forward equals onnx's expected outputs, and the relevance of y is its own value (the rest is constants)."""
    import onnx.backend.test.case.node.loop as backend_loop
    got = {}
    monkeypatch.setattr(backend_loop, "expect", lambda node, inputs, outputs, name, **kw: got.setdefault(
        name, (node, inputs, outputs, kw)))
    backend_loop.Loop.export_loop_11()
    node, (trip, cond, y), expected, kw = got["test_loop11"]
    info = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in zip(list(node.input) + list(node.output), [trip, cond, y] + list(expected))]
    model = helper.make_model(helper.make_graph([node], "test_loop11", info[:3], info[3:]), **kw)
    model.ir_version = IR_VERSION
    with pytest.raises(UnsupportedError) as refused:
        onnx_lrp.Explainer(to_bytes(model))
    assert "integer input(s) trip_count" in str(refused.value) and "constants={'trip_count'" in str(refused.value)
    ex = onnx_lrp.Explainer(to_bytes(model), composite="epsilon", epsilon=0.0,
                            constants={"trip_count": int(trip), "cond": bool(cond)})
    assert [i.name for i in ex.inputs] == ["y"]
    res = ex.explain(y)
    for out, want in zip(res.outputs.values(), expected):
        assert_close(out, want, rtol=1e-6)
    assert_close(res.relevance, y, rtol=1e-5)


def _batch_check_model(batch="N"):
    """`if x.shape[0] == 1`: relu(x) @ A for a single sample, else x @ B; ``batch`` the declared size of axis 0."""
    m, p = _if_model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"]),
                      helper.make_node("Equal", ["n", "one"], ["cond"])],
                     inits={"zero": np.array(0, np.int64), "one": np.array(1, np.int64)})
    m.graph.input[0].type.tensor_type.shape.dim[0].Clear()
    if isinstance(batch, int):
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = batch
    else:
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = batch
    return m, p


def test_if_on_a_dynamic_dimension_is_folded_with_input_shapes():
    """silero-vad's decoder `if x.shape[0] == 1` on a dynamic batch: refused naming x and --input-shape; with
    input_shapes the branch folds, and relevance equals the model exported with the static shape directly and the
    branch's oracle (relu(x) @ A with LRP-0: gradient x input; x @ B for a batch of 3)."""
    m, p = _batch_check_model()
    with pytest.raises(UnsupportedError) as info:
        onnx_lrp.Explainer(to_bytes(m), composite="epsilon")
    msg = str(info.value)
    assert "\n" not in msg and "the_if" in msg and "dynamic dimensions of x" in msg
    assert "input_shapes={'x'" in msg and "--input-shape x=" in msg
    x = np.random.default_rng(4).normal(size=(1, 4)).astype(np.float32)
    for n, want in ((1, np.maximum(x, 0) * p["A"][:, 1]), (3, None)):
        xs = np.concatenate([x] + [x * (k + 2) for k in range(n - 1)]) if n > 1 else x
        fixed = onnx_lrp.Explainer(to_bytes(m), composite="epsilon", epsilon=0.0, input_shapes={"x": (n, 4)})
        static = onnx_lrp.Explainer(to_bytes(_batch_check_model(n)[0]), composite="epsilon", epsilon=0.0)
        assert fixed.inputs[0].dims == static.inputs[0].dims == (n, 4)
        res, ref = fixed.explain(xs, target=1), static.explain(xs, target=1)
        np.testing.assert_array_equal(res.relevance, ref.relevance)
        assert_close(res.outputs["y"], (np.maximum(xs, 0) @ p["A"]) if n == 1 else xs @ p["B"],
                                   rtol=1e-5)
        assert_close(res.relevance, want if want is not None else xs * p["B"][:, 1], rtol=1e-5,
                                   atol=1e-7)
    with pytest.raises(InputError, match="input 'x' has shape 1x5"):  # fed inputs are checked against the fixed dims
        onnx_lrp.Explainer(to_bytes(m), composite="epsilon", input_shapes={"x": (1, 4)}).explain(
            np.ones((1, 5), np.float32))


def test_dynamic_trip_count_is_unrolled_with_input_shapes():
    """A Loop over a dynamic sequence length: with input_shapes fixing it, the same relevance as the Loop exported
    with the static length (and the refusal suggests --input-shape)."""
    with pytest.raises(UnsupportedError, match="--input-shape x="):
        onnx_lrp.Explainer(to_bytes(loop_model(dynamic=True)), composite="epsilon")
    r, y = _run(loop_model(dynamic=True), input_shapes={"x": (3, T, F)})
    r_ref, y_ref = _run(loop_model(dynamic=False))
    assert_close(y, y_ref, rtol=1e-6)
    assert rel_l2_items(r, r_ref).max() <= 1e-6


@pytest.mark.parametrize("shapes, match", [
    ({"y": (1, 4)}, "cannot fix the shape of 'y': the model's inputs are x"),
    ({"x": (1, 5)}, "input 'x' has the static size 4 on axis 1, not 5; only its dynamic dimensions"),
    ({"x": (1,)}, "for input 'x' has rank 1; the input's is Nx4 \\(rank 2\\)"),
    ({"x": (1.5, 4)}, "shape for input 'x' must be positive integer sizes"),
    ({"x": (0, 4)}, "shape for input 'x' must be positive integer sizes"),
    ({"x": (1e30, 4)}, "shape for input 'x' must be positive integer sizes"),
    ({"x": "1x4"}, "shape for input 'x' must be positive integer sizes"),
    ([("x", (1, 4))], "input_shapes must be a dict"),
])
def test_input_shapes_refusals(shapes, match):
    m, _ = _batch_check_model()
    with pytest.raises(InputError, match=match) as info:
        onnx_lrp.Explainer(to_bytes(m), composite="epsilon", input_shapes=shapes)
    assert "\n" not in str(info.value)


def test_input_shapes_shared_symbol():
    """Two inputs with the same symbolic dimension (silero's input [batch, T] and state [2, batch, 128]) cannot get
    two sizes for it; an input not given takes the size fixed for the symbol on another."""
    m, _ = _batch_check_model()
    m.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, "N", "K"]))
    with pytest.raises(InputError, match="inputs 'x' and 'w' share the dimension 'N'; it was fixed to 1 and 3"):
        onnx_lrp.Explainer(to_bytes(m), composite="epsilon", input_shapes={"x": (1, 4), "w": (2, 3, 5)})
    from onnx_lrp.load import fix_input_shapes
    fixed = fix_input_shapes(m, {"x": (1, 4)})
    dims = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim] for v in fixed.graph.input}
    assert dims == {"x": [1, 4], "w": [2, 1, "K"]}
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"  # the caller's model is left as it was


def test_torchscript_if_on_the_batch_size():
    """A real export: TorchScript keeps `if x.shape[0] == 1` as an If on Shape -> Gather -> Equal. Dynamic batch:
    refused naming x; with input_shapes: the relevance of the export with a static batch and LRP-0 = gradient x
    input from torch autograd, for either branch (batch 1: relu then Linear a, batch 3: Linear b)."""
    torch = pytest.importorskip("torch")
    import io

    class Guarded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)

        def forward(self, x):
            if x.shape[0] == 1:
                return self.a(torch.relu(x))
            return self.b(x)

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script is deprecated; the TorchScript exporter needs it for the If
        module = torch.jit.script(Guarded().eval())

    def export(batch, dynamic):
        f = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, (torch.randn(batch, 4),), f, input_names=["x"], output_names=["y"],
                              opset_version=17, dynamo=False,
                              dynamic_axes={"x": {0: "N"}, "y": {0: "N"}} if dynamic else None)
        return f.getvalue()

    dyn = export(1, True)
    assert "If" in [n.op_type for n in onnx.load_from_string(dyn).graph.node]
    with pytest.raises(UnsupportedError, match="dynamic dimensions of x .*--input-shape x="):
        onnx_lrp.Explainer(dyn, composite="epsilon")
    rng = np.random.default_rng(7)
    for batch in (1, 3):
        x = rng.normal(size=(batch, 4)).astype(np.float32)
        res = onnx_lrp.Explainer(dyn, composite="epsilon", epsilon=0.0,
                                 input_shapes={"x": (batch, 4)}).explain(x, target=2)
        ref = onnx_lrp.Explainer(export(batch, False), composite="epsilon", epsilon=0.0).explain(x, target=2)
        xt = torch.tensor(x, requires_grad=True)
        y = module(xt)
        y[:, 2].sum().backward()
        assert_close(res.outputs["y"], y.detach().numpy(), rtol=1e-5, atol=1e-6)
        assert_close(res.relevance, ref.relevance, rtol=1e-6, atol=1e-8)
        assert_close(res.relevance, (xt.grad * xt).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_cli_input_shape_option(tmp_path):
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main
    m, p = _batch_check_model()
    path = tmp_path / "m.onnx"
    path.write_bytes(to_bytes(m))
    runner = CliRunner()
    bad = runner.invoke(main, ["inspect", str(path), "-c", "epsilon"])
    assert bad.exit_code == 1 and "--input-shape x=" in bad.output
    ok = runner.invoke(main, ["inspect", str(path), "-c", "epsilon", "--input-shape", "x=1x4"])
    assert ok.exit_code == 0, ok.output
    x = np.random.default_rng(6).normal(size=(1, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = runner.invoke(main, ["explain", str(path), str(tmp_path / "x.npy"), "-c", "epsilon", "--epsilon", "0",
                               "--input-shape", "x=1x4", "-t", "1", "-o", str(tmp_path / "r.npy")])
    assert out.exit_code == 0, out.output
    assert_close(np.load(tmp_path / "r.npy"), np.maximum(x, 0) * p["A"][:, 1], rtol=1e-5, atol=1e-7)
    rw = runner.invoke(main, ["rewrite", str(path), "-c", "epsilon", "--input-shape", "x=1x4",
                              "-o", str(tmp_path / "lrp.onnx")])
    assert rw.exit_code == 0, rw.output
    for args, match in ((["--input-shape", "x"], "NAME=SIZES"), (["--input-shape", "x=1xfour"], "integers joined"),
                        (["--input-shape", "x=2x5"], "static size 4 on axis 1")):
        wrong = runner.invoke(main, ["inspect", str(path), *args])
        assert wrong.exit_code == 2 and match in wrong.output, wrong.output


def _scalar_scan():
    """onnx's test_scan9_scalar: a running sum over x [5] from a scalar initial state; y the final sum (rank 0),
    z the per-step sums (rank 0 each, stacked to [5])."""
    body = helper.make_graph([helper.make_node("Add", ["sum_in", "next"], ["sum_out"]),
                              helper.make_node("Identity", ["sum_out"], ["scan_out"])], "body",
                             [helper.make_tensor_value_info("sum_in", TensorProto.FLOAT, []),
                              helper.make_tensor_value_info("next", TensorProto.FLOAT, [])],
                             [helper.make_tensor_value_info("sum_out", TensorProto.FLOAT, []),
                              helper.make_tensor_value_info("scan_out", TensorProto.FLOAT, [])])
    g = helper.make_graph([helper.make_node("Scan", ["initial", "x"], ["y", "z"], body=body, num_scan_inputs=1)],
                          "scan9", [helper.make_tensor_value_info("initial", TensorProto.FLOAT, []),
                                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, []),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [5])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = IR_VERSION
    return m


def test_scan_with_scalar_state_and_scan_outputs_keeps_their_shapes():
    """Outputs of the shapes onnxruntime gives for the model itself (was (1,) and (5, 1): numpy's
    ascontiguousarray makes a scalar feed [1]); the scalar input's relevance is a scalar. LRP-0 of a sum: each
    addend gets its own value (y = initial + sum x)."""
    import onnxruntime as ort

    m = _scalar_scan()
    feeds = {"initial": np.array(2.0, np.float32), "x": np.arange(1, 6, dtype=np.float32)}
    plain = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    res = onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon", epsilon=0.0).explain(feeds)
    assert [res.outputs[n].shape for n in ("y", "z")] == [a.shape for a in plain] == [(), (5,)]
    np.testing.assert_array_equal(res.outputs["y"], plain[0])
    np.testing.assert_array_equal(res.outputs["z"], plain[1])
    assert res.relevance["initial"].shape == () and res.relevance["x"].shape == (5,)
    # y is one item (no batch axis): relevance sum = y, each addend its own value
    np.testing.assert_allclose(res.relevance["initial"], 2.0, rtol=1e-6)
    assert_close(res.relevance["x"], feeds["x"], rtol=1e-6)
