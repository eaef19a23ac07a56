"""The Python API contract: targets, start relevance, batches, saving, several inputs, devices, op coverage on CUDA.

References are independent: a numpy LRP-epsilon written from the formula, the ONNX model run in plain
onnxruntime, and onnxruntime's documented CUDA kernel list.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnx_lrp
from onnx_lrp import DeviceError, InputError
from onnx_lrp.load import serialize
from util import assert_close, make_model, node

RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((6, 5)).astype(np.float32)
B1 = RNG.standard_normal(6).astype(np.float32)
W2 = RNG.standard_normal((4, 6)).astype(np.float32)
B2 = RNG.standard_normal(4).astype(np.float32)


def mlp(softmax=False, batch="N"):
    nodes = [node("Gemm", ["x", "w1", "b1"], "h", transB=1), node("Relu", ["h"], "a"),
             node("Gemm", ["a", "w2", "b2"], "y", transB=1)]
    if softmax:
        nodes.append(node("Softmax", ["y"], "p", axis=1))
    return make_model(nodes, {"x": [batch, 5]}, ["p" if softmax else "y"],
                      {"w1": W1, "b1": B1, "w2": W2, "b2": B2}).SerializeToString()


def stab(z, eps=1e-6):
    return z + eps * (np.sign(z) + (z == 0))


def lrp_eps(x, start):
    """LRP-epsilon on the MLP in float64, from the formula R_i = x_i sum_j w_ij R_j / stab(z_j)."""
    x = x.astype(np.float64)
    h = x @ W1.T + B1
    a = np.maximum(h, 0)
    y = a @ W2.T + B2
    r_a = a * ((start(y) / stab(y)) @ W2)
    return x * ((r_a / stab(h)) @ W1), y


def test_targets_start_and_batches_match_a_numpy_oracle():
    ex = onnx_lrp.Explainer(mlp(), composite="epsilon")
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    res = ex.explain(x)  # argmax, starting from the logit
    ref, y = lrp_eps(x, lambda y: np.eye(4)[y.argmax(1)] * y)
    np.testing.assert_array_equal(res.target, y.argmax(1))
    assert_close(res.relevance, ref, rtol=1e-4, atol=1e-5)
    assert_close(res.outputs["y"], y, rtol=1e-5, atol=1e-5)
    # one target for all, one per item, one-hot start
    for target in (2, [0, 3, 1]):
        t = np.broadcast_to(np.asarray(target), (3,))
        res = ex.explain(x, target=target, start="one-hot")
        ref, _ = lrp_eps(x, lambda y: np.eye(4)[t])
        np.testing.assert_array_equal(res.target, t)
        assert_close(res.relevance, ref, rtol=1e-4, atol=1e-5)
    # a single sample without its batch axis: relevance of its shape (tests/api/test_conventions.py has the rest)
    single = ex.explain(x[0], target=1)
    assert single.relevance.shape == x[0].shape
    assert_close(single.relevance, ex.explain(x[:1], target=1).relevance[0], rtol=1e-6)


def test_logit_start_is_one_hot_start_times_the_logit():
    ex = onnx_lrp.Explainer(mlp(), composite="epsilon-plus-flat")
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    a = ex.explain(x, target=[0, 1, 2, 3])
    b = ex.explain(x, target=[0, 1, 2, 3], start="one-hot")
    logit = a.outputs["y"][np.arange(4), a.target]
    assert_close(a.relevance, b.relevance * logit[:, None], rtol=1e-5, atol=1e-6)


def test_softmax_output_explains_the_logits_before_it():
    with_softmax = onnx_lrp.Explainer(mlp(softmax=True), composite="epsilon")
    plain = onnx_lrp.Explainer(mlp(), composite="epsilon")
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    a, b = with_softmax.explain(x), plain.explain(x)
    assert_close(a.relevance, b.relevance, rtol=1e-6)
    np.testing.assert_allclose(a.outputs["p"].sum(1), 1.0, rtol=1e-5)  # the forward output is still the softmax


def test_saved_model_runs_in_plain_onnxruntime(tmp_path):
    ex = onnx_lrp.Explainer(mlp(), composite="epsilon")
    path = tmp_path / "mlp.lrp.onnx"
    ex.save(path)
    model = onnx.load(str(path))
    assert model.ir_version <= 13
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    steer = {"lrp/target": np.array([-1, -1], dtype=np.int64), "lrp/one_hot": np.array(False)}
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x, **steer})))
    assert_close(out["lrp/relevance/x"], ex.explain(x).relevance, rtol=1e-6)
    # the target input: -1 = argmax, or a class per item
    out = dict(zip([o.name for o in sess.get_outputs()],
                   sess.run(None, {"x": x, **steer, "lrp/target": np.array([3, 3], dtype=np.int64)})))
    np.testing.assert_array_equal(out["lrp/target_used"], [3, 3])


def test_static_batch_of_one_runs_item_by_item():
    ex = onnx_lrp.Explainer(mlp(batch=1), composite="epsilon")
    dyn = onnx_lrp.Explainer(mlp(), composite="epsilon")
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    assert_close(ex.explain(x).relevance, dyn.explain(x).relevance, rtol=1e-6)


def test_two_inputs_and_relevance_at_an_intermediate_tensor():
    nodes = [node("Gemm", ["a", "w1", "b1"], "ha", transB=1), node("Gemm", ["b", "w1", "b1"], "hb", transB=1),
             node("Add", ["ha", "hb"], "h"), node("Relu", ["h"], "r"), node("Gemm", ["r", "w2", "b2"], "y", transB=1)]
    model = make_model(nodes, {"a": ["N", 5], "b": ["N", 5]}, ["y"], {"w1": W1, "b1": B1, "w2": W2, "b2": B2})
    ex = onnx_lrp.Explainer(model.SerializeToString(), composite="epsilon", relevance_at=["r"], epsilon=0.0)
    xa, xb = RNG.standard_normal((2, 5)).astype(np.float32), RNG.standard_normal((2, 5)).astype(np.float32)
    res = ex.explain({"a": xa, "b": xb})
    assert set(res.relevance) == {"a", "b"}
    # with epsilon = 0 and the logit start, s = onehot at the last layer: R_r = r * W2[target]
    r = np.maximum(xa @ W1.T + B1 + xb @ W1.T + B1, 0)
    assert_close(res.relevance_at["r"], r * W2[res.target], rtol=1e-4, atol=1e-5)
    # the residual-style Add gets the norm rule (zennit's Sum): R_ha = ha * R_h / stab(h), then epsilon on each Gemm
    ha, hb = xa @ W1.T + B1, xb @ W1.T + B1
    h = ha + hb
    r_h = res.relevance_at["r"]  # Pass through the Relu
    for x_, hx, name in ((xa, ha, "a"), (xb, hb, "b")):
        r_hx = hx * r_h / stab(h, 0.0 + 1e-12)
        np.testing.assert_allclose(res.relevance[name], x_ * ((r_hx / stab(hx, 1e-12)) @ W1), rtol=1e-3, atol=1e-4)
    with pytest.raises(InputError, match="dict"):
        ex.explain(xa)


def test_bad_arguments_give_one_line_errors():
    ex = onnx_lrp.Explainer(mlp(), composite="epsilon")
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    cases = [dict(x=x, target=4), dict(x=x, target=[1, 2, 3]), dict(x=x.astype(np.int32)),
             dict(x=np.full((2, 5), np.nan, np.float32)), dict(x=x[:, :4]), dict(x=x, start="nope")]
    for kw in cases:
        with pytest.raises(InputError) as err:
            ex.explain(**kw)
        assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="gamma"):
        onnx_lrp.Explainer(mlp(), composite="epsilon", gamma=0.5)
    with pytest.raises(InputError, match="unknown composite"):
        onnx_lrp.Explainer(mlp(), composite="no-such-composite")


def test_devices():
    assert onnx_lrp.Explainer(mlp(), device="auto").device in ("cpu", "cuda")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(DeviceError, match="CUDA"):
            onnx_lrp.Explainer(mlp(), device="cuda")
    with pytest.raises(InputError, match="unknown device"):
        onnx_lrp.Explainer(mlp(), device="tpu")


# onnxruntime's CUDAExecutionProvider kernels (docs/OperatorKernels.md of onnxruntime 1.2x, ai.onnx domain)
# restricted to the ops a relevance graph may contain.
CUDA_OPS = {"Abs", "Add", "ArgMax", "Cast", "Clip", "Concat", "ConstantOfShape", "Conv", "ConvTranspose",
            "DepthToSpace", "Div", "Equal", "Expand", "Flatten", "Gather", "Gemm", "Greater", "GreaterOrEqual",
            "Identity", "Less", "MatMul", "Max", "MaxPool", "Min", "Mul", "Neg", "OneHot", "Pad", "ReduceSum",
            "ReduceMax", "Relu", "Reshape", "ScatterElements", "Shape", "Size", "Slice", "Softmax", "Split", "Sqrt",
            "Sub", "Sum", "Transpose", "Unsqueeze", "Where", "Reciprocal", "Sigmoid", "Tanh", "Exp", "Sign", "Not", "And"}


@pytest.mark.parametrize("composite", ["epsilon", "epsilon-plus-flat", "epsilon-gamma-box",
                                       "epsilon-alpha2-beta1-flat"])
def test_relevance_graph_uses_only_ops_the_cuda_provider_implements(composite):
    nodes = [node("Conv", ["x", "w"], "c", pads=[1, 1, 1, 1]), node("BatchNormalization", ["c", "s", "t", "m", "v"], "bn"),
             node("Relu", ["bn"], "r"), node("MaxPool", ["r"], "p", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             node("Conv", ["p", "w2"], "c2", strides=[2, 2], pads=[1, 1, 1, 1]), node("Relu", ["c2"], "r2"),
             node("Conv", ["p", "w3"], "c3", strides=[2, 2]), node("Add", ["r2", "c3"], "sum"),
             node("AveragePool", ["sum"], "ap", kernel_shape=[2, 2], strides=[2, 2]),
             node("GlobalAveragePool", ["ap"], "g"), node("Flatten", ["g"], "f"),
             node("Gemm", ["f", "wd", "bd"], "y", transB=1)]
    inits = {"w": RNG.standard_normal((4, 3, 3, 3)), "s": np.ones(4), "t": np.zeros(4), "m": np.zeros(4),
             "v": np.ones(4), "w2": RNG.standard_normal((6, 4, 3, 3)), "w3": RNG.standard_normal((6, 4, 1, 1)),
             "wd": RNG.standard_normal((3, 6)), "bd": np.zeros(3)}
    model = make_model(nodes, {"x": ["N", 3, 16, 16]}, ["y"], {k: np.asarray(v, np.float32) for k, v in inits.items()})
    box = {"low": -3.0, "high": 3.0} if composite == "epsilon-gamma-box" else {}
    ex = onnx_lrp.Explainer(model.SerializeToString(), composite=composite, **box)
    graph = onnx.load_model_from_string(ex.relevance_model.model_bytes).graph
    emitted = {n.op_type for n in graph.node if n.name.startswith("lrp/")}
    assert emitted and emitted <= CUDA_OPS, f"not in the CUDA kernel list: {sorted(emitted - CUDA_OPS)}"
    assert np.all(np.isfinite(ex.explain(RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)).relevance))


def test_serialize_sets_an_ir_version_onnxruntime_reads():
    ex = onnx_lrp.Explainer(mlp(), composite="epsilon")
    assert onnx.load_model_from_string(ex.relevance_model.model_bytes).ir_version <= 13
    assert onnx.load_model_from_string(serialize(onnx_lrp.load.load(mlp()))).ir_version <= 13


def test_float64_model_is_explained_in_float64():
    nodes = [node("Gemm", ["x", "w1", "b1"], "h", transB=1), node("Relu", ["h"], "a"),
             node("Gemm", ["a", "w2", "b2"], "y", transB=1)]
    model = make_model(nodes, {"x": ["N", 5]}, ["y"], {"w1": W1.astype(np.float64), "b1": B1.astype(np.float64),
                                                       "w2": W2.astype(np.float64), "b2": B2.astype(np.float64)},
                       dtype=np.float64)
    ex = onnx_lrp.Explainer(model.SerializeToString(), composite="epsilon")
    x = RNG.standard_normal((3, 5))
    res = ex.explain(x)
    ref, _ = lrp_eps(x, lambda y: np.eye(4)[y.argmax(1)] * y)
    assert res.relevance.dtype == np.float64
    assert_close(res.relevance, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kwargs,message", [
    (dict(model=None), "model must be a path, bytes or an onnx.ModelProto, not NoneType"),
    (dict(model=5), "not int"),
    (dict(device=5), "device must be 'cpu', 'cuda' or 'auto'"),
    (dict(relevance_at=5), "relevance_at must be a list of tensor names"),
    (dict(relevance_at=[1]), "relevance_at must be a list of tensor names"),
    (dict(threads="abc"), "threads must be a non-negative int"),
    (dict(threads=-1), "threads must be a non-negative int"),
    (dict(epsilon="abc"), "epsilon must be a number"),
])
def test_misuse_of_the_constructor_raises_lrp_errors(kwargs, message):
    kwargs = {"model": mlp(), "composite": "epsilon", **kwargs}
    with pytest.raises(onnx_lrp.LrpError, match=message):
        onnx_lrp.Explainer(kwargs.pop("model"), **kwargs)


def test_relevance_at_one_name_and_save_errors(tmp_path):
    ex = onnx_lrp.Explainer(mlp(), composite="epsilon", relevance_at="a")  # one name, not its letters
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    assert ex.explain(x).relevance_at["a"].shape == (2, 6)
    with pytest.raises(InputError, match="cannot write"):
        ex.save(tmp_path / "missing" / "m.onnx")


def test_build_and_a_runner_are_the_explainer():
    """``onnx_lrp.build_relevance_model`` makes the RelevanceModel an Explainer runs: a Runner of it gives the
    Explainer's relevance bit for bit and the numpy oracle's; the relevance model is a frozen value, and
    ``dir(onnx_lrp)`` lists the public API."""
    import dataclasses

    from onnx_lrp import BuildOptions
    from onnx_lrp.run.runner import Runner, RunOptions

    x = RNG.standard_normal((3, 5)).astype(np.float32)
    rm = onnx_lrp.build_relevance_model(mlp(), "epsilon", BuildOptions(relevance_at=("a",)))
    assert isinstance(rm, onnx_lrp.RelevanceModel) and rm.composite_name == "epsilon"
    assert [s.name for s in rm.inputs] == ["x"] and rm.relevance_inputs == ("x",) and rm.explained_output == "y"
    got = Runner(rm, RunOptions(threads=1)).explain(x, target=2)
    want = onnx_lrp.Explainer(mlp(), composite="epsilon", relevance_at="a").explain(x, target=2)
    np.testing.assert_array_equal(got.relevance, want.relevance)
    np.testing.assert_array_equal(got.relevance_at["a"], want.relevance_at["a"])
    oracle, _ = lrp_eps(x, lambda y: np.eye(4)[[2, 2, 2]] * y)
    assert np.max(np.abs(got.relevance - oracle)) <= 1e-5 * np.max(np.abs(oracle))
    with pytest.raises(dataclasses.FrozenInstanceError):
        rm.explained_output = "a"
    public = {"Explainer", "Explanation", "explain_dataset", "evaluate", "Evaluation", "RelMax", "RelevanceModel",
              "BuildOptions", "build_relevance_model", "LrpError", "InputError", "ModelError", "UnsupportedError", "DeviceError", "NumericError",
              "InternalError", "LrpWarning"}
    assert public <= set(dir(onnx_lrp))
    assert all(getattr(onnx_lrp, name) is not None for name in public)


def test_a_carried_relevance_model_holds_no_in_memory_model():
    """Pickled (to another process), the build source carries a model file's absolute path, a model's bytes, and
    nothing for an onnx_ir model in memory (which no other process can rebuild); the runner still explains it."""
    import pickle

    import onnx_ir as ir

    from onnx_lrp.run.runner import Runner

    x = RNG.standard_normal((2, 5)).astype(np.float32)
    in_memory = ir.serde.deserialize_model(onnx.load_from_string(mlp()))
    ex = onnx_lrp.Explainer(in_memory, composite="epsilon")
    assert ex.relevance_model.source.model is in_memory  # in this process: the model as given
    carried = pickle.loads(pickle.dumps(ex.payload()))
    assert carried[0].source.model is None and carried[0].source.composite == "epsilon"
    np.testing.assert_array_equal(Runner.from_payload(carried).explain(x).relevance, ex.explain(x).relevance)
    from_bytes = pickle.loads(pickle.dumps(onnx_lrp.Explainer(mlp(), composite="epsilon").payload()))
    assert from_bytes[0].source.model == mlp()
