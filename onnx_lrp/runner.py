"""Running a built relevance model: feed checks, target selection, the onnxruntime run and the result.

:class:`Runner` holds what running needs (the relevance model's bytes, its input specs, output names, explained
output, ...) as plain data and imports only numpy and onnx_lrp.runtime: a process that only runs (a Ray actor)
starts without onnx_ir, onnx, the loader or the rewriter. :class:`onnx_lrp.Explainer` builds the relevance model
and is a Runner; :meth:`Runner.payload` / :meth:`Runner.from_payload` carry one to another process.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import runtime
from .errors import InputError, NumericError
from .names import (LEDGER_ENTERING, LEDGER_LEAVING, ONE_HOT_INPUT, POSITION_INPUT, RELEVANCE_PREFIX, TARGET_INPUT,
                    TARGET_OUTPUT, VALUE_OUTPUT)


@dataclass
class Explanation:
    """What one ``explain`` call returns.

    ``relevance`` has the shape of ``x`` (a dict by input name when the model has several float inputs);
    ``outputs`` holds the model's outputs by name; ``target`` the explained index per batch item (into the
    explained output flattened per item); ``relevance_at`` the relevance of tensors asked for by name.
    For sequence outputs (rank >= 3, e.g. a causal LM's logits N x T x V), ``position`` holds the explained
    position per item and ``target`` the class at that position. For integer inputs (token ids), ``relevance`` is
    per token: the relevance at the output of their embedding lookups, summed over the embedding dimension.
    """

    relevance: object
    outputs: dict
    target: np.ndarray
    relevance_at: dict = field(default_factory=dict)
    explained_output: str = ""
    position: object = None
    explained_value: object = None  # the explained tensor at the target per item: the logit (before a softmax)
    ledger: dict | None = None  # with Explainer(ledger=True): {"entering": [K], "leaving": [K]}, summed over the batch


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype
    dims: tuple  # ints and None


class Runner:
    """Runs a relevance model built by :class:`onnx_lrp.Explainer`: ``explain(x, target=...)``."""

    #: the attributes that :meth:`payload` carries (all plain data: str, bool, tuples, numpy dtypes, bytes)
    PAYLOAD = ("model_bytes", "inputs", "relevance_inputs", "relevance_at", "explained_output", "explained_tensor",
               "output_names", "whole", "_rows_from", "sequence_rows", "start", "device", "ledger", "_trace")

    def payload(self) -> dict:
        """What runs this relevance model in another process (a Ray actor) without loading or rewriting the model:
        plain data, so that unpickling it imports nothing beyond this module. (Shipping onnxruntime's optimised
        model instead was measured and dropped: docs/dataset.md, "Speed".)"""
        p = {k: getattr(self, k) for k in self.PAYLOAD}
        p["inputs"] = [InputSpec(s.name, np.dtype(s.dtype), tuple(s.dims)) for s in self.inputs]
        p["_trace"] = list(self._trace)
        return p

    @classmethod
    def from_payload(cls, payload: dict, device: str | None = None, threads: int | None = None) -> "Runner":
        """A Runner (one onnxruntime session) from :meth:`payload`; ``device``: another device than the builder's."""
        self = cls.__new__(cls)
        for k in cls.PAYLOAD:
            setattr(self, k, payload[k])
        if device is not None:
            self.device = runtime.resolve_device(device)
        self._started(runtime.Session(self.model_bytes, self.device, threads))
        return self

    def _started(self, session) -> None:
        self.session = session
        self.device = session.device  # "auto" may fall back to the CPU when CUDA cannot start
        self.device_note = session.fallback
        self._width = None
        self._diag = None  # the diagnostic session that locates non-finite relevance, built on the first failure

    # ------------------------------------------------------------------ input checks
    def checked_feeds(self, x) -> dict[str, np.ndarray]:
        """The feeds of the model's inputs from ``x`` (an array, or a dict by input name), checked and cast."""
        return self._feeds(x)

    def checked_targets(self, target, batch: int) -> np.ndarray:
        """One target per item (-1: arg-max) from None, an int or one int per item, checked against the width."""
        return self._targets(target, batch)

    def _feeds(self, x) -> dict[str, np.ndarray]:
        if isinstance(x, dict):
            arrays = dict(x)
        else:
            if len(self.inputs) != 1:
                raise InputError(f"the model has {len(self.inputs)} inputs ({', '.join(i.name for i in self.inputs)})"
                                 "; pass a dict of arrays by input name")
            arrays = {self.inputs[0].name: x}
        known = {i.name for i in self.inputs}
        extra = set(arrays) - known
        if extra:
            raise InputError(f"unknown input(s) {', '.join(sorted(extra))}; the model's inputs are "
                             f"{', '.join(sorted(known))}")
        feeds = {}
        for spec in self.inputs:
            if spec.name not in arrays:
                raise InputError(f"input {spec.name!r} is missing")
            a = np.asarray(arrays[spec.name])
            if not _native(spec.dtype) or not _native(a.dtype):
                odd = spec.dtype if not _native(spec.dtype) else a.dtype
                raise InputError(f"input {spec.name!r} has element type {odd} (an 8-bit, 4-bit or brain float), which "
                                 "onnxruntime's Python API cannot take; give float16/32/64 data (export the model "
                                 "with such an input)")
            if a.dtype == object:
                raise InputError(f"input {spec.name!r} holds Python objects; give a numeric array")
            if spec.dtype.kind == "f":
                if a.dtype.kind not in "f":
                    raise InputError(f"input {spec.name!r} has dtype {a.dtype}; the model wants {spec.dtype}")
                if not np.all(np.isfinite(a)):
                    if np.isnan(a).any():
                        raise InputError(f"input {spec.name!r} contains NaN or Inf ({int(np.isnan(a).sum())} NaN); "
                                         "clean the data first")
                    raise InputError(f"input {spec.name!r} contains NaN or Inf ({int(np.isinf(a).sum())} infinite "
                                     "values): if it is an additive attention mask, give a large finite negative "
                                     "value instead of -inf (e.g. -1e4 or numpy.finfo('float32').min: the same "
                                     "attention, and relevance 0 at masked positions); else clean the data first")
                a = a.astype(spec.dtype, copy=False)
            elif a.dtype.kind not in "iub" or (spec.dtype.kind == "b") != (a.dtype.kind == "b"):
                raise InputError(f"input {spec.name!r} has dtype {a.dtype}; the model wants {spec.dtype}")
            else:
                a = a.astype(spec.dtype, copy=False)
            if spec.dims:
                if a.ndim == len(spec.dims) - 1 and all(
                        d is None or d == s for d, s in zip(spec.dims[1:], a.shape)):
                    a = a[None]  # a single sample without its batch axis
                if a.ndim != len(spec.dims) or any(d is not None and d != s for d, s in
                                                   zip(spec.dims[1:], a.shape[1:])):
                    want = "x".join("N" if i == 0 else ("?" if d is None else str(d)) for i, d in enumerate(spec.dims))
                    raise InputError(f"input {spec.name!r} has shape {'x'.join(map(str, a.shape))}; the model "
                                     f"wants {want}")
            feeds[spec.name] = np.ascontiguousarray(a)
        return feeds

    def _targets(self, target, batch: int) -> np.ndarray:
        if target is None or (isinstance(target, str) and target == "argmax"):
            return np.full(batch, -1, dtype=np.int64)
        t = np.asarray(target)
        if t.dtype.kind not in "iu":
            raise InputError(f"target must be an int or one int per batch item, not {target!r}")
        t = np.broadcast_to(t.astype(np.int64).reshape(-1), (batch,)) if t.size == 1 else t.astype(np.int64)
        if t.shape != (batch,):
            raise InputError(f"{t.size} targets for a batch of {batch}; give one int or one per item")
        width = self.output_width()
        if width is not None and (np.any(t < 0) or np.any(t >= width)):
            raise InputError(f"target {_brief(t)} out of range: the explained output has {width} entries per item")
        return np.ascontiguousarray(t)

    def output_width(self) -> int | None:
        if self._width is None:
            for o in self.session.session.get_outputs():
                if o.name == self.explained_output:
                    dims = o.shape if self.whole else o.shape[1:]
                    if all(isinstance(d, int) for d in dims):
                        self._width = int(np.prod(dims))
        return self._width

    # ---------------------------------------------------------------------- explain
    def _positions(self, target, position, batch: int, feeds: dict):
        """For sequence outputs: (class targets, positions) from a class target and a position (default: the last,
        -1; negative positions count from the end)."""
        rows, per_row = self.sequence_rows
        if rows is None and self._rows_from is not None:
            name, axis = self._rows_from
            rows = int(feeds[name].shape[axis])
        if isinstance(target, tuple):
            if position is not None or len(target) != 2:
                raise InputError("give the target as (position, class), or as a class with position=...")
            position, target = target
        pos = np.asarray(-1 if position is None else position)
        if pos.dtype.kind not in "iu":
            raise InputError(f"position must be an int or one int per batch item, not {position!r}")
        pos = np.broadcast_to(pos.astype(np.int64).reshape(-1), (batch,)) if pos.size == 1 else pos.astype(np.int64)
        if pos.shape != (batch,) or (rows is not None and (np.any(pos < -rows) or np.any(pos >= rows))):
            raise InputError(f"position {_brief(pos)} does not fit: the explained output has {rows} positions "
                             f"(give one int, or one per item, in [-{rows}, {rows - 1}])")
        if target is None or (isinstance(target, str) and target == "argmax"):
            return np.full(batch, -1, dtype=np.int64), np.ascontiguousarray(pos)
        t = np.asarray(target)
        if t.dtype.kind not in "iu":
            raise InputError(f"target must be a class index (int) or one per batch item, not {target!r}")
        t = np.broadcast_to(t.astype(np.int64).reshape(-1), (batch,)) if t.size == 1 else t.astype(np.int64)
        if t.shape != (batch,) or np.any(t < 0) or (per_row is not None and np.any(t >= per_row)):
            raise InputError(f"target {_brief(t)} out of range: each position of the explained output has "
                             f"{per_row} entries")
        return np.ascontiguousarray(t), np.ascontiguousarray(pos)

    def explain(self, x, target=None, start: str | None = None, position=None) -> Explanation:
        """Relevance of the inputs for ``target`` (None: arg-max per item; an int; one int per item).

        Sequence outputs (rank >= 3, N x T x C...): ``target`` is a class at ``position`` (an index along axis 1;
        default: the last position, as for a causal LM's next-token logits), or a ``(position, class)`` tuple;
        None takes the arg-max class at that position.
        """
        start = start or self.start
        if start not in ("logit", "one-hot"):
            raise InputError(f"start must be 'logit' or 'one-hot', not {start!r}")
        feeds = self._feeds(x)
        batch = next(iter(feeds.values())).shape[0]
        if batch == 0:
            raise InputError("the batch is empty (0 items); give at least one item")
        positions = None
        if self.sequence_rows is not None:
            targets, positions = self._positions(target, position, batch, feeds)
        elif position is not None or isinstance(target, tuple):
            raise InputError(f"position is only for sequence outputs (rank >= 3); {self.explained_output!r} has "
                             "one entry set per item: give the target as a flat index")
        else:
            targets = self._targets(target, 1 if self.whole else batch)
        static_one = all(spec.dims and spec.dims[0] == 1 for spec in self.inputs)
        if static_one and batch > 1 and self.ledger:
            raise InputError("the model has a fixed batch of 1: explain one item at a time with the ledger")
        if static_one and batch > 1 and not self.whole:  # exported with a fixed batch of 1: run item by item
            parts = [self._run({k: v[i:i + 1] for k, v in feeds.items()}, targets[i:i + 1], start,
                               None if positions is None else positions[i:i + 1])
                     for i in range(batch)]
            merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        else:
            merged = self._run(feeds, targets, start, positions)
        per_row = self._check_width(merged, targets)
        self._check_finite(merged, feeds, targets, start, positions)
        rel = {n: merged[RELEVANCE_PREFIX + n] for n in self.relevance_inputs}
        relevance = rel[self.relevance_inputs[0]] if len(rel) == 1 else rel
        used = merged[TARGET_OUTPUT]
        pos_used = None
        if self.sequence_rows is not None:
            pos_used, used = used // per_row, used % per_row
        return Explanation(relevance=relevance,
                           outputs={n: merged[n] for n in self.output_names},
                           target=used,
                           relevance_at={n: merged[RELEVANCE_PREFIX + n] for n in self.relevance_at},
                           explained_output=self.explained_output, position=pos_used,
                           explained_value=merged.get(VALUE_OUTPUT),
                           ledger=None if not self.ledger else
                           {"entering": merged[LEDGER_ENTERING],
                            "leaving": merged[LEDGER_LEAVING]})

    def _check_width(self, merged: dict, targets) -> int | None:
        """Given targets against the explained output's width as it came out of this run (outputs with dynamic
        trailing axes: a target past the end would select nothing, an all-zero relevance); returns the entries
        per position of a sequence output."""
        y = merged[self.explained_output]
        if self.sequence_rows is not None:
            width = self.sequence_rows[1] if self.sequence_rows[1] is not None else int(np.prod(y.shape[2:]))
        else:
            width = int(y.size if self.whole else np.prod(y.shape[1:]))
        if np.any(np.asarray(targets) >= width):
            per = "at each position" if self.sequence_rows is not None else "per item"
            raise InputError(f"target {_brief(np.asarray(targets))} out of range: the explained output "
                             f"{self.explained_output!r} has {width} entries {per} for this input; nothing was "
                             "returned")
        return width

    def _run(self, feeds, targets, start, positions=None):
        feeds = dict(feeds)
        if positions is not None:
            feeds[POSITION_INPUT] = positions
        feeds[TARGET_INPUT] = targets
        feeds[ONE_HOT_INPUT] = np.array(start == "one-hot")
        return self.session.run(feeds)

    def _check_finite(self, merged: dict, feeds, targets, start, positions) -> None:
        """Refuse NaN/Inf in the explained output or any returned relevance: one reduction per returned array, then
        (only on failure) a diagnostic run that names the first node where it appeared."""
        names = [self.explained_output] + [n for n in merged if n.startswith(RELEVANCE_PREFIX)]
        bad = [n for n in names if n in merged and merged[n].dtype.kind == "f" and not np.isfinite(merged[n]).all()]
        if not bad:
            return
        a = merged[bad[0]]
        rows = np.flatnonzero((~np.isfinite(a)).reshape(len(a), -1).any(1)) if a.ndim else []
        item = int(rows[0]) if len(rows) else 0
        where = None
        try:
            from .diagnose import locate  # onnx_ir and the loader: only on this failure

            where = locate(self, feeds, targets, start, positions, item)
        except Exception:  # noqa: BLE001 - the diagnosis is best effort; the refusal stands without it
            where = None
        what = "output" if bad[0] == self.explained_output else "relevance"
        raise NumericError(f"non-finite (NaN/Inf) {what} {bad[0]!r} for batch item {item}: "
                           + (where or "the node where it first appeared could not be located")
                           + "; nothing was returned")


def _brief(a: np.ndarray) -> str:
    """An index array for a message: one value when all items share it, else the first few and the count."""
    vals = np.asarray(a).reshape(-1).tolist()
    if len(set(vals)) == 1:
        return f"{vals[0]}" + (f" (all {len(vals)} items)" if len(vals) > 1 else "")
    return "[" + ", ".join(map(str, vals[:6])) + (f", ... ({len(vals)} items)]" if len(vals) > 6 else "]")


def _native(dt: np.dtype) -> bool:
    """numpy's own element types (not ml_dtypes' float8/float4/bfloat16/int4, which onnxruntime cannot take)."""
    return dt.kind in "iub" and dt.type.__module__ == "numpy" or dt in (np.float16, np.float32, np.float64) \
        or dt == object


__all__ = ["Runner", "Explanation", "InputSpec"]
