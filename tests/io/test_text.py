"""Text in: ``onnx-lrp explain MODEL --text ... [--tokenizer tokenizer.json]`` and ``Explainer.explain_text``.

The language models and tokenizers (tests/goldens/text, scripts/make_text_goldens.py) are a 2-layer GPT-2 and a
1-layer LLaMA with random weights and a byte-level BPE trained offline on a few sentences; the token classifier is
tests/goldens/text_hf's BERT (tests/io/test_text_hf.py checks the classifiers against LXT). References: the
tokenizers library's own encoding and onnx-lrp's array API run on those ids by hand (the next token at the last
position; a continuation as the sum of one explanation per continuation token at the position before it).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import onnx_lrp
from onnx_lrp.cli.main import main
from util import GOLDENS, assert_close

tokenizers = pytest.importorskip("tokenizers")

TEXT = GOLDENS / "text"
HF = GOLDENS / "text_hf"
MODEL, TOKENIZER = TEXT / "gpt2_text.onnx", TEXT / "tokenizer.json"
PROMPT = "the cat sat on the"


def _cli(*args, model=MODEL, tokenizer=TOKENIZER):
    extra = ["--tokenizer", str(tokenizer)] if tokenizer is not None else []
    return CliRunner().invoke(main, ["explain", str(model), "-c", "attnlrp", *extra, *map(str, args)])


@pytest.fixture(scope="module")
def ref():
    return onnx_lrp.Explainer(MODEL, composite="attnlrp")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default token heatmap goes to the current directory


def _explain(ex, ids, position, target=None):
    feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)}
    return ex.explain(feeds, target=target, position=position)


def test_next_token_equals_the_api_on_the_tokenizers_ids(ref, tmp_path):
    ids = tokenizers.Tokenizer.from_file(str(TOKENIZER)).encode(PROMPT).ids
    want = _explain(ref, ids, len(ids) - 1)
    result = _cli("--text", PROMPT, "--json", "-o", tmp_path / "r.npz", "--html", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["task"] == "text-generation" and summary["input_ids"] == list(ids)
    assert summary["explained"][0]["target"] == int(want.target[0]) == summary["explained"][0]["predicted"]
    assert summary["explained"][0]["position"] == len(ids) - 1
    assert_close(summary["relevance"], want.relevance[0], rtol=1e-5, atol=1e-7)
    assert [t["relevance"] for t in summary["token_relevance"]] == summary["relevance"]
    with np.load(tmp_path / "r.npz") as z:
        np.testing.assert_array_equal(z["input_ids"], ids)
        assert_close(z["relevance"], want.relevance[0], rtol=1e-5, atol=1e-7)
        assert list(z["tokens"]) == summary["tokens"]
    page = (tmp_path / "r.html").read_text()
    assert all(w.strip() in page for w in summary["tokens"])
    assert summary["html_file"] == str(tmp_path / "r.html")


def test_continuation_is_the_sum_over_its_tokens(ref):
    tok = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    prompt = tok.encode(PROMPT).ids
    more = tok.encode(" mat and", add_special_tokens=False).ids
    ids = prompt + more
    want = sum(_explain(ref, ids[:-1], p - 1, target=ids[p]).relevance[0].astype(np.float64)
               for p in range(len(prompt), len(ids)))
    result = _cli("--text", PROMPT, "--continuation", " mat and", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["input_ids"] == ids  # every continuation token listed; the last one only explained
    assert [e["target"] for e in summary["explained"]] == more == summary["target"]
    assert_close(summary["relevance"], list(want) + [0.0], rtol=1e-5, atol=1e-7)


def test_per_token_output_by_default_in_the_current_directory(tmp_path):
    """No --html: the token heatmap is written to the current directory (never beside the model) and named in one
    line; the terminal view falls back to token[value] when stdout is not a terminal."""
    before = sorted(p.name for p in TEXT.iterdir())
    result = _cli("--text", PROMPT)
    assert result.exit_code == 0, result.output
    assert "text-generation: next token" in result.stdout and "cat[" in result.stdout
    assert "\x1b[" not in result.stdout
    assert result.stdout.strip().splitlines()[-1].endswith("wrote gpt2_text.tokens.html")
    assert (tmp_path / "gpt2_text.tokens.html").is_file() and sorted(p.name for p in TEXT.iterdir()) == before


def test_terminal_colour_follows_the_terminal_and_no_color(ref, monkeypatch):
    res = ref.explain_text(PROMPT, TOKENIZER)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    monkeypatch.delenv("NO_COLOR", raising=False)
    coloured = res.terminal()
    assert coloured.count("\x1b[48;2;") == len(res.tokens)
    monkeypatch.setenv("NO_COLOR", "1")
    assert res.terminal() == res.terminal(color=False) and "\x1b" not in res.terminal()
    assert res.terminal(color=False).split() == [f"{t.strip()}[{v:+.3g}]" for t, v in zip(res.tokens, res.relevance)]


def test_api_result_for_notebooks_and_json(ref, tmp_path):
    res = ref.explain_text(PROMPT, TOKENIZER)
    ids = tokenizers.Tokenizer.from_file(str(TOKENIZER)).encode(PROMPT).ids
    want = _explain(ref, ids, len(ids) - 1)
    assert_close(res.relevance, want.relevance[0], rtol=1e-5, atol=1e-7)
    assert res.target == res.predicted == int(want.target[0]) and res.position == len(ids) - 1
    assert "".join(res.tokens) == PROMPT and res.label == res.predicted_label
    assert res.logit == pytest.approx(float(want.explained_value[0]), rel=1e-6)
    text = repr(res)
    assert text.startswith("TextExplanation(text-generation: next token") and len(text) < 300 and "\n" not in text
    fragment = res._repr_html_()
    assert "<html" not in fragment and fragment.count('class="t"') == len(res.tokens)
    assert res.html(tmp_path / "p.html") == tmp_path / "p.html" and (tmp_path / "p.html").read_text() == res.html()
    json.dumps(res.to_dict())


@pytest.mark.parametrize("args,message", [
    (["--text", PROMPT, "--target", "3,4"], "one value"),
    (["--continuation", "x"], "--tokenizer and --continuation go with --text"),
    (["--text-pair", "x", "--tokenizer", str(TOKENIZER)], "--text-pair and --tokenizer go with --text"),
    (["--text", PROMPT, "--continuation", " mat", "--target", "3"], "drop --target"),
    (["--text", PROMPT, "--heatmap", "h.png"], "cannot be combined with --text"),
    (["--text", PROMPT, "--mean", "0.5"], "--mean cannot be combined with --text"),
    (["--text", PROMPT, "-o", "r.txt"], ".npy or .npz"),
    (["--text", PROMPT, "--html", "r.txt"], ".html file name"),
    (["--text", PROMPT, "--target", " mat and"], "is 5 tokens under this tokenizer; give one token"),
    (["--text", PROMPT, "--target", "999"], "not a token id"),
    (["--text", PROMPT, "--position", "dog"], "not a token of the text"),
    (["--text", PROMPT, "--text-pair", "x"], "a sentence pair is for classifiers"),
    (["--text", PROMPT, "--task", "text-classification"], "has a sequence axis"),
])
def test_bad_text_options_exit_2_in_one_line(args, message, tmp_path):
    result = _cli(*args)
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_tokenizer_beside_the_model_and_its_labels(tmp_path):
    """Without --tokenizer the tokenizer.json beside MODEL is used, class names come from the config.json beside it
    (as optimum writes them); without either the refusal names the option."""
    folder = tmp_path / "export"
    folder.mkdir()
    shutil.copy(HF / "bert_tokens_optimum.onnx", folder / "model.onnx")
    result = _cli("--text", "john smith works in london", "--json", "-o", "r.npz", model=folder / "model.onnx",
                  tokenizer=None)
    assert result.exit_code == 2 and "give --tokenizer tokenizer.json" in result.stderr
    shutil.copy(HF / "wordpiece.tokenizer.json", folder / "tokenizer.json")
    (folder / "config.json").write_text(json.dumps({"id2label": {"0": "O", "1": "B-PER", "2": "I-PER",
                                                                 "3": "B-LOC", "4": "B-ORG"}}))
    result = _cli("--text", "john smith works in london", "--json", model=folder / "model.onnx", tokenizer=None)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["tokenizer"] == str(folder / "tokenizer.json") and summary["task"] == "token-classification"
    assert summary["position"] == 1 and summary["label"] == "B-PER" and summary["predictions"][1] == "B-PER"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.onnx", "tokenizer.json"]


def test_language_model_or_token_classifier_by_the_vocabulary(ref, tmp_path):
    """N x T x C logits: a language model when C covers the tokenizer's vocabulary (GPT-2 here: 300 = 300), a token
    classifier when C is smaller (the same tokenizer with 40 added tokens); task= overrides the rule."""
    lm = ref.explain_text(PROMPT, TOKENIZER)
    assert lm.task == "text-generation" and lm.position == len(lm.tokens) - 1
    tok = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    tok.add_tokens([f"<extra_{i}>" for i in range(40)])
    tok.save(str(tmp_path / "bigger.json"))
    tagged = ref.explain_text(PROMPT, tmp_path / "bigger.json")
    assert tagged.task == "token-classification" and tagged.position == 0  # no special tokens: the first
    forced = ref.explain_text(PROMPT, tok, task="text-generation")
    np.testing.assert_array_equal(forced.relevance, lm.relevance)
    tagging = ref.explain_text(PROMPT, TOKENIZER, task="token-classification", position=2)
    ids = tokenizers.Tokenizer.from_file(str(TOKENIZER)).encode(PROMPT).ids
    assert_close(tagging.relevance, _explain(ref, ids, 2).relevance[0], rtol=1e-5, atol=1e-7)
    assert tagging.predictions == [str(i) for i in _explain(ref, ids, 2).outputs["logits"][0].argmax(-1)]


def test_models_that_take_embeddings_or_a_fixed_length_are_refused_in_one_line():
    gold = GOLDENS / "transformers"
    for model, message in [(gold / "gpt2_embeds_torchscript.onnx", "takes embeddings"),
                           (gold / "gpt2_ids_torchscript.onnx", "exactly 8 tokens")]:
        result = CliRunner().invoke(main, ["explain", str(model), "-c", "attnlrp", "--text", "the cat",
                                           "--tokenizer", str(TOKENIZER)])
        assert result.exit_code == 2 and result.stderr.count("\n") == 1 and message in result.stderr, \
            result.stderr


def test_llama_style_bos_and_position_ids(tmp_path):
    """A tokenizer that adds BOS (as LLaMA's) and a model that takes position_ids: the BOS is the first token, the
    positions are 0..T-1, and the relevance equals the API's on those inputs."""
    tok = tokenizers.Tokenizer.from_file(str(TEXT / "tokenizer_bos.json"))
    ids = tok.encode(PROMPT).ids
    assert ids[0] == tok.token_to_id("<s>")
    ex = onnx_lrp.Explainer(TEXT / "llama_text.onnx", composite="attnlrp")
    feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64),
             "position_ids": np.arange(len(ids), dtype=np.int64)[None]}
    want = ex.explain(feeds)
    result = CliRunner().invoke(main, ["explain", str(TEXT / "llama_text.onnx"), "-c", "attnlrp", "--text", PROMPT,
                                       "--tokenizer", str(TEXT / "tokenizer_bos.json"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["input_ids"] == list(ids) and summary["tokens"][0] == "<s>"
    assert summary["explained"][0]["target"] == int(want.target[0])
    assert_close(summary["relevance"], want.relevance[0], rtol=1e-5, atol=1e-7)
