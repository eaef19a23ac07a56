"""Text in for the Hugging Face architectures users have: BERT (a sentence pair), RoBERTa, DistilBERT, DeBERTa-v2,
ModernBERT sequence classifiers, a BERT token classifier and the BERT classifier taking ``inputs_embeds``, each
exported by torch.onnx (TorchScript and dynamo) and by optimum (tests/goldens/text_hf, written by
scripts/make_text_hf_goldens.py with transformers 4.57.6, optimum-onnx 0.1.0, LXT 2.1; small random weights).

References (committed; CI needs neither torch nor transformers): the relevance per token of the arg-max class (the
token classifier: at the first non-special token) computed on the torch model in float64 by

* LXT 2.1's own AttnLRP patch of transformers' BERT (``bert*``: LXT patches no other encoder), or
* LXT 2.1's rule functions applied to the unpatched transformers code by a TorchFunctionMode (the others: uniform
  rule on every product of two input-dependent tensors, identity rule on element-wise non-linearities, LayerNorm
  with its standard deviation held constant; on BERT it equals LXT's patch exactly, exports.json).

Criterion (AttnLRP with epsilon 0 is gradient x input of a modified graph, well conditioned here): onnx-lrp's
float32 relevance within rel-L2 max(3 x the float32 torch reference's own distance from the float64 one, 2e-6) of
the float64 reference, the same explained class, and the text path's inputs equal to the tokenizer's own
(ids, attention mask, token types of a pair).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import onnx_lrp
from onnx_lrp.cli.main import main
from util import GOLDENS, assert_close

pytest.importorskip("tokenizers")

GOLD = GOLDENS / "text_hf"
TOKENIZER = {"bert": "wordpiece", "bert_tokens": "wordpiece", "bert_embeds": "wordpiece", "roberta": "bytelevel",
             "distilbert": "wordpiece", "deberta_v2": "unigram", "modernbert": "modernbert"}
EXPORTS = sorted(p.stem for p in GOLD.glob("*.onnx"))
TOLERANCE_FLOOR = 2e-6


def _case(export: str) -> str:
    return export.rsplit("_", 1)[0]


def _explain(export: str, **kw):
    case = _case(export)
    z = np.load(GOLD / f"{case}.npz")
    ex = onnx_lrp.Explainer(GOLD / f"{export}.onnx")
    extra = dict(embeddings=GOLD / "bert_embeddings.npy") if case == "bert_embeds" else {}
    res = ex.explain_text(str(z["text"]), GOLD / f"{TOKENIZER[case]}.tokenizer.json",
                          text_pair=str(z["text_pair"]) or None, **extra, **kw)
    return res, z


def test_every_architecture_and_exporter_is_here():
    status = json.loads((GOLD / "exports.json").read_text())
    cases = ("bert", "bert_tokens", "bert_embeds", "roberta", "distilbert", "deberta_v2", "modernbert")
    for case in cases:
        for exporter in ("torchscript", "dynamo", "optimum"):
            if case == "bert_embeds" and exporter == "optimum":
                continue  # optimum exports ids
            assert status[f"{case}_{exporter}"] == "ok" and f"{case}_{exporter}" in EXPORTS
    assert all(status[f"{c}_mode_vs_lxt_rel_l2"] < 1e-12 for c in ("bert", "bert_tokens", "bert_embeds"))
    assert all((GOLD / f"{e}.onnx").stat().st_size < 250_000 for e in EXPORTS)


@pytest.mark.parametrize("export", EXPORTS)
def test_relevance_per_token_matches_the_reference(export):
    if export.startswith("deberta_v2_") and not export.endswith("dynamo"):
        pytest.skip("DeBERTa-v2 through TorchScript/optimum: refused with a dynamic sequence axis "
                    "(test_deberta_v2_at_a_fixed_length)")
    res, z = _explain(export)
    ref64, ref32 = z["relevance64"], z["relevance32"]
    own = np.linalg.norm(ref32 - ref64) / np.linalg.norm(ref64)
    err = np.linalg.norm(res.relevance - ref64) / np.linalg.norm(ref64)
    assert err <= max(3 * own, TOLERANCE_FLOOR), (export, err, own)
    assert res.target == int(z["target"]) == res.predicted
    np.testing.assert_array_equal(res.input_ids, z["input_ids"][0])
    feeds = res.explanations[0]
    assert feeds.relevance is not None
    if _case(export) == "bert_tokens":
        assert res.task == "token-classification" and res.position == int(z["position"]) == 1
    else:
        assert res.task == "text-classification" and res.position is None


def test_the_text_path_feeds_what_the_tokenizer_gives():
    """The pair's token types (0 then 1) and the attention mask reach the model: the logits equal those of the
    tokenizer's own arrays fed by hand, and differ from all-zero token types."""
    res, z = _explain("bert_torchscript")
    ex = onnx_lrp.Explainer(GOLD / "bert_torchscript.onnx")
    feeds = {k: z[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    assert z["token_type_ids"].max() == 1
    by_hand = ex.explain(feeds)
    assert_close(res.explanations[0].outputs["logits"], by_hand.outputs["logits"], rtol=1e-6)
    zero = ex.explain(dict(feeds, token_type_ids=np.zeros_like(feeds["token_type_ids"])))
    assert np.abs(zero.outputs["logits"] - by_hand.outputs["logits"]).max() > 1e-3


def test_embeddings_from_the_table_or_given_equal_the_ids_model():
    table = np.load(GOLD / "bert_embeddings.npy")
    ids_res, _ = _explain("bert_torchscript")
    res, z = _explain("bert_embeds_torchscript")
    assert_close(res.relevance, ids_res.relevance, rtol=1e-4, atol=1e-7)
    ex = onnx_lrp.Explainer(GOLD / "bert_embeds_torchscript.onnx")
    given = ex.explain_text(str(z["text"]), GOLD / "wordpiece.tokenizer.json", text_pair=str(z["text_pair"]),
                            embeddings=table[z["input_ids"][0]])
    assert_close(given.relevance, res.relevance, rtol=1e-6, atol=1e-9)
    with pytest.raises(onnx_lrp.InputError, match="takes embeddings"):
        ex.explain_text("the cat", GOLD / "wordpiece.tokenizer.json")
    with pytest.raises(onnx_lrp.InputError, match="neither the embedding table"):
        ex.explain_text("the cat", GOLD / "wordpiece.tokenizer.json", embeddings=table[:7])


def test_deberta_v2_at_a_fixed_length(tmp_path):
    """DeBERTa-v2 exported by TorchScript or optimum: its relative-position buckets fold only at a known length.
    With a dynamic sequence axis it is refused in one line; at the text's length (the API's input_shapes, which the
    CLI sets by itself on that refusal) it matches the reference."""
    z = np.load(GOLD / "deberta_v2.npz")
    n = z["input_ids"].shape[1]
    for exporter in ("torchscript", "optimum"):
        with pytest.raises(onnx_lrp.UnsupportedError, match="unsupported node"):
            onnx_lrp.Explainer(GOLD / f"deberta_v2_{exporter}.onnx")
        ex = onnx_lrp.Explainer(GOLD / f"deberta_v2_{exporter}.onnx",
                                input_shapes={"input_ids": (1, n), "attention_mask": (1, n)})
        res = ex.explain_text(str(z["text"]), GOLD / "unigram.tokenizer.json")
        err = np.linalg.norm(res.relevance - z["relevance64"]) / np.linalg.norm(z["relevance64"])
        own = np.linalg.norm(z["relevance32"] - z["relevance64"]) / np.linalg.norm(z["relevance64"])
        assert err <= max(3 * own, TOLERANCE_FLOOR) and res.target == int(z["target"])
    result = CliRunner().invoke(main, ["explain", str(GOLD / "deberta_v2_optimum.onnx"), "--text", str(z["text"]),
                                       "--tokenizer", str(GOLD / "unigram.tokenizer.json"), "--json", "--html",
                                       str(tmp_path / "d.html")])
    assert result.exit_code == 0, result.output
    assert "built for this text's" in result.stderr and result.stderr.count("\n") == 1
    assert_close(json.loads(result.stdout)["relevance"], z["relevance64"], rtol=0, atol=1e-5)


def test_token_classifier_cli_labels_and_positions(tmp_path, monkeypatch):
    """--position by index or by token, --target by label name (--labels: a config.json with id2label, as
    transformers writes it), the predicted label at every token."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"id2label": {"0": "O", "1": "B-PER", "2": "I-PER", "3": "B-LOC", "4": "B-ORG"}}))
    z = np.load(GOLD / "bert_tokens.npz")
    ex = onnx_lrp.Explainer(GOLD / "bert_tokens_torchscript.onnx")
    args = ["explain", str(GOLD / "bert_tokens_torchscript.onnx"), "--text", str(z["text"]), "--tokenizer",
            str(GOLD / "wordpiece.tokenizer.json"), "--labels", str(config), "--json"]
    by_word = json.loads(CliRunner().invoke(main, args + ["--position", "london", "--target", "B-LOC"]).stdout)
    by_index = ex.explain_text(str(z["text"]), GOLD / "wordpiece.tokenizer.json", target=3, position=5)
    assert by_word["position"] == 5 and by_word["target"] == 3 and by_word["label"] == "B-LOC"
    assert_close(by_word["relevance"], by_index.relevance, rtol=1e-6, atol=1e-9)
    direct = ex.explain({k: z[k] for k in ("input_ids", "attention_mask", "token_type_ids")}, target=3, position=5)
    assert_close(by_index.relevance, direct.relevance["input_ids"][0], rtol=1e-6, atol=1e-9)
    logits = direct.outputs["logits"][0]
    names = ["O", "B-PER", "I-PER", "B-LOC", "B-ORG"]
    assert by_word["predictions"] == [names[i] for i in logits.argmax(-1)]
    assert [t["token"].strip() for t in by_word["token_relevance"]] == [t.strip() for t in by_word["tokens"]]
    bad = CliRunner().invoke(main, args + ["--target", "B-MISC"])
    assert bad.exit_code == 2 and "B-MISC" in bad.stderr and "closest: 3 'B-LOC'" in bad.stderr
