"""The options of the commands that build a relevance model, and their one reading into an explainer setup
(:func:`explainer_setup`: preprocessing, rule parameters, ZBox bounds, composite) that every such command calls."""
from __future__ import annotations

from dataclasses import dataclass

import click
import numpy as np
from onnx_lrp.rules.composite import Composite, builtin_names, load_composite

from onnx_lrp.core.errors import InputError

from .io import IMAGENET_MEAN, IMAGENET_STD, Preprocess, image_layout, model_input_dims, parse_floats, parse_size


DEFAULT_COMPOSITE = "auto"  # chosen per network: onnx_lrp/build/auto_composite.py


def composite_option(f):
    return click.option("--composite", "-c", default=DEFAULT_COMPOSITE, show_default=True, metavar="NAME|FILE",
                        help=f"Built-in composite ({', '.join(builtin_names())}) or a composite TOML file; "
                             "auto: epsilon-plus-flat for ReLU networks, attnlrp for other non-linearities (SiLU, "
                             "GELU, hard-swish, attention). `onnx-lrp composites` lists them.")(f)


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


def constant_option(f):
    return click.option("--constant", "constants", multiple=True, metavar="NAME=VALUE",
                        help="Bind the model input NAME to a fixed value (repeatable; a number or comma-separated "
                             "numbers): an integer input that an If branches on, e.g. a sample rate "
                             "(--constant sr=16000). The input is no longer fed.")(f)


def parse_constants(items) -> dict:
    """``NAME=VALUE`` strings (VALUE: numbers, comma-separated for a vector) as a dict of arrays."""
    out = {}
    for item in items or ():
        name, eq, text = item.partition("=")
        if not eq or not name.strip() or not text.strip():
            raise InputError(f"--constant {item}: give NAME=VALUE (e.g. --constant sr=16000)")
        try:
            vals = [float(t) for t in text.split(",")]
        except ValueError:
            raise InputError(f"--constant {item}: VALUE must be a number or comma-separated numbers") from None
        arr = np.asarray(vals if len(vals) > 1 else vals[0])
        if np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        out[name.strip()] = arr
    return out


def input_shape_option(f):
    return click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=DxDx...",
                        help="Fix the dynamic dimensions of the model input NAME (repeatable; sizes joined by x, "
                             "static ones as they are): a shape check that an If branches on then folds, e.g. "
                             "--input-shape input=1x512 --input-shape state=2x1x128.")(f)


def parse_input_shapes(items) -> dict:
    """``NAME=1x512`` strings as a dict of input name -> tuple of sizes."""
    out = {}
    for item in items or ():
        name, eq, text = item.partition("=")
        if not eq or not name.strip() or not text.strip():
            raise InputError(f"--input-shape {item}: give NAME=SIZES (e.g. --input-shape input=1x512)")
        try:
            sizes = tuple(int(t) for t in text.lower().replace(",", "x").split("x"))
        except ValueError:
            raise InputError(f"--input-shape {item}: SIZES must be integers joined by x (e.g. 1x512)") from None
        out[name.strip()] = sizes
    return out


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


def input_options(f):
    """--size --mean --std --crop: how image inputs become model inputs; collected by :func:`preprocess`.

    One definition for every command that reads inputs (explain, trace, snapshot, diff)."""
    opts = [
        click.option("--size", default=None, metavar="H[,W]",
                     help="Images: resize to this size (default: the model's input size)."),
        click.option("--crop", is_flag=True,
                     help="Images: keep the aspect ratio: resize the shorter side, then cut the centre to --size "
                          "(default: resize to --size, which stretches non-square images)."),
        click.option("--mean", default=None, metavar="FLOAT[,FLOAT...]",
                     help="Images: pixels are scaled to [0,1], then (x - mean) / std per channel (default 0). "
                          f"ImageNet models: --mean {','.join(map(str, IMAGENET_MEAN))} "
                          f"--std {','.join(map(str, IMAGENET_STD))}."),
        click.option("--std", default=None, metavar="FLOAT[,FLOAT...]",
                     help="Images: see --mean (default 1). For image inputs without --low/--high, the ZBox bounds "
                          "are the pixel range after this normalisation: low = (0 - mean) / std, "
                          "high = (1 - mean) / std per channel."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def preprocess(kw: dict) -> Preprocess:
    """The :class:`Preprocess` of :func:`input_options`, popped from ``kw``."""
    mean, std = kw.pop("mean", None), kw.pop("std", None)
    pre = Preprocess(parse_size(kw.pop("size", None)), parse_floats(mean, "--mean") or (0.0,),
                     parse_floats(std, "--std") or (1.0,), crop=bool(kw.pop("crop", False)),
                     normalised=mean is not None or std is not None)
    return pre


def image_zbox(model, data_kind, comp: Composite, params: dict, pre: Preprocess) -> str | None:
    """For image inputs and a composite with ZBox but no --low/--high: set the bounds from the pixel range after
    --mean/--std in ``params``; returns the note to print (None when nothing was set). ``data_kind``: the inputs'
    kind, or a function giving it (called only for a composite with ZBox and no bounds given)."""
    if data_kind is None or not takes(comp, "low") or "low" in params or "high" in params:
        return None
    if (data_kind() if callable(data_kind) else data_kind) != "image":
        return None
    infos = model_input_dims(model)
    if len(infos) != 1:
        return None
    low, high = pre.box(image_layout(infos[0]))
    params["low"], params["high"] = low, high
    source = "from --mean/--std" if pre.normalised else "for pixels in [0, 1] (no --mean/--std given)"
    return (f"ZBox bounds {source}: low {[round(float(v), 4) for v in low.ravel()]}, "
            f"high {[round(float(v), 4) for v in high.ravel()]}")


BUILD_NOTE_BYTES = 20 * 2**20  # models this large take seconds to rewrite: say so on stderr


def precision_note(ex) -> str:
    """`` (float16)`` in a summary line when the relevance model computes in the model's own type, else ``""``."""
    kind = getattr(ex, "model_precision", "float32")
    return "" if kind == "float32" else f" ({kind})"


def build_explainer(model, composite: Composite, **kw):
    """``onnx_lrp.Explainer(model, composite, **kw)``; for large model files one line on stderr says what is
    happening before the build (seconds for a ResNet) and one how long it took (deterministic: by file size, so
    small models and failures keep stderr to one line)."""
    import os
    import time

    import onnx_lrp

    try:
        size = os.path.getsize(model) if isinstance(model, (str, os.PathLike)) else len(model)
    except (OSError, TypeError):
        size = 0
    large = size >= BUILD_NOTE_BYTES
    if large:
        click.echo(f"onnx-lrp: building the relevance model of {model} ({size / 2**20:.0f} MB, composite "
                   f"{composite.name}) ...", err=True)
    t0 = time.perf_counter()
    ex = onnx_lrp.Explainer(model, composite=composite, **kw)
    if large:
        click.echo(f"onnx-lrp: built in {time.perf_counter() - t0:.1f} s ({ex.n_nodes} nodes)", err=True)
    return ex


@dataclass
class Setup:
    """What the command line's options make of a model's explainer (:func:`explainer_setup`): the preprocessing of
    image inputs, the rule parameters given, the composite with them, the --constant bindings and --input-shape
    sizes, and the note to print when the ZBox bounds were taken from the pixel range (None otherwise)."""

    pre: Preprocess
    params: dict
    composite: Composite
    constants: dict
    input_shapes: dict
    zbox_note: str | None = None

    def bindings(self) -> dict:
        """The --constant and --input-shape keywords of an Explainer (only those given)."""
        return {k: v for k, v in (("constants", self.constants), ("input_shapes", self.input_shapes)) if v}

    def build(self, model, **kw):
        """The explainer of ``model`` with this composite and these bindings (:func:`build_explainer`)."""
        return build_explainer(model, self.composite, **self.bindings(), **kw)


def explainer_setup(model, composite, kw: dict, *, data_kind=None, pre: Preprocess | None = None) -> Setup:
    """The one reading of the options that set up an explainer, popped from ``kw``: --size/--mean/--std/--crop
    (unless ``pre`` is given: read by the caller already, or a command without image inputs), --constant,
    --input-shape, the rule parameters, and ``composite`` (a name or file) with them.

    ``data_kind``: the kind of the inputs ("image", "npy", ...), or a function giving it, called only when it
    matters: for image inputs and a composite with ZBox but no --low/--high, the bounds are the pixel range after
    --mean/--std (:func:`image_zbox`)."""
    pre = preprocess(kw) if pre is None else pre
    constants = parse_constants(kw.pop("constants", ()))
    input_shapes = parse_input_shapes(kw.pop("input_shapes", ()))
    params = rule_params(kw)
    comp = composite_with(composite, {})
    note = image_zbox(model, data_kind, comp, params, pre)
    return Setup(pre, params, composite_with(comp, params), constants, input_shapes, note)


def common(f):
    """--composite, the rule parameters, --constant and --input-shape."""
    return composite_option(rule_options(constant_option(input_shape_option(f))))


__all__ = ["DEFAULT_COMPOSITE", "Setup", "bounds", "build_explainer", "common", "explainer_setup",
           "precision_note",
           "composite_option", "composite_with", "constant_option", "parse_constants", "input_shape_option",
           "parse_input_shapes", "image_zbox",
           "input_options", "preprocess", "rule_options", "rule_params", "takes"]
