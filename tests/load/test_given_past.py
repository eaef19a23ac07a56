"""A decoder's past key/value state given with the inputs: GroupQueryAttention after a past against onnxruntime's
kernel (op level), and the committed tiny LLaMA (onnxruntime-genai fp32 folder, optimum export with past) explained
with a past made by onnxruntime itself from the first tokens of a prompt: the explained forward is onnxruntime's run
of the file, the last token's logits are those of the whole prompt, the new tokens' relevance plus the past's part
is the explained logit (cp-lrp conserves), and a partial past or inconsistent lengths are refused in one line (API,
and the command line with exit 2)."""
from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper
from util import GOLDENS, assert_cli_refuses, assert_close, cli, ort_session

import onnx_lrp
from onnx_lrp import load as loader
from onnx_lrp.load.passes.past_state import PAST

LLM = GOLDENS / "llm"
MODELS = {"genai": LLM / "llama_genai_fp32" / "model.onnx", "optimum": LLM / "llama_optimum_past.onnx"}
K = 5  # prompt tokens given as the past


# ------------------------------------------------------------------------------------------------ the op itself
def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _gqa_model(case: str, b: int, s: int, p: int, n=4, nkv=2, h=8):
    """One GroupQueryAttention with past inputs (named pk / pv: the loader leaves them inputs) and its feeds."""
    rng = np.random.default_rng(34)
    feeds = {"q": 2 * rng.standard_normal((b, s, n * h)), "k": 2 * rng.standard_normal((b, s, nkv * h)),
             "v": rng.standard_normal((b, s, nkv * h)), "pk": 2 * rng.standard_normal((b, nkv, p, h)),
             "pv": rng.standard_normal((b, nkv, p, h))}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    past = np.array([p - 3, p - 2] if case == "buffer" else [p] * b)  # positions of the past read per item
    feeds["sl"] = (past + s - 1).astype(np.int32)
    feeds["tot"] = np.array(past.max() + s, np.int32)
    attrs = dict(num_heads=n, kv_num_heads=nkv, local_window_size=3 if case == "window" else -1)
    inits, extra = [], ["", ""]
    if case == "rotary":
        angles = np.outer(np.arange(32), 1.0 / 10000 ** (np.arange(0, h, 2) / h))
        inits = [helper.make_tensor(c, TensorProto.FLOAT, angles.shape, f(angles).astype(np.float32).ravel())
                 for c, f in (("cos", np.cos), ("sin", np.sin))]
        extra = ["cos", "sin"]
        attrs["do_rotary"] = 1
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "sl", "tot", *extra], ["y", "ok", "ov"],
                            domain="com.microsoft", name="gqa_past", **attrs)
    ins = [_vi(x, TensorProto.FLOAT, feeds[x].shape) for x in ("q", "k", "v")]
    ins += [_vi(x, TensorProto.FLOAT, ["batch", nkv, "past", h]) for x in ("pk", "pv")]
    ins += [_vi("sl", TensorProto.INT32, [b]), _vi("tot", TensorProto.INT32, [])]
    outs = [_vi("y", TensorProto.FLOAT, [b, s, n * h])]
    if case != "buffer":  # onnxruntime's present of a buffer read in part is the buffer's length, not P + S
        outs += [_vi(x, TensorProto.FLOAT, ["batch", nkv, "total", h]) for x in ("ok", "ov")]
    g = helper.make_graph([node], "gqa_past", ins, outs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m, feeds


@pytest.mark.parametrize("case,b,s,p", [("prompt", 1, 3, 4), ("token", 2, 1, 5), ("window", 1, 4, 5),
                                         ("rotary", 1, 3, 4), ("buffer", 2, 1, 6)])
def test_group_query_attention_after_a_past_is_the_kernels(case, b, s, p):
    """Past and new K/V concatenated (BNSH, K/V heads grouped), causal from the past's end, local window, rotary at
    past..past+S-1, and a max-length buffer (onnxruntime's static cache) of which each item reads its
    seqlens_k + 1 - S first positions. (onnxruntime takes several new tokens after a past for batch 1 only.)"""
    m, feeds = _gqa_model(case, b, s, p, h=16 if case == "rotary" else 8)
    ref = ort_session(m.SerializeToString()).run(None, feeds)
    split = loader.load(m.SerializeToString())
    assert not [nd for nd in split.graph if nd.domain == "com.microsoft"]
    got = ort_session(ir.serde.serialize_model(split).SerializeToString(), optimise=False).run(None, feeds)
    for r, g in zip(ref, got):
        assert r.shape == g.shape
        assert_close(g, r, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------- the tiny LLaMA
@pytest.fixture(scope="module")
def runs():
    """Per model: the ids of a prompt, onnxruntime's past of its first K tokens, its logits of the rest after that
    past, and its logits of the whole prompt."""
    ids = np.random.default_rng(0).integers(3, 300, size=(1, 9)).astype(np.int64)
    out = {}
    for kind, path in MODELS.items():
        sess = ort_session(path.read_bytes() if kind == "optimum" else str(path))
        names = [i.name for i in sess.get_inputs()]
        empty = {n: np.zeros((1, 2, 0, 16), np.float32) for n in names if PAST.match(n)}

        def feeds(new, past, p, names=names):
            f = {"input_ids": new, "attention_mask": np.ones((1, p + new.shape[1]), np.int64), **past}
            if "position_ids" in names:
                f["position_ids"] = np.arange(p, p + new.shape[1])[None]
            return f
        outs = [o.name for o in sess.get_outputs()]
        first = dict(zip(outs, sess.run(None, feeds(ids[:, :K], empty, 0))))
        past = {n: first[n.replace("past_key_values", "present")] for n in empty}
        rest = sess.run(["logits"], feeds(ids[:, K:], past, K))[0]
        whole = sess.run(["logits"], feeds(ids, empty, 0))[0]
        out[kind] = dict(ids=ids, past=past, rest=rest, whole=whole)
    return out


@pytest.fixture(scope="module")
def explainers():
    return {kind: onnx_lrp.Explainer(path, composite="cp-lrp", past_inputs=True) for kind, path in MODELS.items()}


@pytest.fixture(scope="module")
def explained(runs, explainers):
    return {kind: explainers[kind].explain(dict(input_ids=r["ids"][:, K:], **r["past"])) for kind, r in runs.items()}


@pytest.mark.parametrize("kind", list(MODELS))
def test_a_given_past_is_onnxruntimes_forward(kind, runs, explained):
    """The explained forward with the past (mask and positions filled) is onnxruntime's run of the file; its last
    token's logits are those of the whole prompt."""
    r, res = runs[kind], explained[kind]
    assert_close(res.outputs["logits"], r["rest"], rtol=1e-5, atol=1e-5)
    assert np.abs(res.outputs["logits"][0, -1] - r["whole"][0, -1]).max() <= 1e-5


@pytest.mark.parametrize("kind", list(MODELS))
def test_new_tokens_and_the_past_part_sum_to_the_logit(kind, explained):
    """cp-lrp conserves: the new tokens' relevance + the relevance reaching the past = the explained logit, and the
    note says the past's part."""
    res = explained[kind]
    past = sum(float(np.sum(v)) for n, v in res.relevance.items() if PAST.match(n))
    tokens = float(np.sum(res.relevance["input_ids"]))
    assert res.relevance["input_ids"].shape == (1, 9 - K)
    assert_close(tokens + past, float(res.explained_value[0]), rtol=1e-5)
    assert abs(past) > 0.1 * abs(tokens)  # the past holds a real part (else the test would not tell)
    assert res.notes == [f"the past ({K} positions) holds {past:.6g} of the relevance (the new tokens' relevance + "
                         "the past's part = the explained value)"]


def test_the_genai_folder_and_the_optimum_export_agree_with_a_past(explained):
    """The same weights in the two deployed forms: the same new tokens' relevance."""
    a, b = (explained[k].relevance["input_ids"] for k in MODELS)
    assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_an_explainer_uses_a_past_given_without_being_told(runs, explained):
    """Explainer(model) (past fed empty) given a past in the dict: explained by the model that keeps it."""
    r = runs["genai"]
    res = onnx_lrp.Explainer(MODELS["genai"], composite="cp-lrp").explain(dict(input_ids=r["ids"][:, K:],
                                                                               **r["past"]))
    assert_close(res.relevance["input_ids"], explained["genai"].relevance["input_ids"], rtol=1e-6)


def test_a_max_length_past_buffer_is_read_as_far_as_the_mask_says(runs, explainers, explained):
    """onnxruntime-genai's shared buffer: pasts of 12 positions of which the mask (9 = 5 past + 4 new) says the first
    5 hold the past (the rest garbage): onnxruntime's run of the folder's file, and the relevance of the 5-position
    past."""
    r = runs["genai"]
    buffers = {n: np.concatenate([v, np.full((1, 2, 12 - K, 16), 7, np.float32)], 2) for n, v in r["past"].items()}
    feeds = dict(input_ids=r["ids"][:, K:], attention_mask=np.ones((1, 9), np.int64), **buffers)
    ref = ort_session(str(MODELS["genai"])).run(["logits"], feeds)[0]
    res = explainers["genai"].explain(feeds)
    assert_close(res.outputs["logits"], ref, rtol=1e-5, atol=1e-5)
    assert_close(res.relevance["input_ids"], explained["genai"].relevance["input_ids"], rtol=1e-6)
    assert res.notes == explained["genai"].notes


def test_a_partial_past_or_inconsistent_lengths_are_refused_in_one_line(runs, explainers):
    r, ex = runs["optimum"], explainers["optimum"]
    new = r["ids"][:, K:]
    some = {n: v for n, v in r["past"].items() if ".0." in n}
    cases = [(dict(input_ids=new, **some), r"past is given for past_key_values.0.key, past_key_values.0.value but "
                                           r"not for past_key_values.1.key, past_key_values.1.value"),
             (dict(input_ids=new, attention_mask=np.ones((1, 7), np.int64), **r["past"]),
              r"'attention_mask' has shape \[1, 7\]; with a past of 5 positions and 4 new tokens in 'input_ids' it "
              r"is \(1, 9\)"),
             (dict(input_ids=new, position_ids=np.arange(5, 8)[None], **r["past"]), r"'position_ids' has shape"),
             (dict(input_ids=new, **dict(r["past"], **{"past_key_values.1.value": r["past"]["past_key_values.1.value"]
                                                       [:, :, :3]})),
              r"past 'past_key_values.1.value' has 3 positions and 'past_key_values.0.key' 5")]
    for feeds, words in cases:
        with pytest.raises(onnx_lrp.InputError, match=words) as info:
            ex.explain(feeds)
        assert "\n" not in str(info.value)


def test_the_command_line_explains_an_npz_with_a_past(runs, tmp_path):
    """``explain FOLDER x.npz``: the past used (the relevance sum is the logit, the note says the past's part);
    a past for one layer of two: exit 2, one line, nothing written."""
    r = runs["genai"]
    np.savez(tmp_path / "x.npz", input_ids=r["ids"][:, K:], **r["past"])
    res = cli("explain", LLM / "llama_genai_fp32", tmp_path / "x.npz", "--composite", "cp-lrp", "--json",
              "-o", tmp_path / "rel.npz")
    assert res.exit_code == 0, res.output
    item = json.loads(res.stdout)["items"][0]
    assert_close(item["relevance_sum"], item["output"], rtol=1e-5)
    assert "the past (5 positions) holds" in json.loads(res.stdout)["notes"][0]
    saved = np.load(tmp_path / "rel.npz")
    assert saved["relevance/input_ids"].shape == (1, 9 - K)
    part = tmp_path / "part"
    part.mkdir()
    np.savez(part / "x.npz", input_ids=r["ids"][:, K:], **{n: v for n, v in r["past"].items() if ".1." in n})
    assert_cli_refuses(["explain", LLM / "llama_genai_fp32", part / "x.npz", "-o", part / "rel.npz"], part,
                       "past_key_values.1.key", "not for past_key_values.0.key", "every layer")
