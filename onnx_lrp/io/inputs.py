"""Reading model inputs: a file or a directory of files of one kind (``.npy``, ``.npz``, images), for the API
(onnx_lrp.dataset) and the command line. Which kind a file is, and which reader reads it, the table of kinds says
(:mod:`onnx_lrp.io.kinds`); the readers are in :mod:`onnx_lrp.io.readers` (their names are importable from here).

* :func:`load_inputs` reads a file or a directory of files of one kind into one :class:`Batch`;
* :func:`prepare_arrays` makes model input of arrays as images are (uint8 as pixels, --mean/--std);
* :func:`model_signature` / :func:`model_input_dims` read a model's inputs without preparing it.

Every problem raises :class:`onnx_lrp.LrpError` (one line naming the file and what to do).
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import InputError, LrpError
from .convert import layout_hint, pixels_note
from .kinds import ARRAY_KINDS, DIRECTORY, FILE_KINDS, KINDS, Kind, kind_of, suffixes
from .readers import (  # noqa: F401 (the readers' names, importable from here as before)
    ImageLayout,
    InputInfo,
    Preprocess,
    channels_last,
    decode_pixels,
    describe_resize,
    fit,
    format_shape,
    header_dtype,
    image_layout,
    image_size,
    input_infos,
    load_image,
    load_npy,
    load_npz,
    normalise_pixels,
)


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def model_input_dims(model) -> list[InputInfo]:
    """The graph inputs of an ONNX model file, read without preparing the model (cheap)."""
    return [InputInfo(v["name"], tuple(d if isinstance(d, int) else None for d in v["dims"]), np.dtype(v["dtype"])
                      if v["dtype"] in NUMPY_TYPES else np.dtype(np.float32))
            for v in model_signature(model)["inputs"]]


NUMPY_TYPES = ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
               "uint64", "bool")


def model_signature(model) -> dict:
    """The graph inputs (initializers aside) and outputs of an ONNX model file, read without preparing the model:
    ``{"inputs": [...], "outputs": [...]}``, each ``dict(name, dims, dtype)`` with dims an int, the name of a
    symbolic axis (``"batch"``) or None, and dtype a numpy-style name (``"float32"``, ``"int64"``, ``"bfloat16"``)."""
    import onnx_ir as ir

    from .. import load as loader  # the only package allowed to touch onnx

    proto = loader.read_proto(model)
    inits = {t.name for t in proto.graph.initializer}

    def described(v) -> dict:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        try:
            dtype = str(ir.DataType(t.elem_type).numpy()) if t.elem_type else "unknown"
        except (ValueError, TypeError):
            dtype = ir.DataType(t.elem_type).name.lower()
        return dict(name=v.name, dims=dims if t.HasField("shape") else None, dtype=dtype)

    return dict(inputs=[described(v) for v in proto.graph.input if v.name not in inits],
                outputs=[described(v) for v in proto.graph.output])


def model_channel_axis(model, input_name: str, dims=()) -> int:
    """The channel axis of a 4-D float input: -1 when the model transposes it from NHWC to NCHW right after the
    input (Keras/TF exports), else what the dims suggest (last axis 1 or 3, second axis not: channels last), else 1."""
    from .. import load as loader

    try:
        proto = loader.read_proto(model)
    except Exception:  # a model the loader refuses is reported elsewhere; fall back to the dims
        proto = None
    if proto is not None:
        for node in proto.graph.node:
            if input_name in node.input and node.op_type == "Transpose":
                perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
                if perm and perm[0] == [0, 3, 1, 2]:
                    return -1
                if perm and perm[0] == [0, 1, 2, 3]:
                    return 1
    return -1 if channels_last(dims) else 1


@dataclass
class Batch:
    """Inputs for one model run, with a name per batch item and display images when the inputs are images."""

    arrays: dict[str, np.ndarray]
    names: list[str]
    kind: Kind  # NPY, NPZ or IMAGE
    images: list[np.ndarray] | None = None
    layout: ImageLayout | None = None
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line each for the user (e.g. uint8 read as pixels)
    outside_unit: str | None = None  # --mean/--std normalised values outside [0, 1]: which file, which range
    resized: list[str] = field(default_factory=list)  # images: how each was resized (describe_resize), if it was

    def resize_note(self) -> str | None:
        """How the images were resized, for a summary line (None when none was)."""
        said = [r for r in self.resized if r]
        if not said:
            return None
        if len(set(said)) == 1 and len(said) == len(self.names):
            return ("image " if len(said) == 1 else "images ") + said[0]
        return f"{len(said)} of {len(self.names)} images resized" + (
            "" if all("cut" not in r for r in said) else " (aspect kept, the centre cut; --squash: without cutting)")

    def __len__(self) -> int:
        return len(self.names)


def input_kind(path: Path) -> str:
    """The :class:`Kind` of a file from its suffix alone (one of FILE_KINDS), or DIRECTORY; unknown suffixes raise."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"input {path} not found; check the path")
    if path.is_dir():
        return DIRECTORY
    kind = kind_of(path)
    if kind in FILE_KINDS:
        return kind
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        raise InputError(f"input {path} is an ONNX model: the first argument is the model, the second the input "
                         "(onnx-lrp explain MODEL.onnx INPUT)")
    raise InputError(f"input {path} has an unknown type {suffix or '(no suffix)'}; give .npy, .npz, an image "
                     f"({', '.join(suffixes(Kind.IMAGE))}) or a directory of these")


def directory_files(path: Path) -> tuple[Kind, list[Path]]:
    files = sorted(p for p in Path(path).iterdir() if p.is_file() and not p.name.startswith(".")
                   and kind_of(p) in FILE_KINDS)
    if not files:
        raise InputError(f"directory {path} holds no .npy, .npz or image files")
    kinds = {kind_of(p) for p in files}
    if len(kinds) > 1:
        raise InputError(f"directory {path} mixes {', '.join(sorted(kinds))} files; keep one kind per directory")
    return kinds.pop(), files


def items_kind(path) -> Kind:
    """The kind of an input's items: a directory's is that of its files; PIXELS for .npy/.npz arrays of uint8, which
    are read as 8-bit pixels as images are (their range is known: [0, 1] after dividing by 255)."""
    kind = input_kind(path)
    kind = directory_files(path)[0] if kind == DIRECTORY else kind
    if kind in ARRAY_KINDS:
        dtypes = stored_dtypes(path)
        if dtypes and all(d == np.uint8 for d in dtypes):
            return Kind.PIXELS
    return kind


def load_inputs(path, specs, pre: Preprocess = Preprocess()) -> Batch:
    """Read ``path`` (a file or a directory of files of one kind) for a model with inputs ``specs``."""
    infos = input_infos(specs)
    path = Path(path)
    kind = input_kind(path)
    if kind == DIRECTORY:
        kind, files = directory_files(path)
    else:
        files = [path]
    parts = [KINDS[kind].reader(p, infos, pre) for p in files]
    names = [n for part in parts for n in part.names]
    arrays = {}
    for info in infos:
        chunks = [part.arrays[info.name] for part in parts]
        base = chunks[0].shape[1:]
        for f, c in zip(files, chunks):
            if c.shape[1:] != base or c.dtype != chunks[0].dtype:
                raise InputError(f"input {f} has shape {format_shape(c.shape[1:])} ({c.dtype}) but {files[0].name} "
                                 f"has {format_shape(base)} ({chunks[0].dtype}); all files of a batch must agree")
        arrays[info.name] = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    if parts[0].images is not None:  # decoded images: model input already
        return Batch(arrays, names, kind, [im for part in parts for im in part.images], parts[0].layout, files,
                     resized=[r for part in parts for r in part.resized])
    if pre.size is not None or pre.crop or pre.squash:
        raise InputError(f"--size and --crop resize images (--squash too), and {path} holds arrays: resize them "
                         "before saving, or drop --size/--crop/--squash")
    arrays, notes, outside = prepare_arrays(arrays, infos, pre, path)
    return Batch(arrays, names, kind, None, None, files, notes, outside)


def prepare_arrays(arrays: dict, infos: list[InputInfo], pre: Preprocess, path) -> tuple[dict, list, str | None]:
    """Arrays for the model's float inputs by the rule images follow: a uint8 array holds 8-bit pixels and is divided
    by 255; with --mean/--std the one float input is normalised, (x - mean) / std per channel (axis 1, or the last
    of a 4-D input that looks channels-last, as :func:`image_layout` says). Other integer arrays for a float input are
    refused. Returns (arrays, notes for the user, where float values lay outside [0, 1] before --mean/--std or
    None)."""
    out, notes, outside = dict(arrays), [], None
    floats = [i for i in infos if i.dtype.kind == "f"]
    if pre.normalised and len(floats) != 1:
        raise InputError(f"--mean/--std normalise the model's one float input, but it has {len(floats)} "
                         f"({', '.join(i.name for i in floats) or 'none'}): normalise the arrays before saving them "
                         "and drop --mean/--std")
    for info in floats:
        a = out[info.name]
        if a.dtype.kind in "biu" and a.dtype != np.uint8:
            raise InputError(f"input {path} ({info.name}) has dtype {a.dtype} but the model takes {info.dtype}: save "
                             "floats (np.save(path, x.astype(np.float32))); uint8 arrays are read as 8-bit pixels")
        hint = layout_hint(f"input {path} ({info.name})", a.shape, info.dims)
        if hint:
            raise InputError(hint)
        if a.dtype == np.uint8:
            a = a.astype(np.float32) / np.float32(255.0)
            notes.append(pixels_note(Path(path).name))
        elif pre.normalised and a.size and (a.min() < 0 or a.max() > 1):
            outside = f"{path} ({info.name}) holds values from {float(a.min()):.4g} to {float(a.max()):.4g}"
        if pre.normalised:
            a = _normalised(a, info, pre)
        out[info.name] = a
    return out, notes, outside


def _normalised(a: np.ndarray, info: InputInfo, pre: Preprocess) -> np.ndarray:
    """(a - mean) / std per channel of a batch ``a`` (axis 1; the last one for a channels-last 4-D input)."""
    last = channels_last(info.dims or a.shape)
    channels = a.shape[-1 if last else 1] if a.ndim >= 2 else 1
    mean, std = pre.per_channel(channels, f"the model input {info.name!r}")
    shape = (channels,) if last or a.ndim < 2 else (channels,) + (1,) * (a.ndim - 2)
    dtype = np.result_type(a.dtype, np.float32)
    return ((a.astype(dtype, copy=False) - mean.reshape(shape)) / std.reshape(shape)).astype(dtype, copy=False)


def stored_dtypes(path) -> list[np.dtype]:
    """The element types of the arrays in a .npy/.npz file (of the first file of a directory of them), read from
    their headers only; [] for images and files that cannot be read (the reader reports those)."""
    path = Path(path)
    try:
        if path.is_dir():
            kind, files = directory_files(path)
            path = files[0]
        kind = kind_of(path)
        if kind is Kind.NPY:
            with open(path, "rb") as f:
                return [header_dtype(f)]
        if kind is Kind.NPZ:
            with zipfile.ZipFile(path) as z:
                out = []
                for name in z.namelist():
                    with z.open(name) as f:
                        out.append(header_dtype(f))
                return out
    except (OSError, ValueError, LrpError, zipfile.BadZipFile, EOFError):
        return []
    return []


__all__ = ["Batch", "IMAGENET_MEAN", "IMAGENET_STD", "ImageLayout", "InputInfo", "Preprocess", "channels_last",
           "decode_pixels", "describe_resize", "directory_files", "fit", "image_layout", "input_infos", "input_kind",
           "items_kind", "load_image", "load_inputs", "load_npy", "load_npz", "model_channel_axis", "model_input_dims",
           "model_signature", "normalise_pixels", "prepare_arrays", "stored_dtypes"]
