"""Explaining many items in chunks of a batch size: the one loop of the command line, the regression checks and the
dataset engine.

Chunks are ``(items, feeds)``: the indices of the items and their inputs stacked on a batch axis. :func:`slices` cuts
a batch dict into consecutive chunks; :func:`stacked` groups single items (the dataset engine's, each without a
batch axis) into consecutive runs of equal shapes. :func:`explain_chunks` explains them in order (a per-item
target or position picked for each chunk's items; optionally a failing chunk retried item by item), and
:func:`merge` concatenates the explanations along the batch axis into one :class:`Explanation`;
:func:`explain_all` is both for a batch dict.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from ..core.errors import LrpError
from ..core.interface import FORWARD_PREFIX
from .explanation import Explanation


@dataclass
class Chunk:
    """One explained chunk: its items' indices (in order) and the explainer's result for them."""

    items: list
    result: Explanation


def slices(arrays: dict, batch_size: int) -> Iterator[tuple[list, dict]]:
    """Consecutive chunks ``[lo, hi)`` of at most ``batch_size`` items of a batch dict (arrays with a batch axis)."""
    n = next(iter(arrays.values())).shape[0]
    for lo in range(0, n, batch_size):
        hi = min(n, lo + batch_size)
        yield list(range(lo, hi)), {k: a[lo:hi] for k, a in arrays.items()}


def stacked(items: list, batch_size: int) -> Iterator[tuple[list, dict]]:
    """Consecutive runs of at most ``batch_size`` single items ``(index, arrays)`` whose arrays agree in shape and
    type, stacked on a new batch axis."""
    run: list = []
    for i, arrays in items:
        key = tuple((k, a.shape, a.dtype.str) for k, a in arrays.items())
        if run and (len(run) >= batch_size or run[0][0] != key):
            yield _stack([r[1] for r in run])
            run = []
        run.append((key, (i, arrays)))
    if run:
        yield _stack([r[1] for r in run])


def _stack(run: list) -> tuple[list, dict]:
    return [i for i, _ in run], {k: np.stack([a[k] for _, a in run]) for k in run[0][1]}


def per_item(value, items: list):
    """A target (or position) for a chunk's items: None or one value for every item as it is; one value per item
    (a sequence over all items) as the chunk's entries, int64."""
    if value is None or np.ndim(value) == 0:
        return value
    return np.asarray([value[i] for i in items], np.int64)


def explain_chunks(ex, chunks: Iterable[tuple[list, dict]], *, target=None, position=None, start: str | None = None,
                   failed: Callable[[int, str], None] | None = None) -> Iterator[Chunk]:
    """Explain each chunk with ``ex`` (an Explainer or Runner) and yield one :class:`Chunk` per chunk, in order.

    ``target`` / ``position``: None, one for all items, or one per item over all items (see :func:`per_item`).
    Without ``failed`` an :class:`onnx_lrp.LrpError` propagates. With it, a chunk that fails is explained again item
    by item (so one bad item costs only itself), and an item that fails alone is reported as
    ``failed(index, message)``, in order, before the next chunk is yielded."""
    for items, feeds in chunks:
        extra = {} if position is None else {"position": per_item(position, items)}
        if start is not None:
            extra["start"] = start
        try:
            result = ex.explain(feeds, target=per_item(target, items), **extra)
        except LrpError as exc:
            if failed is None:
                raise
            if len(items) == 1:
                failed(items[0], str(exc))
                continue
            singles = (([i], {k: a[j:j + 1] for k, a in feeds.items()}) for j, i in enumerate(items))
            yield from explain_chunks(ex, singles, target=target, position=position, start=start, failed=failed)
            continue
        yield Chunk(list(items), result)


def merge(chunks: list) -> Explanation:
    """The chunks' explanations as one :class:`Explanation` (:meth:`Explanation.concat`), the deployed-output gap's
    item counted over the whole run."""
    return Explanation.concat([c.result for c in chunks], [c.items[0] for c in chunks])


def explain_all(ex, arrays: dict, targets=None, batch_size: int = 32, progress=None, gaps_out: list | None = None
                ) -> tuple[dict, dict, np.ndarray]:
    """Run an explainer over a batch dict in chunks: (relevance by input, outputs by name, targets used).

    Where the outputs are a deployed model's (quantized, float16), the explained forward's explained output is among
    the outputs as ``FORWARD_PREFIX + name``, and the run's largest :class:`onnx_lrp.run.deployed_gap.Gap` (its item
    counted over the whole batch) is appended to ``gaps_out``. ``progress(done, total)`` is called after each chunk."""
    n = next(iter(arrays.values())).shape[0]
    chunks = []
    for chunk in explain_chunks(ex, slices(arrays, batch_size), target=targets):
        chunks.append(chunk)
        if progress is not None:
            progress(chunk.items[-1] + 1, n)
    m = merge(chunks)
    outputs = dict(m.outputs)
    if m.forward is not None and m.forward is not m.outputs:
        outputs[FORWARD_PREFIX + ex.explained_output] = m.forward[ex.explained_output]
    if gaps_out is not None and m.deployed_gap is not None:
        gaps_out.append(m.deployed_gap)
    relevance = m.relevance if isinstance(m.relevance, dict) else {ex.relevance_inputs[0]: m.relevance}
    return relevance, outputs, m.target


__all__ = ["Chunk", "slices", "stacked", "per_item", "explain_chunks", "merge", "explain_all"]
