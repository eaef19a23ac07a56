"""Graph editing for the loading passes: one :class:`Builder` (nodes and constants before an anchor node), the
value surgery every pass needs (:func:`take_over`, :func:`drop`, :func:`bypass`, :func:`only_consumer`, ...) and
the pass interface (:class:`LoadPass`, an ``onnx_ir`` in-place pass whose notes and refusals go to the model's
:class:`Report`).

A pass imports this module and the ground floor (:mod:`onnx_lrp.core`: graph facts, errors, meta keys, the numbers of
quantization); never the pipeline (:mod:`onnx_lrp.load`), another pass, or a later stage. The rewriter's emitter is
:class:`onnx_lrp.core.emitter.Emitter`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from ..core.errors import ModelError, UnsupportedError
from ..core.graph import const, unique_name
from ..core.quantization import dequantize, qparams_misfit


MS = "com.microsoft"


# ---------------------------------------------------------------------------------------------- the pass interface
@dataclass
class Report:
    """What the deployed-form passes did (``notes``, one line each) and what they refused (``refused``: node, why);
    the load pipeline hands one to every pass it runs."""

    notes: list[str] = field(default_factory=list)
    refused: list[tuple[ir.Node, str]] = field(default_factory=list)

    def note(self, count: int, text: str) -> None:
        """``text`` (formatted with ``{n}`` = count) when count is not zero."""
        if count:
            self.notes.append(text.format(n=count))

    def refuse(self, refused: list) -> None:
        self.refused += refused

    def raise_refusals(self, model: ir.Model) -> None:
        """One error listing every refused node, if any."""
        if self.refused:
            raise UnsupportedError([dict(name=n.name, op_type=n.op_type, domain=n.domain,
                                         opset=model.opset_imports.get(n.domain or "", "?"), reason=why)
                                    for n, why in self.refused],
                                   "These deployed forms are not supported; see docs/ci-regression.md "
                                   "(Deployed models) for the supported ones.")


class LoadPass(ir.passes.InPlacePass):
    """A loading pass: ``apply(model, report)`` rewrites the model in place and returns how many places it changed;
    notes and refusals go to ``report``. Run alone as an onnx_ir pass, ``pass_(model)`` (``PassResult.modified``:
    something changed), it raises its own refusals."""

    def apply(self, model: ir.Model, report: Report) -> int:
        raise NotImplementedError

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        report = Report()
        changed = bool(self.apply(model, report))
        report.raise_refusals(model)
        return ir.passes.PassResult(model, changed)


# ---------------------------------------------------------------------------------------------- the builder
class Builder:
    """Adds standard nodes before an anchor node (names ``<anchor>/split/<tag>_<k>``) and constants as
    initializers; ``nodes`` lists what it added (to undo a refused rewrite)."""

    def __init__(self, graph: ir.Graph, anchor: ir.Node):
        self.graph, self.anchor = graph, anchor
        self.base = anchor.name or anchor.op_type
        self.k = 0
        self.nodes: list[ir.Node] = []

    def _name(self, tag: str) -> str:
        self.k += 1
        return f"{self.base}/split/{tag}_{self.k}"

    def const(self, arr, tag: str = "c") -> ir.Value:
        name = self._name(tag)
        if isinstance(arr, ir.PackedTensor):  # 4-bit values packed two to a byte (load.passes.block_quant)
            arr.name = name
            v = ir.Value(name=name, shape=ir.Shape(list(arr.shape)), type=ir.TensorType(arr.dtype), const_value=arr)
            self.graph.register_initializer(v)
            return v
        arr = np.asarray(arr)
        v = ir.Value(name=name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                     const_value=ir.tensor(arr, name=name))
        self.graph.register_initializer(v)
        return v

    def op(self, op_type: str, inputs, like: ir.Value | None = None, tag: str | None = None, num_outputs: int = 1,
           **attrs):
        outs = [ir.Value(name=self._name((tag or op_type.lower()) + (str(i) if num_outputs > 1 else "")))
                for i in range(num_outputs)]
        if like is not None:
            for o in outs:
                o.type, o.shape = like.type, like.shape
        node = ir.node(op_type, list(inputs), attributes=attrs or None, outputs=outs, name=self._name(op_type))
        self.graph.insert_before(self.anchor, node)
        self.nodes.append(node)
        return outs[0] if num_outputs == 1 else outs

    def undo(self, safe: bool = False) -> None:
        """Remove what this builder added (a rewrite that was refused half way)."""
        for n in reversed(self.nodes):
            if safe:
                drop(self.graph, n)
            else:
                self.graph.remove(n, safe=False)

    def dequantize(self, x: ir.Value, s: ir.Value, z: ir.Value | None, axis: int | None = None, tag: str = "x"):
        """DequantizeLinear(x, s, z) as a node, or folded to a float initializer when x, s and z are constants."""
        xc, sc, zc = const(x), const(s), const(z)
        if xc is not None and sc is not None and (z is None or zc is not None):
            ax = 1 if axis is None else axis
            misfit = qparams_misfit(xc, sc, zc, ax, 0)
            if misfit:
                raise ModelError(f"node {self.anchor.name} ({self.anchor.op_type}): {misfit}; the model is malformed "
                                 "(re-export it)")
            return self.const(dequantize(xc, sc, zc, ax, 0), tag=f"{tag}_dequantized")
        attrs = {"axis": axis} if axis is not None and (sc is None or sc.size > 1) else {}
        y = self.op("DequantizeLinear", [x, s] + ([z] if z is not None else []), tag=f"{tag}_dequantized", **attrs)
        return as_float(y, x.shape)

    def requantize(self, y: ir.Value, s: ir.Value | None, z: ir.Value | None, out: ir.Value) -> None:
        """``out`` (a QLinear op's integer output) becomes QuantizeLinear(y, s, z); without ``s`` y itself (QGemm's
        float output)."""
        if s is None:
            take_over(out, y)
            return
        if z is None:  # the default zero point 0 in the output's integer type
            dt = out.dtype.numpy() if out.dtype is not None else np.dtype(np.uint8)
            z = self.const(np.zeros((), dt), tag="zero_point")
        q = self.op("QuantizeLinear", [y, s, z], tag="requantized")
        if out.type is None:  # a com.microsoft op's output: onnx's shape inference left it untyped
            zc = const(z)
            q.type = ir.TensorType(ir.DataType.from_numpy(zc.dtype) if zc is not None else ir.DataType.UINT8)
        take_over(out, q)


# ---------------------------------------------------------------------------------------------- value surgery
def take_over(old: ir.Value, new: ir.Value) -> None:
    """``new`` replaces ``old`` everywhere (graph outputs included) and takes its name."""
    name = old.name
    was_output = old.is_graph_output()
    if new.type is None:
        new.type = old.type
    if new.shape is None:
        new.shape = old.shape
    old.name = None
    new.name = name
    old.replace_all_uses_with(new, replace_graph_outputs=was_output)


def drop(graph: ir.Graph, nodes) -> None:
    """Remove nodes whose outputs are no longer read, detaching their inputs (so those lose these uses)."""
    for n in (nodes if isinstance(nodes, list) else [nodes]):
        for i in range(len(n.inputs)):
            n.replace_input_with(i, None)
        graph.remove(n, safe=False)


def bypass(out: ir.Value, src: ir.Value) -> None:
    """Let the consumers of ``out`` read ``src``; a graph output keeps its name (``src`` takes it over)."""
    if out.is_graph_output():
        name = out.name
        out.name = None
        src.name = name
        out.replace_all_uses_with(src, replace_graph_outputs=True)
    else:
        out.replace_all_uses_with(src)


def substitute(graph: ir.Graph, new: ir.Node, out: ir.Value, before: ir.Node, name: str) -> ir.Value:
    """Insert ``new`` before ``before`` and let it produce what ``out`` held (type, shape, consumers, a graph
    output's name; else ``name``); returns the new value. The old producer is left to the caller to remove."""
    v = new.outputs[0]
    v.type, v.shape = out.type, out.shape
    graph.insert_before(before, new)
    bypass(out, v)
    if v.name is None:
        v.name = name
    return v


def only_consumer(v: ir.Value) -> ir.Node | None:
    """The one node reading ``v`` (not a graph output), or None."""
    uses = list(v.uses())
    if len(uses) != 1 or v.is_graph_output():
        return None
    return uses[0].node


def to_initializer(graph: ir.Graph, out: ir.Value, arr: np.ndarray) -> ir.Value:
    """Replace a computed value by an initializer holding ``arr`` under the same name (its producer is left to
    the caller to remove)."""
    v = ir.Value(name=out.name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                 const_value=ir.tensor(arr, name=out.name))
    out.name = None
    out.replace_all_uses_with(v)
    graph.register_initializer(v)
    return v


def new_param(graph: ir.Graph, base: str, arr: np.ndarray) -> ir.Value:
    """A new initializer holding ``arr``, named ``base`` (or ``base_k``: the first free name)."""
    name, k = base, 0
    while name in graph.initializers:
        k += 1
        name = f"{base}_{k}"
    v = ir.Value(name=name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
                 const_value=ir.tensor(arr, name=name))
    graph.register_initializer(v)
    return v


class Names:
    """Fresh, unique node and value names in the main graph."""

    def __init__(self, graph: ir.Graph):
        self.taken = {v.name for v in graph.inputs} | set(graph.initializers) | {
            o.name for n in graph for o in n.outputs if o.name} | {n.name for n in graph if n.name}

    def __call__(self, base: str) -> str:
        return unique_name(base, self.taken)


# ---------------------------------------------------------------------------------------------- small readers
def attr(node: ir.Node, key: str, default=None):
    """An attribute's value, or ``default``."""
    a = node.attributes.get(key)
    return default if a is None else a.value


def padded_inputs(node: ir.Node, n: int) -> list:
    """The node's inputs, padded with None to ``n``."""
    return list(node.inputs) + [None] * max(0, n - len(node.inputs))


def as_float(v: ir.Value, shape) -> ir.Value:
    """``v`` typed float32 with ``shape``."""
    v.type = ir.TensorType(ir.DataType.FLOAT)
    v.shape = shape
    return v


def per_tensor(v: ir.Value | None) -> bool:
    """A quantization parameter that is one number (or not a constant: its size is the op's business)."""
    c = const(v)
    return c is None or c.size == 1


__all__ = ["Report", "LoadPass", "Builder", "take_over", "drop", "bypass", "substitute", "only_consumer",
           "to_initializer", "new_param", "Names", "attr", "padded_inputs", "as_float", "per_tensor", "const", "MS"]


class Upcast(ir.LazyTensor):
    """A float16 / bfloat16 weight read as float32 where it is used (converted when read; only the last one read is
    kept: nothing holds a float32 copy of every weight); :func:`lower_upcasts` hands the weight over in its type."""

    _last: list = [None, None]  # (tensor, float32 array) of the last conversion: the checks of one node share it

    def __init__(self, source):
        super().__init__(self._convert, ir.DataType.FLOAT, source.shape, name=source.name)
        self.source = source

    def _convert(self):
        if Upcast._last[0] is not self:
            Upcast._last[:] = [None, None]  # the previous weight's copy goes before this one is made
            Upcast._last[:] = [self, np.asarray(self.source.numpy()).astype(np.float32)]
        return ir.tensor(Upcast._last[1])

    @staticmethod
    def forget() -> None:
        """Drop the last converted weight (the model is built)."""
        Upcast._last[:] = [None, None]
