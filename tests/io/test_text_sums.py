"""Honest sums for text: the per-token summary says the tokens' relevance sum beside the explained logit (and where
the rest stays); relevance far from the logit is warned about as for images (the same thresholds,
onnx_lrp.run.conservation), and ``--strict`` / ``strict=True`` refuse it for text as for any input.

References: onnxruntime's own run of the shipped sentiment model (the logit), numpy sums of the relevance, and a
hand-built classifier whose bias of 100 takes almost all of the logit (numpy: the tokens' share is below 1 %).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp.core.errors import LrpWarning, NumericError
from onnx_lrp.run import conservation
from util import GOLDENS, ROOT, assert_close, f32_tol, make_model, node, to_bytes

tokenizers = pytest.importorskip("tokenizers")
ort = pytest.importorskip("onnxruntime")

SENTIMENT, SENT_TOK = ROOT / "models" / "text" / "sentiment.onnx", ROOT / "models" / "text" / "tokenizer.json"
WORDPIECE = GOLDENS / "text_hf" / "wordpiece.tokenizer.json"
REVIEW = "a gripping, funny and moving film"


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    """ids -> embeddings -> mean -> Gemm with a bias of 100: under LRP-0 (attnlrp's linear rule) the bias keeps
    ~all of the logit, the tokens get ~0.01 %."""
    vocab = tokenizers.Tokenizer.from_file(str(WORDPIECE)).get_vocab_size()
    rng = np.random.default_rng(0)
    model = make_model([node("Gather", ["emb", "input_ids"], "e"),
                        node("ReduceMean", ["e"], "pooled", axes=[1], keepdims=0),
                        node("Gemm", ["pooled", "w", "b"], "logits")],
                       {"input_ids": (["batch", "sequence"], np.int64)}, ["logits"],
                       {"emb": rng.normal(size=(vocab, 4)).astype(np.float32),
                        "w": (0.1 * rng.normal(size=(4, 2))).astype(np.float32),
                        "b": np.array([100.0, 100.0], np.float32)})
    folder = tmp_path_factory.mktemp("biased")
    (folder / "biased.onnx").write_bytes(to_bytes(model))
    (folder / "tokenizer.json").write_bytes(WORDPIECE.read_bytes())
    return folder / "biased.onnx"


def test_the_summary_says_the_sum_and_the_logit_of_the_shipped_sentiment_model():
    res = onnx_lrp.Explainer(SENTIMENT).explain_text(REVIEW, SENT_TOK)
    enc = tokenizers.Tokenizer.from_file(str(SENT_TOK)).encode(REVIEW)
    session = ort.InferenceSession(str(SENTIMENT), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {"input_ids": np.asarray([enc.ids], np.int64),
                                      "attention_mask": np.asarray([enc.attention_mask], np.int64)})[0][0]
    assert_close(res.logit, logits[res.target], rtol=1e-5, atol=f32_tol(logits, 8))
    total = float(np.sum(res.relevance))
    line = res.sums()
    assert line.startswith(f"relevance sum {total:.4g} of the logit {res.logit:.4g} ({100 * total / res.logit:.3g} %)")
    # the numbers: about half of the logit reaches the tokens; the line says where the rest stays
    import onnx

    ops = {n.op_type for n in onnx.load(SENTIMENT).graph.node}  # the oracle: what the file holds
    assert {"Gemm", "LayerNormalization", "Softmax"} <= ops and "Gather" in ops
    assert 0.2 < total / res.logit < 0.8 and f"the rest ({res.logit - total:+.4g}) is kept from the tokens by the " \
        "model's biases, normalisations and the attention softmax: " in line
    assert "`onnx-lrp trace MODEL --text TEXT`" in line and "\n" not in line
    assert res.to_dict()["relevance_sum"] == total and res.to_dict()["start_relevance"] == res.logit


def test_relevance_far_from_the_logit_is_warned_and_strict_refuses_it(biased, run_cli, tmp_path):
    ex = onnx_lrp.Explainer(biased, composite="attnlrp")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = ex.explain_text("the film")
    share = float(np.sum(res.relevance)) / res.logit
    assert abs(share) < conservation.FLOOR  # the oracle: the image path's threshold is crossed
    said = [str(w.message) for w in seen if issubclass(w.category, LrpWarning)]
    assert len(said) == 1 and "relevance not conserved" in said[0] and "Gemm_logits" in said[0]
    with pytest.raises(NumericError, match="nothing was returned"):
        onnx_lrp.Explainer(biased, composite="attnlrp", strict=True).explain_text("the film")
    code, out, err = run_cli("explain", biased, "--text", "the film", "-c", "attnlrp", "--no-html", cwd=tmp_path)
    assert code == 0 and err.count("\n") == 1 and err.startswith("onnx-lrp: warning: relevance not conserved"), err
    assert out.splitlines()[1] == res.sums()  # the CLI's second line: the sums
    assert "kept from the tokens by the model's biases: " in res.sums()  # a Gemm: no norms, softmax, other tables
    code, out, err = run_cli("explain", biased, "--text", "the film", "-c", "attnlrp", "--no-html", "--strict",
                             cwd=tmp_path)
    assert code == 1 and out == "" and err.count("\n") == 1 and "nothing was returned (strict)" in err, (out, err)
    assert list(tmp_path.iterdir()) == []


def test_a_conserving_explanation_says_no_rest(biased, run_cli, tmp_path):
    """epsilon-plus-flat: the flat rule at the first layer passes all of the logit on (numpy: the sum is the logit)."""
    res = onnx_lrp.Explainer(biased, composite="epsilon-plus-flat").explain_text("the film")
    assert_close(np.sum(res.relevance), res.logit, rtol=1e-3, atol=f32_tol(res.logit, 8))
    assert "rest" not in res.sums() and res.sums().endswith("(100 %)")


def test_trace_takes_the_text_and_its_ledger_adds_up_to_the_logit(biased, run_cli, tmp_path):
    """`onnx-lrp trace MODEL --text TEXT` (what the sums line points to): the text's inputs as explain fills them;
    the ledger's input relevance is explain_text's sum, and the bias node holds the rest."""
    import json

    with pytest.warns(LrpWarning, match="relevance not conserved"):
        res = onnx_lrp.Explainer(biased, composite="attnlrp").explain_text("the film")
    code, out, err = run_cli("trace", biased, "--text", "the film", "-c", "attnlrp", "--json", cwd=tmp_path)
    assert code == 0, err
    ledger = json.loads(out)
    assert_close(ledger["start_relevance"], res.logit, rtol=1e-6, atol=f32_tol(res.logit, 4))
    assert_close(ledger["input_relevance"], np.sum(res.relevance), rtol=1e-4, atol=f32_tol(res.logit, 16))
    gemm = next(r for r in ledger["nodes"] if r["node"] == "Gemm_logits")
    assert_close(gemm["absorbed"], res.logit - np.sum(res.relevance), rtol=1e-4, atol=f32_tol(res.logit, 16))
    code, _, err = run_cli("trace", biased, "the.npy", "--text", "the film", cwd=tmp_path)
    assert code == 2 and "give INPUT (an image, .npy/.npz array) or --text TEXT: one of them" in err
