"""Faithfulness in regression checks: ``snapshot --metrics aopc,abpc`` stores region-perturbation figures with the
baseline; ``check`` recomputes them for the candidate and fails when the paired mean drops by more than its
tolerance, or when the explanation no longer beats the random ordering.

Stored in the snapshot (plain arrays, no pickle): ``faithfulness/<metric>`` [N] per stored metric,
``faithfulness/aopc_random`` [N], ``faithfulness/curve_<order>`` [N, steps + 1]; the settings in the meta JSON
under ``faithfulness``.
"""
from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.brief import brief_repr
from ..core.errors import InputError
from ..core.validate import expect, expect_list_of


TRACKED = {"aopc": "aopc/morf", "abpc": "abpc"}  # --metrics name -> Evaluation score
DEFAULT_TOLERANCE = 0.05
PREFIX = "faithfulness/"


def parse_metrics(text: str | None) -> list[str]:
    """``aopc,abpc`` -> ["aopc", "abpc"]; unknown names refused."""
    if not text:
        return []
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in TRACKED]
    if bad or not names:
        raise InputError(f"--metrics {text!r}: give {' and/or '.join(TRACKED)} (comma-separated)")
    return list(dict.fromkeys(names))


def parse_tolerances(items) -> dict:
    """``("aopc=0.05", "abpc=off")`` (or one comma-separated string) -> {"aopc": 0.05, "abpc": None}."""
    out = {}
    for item in items or ():
        for part in str(item).split(","):
            if not part.strip():
                continue
            name, sep, value = part.partition("=")
            name = name.strip().lower()
            if not sep or name not in TRACKED:
                raise InputError(f"--metric-tol {part!r}: give NAME=DROP with NAME one of {', '.join(TRACKED)} "
                                 "(e.g. aopc=0.05, or aopc=off)")
            value = value.strip().lower()
            if value in ("off", "false", "none"):
                out[name] = None
                continue
            try:
                v = float(value)
            except ValueError:
                raise InputError(f"--metric-tol {part!r}: the tolerance is a number >= 0 or off") from None
            if not math.isfinite(v) or v < 0:
                raise InputError(f"--metric-tol {part!r}: the tolerance is a number >= 0 or off")
            out[name] = v
    return out


def compute(model, ex, x: np.ndarray, relevance: np.ndarray, targets, settings: dict):
    """The region-perturbation Evaluation for stored ``settings`` (patch, steps, baseline, prob, seed)."""
    from . import evaluate

    return evaluate(model, x, metric="region-perturbation", target=np.asarray(targets, np.int64),
                    relevance=relevance, patch=settings["patch"], steps=settings["steps"],
                    baseline=settings["baseline"], prob=settings["prob"], seed=settings["seed"],
                    orders=("morf", "lerf"), explainer=ex)


def snapshot_part(ev, names: list[str]) -> tuple[dict, dict]:
    """(meta entry, arrays) to store with a snapshot."""
    meta = dict(metrics=names, metric="region-perturbation",
                **{k: ev.params[k] for k in ("patch", "steps", "baseline", "prob", "seed")})
    arrays = {f"{PREFIX}{n}": np.asarray(ev.scores[TRACKED[n]], np.float64) for n in names}
    arrays[f"{PREFIX}aopc_random"] = np.asarray(ev.scores["aopc/random"], np.float64)
    arrays.update({f"{PREFIX}curve_{o}": np.asarray(c, np.float64) for o, c in ev.curves.items()})
    return meta, arrays


def add_to_snapshot(arrays: dict, meta_entry: dict, extra: dict) -> dict:
    """The snapshot's arrays with the faithfulness arrays and the meta entry added."""
    meta = json.loads(str(arrays["meta"]))
    meta["faithfulness"] = meta_entry
    out = dict(arrays, **extra)
    out["meta"] = np.array(json.dumps(meta))
    return out


@dataclass
class Stored:
    settings: dict
    scores: dict
    curves: dict

    def __repr__(self) -> str:
        return brief_repr(self, ["settings", "scores", "curves"])


def read_stored(path, meta: dict, n: int) -> Stored | None:
    """The faithfulness figures of a snapshot (validated by regression.read_snapshot first), None if it has none."""
    settings = meta.get("faithfulness")
    if not settings:
        return None
    expect(settings, dict, f"baseline {path}: meta's faithfulness", "recreate it with `onnx-lrp snapshot --metrics ...`")
    with np.load(Path(path), allow_pickle=False) as z:
        data = {k[len(PREFIX):]: z[k] for k in z.files if k.startswith(PREFIX)}
    for key in ("patch", "steps", "baseline", "prob", "seed", "metrics"):
        if key not in settings:
            raise InputError(f"baseline {path}: its faithfulness settings lack {key!r}; recreate it with "
                             "`onnx-lrp snapshot --metrics ...`")
    expect_list_of(settings["metrics"], str, f"baseline {path}: faithfulness metrics")
    for name in [*settings["metrics"], "aopc_random"]:
        if name not in data or data[name].shape != (n,):
            raise InputError(f"baseline {path}: faithfulness/{name} is missing or not one value per item; "
                             "recreate it with `onnx-lrp snapshot --metrics ...`")
    curves = {k[len("curve_"):]: v for k, v in data.items() if k.startswith("curve_")}
    return Stored(settings, {k: v for k, v in data.items() if not k.startswith("curve_")}, curves)


@dataclass
class FaithCheck:
    """The faithfulness part of a check: per metric the baseline and candidate means, the paired mean change, the
    tolerance and whether it passed; and the random-floor condition."""

    rows: list = field(default_factory=list)
    floor: dict = field(default_factory=dict)
    curves: dict = field(default_factory=dict)  # {"baseline": {order: curve}, "current": {...}}

    @property
    def failed(self) -> list[str]:
        out = [f"{r['metric']} mean dropped by {-r['change']:.4f} (> {r['tolerance']:g})" for r in self.rows
               if not r["passed"]]
        if not self.floor.get("passed", True):
            out.append(f"the explanation no longer beats the random order (AOPC {self.floor['aopc']:.4g} <= "
                       f"{self.floor['aopc_random']:.4g})")
        return out

    @property
    def passed(self) -> bool:
        return not self.failed

    def as_dict(self) -> dict:
        return dict(passed=self.passed, failed=self.failed, metrics=self.rows, random_floor=self.floor)

    def __repr__(self) -> str:
        return f"FaithCheck(passed={self.passed}, failed={self.failed!r})"


def check(stored: Stored, ev, tolerances: dict) -> FaithCheck:
    """Compare the candidate's Evaluation with the stored figures, paired per item."""
    fc = FaithCheck(curves=dict(baseline=stored.curves, current=ev.curves))
    for name in stored.settings["metrics"]:
        base = np.asarray(stored.scores[name], np.float64)
        cur = np.asarray(ev.scores[TRACKED[name]], np.float64)
        tol = tolerances.get(name, DEFAULT_TOLERANCE)
        change = float(np.mean(cur - base))
        fc.rows.append(dict(metric=name, baseline=float(base.mean()), current=float(cur.mean()), change=change,
                            tolerance=tol, passed=bool(tol is None or change >= -tol)))
    aopc, rnd = float(np.mean(ev.scores["aopc/morf"])), float(np.mean(ev.scores["aopc/random"]))
    fc.floor = dict(aopc=aopc, aopc_random=rnd, baseline_aopc_random=float(np.mean(stored.scores["aopc_random"])),
                    passed=bool(aopc > rnd))
    return fc


def format_lines(fc: FaithCheck, settings: dict) -> list[str]:
    lines = [f"faithfulness (region perturbation, patch {settings['patch']}, {settings['steps']} regions, "
             f"{settings['baseline']}, {settings['prob']}; paired over the items):"]
    for r in fc.rows:
        tol = "off" if r["tolerance"] is None else f">= -{r['tolerance']:g}"
        lines.append(f"  {r['metric']:<5} baseline {r['baseline']:.4f}  current {r['current']:.4f}  change "
                     f"{r['change']:+.4f} ({tol})  {'ok' if r['passed'] else 'FAIL'}")
    f = fc.floor
    lines.append(f"  random order: AOPC {f['aopc_random']:.4g} (baseline {f['baseline_aopc_random']:.4g}); the "
                 f"explanation's {f['aopc']:.4g} {'beats' if f['passed'] else 'does NOT beat'} it  "
                 f"{'ok' if f['passed'] else 'FAIL'}")
    return lines


def add_to_junit(xml_text: str, fc: FaithCheck, suite_model: str = "model") -> str:
    """The JUnit XML with one more testcase per tracked metric and one for the random floor."""
    head, _, body = xml_text.partition("\n")
    root = ET.fromstring(body)
    ts = root.find("testsuite")
    cases = [(f"faithfulness.{r['metric']}", r["passed"],
              f"{r['metric']}: baseline {r['baseline']:.4f}, current {r['current']:.4f}, change {r['change']:+.4f}, "
              f"tolerance {r['tolerance']}") for r in fc.rows]
    cases.append(("faithfulness.random_floor", fc.floor["passed"],
                  f"AOPC {fc.floor['aopc']:.4f} vs random order {fc.floor['aopc_random']:.4f}"))
    failures = 0
    for name, passed, text in cases:
        tc = ET.SubElement(ts, "testcase", classname=f"onnx-lrp.{suite_model}", name=name, time="0")
        if not passed:
            failures += 1
            ET.SubElement(tc, "failure", message=text, type="FaithfulnessDrop").text = text
        ET.SubElement(tc, "system-out").text = text
    for el in (root, ts):
        el.set("tests", str(int(el.get("tests", "0")) + len(cases)))
        el.set("failures", str(int(el.get("failures", "0")) + failures))
    ET.indent(root)
    return head + "\n" + ET.tostring(root, encoding="unicode") + "\n"
