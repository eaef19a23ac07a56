"""SmoothGrad, SmoothGrad-squared and VarGrad (captum's NoiseTunnel, zennit's SmoothGrad) over any gradient method or
LRP composite: the noisy samples stacked along the batch axis (sample-major) of the base method's runs, the mean,
mean of squares or variance taken over the samples in float64."""
from __future__ import annotations

import numpy as np

from ..core.errors import InputError


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


__all__ = ["noise_for", "smooth"]
