"""The integration rules of Integrated Gradients, as captum 0.9 computes them
(``captum.attr._utils.approximation_methods``): the points ``alphas`` along the path from the baseline to the input
and the weights ``step_sizes`` of the gradients there; and Integrated Gradients over a composite's modified gradient
(:func:`integrated_relevance`, zennit's ``IntegratedGradients(model, composite=...)``)."""
from __future__ import annotations

import numpy as np

from ..core.errors import InputError

RULES = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")


def alphas_and_steps(integration: str, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(alphas, step sizes), float64, ``n_steps`` each: Riemann sums (left, right, middle, trapezoid: 1/n each, the
    trapezoid's two ends halved) or Gauss-Legendre (the nodes and weights of ``leggauss`` mapped to [0, 1])."""
    if integration == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(n_steps)
        return 0.5 * (1 + nodes), 0.5 * weights
    if integration not in RULES:
        raise InputError(f"integration must be one of {', '.join(RULES)}, not {integration!r}")
    if n_steps < 2:
        raise InputError(f"integration {integration!r} needs n_steps >= 2, not {n_steps}")
    n = n_steps
    steps = np.full(n, 1.0 / n)
    if integration == "riemann_trapezoid":
        steps[0] /= 2
        steps[-1] /= 2
        return np.linspace(0.0, 1.0, n), steps
    low, high = {"riemann_left": (0.0, 1 - 1 / n), "riemann_middle": (1 / (2 * n), 1 - 1 / (2 * n)),
                 "riemann_right": (1 / n, 1.0)}[integration]
    return np.linspace(low, high, n), steps


def integrated_relevance(relevance, x: np.ndarray, targets: np.ndarray, options, rows_per_run: int) -> np.ndarray:
    """sum_k step_k * R(b + alpha_k (x - b)) * (x - b), ``R(rows, targets)`` a composite's relevance at stacked rows
    (its modified gradient: the LRP relevance started from 1 at the target): zennit 0.5.1's
    ``IntegratedGradients(model, composite, n_iter=n)`` is ``integration="riemann_right"`` (alpha = k / n, k = 1..n,
    weights 1 / n) from a zero baseline. The points go along the batch axis, step-major, ``rows_per_run`` rows (at
    least one step) per call."""
    alphas, steps = alphas_and_steps(options.integration, options.n_steps)
    b = np.zeros(()) if options.baselines is None else np.asarray(options.baselines, np.float64)
    try:
        b = np.broadcast_to(b, x.shape)
    except ValueError:
        raise InputError(f"baselines of shape {b.shape} do not broadcast to the input's shape {x.shape}") from None
    diff = x.astype(np.float64) - b
    per = max(1, rows_per_run // max(1, x.shape[0]))
    total = np.zeros(x.shape, np.float64)
    for lo in range(0, len(alphas), per):
        a = alphas[lo:lo + per]
        rows = (b[None] + a.reshape((-1,) + (1,) * x.ndim) * diff[None]).astype(x.dtype)
        r = relevance(rows.reshape((len(a) * x.shape[0],) + x.shape[1:]), np.tile(targets, len(a)))
        total += np.tensordot(steps[lo:lo + per], np.asarray(r, np.float64).reshape((len(a),) + x.shape), axes=1)
    return (total * diff).astype(x.dtype)


__all__ = ["RULES", "alphas_and_steps", "integrated_relevance"]
