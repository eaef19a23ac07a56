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


@pytest.mark.parametrize("option", [["--squash"], ["--labels", "names.txt"]])
def test_dataset_mode_refuses_what_it_does_not_take(files, tmp_path, option):
    args = [files / a if a.endswith(".txt") else a for a in option]
    r = cli("explain", files / "rgb.onnx", files / "wide.png", "--out-dir", tmp_path / "out", *args)
    assert r.exit_code == 2 and f"{option[0]} is not taken with --out-dir" in r.output
    assert not (tmp_path / "out").exists()
