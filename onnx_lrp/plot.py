"""Heatmaps of relevance as pictures: what ``onnx-lrp explain --heatmap`` draws, from arrays.

``heatmap(relevance, x=None, ...)`` returns a PIL image (a notebook shows it inline); ``imsave(fp, relevance, ...)``
writes it, as ``zennit.image.imsave`` does. One tile per item, the relevance summed over the channels, mapped
symmetrically around zero: each tile is scaled to its own largest |relevance| (zennit's ``symmetric=True`` per
item, as its ``grid=True`` normalises each sample), -max at the colour map's left end, 0 in its middle, +max at its
right end; the colour maps are zennit's (``CMAPS``). Pillow is the only dependency (no matplotlib).

    import onnx_lrp, onnx_lrp.plot
    res = onnx_lrp.Explainer("models/digits_cnn.onnx").explain(x)
    onnx_lrp.plot.heatmap(res.relevance, x)              # the input beside each heatmap
    onnx_lrp.plot.imsave("digits.png", res.relevance, cmap="coldnhot", style="heatmap")
    res.heatmap()                                        # the same from the Explanation (with captions)
"""
from __future__ import annotations

from .io.heatmap import CMAPS as _CMAPS
from .io.heatmap import STYLES, Look, picture, save_picture

CMAPS = tuple(_CMAPS)  # the colour maps' names: bwr (default), coldnhot, seismic, france, coolio, coleus, gray, ...


def heatmap(relevance, x=None, *, batch: bool = True, channel_axis: int | None = None, cmap: str = "bwr",
            style: str = "beside", labels=None, cols: int | None = None, scale: int | None = None,
            colorbar: str | None = None):
    """The heatmap picture of ``relevance`` as a PIL image.

    * ``relevance``: [N, C, H, W] (summed over ``channel_axis``), [N, H, W] or [N, F] (a strip per item), one tile
      per item; ``batch=False`` for one item without its batch axis ([C, H, W], [H, W] or [F]), as
      ``Explanation.relevance`` is for an item given without one.
    * ``x``: the input, the relevance's shape with 1 or 3 channels; ``style`` ``beside`` (default: the input, then
      the heatmap), ``overlay`` (the heatmap over a grey copy of the input) or ``heatmap`` (alone; without ``x`` every
      style draws the heatmap alone).
    * ``channel_axis``: None takes 1 (NCHW) unless the shape looks channels-last (last axis 1 or 3, the second not).
    * ``cmap``: one of ``CMAPS``; ``labels``: per item a list of caption lines under its tile; ``cols``: tiles per
      row (at most 8, 4 with ``beside``); ``scale``: the integer enlargement (default: the longer side >= 128
      pixels); ``colorbar``: a caption for a colour bar under the grid.

    Relevance that is not finite, and an ``x`` that cannot be drawn, raise `onnx_lrp.InputError`.
    """
    return picture(relevance, x, Look(batch=batch, channel_axis=channel_axis, cmap=cmap, style=style, labels=labels,
                                      cols=cols, scale=scale, colorbar=colorbar))


def imsave(fp, relevance, x=None, *, format: str | None = None, writer_params: dict | None = None, **options) -> None:
    """Write `heatmap`'s picture to ``fp`` (a path or a binary file), as ``zennit.image.imsave`` does: the
    format from the file name's suffix (or ``format``: "PNG", "JPEG", ...), ``writer_params`` passed to Pillow's
    ``Image.save``; ``options`` are `heatmap`'s."""
    save_picture(heatmap(relevance, x, **options), fp, format, writer_params)


__all__ = ["CMAPS", "STYLES", "heatmap", "imsave"]
