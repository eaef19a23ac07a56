"""The input kinds: the one table of the file formats users feed (suffixes, reader, value range, default output
name, how the dataset engine reads a source of the kind), read by the API (:mod:`onnx_lrp.io.inputs`), the command
line and the dataset sources (:mod:`onnx_lrp.dataset.sources`). Nothing else tests a file's suffix to tell what it
holds: :func:`kind_of` does; nothing else picks a file's reader: the row names it. A new input kind is a row here
(its reader beside the others in :mod:`onnx_lrp.io.readers`, or written here) and a case in
``tests/io/test_input_kinds.py``."""
from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Callable

from . import readers


class Kind(StrEnum):
    """What an input file holds (a ``str``: ``Kind.IMAGE == "image"``)."""

    NPY = "npy"
    NPZ = "npz"
    IMAGE = "image"
    PARQUET = "parquet"
    PIXELS = "pixels"  # .npy/.npz arrays of uint8: 8-bit pixels, divided by 255 as images are (no suffix of its own)


@dataclass(frozen=True)
class InputKind:
    """One row of the table."""

    kind: Kind
    suffixes: tuple[str, ...]  # lower case, with the dot; () for a kind told by its content (PIXELS)
    reader: Callable  # (path, the model's InputInfos, Preprocess) -> readers.Part: how one file of the kind is read
    unit_range: bool  # items lie in [0, 1] before --mean/--std, so box-rule bounds are known without them
    relevance_suffix: str  # explain's default -o for one such file: x.png -> ./x.relevance.npy
    single_run: bool  # explain without --out-dir (and evaluate, trace, ...) reads it; else dataset sources only
    rows: bool  # a dataset SOURCE file of this kind holds one item per row (else the file is one item)
    preprocessed: bool  # --size/--crop/--mean/--std apply to its items in dataset mode (images, Parquet images)


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")

KINDS: dict[Kind, InputKind] = {k.kind: k for k in (
    InputKind(Kind.NPY, (".npy",), readers.read_npy, unit_range=False, relevance_suffix=".npy", single_run=True,
              rows=True, preprocessed=False),
    InputKind(Kind.NPZ, (".npz",), readers.read_npz, unit_range=False, relevance_suffix=".npz", single_run=True,
              rows=True, preprocessed=False),
    InputKind(Kind.IMAGE, IMAGE_SUFFIXES, readers.read_image, unit_range=True, relevance_suffix=".npy",
              single_run=True, rows=False, preprocessed=True),
    InputKind(Kind.PARQUET, (".parquet",), readers.read_rows_elsewhere, unit_range=False, relevance_suffix=".npz",
              single_run=False, rows=True, preprocessed=True),
    InputKind(Kind.PIXELS, (), readers.read_pixels, unit_range=True, relevance_suffix=".npy", single_run=True,
              rows=True, preprocessed=False),
)}

ARRAY_KINDS = (Kind.NPY, Kind.NPZ)  # numeric arrays as stored (np.save / np.savez)
FILE_KINDS = tuple(k for k, spec in KINDS.items() if spec.single_run and spec.suffixes)  # one file, or a directory
ARRAY_SUFFIXES = tuple(s for k in ARRAY_KINDS for s in KINDS[k].suffixes)
UNIT_RANGE = tuple(k for k, spec in KINDS.items() if spec.unit_range)  # kinds whose value range is known
DIRECTORY = "directory"  # input_kind of a directory (its files are of one of FILE_KINDS)

_BY_SUFFIX = {s: spec.kind for spec in KINDS.values() for s in spec.suffixes}


def kind_of(path) -> Kind | None:
    """The kind a file's suffix names (case-insensitive), or None; the one place that tests suffixes."""
    return _BY_SUFFIX.get(os.path.splitext(os.fspath(path))[1].lower())  # = Path(path).suffix, without a Path


def is_kind(path, *kinds: Kind) -> bool:
    """Whether the file's suffix names one of ``kinds`` (all of FILE_KINDS when none are given)."""
    return kind_of(path) in (kinds or FILE_KINDS)


def suffixes(*kinds: Kind) -> tuple[str, ...]:
    """The suffixes of ``kinds`` in table order (e.g. for a message)."""
    return tuple(s for k in kinds for s in KINDS[k].suffixes)


def relevance_name(path, kind) -> Path:
    """explain's default -o: in the current directory, named after the input: ``x.npy`` -> ``x.relevance.npy``; a
    directory (``kind`` DIRECTORY) or a .npz -> ``<name>.relevance.npz``."""
    path = Path(path)
    if kind == DIRECTORY:
        return Path(f"{path.resolve().name}.relevance.npz")  # "." has no name of its own
    return Path(f"{path.stem}.relevance{KINDS[Kind(kind)].relevance_suffix}")


__all__ = ["ARRAY_KINDS", "ARRAY_SUFFIXES", "DIRECTORY", "FILE_KINDS", "IMAGE_SUFFIXES", "InputKind", "KINDS", "Kind",
           "UNIT_RANGE", "is_kind", "kind_of", "relevance_name", "suffixes"]
