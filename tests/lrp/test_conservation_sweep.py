"""Conservation sweep over the third-party exports the tests ship (torch.onnx, tf2onnx, jax2onnx twins; Keras-only
twins): relevance sum / logit per model and composite, with what each rule family must satisfy, read from the
relevance model's own ledger (``Explainer(ledger=True)``):

* every family: a node that has nothing to absorb relevance (no bias, no parameters off the linear path, no integer
  inputs, no held pattern, no stabilised denominator) hands on what it receives (|absorbed| <= 1e-4 x what enters
  it, + 1e-6 x the start);
* LRP-0 (epsilon = 0; attnlrp, which is LRP-0 on these nets): the ratio is that of the framework's own gradient x
  input (1e-4; the goldens' float64 references): 1 up to the biases' share;
* the last line of defence: a ratio outside [0.01, 100] (or exploding entries) is flagged by ``strict=True``;
* with every bias zeroed, each family's sum / logit lies in its band (``BANDS``: LRP-0 exact, epsilon / z+ / gamma
  within 1 %, alpha-beta within [0.9, 1.2]).

A family that vanishes or explodes at a node without a sink fails here. The table (the median ratio over 3-4
items) is in docs/trust.md; ``python tests/lrp/test_conservation_sweep.py`` prints it.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp.run import conservation
from onnx_lrp.core.errors import NumericError
from util import GOLDENS, assert_close

TWINS = GOLDENS / "twins"


def _nhwc(x):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def _inputs(name: str) -> tuple[str, np.ndarray]:
    extra = lambda key: np.load(TWINS / "keras_extra.npz")[key]  # noqa: E731
    twin = lambda net: np.load(TWINS / f"{net}.npz")["x"]  # noqa: E731
    return {
        "small_cnn/torch": (GOLDENS / "small_cnn_torchscript.onnx", lambda: np.load(GOLDENS / "small_cnn.npz")["x"]),
        "resnet/torch": (TWINS / "resnet_torch.onnx", lambda: twin("resnet")),
        "resnet/keras": (TWINS / "resnet_keras.onnx", lambda: _nhwc(twin("resnet"))),
        "mobilenet/flax": (TWINS / "mobilenet_flax.onnx", lambda: _nhwc(twin("mobilenet"))),
        "select/torch": (TWINS / "select_torch.onnx", lambda: twin("select")),
        "conv1d/keras": (TWINS / "conv1d_keras_op17.onnx", lambda: extra("conv1d/x")),
        "densenet/keras": (TWINS / "densenet_keras_op17.onnx", lambda: extra("densenet/x")),
        "text_lstm/keras": (TWINS / "text_lstm_keras.onnx", lambda: extra("text/ids")),
    }[name]


def _gxi(name: str) -> np.ndarray | None:
    """The framework's float64 gradient x input of the arg-max logit, where a golden holds it."""
    net, framework = name.split("/")
    if (TWINS / f"{net}.npz").exists() and net in ("resnet", "mobilenet", "select"):
        gxi = np.load(TWINS / f"{net}.npz")["gxi"]
        return gxi if framework == "torch" else _nhwc(gxi)
    if net in ("conv1d", "densenet"):
        return np.load(TWINS / "keras_extra.npz")[f"{net}/gxi"]
    return None


MODELS = ("small_cnn/torch", "resnet/torch", "resnet/keras", "mobilenet/flax", "select/torch", "conv1d/keras",
          "densenet/keras", "text_lstm/keras")
COMPOSITES = {"epsilon@0": ("epsilon", {"epsilon": 0.0}), "epsilon": ("epsilon", {}),
              "epsilon-plus-flat": ("epsilon-plus-flat", {}),
              "epsilon-gamma-box": ("epsilon-gamma-box", {"low": -3.0, "high": 3.0}),
              "epsilon-alpha2-beta1": ("epsilon-alpha2-beta1", {}), "attnlrp": ("attnlrp", {})}
LRP0 = ("epsilon@0", "attnlrp")
# relevance created where LRP-epsilon (epsilon = 1e-6) divides by outputs near zero after a passed BatchNorm: the
# last line of defence must flag it (LRP-0 on the same net, epsilon@0, is exact: tests/parity/test_framework_twins.py)
EXPLODES = {("densenet/keras", "epsilon")}


def sweep(name: str, composite: str):
    path, x = _inputs(name)
    comp, params = COMPOSITES[composite]
    x = x()
    ex = onnx_lrp.Explainer(str(path), composite=comp, ledger=True, **params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ex.explain(x)
    per_item = res.relevance.reshape(len(x), -1).sum(1) / res.explained_value
    return ex, res, per_item


@pytest.mark.parametrize("composite", list(COMPOSITES))
@pytest.mark.parametrize("name", MODELS)
def test_conservation_band(name, composite):
    ex, res, ratio = sweep(name, composite)
    start = float(np.sum(res.explained_value))
    entering = np.asarray(res.ledger["entering"], np.float64)
    absorbed = entering - np.asarray(res.ledger["leaving"], np.float64)
    lrp0 = composite in LRP0
    # a stabilised denominator (epsilon, norm with 1e-6) absorbs its share: a sink, except under LRP-0
    sinkless = [i for i, row in enumerate(ex.relevance_model.ledger_rows)
                if not row.sinks and (lrp0 or row.rule not in ("epsilon", "norm"))]
    leak = {ex.relevance_model.ledger_rows[i].name: absorbed[i] for i in sinkless
            if abs(absorbed[i]) > 1e-4 * abs(entering[i]) + 1e-6 * abs(start)}
    assert not leak, f"{name} {composite}: nodes without a sink absorb/create relevance: {leak}"
    total = float(np.sum(res.relevance))
    gxi = _gxi(name)
    if lrp0 and gxi is not None:  # LRP-0 = gradient x input: the same sum, the biases' share left out of both
        assert_close(ratio, gxi.reshape(len(gxi), -1).sum(1) / res.explained_value, rtol=1e-4,
                                   atol=1e-5)
    if (name, composite) in EXPLODES:
        comp, params = COMPOSITES[composite]
        with pytest.raises(NumericError, match="relevance not conserved"):
            onnx_lrp.Explainer(str(_inputs(name)[0]), composite=comp, strict=True, **params).explain(
                _inputs(name)[1]())
    else:
        assert np.all(np.isfinite(ratio)) and np.max(np.abs(ratio)) < conservation.CEILING, ratio



# The same networks with every bias zeroed (Conv/Gemm biases, BatchNorm shifts and means, constant Adds): nothing is
# left to absorb relevance, so relevance sum / logit is 1 per rule family up to that family's own slack, measured:
# LRP-0 exact; epsilon, z+, flat, gamma, ZBox lose only what the stabiliser takes (<= 5.5e-3 here: densenet's flat);
# alpha2-beta1 creates or loses relevance where one of its parts is empty (alpha R+ with no R- to subtract: zennit
# does the same), measured 0.96-1.12. A family that vanishes (timm EfficientNet's 0.0022 under epsilon-plus-flat)
# or explodes falls outside its band.
BANDS = {"epsilon@0": (1 - 1e-5, 1 + 1e-5), "attnlrp": (1 - 1e-5, 1 + 1e-5), "epsilon": (0.99, 1 + 1e-5),
         "epsilon-plus-flat": (0.99, 1.01), "epsilon-gamma-box": (0.99, 1 + 1e-5), "epsilon-alpha2-beta1": (0.9, 1.2)}
RELU_NETS = ("small_cnn/torch", "resnet/torch", "resnet/keras", "mobilenet/flax", "select/torch", "conv1d/keras",
             "densenet/keras")


def zero_biases(path) -> bytes:
    """The model with every additive parameter zeroed (read and written with onnx: an independent edit)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}

    def zero(name: str) -> None:
        if name in inits and numpy_helper.to_array(inits[name]).dtype.kind == "f":
            a = numpy_helper.to_array(inits[name])
            inits[name].CopyFrom(numpy_helper.from_array(np.zeros_like(a), name))

    for n in model.graph.node:
        if n.op_type in ("Conv", "ConvTranspose", "Gemm") and len(n.input) > 2:
            zero(n.input[2])
        elif n.op_type == "BatchNormalization":
            zero(n.input[2])
            zero(n.input[3])
        elif n.op_type == "Add":
            for name in n.input:
                zero(name)
    return model.SerializeToString()


@pytest.mark.parametrize("composite", list(COMPOSITES))
@pytest.mark.parametrize("name", RELU_NETS)
def test_without_biases_each_family_conserves_within_its_band(name, composite):
    path, x = _inputs(name)
    comp, params = COMPOSITES[composite]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = onnx_lrp.Explainer(zero_biases(path), composite=comp, **params).explain(x())
    logit = np.asarray(res.explained_value, np.float64)
    assert np.all(np.abs(logit) > 1e-3), logit  # a logit to compare with (not a zeroed network)
    ratio = res.relevance.reshape(len(logit), -1).astype(np.float64).sum(1) / logit
    low, high = BANDS[composite]
    assert np.all((ratio >= low) & (ratio <= high)), f"{name} {composite}: sum / logit {ratio} outside [{low}, {high}]"

def table() -> str:
    lines = ["| model | " + " | ".join(COMPOSITES) + " |", "| --- |" + " --- |" * len(COMPOSITES)]
    for name in MODELS:
        cells = []
        for composite in COMPOSITES:
            _, _, ratio = sweep(name, composite)
            cells.append(f"{np.median(ratio):.3g}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
