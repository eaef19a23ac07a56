"""Writing a model file atomically: bytes alone, or for a large model ``MODEL`` + ``MODEL.data`` with every
external tensor's bytes copied there in page-aligned chunks."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

from ...core.errors import ModelError
from ...core.files import atomic_write, temporary_beside
from .. import external
from .external_data import external_tensors
from .serialize import serialize_proto


COPY_CHUNK = 1 << 26  # bytes copied at once by save_large()


def save_parts(parts: external.Parts, path) -> None:
    """Write ``path`` (and ``path.data`` for a large model) atomically."""
    if parts.large:
        save_large(parts, path)
    else:
        save_bytes(parts.model_bytes, path)


def save_bytes(model_bytes: bytes, path) -> None:
    """Write atomically: a temporary file beside the target, then rename."""
    atomic_write(path, model_bytes)


def save_large(parts: external.Parts, path) -> None:
    """Write a large model as ``path`` + ``path.data`` (every external tensor's bytes copied there, in chunks),
    both via temporary files renamed at the end (no half-written output)."""
    path = Path(path)
    data_name = path.name + ".data"
    proto = onnx.load_model_from_string(parts.model_bytes)
    fd_model, tmp_model = temporary_beside(path)  # unpredictable names, O_EXCL: never through a planted symlink
    fd_data, tmp_data = temporary_beside(path.with_name(data_name))
    try:
        with os.fdopen(fd_data, "wb") as out:
            for t in external_tensors(proto):
                info = {e.key: e.value for e in t.external_data}
                pad = (-out.tell()) % 4096  # page-aligned: onnxruntime can map each tensor
                out.write(b"\0" * pad)
                offset = out.tell()
                if info.get("location") == external.MEMORY:
                    out.write(memoryview(np.ascontiguousarray(parts.arrays[t.name])).cast("B"))
                else:  # "length" is optional: the rest of the file (torch.onnx writes one file per tensor so)
                    src, start = Path(parts.folder) / info["location"], int(info.get("offset", 0))
                    _copy_range(src, start, int(info["length"]) if "length" in info else src.stat().st_size - start,
                                out)
                del t.external_data[:]
                out.truncate()  # a trailing hole becomes part of the file
                for k, val in (("location", data_name), ("offset", str(offset)), ("length", str(out.tell() - offset))):
                    e = t.external_data.add()
                    e.key, e.value = k, val
        model_file, fd_model = os.fdopen(fd_model, "wb"), None  # written through mkstemp's descriptor, not by name
        with model_file:
            model_file.write(serialize_proto(proto))
        os.replace(tmp_data, path.with_name(data_name))
        os.replace(tmp_model, path)
    finally:
        if fd_model is not None:
            os.close(fd_model)
        for tmp in (tmp_model, tmp_data):
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass


def _copy_range(src: Path, offset: int, length: int, out) -> None:
    """Copy ``length`` bytes of ``src`` from ``offset`` to ``out`` in chunks; all-zero chunks become holes of the
    file (sparse weights, e.g. pruned ones, take no disk)."""
    zeros = bytes(COPY_CHUNK)
    with open(src, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            chunk = f.read(min(COPY_CHUNK, left))
            if not chunk:
                raise ModelError(f"external data file {src} ended early; copy it again")
            if chunk == zeros[:len(chunk)]:
                out.seek(len(chunk), 1)
            else:
                out.write(chunk)
            left -= len(chunk)
