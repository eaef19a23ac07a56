"""Heatmaps (onnx_lrp.io.heatmap): colour maps, symmetric scaling, channel sums and the tile layout."""
import numpy as np
import pytest

from onnx_lrp.io import heatmap as hm
from onnx_lrp.core.errors import InputError


def test_colormap_end_points_and_centre():
    v = np.array([0.0, 0.5, 1.0])
    assert hm.apply_cmap(v, "bwr").tolist() == [[0, 0, 255], [255, 255, 255], [255, 0, 0]]
    assert hm.apply_cmap(v, "coldnhot").tolist() == [[0, 255, 255], [0, 0, 0], [255, 255, 255]]
    assert hm.apply_cmap(v, "seismic").tolist() == [[0, 0, 0xD0], [0xD0] * 3, [0xD0, 0, 0]]
    # linear in between: a quarter of the way from white to red
    assert hm.apply_cmap(np.array([0.625]), "bwr").tolist() == [[255, 191, 191]]
    # values outside [0, 1] are clipped to the end points
    assert hm.apply_cmap(np.array([-3.0, 7.0]), "bwr").tolist() == [[0, 0, 255], [255, 0, 0]]
    with pytest.raises(InputError, match="unknown colour map 'viridis'"):
        hm.apply_cmap(v, "viridis")


def test_colormaps_match_zennit():
    zimage = pytest.importorskip("zennit.image", reason="zennit is the reference for the colour maps")
    x = np.linspace(0.0, 1.0, 256)
    for name in hm.CMAPS:
        theirs = np.asarray(zimage.CMAPS[name](x)) * 255  # zennit: floats in [0, 1]
        mine = hm.apply_cmap(x, name).astype(np.float64)
        # zennit puts its nodes on a 0..255 index grid (centre at 128/255), ours at exact fractions (0.5): the
        # difference is at most a couple of levels near a node
        assert np.max(np.abs(mine - theirs)) <= 4.0, name
        assert np.mean(np.abs(mine - theirs)) <= 1.0, name


def test_symmetric_scaling_puts_zero_in_the_middle():
    rel = np.array([[2.0, -1.0], [0.0, -2.0]])
    np.testing.assert_allclose(hm.symmetric(rel), [[1.0, 0.25], [0.5, 0.0]])
    img = hm.colorize(rel, "bwr")
    assert img.shape == (2, 2, 3) and img.dtype == np.uint8
    assert img[0, 0].tolist() == [255, 0, 0]        # +max: the red end
    assert img[1, 1].tolist() == [0, 0, 255]        # -max: the blue end
    assert img[1, 0].tolist() == [255, 255, 255]    # zero: white
    assert img[0, 1].tolist() == [128, 128, 255]    # -max/2: half way to blue
    # not symmetric in the data: the scale is the largest |r|, so the positive end is not reached
    img = hm.colorize(np.array([[1.0, -4.0]]), "bwr")
    assert img[0, 1].tolist() == [0, 0, 255] and img[0, 0].tolist() == [255, 191, 191]
    # all zero: the neutral colour everywhere, no division by zero
    assert hm.colorize(np.zeros((3, 3)), "bwr").reshape(-1, 3).tolist() == [[255, 255, 255]] * 9


def test_relevance_maps_sum_channels():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(2, 3, 5, 4))
    np.testing.assert_allclose(hm.relevance_maps(r, 1), r[:, 0] + r[:, 1] + r[:, 2])
    nhwc = np.moveaxis(r, 1, -1)
    np.testing.assert_allclose(hm.relevance_maps(nhwc, -1), r.sum(1))
    assert hm.relevance_maps(r[:, 0]).shape == (2, 5, 4)
    assert hm.relevance_maps(r[:, 0, 0]).shape == (2, 1, 4)
    with pytest.raises(InputError, match="cannot draw a heatmap"):
        hm.relevance_maps(np.zeros((1, 1, 1, 1, 1)))


def test_render_layout_tiles_and_most_relevant_pixel():
    rng = np.random.default_rng(1)
    maps = rng.normal(size=(3, 6, 5))
    images = [rng.integers(0, 256, size=(6, 5, 3), dtype=np.uint8) for _ in range(3)]
    s = hm.tile_scale(6, 5)
    assert s == 22 and 6 * s >= 128  # small inputs are enlarged by an integer factor
    for style in ("heatmap", "beside", "overlay"):
        im = np.asarray(hm.render(maps, images, cmap="bwr", style=style))
        per = 2 if style == "beside" else 1
        cell_w = per * 5 * s + (per - 1) * 4
        assert im.shape == (4 + 6 * s + 4, 4 + 3 * (cell_w + 4), 3), style
        for i in range(3):
            x0, y0, x1, y1 = hm.cell_box(i, 3, 6, 5, style=style)
            tile = im[y0:y1, x0:x1]
            assert tile.shape == (6 * s, 5 * s, 3)
            block = tile[::s, ::s]  # one pixel per relevance value
            assert np.array_equal(np.repeat(np.repeat(block, s, 0), s, 1), tile)
            if style == "heatmap" or style == "beside":
                assert np.array_equal(block, hm.colorize(maps[i], "bwr"))
                redness = block[..., 0].astype(int) - block[..., 2]
                assert np.unravel_index(np.argmax(redness), redness.shape) == \
                    np.unravel_index(np.argmax(maps[i]), maps[i].shape)
            if style == "beside":  # the input sits left of its heatmap
                left = im[y0:y1, x0 - 5 * s - 4:x0 - 4][::s, ::s]
                assert np.array_equal(left, images[i])
            if style == "overlay":  # opaque heatmap colour where |r| is largest, the grey input where r = 0
                k = np.unravel_index(np.argmax(np.abs(maps[i])), maps[i].shape)
                assert np.array_equal(block[k], hm.colorize(maps[i], "bwr")[k])
    # without images every style draws the heatmap alone
    assert hm.render(maps, None, style="beside").size == hm.render(maps, None, style="heatmap").size
    with pytest.raises(InputError, match="unknown heatmap style"):
        hm.render(maps, images, style="sideways")


def test_display_images_scale_each_item():
    x = np.stack([np.linspace(-1, 1, 16).reshape(1, 4, 4), np.full((1, 4, 4), 3.0)])
    ims = hm.display_images(x, 1)
    assert len(ims) == 2 and ims[0].shape == (4, 4, 3)
    assert ims[0].min() == 0 and ims[0].max() == 255 and np.all(ims[1] == 0)
    assert hm.display_images(np.zeros((1, 2, 4, 4))) is None  # 2 channels: no picture
