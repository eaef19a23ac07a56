"""SmoothGrad, SmoothGrad-squared and VarGrad (captum's NoiseTunnel, zennit's SmoothGrad) over any gradient method or
LRP composite: the noisy samples stacked along the batch axis (sample-major) of the base method's runs, the mean,
mean of squares or variance taken over the samples in float64."""
from __future__ import annotations


import numpy as np

from ..core.errors import InputError
from .packing import Packing, per_input_options


def noise_for(x: np.ndarray, options) -> np.ndarray:
    """The noise, samples x ``x``'s shape: as given (broadcast over the batch when it has none), else drawn from
    N(0, stdevs^2) with ``seed``."""
    shape = (options.nt_samples,) + x.shape
    if options.noise is None:
        rng = np.random.default_rng(options.seed)
        return rng.normal(0.0, options.stdevs, shape)
    noise = options.noise
    if noise.shape[1:] == x.shape[1:] and x.shape[0] == 1:
        noise = noise[:, None]
    try:
        return np.broadcast_to(noise, shape)
    except ValueError:
        raise InputError(f"noise has shape {options.noise.shape}; give samples x the input's shape "
                         f"({', '.join(map(str, shape[1:]))} after the samples)") from None


def smooth(base, x: np.ndarray, targets: np.ndarray, options) -> np.ndarray:
    """``base(rows, targets)`` at ``x`` plus each sample of noise (one stacked call), reduced as ``nt_type`` says."""
    noise = noise_for(x, options)
    n = noise.shape[0]
    rows = (x[None].astype(np.float64) + noise).astype(x.dtype).reshape((n * x.shape[0],) + x.shape[1:])
    attr = np.asarray(base(rows, np.tile(targets, n)), np.float64).reshape((n,) + x.shape)
    mean = attr.mean(axis=0)
    if options.nt_type == "smoothgrad":
        out = mean
    else:
        squares = (attr * attr).mean(axis=0)
        out = squares if options.nt_type == "smoothgrad_sq" else squares - mean * mean
    return out.astype(x.dtype)


class Moved:
    """A composite's inputs as SmoothGrad and Integrated Gradients over it move them: the inputs it attributes
    (float) moved, packed side by side when several (:mod:`.packing`), the others (integer masks, positions) held,
    row r of the stacked rows taking item r mod N's (the samples are stacked item by item)."""

    def __init__(self, runner, x, what: str):
        if isinstance(x, (tuple, list)) and len(x) == len(runner.inputs):
            x = dict(zip([s.name for s in runner.inputs], x))
        feeds = runner.checked_feeds(x)
        specs = [s for s in runner.inputs if s.name in runner.relevance_inputs]
        wrong = [s.name for s in specs if feeds[s.name].dtype.kind != "f"]
        if not specs or wrong:
            name = wrong[0] if wrong else next(iter(feeds))
            raise InputError(f"{what} moves the input (noise, a path): {name!r} must be float, not "
                             f"{feeds[name].dtype}")
        self.runner, self.names = runner, [s.name for s in specs]
        self.held = {k: a for k, a in feeds.items() if k not in self.names}
        self.packing = Packing(specs) if len(specs) > 1 else None
        first = self.names[0]
        self.x = self.packing.pack({k: feeds[k] for k in self.names}) if self.packing else feeds[first]
        self.bare = feeds[first].ndim != np.ndim(x[first] if isinstance(x, dict) else x)
        self.plain = self.packing is None and not self.held  # the one input alone: fed as an array

    def feeds(self, rows: np.ndarray):
        """The runner's feeds for stacked (packed) rows."""
        if self.plain:
            return rows
        arrays = self.packing.unpack(rows) if self.packing else {self.names[0]: rows}
        return {**arrays, **{k: a[np.arange(len(rows)) % len(a)] for k, a in self.held.items()}}

    def relevance(self, explain, rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """``explain(feeds, targets)`` (the composite's relevance) at stacked rows, packed as the rows."""
        r = explain(self.feeds(rows), targets)
        if not isinstance(r, dict):
            return r
        return self.packing.pack({k: r[k] for k in self.names}) if self.packing else r[self.names[0]]

    def options(self, method: str, options, x: np.ndarray):
        """``options`` with the values given per input packed as ``x`` (one input: a 1-tuple is its value)."""
        return per_input_options(self.packing, self.names[0], method, options, x)

    def result(self, out: np.ndarray, given):
        """The attribution in the form the input came in: an array (the one input), else a dict by input name or
        a tuple in the model's order of the moved inputs."""
        if self.packing is not None:
            return self.packing.result(out, given, self.bare)
        out = out[0] if self.bare else out
        if self.plain:
            return out
        return {self.names[0]: out} if isinstance(given, dict) else (out,)


__all__ = ["noise_for", "smooth", "Moved"]
