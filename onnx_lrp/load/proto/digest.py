"""The files a model is made of (the model file and the external data files it names) and their SHA-256."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx

from .external_data import data_folder, external_tensors
from .read import read_proto


def data_files(path) -> list[Path]:
    """The external data files a model file names (each once; as read: in the model's real folder)."""
    proto = read_proto(Path(path))
    names = {e.value for t in external_tensors(proto) for e in t.external_data if e.key == "location"}
    return [data_folder(path) / n for n in sorted(names)]


def model_sha256(path) -> str:
    """SHA-256 of a model file and the external data files it names.

    A model without external data gets the plain digest of its file (as snapshots written before recorded it); with
    external data, each data file's name and bytes follow the graph file's bytes, in name order, so a changed weight
    in a data file changes the digest.
    """
    files = [Path(path)] + data_files(path)
    h = hashlib.sha256()
    for i, f in enumerate(files):
        if i:
            h.update(b"\0" + f.name.encode() + b"\0")
        with open(f, "rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def parts_sha256(model_bytes: bytes, folder=None, arrays: dict | None = None) -> str:
    """SHA-256 of a model held as parts (a relevance model: its graph's bytes, the external data files it names in
    ``folder``, the tensors handed over from memory): a changed weight anywhere changes the digest, not only a
    changed graph (an int4 model's 4-bit weights, a large model's float ones live outside the graph's bytes)."""
    h = hashlib.sha256(model_bytes)
    if folder is not None:
        proto = onnx.ModelProto.FromString(model_bytes)  # the graph only: external data stays in its files
        names = sorted({e.value for t in external_tensors(proto) for e in t.external_data if e.key == "location"})
        for name in names:
            h.update(b"\0file\0" + name.encode() + b"\0")
            with open(Path(folder) / name, "rb") as stream:
                for chunk in iter(lambda: stream.read(1 << 22), b""):
                    h.update(chunk)
    for name in sorted(arrays or {}):
        a = np.ascontiguousarray(arrays[name])
        h.update(b"\0array\0" + name.encode() + b"\0" + str(a.dtype).encode() + str(a.shape).encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()
