"""Pooling and reductions: average pools and sums (linear), max pools (piecewise linear: winner takes all)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...core import meta
from ...core.graph import const, static_dims
from .base import LinearOp, Params, register, spatial_static
from .linear import fit_to
from ..vocabulary import Kind, Nonneg


class _Pool(LinearOp):
    has_params = False

    data_inputs = (0,)

    def params(self, node):
        return Params(None, None)

    def forward(self, em, node, xs, p):
        attrs = {k: a.value for k, a in node.attributes.items()}
        inputs = [xs[0]] + list(node.inputs[1:])
        return em.op(node.op_type, *inputs, tag="z", **attrs)


def _window_misfit(node) -> str | None:
    """Pool windows: kernel_shape, strides, pads and dilations of the right length and range (the ONNX checker
    lets a kernel of 0 or a negative stride pass)."""
    if "kernel_shape" not in node.attributes:
        return "malformed: no kernel_shape"
    nd = len(node.attributes.get_ints("kernel_shape"))
    dims = static_dims(node.inputs[0])
    if nd == 0 or (dims is not None and len(dims) != nd + 2):
        return f"malformed: kernel_shape of {nd} axes for an input of rank {None if dims is None else len(dims)}"
    for attr, n, least in (("kernel_shape", nd, 1), ("strides", nd, 1), ("pads", 2 * nd, 0), ("dilations", nd, 1)):
        vals = list(node.attributes.get_ints(attr, [least] * n))
        if len(vals) != n or any(v < least for v in vals):
            return f"malformed: {attr}={vals} (needs {n} values >= {least})"
    return _window_fits(node, dims, nd)


def _window_fits(node, dims, nd) -> str | None:
    k = list(node.attributes.get_ints("kernel_shape"))
    pads = list(node.attributes.get_ints("pads", [0] * (2 * nd)))
    dil = list(node.attributes.get_ints("dilations", [1] * nd))
    for a in range(nd):
        size = None if dims is None else dims[2 + a]
        if size is not None and size + pads[a] + pads[nd + a] < dil[a] * (k[a] - 1) + 1:
            return f"malformed: kernel_shape {k} larger than the padded input"
    return None


def _window_counts(size, k, st, pb, pe, out, include_pad):
    """Per output position along one axis: (divisor, number of valid inputs), onnxruntime/torch semantics."""
    div = np.empty(out)
    for o in range(out):
        start = o * st - pb
        end = min(start + k, size + pe)
        pool = end - start
        valid = min(end, size) - max(start, 0)
        div[o] = pool if include_pad else valid
    return div


@register
class AveragePool(_Pool):
    """z = mean over windows; J^T s = conv_transpose(s / divisor, ones) per channel."""

    kind = Kind.AVGPOOL
    op_types = ("AveragePool",)
    nonneg = Nonneg.INPUTS

    def check(self, node):
        bad = _window_misfit(node)
        if bad:
            return bad
        if any(d != 1 for d in node.attributes.get_ints("dilations", [])):
            return "dilations"
        if node.attributes.get_string("auto_pad", "NOTSET") not in ("NOTSET", ""):
            return ("auto_pad SAME with a stride > 1 along a dynamic spatial axis, or of unknown rank (the padding "
                    "depends on the length); export with explicit padding or static spatial sizes")
        dims = static_dims(node.inputs[0])
        if dims is None or dims[1] is None:
            return "the channel count must be static (run shape inference)"
        return None

    def transpose(self, em, node, s, p):
        x_sp, z_sp = spatial_static(node.inputs[0]), spatial_static(node.outputs[0])
        if x_sp is None or z_sp is None:
            return [self._transpose_dynamic(em, node, s)]
        channels = static_dims(node.inputs[0])[1]
        k = list(node.attributes.get_ints("kernel_shape"))
        nd = len(k)
        st = list(node.attributes.get_ints("strides", [1] * nd))
        pads = list(node.attributes.get_ints("pads", [0] * (2 * nd)))
        include = node.attributes.get_int("count_include_pad", 0)
        inv = np.ones(z_sp)
        for ax in range(nd):
            div = _window_counts(x_sp[ax], k[ax], st[ax], pads[ax], pads[nd + ax], z_sp[ax], include)
            shape = [1] * nd
            shape[ax] = -1
            inv = inv / div.reshape(shape)
        if not np.allclose(inv, inv.flat[0]):
            s = em.mul(s, em.const(inv[None, None], tag="inv_count"), tag="s_scaled")
            kernel = np.ones((channels, 1) + tuple(k))
        else:
            kernel = np.full((channels, 1) + tuple(k), inv.flat[0])
        # the transposed window sum; ceil_mode windows may reach past the padded input: crop via pads
        pads_b = pads[:nd]
        pads_e, out_pad = [], []
        for ax in range(nd):
            natural = (z_sp[ax] - 1) * st[ax] + k[ax] - pads_b[ax]
            extra = natural - x_sp[ax]
            pads_e.append(max(extra, 0))
            out_pad.append(max(-extra, 0))
        wc = em.const(kernel, tag="ones_kernel", key=(node.name, "pool_kernel"))
        return [em.op("ConvTranspose", s, wc, tag="JTs", strides=st, pads=pads_b + pads_e, group=channels,
                      output_padding=out_pad)]


    def _transpose_dynamic(self, em, node, s):
        """Spatial sizes known only at run time: the divisor of each window is counted by a convolution of ones
        (over the input, or over the padded input with count_include_pad), the window sum transposed by a
        ConvTranspose and padded or cropped to the input's shape."""
        x = node.inputs[0]
        channels = static_dims(x)[1]
        k = list(node.attributes.get_ints("kernel_shape"))
        nd = len(k)
        st = list(node.attributes.get_ints("strides", [1] * nd))
        pads = list(node.attributes.get_ints("pads", [0] * (2 * nd)))
        include = node.attributes.get_int("count_include_pad", 0)
        ceil = node.attributes.get_int("ceil_mode", 0)
        if not ceil and (include or not any(pads)):
            s = em.scale(s, 1.0 / float(np.prod(k)), tag="s_mean")  # every window holds prod(k) counted entries
        else:
            sp_shape = em.op("Shape", x, start=2, tag="x_spatial")
            ones = em.op("ConstantOfShape", em.op("Concat", em.ints([1, 1]), sp_shape, axis=0, tag="ones_shape"),
                         value=ir.tensor(np.ones(1, dtype=em.np_dtype)), tag="ones")
            extra = [t - 1 if ceil else 0 for t in st]  # room for the last (partial) ceil_mode window
            if include:  # windows count padding, but not what lies past it
                ones = em.op("Pad", ones, em.ints([0, 0] + pads[:nd] + [0, 0] + pads[nd:]), em.scalar(1.0),
                             tag="ones_padded")
                conv_pads = [0] * nd + extra
            else:
                conv_pads = pads[:nd] + [pe + e for pe, e in zip(pads[nd:], extra)]
            one_k = em.const(np.ones((1, 1) + tuple(k)), tag="count_kernel", key=(node.name, "count_kernel"))
            count = em.op("Conv", ones, one_k, strides=st, pads=conv_pads, tag="count_all")
            z_sp = em.op("Shape", node.outputs[0], start=2, tag="z_spatial")
            count = em.op("Slice", count, em.ints([0] * nd), z_sp, em.ints(list(range(2, 2 + nd))), tag="count")
            s = em.div(s, count, tag="s_mean")
        kernel = em.const(np.ones((channels, 1) + tuple(k)), tag="ones_kernel", key=(node.name, "pool_kernel"))
        t = em.op("ConvTranspose", s, kernel, strides=st, pads=pads[:nd] + [0] * nd, group=channels,
                  tag="JTs_natural")
        return fit_to(em, t, x, tag="JTs")


class _Reduce(_Pool):
    """Global average pool / ReduceMean / ReduceSum: J^T s = expand(s) (divided by the count for means)."""

    def kept(self, em, node, s):
        """(x, axes, s, z) with s and the output z given back their reduced axes (size 1) when keepdims=0."""
        axes, keep = self.axes(node)
        z = node.outputs[0]
        if not keep and axes:
            s = em.op("Unsqueeze", s, em.ints(axes), tag="s_kept")
            z = em.op("Unsqueeze", z, em.ints(axes), tag="z_kept")
        return node.inputs[0], axes, s, z

    def axes(self, node):
        rank = len(node.inputs[0].shape)
        if node.op_type.startswith("Global"):
            return list(range(2, rank)), True
        axes = None
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            axes = const(node.inputs[1])
            axes = None if axes is None else [int(a) for a in axes.reshape(-1)]
        elif "axes" in node.attributes:
            axes = list(node.attributes.get_ints("axes"))
        if not axes:
            if node.attributes.get_int("noop_with_empty_axes", 0):
                return [], True
            axes = list(range(rank))
        return sorted(a % rank for a in axes), bool(node.attributes.get_int("keepdims", 1))

    def check(self, node):
        x = node.inputs[0]
        if x.shape is None:
            return "input rank unknown"
        if len(node.inputs) > 1 and node.inputs[1] is not None and const(node.inputs[1]) is None:
            return "axes are not constant"
        return meta.COUPLES_ITEMS.get(node)  # batch statistics (load/passes/standard.py)

    def mean(self, node):
        return node.op_type in ("GlobalAveragePool", "ReduceMean")

    def transpose(self, em, node, s, p):
        x = node.inputs[0]
        axes, keep = self.axes(node)
        if not keep and axes:
            s = em.op("Unsqueeze", s, em.ints(axes), tag="s_kept")
        if self.mean(node):
            dims = static_dims(x)
            if all(dims[a] is not None for a in axes):
                count = int(np.prod([dims[a] for a in axes])) if axes else 1
                s = em.scale(s, 1.0 / count, tag="s_mean")
            else:  # reduced sizes known at run time: the count is size(x) / size(z)
                sizes = [em.op("Cast", em.op("Size", v, tag=f"{t}_size"), to=em.dtype.value, tag=f"{t}_n")
                         for v, t in ((x, "x"), (node.outputs[0], "z"))]
                s = em.div(em.mul(s, sizes[1], tag="s_zn"), sizes[0], tag="s_mean")
        return [em.op("Expand", s, em.shape_of(x, tag="x_shape"), tag="JTs")]


@register
class GlobalAveragePool(_Reduce):
    kind = Kind.AVGPOOL
    op_types = ("GlobalAveragePool", "ReduceMean")
    nonneg = Nonneg.INPUTS


@register
class ReduceSum(_Reduce):
    kind = Kind.SUM
    op_types = ("ReduceSum",)
    nonneg = Nonneg.INPUTS


@register
class MaxPool(_Pool):
    """z = max over windows; J^T s scatters s to each window's arg-max (summed where windows overlap)."""

    kind = Kind.MAXPOOL
    op_types = ("MaxPool",)
    nonneg = Nonneg.INPUTS

    def check(self, node):
        bad = _window_misfit(node)
        if bad:
            return bad
        if node.attributes.get_int("storage_order", 0):
            return "storage_order=1"
        if not node.inputs[0].dtype == ir.DataType.FLOAT and not node.inputs[0].dtype == ir.DataType.DOUBLE:
            return "indices need float32/float64 input"
        return None

    def indices(self, em, node):
        if len(node.outputs) < 2:
            node.resize_outputs(2)
            node.outputs[1].name = em.name("argmax")
            node.outputs[1].type = ir.TensorType(ir.DataType.INT64)
        return node.outputs[1]

    def transpose(self, em, node, s, p):
        x = node.inputs[0]
        idx = em.op("Reshape", self.indices(em, node), em.ints([-1]), tag="argmax_flat")
        s_flat = em.op("Reshape", s, em.ints([-1]), tag="s_flat")
        # zeros shaped like x, flattened: x's shape is read where it lives (a shape computed from Size(x) would be a
        # node onnxruntime runs on the CPU in a CUDA session, with a device synchronisation before it)
        dims = static_dims(x)
        if dims is not None and all(d is not None for d in dims):
            zeros = em.op("ConstantOfShape", em.ints([int(np.prod(dims))]),
                          value=ir.tensor(np.zeros(1, dtype=em.np_dtype)), tag="zeros")
        else:
            zeros = em.op("Reshape", em.zeros_like(x, tag="zeros_x"), em.ints([-1]), tag="zeros")
        g = em.op("ScatterElements", zeros, idx, s_flat, axis=0, reduction="add", tag="scatter")
        return [em.reshape_like(g, x, tag="JTs")]


@register
class GlobalMaxPool(_Reduce):
    """z = max (min) over axes; J^T s = s spread evenly over the positions that attain it (as torch.amax)."""

    kind = Kind.MAXPOOL
    op_types = ("GlobalMaxPool", "ReduceMax", "ReduceMin")
    nonneg = Nonneg.INPUTS

    def mean(self, node):
        return False

    def transpose(self, em, node, s, p):
        x, axes, s, z = self.kept(em, node, s)
        hit = em.op("Cast", em.op("Equal", x, z, tag="is_max"), to=em.dtype.value, tag="hit")
        ties = em.reduce_sum(hit, axes, keepdims=True, tag="ties")
        return [em.mul(hit, em.div(s, ties, tag="s_per_tie"), tag="JTs")]


@register
class ReduceNorm(_Reduce):
    """ReduceL1 = sum |x|, ReduceL2 = sqrt(sum x^2): positively homogeneous of degree 1, so x . J^T (R / z) splits
    R in proportion to |x_i| (L1) or x_i^2 (L2) and conserves it (Euler). J^T s = sign(x) s, resp. x / z s."""

    kind = Kind.SUM
    op_types = ("ReduceL1", "ReduceL2")

    def mean(self, node):
        return False

    def transpose(self, em, node, s, p):
        x, axes, s, z = self.kept(em, node, s)
        if node.op_type == "ReduceL1":
            return [em.mul(em.op("Sign", x, tag="sign_x"), s, tag="JTs")]
        # x / z where z > 0; at z = 0 (all of x zero) the subgradient 0
        safe = em.op("Where", em.op("Equal", z, em.scalar(0.0), tag="z_zero"), em.scalar(1.0), z, tag="z_safe")
        return [em.mul(em.div(x, safe, tag="x_over_z"), s, tag="JTs")]
