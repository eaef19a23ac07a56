"""Expected Gradients (Erion et al. 2021) and GradientSHAP (captum's GradientShap): the mean over ``n_samples``
draws of gradient x (noisy input - baseline) at a random point on the path from a baseline drawn from a background
set to the (noisy) input. Every draw is one row of the true-gradient relevance graph's stacked run
(:class:`onnx_lrp.methods.gradients.GradientRunner`), sample-major; the draws come from ``seed`` or are given, so
that captum's result is reproduced when its draws are fed."""
from __future__ import annotations

import numpy as np

from ..core.errors import InputError
from .gradients import GradientRunner


def draws(x: np.ndarray, options) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(baseline indices samples x batch, alphas samples x batch, noise samples x ``x``'s shape): as given, the
    missing ones drawn with ``seed`` (noise: zeros when ``stdevs`` is 0)."""
    n, batch = options.n_samples, x.shape[0]
    rng = np.random.default_rng(options.seed)
    index = options.baseline_indices
    index = rng.integers(0, len(options.baselines), (n, batch)) if index is None else _per_item(index, n, batch,
                                                                                                 "baseline_indices")
    alphas = options.alphas
    alphas = rng.random((n, batch)) if alphas is None else _per_item(alphas, n, batch, "alphas")
    noise = options.noise
    if noise is None:
        noise = rng.normal(0.0, options.stdevs, (n,) + x.shape) if options.stdevs > 0 else np.zeros((1,) + x.shape)
    elif noise.shape[1:] == x.shape[1:] and batch == 1:
        noise = noise[:, None]
    try:
        noise = np.broadcast_to(noise, (n,) + x.shape)
    except ValueError:
        raise InputError(f"noise has shape {options.noise.shape}; give samples x the input's shape "
                         f"({n} x {' x '.join(map(str, x.shape))})") from None
    return index, alphas, noise


def _per_item(a: np.ndarray, n: int, batch: int, name: str) -> np.ndarray:
    """``a`` (samples, or samples x batch) as samples x batch."""
    if a.ndim == 1:
        a = a[:, None]
    try:
        return np.broadcast_to(a, (n, batch))
    except ValueError:
        raise InputError(f"{name} has shape {a.shape}; give samples x batch ({n} x {batch}) or one per sample") \
            from None


def expected_gradients(gr: GradientRunner, x: np.ndarray, targets: np.ndarray, options) -> np.ndarray:
    """captum's GradientShap: mean_s grad(b_s + alpha_s (x + noise_s - b_s)) * (x + noise_s - b_s), each sample's
    baseline ``b_s`` a row of the background set; the samples stacked along the batch axis."""
    background = np.asarray(options.baselines, np.float64)
    if background.shape[1:] != x.shape[1:]:
        raise InputError(f"baselines have shape {' x '.join(map(str, background.shape))}; give a background set "
                         f"n x {' x '.join(map(str, x.shape[1:]))} (the input's shape after its batch axis)")
    index, alphas, noise = draws(x, options)
    n = index.shape[0]
    noisy = x[None].astype(np.float64) + noise  # samples x batch x ...
    b = background[index]
    diff = noisy - b
    shape = (n, x.shape[0]) + (1,) * (x.ndim - 1)
    rows = (b + alphas.reshape(shape) * diff).astype(x.dtype)
    g = gr.gradients(rows.reshape((n * x.shape[0],) + x.shape[1:]), np.tile(targets, n))
    return (g.reshape(noisy.shape).astype(np.float64) * diff).mean(axis=0).astype(x.dtype)


__all__ = ["expected_gradients", "draws"]
