"""The conservation ledger (``Explainer(ledger=True)``, ``onnx-lrp trace``).

1. Bias-free ReLU networks with LRP-0 conserve at every node: each row's entering relevance equals its leaving
   relevance to 1e-5 of the start, on the hand-built CNN of test_conservation.py and on a torch export.
2. On the demo model (biases, epsilon and z+): the rows add up, the start equals the explained logit and the
   absorbed parts equal ``logit - sum(input relevance)``, both read from the relevance model's ordinary outputs.
3. The last Gemm under LRP-epsilon starting from its own logit y_t = z_t absorbs exactly its bias b_t
   (R_in = z_t (z_t - b_t) / z_t): a closed-form oracle for one row.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper
from test_conservation import X_SHAPE, cnn
from util import ROOT, assert_close, to_bytes

import onnx_lrp
from onnx_lrp.cli.main import main
from onnx_lrp.rules import parse_composite

DEMO = ROOT / "models" / "digits_cnn.onnx"
LRP0 = parse_composite("""
[[rules]]
match = { kind = ["activation"] }
rule = "pass"
[[rules]]
match = { kind = ["maxpool", "shape"] }
rule = "gradient"
[[rules]]
match = { kind = ["sum", "avgpool"] }
rule = "norm"
stabilizer = 1e-12
[[rules]]
match = { kind = ["convolution", "dense", "affine"] }
rule = "epsilon"
epsilon = 0.0
""", source="lrp0")


def _check_rows_conserve(ex, x):
    res = ex.explain(x)
    e, l = res.ledger["entering"].astype(np.float64), res.ledger["leaving"].astype(np.float64)
    assert len(e) == len(ex.relevance_model.ledger_rows) and len(e) > 5
    start = e[0]
    assert abs(start) > 1e-3
    worst = np.max(np.abs(e - l)) / abs(start)
    assert worst < 1e-5, [(r.name, a - b) for r, a, b in zip(ex.relevance_model.ledger_rows, e, l)]
    assert abs(np.sum(res.relevance, dtype=np.float64) - start) < 1e-5 * abs(start)


def test_bias_free_handbuilt_cnn_every_row_conserves():
    model, _ = cnn(zero_bias=True)
    ex = onnx_lrp.Explainer(to_bytes(model), composite=LRP0, ledger=True)
    x = np.random.default_rng(3).normal(size=X_SHAPE).astype(np.float32)  # a static batch of 2: sums over both
    _check_rows_conserve(ex, x)
    assert {r.op_type for r in ex.relevance_model.ledger_rows} >= {"Conv", "Relu", "MaxPool", "Add", "Gemm", "Concat"}


def test_bias_free_torch_export_every_row_conserves(tmp_path):
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 6, 3, bias=False), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 8, 3, bias=False),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 16, bias=False), nn.ReLU(),
                        nn.Linear(16, 4, bias=False)).eval()
    path = tmp_path / "net.onnx"
    torch.onnx.export(net, torch.randn(1, 3, 14, 14), str(path), input_names=["x"], output_names=["y"],
                      opset_version=17, dynamo=False)
    ex = onnx_lrp.Explainer(str(path), composite=LRP0, ledger=True)
    x = np.random.default_rng(4).normal(size=(1, 3, 14, 14)).astype(np.float32)
    _check_rows_conserve(ex, x)


@pytest.mark.parametrize("composite", ["epsilon-plus-flat", "epsilon"])
def test_demo_model_absorbed_parts_add_up(composite):
    ex = onnx_lrp.Explainer(str(DEMO), composite=composite, ledger=True)
    x = np.load(ROOT / "models" / "samples" / "batch.npy")[3:4]
    res = ex.explain(x)
    e, l = res.ledger["entering"].astype(np.float64), res.ledger["leaving"].astype(np.float64)
    logit = float(res.outputs["logits"][0, res.target[0]])
    input_sum = float(np.sum(res.relevance, dtype=np.float64))
    assert e[0] == pytest.approx(logit, rel=1e-6)
    assert np.sum(e - l) == pytest.approx(logit - input_sum, abs=1e-5 * abs(logit))
    # a node hands on what the next one (in reverse order) receives on this chain-shaped network
    assert_close(l[:-1], e[1:], rtol=1e-6, atol=1e-6)
    # absorption happens only at layers with a bias; element-wise and pooling rows conserve
    for row, a, b in zip(ex.relevance_model.ledger_rows, e, l):
        if row.op_type in ("Relu", "MaxPool", "Flatten"):
            assert abs(a - b) < 1e-5 * abs(logit), row.name


def test_last_gemm_absorbs_its_bias():
    bias = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(DEMO)).graph.initializer}["classifier.4.bias"]
    ex = onnx_lrp.Explainer(str(DEMO), composite="epsilon", ledger=True)
    x = np.load(ROOT / "models" / "samples" / "batch.npy")
    for i in range(3):
        res = ex.explain(x[i:i + 1])
        row = ex.relevance_model.ledger_rows[0]
        assert row.name == "/classifier/classifier.4/Gemm" and row.sinks == "bias"
        absorbed = float(res.ledger["entering"][0] - res.ledger["leaving"][0])
        assert absorbed == pytest.approx(float(bias[res.target[0]]), abs=1e-4)


def test_trace_cli_json_matches_api():
    r = CliRunner().invoke(main, ["trace", str(DEMO), str(ROOT / "models" / "samples" / "png"), "--item", "3",
                                  "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["item"] == "digit_3.png" and data["target"] == 3
    assert abs(data["unaccounted"]) < 1e-5 * abs(data["start_relevance"])
    assert data["nodes"][-1]["running"] == pytest.approx(data["input_relevance"], rel=1e-5)
    marked = {n["node"] for n in data["nodes"] if n["breaks"]}
    assert marked and all(n["sinks"] == "bias" for n in data["nodes"] if n["node"] in marked)
    text = CliRunner().invoke(main, ["trace", str(DEMO), str(ROOT / "models" / "samples" / "png"), "--item", "3"])
    assert text.exit_code == 0 and "absorbed" in text.output and "! /classifier/classifier.4/Gemm" in text.output


def test_attention_ledger_adds_up_and_only_the_softmax_absorbs():
    """AttnLRP on a two-head self-attention graph: relevance travels in gradient form (the ledger converts it);
    the uniform rule on the bilinear products and LRP-0 conserve, AttnLRP's softmax rule does not."""
    from test_ux import _attention_model

    ex = onnx_lrp.Explainer(_attention_model(), composite="attnlrp", ledger=True)
    x = np.random.default_rng(0).normal(size=(1, 4, 8)).astype(np.float32)
    res = ex.explain(x)
    e, l = res.ledger["entering"].astype(np.float64), res.ledger["leaving"].astype(np.float64)
    start = float(res.explained_value[0])
    assert e[0] == pytest.approx(start, rel=1e-6)
    assert np.sum(e - l) == pytest.approx(start - float(np.sum(res.relevance, dtype=np.float64)), abs=1e-5 * abs(start))
    for row, a, b in zip(ex.relevance_model.ledger_rows, e, l):
        if row.op_type == "Softmax":
            assert abs(a - b) > 1e-3 * abs(start), row.name
        else:
            assert abs(a - b) <= 1e-5 * abs(start), (row.name, a - b)


def test_trace_counts_token_relevance_once(tmp_path):
    """Token ids: the relevance reaching the embedding lookup is the per-token input relevance, not a loss."""
    from util import make_model, node

    rng = np.random.default_rng(0)
    p = {"table": rng.normal(size=(10, 3)).astype(np.float32), "w": rng.normal(size=(12, 2)).astype(np.float32)}
    nodes = [node("Gather", ["table", "ids"], ["e"], axis=0), node("Flatten", ["e"], ["f"], axis=1),
             node("Gemm", ["f", "w"], ["y"])]
    (tmp_path / "m.onnx").write_bytes(to_bytes(make_model(nodes, {"ids": ([1, 4], np.int64)}, ["y"], p)))
    np.save(tmp_path / "ids.npy", np.array([[1, 2, 3, 4]], np.int64))
    r = CliRunner().invoke(main, ["trace", str(tmp_path / "m.onnx"), str(tmp_path / "ids.npy"), "-c", "epsilon",
                                  "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    res = onnx_lrp.Explainer(str(tmp_path / "m.onnx"), composite="epsilon").explain({"ids": np.array([[1, 2, 3, 4]])})
    assert data["input_relevance"] == pytest.approx(float(res.relevance.sum()), rel=1e-6)
    assert abs(data["unaccounted"]) < 1e-5 * abs(data["start_relevance"])
    gather = next(n for n in data["nodes"] if n["op_type"] == "Gather")
    assert gather["to_tokens"] and not gather["breaks"]
