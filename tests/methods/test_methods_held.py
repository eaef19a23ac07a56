"""Occlusion and RISE on a model with a float input and an integer attention mask: the mask is held (fed as given to
every perturbed copy, as captum's ``additional_forward_args``), only the float input is occluded / masked and
attributed, against a numpy oracle of the same model and captum's Occlusion holding the mask; per-input options
count the float inputs (a window for the mask too is refused in one line); the command line names the held inputs
in one line and in --json (the BERT export with its mask against captum: test_methods_real_exports.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from util import assert_cli_refuses, assert_close, cli, make_model, node, to_bytes

N, T, D, C = 2, 5, 4, 3
W = np.random.default_rng(0).standard_normal((D, C)).astype(np.float32)
MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int64)  # the second item padded at its last two positions
X = np.random.default_rng(1).standard_normal((N, T, D)).astype(np.float32)


def masked(mask_type=np.int64) -> bytes:
    """y = tanh(sum_t (x * mask)[:, t] @ W); the mask the model's FIRST input (the float input need not be)."""
    nodes = [node("Cast", ["mask"], "m", to=1), node("Unsqueeze", ["m", "two"], "mu"), node("Mul", ["x", "mu"], "h"),
             node("ReduceSum", ["h", "one"], "s", keepdims=0), node("MatMul", ["s", "W"], "z"),
             node("Tanh", ["z"], "y")]
    return to_bytes(make_model(nodes, {"mask": (["N", T], mask_type), "x": ["N", T, D]}, ["y"],
                               {"W": W, "one": np.array([1], np.int64), "two": np.array([2], np.int64)}))


@pytest.fixture(scope="module")
def model() -> bytes:
    return masked()


def f(x, mask=MASK) -> np.ndarray:
    """The model in float64 numpy."""
    return np.tanh((np.asarray(x, np.float64) * mask[..., None]).sum(1) @ W.astype(np.float64))


def occlusion_oracle(x, targets, window: int, base: float) -> np.ndarray:
    """captum's Occlusion with windows of ``window`` time steps (every feature), stride 1, the mask held."""
    rows = np.arange(N)
    whole = f(x)[rows, targets]
    total, cover = np.zeros(x.shape), np.zeros(T)
    for t in range(T - window + 1):
        occluded = x.astype(np.float64).copy()
        occluded[:, t:t + window] = base
        total[:, t:t + window] += (whole - f(occluded)[rows, targets])[:, None, None]
        cover[t:t + window] += 1
    return total / cover[None, :, None]


def test_occlusion_holds_the_mask(model):
    """The float input's attribution equals the oracle with the mask held (zero where the mask pads: the mask was
    fed as given to every copy); no attribution of the mask."""
    from onnx_lrp.methods import Attributor

    targets = np.array([0, 2])
    got = Attributor(model, "occlusion", sliding_window_shapes=(2, D), strides=(1, D), baselines=0.5).attribute(
        {"x": X, "mask": MASK}, targets)
    assert set(got) == {"x"} and got["x"].dtype == np.float32
    ref = occlusion_oracle(X, targets, 2, 0.5)
    assert_close(got["x"], ref, atol=1e-6)
    assert np.all(got["x"][1, 4] == 0) and np.all(ref[1, :3] != 0)  # the last step: only padded windows
    # a tuple in the model's order: a tuple of the attributed inputs
    (alone,) = Attributor(model, "occlusion", sliding_window_shapes=((2, D),), strides=((1, D),),
                          baselines=0.5).attribute((MASK, X), targets)
    np.testing.assert_array_equal(alone, got["x"])


def test_a_bool_mask_is_held_too():
    from onnx_lrp import Explainer

    ex = Explainer(masked(np.bool_), method="occlusion", sliding_window_shapes=(1, D), strides=(1, D))
    assert ex.held_inputs == ["mask"]
    got = ex.explain({"x": X, "mask": MASK.astype(bool)}, target=1).relevance
    assert_close(got, occlusion_oracle(X, np.array([1, 1]), 1, 0.0), atol=1e-6)


def test_occlusion_is_captums_with_the_mask_as_an_additional_forward_arg(model):
    torch = pytest.importorskip("torch")
    captum_attr = pytest.importorskip("captum.attr")
    from onnx_lrp import Explainer

    w = torch.tensor(W, dtype=torch.float64)

    def forward(x, mask):
        return torch.tanh((x * mask[..., None]).sum(1) @ w)

    targets = np.array([1, 0])
    ref = captum_attr.Occlusion(forward).attribute(
        torch.tensor(X, dtype=torch.float64), sliding_window_shapes=(1, 2), strides=(1, 2), baselines=0.0,
        target=torch.tensor(targets), additional_forward_args=(torch.tensor(MASK, dtype=torch.float64),)).numpy()
    ex = Explainer(model, method="occlusion", sliding_window_shapes=(1, 2), strides=(1, 2))
    assert ex.held_inputs == ["mask"] and ex.relevance_inputs == ["x"]
    e = ex.explain({"mask": MASK, "x": X}, target=targets)
    assert_close(e.relevance, ref, atol=1e-6)  # one attributed input: its array, as LRP's Explanation


def test_rise_masks_the_float_input_and_holds_the_mask(model):
    """RISE with explicit masks: sum_i f(x * M_i + b (1 - M_i), mask)[target] M_i / (n p), the mask held."""
    from onnx_lrp import Explainer

    masks = (np.random.default_rng(2).random((6, T, D)) < 0.5).astype(np.float32)
    targets = np.array([2, 1])
    ex = Explainer(model, method="rise", masks=masks, probability=0.5, baselines=0.25)
    assert ex.held_inputs == ["mask"]
    got = ex.explain({"x": X, "mask": MASK}, target=targets).relevance
    ref = sum(f(X * m + 0.25 * (1 - m))[np.arange(N), targets][:, None, None] * m for m in masks) / (6 * 0.5)
    assert got.shape == (N, T, D)
    assert_close(got, ref, atol=1e-6)


def test_a_window_for_the_mask_too_is_refused_in_one_line(model):
    from onnx_lrp import InputError
    from onnx_lrp.methods import Attributor

    attr = Attributor(model, "occlusion", sliding_window_shapes=((1, D), (1,)), strides=((1, D), (1,)))
    with pytest.raises(InputError) as exc:
        attr.attribute({"x": X, "mask": MASK}, 0)
    assert "per occluded input (x: the float inputs; integer ones are held as given)" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_rise_with_two_float_inputs_refused_in_one_line():
    from onnx_lrp import InputError
    from onnx_lrp.methods import Attributor

    two = to_bytes(make_model([node("Add", ["a", "b"], "y")], {"a": ["N", 4], "b": ["N", 4]}, ["y"]))
    a = np.ones((1, 4), np.float32)
    with pytest.raises(InputError) as exc:
        Attributor(two, "rise", n_masks=4).attribute({"a": a, "b": a}, 0)
    assert "rise masks one float input; the model has 2 (a, b" in str(exc.value) and "\n" not in str(exc.value)


def test_command_line_names_the_held_inputs(model, tmp_path):
    path, inputs = tmp_path / "m.onnx", tmp_path / "x.npz"
    path.write_bytes(model)
    np.savez(inputs, x=X, mask=MASK)
    window = ["--method", "occlusion", "--sliding-window-shapes", f"1,{D}", "--strides", f"1,{D}"]
    res = cli("explain", path, inputs, *window, "-o", tmp_path / "r.npz")
    assert res.exit_code == 0, res.output
    lines = [s for s in res.stdout.splitlines() if s.startswith("held:")]
    assert lines == ["held: mask fed as given to every run of occlusion, not attributed (relevance of x)"]
    res = cli("explain", path, inputs, *window, "-o", tmp_path / "r2.npz", "--json")
    summary = json.loads(res.stdout)
    assert res.exit_code == 0 and summary["held_inputs"] == ["mask"]
    out = np.load(tmp_path / "r2.npz")
    assert_close(out["relevance"] if "relevance" in out.files else out["relevance/x"],
                 occlusion_oracle(X, np.argmax(f(X), 1), 1, 0.0), atol=1e-6)
    before = inputs.read_bytes()
    assert_cli_refuses(["explain", path, inputs, "--method", "occlusion", "--sliding-window-shapes", f"1,{D};1",
                        "-o", tmp_path / "r3.npz"], tmp_path, "per occluded input (x: the float inputs")
    assert inputs.read_bytes() == before
