"""The Python API does what the CLI does for text: ``Explainer(folder_or_file).explain_text(text)`` finds the
tokenizer.json and the class names (config.json's id2label) beside the model, an export folder works as the model,
``target="positive"`` names a class, and the relevance file is the TextExplanation's own arrays.

Models: tests/goldens/newcomer (scripts/make_newcomer_models.py): one tiny 3-label BERT exported by torch.onnx and by
optimum, class names only in config.json. References: the torch model's float64 logits (reference.json), the
tokenizers library's own encoding, config.json read by json, and the file as np.load reads it back.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp.core.errors import InputError, ModelError
from onnx_lrp.io.model_folder import resolve_model_folder
from onnx_lrp.io.text import TextRequest
from util import GOLDENS, assert_close, f32_tol

tokenizers = pytest.importorskip("tokenizers")

NEW = GOLDENS / "newcomer"
OPTIMUM, TORCH = NEW / "bert_optimum", NEW / "torch_onnx" / "classifier.onnx"
REF = json.loads((NEW / "reference.json").read_text())
NAMES = {int(k): v for k, v in json.loads((OPTIMUM / "config.json").read_text())["id2label"].items()}


@pytest.fixture(scope="module")
def folder_ex():
    return onnx_lrp.Explainer(OPTIMUM)  # the folder optimum wrote, as the user has it


@pytest.fixture(scope="module")
def torch_ex():
    return onnx_lrp.Explainer(TORCH)


def test_an_export_folder_is_its_model_onnx_and_the_files_beside_it_are_found(folder_ex):
    assert resolve_model_folder(OPTIMUM) == (OPTIMUM / "model.onnx", OPTIMUM.absolute())
    res = folder_ex.explain_text(REF["text"])  # no tokenizer, no labels given
    enc = tokenizers.Tokenizer.from_file(str(OPTIMUM / "tokenizer.json")).encode(REF["text"])
    assert res.input_ids == enc.ids and res.relevance.shape == (len(enc.ids),)
    want = int(np.argmax(REF["logits"]))
    assert (res.target, res.label, res.predicted_label) == (want, NAMES[want], NAMES[want])
    assert_close(res.logit, REF["logits"][want], rtol=1e-5, atol=f32_tol(np.float32(REF["logits"]), 8))


def test_a_class_by_its_name_from_config_json(folder_ex, torch_ex):
    for name, index in (("positive", 2), ("Negative", 0)):
        res = folder_ex.explain_text(REF["text"], target=name)
        assert (res.target, res.label) == (index, NAMES[index])
        assert_close(res.logit, REF["logits"][index], rtol=1e-5, atol=f32_tol(np.float32(REF["logits"]), 8))
        # the torch.onnx export of the same model (another exporter's graph) explains it the same
        other = torch_ex.explain_text(REF["text"], target=name)
        assert other.label == NAMES[index]
        assert_close(other.relevance, res.relevance, rtol=1e-4, atol=f32_tol(res.relevance, 16))
    with pytest.raises(InputError, match="'postive' is not a class of this model; closest: 2 'positive'"):
        folder_ex.explain_text(REF["text"], target="postive")
    assert folder_ex.explain_text(REF["text"], target="neu").label == "neutral"  # a unique prefix, as for images


def test_the_given_tokenizer_and_labels_win(folder_ex, tmp_path):
    (tmp_path / "names.txt").write_text("bad\nmeh\ngood\n")
    tok = tokenizers.Tokenizer.from_file(str(OPTIMUM / "tokenizer.json"))
    res = folder_ex.explain_text(REF["text"], tok, target="good", labels=tmp_path / "names.txt")
    assert (res.target, res.label) == (2, "good")
    assert_close(res.relevance, folder_ex.explain_text(REF["text"], target=2).relevance, rtol=0, atol=0)


def test_without_a_tokenizer_beside_the_model_it_is_refused_in_one_line(tmp_path):
    from types import SimpleNamespace

    from onnx_lrp.io.text import tokenizer_of

    (tmp_path / "m.onnx").write_bytes(TORCH.read_bytes())
    here = SimpleNamespace(folder=resolve_model_folder(tmp_path / "m.onnx")[1])  # what Explainer(path) keeps
    assert here.folder == tmp_path.absolute()
    with pytest.raises(InputError) as info:
        tokenizer_of(here, None)
    msg = str(info.value)
    assert "\n" not in msg and f"no tokenizer.json beside the model in {tmp_path}" in msg and "tokenizer=" in msg
    with pytest.raises(InputError, match="for a model not given as a file"):
        tokenizer_of(SimpleNamespace(folder=resolve_model_folder(TORCH.read_bytes())[1]), None)
    (tmp_path / "tokenizer.json").write_bytes((OPTIMUM / "tokenizer.json").read_bytes())
    assert tokenizer_of(here, None) == tmp_path.absolute() / "tokenizer.json"


def test_a_folder_without_one_model_is_refused_naming_its_files(tmp_path):
    with pytest.raises(ModelError, match="holds no .onnx file"):
        onnx_lrp.Explainer(tmp_path)
    for name in ("encoder_model.onnx", "decoder_model.onnx"):
        (tmp_path / name).write_bytes(TORCH.read_bytes())
    with pytest.raises(ModelError) as info:
        onnx_lrp.Explainer(tmp_path)
    msg = str(info.value)
    assert "2 .onnx files (decoder_model.onnx, encoder_model.onnx)" in msg and "no model.onnx" in msg
    (tmp_path / "decoder_model.onnx").unlink()  # one .onnx file: that one
    assert resolve_model_folder(tmp_path)[0] == tmp_path / "encoder_model.onnx"


def test_the_request_is_one_frozen_object(folder_ex):
    request = TextRequest(REF["text"], target="neutral")
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.target = 0
    from onnx_lrp.io.text import explain_request

    assert explain_request(folder_ex, request).label == "neutral"


def test_the_npz_is_the_text_explanations_arrays_round_trip(folder_ex, run_cli, tmp_path):
    """The CLI writes TextExplanation.arrays() (keys as before); np.load gives back what the API returns."""
    code, out, err = run_cli("explain", OPTIMUM, "--text", REF["text"], "--target", "positive", "-o", "r.npz",
                             "--no-html", cwd=tmp_path)
    assert code == 0, err
    assert "class 2 'positive'" in out and sorted(p.name for p in tmp_path.iterdir()) == ["r.npz"]
    res = folder_ex.explain_text(REF["text"], target="positive")
    with np.load(tmp_path / "r.npz") as saved:
        got = {k: saved[k] for k in saved.files}
    want = res.arrays()
    assert sorted(got) == ["input_ids", "n_prompt", "positions", "relevance", "targets", "tokens"] == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert_close(got[k], want[k], rtol=0, atol=0) if got[k].dtype.kind != "U" else \
            np.testing.assert_array_equal(got[k], want[k])
    assert got["tokens"].tolist() == res.tokens and got["targets"].tolist() == [2]


def test_an_export_folder_as_model_on_the_command_line(run_cli, tmp_path):
    """explain and inspect take the folder (any model: the digits CNN here); other commands refuse it naming its
    model.onnx. The reference: the same command on the .onnx file itself."""
    from util import ROOT

    folder = tmp_path / "digits export"
    folder.mkdir()
    (folder / "model.onnx").write_bytes((ROOT / "models" / "digits_cnn.onnx").read_bytes())
    image = ROOT / "models" / "samples" / "png" / "digit_3.png"
    assert run_cli("explain", folder, image, "-o", "a.npy", cwd=tmp_path)[0] == 0
    assert run_cli("explain", folder / "model.onnx", image, "-o", "b.npy", cwd=tmp_path)[0] == 0
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
    code, out, err = run_cli("inspect", folder, "--json", cwd=tmp_path)
    assert code == 0 and json.loads(out)["suggested"]["command"].startswith(
        f"onnx-lrp explain '{folder / 'model.onnx'}' IMAGE.png"), err
    code, out, err = run_cli("rewrite", folder, "-o", "r.onnx", cwd=tmp_path)
    assert code == 2 and err.count("\n") == 1 and f"is a folder; give its model file: {folder / 'model.onnx'}" in err
    from onnx_lrp.core.errors import ModelError
    from onnx_lrp.load import load

    with pytest.raises(ModelError, match=f"is a directory; give the .onnx file \\({folder / 'model.onnx'}\\)"):
        load(folder)  # the API's other doors name it too


def test_a_hugging_face_folder_without_onnx_is_refused_saying_to_export_it(run_cli, tmp_path):
    weights = tmp_path / "bert_pt"
    weights.mkdir()
    (weights / "config.json").write_text(json.dumps({"id2label": {"0": "a", "1": "b"}}))
    image = GOLDENS.parent.parent / "models" / "samples" / "png" / "digit_3.png"
    for args in ((weights, image), (weights, "--text", "hi")):
        code, out, err = run_cli("explain", *args, cwd=tmp_path)
        assert code == 2 and err.count("\n") == 1 and "no .onnx file" in err and "export" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert_pt"]
