"""Running a built relevance model: feed checks, target selection, the onnxruntime run and the result.

:class:`Runner` runs a :class:`onnx_lrp.core.relevance_model.RelevanceModel` (plain data) with :class:`RunOptions`
and imports only numpy and onnx_lrp.run.runtime: a process that only runs (a Ray actor) starts without onnx_ir, onnx,
the loader or the rewriter. Only when an item's relevance is not conserved does a Runner rebuild the relevance model
with the conservation ledger (:func:`onnx_lrp.building.build`, from the relevance model's build source) to name the nodes
that absorb or create it. :meth:`Runner.payload` / :meth:`Runner.from_payload` carry one to another process.
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from ..core.errors import InputError, LrpError, LrpWarning
from ..core.interface import (
    CHECK_FINITE,
    LEDGER_ENTERING,
    LEDGER_LEAVING,
    ONE_HOT_INPUT,
    POSITION_INPUT,
    RELEVANCE_PREFIX,
    TARGET_INPUT,
    TARGET_OUTPUT,
    VALUE_OUTPUT,
)
from ..core.relevance_model import BuildOptions, InputSpec, RelevanceModel, describe_inputs
from . import binding, checks, conservation, runtime
from . import deployed_gap as gaps
from .explanation import Explanation, given_without_batch_axis
from .options import RunOptions


def open_session(model: RelevanceModel, options: RunOptions, config: dict | None = None) -> runtime.Session:
    """The onnxruntime session of ``model`` with ``options`` (``config``: :class:`runtime.Session`'s)."""
    external = runtime.ExternalData(model.model_folder, model.model_arrays, model.model_prepack)
    return runtime.Session(model.model_bytes, options.device, options.threads, external=external,
                           precise=options.precise, config=config, **options.session_settings())


def _field(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.relevance_model, name), doc=doc)


def _listed(name: str, doc: str) -> property:
    """A sequence field of the relevance model as a list (a copy), as the Explainer's API has always given it."""
    def get(self):
        value = getattr(self.relevance_model, name)
        return None if value is None else list(value)
    return property(get, doc=doc)


class Runner:
    """Runs a :class:`onnx_lrp.core.relevance_model.RelevanceModel` in one onnxruntime session:
    ``explain(x, target=...)``. ``session``: one already started for it (default: started here)."""

    # the relevance model's fields the Explainer's API gives (docs/python-api.md); the others are read as
    # ``runner.relevance_model.X``, the run options as ``runner.options.X``
    inputs = _listed("inputs", "InputSpec per model input")
    relevance_inputs = _listed("relevance_inputs", "the inputs whose relevance is returned")
    output_names = _listed("output_names", "the model's own outputs")
    explained_output = _field("explained_output", "the model output whose entry is explained")
    explained_tensor = _field("explained_tensor", "where relevance starts (the logits behind a softmax)")
    composite_name = _field("composite_name", "the composite's name (for \"auto\": the one chosen)")
    gap_warnings = True  # warn (once) when the gap is beyond the tolerance; the CLI reports it itself
    last_transfer: dict | None = None  # bytes host -> device and device -> host of the last run (binding.bytes_moved)

    def __init__(self, model: RelevanceModel, options: RunOptions = RunOptions(), session=None):
        self.relevance_model = model
        self.options = options
        self._started(session if session is not None else open_session(model, options))

    def __repr__(self) -> str:
        model = self.relevance_model
        given = model.source.model
        where = repr(given) if isinstance(given, str) else f"<{type(given).__name__}>"
        return (f"{type(self).__name__}({where}, composite={model.composite_name!r}, device={self.device!r}, "
                f"inputs={describe_inputs(model.inputs)}, explained_output={model.explained_output!r})")

    @property
    def deployed(self):
        """The deployed model as onnxruntime loads it (bytes or a file path), run beside the relevance model so that
        ``outputs`` are the deployed ones; None: the explained forward is the deployed model (a float model)."""
        return None if self.relevance_model.deployed is None else self.relevance_model.deployed.source

    @property
    def deployed_kinds(self) -> tuple:
        """"int8", "float16": what makes the deployed forward differ from the explained one."""
        return () if self.relevance_model.deployed is None else self.relevance_model.deployed.kinds

    @property
    def deployed_constants(self) -> dict:
        """Inputs bound to constants when building: fed to the deployed model too."""
        return {} if self.relevance_model.deployed is None else self.relevance_model.deployed.constants

    def payload(self) -> tuple:
        """What runs this relevance model in another process (a Ray actor) without loading or rewriting the model:
        the relevance model and the run options (plain data: unpickling it imports nothing beyond this module and
        :mod:`onnx_lrp.core.relevance_model`). (Shipping onnxruntime's optimised model instead was measured and
        dropped: docs/dataset.md, "Speed".)"""
        return self.relevance_model, dataclasses.replace(self.options, device=self.device, threads=None)

    @classmethod
    def from_payload(cls, payload, device: str | None = None, threads: int | None = None) -> "Runner":
        """A Runner (one onnxruntime session) from :meth:`payload`, or from a relevance model alone (default run
        options); ``device``: another device than the builder's."""
        model, options = (payload, RunOptions()) if isinstance(payload, RelevanceModel) else payload
        options = dataclasses.replace(options, threads=threads)
        if device is not None:
            options = dataclasses.replace(options, device=runtime.resolve_device(device))
        return cls(model, options)

    def _started(self, session) -> None:
        self.session = session
        self.device = session.device  # "auto" may fall back to the CPU when CUDA cannot start
        self.device_note = session.fallback
        self._width = None
        self._ledger_books: dict = {}  # start relevance -> the ledger's Runner, built on the first item that trips
        # the checks of every run; the nodes that do not conserve named from the ledger (read late: patchable)
        self.checks = checks.RunChecks(self.relevance_model, self.options, self.device,
                                       lambda *item: self._culprits(*item))
        self._gap_reason = None  # why the deployed outputs differ (onnx_lrp.run.deployed_gap.cause), found on the first gap
        self._gap_warned = False
        self.deployed_session = None
        self.deployed_note = None  # why the deployed model does not run beside the relevance model, if it does not
        if self.deployed is not None:
            try:
                threads = getattr(session, "threads", None)
                self.deployed_session = runtime.Session(self.deployed, session.device, threads, deployed=True,
                                                        **self.options.session_settings())
            except LrpError as exc:  # not runnable as written (e.g. a com.microsoft op without a CPU kernel)
                self.deployed_note = f"{gaps.cannot_run(str(exc), self.deployed, session.device)}; outputs are " \
                    "the explained forward's"
                warnings.warn(self.deployed_note, LrpWarning, stacklevel=3)

    # ------------------------------------------------------------------ input checks
    def checked_feeds(self, x) -> dict[str, np.ndarray]:
        """The feeds of the model's inputs from ``x`` (an array, or a dict by input name), checked and cast."""
        return self._feeds(x)

    def checked_targets(self, target, batch: int) -> np.ndarray:
        """One target per item (-1: arg-max) from None, an int or one int per item, checked against the width."""
        return self._targets(target, batch)

    def _feeds(self, x, finite: bool = True) -> dict:
        """The checked feeds by input name: numpy arrays cast to the input's type, or device arrays
        (:class:`onnx_lrp.run.binding.DeviceArray`, bound in place). ``finite``: refuse NaN / Inf on the host here
        (else the relevance graph's probe finds them, :meth:`onnx_lrp.run.checks.RunChecks.finite`)."""
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
            past = " (a decoder's past key/value state is fed empty; to explain with a given past, bind it with "\
                "the Explainer's constants=)" if any(gaps.is_past(n) for n in extra) else ""
            raise InputError(f"unknown input(s) {', '.join(sorted(extra))}; the model's inputs are "
                             f"{', '.join(sorted(known))}{past}")
        feeds = {}
        for spec in self.inputs:
            if spec.name not in arrays:
                raise InputError(f"input {spec.name!r} is missing")
            device = binding.classify(arrays[spec.name])
            a = np.asarray(arrays[spec.name]) if device is None else device
            if not _native(spec.dtype) or not _native(a.dtype):
                odd = spec.dtype if not _native(spec.dtype) else a.dtype
                raise InputError(f"input {spec.name!r} has element type {odd} (an 8-bit, 4-bit or brain float), which "
                                 "onnxruntime's Python API cannot take; give float16/32/64 data (export the model "
                                 "with such an input)")
            feeds[spec.name] = self._feed(spec, a, finite) if device is None else binding.device_feed(spec, device)
        return feeds

    def _feed(self, spec: InputSpec, a: np.ndarray, finite: bool) -> np.ndarray:
        if a.dtype == object:
            raise InputError(f"input {spec.name!r} holds Python objects; give a numeric array")
        if spec.dtype.kind == "f":
            if a.dtype.kind not in "f":
                raise InputError(f"input {spec.name!r} has dtype {a.dtype}; the model wants {spec.dtype}")
            if finite:
                checks.refuse_non_finite(spec.name, a)
            a = a.astype(spec.dtype, copy=False)
        elif a.dtype.kind not in "iub" or (spec.dtype.kind == "b") != (a.dtype.kind == "b"):
            raise InputError(f"input {spec.name!r} has dtype {a.dtype}; the model wants {spec.dtype}")
        else:
            a = a.astype(spec.dtype, copy=False)
        if spec.dims:
            if a.ndim == len(spec.dims) - 1 and binding.fits(spec.dims[1:], a.shape):
                a = a[None]  # a single sample without its batch axis
            binding.check_shape(spec, a.shape)
        return np.asarray(a, order="C")  # not ascontiguousarray: it makes a scalar (1,)

    def _targets(self, target, batch: int) -> np.ndarray:
        if target is None or (isinstance(target, str) and target == "argmax"):
            return np.full(batch, -1, dtype=np.int64)
        t = np.asarray(target)
        if t.dtype.kind not in "iu":
            raise InputError(f"target must be an int or one int per batch item, not {target!r}")
        t = _per_item(t, batch)
        if t.shape != (batch,):
            raise InputError(f"{t.size} targets for a batch of {batch}; give one int or one per item")
        width = self.output_width()
        if width is not None and (np.any(t < 0) or np.any(t >= width)):
            raise InputError(f"target {checks.brief(t)} out of range: the explained output has {width} entries per item")
        return np.ascontiguousarray(t)

    def output_width(self) -> int | None:
        if self._width is None:
            for o in self.session.session.get_outputs():
                # onnxruntime reports a declared shape it could not reconcile with the graph as rank 0: unknown
                whole = self.relevance_model.whole
                if o.name == self.explained_output and o.shape is not None and len(o.shape) >= 2 - whole:
                    dims = o.shape if whole else o.shape[1:]
                    if all(isinstance(d, int) for d in dims):
                        self._width = int(np.prod(dims))
        return self._width

    # ---------------------------------------------------------------------- explain
    def _positions(self, target, position, batch: int, feeds: dict):
        """For sequence outputs: (class targets, positions) from a class target and a position (default: the last,
        -1; negative positions count from the end)."""
        rows, per_row = self.relevance_model.sequence_rows
        if rows is None and self.relevance_model.sequence_rows_from is not None:
            name, axis = self.relevance_model.sequence_rows_from
            rows = int(feeds[name].shape[axis])
        if isinstance(target, tuple):
            if position is not None or len(target) != 2:
                raise InputError("give the target as (position, class), or as a class with position=...")
            position, target = target
        pos = np.asarray(-1 if position is None else position)
        if pos.dtype.kind not in "iu":
            raise InputError(f"position must be an int or one int per batch item, not {position!r}")
        pos = _per_item(pos, batch)
        if pos.shape != (batch,) or (rows is not None and (np.any(pos < -rows) or np.any(pos >= rows))):
            raise InputError(f"position {checks.brief(pos)} does not fit: the explained output has {rows} positions "
                             f"(give one int, or one per item, in [-{rows}, {rows - 1}])")
        if target is None or (isinstance(target, str) and target == "argmax"):
            return np.full(batch, -1, dtype=np.int64), np.ascontiguousarray(pos)
        t = np.asarray(target)
        if t.dtype.kind not in "iu":
            raise InputError(f"target must be a class index (int) or one per batch item, not {target!r}")
        t = _per_item(t, batch)
        if t.shape != (batch,) or np.any(t < 0) or (per_row is not None and np.any(t >= per_row)):
            raise InputError(f"target {checks.brief(t)} out of range: each position of the explained output has "
                             f"{per_row} entries")
        return np.ascontiguousarray(t), np.ascontiguousarray(pos)

    def explain(self, x, target=None, start: str | None = None, position=None) -> Explanation:
        """The relevance of the inputs for `target`.

        Args:
            x (ndarray | dict): an array for a model with one input, or a dict of arrays by input name; with or without the batch
                axis (one item without it gets an `Explanation` without it too).
            target (int | list | tuple | None): None (default: the arg-max per item), an int for every item, or one int per item. For
                sequence outputs (rank >= 3, N x T x C...) a class at `position`, or a `(position, class)` tuple;
                None takes the arg-max class at that position.
            start: the start relevance, `"logit"` (the target's output value) or `"one-hot"` (1); default: the
                Explainer's `start`.
            position (int | None): for sequence outputs, the position along axis 1 (default: the last one, as for a causal
                LM's next-token logits).

        Returns:
            Explanation: the relevance, the outputs and what was explained.

        Raises:
            InputError: an input, a target or a position that does not fit the model.
            NumericError: relevance that is not finite (or not conserved, with `strict=True`).
        """
        m, start = self.relevance_model, start or self.options.start
        if start not in ("logit", "one-hot"):
            raise InputError(f"start must be 'logit' or 'one-hot', not {start!r}")
        feeds = self._feeds(x, finite=self._finite_on_host())
        batch = next((a.shape[0] for a in feeds.values() if a.ndim), 1)  # scalar inputs only: one item
        if batch == 0:
            raise InputError("the batch is empty (0 items); give at least one item")
        positions = None
        if m.sequence_rows is not None:
            targets, positions = self._positions(target, position, batch, feeds)
        elif position is not None or isinstance(target, tuple):
            raise InputError(f"position is only for sequence outputs (rank >= 3); {self.explained_output!r} has "
                             "one entry set per item: give the target as a flat index")
        else:
            targets = self._targets(target, 1 if m.whole else batch)
        static_one = self._static_one()
        if static_one and batch > 1 and m.ledger:
            raise InputError("the model has a fixed batch of 1: explain one item at a time with the ledger")
        deployed = self._deployed_run(feeds)
        if deployed is not None and m.sequence_rows is None and not m.whole and np.all(targets < 0) and \
                self.explained_output in deployed and deployed[self.explained_output].shape[:1] == (batch,):
            # arg-max: the deployed model's prediction (the explained forward's can differ where they disagree)
            targets = np.argmax(np.asarray(deployed[self.explained_output]).reshape(batch, -1), axis=1)
        if static_one and batch > 1 and not m.whole:  # exported with a fixed batch of 1: run item by item
            parts = [self._run(_item(feeds, i), targets[i:i + 1], start,
                               None if positions is None else positions[i:i + 1])
                     for i in range(batch)]
            merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        else:
            merged = self._run(feeds, targets, start, positions)
        return self._explanation(x, merged, feeds, (targets, start, positions), deployed)

    def _explanation(self, x, merged: dict, feeds: dict, asked: tuple, deployed) -> Explanation:
        """The checked run's Explanation: finiteness and conservation checked, the targets and positions it used,
        the deployed outputs and their gap (``asked``: the targets, start and positions of the run)."""
        m, (targets, start, positions) = self.relevance_model, asked
        batch = next((a.shape[0] for a in feeds.values() if a.ndim), 1)
        per_row = self.checks.width(merged, targets)
        self.checks.finite(merged, feeds, targets, start, positions)
        rel = {n: merged[RELEVANCE_PREFIX + n] for n in self.relevance_inputs}
        self.checks.conserved(merged, list(rel.values()), feeds, start, positions)
        relevance = rel[self.relevance_inputs[0]] if len(rel) == 1 else rel
        used = merged[TARGET_OUTPUT]
        pos_used = None
        if m.sequence_rows is not None:
            pos_used, used = used // per_row, used % per_row
        forward = {n: merged[n] for n in self.output_names}
        outputs, gap = forward, None
        if deployed is not None:
            outputs = {n: deployed.get(n, forward[n]) for n in self.output_names}
            gap = self._gap(feeds, outputs, forward, batch)
        res = Explanation(relevance=relevance, outputs=outputs, forward=forward, deployed_gap=gap, target=used,
                          relevance_at={n: merged[RELEVANCE_PREFIX + n] for n in m.relevance_at},
                          explained_output=self.explained_output, position=pos_used,
                          explained_value=merged.get(VALUE_OUTPUT), inputs=feeds,
                          ledger=None if not m.ledger else
                          {"entering": merged[LEDGER_ENTERING], "leaving": merged[LEDGER_LEAVING]})
        return res.without_batch_axis(m.whole) if given_without_batch_axis(x, self.inputs) else res

    def _deployed_run(self, feeds: dict) -> dict | None:
        """The deployed model's outputs, or None (a float model; or it fails on this input: said once, and the
        outputs are the explained forward's)."""
        if self.deployed_session is None:
            return None
        try:
            return self.deployed_outputs(binding.on_host(feeds, "a quantized or float16 model's deployed run"))
        except LrpError as exc:
            if self.deployed_note is None:
                self.deployed_note = f"{exc}; outputs are the explained forward's"
                warnings.warn(self.deployed_note, LrpWarning, stacklevel=3)
            return None

    def deployed_outputs(self, feeds: dict, session=None) -> dict:
        """The deployed model's outputs on ``feeds`` (the relevance model's inputs), run as written by onnxruntime
        (``session``: another session of it, e.g. with other config entries); fixed-batch-1 models item by item."""
        session = session or self.deployed_session
        types = session.input_types
        feeds = dict(feeds, **{k: v for k, v in self.deployed_constants.items() if k in types})
        feeds.update(gaps.empty_past(session.inputs(), feeds))  # a decoder's KV cache: empty, as explained
        feeds = {k: np.asarray(v).astype(types[k], copy=False) if types.get(k) is not None else v
                 for k, v in feeds.items() if k in types}
        static_one = self._static_one()
        batch = next((np.shape(v)[0] for k, v in feeds.items() if k not in self.deployed_constants and np.ndim(v)), 1)
        if static_one and batch > 1 and not self.relevance_model.whole:
            parts = [session.run({k: (v[i:i + 1] if k not in self.deployed_constants else v)
                                  for k, v in feeds.items()}) for i in range(batch)]
            return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return session.run(feeds)

    def _finite_on_host(self) -> bool:
        """Whether the inputs' NaN / Inf are refused on the host before the run: a deployed model runs first on
        them, and a relevance model without the graph's probe (built before it) has no other check."""
        return self.deployed_session is not None or CHECK_FINITE not in self.session.output_names

    def _static_one(self) -> bool:
        """Whether the model was exported with a fixed batch of 1 (every input's first dimension 1): a batch then
        runs item by item."""
        return all(spec.dims and spec.dims[0] == 1 for spec in self.inputs)

    def _gap(self, feeds, outputs: dict, forward: dict, batch: int):
        """The gap on the explained output, its cause found on the first one beyond the tolerance, one warning."""
        name = self.explained_output
        m = self.relevance_model
        gap = gaps.measure(name, outputs[name], forward[name], m.output_step, 1 if m.whole else batch)
        if not gap.beyond:
            return gap
        if self._gap_reason is None:
            self._gap_reason = gaps.cause(self, binding.on_host(feeds, "the deployed model's gap"), forward[name], gap)
        gap = dataclasses.replace(gap, reason=self._gap_reason)
        if self.gap_warnings and not self._gap_warned:
            self._gap_warned = True
            warnings.warn(gap.message(), LrpWarning, stacklevel=3)
        return gap

    def _run(self, feeds, targets, start, positions=None):
        feeds = dict(feeds)
        if positions is not None:
            feeds[POSITION_INPUT] = positions
        feeds[TARGET_INPUT] = targets
        feeds[ONE_HOT_INPUT] = np.array(start == "one-hot")
        return self.run_bound(feeds)

    def run_bound(self, feeds: dict) -> dict:
        """One run of the relevance model through onnxruntime's IOBinding (:mod:`onnx_lrp.run.binding`): the
        small outputs (target, explained value, checks, ledger) come to the host as numpy; the others as numpy
        for host feeds, else stay beside the first device array and come back as its kind. ``last_transfer`` then
        holds the bytes that crossed between host and device."""
        session = self.session
        if not hasattr(session, "run_bound"):  # a session of another kind: its own run, host arrays
            return session.run(binding.on_host(feeds, "this session"))
        names = session.output_names
        small = {n for n in names if n.startswith(_SMALL_PREFIXES) or n in (TARGET_OUTPUT, VALUE_OUTPUT)}
        plan = binding.plan(self.device, feeds, names, small)
        like = binding.first_device_array(feeds)
        for a in feeds.values():
            if isinstance(a, binding.DeviceArray):
                binding.settle(a)
        values = session.run_bound(feeds, plan)
        out = {n: v.numpy() if like is None or n in small else binding.to_kind(v, like) for n, v in values.items()}
        self.last_transfer = binding.bytes_moved(plan, feeds, out)
        return out

    def _culprits(self, feeds, item: int, target: int, start, positions):
        """The nodes that absorb or create most relevance for item ``item`` of ``feeds``, read from the ledger
        (:func:`onnx_lrp.run.conservation.culprits`); None when nothing can rebuild the relevance model here."""
        book = self if self.relevance_model.ledger else self._ledger_book(start)
        if book is None:
            return None
        one = {k: v[item:item + 1] for k, v in feeds.items()} if not self.relevance_model.whole else feeds
        extra = {} if positions is None else {"position": positions}
        if self.relevance_model.sequence_rows is not None:
            target = target % (self.relevance_model.sequence_rows[1] or 1 << 62)
        book.checks.reading_ledger = True  # this run only reads the ledger: no check of its own
        try:
            res = book.explain(one, target=target, start=start, **extra)
        finally:
            book.checks.reading_ledger = False
        return conservation.culprits(book.relevance_model.ledger_rows, res.ledger["entering"], res.ledger["leaving"])

    def _ledger_book(self, start: str) -> "Runner | None":
        """The relevance model rebuilt with the conservation ledger from its build source: built on the first item
        that does not conserve and kept (one per start relevance), so that a model that never conserves pays the
        build once, not on every call. None when the source holds no model (an onnx_ir model carried here)."""
        source = self.relevance_model.source
        if source is None or source.model is None:
            return None
        if start not in self._ledger_books:
            from ..building import build  # the loader and the rewriter: only when the check trips

            given = source.options
            options = BuildOptions(output=given.output, explain_logits=given.explain_logits, ledger=True,
                                   constants=given.constants, input_shapes=given.input_shapes)
            self._ledger_books[start] = Runner(build(source.model, source.composite_spec(), options),
                                               RunOptions(start=start))
        return self._ledger_books[start]

# outputs that always come to the host: a few numbers per item (the checks, the ledger's sums per node)
_SMALL_PREFIXES = ("lrp/check/", "lrp/ledger/")


def _per_item(a: np.ndarray, batch: int) -> np.ndarray:
    """An int array (a target, a position) as one int64 per item: one value broadcast to the ``batch``, else as
    given (its shape checked by the caller)."""
    return np.broadcast_to(a.astype(np.int64).reshape(-1), (batch,)) if a.size == 1 else a.astype(np.int64)


def _item(feeds: dict, i: int) -> dict:
    """Item ``i`` of the feeds (on the host: a model with a fixed batch of 1 runs item by item)."""
    return {k: v[i:i + 1] for k, v in binding.on_host(feeds, "a model with a fixed batch of 1").items()}


def _native(dt: np.dtype) -> bool:
    """numpy's own element types (not ml_dtypes' float8/float4/bfloat16/int4, which onnxruntime cannot take)."""
    return dt.kind in "iub" and dt.type.__module__ == "numpy" or dt in (np.float16, np.float32, np.float64) \
        or dt == object


__all__ = ["Runner", "RunOptions", "Explanation", "InputSpec", "open_session"]
