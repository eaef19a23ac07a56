"""The graph a method is written around (:mod:`.ingraph`): a model opened for it (its input and outputs renamed
out of the way), the true-gradient relevance model's stacked run (the input first, then every point along the batch
axis), and the plain gradient methods and Integrated Gradients."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from .. import load as loader
from ..core.emitter import Emitter
from ..core.errors import InputError
from ..core.interface import ONE_HOT_INPUT, RELEVANCE_PREFIX, TARGET_INPUT, TARGET_OUTPUT
from ..load import external
from .gradients import GradientRunner
from .ingraph_inputs import Inputs
from .integration import alphas_and_steps

BASELINES_INPUT = "lrp/baselines"
END = np.iinfo(np.int64).max


def open_model(model_bytes: bytes, folder, arrays: dict) -> ir.Model:
    """An onnx_ir model from its parts (:class:`onnx_lrp.load.external.Parts`): external tensors read from
    ``folder``, the tensors handed over from memory put back."""
    model = loader.deserialize(model_bytes, folder)
    for g in [model.graph, *model.graph.subgraphs()]:
        for v in g.initializers.values():
            t = v.const_value
            if isinstance(t, ir.ExternalTensor) and t.location == external.MEMORY:
                v.const_value = ir.tensor(arrays[v.name], name=v.name)
    return model


class MethodGraph:
    """A model's graph opened for a method: its inputs and outputs renamed out of the way, the new inputs made (the
    float ones ``floats`` moved, packed when several: :mod:`.ingraph_inputs`; the ``held`` ones fed as given)."""

    def __init__(self, model: ir.Model, floats, output_names, explained: str, held=()):
        self.model, self.graph = model, model.graph
        g = self.graph
        self.io = Inputs(g, [floats] if isinstance(floats, str) else list(floats), list(held))
        self.name = self.io.floats[0] if not self.io.packed else None
        self.old_x = self.io.old[self.io.floats[0]]
        self.forward = {v.name: v for v in g.outputs if v.name in output_names}
        self.explained = self.forward[explained]
        for v in self.forward.values():
            v.name = "lrp/method/was/" + v.name
        self.t = ir.Value(name=TARGET_INPUT, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["N"]))
        self.dtype = self.old_x.dtype
        self.em = Emitter(g, model.opset_imports.get("", 17), self.dtype)
        self.io.em = self.em
        self.x = self.io.x()
        self.rank = 2 if self.io.packed else len(self.old_x.shape)
        self.removed = list(self.io.old.values())

    @property
    def label(self) -> str:
        """The moved input(s), for messages."""
        return " and ".join(repr(n) for n in self.io.floats)

    def input(self, name: str, dtype: ir.DataType, dims: list) -> ir.Value:
        """A new graph input (``dims``: ints or symbolic names)."""
        return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(dims))

    def item_dims(self) -> list:
        """The moved input's dims after its batch axis (ints, or None where symbolic; packed: one axis)."""
        if self.io.packed:
            return self.io.packed_dims()
        return [d if isinstance(d, int) else None for d in self.old_x.shape[1:]]

    def forget_shapes(self) -> None:
        """The rows are not the input's items: no shape the exporter wrote for N holds."""
        for node in self.graph:
            for v in node.outputs:
                v.shape = None

    def feed_rows(self, rows: ir.Value, n: ir.Value) -> None:
        """The model run at stacked rows of the moved input, the held inputs copied along (:mod:`.ingraph_inputs`)."""
        self.io.feed_rows(rows, n)

    def finish(self, relevance: ir.Value, target: ir.Value, rows: ir.Value | None, extra_inputs=()) -> ir.Model:
        """The graph's inputs and outputs set (the model's outputs: their first ``rows`` rows; the attribution one
        output per float input), dead nodes dropped, sorted."""
        em, g = self.em, self.graph
        outputs = []
        for name, v in self.forward.items():
            if rows is None:
                out = em.op("Identity", v, tag="output")
            else:
                out = em.op("Slice", v, em.ints([0]), rows, em.ints([0]), tag="item_output")
            out.name = name
            outputs.append(out)
        attributions = self.io.unpack(relevance, 1, "attribution") if self.io.packed else {self.name: relevance}
        for name, v in attributions.items():
            v.name = RELEVANCE_PREFIX + name
        target.name = TARGET_OUTPUT
        g.outputs.clear()
        g.outputs.extend([*outputs, *attributions.values(), target])
        for old in self.removed:
            g.inputs.remove(old)
        g.inputs.extend([*self.io.new.values(), self.t, *extra_inputs])
        RemoveUnusedNodesPass()(self.model)
        g.sort()
        return self.model


class GradientGraph(MethodGraph):
    """A relevance model's graph opened for the method (the true-gradient one, or an LRP composite's started at
    ``one_hot`` or the logit): also its target and one-hot inputs and its relevance outputs out of the way; the
    inputs it attributes moved, the others (integer masks) held."""

    def __init__(self, runner, one_hot: bool = True):
        rm = runner.relevance_model
        model = open_model(rm.model_bytes, rm.model_folder, rm.model_arrays)
        floats = [s.name for s in runner.inputs if s.name in runner.relevance_inputs]
        held = [s.name for s in runner.inputs if s.name not in floats]
        super().__init__(model, floats, runner.output_names, runner.explained_output, held)
        inputs = {v.name: v for v in self.graph.inputs}
        self.old_t, self.old_one = inputs[TARGET_INPUT], inputs[ONE_HOT_INPUT]
        outputs = {v.name: v for v in self.graph.outputs}
        gradients = {n: outputs[RELEVANCE_PREFIX + n] for n in self.io.floats}
        self.target_used = outputs[TARGET_OUTPUT]
        self.outputs = outputs
        for v in (self.old_t, self.old_one, *gradients.values(), self.target_used):
            v.name = "lrp/method/was/" + v.name
        self.gradient = self.io.pack(gradients, 1, "gradient") if self.io.packed else gradients[self.name]
        self.removed += [self.old_t, self.old_one]
        self.old_one.replace_all_uses_with(self.em.const(np.array(one_hot), tag="one_hot"))

    def plain(self) -> ir.Value:
        """The graph run at the inputs alone: the target as given (-1: the arg-max), resolved."""
        self.io.feed_plain()
        self.old_t.replace_all_uses_with(self.t)
        return self.em.op("Identity", self.target_used, tag="target")

    def stacked(self, points: ir.Value, lead: int) -> tuple[ir.Value, ir.Value, ir.Value]:
        """(the gradient at every point, in ``points``' shape; the targets; N): ``points`` (``lead`` leading axes,
        then the input's shape) stacked along the batch axis after the input itself, each point explaining its
        item's target (given, or the arg-max at the input)."""
        em = self.em
        self.forget_shapes()
        shape = em.op("Shape", self.x, tag="shape")
        n = em.op("Slice", shape, em.ints([0]), em.ints([1]), tag="n")
        tail = em.op("Slice", shape, em.ints([1]), em.ints([END]), tag="tail")
        flat = em.op("Reshape", points, em.op("Concat", em.ints([-1]), tail, axis=0, tag="flat_shape"), tag="points")
        self.feed_rows(em.op("Concat", self.x, flat, axis=0, tag="rows"), n)
        target = self.targets(n)
        pshape = em.op("Shape", points, tag="points_shape")
        k = em.op("ReduceProd", em.op("Slice", pshape, em.ints([0]), em.ints([lead]), tag="lead"), keepdims=1,
                  tag="per_item")
        self.old_t.replace_all_uses_with(em.op("Concat", target, em.op("Tile", target, k), axis=0, tag="targets"))
        g = em.op("Slice", self.gradient, n, em.ints([END]), em.ints([0]), tag="point_gradients")
        return em.op("Reshape", g, pshape, tag="by_point"), target, n

    def targets(self, n: ir.Value) -> ir.Value:
        """lrp/target with -1 resolved to the arg-max of the explained output over each of the first ``n`` rows."""
        return argmax_targets(self.em, self.explained, self.t, n)

    def double(self, v: ir.Value) -> ir.Value:
        return self.em.op("Cast", v, to=ir.DataType.DOUBLE)

    def lead_shape(self, v: ir.Value, lead: int) -> ir.Value:
        """``v`` (``lead`` axes) with the input's other axes as 1s appended: it broadcasts over items' entries."""
        return self.em.op("Reshape", v, self.em.op("Concat", self.em.op("Shape", v), self.em.ints([1] * (
            self.rank - 1)), axis=0, tag="lead_shape"), tag="per_point")


def argmax_targets(em: Emitter, explained: ir.Value, t: ir.Value, n: ir.Value) -> ir.Value:
    """``t`` with -1 resolved to the arg-max of ``explained`` over each of its first ``n`` rows."""
    y = em.op("Slice", explained, em.ints([0]), n, em.ints([0]), tag="item_logits")
    best = em.op("ArgMax", em.op("Flatten", y, axis=1, tag="flat_logits"), axis=1, keepdims=0, tag="argmax")
    return em.op("Where", em.op("Less", t, em.scalar(0, np.int64), tag="is_argmax"), best, t, tag="target")


def _item_constant(w: MethodGraph, b, name: str, dims: list) -> ir.Value:
    """A baseline constant checked to broadcast to one item of input ``name`` (``dims``: N and its item dims)."""
    b = np.asarray(b, np.float64)
    if b.ndim > len(dims) or (b.ndim == len(dims) and b.shape[0] != 1) or any(
            s != 1 and s != d for s, d in zip(b.shape[::-1], dims[::-1])):
        raise InputError(f"baselines of shape {b.shape} do not broadcast to one item of {name!r} "
                         f"({' x '.join(str(d) for d in dims)}); give a number, an array of one item, or "
                         "--baseline-input")
    return w.em.const(b.astype(w.dtype.numpy()), tag="baselines")


def constant_baseline(w: MethodGraph, baselines) -> ir.Value:
    """A baseline constant that broadcasts to one item (None: 0); several float inputs: a number for all, or one
    baseline per input (a tuple or dict), each broadcast to its input's item and packed."""
    io, em = w.io, w.em
    if baselines is None:
        baselines = 0.0
    if not io.packed:
        if isinstance(baselines, (tuple, dict)):
            baselines = io.per_input(baselines, "baselines")[w.name]
        return _item_constant(w, baselines, w.name, [None] + w.item_dims())
    if not isinstance(baselines, (tuple, list, dict)):
        if np.ndim(baselines) != 0:
            raise InputError(f"baselines: the model has {len(io.floats)} float inputs ({', '.join(io.floats)}); give "
                             "one number, or a tuple with one baseline per input")
        return em.const(np.asarray(baselines, w.dtype.numpy()), tag="baselines")
    items = {}
    for k, b in io.per_input(baselines, "baselines").items():
        c = _item_constant(w, b, k, [None] + io.item_dims(k))
        one = em.op("Concat", em.ints([1]), em.op("Slice", em.op("Shape", io.new[k]), em.ints([1]), em.ints([END])),
                    axis=0, tag="item_shape")
        items[k] = em.op("Expand", c, one, tag="baseline_item")
    return io.pack(items, 1, "baselines")


def _baseline(w: GradientGraph, baselines, baseline_input: bool) -> tuple[ir.Value, list]:
    if baseline_input and w.io.packed:
        given = {k: ir.Value(name=f"{BASELINES_INPUT}/{k}", type=v.type, shape=v.shape)
                 for k, v in w.io.old.items() if k in w.io.floats}
        return w.io.pack(given, 1, "baselines"), list(given.values())
    if baseline_input:
        b = ir.Value(name=BASELINES_INPUT, type=w.old_x.type, shape=w.old_x.shape)
        return b, [b]
    return constant_baseline(w, baselines), []


def ig_sum(w: GradientGraph, xs: ir.Value, lead: int, b: ir.Value, options) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(captum's IntegratedGradients at every row of ``xs`` (``lead`` leading axes, then the input's shape) from
    the baseline ``b``, float64; the targets; N): ``sum_k w_k g(b + alpha_k (xs - b)) * (xs - b)``."""
    em = w.em
    alphas, steps = alphas_and_steps(options.integration, options.n_steps)
    ones = [1] * (lead + w.rank)
    diff = em.op("Sub", xs, b, tag="diff")
    alpha = em.const(alphas.reshape([len(alphas)] + ones).astype(w.dtype.numpy()), tag="alphas")
    path = em.op("Add", b, em.op("Mul", alpha, em.op("Unsqueeze", diff, em.ints([0])), tag="scaled"), tag="path")
    g, target, n = w.stacked(path, lead + 1)
    weights = em.const(steps.reshape([len(steps)] + ones), tag="weights", dtype=np.float64)
    total = em.op("ReduceSum", em.op("Mul", w.double(g), weights, tag="weighted"), em.ints([0]), keepdims=0,
                  tag="sum")
    return em.op("Mul", total, w.double(diff), tag="times_diff"), target, n


def integrated_gradients_model(gr: GradientRunner, options, baseline_input: bool = False) -> ir.Model:
    """The model of the prediction and captum's IntegratedGradients (``options``:
    :class:`onnx_lrp.methods.options.IntegratedGradientsOptions`) in one run; see the module."""
    w = GradientGraph(gr.runner)
    with w.em.scope("method/ig"):
        b, extra = _baseline(w, options.baselines, baseline_input)
        attribution, target, n = ig_sum(w, w.x, 0, b, options)
        relevance = w.em.op("Cast", attribution, to=w.dtype, tag="attribution")
    return w.finish(relevance, target, n, extra)


def gradient_model(gr: GradientRunner, method: str, options) -> ir.Model:
    """The model of the prediction and ``gradient`` (signed, or ``abs``) or ``gradient-x-input``."""
    w = GradientGraph(gr.runner)
    em = w.em
    with em.scope("method/" + method):
        target = w.plain()
        g = w.gradient
        if method == "gradient-x-input":
            out = em.op("Mul", g, w.x, tag="attribution")
        else:
            out = em.op("Abs" if options.abs else "Identity", g, tag="attribution")
    return w.finish(out, target, None)


def batch_axis_free(name: str, dims) -> None:
    """Refused when the input has a fixed batch of 1 (the points go along the batch axis)."""
    if dims and dims[0] == 1:
        raise InputError(f"input {name!r} has a fixed batch of 1: the method's points go along the batch axis; "
                         "export the model with a dynamic batch axis")



__all__ = ["BASELINES_INPUT", "END", "MethodGraph", "GradientGraph", "integrated_gradients_model", "gradient_model", "open_model", "argmax_targets",
           "constant_baseline", "ig_sum", "batch_axis_free"]
