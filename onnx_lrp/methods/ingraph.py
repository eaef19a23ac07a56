"""A gradient method as ONE ONNX model for plain onnxruntime (``onnx-lrp rewrite --method ...``): the true-gradient
relevance model (:mod:`.gradients`) with the method around it in the graph. For ``integrated-gradients`` the input
and its ``n_steps`` points on the path from the baseline are stacked along the batch axis (the alphas a constant:
``b + alpha_k (x - b)``), the target is the model's arg-max at the input unless given, one run computes the
prediction and every point's gradient, and the weighted sum ``sum_k w_k g_k * (x - b)`` (in float64) is an output.
The baseline is a constant (a number or an array broadcast to one item) or an input ``lrp/baselines``.

Inputs: the model's input, ``lrp/target`` (int64 [N], -1: the arg-max) and, with ``baseline_input``,
``lrp/baselines`` (the input's shape). Outputs: the model's outputs at the input, ``lrp/relevance/<input>`` (the
attribution) and ``lrp/target_used``."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from .. import load as loader
from ..core.emitter import Emitter
from ..core.errors import InputError
from ..core.interface import ONE_HOT_INPUT, RELEVANCE_PREFIX, TARGET_INPUT, TARGET_OUTPUT
from .gradients import GradientRunner
from .integration import alphas_and_steps

IN_GRAPH = ("gradient", "gradient-x-input", "integrated-gradients")
BASELINES_INPUT = "lrp/baselines"
_END = np.iinfo(np.int64).max


class _Wrap:
    """The relevance model's graph opened for the method: its input, target and one-hot inputs and its outputs
    renamed out of the way, the new inputs made."""

    def __init__(self, gr: GradientRunner):
        rm = gr.runner.relevance_model
        if rm.model_folder is not None or rm.model_arrays:
            raise InputError("rewrite --method writes models whose weights fit in one file (< 2 GB) for now; "
                             "use rewrite without --method (LRP) or the Python API's Attributor")
        self.model = loader.deserialize(rm.model_bytes)
        self.graph = g = self.model.graph
        self.name = gr.spec.name
        inputs = {v.name: v for v in g.inputs}
        self.old_x, self.old_t, self.old_one = inputs[self.name], inputs[TARGET_INPUT], inputs[ONE_HOT_INPUT]
        self.forward = {v.name: v for v in g.outputs if v.name in gr.runner.output_names}
        self.explained = self.forward[gr.runner.explained_output]
        self.gradient = next(v for v in g.outputs if v.name == RELEVANCE_PREFIX + self.name)
        self.target_used = next(v for v in g.outputs if v.name == TARGET_OUTPUT)
        for v in (self.old_x, self.old_t, self.old_one, self.gradient, self.target_used, *self.forward.values()):
            v.name = "lrp/method/was/" + v.name
        self.x = ir.Value(name=self.name, type=self.old_x.type, shape=self.old_x.shape)
        self.t = ir.Value(name=TARGET_INPUT, type=self.old_t.type, shape=self.old_t.shape)
        self.rank = len(self.old_x.shape)
        self.dtype = self.old_x.dtype
        self.em = Emitter(g, self.model.opset_imports.get("", 17), self.dtype)

    def finish(self, relevance: ir.Value, target: ir.Value, rows: ir.Value | None, extra_inputs=()) -> bytes:
        """The graph's inputs and outputs set, dead nodes dropped, sorted; the model's bytes."""
        em, g = self.em, self.graph
        outputs = []
        for name, v in self.forward.items():
            out = v if rows is None else em.op("Slice", v, em.ints([0]), rows, em.ints([0]), tag="item_output")
            if rows is None:
                out = em.op("Identity", v, tag="output")
            out.name = name
            outputs.append(out)
        relevance.name, target.name = RELEVANCE_PREFIX + self.name, TARGET_OUTPUT
        g.outputs.clear()
        g.outputs.extend([*outputs, relevance, target])
        for old in (self.old_x, self.old_t, self.old_one):
            g.inputs.remove(old)
        g.inputs.extend([self.x, self.t, *extra_inputs])
        RemoveUnusedNodesPass()(self.model)
        g.sort()
        return loader.serialize(self.model)


def _targets(w: _Wrap, n: ir.Value) -> ir.Value:
    """lrp/target with -1 resolved to the arg-max of the explained output over each of the first ``n`` rows."""
    em = w.em
    y = em.op("Slice", w.explained, em.ints([0]), n, em.ints([0]), tag="item_logits")
    best = em.op("ArgMax", em.op("Flatten", y, axis=1, tag="flat_logits"), axis=1, keepdims=0, tag="argmax")
    return em.op("Where", em.op("Less", w.t, em.scalar(0, np.int64), tag="is_argmax"), best, w.t,
                 tag="target")


def _baseline(w: _Wrap, baselines, baseline_input: bool) -> tuple[ir.Value, list]:
    if baseline_input:
        b = ir.Value(name=BASELINES_INPUT, type=w.old_x.type, shape=w.old_x.shape)
        return b, [b]
    b = np.zeros(()) if baselines is None else np.asarray(baselines, np.float64)
    dims = [d if isinstance(d, int) else None for d in w.old_x.shape]
    if b.ndim > w.rank or (b.ndim == w.rank and b.shape[0] != 1) or any(
            s != 1 and s != d for s, d in zip(b.shape[::-1], dims[::-1])):
        raise InputError(f"baselines of shape {b.shape} do not broadcast to one item of {w.name!r} "
                         f"({' x '.join(str(d) for d in dims)}); give a number, an array of one item, or "
                         "--baseline-input")
    return w.em.const(b.astype(w.dtype.numpy()), tag="baselines"), []


def integrated_gradients_model(gr: GradientRunner, options, baseline_input: bool = False) -> bytes:
    """The ONNX model of the prediction and captum's IntegratedGradients (``options``:
    :class:`onnx_lrp.methods.options.IntegratedGradientsOptions`) in one run; see the module."""
    if gr.spec.dims and gr.spec.dims[0] == 1:
        raise InputError(f"input {gr.spec.name!r} has a fixed batch of 1: the steps go along the batch axis; "
                         "export the model with a dynamic batch axis")
    w = _Wrap(gr)
    em = w.em
    alphas, steps = alphas_and_steps(options.integration, options.n_steps)
    s, lead = len(alphas), [1] * w.rank
    for node in w.graph:  # the rows are not the input's items: no shape the exporter wrote for N holds
        for v in node.outputs:
            v.shape = None
    with em.scope("method/ig"):
        b, extra = _baseline(w, options.baselines, baseline_input)
        shape = em.op("Shape", w.x, tag="shape")
        n = em.op("Slice", shape, em.ints([0]), em.ints([1]), tag="n")
        diff = em.op("Sub", w.x, b, tag="diff")
        alpha = em.const(alphas.reshape([s] + lead).astype(w.dtype.numpy()), tag="alphas")
        path = em.op("Add", b, em.op("Mul", alpha, em.op("Unsqueeze", diff, em.ints([0])), tag="scaled"),
                     tag="path")
        tail = em.op("Slice", shape, em.ints([1]), em.ints([_END]), tag="tail")
        flat = em.op("Reshape", path, em.op("Concat", em.ints([-1]), tail, axis=0, tag="flat_shape"), tag="points")
        rows = em.op("Concat", w.x, flat, axis=0, tag="rows")
        w.old_x.replace_all_uses_with(rows)
        target = _targets(w, n)
        w.old_t.replace_all_uses_with(em.op("Concat", target, em.op("Tile", target, em.ints([s])), axis=0,
                                            tag="targets"))
        w.old_one.replace_all_uses_with(em.const(np.array(True), tag="one_hot"))
        g = em.op("Slice", w.gradient, n, em.ints([_END]), em.ints([0]), tag="point_gradients")
        g = em.op("Reshape", g, em.op("Concat", em.ints([s]), shape, axis=0, tag="steps_shape"), tag="by_step")
        weights = em.const(steps.reshape([s] + lead), tag="weights", dtype=np.float64)
        total = em.op("ReduceSum", em.op("Mul", em.op("Cast", g, to=ir.DataType.DOUBLE), weights, tag="weighted"),
                      em.ints([0]), keepdims=0, tag="sum")
        attribution = em.op("Mul", total, em.op("Cast", diff, to=ir.DataType.DOUBLE), tag="times_diff")
        relevance = em.op("Cast", attribution, to=w.dtype, tag="attribution")
    return w.finish(relevance, target, n, extra)


def gradient_model(gr: GradientRunner, method: str, options) -> bytes:
    """The ONNX model of the prediction and ``gradient`` (signed, or ``abs``) or ``gradient-x-input``."""
    w = _Wrap(gr)
    em = w.em
    with em.scope("method/" + method):
        w.old_x.replace_all_uses_with(w.x)
        w.old_t.replace_all_uses_with(w.t)
        w.old_one.replace_all_uses_with(em.const(np.array(True), tag="one_hot"))
        g = w.gradient
        if method == "gradient-x-input":
            out = em.op("Mul", g, w.x, tag="attribution")
        else:
            out = em.op("Abs" if options.abs else "Identity", g, tag="attribution")
        target = em.op("Identity", w.target_used, tag="target")
    return w.finish(out, target, None)


def method_model(model, method: str, baseline_input: bool = False, **options) -> bytes:
    """``method`` (one of :data:`IN_GRAPH`) on ``model`` as one ONNX model's bytes (see the module)."""
    from . import Attributor

    if method not in IN_GRAPH:
        raise InputError(f"rewrite --method writes {', '.join(IN_GRAPH)} into the graph; {method} runs through "
                         "`onnx-lrp explain --method` (its stacked runs are not one graph yet)")
    if baseline_input and method != "integrated-gradients":
        raise InputError(f"--baseline-input is for integrated-gradients, not {method}")
    if options.get("base", "gradient") != "gradient":
        raise InputError(f"rewrite --method {method} writes the true gradient into the graph; over composite "
                         f"{options['base']!r} it runs through `onnx-lrp explain --method` (not one graph yet)")
    attributor = Attributor(model, method, **options)
    if method == "integrated-gradients":
        return integrated_gradients_model(attributor.engine, attributor.options, baseline_input)
    return gradient_model(attributor.engine, method, attributor.options)


__all__ = ["IN_GRAPH", "BASELINES_INPUT", "method_model", "integrated_gradients_model", "gradient_model"]
