"""The last line of defence of every ``explain``: relevance that vanished or exploded is not returned quietly.

LRP redistributes the start relevance (the explained logit, or 1 with ``start="one-hot"``) to the inputs; biases
and stabilisers absorb a share, but an input relevance that sums to less than 1 % or more than 100 x the start,
or one input entry above 1e6 x the start relevance, means a rule vanished or exploded somewhere (timm's
EfficientNet-B0 under a ReLU composite: 0.2 %; LRP-0 dividing by outputs near zero: 1e30). Then ``explain`` warns
in one line (``LrpWarning``) that names the nodes that absorb or create most of it (read from the conservation
ledger, built only when the check trips) and what to try; ``strict=True`` (``--strict``) raises ``NumericError``
instead. Only numpy here: the check runs in every process that runs a relevance model.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


FLOOR = 0.01  # input relevance sum / start relevance below this: relevance vanished
CEILING = 100.0  # above this: relevance was created
PEAK = 1e6  # one input entry above this many times the start relevance: it exploded (and may cancel in the sum)


def per_item(relevance: list[np.ndarray], batch: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(sum, largest |entry|) of the input relevance per item, over every relevance input (float64); None when
    an array has no batch axis of that length (an output explained as one item over a batch: judged as one)."""
    sums, peaks = np.zeros(batch), np.zeros(batch)
    for r in relevance:
        a = np.asarray(r, np.float64)
        if batch == 1:
            a = a.reshape(1, -1)
        elif a.ndim == 0 or a.shape[0] != batch:
            return None
        a = a.reshape(batch, -1)
        sums += a.sum(1)
        peaks = np.maximum(peaks, np.abs(a).max(1, initial=0.0))
    return sums, peaks


def per_item_rows(rows: list[tuple[np.ndarray, np.ndarray, bool]], batch: int
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`per_item` from the relevance graph's own per-row sums and peaks (``lrp/check/sum|peak/<input>``: one
    row per entry of each relevance input's leading axis; ``scalar``: the input has rank 0): the same judgement
    without reading the relevance arrays."""
    sums, peaks = np.zeros(batch), np.zeros(batch)
    for row_sums, row_peaks, scalar in rows:
        s, p = np.asarray(row_sums, np.float64).reshape(-1), np.asarray(row_peaks, np.float64).reshape(-1)
        if batch == 1:
            s, p = s.sum(keepdims=True), p.max(initial=0.0, keepdims=True)
        elif scalar or len(s) != batch:
            return None
        sums += s
        peaks = np.maximum(peaks, p)
    return sums, peaks


def far(sums: np.ndarray, peaks: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Items whose input relevance is far from their start relevance (items that start from 0 are not judged)."""
    starts = np.abs(np.asarray(starts, np.float64).reshape(-1))
    ratio = np.abs(sums) / np.where(starts > 0, starts, 1.0)
    return (starts > 0) & ((ratio < FLOOR) | (ratio > CEILING) | (peaks > PEAK * starts))


@dataclass(frozen=True)
class Off:
    """The item judged worst of a batch that is not conserved: its index, how many items are far (of ``batch``), its
    input relevance sum (``total``) and largest |entry| (``peak``), its start relevance and the start's kind."""
    item: int
    n_far: int
    batch: int
    total: float
    peak: float
    start: float
    start_kind: str


def message(off_item: Off, culprits: list[tuple[str, str, str, float]] | None, composite: str) -> str:
    """The one line: what is off, for which items, where (the ledger's largest absorbers/creators), what to try."""
    item, n_far, batch, total, peak, start, start_kind = (
        off_item.item, off_item.n_far, off_item.batch, off_item.total, off_item.peak, off_item.start,
        off_item.start_kind)
    what = "logit" if start_kind == "logit" else "one-hot start"
    ratio = abs(total) / abs(start)
    if peak > PEAK * abs(start):
        off = f"an input relevance entry of {peak:.3g} ({peak / abs(start):.2g} x the start relevance)"
    elif ratio < FLOOR:
        off = f"the input relevance sums to {total:.3g}, {ratio:.2g} x the start relevance ({what} {start:.4g})"
    else:
        off = f"the input relevance sums to {total:.3g}, {ratio:.3g} x the start relevance ({what} {start:.4g})"
    items = f"item {item}" + (f" (and {n_far - 1} more of {batch})" if n_far > 1 else "")
    if culprits:
        where = "; most is absorbed (+) or created (-) at " + ", ".join(
            f"{name} ({op}, {rule}: {absorbed:+.3g})" for name, op, rule, absorbed in culprits)
    else:
        where = ""
    if peak > PEAK * abs(start) or ratio > CEILING:
        hint = "give a larger epsilon/stabilizer or another composite"
    else:
        others = ", ".join(c for c in ("epsilon-gamma-box", "attnlrp") if c != composite)
        hint = f"try another composite (`onnx-lrp composites` lists them; {others})"
    return (f"relevance not conserved under composite {composite!r} for {items}: {off}{where}; {hint}, or run "
            "`onnx-lrp trace MODEL INPUT` for the whole ledger")


def culprits(rows, entering, leaving, n: int = 3) -> list[tuple[str, str, str, float]]:
    """The ``n`` ledger rows that absorb (or create: negative) the most relevance, largest magnitude first."""
    absorbed = np.asarray(entering, np.float64) - np.asarray(leaving, np.float64)
    # a row summed over a masked tensor (-inf * 0 in an attention mask) is not finite: no number to report there
    absorbed = np.where(np.isfinite(absorbed), absorbed, 0.0)
    order = np.argsort(-np.abs(absorbed), kind="stable")[:n]
    return [(rows[i].name, rows[i].op_type, rows[i].rule, float(absorbed[i])) for i in order if absorbed[i] != 0]


__all__ = ["CEILING", "FLOOR", "Off", "PEAK", "culprits", "far", "message", "per_item", "per_item_rows"]
