"""Adjoint tests of every op's transpose: <J t, c> = <t, J^T c>.

For each case a one-node (or tiny) model f is built with onnx.helper, a probe ``<reshape(f(x), [1, -1]), c>`` is
appended and the model is rewritten with the gradient rule everywhere; with start="one-hot" the relevance of the
input is then J^T c. J t is computed independently from onnxruntime forwards of the ORIGINAL model:

- linear/affine ops: J t = f(x + t) - f(x) (exact in float32 with dyadic inputs and weights);
- piecewise-linear ops (Relu, MaxPool, ...): J t = (f(x + h t) - f(x)) / h at a fixed activation pattern
  (inputs far from kinks and ties, h = 2^-6, exact in float32);
- smooth ops (Sigmoid, Tanh, Softmax): central differences of the float64 model;
- normalisations whose scale is held constant by design (LayerNormalization, RMSNormalization,
  SimplifiedLayerNormalization, as LXT detaches it): J t = gamma * center(t) / std(x) from numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from util import add_probe, assert_close, dyadic, explain_probe, make_model, node, run, to_bytes

import onnx_lrp
import onnx_lrp.lrp.ops
from onnx_lrp import load as loader
from onnx_lrp.rules import parse_composite

GRADIENT = parse_composite('[[rules]]\nrule = "gradient"\n', source="gradient-everywhere")
PASS_ACTS = parse_composite('[[rules]]\nmatch = { kind = ["activation", "lrn"] }\nrule = "pass"\n'
                            '[[rules]]\nrule = "gradient"\n', source="pass-activations")

_W = np.random.default_rng(1234)


def W(*shape):
    """Dyadic constant weights."""
    return dyadic(_W, shape)


def NZ(*shape):
    """Dyadic constants without zeros (divisors)."""
    return (_W.choice([-4.0, -2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 4.0], size=shape)).astype(np.float32)


def I(*vals):
    return np.array(vals, dtype=np.int64)


@dataclass
class Case:
    id: str
    nodes: list
    inputs: dict
    outs: list
    inits: dict = field(default_factory=dict)
    mode: str = "linear"  # linear | pwl | smooth
    opset: int = 17
    distinct: bool = False  # inputs with well separated values (no ties in max pools)
    keep_outputs: bool = False
    jvp: object = None  # mode "detached": numpy J t from (feeds, input name, t)

    @property
    def op_types(self):
        return {n.op_type for n in self.nodes}


def one(id, op, x_shape, *const_inputs, mode="linear", opset=17, distinct=False, keep_outputs=False, inits=None,
        jvp=None, op_mode=None, **attrs):
    """A one-node case: input x, then named constants (name, array) or None for an empty input. ``mode`` is the
    test's mode; ``op_mode`` the node's ``mode`` attribute (Pad, Resize)."""
    if op_mode is not None:
        attrs["mode"] = op_mode
    inits = dict(inits or {})
    names = ["x"]
    for c in const_inputs:
        if c is None:
            names.append("")
        else:
            names.append(c[0])
            inits[c[0]] = c[1]
    return Case(id, [node(op, names, ["y"], **attrs)], {"x": x_shape}, ["y"], inits, mode, opset, distinct,
                keep_outputs, jvp)


def _norm_jvp(centered, gamma, axis=-1, eps=1e-5):
    """J t of y = gamma * center(x) / std(x) with std(x) held constant (no centering for the RMS forms)."""
    def jvp(feeds, name, t):
        x = feeds["x"].astype(np.float64)
        axes = tuple(range(axis % x.ndim, x.ndim))
        d = x - x.mean(axes, keepdims=True) if centered else x
        inv = 1.0 / np.sqrt((d * d).mean(axes, keepdims=True) + eps)
        tc = t - t.mean(axes, keepdims=True) if centered else t
        return [gamma.astype(np.float64) * tc * inv]
    return jvp


_G4, _G34 = W(4), W(3, 4)
LEAF_NODES = [node("Shape", ["x"], ["shp"]), node("ConstantOfShape", ["shp"], ["z"],
                                                  value=onnx.numpy_helper.from_array(np.array([0.25], np.float32))),
              # seeded: every fresh session draws the same values, so they cancel in f(x + t) - f(x)
              node("EyeLike", ["x"], ["e"]), node("RandomUniformLike", ["x"], ["u"], seed=1.0),
              node("RandomNormalLike", ["x"], ["v"], seed=2.0), node("Size", ["x"], ["sz"]),
              node("Cast", ["sz"], ["szf"], to=1), node("Gather", ["shp", "one_i"], ["n4"], axis=0),
              node("Range", ["zero_i", "n4", "one_i"], ["rg"]), node("Cast", ["rg"], ["rgf"], to=1),
              node("Sum", ["x", "z", "e", "u", "v", "szf", "rgf"], ["y"])]


CASES = [
    # ------------------------------------------------------------------ Conv
    one("conv2d_pads_bias", "Conv", [2, 3, 6, 6], ("w", W(4, 3, 3, 3)), ("b", W(4)), pads=[1, 1, 1, 1]),
    one("conv1d_stride_dil_asym", "Conv", [2, 2, 11], ("w", W(3, 2, 3)), ("b", W(3)), strides=[2], dilations=[2],
        pads=[1, 2]),
    one("conv3d_asym_stride", "Conv", [2, 2, 4, 5, 4], ("w", W(3, 2, 2, 3, 2)), pads=[1, 0, 1, 0, 1, 1],
        strides=[1, 2, 1]),
    one("conv2d_groups", "Conv", [2, 4, 7, 7], ("w", W(6, 2, 3, 3)), ("b", W(6)), group=2, strides=[2, 2],
        pads=[0, 1, 1, 0]),
    one("conv2d_depthwise", "Conv", [2, 3, 6, 6], ("w", W(6, 1, 3, 3)), group=3, pads=[1, 1, 1, 1]),
    one("conv2d_depthwise_stride", "Conv", [2, 3, 7, 6], ("w", W(3, 1, 3, 2)), group=3, strides=[2, 2],
        pads=[1, 0, 0, 1]),
    one("conv2d_dil_asym_stride1", "Conv", [2, 2, 8, 8], ("w", W(3, 2, 3, 3)), dilations=[2, 1],
        pads=[0, 1, 2, 0]),
    one("conv2d_pad_beyond_kernel", "Conv", [2, 2, 5, 5], ("w", W(3, 2, 1, 2)), pads=[1, 2, 2, 1]),
    one("conv2d_stride_leftover", "Conv", [2, 2, 7, 8], ("w", W(2, 2, 2, 3)), strides=[2, 3]),
    one("conv2d_stride_dil_pads", "Conv", [2, 2, 9, 9], ("w", W(2, 2, 3, 3)), strides=[2, 2], dilations=[2, 2],
        pads=[1, 1, 1, 1]),
    one("conv1d_stride_gt_kernel", "Conv", [2, 1, 8], ("w", W(2, 1, 1)), strides=[3]),
    one("conv2d_same_upper", "Conv", [2, 2, 7, 7], ("w", W(3, 2, 3, 3)), ("b", W(3)), auto_pad="SAME_UPPER",
        strides=[2, 2]),
    one("conv2d_same_lower", "Conv", [2, 2, 6, 7], ("w", W(3, 2, 4, 3)), auto_pad="SAME_LOWER", strides=[2, 1]),
    one("conv2d_same_upper_even_kernel", "Conv", [2, 2, 6, 6], ("w", W(2, 2, 2, 2)), auto_pad="SAME_UPPER"),
    one("conv2d_same_lower_stride", "Conv", [2, 2, 7, 8], ("w", W(2, 2, 3, 2)), auto_pad="SAME_LOWER",
        strides=[3, 2]),
    one("conv1d_same_upper_depthwise", "Conv", [2, 3, 9], ("w", W(3, 1, 4)), auto_pad="SAME_UPPER", group=3,
        strides=[2]),
    one("conv2d_valid", "Conv", [2, 2, 8, 8], ("w", W(3, 2, 3, 3)), auto_pad="VALID", strides=[3, 3]),
    # strided 2-D transposes written as phases + DepthToSpace, and strided 1x1 as channel mix + zero interleave
    one("conv2d_phases_k5_s2_pads", "Conv", [2, 3, 11, 12], ("w", W(4, 3, 5, 5)), strides=[2, 2], pads=[2, 1, 0, 2]),
    one("conv2d_phases_k4_s3", "Conv", [2, 2, 13, 13], ("w", W(3, 2, 4, 4)), strides=[3, 3], pads=[1, 2, 0, 1]),
    one("conv2d_1x1_s2_odd", "Conv", [2, 4, 9, 7], ("w", W(3, 4, 1, 1)), ("b", W(3)), strides=[2, 2]),
    one("conv2d_1x1_s2_groups", "Conv", [2, 4, 8, 8], ("w", W(6, 2, 1, 1)), group=2, strides=[2, 2]),
    # strided 1x1 (zeros interleaved by a ConvTranspose: its crop at both ends, its output_padding) and the
    # strided ConvTranspose paths of ResNet/MobileNet-like layers
    one("conv2d_1x1_s2_pads", "Conv", [2, 3, 8, 7], ("w", W(4, 3, 1, 1)), ("b", W(4)), strides=[2, 2],
        pads=[1, 0, 0, 1]),
    one("conv2d_1x1_s3_pads", "Conv", [2, 2, 10, 11], ("w", W(3, 2, 1, 1)), strides=[3, 3], pads=[2, 1, 1, 0]),
    one("conv2d_k3_s2_even", "Conv", [2, 3, 8, 8], ("w", W(4, 3, 3, 3)), strides=[2, 2], pads=[1, 1, 1, 1]),
    one("conv2d_k7_s2_stem", "Conv", [2, 3, 12, 11], ("w", W(4, 3, 7, 7)), strides=[2, 2], pads=[3, 3, 3, 3]),
    one("conv2d_depthwise_s2_pads", "Conv", [2, 4, 8, 8], ("w", W(4, 1, 3, 3)), group=4, strides=[2, 2],
        pads=[1, 1, 1, 1]),
    # ------------------------------------------------------------ ConvTranspose
    one("convT2d_stride_outpad", "ConvTranspose", [2, 3, 4, 4], ("w", W(3, 2, 3, 3)), ("b", W(2)), strides=[2, 2],
        pads=[1, 1, 1, 1], output_padding=[1, 1]),
    one("convT1d_group_dil", "ConvTranspose", [2, 4, 5], ("w", W(4, 1, 3)), group=2, dilations=[2], strides=[3],
        pads=[0, 1]),
    one("convT2d_asym", "ConvTranspose", [2, 2, 3, 4], ("w", W(2, 3, 2, 3)), strides=[2, 1], pads=[0, 1, 1, 0],
        output_padding=[1, 0]),
    one("convT3d", "ConvTranspose", [2, 2, 2, 3, 2], ("w", W(2, 2, 2, 2, 2)), strides=[2, 2, 1]),
    # ------------------------------------------------------------------ Gemm
    one("gemm_bias", "Gemm", [3, 5], ("B", W(5, 4)), ("C", W(4))),
    one("gemm_alpha_beta_transB", "Gemm", [3, 5], ("B", W(4, 5)), ("C", W(1, 4)), alpha=0.5, beta=2.0, transB=1),
    one("gemm_nobias_transB", "Gemm", [3, 5], ("B", W(4, 5)), transB=1, alpha=1.5),
    one("gemm_scalar_c", "Gemm", [3, 5], ("B", W(5, 4)), ("C", np.array(0.75, dtype=np.float32)), beta=0.5),
    # ---------------------------------------------------------------- MatMul
    one("matmul_2d", "MatMul", [3, 5], ("w", W(5, 4))),
    one("matmul_nd", "MatMul", [2, 3, 5], ("w", W(5, 4))),
    one("matmul_broadcast_weight", "MatMul", [2, 5], ("w", W(3, 5, 4))),
    one("matmul_broadcast_both", "MatMul", [2, 1, 3, 5], ("w", W(4, 5, 2))),
    Case("matmul_const_left", [node("MatMul", ["w", "x"], ["y"])], {"x": [2, 5, 3]}, ["y"], {"w": W(4, 5)}),
    Case("matmul_const_left_broadcast", [node("MatMul", ["w", "x"], ["y"])], {"x": [5, 2]}, ["y"],
         {"w": W(3, 4, 5)}),
    Case("matmul_bias_add", [node("MatMul", ["x", "w"], ["h"]), node("Add", ["h", "b"], ["y"])], {"x": [3, 5]},
         ["y"], {"w": W(5, 4), "b": W(4)}),
    # ------------------------------------------------- element-wise with a constant
    one("add_const_bcast", "Add", [2, 3, 4], ("c", W(3, 1))),
    one("add_scalar", "Add", [2, 3, 4], ("c", np.array(0.5, dtype=np.float32))),
    one("sub_x_minus_c", "Sub", [2, 3, 4], ("c", W(4))),
    Case("sub_c_minus_x", [node("Sub", ["c", "x"], ["y"])], {"x": [2, 3, 4]}, ["y"], {"c": W(3, 4)}),
    one("mul_const_bcast", "Mul", [2, 3, 4], ("c", W(1, 3, 1))),
    Case("mul_const_first", [node("Mul", ["c", "x"], ["y"])], {"x": [2, 3, 4]}, ["y"], {"c": W(4)}),
    one("mul_const_higher_rank", "Mul", [3, 4], ("c", W(2, 3, 4))),
    one("div_const", "Div", [2, 3, 4], ("c", NZ(3, 4))),
    # ------------------------------------------------ sums of activations
    Case("add_acts_bcast", [node("Add", ["x", "u"], ["y"])], {"x": [2, 3, 4], "u": [2, 1, 4]}, ["y"]),
    Case("add_acts_rank", [node("Add", ["u", "x"], ["y"])], {"x": [2, 3, 4], "u": [4]}, ["y"]),
    Case("add_same_input", [node("Add", ["x", "x"], ["y"])], {"x": [2, 3]}, ["y"]),
    Case("sub_acts_bcast", [node("Sub", ["x", "u"], ["y"])], {"x": [2, 3, 4], "u": [3, 1]}, ["y"]),
    Case("sub_acts_bcast_first", [node("Sub", ["u", "x"], ["y"])], {"x": [2, 3, 4], "u": [3, 1]}, ["y"]),
    Case("sum3_bcast", [node("Sum", ["x", "u", "v"], ["y"])], {"x": [2, 3, 4], "u": [2, 1, 4], "v": [1, 3, 1]},
         ["y"]),
    Case("sum_with_const", [node("Sum", ["x", "c", "u"], ["y"])], {"x": [2, 3, 4], "u": [2, 3, 4]}, ["y"],
         {"c": W(4)}),
    # ----------------------------------------------------- BatchNormalization
    one("bn_input", "BatchNormalization", [2, 3, 4, 4], ("s", W(3)), ("bb", W(3)), ("m", W(3)),
        ("v", NZ(3) ** 2), epsilon=1e-3),
    one("bn_1d", "BatchNormalization", [2, 3, 5], ("s", W(3)), ("bb", W(3)), ("m", W(3)), ("v", NZ(3) ** 2)),
    Case("bn_after_relu", [node("Relu", ["x"], ["r"]), node("BatchNormalization", ["r", "s", "bb", "m", "v"], ["y"])],
         {"x": [2, 3, 4, 4]}, ["y"], {"s": W(3), "bb": W(3), "m": W(3), "v": NZ(3) ** 2}, mode="pwl"),
    # ---------------------------------------------------------------- MaxPool
    one("maxpool_3x3_s2", "MaxPool", [2, 2, 9, 9], mode="pwl", distinct=True, kernel_shape=[3, 3], strides=[2, 2]),
    one("maxpool_ceil", "MaxPool", [2, 2, 8, 8], mode="pwl", distinct=True, kernel_shape=[3, 3], strides=[2, 2],
        ceil_mode=1),
    one("maxpool_dil_pads", "MaxPool", [2, 2, 9, 9], mode="pwl", distinct=True, kernel_shape=[2, 2],
        dilations=[2, 2], pads=[1, 1, 1, 1]),
    one("maxpool_asym_pads_ceil", "MaxPool", [2, 2, 7, 7], mode="pwl", distinct=True, kernel_shape=[3, 3],
        strides=[2, 2], pads=[1, 0, 0, 1], ceil_mode=1),
    one("maxpool_1d", "MaxPool", [2, 3, 10], mode="pwl", distinct=True, kernel_shape=[3], strides=[2], pads=[1, 1]),
    one("maxpool_3d", "MaxPool", [2, 1, 4, 4, 4], mode="pwl", distinct=True, kernel_shape=[2, 2, 2],
        strides=[2, 2, 2]),
    one("maxpool_same_lower", "MaxPool", [2, 2, 8, 7], mode="pwl", distinct=True, kernel_shape=[2, 3],
        strides=[2, 1], auto_pad="SAME_LOWER"),
    one("maxpool_same_upper", "MaxPool", [2, 2, 7, 7], mode="pwl", distinct=True, kernel_shape=[3, 3],
        strides=[2, 2], auto_pad="SAME_UPPER"),
    # ------------------------------------------------------------ AveragePool
    one("avgpool_pads_include", "AveragePool", [2, 2, 6, 6], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
        count_include_pad=1),
    one("avgpool_pads_exclude", "AveragePool", [2, 2, 6, 6], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
        count_include_pad=0),
    one("avgpool_ceil", "AveragePool", [2, 2, 8, 8], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    one("avgpool_ceil_pads_exclude", "AveragePool", [2, 2, 7, 7], kernel_shape=[3, 3], strides=[2, 2],
        pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=0),
    one("avgpool_ceil_pads_include", "AveragePool", [2, 2, 6, 6], kernel_shape=[3, 3], strides=[2, 2],
        pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1),
    one("avgpool_1d_asym", "AveragePool", [2, 3, 9], kernel_shape=[3], strides=[3], pads=[0, 2]),
    one("avgpool_same_upper", "AveragePool", [2, 2, 7, 7], kernel_shape=[3, 3], strides=[2, 2],
        auto_pad="SAME_UPPER"),
    one("avgpool_3d", "AveragePool", [2, 1, 4, 4, 4], kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
    # --------------------------------------------------- global pools, reductions
    one("global_avgpool", "GlobalAveragePool", [2, 3, 4, 5]),
    one("global_maxpool", "GlobalMaxPool", [2, 3, 4, 5], mode="pwl", distinct=True),
    one("reducemean_axes_input_keep", "ReduceMean", [2, 3, 4, 5], ("axes", I(1, 3)), opset=18, keepdims=1),
    one("reducemean_axes_input_nokeep", "ReduceMean", [2, 3, 4, 5], ("axes", I(-1)), opset=18, keepdims=0),
    one("reducemean_attr", "ReduceMean", [2, 3, 4], axes=[2], keepdims=0),
    one("reducemean_all", "ReduceMean", [2, 3, 4], keepdims=1),
    one("reducesum_keep", "ReduceSum", [2, 3, 4, 5], ("axes", I(0, 2)), keepdims=1),
    one("reducesum_nokeep", "ReduceSum", [2, 3, 4, 5], ("axes", I(1, -2)), keepdims=0),
    one("reducesum_all_scalar", "ReduceSum", [2, 3, 4], keepdims=0),
    one("reducesum_noop_empty_axes", "ReduceSum", [2, 3, 4], noop_with_empty_axes=1),
    one("reducemax_axes_nokeep", "ReduceMax", [2, 3, 4], ("axes", I(1)), opset=18, mode="pwl", distinct=True,
        keepdims=0),
    # ------------------------------------------------------------ shape ops
    one("flatten_axis2", "Flatten", [2, 3, 4, 5], axis=2),
    one("flatten_axis0", "Flatten", [2, 3, 4], axis=0),
    one("reshape_zero_minus1", "Reshape", [2, 3, 4], ("shape", I(0, -1, 2))),
    one("transpose_perm", "Transpose", [2, 3, 4], perm=[2, 0, 1]),
    one("transpose_default", "Transpose", [2, 3, 4]),
    one("squeeze_axes", "Squeeze", [2, 1, 3, 1], ("axes", I(1, -1))),
    one("squeeze_all", "Squeeze", [2, 1, 3, 1]),
    one("unsqueeze", "Unsqueeze", [2, 3], ("axes", I(0, -1))),
    Case("concat_with_const", [node("Concat", ["x", "c", "u"], ["y"], axis=1)], {"x": [2, 3, 4], "u": [2, 1, 4]},
         ["y"], {"c": W(2, 2, 4)}),
    Case("concat_same_input_neg_axis", [node("Concat", ["x", "x"], ["y"], axis=-1)], {"x": [2, 3]}, ["y"]),
    Case("split_sizes_one_unused", [node("Split", ["x", "split"], ["a", "b", "c"], axis=1)], {"x": [2, 7, 3]},
         ["a", "c"], {"split": I(2, 4, 1)}),
    Case("split_equal", [node("Split", ["x"], ["a", "b"], axis=-1)], {"x": [2, 3, 4]}, ["a", "b"]),
    Case("split_num_outputs", [node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3)], {"x": [2, 7, 2]},
         ["a", "b", "c"], opset=18),
    one("slice_negative_step", "Slice", [2, 5, 6], ("st", I(-1)), ("en", I(-100)), ("ax", I(2)), ("sp", I(-2))),
    one("slice_steps_several_axes", "Slice", [2, 5, 7], ("st", I(1, 0)), ("en", I(4, 7)), ("ax", I(1, 2)),
        ("sp", I(2, 3))),
    one("slice_default_axes_clamped", "Slice", [2, 5, 4], ("st", I(0, 1)), ("en", I(1, 1000))),
    one("slice_neg_axis_neg_start", "Slice", [2, 5, 6], ("st", I(-3)), ("en", I(-1)), ("ax", I(-1))),
    one("slice_mixed_steps", "Slice", [2, 6, 7], ("st", I(5, 0)), ("en", I(0, 7)), ("ax", I(1, 2)), ("sp", I(-3, 2))),
    one("gather_scalar", "Gather", [2, 5, 3], ("i", np.array(3, dtype=np.int64)), axis=1),
    one("gather_1d_neg_repeated", "Gather", [2, 5, 3], ("i", I(4, -1, 0, 0)), axis=1),
    one("gather_2d_last_axis", "Gather", [2, 3, 4], ("i", np.array([[0, 2], [2, -3]], dtype=np.int64)), axis=-1),
    one("gather_axis0_repeated", "Gather", [3, 4], ("i", I(1, 1, 0))),
    one("pad_constant_value", "Pad", [2, 3, 4], ("p", I(0, 1, 2, 0, 2, 1)), ("v", np.array(0.5, dtype=np.float32))),
    one("pad_negative", "Pad", [2, 3, 5], ("p", I(0, -1, 1, 0, 1, -2))),
    one("pad_axes_input", "Pad", [2, 3, 5], ("p", I(2, -1, 1, 0)), None, ("ax", I(1, -1)), opset=18),
    one("expand", "Expand", [3, 1], ("shape", I(2, 3, 4))),
    one("expand_same_rank", "Expand", [2, 1, 4], ("shape", I(2, 3, 1))),
    Case("cast_float64_roundtrip", [node("Cast", ["x"], ["d"], to=11), node("Cast", ["d"], ["y"], to=1)],
         {"x": [2, 3]}, ["y"]),
    Case("cast_float16_roundtrip", [node("Cast", ["x"], ["d"], to=10), node("Cast", ["d"], ["y"], to=1)],
         {"x": [2, 3]}, ["y"]),
    Case("castlike_roundtrip", [node("CastLike", ["x", "like"], ["d"]), node("Cast", ["d"], ["y"], to=1)],
         {"x": [2, 3]}, ["y"], {"like": np.zeros(1, dtype=np.float64)}),
    one("identity_kept", "Identity", [2, 3], keep_outputs=True),
    one("dropout_kept", "Dropout", [2, 3], keep_outputs=True),
    # ------------------------------------------------- activations with a derivative
    one("relu", "Relu", [2, 3, 4], mode="pwl"),
    one("leakyrelu", "LeakyRelu", [2, 3, 4], mode="pwl", alpha=0.2),
    one("clip_min_max", "Clip", [2, 3, 4], ("lo", np.array(-1.0, dtype=np.float32)),
        ("hi", np.array(1.0, dtype=np.float32)), mode="pwl"),
    one("clip_min_only", "Clip", [2, 3, 4], ("lo", np.array(-0.5, dtype=np.float32)), mode="pwl"),
    one("sigmoid", "Sigmoid", [2, 3, 4], mode="smooth"),
    one("tanh", "Tanh", [2, 3, 4], mode="smooth"),
    # f(0) != 0: their derivatives serve the gradient-x-input rule (onnx_lrp/ops/elementwise.py)
    one("hardsigmoid", "HardSigmoid", [2, 3, 4], mode="pwl", alpha=0.2, beta=0.5),  # kinks at +-2.5, x in [-2, 2]
    one("exp", "Exp", [2, 3, 4], mode="smooth"),
    one("cos", "Cos", [2, 3, 4], mode="smooth"),
    one("pow_2", "Pow", [2, 3, 4], ("e", np.array(2.0, np.float32)), mode="smooth"),
    *[Case(f"exp_{op.lower()}", [node("Exp", ["x"], ["ex"]), node(op, ["ex"], ["y"])], {"x": [2, 3, 4]}, ["y"],
           mode="smooth") for op in ("Log", "Sqrt", "Reciprocal")],  # positive arguments
    # --------------------------------------------- transformer ops (onnx_lrp/ops/transformer.py)
    one("softmax_last", "Softmax", [2, 3, 5], mode="smooth"),
    one("softmax_axis1", "Softmax", [2, 4, 3], mode="smooth", axis=1),
    one("layernorm_detached", "LayerNormalization", [2, 3, 4], ("g", _G4), ("bb", W(4)), mode="detached",
        jvp=_norm_jvp(True, _G4)),
    one("layernorm_axis1_detached", "LayerNormalization", [2, 3, 4], ("g", _G34), mode="detached", axis=1,
        jvp=_norm_jvp(True, _G34, axis=1)),
    one("rmsnorm_detached", "RMSNormalization", [2, 3, 4], ("g", _G4), mode="detached", opset=23,
        jvp=_norm_jvp(False, _G4)),
    Case("where_const_cond", [node("Where", ["cond", "x", "u"], ["y"])], {"x": [2, 3, 4], "u": [2, 1, 4]}, ["y"],
         {"cond": _W.random((3, 4)) > 0.5}),
    Case("where_computed_cond", [node("Greater", ["x", "zero"], ["cond"]), node("Where", ["cond", "u", "x"], ["y"])],
         {"x": [2, 3, 4], "u": [4]}, ["y"], {"zero": np.array(0.0, np.float32)}, mode="pwl"),
    one("tile", "Tile", [2, 3], ("reps", I(2, 3))),
    one("tile_batch1", "Tile", [2, 3, 2], ("reps", I(1, 2, 3))),
    one("trilu_upper_k1", "Trilu", [2, 4, 5], ("k", np.array(1, np.int64)), upper=1),
    one("trilu_lower", "Trilu", [2, 4, 4], upper=0),
    # fake quantization: relevance passes straight through (the straight-through estimator's J = identity)
    Case("quantize_dequantize", [node("QuantizeLinear", ["x", "qs", "qz"], ["q"]),
                                 node("DequantizeLinear", ["q", "qs", "qz"], ["y"])], {"x": [2, 3, 4]}, ["y"],
         {"qs": np.array(0.125, np.float32), "qz": np.array(0, np.int8)}, mode="detached",
         jvp=lambda feeds, name, t: [t]),
    Case("dynamic_quantize_dequantize", [node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"]),
                                         node("DequantizeLinear", ["q", "qs", "qz"], ["y"])], {"x": [2, 3, 4]}, ["y"],
         mode="detached", jvp=lambda feeds, name, t: [t]),
    # ------------------------------------------- a symbolic batch dimension (as torch.onnx dynamic_axes)
    one("dyn_conv2d_stride", "Conv", ["N", 2, 7, 7], ("w", W(3, 2, 3, 3)), ("b", W(3)), strides=[2, 2],
        pads=[1, 1, 1, 1]),
    one("dyn_conv2d_same_upper", "Conv", ["N", 2, 6, 6], ("w", W(2, 2, 3, 3)), auto_pad="SAME_UPPER", strides=[2, 2]),
    one("dyn_convT", "ConvTranspose", ["N", 2, 3, 3], ("w", W(2, 2, 3, 3)), strides=[2, 2], output_padding=[1, 1]),
    one("dyn_gemm", "Gemm", ["N", 5], ("B", W(4, 5)), ("C", W(4)), transB=1),
    one("dyn_matmul_nd", "MatMul", ["N", 3, 5], ("w", W(5, 4))),
    one("dyn_maxpool", "MaxPool", ["N", 2, 7, 7], mode="pwl", distinct=True, kernel_shape=[3, 3], strides=[2, 2],
        pads=[1, 1, 1, 1]),
    one("dyn_avgpool_ceil", "AveragePool", ["N", 2, 7, 7], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    one("dyn_global_avgpool", "GlobalAveragePool", ["N", 3, 4, 5]),
    one("dyn_global_maxpool", "GlobalMaxPool", ["N", 3, 4, 5], mode="pwl", distinct=True),
    one("dyn_reducemean", "ReduceMean", ["N", 3, 4], ("axes", I(-1)), opset=18, keepdims=0),
    one("dyn_reducesum_batch_axis", "ReduceSum", ["N", 3, 4], ("axes", I(0)), keepdims=1),
    one("dyn_flatten", "Flatten", ["N", 3, 4]),
    one("dyn_reshape", "Reshape", ["N", 3, 4], ("shape", I(-1, 2, 6))),
    one("dyn_transpose", "Transpose", ["N", 3, 4], perm=[0, 2, 1]),
    one("dyn_unsqueeze", "Unsqueeze", ["N", 3], ("axes", I(1))),
    Case("dyn_concat", [node("Concat", ["x", "u"], ["y"], axis=1)], {"x": ["N", 3, 4], "u": ["N", 2, 4]}, ["y"]),
    Case("dyn_split", [node("Split", ["x", "split"], ["a", "b"], axis=2)], {"x": ["N", 3, 5]}, ["a", "b"],
         {"split": I(2, 3)}),
    one("dyn_slice", "Slice", ["N", 5, 6], ("st", I(4, 1)), ("en", I(0, 6)), ("ax", I(1, 2)), ("sp", I(-2, 2))),
    one("dyn_gather_2d", "Gather", ["N", 5, 3], ("i", np.array([[4, 0], [-1, 0]], dtype=np.int64)), axis=1),
    one("dyn_pad_negative", "Pad", ["N", 3, 5], ("p", I(0, 1, -1, 0, -1, 2))),
    one("dyn_expand", "Expand", ["N", 1, 4], ("shape", I(1, 3, 4))),
    # reflect / edge / wrap copy border elements: the transpose scatter-adds every copy back to its source
    one("pad_reflect_2d", "Pad", [2, 2, 4, 5], ("p", I(0, 0, 2, 1, 0, 0, 3, 4)), op_mode="reflect"),
    one("pad_edge_2d", "Pad", [2, 2, 3, 4], ("p", I(0, 0, 1, 5, 0, 0, 3, 0)), op_mode="edge"),
    one("pad_wrap_2d", "Pad", [2, 2, 3, 4], ("p", I(0, 0, 2, 3, 0, 0, 1, 4)), op_mode="wrap", opset=19),
    one("pad_reflect_axes_input", "Pad", [2, 3, 6], ("p", I(3, 2)), None, ("ax", I(-1)), op_mode="reflect", opset=18),
    one("dyn_pad_reflect_batch", "Pad", ["N", 3, 5], ("p", I(0, 1, 2, 0, 2, 3)), op_mode="reflect"),
    one("dyn_tile", "Tile", ["N", 3], ("reps", I(1, 2))),
    Case("dyn_add_acts_bcast", [node("Add", ["x", "u"], ["y"])], {"x": ["N", 3, 4], "u": ["N", 1, 4]}, ["y"]),
    one("dyn_mul_const", "Mul", ["N", 3, 4], ("c", W(3, 1))),
    one("dyn_bn", "BatchNormalization", ["N", 3, 4, 4], ("s", W(3)), ("bb", W(3)), ("m", W(3)), ("v", NZ(3) ** 2)),
    one("dyn_softmax", "Softmax", ["N", 3, 5], mode="smooth"),
    one("dyn_layernorm", "LayerNormalization", ["N", 3, 4], ("g", _G4), mode="detached", jvp=_norm_jvp(True, _G4)),
    Case("leaf_ops_dynamic_batch", LEAF_NODES, {"x": ["N", 4]}, ["y"],
         {"one_i": np.array(1, np.int64), "zero_i": np.array(0, np.int64)}),
]


def _group_norm_jvp(groups, gamma, eps=1e-5):
    """J t of GroupNormalization / InstanceNormalization with the std of each (item, group) held constant."""
    def jvp(feeds, name, t):
        x = feeds["x"].astype(np.float64)
        xg = x.reshape(x.shape[0], groups, -1)
        d = xg - xg.mean(2, keepdims=True)
        inv = 1.0 / np.sqrt((d * d).mean(2, keepdims=True) + eps)
        tg = t.reshape(x.shape[0], groups, -1)
        g = gamma.astype(np.float64).reshape([-1] + [1] * (x.ndim - 2))
        return [((tg - tg.mean(2, keepdims=True)) * inv).reshape(x.shape) * g]
    return jvp


_C6, _G3 = W(6), W(3)
_OFF = (0.125 + 0.25 * _W.integers(-8, 8, size=(3,))).astype(np.float32)  # never equal to a multiple of 1/4
CASES += [
    # ----------------------------------------------- selections (onnx_lrp/ops/select.py)
    one("gatherelements_axis1_neg_repeated", "GatherElements", [2, 4, 3],
        ("i", np.array([[[0, -1, 2], [3, 3, -4]], [[1, 0, 0], [-2, 2, 1]]], np.int64)), axis=1),
    Case("gatherelements_runtime_argmax", [node("ArgMax", ["x"], ["am"], axis=2, keepdims=1),
                                           node("GatherElements", ["x", "am"], ["y"], axis=2)],
         {"x": [2, 3, 5]}, ["y"], mode="pwl", distinct=True),
    one("gathernd_crop_neg", "GatherND", [2, 4, 3], ("i", np.array([[[0, -1]], [[1, 2]]], np.int64))),
    one("gathernd_full_index", "GatherND", [2, 4, 3], ("i", np.array([[0, 1, 2], [1, -1, 0], [0, 1, 2]], np.int64))),
    Case("scatterelements_none", [node("ScatterElements", ["x", "i", "u"], ["y"], axis=1)],
         {"x": [2, 4, 3], "u": [2, 2, 3]}, ["y"], {"i": np.array([[[0, 3, 1], [2, 0, -1]], [[1, 1, 0], [3, 2, 2]]],
                                                                np.int64)}),
    Case("scatterelements_add_dup", [node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction="add")],
         {"x": [2, 4, 3], "u": [2, 2, 3]}, ["y"], {"i": np.array([[[0, 0, 1], [0, 0, -1]], [[1, 1, 0], [1, 2, 0]]],
                                                                np.int64)}, opset=18),
    Case("scatternd_none_neg", [node("ScatterND", ["x", "i", "u"], ["y"])], {"x": [2, 4, 3], "u": [2, 1, 3]}, ["y"],
         {"i": np.array([[[0, -1]], [[1, 2]]], np.int64)}),
    Case("scatternd_add_const_data", [node("ScatterND", ["c", "i", "x"], ["y"], reduction="add")],
         {"x": [2, 3]}, ["y"], {"c": W(2, 4, 3), "i": np.array([[0, 1], [1, 1]], np.int64)}, opset=18),
    Case("topk_values", [node("TopK", ["x", "k"], ["y", "idx"], axis=1)], {"x": [2, 5, 4]}, ["y"],
         {"k": I(3)}, mode="pwl", distinct=True),
    Case("topk_smallest_last_axis", [node("TopK", ["x", "k"], ["y", "idx"], largest=0)], {"x": [2, 3, 6]}, ["y"],
         {"k": I(2)}, mode="pwl", distinct=True),
    # Max/Min of activations: winner takes all; x against its transpose ties exactly on the diagonal (split)
    Case("max_acts_ties_const", [node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
                                 node("Max", ["x", "xt", "c"], ["y"])], {"x": [2, 3, 3]}, ["y"], {"c": _OFF},
         mode="pwl", distinct=True),
    Case("min_acts_broadcast", [node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
                                node("Min", ["xt", "x"], ["y"])], {"x": [2, 3, 3]}, ["y"], mode="pwl", distinct=True),
    one("max_const_broadcast_input", "Max", [2, 3, 1], ("c", _OFF), mode="pwl", distinct=True),
    one("min_const_activation", "Min", [2, 4, 3], ("c", _OFF), mode="pwl", distinct=True),
    one("reducemin_axes", "ReduceMin", [2, 3, 4], ("axes", I(1)), opset=18, mode="pwl", distinct=True, keepdims=0),
    one("reversesequence_time_major", "ReverseSequence", [4, 3, 2], ("lens", np.array([4, 1, 2], np.int64))),
    one("reversesequence_batch_major", "ReverseSequence", [3, 5, 2], ("lens", np.array([5, 3, 1], np.int64)),
        batch_axis=0, time_axis=1),
    one("depthtospace_dcr", "DepthToSpace", [2, 8, 2, 3], blocksize=2),
    Case("depthtospace_crd", [node("DepthToSpace", ["x"], ["y"], blocksize=2, mode="CRD")], {"x": [2, 8, 3, 2]},
         ["y"]),
    one("spacetodepth", "SpaceToDepth", [2, 2, 4, 6], blocksize=2),
    Case("dyn_depthtospace_crd", [node("DepthToSpace", ["x"], ["y"], blocksize=3, mode="CRD")],
         {"x": ["N", 18, 2, 2]}, ["y"]),
    one("reducel1_axes_keep", "ReduceL1", [2, 3, 4], ("axes", I(2)), opset=18, mode="pwl", keepdims=1),
    one("reducel2_axes_nokeep", "ReduceL2", [2, 3, 4], ("axes", I(1, 2)), opset=18, mode="smooth", keepdims=0),
    # ---------------------------------------------------------------- Resize (onnx_lrp/ops/resize.py)
    one("resize_nearest_up2", "Resize", [2, 2, 3, 4], None, ("sc", np.array([1, 1, 2, 2], np.float32))),
    one("resize_nearest_asym_floor_down", "Resize", [2, 2, 6, 7], None, ("sc", np.array([1, 1, 0.5, 0.6], np.float32)),
        coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    one("resize_nearest_ceil_up", "Resize", [2, 1, 3, 5], None, ("sc", np.array([1, 1, 1.5, 2.5], np.float32)),
        nearest_mode="round_prefer_ceil"),
    one("resize_linear_half_pixel_up2", "Resize", [2, 2, 3, 4], None, ("sc", np.array([1, 1, 2, 2], np.float32)),
        op_mode="linear"),
    one("resize_linear_align_corners_sizes", "Resize", [2, 2, 4, 5], None, None, ("sz", I(2, 2, 7, 3)),
        op_mode="linear", coordinate_transformation_mode="align_corners"),
    one("resize_linear_pytorch_half_pixel_down", "Resize", [2, 1, 8, 6], None, ("sc", np.array([1, 1, 0.5, 0.75],
                                                                                                  np.float32)),
        op_mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
    one("resize_linear_1d_axes_attr", "Resize", [2, 3, 5], None, ("sc", np.array([1.6], np.float32)), op_mode="linear",
        axes=[2], opset=18),
    # a long axis (2100 -> 4200: an n x n_out matrix of 8.8 M entries): nearest scatter-adds by source index instead
    one("resize_nearest_long_axis_scatter", "Resize", [2, 1, 2100], None, ("sc", np.array([1, 1, 2], np.float32)),
        nearest_mode="round_prefer_ceil"),
    # scales computed at run time on a static input (onnxruntime's data propagation sees the static shape)
    Case("resize_nearest_runtime_scales_static_x", [node("Shape", ["x"], ["s"]), node("Cast", ["s"], ["sf"], to=1),
                                                    node("Div", ["sf", "sf"], ["o"]), node("Mul", ["o", "c"], ["sc"]),
                                                    node("Resize", ["x", "", "sc"], ["y"])],
         {"x": [2, 2, 3, 4]}, ["y"], {"c": np.array([1, 1, 2, 1.5], np.float32)}),
    # no numpy formula for these: the matrix is the op's response to an identity (at run time)
    one("resize_linear_antialias_down", "Resize", [2, 2, 9, 8], None, ("sc", np.array([1, 1, 0.5, 0.6], np.float32)),
        op_mode="linear", antialias=1, opset=18),
    one("resize_linear_half_pixel_symmetric", "Resize", [2, 1, 5, 4], None, None, ("sz", I(2, 1, 8, 3)),
        op_mode="linear", coordinate_transformation_mode="half_pixel_symmetric", opset=19),
    # --------------------------------------- InstanceNormalization / GroupNormalization (onnx_lrp/ops/norms.py)
    one("instancenorm_detached", "InstanceNormalization", [2, 3, 4, 5], ("s", _G3), ("bb", W(3)), mode="detached",
        jvp=_group_norm_jvp(3, _G3), epsilon=1e-5),
    one("groupnorm21_per_channel", "GroupNormalization", [2, 6, 4], ("s", _C6), ("bb", W(6)), mode="detached",
        opset=21, jvp=_group_norm_jvp(2, _C6), num_groups=2),
    one("groupnorm21_4d_one_group", "GroupNormalization", [2, 6, 2, 2], ("s", _C6), ("bb", W(6)), mode="detached",
        opset=21, jvp=_group_norm_jvp(1, _C6), num_groups=1),
]

# dynamic spatial/time axes (variable-length EEG/audio, dynamic H x W): sizes read from the tensors at run time
# (the symbolic sizes are fed as SYMBOLIC gives them: odd lengths leave inputs no strided window reaches)
SYMBOLIC = {"T": 11, "H": 9, "W": 8}
CASES += [
    one("dynT_conv1d_stride_dil", "Conv", ["N", 2, "T"], ("w", W(3, 2, 3)), ("b", W(3)), strides=[2], dilations=[2],
        pads=[1, 2]),
    one("dynT_conv1d_stride1", "Conv", ["N", 2, "T"], ("w", W(3, 2, 5)), pads=[2, 2]),
    one("dynHW_conv2d_stride_pads", "Conv", ["N", 2, "H", "W"], ("w", W(3, 2, 3, 3)), strides=[2, 2],
        pads=[1, 0, 0, 1]),
    # the end padding is not reached by the last window along W (8 + 2 - 3 is odd): the transpose may not crop it
    one("dynHW_conv2d_s2_end_pad_unreached", "Conv", ["N", 2, "H", "W"], ("w", W(3, 2, 3, 3)), strides=[2, 2],
        pads=[1, 1, 1, 1]),
    one("dynT_conv1d_s3_end_pad_unreached", "Conv", ["N", 2, "T"], ("w", W(2, 2, 2)), strides=[3], pads=[0, 2]),
    one("dynHW_avgpool_end_pad_unreached", "AveragePool", ["N", 2, "H", "W"], kernel_shape=[3, 3], strides=[2, 2],
        pads=[1, 1, 1, 1]),
    one("dynHW_avgpool_end_pad_unreached_include", "AveragePool", ["N", 2, "H", "W"], kernel_shape=[3, 3],
        strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
    one("dynHW_maxpool_end_pad_unreached", "MaxPool", ["N", 2, "H", "W"], mode="pwl", distinct=True,
        kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    one("dynHW_conv2d_1x1_s2", "Conv", ["N", 4, "H", "W"], ("w", W(3, 4, 1, 1)), strides=[2, 2]),
    one("dynHW_convT2d_stride", "ConvTranspose", ["N", 3, "H", "W"], ("w", W(3, 2, 3, 3)), strides=[2, 2],
        pads=[1, 0, 1, 0], output_padding=[1, 1]),
    one("dynHW_avgpool", "AveragePool", ["N", 2, "H", "W"], kernel_shape=[2, 3], strides=[2, 2]),
    one("dynHW_avgpool_ceil_pads_exclude", "AveragePool", ["N", 2, "H", "W"], kernel_shape=[3, 3], strides=[2, 2],
        pads=[1, 1, 1, 1], ceil_mode=1),
    one("dynHW_avgpool_ceil_pads_include", "AveragePool", ["N", 2, "H", "W"], kernel_shape=[3, 3], strides=[2, 2],
        pads=[1, 0, 1, 1], ceil_mode=1, count_include_pad=1),
    one("dynT_avgpool_pads_exclude", "AveragePool", ["N", 2, "T"], kernel_shape=[3], strides=[2], pads=[1, 1]),
    one("dynT_reducemean_time", "ReduceMean", ["N", 3, "T"], ("axes", I(-1)), opset=18, keepdims=0),
    one("dynHW_global_avgpool", "GlobalAveragePool", ["N", 3, "H", "W"]),
    Case("dynT_concat_time", [node("Concat", ["x", "u"], ["y"], axis=1)], {"x": ["N", "T", 4], "u": ["N", "S", 4]},
         ["y"]),
    one("dynT_slice_time_steps", "Slice", ["N", 3, "T"], ("st", I(-2, 1)), ("en", I(0, 9)), ("ax", I(2, 1)),
        ("sp", I(-3, 1))),
    one("dynT_slice_batch_uncut", "Slice", ["N", 3, "T"], ("st", I(0, 1)), ("en", I(2**62, 3)), ("ax", I(0, 1))),
    one("dynT_expand_time", "Expand", ["N", 3, 1], ("shape", I(1, 3, 5))),
    # Resize of a dynamic axis: the interpolation matrix is the forward Resize of an identity at run time
    one("dynHW_resize_nearest_asym_floor_up2", "Resize", ["N", 2, "H", "W"], None,
        ("sc", np.array([1, 1, 2, 2], np.float32)), coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    one("dynHW_resize_nearest_down", "Resize", ["N", 2, "H", "W"], None, ("sc", np.array([1, 1, 0.5, 0.7], np.float32))),
    one("dynHW_resize_linear_half_pixel_up", "Resize", ["N", 2, "H", "W"], None,
        ("sc", np.array([1, 1, 2, 1.5], np.float32)), op_mode="linear"),
    one("dynT_resize_linear_align_corners_sizes", "Resize", ["N", 2, "T"], None, None, ("sz", I(2, 2, 17)),
        op_mode="linear", coordinate_transformation_mode="align_corners"),
    one("dynT_resize_linear_axes_attr", "Resize", ["N", 3, "T"], None, ("sc", np.array([0.6], np.float32)),
        op_mode="linear", coordinate_transformation_mode="pytorch_half_pixel", axes=[2], opset=18),
    Case("dynHW_resize_runtime_sizes", [node("Shape", ["x"], ["shp"]), node("Mul", ["shp", "twice"], ["sizes"]),
                                        node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear")],
         {"x": ["N", 2, "H", "W"]}, ["y"], {"twice": I(1, 1, 2, 3)}),
    # auto_pad SAME with stride 1 along dynamic axes (PP-OCRv6): the total padding is (k - 1) d whatever the length
    one("dynHW_conv_same_upper_even_kernel", "Conv", ["N", 2, "H", "W"], ("w", W(3, 2, 2, 2)), auto_pad="SAME_UPPER"),
    one("dynT_conv_same_lower", "Conv", ["N", 2, "T"], ("w", W(2, 2, 4)), auto_pad="SAME_LOWER"),
    one("dynHW_maxpool_same_upper", "MaxPool", ["N", 2, "H", "W"], mode="pwl", distinct=True, kernel_shape=[2, 2],
        auto_pad="SAME_UPPER"),
    # pads computed at run time (torch's pad-to-a-multiple of a dynamic size): here c * (shape / shape)
    Case("dynT_pad_runtime_pads_crop", [node("Shape", ["x"], ["s"]), node("Div", ["s", "s"], ["o"]),
                                        node("Concat", ["o", "o"], ["oo"], axis=0), node("Mul", ["oo", "pc"], ["p"]),
                                        node("Pad", ["x", "p"], ["y"])],
         {"x": ["N", 2, "T"]}, ["y"], {"pc": I(0, 1, 2, 0, -1, -3)}),
    Case("dynT_pad_runtime_pads_axes", [node("Shape", ["x"], ["s"]), node("Slice", ["s", "i0", "i2"], ["s2"]),
                                        node("Div", ["s2", "s2"], ["o"]), node("Mul", ["o", "pc"], ["p"]),
                                        node("Pad", ["x", "p", "", "ax"], ["y"])],
         {"x": ["N", 2, "T"]}, ["y"], {"pc": I(3, 1), "i0": I(0), "i2": I(2), "ax": I(-1)}, opset=18),
    Case("dynT_pad_runtime_pads_reflect", [node("Shape", ["x"], ["s"]), node("Div", ["s", "s"], ["o"]),
                                           node("Concat", ["o", "o"], ["oo"], axis=0),
                                           node("Mul", ["oo", "pc"], ["p"]), node("Pad", ["x", "p"], ["y"],
                                                                                  mode="reflect")],
         {"x": [2, 3, "T"]}, ["y"], {"pc": I(0, 1, 4, 0, 2, 3)}),
    one("dynT_pad_reflect_time", "Pad", ["N", 2, "T"], ("p", I(0, 0, 4, 0, 0, 3)), op_mode="reflect"),
    one("dynHW_pad_edge", "Pad", ["N", 2, "H", "W"], ("p", I(0, 0, 1, 2, 0, 0, 3, 1)), op_mode="edge"),
    one("dynHW_pad_wrap", "Pad", ["N", 1, "H", "W"], ("p", I(0, 0, 2, 1, 0, 0, 1, 3)), op_mode="wrap", opset=19),
]

# operands computed from the input's shape at run time (a dynamic axis): not parameters, not activations
# (loader.mark_shape_only); s = float(shape(x)) = [N, 2] broadcasts against x [N, 2]
_SHAPE_F = [node("Shape", ["x"], ["shape_i"]), node("Cast", ["shape_i"], ["shape_f"], to=1)]
CASES += [
    Case("runtime-scale-Mul", _SHAPE_F + [node("Mul", ["x", "shape_f"], ["y"])], {"x": ["N", 2]}, ["y"]),
    Case("runtime-scale-Div", _SHAPE_F + [node("Div", ["x", "shape_f"], ["y"])], {"x": ["N", 2]}, ["y"]),
    Case("runtime-shift-Sub", _SHAPE_F + [node("Sub", ["shape_f", "x"], ["y"])], {"x": ["N", 2]}, ["y"]),
]

# Max/Min (onnx_lrp/ops/select.py): of activations winner
# takes all (x against its transpose ties on the diagonal: split evenly), of one activation and constants an
# element-wise activation. Constants and the second operand sit off the 1/4 grid of the distinct inputs: no ties
# that a one-sided difference would see.
_MAXMIN_OFF = (0.125 + 0.25 * np.array([-3, 1, 4])).astype(np.float32)
CASES += [
    Case("maxmin_max_acts_ties", [node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]), node("Max", ["x", "xt"], ["y"])],
         {"x": [2, 3, 3]}, ["y"], mode="pwl", distinct=True),
    Case("maxmin_min_acts_broadcast", [node("Add", ["u", "off"], ["uo"]), node("Min", ["x", "uo"], ["y"])],
         {"x": [2, 3, 4], "u": [2, 1, 4]}, ["y"], {"off": np.array(0.125, np.float32)}, mode="pwl", distinct=True),
    one("maxmin_min_const_activation", "Min", [2, 4, 3], ("c", _MAXMIN_OFF), mode="pwl", distinct=True),
]

# element-wise ops that have no derivative in the engine: the gradient rule is refused, pass moves R unchanged
PASS_ONLY = [
    ("Abs", {}, 17), ("Celu", {}, 17), ("Elu", {}, 17), ("Erf", {}, 17),
    ("Gelu", {}, 20), ("LRN", {"size": 3}, 17), ("Mish", {}, 18),
    ("Neg", {}, 17), ("PRelu", {"slope": np.full((3, 1, 1), 0.25, np.float32)}, 17), ("Selu", {}, 17),
    ("Shrink", {}, 17), ("Sin", {}, 17), ("Softsign", {}, 17), ("ThresholdedRelu", {}, 17),
    ("Sign", {}, 17), ("Floor", {}, 17), ("Ceil", {}, 17), ("Round", {}, 17),
]


def _distinct(rng, shape):
    n = int(np.prod(shape))
    return ((rng.permutation(n) - n // 2) / 4.0).reshape(shape).astype(np.float32)


def _feeds(case: Case, rng):
    feeds = {}
    for name, shape in case.inputs.items():
        shape = [SYMBOLIC.get(d, 2) if isinstance(d, str) else d for d in shape]
        if case.distinct:
            feeds[name] = _distinct(rng, shape)
        else:
            feeds[name] = dyadic(rng, shape, odd=case.mode == "pwl")
    return feeds


def _outputs(model, feeds, case):
    return run(model, feeds)[:len(case.outs)]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_adjoint(case: Case):
    rng = np.random.default_rng(abs(hash(case.id)) % 2**32)
    model = make_model(case.nodes, case.inputs, case.outs, case.inits, opset=case.opset)
    feeds = _feeds(case, rng)
    ys = _outputs(model, feeds, case)
    cs = [dyadic(rng, y.shape) for y in ys]
    batch = feeds["x"].shape[0]
    res, _ = explain_probe(model, case.outs, cs, GRADIENT, feeds if len(feeds) > 1 else feeds["x"], batch,
                           keep_outputs=case.keep_outputs)
    rel = res.relevance if isinstance(res.relevance, dict) else {"x": res.relevance}
    rel = {k: v / batch for k, v in rel.items()}  # one unit of relevance per batch row of the probe
    # the explained scalar is <f(x), c>: the relevance model ran the original forward
    want = sum(float(np.sum(y.astype(np.float64) * c)) for y, c in zip(ys, cs))
    assert res.outputs["probe"].shape == (batch, 1)
    assert_close(res.outputs["probe"][:, 0], want, rtol=1e-5, atol=1e-5)
    assert set(rel) == set(case.inputs)
    if case.mode == "smooth":
        model64 = make_model(case.nodes, case.inputs, case.outs, case.inits, opset=case.opset, dtype=np.float64)
    for name in case.inputs:
        jtc = rel[name].astype(np.float64)
        assert jtc.shape == feeds[name].shape, (jtc.shape, feeds[name].shape)
        for _ in range(2):
            t = dyadic(rng, feeds[name].shape)
            if case.mode == "linear":
                moved = dict(feeds, **{name: feeds[name] + t})
                jt = [a.astype(np.float64) - b for a, b in zip(_outputs(model, moved, case), ys)]
            elif case.mode == "detached":
                jt = case.jvp(feeds, name, t.astype(np.float64))
            elif case.mode == "pwl":
                h = 2.0 ** -6
                moved = dict(feeds, **{name: (feeds[name] + h * t).astype(np.float32)})
                jt = [(a.astype(np.float64) - b) / h for a, b in zip(_outputs(model, moved, case), ys)]
            else:
                h = 1e-4
                f64 = {k: v.astype(np.float64) for k, v in feeds.items()}
                up = _outputs(model64, dict(f64, **{name: f64[name] + h * t}), case)
                down = _outputs(model64, dict(f64, **{name: f64[name] - h * t}), case)
                jt = [(a - b) / (2 * h) for a, b in zip(up, down)]
            lhs = sum(float(np.sum(j * c)) for j, c in zip(jt, cs))
            rhs = float(np.sum(t * jtc))
            scale = sum(float(np.sum(np.abs(j * c))) for j, c in zip(jt, cs)) + float(np.sum(np.abs(t * jtc)))
            tol = (1e-6 if case.mode == "smooth" else 1e-5) * scale + 1e-6
            assert abs(lhs - rhs) <= tol, f"{case.id} input {name}: <J t, c> = {lhs} but <t, J^T c> = {rhs}"


def _pass_only_model(op, params, opset):
    inits = {k: v for k, v in params.items() if isinstance(v, np.ndarray)}
    attrs = {k: v for k, v in params.items() if not isinstance(v, np.ndarray)}
    return make_model([node(op, ["x"] + list(inits), ["y"], **attrs)], {"x": [2, 3, 4, 4]}, ["y"], inits, opset=opset)


@pytest.mark.parametrize("op,params,opset", PASS_ONLY, ids=[p[0] for p in PASS_ONLY])
def test_activation_without_derivative(op, params, opset):
    """Pass moves R_out to the input unchanged; the gradient rule is refused with an error naming the node."""
    rng = np.random.default_rng(7)
    model = _pass_only_model(op, params, opset)
    x = np.abs(dyadic(rng, [2, 3, 4, 4])) + 0.125  # in every op's domain (Log, Sqrt)
    c = dyadic(rng, [2, 3, 4, 4])
    probe = to_bytes(add_probe(model, "y", c, batch=2))
    res = onnx_lrp.Explainer(probe, composite=PASS_ACTS, start="one-hot").explain(x)
    np.testing.assert_array_equal(res.relevance, 2 * c)
    with pytest.raises(onnx_lrp.UnsupportedError) as info:
        onnx_lrp.Explainer(probe, composite=GRADIENT)
    msg = str(info.value)
    assert f"{op}_y" in msg and op in msg and "\n" not in msg


# registered op types the loader never hands to the rewriter
NOT_LOADABLE = {"SimplifiedLayerNormalization": "an onnxruntime contrib op in the default domain: the loader moves it "
                                                "to com.microsoft and onnx_lrp/load/passes/ort_fused.py splits it (RMS norm)"}
# handlers that refuse the gradient rule (their own rules are tested elsewhere)
NO_GRADIENT = {"Einsum": [node("Einsum", ["x", "w"], ["y"], equation="bij,jk->bik")]}


def _recurrent(op, gates):  # its rule (LRP for LSTMs) is tested against a numpy oracle in test_recurrent.py
    def weight(name, *shape):
        return node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.full(shape, 0.1, np.float32)))
    return [weight("rw", 1, gates * 2, 4), weight("rr", 1, gates * 2, 2),
            node(op, ["x", "rw", "rr"], ["y"], hidden_size=2)]


NO_GRADIENT.update({op: _recurrent(op, g) for op, g in (("LSTM", 4), ("GRU", 3), ("RNN", 1))})


@pytest.mark.parametrize("op", sorted(NOT_LOADABLE))
def test_not_loadable(op):
    model = make_model([node(op, ["x", "g"], ["y"])], {"x": [2, 3, 4]}, [("y", np.float32)], {"g": W(4)})
    model.graph.output[0].type.tensor_type.shape.CopyFrom(model.graph.input[0].type.tensor_type.shape)
    assert not [n for n in loader.load(to_bytes(model)).graph if n.op_type == op]


@pytest.mark.parametrize("op", sorted(NO_GRADIENT))
def test_gradient_refused(op):
    model = make_model(NO_GRADIENT[op], {"x": [2, 3, 4]}, ["y"], {"w": W(4, 5)})
    with pytest.raises(onnx_lrp.UnsupportedError) as info:
        onnx_lrp.Explainer(to_bytes(model), composite=GRADIENT)
    assert f"{op}_y" in str(info.value) and "\n" not in str(info.value)


def test_every_registered_op_is_covered():
    covered = set().union(*(c.op_types for c in CASES)) | {p[0] for p in PASS_ONLY} | set(NOT_LOADABLE) | set(
        NO_GRADIENT) | {"Softplus"}  # no float64 Softplus in onnxruntime: its derivative is checked in test_gates
    covered |= {"HardSwish"}  # its gradient on every piece: test_hard_gradients (no float64 HardSwish either)
    missing = sorted(set(onnx_lrp.lrp.ops.REGISTRY) - covered)
    assert not missing, f"ops without an adjoint / pass test: {missing}"
