"""Attention masks carry no relevance: real TorchScript exports of small random-weight transformers that take
``attention_mask`` (made by scripts/make_mask_goldens.py with transformers 4.53; no torch needed here).

* OPT (positions counted from the mask, a mask-only ScatterND) and BERT + sentence-transformers' masked mean
  pooling ``sum(h * m) / sum(m)``: relevance per token against LXT's efficient AttnLRP (rel. L2 < 1e-4);
* the padding property, on OPT, Falcon and BERT + pooling: a padded item's valid tokens get the relevance of the
  same tokens given alone (the same export, a shorter sequence, no padding), its padding none;
* the default explained output of BERT + pooling, which lists an int64 token count first, is the sentence
  embedding.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import onnx_lrp
from util import GOLDENS, assert_close, rel_l2

MASKS = GOLDENS / "masks"
PAD = 3


@pytest.fixture(scope="module")
def ref():
    return dict(np.load(MASKS / "masks.npz"))


def _explainer(name):
    return onnx_lrp.Explainer(MASKS / f"{name}.onnx", composite="attnlrp")


@pytest.mark.parametrize("name", ["opt", "bert_pool"])
def test_masked_models_match_lxt(name, ref):
    ex = _explainer(name)
    side = "left" if name == "opt" else "right"
    feeds = {"input_ids": ref[f"ids_{side}"], "attention_mask": ref[f"mask_{side}"]}
    res = ex.explain(feeds, target=ref[f"{name}_target"])
    out = "opt_logits" if name == "opt" else "bert_pool_embedding"
    y = res.outputs[ex.explained_output]
    if name == "opt":  # a fully masked row (a left pad's own position) holds no defined value: compare the rest
        y, want = [np.concatenate([a[0, PAD:], a[1]]) for a in (y, ref[out])]
    else:
        want = ref[out]
    assert_close(y, want, rtol=1e-4, atol=1e-5)
    for i in range(2):
        assert rel_l2(res.relevance[i], ref[f"{name}_lxt"][i]) < 1e-4, (name, i)  # measured 1e-7; cp-lrp: 1e-2
    assert np.abs(res.relevance[0][:PAD] if side == "left" else res.relevance[0][-PAD:]).max() < 1e-6 * np.abs(
        res.relevance[0]).max()


@pytest.mark.parametrize("name, side", [("opt", "left"), ("falcon", "left"), ("bert_pool", "right")])
def test_padding_gets_no_relevance_and_changes_nothing(name, side, ref):
    ex = _explainer(name)
    ids, mask = ref[f"ids_{side}"][:1], ref[f"mask_{side}"][:1]
    keep = slice(PAD, None) if side == "left" else slice(None, -PAD)
    padded = ex.explain({"input_ids": ids, "attention_mask": mask})
    alone = ex.explain({"input_ids": np.ascontiguousarray(ids[:, keep]),
                        "attention_mask": np.ascontiguousarray(mask[:, keep])}, target=padded.target)
    y_pad, y_alone = padded.outputs[ex.explained_output], alone.outputs[ex.explained_output]
    if y_pad.ndim == 3:  # causal LM: the last position is a valid token
        y_pad, y_alone = y_pad[:, -1], y_alone[:, -1]
    assert_close(y_pad, y_alone, rtol=1e-4, atol=1e-5)
    scale = np.abs(alone.relevance).max()
    assert scale > 0
    np.testing.assert_allclose(padded.relevance[:, keep], alone.relevance, rtol=1e-4, atol=1e-5 * scale)
    pad = np.delete(padded.relevance[0], np.arange(ids.shape[1])[keep])
    assert np.abs(pad).max() <= 1e-6 * scale


def test_default_output_is_the_first_float_output(ref):
    ex = _explainer("bert_pool")
    assert [o for o in ex.output_names] == ["n_tokens", "sentence_embedding"]
    assert ex.explained_output == "sentence_embedding"
    res = ex.explain({"input_ids": ref["ids_right"], "attention_mask": ref["mask_right"]})
    np.testing.assert_array_equal(res.outputs["n_tokens"], ref["mask_right"].sum(1))
    np.testing.assert_array_equal(res.target, ref["bert_pool_embedding"].argmax(-1))
    assert np.all(np.isfinite(res.relevance))


def test_model_of_integer_inputs_only_is_refused_in_one_line():
    """An integer image cast to float and no embedding lookup: nothing carries relevance; one line says why."""
    from util import make_model, node
    w = np.ones((2, 1, 3, 3), np.float32)
    m = make_model([node("Cast", ["img"], "f", to=1), node("Conv", ["f", "w"], "c"),
                    node("ReduceMean", ["c"], "y", axes=[2, 3], keepdims=0)],
                   {"img": ([1, 1, 5, 5], np.int64)}, ["y"], {"w": w}, opset=17)
    with pytest.raises(onnx_lrp.InputError, match="not a float tensor computed from the inputs.*integer") as err:
        onnx_lrp.Explainer(m.SerializeToString())
    assert "\n" not in str(err.value)


def test_control_flow_on_an_integer_input_is_not_taken_for_a_mask():
    """An If whose condition comes from an integer input (silero-vad's sample rate) reads the float input inside
    its branches: its output is not mask-only; the If is refused by name, not the model as having nothing to
    explain."""
    from onnx import TensorProto, helper
    from util import IR_VERSION
    branch = lambda k: helper.make_graph([helper.make_node("Mul", ["x", k], ["o" + k])], "b" + k, [],  # noqa: E731
                                         [helper.make_tensor_value_info("o" + k, TensorProto.FLOAT, [1, 3])])
    nodes = [helper.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], name="if_sr", then_branch=branch("two"),
                              else_branch=branch("three"))]
    g = helper.make_graph(nodes, "vad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3]),
                                         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
                          initializer=[onnx.numpy_helper.from_array(np.array(16000, np.int64), "sr16k"),
                                       onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                                       onnx.numpy_helper.from_array(np.array(3.0, np.float32), "three")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = IR_VERSION
    with pytest.raises(onnx_lrp.UnsupportedError, match="if_sr"):
        onnx_lrp.Explainer(m.SerializeToString())


def test_float_additive_mask_input(tmp_path):
    """A float additive mask fed as an input: -1e4 and float32's min give the same attention, so the same relevance
    (attnlrp and cp-lrp), and the mask itself gets none; -inf (NaN under the rules: -inf * 0) is refused in one line
    that says what to give instead."""
    torch = pytest.importorskip("torch")

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (torch.nn.Linear(8, n) for n in (8, 8, 8, 3))

        def forward(self, x, mask):
            a = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) / 8 ** 0.5 + mask[:, None, :], -1)
            return self.o((a @ self.v(x)).mean(1))

    torch.manual_seed(0)
    path = tmp_path / "mask.onnx"
    torch.onnx.export(Attention().eval(), (torch.randn(2, 5, 8), torch.zeros(2, 5)), str(path), opset_version=17,
                      dynamo=False, input_names=["x", "mask"], output_names=["y"])
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    for composite in ("attnlrp", "cp-lrp"):
        ex = onnx_lrp.Explainer(path, composite=composite)
        rel = {}
        for value in (-1e4, np.finfo(np.float32).min):
            mask = np.zeros((2, 5), np.float32)
            mask[0, 3:] = value
            r = ex.explain({"x": x, "mask": mask}, target=0)
            assert np.all(r.relevance["mask"] == 0)
            rel[value] = r.relevance["x"]
        assert np.abs(rel[-1e4]).sum() > 0
        assert_close(rel[-1e4], rel[np.finfo(np.float32).min], rtol=1e-5, atol=1e-7)
        mask[0, 3:] = -np.inf
        with pytest.raises(onnx_lrp.InputError, match=r"input 'mask' .*-1e4"):
            ex.explain({"x": x, "mask": mask}, target=0)


def test_mask_from_a_comparison_of_the_input_carries_no_relevance(tmp_path):
    """Keras' Masking written by hand: ``m = (x != 0).any(-1)`` cast to float multiplies the hidden state. The bool
    comparison is piecewise constant, so the product is a scaling by a mask, not a product of two activations: the
    CNN composites explain it (before: refused as 'bilinear'), and LRP-0 equals gradient x input of the ReLU net
    with the mask held (zero rows, the padding, get none)."""
    torch = pytest.importorskip("torch")

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(6, 3, bias=False)

        def forward(self, x):
            m = (x != 0).any(-1, keepdim=True).float()
            return self.b(torch.relu(self.a(x)) * m).sum(1)

    torch.manual_seed(0)
    net = Masked().eval()
    x = torch.randn(2, 5, 4)
    x[0, 3:] = 0
    path = tmp_path / "masked.onnx"
    torch.onnx.export(net, (x,), str(path), opset_version=17, dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}})
    onnx_lrp.Explainer(path, composite="epsilon-plus-flat").explain(x.numpy(), target=1)  # no bilinear refusal
    r = onnx_lrp.Explainer(path, composite="epsilon", epsilon=0.0).explain(x.numpy(), target=1).relevance
    xg = x.clone().requires_grad_(True)
    net(xg)[:, 1].sum().backward()
    assert_close(r, (xg.grad * x).numpy(), rtol=1e-5, atol=1e-6)
    assert np.all(r[0, 3:] == 0) and np.abs(r).sum() > 0
