"""A newcomer's text classifiers: a 3-label BERT exported by torch.onnx (classifier.onnx with config.json and
tokenizer.json beside it) and the folder optimum wrote, copied into a folder whose name has a space, inspected and
then explained from ANOTHER working directory by the very command ``inspect`` suggests, with class names.

Models: tests/goldens/newcomer (scripts/make_newcomer_models.py). References: the torch model's float64 logits
(reference.json), the class names of config.json read by json, the suggested command split by the shell's rules.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil

import numpy as np
import pytest

from util import GOLDENS, assert_close, f32_tol

pytest.importorskip("tokenizers")

NEW = GOLDENS / "newcomer"
REF = json.loads((NEW / "reference.json").read_text())


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """The user's layout: <home>/my models/{torch_onnx, bert_optimum}; they work in <home>/work."""
    home = tmp_path_factory.mktemp("home")
    shutil.copytree(NEW, home / "my models")
    (home / "work").mkdir()
    return home


@pytest.mark.parametrize("given", ["torch_onnx/classifier.onnx", "bert_optimum"])
def test_the_suggested_command_runs_from_another_directory_with_class_names(exports, run_cli, given):
    model = os.path.relpath(exports / "my models" / given, exports / "work")  # as typed in <home>/work
    code, out, err = run_cli("inspect", model, "--json", cwd=exports / "work")
    assert code == 0, err
    tip = json.loads(out)["suggested"]
    names = json.loads((exports / "my models" / given.split("/")[0] / "config.json").read_text())["id2label"]
    assert all(name in tip["note"] for name in names.values())  # the class names are offered
    args = shlex.split(tip["command"].replace("TEXT", shlex.quote(REF["text"])))
    assert args[:2] == ["onnx-lrp", "explain"] and "TOKENIZER.json" not in args
    code, out, err = run_cli(*args[1:], "--target", "positive", "--json", cwd=exports / "work")
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["target"], summary["label"]) == (2, "positive") and summary["predicted_label"] in names.values()
    assert_close(summary["logit"], REF["logits"][2], rtol=1e-5, atol=f32_tol(np.float32(REF["logits"]), 8))
    page = exports / "work" / args[args.index("--html") + 1]
    assert page.is_file() and page.parent == exports / "work"
    assert summary["html_file"] == args[args.index("--html") + 1]
    assert summary["kept_by"][-1] == "the position and token-type embeddings"  # BERT's three lookups
    assert len(summary["tokens"]) == REF["tokens"] and summary["relevance_sum"] == pytest.approx(
        sum(summary["relevance"]), rel=1e-9)


def test_the_folder_as_model_explains_without_a_tokenizer_option(exports, run_cli):
    code, out, err = run_cli("explain", exports / "my models" / "bert_optimum", "--text", REF["text"], "--target",
                             "Negative", cwd=exports / "work")
    assert code == 0, err
    want = int(np.argmax(REF["logits"]))
    assert out.splitlines()[0].startswith("text-classification: class 0 'negative': logit ")
    assert want == 2 and out.splitlines()[0].endswith(f"the model predicts class 2 {REF['labels'][2]!r}")
    import onnx

    model = onnx.load(exports / "my models" / "bert_optimum" / "model.onnx")
    tables = {i.name for i in model.graph.initializer}
    looked_up = [n.input[0] for n in model.graph.node if n.op_type == "Gather" and n.input[0] in tables]
    assert len(looked_up) == 3 and any("position" in t for t in looked_up)  # the oracle: three embedding tables
    assert out.splitlines()[1].startswith("relevance sum ") and "the position and token-type embeddings: " in \
        out.splitlines()[1]
    assert out.splitlines()[-1].endswith("wrote bert_optimum.tokens.html")  # named after the folder, not "model"
