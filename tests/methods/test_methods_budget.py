"""The methods' memory budget and their lean runs (issue 36, point 4): the rows per run chosen so that the built model
and one stacked run stay within ``memory_budget`` (the activation bytes per row read from the forward's shapes,
checked against the shapes by hand), chunked runs equal to one run, ReLU's derivative read from its output equal to
a numpy oracle of the gradient, occlusion's rows per run capped on the CPU with the same result, and the session
entry that turns onnxruntime's memory pattern off giving the same outputs."""
from __future__ import annotations

import numpy as np
import pytest
from util import assert_close, make_model, node

from onnx_lrp import load
from onnx_lrp.methods import Attributor, budget, occlusion

RNG = np.random.default_rng(7)
W1 = RNG.normal(size=(4, 2, 3, 3)).astype(np.float32)  # Conv 2 -> 4, 3 x 3, pads 1
B1 = RNG.normal(size=4).astype(np.float32)
W2 = RNG.normal(size=(4 * 6 * 6, 5)).astype(np.float32)  # Flatten -> MatMul -> 5 classes


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """x (N x 2 x 6 x 6) -> Conv -> Relu -> Flatten -> MatMul: a tiny ReLU net whose gradient numpy writes out."""
    model = make_model([node("Conv", ["x", "w1", "b1"], "z", pads=[1, 1, 1, 1]), node("Relu", ["z"], "h"),
                        node("Flatten", ["h"], "f"), node("MatMul", ["f", "w2"], "y")],
                       {"x": ["N", 2, 6, 6]}, ["y"], {"w1": W1, "b1": B1, "w2": W2})
    path = tmp_path_factory.mktemp("budget") / "cnn.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def _conv(x):
    """numpy's Conv 3 x 3, pads 1 (float64)."""
    p = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((x.shape[0], 4, 6, 6))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", p[:, :, i:i + 6, j:j + 6], W1[:, :, i, j])
    return out + B1[None, :, None, None]


def _gradient(x, t):
    """d y[t] / d x by hand: the MatMul's column, the ReLU mask [z > 0], the Conv's transpose."""
    z = _conv(x)
    g = np.broadcast_to(W2[:, t].reshape(4, 6, 6).astype(np.float64), z.shape) * (z > 0)
    p = np.zeros((x.shape[0], 2, 8, 8))
    for i in range(3):
        for j in range(3):
            p[:, :, i:i + 6, j:j + 6] += np.einsum("nohw,oc->nchw", g, W1[:, :, i, j])
    return p[:, :, 1:7, 1:7]


def test_activation_bytes_are_the_forward_outputs_per_item(cnn):
    """Conv and Relu 4 x 6 x 6, Flatten 144, MatMul 5 floats per item: 4 bytes each, by hand."""
    forward = load.load(cnn)
    assert budget.activation_bytes(forward.graph) == 4 * (144 + 144 + 144 + 5)


def test_rows_per_run_keep_the_built_model_and_the_run_within_the_budget(cnn):
    x = RNG.normal(size=(1, 2, 6, 6)).astype(np.float32)
    eng = Attributor(cnn, "gradient", memory_budget=2**40).engine
    row = max(eng.activation_bytes, x.nbytes * budget.ROW_FACTOR)
    assert eng.activation_bytes == 4 * (144 * 3 + 5)
    for rows in (1, 3, 10):
        given = eng.resident_bytes + rows * row + row // 2  # room for `rows` rows and half a row more
        small = Attributor(cnn, "gradient", memory_budget=given).engine
        small.resident_bytes = eng.resident_bytes  # the same built model (a second build's rise may differ)
        assert small.rows_per_run(x) == rows
        assert small.resident_bytes + rows * row <= given < small.resident_bytes + (rows + 1) * row
    assert budget.rows_within(10, 100, 1) == 1  # a budget under the model itself: still one row per run


def test_relu_gradient_from_its_output_and_chunked_runs_equal_numpy(cnn):
    """The gradient (ReLU's mask read from its output) against numpy's, in one run and one row per run; integrated
    gradients chunked the same."""
    x = RNG.normal(size=(5, 2, 6, 6)).astype(np.float32)
    x[0, 0, :2] = 0.0  # inputs at 0 and pre-activations near 0 are no special case
    t = np.array([0, 1, 2, 3, 4])
    want = np.stack([_gradient(x[i:i + 1], t[i])[0] for i in range(5)])
    one = Attributor(cnn, "gradient", internal_batch_size=64).attribute(x, t)
    rows = Attributor(cnn, "gradient", internal_batch_size=1).attribute(x, t)
    assert_close(one, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(rows, one)
    ig = [Attributor(cnn, "integrated-gradients", n_steps=8, internal_batch_size=n).attribute(x, t) for n in (3, 64)]
    assert_close(ig[0], ig[1], rtol=1e-6)


def test_occlusion_caps_its_rows_per_run_on_the_cpu_with_the_same_result(cnn):
    x = RNG.normal(size=(2, 2, 6, 6)).astype(np.float32)
    occ = Attributor(cnn, "occlusion", sliding_window_shapes=(1, 2, 2), strides=1)
    assert occ.engine.rows_per_run(x) == occlusion.CPU_ROWS  # the 2 GB budget would allow thousands
    one = Attributor(cnn, "occlusion", sliding_window_shapes=(1, 2, 2), strides=1, internal_batch_size=10**4)
    got, want = occ.attribute(x, [1, 3]), one.attribute(x, [1, 3])
    assert_close(got, want, rtol=1e-6)
    # captum's occlusion by hand for one window: the drop of the target where the window covers
    y = lambda a: np.maximum(_conv(a), 0).reshape(len(a), -1) @ W2.astype(np.float64)  # noqa: E731
    hidden = x[:1].copy()
    hidden[:, 0, 0:2, 0:2] = 0.0
    corner = (y(x[:1]) - y(hidden))[0, 1]  # the only window over entry (0, 0, 0)
    assert_close(got[0, 0, 0, 0], corner, rtol=1e-5, atol=1e-6)


def test_the_memory_pattern_entry_leaves_the_outputs_as_they_are(cnn):
    from onnx_lrp.run import runtime

    x = RNG.normal(size=(3, 2, 6, 6)).astype(np.float32)
    plain = runtime.Session(cnn, deployed=True)
    lean = runtime.Session(cnn, deployed=True, config={runtime.MEM_PATTERN: "0"})
    for _ in range(2):  # the second run of a shape is the one the pattern changes
        np.testing.assert_array_equal(lean.run({"x": x})["y"], plain.run({"x": x})["y"])
