"""The last line of defence (onnx_lrp/conservation.py): relevance that vanished or exploded is never returned
quietly. Each case is a small MLP whose relevance sum is known in closed form (numpy), so the trip points are
checked against the definition: below 1 % or above 100 x the start relevance, or one input entry above 1e6 x it.
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp.run import conservation
from onnx_lrp.core.errors import LrpWarning, NumericError

from util import assert_close, explain, make_model, node, to_bytes


def mlp(bias: float, w2_scale: float = 1.0) -> bytes:
    """x (4) -> Gemm (3, bias ``bias``) -> Relu -> Gemm (2, no bias): with epsilon, the bias absorbs its share."""
    w1 = np.array([[1.0, 0.5, -0.25], [0.5, 1.0, 0.25], [0.25, -0.5, 1.0], [1.0, 1.0, 1.0]], np.float32)
    w2 = (np.array([[1.0, -1.0], [0.5, 0.25], [0.25, 1.0]]) * w2_scale).astype(np.float32)
    return to_bytes(make_model(
        [node("Gemm", ["x", "w1", "b1"], "h", name="dense1"), node("Relu", ["h"], "a", name="relu"),
         node("Gemm", ["a", "w2"], "y", name="dense2")],
        {"x": ["N", 4]}, ["y"], {"w1": w1, "b1": np.full(3, bias, np.float32), "w2": w2}))


X = np.array([[0.5, 0.25, 0.75, 0.125]], np.float32)


def test_conserving_explanation_is_silent():
    res, seen = explain(mlp(0.0), X, target=0, warned=True)
    assert abs(res.relevance.sum() / res.explained_value[0] - 1) < 1e-5  # no bias: epsilon conserves
    assert seen == []


def test_bias_that_absorbs_nearly_all_warns_and_names_the_node():
    # the bias (100) dwarfs w1 x (~1): the Gemm's epsilon rule hands x only x w / (x w + b) of its relevance
    res, seen = explain(mlp(100.0), X, target=0, warned=True)
    ratio = res.relevance.sum() / res.explained_value[0]
    assert ratio < conservation.FLOOR
    assert len(seen) == 1 and "\n" not in seen[0]
    assert "item 0" in seen[0] and "dense1" in seen[0] and "onnx-lrp trace" in seen[0]
    assert "composite 'epsilon'" in seen[0]


def test_strict_refuses():
    with pytest.raises(NumericError, match="relevance not conserved.*dense1.*strict"):
        onnx_lrp.Explainer(mlp(100.0), composite="epsilon", strict=True).explain(X, target=0)
    res = onnx_lrp.Explainer(mlp(0.0), composite="epsilon", strict=True).explain(X, target=0)
    assert np.isfinite(res.relevance).all()


def test_trip_points_follow_the_definition():
    starts = np.array([2.0, 2.0, 2.0, 2.0, 2.0, 0.0])
    sums = np.array([2.0, 0.019, 0.021, 201.0, 199.0, 5.0])
    peaks = np.array([2.1e6, 1.0, 1.0, 1.0, 1.0, 1e9])
    assert conservation.far(sums, peaks, starts).tolist() == [True, True, False, True, False, False]


def test_exploding_entries_warn_even_when_the_sum_is_fine():
    # one sample: relevance +-1e7 that cancels in the sum (the sum is 1 x the start)
    rel = [np.array([[1e7, -1e7, 1.0]])]
    sums, peaks = conservation.per_item(rel, 1)
    assert conservation.far(sums, peaks, np.array([1.0])).tolist() == [True]
    text = conservation.message(conservation.Off(0, 1, 1, float(sums[0]), float(peaks[0]), 1.0, "logit"),
                                None, "epsilon")
    assert "1e+07" in text and "\n" not in text


def test_ledger_explainer_names_culprits_without_a_second_build():
    ex = onnx_lrp.Explainer(mlp(100.0), composite="epsilon", ledger=True)
    with pytest.warns(LrpWarning, match="dense1 \\(Gemm, epsilon: \\+"):
        ex.explain(X, target=0)


def test_a_model_that_never_conserves_builds_its_ledger_once(monkeypatch):
    # every call warns and names the node, but the ledger model is built on the first trip only (before: a whole
    # second Explainer per call, seconds on a ResNet50, on every explain of a model that does not conserve)
    import onnx_lrp.building

    built = []
    real_build = onnx_lrp.building.build

    def counting_build(model, composite="auto", options=onnx_lrp.building.BuildOptions()):
        built.append(options.ledger)
        return real_build(model, composite, options)

    ex = onnx_lrp.Explainer(mlp(100.0), composite="epsilon")
    monkeypatch.setattr(onnx_lrp.building, "build", counting_build)
    for _ in range(3):
        with pytest.warns(LrpWarning, match="dense1"):
            ex.explain(X, target=0)
    assert built == [True]
    with pytest.warns(LrpWarning, match="dense1"):
        ex.explain(X, target=0, start="one-hot")  # another start relevance: its own ledger model
    assert built == [True, True]


# ------------------------------------------------------------ the default composite fits the network ("auto")
def _act_net(act: str) -> bytes:
    """x (N x 4) -> Gemm -> activation -> Gemm (no biases): ``act`` is Relu, Clip (ReLU6), SiLU (Sigmoid * x),
    HardSwish, Gelu (opset 20) or Mish (x * tanh(softplus(x)))."""
    w1 = np.array([[1.0, -0.5, 0.25], [0.5, 1.0, -0.75], [-0.25, 0.5, 1.0], [1.0, 1.0, -1.0]], np.float32)
    w2 = np.array([[1.0, -1.0], [0.5, 0.25], [-0.25, 1.0]], np.float32)
    nodes = [node("Gemm", ["x", "w1"], "h", name="dense1")]
    inits = {"w1": w1, "w2": w2}
    if act == "Clip":
        nodes.append(node("Clip", ["h", "lo", "hi"], "a", name="act"))
        inits.update(lo=np.array(0.0, np.float32), hi=np.array(6.0, np.float32))
    elif act == "SiLU":
        nodes += [node("Sigmoid", ["h"], "s", name="sig"), node("Mul", ["h", "s"], "a", name="act")]
    elif act == "ReluSE":  # ReLU, then a squeeze-excitation-like sigmoid gate (RegNetY)
        nodes += [node("Relu", ["h"], "r", name="relu"), node("Gemm", ["r", "wse"], "e", name="se"),
                  node("Sigmoid", ["e"], "g", name="sig"), node("Mul", ["r", "g"], "a", name="gate")]
        inits["wse"] = np.eye(3, dtype=np.float32)
    elif act == "Mish":
        nodes += [node("Softplus", ["h"], "sp", name="sp"), node("Tanh", ["sp"], "t", name="tanh"),
                  node("Mul", ["h", "t"], "a", name="act")]
    else:
        nodes.append(node(act, ["h"], "a", name="act"))
    nodes.append(node("Gemm", ["a", "w2"], "y", name="dense2"))
    return to_bytes(make_model(nodes, {"x": ["N", 4]}, ["y"], inits, opset=20 if act == "Gelu" else 17))


@pytest.mark.parametrize("act,chosen", [("Relu", "epsilon-plus-flat"), ("Clip", "epsilon-plus-flat"),
                                        ("ReluSE", "epsilon-plus-flat"),
                                        ("SiLU", "attnlrp"), ("HardSwish", "attnlrp"), ("Gelu", "attnlrp"),
                                        ("Mish", "attnlrp")])
def test_default_composite_fits_the_activations(act, chosen):
    ex = onnx_lrp.Explainer(_act_net(act))
    assert ex.composite_name == chosen and "auto" in ex.composite_reason
    x = np.array([[0.5, -0.25, 0.75, 0.125], [-1.0, 0.5, 0.25, 1.5]], np.float32)
    res = ex.explain(x, target=0)
    if act not in ("Mish", "ReluSE"):  # bias-free, identity rule on f(0) = 0: it conserves exactly
        assert_close(res.relevance.sum(1), res.explained_value, rtol=1e-5, atol=1e-6)
    assert onnx_lrp.Explainer(_act_net(act), composite="epsilon").composite_name == "epsilon"  # overridden
    assert onnx_lrp.Explainer(_act_net(act), composite="epsilon").composite_reason == ""


def test_auto_takes_the_rule_parameters_of_its_choice():
    ex = onnx_lrp.Explainer(_act_net("Relu"), epsilon=0.25)
    assert ex.composite_name == "epsilon-plus-flat"
    assert any(getattr(e.rule, "epsilon", None) == 0.25 for e in ex.composite.entries)
    with pytest.raises(onnx_lrp.InputError, match="chose composite attnlrp.*gamma"):
        onnx_lrp.Explainer(_act_net("SiLU"), gamma=0.5)


def test_cli_summary_names_the_chosen_composite(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main

    monkeypatch.chdir(tmp_path)  # the relevance goes to the current directory
    (tmp_path / "m.onnx").write_bytes(_act_net("SiLU"))
    np.save(tmp_path / "x.npy", X)
    r = CliRunner().invoke(main, ["explain", str(tmp_path / "m.onnx"), str(tmp_path / "x.npy")])
    assert r.exit_code == 0, r.output
    assert "composite attnlrp (auto: non-ReLU non-linearities" in r.output and "--composite overrides" in r.output
    r = CliRunner().invoke(main, ["explain", str(tmp_path / "m.onnx"), str(tmp_path / "x.npy"), "-c", "epsilon"])
    assert r.exit_code == 0 and "composite epsilon," in r.output


def test_strict_in_dataset_mode_fails_the_items_that_do_not_conserve(tmp_path):
    """``--strict --out-dir``: the item whose relevance is not conserved (bias 100 absorbs almost all of it) fails
    (errors.jsonl, exit 1); the item that conserves (an input 1e4 x larger, the bias a small share) is written with
    the relevance a plain explain gives it."""
    import json

    from click.testing import CliRunner

    from onnx_lrp.cli.main import main
    from onnx_lrp.dataset import read_shards

    (tmp_path / "m.onnx").write_bytes(mlp(100.0))
    xs = np.concatenate([X, X * 1e4])
    np.save(tmp_path / "x.npy", xs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LrpWarning)
        want = onnx_lrp.Explainer(mlp(100.0), composite="epsilon").explain(xs, target=0)
    share = want.relevance.sum(axis=1) / want.explained_value  # the premise: item 0 far below 1 %, item 1 near 1
    assert share[0] < 0.01 and 0.5 < share[1] <= 1.0
    args = ["explain", str(tmp_path / "m.onnx"), str(tmp_path / "x.npy"), "-c", "epsilon", "--target", "0",
            "--out-dir", str(tmp_path / "out"), "--strict"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1, r.output
    errors = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [e["item"] for e in errors] == ["x.npy[0]"]
    assert "relevance not conserved" in errors[0]["error"] and "strict" in errors[0]["error"]
    got = read_shards(tmp_path / "out")
    assert got["items"].tolist() == ["x.npy[1]"]
    assert_close(got["relevance"][0], want.relevance[1], rtol=1e-6)


# ------------------------------------------------------------------------------ refused in one line (issue 17)
def test_negative_stabilisers_are_refused(tmp_path):
    bad = tmp_path / "neg.toml"
    bad.write_text('name = "neg"\n[[rules]]\nrule = "epsilon"\nepsilon = -1.0\n')
    with pytest.raises(onnx_lrp.InputError, match=f"composite {bad}: entry 1: .*epsilon must be >= 0"):
        onnx_lrp.Explainer(mlp(0.0), composite=str(bad))
    for params in ({"stabilizer": -1.0}, {"epsilon": -1.0}, {"gamma": -0.5}):
        with pytest.raises(onnx_lrp.InputError, match=f"{next(iter(params))} (must be )?>= 0"):
            onnx_lrp.Explainer(mlp(0.0), composite="epsilon-gamma-box", low=-3.0, high=3.0, **params)


def test_binary_composite_file_is_named(tmp_path):
    bad = tmp_path / "garbage.toml"
    bad.write_bytes(b"\xff\xfe\x00garbage\x80")
    with pytest.raises(onnx_lrp.InputError, match=f"composite file {bad} is not a UTF-8 TOML composite"):
        onnx_lrp.Explainer(mlp(0.0), composite=str(bad))


@pytest.mark.parametrize("content,message", [(b"1.0 2.0 3.0\n", "is a text file, not a NumPy .npy array"),
                                             (b"\x80\x04K\x01.", "is a Python pickle"),
                                             (b"PK\x03\x04rest", "is an .npz archive")])
def test_npy_that_is_not_npy_says_what_it_is(tmp_path, content, message):
    from onnx_lrp.io.inputs import load_npy

    path = tmp_path / "x.npy"
    path.write_bytes(content)
    with pytest.raises(onnx_lrp.InputError, match=message):
        load_npy(path)


def test_unknown_future_opset_is_refused():
    import onnx

    known = onnx.defs.onnx_opset_version()
    model = make_model([node("Relu", ["x"], "y")], {"x": ["N", 4]}, ["y"], opset=99)
    with pytest.raises(onnx_lrp.ModelError, match=f"imports opset 99, which does not exist yet: .* knows opsets up to {known}"):
        onnx_lrp.Explainer(to_bytes(model))
    ok = make_model([node("Relu", ["x"], "y")], {"x": ["N", 4]}, ["y"], opset=known)  # known, Relu unchanged
    assert onnx_lrp.Explainer(to_bytes(ok)).explain(X).relevance.shape == X.shape


@pytest.mark.parametrize("graph", ["add", "matmul"])
def test_declared_input_the_graph_does_not_fit_is_refused(tmp_path, graph):
    """An input declared 17 x 17 where a constant of the graph needs 16 x 16: shape inference says so at load, so
    inspect and rewrite refuse (exit 2, one line) instead of writing a relevance model that cannot run."""
    import onnx
    from click.testing import CliRunner
    from onnx import TensorProto, helper, numpy_helper

    from onnx_lrp.cli.main import main

    if graph == "add":
        nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Flatten", ["a"], ["f"], axis=1),
                 helper.make_node("Gemm", ["f", "w"], ["y"])]
        inits, out = {"b": np.ones((1, 1, 16, 16), np.float32), "w": np.ones((256, 10), np.float32)}, ["N", 10]
    else:
        nodes, inits, out = [helper.make_node("MatMul", ["x", "w"], ["y"])], {"w": np.ones((16, 10), np.float32)}, \
            ["N", 1, 17, 10]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 17, 17])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    for args in (["inspect", str(path)], ["rewrite", str(path), "-o", str(tmp_path / "r.onnx")]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2, r.output
        assert "shape inference finds the graph inconsistent" in r.output and "Incompatible dimensions" in r.output
    assert not (tmp_path / "r.onnx").exists()


def test_declared_input_the_recorded_shapes_do_not_fit_is_refused(tmp_path):
    """An input declared 17 x 17 in a graph exported for 16 x 16 whose only size check is the exporter's value_info
    (a Reshape to a fixed size, as torch's dynamo exporter writes a flatten): shape inference reports the recorded
    shapes differ; inspect, rewrite, explain and the API refuse in one line naming the input and both shapes, and
    write nothing (before: exit 0 and a relevance model that could not run)."""
    import onnx
    from click.testing import CliRunner
    from onnx import TensorProto, helper, numpy_helper

    from onnx_lrp.cli.main import main

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]), helper.make_node("Gemm", ["f", "fw"], ["y"])]
    inits = {"w": np.ones((2, 1, 3, 3), np.float32), "shape": np.array([1, 512], np.int64),
             "fw": np.ones((512, 3), np.float32)}
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 17, 17])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()],
                          value_info=[helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 16, 16])
                                      for n in ("c", "r")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    np.save(tmp_path / "x.npy", np.ones((1, 1, 17, 17), np.float32))
    said = "the declared input shape(s) x 1x1x17x17 give c the shape 1x2x17x17, where the exporter recorded 1x2x16x16"
    for args in (["inspect", str(path)], ["rewrite", str(path), "-o", str(tmp_path / "r.onnx")],
                 ["explain", str(path), str(tmp_path / "x.npy"), "-o", str(tmp_path / "out.npy")]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2, r.output
        assert said in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "r.onnx").exists() and not (tmp_path / "out.npy").exists()
    with pytest.raises(onnx_lrp.ModelError, match=re.escape(said)):
        onnx_lrp.Explainer(str(path))
    # recorded shapes that are only a permutation of the inferred ones are a layout label (jax2onnx's NHWC shapes
    # on NCHW values), not a size: the same graph fitted to 17 x 17, with such labels, loads and runs
    inits.update(shape=np.array([1, 578], np.int64), fw=np.ones((578, 3), np.float32))
    g = model.graph
    del g.initializer[:], g.value_info[:]
    g.initializer.extend([numpy_helper.from_array(v, k) for k, v in inits.items()])
    g.value_info.extend([helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 17, 17, 2]) for n in ("c", "r")])
    res = onnx_lrp.Explainer(model.SerializeToString()).explain(np.ones((1, 1, 17, 17), np.float32))
    assert res.relevance.shape == (1, 1, 17, 17)


def _scan_model() -> bytes:
    """s = s0 + sum_t x_t (a scalar state), y_t = 2 s_t (scalar scan outputs, stacked to (5,))."""
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["s_out", "two"], ["y_t"])],
        "body", [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, []),
                 helper.make_tensor_value_info("x_t", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("y_t", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    g = helper.make_graph([helper.make_node("Scan", ["s0", "x"], ["s", "y"], body=body, num_scan_inputs=1)], "g",
                          [helper.make_tensor_value_info("s0", TensorProto.FLOAT, []),
                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
                          [helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m.SerializeToString()


@pytest.mark.parametrize("output", ["s", "y"])
def test_scan_with_scalar_outputs_keeps_their_shapes(output):
    """Before: the explained forward returned (1,) and (5, 1) for the model's () and (5,) (a scalar input fed as
    (1,)), and the scalar input's relevance had shape (1,)."""
    feeds = {"s0": np.array(1.0, np.float32), "x": np.arange(1, 6, dtype=np.float32)}
    res = onnx_lrp.Explainer(_scan_model(), output=output, composite="epsilon", epsilon=0.0).explain(feeds)
    s = 1.0 + np.cumsum(feeds["x"])
    np.testing.assert_allclose(res.outputs["s"], np.float32(s[-1]))
    np.testing.assert_allclose(res.outputs["y"], 2 * s)
    assert res.outputs["s"].shape == () and res.outputs["y"].shape == (5,)
    assert res.relevance["s0"].shape == () and res.relevance["x"].shape == (5,)
    # sums are linear: LRP-0 gives each addend its share of the explained value
    value = float(res.explained_value[0])
    assert abs(float(res.relevance["s0"]) + float(res.relevance["x"].sum()) - value) <= 1e-5 * abs(value)


def test_precise_session_runs_without_layout_optimisations():
    """precise=True: onnxruntime at ORT_ENABLE_EXTENDED (no NCHWc blocked convolutions); the same relevance up to
    float32 rounding on a small CNN (another rounding, not a closer one: docs/trust.md)."""
    import onnxruntime as ort

    from test_framework_twins import TWINS

    x = np.load(TWINS / "resnet.npz")["x"]
    fast = onnx_lrp.Explainer(str(TWINS / "resnet_torch.onnx"), composite="epsilon-plus")
    precise = onnx_lrp.Explainer(str(TWINS / "resnet_torch.onnx"), composite="epsilon-plus", precise=True)
    assert precise.session.precise and not fast.session.precise
    level = precise.session.session.get_session_options().graph_optimization_level
    assert level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    a, b = fast.explain(x).relevance, precise.explain(x).relevance
    assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)
    from onnx_lrp.run.runner import Runner

    assert Runner.from_payload(precise.payload()).session.precise


# ------------------------------------------------------------ Ray: the actor names the nodes too (issue 17)
_ACTOR = """
import dataclasses, pickle, sys, warnings
import numpy as np
import onnx_lrp.ray  # what a Ray actor imports: ExplainBatch, whose runner comes from the plain-data payload
(relevance_model, options), x, stricts = pickle.loads(sys.stdin.buffer.read())
heavy = lambda: sorted(m for m in ("onnx", "onnx_ir", "onnx_lrp.load", "onnx_lrp.lrp.rewriter") if m in sys.modules)
outs = []
for strict in stricts:  # one actor after the other in this process (the first one sees nothing heavy imported)
    payload = (relevance_model, dataclasses.replace(options, strict=strict))
    batch = onnx_lrp.ray.ExplainBatch(relevance_model=payload, target=0, threads=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ok = batch({"x": x[1:]})  # conserves: nothing heavy is imported
        before = heavy()
        try:
            bad = batch({"x": x})
            error = None
        except Exception as exc:
            bad, error = None, f"{type(exc).__name__}: {exc}"
    outs.append(dict(before=before, after=heavy(), ok=ok["relevance"], error=error,
                     bad=None if bad is None else bad["relevance"],
                     seen=[str(w.message) for w in seen if "conserved" in str(w.message)]))
sys.stdout.buffer.write(pickle.dumps(outs))
"""


def _in_an_actor(payload, x, stricts=(False,)) -> list:
    """What ExplainBatch from ``payload`` gives in a fresh process (an actor's), once per value of ``strict``."""
    import pickle
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _ACTOR], input=pickle.dumps((payload, x, list(stricts))),
                          capture_output=True, timeout=180)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return pickle.loads(proc.stdout)


def test_a_ray_actor_names_the_nodes_that_absorb_the_relevance(tmp_path):
    """ExplainBatch from a payload (a fresh process: what a Ray actor runs) warns like an Explainer and names the
    Gemm whose bias absorbs the relevance: the actor rebuilds the ledger model from the model file the payload
    names, only when the check trips (before it, neither onnx nor onnx_ir is imported)."""
    pytest.importorskip("ray")
    path = tmp_path / "m.onnx"
    path.write_bytes(mlp(100.0))
    xs = np.concatenate([X, X * 1e4])  # item 0 does not conserve (the bias takes 99 %+), item 1 does
    with warnings.catch_warnings(record=True) as here:
        warnings.simplefilter("always")
        ex = onnx_lrp.Explainer(str(path), composite="epsilon")
        want = ex.explain(xs, target=0)
    got, strict = _in_an_actor(ex.payload(), xs, stricts=(False, True))  # two actors, one interpreter
    assert got["before"] == [] and "onnx_ir" in got["after"]
    np.testing.assert_allclose(got["bad"], want.relevance, rtol=1e-6, atol=0)
    np.testing.assert_allclose(got["ok"], want.relevance[1:], rtol=1e-6, atol=0)
    assert len(got["seen"]) == 1 and "\n" not in got["seen"][0]
    assert "dense1 (Gemm, epsilon: +" in got["seen"][0]
    assert got["seen"][0] == [str(w.message) for w in here if "conserved" in str(w.message)][0]
    # strict: an error that names the node, nothing returned
    assert strict["bad"] is None and strict["error"].startswith("NumericError") and "dense1 (Gemm" in strict["error"]


def test_a_payload_from_model_bytes_carries_them_for_the_ledger():
    """A model given as bytes: the payload carries them (an actor has no file to read); an onnx_ir model in memory
    carries nothing (the warning then names no node)."""
    import pickle

    from onnx_lrp.run.runner import Runner

    def carried(payload):  # what another process receives
        return pickle.loads(pickle.dumps(payload))

    ex = onnx_lrp.Explainer(mlp(100.0), composite="epsilon")
    source = carried(ex.payload())[0].source
    assert (source.model, source.composite) == (mlp(100.0), "epsilon")  # a built-in composite travels by name
    with pytest.warns(LrpWarning, match="dense1 \\(Gemm, epsilon: \\+"):
        Runner.from_payload(carried(ex.payload())).explain(X, target=0)
    # a composite with other parameters travels pickled: the carried runner names the same nodes and numbers
    tuned = onnx_lrp.Explainer(mlp(100.0), composite="epsilon", epsilon=0.01)
    assert isinstance(carried(tuned.payload())[0].source.composite, bytes)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tuned.explain(X, target=0)
        Runner.from_payload(carried(tuned.payload())).explain(X, target=0)
    lines = [str(w.message) for w in seen if "conserved" in str(w.message)]
    assert len(lines) == 2 and lines[0] == lines[1] and "dense1 (Gemm, epsilon: +" in lines[0]


# ------------------------------------------------------------ a Dropout left in training mode (issue 17, Flax)
@pytest.mark.parametrize("mode", ["true", "false", "input"])
def test_dropout_in_training_mode_is_refused_not_dropped(mode):
    """Dropout(x, ratio, training_mode): with training_mode true (a constant, as jax2onnx writes nnx.Dropout without
    deterministic=True) or fed at run time the deployed masks are random; the loader kept dropping the node, so the
    relevance explained a network other than the deployed one, silently. Now refused in one line naming the node;
    training_mode false is still dropped (the relevance equals that of the same net without it)."""
    w = np.array([[1.0, -0.5], [0.25, 1.0], [0.5, 0.5]], np.float32)
    nodes = [node("Dropout", ["x", "ratio", "train"], "d", name="drop"), node("MatMul", ["d", "w"], "y", name="mm")]
    inits = {"w": w, "ratio": np.array(0.5, np.float32)}
    inputs = {"x": ["N", 3]}
    if mode == "input":
        inputs["train"] = ([], np.bool_)
    else:
        inits["train"] = np.array(mode == "true")
    model = to_bytes(make_model(nodes, inputs, ["y"], inits))
    if mode != "false":
        with pytest.raises(onnx_lrp.UnsupportedError, match=r"\[drop\]: training_mode is set") as info:
            onnx_lrp.Explainer(model, composite="epsilon")
        assert "\n" not in str(info.value)
        return
    x = np.array([[0.5, 1.0, -0.25]], np.float32)
    res = onnx_lrp.Explainer(model, composite="epsilon", epsilon=0.0, stabilizer=0.0).explain(x, target=0)
    assert_close(res.relevance, x * w[:, 0], rtol=1e-6)  # LRP-0 of one linear layer: x w


# ------------------------------------------------------------ batch statistics couple items (issue 17, Flax)
@pytest.mark.parametrize("returns", [True, False])
def test_a_reduction_over_the_batch_axis_that_returns_to_the_items_is_refused(returns):
    """``h - h.mean(axis=0)`` (batch statistics written by hand): each item's output depends on the others, so the
    relevance of one item's logit leaked into the other items' inputs (explained before, silently: the result was
    gradient x input of the whole batch's sum). Refused in one line naming the reduction and where it returns. A
    batch mean that does not return to the items (an output that is one whole: the mean over the batch of a
    linear map) is explained."""
    w = np.array([[1.0, -0.5], [0.25, 1.0], [0.5, 0.5]], np.float32)
    nodes = [node("ReduceMean", ["x"], "mu", axes=[0], keepdims=int(returns), name="batch_mean")]
    if returns:
        nodes += [node("Sub", ["x", "mu"], "c", name="center"), node("MatMul", ["c", "w"], "y", name="mm")]
    else:
        nodes += [node("MatMul", ["mu", "w"], "y", name="mm")]
    model = to_bytes(make_model(nodes, {"x": ["N", 3]}, ["y"], {"w": w}))
    x = np.array([[0.5, 1.0, -0.25], [1.5, -0.5, 0.75]], np.float32)
    if returns:
        with pytest.raises(onnx_lrp.UnsupportedError, match=r"\[batch_mean\]: reduces over the batch axis \('N', "
                           r"axis 0\) and its result returns to the items at center \(Sub\)") as info:
            onnx_lrp.Explainer(model, composite="epsilon")
        assert "\n" not in str(info.value)
        fixed = onnx_lrp.Explainer(model, composite="epsilon", epsilon=0.0, stabilizer=0.0,
                                   input_shapes={"x": [1, 3]})  # a batch of 1: one item, its own statistics
        assert np.allclose(fixed.explain(x[:1], target=0).relevance, 0.0, atol=1e-6)  # x - mean(x) = 0 for one item
        return
    res = onnx_lrp.Explainer(model, composite="epsilon", epsilon=0.0, stabilizer=0.0).explain(x, target=0)
    assert_close(res.relevance, x * w[:, 0] / len(x), rtol=1e-5)  # LRP-0 of the whole: x dy/dx
