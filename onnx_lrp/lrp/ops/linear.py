"""Linear layers with parameters (Conv, ConvTranspose, Gemm, MatMul, element-wise affine) and sums.

Each op's transpose is written right beside its forward: Conv -> ConvTranspose (or, at stride 1, a Conv with the
flipped, transposed kernel, which onnxruntime runs at Conv speed), Gemm/MatMul -> MatMul with the transposed
weight, broadcasting -> ReduceSum over the broadcast axes.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...core import meta
from ...core.emitter import Emitter
from ...core.graph import carries, const, is_param, static_dims
from .base import LinearOp, Op, Params, out_dims, register, spatial_static
from ..vocabulary import Kind, Nonneg


def _attr_ints(node, name, default):
    return list(node.attributes.get_ints(name, default))


def _bias_of(node: ir.Node, idx: int) -> np.ndarray | None:
    """The layer's bias: its own input ``idx`` or the Add folded onto it by the canonizer."""
    b = const(node.inputs[idx]) if len(node.inputs) > idx else None
    if meta.BIAS.has(node):
        extra = meta.BIAS.get(node)
        b = extra if b is None else b + extra
    return b


def _param_shape(v: ir.Value) -> tuple:
    """A weight's shape; a packed weight's (meta.PACKED_WEIGHT: an int4 LLM's) from its static shape, without
    computing its float value (the vocabulary head's is 1 GB)."""
    if v.const_value is None and meta.PACKED_WEIGHT.has(v) and v.shape is not None and \
            all(isinstance(d, int) for d in v.shape):
        return tuple(v.shape)
    return const(v).shape


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` are the same memory read alike (a packed weight's value, read twice): equal without
    comparing their elements."""
    return a is b or (a.dtype == b.dtype and a.shape == b.shape and a.strides == b.strides
                      and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _wconst(em: Emitter, node: ir.Node, p: Params, arr: np.ndarray, tag: str) -> ir.Value:
    return em.const(arr, tag=tag, key=(node.name, tag, p.key))


def fit_to(em: Emitter, t: ir.Value, x: ir.Value, tag: str) -> ir.Value:
    """``t`` (N, C, spatial...) padded with zeros or cropped at the end of each spatial axis to ``x``'s shape, read at
    run time: the transpose of a strided window op whose trailing inputs no window reached (or, with ceil_mode, whose
    last window reached past them)."""
    rank = len(x.shape)
    diff = em.op("Sub", em.shape_of(x, tag=f"{tag}_x_shape"), em.shape_of(t, tag=f"{tag}_t_shape"), tag=f"{tag}_diff")
    pads = em.op("Concat", em.ints([0] * rank), diff, axis=0, tag=f"{tag}_pads")
    return em.op("Pad", t, pads, tag=tag)


def _like(v: ir.Value, x: ir.Value) -> ir.Value:
    """Give J^T s the (known) type and shape of the input x it is the gradient for. onnxruntime's NCHWc layout
    pass runs an element-wise Mul/Add of two blocked tensors in the blocked layout only when it can prove their
    shapes equal, which needs the symbolic batch dimension that shape inference loses along the relevance path."""
    if x.shape is not None and v.shape is None:
        v.shape = x.shape
    if x.type is not None and v.type is None:
        v.type = x.type
    return v


class _Conv(LinearOp):
    kind = Kind.CONVOLUTION

    def geometry(self, node):
        x, z = node.inputs[0], node.outputs[0]
        w = const(node.inputs[1])
        nd = w.ndim - 2
        return dict(
            x_sp=spatial_static(x), z_sp=spatial_static(z), k=list(w.shape[2:]),
            strides=_attr_ints(node, "strides", [1] * nd), dil=_attr_ints(node, "dilations", [1] * nd),
            pads=_attr_ints(node, "pads", [0] * (2 * nd)), group=node.attributes.get_int("group", 1), nd=nd)

    data_inputs = (0,)

    def check(self, node):
        if not is_param(node.inputs[1]):
            return "weight is not a constant"
        if len(node.inputs) > 2 and node.inputs[2] is not None and not is_param(node.inputs[2]):
            return "bias is not a constant"
        if node.attributes.get_string("auto_pad", "NOTSET") not in ("NOTSET", ""):
            return ("auto_pad SAME with a stride > 1 along a dynamic spatial axis, or of unknown rank (the padding "
                    "depends on the length); export with explicit padding or static spatial sizes")
        bad = self.malformed(node)
        if bad:
            return "malformed: " + bad
        if node.inputs[0].shape is None:
            return "input rank unknown (run shape inference)"
        return None  # dynamic spatial sizes: the transposes read them from the forward tensors at run time

    def malformed(self, node) -> str | None:
        """Attributes and parameter shapes that do not fit each other (the ONNX checker lets them pass)."""
        w = const(node.inputs[1])
        if w.ndim < 3:
            return f"weight of rank {w.ndim} (needs >= 3)"
        nd = w.ndim - 2
        group = node.attributes.get_int("group", 1)
        x = static_dims(node.inputs[0])
        if x is not None and len(x) != w.ndim:
            return f"input of rank {len(x)} for a weight of rank {w.ndim}"
        for attr, n, least in (("strides", nd, 1), ("dilations", nd, 1), ("pads", 2 * nd, 0),
                               ("kernel_shape", nd, 1), ("output_padding", nd, 0)):
            vals = list(node.attributes.get_ints(attr, [least] * n))
            if len(vals) != n or any(v < least for v in vals):
                return f"{attr}={vals} (needs {n} values >= {least})"
        if "kernel_shape" in node.attributes and list(node.attributes.get_ints("kernel_shape")) != list(w.shape[2:]):
            return f"kernel_shape {list(node.attributes.get_ints('kernel_shape'))} != weight {list(w.shape[2:])}"
        if group < 1:
            return f"group={group}"
        conv = node.op_type == "Conv"
        cin = w.shape[1] * group if conv else w.shape[0]
        cout = w.shape[0] if conv else w.shape[1] * group
        if (conv and w.shape[0] % group) or (not conv and w.shape[0] % group):
            return f"{w.shape[0]} channels do not split into group={group}"
        if x is not None and x[1] is not None and x[1] != cin:
            return f"input has {x[1]} channels, the weight expects {cin}"
        b = const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        if b is not None and b.shape != (cout,):
            return f"bias of shape {list(b.shape)} for {cout} output channels"
        if conv and x is not None:
            pads, dil = list(node.attributes.get_ints("pads", [0] * (2 * nd))), list(
                node.attributes.get_ints("dilations", [1] * nd))
            if any(x[2 + a] is not None and x[2 + a] + pads[a] + pads[nd + a] < dil[a] * (w.shape[2 + a] - 1) + 1
                   for a in range(nd)):
                return f"kernel {list(w.shape[2:])} larger than the padded input {x[2:]}"
        return None

    def params(self, node):
        return Params(const(node.inputs[1]), _bias_of(node, 2))

    def forward(self, em, node, xs, p):
        """The same convolution (its own attributes) on modified inputs and parameters."""
        attrs = {k: a.value for k, a in node.attributes.items()
                 if k in ("strides", "pads", "dilations", "group", "output_padding")}
        inputs = [xs[0], _wconst(em, node, p, p.w, "w")]
        if p.b is not None and np.any(p.b):
            inputs.append(_wconst(em, node, p, p.b, "b"))
        return em.op(node.op_type, *inputs, tag="z", **attrs)

    def bias_const(self, em, node, b, tag):
        nd = const(node.inputs[1]).ndim - 2
        return em.const(np.asarray(b).reshape((-1,) + (1,) * nd), tag=tag)


def _same_across_channels(w: np.ndarray) -> bool:
    """Whether every (output, input) channel pair of a convolution weight holds the same kernel."""
    return bool(np.array_equal(w[0, 0], w[-1, -1]) and np.all(w == w[:1, :1]))


@register
class Conv(_Conv):
    """z = conv(x, W) + b; J^T s = conv_transpose(s, W)."""

    op_types = ("Conv",)

    def transpose(self, em, node, s, p):
        out = self._transpose(em, node, s, p)
        _like(out[0], node.inputs[0])
        return out

    def _transpose(self, em, node, s, p):
        g = self.geometry(node)
        w, nd, group = p.w, g["nd"], g["group"]
        if group == 1 and w.shape[0] > 1 and g["x_sp"] is not None and g["z_sp"] is not None \
                and _same_across_channels(w):
            # one kernel for every (output, input) channel pair (the flat rule's ones): the output channels summed
            # first, one channel transposed, then the same map for every input channel (cout x cin times fewer
            # multiply-adds; ResNet50's first layer under flat: 33 ms -> under 1 ms at batch 8)
            one = self._transpose(em, node, em.reduce_sum(s, [1], tag="JTs_sum"), Params(
                np.ascontiguousarray(w[:1, :1]), None, key=(p.key, "one")))[0]
            return [em.op("Expand", one, em.shape_of(node.inputs[0], tag="x_shape"), tag="JTs_all")]
        pads_b, pads_e = g["pads"][:nd], g["pads"][nd:]
        reach = [d * (k - 1) for d, k in zip(g["dil"], g["k"])]
        if all(st == 1 for st in g["strides"]) and all(r - pb >= 0 and r - pe >= 0
                                                        for r, pb, pe in zip(reach, pads_b, pads_e)):
            # stride 1: the transpose is a Conv with the kernel flipped and in/out channels swapped per group
            cout, cin_g = w.shape[:2]
            wt = w.reshape((group, cout // group, cin_g) + w.shape[2:]).swapaxes(1, 2)
            wt = wt.reshape((group * cin_g, cout // group) + w.shape[2:])
            wt = np.ascontiguousarray(np.flip(wt, axis=tuple(range(2, 2 + nd))))
            pads = [r - pb for r, pb in zip(reach, pads_b)] + [r - pe for r, pe in zip(reach, pads_e)]
            return [em.op("Conv", s, _wconst(em, node, p, wt, "wT"), tag="JTs", pads=pads, dilations=g["dil"],
                          group=group)]
        st = g["strides"][0]
        if g["x_sp"] is None or g["z_sp"] is None:  # dynamic spatial sizes: crop or pad to x's shape at run time
            # only the leading pads are cropped here: the last window may stop short of the end padding, whose
            # place the natural transpose would then give to the last inputs; fit_to crops or pads the end to x
            t = em.op("ConvTranspose", s, _wconst(em, node, p, w, "w"), tag="JTs_natural", strides=g["strides"],
                      pads=list(pads_b) + [0] * nd, dilations=g["dil"], group=group)
            return [fit_to(em, t, node.inputs[0], tag="JTs")]
        if nd == 2 and max(g["k"]) == 1 and all(x == st for x in g["strides"]) and w.shape[1] > 1:
            return [self._pointwise_upsample(em, node, s, p, g)]
        # other strided transposes: onnxruntime's ConvTranspose (measured faster than a polyphase Conv, whose
        # phases need a layout reorder on each side and an interleave, on ResNet50 and MobileNetV2)
        out_pad = [xs - ((zs - 1) * st + d * (k - 1) + 1 - pb - pe) for xs, zs, st, d, k, pb, pe in
                   zip(g["x_sp"], g["z_sp"], g["strides"], g["dil"], g["k"], pads_b, pads_e)]
        return [em.op("ConvTranspose", s, _wconst(em, node, p, w, "w"), tag="JTs", strides=g["strides"],
                      pads=g["pads"], dilations=g["dil"], group=group, output_padding=out_pad)]


    def _pointwise_upsample(self, em, node, s, p, g):
        """Strided 1x1 transpose: the channel mix at low resolution, then zeros interleaved and a crop."""
        w, group, st = p.w, g["group"], g["strides"][0]
        cout, cin_g = w.shape[:2]
        wt = w.reshape(group, cout // group, cin_g, 1, 1).swapaxes(1, 2).reshape(group * cin_g, cout // group, 1, 1)
        mixed = em.op("Conv", s, _wconst(em, node, p, np.ascontiguousarray(wt), "wT"), tag="JTs_mixed", group=group)
        cin = group * cin_g
        # zeros interleaved by a per-channel ConvTranspose with a 1x1 kernel of ones (exact: each output is one
        # value times 1 or nothing), cropped by its pads: onnxruntime runs it several times faster than
        # Pad + DepthToSpace + Slice. The full upsampled length is st*(h-1)+1; output i reads position i + pad.
        pads_b, pads_e, out_pad = [], [], []
        for x, zz, pb in zip(g["x_sp"], g["z_sp"], g["pads"][:2]):
            full = st * (zz - 1) + 1
            pads_b.append(pb)
            pads_e.append(max(0, full - pb - x))
            out_pad.append(max(0, x - (full - pb)))
        ones = em.const(np.ones((cin, 1, 1, 1), dtype=w.dtype), tag="interleave", key=("interleave", cin, w.dtype.str))
        return em.op("ConvTranspose", mixed, ones, tag="JTs", group=cin, strides=[st, st], pads=pads_b + pads_e,
                     output_padding=out_pad)


@register
class ConvTranspose(_Conv):
    """z = conv_transpose(x, W) + b; J^T s = conv(s, W)."""

    op_types = ("ConvTranspose",)

    def check(self, node):
        if "output_shape" in node.attributes:
            return "output_shape attribute (give explicit pads instead)"
        return super().check(node)

    def params(self, node):
        # weight layout (Cin, Cout/g, k...): bias is per output channel
        return Params(const(node.inputs[1]), _bias_of(node, 2))


    def transpose(self, em, node, s, p):
        g = self.geometry(node)
        return [em.op("Conv", s, _wconst(em, node, p, p.w, "w"), tag="JTs", strides=g["strides"], pads=g["pads"],
                      dilations=g["dil"], group=g["group"])]


@register
class Gemm(LinearOp):
    """z = alpha x W(^T) + beta c; J^T s = s W (a MatMul with the weight as stored, or Gemm with transB)."""

    kind = Kind.DENSE
    op_types = ("Gemm",)

    data_inputs = (0,)

    def check(self, node):
        if not is_param(node.inputs[1]):
            return "B is not a constant (a product of two activations)"
        if node.attributes.get_int("transA", 0):
            return "transA=1 on an activation"
        c = const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        if len(node.inputs) > 2 and node.inputs[2] is not None and c is None:
            return "C is not a constant"
        if c is not None and c.ndim == 2 and c.shape[0] != 1:
            return "C varies along the batch"
        w = const(node.inputs[1])
        if w.ndim != 2:
            return f"malformed: B of rank {w.ndim}"
        trans_b = node.attributes.get_int("transB", 0)
        k, n_out = (w.shape[1], w.shape[0]) if trans_b else w.shape
        if c is not None and (c.ndim > 2 or c.size not in (1, n_out)):
            return f"malformed: C of shape {list(c.shape)} for {n_out} outputs"
        x = static_dims(node.inputs[0])
        if x is not None and (len(x) != 2 or (x[1] is not None and x[1] != k)):
            return f"malformed: A of shape {x} for B {list(w.shape)} (transB={trans_b})"
        if not all(np.isfinite(node.attributes.get_float(a, 1.0)) for a in ("alpha", "beta")):
            return "malformed: alpha or beta is not finite"
        return None

    def params(self, node):
        alpha = node.attributes.get_float("alpha", 1.0)
        beta = node.attributes.get_float("beta", 1.0)
        w = const(node.inputs[1])
        trans_b = node.attributes.get_int("transB", 0)
        n_out = w.shape[0] if trans_b else w.shape[1]
        c = const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        b = None if c is None else np.broadcast_to(beta * c.reshape(-1), (n_out,)).astype(w.dtype)
        if meta.BIAS.has(node):
            b = meta.BIAS.get(node) if b is None else b + meta.BIAS.get(node)
        return Params(w if alpha == 1.0 else (alpha * w).astype(w.dtype), b)

    def forward(self, em, node, xs, p):
        inputs = [xs[0], _wconst(em, node, p, p.w, "w")]
        if p.b is not None and np.any(p.b):
            inputs.append(_wconst(em, node, p, p.b, "b"))
        return em.op("Gemm", *inputs, tag="z", transB=node.attributes.get_int("transB", 0))

    def transpose(self, em, node, s, p):
        wc = _wconst(em, node, p, p.w, "w")
        if node.attributes.get_int("transB", 0):
            return [em.op("MatMul", s, wc, tag="JTs")]
        return [em.op("Gemm", s, wc, tag="JTs", transB=1)]


class MatMul(LinearOp):
    """z = x W (or W x) with a constant W; J^T s = s W^T (or W^T s), summed over broadcast batch axes."""

    kind = Kind.DENSE
    op_types = ("MatMul",)

    def _side(self, node):
        return 1 if is_param(node.inputs[1]) else 0  # which input is the weight

    def relevance_inputs(self, node):
        return [i for i in (0, 1) if carries(node.inputs[i])]

    def check(self, node):
        if not (is_param(node.inputs[0]) or is_param(node.inputs[1])):
            return "a product of two activations (bilinear; use the attnlrp composite)"
        w = _param_shape(node.inputs[self._side(node)])
        if len(w) < 2:
            return "1-D weight"
        x = static_dims(node.inputs[1 - self._side(node)])
        if x is not None and len(x) >= 2:
            inner_x, inner_w = (x[-1], w[-2]) if self._side(node) == 1 else (x[-2], w[-1])
            if inner_x is not None and inner_x != inner_w:
                return f"malformed: inner dimensions {inner_x} and {inner_w} differ"
        return None

    def params(self, node):
        return Params(const(node.inputs[self._side(node)]), meta.BIAS.get(node))

    def forward(self, em, node, xs, p):
        wc = _wconst(em, node, p, p.w, "w")
        z = em.op("MatMul", xs[0], wc, tag="xw") if self._side(node) == 1 else em.op("MatMul", wc, xs[0], tag="wx")
        if p.b is not None and np.any(p.b):
            z = em.add(z, _wconst(em, node, p, p.b, "b"), tag="z")
        return z

    def transpose(self, em, node, s, p):
        side = self._side(node)
        x = node.inputs[1 - side]
        if side == 1 and p.w.ndim == 2 and x.shape is not None and len(x.shape) >= 2:
            # s W^T as Gemm(s, W, transB=1) on the rows of s: no transposed copy of the weight (the forward's own
            # initializer when unmodified), and onnxruntime's Gemm with transB beats MatMul with W^T on long rows
            own = node.inputs[1]
            c = const(own)
            wc = own if _same_array(p.w, c) or np.array_equal(p.w, c) else _wconst(em, node, p, p.w, "w")
            if len(x.shape) == 2:
                return [em.op("Gemm", s, wc, transB=1, tag="JTs")]
            rows = em.op("Reshape", s, em.ints([-1, p.w.shape[1]]), tag="s_rows")
            return [em.reshape_like(em.op("Gemm", rows, wc, transB=1, tag="JTs_rows"), x, tag="JTs")]
        wt = np.ascontiguousarray(np.swapaxes(p.w, -1, -2))
        wtc = _wconst(em, node, p, wt, "wT")
        g = em.op("MatMul", s, wtc, tag="JTs") if side == 1 else em.op("MatMul", wtc, s, tag="JTs")
        xd, zd = static_dims(x), out_dims(node)
        if xd is not None and zd is not None and (len(xd) < len(zd) or any(
                a == 1 and b != 1 for a, b in zip(xd[:-2], zd[len(zd) - len(xd):-2]))):
            g = em.unbroadcast(g, zd, x, tag="JTs_sum")  # batch axes x was broadcast along
        return [g]


class Affine(LinearOp):
    """z = x * w + b with constants w, b broadcast element-wise; J^T s = unbroadcast(s * w)."""

    kind = Kind.AFFINE

    def __init__(self, op_type):
        self.op_types = (op_type,)

    def relevance_inputs(self, node):
        return [i for i, v in enumerate(node.inputs[:2]) if carries(v)][:1]

    def check(self, node):
        if node.op_type == "Div" and is_param(node.inputs[0]):
            return "division of a constant by an activation (not linear)"
        return _broadcast_misfit(node)

    def params(self, node):
        t = node.op_type
        i = self.relevance_inputs(node)[0]
        c = const(node.inputs[1 - i])
        if c is None:  # a shift computed from the input's shape (a causal mask): its value is not needed
            return Params(None, None) if t == "Add" or i == 0 else Params(
                np.array(-1.0, dtype=node.outputs[0].dtype.numpy()), None)
        if t == "Mul":
            return Params(c, None)
        if t == "Div":
            return Params((1.0 / c).astype(c.dtype), None)
        if t == "Add":
            return Params(None, c)
        # Sub: x - c, or c - x
        return Params(None, -c) if i == 0 else Params(-np.ones_like(c), c)

    def forward(self, em, node, xs, p):
        z = xs[0]
        if p.w is not None and not np.all(p.w == 1):
            z = em.mul(z, _wconst(em, node, p, p.w, "w"), tag="xw")
        if p.b is not None and np.any(p.b):
            z = em.add(z, _wconst(em, node, p, p.b, "b"), tag="z")
        return z

    def transpose(self, em, node, s, p):
        x = node.inputs[self.relevance_inputs(node)[0]]
        if p.w is not None and not np.all(p.w == 1):
            s = em.mul(s, _wconst(em, node, p, p.w, "w"), tag="sw")
        return [em.unbroadcast(s, out_dims(node), x, tag="JTs")]


def _broadcast_misfit(node) -> str | None:
    """Element-wise ops: the inputs' static shapes must broadcast to the output's (unknown ranks are refused: the
    transpose sums over broadcast axes)."""
    dims = [static_dims(v) for v in node.inputs if v is not None]
    out = static_dims(node.outputs[0])
    if out is None or any(d is None for d in dims):
        return "input or output rank unknown"
    try:
        shape = np.broadcast_shapes(*[tuple(1 if d is None else d for d in ds) for ds in dims])
    except ValueError:
        return f"malformed: inputs of shapes {dims} do not broadcast"
    if len(shape) != len(out) or any(o is not None and s != 1 and s != o for s, o in zip(shape, out)):
        return f"malformed: inputs of shapes {dims} do not give the output shape {out}"
    return None


@register
class BatchNormalization(Affine):
    """Inference-mode BatchNormalization not folded into a layer: z = x * a + c, per channel."""

    kind = Kind.BATCHNORM

    def __init__(self):
        super().__init__("BatchNormalization")

    data_inputs = (0,)

    def check(self, node):
        if node.attributes.get_int("training_mode", 0):
            return "training_mode=1"
        if not all(is_param(v) for v in node.inputs[1:5]):
            return "statistics are not constants"
        x = static_dims(node.inputs[0])
        shapes = {tuple(const(v).shape) for v in node.inputs[1:5]}
        if x is None or len(x) < 2:
            return "input rank unknown or < 2"
        if len(shapes) != 1 or (x[1] is not None and shapes != {(x[1],)}):
            return f"malformed: statistics of shapes {sorted(shapes)} for {x[1]} channels"
        return None

    def params(self, node):
        scale, shift, mean, var = (const(v).astype(np.float64) for v in node.inputs[1:5])
        a = scale / np.sqrt(var + node.attributes.get_float("epsilon", 1e-5))
        rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else 4
        shape = (-1,) + (1,) * (rank - 2)
        dtype = const(node.inputs[1]).dtype
        return Params(a.reshape(shape).astype(dtype), (shift - mean * a).reshape(shape).astype(dtype))


class ChannelAffine(Affine):
    """x * w + b with w, b constant per channel, not foldable into a layer (an unfolded BatchNormalization written
    as Mul/Add, e.g. by tf2onnx; ``canonize.mark_channel_affine``): BatchNormalization's kind."""

    kind = Kind.BATCHNORM


class Sum(LinearOp):
    """z = x1 + x2 + ... (Sub: x1 - x2) of activations; J^T s = +-s, summed over broadcast axes."""

    kind = Kind.SUM
    has_params = False
    nonneg = Nonneg.INPUTS

    def __init__(self, op_type):
        self.op_types = (op_type,)

    def params(self, node):
        return Params(None, None)

    def check(self, node):
        return _broadcast_misfit(node)

    def _signs(self, node):
        return [1.0, -1.0] if node.op_type == "Sub" else [1.0] * len(node.inputs)

    def forward(self, em, node, xs, p):
        signs = self._signs(node)
        idx = self.relevance_inputs(node)
        terms = [em.scale(x, signs[i], tag="signed") for x, i in zip(xs, idx)]
        consts = [v for j, v in enumerate(node.inputs) if j not in idx and v is not None]
        return em.sum(terms + [em.scale(c, signs[j]) for j, c in enumerate(node.inputs) if c in consts],
                      tag="z")

    def transpose(self, em, node, s, p):
        signs = self._signs(node)
        out = []
        for i in self.relevance_inputs(node):
            g = em.unbroadcast(s, out_dims(node), node.inputs[i], tag=f"JTs{i}")
            out.append(em.scale(g, signs[i], tag=f"JTs{i}_signed"))
        return out


class RuntimeScale(Affine):
    """x * c or x / c with c computed at run time from the input's shape (rotary cos/sin tables of an export with a
    dynamic sequence length): linear in x, J^T s = unbroadcast(s * c). Its weights are not known when the graph is
    rewritten, so only rules that keep them as they are apply (epsilon, LRP-0, pass)."""

    has_params = False

    def _other(self, node):
        return node.inputs[1 - self.relevance_inputs(node)[0]]

    def check(self, node):
        if node.op_type == "Div" and self.relevance_inputs(node)[0] == 1:
            return "division by an activation (not linear)"
        return None

    def params(self, node):
        return Params(None, None)

    def forward(self, em, node, xs, p):
        return em.op(node.op_type, xs[0], self._other(node), tag="z")

    def transpose(self, em, node, s, p):
        x = node.inputs[self.relevance_inputs(node)[0]]
        s = em.op(node.op_type, s, self._other(node), tag="sw")
        return [em.unbroadcast(s, out_dims(node), x, tag="JTs")]


class ElementwiseBinary(Op):
    """Add/Sub/Mul/Div: affine when one side is a constant, a sum when both are activations."""

    def __init__(self, op_type):
        self.op_types = (op_type,)
        self.affine = Affine(op_type)
        self.channel = ChannelAffine(op_type)
        self.sum = Sum(op_type) if op_type in ("Add", "Sub", "Sum") else None
        self.runtime = RuntimeScale(op_type) if op_type in ("Mul", "Div") else None

    def resolve(self, node):
        acts = [v for v in node.inputs if carries(v)]
        if self.sum is not None and (len(acts) > 1 or node.op_type == "Sum"):
            return self.sum
        if self.runtime is not None and len(acts) == 1 and not all(is_param(v) or v is acts[0]
                                                                    for v in node.inputs[:2]):
            return self.runtime
        return self.channel if meta.CHANNEL_AFFINE.has(node) else self.affine

    def nonneg_output(self, node, inputs_nonneg):
        if node.op_type == "Add":
            return all(inputs_nonneg)
        if node.op_type == "Mul":  # e.g. a gated signal relu(h) * sigmoid(s)
            return bool(inputs_nonneg) and all(inputs_nonneg[:2])
        return False

    def check(self, node):
        acts = [v for v in node.inputs if carries(v)]
        if node.op_type in ("Mul", "Div") and len(acts) > 1:
            return "product of two activations (bilinear; use the attnlrp composite)"
        return None


for _t in ("Add", "Sub"):  # Mul and Div: one dispatcher with the products (onnx_lrp.lrp.ops.transformer.Products)
    register(ElementwiseBinary(_t))
register(Sum("Sum"))
