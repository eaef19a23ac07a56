"""The token page of a continuation: every continuation token drawn, outlined and listed in the npz; text readable on
every cell (WCAG AA: contrast >= 4.5:1, computed here from the page's own colours); ``--no-html``; the default page
never overwrites the page of another model.

References: the tokenizers library's encoding of prompt + continuation, WCAG 2's contrast formula written here, the
files on disk (digests before / after).
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from util import GOLDENS, ROOT

tokenizers = pytest.importorskip("tokenizers")

LM, LM_TOK = ROOT / "models" / "text" / "tiny_lm.onnx", ROOT / "models" / "text" / "tokenizer.json"
PROMPT, MORE = "The capital of France is", " Paris is big"


def _luminance(rgb):  # WCAG 2.x relative luminance
    c = np.asarray(rgb, np.float64) / 255
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return float(lin @ [0.2126, 0.7152, 0.0722])


def _contrast(a, b):
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _cells(page: str):
    """(text, background, foreground, outlined) of every token cell of the page."""
    cell = r'<span class="t" style="color:rgb\(([^)]*)\);background:rgb\(([^)]*)\)([^"]*)"[^>]*>(.*?)</span>'
    found = re.findall(cell, page)
    return [(text, tuple(map(int, bg.split(","))), tuple(map(int, fg.split(","))), "outline" in rest)
            for fg, bg, rest, text in found]


@pytest.fixture(scope="module")
def continued(tmp_path_factory):
    """One run: --continuation with 5 tokens, the page and the npz written."""
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main

    out = tmp_path_factory.mktemp("continued")
    result = CliRunner().invoke(main, ["explain", str(LM), "--text", PROMPT, "--continuation", MORE, "--tokenizer",
                                       str(LM_TOK), "--html", str(out / "c.html"), "-o", str(out / "c.npz")])
    assert result.exit_code == 0, result.output
    return out


def test_every_continuation_token_is_drawn_outlined_and_in_the_npz(continued):
    tok = tokenizers.Tokenizer.from_file(str(LM_TOK))
    prompt, more = tok.encode(PROMPT), tok.encode(MORE, add_special_tokens=False)
    assert len(more.ids) >= 4  # the case: with 4 continuation tokens the last one went missing
    cells = _cells((continued / "c.html").read_text())
    assert len(cells) == len(prompt.ids) + len(more.ids)
    outlined = [text.replace("&nbsp;", " ") for text, _, _, mark in cells if mark]
    assert "".join(outlined) == MORE  # every continuation token, outlined, reads as the continuation
    assert not any(mark for *_, mark in cells[:len(prompt.ids)])
    with np.load(continued / "c.npz") as saved:
        assert saved["input_ids"].tolist() == prompt.ids + more.ids
        assert "".join(saved["tokens"][int(saved["n_prompt"]):]) == MORE
        assert saved["targets"].tolist() == more.ids and saved["relevance"].shape == (len(prompt.ids) + len(more.ids),)
        assert saved["relevance"][-1] == 0  # the last token is only explained, never fed
        assert saved["positions"].tolist() == list(range(len(prompt.ids) - 1, len(prompt.ids) + len(more.ids) - 1))


def test_every_cell_reads_at_wcag_aa(continued):
    cells = _cells((continued / "c.html").read_text())
    ratios = [_contrast(bg, fg) for _, bg, fg, _ in cells]
    assert min(ratios) >= 4.5, sorted(zip(ratios, cells))[:3]
    # the strongest colours are there (full red / full blue), and they need different text colours
    from onnx_lrp.io.tokens import text_colour

    assert text_colour((0, 0, 255)) == (255, 255, 255) and text_colour((255, 0, 0)) == (0, 0, 0)
    for value in np.linspace(-1, 1, 41):  # the whole scale, not only this page's values
        from onnx_lrp.io.tokens import _rgb

        assert _contrast(_rgb(value), text_colour(_rgb(value))) >= 4.5


def _digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_no_html_and_the_default_page_never_overwrites_another_models(run_cli, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    from util import make_model, node, to_bytes

    tok = GOLDENS / "text" / "tokenizer.json"
    vocab = tokenizers.Tokenizer.from_file(str(tok)).get_vocab_size()
    rng = np.random.default_rng(0)
    lm = make_model([node("Gather", ["emb", "input_ids"], "e"), node("MatMul", ["e", "w"], "logits")],
                    {"input_ids": (["batch", "sequence"], np.int64)}, ["logits"],
                    {"emb": rng.normal(size=(vocab, 4)).astype(np.float32),
                     "w": rng.normal(size=(4, vocab)).astype(np.float32)})
    (other / "tiny_lm.onnx").write_bytes(to_bytes(lm))  # another model of the same file name (a tiny LM: fast)
    (other / "tokenizer.json").write_bytes(tok.read_bytes())
    code, out, err = run_cli("explain", other / "tiny_lm.onnx", "--text", "the cat", "--no-html", cwd=tmp_path)
    assert code == 0 and out.splitlines()[-1].endswith("wrote nothing (--no-html)"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere"]
    code, out, err = run_cli("explain", other / "tiny_lm.onnx", "--text", "the cat", cwd=tmp_path)
    assert code == 0 and (tmp_path / "tiny_lm.tokens.html").is_file(), err
    from onnx_lrp.cli.text import _html_file

    again = tmp_path / "elsewhere" / ".." / "elsewhere" / "tiny_lm.onnx"  # the same model, spelled otherwise
    assert _html_file(again, again.parent, None, None) == Path("tiny_lm.tokens.html")  # its own page: rewritten
    before = _digests(tmp_path)
    # the shipped tiny_lm.onnx has the same file name: its default page would overwrite the other's
    code, out, err = run_cli("explain", LM, "--text", "the cat", "--tokenizer", LM_TOK, cwd=tmp_path)
    assert code == 2 and out == "" and err.count("\n") == 1 and "tiny_lm.tokens.html here is the token page of " \
        f"model {other / 'tiny_lm.onnx'}" in err and "--html FILE" in err, err
    assert _digests(tmp_path) == before
    (tmp_path / "tiny_lm.tokens.html").write_text("<p>my notes</p>")  # not a page of onnx-lrp: refused too
    code, _, err = run_cli("explain", LM, "--text", "the cat", "--tokenizer", LM_TOK, cwd=tmp_path)
    assert code == 2 and "something other than an onnx-lrp token page" in err
    code, _, err = run_cli("explain", LM, "--text", "the cat", "--tokenizer", LM_TOK, "--no-html", "--html", "x.html",
                           cwd=tmp_path)
    assert code == 2 and "--html and --no-html: give one" in err
