"""Every example of the README and the docs pages that runs a model of models/ gives the same arrays in both forms
(issue 35, "one behaviour for the CLI and the API"): each `onnx-lrp ...` command of their code blocks is run as
written (from another working directory, the models/ paths made absolute, plus `-o` / `--json` to read what it
computed) and compared with the same request made through the Python API (`Explainer`, `explain_text`,
`onnx_lrp.evaluate`, `explain_concepts`, `onnx_lrp.preprocess.load_image`); a command the docs add without a case
here fails `test_every_docs_command_has_a_case`.
"""
from __future__ import annotations

import json
import os
import re
import shlex

import numpy as np
import pytest
from click.testing import CliRunner
from util import ROOT, assert_close

import onnx_lrp
from onnx_lrp.cli.main import main

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SENT, LM, TOK = "models/text/sentiment.onnx", "models/text/tiny_lm.onnx", "models/text/tokenizer.json"
DIGITS, BATCH = "models/digits_cnn.onnx", "models/samples/batch.npy"
LAYER = "/features/features.6/Conv_output_0"


def docs_commands() -> set[str]:
    """The `onnx-lrp` commands of the pages' shell blocks that name a file of models/ (continuations joined,
    comments and repeated spaces dropped)."""
    found = set()
    for page in PAGES:
        for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = re.sub(r"\s+#.*$", "", line.strip())
                if line.startswith("onnx-lrp ") and "models/" in line:
                    found.add(norm(line))
    return found


def norm(command: str) -> str:
    return shlex.join(shlex.split(command))


def cli(command: str, cwd, *extra):
    """The command as the docs write it, in-process from ``cwd``, with the models/ paths made absolute."""
    args = [str(ROOT / a) if a.startswith("models/") else a for a in shlex.split(command)[1:]]
    old = os.getcwd()
    try:
        os.chdir(cwd)
        r = CliRunner().invoke(main, [*args, *extra])
    finally:
        os.chdir(old)
    assert r.exit_code == 0, (command, r.exit_code, r.output, r.stderr)
    return r


@pytest.fixture(scope="module")
def api():
    """One Explainer per model, as the docs' Python blocks make them."""
    made = {}

    def get(model: str):
        if model not in made:
            made[model] = onnx_lrp.Explainer(str(ROOT / model))
        return made[model]
    return get


# ------------------------------------------------------------------------------------------------ image models
def image_case(command, python):
    def check(tmp_path, api):
        cli(command, tmp_path)
        out = re.search(r"-o (\S+)", command).group(1)
        with np.load(tmp_path / out, allow_pickle=False) as z:
            got = {k: z[k] for k in ("relevance", "targets", "outputs")}
        res = python(api)
        assert_close(got["relevance"], res.relevance, rtol=1e-5, atol=1e-6)
        assert got["targets"].tolist() == np.asarray(res.target).tolist()
        assert_close(got["outputs"], res.outputs[res.explained_output], rtol=1e-6)
    return check


def pngs(api):
    from onnx_lrp.preprocess import load_image

    files = sorted((ROOT / "models/samples/png").glob("*.png"))
    return api(DIGITS).explain(np.concatenate([load_image(f, model=api(DIGITS)) for f in files]))


# ------------------------------------------------------------------------------------------------- text models
def text_case(command, model, text, **keywords):
    def check(tmp_path, api):
        pytest.importorskip("tokenizers")
        got = json.loads(cli(command, tmp_path, "--json").stdout)
        res = api(model).explain_text(text, str(ROOT / TOK), **keywords)
        assert got["tokens"] == list(res.tokens)
        assert_close(np.array(got["relevance"]), res.relevance, rtol=1e-5, atol=1e-6)
        assert (got["target"], got["label"], got["logit"]) == (res.target, res.label, pytest.approx(res.logit))
        beside = api(model).explain_text(text, **keywords)  # the tokenizer.json beside the model, as the CLI finds
        assert_close(beside.relevance, res.relevance)
    return check


def evaluate_case(command):
    def check(tmp_path, api):
        got = json.loads(cli(command, tmp_path, "--json").stdout)["summary"]
        ev = onnx_lrp.evaluate(str(ROOT / DIGITS), np.load(ROOT / BATCH), metric="region-perturbation", patch=2,
                               steps=40, composite="epsilon-plus-flat")
        want = ev.summary()
        for key in ("aopc/morf", "aopc/lerf", "aopc/random", "abpc"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    return check


def concepts_case(command):
    def check(tmp_path, api):
        cli(command, tmp_path, "-o", "concepts.npz")
        x = np.load(ROOT / "models/samples/npy/digit_3.npy")
        x = x if x.ndim == 4 else x[None]
        res = api(DIGITS).explain_concepts(x[:1], None, LAYER, concepts="top:6")
        with np.load(tmp_path / "concepts.npz", allow_pickle=False) as z:
            assert_close(z["heatmaps"], np.asarray(res.heatmaps).reshape(z["heatmaps"].shape), rtol=1e-5, atol=1e-6)
            assert_close(z["shares"], np.asarray(res.shares), rtol=1e-5, atol=1e-7)
    return check


FRANCE, FILM = "The capital of France is", "a gripping, funny and moving film"
CASES = {
    f"onnx-lrp explain {DIGITS} models/samples/png --heatmap digits.png -o digits.npz": image_case(
        f"onnx-lrp explain {DIGITS} models/samples/png --heatmap digits.png -o digits.npz", pngs),
    f"onnx-lrp explain {DIGITS} {BATCH} --target 3 -o batch3.npz": image_case(
        f"onnx-lrp explain {DIGITS} {BATCH} --target 3 -o batch3.npz",
        lambda api: api(DIGITS).explain(np.load(ROOT / BATCH), target=3)),
    f"onnx-lrp explain {SENT} --text '{FILM}' --tokenizer {TOK} --html sentiment.html": text_case(
        f"onnx-lrp explain {SENT} --text '{FILM}' --tokenizer {TOK} --html sentiment.html", SENT, FILM),
    f"onnx-lrp explain {SENT} --text '{FILM}' --tokenizer {TOK} --target negative": text_case(
        f"onnx-lrp explain {SENT} --text '{FILM}' --tokenizer {TOK} --target negative", SENT, FILM,
        target="negative"),
    f"onnx-lrp explain {LM} --text '{FRANCE}' --tokenizer {TOK} --html next-token.html": text_case(
        f"onnx-lrp explain {LM} --text '{FRANCE}' --tokenizer {TOK} --html next-token.html", LM, FRANCE),
    f"onnx-lrp explain {LM} --text '{FRANCE}' --continuation ' Paris' --tokenizer {TOK}": text_case(
        f"onnx-lrp explain {LM} --text '{FRANCE}' --continuation ' Paris' --tokenizer {TOK}", LM, FRANCE,
        continuation=" Paris"),
    f"onnx-lrp explain {LM} --text 'The capital of Japan is' --target ' Paris' --tokenizer {TOK}": text_case(
        f"onnx-lrp explain {LM} --text 'The capital of Japan is' --target ' Paris' --tokenizer {TOK}", LM,
        "The capital of Japan is", target=" Paris"),
    f"onnx-lrp evaluate {DIGITS} {BATCH} --patch 2 --steps 40 --plot curves.png": evaluate_case(
        f"onnx-lrp evaluate {DIGITS} {BATCH} --patch 2 --steps 40 --plot curves.png"),
    f"onnx-lrp concepts {DIGITS} models/samples/npy/digit_3.npy --layer {LAYER} --top 6 --heatmap concepts.png":
        concepts_case(f"onnx-lrp concepts {DIGITS} models/samples/npy/digit_3.npy --layer {LAYER} --top 6 "
                      "--heatmap concepts.png"),
}
CASES = {norm(k): v for k, v in CASES.items()}


def test_every_docs_command_has_a_case():
    found = docs_commands()
    assert found, "no onnx-lrp command naming models/ found in the README and docs"
    missing = sorted(found - set(CASES))
    assert not missing, f"docs commands without a both-forms case here: {missing}"
    assert not set(CASES) - found, f"cases for commands the docs no longer show: {sorted(set(CASES) - found)}"


@pytest.mark.parametrize("command", sorted(CASES), ids=[f"{c.split()[1]}-{c.split()[2].split('/')[-1]}-{i}"
                                                        for i, c in enumerate(sorted(CASES))])
def test_cli_and_python_give_the_same_arrays(command, tmp_path, api):
    CASES[command](tmp_path, api)
