"""Where a relevance model loses digits: its float32 run by onnxruntime against the same graph run in float64.

    onnx-lrp rewrite MODEL.onnx -o MODEL.lrp.onnx
    python scripts/replay_float64.py MODEL.lrp.onnx x.npy [--target 3] [--one-hot] [--worst 12]

The relevance model (every float intermediate added as an output) runs in onnxruntime in float32 at three
optimisation levels (none; extended, what ``precise=True`` uses; all, the default with its blocked NCHWc layouts), and
the same graph, cast to float64, runs in onnx's reference interpreter (its Conv, ConvTranspose and MaxPool through
torch in float64 when torch imports: onnx.reference's own are slow on large models). It prints the relative L2
distance of each relevance output per level and the intermediates furthest from float64. A distance of the order of
float32's own rounding at the input (compare zennit float32 vs float64 on the same network) means no digits are lost
in the graph; one step that stands out names the node that loses them.
"""
from __future__ import annotations

import argparse
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

LEVELS = {"none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    norm = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / norm) if norm > 0 else (0.0 if not np.any(a) else float("inf"))


def with_all_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list]:
    """The model with every float32 intermediate as an output, and their names (in node order)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    typed = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in list(typed.graph.value_info) + list(typed.graph.output)}
    have = {o.name for o in model.graph.output}
    names = [o for n in model.graph.node for o in n.output
             if o and o not in have and types.get(o) == TensorProto.FLOAT]
    model.graph.output.extend(onnx.helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in names)
    return model, names


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph in float64: float32 initializers, Constant tensors, Cast targets and value types."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
            if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
    for v in list(g.input) + list(g.output):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    del g.value_info[:]
    return model


class OneHot(OpRun):
    """OneHot with its depth given as a one-element tensor (onnx.reference takes a scalar only)."""

    op_domain = ""

    def _run(self, indices, depth, values, axis=-1):
        depth = int(np.asarray(depth).reshape(-1)[0])
        idx = np.asarray(indices, np.int64)
        idx = np.where(idx < 0, idx + depth, idx)
        axis = axis if axis >= 0 else idx.ndim + 1 + axis
        hot = np.moveaxis(idx[..., None] == np.arange(depth), -1, axis)
        return (np.where(hot, values[1], values[0]).astype(values.dtype),)


def reference_ops() -> list:
    """Ops the float64 interpreter runs otherwise than onnx.reference: OneHot; Conv, ConvTranspose (no
    output_shape) and MaxPool (2-D) in float64 through torch when it imports."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return [OneHot]

    def t(a):
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a))

    def pad_arg(pads, nd):  # ONNX [b1, b2, ..., e1, e2, ...] -> F.pad's last-axis-first pairs
        return [p for i in reversed(range(nd)) for p in (pads[i], pads[nd + i])]

    class Conv(OpRun):
        op_domain = ""

        def _run(self, X, W, B=None, auto_pad=None, dilations=None, group=None, kernel_shape=None, pads=None,
                 strides=None):
            nd = X.ndim - 2
            x = F.pad(t(X), pad_arg(pads or [0] * 2 * nd, nd))
            conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
            return (conv(x, t(W), t(B), stride=strides or 1, dilation=dilations or 1, groups=group or 1).numpy(),)

    class ConvTranspose(OpRun):
        op_domain = ""

        def _run(self, X, W, B=None, auto_pad=None, dilations=None, group=None, kernel_shape=None,
                 output_padding=None, output_shape=None, pads=None, strides=None):
            if output_shape is not None:
                raise NotImplementedError("ConvTranspose with output_shape")
            nd = X.ndim - 2
            pads = pads or [0] * 2 * nd
            conv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nd - 1]
            y = conv(t(X), t(W), t(B), stride=strides or 1, dilation=dilations or 1, groups=group or 1)
            opad = output_padding or [0] * nd
            y = F.pad(y, [p for i in reversed(range(nd)) for p in (0, opad[i])])  # output_padding at the end
            crop = tuple(slice(pads[i], y.shape[2 + i] - pads[nd + i]) for i in range(nd))
            return (y[(slice(None), slice(None)) + crop].contiguous().numpy(),)

    class MaxPool(OpRun):
        op_domain = ""

        def _run(self, X, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None, pads=None,
                 storage_order=None, strides=None):
            if X.ndim != 4 or (pads and pads[:2] != pads[2:]):
                raise NotImplementedError("MaxPool other than 2-D with symmetric pads")
            y, idx = F.max_pool2d(t(X), kernel_shape, strides or 1, (pads or [0, 0])[:2], dilations or 1,
                                  bool(ceil_mode), return_indices=True)
            n, c, h, w = X.shape
            flat = idx + torch.arange(n * c).reshape(n, c, 1, 1) * h * w  # ONNX indices run over N, C, H, W
            return (y.numpy(), flat.numpy().astype(np.int64))

    return [OneHot, Conv, ConvTranspose, MaxPool]


def feeds_of(model: onnx.ModelProto, x: np.ndarray, target, one_hot: bool) -> dict:
    """The relevance model's inputs: the model's (one float input: ``x``), the target and the start's kind."""
    feeds = {}
    for i in model.graph.input:
        t = i.type.tensor_type
        if i.name == "lrp/target":
            feeds[i.name] = np.broadcast_to(np.asarray(target, np.int64), (x.shape[0],)).copy()
        elif i.name == "lrp/one_hot":
            feeds[i.name] = np.array(one_hot, dtype=onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
        elif i.name == "lrp/position":
            feeds[i.name] = np.full((x.shape[0],), -1, np.int64)
        else:
            feeds[i.name] = x.astype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
    return feeds


def run_ort(model: onnx.ModelProto, feeds: dict, level) -> dict:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a relevance model (onnx-lrp rewrite's output)")
    ap.add_argument("x", help=".npy input of the model (with its batch axis)")
    ap.add_argument("--target", type=int, default=None, help="the class explained (default: onnxruntime's arg-max)")
    ap.add_argument("--one-hot", action="store_true", help="start from 1 instead of the logit (zennit's convention)")
    ap.add_argument("--worst", type=int, default=12, help="how many intermediates furthest from float64 to list")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    model = onnx.load(args.model)
    x = np.load(args.x)
    if args.target is None:
        probe = run_ort(model, feeds_of(model, x, 0, args.one_hot), LEVELS["all"])
        args.target = probe["lrp/target_used"]
    feeds = feeds_of(model, x, args.target, args.one_hot)
    wide, names = with_all_outputs(model)
    feeds64 = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in feeds.items()}
    ref = ReferenceEvaluator(to_float64(wide), new_ops=reference_ops()).run(None, feeds64, intermediate=True)
    relevance = [o.name for o in model.graph.output if o.name.startswith("lrp/relevance/")]
    worst = []
    for label, level in LEVELS.items():
        got = run_ort(wide, feeds, level)
        print(label, "  ".join(f"{r}: {rel_l2(got[r], ref[r]):.3g}" for r in relevance))
        if label == "all":
            worst = sorted(((rel_l2(got[n], ref[n]), n) for n in names if n in got), reverse=True)[:args.worst]
    print("furthest from float64 (optimisation level all):")
    for d, n in worst:
        print(f"  {d:10.3g}  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
