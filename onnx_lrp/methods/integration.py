"""The integration rules of Integrated Gradients, as captum 0.9 computes them
(``captum.attr._utils.approximation_methods``): the points ``alphas`` along the path from the baseline to the input
and the weights ``step_sizes`` of the gradients there."""
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


__all__ = ["RULES", "alphas_and_steps"]
