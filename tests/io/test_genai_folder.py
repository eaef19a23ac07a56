"""onnxruntime-genai folders as MODEL (onnx_lrp/io/genai.py, cli/generate.py): what genai_config.json says, and the
folders refused in one line (API: InputError; CLI: exit 2, one line, nothing written, the folder unchanged).

The folders are tests/goldens/llm's, written by onnxruntime-genai 0.18's model builder (scripts/make_llm_models.py);
the reference for what a folder holds is its genai_config.json read here with json, and for decoding
onnxruntime-genai's own greedy generation (the ids in tests/goldens/llm/<arch>.npz).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from onnx_lrp.cli.main import main
from onnx_lrp.core.errors import InputError
from onnx_lrp.io import genai
from onnx_lrp.run.generation import Decoder
from util import GOLDENS

LLM = GOLDENS / "llm"
PROMPT = "the cat sat on the mat and the dog"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default HTML page goes to the current directory


def _copy(tmp_path, name="llama_genai_fp32"):
    dest = tmp_path / name
    shutil.copytree(LLM / name, dest)
    return dest


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def _cli(*args):
    return CliRunner().invoke(main, ["explain", *map(str, args)])


@pytest.mark.parametrize("name", ["llama_genai_fp32", "llama_genai_int4", "qwen2_genai_fp32", "qwen2_genai_int4"])
def test_the_config_is_read_as_the_builder_wrote_it(name):
    folder = genai.read_folder(LLM / name)
    cfg = json.loads((LLM / name / "genai_config.json").read_text())["model"]
    assert folder.model == (LLM / name / cfg["decoder"]["filename"]).resolve()
    assert folder.tokenizer == LLM / name / "tokenizer.json"
    assert folder.eos == (cfg["eos_token_id"],) and folder.bos == cfg["bos_token_id"]
    assert folder.context_length == cfg["context_length"]
    assert (folder.kv_heads, folder.head_size, folder.layers) == (
        cfg["decoder"]["num_key_value_heads"], cfg["decoder"]["head_size"], cfg["decoder"]["num_hidden_layers"])
    assert folder.inputs["past_key_names"] == cfg["decoder"]["inputs"]["past_key_names"]
    assert genai.config_beside(folder.model) == folder and genai.is_genai_folder(LLM / name)
    assert genai.config_beside(LLM / "llama_optimum_past.onnx") is None
    assert genai.model_file(LLM / name) == folder.model and genai.model_file(LLM) is None


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_greedy_decoding_with_the_kv_cache_equals_onnxruntime_genai(arch, precision):
    """Plain onnxruntime, the KV cache fed back (GroupQueryAttention with past, MatMulNBits in int4): the same ids as
    onnxruntime-genai's own greedy generation on the folder."""
    ref = np.load(LLM / f"{arch}.npz")
    dec = Decoder(LLM / f"{arch}_genai_{precision}")
    assert dec.past and set(dec.present) == set(dec.past)
    assert dec.greedy([int(i) for i in ref["prompt_ids"]], 8) == ref[f"genai_{precision}_generated"].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_optimum_exports_decode_the_same_tokens(arch):
    """The optimum exports of the same weights: with past (KV cache, position_ids) and without (a full forward per
    step) generate onnxruntime-genai's fp32 tokens."""
    ref = np.load(LLM / f"{arch}.npz")
    ids, want = [int(i) for i in ref["prompt_ids"]], ref["genai_fp32_generated"].tolist()
    assert Decoder(LLM / f"{arch}_optimum_past.onnx").greedy(ids, 8) == want
    nopast = Decoder(LLM / f"{arch}_optimum_nopast.onnx")
    assert not nopast.past and nopast.greedy(ids, 8) == want


def test_decoding_stops_at_an_end_of_sequence_id():
    ref = np.load(LLM / "llama.npz")
    want = ref["genai_fp32_generated"].tolist()
    got = Decoder(LLM / "llama_genai_fp32").greedy([int(i) for i in ref["prompt_ids"]], 8, eos=(want[2],))
    assert got == want[:3]


def test_an_export_folders_config_gives_the_end_of_sequence(tmp_path):
    """Beside an optimum export, generation_config.json (else config.json) says eos_token_id: generation stops
    there, as transformers' generate does."""
    ref = np.load(LLM / "llama.npz")
    want = ref["genai_fp32_generated"].tolist()
    shutil.copy(LLM / "llama_optimum_past.onnx", tmp_path / "model.onnx")
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 1}))
    assert Decoder(tmp_path / "model.onnx").eos == (1,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [want[1], 1]}))
    dec = Decoder(tmp_path / "model.onnx")
    assert dec.eos == (want[1], 1) and dec.greedy([int(i) for i in ref["prompt_ids"]], 8, dec.eos) == want[:2]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(InputError, match="eos_token_id is a string"):
        Decoder(tmp_path / "model.onnx")


def _refused(tmp_path, folder, *more):
    before = _snapshot(folder)
    r = _cli(folder, "--text", PROMPT, "--generate", "2", "-o", tmp_path / "out.npz", *more)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out.npz").exists() and _snapshot(folder) == before
    return lines[0]


def test_a_folder_without_a_tokenizer_is_refused(tmp_path):
    folder = _copy(tmp_path)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(InputError, match="no tokenizer.json"):
        genai.read_folder(folder)
    assert genai.model_file(folder) == folder.resolve() / "model.onnx"  # inspect needs no tokenizer
    assert "tokenizer.json" in _refused(tmp_path, folder)


def test_a_config_naming_a_missing_file_is_refused(tmp_path):
    folder = _copy(tmp_path)
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["decoder"]["filename"] = "decoder.onnx"
    (folder / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="'decoder.onnx', which is not in"):
        genai.read_folder(folder)
    assert "decoder.onnx" in _refused(tmp_path, folder)


@pytest.mark.parametrize("bad", ["../llama_genai_int4/model.onnx", "/etc/hostname"])
def test_a_config_naming_a_file_outside_the_folder_is_refused(tmp_path, bad):
    folder = _copy(tmp_path)
    _copy(tmp_path, "llama_genai_int4")
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["decoder"]["filename"] = bad
    (folder / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="points outside"):
        genai.read_folder(folder)
    assert "points outside" in _refused(tmp_path, folder)


def test_a_config_that_is_not_json_is_refused(tmp_path):
    folder = _copy(tmp_path)
    (folder / "genai_config.json").write_text("{ not json")
    with pytest.raises(InputError, match="genai_config.json"):
        genai.read_folder(folder)
    assert "genai_config.json" in _refused(tmp_path, folder)


def test_a_folder_without_a_config_or_a_model_is_refused(tmp_path):
    """Without genai_config.json a folder is an export folder (its model.onnx); without either, refused."""
    folder = _copy(tmp_path)
    (folder / "genai_config.json").unlink()
    with pytest.raises(InputError, match="has no genai_config.json"):
        genai.read_folder(folder)
    (folder / "model.onnx").rename(folder / "decoder.onnx.bak")
    assert "genai_config.json or model.onnx" in _refused(tmp_path, folder)


def test_a_prompt_longer_than_the_context_is_refused(tmp_path):
    """context_length is 64: a prompt of 70 tokens (or one whose generation would pass it) is refused before any
    model is built, with both lengths."""
    folder = _copy(tmp_path)
    long = " ".join(["the cat"] * 40)
    before = _snapshot(folder)
    r = _cli(folder, "--text", long, "--generate", "2")
    assert r.exit_code == 2 and "context_length 64" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = _cli(folder, "--text", PROMPT, "--generate", "60")
    assert r.exit_code == 2 and "14 tokens) and 60 new" in r.output, r.output
    assert _snapshot(folder) == before and not list(tmp_path.glob("*.html"))
    with pytest.raises(InputError, match="context_length 64"):
        genai.read_folder(folder).check_length(65)
    with pytest.raises(InputError, match="the text needs 65 tokens, more than the model's context_length 64"):
        genai.check_model_length(folder / "model.onnx", 65)
    genai.check_model_length(folder / "model.onnx", 64)
    genai.check_model_length(LLM / "llama_optimum_past.onnx", 10 ** 6)  # not in a genai folder: nothing to check
