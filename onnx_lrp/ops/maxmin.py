"""Element-wise Max/Min (Keras Maximum/Minimum layers, torch.maximum/minimum).

Interim: the conformance branch adds the same semantics in ``ops/select.py`` (registered under the same op types);
when both are merged, keep that one and delete this file and its import in ``ops/__init__.py``.

Of two or more activations: piecewise linear like a max pool, kind "maxpool" (the CNN composites: winner takes
all); J^T s gives each position's s to the input(s) that attain the max (min), split evenly between ties, as
torch.maximum's gradient does. Of one activation and constants (``Max(x, 0)`` is a ReLU): an element-wise
activation with f'(x) = [x == f(x)].
"""
from __future__ import annotations

from .base import ActivationOp, LinearOp, Op, Params, carries, out_dims, register


class SelectActivation(ActivationOp):
    """Max/Min of one activation with constants: an element-wise non-linearity."""

    def __init__(self, op_type):
        self.op_types = (op_type,)

    def relevance_inputs(self, node):
        return [i for i, v in enumerate(node.inputs) if carries(v)]

    def check(self, node):
        x = node.inputs[self.relevance_inputs(node)[0]]
        if x.shape is None:
            return "input rank unknown"
        dims = list(x.shape)
        for v in node.inputs:
            if v is x or v is None:
                continue
            c = v.shape if v.shape is not None else None
            if c is None or len(c) > len(dims) or any(
                    d != 1 and d != xd for d, xd in zip(list(c)[::-1], dims[::-1])):
                return "the activation is broadcast to a larger shape by a constant (not element-wise)"
        return None

    def derivative(self, em, node):
        x = node.inputs[self.relevance_inputs(node)[0]]
        return em.op("Cast", em.op("Equal", x, node.outputs[0], tag="selected"), to=em.dtype.value, tag="dfdx")


class SelectPool(LinearOp):
    """Max/Min of several activations: winner takes all (ties split evenly)."""

    kind = "maxpool"
    has_params = False

    def __init__(self, op_type):
        self.op_types = (op_type,)

    def params(self, node):
        return Params(None, None)

    def forward(self, em, node, xs, p):
        idx = self.relevance_inputs(node)
        inputs = [xs[idx.index(i)] if i in idx else v for i, v in enumerate(node.inputs)]
        return em.op(node.op_type, *inputs, tag="z")

    def transpose(self, em, node, s, p):
        z = node.outputs[0]
        hits = {i: em.op("Cast", em.op("Equal", v, z, tag=f"selected{i}"), to=em.dtype.value, tag=f"hit{i}")
                for i, v in enumerate(node.inputs) if v is not None}
        ties = em.sum(list(hits.values()), tag="ties") if len(hits) > 1 else next(iter(hits.values()))
        s_tie = em.div(s, em.op("Max", ties, em.scalar(1.0), tag="ties_guard"), tag="s_per_tie")
        return [em.unbroadcast(em.mul(hits[i], s_tie, tag=f"JTs{i}_full"), out_dims(node), node.inputs[i],
                               tag=f"JTs{i}") for i in self.relevance_inputs(node)]


class Select(Op):
    """Dispatch Max/Min: several activations -> SelectPool, one -> SelectActivation."""

    def __init__(self, op_type):
        self.op_types = (op_type,)
        self.pool = SelectPool(op_type)
        self.activation = SelectActivation(op_type)

    def resolve(self, node):
        return self.pool if sum(carries(v) for v in node.inputs) > 1 else self.activation


for _t in ("Max", "Min"):
    register(Select(_t))
