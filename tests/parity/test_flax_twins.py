"""Flax (nnx) CNNs with pooling, crops and residual blocks as jax2onnx 0.17 writes them (issue 17), at opsets 17 and
23: LRP-0 (``epsilon`` with epsilon = 0 and stabilizer 0, started from the logit) equals JAX's own float64 gradient
x input on these piecewise-linear networks. The models and references are committed
(scripts/make_flax_twins.py), so no JAX is needed here.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import onnx_lrp
from test_framework_twins import LRP0
from util import GOLDENS, assert_close, explain, rel_l2_items

TWINS = GOLDENS / "flax_twins"
NETS = ("pool_res_crop", "avg_proj_crop", "max_res_crop")
# LRP-0 on every linear layer, the unfoldable BatchNorms included (the built-in composites give kind "batchnorm"
# zennit's Pass, which is not gradient x input: preact_res is 32x off with `epsilon` at epsilon = 0): the framework
# twins' LRP-0 composite, whose last entry gives every other kind epsilon = 0
LRP0_ALL = LRP0


def golden_run(net, opset, composite, **params):
    """(Explanation, golden) of the Flax twin ``net`` exported at ``opset`` on its golden's input and target."""
    path = TWINS / f"{net}_op{opset}.onnx"
    assert onnx.load(str(path), load_external_data=False).opset_import[0].version == opset
    golden = np.load(TWINS / f"{net}.npz")
    return explain(path, golden["x"], composite, golden["target"], start="logit", **params), golden


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("net", NETS)
def test_flax_cnn_lrp0_equals_float64_gradient_x_input(net, opset):
    """The built-in ``epsilon`` composite at epsilon = 0, stabilizer 0 (every BatchNorm here is folded)."""
    res, golden = golden_run(net, opset, "epsilon", epsilon=0.0, stabilizer=0.0)
    assert_close(res.outputs["y"], golden["logits"], rtol=1e-4, atol=1e-5)
    assert rel_l2_items(res.relevance, golden["gxi"]).max() <= 1e-5


@pytest.mark.parametrize("opset", [17, 23])
def test_flax_preactivation_resnet_lrp0_on_its_batchnorms_equals_gradient_x_input(opset):
    """Pre-activation blocks: the BatchNorms after the residual sums cannot be folded; LRP-0 on them too (LRP0_ALL)
    is gradient x input."""
    res, golden = golden_run("preact_res", opset, LRP0_ALL)
    assert_close(res.outputs["y"], golden["logits"], rtol=1e-4, atol=1e-5)
    assert rel_l2_items(res.relevance, golden["gxi"]).max() <= 1e-5


# ------------------------------------------------------------ user-style nnx.Modules (issue 17, second round)
@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("net", ["ln_res", "gn_res"])
def test_flax_norm_residual_lrp0_is_gradient_x_input_with_the_variance_held(net, opset):
    """LayerNorm / GroupNorm in a residual block: the rules hold the normalising std constant (LXT), so LRP-0 is JAX's
    float64 gradient x input with the variance under stop_gradient, not the plain gradient (which differs by 0.1-0.2
    rel-L2: the size of issue 17's "Flax CNN 0.198 off")."""
    res, golden = golden_run(net, opset, "epsilon", epsilon=0.0, stabilizer=0.0)
    assert_close(res.outputs["y"], golden["logits"], rtol=1e-4, atol=1e-5)
    assert rel_l2_items(res.relevance, golden["gxi_held"]).max() <= 1e-5
    assert rel_l2_items(res.relevance, golden["gxi"]).min() > 0.05  # the convention is what differs, not noise


@pytest.mark.parametrize("opset", [17, 23])
def test_flax_ops_mix_lrp0_equals_float64_gradient_x_input(opset):
    """Explicit asymmetric conv pads, kernel dilation, jnp.pad, grouped and depthwise convs, an average pool without
    the padding in the count, crops, strided slices with offsets, a strided projection block."""
    res, golden = golden_run("ops_mix", opset, "epsilon", epsilon=0.0, stabilizer=0.0)
    assert_close(res.outputs["y"], golden["logits"], rtol=1e-4, atol=1e-5)
    assert rel_l2_items(res.relevance, golden["gxi"]).max() <= 1e-5


def test_flax_static_batch_of_one_explains_item_by_item():
    golden = np.load(TWINS / "ops_mix.npz")
    ex = onnx_lrp.Explainer(str(TWINS / "ops_mix_b1_op17.onnx"), composite="epsilon", epsilon=0.0, stabilizer=0.0)
    rel = np.concatenate([ex.explain(golden["x"][i:i + 1], target=int(golden["target"][i])).relevance
                          for i in range(len(golden["x"]))])
    assert rel_l2_items(rel, golden["gxi"]).max() <= 1e-5


@pytest.mark.parametrize("opset", [17, 23])
def test_flax_dropout_left_in_training_mode_is_refused(opset):
    """nnx.Dropout without deterministic=True: jax2onnx writes Dropout(training_mode=true), whose masks are random on
    every run; before, the loader dropped it and explained another network than the deployed one, silently."""
    with pytest.raises(onnx_lrp.UnsupportedError, match=r"Dropout.*training_mode is set.*eval mode") as info:
        onnx_lrp.Explainer(str(TWINS / f"dropout_train_op{opset}.onnx"), composite="epsilon")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("opset", [17, 23])
def test_flax_circular_padding_reflect_pad_and_dynamic_slice(opset):
    """padding="CIRCULAR", jnp.pad(mode="reflect"), lax.dynamic_slice: jax2onnx bounds their Slices by the dynamic
    batch size (refused before as "not constants"); LRP-0 equals JAX's float64 gradient x input."""
    res, golden = golden_run("wrap_slices", opset, "epsilon", epsilon=0.0, stabilizer=0.0)
    assert_close(res.outputs["y"], golden["logits"], rtol=1e-4, atol=1e-5)
    assert rel_l2_items(res.relevance, golden["gxi"]).max() <= 1e-5


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("net", ["gn_silu", "ln_gelu"])
def test_flax_norm_then_silu_or_gelu_under_attnlrp_is_lxt(net, opset):
    """GroupNorm -> SiLU (a diffusion UNet's block), LayerNorm -> GELU, decomposed by jax2onnx: attnlrp (the default
    for such nets) equals JAX's float64 gradient x input with LXT's identity rule on the activations and the
    variance held (``gxi_identity``). Before, the norm's scale and shift were held inside the SiLU/GELU pattern:
    1.7-390 rel-L2."""
    path = TWINS / f"{net}_op{opset}.onnx"
    golden = np.load(TWINS / f"{net}.npz")
    ex = onnx_lrp.Explainer(str(path), start="logit")
    assert ex.composite_name == "attnlrp"  # auto: non-ReLU non-linearities
    res = ex.explain(golden["x"], target=golden["target"])
    assert_close(res.outputs["y"], golden["logits"], rtol=1e-4, atol=1e-5)
    assert rel_l2_items(res.relevance, golden["gxi_identity"]).max() <= 1e-5


@pytest.mark.parametrize("opset", [17, 23])
def test_flax_hand_written_layernorm(opset):
    """A LayerNorm written by hand with jnp.var (jax2onnx: ReduceSumSquare, Reshape/Expand broadcasts of
    keepdims reductions, a Where guarding the divisor): refused before; now read as a normalisation with its std held,
    so LRP-0 is JAX's float64 gradient x input with the variance under stop_gradient."""
    res, golden = golden_run("hand_ln", opset, "epsilon", epsilon=0.0, stabilizer=0.0)
    assert_close(res.outputs["y"], golden["logits"], rtol=1e-4, atol=1e-5)
    assert rel_l2_items(res.relevance, golden["gxi_held"]).max() <= 1e-5
    assert rel_l2_items(res.relevance, golden["gxi"]).min() > 0.05
