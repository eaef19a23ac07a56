"""Shards: shard ``k`` holds the items ``[k * shard_size, (k + 1) * shard_size)`` of the sorted source; one shard is
read, explained in batches of equal shapes (an item that fails is recorded, the others go on) and written as one
``shards/part-NNNNN.npz`` atomically (temporary file, fsync, rename). The task both engines run."""
from __future__ import annotations

import collections
import hashlib
import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import OutputError
from ..core.files import atomic_write
from ..run.batches import explain_chunks, stacked
from .sources import Source


FORMAT = 1
MANIFEST = "manifest.json"
ERRORS = "errors.jsonl"
SHARD_DIR = "shards"


@dataclass(frozen=True)
class Span:
    """One shard's place: the items ``[lo, hi)`` of ``source`` (sorted), shard number ``index``."""
    source: Source
    index: int
    lo: int
    hi: int


@dataclass(frozen=True)
class ShardJob:
    """How a shard is explained: batches of ``batch_size``, ``targets`` / ``start`` as the Explainer takes them,
    ``readers`` threads decoding ahead (> 1: a Ray actor with several CPUs, e.g. beside a GPU)."""
    batch_size: int
    targets: object = None
    start: str | None = None
    readers: int = 1


def shard_name(index: int) -> str:
    return f"part-{index:05d}.npz"


@dataclass
class ShardResult:
    index: int
    lo: int
    hi: int
    items: list
    arrays: dict  # relevance (/<input>), targets, outputs, positions, relevance_at/<name>
    failed: list = field(default_factory=list)  # [{"item", "error"}]


def explain_items(ex, ok: list, batch_size: int, targets=None, start: str | None = None):
    """Explain (index, arrays) items in batches: ([(indices, result arrays with a batch axis)], [(index, message)]).

    Consecutive items of equal shapes are stacked (:func:`onnx_lrp.run.batches.stacked`); a batch that fails (e.g.
    one item onnxruntime cannot run) is retried item by item, so one bad item costs only itself; an item whose
    relevance is not finite is a failure, never returned."""
    done, bad = [], []
    for chunk in explain_chunks(ex, stacked(ok, batch_size), target=targets, start=start,
                                failed=lambda i, message: bad.append((i, message))):
        idx, arrays = chunk.items, _arrays(ex, chunk.result)
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


def _arrays(ex, res) -> dict:
    """One explained batch as shard arrays: relevance (/<input>), targets, outputs, forward, positions,
    relevance_at/<name>."""
    rel = res.relevance if isinstance(res.relevance, dict) else {None: res.relevance}
    arrays = {("relevance" if k is None else f"relevance/{k}"): v for k, v in rel.items()}
    arrays["targets"] = np.asarray(res.target, np.int64).reshape(-1)
    arrays["outputs"] = res.outputs[ex.explained_output]
    if res.forward is not None and res.forward is not res.outputs:  # quantized / float16: the explained forward
        arrays["forward"] = res.forward[ex.explained_output]
    if res.position is not None:
        arrays["positions"] = np.asarray(res.position, np.int64).reshape(-1)
    arrays.update({f"relevance_at/{k}": v for k, v in res.relevance_at.items()})
    return arrays


def explain_shard(ex, span: Span, job: ShardJob) -> ShardResult:
    """Read, decode and explain one shard. With ``job.readers`` > 1 (a Ray actor with several CPUs, e.g. beside a
    GPU) threads decode the next batches of the shard while onnxruntime runs the current one."""
    source, lo, hi = span.source, span.lo, span.hi
    batch_size, targets, start, readers = job.batch_size, job.targets, job.start, job.readers
    if readers <= 1:
        ok, bad = source.read(lo, hi)
        return compute_shard(ex, span, ok, bad, job)
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
    return _assemble(span, done, bad)


def compute_shard(ex, span: Span, ok, bad, job: ShardJob) -> ShardResult:
    """Explain one shard's items already read (``ok``; ``bad``: the items that failed to read)."""
    done, bad2 = explain_items(ex, ok, job.batch_size, job.targets, job.start)
    return _assemble(span, done, bad + bad2)


def _assemble(span: Span, done, bad) -> ShardResult:
    """One shard's result from explain_items' chunks (disjoint, each in item order): concatenated in item order."""
    bad = sorted(bad)
    done.sort(key=lambda t: t[0][0])
    keys = list(done[0][1]) if done else []
    arrays = {k: done[0][1][k] if len(done) == 1 else np.concatenate([d[k] for _, d in done]) for k in keys}
    if not done:
        arrays = {"relevance": np.zeros((0,), np.float32), "targets": np.zeros((0,), np.int64),
                  "outputs": np.zeros((0,), np.float32)}
    source = span.source
    return ShardResult(span.index, span.lo, span.hi, [source.ids[i] for idx, _ in done for i in idx], arrays,
                       [dict(item=source.ids[i], error=msg) for i, msg in bad])


def write_shard(out_dir: Path, res: ShardResult) -> dict:
    """Write one shard (atomically) and return its manifest record."""
    buf = io.BytesIO()
    arrays = dict(res.arrays)
    arrays["items"] = np.array(res.items, dtype=str) if res.items else np.zeros((0,), dtype="<U1")
    np.savez(buf, **arrays)
    data = buf.getbuffer()  # no copy
    name = shard_name(res.index)
    atomic_write(Path(out_dir) / SHARD_DIR / name, data, sync_dir=False)
    return dict(index=res.index, file=f"{SHARD_DIR}/{name}", items=[res.lo, res.hi], explained=len(res.items),
                sha256=hashlib.sha256(data).hexdigest(), failed=res.failed)


def check_out_dir(out_dir, source: dict) -> None:
    """Refuse an OUT inside the source folder of a "files" source (a directory is searched recursively, and so is a
    glob with ``**``): its shards would be read back as items. ``source``: the manifest header's source record."""
    if source.get("kind") != "files":
        return
    text = str(source.get("path", ""))
    parts = Path(text).parts
    wild = next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), None)
    if wild is not None and "**" not in text:  # a glob of fixed depth: OUT/shards/part-*.npz lie deeper
        return
    root = Path(text) if wild is None else Path(*parts[:wild]) if wild else Path(".")
    if not root.is_dir():
        return
    real_out, real_root = os.path.realpath(out_dir), os.path.realpath(root)
    if real_out == real_root or real_out.startswith(real_root.rstrip(os.sep) + os.sep):
        raise OutputError(f"--out-dir {out_dir} is inside the source {text}: its shards would be read as items; "
                          "choose a folder outside the source")


__all__ = ["ShardJob", "ShardResult", "Span", "check_out_dir", "explain_items", "explain_shard", "compute_shard", "write_shard", "shard_name", "FORMAT", "MANIFEST", "ERRORS", "SHARD_DIR"]
