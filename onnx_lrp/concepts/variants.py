"""The three concept relevance models of a conditioned tensor ``L``, each made by post-processing the rewriter's
relevance model with onnx_ir (see :mod:`onnx_lrp.concepts`): **upper** (the relevance down to ``L`` only), **masked**
(a mask input multiplies the relevance at ``L``) and **seeded** (the graph below ``L``, its relevance starting from
an input)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from ..core.errors import InputError
from ..core.interface import ONE_HOT_INPUT, POSITION_INPUT, RELEVANCE_PREFIX, TARGET_INPUT, TARGET_OUTPUT, VALUE_OUTPUT
from ..lrp import rewriter
from .lookup import find_tensor, layer_names, listing


MASK_PREFIX = "lrp/mask/"
SEED_PREFIX = "lrp/seed/"


def _prune(model: ir.Model, keep) -> None:
    """Keep only the graph outputs ``keep`` (names, in this order), then drop the nodes and the rewriter's inputs
    that no longer feed any."""
    graph = model.graph
    by_name = {o.name: o for o in graph.outputs}
    outs = [by_name[n] for n in keep if n in by_name]
    graph.outputs.clear()
    graph.outputs.extend(outs)
    RemoveUnusedNodesPass()(model)
    unused = [v for v in graph.inputs if v.name in (TARGET_INPUT, ONE_HOT_INPUT, POSITION_INPUT) and not v.uses()]
    for v in unused:
        graph.inputs.remove(v)


def _scope_of(node: ir.Node) -> str:
    return f"lrp/{node.name.lstrip('/')}/"


def add_mask(model: ir.Model, name: str) -> str:
    """Multiply the relevance at tensor ``name`` by a new input ``lrp/mask/<name>`` (default ones, rank of the
    tensor, every axis broadcast) where it enters the rules of the tensor's producer; returns the input's name."""
    graph = model.graph
    v = find_tensor(graph, name)
    producer = v.producer()
    scope = _scope_of(producer)
    inside = [n for n in graph if n.name.startswith(scope)]
    ids = {id(n) for n in inside}
    entering = []
    for n in inside:
        for i, u in enumerate(n.inputs):
            p = u.producer() if u is not None else None
            if p is None or id(p) in ids or not p.name.startswith("lrp/") or p.name.startswith("lrp/const"):
                continue
            entering.append((n, i, u))
    if not entering:
        raise InputError(f"relevance at {name!r} cannot be masked: its producer {producer.name} ({producer.op_type}) "
                         "passes relevance without a rule node of its own; condition on a layer's output (Conv, "
                         f"Gemm, MatMul): {listing(layer_names(graph))}")
    dtype = entering[0][2].dtype or v.dtype
    rank = len(v.shape)
    mask_name = MASK_PREFIX + name
    ones = np.ones([1] * rank, dtype=dtype.numpy())
    mask = ir.Value(name=mask_name, shape=ir.Shape([f"lrp_mask_{i}" for i in range(rank)]),
                    type=ir.TensorType(dtype), const_value=ir.tensor(ones, name=mask_name))
    graph.inputs.append(mask)
    graph.register_initializer(mask)  # the default: an input with an initializer is optional in onnxruntime
    masked: dict[int, ir.Value] = {}
    for n, i, u in entering:
        if id(u) not in masked:
            out = ir.Value(name=f"{mask_name}/masked{len(masked)}")
            graph.append(ir.node("Mul", [u, mask], outputs=[out], name=f"{mask_name}/mul{len(masked)}"))
            masked[id(u)] = out
        n.replace_input_with(i, masked[id(u)])
    graph.sort()
    return mask_name


def build_upper(model: ir.Model, composite, layer: str, output, explain_logits: bool) -> list[str]:
    """The forward pass and the relevance down to ``layer`` (nothing below): its relevance and activation."""
    graph = model.graph
    v = find_tensor(graph, layer)
    forward = [o.name for o in graph.outputs]
    rewriter.rewrite(model, composite, output=output, relevance_at=[layer], explain_logits=explain_logits)
    graph.outputs.append(v)
    keep = forward + [layer, RELEVANCE_PREFIX + layer, TARGET_OUTPUT, VALUE_OUTPUT]
    _prune(model, list(dict.fromkeys(keep)))
    return keep


def build_masked(model: ir.Model, composite, masks, record, output, explain_logits: bool) -> None:
    """The whole relevance model with a mask input at each tensor in ``masks`` and relevance at ``record``."""
    graph = model.graph
    for n in list(masks) + list(record):
        find_tensor(graph, n, "record" if n in record else "layer")
    forward = [o.name for o in graph.outputs]
    rewriter.rewrite(model, composite, output=output, relevance_at=list(record), explain_logits=explain_logits)
    for n in masks:
        add_mask(model, n)
    keep = forward + [o.name for o in graph.outputs if o.name.startswith(RELEVANCE_PREFIX)]
    _prune(model, list(dict.fromkeys(keep + [TARGET_OUTPUT, VALUE_OUTPUT])))


def build_seeded(model: ir.Model, composite, layer: str, record) -> None:
    """The graph below ``layer`` only, its relevance starting from the input ``lrp/seed/<layer>``."""
    graph = model.graph
    v = find_tensor(graph, layer)
    for n in record:
        find_tensor(graph, n, "record")
    graph.outputs.append(v)
    trace: list = []
    rewriter.rewrite(model, composite, output=layer, relevance_at=list(record), explain_logits=False, trace=trace)
    start = trace[0].values[0]
    r0 = next(o for n in graph for o in n.outputs if o.name == start)
    dims = list(v.shape)
    seed = ir.Value(name=SEED_PREFIX + layer, shape=ir.Shape(["lrp_batch"] + dims[1:]),
                    type=ir.TensorType(r0.dtype or v.dtype))
    graph.inputs.append(seed)
    ir.convenience.replace_all_uses_with(r0, seed)
    _prune(model, [o.name for o in graph.outputs if o.name.startswith(RELEVANCE_PREFIX)])



__all__ = ["MASK_PREFIX", "SEED_PREFIX", "add_mask", "build_upper", "build_masked", "build_seeded"]
