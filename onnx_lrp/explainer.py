"""The Python API: ``Explainer(model, composite=...).explain(x, target=...)``."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import loader, rewriter, runtime
from .errors import InputError
from .graph import static_dims
from .ops import carries
from .rules.composite import Composite, load_composite


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


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype
    dims: tuple  # ints and None


class Explainer:
    """Builds the relevance model once (load, canonize, rewrite) and one onnxruntime session for it."""

    def __init__(self, model, composite: "str | Path | Composite" = "epsilon-plus-flat", device: str = "cpu",
                 output: str | None = None, relevance_at=(), explain_logits: bool = True, start: str = "logit",
                 threads: int | None = None, **rule_params):
        if start not in ("logit", "one-hot"):
            raise InputError(f"start must be 'logit' or 'one-hot', not {start!r}")
        try:
            self.composite = load_composite(composite).with_params(**rule_params)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        self.start = start
        self.device = runtime.resolve_device(device)
        ir_model = loader.load(model)
        graph = ir_model.graph
        self.inputs = [InputSpec(v.name, np.dtype(v.dtype.numpy()), tuple(static_dims(v) or ()))
                       for v in graph.inputs]
        self.relevance_inputs = [v.name for v in graph.inputs if carries(v)]
        self.relevance_at = list(relevance_at)
        y_value, y_out = rewriter.explained_value(graph, output, explain_logits)
        y_dims = static_dims(y_value)
        self._rows_from = _sequence_axis_source(graph, y_value)
        rewriter.rewrite(ir_model, self.composite, output=output, relevance_at=self.relevance_at,
                         explain_logits=explain_logits)
        self.output_names = [o.name for o in graph.outputs
                             if not o.name.startswith("lrp/")]
        self.explained_output = y_out.name
        produced = {o.name for o in graph.outputs}
        self.relevance_inputs = [v.name for v in graph.inputs if rewriter.RELEVANCE_PREFIX + v.name in produced]
        self.sequence_rows = None  # (positions, entries per position) for explained outputs of rank >= 3
        if rewriter.POSITION_INPUT in {v.name for v in graph.inputs} and y_dims is not None:
            # a dynamic sequence length (None) is read from the input axis with the same symbolic dimension
            self.sequence_rows = (y_dims[1], int(np.prod(y_dims[2:])))
        self.model_bytes = loader.serialize(ir_model)
        self.session = runtime.Session(self.model_bytes, self.device, threads)
        self._width = None

    # ------------------------------------------------------------------ input checks
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
            if a.dtype == object:
                raise InputError(f"input {spec.name!r} holds Python objects; give a numeric array")
            if spec.dtype.kind == "f":
                if a.dtype.kind not in "f":
                    raise InputError(f"input {spec.name!r} has dtype {a.dtype}; the model wants {spec.dtype}")
                if not np.all(np.isfinite(a)):
                    raise InputError(f"input {spec.name!r} contains NaN or Inf; clean the data first")
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
            raise InputError(f"target {t.tolist()} out of range: the explained output has {width} entries per item")
        return np.ascontiguousarray(t)

    def output_width(self) -> int | None:
        if self._width is None:
            for o in self.session.session.get_outputs():
                if o.name == self.explained_output:
                    dims = o.shape[1:]
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
            raise InputError(f"position {pos.tolist()} does not fit: the explained output has {rows} positions "
                             f"(give one int, or one per item, in [-{rows}, {rows - 1}])")
        if target is None or (isinstance(target, str) and target == "argmax"):
            return np.full(batch, -1, dtype=np.int64), np.ascontiguousarray(pos)
        t = np.asarray(target)
        if t.dtype.kind not in "iu":
            raise InputError(f"target must be a class index (int) or one per batch item, not {target!r}")
        t = np.broadcast_to(t.astype(np.int64).reshape(-1), (batch,)) if t.size == 1 else t.astype(np.int64)
        if t.shape != (batch,) or np.any(t < 0) or np.any(t >= per_row):
            raise InputError(f"target {t.tolist()} out of range: each position of the explained output has "
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
        positions = None
        if self.sequence_rows is not None:
            targets, positions = self._positions(target, position, batch, feeds)
        elif position is not None or isinstance(target, tuple):
            raise InputError(f"position is only for sequence outputs (rank >= 3); {self.explained_output!r} has "
                             "one entry set per item: give the target as a flat index")
        else:
            targets = self._targets(target, batch)
        static_one = all(spec.dims and spec.dims[0] == 1 for spec in self.inputs)
        if static_one and batch > 1:  # exported with a fixed batch of 1: run item by item
            parts = [self._run({k: v[i:i + 1] for k, v in feeds.items()}, targets[i:i + 1], start,
                               None if positions is None else positions[i:i + 1])
                     for i in range(batch)]
            merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        else:
            merged = self._run(feeds, targets, start, positions)
        rel = {n: merged[rewriter.RELEVANCE_PREFIX + n] for n in self.relevance_inputs}
        relevance = rel[self.relevance_inputs[0]] if len(rel) == 1 else rel
        used = merged[rewriter.TARGET_OUTPUT]
        pos_used = None
        if self.sequence_rows is not None:
            pos_used, used = used // self.sequence_rows[1], used % self.sequence_rows[1]
        return Explanation(relevance=relevance,
                           outputs={n: merged[n] for n in self.output_names},
                           target=used,
                           relevance_at={n: merged[rewriter.RELEVANCE_PREFIX + n] for n in self.relevance_at},
                           explained_output=self.explained_output, position=pos_used)

    def _run(self, feeds, targets, start, positions=None):
        feeds = dict(feeds)
        if positions is not None:
            feeds[rewriter.POSITION_INPUT] = positions
        feeds[rewriter.TARGET_INPUT] = targets
        feeds[rewriter.ONE_HOT_INPUT] = np.array(start == "one-hot")
        return self.session.run(feeds)

    def save(self, path) -> None:
        """Write the relevance model; it runs in stock onnxruntime without onnx-lrp."""
        loader.save_bytes(self.model_bytes, path)


def _sequence_axis_source(graph, y) -> tuple[str, int] | None:
    """(input name, axis) whose symbolic dimension is the explained output's axis 1 (e.g. ``seq``), if any."""
    if y.shape is None or len(y.shape) < 3 or isinstance(y.shape[1], int):
        return None
    name = getattr(y.shape[1], "value", None)
    if not name:
        return None
    for v in graph.inputs:
        for axis, d in enumerate(v.shape or ()):
            if not isinstance(d, int) and getattr(d, "value", None) == name:
                return v.name, axis
    return None
