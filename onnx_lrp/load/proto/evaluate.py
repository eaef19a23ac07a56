"""onnx's reference evaluator on a few nodes of an onnx_ir graph: one node with constant inputs (constant folding,
:mod:`onnx_lrp.load.fold`) and a Loop body's condition, run once per iteration (the control-flow pass)."""
from __future__ import annotations

import numpy as np
import onnx
import onnx.reference
import onnx_ir as ir

from ...core.graph import captured_values
from .opset import MIN_OPSET


def eval_node(node: ir.Node, opset: int, given: dict | None = None) -> list[np.ndarray] | None:
    """Evaluate one node whose inputs are all constant (or ``given``: input index -> array) with onnx's reference
    evaluator."""
    proto = ir.serde.serialize_node(node)
    feeds, inputs = {}, []
    for i, v in enumerate(node.inputs):
        if v is None:
            continue
        arr = given[i] if given and i in given else v.const_value.numpy()
        feeds[v.name] = arr
        inputs.append(onnx.helper.make_tensor_value_info(v.name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype),
                                                         arr.shape))
    outputs = [onnx.helper.make_empty_tensor_value_info(o.name) for o in node.outputs]
    graph = onnx.helper.make_graph([proto], "fold", inputs, outputs)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    try:
        results = onnx.reference.ReferenceEvaluator(model).run(None, feeds)
    except Exception:
        return None
    return [np.asarray(r) for r in results]


def eval_nodes(nodes: list, inputs: list, outputs: list, opset: int):
    """A function evaluating a few nodes of one graph (a control-flow body's condition) from arrays for ``inputs``
    (values read by the nodes; every other value they read must be a constant), returning ``outputs``' arrays or
    None; None when some other input is not a constant. The control-flow pass's evaluator (built once per Loop, run
    once per iteration)."""
    produced = {id(o) for n in nodes for o in n.outputs}
    given = {id(v) for v in inputs}
    inits, seen = [], set()
    for n in nodes:
        for v in list(n.inputs) + captured_values(n):
            if v is None or id(v) in produced or id(v) in given or id(v) in seen:
                continue
            seen.add(id(v))
            if v.const_value is None:
                return None
            inits.append(onnx.numpy_helper.from_array(v.const_value.numpy(), v.name))
    ins = [onnx.helper.make_empty_tensor_value_info(v.name) for v in inputs]
    outs = [onnx.helper.make_empty_tensor_value_info(o.name) for o in outputs]
    graph = onnx.helper.make_graph([ir.serde.serialize_node(n) for n in nodes], "cond", ins, outs, inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    try:
        evaluator = onnx.reference.ReferenceEvaluator(model)
    except Exception:
        return None
    names = [v.name for v in inputs]

    def run(arrays: list) -> list[np.ndarray] | None:
        try:
            return [np.asarray(r) for r in evaluator.run(None, dict(zip(names, arrays)))]
        except Exception:
            return None
    return run


def condition_evaluator(model: ir.Model):
    """``evaluate(nodes, inputs, outputs)`` for the control-flow pass (:func:`eval_nodes` at the model's opset)."""
    opset = model.opset_imports.get("", MIN_OPSET)
    return lambda nodes, ins, outs: eval_nodes(nodes, ins, outs, opset)
