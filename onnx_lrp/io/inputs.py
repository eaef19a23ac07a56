"""Reading model inputs: ``.npy`` (never unpickled), ``.npz`` (one array per model input, by name), images
(PNG/JPEG/..., resized and normalised) or a directory of these, for the API (onnx_lrp.dataset) and the command line.
Which kind a file is, the table of kinds says (:mod:`onnx_lrp.io.kinds`); the readers of each kind are here.

* :func:`load_inputs` reads a file or a directory of files of one kind into one :class:`Batch`.
* :func:`load_image` decodes one image; :func:`decode_pixels` + :func:`normalise_pixels` are its two halves, so
  that the dataset engines decode many images and normalise them as one batch (the same numbers).

Every problem raises :class:`onnx_lrp.LrpError` (one line naming the file and what to do).
"""
from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import InputError, LrpError
from .convert import layout_hint, pixels_note
from .kinds import ARRAY_KINDS, DIRECTORY, FILE_KINDS, Kind, kind_of, suffixes


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# ---------------------------------------------------------------------------------------------- input specs
@dataclass(frozen=True)
class InputInfo:
    """What the reader needs to know about one model input (``onnx_lrp.Explainer.inputs`` fits)."""

    name: str
    dims: tuple  # ints and None; () when unknown
    dtype: np.dtype = np.dtype(np.float32)


def input_infos(specs) -> list[InputInfo]:
    return [InputInfo(s.name, tuple(s.dims or ()), np.dtype(getattr(s, "dtype", np.float32))) for s in specs]


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


@dataclass(frozen=True)
class ImageLayout:
    channels: int
    height: int | None
    width: int | None
    channels_last: bool = False

    @property
    def channel_axis(self) -> int:
        return -1 if self.channels_last else 1


def image_layout(info: InputInfo) -> ImageLayout:
    """NCHW (PyTorch) unless the dims look like NHWC (last axis 1 or 3, second axis not)."""
    dims = info.dims
    if len(dims) != 4:
        raise InputError(f"the model input {info.name!r} has {len(dims) or 'unknown'} dims; an image input needs a "
                         "4-D input (N,C,H,W); give a .npy array instead")
    last = channels_last(dims)
    c, h, w = (dims[3], dims[1], dims[2]) if last else (dims[1], dims[2], dims[3])
    c = 3 if c is None else c
    if c not in (1, 3):
        raise InputError(f"the model input {info.name!r} has {c} channels; images can feed 1 (grey) or 3 (RGB) "
                         "channels; give a .npy array instead")
    return ImageLayout(c, h, w, last)


# ---------------------------------------------------------------------------------------------- preprocessing
@dataclass(frozen=True)
class Preprocess:
    """Images: resize to ``size`` (H, W; None = the model's input size), scale to [0, 1], then (x - mean) / std."""

    size: tuple | None = None
    mean: tuple = (0.0,)
    std: tuple = (1.0,)
    crop: bool = False  # --crop was given (resizing keeps the aspect ratio unless ``squash``: the default)
    normalised: bool = False  # --mean or --std was given (else the defaults 0 and 1)
    squash: bool = False  # resize to the size whatever the aspect ratio (else: the shorter side, then the centre)

    def per_channel(self, channels: int | None, where: str = "the model's input") -> tuple[np.ndarray, np.ndarray]:
        """--mean and --std as one value per channel (``channels`` None: as many as given, or one)."""
        mean, std = np.asarray(self.mean, np.float32).ravel(), np.asarray(self.std, np.float32).ravel()
        if channels is None:
            channels = max(mean.size, std.size)
        for what, arr in (("--mean", mean), ("--std", std)):
            if arr.size not in (1, channels):
                give = "one value" if channels == 1 else f"one value or {channels} (one per channel)"
                raise InputError(f"{what} has {arr.size} values but {where} has {channels} "
                                 f"channel{'' if channels == 1 else 's'}; give {give}")
        if np.any(std <= 0):
            raise InputError("--std values must be > 0")
        return np.broadcast_to(mean, (channels,)).copy(), np.broadcast_to(std, (channels,)).copy()

    def bounds(self, channels: int | None, rank: int = 4, where: str = "the model's input") \
            -> tuple[np.ndarray, np.ndarray]:
        """Box-rule bounds: the range [0, 1] after normalisation, low = (0 - mean) / std, high = (1 - mean) / std per
        channel, shaped [C, 1, ...] for an input of ``rank`` (batch axis included): the box rule applies to the input
        of the first layer, and ONNX convolutions are channels-first (an NHWC model transposes its input before)."""
        mean, std = self.per_channel(channels, where)
        low, high = (0.0 - mean) / std, (1.0 - mean) / std
        shape = (-1,) + (1,) * max(0, rank - 2)
        return low.reshape(shape), high.reshape(shape)

    def box(self, layout: ImageLayout) -> tuple[np.ndarray, np.ndarray]:
        """Box-rule bounds of an image input (:meth:`bounds`), shaped [C, 1, 1]."""
        return self.bounds(layout.channels, 4)


# ---------------------------------------------------------------------------------------------- readers
def load_npy(path: Path) -> np.ndarray:
    """An array from a .npy file; pickled objects are refused, never unpickled."""
    path = Path(path)
    _check_file(path)
    _check_npy_magic(path)
    from ..core.validate import check_npy

    check_npy(path, f"input {path}")  # the declared shape x itemsize against the cap, before reading
    try:
        arr = np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object" in str(exc).lower():
            raise InputError(f"input {path} holds pickled Python objects, which are never loaded; save a numeric "
                             "array (np.save(path, np.asarray(x, dtype=np.float32)))") from None
        raise InputError(f"input {path} is not a valid .npy file ({_first_line(exc)}); write it with np.save") \
            from None
    except Exception as exc:  # EOFError, UnpicklingError, OSError on truncated files
        raise InputError(f"input {path} is not a valid .npy file ({type(exc).__name__}: {_first_line(exc)}); "
                         "it may be truncated; write it with np.save") from None
    if not isinstance(arr, np.ndarray):
        raise InputError(f"input {path} is not a .npy array; use .npz for several arrays")
    return arr


def _check_npy_magic(path: Path) -> None:
    """numpy reads a file without the .npy magic as a pickle (and refuses it as pickled objects): say what it is."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError:
        return  # np.load reports it
    if head == b"\x93NUMPY":
        return
    if head.startswith(b"PK\x03\x04"):
        raise InputError(f"input {path} is an .npz archive, not an .npy array; rename it to .npz")
    if head[:1] == b"\x80":
        raise InputError(f"input {path} is a Python pickle, which is never loaded; save a numeric array with np.save")
    what = "a text file" if head and all(32 <= b < 127 or b in (9, 10, 13) for b in head) else \
        "empty" if not head else "a file without the .npy header"
    raise InputError(f"input {path} is {what}, not a NumPy .npy array; write it with np.save")


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """Arrays by name from a .npz file; pickled objects are refused."""
    path = Path(path)
    _check_file(path)
    _check_magic(path, ZIP_MAGIC, ".npz", "np.savez")
    from ..core.validate import check_npz

    check_npz(path, f"input {path}")  # the members' declared sizes against the cap, before inflating any
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object" in str(exc).lower():
            raise InputError(f"input {path} holds pickled Python objects, which are never loaded; save numeric "
                             "arrays with np.savez") from None
        raise InputError(f"input {path} is not a valid .npz file ({_first_line(exc)}); write it with np.savez") \
            from None
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise InputError(f"input {path} is not a valid .npz file ({type(exc).__name__}: {_first_line(exc)}); "
                         "it may be truncated; write it with np.savez") from None


def load_image(path: Path, layout: ImageLayout, pre: Preprocess, data: bytes | None = None) \
        -> tuple[np.ndarray, np.ndarray]:
    """(model input [C,H,W] or [H,W,C] float32, display image uint8 [H,W,3]) from an image file (or from its
    encoded bytes ``data``, e.g. a Parquet column; ``path`` then only names it in messages)."""
    pixels = decode_pixels(path, layout, pre, data)
    x = normalise_pixels(pixels[None], layout, pre)[0]
    hwc = pixels.astype(np.float32) / 255.0
    display = np.repeat(hwc, 3, axis=2) if layout.channels == 1 else hwc
    return x, (display * 255 + 0.5).astype(np.uint8)


def image_size(layout: ImageLayout, pre: Preprocess, path) -> tuple[int, int]:
    """(H, W) images are resized to: --size, else the model's input size."""
    size = pre.size or ((layout.height, layout.width) if layout.height and layout.width else None)
    if size is None:
        raise InputError(f"the model's input size is dynamic; give --size H,W to resize {Path(path).name}")
    from ..core.validate import check_size

    # the decoded, resized image as float32 model input: refused before decoding when beyond the cap
    check_size(int(size[0]) * int(size[1]) * max(3, layout.channels) * 4, f"image {Path(path).name} at size "
               f"{size[0]}x{size[1]}")
    return size


def fit(source: tuple, size: tuple, squash: bool = False) -> tuple[tuple, tuple | None]:
    """How an image of ``source`` (W, H) becomes ``size`` (H, W): (the size it is resized to (W, H), the box cut
    from it (left, top, right, bottom) or None). As torchvision's ``Resize`` + ``CenterCrop``: the side that fits
    tightly is resized to the size, the other scaled in proportion (rounded down), then the centre cut; ``squash``:
    resized to the size whatever the aspect ratio."""
    (w, h), (th, tw) = source, size
    if squash or (w, h) == (tw, th):
        return (tw, th), None
    if tw * h >= th * w:  # the width fits tightly: resize it to tw
        scaled = (tw, max(th, int(tw * h / w)))
    else:
        scaled = (max(tw, int(th * w / h)), th)
    left, top = int(round((scaled[0] - tw) / 2.0)), int(round((scaled[1] - th) / 2.0))
    return scaled, (None if scaled == (tw, th) else (left, top, left + tw, top + th))


def describe_resize(source: tuple, size: tuple, squash: bool = False) -> str | None:
    """One phrase for the summary: how an image of ``source`` (W, H) became ``size`` (H, W); None when unchanged."""
    scaled, box = fit(source, size, squash)
    if tuple(source) == scaled and box is None:
        return None
    if box is None:
        stretched = squash and source[0] * size[0] != source[1] * size[1]
        return f"resized to {size[0]}x{size[1]}" + (" (squashed: --squash)" if stretched else "")
    resized = "" if tuple(source) == scaled else f"resized to {scaled[1]}x{scaled[0]} (aspect kept), "
    return f"{resized}the centre {size[0]}x{size[1]} cut (--squash: resized without cutting)"


def decode_pixels(path, layout: ImageLayout, pre: Preprocess, data: bytes | None = None) -> np.ndarray:
    """The pixels [H,W,C] uint8 of an image file (or of its encoded bytes ``data``), converted to the model's
    channels and resized as ``pre`` says; :func:`normalise_pixels` makes model input of them."""
    from PIL import Image, UnidentifiedImageError

    if data is None:
        _check_file(Path(path))
    size = image_size(layout, pre, path)
    try:
        with Image.open(path if data is None else io.BytesIO(data)) as im:
            im.load()
            mode = "L" if layout.channels == 1 else "RGB"
            im = im.convert(mode)
            scaled, box = fit(im.size, size, pre.squash)
            if scaled != im.size:
                im = im.resize(scaled, Image.Resampling.BILINEAR)
            if box is not None:
                im = im.crop(box)
            pixels = np.asarray(im, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InputError(f"input {path} is not a readable image ({type(exc).__name__}: {_first_line(exc)}); give "
                         "a PNG or JPEG file") from None
    return pixels.reshape(size[0], size[1], layout.channels)


def normalise_pixels(pixels: np.ndarray, layout: ImageLayout, pre: Preprocess) -> np.ndarray:
    """Model input float32 [N,C,H,W] (or [N,H,W,C]) of pixels [N,H,W,C] uint8: (pixels / 255 - mean) / std, the
    same numbers per image whether one image or a batch is normalised (element-wise operations only). Computed in
    place, written straight into the channels-first layout, ~1 MB at a time (it stays in the CPU cache)."""
    mean, std = pre.per_channel(layout.channels)
    n, h, w, c = pixels.shape
    out = np.empty((n, h, w, c) if layout.channels_last else (n, c, h, w), np.float32)
    view = out if layout.channels_last else out.transpose(0, 2, 3, 1)
    step = max(1, (1 << 20) // max(1, 4 * h * w * c))
    for lo in range(0, n, step):
        v = view[lo:lo + step]
        np.divide(pixels[lo:lo + step], np.float32(255.0), out=v)
        np.subtract(v, mean, out=v)
        np.divide(v, std, out=v)
    return out


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
    parts = [_load_one(p, kind, infos, pre) for p in files]
    names = [n for part in parts for n in part.names]
    arrays = {}
    for info in infos:
        chunks = [part.arrays[info.name] for part in parts]
        base = chunks[0].shape[1:]
        for f, c in zip(files, chunks):
            if c.shape[1:] != base or c.dtype != chunks[0].dtype:
                raise InputError(f"input {f} has shape {_shape(c.shape[1:])} ({c.dtype}) but {files[0].name} has "
                                 f"{_shape(base)} ({chunks[0].dtype}); all files of a batch must agree")
        arrays[info.name] = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    images = [im for part in parts for im in (part.images or [])] if kind is Kind.IMAGE else None
    if kind is Kind.IMAGE:
        return Batch(arrays, names, kind, images, parts[0].layout, files,
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


def channels_last(dims) -> bool:
    """A 4-D input whose last axis is 1 or 3 and second is not: channels last (NHWC, Keras), else channels first."""
    dims = tuple(dims or ())
    return len(dims) == 4 and dims[3] in (1, 3) and dims[1] not in (1, 3)


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
                return [_header_dtype(f)]
        if kind is Kind.NPZ:
            with zipfile.ZipFile(path) as z:
                out = []
                for name in z.namelist():
                    with z.open(name) as f:
                        out.append(_header_dtype(f))
                return out
    except (OSError, ValueError, LrpError, zipfile.BadZipFile, EOFError):
        return []
    return []


def _header_dtype(f) -> np.dtype:
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return read(f)[2]


def _load_one(path: Path, kind: Kind, infos: list[InputInfo], pre: Preprocess) -> Batch:
    if kind is Kind.IMAGE:
        if len(infos) != 1:
            raise InputError(f"the model has {len(infos)} inputs ({', '.join(i.name for i in infos)}); an image "
                             "feeds one; give a .npz with one array per input")
        layout = image_layout(infos[0])
        x, display = load_image(path, layout, pre)
        source = _source_size(path)
        said = describe_resize(source, image_size(layout, pre, path), pre.squash) if source else None
        return Batch({infos[0].name: x[None]}, [path.name], kind, [display], layout, resized=[said])
    if kind is Kind.NPY:
        if len(infos) != 1:
            raise InputError(f"the model has {len(infos)} inputs ({', '.join(i.name for i in infos)}); a .npy file "
                             f"holds one array; give a .npz with arrays named {', '.join(i.name for i in infos)}")
        arrays = {infos[0].name: load_npy(path)}
    else:
        arrays = load_npz(path)
        if len(infos) == 1 and len(arrays) == 1 and infos[0].name not in arrays:
            arrays = {infos[0].name: next(iter(arrays.values()))}
        missing = [i.name for i in infos if i.name not in arrays]
        extra = sorted(set(arrays) - {i.name for i in infos})
        if missing or extra:
            raise InputError(f"input {path} holds arrays {', '.join(sorted(arrays)) or '(none)'} but the model's "
                             f"inputs are {', '.join(i.name for i in infos)}; name one array per input")
    out = {}
    for info in infos:
        a = arrays[info.name]
        if a.dtype == object or a.dtype.kind not in "biuf":
            raise InputError(f"input {path} ({info.name}) has dtype {a.dtype}; give a numeric array")
        if info.dims and a.ndim == len(info.dims) - 1:
            a = a[None]  # one sample without its batch axis
        if info.dims and a.ndim != len(info.dims):
            raise InputError(f"input {path} ({info.name}) has shape {_shape(a.shape)} (rank {a.ndim}); the model "
                             f"wants rank {len(info.dims)}: {_want(info.dims)}")
        if a.ndim == 0:
            raise InputError(f"input {path} ({info.name}) is a scalar; give an array with a batch axis")
        out[info.name] = a
    batch = next(iter(out.values())).shape[0]
    for name, a in out.items():
        if a.shape[0] != batch:
            raise InputError(f"input {path}: array {name!r} has {a.shape[0]} items but others have {batch}; give "
                             "the same batch size for every input")
    stem = path.name
    names = [stem] if batch == 1 else [f"{stem}[{i}]" for i in range(batch)]
    return Batch(out, names, kind)


def _source_size(path: Path) -> tuple | None:
    """An image file's (W, H), from its header; None when unreadable (the reader reports it)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return im.size
    except Exception:  # noqa: BLE001 - read already by load_image, which names the problem
        return None


def _check_file(path: Path) -> None:
    if not path.exists():
        raise InputError(f"input {path} not found; check the path")
    if not path.is_file():
        raise InputError(f"input {path} is not a regular file")
    if path.stat().st_size == 0:
        raise InputError(f"input {path} is empty; write the array or image again")


# the first bytes of a .npy file and of a .npz (a zip) file: without them np.load would try to unpickle the file
# and say "pickled data" of a text file
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"


def _check_magic(path: Path, magic: bytes, kind: str, how: str) -> None:
    with open(path, "rb") as f:
        head = f.read(len(magic))
    if head != magic:
        raise InputError(f"input {path} is not a {kind} file (it starts with {head!r}, not {magic!r}); write it "
                         f"with {how}")


def _shape(shape) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _want(dims) -> str:
    return "x".join("N" if i == 0 else ("?" if d is None else str(d)) for i, d in enumerate(dims))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "cannot parse"


__all__ = ["Batch", "IMAGENET_MEAN", "IMAGENET_STD", "ImageLayout", "InputInfo", "Preprocess", "channels_last",
           "decode_pixels", "describe_resize", "directory_files", "fit", "image_layout", "input_infos", "input_kind",
           "items_kind", "load_image", "load_inputs", "load_npy", "load_npz", "model_channel_axis", "model_input_dims",
           "model_signature", "normalise_pixels", "prepare_arrays", "stored_dtypes"]
