"""When a sample of a regression check drifts, and which drift fails the check: the thresholds (defaults, the
``[check]`` table of ``.onnx-lrp.toml``, the command line) and the metrics of a sample beyond them.

A sample drifts in three kinds, told apart (:data:`KINDS`): **outputs** (``output_diff`` beyond its threshold: the
model computes other numbers), **relevance** (a relevance metric on the wrong side of its threshold, or relevance that
is not finite: the explanation moved) and **predictions** (the arg-max of the explained output changed).
``Thresholds.fail_on`` names the kinds that fail the check (default: relevance and predictions; output drift alone
is reported, not failed: a re-export or quantization that moves the logits a little but explains the same is no
regression of the explanation). Thresholds (:class:`Thresholds`) have documented defaults, can be set in a TOML
file (``[check]`` table of ``.onnx-lrp.toml``) and on the command line; a threshold set to ``false`` / ``off`` is
not checked.
"""
from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import InputError


CONFIG_NAME = ".onnx-lrp.toml"
CONFIG_TABLE = "check"

# metric -> (threshold field, direction): "min" = must be >= threshold, "max" = must be <= threshold
METRICS = {
    "output_diff": ("max_output_diff", "max"),
    "cosine": ("min_cosine", "min"),
    "rel_l2": ("max_rel_l2", "max"),
    "spearman": ("min_spearman", "min"),
    "topk_iou": ("min_topk_iou", "min"),
}
# the kinds of drift, each with the metrics that show it (predictions: the arg-max, not a metric)
KINDS = ("outputs", "relevance", "predictions")
KIND_OF_METRIC = {"output_diff": "outputs", "cosine": "relevance", "rel_l2": "relevance", "spearman": "relevance",
                  "topk_iou": "relevance"}
KIND_NAMES = {"outputs": "OutputDrift", "relevance": "RelevanceDrift", "predictions": "PredictionChanged"}
DEFAULT_FAIL_ON = ("relevance", "predictions")
METRIC_HELP = {
    "output_diff": "max |y - y0| / max |y0| of the explained output",
    "cosine": "cosine similarity of the relevance",
    "rel_l2": "||r - r0|| / ||r0|| of the relevance divided by its sum of |r| (its shape)",
    "spearman": "Spearman rank correlation of the relevance",
    "topk_iou": "IoU of the top-k % most relevant features",
}


@dataclass(frozen=True)
class Thresholds:
    """When a sample counts as drifted. ``None`` switches a metric's check off.

    The defaults accept float rounding, re-exports, ORT graph optimisation and float16 weights, and reject a
    visibly different explanation: on the demo model a +-30 % perturbation of one convolution's weights or int8
    static quantization fail them (docs/ci-regression.md has the figures).
    """

    max_output_diff: float | None = 0.02
    min_cosine: float | None = 0.995
    max_rel_l2: float | None = 0.1
    min_spearman: float | None = 0.95
    min_topk_iou: float | None = 0.8
    topk_percent: float = 10.0
    fail_on: tuple = DEFAULT_FAIL_ON  # the kinds of drift that fail the check (KINDS)

    def replace(self, **kw) -> "Thresholds":
        return dataclasses.replace(self, **kw)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["fail_on"] = list(self.fail_on)
        return d


DEFAULT_THRESHOLDS = Thresholds()
_FIELDS = {f.name for f in dataclasses.fields(Thresholds)}


def parse_fail_on(value) -> tuple:
    """The kinds of drift that fail a check, from ``outputs,relevance`` (command line), a TOML list of them, or
    ``none`` (nothing fails: report only); in the order of :data:`KINDS`."""
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value]
    else:
        raise InputError(f"fail_on = {value!r}: give a list of {', '.join(KINDS)} (or \"none\")")
    if items in (["none"], []):
        return ()
    unknown = [v for v in items if v not in KINDS]
    if unknown:
        raise InputError(f"fail_on: unknown kind {unknown[0]!r}; give any of {', '.join(KINDS)} (comma-separated), "
                         "or none")
    return tuple(k for k in KINDS if k in items)


def parse_threshold(value, key: str):
    """A threshold from TOML or the command line: a number, or off/false/none (not checked); ``fail_on``: the kinds
    of drift that fail (:func:`parse_fail_on`)."""
    if key == "fail_on":
        return parse_fail_on(value)
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in (
            "off", "false", "none", "no")):
        if key == "topk_percent":
            raise InputError("topk_percent cannot be switched off; give a percentage in (0, 100]")
        return None
    if isinstance(value, bool):
        raise InputError(f"threshold {key} = true: give a number, or false to switch the check off")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"threshold {key} = {value!r} is not a number (or off)") from None
    if not math.isfinite(v):
        raise InputError(f"threshold {key} = {value!r} is not a finite number")
    if key == "topk_percent" and not 0 < v <= 100:
        raise InputError(f"topk_percent = {v} must be in (0, 100]")
    if key in ("max_output_diff", "max_rel_l2") and v < 0:
        raise InputError(f"threshold {key} = {v} must be >= 0")
    if key in ("min_cosine", "min_spearman") and not -1 <= v <= 1:
        raise InputError(f"threshold {key} = {v} must be in [-1, 1]")
    if key == "min_topk_iou" and not 0 <= v <= 1:
        raise InputError(f"threshold {key} = {v} must be in [0, 1]")
    return v


def load_thresholds(config: "str | os.PathLike | None" = None, overrides: dict | None = None,
                    cwd: "str | os.PathLike | None" = None) -> tuple[Thresholds, str | None]:
    """Defaults, then the ``[check]`` table of ``config`` (or of ``.onnx-lrp.toml`` in ``cwd`` when it exists),
    then ``overrides`` (command line; keys are Thresholds fields, values None = not given). Returns the thresholds
    and the config file used (or None)."""
    th = DEFAULT_THRESHOLDS
    used = None
    path = Path(config) if config is not None else Path(cwd or os.getcwd()) / CONFIG_NAME
    if config is not None or path.is_file():
        if not path.is_file():
            raise InputError(f"config file {path} not found; give a TOML file with a [{CONFIG_TABLE}] table")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"config file {path} is not valid TOML ({exc})") from None
        except RecursionError:
            raise InputError(f"config file {path} is nested too deeply to read; give a plain [{CONFIG_TABLE}] "
                             "table") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"config file {path} cannot be read ({exc})") from None
        if config is not None and CONFIG_TABLE not in data:  # given on purpose: it must say something
            raise InputError(f"config file {path} has no [{CONFIG_TABLE}] table; give the thresholds there (e.g. "
                             f"[{CONFIG_TABLE}] min_cosine = 0.99)")
        table = data.get(CONFIG_TABLE, {})
        if not isinstance(table, dict):
            raise InputError(f"config file {path}: [{CONFIG_TABLE}] must be a table")
        unknown = sorted(set(table) - _FIELDS)
        if unknown:
            raise InputError(f"config file {path}: unknown key(s) {', '.join(unknown)} in [{CONFIG_TABLE}]; known: "
                             f"{', '.join(sorted(_FIELDS))}")
        th = th.replace(**{k: parse_threshold(v, k) for k, v in table.items()})
        used = str(path)
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = sorted(set(given) - _FIELDS)
    if unknown:
        raise InputError(f"unknown threshold(s) {', '.join(unknown)}")
    th = th.replace(**{k: parse_threshold(v, k) for k, v in given.items()})
    return th, used


def failures(metrics: dict, th: Thresholds) -> list[str]:
    """The metrics of one sample beyond their thresholds, as readable strings (any kind)."""
    return [m for kind in ("outputs", "relevance") for m in drift(metrics, th).get(kind, [])]


def drift(metrics: dict, th: Thresholds, predicted: tuple[int, int] | None = None) -> dict[str, list[str]]:
    """The drift of one sample by kind (:data:`KINDS`; only kinds that drifted): the metrics beyond their
    thresholds as readable strings, and ``predicted`` (baseline, current) when the arg-max changed."""
    out: dict[str, list[str]] = {}
    for name, (key, direction) in METRICS.items():
        limit = getattr(th, key)
        v = metrics[name]
        if limit is None:
            continue
        kind = out.setdefault(KIND_OF_METRIC[name], [])
        if v is None or (isinstance(v, float) and math.isnan(v)):
            kind.append(f"{name} is not finite")
        elif direction == "min" and v < limit:
            kind.append(f"{name} {v:.4g} < {limit:g}")
        elif direction == "max" and v > limit:
            kind.append(f"{name} {v:.4g} > {limit:g}")
    if predicted is not None and predicted[0] != predicted[1]:
        out["predictions"] = [f"prediction {predicted[0]} -> {predicted[1]}"]
    return {k: out[k] for k in KINDS if out.get(k)}


__all__ = ["CONFIG_NAME", "CONFIG_TABLE", "DEFAULT_FAIL_ON", "DEFAULT_THRESHOLDS", "KINDS", "KIND_NAMES",
           "KIND_OF_METRIC", "METRICS", "METRIC_HELP", "Thresholds", "drift", "failures", "load_thresholds",
           "parse_fail_on", "parse_threshold"]
