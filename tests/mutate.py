"""Small valid seed models and random mutations of them, for the property-based test (test_fuzz.py) and the
offline campaign (scripts/fuzz_models.py).

A mutation is one edit of a ModelProto (or of its bytes): a flipped byte, a dropped or retyped attribute, an
attribute set to an odd value (0, -1, 2**30, NaN), a changed input dimension, rank or data type, a deleted node
input, a NaN/Inf constant, an initializer whose shape no longer fits its data, an op moved to an unknown domain.
``outcome`` runs ``Explainer(...).explain(...)`` on the result and classifies what happened.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from util import make_model, node

_R = np.random.default_rng(1234)


def _w(*shape):
    return (0.5 * _R.standard_normal(shape)).astype(np.float32)


def seed_models() -> dict[str, onnx.ModelProto]:
    """Four small valid models covering the common op kinds."""
    mlp = make_model([node("Gemm", ["x", "w1", "b1"], "h", transB=1), node("Relu", ["h"], "a"),
                      node("Gemm", ["a", "w2", "b2"], "y", transB=1, alpha=1.0, beta=1.0),
                      node("Softmax", ["y"], "p", axis=1)],
                     {"x": ["N", 5]}, ["p"], {"w1": _w(6, 5), "b1": _w(6), "w2": _w(4, 6), "b2": _w(4)})
    cnn = make_model([node("Conv", ["x", "w", "b"], "c", pads=[1, 1, 1, 1], strides=[1, 1], group=1),
                      node("BatchNormalization", ["c", "s", "bb", "mu", "var"], "n", epsilon=1e-5),
                      node("Relu", ["n"], "r"),
                      node("MaxPool", ["r"], "m", kernel_shape=[2, 2], strides=[2, 2]),
                      node("Flatten", ["m"], "f", axis=1),
                      node("Gemm", ["f", "fw", "fb"], "y", transB=1)],
                     {"x": ["N", 2, 4, 4]}, ["y"],
                     {"w": _w(3, 2, 3, 3), "b": _w(3), "s": np.abs(_w(3)) + 0.5, "bb": _w(3), "mu": _w(3),
                      "var": np.abs(_w(3)) + 0.5, "fw": _w(4, 12), "fb": _w(4)})
    res = make_model([node("Conv", ["x", "w", "b"], "c", pads=[1, 1, 1, 1]), node("Relu", ["c"], "r"),
                      node("Conv", ["r", "w2", "b2"], "c2", pads=[1, 1, 1, 1]), node("Add", ["c2", "r"], "s"),
                      node("GlobalAveragePool", ["s"], "g"), node("Reshape", ["g", "shape"], "f"),
                      node("MatMul", ["f", "fw"], "mm"), node("Add", ["mm", "fb"], "y")],
                     {"x": ["N", 2, 4, 4]}, ["y"],
                     {"w": _w(3, 2, 3, 3), "b": _w(3), "w2": _w(3, 3, 3, 3), "b2": _w(3),
                      "shape": np.array([-1, 3], dtype=np.int64), "fw": _w(3, 4), "fb": _w(4)})
    seq = make_model([node("MatMul", ["x", "wq"], "q"), node("LayerNormalization", ["q", "g", "be"], "ln", axis=-1),
                      node("Concat", ["ln", "x"], "cat", axis=-1), node("AveragePool", ["cat"], "ap",
                                                                         kernel_shape=[2], strides=[1]),
                      node("Mul", ["ap", "ap"], "sq"), node("Tanh", ["sq"], "t"),
                      node("ReduceMean", ["t", "axes"], "y", keepdims=0)],
                     {"x": ["N", 3, 4]}, ["y"],
                     {"wq": _w(4, 4), "g": np.abs(_w(4)) + 0.5, "be": _w(4), "axes": np.array([1], dtype=np.int64)},
                     opset=18)
    half = make_model([node("Gemm", ["x", "w1", "b1"], "h", transB=1), node("Relu", ["h"], "a"),
                       node("Gemm", ["a", "w2", "b2"], "y", transB=1)],
                      {"x": ["N", 5]}, ["y"], {k: v.astype(np.float16) for k, v in
                                               {"w1": _w(6, 5), "b1": _w(6), "w2": _w(4, 6), "b2": _w(4)}.items()},
                      dtype=np.float16)
    qdq = make_model([node("QuantizeLinear", ["x", "xs", "xz"], "xq"), node("DequantizeLinear", ["xq", "xs", "xz"], "xd"),
                      node("DequantizeLinear", ["wq", "ws", "wz"], "w", axis=0),
                      node("Conv", ["xd", "w", "b"], "c", pads=[1, 1, 1, 1]), node("Relu", ["c"], "r"),
                      node("GlobalAveragePool", ["r"], "g"), node("Flatten", ["g"], "y")],
                     {"x": ["N", 2, 4, 4]}, ["y"],
                     {"xs": np.float32(0.05), "xz": np.int8(0), "wq": _R.integers(-100, 100, (3, 2, 3, 3)).astype(np.int8),
                      "ws": np.full(3, 0.01, np.float32), "wz": np.zeros(3, np.int8), "b": _w(3)})
    return {"mlp": mlp, "cnn": cnn, "res": res, "seq": seq, "half": half, "qdq": qdq}


ODD_INTS = [0, -1, 1, 2, 3, 7, 2 ** 30, -(2 ** 31)]
ODD_FLOATS = [0.0, -1.0, 1e30, float("nan"), float("inf"), -float("inf")]
DTYPES = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.INT32,
          TensorProto.BOOL, TensorProto.UINT8, TensorProto.STRING, TensorProto.BFLOAT16]
KINDS = ["flip", "drop_attr", "retype_attr", "odd_attr", "input_dim", "input_rank", "input_dtype", "del_input",
         "nan_init", "init_shape", "init_dims", "init_dtype", "unknown_op", "del_node", "swap_inputs", "output_drop"]


def mutate(model: onnx.ModelProto, rnd, kind: str | None = None) -> bytes:
    """One random mutation of ``model``; ``rnd`` is a ``random.Random`` (or a hypothesis ``randoms()``)."""
    kind = kind or rnd.choice(KINDS)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    if kind == "flip":
        data = bytearray(m.SerializeToString())
        for _ in range(rnd.randint(1, 4)):
            i = rnd.randrange(len(data))
            data[i] = rnd.randrange(256)
        return bytes(data)
    nd = g.node[rnd.randrange(len(g.node))]
    if kind in ("drop_attr", "retype_attr", "odd_attr") and len(nd.attribute):
        a = nd.attribute[rnd.randrange(len(nd.attribute))]
        if kind == "drop_attr":
            nd.attribute.remove(a)
        elif kind == "retype_attr":
            name = a.name
            nd.attribute.remove(a)
            value = rnd.choice([1.5, 3, [1, 2], [0.5], "abc", []])
            if value == []:
                nd.attribute.append(helper.make_attribute(name, [], attr_type=onnx.AttributeProto.INTS))
            else:
                nd.attribute.append(helper.make_attribute(name, value))
        else:
            if a.type == onnx.AttributeProto.INT:
                a.i = rnd.choice(ODD_INTS)
            elif a.type == onnx.AttributeProto.FLOAT:
                a.f = rnd.choice(ODD_FLOATS)
            elif a.type == onnx.AttributeProto.INTS and len(a.ints):
                a.ints[rnd.randrange(len(a.ints))] = rnd.choice(ODD_INTS)
            else:
                nd.attribute.append(helper.make_attribute("odd_" + a.name, 1))
    elif kind in ("drop_attr", "retype_attr", "odd_attr"):  # no attribute: add a bogus one
        nd.attribute.append(helper.make_attribute(rnd.choice(["axis", "group", "alpha"]), rnd.choice(ODD_INTS)))
    elif kind == "input_dim":
        shape = g.input[0].type.tensor_type.shape
        d = shape.dim[rnd.randrange(len(shape.dim))]
        d.dim_value = rnd.choice([0, 1, 2, 5, 2 ** 30])
    elif kind == "input_rank":
        shape = g.input[0].type.tensor_type.shape
        if rnd.random() < 0.5 and len(shape.dim) > 1:
            del shape.dim[-1]
        else:
            shape.dim.add().dim_value = rnd.choice([1, 3])
    elif kind == "input_dtype":
        g.input[0].type.tensor_type.elem_type = rnd.choice(DTYPES)
    elif kind == "del_input" and len(nd.input):
        nd.input[rnd.randrange(len(nd.input))] = ""
    elif kind == "init_dims" and len(g.initializer):  # dims that no longer fit the data
        init = g.initializer[rnd.randrange(len(g.initializer))]
        if len(init.dims):
            init.dims[rnd.randrange(len(init.dims))] = rnd.choice([0, 1, 2, 5, 2 ** 30])
        else:
            init.dims.append(rnd.choice([0, 2]))
    elif kind in ("nan_init", "init_shape", "init_dtype") and len(g.initializer):
        init = g.initializer[rnd.randrange(len(g.initializer))]
        arr = numpy_helper.to_array(init)
        if kind == "nan_init" and arr.dtype.kind == "f":
            arr = arr.copy()
            arr.reshape(-1)[rnd.randrange(arr.size)] = rnd.choice([math.nan, math.inf, -math.inf, 1e38])
        elif kind == "init_shape":
            flat = arr.reshape(-1)
            arr = flat[: max(0, flat.size - rnd.randint(1, 2))] if rnd.random() < 0.5 else \
                np.concatenate([flat, flat[:1]])
            if rnd.random() < 0.5 and arr.size:
                arr = arr.reshape(1, -1)
        elif kind == "init_dtype":
            arr = arr.astype(rnd.choice([np.float64, np.int64, np.float16, np.int32]))
        init.CopyFrom(numpy_helper.from_array(arr, init.name))
    elif kind == "unknown_op":
        nd.domain = rnd.choice(["com.example", "com.microsoft", ""])
        nd.op_type = rnd.choice(["Foo", "Inverse", nd.op_type])
        if nd.domain and not any(o.domain == nd.domain for o in m.opset_import):
            m.opset_import.append(helper.make_opsetid(nd.domain, 1))
    elif kind == "del_node" and len(g.node) > 1:
        g.node.remove(nd)
    elif kind == "swap_inputs" and len(nd.input) > 1:
        i, j = rnd.sample(range(len(nd.input)), 2)
        nd.input[i], nd.input[j] = nd.input[j], nd.input[i]
    elif kind == "output_drop":
        g.output[0].type.tensor_type.elem_type = rnd.choice(DTYPES)
    return m.SerializeToString()


def sample_input(model: onnx.ModelProto, rnd) -> np.ndarray:
    """An input for the ORIGINAL model (batch 1 to 3); sometimes an empty batch or a wrong rank."""
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in model.graph.input[0].type.tensor_type.shape.dim]
    batch = rnd.choice([1, 2, 3, 0]) if rnd.random() < 0.1 else rnd.choice([1, 2, 3])
    shape = [batch] + [d or 1 for d in dims[1:]]
    if rnd.random() < 0.05:
        shape = shape[:-1]
    x = np.random.default_rng(rnd.randrange(2 ** 31)).standard_normal(shape).astype(np.float32)
    return x


COMPOSITES = [("epsilon", {}), ("epsilon-plus-flat", {}), ("epsilon-gamma-box", {"low": -3.0, "high": 3.0}),
              ("attnlrp", {}), ("epsilon-alpha2-beta1", {})]


def outcome(data: bytes, x: np.ndarray, composite: str, params: dict) -> tuple[str, str]:
    """('ok' | 'refused' | 'nonfinite' | 'wrong_shape' | 'crash', detail)."""
    import onnx_lrp
    try:
        res = onnx_lrp.Explainer(data, composite=composite, **params).explain(x)
    except onnx_lrp.LrpError as exc:
        msg = str(exc)
        if "internal error" in msg:
            return "crash", msg.splitlines()[0][:300]
        return "refused", msg.splitlines()[0][:200]
    except Exception as exc:  # noqa: BLE001 - the property under test
        import traceback
        tb = traceback.extract_tb(exc.__traceback__)
        where = f"{tb[-1].filename.split('/')[-1]}:{tb[-1].lineno}" if tb else "?"
        return "crash", f"{type(exc).__name__} at {where}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    rels = res.relevance.values() if isinstance(res.relevance, dict) else [res.relevance]
    for r in rels:
        if not np.all(np.isfinite(r)):
            return "nonfinite", ""
    if not isinstance(res.relevance, dict) and res.relevance.shape != x.shape and \
            res.relevance.shape[1:] != x.shape:
        return "wrong_shape", f"{res.relevance.shape} for {x.shape}"
    return "ok", ""
