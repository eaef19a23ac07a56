"""Models whose weights live in external data files, written directly (no protobuf of the weights is ever built):
a > 2 GiB MLP in seconds, and low-precision twins of one float32 model.

``write_mlp(folder, widths, dtype, files)`` writes ``mlp.onnx`` (MatMul -> Add -> Relu per layer, the last without
Relu) and its weights as raw little-endian data: ``files=1`` one data file, ``files=2`` the first weight in its own
file and the rest in a second one (as optimum's shards). Weights are random normal scaled by 1/sqrt(fan-in), biases
small; ``weights(folder)`` reads them back memory-mapped for the numpy oracle.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

IR_VERSION = 10
_CHUNK = 1 << 24  # elements generated at once (64 MB of float32)
ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}


def to_bfloat16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bfloat16_bits(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def _encode(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return a.astype("<f4")
    if dtype == "float16":
        return a.astype("<f2")
    return to_bfloat16_bits(a)


def _write_tensor(f, rng, shape, scale, dtype, sparse: bool = False) -> tuple[int, int]:
    """Append one random tensor to the open file ``f``; returns (offset, length). Tensors above one chunk repeat
    one random chunk, each time with another random scale per element block; ``sparse``: only the first chunk is
    written, the rest is a hole of the file (zeros on disk for free: a > 2 GiB weight in a second)."""
    offset = f.tell()
    n = int(np.prod(shape))
    base = rng.standard_normal(min(_CHUNK, n), dtype=np.float32) * np.float32(scale)
    done = 0
    while done < n:
        k = min(_CHUNK, n - done)
        if done and sparse:
            f.seek((n - done) * np.dtype(np.float32 if dtype == "float32" else np.float16).itemsize, 1)
            break
        a = base[:k] if done == 0 else base[:k] * rng.uniform(0.5, 1.5, size=(k + 4095) // 4096).astype(
            np.float32).repeat(4096)[:k]
        f.write(_encode(a, dtype).tobytes())
        done += k
    return offset, f.tell() - offset


def _external(name, dims, dtype, location, offset, length) -> TensorProto:
    t = TensorProto(name=name, dims=list(dims), data_type=ONNX_TYPE[dtype])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def write_mlp(folder, widths=(64, 128, 10), dtype: str = "float32", files: int = 1, seed: int = 0,
              batch=None, sparse: bool = False, bias_scale: float = 0.1) -> Path:
    """``mlp.onnx`` in ``folder``: len(widths) - 1 layers, input ``x`` [batch, widths[0]] of ``dtype``; ``sparse``:
    weights above one chunk (2**24 elements) are random in their first chunk only, zero (a file hole) after it;
    ``bias_scale``: the biases' standard deviation (0: a deep MLP whose epsilon relevance is conserved)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    handles = {}
    try:
        for i, (m, n) in enumerate(zip(widths[:-1], widths[1:])):
            location = "mlp.data" if files == 1 or i > 0 else "mlp.w0.data"
            f = handles.get(location) or handles.setdefault(location, open(folder / location, "wb"))
            off, ln = _write_tensor(f, rng, (m, n), 1.0 / np.sqrt(m), dtype, sparse)
            inits.append(_external(f"w{i}", (m, n), dtype, location, off, ln))
            off, ln = _write_tensor(f, rng, (n,), bias_scale, dtype)
            inits.append(_external(f"b{i}", (n,), dtype, location, off, ln))
            x = "x" if i == 0 else f"h{i - 1}"
            last = i == len(widths) - 2
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"mm{i}"))
            nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], ["y" if last else f"z{i}"], name=f"add{i}"))
            if not last:
                nodes.append(helper.make_node("Relu", [f"z{i}"], [f"h{i}"], name=f"relu{i}"))
    finally:
        for f in handles.values():
            f.truncate()  # a trailing hole becomes part of the file
            f.close()
    t = ONNX_TYPE[dtype]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", t, [batch or "batch", widths[0]])],
                              [helper.make_tensor_value_info("y", t, [batch or "batch", widths[-1]])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = IR_VERSION
    path = folder / "mlp.onnx"
    path.write_bytes(model.SerializeToString())  # only the graph: the weights are already on disk
    return path


def weights(path, as_float32: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
    """(W, b) per layer, memory-mapped from the data files of ``write_mlp`` (float32 views unless not asked)."""
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    arrays = {}
    for t in model.graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        np_type = {TensorProto.FLOAT: "<f4", TensorProto.FLOAT16: "<f2", TensorProto.BFLOAT16: "<u2"}[t.data_type]
        a = np.memmap(path.parent / info["location"], dtype=np_type, mode="r", offset=int(info["offset"]),
                      shape=tuple(t.dims))
        if as_float32:
            a = from_bfloat16_bits(a) if t.data_type == TensorProto.BFLOAT16 else a
        arrays[t.name] = a
    return [(arrays[f"w{i}"], arrays[f"b{i}"]) for i in range(len(arrays) // 2)]


def epsilon_oracle(layers, x: np.ndarray, target: int, eps: float = 1e-6, dtype=np.float64) -> np.ndarray:
    """LRP-epsilon of the MLP (numpy, in ``dtype``), relevance of ``x`` for output ``target``, starting from the
    logit. float32 reads memory-mapped float32 weights in place (a float64 copy of a 2 GB weight would be 4 GB)."""
    acts = [np.asarray(x, dtype)]
    zs = []
    for i, (w, b) in enumerate(layers):
        z = acts[-1] @ np.asarray(w, dtype) + np.asarray(b, dtype)
        zs.append(z)
        acts.append(np.maximum(z, 0) if i < len(layers) - 1 else z)
    r = np.zeros_like(zs[-1])
    r[:, target] = zs[-1][:, target]
    for i in range(len(layers) - 1, -1, -1):
        z = zs[i]
        s = r / (z + dtype(eps) * np.where(z >= 0, 1, -1).astype(dtype))
        r = acts[i] * (s @ np.asarray(layers[i][0], dtype).T)
    return r
