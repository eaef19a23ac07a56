"""Recurrent layers (ONNX LSTM, GRU, RNN) against a numpy LRP-for-LSTMs oracle (tests/recurrent_oracle.py, from
Arras et al. 2017/2019 and the ONNX op definitions), conservation with zero biases, and real torch exports."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from recurrent_oracle import lrp_op, stab
from util import assert_close, explain_probe, make_model, node, run, to_bytes

import onnx_lrp
from onnx_lrp.core.errors import UnsupportedError
from onnx_lrp.rules import Entry, Gradient, load_composite

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
T, B, I, H = 5, 3, 3, 4


def composite(name="epsilon"):
    base = load_composite(name)
    return dataclasses.replace(base, entries=(Entry({"name": "probe*"}, Gradient()),) + base.entries)


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


def single(op, direction="forward", layout=0, lens=None, bias=True, seed=0, attrs=None, peephole=False,
           states="inputs"):
    """One recurrent node with random weights; initial states as graph inputs ("inputs") or absent (None)."""
    rng = np.random.default_rng(seed)
    G, D = GATES[op], 2 if direction == "bidirectional" else 1
    w = (rng.normal(size=(D, G * H, I)) * 0.6).astype(np.float32)
    r = (rng.normal(size=(D, G * H, H)) * 0.6).astype(np.float32)
    b = (rng.normal(size=(D, 2 * G * H)) * 0.3 * bias).astype(np.float32)
    x = rng.normal(size=(T, B, I)).astype(np.float32)
    h0 = rng.normal(size=(D, B, H)).astype(np.float32) * (states == "inputs")
    c0 = rng.normal(size=(D, B, H)).astype(np.float32) * (states == "inputs")
    p = (rng.normal(size=(D, 3 * H)) * 0.5).astype(np.float32) if peephole else None
    if layout == 1:
        x, h0, c0 = x.swapaxes(0, 1).copy(), h0.swapaxes(0, 1).copy(), c0.swapaxes(0, 1).copy()
    has_c = op == "LSTM"
    ins = ["x", "W", "R", "B", "lens" if lens is not None else "",
           "h0" if states == "inputs" else "", "c0" if has_c and states == "inputs" else "", "P" if peephole else ""]
    while ins and ins[-1] == "":
        ins.pop()
    outs = ["Y", "Yh"] + (["Yc"] if has_c else [])
    inputs = {"x": x.shape}
    feeds = {"x": x}
    if states == "inputs":
        inputs["h0"], feeds["h0"] = h0.shape, h0
        if has_c:
            inputs["c0"], feeds["c0"] = c0.shape, c0
    if lens is not None:
        inputs["lens"], feeds["lens"] = ((B,), np.int32), np.asarray(lens, np.int32)
    inits = {"W": w, "R": r, "B": b}
    if peephole:
        inits["P"] = p
    m = make_model([node(op, ins, outs, name="rnn", hidden_size=H, direction=direction, layout=layout,
                         **(attrs or {}))], inputs, outs, inits=inits)
    return m, feeds, dict(w=w, r=r, b=b, h0=h0, c0=c0 if has_c else None, p=p, outs=outs, D=D)


def explain_single(m, feeds, spec, op, direction, layout, lens, eps, seed=1, which=None, **kw):
    """Explain a random linear probe of the op's outputs; returns (explanation, oracle tuple, the relevance entering
    each probed output: start one-hot, the gradient rule on the probe gives it ``nb * c``)."""
    rng = np.random.default_rng(seed)
    D = spec["D"]
    shapes = {"Y": (T, D, B, H) if layout == 0 else (B, T, D, H), "Yh": (D, B, H) if layout == 0 else (B, D, H)}
    shapes["Yc"] = shapes["Yh"]
    which = which or spec["outs"]
    cs = [rng.normal(size=shapes[o]).astype(np.float32) for o in which]
    nb = next(iter(feeds.values())).shape[0]  # the explainer's "batch" (axis 0 of the input)
    res, entering = explain_probe(m, which, cs, composite(), feeds, nb, keep_outputs=True, epsilon=eps)
    r = dict(zip(which, entering))
    zero = {o: np.zeros(shapes[o]) for o in ("Y", "Yh", "Yc")}
    oracle = lrp_op(op, feeds["x"], spec["w"], spec["r"], spec["b"], spec["h0"], spec["c0"],
                    r.get("Y", zero["Y"]), r.get("Yh", zero["Yh"]), r.get("Yc", zero["Yc"]) if op == "LSTM" else None,
                    direction=direction, layout=layout, lens=lens, eps=eps, p=spec["p"], **kw)
    return res, oracle, r


CASES = [(op, d, layout, lens) for op in ("LSTM", "GRU", "RNN") for d in ("forward", "reverse", "bidirectional")
         for layout, lens in ((0, None), (1, (5, 2, 4)))]


@pytest.mark.parametrize("op,direction,layout,lens", CASES)
def test_single_op_matches_the_numpy_oracle(op, direction, layout, lens):
    """Every direction; layout 0 without and layout 1 with sequence_lens (padded items); initial states as
    inputs; relevance entering Y, Y_h and Y_c at once. The oracle also checks the forward against onnxruntime."""
    m, feeds, spec = single(op, direction, layout, lens, seed=len(op) + layout)
    eps = 1e-3
    res, (Y, Yh, Yc, Rx, Rh0, Rc0), _ = explain_single(m, feeds, spec, op, direction, layout, lens, eps)
    assert rel_err(res.outputs["Y"], Y) < 1e-5 and rel_err(res.outputs["Yh"], Yh) < 1e-5  # oracle forward = ORT
    assert rel_err(res.relevance["x"], Rx) < 1e-4
    assert rel_err(res.relevance["h0"], Rh0) < 1e-4
    if op == "LSTM":
        assert rel_err(res.relevance["c0"], Rc0) < 1e-4
    if lens is not None:  # padded steps of an item carry no relevance
        x_rel = res.relevance["x"]
        for item, n in enumerate(lens):
            assert np.all(x_rel[item, n:] == 0)


@pytest.mark.parametrize("op,attrs,peephole", [("LSTM", {}, True), ("LSTM", {"clip": 0.7}, False),
                                               ("LSTM", {"input_forget": 1}, True),
                                               ("GRU", {"linear_before_reset": 1}, False),
                                               ("GRU", {"clip": 0.5}, False), ("RNN", {"clip": 0.5}, False),
                                               ("RNN", {"activations": ["Relu"]}, False)])
def test_op_variants_match_the_oracle(op, attrs, peephole):
    """Peepholes, clip, coupled gates (input_forget), GRU's linear_before_reset, a Relu RNN; relevance entering Y_h
    alone (the last state)."""
    m, feeds, spec = single(op, attrs=attrs, peephole=peephole, seed=7)
    ort_y = run(m, feeds)[0]
    kw = {"lbr": attrs.get("linear_before_reset", 0)} if op == "GRU" else {}
    if "activations" in attrs:
        kw["acts"] = tuple(attrs["activations"])
    if "clip" in attrs:  # the activations' inputs clipped; the epsilon rule reads the unclipped linear map
        kw["clip"] = attrs["clip"]
    if "input_forget" in attrs:
        kw["input_forget"] = attrs["input_forget"]
    res, (Y, Yh, Yc, Rx, Rh0, Rc0), _ = explain_single(m, feeds, spec, op, "forward", 0, None, 1e-3, which=["Yh"], **kw)
    assert rel_err(Y, ort_y) < 1e-5
    assert rel_err(res.relevance["x"], Rx) < 1e-4 and rel_err(res.relevance["h0"], Rh0) < 1e-4
    assert np.abs(Rx).max() > 0


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_conservation_with_zero_biases(op):
    """Zero biases, tiny epsilon: input + initial-state relevance = the relevance entering Y and Y_h."""
    m, feeds, spec = single(op, "bidirectional", bias=False, seed=3)
    res, _, r_out = explain_single(m, feeds, spec, op, "bidirectional", 0, None, 1e-9)
    total_in = sum(float(np.sum(v, dtype=np.float64)) for v in res.relevance.values())
    total_out = sum(float(v.sum()) for v in r_out.values())
    assert abs(total_in - total_out) < 1e-5 * sum(float(np.abs(v).sum()) for v in r_out.values())


def test_epsilon_zero_guards_exact_zeros():
    """epsilon = 0 (LRP-0): an all-zero input makes every pre-activation and cell state exactly 0 (zero biases and
    states): the relevance is 0, not NaN."""
    m, feeds, spec = single("LSTM", bias=False, states=None)
    feeds = {"x": np.zeros_like(feeds["x"])}
    res, _, _ = explain_single(m, feeds, spec | {"h0": np.zeros((1, B, H)), "c0": np.zeros((1, B, H))}, "LSTM",
                            "forward", 0, None, 0.0)
    assert np.all(np.isfinite(res.relevance)) and np.all(res.relevance == 0)


def test_unsupported_attributes_are_refused_in_one_line():
    m, _, _ = single("LSTM", attrs={"activation_alpha": [0.5]})
    m2, _, _ = single("GRU", attrs={"activations": ["HardSigmoid", "Tanh"]})
    for model, what in ((m, "activation_alpha"), (m2, "activations")):
        with pytest.raises(UnsupportedError) as err:
            onnx_lrp.Explainer(to_bytes(model), composite="epsilon")
        assert what in str(err.value) and "rnn" in str(err.value) and "\n" not in str(err.value).strip()


def test_composite_without_recurrent_rule_is_refused():
    m, _, _ = single("GRU")
    with pytest.raises(UnsupportedError, match="recurrent"):
        onnx_lrp.Explainer(to_bytes(m), composite=dataclasses.replace(load_composite("epsilon"), entries=tuple(
            e for e in load_composite("epsilon").entries if e.match.get("kind") != "recurrent")))


# ------------------------------------------------------------------------------------------ torch exports
_TORCH_ORDER = {"LSTM": [0, 3, 1, 2], "GRU": [1, 0, 2], "RNN": [0]}  # torch (ifgo / rzn) -> ONNX (iofc / zrh)


def _onnx_params(rnn, op, layer, d):
    """The ONNX W, R, B of one layer and direction, from torch's parameters."""
    sfx = f"_l{layer}" + ("_reverse" if d else "")
    g = {k: getattr(rnn, k + sfx).detach().numpy().astype(np.float64) for k in ("weight_ih", "weight_hh", "bias_ih",
                                                                                 "bias_hh")}
    order = _TORCH_ORDER[op]

    def reorder(a):
        return np.concatenate([np.split(a, len(order))[k] for k in order])
    return reorder(g["weight_ih"]), reorder(g["weight_hh"]), np.concatenate([reorder(g["bias_ih"]),
                                                                             reorder(g["bias_hh"])])


def torch_oracle(net, op, x, target, eps):
    """LRP of net = head(rnn(x)[:, -1]) by hand: epsilon on the head, then each layer's oracle, top to bottom."""
    rnn, head = net.rnn, net.head
    D, H, L = 2 if rnn.bidirectional else 1, rnn.hidden_size, rnn.num_layers
    nb, nt = x.shape[:2]
    params, inputs = [], [x.transpose(1, 0, 2).astype(np.float64)]
    zeros = np.zeros((D, nb, H))
    for layer in range(L):
        w, r, b = (np.stack(a) for a in zip(*[_onnx_params(rnn, op, layer, d) for d in range(D)]))
        params.append((w, r, b))
        Y = lrp_op(op, inputs[-1], w, r, b, zeros, zeros if op == "LSTM" else None, np.zeros((nt, D, nb, H)), zeros,
                   zeros if op == "LSTM" else None, direction="bidirectional" if D == 2 else "forward",
                   eps=eps, lbr=1)[0]
        inputs.append(Y.transpose(0, 2, 1, 3).reshape(nt, nb, D * H))
    last = inputs[-1][-1]
    wh, bh = head.weight.detach().numpy().astype(np.float64), head.bias.detach().numpy().astype(np.float64)
    z = last @ wh.T + bh
    r_out = np.zeros_like(z)
    r_out[np.arange(nb), target] = z[np.arange(nb), target]
    r_last = last * ((r_out / stab(z, eps)) @ wh)
    ry = np.zeros((nt, D, nb, H))
    ry[-1] = r_last.reshape(nb, D, H).transpose(1, 0, 2)
    for layer in reversed(range(L)):
        w, r, b = params[layer]
        rx = lrp_op(op, inputs[layer], w, r, b, zeros, zeros if op == "LSTM" else None, ry, zeros,
                    zeros if op == "LSTM" else None, direction="bidirectional" if D == 2 else "forward", eps=eps,
                    lbr=1)[3]
        if layer:
            ry = rx.reshape(nt, nb, D, H).transpose(0, 2, 1, 3)
    return rx.transpose(1, 0, 2)


def _export(op, bidirectional, layers, dynamic, path, seed=0, bias=True, dynamo=False):
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(torch.nn, op)(3, 5, num_layers=layers, bidirectional=bidirectional, batch_first=True,
                                             bias=bias)
            self.head = torch.nn.Linear(5 * (2 if bidirectional else 1), 4, bias=bias)

        def forward(self, x):
            y, _ = self.rnn(x)
            return self.head(y[:, -1])

    torch.manual_seed(seed)
    net = Net().eval()
    if dynamo:
        torch.onnx.export(net, (torch.zeros(2, 6, 3),), str(path), input_names=["x"], output_names=["logits"],
                          opset_version=18, dynamo=True, verbose=False)
        return net
    kw = dict(dynamic_axes={"x": {0: "batch", 1: "time"}}) if dynamic else {}
    torch.onnx.export(net, torch.zeros(2, 6, 3), str(path), input_names=["x"], output_names=["logits"],
                      opset_version=17, dynamo=False, **kw)
    return net


@pytest.mark.parametrize("op,bidirectional,layers", [("LSTM", True, 2), ("GRU", True, 1), ("RNN", False, 2),
                                                     ("LSTM", False, 1)])
def test_torch_export_matches_the_oracle(tmp_path, op, bidirectional, layers):
    """nn.LSTM / nn.GRU / nn.RNN (batch_first, bidirectional, stacked) with a Linear head, exported by TorchScript
    with a dynamic batch and sequence length: relevance = the oracle's, at the exported length and another one;
    the CNN composites leave the recurrent layer and the head (epsilon) alike."""
    net = _export(op, bidirectional, layers, True, tmp_path / "m.onnx")
    rng = np.random.default_rng(5)
    for nt in (6, 9):
        x = rng.normal(size=(3, nt, 3)).astype(np.float32)
        for name in ("epsilon", "epsilon-plus-flat"):
            res = onnx_lrp.Explainer(str(tmp_path / "m.onnx"), composite=name, epsilon=1e-3).explain(x)
            want = torch_oracle(net, op, x, res.target, 1e-3)
            assert rel_err(res.relevance, want) < 1e-4, (nt, name)


def test_torch_static_and_dynamic_length_exports_agree(tmp_path):
    """The same LSTM exported with a fixed and with a dynamic sequence length: the same relevance."""
    _export("LSTM", True, 1, False, tmp_path / "static.onnx")
    _export("LSTM", True, 1, True, tmp_path / "dynamic.onnx")
    x = np.random.default_rng(2).normal(size=(2, 6, 3)).astype(np.float32)
    a = onnx_lrp.Explainer(str(tmp_path / "static.onnx"), composite="epsilon").explain(x)
    b = onnx_lrp.Explainer(str(tmp_path / "dynamic.onnx"), composite="epsilon").explain(x)
    np.testing.assert_array_equal(a.target, b.target)
    assert_close(b.relevance, a.relevance, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_torch_export_conserves_with_zero_biases(tmp_path, op):
    """bias=False everywhere, zero initial states: the input relevance sums to the explained logit."""
    _export(op, True, 2, True, tmp_path / "m.onnx", bias=False)
    x = np.random.default_rng(4).normal(size=(3, 7, 3)).astype(np.float32)
    res = onnx_lrp.Explainer(str(tmp_path / "m.onnx"), composite="epsilon", epsilon=1e-9).explain(x)
    logit = res.outputs["logits"][np.arange(3), res.target]
    assert_close(res.relevance.sum(axis=(1, 2)), logit, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # the torch.export-based exporter takes 5-15 s per model
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_torch_dynamo_export_matches_the_oracle(tmp_path, op):
    """The torch.export-based exporter writes nn.LSTM / nn.GRU as ONNX LSTM / GRU nodes too (nn.RNN it unrolls into
    MatMul / Add / Tanh, which the existing handlers explain)."""
    net = _export(op, True, 2, False, tmp_path / "m.onnx", dynamo=True)
    x = np.random.default_rng(8).normal(size=(2, 6, 3)).astype(np.float32)
    res = onnx_lrp.Explainer(str(tmp_path / "m.onnx"), composite="epsilon", epsilon=1e-3).explain(x)
    assert rel_err(res.relevance, torch_oracle(net, op, x, res.target, 1e-3)) < 1e-4


def test_unrolled_lstm_cell_matches_the_lstm_op(tmp_path):
    """nn.LSTMCell in a Python loop (TorchScript unrolls it into Gemm / Split / Sigmoid / Tanh / Mul / Add per step)
    with the weights of an nn.LSTM: the gate products need signal-take-all (all relevance to the non-gate factor of
    a Mul with a Sigmoid output). Until a composite gives such products a rule, the CNN composites refuse them and
    name every one."""
    torch = pytest.importorskip("torch")

    class Cell(torch.nn.Module):
        def __init__(self, lstm, head):
            super().__init__()
            self.cell, self.head = torch.nn.LSTMCell(3, 5), head
            for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(self.cell, k).data.copy_(getattr(lstm, k + "_l0").data)

        def forward(self, x):
            h = c = torch.zeros(x.shape[0], 5)
            for t in range(x.shape[1]):
                h, c = self.cell(x[:, t], (h, c))
            return self.head(h)

    net = _export("LSTM", False, 1, False, tmp_path / "op.onnx")
    torch.onnx.export(Cell(net.rnn, net.head).eval(), torch.zeros(2, 6, 3), str(tmp_path / "cell.onnx"),
                      input_names=["x"], output_names=["logits"], opset_version=17, dynamo=False)
    x = np.random.default_rng(9).normal(size=(2, 6, 3)).astype(np.float32)
    ref = onnx_lrp.Explainer(str(tmp_path / "op.onnx"), composite="epsilon").explain(x)
    try:
        got = onnx_lrp.Explainer(str(tmp_path / "cell.onnx"), composite="epsilon").explain(x)
    except UnsupportedError as err:
        msg = str(err)
        assert msg.count("Mul") >= 6 * 3 - 1 and "/cell" in msg  # every gate product of every step is named
        pytest.skip("no gate rule for Sigmoid-gated products in the CNN composites yet")
    np.testing.assert_array_equal(got.target, ref.target)
    assert rel_err(got.relevance, ref.relevance) < 1e-3


# ------------------------------------------------------------------------------------------ onnx backend cases
def _backend_cases():
    """The onnx wheel's LSTM / GRU / RNN node test cases (model, inputs, outputs of onnx's numpy reference)."""
    import onnx.backend.test.case.node as cases
    from onnx.backend.test.case.node import gru, lstm, rnn  # noqa: F401  (importing registers the cases)
    return {c.name: c for c in cases._NodeTestCases if c.model.graph.node[0].op_type in GATES}


BACKEND = sorted(_backend_cases())


@pytest.mark.parametrize("name", BACKEND)
def test_onnx_backend_cases(name):
    """Each of the onnx wheel's LSTM/GRU/RNN node tests (defaults, biases, peepholes with initial states and
    sequence_lens, batchwise = layout 1, reverse, bidirectional), weights made initializers: the relevance model's
    forward equals onnx's reference outputs (layout 1 too, which onnxruntime runs only through the canonizer) and
    the relevance entering Y_h (and Y, Y_c) matches the oracle."""
    import onnx
    case = _backend_cases()[name]
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    model.ir_version = 10
    ins, expected = case.data_sets[0]
    n = model.graph.node[0]
    op = n.op_type
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    given = dict(zip([i.name for i in model.graph.input], ins))
    params = {k: given.pop(k) for k in ("W", "R", "B", "P") if k in given}
    model.graph.initializer.extend([onnx.numpy_helper.from_array(v, k) for k, v in params.items()])
    keep = [i for i in model.graph.input if i.name not in params]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    outs = [o.name for o in model.graph.output]
    rng = np.random.default_rng(3)
    cs = [rng.normal(size=e.shape).astype(np.float32) for e in expected]
    nb = given["X"].shape[0]
    res, _ = explain_probe(model, outs, cs, composite(), given, nb, keep_outputs=True, epsilon=1e-3)
    for o, e in zip(outs, expected):
        assert_close(res.outputs[o], e, rtol=1e-5, atol=1e-6)
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    layout, H = attrs.get("layout", 0), attrs["hidden_size"]
    D = 2 if direction == "bidirectional" else 1
    x = given["X"]
    nbatch = x.shape[1 - layout]
    state = (nbatch, D, H) if layout else (D, nbatch, H)
    zeros = np.zeros(state)
    r = {o: nb * c.astype(np.float64) for o, c in zip(outs, cs)}
    ry = r.get("Y", np.zeros((x.shape[0], x.shape[1], D, H)) if layout else np.zeros((x.shape[0], D, nbatch, H)))
    w = params["W"]
    b = params.get("B", np.zeros((D, 2 * w.shape[1])))
    Rx, Rh0, Rc0 = lrp_op(op, x, w, params["R"], b, given.get("initial_h", zeros),
                          given.get("initial_c", zeros) if op == "LSTM" else None, ry, r.get("Y_h", zeros),
                          r.get("Y_c", zeros) if op == "LSTM" else None, direction=direction, layout=layout,
                          lens=given.get("sequence_lens"), eps=1e-3, p=params.get("P"))[3:]
    rel = res.relevance if isinstance(res.relevance, dict) else {"X": res.relevance}
    assert rel_err(rel["X"], Rx) < 1e-4 and np.abs(Rx).max() > 0
    if "initial_h" in rel:
        assert rel_err(rel["initial_h"], Rh0) < 1e-4 and rel_err(rel["initial_c"], Rc0) < 1e-4


def test_token_ids_embedding_lstm_matches_the_oracle(tmp_path):
    """The sentiment-model shape of Arras et al.: token ids -> nn.Embedding -> bidirectional nn.LSTM -> Linear.
    The relevance per token (at the embedding lookup, summed over the embedding) is the oracle's."""
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(20, 3)
            self.rnn = torch.nn.LSTM(3, 5, batch_first=True, bidirectional=True)
            self.head = torch.nn.Linear(10, 4)

        def forward(self, ids):
            return self.head(self.rnn(self.emb(ids))[0][:, -1])

    torch.manual_seed(1)
    net = Net().eval()
    ids = torch.randint(0, 20, (3, 8))
    torch.onnx.export(net, ids, str(tmp_path / "m.onnx"), input_names=["ids"], output_names=["logits"],
                      opset_version=17, dynamo=False, dynamic_axes={"ids": {0: "batch", 1: "time"}})
    res = onnx_lrp.Explainer(str(tmp_path / "m.onnx"), composite="epsilon", epsilon=1e-3).explain(
        {"ids": ids.numpy()})
    x = net.emb(ids).detach().numpy()
    assert res.relevance.shape == (3, 8)
    assert rel_err(res.relevance, torch_oracle(net, "LSTM", x, res.target, 1e-3).sum(-1)) < 1e-4
