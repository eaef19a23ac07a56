"""Heatmaps of relevance with numpy + pillow (no matplotlib): what ``explain --heatmap`` draws, what
:mod:`onnx_lrp.plot` and ``Explanation.heatmap()`` return.

Relevance is mapped symmetrically around zero: each item is divided by its own largest absolute relevance, so
-max sits at the colour map's left end, 0 in its middle and +max at its right end. The colour maps follow
zennit's (``zennit.image.CMAPS``): piecewise-linear between colour nodes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import InputError, OutputError
from ..core.files import printable


def _hex(code: str) -> tuple[int, int, int]:
    if len(code) == 3:
        return tuple(int(c * 2, 16) for c in code)  # type: ignore[return-value]
    return tuple(int(code[i:i + 2], 16) for i in (0, 2, 4))  # type: ignore[return-value]


def _nodes(*spec) -> tuple[tuple[float, tuple[int, int, int]], ...]:
    """Nodes from (position, colour) pairs; a position of None is spaced evenly between its neighbours."""
    pos = [p for p, _ in spec]
    known = [i for i, p in enumerate(pos) if p is not None]
    for a, b in zip(known, known[1:]):
        for k in range(a + 1, b):
            pos[k] = pos[a] + (pos[b] - pos[a]) * (k - a) / (b - a)
    return tuple((float(p), _hex(c)) for p, (_, c) in zip(pos, spec))


# name -> nodes (position in [0, 1], RGB); diverging maps have their neutral colour at 0.5 (= zero relevance)
CMAPS = {
    "bwr": _nodes((0, "00f"), (0.5, "fff"), (1, "f00")),
    "coldnhot": _nodes((0, "0ff"), (0.25, "00f"), (0.5, "000"), (None, "f00"), (None, "ff0"), (1, "fff")),
    "seismic": _nodes((0, "0000d0"), (0.5, "d0d0d0"), (1, "d00000")),
    "france": _nodes((0, "0055a4"), (0.5, "fff"), (1, "ef4135")),
    "coolio": _nodes((0, "00d0d0"), (0.5, "d0d0d0"), (1, "d000d0")),
    "coleus": _nodes((0, "00d000"), (0.5, "d0d0d0"), (1, "d000d0")),
    "gray": _nodes((0, "000"), (1, "fff")),
    "wred": _nodes((0, "fff"), (1, "f00")),
    "wblue": _nodes((0, "fff"), (1, "00f")),
    "hot": _nodes((0, "000"), (None, "f00"), (None, "ff0"), (1, "fff")),
    "cold": _nodes((0, "000"), (None, "00f"), (1, "0ff")),
}
DIVERGING = ("bwr", "coldnhot", "seismic", "france", "coolio", "coleus")
STYLES = ("beside", "overlay", "heatmap")
IMAGE_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP", ".bmp": "BMP", ".tif": "TIFF",
                 ".tiff": "TIFF", ".gif": "GIF"}  # --heatmap suffix -> Pillow format


def colormap(name: str):
    if name not in CMAPS:
        raise InputError(f"unknown colour map {name!r}; choose one of {', '.join(CMAPS)}")
    return CMAPS[name]


def apply_cmap(values: np.ndarray, name: str = "bwr") -> np.ndarray:
    """RGB uint8 [..., 3] for values in [0, 1] (clipped), interpolating linearly between the map's nodes."""
    nodes = colormap(name)
    pos = np.array([p for p, _ in nodes])
    rgb = np.array([c for _, c in nodes], dtype=np.float64)
    v = np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0)
    out = np.stack([np.interp(v, pos, rgb[:, k]) for k in range(3)], axis=-1)
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def symmetric(rel: np.ndarray) -> np.ndarray:
    """Relevance scaled to [0, 1] with 0 -> 0.5 and +-max|rel| -> 1 / 0 (an all-zero map stays at 0.5)."""
    rel = np.asarray(rel, dtype=np.float64)
    vmax = float(np.max(np.abs(rel))) if rel.size else 0.0
    if not np.isfinite(vmax) or vmax == 0.0:
        return np.full(rel.shape, 0.5)
    return 0.5 + 0.5 * rel / vmax


def colorize(rel: np.ndarray, cmap: str = "bwr") -> np.ndarray:
    """RGB uint8 [H, W, 3] heatmap of one 2-D relevance map, symmetric around zero."""
    return apply_cmap(symmetric(rel), cmap)


def relevance_maps(relevance: np.ndarray, channel_axis: int | None = 1) -> np.ndarray:
    """[N, H, W] maps: 4-D relevance is summed over its channel axis; [N, H, W] stays; [N, F] becomes [N, 1, F]."""
    r = np.asarray(relevance, dtype=np.float64)
    if r.ndim == 4:
        return r.sum(axis=channel_axis if channel_axis is not None else 1)
    if r.ndim == 3:
        return r
    if r.ndim == 2:
        return r[:, None, :]
    raise InputError(f"cannot draw a heatmap of relevance with shape {'x'.join(map(str, r.shape))}; heatmaps need "
                     "[N,F], [N,H,W] or [N,C,H,W]")


def display_images(x: np.ndarray, channel_axis: int = 1) -> list[np.ndarray] | None:
    """Grey or RGB uint8 pictures of 4-D array inputs with 1 or 3 channels (each scaled by its own range)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 4 or x.shape[channel_axis] not in (1, 3):
        return None
    hwc = np.moveaxis(x, channel_axis, -1)
    out = []
    for item in hwc:
        lo, hi = float(item.min()), float(item.max())
        scaled = (item - lo) / (hi - lo) if hi > lo else np.zeros_like(item)
        scaled = np.repeat(scaled, 3, axis=-1) if scaled.shape[-1] == 1 else scaled
        out.append((scaled * 255 + 0.5).astype(np.uint8))
    return out


def tile_scale(height: int, width: int, min_side: int = 128) -> int:
    """The integer factor that makes a tile's longer side at least ``min_side`` pixels (1 for large inputs)."""
    return max(1, -(-min_side // max(height, width, 1)))


MAX_COLS = {"beside": 4, "overlay": 8, "heatmap": 8}  # cells per row (a beside cell holds two tiles)
LINE_H = 13  # caption line height in pixels (Pillow's default font)
BAR_H = 34  # colour bar strip: the bar and its labels
GAP = 4  # pixels between cells and around the grid
BACKGROUND = (200, 200, 200)  # the grid's colour between cells


def _font():
    from PIL import ImageFont
    try:
        return ImageFont.load_default(size=11)
    except TypeError:  # Pillow < 10.1: the bitmap font
        return ImageFont.load_default()


def _fit(draw, text: str, font, width: int) -> str:
    """``text`` (control characters escaped: a newline draws no second line) cut with an ellipsis to fit ``width``
    pixels."""
    text = printable(text)
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "\u2026", font=font) > width:
        text = text[:-1]
    return text + "\u2026"


@dataclass(frozen=True)
class _Grid:
    """:func:`render`'s layout: the tile scale, tiles per cell, cells per row, tile height and width, cell width,
    caption height under each cell and the gap between cells."""

    scale: int
    per_cell: int
    cols: int
    th: int
    tw: int
    cell_w: int
    cap: int
    gap: int

    def origin(self, index: int) -> tuple[int, int]:
        """(top, left) of cell ``index``."""
        r, c = divmod(index, self.cols)
        return self.gap + r * (self.th + self.cap + self.gap), self.gap + c * (self.cell_w + self.gap)


def _layout(n, h, w, style, cols, scale, caption_lines) -> _Grid:
    gap = GAP
    s = scale or tile_scale(h, w)
    per_cell = 2 if style == "beside" else 1
    cols = cols or min(n, MAX_COLS[style])
    th, tw = h * s, w * s
    cell_w = per_cell * tw + (per_cell - 1) * gap
    cap = caption_lines * LINE_H + (2 if caption_lines else 0)
    return _Grid(s, per_cell, cols, th, tw, cell_w, cap, gap)


def render(maps: np.ndarray, images=None, cmap: str = "bwr", style: str = "beside", cols: int | None = None,
           scale: int | None = None, labels=None, colorbar: str | None = None):
    """One PIL image: a grid with one cell per batch item.

    ``style``: ``heatmap`` (the heatmap alone), ``beside`` (the input, then the heatmap) or ``overlay`` (the
    heatmap over a grey copy of the input, opaque where |relevance| is largest). Without ``images`` every style
    draws the heatmap alone. Tiles are enlarged by an integer factor (nearest neighbour), so every relevance value
    is a block of ``scale x scale`` pixels. At most 8 cells per row (4 with ``beside``).

    ``labels``: per item a list of caption lines drawn under its cell (all items the same number of lines);
    ``colorbar``: a caption for a colour bar under the grid, from -max|R| (left) through 0 to +max|R| (right).
    """
    from PIL import Image

    if style not in STYLES:
        raise InputError(f"unknown heatmap style {style!r}; choose one of {', '.join(STYLES)}")
    colormap(cmap)
    maps = np.asarray(maps, dtype=np.float64)
    n, h, w = maps.shape
    if images is not None and (len(images) != n or any(im.shape[:2] != (h, w) for im in images)):
        images = None  # the inputs do not line up with the relevance map: draw the heatmap alone
    if images is None:
        style = "heatmap"
    lines = max((len(x) for x in labels), default=0) if labels else 0
    g = _layout(n, h, w, style, cols, scale, lines)
    gap = g.gap
    rows = -(-n // g.cols)
    width = gap + g.cols * (g.cell_w + gap)
    bar = BAR_H if colorbar else 0
    canvas = np.empty((gap + rows * (g.th + g.cap + gap) + bar, width, 3), dtype=np.uint8)
    canvas[...] = BACKGROUND
    for i in range(n):
        y0, x0 = g.origin(i)
        for k, tile in enumerate(_tiles(maps[i], None if images is None else images[i], style, cmap)):
            big = np.repeat(np.repeat(tile, g.scale, axis=0), g.scale, axis=1)
            xk = x0 + k * (g.tw + gap)
            canvas[y0:y0 + g.th, xk:xk + g.tw] = big
    if bar:  # the colour bar: the map's full range, as drawn in every tile
        x_lo, x_hi = gap, min(width - gap, gap + 256)
        ramp = apply_cmap(np.linspace(0, 1, x_hi - x_lo), cmap)
        y_bar = canvas.shape[0] - bar + 4
        canvas[y_bar:y_bar + 10, x_lo:x_hi] = ramp[None]
    image = Image.fromarray(canvas, mode="RGB")
    if labels or bar:
        _captions(image, g, n, labels, colorbar if bar else None)
    return image


def _tiles(rel: np.ndarray, image, style: str, cmap: str) -> list:
    """The tiles of one cell: the heatmap; the input beside it; or the heatmap over a grey copy of the input."""
    heat = colorize(rel, cmap)
    if style == "beside":
        return [np.asarray(image, dtype=np.uint8), heat]
    if style == "overlay":
        grey = np.asarray(image, dtype=np.float64).mean(axis=-1, keepdims=True)
        vmax = np.max(np.abs(rel)) or 1.0
        alpha = np.clip(np.abs(rel) / vmax, 0, 1)[..., None] ** 0.5
        return [np.round((1 - alpha) * grey + alpha * heat).astype(np.uint8)]
    return [heat]


def _captions(image, g: _Grid, n: int, labels, colorbar: str | None) -> None:
    """The caption lines under the cells and the colour bar's labels."""
    from PIL import ImageDraw

    draw, font = ImageDraw.Draw(image), _font()
    gap, width = g.gap, image.width
    for i in range(n if labels else 0):
        y0, x0 = g.origin(i)
        for k, line in enumerate(labels[i]):
            draw.text((x0, y0 + g.th + 1 + k * LINE_H), _fit(draw, str(line), font, g.cell_w), fill=(0, 0, 0),
                      font=font)
    if colorbar is not None:
        y = image.height - BAR_H + 16
        x_hi = min(width - gap, gap + 256)
        draw.text((gap, y), "-max|R|", fill=(0, 0, 0), font=font)
        mid = "0"
        draw.text(((gap + x_hi) // 2 - draw.textlength(mid, font=font) / 2, y), mid, fill=(0, 0, 0), font=font)
        draw.text((x_hi - draw.textlength("+max|R|", font=font), y), "+max|R|", fill=(0, 0, 0), font=font)
        if x_hi + 8 < width:
            draw.text((x_hi + 8, y - 12), _fit(draw, colorbar, font, width - x_hi - 10), fill=(0, 0, 0), font=font)


def cell_box(index: int, n: int, h: int, w: int, style: str = "heatmap", cols: int | None = None,
             scale: int | None = None, caption_lines: int = 0) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of item ``index``'s heatmap tile in :func:`render`'s layout."""
    g = _layout(n, h, w, style, cols, scale, caption_lines)
    y0, x0 = g.origin(index)
    x0 += (g.per_cell - 1) * (g.tw + g.gap)
    return x0, y0, x0 + g.tw, y0 + g.th


@dataclass(frozen=True)
class Look:
    """How :func:`picture` draws: ``batch`` (the first axis counts the items), ``channel_axis`` (None: 1 unless the
    shape looks channels-last), ``cmap``, ``style``, ``labels`` (per item a list of caption lines), ``cols``,
    ``scale`` and ``colorbar`` (a caption for the colour bar): :func:`render`'s options."""

    batch: bool = True
    channel_axis: int | None = None
    cmap: str = "bwr"
    style: str = "beside"
    labels: tuple | list | None = None
    cols: int | None = None
    scale: int | None = None
    colorbar: str | None = None


def picture(relevance, x=None, look: Look = Look()):
    """One PIL image of ``relevance`` (and ``x``, the input it explains, for the ``beside`` / ``overlay`` styles),
    drawn as ``look`` says.

    ``look.batch=True``: the first axis counts the items, one tile each: [N, C, H, W] (summed over the channel
    axis), [N, H, W], or [N, F] (a strip per item); ``batch=False``: one item without it ([C, H, W], [H, W], [F]).
    ``look.channel_axis`` (4-D relevance): None takes 1 unless the shape looks channels-last (last axis 1 or 3, the
    second not). ``x``: the same layout as ``relevance``, 1 or 3 channels (grey or RGB, each item scaled to its own
    range); other arrays are refused, as are relevance values that are not finite. The rest is :func:`render`'s.
    """
    r, x = _items(relevance, x, look.batch)
    channel_axis = look.channel_axis
    if channel_axis is None:
        from .inputs import channels_last

        channel_axis = -1 if channels_last(r.shape) else 1
    maps = relevance_maps(r, channel_axis)
    images = None
    if x is not None:
        x = np.asarray(x)
        images = display_images(x, channel_axis) if x.shape == r.shape and x.dtype.kind in "fiub" else None
        if images is None:
            raise InputError(f"x of shape {'x'.join(map(str, x.shape))} cannot be drawn beside relevance of shape "
                             f"{'x'.join(map(str, r.shape))}: it needs the relevance's shape, [N, C, H, W] with 1 "
                             "or 3 channels; leave x out to draw the heatmap alone")
    labels = look.labels
    if labels is not None and len(labels) != len(maps):
        raise InputError(f"{len(labels)} labels for {len(maps)} item(s); give one list of caption lines per item")
    return render(maps, images, cmap=look.cmap, style=look.style, cols=look.cols, scale=look.scale, labels=labels,
                  colorbar=look.colorbar)


def _items(relevance, x, batch: bool):
    """``relevance`` (and ``x``) with a batch axis, checked drawable: numeric, finite, 2 to 4 axes."""
    r = np.asarray(relevance)
    if r.dtype.kind not in "fiu":
        raise InputError(f"relevance of dtype {r.dtype} cannot be drawn; give a numeric array")
    if not batch:
        r = r[None]
        x = None if x is None else np.asarray(x)[None]
    if r.size and not np.all(np.isfinite(r)):
        raise InputError("the relevance holds NaN or Inf; nothing was drawn")
    if r.ndim not in (2, 3, 4):
        shape = "x".join(map(str, r.shape[0 if batch else 1:]))
        raise InputError(f"cannot draw relevance of shape {shape or 'scalar'}" + (" per item" if not batch else "") +
                         "; heatmaps need [N, C, H, W], [N, H, W] or [N, F] (batch=False: one item without N)")
    return r, x


def save_picture(image, fp, format: str | None = None, writer_params: dict | None = None) -> None:
    """``image.save(fp, format, **writer_params)`` with Pillow's refusals as one line: a file name whose suffix
    names no image format, a folder that cannot be written."""
    try:
        image.save(fp, format=format, **(writer_params or {}))
    except (KeyError, ValueError) as exc:  # Pillow: unknown extension / format
        raise OutputError(f"cannot write the heatmap to {fp} ({exc}); give a file name ending in "
                          f"{', '.join(IMAGE_FORMATS)} or format='PNG'") from None
    except OSError as exc:
        raise OutputError(f"cannot write the heatmap to {fp}: {exc.strerror or exc}") from None


__all__ = ["CMAPS", "DIVERGING", "IMAGE_FORMATS", "MAX_COLS", "STYLES", "apply_cmap", "cell_box", "colorize",
           "colormap", "display_images",
           "Look", "picture", "relevance_maps", "render", "save_picture", "symmetric", "tile_scale"]
