"""Ops that change nothing dropped or simplified: Identity and eval-mode Dropout, a Where whose constant condition
picks one branch everywhere, LayerNormalization's empty bias input."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...builder import bypass, const
from .values import same_shape


def drop_identities(graph: ir.Graph) -> None:
    for node in list(graph):
        if node.op_type not in ("Identity", "Dropout") or node.domain not in ("", "ai.onnx"):
            continue
        out, src = node.outputs[0], node.inputs[0]
        if node.op_type == "Dropout" and len(node.outputs) > 1 and list(node.outputs[1].uses()):
            continue
        if node.op_type == "Dropout" and _training(node):
            continue  # random masks on every run: kept, so that its op check refuses it (not explained as eval)
        if out.is_graph_output():
            if src.is_graph_input() or src.is_graph_output() or src.const_value is not None:
                continue  # the Identity keeps two graph names apart
        bypass(out, src)
        graph.remove(node)


def _training(node: ir.Node) -> bool:
    """A Dropout whose ``training_mode`` input is true or not a constant (jax2onnx writes nnx.Dropout with
    ``deterministic=False`` as a constant true)."""
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return False
    mode = node.inputs[2].const_value
    return mode is None or bool(np.any(mode.numpy()))


def where_constant(graph: ir.Graph) -> int:
    """``Where(c, a, b)`` with a constant condition that is true (false) everywhere and ``a`` (``b``) already of the
    output's shape is ``a`` (``b``): jax2onnx guards ``jnp.var``'s divisor ``n - ddof > 0`` so, with NaN otherwise."""
    done = 0
    for node in list(graph):
        if node.op_type != "Where" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 3:
            continue
        c = const(node.inputs[0])
        if c is None or c.size == 0 or not (np.all(c) or not np.any(c)):
            continue
        pick = node.inputs[1] if np.all(c) else node.inputs[2]
        if pick is None or not same_shape(pick, node.outputs[0]) or pick.dtype != node.outputs[0].dtype:
            continue
        bypass(node.outputs[0], pick)
        graph.remove(node)
        done += 1
    return done


def layernorm_without_empty_bias(graph: ir.Graph) -> None:
    """LayerNormalization(x, scale, "") -> LayerNormalization(x, scale): the same op (the bias is optional), but the
    empty input name crashes onnxruntime 1.32's optimisations (a segfault, found by the fuzzer)."""
    for node in list(graph):
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        inputs = list(node.inputs)
        if len(inputs) < 3 or inputs[-1] is not None:
            continue
        while inputs and inputs[-1] is None:
            inputs.pop()
        new = ir.node("LayerNormalization", inputs, {k: a for k, a in node.attributes.items()},
                      num_outputs=len(node.outputs), name=node.name)
        for old_out, new_out in zip(node.outputs, new.outputs):
            new_out.type, new_out.shape = old_out.type, old_out.shape
        graph.insert_before(node, new)
        names = [o.name for o in node.outputs]
        for old_out, new_out in zip(node.outputs, new.outputs):
            old_out.replace_all_uses_with(new_out, replace_graph_outputs=old_out.is_graph_output())
        graph.remove(node)
        for new_out, name in zip(new.outputs, names):
            new_out.name = name
