"""The options of the commands that build a relevance model, and their one reading into an explainer setup
(:func:`explainer_setup`: preprocessing, rule parameters, ZBox bounds, composite) that every such command calls."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
from onnx_lrp.rules.composite import Composite, load_composite

from onnx_lrp.core.errors import InputError
from onnx_lrp.core.relevance_model import BuildOptions
from onnx_lrp.run.options import RunOptions

from .helpfmt import Row
from onnx_lrp.io.inputs import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Batch,
    Preprocess,
    channels_last,
    load_inputs,
    model_input_dims,
)
from onnx_lrp.io.kinds import UNIT_RANGE, is_kind

from .io import parse_floats, parse_size


DEFAULT_COMPOSITE = "auto"  # chosen per network: onnx_lrp/building/auto_composite.py


def composite_option(f):
    return click.option("--composite", "-c", default=DEFAULT_COMPOSITE, metavar="NAME|FILE",
                        help="auto, a name (onnx-lrp composites) or TOML.")(f)


def rule_options(f):
    """--epsilon --gamma --low --high --alpha --beta --stabilizer; collected by :func:`rule_params`."""
    opts = [
        click.option("--epsilon", type=float, default=None, help="Epsilon of the epsilon rules."),
        click.option("--gamma", type=float, default=None, help="Gamma of the gamma rules (>= 0)."),
        click.option("--low", default=None, metavar="FLOAT[,FLOAT...]",
                     help="Box-rule lower bound of the input (one value or one per channel; default: from "
                          "--mean/--std)."),
        click.option("--high", default=None, metavar="FLOAT[,FLOAT...]",
                     help="Box-rule upper bound of the input (see --low)."),
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
                        help="Bind the model input NAME to a fixed value, e.g. a sample rate an If branches on "
                             "(--constant sr=16000); repeatable.")(f)


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
            raise InputError(f"--constant {item}: VALUE must be a number or comma-separated numbers (e.g. --constant "
                             "sr=16000)") from None
        arr = np.asarray(vals if len(vals) > 1 else vals[0])
        if np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        out[name.strip()] = arr
    return out


def input_shape_option(f):
    return click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=DxD...",
                        help="Fix the dynamic sizes of the model input NAME (--input-shape x=1x512), so that a shape "
                             "check an If branches on folds; repeatable.")(f)


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


def rule_params(kw) -> dict:
    """The rule parameters given on the command line (None = the composite's own), read from click's options."""
    params = {k: kw.get(k) for k in ("epsilon", "gamma", "alpha", "beta", "stabilizer")}
    if params["alpha"] is not None and params["beta"] is None:
        params["beta"] = params["alpha"] - 1.0  # alpha - beta = 1
    elif params["beta"] is not None and params["alpha"] is None:
        params["alpha"] = params["beta"] + 1.0
    params["low"] = bounds(kw.get("low"), "--low")
    params["high"] = bounds(kw.get("high"), "--high")
    for k in ("epsilon", "gamma", "alpha", "beta", "stabilizer"):
        v = params[k]
        if v is not None and not np.isfinite(v):
            raise InputError(f"--{k} {v} is not a finite number; give a finite one")
        if v is not None and abs(v) > float(np.finfo(np.float32).max):  # it would be Inf in the model's float32
            raise InputError(f"--{k} {v:g} is beyond float32's range (|x| <= 3.4e38), in which the model computes; "
                             "give a smaller number")
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
    """--size --mean --std --crop: how inputs become model inputs; collected by :func:`preprocess`.

    One definition for every command that reads inputs (explain, trace, snapshot, diff, evaluate, concepts, relmax).
    """
    opts = [
        click.option("--size", default=None, metavar="H[,W]",
                     help="Images: resize to this size (default: the model's input size), keeping the aspect ratio: "
                          "the shorter side to fit, the centre cut (torchvision's Resize + CenterCrop)."),
        click.option("--crop", is_flag=True,
                     help="Images: keep the aspect ratio (the default; see --size)."),
        click.option("--squash", is_flag=True,
                     help="Images: resize to the size whatever the aspect ratio (no cut)."),
        click.option("--mean", default=None, metavar="FLOAT[,FLOAT...]",
                     help="Normalise every input kind, (x - mean) / std per channel, images and uint8 arrays scaled "
                          f"to [0, 1] first (ImageNet: --mean {','.join(map(str, IMAGENET_MEAN))} "
                          f"--std {','.join(map(str, IMAGENET_STD))}); the box-rule bounds follow from them."),
        click.option("--std", default=None, metavar="FLOAT[,FLOAT...]", help="See --mean (default 1)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


# help rows (cli.helpfmt) of the shared options, for the sections of every command's help: one line each at 80
# columns (the option column 30 wide, the help 44); docs/cli.md says the rest
RULE_ROWS = ["composite",
             Row(("epsilon", "gamma", "stabilizer"), "Rule parameters (default: the composite's).",
                 left="--epsilon/--gamma/--stabilizer"),
             Row(("alpha", "beta"), "Alpha-beta rules (alpha - beta = 1)."),
             Row(("low", "high"), "Box bounds (default: from --mean/--std).", left="--low/--high F[,F...]")]
INPUT_ROWS = [Row(("mean", "std"), "Normalise any input: (x - mean) / std.", left="--mean/--std F[,F...]"),
              Row(("size", "crop", "squash"), "Resize images (aspect kept, centre cut).",
                  left="--size H[,W], --crop, --squash")]
BINDING_ROWS = [Row(("constants", "input_shapes"), "Bind an input to a value / fix its sizes.",
                    left="--constant, --input-shape")]


def preprocess(kw) -> Preprocess:
    """The :class:`Preprocess` of :func:`input_options`, read from click's options."""
    mean, std = kw.get("mean"), kw.get("std")
    if kw.get("crop") and kw.get("squash"):
        raise InputError("--crop keeps the aspect ratio and --squash does not; give one of them")
    pre = Preprocess(parse_size(kw.get("size")), parse_floats(mean, "--mean") or (0.0,),
                     parse_floats(std, "--std") or (1.0,), crop=bool(kw.get("crop", False)),
                     normalised=mean is not None or std is not None, squash=bool(kw.get("squash", False)))
    return pre


KNOWN_RANGE = UNIT_RANGE  # items in [0, 1] before --mean/--std: images and uint8 arrays (divided by 255)


def box_bounds(model, data_kind, comp: Composite, params: dict, pre: Preprocess) -> tuple[str | None, str | None]:
    """The bounds of a box rule (ZBox) when the composite has one and no --low/--high were given, set in ``params``:
    the range [0, 1] after normalisation (low = (0 - mean) / std, high = (1 - mean) / std per channel) when
    --mean/--std are given, whatever the input kind (they normalise every kind), or [0, 1] for images and uint8
    arrays, whose range is known. ``data_kind``: the inputs' kind, or a function giving it (called only when it
    matters). Returns (the note to print, "mean/std" or "pixels"), or (None, None) when nothing was set."""
    if not takes(comp, "low") or "low" in params or "high" in params:
        return None, None
    if not pre.normalised and (data_kind() if callable(data_kind) else data_kind) not in KNOWN_RANGE:
        return None, None
    floats = [i for i in model_input_dims(model) if i.dtype.kind == "f"]
    if len(floats) != 1:
        return None, None
    dims = floats[0].dims
    channels = (dims[-1] if channels_last(dims) else dims[1]) if len(dims) >= 2 else 1
    params["low"], params["high"] = pre.bounds(channels, len(dims) or 4, f"the model input {floats[0].name!r}")
    source = "from --mean/--std" if pre.normalised else "for pixels in [0, 1] (no --mean/--std given)"
    note = (f"ZBox bounds {source}: low {[round(float(v), 4) for v in params['low'].ravel()]}, "
            f"high {[round(float(v), 4) for v in params['high'].ravel()]}")
    return note, ("mean/std" if pre.normalised else "pixels")


def check_model_arg(model) -> None:
    """MODEL given an input file or a directory (MODEL and INPUT swapped): refused naming the order."""
    if not isinstance(model, (str, os.PathLike)):
        return
    path = Path(model)
    if path.is_dir() and any(path.glob("*.onnx")):  # an export folder (explain and inspect take it as its model)
        from onnx_lrp.io.model_folder import resolve_model_folder

        raise InputError(f"MODEL {model} is a folder; give its model file: {resolve_model_folder(path)[0]}")
    if path.is_dir() and (path / "config.json").is_file():  # a save_pretrained folder of weights, not exported
        raise InputError(f"MODEL {model} holds no .onnx file (a Hugging Face folder?): export it to ONNX first, e.g. "
                         f"optimum-cli export onnx --model {model} {path.name}-onnx")
    if path.is_dir() or is_kind(path):
        what = "a directory" if path.is_dir() else f"an input file ({path.suffix.lower()})"
        raise InputError(f"MODEL {model} is {what}, not an ONNX model: the first argument is the model (.onnx), the "
                         "second the input, as in onnx-lrp explain MODEL.onnx INPUT")


BUILD_NOTE_BYTES = 20 * 2**20  # models this large take seconds to rewrite: say so on stderr


def precision_note(ex) -> str:
    """`` (float16)`` in a summary line when the relevance model computes in the model's own type, else ``""``."""
    kind = ex.relevance_model.model_precision
    return "" if kind == "float32" else f" ({kind})"


def uses_tf32(ex) -> bool:
    """Whether the run computed with TF32 (asked for, and on CUDA)."""
    return bool(ex.options.tf32 and ex.device == "cuda")


def device_note(ex) -> str:
    """`` (TF32)`` after the device in a summary line when the run computed with TF32, else ``""``."""
    return " (TF32)" if uses_tf32(ex) else ""


def build_explainer(model, composite: Composite, build: BuildOptions, run: RunOptions):
    """``onnx_lrp.Explainer(model, composite, build=build, run=run)``; for large model files one line on stderr says
    what is happening before the build (seconds for a ResNet) and one how long it took (deterministic: by file size,
    so small models and failures keep stderr to one line)."""
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
    ex = onnx_lrp.Explainer(model, composite=composite, build=build, run=run)
    if large:
        click.echo(f"onnx-lrp: built in {time.perf_counter() - t0:.1f} s ({ex.n_nodes} nodes)", err=True)
    return ex


# click's option (its dest) -> the field of BuildOptions / RunOptions it sets: a click option named as a field sets
# it (a new run option needs no line here); --output's dest is output_name; --constant / --input-shape are parsed
BUILD_FIELDS = {"output_name": "output", **{f.name: f.name for f in dataclasses.fields(BuildOptions)
                                            if f.name not in ("output", "constants", "input_shapes", "device")}}
RUN_FIELDS = {f.name: f.name for f in dataclasses.fields(RunOptions)}


@dataclass(frozen=True)
class Setup:
    """What the command line's options make of a model's explainer (:func:`explainer_setup`): the preprocessing of
    image inputs, the rule parameters given, the composite with them, the build and run options (the --constant
    bindings and --input-shape sizes among the build options), and the note to print when the ZBox bounds were
    taken from the pixel range (None otherwise)."""

    pre: Preprocess
    params: dict
    composite: Composite
    build: BuildOptions
    run: RunOptions
    zbox_note: str | None = None
    bounds_from: str | None = None  # "mean/std" or "pixels" when the box-rule bounds were derived (box_bounds)

    @property
    def constants(self) -> dict:
        return self.build.constants or {}

    @property
    def input_shapes(self) -> dict:
        return self.build.input_shapes or {}

    def bindings(self) -> dict:
        """The --constant and --input-shape keywords of an Explainer (only those given)."""
        return {k: v for k, v in (("constants", self.constants), ("input_shapes", self.input_shapes)) if v}

    def keywords(self) -> dict:
        """These options as the Explainer's keywords (what a dataset's manifest records)."""
        b, r = self.build, self.run
        return dict(composite=self.composite, device=r.device, tf32=r.tf32, precision=b.precision, strict=r.strict,
                    precise=r.precise, output=b.output, start=r.start, relevance_at=b.relevance_at,
                    **self.bindings())

    def changed(self, **fields) -> "Setup":
        """This setup with fields of its BuildOptions / RunOptions changed (``ledger=True``, ``input_shapes=``)."""
        build = {k: v for k, v in fields.items() if k not in RUN_FIELDS.values()}
        run = {k: v for k, v in fields.items() if k in RUN_FIELDS.values()}
        return dataclasses.replace(self, build=dataclasses.replace(self.build, **build),
                                   run=dataclasses.replace(self.run, **run))

    def explainer(self, model, **fields):
        """The explainer of ``model`` with these options (``fields`` changed: :meth:`changed`;
        :func:`build_explainer`)."""
        setup = self.changed(**fields) if fields else self
        return build_explainer(model, setup.composite, setup.build, setup.run)

    def read(self, path, specs) -> Batch:
        """The inputs at ``path`` for a model with inputs ``specs``, preprocessed (:func:`load_inputs`); their notes
        on stderr. Refused when the box-rule bounds came from --mean/--std but the arrays were not in [0, 1] before
        normalisation (normalised already?); warned when --mean/--std normalise values outside [0, 1]."""
        batch = load_inputs(path, specs, self.pre)
        for note in dict.fromkeys(batch.notes):
            click.echo(f"onnx-lrp: {note}", err=True)
        if batch.outside_unit and self.bounds_from == "mean/std":
            raise InputError(f"{batch.outside_unit}, outside [0, 1]: the box-rule bounds from --mean/--std are those "
                             "of values in [0, 1] before normalisation; if the array is normalised already, drop "
                             "--mean/--std and give its range with --low/--high")
        if batch.outside_unit:
            click.echo(f"onnx-lrp: warning: {batch.outside_unit}, outside [0, 1]: --mean/--std normalise arrays as "
                       "they do pixels in [0, 1]; drop them if the array is normalised already", err=True)
        return batch


def explainer_setup(model, options, *, data_kind=None, pre: Preprocess | None = None) -> Setup:
    """The one mapping of click's options (a command's whole option dict, read, never popped) to an explainer's
    setup: --size/--mean/--std/--crop (unless ``pre`` is given: read by the caller already, or a command without
    image inputs), the composite (--composite) with the rule parameters, and the build and run options
    (:data:`BUILD_FIELDS`, :data:`RUN_FIELDS`, --constant, --input-shape); options a command does not have take
    their defaults.

    ``data_kind``: the kind of the inputs ("image", "npy", ...), or a function giving it, called only when it
    matters: for image inputs and a composite with ZBox but no --low/--high, the bounds are the pixel range after
    --mean/--std (:func:`box_bounds`)."""
    check_model_arg(model)
    pre = preprocess(options) if pre is None else pre
    constants = parse_constants(options.get("constants", ()))
    input_shapes = parse_input_shapes(options.get("input_shapes", ()))
    params = rule_params(options)
    comp = composite_with(options.get("composite", DEFAULT_COMPOSITE), {})
    note, source = box_bounds(model, data_kind, comp, params, pre)
    run = RunOptions(**{f: options[k] for k, f in RUN_FIELDS.items() if options.get(k) is not None})
    given = {f: tuple(v) if f == "relevance_at" else v for k, f in BUILD_FIELDS.items()
             if (v := options.get(k)) is not None}
    build = BuildOptions(**given, constants=constants or None, input_shapes=input_shapes or None,
                         device=_build_device(options))
    return Setup(pre, params, composite_with(comp, params), build, run, note, source)


def _build_device(options) -> str:
    """The device the relevance model is built for: --device resolved ("auto": CUDA when onnxruntime has it); the
    CPU for a command without --device."""
    if options.get("device") is None:
        return "cpu"
    from onnx_lrp.run.runtime import resolve_device

    return resolve_device(options["device"])


def common(f):
    """--composite, the rule parameters, --constant and --input-shape."""
    return composite_option(rule_options(constant_option(input_shape_option(f))))


__all__ = ["BINDING_ROWS", "DEFAULT_COMPOSITE", "INPUT_ROWS", "RULE_ROWS", "Setup", "bounds", "build_explainer", "common", "explainer_setup",
           "precision_note", "uses_tf32", "device_note",
           "composite_option", "composite_with", "constant_option", "parse_constants", "input_shape_option",
           "parse_input_shapes", "box_bounds", "check_model_arg",
           "input_options", "preprocess", "rule_options", "rule_params", "takes"]
