"""Class names for any classifier: read them (a JSON list, a JSON dict of index -> name, a config.json with
``id2label``, or a text file with one name per line), find them beside a model (its ``config.json``) or in its ONNX
metadata (``id2label``), and turn a target given by name into its class index.

Names are a plain ``list[str]`` indexed by class. A name matches a target when equal to it ignoring case and
surrounding spaces, or when it is one of the name's comma-separated aliases (ImageNet's ``"tabby, tabby cat"``
answers to ``tabby cat``), or, failing both, when exactly one class starts with it; a miss names the closest.
"""
from __future__ import annotations

import difflib
import json
import re
import warnings
from pathlib import Path

import numpy as np

from ..core.errors import InputError, LrpWarning

_DEFAULT = re.compile(r"LABEL_\d+")  # the id2label transformers writes when a config names no classes
HINT = "a JSON list of class names, a config.json with id2label, or a text file with one class name per line"


def read_labels(path) -> list[str]:
    """The class names in the file ``path`` (see the module); a file that holds none: one-line InputError."""
    from .tokens import read_list_file

    data = read_list_file(path, "labels file", HINT)
    if isinstance(data, dict) and "id2label" in data:
        data = data["id2label"]
    if isinstance(data, list) and Path(path).suffix.lower() != ".json":
        while data and not data[-1].strip():
            data = data[:-1]  # blank lines at the end are not classes
    return as_labels(data, f"labels file {path}")


def as_labels(value, where: str = "labels") -> list[str] | None:
    """Class names from what a caller gives: None, a file path, a list / tuple of names, or a dict of class index ->
    name (missing indices are named by their number). Anything else: one-line InputError naming ``where``."""
    if value is None:
        return None
    if isinstance(value, (str, Path)):
        return read_labels(value)
    if isinstance(value, dict):
        return _from_dict(value, where)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        names = [" ".join(v.split()) for v in value]
        empty = [i for i, v in enumerate(names) if not v]
        if empty:
            raise InputError(f"{where}: class {empty[0]} has an empty name; give {HINT}")
        return names
    raise InputError(f"{where}: give {HINT} (or, in Python, a list of names or a dict of class index -> name)")


def _from_dict(value: dict, where: str) -> list[str]:
    try:
        pairs = {int(k): v for k, v in value.items()}
    except (TypeError, ValueError):
        raise InputError(f"{where}: give a dict of class index -> name, e.g. {{0: 'negative', 1: 'positive'}}"
                         ) from None
    if not pairs or min(pairs) < 0 or max(pairs) >= 1_000_000 or not all(isinstance(v, str) for v in pairs.values()):
        raise InputError(f"{where}: give a dict of class index (0, 1, ...) -> name, e.g. {{0: 'negative', "
                         "1: 'positive'}")
    names = [str(i) for i in range(max(pairs) + 1)]
    for i, v in pairs.items():
        names[i] = " ".join(v.split()) or str(i)
    return names


def labels_beside(model_path) -> list[str] | None:
    """The ``id2label`` of the ``config.json`` beside ``model_path`` (what transformers and optimum save), if any.
    A config.json that is not UTF-8 JSON is refused in one line; one without a usable ``id2label`` is ignored."""
    from ..core.validate import read_json

    if model_path is None:
        return None
    p = Path(str(model_path)).parent / "config.json"
    if not p.is_file():
        return None
    config = read_json(p, f"{p} (beside the model)", "fix it or move it away")
    if not isinstance(config, dict) or not isinstance(config.get("id2label"), dict):
        return None
    try:
        return _from_dict(config["id2label"], str(p))
    except InputError:
        return None


def metadata_labels(metadata: dict | None) -> list[str] | None:
    """The ``id2label`` entry of a model's ONNX metadata (a JSON list or dict), if any and readable."""
    raw = (metadata or {}).get("id2label")
    if not raw:
        return None
    try:
        return as_labels(json.loads(raw), "the model's id2label metadata")
    except (ValueError, InputError, RecursionError):
        return None


def find_labels(given, runner, model=None) -> list[str] | None:
    """The class names of a model: ``given`` (:func:`as_labels`), else the ``id2label`` of its ONNX metadata (read
    from ``runner``'s session), else the config.json beside ``model`` (a path; :func:`labels_beside`). Names that
    do not count the model's classes (:func:`class_count`) are refused when given, and not used when found, with
    an LrpWarning unless they are transformers' defaults (``LABEL_0``, ``LABEL_1``: a language model's config.json
    names 2, not its vocabulary): one name too many or too few would name every class by its neighbour's name."""
    width = class_count(runner)
    if given is not None:
        names = as_labels(given)
        if width is not None and len(names) != width:
            raise InputError(f"labels: {len(names)} names for the {width} classes of {runner.explained_output!r}; "
                             "give one name per class, in class order")
        return names
    try:
        meta = runner.session.session.get_modelmeta().custom_metadata_map
    except AttributeError:
        meta = None
    found, where = metadata_labels(meta), "the model's metadata"
    if found is None and isinstance(model, (str, Path)):
        found, where = labels_beside(model), str(Path(str(model)).parent / "config.json")
    if found is not None and width is not None and len(found) != width:
        if not all(_DEFAULT.fullmatch(n) for n in found):  # transformers' LABEL_0, LABEL_1: no names at all
            warnings.warn(f"{where} names {len(found)} classes but {runner.explained_output!r} has {width}: its "
                          "names are not used (give labels=, --labels, with one name per class)", LrpWarning,
                          stacklevel=3)
        return None
    return found


def class_count(runner) -> int | None:
    """The number of classes the explained output has per item (per position for sequence outputs), when known."""
    try:
        rows = runner.relevance_model.sequence_rows
        return rows[1] if rows is not None else runner.output_width()
    except AttributeError:
        return None


def by_name(target) -> bool:
    """Whether a target names a class (a string other than digits / "argmax", or a list holding one)."""
    if isinstance(target, str):
        t = target.strip().lower()
        return t not in ("", "argmax") and not t.lstrip("+-").isdigit()
    if isinstance(target, (list, tuple)):
        return any(by_name(t) for t in target)
    return isinstance(target, np.ndarray) and target.dtype.kind in "US"


def label_of(index, labels: list[str] | None) -> str | None:
    """The name of class ``index``, or None without names (or past their end)."""
    if labels is None or index is None:
        return None
    i = int(index)
    return labels[i] if 0 <= i < len(labels) else None


def resolve_target(name_or_index, labels: list[str] | None, width: int | None = None, what: str = "target"
                   ) -> int | None:
    """A class index from an index (int or digits), a class name (see the module), or None / "" / "argmax" (None:
    the prediction). ``width``: the number of classes, when known (an index past it is refused)."""
    t = name_or_index
    if t is None or (isinstance(t, str) and t.strip().lower() in ("", "argmax")):
        return None
    if isinstance(t, (bool, np.bool_)):
        raise InputError(f"{what} must be a class index or name, not {t!r}")
    if isinstance(t, (int, np.integer)):
        index = int(t)
    elif isinstance(t, str) and t.strip().lstrip("+-").isdigit():
        index = int(t.strip())
    elif isinstance(t, str):
        return _by_name(t, labels, what)
    else:
        raise InputError(f"{what} must be a class index or name, not {t!r}")
    if index < 0 or (width is not None and index >= width):
        raise InputError(f"{what} {index} out of range: the model has {width} classes (0..{(width or 1) - 1})"
                         if width is not None else f"{what} {index}: give a class index >= 0")
    return index


def resolve_targets(target, labels: list[str] | None, width: int | None = None, what: str = "target"):
    """:func:`resolve_target` on one target or on each of a list of them (one per item); an array of integers is
    returned as given (its range is checked where it is used)."""
    if isinstance(target, (list, tuple)):
        return [resolve_target(t, labels, width, f"{what}[{i}]") for i, t in enumerate(target)]
    if isinstance(target, np.ndarray) and target.dtype.kind in "US":
        return [resolve_target(str(t), labels, width, f"{what}[{i}]") for i, t in enumerate(target.ravel())]
    if isinstance(target, np.ndarray):
        return target
    return resolve_target(target, labels, width, what)


def _norm(s: str) -> str:
    return " ".join(s.split()).casefold()


def _by_name(name: str, labels: list[str] | None, what: str) -> int:
    if not labels:
        raise InputError(f"{what} {name!r}: the model names no classes; give a class index, or the class names "
                         "(--labels FILE / labels=...)")
    want = _norm(name)
    full = [_norm(n) for n in labels]
    aliases = [[a.strip() for a in f.split(",") if a.strip()] for f in full]
    for found in ([i for i, f in enumerate(full) if f == want],
                  [i for i, a in enumerate(aliases) if want in a],
                  [i for i, (f, a) in enumerate(zip(full, aliases)) if f.startswith(want)
                   or any(x.startswith(want) for x in a)]):
        if len(found) == 1:
            return found[0]
        if found:
            shown = ", ".join(f"{i} {labels[i]!r}" for i in found[:8]) + (", ..." if len(found) > 8 else "")
            raise InputError(f"{what} {name!r} names {len(found)} classes ({shown}); give more of the name or the "
                             "class index")
    raise InputError(f"{what} {name!r} is not a class of this model; {_closest(want, labels, full, aliases)}")


def _closest(want: str, labels: list[str], full: list[str], aliases: list[list[str]]) -> str:
    words = {}
    for i, (f, a) in enumerate(zip(full, aliases)):
        for w in [f, *a]:
            words.setdefault(w, i)
    near = difflib.get_close_matches(want, list(words), n=3, cutoff=0.5)
    if near:
        shown = ", ".join(dict.fromkeys(f"{words[w]} {labels[words[w]]!r}" for w in near))
        return f"closest: {shown} (or give a class index 0..{len(labels) - 1})"
    return f"give a class index 0..{len(labels) - 1} or one of its {len(labels)} names (e.g. {labels[0]!r})"


__all__ = ["by_name", "class_count", "find_labels", "read_labels", "as_labels", "labels_beside", "metadata_labels",
           "label_of", "resolve_target", "resolve_targets"]
