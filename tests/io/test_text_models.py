"""The shipped text models (models/text, built by models/build_text.py): their accuracy as the READMEs state it,
re-measured with plain onnxruntime and the tokenizers library, and README.md's text quickstart commands run as
written in a copy of the models folder.
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from onnx_lrp.cli.main import main
from util import ROOT

tokenizers = pytest.importorskip("tokenizers")

TEXT = ROOT / "models" / "text"


def _batch(tok, texts):
    enc = [tok.encode(t).ids for t in texts]
    width = max(map(len, enc))
    ids = np.zeros((len(enc), width), np.int64)
    mask = np.zeros((len(enc), width), np.int64)
    for i, e in enumerate(enc):
        ids[i, :len(e)], mask[i, :len(e)] = e, 1
    return ids, mask, [len(e) for e in enc]


def test_shipped_text_models_match_the_readmes():
    meta = json.loads((TEXT / "text.json").read_text())
    tok = tokenizers.Tokenizer.from_file(str(TEXT / "tokenizer.json"))
    sentiment = ort.InferenceSession(str(TEXT / "sentiment.onnx"), providers=["CPUExecutionProvider"])
    texts, labels = zip(*meta["heldout"])
    ids, mask, _ = _batch(tok, texts)  # padded: the attention mask keeps the padding out
    correct = int((sentiment.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0].argmax(1)
                   == np.asarray(labels)).sum())
    assert (correct, len(texts)) == (meta["sentiment_correct"], meta["sentiment_total"]) and correct / len(texts) > 0.95
    lm = ort.InferenceSession(str(TEXT / "tiny_lm.onnx"), providers=["CPUExecutionProvider"])
    prompts = [f"The capital of {c} is" for c, _ in meta["facts"]]
    ids, mask, lengths = _batch(tok, prompts)
    logits = lm.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
    nxt = [tok.decode([int(logits[i, n - 1].argmax())]) for i, n in enumerate(lengths)]
    recalled = sum(int(w == f" {k}") for w, (_, k) in zip(nxt, meta["facts"]))
    assert (recalled, len(prompts)) == (meta["lm_recalled"], meta["lm_total"]) == (len(prompts), len(prompts))
    for readme in (TEXT.parent / "README.md", ROOT / "README.md"):
        assert f"{correct}/{len(texts)}" in readme.read_text(), readme
    assert f"{recalled}/{len(prompts)}" in (TEXT.parent / "README.md").read_text()
    for name in ("sentiment.onnx", "tiny_lm.onnx"):
        model = onnx.load(TEXT / name)
        assert (TEXT / name).stat().st_size < 2_000_000 and model.opset_import[0].version == 17
        assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    labels = {p.key: p.value for p in onnx.load(TEXT / "sentiment.onnx").metadata_props}["id2label"]
    assert json.loads(labels) == {"0": "negative", "1": "positive"} and meta["labels"] == ["negative", "positive"]
    assert tok.get_vocab_size() == logits.shape[-1] == meta["vocabulary"]


def _readme_text_commands() -> list:
    """The onnx-lrp commands of README.md's quickstart that use models/text, as argument lists."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("onnx-lrp ") and "models/text/" in line:
                commands.append(shlex.split(line)[1:])
    return commands


def test_readme_text_quickstart_works_as_written(tmp_path, monkeypatch):
    """The README's text commands, run in a folder holding only models/text (as a fresh clone's): each exits 0,
    writes what it names into the current directory and nothing into models/; the sentiment example is positive
    with its three sentiment words the most relevant tokens, the LM predicts ' Paris'."""
    shutil.copytree(TEXT, tmp_path / "models" / "text", ignore=shutil.ignore_patterns("build_*"))
    monkeypatch.chdir(tmp_path)
    commands = _readme_text_commands()
    assert len(commands) == 3 and {c[1] for c in commands} == {"models/text/sentiment.onnx",
                                                                "models/text/tiny_lm.onnx"}
    for args in commands:
        result = CliRunner().invoke(main, args + ["--json"])
        assert result.exit_code == 0, (args, result.output)
        summary = json.loads(result.stdout)
        assert Path(summary["html_file"]).is_file() and Path(summary["html_file"]).parent == Path(".")
        if "sentiment.onnx" in args[1]:
            assert summary["label"] == "positive" == summary["predicted_label"]
            top = [summary["tokens"][i].strip() for i in np.argsort(summary["relevance"])[::-1][:3]]
            assert sorted(top) == ["funny", "gripping", "moving"], top
        else:
            assert summary["label"] == " Paris" and summary["explained"][-1]["predicted_label"] == " Paris"
    assert sorted(p.name for p in (tmp_path / "models" / "text").iterdir()) == sorted(
        p.name for p in TEXT.iterdir() if not p.name.startswith("build_"))
