"""Options shared by commands that build a relevance model (explain, rewrite, inspect, and regression commands)."""
from __future__ import annotations

import click
import numpy as np

from onnx_lrp.errors import InputError
from onnx_lrp.rules.composite import Composite, builtin_names, load_composite

from .io import parse_floats

DEFAULT_COMPOSITE = "epsilon-plus-flat"


def composite_option(f):
    return click.option("--composite", "-c", default=DEFAULT_COMPOSITE, show_default=True, metavar="NAME|FILE",
                        help=f"Built-in composite ({', '.join(builtin_names())}) or a composite TOML file. "
                             "`onnx-lrp composites` lists them.")(f)


def rule_options(f):
    """--epsilon --gamma --low --high --alpha --beta --stabilizer; collected by :func:`rule_params`."""
    opts = [
        click.option("--epsilon", type=float, default=None, help="Epsilon of the epsilon rules."),
        click.option("--gamma", type=float, default=None, help="Gamma of the gamma rules (>= 0)."),
        click.option("--low", default=None, metavar="FLOAT[,FLOAT...]",
                     help="ZBox lower bound of the input (one value or one per channel)."),
        click.option("--high", default=None, metavar="FLOAT[,FLOAT...]",
                     help="ZBox upper bound of the input (one value or one per channel)."),
        click.option("--alpha", type=float, default=None, help="Alpha of the alpha-beta rules (alpha - beta = 1)."),
        click.option("--beta", type=float, default=None, help="Beta of the alpha-beta rules."),
        click.option("--stabilizer", type=float, default=None,
                     help="Stabiliser of the non-epsilon rules (zennit's default 1e-6)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def bounds(text: str | None, what: str):
    """A ZBox bound from the command line: a float, or per-channel values shaped [C, 1, 1] (ONNX convolutions are
    channels-first)."""
    vals = parse_floats(text, what)
    if vals is None:
        return None
    if len(vals) == 1:
        return vals[0]
    return np.asarray(vals, dtype=np.float32).reshape(-1, 1, 1)


def rule_params(kw: dict) -> dict:
    """The rule parameters given on the command line (None = the composite's own), popped from ``kw``."""
    params = {k: kw.pop(k, None) for k in ("epsilon", "gamma", "alpha", "beta", "stabilizer")}
    if params["alpha"] is not None and params["beta"] is None:
        params["beta"] = params["alpha"] - 1.0  # alpha - beta = 1
    elif params["beta"] is not None and params["alpha"] is None:
        params["alpha"] = params["beta"] + 1.0
    params["low"] = bounds(kw.pop("low", None), "--low")
    params["high"] = bounds(kw.pop("high", None), "--high")
    for k in ("epsilon", "gamma", "alpha", "beta", "stabilizer"):
        v = params[k]
        if v is not None and not np.isfinite(v):
            raise InputError(f"--{k} {v} is not a finite number")
    return {k: v for k, v in params.items() if v is not None}


def composite_with(spec, params: dict) -> Composite:
    """Load a composite and set its rule parameters; one-line errors."""
    try:
        return load_composite(spec).with_params(**params)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"composite file {spec}: {exc.strerror or exc}") from None


def takes(composite: Composite, param: str) -> bool:
    return any(param in e.rule.params() for e in composite.entries)


def common(f):
    """--composite and the rule parameters."""
    return composite_option(rule_options(f))


__all__ = ["DEFAULT_COMPOSITE", "bounds", "common", "composite_option", "composite_with", "rule_options",
           "rule_params", "takes"]
