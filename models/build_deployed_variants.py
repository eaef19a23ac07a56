"""Build the deployed variants of the demo model ``models/digits_cnn.onnx`` (for tests and the regression docs).

Writes into a git-ignored folder (``models/deployed/``, or ``--out DIR``)::

    digits_cnn.qdq.onnx        static int8 quantization, QDQ format (onnxruntime.quantization.quantize_static,
                               calibrated on the first 64 held-out images)
    digits_cnn.dynamic.onnx    dynamic quantization (quantize_dynamic: DynamicQuantizeLinear + ConvInteger /
                               MatMulInteger)
    digits_cnn.fp16.onnx       float16 weights and compute, float32 inputs and outputs (Casts at the boundary;
                               built here with onnx + numpy, onnxconverter-common is not needed)
    digits_cnn.fp16io.onnx     float16 everywhere, inputs and outputs included
    digits_cnn.ort.onnx        onnxruntime's offline optimisation (ORT_ENABLE_EXTENDED: com.microsoft FusedConv,
                               FusedGemm)
    digits_cnn.reexport.onnx   the same model re-serialised with other node names (must pass a regression check)
    digits_cnn.perturbed.onnx  one layer's weights perturbed (the second convolution, +/-30 % noise)

Usage::

    python models/build_deployed_variants.py [--out DIR]

Only onnx, onnxruntime and numpy are needed; every function takes paths so tests can build into a tmp folder.
"""
from __future__ import annotations

import argparse
import copy
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
MODEL = HERE / "digits_cnn.onnx"
HELDOUT = HERE / "digits_heldout.npz"
IR_VERSION = 8  # onnxruntime 1.31 reads IR <= 13


def calibration_images(n: int = 64) -> np.ndarray:
    with np.load(HELDOUT, allow_pickle=False) as z:
        return z["images"][:n].astype(np.float32) / 255.0


def build_qdq(src: Path, dst: Path, images: np.ndarray | None = None, per_channel: bool = False) -> Path:
    """Static quantization in QDQ format (QInt8 weights, QUInt8 activations: onnxruntime's defaults)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    x = calibration_images() if images is None else images
    name = onnx.load(str(src)).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{name: x[i:i + 16]} for i in range(0, len(x), 16)])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel)
    return dst


def build_dynamic(src: Path, dst: Path) -> Path:
    from onnxruntime.quantization import quantize_dynamic

    quantize_dynamic(str(src), str(dst))
    return dst


def to_float16(model: onnx.ModelProto, keep_io_types: bool = True) -> onnx.ModelProto:
    """float32 initializers, Constants and values -> float16; Casts at the inputs/outputs when ``keep_io_types``."""
    m = copy.deepcopy(model)
    g = m.graph
    for init in g.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16), a.t.name))
        if node.op_type == "Cast":
            for a in node.attribute:
                if a.name == "to" and a.i == TensorProto.FLOAT:
                    a.i = TensorProto.FLOAT16
    del g.value_info[:]
    new_nodes_front, new_nodes_back = [], []
    for vi in g.input:
        if vi.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        if keep_io_types:
            inner = vi.name + "_fp16"
            new_nodes_front.append(helper.make_node("Cast", [vi.name], [inner], name=f"cast_in_{vi.name}",
                                                    to=TensorProto.FLOAT16))
            for node in g.node:
                for i, n in enumerate(node.input):
                    if n == vi.name:
                        node.input[i] = inner
        else:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    for vi in g.output:
        if vi.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        if keep_io_types:
            inner = vi.name + "_fp16"
            for node in g.node:
                for i, n in enumerate(node.output):
                    if n == vi.name:
                        node.output[i] = inner
                for i, n in enumerate(node.input):
                    if n == vi.name:
                        node.input[i] = inner
            new_nodes_back.append(helper.make_node("Cast", [inner], [vi.name], name=f"cast_out_{vi.name}",
                                                   to=TensorProto.FLOAT))
        else:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    nodes = new_nodes_front + list(g.node) + new_nodes_back
    del g.node[:]
    g.node.extend(nodes)
    m.ir_version = min(m.ir_version, IR_VERSION) if m.ir_version else IR_VERSION
    onnx.checker.check_model(m)
    return m


def build_fp16(src: Path, dst: Path, keep_io_types: bool = True) -> Path:
    onnx.save(to_float16(onnx.load(str(src)), keep_io_types), str(dst))
    return dst


def build_ort_optimized(src: Path, dst: Path, level: str = "extended") -> Path:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                   "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    so.optimized_model_filepath = str(dst)
    so.log_severity_level = 3
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return dst


def build_reexport(src: Path, dst: Path) -> Path:
    """The same computation, re-serialised with new node names and shuffled initializer order."""
    m = onnx.load(str(src))
    for i, node in enumerate(m.graph.node):
        node.name = f"reexported_{i}_{node.op_type}"
    inits = list(m.graph.initializer)[::-1]
    del m.graph.initializer[:]
    m.graph.initializer.extend(inits)
    m.producer_name = "re-export"
    onnx.save(m, str(dst))
    return dst


def build_perturbed(src: Path, dst: Path, layer: int = 1, scale: float = 0.3, seed: int = 0) -> Path:
    """The ``layer``-th Conv's weights times (1 + scale * N(0, 1)): one layer changed, everything else the same."""
    m = onnx.load(str(src))
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    w_name = convs[layer].input[1]
    rng = np.random.default_rng(seed)
    for init in m.graph.initializer:
        if init.name == w_name:
            w = numpy_helper.to_array(init)
            w = (w * (1 + scale * rng.standard_normal(w.shape))).astype(w.dtype)
            init.CopyFrom(numpy_helper.from_array(w, init.name))
    onnx.save(m, str(dst))
    return dst


def build_all(out: Path, src: Path = MODEL) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ignore = out / ".gitignore"
    if not ignore.exists():  # build outputs never go into git
        ignore.write_text("*\n")
    stem = src.stem
    paths = {
        "qdq": build_qdq(src, out / f"{stem}.qdq.onnx"),
        "dynamic": build_dynamic(src, out / f"{stem}.dynamic.onnx"),
        "fp16": build_fp16(src, out / f"{stem}.fp16.onnx", keep_io_types=True),
        "fp16io": build_fp16(src, out / f"{stem}.fp16io.onnx", keep_io_types=False),
        "ort": build_ort_optimized(src, out / f"{stem}.ort.onnx"),
        "reexport": build_reexport(src, out / f"{stem}.reexport.onnx"),
        "perturbed": build_perturbed(src, out / f"{stem}.perturbed.onnx"),
    }
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "deployed"), help="output folder (default: models/deployed, "
                                                                   "git-ignored)")
    args = ap.parse_args()
    import logging

    logging.getLogger().setLevel(logging.ERROR)  # quantize_static's pre-processing advice
    for kind, path in build_all(Path(args.out)).items():
        print(f"{kind:10s} {path}")


if __name__ == "__main__":
    main()
