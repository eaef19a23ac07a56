"""A generation explained (onnx_lrp/run/generation.py, Explainer.explain_generation, explain --generate): greedy
decoding through the deployed folder, then every generated token explained over everything before it in one batch.

References: onnxruntime-genai's own greedy ids for the folder and LXT 2.1's AttnLRP relevance on the Hugging Face
model the folder was built from (tests/goldens/llm/llama.npz, scripts/make_llm_models.py), the Hugging Face model's
logits, and onnx-lrp's array API explaining each step alone on its own tokens.
The relevance model is built from the optimum export of the same weights without a KV cache (the genai folder's
GroupQueryAttention with past is the loader's; tests/load covers it); the folder generates.
"""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import onnx_lrp
from onnx_lrp.cli.main import main
from onnx_lrp.core.errors import InputError
from onnx_lrp.io import tokens as tk
from onnx_lrp.run.generation import sequence_feeds
from util import GOLDENS, assert_close

pytest.importorskip("tokenizers")

LLM = GOLDENS / "llm"
FOLDER, MODEL = LLM / "llama_genai_fp32", LLM / "llama_optimum_nopast.onnx"
PROMPT = "the cat sat on the mat and the dog"
N = 6
FOIL = 5


@pytest.fixture(scope="module")
def ref():
    return np.load(LLM / "llama.npz")


@pytest.fixture(scope="module")
def ex():
    return onnx_lrp.Explainer(MODEL, composite="attnlrp")


@pytest.fixture(scope="module")
def gen(ex):
    return ex.explain_generation(PROMPT, N, FOLDER / "tokenizer.json", decoder=FOLDER)


def _alone(ex, ids, target):
    """Step explained alone: its own tokens, the last position, one run."""
    feeds, name = sequence_feeds(ex, ids, 1)
    res = ex.explain(feeds, target=target, position=len(ids) - 1)
    rel = res.relevance[name] if isinstance(res.relevance, dict) else res.relevance
    return tk.per_token(np.asarray(rel)[0], len(ids))


def test_the_generated_tokens_are_onnxruntime_genais(gen, ref):
    assert gen.prompt_ids == ref["prompt_ids"].tolist()
    assert gen.generated == ref["genai_fp32_generated"].tolist()[:N]
    assert gen.predicted == gen.generated  # the explained forward (no-past export) predicts the same tokens
    p = len(gen.prompt_ids)
    assert gen.relevance.shape == (N, p + N - 1) and len(gen.tokens) == p + N


def test_every_row_equals_that_step_explained_alone(ex, gen):
    p = len(gen.prompt_ids)
    for k in range(N):
        ids = gen.prompt_ids + gen.generated[:k]
        assert_close(gen.relevance[k, :p + k], _alone(ex, ids, gen.generated[k]), rtol=1e-5, atol=1e-5)
        assert not gen.relevance[k, p + k:].any()  # zeros after the row's position


def test_the_first_step_matches_lxt_and_the_hf_logits(gen, ref):
    """Step 1 is the next token after the prompt: LXT's AttnLRP relevance for it on the Hugging Face model, within
    3x LXT's own float32 distance to its float64 (or 1e-5); the explained logit is the Hugging Face model's."""
    assert gen.generated[0] == int(ref["lxt_target"])
    p = len(gen.prompt_ids)
    bound = max(3 * np.abs(ref["lxt_relevance32"] - ref["lxt_relevance64"]).max(), 1e-5)
    assert np.abs(gen.relevance[0, :p] - ref["lxt_relevance64"]).max() <= bound
    assert_close(gen.logits[0], ref["hf_logits"][0, -1, gen.generated[0]], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def con(ex):
    return ex.explain_generation(PROMPT, 3, FOLDER / "tokenizer.json", decoder=FOLDER, contrast=FOIL)


def test_contrast_is_the_target_minus_the_foil(ex, gen, con, ref):
    assert con.generated == gen.generated[:3] and con.contrast == FOIL
    p = len(con.prompt_ids)
    for k in range(3):
        ids = con.prompt_ids + con.generated[:k]
        want = _alone(ex, ids, con.generated[k]) - _alone(ex, ids, FOIL)
        assert_close(con.relevance[k, :p + k], want, rtol=1e-5, atol=1e-5)
    hf = ref["hf_logits"][0, -1]
    assert_close(con.logits[0], hf[con.generated[0]] - hf[FOIL], rtol=1e-5, atol=1e-5)


def test_bad_requests_are_refused_in_one_line(ex):
    for n in (0, -1, 1.5, True):
        with pytest.raises(InputError, match="integer >= 1"):
            ex.explain_generation(PROMPT, n, FOLDER / "tokenizer.json", decoder=FOLDER)
    with pytest.raises(InputError, match="context_length 64"):
        ex.explain_generation(PROMPT, 60, FOLDER / "tokenizer.json", decoder=FOLDER)
    with pytest.raises(InputError, match="not a token id"):
        ex.explain_generation(PROMPT, 1, FOLDER / "tokenizer.json", decoder=FOLDER, contrast=10 ** 6)


def test_cli_writes_the_rows_the_api_computes(con, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["explain", str(MODEL), "-c", "attnlrp", "--tokenizer", str(FOLDER / "tokenizer.json"),
                                  "--text", PROMPT, "--generate", "3", "--contrast", str(FOIL), "-o", "g.npz",
                                  "--html", "g.html"])
    assert r.exit_code == 0, r.output
    out = np.load(tmp_path / "g.npz")
    assert out["generated"].tolist() == con.generated and out["prompt_ids"].tolist() == con.prompt_ids
    assert out["tokens"].tolist() == con.tokens and int(out["contrast"]) == FOIL
    assert_close(out["relevance"], con.relevance, rtol=1e-5, atol=1e-6)
    page = (tmp_path / "g.html").read_text()
    assert page.count("<hr>") == 2 and "step 1:" in page and page.count("outline:2px") == 3
    assert r.output.count("  step ") == 3 and "logit diff" in r.output and "top:" in r.output
    for args, said in ((["--text", PROMPT, "--generate", "2", "--target", "3"], "--target cannot be combined"),
                       (["--generate", "2"], "go with --text"),
                       (["--text", PROMPT, "--generate", "2", "-o", "g.npy"], ".npz")):
        r = CliRunner().invoke(main, ["explain", str(MODEL), "--tokenizer", str(FOLDER / "tokenizer.json"), *args])
        assert r.exit_code == 2 and said in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "g.npy").exists()


def test_the_genai_folder_as_model_generates_and_explains_itself(gen, tmp_path, monkeypatch):
    """The folder as MODEL: its model file (GroupQueryAttention with past and rotary caches, the past fed empty by
    the loader) explained over its own generation: the rows of the export without past of the same weights."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["explain", str(FOLDER), "-c", "attnlrp", "--text", PROMPT, "--generate", str(N),
                                  "-o", "g.npz"])
    if r.exit_code == 2 and "GroupQueryAttention with past" in r.output:
        pytest.skip("this tree's loader refuses GroupQueryAttention with past state")
    assert r.exit_code == 0, r.output
    out = np.load(tmp_path / "g.npz")
    assert out["generated"].tolist() == gen.generated and out["predicted"].tolist() == gen.generated
    assert_close(out["relevance"], gen.relevance, rtol=1e-5, atol=1e-5)
    assert (tmp_path / "llama_genai_fp32.generation.html").is_file()
