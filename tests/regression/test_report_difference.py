"""issue 35 item 6: the HTML report's difference tile is drawn on the BASELINE's scale, not its own maximum: a drift
of 0.0006 (relative to the baseline's largest |relevance|) stays near the neutral white of the bwr map, while a
drift as large as the baseline saturates. Pixels read back from the page's PNG, checked against the colour map's
nodes (blue 0 -> white 0.5 -> red 1)."""
from __future__ import annotations

import base64
import io
import re

import numpy as np
from PIL import Image

from onnx_lrp import regression as rg
from onnx_lrp.io import heatmap as hm
from onnx_lrp.regression.html import report_html

H = W = 12


def _tiles(base, cur):
    """The page of a comparison of two [N, 1, H, W] relevance sets, and per sample its (baseline, current,
    difference) tiles as RGB arrays, one pixel per relevance value."""
    n = len(base)
    y = np.tile(np.arange(10.0), (n, 1))
    items = [f"s{i}" for i in range(n)]
    comp = rg.compare(rg.Result({"x": base}, y, y.argmax(1), items), rg.Result({"x": cur}, y, y.argmax(1), items))
    page = report_html(comp, {"command": "check", "model": "m.onnx"}, base[:, 0], cur[:, 0])
    srcs = dict(re.findall(r'<img alt="heatmaps of ([^"]+)" src="data:image/png;base64,([^"]+)"', page))
    s = hm.tile_scale(H, W, 160)
    out = []
    for item in items:
        im = np.asarray(Image.open(io.BytesIO(base64.b64decode(srcs[item]))).convert("RGB")).astype(int)
        boxes = [hm.cell_box(k, 3, H, W, cols=3, scale=s, caption_lines=1) for k in range(3)]
        out.append([im[t:b:s, l:r:s] for l, t, r, b in boxes])
    return comp, out


def test_a_tiny_drift_stays_near_white_and_a_large_one_saturates():
    rng = np.random.default_rng(3)
    base = rng.normal(size=(2, 1, H, W))
    peak = np.abs(base).max(axis=(1, 2, 3), keepdims=True)
    cur = base.copy()
    cur[0] += 0.0006 * peak[0] * rng.choice([-1.0, 1.0], size=(1, H, W))  # a drift of 0.0006
    cur[1] = -base[1]  # the sign of every value flipped: a drift as large as the baseline
    comp, tiles = _tiles(base, cur)
    assert comp.samples[0].passed and not comp.samples[1].passed
    tiny = tiles[0][2]
    assert np.abs(tiny - 255).max() <= 2, np.abs(tiny - 255).max()  # white within 2 of 255 in every channel
    # its own maximum would have saturated it: the old drawing (scaled to the difference's own max) is far from white
    own = hm.apply_cmap(hm.symmetric(cur[0, 0] - base[0, 0])).astype(int)
    assert np.abs(own - 255).max() > 200
    big = tiles[1][2]
    assert np.abs(big - 255).max() > 200  # the large drift is drawn saturated where |base| peaks
    # baseline and current tiles stay on their own scales
    assert np.abs(tiles[0][0] - hm.apply_cmap(hm.symmetric(base[0, 0]))).max() <= 1


def test_a_harmless_rescale_draws_no_difference():
    rng = np.random.default_rng(4)
    base = rng.normal(size=(1, 1, H, W))
    comp, tiles = _tiles(base, base * 1.5)
    assert comp.passed and comp.samples[0].metrics["rel_l2"] < 1e-12
    assert np.abs(tiles[0][2] - 255).max() <= 1
