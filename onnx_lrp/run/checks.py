"""The checks of every run of a relevance model (:class:`RunChecks`, owned by :class:`onnx_lrp.run.runner.Runner`):
the targets against the explained output's width, NaN / Inf anywhere (refused), relevance far from conserved
(warned, or refused with ``strict``). They read the relevance graph's own check outputs (``lrp/check/``, a few
numbers per item: :func:`onnx_lrp.lrp.rewriter.check_outputs`), never the relevance arrays, except on the rare
path where a check trips and the arrays name what went wrong."""
from __future__ import annotations

import warnings

import numpy as np

from ..core.errors import InputError, LrpWarning, NumericError
from ..core.interface import (
    CHECK_FINITE,
    CHECK_PEAK_PREFIX,
    CHECK_SUM_PREFIX,
    RELEVANCE_PREFIX,
    TARGET_OUTPUT,
    VALUE_OUTPUT,
)
from ..core.relevance_model import RelevanceModel
from . import binding, conservation


class RunChecks:
    """The checks of the runs of one relevance model, owned by its :class:`onnx_lrp.run.runner.Runner`
    (``runner.checks``): they read the relevance model (what it outputs), the run options (``strict``, the
    session settings), the device its session runs on, and ask ``culprits(feeds, item, target, start, positions)`` for the nodes that
    absorb or create relevance (the Runner's ledger) when an item does not conserve."""

    def __init__(self, model: RelevanceModel, options, device: str, culprits):
        self.model = model
        self.strict, self.settings = options.strict, options.session_settings()
        self.device = device
        self.culprits = culprits
        self.reading_ledger = False  # the run only reads its ledger for another: no conservation check of its own
        self._diag = None  # the diagnostic session that locates non-finite relevance, built on the first failure

    def width(self, merged: dict, targets) -> int | None:
        """Given targets against the explained output's width as it came out of this run (outputs with dynamic
        trailing axes: a target past the end would select nothing, an all-zero relevance); returns the entries
        per position of a sequence output."""
        shape = binding.shape_of(merged[self.model.explained_output])
        if self.model.sequence_rows is not None:
            width = self.model.sequence_rows[1] if self.model.sequence_rows[1] is not None else int(np.prod(shape[2:]))
        else:
            width = int(np.prod(shape if self.model.whole else shape[1:]))
        if np.any(np.asarray(targets) >= width):
            per = "at each position" if self.model.sequence_rows is not None else "per item"
            raise InputError(f"target {brief(np.asarray(targets))} out of range: the explained output "
                             f"{self.model.explained_output!r} has {width} entries {per} for this input; nothing was "
                             "returned")
        return width

    def conserved(self, merged: dict, relevance: list, feeds, start, positions) -> None:
        """Warn (``strict``: raise) when the input relevance of an item is far from its start relevance
        (:mod:`onnx_lrp.run.conservation`), judged from the relevance graph's per-item sums and peaks
        (``lrp/check/``); the ledger that names the nodes is built only then."""
        if not relevance or VALUE_OUTPUT not in merged or self.reading_ledger:
            return
        values = np.asarray(merged[VALUE_OUTPUT], np.float64).reshape(-1)
        starts = values if start == "logit" else np.ones_like(values)
        got = self.item_sums(merged, len(starts))
        if got is None:
            return
        sums, peaks = got
        bad = np.flatnonzero(conservation.far(sums, peaks, starts))
        if not len(bad):
            return
        ratio = np.abs(np.log10(np.maximum(np.abs(sums[bad]), 1e-300) / np.abs(starts[bad])))
        item = int(bad[np.argmax(np.maximum(ratio, np.log10(np.maximum(peaks[bad], 1e-300) / np.abs(starts[bad]))))])
        found = None
        try:
            found = self.culprits(binding.on_host(feeds, "naming the nodes"), item,
                                   int(np.asarray(merged[TARGET_OUTPUT]).reshape(-1)[item]), start,
                                   None if positions is None else positions[item:item + 1])
        except Exception:  # noqa: BLE001 - naming the nodes is best effort; the warning stands without it
            found = None
        off = conservation.Off(item, len(bad), len(starts), float(sums[item]), float(peaks[item]),
                               float(starts[item]), start)
        text = conservation.message(off, found, self.model.composite_name)
        if self.strict:
            raise NumericError(text + "; nothing was returned (strict)")
        warnings.warn(text, LrpWarning, stacklevel=3)

    def item_sums(self, merged: dict, batch: int):
        """(sum, largest |entry|) of the input relevance per item: from the graph's check outputs, or (a relevance
        model built without them) from the relevance arrays on the host."""
        inputs = self.model.relevance_inputs
        names = [(CHECK_SUM_PREFIX + n, CHECK_PEAK_PREFIX + n) for n in inputs]
        if all(s in merged and p in merged for s, p in names):
            scalar = {spec.name: spec.dims == () for spec in self.model.inputs}
            return conservation.per_item_rows([(merged[s], merged[p], scalar.get(n, False)) for (s, p), n in
                                               zip(names, inputs)], batch)
        return conservation.per_item([binding.to_host(merged[RELEVANCE_PREFIX + n]) for n in inputs], batch)

    def finite(self, merged: dict, feeds, targets, start, positions) -> None:
        """Refuse NaN/Inf in the inputs, the explained output or any returned relevance: the relevance graph's probe
        (``lrp/check/finite``, a float64 sum over all of them) says whether one is; only then are the arrays read
        here, to name the array and the item, and a diagnostic run names the first node where it appeared."""
        probe = merged.get(CHECK_FINITE)
        if probe is not None and np.all(np.isfinite(np.asarray(probe))):
            return
        feeds = binding.on_host(feeds, "locating a non-finite value")
        for spec in self.model.inputs:
            if spec.dtype.kind == "f" and spec.name in feeds:
                refuse_non_finite(spec.name, np.asarray(feeds[spec.name]))
        names = [self.model.explained_output] + [n for n in merged if n.startswith(RELEVANCE_PREFIX)]
        arrays = {n: binding.to_host(merged[n]) for n in names if n in merged}
        bad = [n for n, a in arrays.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]
        if not bad:
            return  # a float64 probe that overflowed: every entry is finite
        merged = dict(merged, **arrays)
        a = merged[bad[0]]
        rows = np.flatnonzero((~np.isfinite(a)).reshape(len(a), -1).any(1)) if a.ndim else []
        item = int(rows[0]) if len(rows) else 0
        where, error = None, NumericError
        try:
            from . import diagnose  # onnx_ir and the loader: only on this failure

            if self._diag is None:
                self._diag = diagnose.diagnostic_session(self.model, self.device, self.settings)
            where = diagnose.locate(self.model, self._diag, feeds, targets, start, positions, item)
            error = diagnose.error_class(where)  # a forward already non-finite: bad input (exit 2), not a result
        except Exception:  # noqa: BLE001 - the diagnosis is best effort; the refusal stands without it
            where = None
        what = "output" if bad[0] == self.model.explained_output else "relevance"
        raise error(f"non-finite (NaN/Inf) {what} {bad[0]!r} for batch item {item}: "
                           + (where or "the node where it first appeared could not be located")
                           + "; nothing was returned")



def refuse_non_finite(name: str, a: np.ndarray) -> None:
    """NaN / Inf in a float input, refused in one line that says what to do."""
    if np.all(np.isfinite(a)):
        return
    if np.isnan(a).any():
        raise InputError(f"input {name!r} contains NaN or Inf ({int(np.isnan(a).sum())} NaN); clean the data first")
    raise InputError(f"input {name!r} contains NaN or Inf ({int(np.isinf(a).sum())} infinite values): if it is an "
                     "additive attention mask, give a large finite negative value instead of -inf (e.g. -1e4 or "
                     "numpy.finfo('float32').min: the same attention, and relevance 0 at masked positions); else "
                     "clean the data first")


def brief(a: np.ndarray) -> str:
    """An index array for a message: one value when all items share it, else the first few and the count."""
    vals = np.asarray(a).reshape(-1).tolist()
    if len(set(vals)) == 1:
        return f"{vals[0]}" + (f" (all {len(vals)} items)" if len(vals) > 1 else "")
    return "[" + ", ".join(map(str, vals[:6])) + (f", ... ({len(vals)} items)]" if len(vals) > 6 else "]")


__all__ = ["RunChecks", "brief", "refuse_non_finite"]
