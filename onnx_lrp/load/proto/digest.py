"""The files a model is made of (the model file and the external data files it names) and their SHA-256."""
from __future__ import annotations

import hashlib
from pathlib import Path

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
