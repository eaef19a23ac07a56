"""``check --heatmap-dir``'s PNG of a drifted sample draws the difference on the baseline's scale (as the HTML
report's tile does): a drift that is small beside the baseline stays near white instead of being stretched to its
own maximum. Oracle: the bwr colour map written out in numpy at 0.5 + 0.5 d / max|baseline|, d the current map
brought to the baseline's sum of |r| minus the baseline."""
from __future__ import annotations

import numpy as np

from onnx_lrp.cli.regress import _drift_picture
from onnx_lrp.io import heatmap as hm
from onnx_lrp.regression.compare import Sample

H, W = 6, 8


def _sample():
    metrics = {"cosine": 0.9999, "rel_l2": 0.0012, "output_diff": 0.0, "spearman": 1.0, "topk_iou": 1.0}
    return Sample("digit_3.npy", 0, 3, 3, 3, metrics, failed=["cosine 0.9999 < 0.99999"],
                  drift={"relevance": ["cosine 0.9999 < 0.99999"]}, failed_kinds=("relevance",))


def _bwr(v):
    """numpy oracle of the bwr map: blue (0) - white (0.5) - red (1), linear between."""
    v = np.clip(v, 0, 1)[..., None]
    low = np.concatenate([2 * v, 2 * v, np.ones_like(v)], -1)
    high = np.concatenate([np.ones_like(v), 2 - 2 * v, 2 - 2 * v], -1)
    return 255 * np.where(v <= 0.5, low, high)


def _difference_tile(base, cur):
    image = np.asarray(_drift_picture(_sample(), base, cur))
    scale = hm.tile_scale(H, W, 200)
    left, top, right, bottom = hm.cell_box(2, 3, H, W, cols=3, scale=scale, caption_lines=2)
    tile = image[top:bottom, left:right].astype(np.float64)
    assert tile.shape == (H * scale, W * scale, 3)
    return tile[::scale, ::scale]


def _expected(b, c):
    d = c * (np.abs(b).sum() / np.abs(c).sum()) - b
    return _bwr(0.5 + 0.5 * d / np.abs(b).max())


def test_small_drift_drawn_near_white_on_the_baseline_scale():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((1, H, W))
    cur = base.copy()
    cur[0, 2, 3] += 0.0006 * np.abs(base).max()  # a drift of 0.06 % of the baseline's peak in one pixel
    tile = _difference_tile(base, cur)
    np.testing.assert_allclose(tile, _expected(base[0], cur[0]), atol=1.0)
    assert tile.min() >= 254  # near white: on its own maximum the pixel would be saturated (0 in two channels)


def test_real_drift_still_shows():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((2, H, W))
    cur = base.copy()
    cur[0, :, :4] *= -1  # half the map flipped
    tile = _difference_tile(base, cur)
    np.testing.assert_allclose(tile, _expected(base[0], cur[0]), atol=1.0)
    assert tile.min() < 60  # strongly coloured where the map flipped
