"""Dataset sources: a directory or glob of images / arrays, one .npy/.npz array of items, or a Parquet file; each
item has a stable id (its file, or ``file[row]``), items are sorted, read in ranges and decoded like
``onnx-lrp explain`` reads one. An item that cannot be read fails alone (``ITEM_ERRORS``)."""
from __future__ import annotations

import glob as globlib
import hashlib
import os
from pathlib import Path

import numpy as np

from ..core.errors import InputError, LrpError
from ..io.inputs import (
    Preprocess,
    decode_pixels,
    image_layout,
    load_image,
    load_npy,
    load_npz,
    normalise_pixels,
)
from ..io.kinds import FILE_KINDS, KINDS, Kind, is_kind, kind_of


GLOB_CHARS = "*?["


class Source:
    """Items in a fixed order, each with a source id; ``read(lo, hi)`` decodes items lo..hi-1.

    Picklable without its data (Ray ships it to every actor): arrays are opened lazily per process.
    """

    kind = "?"

    def __init__(self, path, infos, pre: Preprocess):
        self.path = str(path)
        self.infos = list(infos)
        self.pre = pre
        self.ids: list[str] = []

    def __len__(self) -> int:
        return len(self.ids)

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.kind.encode())
        h.update("".join(f"{i}\n" for i in self.ids).encode())  # = one update per id
        return h.hexdigest()

    def read_item(self, i: int) -> dict:
        raise NotImplementedError

    def read(self, lo: int, hi: int) -> tuple[list[tuple[int, dict]], list[tuple[int, str]]]:
        """(index, arrays by input name without the batch axis) of the readable items, (index, message) of the
        others."""
        ok, bad = [], []
        for i in range(lo, hi):
            try:
                arrays = self.read_item(i)
                _check_item(arrays, self.infos, self.ids[i])
                ok.append((i, arrays))
            except ITEM_ERRORS as exc:
                bad.append((i, _item_message(exc, self.ids[i])))
        return ok, bad

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


ITEM_ERRORS = (LrpError, OSError, ValueError)  # what one unreadable item may raise; it fails alone


def _item_message(exc: BaseException, item: str) -> str:
    if isinstance(exc, LrpError):
        return str(exc)
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"item {item} cannot be read ({type(exc).__name__}: {text})"


def _check_item(arrays: dict, infos, item: str) -> None:
    for info in infos:
        a = arrays[info.name]
        if a.dtype == object or a.dtype.kind not in "biuf":
            raise InputError(f"item {item} ({info.name}) has dtype {a.dtype}; give a numeric array")
        if info.dims and (a.ndim != len(info.dims) - 1 or any(
                d is not None and d != s for d, s in zip(info.dims[1:], a.shape))):
            want = "x".join("?" if d is None else str(d) for d in info.dims[1:])
            raise InputError(f"item {item} ({info.name}) has shape {'x'.join(map(str, a.shape))}; the model wants "
                             f"{want} per item")
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise InputError(f"item {item} ({info.name}) contains NaN or Inf; clean the data first")


class FileSource(Source):
    """One item per file (image, .npy or .npz); ids are paths relative to the source root, sorted."""

    kind = "files"

    def __init__(self, path, files: list, root, infos, pre, ids: list[str] | None = None):
        super().__init__(path, infos, pre)
        self.root = str(root)
        self.ids = ids if ids is not None else [
            Path(os.path.relpath(f, root)).as_posix() if root else str(f) for f in files]
        self.files = [str(f) for f in files]

    def read(self, lo, hi):
        """Images are decoded one by one and normalised together (one array operation per shard, the same numbers
        as :func:`onnx_lrp.io.inputs.load_image`); other files are read as by :meth:`read_item`."""
        ok, bad, images = [], [], []
        for i in range(lo, hi):
            try:
                if is_kind(self.files[i], Kind.IMAGE):
                    info = self._single("an image")
                    images.append((i, decode_pixels(self.files[i], image_layout(info), self.pre)))
                    continue
                arrays = self.read_item(i)
                _check_item(arrays, self.infos, self.ids[i])
                ok.append((i, arrays))
            except ITEM_ERRORS as exc:
                bad.append((i, _item_message(exc, self.ids[i])))
        if images:
            info, first = self.infos[0], self.ids[images[0][0]]
            try:
                block = normalise_pixels(np.stack([p for _, p in images]), image_layout(info), self.pre)
                _check_item({info.name: block[0]}, self.infos, first)  # all images have its shape
            except ITEM_ERRORS as exc:  # e.g. --size against the model's fixed input size: every image fails
                msg = _item_message(exc, first)
                bad += [(i, msg.replace(first, self.ids[i], 1)) for i, _ in images]
            else:
                ok += [(i, {info.name: block[j]}) for j, (i, _) in enumerate(images)]
                ok.sort(key=lambda t: t[0])
        return ok, bad

    def read_item(self, i: int) -> dict:
        path = Path(self.files[i])
        kind = kind_of(path)
        if kind is Kind.IMAGE:
            info = self._single("an image")
            x, _ = load_image(path, image_layout(info), self.pre)
            return {info.name: x}
        if kind is Kind.NPY:
            info = self._single("a .npy file")
            return {info.name: _one_item(load_npy(path), info, self.ids[i])}
        arrays = load_npz(path)
        if len(self.infos) == 1 and len(arrays) == 1:
            arrays = {self.infos[0].name: next(iter(arrays.values()))}
        missing = [n.name for n in self.infos if n.name not in arrays]
        if missing:
            raise InputError(f"item {self.ids[i]} holds arrays {', '.join(sorted(arrays))} but the model's inputs "
                             f"are {', '.join(n.name for n in self.infos)}; name one array per input")
        return {n.name: _one_item(arrays[n.name], n, self.ids[i]) for n in self.infos}

    def _single(self, what: str):
        if len(self.infos) != 1:
            raise InputError(f"the model has {len(self.infos)} inputs ({', '.join(i.name for i in self.infos)}); "
                             f"{what} feeds one; give .npz files with one array per input")
        return self.infos[0]


def _one_item(a: np.ndarray, info, item: str) -> np.ndarray:
    """A file's array as one item: a leading batch axis of 1 is dropped."""
    if info.dims and a.ndim == len(info.dims):
        if a.shape[0] != 1:
            raise InputError(f"item {item} holds {a.shape[0]} items on its first axis; a file in a directory source "
                             "is one item: split it, or give the file itself as SOURCE")
        a = a[0]
    return a


class RowIds:
    """``name[i]`` for i < n, made on demand (a million rows cost no memory)."""

    def __init__(self, name: str, n: int):
        self.name, self.n = name, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> str:
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return f"{self.name}[{i % self.n}]"

    def __iter__(self):
        return (f"{self.name}[{i}]" for i in range(self.n))


class NpyRows:
    """Rows of a C-ordered .npy file read on demand with plain file reads (not mmap: mapped pages would stay
    resident and count against the process)."""

    def __init__(self, path):
        self.path = str(path)
        with open(self.path, "rb") as f:
            version = np.lib.format.read_magic(f)
            shape, fortran, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                     else np.lib.format.read_array_header_2_0(f))
            self.offset = f.tell()
        if fortran or dtype.hasobject or not shape:
            raise ValueError("not a C-ordered numeric array with a batch axis")
        self.shape, self.dtype, self.ndim = tuple(shape), dtype, len(shape)
        self.row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        if os.path.getsize(self.path) < self.offset + self.row * shape[0]:
            raise ValueError("truncated")

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, slice):
            lo, hi, step = key.indices(self.shape[0])
            if step != 1:
                raise IndexError("only contiguous rows")
        else:
            lo = int(key) % self.shape[0]
            hi = lo + 1
        count = max(0, hi - lo)
        with open(self.path, "rb") as f:
            f.seek(self.offset + lo * self.row)
            data = np.fromfile(f, dtype=self.dtype, count=count * (self.row // self.dtype.itemsize))
        out = data.reshape((count,) + self.shape[1:])
        return out if isinstance(key, slice) else out[0]


class ArraySource(Source):
    """A .npy (memory-mapped) or .npz with a batch axis: one item per row; ids ``name[i]``."""

    kind = "arrays"

    def __init__(self, path, infos, pre):
        super().__init__(path, infos, pre)
        arrays = self._open()
        n = {len(a) for a in arrays.values()}
        if len(n) != 1:
            raise InputError(f"{path}: the arrays have different lengths {sorted(n)}; give one row per item in each")
        self.ids = RowIds(Path(path).name, n.pop())

    def fingerprint(self) -> str:
        h = hashlib.sha256(f"{self.kind}:{self.ids.name}:{len(self.ids)}".encode())
        for k, a in sorted(self._open().items()):
            h.update(f"{k}:{a.shape}:{a.dtype}".encode())
        return h.hexdigest()

    def _open(self) -> dict:
        arrays = getattr(self, "_arrays", None)
        if arrays is not None:
            return arrays
        path = Path(self.path)
        if is_kind(path, Kind.NPY):
            if len(self.infos) != 1:
                raise InputError(f"the model has {len(self.infos)} inputs; a .npy file holds one array; give a .npz "
                                 f"with arrays named {', '.join(i.name for i in self.infos)}")
            try:  # rows are read per shard, never the whole file
                arr = NpyRows(path)
            except Exception:  # pickles, broken or empty files: load_npy says what is wrong in one line
                arr = load_npy(path)
            arrays = {self.infos[0].name: arr}
        else:
            arrays = load_npz(path)  # a .npz cannot be memory-mapped: read once per process
            if len(self.infos) == 1 and len(arrays) == 1:
                arrays = {self.infos[0].name: next(iter(arrays.values()))}
            missing = [i.name for i in self.infos if i.name not in arrays]
            if missing:
                raise InputError(f"input {path} holds arrays {', '.join(sorted(arrays))} but the model's inputs are "
                                 f"{', '.join(i.name for i in self.infos)}; name one array per input")
            arrays = {i.name: arrays[i.name] for i in self.infos}
        for info in self.infos:
            a = arrays[info.name]
            if info.dims and a.ndim != len(info.dims):
                raise InputError(f"input {path} ({info.name}) has shape {'x'.join(map(str, a.shape))}; a dataset "
                                 f"array has a batch axis first and rank {len(info.dims)}")
        self._arrays = arrays
        return arrays

    def read_item(self, i: int) -> dict:
        return {k: np.asarray(a[i]) for k, a in self._open().items()}

    def read(self, lo, hi):
        arrays = self._open()
        ok, bad = [], []
        block = {k: np.asarray(a[lo:hi]) for k, a in arrays.items()}  # one read per shard
        for j, i in enumerate(range(lo, hi)):
            item = {k: a[j] for k, a in block.items()}
            try:
                _check_item(item, self.infos, self.ids[i])
                ok.append((i, item))
            except ITEM_ERRORS as exc:
                bad.append((i, _item_message(exc, self.ids[i])))
        return ok, bad


class ParquetSource(Source):
    """A Parquet file or dataset directory: one item per row; a column of arrays (lists, reshaped to the model's
    input) or of encoded images (binary). Ids ``name[row]``, or the ``id`` column when there is one."""

    kind = "parquet"

    def __init__(self, path, infos, pre, column: str | None = None):
        super().__init__(path, infos, pre)
        ds = self._open()
        names = ds.schema.names
        if len(infos) == 1:
            if column is None:
                data = [c for c in names if c != "id"]
                column = infos[0].name if infos[0].name in names else (data[0] if len(data) == 1 else None)
            if column is None or column not in names:
                raise InputError(f"Parquet source {path} has columns {', '.join(names)}; name the one to explain "
                                 "with --column")
            self.columns = {infos[0].name: column}
        else:
            missing = [i.name for i in infos if i.name not in names]
            if missing:
                raise InputError(f"Parquet source {path} has columns {', '.join(names)} but the model's inputs are "
                                 f"{', '.join(i.name for i in infos)}; give one column per input")
            self.columns = {i.name: i.name for i in infos}
        if "id" in names:
            self.ids = [str(v) for v in ds.to_table(columns=["id"]).column("id").to_pylist()]
        else:
            self.ids = RowIds(Path(path).name, ds.count_rows())

    def _open(self):
        ds = getattr(self, "_ds", None)
        if ds is None:
            try:
                import pyarrow.dataset as pads
            except ImportError:
                raise InputError("Parquet sources need pyarrow: pip install 'onnx-lrp[ray]' (or pip install pyarrow)") \
                    from None
            try:
                ds = self._ds = pads.dataset(self.path, format="parquet")
            except Exception as exc:  # pyarrow's own exception types
                raise InputError(f"{self.path} is not a readable Parquet dataset ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
        return ds

    def read_item(self, i):
        return self._rows(i, i + 1)[0]

    def _rows(self, lo, hi) -> list:
        table = self._open().take(list(range(lo, hi)), columns=sorted(set(self.columns.values())))
        cols = {name: table.column(col) for name, col in self.columns.items()}
        out = []
        for j in range(hi - lo):
            item = {}
            for info in self.infos:
                value = cols[info.name][j].as_py()
                item[info.name] = self._decode(value, info, self.ids[lo + j])
            out.append(item)
        return out

    def _decode(self, value, info, item):
        if isinstance(value, (bytes, bytearray)):
            x, _ = load_image(Path(item), image_layout(info), self.pre, data=bytes(value))
            return x
        a = np.asarray(value, dtype=np.dtype(info.dtype))
        dims = info.dims[1:] if info.dims else ()
        if a.ndim == 1 and dims and all(d is not None for d in dims) and a.size == int(np.prod(dims)):
            a = a.reshape(dims)
        return a

    def read(self, lo, hi):
        ok, bad = [], []
        try:
            rows = self._rows(lo, hi)
        except ITEM_ERRORS:
            rows = None  # one bad row: read them one by one to name it
        for j, i in enumerate(range(lo, hi)):
            try:
                item = rows[j] if rows is not None else self.read_item(i)
                _check_item(item, self.infos, self.ids[i])
                ok.append((i, item))
            except ITEM_ERRORS as exc:
                bad.append((i, _item_message(exc, self.ids[i])))
        return ok, bad


def list_files(root) -> list[str]:
    """The files below ``root`` as sorted relative POSIX paths; hidden entries are skipped and symbolic links to
    directories not followed (one scandir per directory: a million files cost seconds, not minutes)."""
    out, stack = [], [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel)) as entries:
            for e in entries:
                if e.name.startswith("."):
                    continue
                r = f"{rel}/{e.name}" if rel else e.name
                if e.is_dir(follow_symlinks=False):
                    stack.append(r)
                elif e.is_file():
                    out.append(r)
    out.sort()
    return out


def open_source(source, infos, pre: Preprocess = Preprocess(), column: str | None = None) -> Source:
    """A directory (searched recursively, sorted), a glob, a .npy/.npz with a batch axis, a Parquet file or
    directory, or one image."""
    text = str(source)
    path = Path(text)
    if not path.exists() and any(c in text for c in GLOB_CHARS):
        files = sorted(Path(p) for p in globlib.glob(text, recursive=True) if Path(p).is_file() and is_kind(p))
        if not files:
            raise InputError(f"the pattern {text!r} matches no image, .npy or .npz file")
        root = Path(os.path.commonpath([str(f.parent) for f in files]))
        return FileSource(text, files, root, infos, pre)
    if not path.exists():
        raise InputError(f"source {path} not found; give a directory, a glob, a .npy/.npz or a Parquet dataset")
    if path.is_dir():
        rel = list_files(path)
        if rel and all(is_kind(r, Kind.PARQUET) for r in rel):
            return ParquetSource(path, infos, pre, column)
        rel = [r for r in rel if is_kind(r)]
        if not rel:
            raise InputError(f"directory {path} holds no image, .npy, .npz or .parquet files")
        return FileSource(path, [os.path.join(path, r) for r in rel], path, infos, pre, ids=rel)
    kind = kind_of(path)
    if kind is Kind.PARQUET:
        return ParquetSource(path, infos, pre, column)
    if kind in FILE_KINDS:  # a file of rows (.npy/.npz), or one item (an image)
        return ArraySource(path, infos, pre) if KINDS[kind].rows else FileSource(path, [path], path.parent, infos, pre)
    suffix = path.suffix.lower()
    raise InputError(f"source {path} has an unknown type {suffix or '(no suffix)'}; give a directory, a glob, a "
                     ".npy/.npz with a batch axis or a Parquet dataset")


__all__ = ["Source", "FileSource", "ArraySource", "ParquetSource", "ITEM_ERRORS", "list_files", "open_source"]
