"""Explain a whole dataset: sources, deterministic shards, a streaming local engine and a resumable output.

``explain_dataset(model, source, out_dir, engine="local")`` writes ``out_dir``:

* ``shards/part-NNNNN.npz``: per shard ``items`` (source id of each explained item), ``relevance`` (or
  ``relevance/<input>`` for several float inputs), ``targets``, ``outputs`` (the explained output);
* ``manifest.json``: model SHA-256, composite and parameters, onnx-lrp version, engine, item count, the shards done
  (item range, checksum, failed items);
* ``errors.jsonl``: one line per item that could not be read or explained (``{"item": id, "error": message}``).

Shard ``k`` holds the items ``[k * shard_size, (k + 1) * shard_size)`` of the sorted source, so a rerun of the same
command finds the same shards: it skips those the manifest lists (each file written to a temporary file, fsync'ed,
renamed, then added to the manifest) and explains only the rest. A manifest written with another model, composite,
parameters or source refuses unless ``overwrite=True``.

The local engine overlaps reading/decoding (a thread pool, ``workers`` shards ahead) and writing (one thread) with the
onnxruntime run in the calling thread (onnxruntime releases the GIL); at most ``workers + 4`` shards are in memory, so
the peak does not grow with the dataset. The Ray engine (:mod:`onnx_lrp.ray`) runs the same shard task on Ray Data
actors.
"""
from __future__ import annotations

import collections
import glob as globlib
import hashlib
import io
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import InputError, LrpError, OutputError
from .inputs import (ARRAY_SUFFIXES, IMAGE_SUFFIXES, Preprocess, decode_pixels, image_layout, input_infos, load_image,
                     load_npy, load_npz, normalise_pixels)

FORMAT = 1
MANIFEST = "manifest.json"
ERRORS = "errors.jsonl"
SHARD_DIR = "shards"
DEFAULT_SHARD_SIZE = 256
ENGINES = ("local", "ray")
GLOB_CHARS = "*?["


def shard_name(index: int) -> str:
    return f"part-{index:05d}.npz"


# ---------------------------------------------------------------------------------------------- sources
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
        as :func:`onnx_lrp.inputs.load_image`); other files are read as by :meth:`read_item`."""
        ok, bad, images = [], [], []
        for i in range(lo, hi):
            try:
                if self.files[i].lower().endswith(IMAGE_SUFFIXES):
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
        suffix = path.suffix.lower()
        if suffix in IMAGE_SUFFIXES:
            info = self._single("an image")
            x, _ = load_image(path, image_layout(info), self.pre)
            return {info.name: x}
        if suffix == ".npy":
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
        if path.suffix.lower() == ".npy":
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
        files = sorted(Path(p) for p in globlib.glob(text, recursive=True) if Path(p).is_file()
                       and Path(p).suffix.lower() in IMAGE_SUFFIXES + ARRAY_SUFFIXES)
        if not files:
            raise InputError(f"the pattern {text!r} matches no image, .npy or .npz file")
        root = Path(os.path.commonpath([str(f.parent) for f in files]))
        return FileSource(text, files, root, infos, pre)
    if not path.exists():
        raise InputError(f"source {path} not found; give a directory, a glob, a .npy/.npz or a Parquet dataset")
    if path.is_dir():
        rel = list_files(path)
        if rel and all(r.lower().endswith(".parquet") for r in rel):
            return ParquetSource(path, infos, pre, column)
        rel = [r for r in rel if r.lower().endswith(IMAGE_SUFFIXES + ARRAY_SUFFIXES)]
        if not rel:
            raise InputError(f"directory {path} holds no image, .npy, .npz or .parquet files")
        return FileSource(path, [os.path.join(path, r) for r in rel], path, infos, pre, ids=rel)
    suffix = path.suffix.lower()
    if suffix in ARRAY_SUFFIXES:
        return ArraySource(path, infos, pre)
    if suffix == ".parquet":
        return ParquetSource(path, infos, pre, column)
    if suffix in IMAGE_SUFFIXES:
        return FileSource(path, [path], path.parent, infos, pre)
    raise InputError(f"source {path} has an unknown type {suffix or '(no suffix)'}; give a directory, a glob, a "
                     ".npy/.npz with a batch axis or a Parquet dataset")


# ---------------------------------------------------------------------------------------------- explaining a shard
@dataclass
class ShardResult:
    index: int
    lo: int
    hi: int
    items: list
    arrays: dict  # relevance (/<input>), targets, outputs, positions, relevance_at/<name>
    failed: list = field(default_factory=list)  # [{"item", "error"}]


def _batches(ok: list, batch_size: int):
    """Consecutive runs of at most batch_size items with equal shapes (stackable)."""
    run = []
    for i, arrays in ok:
        key = tuple((k, a.shape, a.dtype.str) for k, a in arrays.items())
        if run and (len(run) >= batch_size or run[0][0] != key):
            yield [r[1] for r in run]
            run = []
        run.append((key, (i, arrays)))
    if run:
        yield [r[1] for r in run]


def _target_for(targets, idx: list[int]):
    if targets is None or isinstance(targets, (int, np.integer)):
        return targets
    return np.asarray([targets[i] for i in idx], np.int64)


def explain_items(ex, ok: list, batch_size: int, targets=None, start: str | None = None):
    """Explain (index, arrays) items in batches: ([(indices, result arrays with a batch axis)], [(index, message)]).

    A batch that fails (e.g. one item onnxruntime cannot run) is retried item by item, so one bad item costs only
    itself; an item whose relevance is not finite is a failure, never returned."""
    done, bad = [], []
    for batch in _batches(ok, batch_size):
        idx = [i for i, _ in batch]
        feeds = {k: np.stack([a[k] for _, a in batch]) for k in batch[0][1]}
        try:
            res = ex.explain(feeds, target=_target_for(targets, idx), start=start)
        except LrpError as exc:
            if len(batch) == 1:
                bad.append((idx[0], str(exc)))
                continue
            d, b = explain_items(ex, batch, 1, targets, start)
            done += d
            bad += b
            continue
        rel = res.relevance if isinstance(res.relevance, dict) else {None: res.relevance}
        arrays = {("relevance" if k is None else f"relevance/{k}"): v for k, v in rel.items()}
        arrays["targets"] = np.asarray(res.target, np.int64).reshape(-1)
        arrays["outputs"] = res.outputs[ex.explained_output]
        if res.position is not None:
            arrays["positions"] = np.asarray(res.position, np.int64).reshape(-1)
        arrays.update({f"relevance_at/{k}": v for k, v in res.relevance_at.items()})
        finite = {k: np.isfinite(v.reshape(len(idx), -1)).all(axis=1) for k, v in arrays.items()
                  if k.startswith("relevance")}
        keep = np.logical_and.reduce(list(finite.values())) if finite else np.ones(len(idx), bool)
        for j in np.flatnonzero(~keep):
            bad_keys = [k for k, f in finite.items() if not f[j]]
            bad.append((idx[j], f"the relevance ({', '.join(bad_keys)}) is not finite (NaN or Inf); try a larger "
                                "--epsilon or another composite"))
        if keep.all():
            done.append((idx, arrays))
        elif keep.any():
            done.append(([i for i, k in zip(idx, keep) if k], {k: v[keep] for k, v in arrays.items()}))
    return done, bad


def explain_shard(ex, source: Source, index: int, lo: int, hi: int, batch_size: int, targets=None,
                  start: str | None = None, readers: int = 1) -> ShardResult:
    """Read, decode and explain one shard. With ``readers`` > 1 (a Ray actor with several CPUs, e.g. beside a GPU)
    threads decode the next batches of the shard while onnxruntime runs the current one."""
    if readers <= 1:
        ok, bad = source.read(lo, hi)
        return compute_shard(ex, source, index, lo, hi, ok, bad, batch_size, targets, start)
    chunks = iter([(a, min(hi, a + batch_size)) for a in range(lo, hi, batch_size)])
    done, bad = [], []
    with ThreadPoolExecutor(readers, thread_name_prefix="lrp-read") as pool:
        pending = collections.deque(pool.submit(source.read, *c) for c in
                                    [c for _, c in zip(range(readers + 1), chunks)])
        while pending:
            ok_c, bad_c = pending.popleft().result()
            nxt = next(chunks, None)
            if nxt is not None:
                pending.append(pool.submit(source.read, *nxt))
            d, b = explain_items(ex, ok_c, batch_size, targets, start)
            done += d
            bad += bad_c + b
    return _assemble(source, index, lo, hi, done, bad)


def compute_shard(ex, source, index, lo, hi, ok, bad, batch_size, targets=None, start=None) -> ShardResult:
    done, bad2 = explain_items(ex, ok, batch_size, targets, start)
    return _assemble(source, index, lo, hi, done, bad + bad2)


def _assemble(source, index, lo, hi, done, bad) -> ShardResult:
    """One shard's result from explain_items' chunks (disjoint, each in item order): concatenated in item order."""
    bad = sorted(bad)
    done.sort(key=lambda t: t[0][0])
    keys = list(done[0][1]) if done else []
    arrays = {k: done[0][1][k] if len(done) == 1 else np.concatenate([d[k] for _, d in done]) for k in keys}
    if not done:
        arrays = {"relevance": np.zeros((0,), np.float32), "targets": np.zeros((0,), np.int64),
                  "outputs": np.zeros((0,), np.float32)}
    return ShardResult(index, lo, hi, [source.ids[i] for idx, _ in done for i in idx], arrays,
                       [dict(item=source.ids[i], error=msg) for i, msg in bad])


# ---------------------------------------------------------------------------------------------- writing
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, sync_dir: bool = True) -> None:
    """Write to a temporary file beside ``path``, fsync, rename: ``path`` is either absent, old, or whole.

    ``sync_dir`` also makes the rename durable at once (shards skip it: the manifest lists a shard only with its
    checksum, and a rerun redoes a listed shard whose file is missing or differs)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync_dir:
        _fsync_dir(path.parent)


def write_shard(out_dir: Path, res: ShardResult) -> dict:
    """Write one shard (atomically) and return its manifest record."""
    buf = io.BytesIO()
    arrays = dict(res.arrays)
    arrays["items"] = np.array(res.items, dtype=str) if res.items else np.zeros((0,), dtype="<U1")
    np.savez(buf, **arrays)
    data = buf.getbuffer()  # no copy
    name = shard_name(res.index)
    _test_hook("ONNX_LRP_TEST_SLEEP_PER_SHARD")
    atomic_write(Path(out_dir) / SHARD_DIR / name, data, sync_dir=False)
    return dict(index=res.index, file=f"{SHARD_DIR}/{name}", items=[res.lo, res.hi], explained=len(res.items),
                sha256=hashlib.sha256(data).hexdigest(), failed=res.failed)


def _test_hook(var: str) -> None:
    """Tests only: sleep this many seconds per shard, so a run can be killed half way."""
    v = os.environ.get(var)
    if v:
        time.sleep(float(v))


def sha256_bytes_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Output:
    """OUT: the manifest (one JSON file, rewritten atomically after each shard) and errors.jsonl (from it)."""

    def __init__(self, out_dir, header: dict, shard_size: int, overwrite: bool):
        self.dir = Path(out_dir)
        self.header = header
        self.shard_size = shard_size
        self.lock = threading.Lock()
        if self.dir.exists() and not self.dir.is_dir():
            raise OutputError(f"--out-dir {self.dir} is a file; give a directory")
        try:
            (self.dir / SHARD_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create {self.dir}: {exc.strerror or exc}; choose a writable directory") \
                from None
        if not os.access(self.dir, os.W_OK):
            raise OutputError(f"--out-dir {self.dir} is not writable; choose another directory")
        self.done: dict[int, dict] = {}
        old = None if overwrite else self._read()
        if old is not None:
            diff = [k for k in MATCH_KEYS if old.get(k) != header.get(k)]
            if diff:
                raise InputError(f"--out-dir {self.dir} holds a run with another {', '.join(diff)} "
                                 f"({MANIFEST} does not match this command); use another --out-dir, or --overwrite "
                                 "to discard it")
            for rec in old.get("shards", []):  # a shard counts as done only when its file is whole
                p = self.dir / rec["file"]
                if p.is_file() and sha256_bytes_of(p) == rec["sha256"]:
                    self.done[int(rec["index"])] = rec
        stale = [*(self.dir / SHARD_DIR).glob(".part-*.tmp"), *self.dir.glob(f".{MANIFEST}.*.tmp")]
        if overwrite:
            stale += [self.dir / MANIFEST, self.dir / ERRORS, *(self.dir / SHARD_DIR).glob("part-*.npz")]
        for p in stale:  # temporary files of a killed run, never visible under the shard names
            if p.exists():
                p.unlink()
        self.resumed = len(self.done)
        self.saved_at = -float("inf")
        self.first_at = None  # perf_counter when this run's first shard was recorded

    def _read(self):
        p = self.dir / MANIFEST
        if not p.exists():
            return None
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{p} is not a readable manifest ({exc}); use --overwrite to start again") from None

    def add(self, rec: dict) -> None:
        """Record a written shard; the manifest is rewritten at most every MANIFEST_EVERY_S seconds (and at the
        end), so its cost stays small for many shards: a killed run redoes at most that much work."""
        with self.lock:
            self.done[int(rec["index"])] = rec
            if self.first_at is None:
                self.first_at = time.perf_counter()
            now = time.monotonic()
            if now - self.saved_at >= MANIFEST_EVERY_S:
                self.save()
                self.saved_at = now

    def failed(self) -> list:
        return [f for i in sorted(self.done) for f in self.done[i]["failed"]]

    def manifest(self, complete: bool = False) -> dict:
        shards = [self.done[i] for i in sorted(self.done)]
        return dict(self.header, shards=shards, failed=self.failed(), complete=complete,
                    explained=sum(s["explained"] for s in shards))

    def save(self, complete: bool = False) -> None:
        # compact JSON: the C encoder, no per-entry chunks (the manifest is rewritten after every shard)
        atomic_write(self.dir / MANIFEST, (json.dumps(self.manifest(complete), separators=(",", ":")) + "\n").encode())
        if complete:
            lines = "".join(json.dumps(f) + "\n" for f in self.failed())
            atomic_write(self.dir / ERRORS, lines.encode())


MANIFEST_EVERY_S = 1.0
MATCH_KEYS = ("format", "model_sha256", "composite", "parameters", "source", "shard_size", "item_count")


# ---------------------------------------------------------------------------------------------- progress
class Progress:
    """Items/s and ETA on stderr, at most once a second, and once at the end."""

    def __init__(self, total: int, enabled: bool, stream=None):
        self.total, self.enabled, self.stream = total, enabled, stream or sys.stderr
        self.count = 0
        self.t0 = self.last = time.perf_counter()

    def update(self, n: int, final: bool = False) -> None:
        self.count += n
        now = time.perf_counter()
        if not self.enabled or (not final and now - self.last < 1.0):
            return
        self.last = now
        rate = self.count / max(now - self.t0, 1e-9)
        left = (self.total - self.count) / rate if rate > 0 else float("inf")
        eta = time.strftime("%H:%M:%S", time.gmtime(left)) if np.isfinite(left) else "?"
        self.stream.write(f"onnx-lrp: {self.count}/{self.total} items ({100 * self.count / max(self.total, 1):.0f} "
                          f"%), {rate:.1f} items/s, ETA {eta}\n")
        self.stream.flush()


# ---------------------------------------------------------------------------------------------- engines
def run_local(ex, source: Source, todo: list[tuple[int, int, int]], out: Output, batch_size: int, workers: int,
              targets, start, progress: Progress) -> None:
    """Read ``workers`` shards ahead in a thread pool, explain in this thread, write in one writer thread."""
    workers = max(1, int(workers))
    pending_reads: collections.deque = collections.deque()
    pending_writes: collections.deque = collections.deque()
    shards = iter(todo)
    with ThreadPoolExecutor(workers, thread_name_prefix="lrp-read") as readers, \
            ThreadPoolExecutor(1, thread_name_prefix="lrp-write") as writer:
        def submit_read():
            nxt = next(shards, None)
            if nxt is not None:
                pending_reads.append((nxt, readers.submit(source.read, nxt[1], nxt[2])))

        def write(res):
            rec = write_shard(out.dir, res)
            out.add(rec)
            return res.hi - res.lo

        for _ in range(workers + 1):
            submit_read()
        try:
            while pending_reads:
                (index, lo, hi), fut = pending_reads.popleft()
                ok, bad = fut.result()
                submit_read()
                res = compute_shard(ex, source, index, lo, hi, ok, bad, batch_size, targets, start)
                while len(pending_writes) >= 2:  # bounded: at most two shards waiting to be written
                    progress.update(pending_writes.popleft().result())
                pending_writes.append(writer.submit(write, res))
            while pending_writes:
                progress.update(pending_writes.popleft().result())
        except BaseException:
            for _, fut in pending_reads:
                fut.cancel()
            for fut in pending_writes:
                fut.cancel()
            raise


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def explainer_payload(ex) -> dict:
    """What runs an Explainer's relevance model in another process without loading or rewriting the model again:
    plain data (see :meth:`onnx_lrp.runner.Runner.payload`)."""
    return ex.payload()


def explainer_from_payload(payload: dict, device: str | None = None, threads: int | None = None):
    """A :class:`onnx_lrp.runner.Runner` (``explain`` as the Explainer's) from :func:`explainer_payload`; imports
    neither onnx_ir nor onnx."""
    from .runner import Runner

    return Runner.from_payload(payload, device, threads)


# ---------------------------------------------------------------------------------------------- the API
def _composite_id(comp) -> dict:
    return dict(name=comp.name, sha256=hashlib.sha256(repr(comp).encode()).hexdigest())


def _json_target(targets):
    if targets is None:
        return "argmax"
    if isinstance(targets, (int, np.integer)):
        return int(targets)
    return hashlib.sha256(np.asarray(targets, np.int64).tobytes()).hexdigest()


def explain_dataset(model, source, out_dir, engine: str = "local", *, batch_size: int = 32,
                    shard_size: int = DEFAULT_SHARD_SIZE, workers: int | None = None, target=None,
                    ray_address: str | None = None, overwrite: bool = False, progress: bool = False,
                    size=None, mean=(0.0,), std=(1.0,), crop: bool = False, column: str | None = None,
                    explainer=None,
                    **explainer_options) -> dict:
    """Explain every item of ``source`` into ``out_dir`` (see the module docstring); returns the summary.

    ``explainer_options`` go to :class:`onnx_lrp.Explainer` (composite, device, output, start, relevance_at and rule
    parameters); ``size``/``mean``/``std`` preprocess images (as ``onnx-lrp explain``); ``target`` is None
    (arg-max), a class index, or one index per item. ``explainer`` reuses an Explainer built by the caller.
    A summary: item count, explained, failed, shards (written now / resumed), seconds, seconds until the first
    shard was written (the fixed start: Ray's actors, imports, sessions), items/s.
    """
    from . import __version__
    from .explainer import Explainer
    from .regression import params_to_json, sha256_file

    if engine not in ENGINES:
        raise InputError(f"engine {engine!r}: use local or ray")
    if int(batch_size) < 1 or int(shard_size) < 1:
        raise InputError("batch_size and shard_size must be >= 1")
    if workers is not None and int(workers) < 1:
        raise InputError("workers must be >= 1")
    if engine == "ray":
        from .ray import require_ray
        require_ray()
    ex = explainer or Explainer(model, **explainer_options)
    pre = Preprocess(tuple(size) if size is not None else None, tuple(np.atleast_1d(mean).tolist()),
                     tuple(np.atleast_1d(std).tolist()), crop=bool(crop))
    src = open_source(source, input_infos(ex.inputs), pre, column)
    n = len(src)
    if isinstance(target, str):
        target = None if target == "argmax" else InputError(f"target {target!r}: give argmax, an int or a list")
        if isinstance(target, Exception):
            raise target
    if target is not None and not isinstance(target, (int, np.integer)):
        target = np.asarray(target, np.int64).reshape(-1)
        if len(target) != n:
            raise InputError(f"{len(target)} targets for {n} items; give one, or one per item")
    start = explainer_options.get("start", ex.start)
    params = {k: v for k, v in explainer_options.items() if k not in ("composite", "device", "threads", "tf32")}
    header = dict(format=FORMAT, onnx_lrp_version=__version__, engine=engine, model=str(model),
                  model_sha256=sha256_file(model) if isinstance(model, (str, os.PathLike)) else
                  hashlib.sha256(ex.model_bytes).hexdigest(),
                  composite=_composite_id(ex.composite),
                  parameters=dict(params_to_json(params), target=_json_target(target), start=start,
                                  output=ex.explained_output, size=list(pre.size) if pre.size else None,
                                  mean=list(pre.mean), std=list(pre.std), crop=pre.crop, column=column),
                  source=dict(path=str(source), kind=src.kind, fingerprint=src.fingerprint()),
                  shard_size=int(shard_size), item_count=n, batch_size=int(batch_size))
    out = Output(out_dir, header, int(shard_size), overwrite)
    all_shards = [(k, lo, min(n, lo + shard_size)) for k, lo in enumerate(range(0, n, shard_size))]
    todo = [s for s in all_shards if s[0] not in out.done]
    prog = Progress(sum(hi - lo for _, lo, hi in todo), progress)
    t0 = time.perf_counter()
    try:
        if todo and engine == "local":
            run_local(ex, src, todo, out, int(batch_size), workers or min(4, cpu_cores()), target, start, prog)
        elif todo:
            from .ray import run_ray
            run_ray(ex, src, todo, out, int(batch_size), workers, target, start, prog, ray_address)
    except BaseException:
        out.save()  # keep what was written for the rerun (Ctrl-C, a lost Ray cluster, ...)
        raise
    seconds = time.perf_counter() - t0
    out.save(complete=True)
    prog.update(0, final=bool(todo) and progress)
    m = out.manifest(True)
    done_items = sum(hi - lo for _, lo, hi in todo)
    return dict(out_dir=str(out.dir), engine=engine, items=n, explained=m["explained"], failed=len(m["failed"]),
                shards=len(all_shards), shards_written=len(todo), shards_resumed=out.resumed,
                seconds=round(seconds, 3),
                first_shard_s=round(out.first_at - t0, 3) if out.first_at is not None else None,
                items_per_s=round(done_items / seconds, 2) if seconds > 0 and todo else None,
                manifest=str(out.dir / MANIFEST), errors=str(out.dir / ERRORS))


def read_shards(out_dir) -> dict:
    """All shards of a finished OUT concatenated in item order: {"items", "relevance", "targets", "outputs", ...}."""
    out_dir = Path(out_dir)
    manifest = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
    parts = collections.defaultdict(list)
    for rec in manifest["shards"]:
        with np.load(out_dir / rec["file"], allow_pickle=False) as z:
            for k in z.files:
                if len(z[k]):
                    parts[k].append(z[k])
    return {k: np.concatenate(v) for k, v in parts.items()}


def explain_arrays(ex, arrays: dict, targets=None, batch_size: int = 32, engine: str = "local",
                   workers: int | None = None, ray_address: str | None = None, progress=None):
    """(relevance by input, outputs by name, targets used) of in-memory arrays (``onnx-lrp check``'s snapshot
    inputs) on either engine."""
    if engine not in ENGINES:
        raise InputError(f"engine {engine!r}: use local or ray")
    if engine == "ray":
        from .ray import explain_arrays_ray
        return explain_arrays_ray(ex, arrays, targets, batch_size, workers, ray_address)
    from .regression import explain_all
    return explain_all(ex, arrays, targets, batch_size, progress=progress)


__all__ = ["explain_dataset", "explain_arrays", "open_source", "read_shards", "explain_items", "explainer_payload",
           "explainer_from_payload", "Source", "FileSource", "ArraySource", "ParquetSource"]
