"""The Python API: ``Explainer(model, composite=...).explain(x, target=...)``."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from . import ledger as ledger_mod
from . import loader, rewriter, runtime
from .errors import InputError, LrpError, ModelError, NumericError, internal_error
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
    explained_value: object = None  # the explained tensor at the target per item: the logit (before a softmax)
    ledger: dict | None = None  # with Explainer(ledger=True): {"entering": [K], "leaving": [K]}, summed over the batch


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype
    dims: tuple  # ints and None


class Explainer:
    """Builds the relevance model once (load, canonize, rewrite) and one onnxruntime session for it."""

    def __init__(self, model, composite: "str | Path | Composite" = "epsilon-plus-flat", device: str = "cpu",
                 output: str | None = None, relevance_at=(), explain_logits: bool = True, start: str = "logit",
                 threads: int | None = None, ledger: bool = False, constants: dict | None = None,
                 input_shapes: dict | None = None, **rule_params):
        if start not in ("logit", "one-hot"):
            raise InputError(f"start must be 'logit' or 'one-hot', not {start!r}")
        try:
            self.composite = load_composite(composite).with_params(**rule_params)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        self.start = start
        self.device = runtime.resolve_device(device)
        if isinstance(relevance_at, str):
            relevance_at = [relevance_at]  # one tensor name
        try:
            relevance_at = list(relevance_at)
        except TypeError:
            raise InputError(f"relevance_at must be a list of tensor names, not {relevance_at!r}") from None
        if not all(isinstance(n, str) for n in relevance_at):
            raise InputError(f"relevance_at must be a list of tensor names (strings), not {relevance_at!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
            raise InputError(f"threads must be a non-negative int (0: onnxruntime's default), not {threads!r}")
        try:
            self._build(model, output, relevance_at, explain_logits, threads, ledger, device, constants,
                        input_shapes)
        except LrpError:
            raise
        except MemoryError:
            raise ModelError("out of memory while building the relevance model; the model (or a dimension of it) is "
                             "too large for this machine") from None
        except Exception as exc:  # a bug (or a malformed model no check foresaw): one line, counted by the fuzzer
            raise internal_error(None, exc) from exc

    def _build(self, model, output, relevance_at, explain_logits, threads, ledger, device, constants=None,
               input_shapes=None) -> None:
        ir_model = loader.load(model, constants=constants, input_shapes=input_shapes)
        graph = ir_model.graph
        self.n_nodes = sum(1 for _ in graph)  # of the canonized forward graph
        self.inputs = [InputSpec(v.name, np.dtype(v.dtype.numpy()), tuple(static_dims(v) or ()))
                       for v in graph.inputs]
        self.relevance_inputs = [v.name for v in graph.inputs if carries(v)]
        self.relevance_at = list(relevance_at)
        y_value, y_out = rewriter.explained_value(graph, output, explain_logits)
        y_dims = static_dims(y_value)
        self.whole = rewriter.whole_output(graph, y_value)  # no batch axis: the output is one item
        self._rows_from = _sequence_axis_source(graph, y_value)
        self.ledger_rows = [] if ledger else None  # one onnx_lrp.ledger.LedgerRow per node, reverse order
        self._trace: list = []
        rewriter.rewrite(ir_model, self.composite, output=output, relevance_at=self.relevance_at,
                         explain_logits=explain_logits, ledger=self.ledger_rows, trace=self._trace)
        self._diag = None  # the diagnostic session that locates non-finite relevance, built on the first failure
        self.output_names = [o.name for o in graph.outputs
                             if not o.name.startswith("lrp/")]
        self.explained_output = y_out.name
        self.explained_tensor = y_value.name  # what relevance starts from: the logits behind a softmax output
        produced = {o.name for o in graph.outputs}
        self.relevance_inputs = [v.name for v in graph.inputs if rewriter.RELEVANCE_PREFIX + v.name in produced]
        self.sequence_rows = None  # (positions, entries per position) for explained outputs of rank >= 3
        if rewriter.POSITION_INPUT in {v.name for v in graph.inputs} and y_dims is not None:
            # a dynamic sequence length (None) is read from the input axis with the same symbolic dimension
            # dynamic trailing axes (a detector's H x W map): entries per position (None) read from the output
            trailing = y_dims[2:]
            self.sequence_rows = (y_dims[1], int(np.prod(trailing)) if all(d is not None for d in trailing) else None)
        self.model_bytes = loader.serialize(ir_model)
        self.session = runtime.Session(self.model_bytes, device, threads)
        self.device = self.session.device  # "auto" may fall back to the CPU when CUDA cannot start
        self.device_note = self.session.fallback
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
        if static_one and batch > 1 and self.ledger_rows is not None:
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
        rel = {n: merged[rewriter.RELEVANCE_PREFIX + n] for n in self.relevance_inputs}
        relevance = rel[self.relevance_inputs[0]] if len(rel) == 1 else rel
        used = merged[rewriter.TARGET_OUTPUT]
        pos_used = None
        if self.sequence_rows is not None:
            pos_used, used = used // per_row, used % per_row
        return Explanation(relevance=relevance,
                           outputs={n: merged[n] for n in self.output_names},
                           target=used,
                           relevance_at={n: merged[rewriter.RELEVANCE_PREFIX + n] for n in self.relevance_at},
                           explained_output=self.explained_output, position=pos_used,
                           explained_value=merged.get(rewriter.VALUE_OUTPUT),
                           ledger=None if self.ledger_rows is None else
                           {"entering": merged[ledger_mod.ENTERING_OUTPUT],
                            "leaving": merged[ledger_mod.LEAVING_OUTPUT]})

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
            feeds[rewriter.POSITION_INPUT] = positions
        feeds[rewriter.TARGET_INPUT] = targets
        feeds[rewriter.ONE_HOT_INPUT] = np.array(start == "one-hot")
        return self.session.run(feeds)

    # ------------------------------------------------------------------ numeric honesty
    def _check_finite(self, merged: dict, feeds, targets, start, positions) -> None:
        """Refuse NaN/Inf in the explained output or any returned relevance: one reduction per returned array, then
        (only on failure) a diagnostic run that names the first node where it appeared."""
        names = [self.explained_output] + [n for n in merged if n.startswith(rewriter.RELEVANCE_PREFIX)]
        bad = [n for n in names if n in merged and merged[n].dtype.kind == "f" and not np.isfinite(merged[n]).all()]
        if not bad:
            return
        a = merged[bad[0]]
        rows = np.flatnonzero((~np.isfinite(a)).reshape(len(a), -1).any(1)) if a.ndim else []
        item = int(rows[0]) if len(rows) else 0
        where = None
        try:
            where = self._locate(feeds, targets, start, positions, item)
        except Exception:  # noqa: BLE001 - the diagnosis is best effort; the refusal stands without it
            where = None
        what = "output" if bad[0] == self.explained_output else "relevance"
        raise NumericError(f"non-finite (NaN/Inf) {what} {bad[0]!r} for batch item {item}: "
                           + (where or "the node where it first appeared could not be located")
                           + "; nothing was returned")

    def _diagnostic_session(self):
        """A session over the relevance model that also returns every forward activation and every relevance
        tensor of the walk (built once, only when needed)."""
        if self._diag is None:
            model = loader.deserialize(self.model_bytes)  # not kept alive beside the session: rebuilt on failure
            graph = model.graph
            have = {id(v) for v in graph.outputs}
            rel_type = next((o.type for o in graph.outputs if o.name.startswith(rewriter.RELEVANCE_PREFIX)
                             and o.type is not None), ir.TensorType(ir.DataType.FLOAT))
            forward, extra = [], []
            for node in graph:
                if node.name.startswith("lrp/"):
                    continue
                for o in node.outputs:
                    if not o.name.startswith("lrp/") and carries(o):
                        forward.append((node, o))
                        if id(o) not in have:
                            extra.append(o)
                            have.add(id(o))
            by_name = {o.name: o for n in graph for o in n.outputs}
            for step in self._trace:
                for name in step.values:
                    v = by_name.get(name)
                    if v is not None and id(v) not in have:
                        if v.type is None:
                            v.type = rel_type
                        extra.append(v)
                        have.add(id(v))
            graph.outputs.extend(extra)
            forward = [(n.name, n.op_type, o.name) for n, o in forward]
            self._diag = (runtime.Session(loader.serialize(model), self.device), forward)
        return self._diag

    def _locate(self, feeds, targets, start, positions, item: int) -> str:
        session, forward = self._diagnostic_session()
        one = all(spec.dims and spec.dims[0] in (None, 1) for spec in self.inputs)
        if one:
            feeds = {k: v[item:item + 1] for k, v in feeds.items()}
            targets = targets[item:item + 1]
            positions = None if positions is None else positions[item:item + 1]
        feeds = dict(feeds)
        if positions is not None:
            feeds[rewriter.POSITION_INPUT] = positions
        feeds[rewriter.TARGET_INPUT] = targets
        feeds[rewriter.ONE_HOT_INPUT] = np.array(start == "one-hot")
        got = session.run(feeds)

        def finite(name):
            a = got.get(name)
            return a is None or a.dtype.kind != "f" or bool(np.isfinite(a).all())

        first_forward = next(((n, op, o) for n, op, o in forward if not finite(o)), None)
        if not finite(self.explained_output) or (first_forward is not None and
                                                 not all(finite(v) for s in self._trace[:1] for v in s.values)):
            if first_forward is not None:
                n, op, o = first_forward
                return (f"the forward pass is already non-finite at node {n} ({op}, output {o!r}); "
                        "check the model's parameters (a NaN/Inf weight?) and the input's range")
            return "the forward pass is already non-finite; check the model's parameters and the input's range"
        for step in self._trace:
            if not all(finite(v) for v in step.values):
                hint = ("its forward values are non-finite too (first: node "
                        f"{first_forward[0]}, {first_forward[1]})" if first_forward is not None else
                        "its forward values are finite: the rule's denominators vanish or overflow; give a larger "
                        "epsilon/stabilizer or map this node to another rule in a composite file")
                return f"first at node {step.node} ({step.op_type}) under rule {step.rule!r}; {hint}"
        return "every relevance tensor of the walk is finite in a separate run (a summed relevance overflowed?)"

    def save(self, path, computed_weights: bool = False) -> dict | None:
        """Write the relevance model; it runs in stock onnxruntime without onnx-lrp.

        ``computed_weights``: store no modified copies of the weights (W+, |W|, transposed kernels, ...) but nodes
        that compute them from the original weights (onnxruntime folds them when it loads the file): a file about
        the model's size instead of 2-4 times it. Returns the counts of :func:`onnx_lrp.weights.compute_in_graph`.
        """
        data = self.model_bytes_computed() if computed_weights else self.model_bytes
        try:
            loader.save_bytes(data, path)
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        return self._computed_counts if computed_weights else None

    def model_bytes_computed(self) -> bytes:
        """The relevance model with modified weights computed in the graph (see :meth:`save`)."""
        from . import weights

        model = loader.to_ir(loader.read_proto(self.model_bytes))
        self._computed_counts = weights.compute_in_graph(model)
        return loader.serialize(model)


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
