"""Reading options and writing outputs for the command line; reusable by every command.

* The readers of model inputs (:func:`~onnx_lrp.io.inputs.load_inputs`, :class:`~onnx_lrp.io.inputs.Preprocess`)
  live in :mod:`onnx_lrp.io.inputs` (the API uses them too), the kinds of input files in :mod:`onnx_lrp.io.kinds`;
  the commands import them from there.
* :class:`AtomicOutputs` writes several files as one transaction: each goes to a temporary file in its target's
  directory and is renamed over the target only when all of them were written, so a failed run leaves no
  half-written file and never clobbers an existing output.

Every problem raises :class:`onnx_lrp.LrpError` (one line naming the file and what to do).
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from onnx_lrp.core.errors import InputError, OutputError
from onnx_lrp.core.files import guard_outputs, temporary_beside
from onnx_lrp.io.kinds import Kind, suffixes


def parse_floats(text: str | None, what: str) -> tuple | None:
    if text is None:
        return None
    try:
        vals = tuple(float(v) for v in str(text).replace(" ", "").split(",") if v != "")
    except ValueError:
        raise InputError(f"{what} {text!r} is not a number or comma-separated numbers (e.g. 0.5 or "
                         "0.485,0.456,0.406)") from None
    if not vals or not all(np.isfinite(vals)):
        raise InputError(f"{what} {text!r}: give finite numbers, e.g. 0.5 or 0.485,0.456,0.406")
    return vals


def parse_size(text: str | None) -> tuple | None:
    if text is None:
        return None
    parts = str(text).lower().replace("x", ",").split(",")
    try:
        vals = tuple(int(p) for p in parts if p.strip())
    except ValueError:
        vals = ()
    if len(vals) not in (1, 2) or min(vals) < 1 or max(vals) > 16384:  # a huge size would exhaust memory
        raise InputError(f"--size {text!r}: give one side (224) or height,width (224,224), at most 16384 each")
    return vals * 2 if len(vals) == 1 else vals


# ---------------------------------------------------------------------------------------------- progress
class Progress:
    """A progress bar on stderr that appears only when the work takes longer than ``after_s`` seconds (estimated
    from the first step); ``update(done, total)``; use as a context manager."""

    def __init__(self, label: str, after_s: float = 2.0):
        import time
        self._clock = time.perf_counter
        self.label, self.after_s = label, after_s
        self._t0 = self._clock()
        self._bar = None
        self._shown = 0

    def update(self, done: int, total: int) -> None:
        import sys

        import click
        if self._bar is None and done < total and done > 0:
            if (self._clock() - self._t0) / done * total > self.after_s:
                self._bar = click.progressbar(length=total, label=self.label, file=sys.stderr)
                self._bar.__enter__()
        if self._bar is not None:
            self._bar.update(done - self._shown)
            self._shown = done

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)


# ---------------------------------------------------------------------------------------------- writing
class AtomicOutputs:
    """Write files as one transaction: temporary files beside their targets, renamed over them at ``commit``.

    Use as a context manager: ``with AtomicOutputs() as out: out.save_npy(path, arr); out.save_png(path, image)``.
    Leaving the block normally commits; an exception removes every temporary file and leaves the targets alone.
    """

    def __init__(self):
        self._pending: list[tuple[Path, Path]] = []

    def __enter__(self) -> "AtomicOutputs":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def write(self, path, writer) -> Path:
        """Call ``writer(binary_file)`` on a temporary file that becomes ``path`` at commit."""
        path = Path(path)
        check_writable(path)
        try:
            fd, tmp = temporary_beside(path)
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}; choose a writable directory") from None
        self._pending.append((tmp, path))
        try:
            with os.fdopen(fd, "wb") as f:
                writer(f)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
        return path

    def write_bytes(self, path, data: bytes) -> Path:
        return self.write(path, lambda f: f.write(data))

    def save_npy(self, path, arr: np.ndarray) -> Path:
        return self.write(path, lambda f: np.save(f, np.asarray(arr), allow_pickle=False))

    def save_npz(self, path, arrays: dict, compressed: bool = False) -> Path:
        def writer(f):
            buf = io.BytesIO()
            (np.savez_compressed if compressed else np.savez)(buf, **{k: np.asarray(v) for k, v in arrays.items()})
            f.write(buf.getvalue())
        return self.write(path, writer)

    def save_png(self, path, image) -> Path:
        return self.write(path, lambda f: image.save(f, format="PNG"))

    def save_image(self, path, image) -> Path:
        """A Pillow image in the format its suffix names (.png, .jpg, .webp, ...)."""
        from onnx_lrp.io.heatmap import IMAGE_FORMATS
        fmt = IMAGE_FORMATS.get(Path(path).suffix.lower(), "PNG")
        extra = {"quality": 95} if fmt in ("JPEG", "WEBP") else {}
        return self.write(path, lambda f: image.save(f, format=fmt, **extra))

    def commit(self) -> None:
        try:
            for tmp, path in self._pending:
                os.replace(tmp, path)
        except OSError as exc:
            self.abort()
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
        self._pending = []

    def abort(self) -> None:
        for tmp, _ in self._pending:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
        self._pending = []


def model_files(model, what: str = "the model") -> list[tuple[str, Path]]:
    """MODEL and the external data files it names, as :func:`guard` inputs (a model that cannot be read: the file
    alone; loading refuses it later)."""
    pairs = [(what, Path(model))]
    if not Path(model).is_file():
        return pairs
    from onnx_lrp import load as loader
    from onnx_lrp.core.errors import LrpError
    try:
        pairs += [(f"{what}'s external data file", f) for f in loader.data_files(model)]
    except (LrpError, OSError, ValueError):
        pass
    return pairs


def guard(inputs, outputs, models=()) -> None:
    """Refuse (one line naming both paths, before anything is written) an output that names an input, by resolved
    path (:func:`onnx_lrp.core.files.guard_outputs`). ``inputs`` and ``outputs``: (what / option, path) pairs (None
    paths skipped; a folder input stands for the files in it that a reader reads: arrays, images, Parquet); ``models``: (what, model path) pairs whose external data
    files count as inputs too (read only when some output already exists: a new file can overwrite nothing)."""
    outputs = [(opt, Path(p)) for opt, p in outputs if p is not None]
    inputs = [(w, p) for w, p in inputs if p is not None]
    if any(os.path.lexists(p) for _, p in outputs):
        inputs += [pair for what, m in models if m is not None for pair in model_files(m, what)]
    guard_outputs(inputs, outputs, folder_suffixes=suffixes(*Kind))  # what a folder input's readers read


def check_writable(path) -> None:
    """Raise OutputError unless ``path`` can be created or replaced (checked before any work is done)."""
    path = Path(path)
    parent = path.parent
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a directory; give a file name")
    if not parent.exists():
        blocker = next((p for p in [parent, *parent.parents] if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise OutputError(f"cannot write {path}: {blocker} is a file, not a directory; choose another path")
        raise OutputError(f"cannot write {path}: directory {parent} does not exist; create it first")
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: {parent} is a file, not a directory; choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {path}: directory {parent} is not writable; choose another path")
    if path.exists() and not os.access(path, os.W_OK) and not os.access(parent, os.W_OK):
        raise OutputError(f"cannot write {path}: it is read-only; choose another path")


__all__ = ["AtomicOutputs", "Progress", "check_writable", "parse_floats", "parse_size"]
