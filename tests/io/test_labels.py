"""Class names (onnx_lrp.io.labels): every file form gives the same list, found beside a model and in its metadata,
and targets by name resolve to the index a hand-written lookup gives; misses and ambiguities are refused in one line
naming the closest classes."""
from __future__ import annotations

import json

import pytest

from onnx_lrp.core.errors import InputError
from onnx_lrp.io.labels import (as_labels, label_of, labels_beside, metadata_labels, read_labels, resolve_target,
                                resolve_targets)

NAMES = ["tench, Tinca tinca", "goldfish", "tabby, tabby cat", "tiger cat", "Persian cat", "crane", "crane"]


@pytest.mark.parametrize("form", ["json_list", "txt", "config", "json_dict"])
def test_every_file_form_reads_the_same_names(tmp_path, form):
    if form == "json_list":
        p = tmp_path / "labels.json"
        p.write_text(json.dumps(NAMES))
    elif form == "txt":
        p = tmp_path / "labels.txt"
        p.write_text("\n".join(NAMES) + "\n\n")  # blank lines at the end are not classes
    elif form == "config":
        p = tmp_path / "config.json"
        p.write_text(json.dumps({"architectures": ["X"], "id2label": {str(i): n for i, n in enumerate(NAMES)}}))
    else:
        p = tmp_path / "names.json"
        p.write_text(json.dumps({str(i): n for i, n in reversed(list(enumerate(NAMES)))}))
    assert read_labels(p) == NAMES
    assert as_labels(str(p)) == NAMES


def test_sparse_dict_names_missing_classes_by_number():
    assert as_labels({0: "neg", 2: "pos"}) == ["neg", "1", "pos"]


@pytest.mark.parametrize("bad, words", [
    ({"a": "x"}, "dict of class index"), ({-1: "x"}, "class index (0, 1"), (["a", ""], "class 1 has an empty name"),
    ([1, 2], "a JSON list"), (3, "a JSON list")])
def test_bad_values_refused_in_one_line(bad, words):
    with pytest.raises(InputError) as e:
        as_labels(bad)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_bad_files_refused(tmp_path):
    p = tmp_path / "l.json"
    p.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        read_labels(p)
    p.write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(InputError, match="labels file"):
        read_labels(p)
    with pytest.raises(InputError, match="not found"):
        read_labels(tmp_path / "missing.txt")


def test_labels_beside_the_model(tmp_path):
    model = tmp_path / "model.onnx"
    assert labels_beside(model) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert labels_beside(model) is None  # no id2label: ignored
    (tmp_path / "config.json").write_text(json.dumps({"id2label": {"0": "NEGATIVE", "1": "POSITIVE"}}))
    assert labels_beside(model) == ["NEGATIVE", "POSITIVE"]
    (tmp_path / "config.json").write_bytes(b"\xff\xfe")
    with pytest.raises(InputError, match="beside the model"):
        labels_beside(model)


def test_metadata_labels():
    assert metadata_labels({"id2label": json.dumps({"0": "a", "1": "b"})}) == ["a", "b"]
    assert metadata_labels({"id2label": json.dumps(["a", "b"])}) == ["a", "b"]
    assert metadata_labels({"id2label": "{broken"}) is None
    assert metadata_labels({}) is None and metadata_labels(None) is None


def _oracle(name: str) -> list[int]:
    """By hand: exact names, then aliases, then prefixes (case-insensitive)."""
    n = name.lower().strip()
    for pred in (lambda s: s.lower() == n, lambda s: n in [a.strip().lower() for a in s.split(",")],
                 lambda s: s.lower().startswith(n) or any(a.strip().lower().startswith(n) for a in s.split(","))):
        hits = [i for i, s in enumerate(NAMES) if pred(s)]
        if hits:
            return hits
    return []


@pytest.mark.parametrize("name", ["goldfish", "GOLDFISH", " tabby cat ", "tabby", "tabb", "tiger", "persian",
                                  "Tinca tinca", "tench, tinca tinca"])
def test_target_by_name_matches_a_hand_lookup(name):
    hits = _oracle(name)
    assert len(hits) == 1
    assert resolve_target(name, NAMES, len(NAMES)) == hits[0]


def test_target_by_index_and_default():
    assert resolve_target(None, NAMES) is None and resolve_target("argmax", NAMES) is None
    assert resolve_target(3, NAMES, 7) == 3 and resolve_target("4", None, 7) == 4
    with pytest.raises(InputError, match="out of range"):
        resolve_target(7, NAMES, 7)
    with pytest.raises(InputError, match="class index or name"):
        resolve_target(True, NAMES)
    assert resolve_targets(["tabby", 1], NAMES, 7) == [2, 1]


def test_misses_and_ambiguities_refused_naming_classes():
    with pytest.raises(InputError) as e:
        resolve_target("tabbby cat", NAMES)
    assert "closest" in str(e.value) and "2 'tabby, tabby cat'" in str(e.value)
    with pytest.raises(InputError) as e:
        resolve_target("crane", NAMES)  # two classes with one name (as ImageNet's 134 and 517)
    assert "names 2 classes" in str(e.value) and "5 'crane'" in str(e.value) and "6 'crane'" in str(e.value)
    with pytest.raises(InputError) as e:
        resolve_target("t", NAMES)
    assert "names 3 classes" in str(e.value)
    with pytest.raises(InputError, match="names no classes"):
        resolve_target("cat", None)


def test_label_of():
    assert label_of(2, NAMES) == "tabby, tabby cat" and label_of(9, NAMES) is None and label_of(1, None) is None
