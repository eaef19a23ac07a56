"""Class names for image classifiers on the command line (issue 35 items 3 and 4): ``--labels`` (a JSON list, one
name per line, a config.json) or a config.json beside the model name the classes in the table, the JSON summary and
the heatmap's captions, and ``--target NAME`` picks the class a hand lookup gives; ``--labels`` on an image is not
taken for text; ``--size`` keeps the aspect ratio and says so (``--squash`` squashes)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from PIL import Image
from util import make_model, node

from onnx_lrp.cli.main import main

NAMES = ["tench", "goldfish", "tabby, tabby cat", "tiger cat", "Persian cat"]


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("labels")
    rng = np.random.default_rng(0)
    inits = {"W": rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "B": rng.normal(size=4).astype(np.float32),
             "G": rng.normal(size=(5, 4)).astype(np.float32)}
    m = make_model([node("Conv", ["x", "W", "B"], "c", pads=[1, 1, 1, 1]), node("Relu", ["c"], "r"),
                    node("GlobalAveragePool", ["r"], "p"), node("Flatten", ["p"], "f"),
                    node("Gemm", ["f", "G"], "y", transB=1)], {"x": (["N", 3, 8, 8], np.float32)}, ["y"], inits)
    onnx.save(m, d / "rgb.onnx")
    Image.fromarray(rng.integers(0, 256, (8, 12, 3), dtype=np.uint8)).save(d / "wide.png")
    (d / "names.txt").write_text("\n".join(NAMES) + "\n")
    (d / "names.json").write_text(json.dumps(NAMES))
    (d / "cfg").mkdir()  # not beside the model: the runs without --labels have no names
    (d / "cfg" / "config.json").write_text(json.dumps({"id2label": {str(i): n for i, n in enumerate(NAMES)}}))
    return d


def _summary(r) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(r.output[r.output.index("{"):])


@pytest.mark.parametrize("labels", ["names.txt", "names.json", "cfg/config.json"])
def test_target_by_name_and_names_in_the_summary(files, tmp_path, labels):
    r = cli("explain", files / "rgb.onnx", files / "wide.png", "--labels", files / labels, "--target", "tabby cat",
            "--json", "-o", tmp_path / "r.npy")
    item = _summary(r)["items"][0]
    assert item["target"] == NAMES.index("tabby, tabby cat") and item["target_label"] == "tabby, tabby cat"
    assert item["predicted_label"] == NAMES[item["predicted"]]
    assert "--text" not in r.output


def test_table_and_captions_name_the_classes(files, tmp_path):
    r = cli("explain", files / "rgb.onnx", files / "wide.png", "--labels", files / "names.txt", "-t", "persian",
            "--heatmap", tmp_path / "h.png", "-o", tmp_path / "r.npy")
    assert r.exit_code == 0, r.output
    head, row = r.output.splitlines()[:2]
    assert head.endswith("class (target)") and row.endswith("Persian cat") and row.split()[2] == "4"
    with_names = np.asarray(Image.open(tmp_path / "h.png"))
    r = cli("explain", files / "rgb.onnx", files / "wide.png", "-t", "4", "--heatmap", tmp_path / "h2.png", "-o",
            tmp_path / "r2.npy")
    assert r.exit_code == 0, r.output
    without = np.asarray(Image.open(tmp_path / "h2.png"))
    assert not np.array_equal(with_names, without)  # the same relevance; the captions differ (the class line)
    np.testing.assert_array_equal(np.load(tmp_path / "r.npy"), np.load(tmp_path / "r2.npy"))


def test_config_json_beside_the_model_is_found(files, tmp_path):
    shutil.copy(files / "rgb.onnx", tmp_path / "model.onnx")
    shutil.copy(files / "cfg" / "config.json", tmp_path / "config.json")
    r = cli("explain", tmp_path / "model.onnx", files / "wide.png", "-t", "goldfish", "--json", "-o",
            tmp_path / "r.npy")
    assert _summary(r)["items"][0]["target"] == 1


@pytest.mark.parametrize("names, warned", [(NAMES[:4], True), (["LABEL_0", "LABEL_1"], False)])
def test_config_json_that_miscounts_is_not_used(files, tmp_path, names, warned):
    """A config.json beside the model naming another number of classes than the model has is not used, and said
    in one line; transformers' default LABEL_i names (a language model's config) are left without a word."""
    shutil.copy(files / "rgb.onnx", tmp_path / "model.onnx")
    (tmp_path / "config.json").write_text(json.dumps({"id2label": {str(i): n for i, n in enumerate(names)}}))
    r = CliRunner().invoke(main, ["explain", str(tmp_path / "model.onnx"), str(files / "wide.png"),
                                                  "--json", "-o", str(tmp_path / "r.npy")])
    assert r.exit_code == 0, r.output
    assert not any(n in r.stdout for n in names)  # no class named
    said = [ln for ln in r.stderr.splitlines() if "config.json names" in ln]
    assert len(said) == (1 if warned else 0), r.stderr
    if warned:
        assert f"names {len(names)} classes but 'y' has 5" in said[0] and "--labels" in said[0]


@pytest.mark.parametrize("target, words", [("tabby kat", "closest: 2 'tabby, tabby cat'"),
                                           ("t", "names 3 classes"), ("zebra", "give a class index 0..4")])
def test_a_miss_is_refused_in_one_line(files, tmp_path, target, words):
    r = cli("explain", files / "rgb.onnx", files / "wide.png", "--labels", files / "names.txt", "-t", target,
            "-o", tmp_path / "r.npy")
    assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "r.npy").exists()


def test_a_name_without_names_is_refused(files, tmp_path):
    r = cli("explain", files / "rgb.onnx", files / "wide.png", "-t", "tabby", "-o", tmp_path / "r.npy")
    assert r.exit_code == 2 and "names no classes" in r.output and "--labels" in r.output


def test_size_keeps_the_aspect_and_says_so(files, tmp_path):
    r = cli("explain", files / "rgb.onnx", files / "wide.png", "-o", tmp_path / "r.npy")
    assert r.exit_code == 0 and "image the centre 8x8 cut" in r.output  # 12x8 to 8x8: no resize, the centre
    r = cli("explain", files / "rgb.onnx", files / "wide.png", "--squash", "-o", tmp_path / "r.npy")
    assert r.exit_code == 0 and "image resized to 8x8 (squashed: --squash)" in r.output
    r = cli("explain", files / "rgb.onnx", files / "wide.png", "--squash", "--crop", "-o", tmp_path / "r.npy")
    assert r.exit_code == 2 and "give one of them" in r.output
    r = cli("inspect", files / "rgb.onnx")
    assert r.exit_code == 0 and "keeping the aspect" in r.output


def test_dataset_mode_refuses_what_it_does_not_take(files, tmp_path):
    r = cli("explain", files / "rgb.onnx", files / "wide.png", "--out-dir", tmp_path / "out", "--labels",
            files / "names.txt")
    assert r.exit_code == 2 and "--labels is not taken with --out-dir" in r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--squash", None])
def test_dataset_mode_resizes_as_a_single_run(files, tmp_path, flag):
    """--out-dir (and explain_dataset's squash=) resize as the single run does: squashed with --squash, else the
    centre cut; the two differ on a 12x8 image."""
    import onnx_lrp
    from onnx_lrp.dataset import read_shards

    (tmp_path / "src").mkdir()
    shutil.copy(files / "wide.png", tmp_path / "src" / "wide.png")
    flags = [flag] if flag else []
    r = cli("explain", files / "rgb.onnx", files / "wide.png", *flags, "-o", tmp_path / "r.npy")
    assert r.exit_code == 0, r.output
    single = np.load(tmp_path / "r.npy")
    r = cli("explain", files / "rgb.onnx", tmp_path / "src", *flags, "--out-dir", tmp_path / "out")
    assert r.exit_code == 0, r.output
    np.testing.assert_allclose(read_shards(tmp_path / "out")["relevance"], single, rtol=1e-6, atol=1e-7)
    onnx_lrp.explain_dataset(files / "rgb.onnx", tmp_path / "src", tmp_path / "api", squash=bool(flag))
    np.testing.assert_allclose(read_shards(tmp_path / "api")["relevance"], single, rtol=1e-6, atol=1e-7)
    other = onnx_lrp.explain_dataset(files / "rgb.onnx", tmp_path / "src", tmp_path / "other", squash=not flag)
    assert other["explained"] == 1
    assert not np.allclose(read_shards(tmp_path / "other")["relevance"], single, atol=1e-3)
