"""The heatmap renderer for the commands: :mod:`onnx_lrp.io.heatmap` (the package's; :mod:`onnx_lrp.plot` is its
public face)."""
from onnx_lrp.io.heatmap import (  # noqa: F401 (re-exported for the commands)
    BAR_H,
    CMAPS,
    DIVERGING,
    IMAGE_FORMATS,
    LINE_H,
    MAX_COLS,
    STYLES,
    apply_cmap,
    cell_box,
    colorize,
    colormap,
    display_images,
    relevance_maps,
    render,
    symmetric,
    tile_scale,
)

__all__ = ["BAR_H", "CMAPS", "DIVERGING", "IMAGE_FORMATS", "LINE_H", "MAX_COLS", "STYLES", "apply_cmap", "cell_box",
           "colorize", "colormap", "display_images", "relevance_maps", "render", "symmetric", "tile_scale"]
