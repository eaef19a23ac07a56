"""The Emitter: appends relevance nodes to an onnx_ir graph under scoped names (``lrp/<node>/<tag>``)."""
from __future__ import annotations

import contextlib
from typing import Sequence

import numpy as np
import onnx_ir as ir

from .graph import static_dims, unique_name


class Emitter:
    """Builds nodes and initializers; every name is scoped to the node being rewritten."""

    def __init__(self, graph: ir.Graph, opset: int, dtype: ir.DataType = ir.DataType.FLOAT):
        self.graph = graph
        self.opset = opset
        self.dtype = dtype
        self.np_dtype = dtype.numpy()
        self._prefix = "lrp"
        self._names: set[str] = {v.name for v in graph.initializers.values()} | {
            o.name for n in graph for o in n.outputs if o.name} | {v.name for v in graph.inputs}
        self._scalars: dict = {}
        self._consts: dict = {}
        self.nodes_emitted = 0

    @contextlib.contextmanager
    def scope(self, name: str):
        old = self._prefix
        self._prefix = f"lrp/{name.lstrip('/')}"
        try:
            yield
        finally:
            self._prefix = old

    def name(self, tag: str) -> str:
        return unique_name(f"{self._prefix}/{tag}", self._names)

    # ---------------------------------------------------------------- nodes
    def op(self, op_type: str, *inputs: ir.Value | None, tag: str | None = None, **attrs) -> ir.Value:
        return self.op_multi(op_type, inputs, 1, tag=tag, **attrs)[0]

    def op_multi(self, op_type: str, inputs: Sequence[ir.Value | None], num_outputs: int, tag: str | None = None,
                 **attrs) -> list[ir.Value]:
        tag = tag or op_type.lower()
        outputs = [ir.Value(name=self.name(tag if num_outputs == 1 else f"{tag}{i}")) for i in range(num_outputs)]
        attributes = {k: v for k, v in attrs.items() if v is not None}
        node = ir.node(op_type, list(inputs), attributes, outputs=outputs, name=self.name(f"{tag}_node"))
        self.graph.append(node)
        self.nodes_emitted += 1
        return outputs

    # ------------------------------------------------------------ constants
    def const(self, array, tag: str = "const", dtype=None, key=None) -> ir.Value:
        """An initializer; ``key`` deduplicates constants asked for twice."""
        if key is not None and key in self._consts:
            return self._consts[key]
        arr = np.asarray(array)
        if dtype is not None:
            arr = arr.astype(dtype)
        elif arr.dtype.kind == "f":
            arr = arr.astype(self.np_dtype)
        arr = np.ascontiguousarray(arr)
        name = self.name(tag)
        v = ir.Value(name=name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                     const_value=ir.tensor(arr, name=name))
        self.graph.register_initializer(v)
        if key is not None:
            self._consts[key] = v
        return v

    def scalar(self, value, dtype=None) -> ir.Value:
        dtype = np.dtype(dtype or self.np_dtype)
        key = (float(value) if dtype.kind == "f" else int(value), dtype.str)
        if key not in self._scalars:
            old = self._prefix
            self._prefix = "lrp/const"
            self._scalars[key] = self.const(np.array(value, dtype=dtype), tag=f"{dtype.name}_{value}")
            self._prefix = old
        return self._scalars[key]

    def ints(self, values, tag="ints") -> ir.Value:
        values = [int(v) for v in values]
        key = ("ints", tuple(values))
        if key not in self._consts:
            old = self._prefix
            self._prefix = "lrp/const"
            self._consts[key] = self.const(np.array(values, dtype=np.int64), tag=tag)
            self._prefix = old
        return self._consts[key]

    # -------------------------------------------------------------- helpers
    def add(self, a, b, tag="add"):
        return self.op("Add", a, b, tag=tag)

    def sub(self, a, b, tag="sub"):
        return self.op("Sub", a, b, tag=tag)

    def mul(self, a, b, tag="mul"):
        return self.op("Mul", a, b, tag=tag)

    def div(self, a, b, tag="div"):
        return self.op("Div", a, b, tag=tag)

    def reduce_mean(self, v, axes, tag: str):
        """ReduceMean keeping dims (axes as an input from opset 18, as an attribute before)."""
        if self.opset >= 18:
            return self.op("ReduceMean", v, self.ints(axes), keepdims=1, tag=tag)
        return self.op("ReduceMean", v, axes=list(axes), keepdims=1, tag=tag)

    def inv_std(self, d, axes, eps: float):
        """1 / sqrt(mean(d * d over ``axes``) + eps) of centred (or, for RMS norms, raw) values ``d``: a
        normalisation's scale."""
        var = self.reduce_mean(self.mul(d, d, tag="sq"), axes, "var")
        return self.op("Reciprocal", self.op("Sqrt", self.add(var, self.scalar(eps), tag="var_eps"), tag="std"),
                       tag="inv_std")

    def neg(self, a, tag="neg"):
        return self.op("Neg", a, tag=tag)

    def scale(self, a, c: float, tag="scaled"):
        if c == 1.0:
            return a
        if c == -1.0:
            return self.neg(a, tag=tag)
        return self.mul(a, self.scalar(c), tag=tag)

    def sum(self, values: Sequence[ir.Value], tag="sum") -> ir.Value:
        values = [v for v in values if v is not None]
        if not values:
            raise ValueError("nothing to sum")
        if len(values) == 1:
            return values[0]
        if len(values) == 2:
            return self.add(values[0], values[1], tag=tag)
        return self.op("Sum", *values, tag=tag)

    def positive(self, x, tag="x+"):
        return self.op("Relu", x, tag=tag)

    def negative(self, x, tag="x-"):
        """min(x, 0) as a Clip (onnxruntime's Min with a scalar is about 3x slower)."""
        big = float(np.finfo(self.np_dtype).max)
        return self.op("Clip", x, self.scalar(-big), self.scalar(0.0), tag=tag)

    def positive_part(self, x, tag="x+"):
        """max(x, 0) as a Clip: read in the layout x has (a Relu would make onnxruntime compute it in its blocked
        NCHWc layout and reorder it back, see ``relu_plus``)."""
        return self.op("Clip", x, self.scalar(0.0), self.scalar(float(np.finfo(self.np_dtype).max)), tag=tag)

    def relu_plus(self, z, eps: float, tag="stab"):
        """relu(z) + eps, written as max(z + eps, eps): equal for every z (rounding is monotonic, so z + eps >= eps
        exactly when z >= 0). Both ops read z as the forward left it; a Relu here would make onnxruntime compute it
        in its blocked NCHWc layout and reorder the result back, about three times the cost."""
        shifted = self.add(z, self.scalar(eps), tag=f"{tag}_shift")
        return self.op("Clip", shifted, self.scalar(eps), tag=tag)

    def stabilize(self, z, eps: float, tag="stab"):
        """zennit: z + eps * (sign(z) + (z == 0)), i.e. z + (eps if z >= 0 else -eps).

        Written as z + clip(z * 2eps/FLT_MIN + eps, -eps, eps), which onnxruntime runs faster than a Where; it is
        the same for every normal float and for 0 (only negative denormals, |z| < 1.2e-38, would get +eps)."""
        if eps == 0:
            return z
        gain = 2.0 * eps / float(np.finfo(np.float32).tiny)
        if self.np_dtype == np.float32 and gain < 1e38:
            scaled = self.op("Mul", z, self.scalar(gain), tag=f"{tag}_gain")
            shifted = self.op("Add", scaled, self.scalar(eps), tag=f"{tag}_shift")
            shift = self.op("Clip", shifted, self.scalar(-eps), self.scalar(eps), tag=f"{tag}_eps")
            return self.add(z, shift, tag=tag)
        ge = self.op("GreaterOrEqual", z, self.scalar(0.0), tag=f"{tag}_sign")
        shift = self.op("Where", ge, self.scalar(eps), self.scalar(-eps), tag=f"{tag}_eps")
        return self.add(z, shift, tag=tag)

    def shape_of(self, x, tag="shape"):
        return self.op("Shape", x, tag=tag)

    def reshape_like(self, r, like, tag="reshaped"):
        return self.op("Reshape", r, self.shape_of(like, tag=f"{tag}_shape"), tag=tag)

    def reduce_sum(self, x, axes: Sequence[int], keepdims: bool = True, tag="reduced"):
        return self.op("ReduceSum", x, self.ints(axes), keepdims=int(keepdims), tag=tag)

    def zeros_like(self, x, tag="zeros"):
        return self.op("ConstantOfShape", self.shape_of(x, tag=f"{tag}_shape"),
                       value=ir.tensor(np.zeros(1, dtype=self.np_dtype)), tag=tag)

    def unbroadcast(self, s: ir.Value, s_dims: list | None, x: ir.Value, tag="unbroadcast") -> ir.Value:
        """Sum ``s`` over the axes along which ``x`` was broadcast to ``s``'s shape (the transpose of broadcasting)."""
        x_dims = static_dims(x)
        if x_dims is None or s_dims is None:
            raise ValueError("broadcast transpose needs known ranks")
        lead = len(s_dims) - len(x_dims)
        axes = list(range(lead)) + [lead + i for i, d in enumerate(x_dims)
                                    if d == 1 and s_dims[lead + i] != 1]
        if not axes:
            return s
        out = self.reduce_sum(s, axes, keepdims=True, tag=tag)
        if lead:
            out = self.op("Reshape", out, self.ints([d if d is not None else 0 for d in x_dims]) if all(
                d is not None for d in x_dims) else self.shape_of(x, tag=f"{tag}_shape"), tag=f"{tag}_r")
        return out
