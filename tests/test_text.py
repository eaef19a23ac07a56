"""Text in: ``onnx-lrp explain MODEL --text ... --tokenizer tokenizer.json [--continuation ...]``.

The model and tokenizer (tests/goldens/text, scripts/make_text_goldens.py) are a 2-layer GPT-2 with random weights
and a byte-level BPE trained offline on a few sentences. References: the tokenizers library's own encoding and
onnx-lrp's API run on those ids by hand (the next token at the last position; a continuation as the sum of one
explanation per continuation token at the position before it).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import onnx_lrp
from onnx_lrp.cli.main import main

tokenizers = pytest.importorskip("tokenizers")

TEXT = Path(__file__).parent / "goldens" / "text"
MODEL, TOKENIZER = TEXT / "gpt2_text.onnx", TEXT / "tokenizer.json"
PROMPT = "the cat sat on the"


def _cli(*args):
    result = CliRunner().invoke(main, ["explain", str(MODEL), "-c", "attnlrp", "--tokenizer", str(TOKENIZER),
                                       *map(str, args)])
    return result


@pytest.fixture(scope="module")
def ref():
    return onnx_lrp.Explainer(MODEL, composite="attnlrp")


def _explain(ex, ids, position, target=None):
    feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)}
    return ex.explain(feeds, target=target, position=position)


def test_next_token_equals_the_api_on_the_tokenizers_ids(ref, tmp_path):
    ids = tokenizers.Tokenizer.from_file(str(TOKENIZER)).encode(PROMPT).ids
    want = _explain(ref, ids, len(ids) - 1)
    result = _cli("--text", PROMPT, "--json", "-o", tmp_path / "r.npz", "--html", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["input_ids"] == list(ids)
    assert summary["explained"][0]["token_id"] == int(want.target[0]) == summary["explained"][0]["predicted_id"]
    np.testing.assert_allclose(summary["relevance"], want.relevance[0], rtol=1e-5, atol=1e-7)
    with np.load(tmp_path / "r.npz") as z:
        np.testing.assert_array_equal(z["input_ids"], ids)
        np.testing.assert_allclose(z["relevance"], want.relevance[0], rtol=1e-5, atol=1e-7)
    page = (tmp_path / "r.html").read_text()
    assert all(w.strip() in page for w in summary["tokens"])


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
    assert summary["input_ids"] == ids[:-1]
    assert [e["token_id"] for e in summary["explained"]] == more
    np.testing.assert_allclose(summary["relevance"], want, rtol=1e-5, atol=1e-7)


def test_terminal_shows_every_token():
    result = _cli("--text", PROMPT)
    assert result.exit_code == 0, result.output
    assert "explained token" in result.stdout and "cat[" in result.stdout


@pytest.mark.parametrize("args,message", [
    (["--text", PROMPT, "--target", "3,4"], "one token id"),
    (["--continuation", "x"], "--text and --tokenizer go together"),
    (["--text", PROMPT, "--continuation", " mat", "--target", "3"], "drop --target"),
    (["--text", PROMPT, "--heatmap", "h.png"], "cannot be combined with --text"),
    (["--text", PROMPT, "-o", "r.txt"], ".npy or .npz"),
])
def test_bad_text_options_exit_2_in_one_line(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _cli(*args)
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_models_that_take_no_ids_or_a_fixed_length_are_refused_in_one_line():
    gold = Path(__file__).parent / "goldens" / "transformers"
    for model, message in [(gold / "gpt2_embeds_torchscript.onnx", "takes token ids"),
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
    assert summary["explained"][0]["token_id"] == int(want.target[0])
    np.testing.assert_allclose(summary["relevance"], want.relevance[0], rtol=1e-5, atol=1e-7)
