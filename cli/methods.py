"""``--method NAME`` and the methods' options (captum's names) of ``explain``, ``snapshot`` / ``check`` and
``evaluate``: one reading of the command line into the keywords of ``onnx_lrp.Explainer(model, method=...)``."""
from __future__ import annotations

import click

from onnx_lrp.core.errors import InputError
from onnx_lrp.io.kinds import Kind, is_kind

# click's dest -> (the method option's keyword, the methods that take it)
_IG = ("integrated-gradients",)
_NT = ("smoothgrad", "vargrad")
_SHAP = ("expected-gradients", "gradient-shap")
OPTION_METHODS = {
    "memory_budget": None,  # every method (None: not LRP)
    "n_steps": _IG, "integration": _IG, "baselines": _IG + ("occlusion", "rise") + _SHAP,
    "nt_type": ("smoothgrad",), "nt_samples": _NT, "stdevs": _NT + ("gradient-shap",),
    "seed": _NT + _SHAP + ("rise",), "base": _NT + _IG,
    "sliding_window_shapes": ("occlusion",), "strides": ("occlusion",), "abs": ("gradient",),
    "n_samples": _SHAP, "layer": ("grad-cam",), "relu_attributions": ("grad-cam",),
    "n_masks": ("rise",), "probability": ("rise",),
}
# the help's order: options of one metavar side by side (NAME, N, F, ..., the flags), four lines at 80 columns
METHOD_KEYS = ("method", "base", "layer", "integration", "nt_type", "relu_attributions", "n_steps", "nt_samples",
               "n_samples", "n_masks", "seed", "memory_budget", "stdevs", "probability", "baselines", "strides", "abs",
               "sliding_window_shapes")
assert set(METHOD_KEYS) == {"method", *OPTION_METHODS}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def method_options(f):
    """--method and its options, all default None (so that an option given to a method that does not take it is
    refused by name); in :data:`METHOD_KEYS`' order, options of one metavar side by side in the help."""
    decorators = [
        click.option("--method", default=None, metavar="NAME",
                     help="lrp (default), a composite, gradient, gradient-x-input, integrated-gradients, smoothgrad, "
                          "vargrad, expected-gradients, gradient-shap, grad-cam, occlusion, rise (docs/methods.md)."),
        click.option("--base", default=None, metavar="NAME",
                     help="smoothgrad, vargrad: the smoothed method or composite (default gradient); "
                          "integrated-gradients: a composite whose modified gradient is integrated."),
        click.option("--layer", default=None, metavar="NAME",
                     help="grad-cam: the tensor N x C x H x W it weighs (e.g. the last convolution block's output)."),
        click.option("--integration", default=None, metavar="NAME",
                     help="integrated-gradients: gausslegendre (default), riemann_left|right|middle|trapezoid."),
        click.option("--nt-type", "nt_type", default=None, metavar="NAME", help="smoothgrad|smoothgrad_sq|vargrad."),
        click.option("--n-steps", "n_steps", type=click.IntRange(min=1), default=None, metavar="N",
                     help="integrated-gradients: points on the path (default 50)."),
        click.option("--nt-samples", "nt_samples", type=click.IntRange(min=1), default=None, metavar="N",
                     help="smoothgrad, vargrad: noisy samples (default 5)."),
        click.option("--n-samples", "n_samples", type=click.IntRange(min=1), default=None, metavar="N",
                     help="expected-gradients, gradient-shap: draws per item (default 5)."),
        click.option("--n-masks", "n_masks", type=click.IntRange(min=1), default=None, metavar="N",
                     help="rise: random masks (default 2000)."),
        click.option("--seed", type=click.IntRange(min=0), default=None, metavar="N",
                     help="smoothgrad, vargrad, expected-gradients, gradient-shap, rise: the draws' seed."),
        click.option("--memory-budget", "memory_budget", type=click.IntRange(min=1), default=None, metavar="MB",
                     help="Methods: megabytes the built model and one stacked run may take (default 2048)."),
        click.option("--stdevs", type=click.FloatRange(min=0), default=None, metavar="F",
                     help="smoothgrad, vargrad, gradient-shap: noise standard deviation (default 1; 0)."),
        click.option("--probability", type=click.FloatRange(min=0, max=1, min_open=True), default=None, metavar="F",
                     help="rise: the chance a mask's cell is kept (default 0.5)."),
        click.option("--baselines", default=None, metavar="X|FILE.npy",
                     help="integrated-gradients, occlusion, rise: the baseline, a number or an .npy (default 0); "
                          "expected-gradients, gradient-shap: the background set, an .npy (n x an item's shape)."),
        click.option("--sliding-window-shapes", "sliding_window_shapes", default=None, metavar="A,B,..",
                     help="occlusion: the window, one size per input axis after the batch (several inputs: "
                          "one window each, separated by ';')."),
        click.option("--strides", default=None, metavar="S[,S..]", help="occlusion: the window's step (default 1)."),
        click.option("--abs", "abs", is_flag=True, default=None, help="gradient: its magnitude."),
        click.option("--relu-attributions", "relu_attributions", is_flag=True, default=None,
                     help="grad-cam: its positive part."),
    ]
    for d in reversed(decorators):
        f = d(f)
    return f


def _ints(text: str, flag: str) -> tuple:
    try:
        vals = tuple(int(v) for v in str(text).replace(" ", "").split(",") if v)
    except ValueError:
        raise InputError(f"{flag} {text!r}: give integers separated by commas (3,8,8)") from None
    if not vals:
        raise InputError(f"{flag} {text!r}: give integers separated by commas (3,8,8)")
    return vals


def _baselines(text: str):
    try:
        return float(text)
    except ValueError:
        pass
    if not is_kind(text, Kind.NPY):
        raise InputError(f"--baselines {text!r}: give a number or an .npy file")
    import numpy as np

    try:
        return np.load(text, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"--baselines {text}: cannot read it as an .npy array ({exc})") from None


def _per_input_ints(text: str, flag: str, one=None):
    """Integers separated by commas; several inputs: one group per input, separated by ';' (2;1,3)."""
    if ";" in str(text):
        return tuple(_ints(part, flag) for part in str(text).split(";"))
    vals = _ints(text, flag)
    return one(vals) if one is not None else vals


_PARSE = {"sliding_window_shapes": lambda v: _per_input_ints(v, "--sliding-window-shapes"),
          "strides": lambda v: _per_input_ints(v, "--strides", lambda t: t[0] if len(t) == 1 else t),
          "baselines": _baselines, "memory_budget": lambda v: int(v) * 2**20}


def method_keywords(options: dict) -> tuple[str | None, dict]:
    """(the method of --method, or None for LRP; its keywords) from click's option dict; an option given without
    a method that takes it is refused, naming the methods that do."""
    from onnx_lrp.methods.explain import is_method

    method = options.get("method")
    given = {k: v for k, v in options.items() if k in OPTION_METHODS and v is not None}
    if not is_method(method):
        if given:
            flag = _flag(next(iter(given)))
            raise InputError(f"{flag} is an option of the attribution methods; give --method (docs/methods.md)")
        return None, {}
    _needed(method, given, bool(options.get("baseline_input")))
    keywords = {}
    for k, v in given.items():
        takers = OPTION_METHODS[k]
        if takers is not None and method not in takers:
            raise InputError(f"{_flag(k)} is for --method {' or '.join(takers)}, not {method}")
        keywords[k] = _PARSE.get(k, lambda a: a)(v)
    return method, keywords


# what a method cannot run without, as the command line says it
_NEEDS = {"grad-cam": ("layer", "--layer NAME: the tensor N x C x H x W it weighs (e.g. the last convolution block's "
                                "output; onnx-lrp concepts MODEL --list-layers lists the convolutions' outputs)"),
          "expected-gradients": ("baselines", "--baselines FILE.npy: a background set, n x an item's shape (e.g. "
                                              "some training inputs)")}
_NEEDS["gradient-shap"] = _NEEDS["expected-gradients"]


def _needed(method: str, given: dict, baseline_input: bool = False) -> None:
    """The option ``method`` cannot run without (grad-cam's --layer, the background set unless it is an input:
    rewrite's --baseline-input), refused when missing."""
    need = _NEEDS.get(method)
    if need is None or (baseline_input and need[0] == "baselines"):
        return
    key, what = need
    value = given.get(key)
    if value is None or (key == "baselines" and not is_kind(value, Kind.NPY)):
        raise InputError(f"--method {method} needs {what}")


def with_lrp_method(options: dict) -> dict:
    """click's options with a composite named by --method as --composite (``--method epsilon`` is ``--composite
    epsilon``); refused when --composite names another."""
    from onnx_lrp.methods.explain import is_method

    method = options.get("method")
    if method in (None, "lrp") or is_method(method):
        return options
    composite = options.get("composite")
    if composite not in (None, "auto", method):
        raise InputError(f"--method {method} and --composite {composite} name two rule sets; give one")
    return {**options, "composite": method}


def with_base_params(method: str, keywords: dict, params: dict) -> dict:
    """The rule parameters given (--epsilon, --low/--high, ...) as ``base_options`` of a method over a composite
    (``--base COMPOSITE``: integrated-gradients, smoothgrad, vargrad); refused for any other method."""
    from onnx_lrp.methods.explain import is_method

    if not params:
        return keywords
    base = keywords.get("base")
    if base is None or is_method(base):
        raise InputError(f"a rule parameter ({', '.join(params)}) is LRP's; --method {method} takes one only over a "
                         "composite (--base COMPOSITE)")
    return {**keywords, "base_options": dict(params)}


def method_explainer(model, method: str, keywords: dict, *, output=None, device=None, threads=None):
    """``onnx_lrp.Explainer(model, method=method, **keywords)`` with the run's output, device and threads."""
    import onnx_lrp

    from onnx_lrp.run.runtime import resolve_device

    extra = {k: v for k, v in (("output", output), ("threads", threads)) if v is not None}
    return onnx_lrp.Explainer(model, device=resolve_device(device or "cpu"), method=method, **keywords, **extra)


def snapshot_method(arrays: dict, method: str | None, keywords: dict) -> dict:
    """A snapshot's arrays with the method and its options stored (meta "method"; array options as
    ``method/<option>``), so that check recomputes the same attributions; unchanged for LRP."""
    if method is None:
        return arrays
    import json

    import numpy as np

    meta = json.loads(str(arrays["meta"]))
    plain = {k: v for k, v in keywords.items() if not isinstance(v, np.ndarray)}
    plain = {k: list(v) if isinstance(v, tuple) else v for k, v in plain.items()}
    stored = {f"method/{k}": v for k, v in keywords.items() if isinstance(v, np.ndarray)}
    meta["method"] = {"name": method, "options": plain, "arrays": sorted(k.split("/", 1)[1] for k in stored)}
    return {**arrays, **stored, "meta": np.array(json.dumps(meta))}


def snapshot_keywords(baseline, meta: dict) -> tuple[str | None, dict]:
    """(the method a snapshot was taken with, its options) from its metadata and arrays; (None, {}) for LRP."""
    import numpy as np

    entry = meta.get("method")
    if entry is None:
        return None, {}
    from onnx_lrp.methods.explain import is_method

    if not isinstance(entry, dict) or not is_method(entry.get("name")) or not isinstance(entry.get("options"), dict):
        raise InputError(f"baseline {baseline}: its metadata's method is not one onnx-lrp knows ({entry!r}); "
                         "recreate it with `onnx-lrp snapshot --method ...`")
    keywords = {k: tuple(v) if isinstance(v, list) else v for k, v in entry["options"].items()}
    with np.load(baseline, allow_pickle=False) as z:
        for k in entry.get("arrays", []):
            if f"method/{k}" not in z.files:
                raise InputError(f"baseline {baseline} lacks method/{k}; recreate it with `onnx-lrp snapshot`")
            keywords[k] = z[f"method/{k}"]
    return entry["name"], keywords


__all__ = ["snapshot_method", "snapshot_keywords", "METHOD_KEYS", "OPTION_METHODS", "method_options", "method_keywords", "with_lrp_method", "method_explainer",
           "with_base_params"]
