"""``auto_pad`` of convolutions and pools made explicit ``pads`` (static spatial sizes, or stride 1 along a dynamic
axis)."""
from __future__ import annotations

import math

import onnx_ir as ir

from ...builder import const


_SPATIAL_OPS = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"}


def explicit_pads(graph: ir.Graph) -> None:
    for node in graph:
        if node.op_type not in _SPATIAL_OPS:
            continue
        auto = node.attributes.get_string("auto_pad", "NOTSET")
        if auto in ("NOTSET", ""):
            continue
        x = node.inputs[0]
        if auto == "VALID":
            nd = len(x.shape) - 2 if x.shape is not None else len(node.attributes.get_ints("kernel_shape", []))
            node.attributes["pads"] = ir.AttrInt64s("pads", [0] * (2 * nd))
            node.attributes.pop("auto_pad")
            continue
        if x.shape is None:
            continue  # left as is; the op handler reports it
        spatial = [d if isinstance(d, int) else None for d in list(x.shape)[2:]]
        nd = len(spatial)
        if node.op_type in ("Conv", "ConvTranspose"):
            w = const(node.inputs[1])
            kernel = list(node.attributes.get_ints("kernel_shape", w.shape[2:] if w is not None else []))
        else:
            kernel = list(node.attributes.get_ints("kernel_shape"))
        strides = list(node.attributes.get_ints("strides", [1] * nd))
        dil = list(node.attributes.get_ints("dilations", [1] * nd))
        if node.op_type == "ConvTranspose":
            continue  # ConvTranspose's auto_pad refers to its output; handled by its op
        if any(size is None and s != 1 for size, s in zip(spatial, strides)):
            continue  # a dynamic axis with stride > 1: its padding depends on the length; the op handler reports it
        begins, ends = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dil):
            # stride 1: the output keeps the length and the total padding is (k - 1) d whatever the length
            out = math.ceil(size / s) if size is not None else None
            total = (k - 1) * d if size is None else max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            if auto == "SAME_UPPER":
                begins.append(small)
                ends.append(total - small)
            else:
                begins.append(total - small)
                ends.append(small)
        node.attributes["pads"] = ir.AttrInt64s("pads", begins + ends)
        node.attributes.pop("auto_pad")
