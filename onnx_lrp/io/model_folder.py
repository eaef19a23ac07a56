"""A model given as its .onnx file or as the folder an exporter wrote (optimum's ``model.onnx``, transformers'
``save_pretrained``, ...), with the files that come with it (tokenizer.json, config.json) found in that folder.

:func:`resolve_model_folder` is the one place that turns what the user gave into (the model file, its folder); the
API (``Explainer``) and the command line both ask it. A new kind of export folder is one finder appended to
:data:`FINDERS` (a function of the folder that returns the model file, or None when the folder is not of its kind).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ..core.errors import ModelError
from .genai import model_file as _genai

TOKENIZER = "tokenizer.json"
CONFIG = "config.json"


def _export(folder: Path) -> "Path | None":
    """An optimum / torch.onnx export folder: its model.onnx (beside its model.onnx_data, if any)."""
    p = folder / "model.onnx"
    return p if p.is_file() else None


def _only_onnx(folder: Path) -> "Path | None":
    """A folder holding exactly one .onnx file: that file."""
    found = sorted(p for p in folder.glob("*.onnx") if p.is_file())
    return found[0] if len(found) == 1 else None


# tried in order; the first that names a file wins
FINDERS: list[Callable[[Path], "Path | None"]] = [_genai, _export, _only_onnx]


def resolve_model_folder(path) -> tuple[object, "Path | None"]:
    """(the model file, the folder of the files that come with it) for ``path``: an .onnx file (its own folder), or
    an export folder (the model file a finder of :data:`FINDERS` names in it). A model that is not a path (bytes,
    a ModelProto, an onnx_ir model) comes back as it is, with no folder; a path that does not exist too (the loader
    refuses it). A folder without a model it can name is refused in one line listing its .onnx files."""
    if not isinstance(path, (str, os.PathLike)):
        return path, None
    p = Path(os.fspath(path))
    if not p.is_dir():
        return path, p.absolute().parent if p.exists() else None
    for finder in FINDERS:
        found = finder(p)
        if found is not None:
            return found, p.absolute()
    onnx_files = sorted(q.name for q in p.glob("*.onnx"))
    if not onnx_files:
        raise ModelError(f"model folder {p} holds no .onnx file; export the model to ONNX into it (optimum-cli "
                         "export onnx, torch.onnx.export) or give the .onnx file")
    shown = ", ".join(onnx_files[:6]) + (f" and {len(onnx_files) - 6} more" if len(onnx_files) > 6 else "")
    raise ModelError(f"model folder {p} holds {len(onnx_files)} .onnx files ({shown}) and no model.onnx; give the "
                     f"one to explain, e.g. {p / onnx_files[0]}")


def model_argument(model) -> str:
    """The command line's MODEL: an export folder (a folder holding .onnx files) as its model file, anything else as
    given (a folder without models stays a folder: the command says MODEL and INPUT may be swapped)."""
    p = Path(os.fspath(model))
    if p.is_dir() and any(p.glob("*.onnx")):
        return str(resolve_model_folder(p)[0])
    return model


def beside(folder: "Path | None", name: str) -> "Path | None":
    """The file ``name`` in the model's folder, or None (no folder, or no such file there)."""
    if folder is None:
        return None
    p = Path(folder) / name
    return p if p.is_file() else None


__all__ = ["CONFIG", "FINDERS", "TOKENIZER", "beside", "model_argument", "resolve_model_folder"]
