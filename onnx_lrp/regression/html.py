"""The HTML report of a regression check (``--report-html FILE``): one self-contained page for people.

The verdict, what fails the check (``fail_on``) and the drift per kind, the thresholds, one table row per sample
(failing samples first, then those that drifted without failing, then the rest; values beyond their threshold
marked), and per sample the baseline / current / difference heatmaps (the difference on the baseline's scale)
as inline PNG images (``data:`` URIs: the
file needs nothing beside it, and opens from a CI artifact as it is). Colours stay off the heatmaps' own palette
(no pure red or blue in the page), so that a screenshot tells the heatmaps apart from the text.
"""
from __future__ import annotations

import base64
import html
import io
import math

import numpy as np

from ..io import heatmap as hm
from ..core.files import printable
from .compare import Comparison, relevance_scale
from .report import fmt, drift_line, sample_status
from .thresholds import METRICS

MAX_PICTURES = 100  # samples drawn (failing first); the table lists every sample
STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; background: #fafafa; }
h1 { font-size: 20px; margin: 0 0 8px; } h2 { font-size: 16px; margin: 24px 0 8px; }
.verdict { display: inline-block; padding: 4px 12px; border-radius: 4px; font-weight: bold; color: #fff; }
.pass { background: #2e7d32; } .fail { background: #8e244d; }
table { border-collapse: collapse; margin: 8px 0; } td, th { padding: 3px 8px; border-bottom: 1px solid #ddd; }
th { text-align: left; background: #eee; } td.num { text-align: right; font-family: monospace; }
td.beyond { background: #f6d7a7; font-weight: bold; } tr.failing td:first-child { border-left: 4px solid #8e244d; }
tr.drift td:first-child { border-left: 4px solid #c88a12; }
.sample { display: inline-block; vertical-align: top; margin: 0 16px 16px 0; background: #fff; padding: 8px;
          border: 1px solid #ddd; } .sample img { image-rendering: pixelated; display: block; margin: 4px 0; }
.status { max-width: 500px; }
.small { color: #555; font-size: 12px; }
"""


def _escape(text) -> str:
    """HTML-escaped, control characters shown as text (``\\x1b``): a name cannot smuggle markup or terminal codes."""
    return html.escape(printable(text))


def _png(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _order(comp: Comparison) -> list:
    """Failing samples first, then drifted but not failing, then the rest (each in item order)."""
    return sorted(comp.samples, key=lambda s: (0 if s.failed else 1 if s.drift else 2, s.index))


def _beyond(s, name: str, th) -> bool:
    key, direction = METRICS[name]
    limit, v = getattr(th, key), s.metrics[name]
    if limit is None:
        return False
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return True
    return v < limit if direction == "min" else v > limit


def _head(comp: Comparison, context: dict) -> list[str]:
    e = _escape
    n, d = len(comp.samples), len(comp.drifted)
    verdict = (f'<span class="verdict fail">FAIL</span> {d} of {n} sample(s) fail' if d else
               f'<span class="verdict pass">PASS</span> all {n} sample(s) pass')
    what = context.get("command", "check")
    against = context.get("baseline") or context.get("model_a") or ""
    out = [f"<h1>onnx-lrp {e(what)}: {e(str(context.get('model', '')))}</h1>",
           f'<p class="small">against {e(str(against))}; composite {e(str(context.get("composite", "")))}'
           + (f"; model {'changed' if context.get('model_changed') else 'unchanged'}" if "model_changed" in context
              else "") + "</p>",
           f"<p>{verdict}</p>", f"<p>{e(drift_line(comp))}</p>"]
    th = comp.thresholds
    cells = "".join(f"<td class=num>{'&ge;' if METRICS[m][1] == 'min' else '&le;'} "
                    f"{getattr(th, METRICS[m][0]):g}</td>" if getattr(th, METRICS[m][0]) is not None
                    else "<td class=num>off</td>" for m in METRICS)
    out += ["<h2>Thresholds</h2>", "<table><tr>" + "".join(f"<th>{m}</th>" for m in METRICS) + "<th>top-k</th></tr>",
            f"<tr>{cells}<td class=num>{th.topk_percent:g} %</td></tr></table>"]
    return out


def _table(comp: Comparison) -> list[str]:
    e = _escape
    rows = ["<h2>Samples</h2>", "<table><tr><th>item</th><th>target</th><th>pred</th>"
            + "".join(f"<th>{m}</th>" for m in METRICS) + "<th>status</th></tr>"]
    for s in _order(comp):
        pred = f"{s.predicted_baseline}" + ("" if s.predicted_current == s.predicted_baseline
                                            else f" &rarr; {s.predicted_current}")
        cls = "failing" if s.failed else "drift" if s.drift else ""
        cells = "".join(f"<td class=\"num{' beyond' if _beyond(s, m, comp.thresholds) else ''}\">"
                        f"{fmt(s.metrics[m])}</td>" for m in METRICS)
        rows.append(f'<tr class="{cls}"><td><a href="#s{s.index}">{e(s.item)}</a></td><td class=num>{s.target}'
                    f"</td><td class=num>{pred}</td>{cells}<td>{e(sample_status(s))}</td></tr>")
    rows.append("</table>")
    return rows


def difference(base: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """The difference tile's values in [0, 1] for the colour map: the current map brought to the baseline's sum of
    |r| (the shape the check compares, :func:`onnx_lrp.regression.compare.relevance_scale`) minus the baseline,
    divided by the baseline's largest |relevance|: a drift that is small beside the baseline stays near white (0.5),
    whatever its own maximum."""
    b, c = np.asarray(base, np.float64), np.asarray(cur, np.float64)
    sb, sc = relevance_scale(b), relevance_scale(c)
    peak = float(np.max(np.abs(b))) if b.size else 0.0
    d = c * (sb / sc) - b
    if not np.isfinite(peak) or peak == 0.0:
        return hm.symmetric(d)
    return np.clip(0.5 + 0.5 * d / peak, 0.0, 1.0)


def drift_image(b: np.ndarray, c: np.ndarray, labels, size: int = 160, colorbar: str | None = None):
    """Baseline and current, each on its own scale, and their difference on the baseline's (:func:`difference`):
    three tiles in a row, ``labels`` a list of caption lines under each, the longer side of a tile >= ``size``
    pixels (the HTML report's pictures and ``check --heatmap-dir``'s)."""
    maps = np.stack([b, c, c - b])
    scale = hm.tile_scale(*maps.shape[1:], size)
    image = hm.render(maps, None, style="heatmap", cols=3, labels=labels, scale=scale, colorbar=colorbar)
    lines = max(len(x) for x in labels)
    left, top, right, bottom = hm.cell_box(2, 3, *maps.shape[1:], cols=3, scale=scale, caption_lines=lines)
    tile = hm.apply_cmap(difference(b, c))
    tile = np.repeat(np.repeat(tile, scale, axis=0), scale, axis=1)
    pixels = np.asarray(image).copy()
    pixels[top:bottom, left:right] = tile
    from PIL import Image
    return Image.fromarray(pixels, mode="RGB")


def _sample_image(b: np.ndarray, c: np.ndarray):
    return drift_image(b, c, [["baseline"], ["current"], ["difference"]])


def _pictures(comp: Comparison, base_maps, cur_maps, limit: int) -> list[str]:
    e = _escape
    drawn = _order(comp)[:limit]
    out = ["<h2>Heatmaps</h2>", '<p class="small">baseline and current, each scaled symmetrically to its own largest '
           "|relevance|; the difference (current at the baseline's sum of |relevance|, minus the baseline: the shape "
           "the check compares) on the baseline's scale, so that a small drift stays near white (red positive, blue "
           "negative)"
           + (f"; the first {limit} of {len(comp.samples)} samples, failing first" if len(drawn) < len(comp.samples)
              else "") + "</p>"]
    for s in drawn:
        b, c = np.asarray(base_maps[s.index], np.float64), np.asarray(cur_maps[s.index], np.float64)
        image = _sample_image(b, c)
        out.append(f'<div class="sample" id="s{s.index}"><b>{e(s.item)}</b> <span class="small">target {s.target}'
                   f'</span><img alt="heatmaps of {e(s.item)}" src="{_png(image)}">'
                   f'<div class="small status">{e(sample_status(s))}</div></div>')
    return out


def report_html(comp: Comparison, context: dict, base_maps, cur_maps, limit: int = MAX_PICTURES) -> str:
    """The page: ``base_maps`` / ``cur_maps`` are the baseline's and the current relevance as [N, H, W] maps (or
    [N, 1, F] strips; :func:`onnx_lrp.io.heatmap.relevance_maps`), index by sample."""
    title = _escape(f"onnx-lrp {context.get('command', 'check')}: {context.get('model', '')}")
    body = _head(comp, context) + _table(comp) + _pictures(comp, base_maps, cur_maps, limit)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{title}</title><style>{STYLE}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")


__all__ = ["MAX_PICTURES", "difference", "report_html"]
