"""Relevance maximisation (RelMax, zennit-crp's ``Maximization``): per channel of a layer, the dataset items whose
relevance there is largest, kept over batches and over resumable shards of a dataset source, and the receptive-field
heatmaps of the top items."""
from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import InputError
from ..core.files import atomic_write
from ..core.interface import RELEVANCE_PREFIX
from ..core.validate import check_npz, expect, expect_list_of, read_json
from .running import channel_axis_of, run_seeded, shares_of, upper_pass


SAMPLES = 40  # RelMax reference samples per channel (zennit-crp's Maximization.SAMPLE_SIZE)


class RelMax:
    """Relevance maximisation (zennit-crp's ``Maximization("relevance", "sum", abs_norm=True)``): per channel of
    ``layer``, the ``samples`` items whose relevance there, summed over the other axes and divided by the item's
    absolute sum over the channels, is largest; ``rf``: the position (flattened) of each one's largest relevance in
    that channel, the neuron whose receptive field :meth:`reference_heatmaps` shows."""

    def __init__(self, explainer, layer: str, samples: int = SAMPLES, channel_axis: int = 1, abs_norm: bool = True):
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise InputError(f"samples must be a positive int, not {samples!r}")
        self.ex, self.layer, self.samples = explainer, layer, samples
        self.channel_axis, self.abs_norm = channel_axis, abs_norm
        self.indices = self.scores = self.rf = None  # samples x C, best first

    def update(self, x, targets=None, ids=None) -> None:
        """Add a batch (``targets``: one class per item, None: arg-max; ``ids``: the items' indices in the
        dataset, default consecutive after those seen)."""
        up = upper_pass(self.ex, x, targets, self.layer)
        rel = up["relevance"]
        axis = channel_axis_of(self.channel_axis, rel.ndim)
        flat = np.moveaxis(rel.astype(np.float64), axis, 1).reshape(rel.shape[0], rel.shape[axis], -1)
        score = shares_of(rel, axis, self.abs_norm)
        ids = np.arange(len(rel)) if ids is None else np.asarray(ids, dtype=np.int64)
        if ids.shape != (len(rel),):
            raise InputError(f"{ids.size} ids for a batch of {len(rel)}")
        self.merge(np.repeat(ids[:, None], rel.shape[axis], 1), score, np.argmax(flat, -1))

    def merge(self, indices, scores, rf) -> None:
        """Merge candidates (rows: samples, columns: channels) into the kept top ``samples`` per channel."""
        if self.indices is not None:
            indices = np.concatenate([indices, self.indices])
            scores = np.concatenate([scores, self.scores])
            rf = np.concatenate([rf, self.rf])
        order = np.argsort(-scores, axis=0, kind="stable")[:self.samples]
        self.indices = np.take_along_axis(indices, order, 0).astype(np.int64)
        self.scores = np.take_along_axis(scores, order, 0)
        self.rf = np.take_along_axis(rf, order, 0).astype(np.int64)

    def arrays(self) -> dict:
        return {"indices": self.indices, "scores": self.scores, "rf": self.rf}

    def reference_heatmaps(self, data, channels, count: int = 8, batch_size: int = 16) -> dict:
        """Per channel, the receptive-field heatmaps (count x the input item's shape) of its top ``count``
        samples: the relevance below ``layer`` started from the activation at the sample's ``rf`` neuron only
        (zennit-crp's ``ChannelConcept.mask_rf`` with ``start_layer``). ``data``: an array of the items, or a
        dataset source (``read_item``)."""
        if self.indices is None:
            raise InputError("RelMax has seen no data: call update (or relmax build) first")
        out = {}
        for c in channels:
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= c < self.indices.shape[1]:
                raise InputError(f"channel {c!r} out of range: {self.layer!r} has {self.indices.shape[1]} channels")
            ids = self.indices[:count, c]
            xs = np.stack([_item(data, int(i)) for i in ids])
            up = upper_pass(self.ex, xs, None, self.layer)
            act = up["activation"]
            axis = channel_axis_of(self.channel_axis, act.ndim)
            moved = np.moveaxis(act, axis, 1)
            seed = np.zeros_like(moved).reshape(len(ids), moved.shape[1], -1)
            rows = np.arange(len(ids))
            seed[rows, c, self.rf[:count, c]] = moved.reshape(seed.shape)[rows, c, self.rf[:count, c]]
            seed = np.moveaxis(seed.reshape(moved.shape), 1, axis)
            res = run_seeded(self.ex, self.layer, up["x"], up["input"], seed, (), batch_size)
            out[int(c)] = res[RELEVANCE_PREFIX + up["input"]]
        return out


def _item(data, i: int) -> np.ndarray:
    if hasattr(data, "read_item"):
        arrays = data.read_item(i)
        return next(iter(arrays.values()))
    return np.asarray(data[i])


@dataclass(frozen=True)
class Scan:
    """How :func:`relmax_build` scans a source (its keywords), checked once when made."""

    samples: int = SAMPLES  # reference samples kept per channel
    shard_size: int = 256  # items per shard (the unit of resuming)
    batch_size: int = 32  # items per run
    overwrite: bool = False  # replace a result made with other settings

    def __post_init__(self):
        for name in ("samples", "shard_size", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InputError(f"{name} must be a positive int, not {v!r}")


def relmax_build(explainer, source, out_dir, layer: str, targets=None, log=None, **scan) -> RelMax:
    """RelMax over a dataset source (onnx_lrp.dataset.open_source), resumable: each shard's top candidates are
    written (atomically) to ``out_dir/relmax-shards/part-NNNNN.npz`` and listed in ``out_dir/relmax.json``; a
    rerun skips the shards done. The merged result: ``out_dir/relmax.npz`` (indices, scores, rf per channel, and
    the source ids of the items). ``scan``: :class:`Scan`'s fields (samples, shard_size, batch_size, overwrite)."""
    scan = Scan(**scan)
    samples, shard_size, batch_size = scan.samples, scan.shard_size, scan.batch_size
    out = Path(out_dir)
    (out / "relmax-shards").mkdir(parents=True, exist_ok=True)
    rmodel = explainer.relevance_model
    from ..load import parts_sha256  # the loader (onnx): only when a scan starts

    setup = dict(layer=layer, samples=samples, shard_size=shard_size, items=len(source),
                 source=source.fingerprint(), composite=explainer.composite_name,
                 model=parts_sha256(rmodel.model_bytes, rmodel.model_folder, rmodel.model_arrays))
    manifest = _manifest(out / "relmax.json", setup, scan.overwrite)
    labels = None if targets is None else np.asarray(targets)
    if labels is not None and labels.shape != (len(source),):
        raise InputError(f"{labels.size} targets for {len(source)} items; give one class per item")
    rm = RelMax(explainer, layer, samples)
    for k, lo in enumerate(range(0, len(source), shard_size)):
        hi = min(len(source), lo + shard_size)
        path = out / "relmax-shards" / f"part-{k:05d}.npz"
        rec = manifest["shards"].get(str(k))
        if rec and path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == rec["sha256"]:
            part = np.load(path)
            if part["indices"].size:
                rm.merge(part["indices"], part["scores"], part["rf"])
            continue
        shard, bad = _shard(explainer, source, layer, samples, lo, hi, labels, batch_size)
        arrays = shard.arrays() if shard.indices is not None else {
            "indices": np.zeros((0, 0), np.int64), "scores": np.zeros((0, 0)), "rf": np.zeros((0, 0), np.int64)}
        data = _npz(arrays)
        atomic_write(path, data, sync_dir=False)
        manifest["shards"][str(k)] = {"items": [lo, hi], "sha256": hashlib.sha256(data).hexdigest(),
                                      "failed": [{"item": source.ids[i], "error": m} for i, m in bad]}
        atomic_write(out / "relmax.json", json.dumps(manifest, indent=1).encode())
        if shard.indices is not None:
            rm.merge(shard.indices, shard.scores, shard.rf)
        if log:
            log(f"shard {k}: items {lo}..{hi - 1} ({len(bad)} failed)")
    if rm.indices is None:
        raise InputError("no item of the source could be read; see relmax.json for the errors")
    atomic_write(out / "relmax.npz", _npz(dict(rm.arrays(), ids=np.array(
        [str(source.ids[i]) for i in rm.indices.reshape(-1)]).reshape(rm.indices.shape), layer=np.array(layer))))
    return rm


def _manifest(path: Path, setup: dict, overwrite: bool) -> dict:
    """The manifest of an earlier run with the same setup (its shards are resumed), else a new one; an earlier run
    with another setup is refused unless ``overwrite``."""
    manifest = {"setup": setup, "shards": {}}
    if path.exists():
        old = _read_manifest(path, overwrite)
        if old is None:  # unreadable, and --overwrite: start again
            return manifest
        if old.get("setup") != setup and not overwrite:
            diff = ", ".join(k for k in setup if old.get("setup", {}).get(k) != setup[k])
            raise InputError(f"{path} was written for another run (differs in: {diff}); use another "
                             "--out-dir or --overwrite")
        if old.get("setup") == setup:
            manifest = old
    return manifest


def _read_manifest(path: Path, overwrite: bool) -> dict | None:
    """An earlier run's relmax.json, every field checked (None: unreadable but ``overwrite`` starts again)."""
    hint = "use another --out-dir, or --overwrite to start again"
    try:
        old = expect(read_json(path), dict, f"{path}", hint)
        expect(old.get("setup"), dict, f"{path}: setup", hint)
        for k, rec in expect(old.get("shards"), dict, f"{path}: shards", hint).items():
            where = f"{path}: shards.{k}"
            if not k.isdigit():
                raise InputError(f"{where}: a shard's key is its index; {hint}")
            expect(rec, dict, where, hint)
            expect(rec.get("sha256"), str, f"{where}.sha256", hint)
            items = expect_list_of(rec.get("items"), int, f"{where}.items", hint)
            if len(items) != 2:
                raise InputError(f"{where}.items has {len(items)} entries; give [first, end]; {hint}")
            expect_list_of(rec.get("failed", []), dict, f"{where}.failed", hint)
    except InputError:
        if overwrite:
            return None
        raise
    return old


def _shard(explainer, source, layer: str, samples: int, lo: int, hi: int, labels, batch_size: int):
    """(the RelMax of the items ``lo`` to ``hi`` of ``source``, the items that could not be read)."""
    shard = RelMax(explainer, layer, samples)
    ok, bad = source.read(lo, hi)
    for b in range(0, len(ok), batch_size):
        chunk = ok[b:b + batch_size]
        ids = np.array([i for i, _ in chunk])
        xs = np.stack([next(iter(a.values())) for _, a in chunk])
        shard.update(xs, None if labels is None else labels[ids], ids)
    return shard, bad


def _npz(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def relmax_load(explainer, out_dir) -> RelMax:
    """The RelMax result a :func:`relmax_build` wrote."""
    path = Path(out_dir) / "relmax.npz"
    if not path.exists():
        raise InputError(f"{path} not found; run `onnx-lrp relmax build` with this --out-dir first")
    check_npz(path, str(path))
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path} is not a readable RelMax result ({type(exc).__name__}); run `onnx-lrp relmax "
                         "build --overwrite` with this --out-dir again") from None
    missing = [k for k in ("indices", "scores", "rf", "layer") if k not in data]
    if missing:
        raise InputError(f"{path} lacks {', '.join(missing)}; run `onnx-lrp relmax build --overwrite` again")
    ind, sc, rf, layer = data["indices"], data["scores"], data["rf"], data["layer"]
    if (ind.ndim != 2 or ind.dtype.kind not in "iu" or rf.dtype.kind not in "iu" or sc.dtype.kind != "f"
            or sc.shape != ind.shape or rf.shape != ind.shape or not len(ind) or layer.dtype.kind != "U"
            or layer.ndim != 0 or (ind.size and ind.min() < 0)):
        raise InputError(f"{path} is not a consistent RelMax result (indices, scores, rf: samples x channels of "
                         "the same shape; layer: a name); run `onnx-lrp relmax build --overwrite` again")
    rm = RelMax(explainer, str(layer), samples=len(ind))
    rm.indices, rm.scores, rm.rf = ind, sc, rf
    return rm


__all__ = ["Scan", "SAMPLES", "RelMax", "relmax_build", "relmax_load"]
