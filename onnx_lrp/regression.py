"""Regression checks for explanations: metrics, the snapshot file, comparisons and reports (no onnx import).

A **snapshot** (``onnx-lrp snapshot``) is a plain ``.npz`` (written with ``np.savez_compressed``, read with
``allow_pickle=False``) holding everything a later check needs, so that the check is reproducible from the file
alone:

==========================  ==========================================================================
``meta``                    a JSON string: format and version, onnx-lrp version, the model's SHA-256 and
                            file name, the composite (its TOML text and name), rule-parameter overrides,
                            ``start``, the explained output, the target request, item names, date
``inputs/<name>``           the model inputs, as fed to the model
``targets``                 int64 [N]: the explained index per item (arg-max resolved at snapshot time)
``outputs/<name>``          every model output (quantized and float16 models: the deployed model's, as
                            onnxruntime computed them on the snapshot's machine)
``forward/<name>``          quantized and float16 models only: the explained output of the explained forward
                            (the float path the relevance is computed on)
``relevance/<name>``        the relevance of every float input
==========================  ==========================================================================

``meta`` also records the machine (``machine``: architecture, onnxruntime version, int8 CPU flags, whether
onnxruntime's int8 sums saturate there) and the gap between deployed outputs and explained forward
(``deployed_gap``), so that a check on another CPU can say when the deployed outputs differ between the two.

**Metrics** (per sample; relevance of all inputs flattened into one vector, in float64):

- ``output_diff``  max |y - y0| / max |y0| over the explained output (e.g. the logits) of the explained forward
  (``forward/<name>`` where stored, else ``outputs/<name>``): the relative change of the prediction the relevance
  is computed on, the same on every CPU (upper threshold);
- ``cosine``       cosine similarity of the relevance vectors (lower threshold);
- ``rel_l2``       ||r - r0|| / ||r0|| (upper threshold);
- ``spearman``     Spearman rank correlation of the relevance (ties get their average rank; lower threshold);
- ``topk_iou``     intersection over union of the top-k % most relevant features (largest relevance values, k from
  ``topk_percent``; lower threshold).

A sample **drifts** when any metric is on the wrong side of its threshold, or its relevance is not finite.
Thresholds (:class:`Thresholds`) have documented defaults, can be set in a TOML file (``[check]`` table of
``.onnx-lrp.toml``) and on the command line; a threshold set to ``false`` / ``off`` is not checked.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .core.errors import InputError
from .core.interface import FORWARD_PREFIX
from .metrics import similarity
from .run import deployed_gap as gaps


FORMAT = "onnx-lrp-snapshot"
FORMAT_VERSION = 1
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
METRIC_HELP = {
    "output_diff": "max |y - y0| / max |y0| of the explained output",
    "cosine": "cosine similarity of the relevance",
    "rel_l2": "||r - r0|| / ||r0|| of the relevance",
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

    def replace(self, **kw) -> "Thresholds":
        return dataclasses.replace(self, **kw)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


DEFAULT_THRESHOLDS = Thresholds()
_FIELDS = {f.name for f in dataclasses.fields(Thresholds)}


def parse_threshold(value, key: str):
    """A threshold from TOML or the command line: a number, or off/false/none (not checked)."""
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
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"config file {path} cannot be read ({exc})") from None
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


# ---------------------------------------------------------------------------------------------- metrics
def cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    """||b - a|| / ||a|| (a: the baseline)."""
    na = float(np.linalg.norm(a))
    d = float(np.linalg.norm(b - a))
    if na == 0.0:
        return 0.0 if d == 0.0 else math.inf
    return d / na


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two relevance maps (:func:`onnx_lrp.metrics.similarity.spearman`).

    A constant map has no ranking (there the correlation is undefined: NaN); a regression check compares a map with
    its baseline, so two constant maps (e.g. all zero both times) count as the same ranking (1.0) and a constant map
    against a varying one as no agreement (0.0)."""
    rho = similarity.spearman(a, b)
    if not math.isnan(rho):
        return rho
    return 1.0 if _constant(a) and _constant(b) else 0.0


def _constant(a: np.ndarray) -> bool:
    a = np.asarray(a).ravel()
    return bool(np.all(a == a[0])) if a.size else True


def topk_count(n: int, percent: float) -> int:
    return max(1, min(n, int(round(n * percent / 100.0))))


def topk_iou(a: np.ndarray, b: np.ndarray, percent: float) -> float:
    """IoU of the index sets of the k largest values (ties broken by index, stably)."""
    k = topk_count(a.size, percent)
    ia = set(np.argsort(-a, kind="mergesort")[:k].tolist())
    ib = set(np.argsort(-b, kind="mergesort")[:k].tolist())
    return len(ia & ib) / len(ia | ib)


def output_diff(y0: np.ndarray, y: np.ndarray) -> float:
    y0, y = np.asarray(y0, np.float64).ravel(), np.asarray(y, np.float64).ravel()
    scale = float(np.max(np.abs(y0))) if y0.size else 0.0
    d = float(np.max(np.abs(y - y0))) if y0.size else 0.0
    if not math.isfinite(d):
        return math.inf
    return d / scale if scale > 0 else (0.0 if d == 0 else math.inf)


def sample_metrics(r0: np.ndarray, r: np.ndarray, y0: np.ndarray, y: np.ndarray, topk_percent: float) -> dict:
    """Every metric for one sample (relevance vectors flattened, float64)."""
    r0 = np.asarray(r0, np.float64).ravel()
    r = np.asarray(r, np.float64).ravel()
    out = {"output_diff": output_diff(y0, y)}
    if not (np.all(np.isfinite(r)) and np.all(np.isfinite(r0))):
        out.update(cosine=math.nan, rel_l2=math.nan, spearman=math.nan, topk_iou=math.nan)
        return out
    out.update(cosine=cosine(r0, r), rel_l2=rel_l2(r0, r), spearman=spearman(r0, r),
               topk_iou=topk_iou(r0, r, topk_percent))
    return out


def failures(metrics: dict, th: Thresholds) -> list[str]:
    """The metrics of one sample beyond their thresholds, as readable strings."""
    out = []
    for name, (key, direction) in METRICS.items():
        limit = getattr(th, key)
        v = metrics[name]
        if limit is None:
            continue
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append(f"{name} is not finite")
        elif direction == "min" and v < limit:
            out.append(f"{name} {v:.4g} < {limit:g}")
        elif direction == "max" and v > limit:
            out.append(f"{name} {v:.4g} > {limit:g}")
    return out


# ---------------------------------------------------------------------------------------------- comparison
@dataclass
class Result:
    """One explanation set: relevance by input name, the explained output, targets, item names."""

    relevance: dict
    explained: np.ndarray
    targets: np.ndarray
    items: list
    outputs: dict = field(default_factory=dict)
    forward: np.ndarray | None = None  # the explained forward's explained output, where it differs from ``explained``

    @property
    def explained_forward(self) -> np.ndarray:
        return self.explained if self.forward is None else self.forward


@dataclass
class Sample:
    item: str
    index: int
    target: int
    predicted_baseline: int
    predicted_current: int
    metrics: dict
    failed: list

    @property
    def passed(self) -> bool:
        return not self.failed


@dataclass
class Comparison:
    samples: list
    thresholds: Thresholds

    @property
    def drifted(self) -> list:
        return [s for s in self.samples if not s.passed]

    @property
    def passed(self) -> bool:
        return not self.drifted

    def summary(self) -> dict:
        """Per metric over samples: mean, min, max (finite values; NaN when none)."""
        out = {}
        for name in METRICS:
            vals = np.array([s.metrics[name] for s in self.samples], dtype=np.float64)
            fin = vals[np.isfinite(vals)]
            out[name] = dict(mean=float(fin.mean()) if fin.size else math.nan,
                             min=float(vals.min()) if vals.size else math.nan,
                             max=float(vals.max()) if vals.size else math.nan)
            # the bad end: the largest value of a "max" metric, the smallest of a "min" metric; NaN counts as worst
            bad_high = METRICS[name][1] == "max"
            order = np.where(np.isnan(vals), -np.inf if not bad_high else np.inf, vals)
            k = (int(np.argmax(order)) if bad_high else int(np.argmin(order))) if vals.size else None
            out[name]["worst"] = float(vals[k]) if k is not None else math.nan
            out[name]["worst_item"] = self.samples[k].item if k is not None else None
            out[name]["p95"] = (float(np.percentile(fin, 95 if bad_high else 5)) if fin.size else math.nan)
        return out


def flat_relevance(relevance: dict, i: int) -> np.ndarray:
    return np.concatenate([np.asarray(relevance[k][i], np.float64).ravel() for k in sorted(relevance)])


def compare(base: Result, cur: Result, th: Thresholds = DEFAULT_THRESHOLDS) -> Comparison:
    if sorted(base.relevance) != sorted(cur.relevance):
        raise InputError(f"the relevance is for inputs {', '.join(sorted(cur.relevance))} but the baseline has "
                         f"{', '.join(sorted(base.relevance))}; the model's inputs changed")
    n = len(base.items)
    for k in base.relevance:
        if base.relevance[k].shape != cur.relevance[k].shape:
            raise InputError(f"relevance of input {k!r} has shape {'x'.join(map(str, cur.relevance[k].shape))} but "
                             f"the baseline's is {'x'.join(map(str, base.relevance[k].shape))}")
    if base.explained.shape[0] != n or cur.explained.shape[0] != n:
        raise InputError("baseline and current explanations have different numbers of items")
    yb = base.explained.reshape(n, -1)
    yc = cur.explained.reshape(n, -1)
    if yb.shape != yc.shape:
        raise InputError(f"the explained output has {yc.shape[1]} entries per item but the baseline's has "
                         f"{yb.shape[1]}")
    # output_diff on the explained forward: deployed int8 outputs differ between CPUs (deployed_difference)
    fb = base.explained_forward.reshape(n, -1)
    fc = cur.explained_forward.reshape(n, -1)
    samples = []
    for i in range(n):
        m = sample_metrics(flat_relevance(base.relevance, i), flat_relevance(cur.relevance, i), fb[i], fc[i],
                           th.topk_percent)
        samples.append(Sample(str(base.items[i]), i, int(base.targets[i]), int(np.argmax(yb[i])),
                              int(np.argmax(yc[i])) if np.all(np.isfinite(yc[i])) else -1, m, failures(m, th)))
    return Comparison(samples, th)


def explain_all(ex, arrays: dict, targets=None, batch_size: int = 32, progress=None, gaps_out: list | None = None
                ) -> tuple[dict, dict, np.ndarray]:
    """Run an Explainer over a batch dict in chunks: (relevance by input, outputs by name, targets used).

    Where the outputs are a deployed model's (quantized, float16), the explained forward's explained output is among
    the outputs as ``FORWARD_PREFIX + name``, and each chunk's :class:`onnx_lrp.run.deployed_gap.Gap` is appended to ``gaps_out``
    (items counted over the whole batch). ``progress(done, total)`` is called after each chunk."""
    n = next(iter(arrays.values())).shape[0]
    rel, outs, used = [], [], []
    for lo in range(0, n, batch_size):
        if progress is not None and lo:
            progress(lo, n)
        hi = min(n, lo + batch_size)
        t = None if targets is None else (targets[lo:hi] if np.ndim(targets) else targets)
        res = ex.explain({k: a[lo:hi] for k, a in arrays.items()}, target=t)
        r = res.relevance if isinstance(res.relevance, dict) else {ex.relevance_inputs[0]: res.relevance}
        rel.append(r)
        outs.append(dict(res.outputs))
        if res.forward is not None and res.forward is not res.outputs:
            outs[-1][FORWARD_PREFIX + ex.explained_output] = res.forward[ex.explained_output]
        if gaps_out is not None and res.deployed_gap is not None:
            gaps_out.append(res.deployed_gap.shifted(lo))
        used.append(np.asarray(res.target, np.int64))
    if progress is not None:
        progress(n, n)
    relevance = {k: np.concatenate([r[k] for r in rel]) for k in rel[0]}
    outputs = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
    return relevance, outputs, np.concatenate(used)


def deployed_difference(base: Result, cur: Result, step: float | None, machines: dict | None = None) -> dict | None:
    """How far the deployed outputs of the current run are from the baseline's (both stored as outputs), for
    models with a deployed run (``forward`` stored): int8 kernels compute differently on CPUs with and without
    VNNI, so a baseline from another machine can differ here while the explanation (compared on the explained
    forward) does not. None for float models."""
    if base.forward is None or base.explained.shape != cur.explained.shape:
        return None
    n = len(base.items)
    g = gaps.measure("", base.explained, cur.explained, step, n)
    return dict(max_abs=g.max_abs, item=str(base.items[g.item]) if n else None, index=g.index,
                tolerance=g.tolerance, differ=g.beyond, machines=machines or {})


def deployed_difference_message(d: dict, output: str) -> str:
    """One line for a deployed difference beyond the tolerance, with the int8 facts of both machines."""
    m = d.get("machines") or {}

    def fact(x):
        if not x:
            return "unknown"
        sat = x.get("int8_saturates")
        return ("int8 sums saturate" if sat else "int8 sums exact" if sat is False else "int8 unknown") + \
            f", onnxruntime {x.get('onnxruntime')}, flags {','.join(x.get('cpu_flags') or []) or '?'}"
    return (f"the deployed outputs differ from the baseline's by up to {d['max_abs']:.3g} on {output}[{d['index']}] "
            f"of {d['item']} (tolerance {d['tolerance']:.3g}): onnxruntime's int8 kernels compute differently on the "
            f"baseline's machine ({fact(m.get('baseline'))}) and this one ({fact(m.get('current'))}); the "
            "explanations are compared on the explained forward, which does not depend on the int8 kernels")


# ---------------------------------------------------------------------------------------------- snapshot file
def model_sha256(path) -> str:
    """The digest of a model file together with its external data files (the loader's)."""
    from .load import model_sha256 as digest

    return digest(path)


def composite_source(spec) -> tuple[str, str]:
    """(name, TOML text) of a built-in composite name or a composite file."""
    from .rules.composite import BUILTIN_DIR, builtin_names

    text = str(spec)
    path = Path(text)
    if path.suffix == ".toml" or path.exists():
        try:
            return path.stem, path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"composite file {path} cannot be read ({exc})") from None
    key = text.replace("_", "-").lower()
    builtin = BUILTIN_DIR / f"{key}.toml"
    if not builtin.is_file():
        raise InputError(f"unknown composite {text!r}; built-in composites: {', '.join(builtin_names())}")
    return key, builtin.read_text(encoding="utf-8")


def params_to_json(params: dict) -> dict:
    """Rule-parameter overrides as JSON (arrays as {"array": nested lists, "dtype": ...})."""
    out = {}
    for k, v in params.items():
        if isinstance(v, np.ndarray) or isinstance(v, (list, tuple)):
            a = np.asarray(v)
            out[k] = {"array": a.tolist(), "dtype": str(a.dtype)}
        elif isinstance(v, (np.floating, np.integer)):
            out[k] = v.item()
        else:
            out[k] = v
    return out


def params_from_json(data: dict) -> dict:
    out = {}
    for k, v in (data or {}).items():
        out[k] = np.asarray(v["array"], dtype=v.get("dtype", "float32")) if isinstance(v, dict) else v
    return out


@dataclass
class Snapshot:
    meta: dict
    inputs: dict
    targets: np.ndarray
    outputs: dict
    relevance: dict
    forward: dict = field(default_factory=dict)

    @property
    def items(self) -> list:
        return list(self.meta.get("items") or [f"item[{i}]" for i in range(len(self.targets))])

    def composite(self):
        """The stored composite with its parameter overrides."""
        from .rules.composite import parse_composite

        c = self.meta["composite"]
        try:
            return parse_composite(c["toml"], source=c["name"]).with_params(**params_from_json(c.get("params")))
        except ValueError as exc:
            raise InputError(f"the snapshot's composite cannot be used: {exc}") from None

    def result(self) -> Result:
        name = self.meta["explained_output"]
        return Result(self.relevance, self.outputs[name], self.targets, self.items, self.outputs,
                      self.forward.get(name))


def snapshot_arrays(*, inputs: dict, targets, outputs: dict, relevance: dict, model_path, composite_name: str,
                    composite_toml: str, params: dict, start: str, output: str | None, explained_output: str,
                    target_request, items: list, batch_size: int = 32, notes: list | None = None,
                    machine: dict | None = None, deployed_gap: dict | None = None) -> dict:
    """The arrays of a snapshot file (``np.savez_compressed(path, **arrays)``), metadata as one JSON string."""
    from . import __version__

    meta = dict(format=FORMAT, format_version=FORMAT_VERSION, onnx_lrp_version=__version__,
                created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                model=dict(file=Path(model_path).name, sha256=model_sha256(model_path)),
                composite=dict(name=composite_name, toml=composite_toml, params=params_to_json(params)),
                start=start, output=output, explained_output=explained_output,
                target_request=target_request, items=[str(i) for i in items], batch_size=int(batch_size),
                inputs=sorted(inputs), relevance=sorted(relevance),
                outputs=sorted(k for k in outputs if not k.startswith(FORWARD_PREFIX)), notes=notes or [],
                machine=machine, deployed_gap=_json_safe(deployed_gap) if deployed_gap else None)
    arrays = {"meta": np.array(json.dumps(meta))}
    arrays.update({f"inputs/{k}": np.asarray(v) for k, v in inputs.items()})
    arrays["targets"] = np.asarray(targets, np.int64)
    for k, v in outputs.items():
        forward = k.startswith(FORWARD_PREFIX)
        arrays[f"forward/{k[len(FORWARD_PREFIX):]}" if forward else f"outputs/{k}"] = np.asarray(v)
    arrays.update({f"relevance/{k}": np.asarray(v) for k, v in relevance.items()})
    return arrays


def read_snapshot(path) -> Snapshot:
    """Read and validate a snapshot (never unpickles); one-line InputError on anything wrong."""
    import zipfile

    path = Path(path)
    if not path.is_file():
        raise InputError(f"baseline {path} not found; create it with `onnx-lrp snapshot MODEL INPUTS -o {path}`")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a plain .npy array
            raise InputError(f"baseline {path} is a single array, not an onnx-lrp snapshot (.npz); create one with "
                             "`onnx-lrp snapshot MODEL INPUTS -o baseline.npz`")
        with loaded as z:
            data = {k: z[k] for k in z.files}
    except InputError:
        raise
    except ValueError as exc:
        raise InputError(f"baseline {path} holds pickled objects or is not an .npz ({str(exc).splitlines()[0]}); "
                         "snapshots hold plain arrays only: recreate it with `onnx-lrp snapshot`") from None
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise InputError(f"baseline {path} is not a valid .npz file ({type(exc).__name__}); it may be truncated; "
                         "recreate it with `onnx-lrp snapshot`") from None
    if "meta" not in data:
        raise InputError(f"baseline {path} is an .npz but not an onnx-lrp snapshot (no 'meta'); create one with "
                         "`onnx-lrp snapshot`")
    try:
        meta = json.loads(str(data["meta"]))
    except (json.JSONDecodeError, TypeError) as exc:
        raise InputError(f"baseline {path}: its metadata is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f"baseline {path} is not an onnx-lrp snapshot (format {meta.get('format')!r})")
    if int(meta.get("format_version", 0)) > FORMAT_VERSION:
        raise InputError(f"baseline {path} has snapshot format {meta.get('format_version')}, newer than this "
                         f"onnx-lrp reads ({FORMAT_VERSION}); upgrade onnx-lrp")
    for key in ("composite", "explained_output", "start", "items"):
        if key not in meta:
            raise InputError(f"baseline {path}: its metadata lacks {key!r}; recreate it with `onnx-lrp snapshot`")

    def group(prefix):
        return {k[len(prefix):]: v for k, v in data.items() if k.startswith(prefix)}

    snap = Snapshot(meta, group("inputs/"), np.asarray(data.get("targets", np.zeros(0)), np.int64),
                    group("outputs/"), group("relevance/"), group("forward/"))
    n = len(snap.targets)
    if not snap.inputs or not snap.relevance or meta["explained_output"] not in snap.outputs:
        raise InputError(f"baseline {path} lacks inputs, relevance or the explained output "
                         f"{meta['explained_output']!r}; recreate it with `onnx-lrp snapshot`")
    for kind, arrs in (("inputs", snap.inputs), ("outputs", snap.outputs), ("relevance", snap.relevance),
                       ("forward", snap.forward)):
        for k, a in arrs.items():
            if a.ndim == 0 or a.shape[0] != n:
                raise InputError(f"baseline {path}: {kind}/{k} has {a.shape[0] if a.ndim else 0} items but "
                                 f"targets has {n}; the file is inconsistent")
    if len(meta["items"]) != n:
        raise InputError(f"baseline {path}: {len(meta['items'])} item names for {n} items")
    return snap


# ---------------------------------------------------------------------------------------------- reports
def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return f"{v:.4f}" if abs(v) < 1000 else f"{v:.3g}"


def format_table(comp: Comparison, max_rows: int | None = None) -> str:
    """A readable table: one row per sample, then the thresholds and a per-metric summary."""
    names = list(METRICS)
    width = max([len("item")] + [len(s.item) for s in comp.samples])
    head = f"{'item':<{width}}  {'target':>6}  {'pred':>7}  " + "  ".join(f"{n:>11}" for n in names) + "  status"
    lines = [head, "-" * len(head)]
    rows = comp.samples if max_rows is None else comp.samples[:max_rows]
    for s in rows:
        pred = f"{s.predicted_baseline}" + ("" if s.predicted_current == s.predicted_baseline else
                                            f">{s.predicted_current}")
        status = "ok" if s.passed else "DRIFT: " + "; ".join(s.failed)
        lines.append(f"{s.item:<{width}}  {s.target:>6}  {pred:>7}  " +
                     "  ".join(f"{_fmt(s.metrics[n]):>11}" for n in names) + f"  {status}")
    if max_rows is not None and len(comp.samples) > max_rows:
        lines.append(f"... {len(comp.samples) - max_rows} more sample(s) (--report-json lists all)")
    th = comp.thresholds
    lim = []
    for n in names:
        key, direction = METRICS[n]
        v = getattr(th, key)
        lim.append(f"{'>=' if direction == 'min' else '<='}{v:g}" if v is not None else "off")
    lines.append(f"{'threshold':<{width}}  {'':>6}  {'':>7}  " + "  ".join(f"{x:>11}" for x in lim) +
                 f"  (top-k: {th.topk_percent:g} %)")
    summ = comp.summary()
    lines.append(f"{'mean':<{width}}  {'':>6}  {'':>7}  " + "  ".join(f"{_fmt(summ[n]['mean']):>11}" for n in names))
    for stat, label in (("p95", "95% worst"), ("worst", "worst")):  # the bad end of each metric (max or min)
        lines.append(f"{label:<{width}}  {'':>6}  {'':>7}  " + "  ".join(f"{_fmt(summ[n][stat]):>11}" for n in names))
    lines.append("worst item per metric: " + ", ".join(f"{n} {summ[n]['worst_item']}" for n in names
                                                         if summ[n]['worst_item'] is not None))
    return "\n".join(lines)


def report_dict(comp: Comparison, context: dict) -> dict:
    return dict(tool="onnx-lrp", **context, passed=comp.passed, thresholds=comp.thresholds.as_dict(),
                n_samples=len(comp.samples), n_drifted=len(comp.drifted),
                drifted=[s.item for s in comp.drifted],
                summary=_json_safe(comp.summary()),
                samples=[dict(item=s.item, index=s.index, target=s.target, predicted_baseline=s.predicted_baseline,
                              predicted_current=s.predicted_current, passed=s.passed, failed=s.failed,
                              metrics=_json_safe(s.metrics)) for s in comp.samples])


def _json_safe(obj):
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def report_json(comp: Comparison, context: dict) -> str:
    return json.dumps(report_dict(comp, context), indent=2) + "\n"


def junit_xml(comp: Comparison, context: dict, suite: str = "onnx-lrp check") -> str:
    """JUnit XML: one testcase per sample (a <failure> for drifted ones), metrics as properties and in
    system-out, thresholds as suite properties."""
    model = Path(str(context.get("model", "model"))).stem
    root = ET.Element("testsuites", name="onnx-lrp", tests=str(len(comp.samples)), failures=str(len(comp.drifted)))
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(comp.samples)), failures=str(len(comp.drifted)),
                       errors="0", skipped="0", time=f"{float(context.get('seconds', 0.0)):.3f}")
    props = ET.SubElement(ts, "properties")
    for k, v in comp.thresholds.as_dict().items():
        ET.SubElement(props, "property", name=f"threshold.{k}", value="off" if v is None else f"{v:g}")
    for k in ("model", "baseline", "model_a", "model_b", "composite"):
        if context.get(k) is not None:
            ET.SubElement(props, "property", name=k, value=str(context[k]))
    deployed = context.get("deployed_outputs")
    if deployed:  # the deployed outputs of the baseline's machine and this one (onnx-lrp check)
        ET.SubElement(props, "property", name="deployed_outputs.max_abs_diff", value=f"{deployed['max_abs']:.4g}")
        ET.SubElement(props, "property", name="deployed_outputs.differ", value=str(bool(deployed["differ"])).lower())
    for s in comp.samples:
        tc = ET.SubElement(ts, "testcase", classname=f"onnx-lrp.{model}", name=s.item, time="0")
        tprops = ET.SubElement(tc, "properties")
        for n in METRICS:
            ET.SubElement(tprops, "property", name=n, value=_fmt(s.metrics[n]))
        figures = ", ".join(f"{n}={_fmt(s.metrics[n])}" for n in METRICS)
        if s.failed:
            f = ET.SubElement(tc, "failure", message="; ".join(s.failed), type="RelevanceDrift")
            f.text = f"target {s.target}: {figures}"
        ET.SubElement(tc, "system-out").text = f"target {s.target}: {figures}"
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


__all__ = ["Thresholds", "DEFAULT_THRESHOLDS", "METRICS", "METRIC_HELP", "load_thresholds", "parse_threshold",
           "cosine", "rel_l2", "spearman", "topk_iou", "topk_count", "output_diff", "sample_metrics",
           "failures", "Result", "Sample", "Comparison", "compare", "explain_all", "model_sha256",
           "deployed_difference", "deployed_difference_message",
           "composite_source", "params_to_json", "params_from_json", "Snapshot", "snapshot_arrays", "read_snapshot",
           "format_table", "report_dict", "report_json", "junit_xml", "FORMAT", "FORMAT_VERSION", "CONFIG_NAME"]
