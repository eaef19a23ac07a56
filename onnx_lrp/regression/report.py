"""Reports of a regression check: the table on stdout, the JSON report and JUnit XML for CI systems (the HTML page
for people: :mod:`.html`). Each names the kind of every drift (outputs, relevance, predictions) and whether it fails
the check (``Thresholds.fail_on``)."""
from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

from ..core.files import printable
from .compare import Comparison
from .thresholds import KIND_NAMES, METRICS


def fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return f"{v:.4f}" if abs(v) < 1000 else f"{v:.3g}"


def format_table(comp: Comparison, max_rows: int | None = None) -> str:
    """A readable table: one row per sample, then the thresholds and a per-metric summary."""
    names = list(METRICS)
    width = max([len("item")] + [len(printable(s.item)) for s in comp.samples])
    head = f"{'item':<{width}}  {'target':>6}  {'pred':>7}  " + "  ".join(f"{n:>11}" for n in names) + "  status"
    lines = [head, "-" * len(head)]
    rows = comp.samples if max_rows is None else comp.samples[:max_rows]
    for s in rows:
        pred = f"{s.predicted_baseline}" + ("" if s.predicted_current == s.predicted_baseline else
                                            f">{s.predicted_current}")
        status = printable(sample_status(s))
        lines.append(f"{printable(s.item):<{width}}  {s.target:>6}  {pred:>7}  " +
                     "  ".join(f"{fmt(s.metrics[n]):>11}" for n in names) + f"  {status}")
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
    lines.append(f"{'':<{width}}  {'':>6}  {'':>7}  " + drift_line(comp))
    summ = comp.summary()
    lines.append(f"{'mean':<{width}}  {'':>6}  {'':>7}  " + "  ".join(f"{fmt(summ[n]['mean']):>11}" for n in names))
    for stat, label in (("p95", "95% worst"), ("worst", "worst")):  # the bad end of each metric (max or min)
        lines.append(f"{label:<{width}}  {'':>6}  {'':>7}  " + "  ".join(f"{fmt(summ[n][stat]):>11}" for n in names))
    lines.append("worst item per metric: " + ", ".join(f"{n} {printable(summ[n]['worst_item'])}" for n in names
                                                         if summ[n]['worst_item'] is not None))
    return "\n".join(lines)


def sample_status(s) -> str:
    """``ok``, or per kind of drift ``FAIL relevance: cosine 0.98 < 0.995`` (a kind that fails the check) or
    ``drift outputs: output_diff 0.0415 > 0.02`` (reported, not failing)."""
    if not s.drift:
        return "ok"
    return " | ".join(f"{'FAIL' if k in s.failed_kinds else 'drift'} {k}: {'; '.join(m)}" for k, m in s.drift.items())


def drift_line(comp: Comparison) -> str:
    """Samples per kind of drift and what fails: ``drift: outputs 7, relevance 0, predictions 0 (fail on relevance,
    predictions)``."""
    fail_on = comp.thresholds.fail_on
    counts = ", ".join(f"{k} {v}" for k, v in comp.drift_counts().items())
    return f"drift: {counts} (fail on {', '.join(fail_on) if fail_on else 'nothing: report only'})"


def report_dict(comp: Comparison, context: dict) -> dict:
    return dict(tool="onnx-lrp", **context, passed=comp.passed, thresholds=comp.thresholds.as_dict(),
                fail_on=list(comp.thresholds.fail_on), drift_counts=comp.drift_counts(),
                n_samples=len(comp.samples), n_drifted=len(comp.drifted),
                drifted=[s.item for s in comp.drifted],
                summary=json_safe(comp.summary()),
                samples=[dict(item=s.item, index=s.index, target=s.target, predicted_baseline=s.predicted_baseline,
                              predicted_current=s.predicted_current, passed=s.passed, failed=s.failed,
                              failed_kinds=list(s.failed_kinds), drift=s.drift,
                              metrics=json_safe(s.metrics)) for s in comp.samples])


def json_safe(obj):
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def report_json(comp: Comparison, context: dict) -> str:
    return json.dumps(report_dict(comp, context), indent=2) + "\n"


def junit_xml(comp: Comparison, context: dict, suite: str = "onnx-lrp check") -> str:
    """JUnit XML: one testcase per sample (a <failure> for drifted ones), metrics as properties and in
    system-out, thresholds as suite properties. Every name and message goes through :func:`printable` (a control
    character cannot be written in XML 1.0, even as a reference: it is escaped as text, ``\\x1b``)."""
    model = printable(Path(str(context.get("model", "model"))).stem)
    root = ET.Element("testsuites", name="onnx-lrp", tests=str(len(comp.samples)), failures=str(len(comp.drifted)))
    ts = ET.SubElement(root, "testsuite", name=printable(suite), tests=str(len(comp.samples)), failures=str(len(comp.drifted)),
                       errors="0", skipped="0", time=f"{float(context.get('seconds', 0.0)):.3f}")
    props = ET.SubElement(ts, "properties")
    for k, v in comp.thresholds.as_dict().items():
        if k != "fail_on":
            ET.SubElement(props, "property", name=f"threshold.{k}", value="off" if v is None else f"{v:g}")
    ET.SubElement(props, "property", name="fail_on", value=",".join(comp.thresholds.fail_on) or "none")
    for k in ("model", "baseline", "model_a", "model_b", "composite"):
        if context.get(k) is not None:
            ET.SubElement(props, "property", name=k, value=printable(context[k]))
    deployed = context.get("deployed_outputs")
    if deployed:  # the deployed outputs of the baseline's machine and this one (onnx-lrp check)
        ET.SubElement(props, "property", name="deployed_outputs.max_abs_diff", value=f"{deployed['max_abs']:.4g}")
        ET.SubElement(props, "property", name="deployed_outputs.differ", value=str(bool(deployed["differ"])).lower())
    for s in comp.samples:
        tc = ET.SubElement(ts, "testcase", classname=f"onnx-lrp.{model}", name=printable(s.item), time="0")
        tprops = ET.SubElement(tc, "properties")
        for n in METRICS:
            ET.SubElement(tprops, "property", name=n, value=fmt(s.metrics[n]))
        ET.SubElement(tprops, "property", name="drift", value=printable(",".join(s.drift) or "none"))
        figures = ", ".join(f"{n}={fmt(s.metrics[n])}" for n in METRICS)
        pred = f"predicted {s.predicted_baseline}" + (f" -> {s.predicted_current}"
                                                      if s.predicted_current != s.predicted_baseline else "")
        text = f"target {s.target}, {pred}: {figures}" + ("\n" + printable(sample_status(s)) if s.drift else "")
        if s.failed:
            f = ET.SubElement(tc, "failure", type=",".join(KIND_NAMES[k] for k in s.failed_kinds),
                              message=printable("; ".join(f"{k}: {'; '.join(s.drift[k])}" for k in s.failed_kinds)))
            f.text = text
        ET.SubElement(tc, "system-out").text = text
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


__all__ = ["drift_line", "fmt", "format_table", "json_safe", "junit_xml", "report_dict", "report_json",
           "sample_status"]
