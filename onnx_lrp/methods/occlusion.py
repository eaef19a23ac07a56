"""Occlusion (captum's Occlusion) as batched forwards of the original model in plain onnxruntime: every window
position filled with the baseline, the windows stacked along the batch axis, each input entry's attribution the
mean, over the windows that cover it, of the drop of the target's output entry."""
from __future__ import annotations

import itertools

import numpy as np

from .. import load as loader
from ..core.errors import InputError
from ..core.relevance_model import carried_model
from ..run import runtime

ROW_FACTOR = 16  # a forward row's working memory, in units of the input row's bytes (rough)
#: rows per run on the CPU at most: onnxruntime's forward costs the same per row from 1 to 16 rows and more per row
#: beyond (ResNet50 at 224 px: +10 % at 64 rows, the activations no longer in the caches), and holds more memory
CPU_ROWS = 16


def windows(shape: tuple, window: tuple, strides: tuple) -> list:
    """The windows as tuples of slices over ``shape`` (the input without its batch axis), in captum's order (the
    first axis varies fastest); a window that passes the end is cut there, as captum's padding does."""
    if len(window) != len(shape):
        raise InputError(f"sliding_window_shapes has {len(window)} axes, the input has {len(shape)} after the batch "
                         f"axis ({' x '.join(map(str, shape))})")
    if any(w > d for w, d in zip(window, shape)):
        raise InputError(f"occlusion window {' x '.join(map(str, window))} is larger than the input "
                         f"{' x '.join(map(str, shape))}; give sliding_window_shapes within it")
    if any(s > w and d != w for s, w, d in zip(strides, window, shape)):
        raise InputError(f"strides {strides} exceed the window {window} where it does not cover the input: entries "
                         "would be skipped; give strides <= sliding_window_shapes")
    counts = [int(np.ceil((d - w) / s)) + 1 for d, w, s in zip(shape, window, strides)]
    out = []
    for index in itertools.product(*[range(c) for c in reversed(counts)]):
        starts = [i * s for i, s in zip(reversed(index), strides)]
        out.append(tuple(slice(a, min(a + w, d)) for a, w, d in zip(starts, window, shape)))
    return out


class Forward:
    """The original model in a plain onnxruntime session: its explained output's rows for stacked inputs (an array
    for a model with one input; a dict of arrays by input name for several)."""

    def __init__(self, model, settings):
        source = carried_model(model)
        if source is None:
            raise InputError("occlusion runs the model as a file or bytes; save it (onnx.save) and give the path")
        loader.read_proto(source)  # the loader's checks first: a valid ONNX file, external data inside its folder
        self.session = runtime.Session(source, settings.device, settings.threads, deployed=True)
        self.names = list(self.session.input_names)
        self.input = self.names[0]
        self.output = settings.output or self.session.output_names[0]
        if self.output not in self.session.output_names:
            raise InputError(f"output {self.output!r} is not an output of the model "
                             f"({', '.join(self.session.output_names)})")
        self.settings = settings

    def prepared(self, x):
        """``x`` as the model takes it (its element type, with the batch axis) and whether it came without one;
        several inputs: a dict by input name, from a tuple in the model's order or a dict."""
        if len(self.names) == 1:
            return self._one(self.session.inputs()[0], x)
        if isinstance(x, (tuple, list)) and len(x) == len(self.names):
            x = dict(zip(self.names, x))
        if not isinstance(x, dict) or sorted(x) != sorted(self.names):
            raise InputError(f"the model has {len(self.names)} inputs ({', '.join(self.names)}): give a tuple of "
                             "arrays in that order or a dict by input name")
        specs = {s.name: s for s in self.session.inputs()}
        out = {k: self._one(specs[k], x[k]) for k in self.names}
        return {k: a for k, (a, _) in out.items()}, out[self.input][1]

    def _one(self, spec, x) -> tuple[np.ndarray, bool]:
        a = np.asarray(x)
        want = self.session.input_types.get(spec.name)
        kind = None if want is None else np.dtype(want).kind
        if a.dtype.kind not in "fiub" or kind is None or (kind in "iub" and a.dtype.kind == "f") or \
                (a.dtype.kind == "b" and kind != "b"):
            raise InputError(f"input {spec.name!r} wants {spec.type}, not an array of {a.dtype}")
        bare = a.ndim == len(spec.shape) - 1
        return (a[None] if bare else a).astype(want, copy=False), bare

    def feeds(self, x) -> dict:
        return {self.input: x} if not isinstance(x, dict) else x

    def rows_per_run(self, x) -> int:
        if self.session.inputs()[0].shape[:1] == [1]:
            return 1  # exported with a fixed batch of 1
        if self.settings.internal_batch_size is not None:
            return self.settings.internal_batch_size
        row = sum(max(1, a[:1].nbytes) for a in self.feeds(x).values())
        rows = max(1, self.settings.memory_budget // (row * ROW_FACTOR))
        return min(rows, CPU_ROWS) if self.session.device == "cpu" else rows

    def scores(self, x) -> np.ndarray:
        """The explained output at ``x``, N x entries per item."""
        feeds = self.feeds(x)
        y = self.session.run({k: np.ascontiguousarray(a) for k, a in feeds.items()}, [self.output])[self.output]
        return np.asarray(y, np.float64).reshape(len(feeds[self.input]), -1)

    def entries(self, rows, targets: np.ndarray) -> np.ndarray:
        """The output entry ``targets[i]`` of row i (float64), one run."""
        y = self.scores(rows)
        if np.any(targets >= y.shape[1]):
            raise InputError(f"target {int(targets.max())} out of range: output {self.output!r} has {y.shape[1]} "
                             "entries per item")
        return y[np.arange(len(y)), targets]


def _per_input(value, names: list, several: bool, loose: bool = True) -> dict:
    """An option given per input (a tuple in the model's order, or a dict) as a dict; else the one value for
    every input (``loose``: a tuple as long as the inputs is one per input; not for one window of as many axes)."""
    if isinstance(value, dict):
        return {k: value.get(k, 0.0) for k in names}
    if several or (loose and isinstance(value, tuple) and len(value) == len(names)):
        if not isinstance(value, tuple) or len(value) != len(names):
            raise InputError(f"occlusion: give one window (and strides, baselines) per occluded input "
                             f"({', '.join(names)}: the float inputs; integer ones are held as given)")
        return dict(zip(names, value))
    return {k: value for k in names}


per_input = _per_input  # the in-graph occlusion reads the options alike (ingraph_forward)


def occlusion(fwd: Forward, x, targets, options):
    """captum's Occlusion: sum over windows of (f(x) - f(x occluded)) on the window, divided by the coverage; the
    occluded copies made and run a chunk of windows at a time. Several inputs (``x`` a dict): each float input
    occluded in turn, the others as given (integer ones held: :func:`occluded`); a dict of attributions of those."""
    feeds = fwd.feeds(x)
    batch = len(feeds[fwd.input])
    if targets is None:
        targets = np.argmax(fwd.scores(x), axis=1)
    targets = np.broadcast_to(np.asarray(targets, np.int64).reshape(-1), (batch,))
    whole = fwd.entries(x, targets)
    if not isinstance(x, dict):
        return _occlude(fwd, feeds, fwd.input, (options.sliding_window_shapes, options.strides, options.baselines),
                        targets, whole)
    names = occluded(feeds)
    several = isinstance(options.sliding_window_shapes[0], tuple)
    shapes = _per_input(options.sliding_window_shapes, names, several, loose=False)
    strides = _per_input(options.strides, names, several, loose=False)
    bases = _per_input(options.baselines, names, False)
    return {k: _occlude(fwd, feeds, k, (shapes[k], strides[k], bases[k]), targets, whole) for k in names}


def occluded(feeds: dict) -> list:
    """The inputs occlusion occludes and attributes: the float ones, the integer and bool ones (attention masks,
    positions) held as given in every copy, as captum's ``additional_forward_args``; a model with no float input
    (token ids and a mask): every input, each occluded in turn with the others as given."""
    floats = [k for k, a in feeds.items() if np.asarray(a).dtype.kind == "f"]
    return floats or list(feeds)


def _occlude(fwd: Forward, feeds: dict, name: str, window: tuple, targets, whole) -> np.ndarray:
    """Occlusion of input ``name`` (window shape, strides, baseline), the other inputs as given."""
    x = feeds[name]
    spots = windows(x.shape[1:], window[0], window[1])
    base = np.broadcast_to(np.asarray(window[2], x.dtype), x.shape)
    batch = x.shape[0]
    total = np.zeros(x.shape, np.float64)
    cover = np.zeros(x.shape[1:], np.float64)
    per_run = max(1, fwd.rows_per_run(feeds) // batch)
    # the stacked copies: one buffer per input for the whole call, refilled per chunk (the others' copies once)
    buffers = {k: np.repeat(a[None], min(per_run, len(spots)), axis=0) for k, a in feeds.items()}
    for start in range(0, len(spots), per_run):
        chunk = spots[start:start + per_run]
        held = buffers[name][:len(chunk)]
        held[...] = x[None]
        for k, spot in enumerate(chunk):
            held[(k, slice(None)) + spot] = base[(slice(None),) + spot]
        rows = {k: a[:len(chunk)].reshape((-1,) + a.shape[2:]) for k, a in buffers.items()}
        drops = whole[None] - fwd.entries(rows if len(rows) > 1 else rows[name], np.tile(targets, len(chunk))
                                          ).reshape(len(chunk), batch)
        for k, spot in enumerate(chunk):
            total[(slice(None),) + spot] += drops[k].reshape((batch,) + (1,) * (x.ndim - 1))
            cover[spot] += 1
    return (total / cover).astype(x.dtype if x.dtype.kind == "f" else np.float32)


def in_form(out: dict, given, names: list):
    """Attributions by input name in the form the inputs came in: a dict, or a tuple in the model's order."""
    return out if isinstance(given, dict) else tuple(out[k] for k in names if k in out)


__all__ = ["windows", "Forward", "occlusion", "occluded", "in_form"]
