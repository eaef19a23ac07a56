"""The readers of model input files, one per input kind (:mod:`onnx_lrp.io.kinds` names each kind's reader in its
table): ``.npy`` (never unpickled), ``.npz`` (one array per model input, by name), images (PNG/JPEG/..., resized and
normalised), and the pieces they share (the model input's layout, the preprocessing, the image decoder). A reader
takes (file, the model's inputs, the preprocessing) and returns a :class:`Part` (arrays by input name with the batch
axis, a name per item); :func:`onnx_lrp.io.inputs.load_inputs` joins the parts of a directory. Nothing here tells a
file's kind from its suffix: the table does.

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

from ..core.errors import InputError


# ---------------------------------------------------------------------------------------------- input specs
@dataclass(frozen=True)
class InputInfo:
    """What the reader needs to know about one model input (``onnx_lrp.Explainer.inputs`` fits)."""

    name: str
    dims: tuple  # ints and None; () when unknown
    dtype: np.dtype = np.dtype(np.float32)


def input_infos(specs) -> list[InputInfo]:
    return [InputInfo(s.name, tuple(s.dims or ()), np.dtype(getattr(s, "dtype", np.float32))) for s in specs]


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
        raise _refused_array_file(path, exc, "a valid .npy file; write it with np.save",
                                  "save a numeric array (np.save(path, np.asarray(x, dtype=np.float32)))") from None
    except Exception as exc:  # EOFError, UnpicklingError, OSError on truncated files
        raise InputError(f"input {path} is not a valid .npy file ({type(exc).__name__}: {_first_line(exc)}); "
                         "it may be truncated; write it with np.save") from None
    if not isinstance(arr, np.ndarray):
        raise InputError(f"input {path} is not a .npy array; use .npz for several arrays")
    return arr


def _refused_array_file(path, exc: ValueError, what: str, fix: str) -> InputError:
    """numpy's ValueError on reading ``path`` as one line: pickled objects (never loaded; ``fix``) or not a valid
    ``what`` ("a valid .npy file; write it with np.save")."""
    if "pickle" in str(exc).lower() or "object" in str(exc).lower():
        return InputError(f"input {path} holds pickled Python objects, which are never loaded; {fix}")
    file, how = what.split("; ")
    return InputError(f"input {path} is not {file} ({_first_line(exc)}); {how}")


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
        raise _refused_array_file(path, exc, "a valid .npz file; write it with np.savez",
                                  "save numeric arrays with np.savez") from None
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


def channels_last(dims) -> bool:
    """A 4-D input whose last axis is 1 or 3 and second is not: channels last (NHWC, Keras), else channels first."""
    dims = tuple(dims or ())
    return len(dims) == 4 and dims[3] in (1, 3) and dims[1] not in (1, 3)


def header_dtype(f) -> np.dtype:
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return read(f)[2]


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


def format_shape(shape) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _want(dims) -> str:
    return "x".join("N" if i == 0 else ("?" if d is None else str(d)) for i, d in enumerate(dims))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "cannot parse"


# ---------------------------------------------------------------------------------------------- one reader per kind
@dataclass
class Part:
    """What a reader read from one file: arrays by input name (with the batch axis), a name per item and, for
    images, the display images, their layout and how each was resized."""

    arrays: dict[str, np.ndarray]
    names: list[str]
    images: list[np.ndarray] | None = None  # decoded images: the arrays are model input already (normalised)
    layout: ImageLayout | None = None
    resized: list = field(default_factory=list)


def read_image(path: Path, infos: list[InputInfo], pre: Preprocess) -> Part:
    """An image file for a model with one image input: resized and normalised as ``pre`` says."""
    if len(infos) != 1:
        raise InputError(f"the model has {len(infos)} inputs ({', '.join(i.name for i in infos)}); an image "
                         "feeds one; give a .npz with one array per input")
    layout = image_layout(infos[0])
    x, display = load_image(path, layout, pre)
    source = _source_size(path)
    said = describe_resize(source, image_size(layout, pre, path), pre.squash) if source else None
    return Part({infos[0].name: x[None]}, [path.name], [display], layout, [said])


def read_npy(path: Path, infos: list[InputInfo], pre: Preprocess) -> Part:
    """A .npy array for a model with one input (a batch, or one item without its batch axis)."""
    if len(infos) != 1:
        raise InputError(f"the model has {len(infos)} inputs ({', '.join(i.name for i in infos)}); a .npy file "
                         f"holds one array; give a .npz with arrays named {', '.join(i.name for i in infos)}")
    return _arrays_part(path, {infos[0].name: load_npy(path)}, infos)


def read_npz(path: Path, infos: list[InputInfo], pre: Preprocess) -> Part:
    """A .npz archive: one array per model input, by name (any name when the model has one input)."""
    arrays = load_npz(path)
    if len(infos) == 1 and len(arrays) == 1 and infos[0].name not in arrays:
        arrays = {infos[0].name: next(iter(arrays.values()))}
    missing = [i.name for i in infos if i.name not in arrays]
    extra = sorted(set(arrays) - {i.name for i in infos})
    if missing or extra:
        raise InputError(f"input {path} holds arrays {', '.join(sorted(arrays)) or '(none)'} but the model's "
                         f"inputs are {', '.join(i.name for i in infos)}; name one array per input")
    return _arrays_part(path, arrays, infos)


def read_pixels(path: Path, infos: list[InputInfo], pre: Preprocess) -> Part:
    """A .npy or .npz of uint8 pixels (told by its first bytes): read as either; the caller divides by 255."""
    with open(path, "rb") as f:
        zipped = f.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    return (read_npz if zipped else read_npy)(path, infos, pre)


def read_rows_elsewhere(path: Path, infos: list[InputInfo], pre: Preprocess) -> Part:
    """Kinds that hold one item per row of a dataset (Parquet): read by the dataset engine
    (:mod:`onnx_lrp.dataset.sources`), not by one run."""
    raise InputError(f"input {path} is a dataset source (one item per row): explain it with --out-dir DIR "
                     "(Python: onnx_lrp.explain_dataset)")


def _arrays_part(path: Path, arrays: dict, infos: list[InputInfo]) -> Part:
    """The arrays of one file checked against the model's inputs: numeric, of the input's rank (one item without
    its batch axis gets one), one batch size for all."""
    out = {}
    for info in infos:
        a = arrays[info.name]
        if a.dtype == object or a.dtype.kind not in "biuf":
            raise InputError(f"input {path} ({info.name}) has dtype {a.dtype}; give a numeric array")
        if info.dims and a.ndim == len(info.dims) - 1:
            a = a[None]  # one sample without its batch axis
        if info.dims and a.ndim != len(info.dims):
            raise InputError(f"input {path} ({info.name}) has shape {format_shape(a.shape)} (rank {a.ndim}); the "
                             f"model wants rank {len(info.dims)}: {_want(info.dims)}")
        if a.ndim == 0:
            raise InputError(f"input {path} ({info.name}) is a scalar; give an array with a batch axis")
        out[info.name] = a
    batch = next(iter(out.values())).shape[0]
    for name, a in out.items():
        if a.shape[0] != batch:
            raise InputError(f"input {path}: array {name!r} has {a.shape[0]} items but others have {batch}; give "
                             "the same batch size for every input")
    stem = path.name
    return Part(out, [stem] if batch == 1 else [f"{stem}[{i}]" for i in range(batch)])


__all__ = ["ImageLayout", "InputInfo", "Part", "Preprocess", "channels_last", "decode_pixels", "describe_resize",
           "fit", "format_shape", "header_dtype", "image_layout", "image_size", "input_infos", "load_image",
           "load_npy", "load_npz", "normalise_pixels", "read_image", "read_npy", "read_npz", "read_pixels",
           "read_rows_elsewhere"]
