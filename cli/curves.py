"""Line plots drawn with Pillow (no matplotlib): the perturbation curves of `evaluate` and of `check`/`snapshot`
reports, and the per-layer similarity of the randomisation check."""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

COLORS = {"morf": (200, 30, 30), "lerf": (30, 90, 200), "random": (110, 110, 110)}
PALETTE = [(200, 30, 30), (30, 90, 200), (110, 110, 110), (20, 140, 60), (160, 80, 200), (220, 140, 0)]


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one bitmap size
        return ImageFont.load_default()


def _dashed(draw, points, fill, width, dash=8):
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        length = max(1.0, float(np.hypot(x1 - x0, y1 - y0)))
        n = max(1, int(length // dash))
        for k in range(0, n, 2):
            a, b = k / n, min(1.0, (k + 1) / n)
            draw.line([(x0 + a * (x1 - x0), y0 + a * (y1 - y0)), (x0 + b * (x1 - x0), y0 + b * (y1 - y0))],
                      fill=fill, width=width)


def line_plot(series: list[dict], title: str, xlabel: str, ylabel: str, size=(720, 440), xticks=None) -> Image.Image:
    """``series``: dicts with ``y`` (values at x = 0, 1, ...), ``label``, optional ``color`` and ``dashed``."""
    w, h = size
    left, right, top, bottom = 70, 20, 52, 60
    legend_h = 18 * len(series)
    img = Image.new("RGB", (w, h + legend_h), "white")
    draw = ImageDraw.Draw(img)
    font, small = _font(14), _font(12)
    ys = np.concatenate([np.asarray(s["y"], np.float64) for s in series]) if series else np.zeros(1)
    ys = ys[np.isfinite(ys)] if np.isfinite(ys).any() else np.zeros(1)
    lo, hi = float(ys.min()), float(ys.max())
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    pad = 0.05 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    n = max(len(s["y"]) for s in series) if series else 2
    pw, ph = w - left - right, h - top - bottom

    def px(i, v):
        return left + pw * i / max(1, n - 1), top + ph * (1 - (v - lo) / (hi - lo))

    draw.text((left, 8), title, fill="black", font=font)
    for k in range(6):  # horizontal grid and y labels
        v = lo + (hi - lo) * k / 5
        _, y = px(0, v)
        draw.line([(left, y), (left + pw, y)], fill=(230, 230, 230))
        draw.text((6, y - 7), f"{v:.3g}", fill="black", font=small)
    ticks = xticks or [(i, str(i)) for i in np.linspace(0, n - 1, min(n, 6)).round().astype(int)]
    for i, text in ticks:
        x, _ = px(i, lo)
        draw.line([(x, top + ph), (x, top + ph + 4)], fill="black")
        draw.text((x - 8, top + ph + 6), text[:14], fill="black", font=small)
    draw.rectangle([left, top, left + pw, top + ph], outline="black")
    draw.text((left + pw // 2 - 60, top + ph + 26), xlabel, fill="black", font=small)
    draw.text((left, top - 18), ylabel, fill=(80, 80, 80), font=small)
    for j, s in enumerate(series):
        color = tuple(s.get("color") or PALETTE[j % len(PALETTE)])
        pts = [px(i, v) for i, v in enumerate(np.asarray(s["y"], np.float64)) if np.isfinite(v)]
        if len(pts) > 1 and s.get("dashed"):
            _dashed(draw, pts, color, 2)
        elif len(pts) > 1:
            draw.line(pts, fill=color, width=2)
        ly = h + 18 * j
        if s.get("dashed"):
            _dashed(draw, [(left, ly + 7), (left + 30, ly + 7)], color, 2)
        else:
            draw.line([(left, ly + 7), (left + 30, ly + 7)], fill=color, width=2)
        draw.text((left + 38, ly), s["label"], fill="black", font=small)
    return img


def perturbation_series(curves: dict, prefix: str = "", dashed: bool = False, aopc: dict | None = None) -> list[dict]:
    """One series per order: the mean over the items of the target's score after each step."""
    out = []
    for order, curve in curves.items():
        label = f"{prefix}{order.upper() if order != 'random' else 'random order'}"
        if aopc and order in aopc:
            label += f"  (AOPC {aopc[order]:.3f})"
        color = COLORS.get(order, PALETTE[len(out) % len(PALETTE)])
        if dashed:  # the baseline, lighter
            color = tuple(int(c + (255 - c) * 0.45) for c in color)
        out.append(dict(y=np.nanmean(np.asarray(curve, np.float64), axis=0), label=label, color=color, dashed=dashed))
    return out
