"""Occlusion (captum's Occlusion) as batched forwards of the original model in plain onnxruntime: every window
position filled with the baseline, the windows stacked along the batch axis, each input entry's attribution the
mean, over the windows that cover it, of the drop of the target's output entry."""
from __future__ import annotations

import itertools

import numpy as np

from ..core.errors import InputError
from ..core.relevance_model import carried_model
from ..run import runtime

ROW_FACTOR = 16  # a forward row's working memory, in units of the input row's bytes (rough)


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
    """The original model in a plain onnxruntime session: its explained output's rows for stacked inputs."""

    def __init__(self, model, settings):
        source = carried_model(model)
        if source is None:
            raise InputError("occlusion runs the model as a file or bytes; save it (onnx.save) and give the path")
        self.session = runtime.Session(source, settings.device, settings.threads, deployed=True)
        if len(self.session.input_names) != 1:
            raise InputError(f"occlusion takes a model with one input for now; this one has "
                             f"{len(self.session.input_names)} ({', '.join(self.session.input_names)})")
        self.input = self.session.input_names[0]
        self.output = settings.output or self.session.output_names[0]
        if self.output not in self.session.output_names:
            raise InputError(f"output {self.output!r} is not an output of the model "
                             f"({', '.join(self.session.output_names)})")
        self.settings = settings

    def prepared(self, x) -> tuple[np.ndarray, bool]:
        """``x`` as the model takes it (its element type, with the batch axis) and whether it came without one."""
        a = np.asarray(x)
        spec = self.session.inputs()[0]
        want = self.session.input_types.get(self.input)
        kind = None if want is None else np.dtype(want).kind
        if a.dtype.kind not in "fiu" or kind is None or (kind in "iu" and a.dtype.kind == "f"):
            raise InputError(f"input {self.input!r} wants {spec.type}, not an array of {a.dtype}")
        bare = a.ndim == len(spec.shape) - 1
        return (a[None] if bare else a).astype(want, copy=False), bare

    def rows_per_run(self, x: np.ndarray) -> int:
        if self.session.inputs()[0].shape[:1] == [1]:
            return 1  # exported with a fixed batch of 1
        if self.settings.internal_batch_size is not None:
            return self.settings.internal_batch_size
        return max(1, self.settings.memory_budget // (max(1, x[:1].nbytes) * ROW_FACTOR))

    def entries(self, rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """The output entry ``targets[i]`` of row i (float64), one run."""
        y = self.session.run({self.input: np.ascontiguousarray(rows)}, [self.output])[self.output]
        y = np.asarray(y, np.float64).reshape(len(rows), -1)
        if np.any(targets >= y.shape[1]):
            raise InputError(f"target {int(targets.max())} out of range: output {self.output!r} has {y.shape[1]} "
                             "entries per item")
        return y[np.arange(len(y)), targets]


def occlusion(fwd: Forward, x: np.ndarray, targets, options) -> np.ndarray:
    """captum's Occlusion: sum over windows of (f(x) - f(x occluded)) on the window, divided by the coverage; the
    occluded copies made and run a chunk of windows at a time."""
    spots = windows(x.shape[1:], options.sliding_window_shapes, options.strides)
    base = np.broadcast_to(np.asarray(options.baselines, x.dtype), x.shape)
    batch = x.shape[0]
    if targets is None:
        y = np.asarray(fwd.session.run({fwd.input: x}, [fwd.output])[fwd.output]).reshape(batch, -1)
        targets = np.argmax(y, axis=1)
    targets = np.broadcast_to(np.asarray(targets, np.int64).reshape(-1), (batch,))
    whole = fwd.entries(x, targets)
    total = np.zeros(x.shape, np.float64)
    cover = np.zeros(x.shape[1:], np.float64)
    per_run = max(1, fwd.rows_per_run(x) // batch)
    for start in range(0, len(spots), per_run):
        chunk = spots[start:start + per_run]
        rows = np.repeat(x[None], len(chunk), axis=0)
        for k, spot in enumerate(chunk):
            rows[(k, slice(None)) + spot] = base[(slice(None),) + spot]
        drops = whole[None] - fwd.entries(rows.reshape((-1,) + x.shape[1:]), np.tile(targets, len(chunk))
                                          ).reshape(len(chunk), batch)
        for k, spot in enumerate(chunk):
            total[(slice(None),) + spot] += drops[k].reshape((batch,) + (1,) * (x.ndim - 1))
            cover[spot] += 1
    return (total / cover).astype(x.dtype)


__all__ = ["windows", "Forward", "occlusion"]
