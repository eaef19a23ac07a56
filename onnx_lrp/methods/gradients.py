"""The gradient family in the relevance graph: the relevance model built with the ``gradient`` rule on every node
(each op's own vector-Jacobian product) and started from 1 at the target (``start="one-hot"``) returns, as the input
relevance, the true gradient of the explained entry w.r.t. the input — no division by the input anywhere, so inputs
at 0 are no special case. Every gradient-family method is that graph run at other inputs: the integration points or
the noisy samples stacked along the batch axis, as many rows per onnxruntime run as the memory budget allows.

Products of two activations (attention, gated MLPs) and gates take the product rule (:class:`TrueGradient`);
LayerNormalization and functions of one tensor written out (GELU, SiLU) their true gradients (:mod:`.normgrad`), and
forward LSTMs theirs through time (:mod:`.lstmgrad`). Ops whose ``gradient`` rule is not their true gradient, or that
have none (the other normalisations with their scale held, GRU, RNN, other LSTMs, quotients of activations), and
ops on the path that pass no gradient (ArgMax, casts to integers, ...), are refused before anything runs, naming the
node."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

import numpy as np
import onnx_ir as ir

from .. import load as loader
from ..core.errors import InputError, UnsupportedError
from ..core.interface import ONE_HOT_INPUT, RELEVANCE_PREFIX, TARGET_INPUT, TARGET_OUTPUT
from ..lrp.families import Family, FamilyRule, family_table
from ..rules.base import Rule
from ..rules.elementwise import Gradient
from ..rules.composite import Composite, Entry
from ..run import launch, runtime
from . import budget
from .integration import alphas_and_steps
from .lstmgrad import TrueLSTMGradient  # the LSTM op's true gradient
from .normgrad import NORM_OPS, FunctionGradient, TrueNormGradient  # LayerNorm's, GELU's true gradients
from .options import RunSettings
from .packing import Packing, per_input_options


#: ops whose output is piecewise constant in their input (or an integer): no gradient passes them
STOPS = {"ArgMax", "ArgMin", "Round", "Floor", "Ceil", "Sign", "Equal", "Less", "Greater", "LessOrEqual",
         "GreaterOrEqual", "NonZero", "IsNaN", "IsInf"}
SHAPE_ONLY = {"Shape", "Size"}  # their outputs do not depend on the input's values


def _upstream(value) -> set:
    """The nodes ``value`` depends on (ids)."""
    seen, stack = set(), [value]
    while stack:
        node = stack.pop().producer()
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            stack.extend(v for v in node.inputs if v is not None)
    return seen


def non_differentiable(model, output: str | None = None, forward=None) -> list[dict]:
    """The nodes between a model input and the explained output that pass no gradient (:data:`STOPS`, casts to
    integers), as :class:`UnsupportedError` lists them (autograd would take 0 for their gradient; the methods
    refuse instead). It loads the model once more (``forward``: the model as loaded, when it is at hand)."""
    forward = loader.load(model) if forward is None else forward
    outputs = {v.name: v for v in forward.graph.outputs}
    upstream = _upstream(outputs.get(output) or forward.graph.outputs[0])
    reached = {v.name for v in forward.graph.inputs}
    found = []
    for node in forward.graph:
        if not any(v is not None and v.name in reached for v in node.inputs):
            continue
        to = node.attributes.get("to")
        integer = node.op_type == "Cast" and to is not None and ir.DataType(to.as_int()).is_integer()
        if (node.op_type in STOPS or integer) and id(node) in upstream:
            found.append({"name": node.name, "op_type": node.op_type, "domain": node.domain,
                          "opset": forward.opset_imports.get(node.domain or "", 0),
                          "reason": "no gradient (piecewise constant or integer output) on the path from the input"})
            continue
        if node.op_type not in SHAPE_ONLY:  # a tensor's shape carries no gradient (HF exports compare shapes)
            reached.update(o.name for o in node.outputs)
    return found


@dataclass(frozen=True)
class HeldScale(Rule):
    """Refuses the normalisations whose rules hold the scale (std, rms) constant: their ``gradient`` rule is the
    gradient with the scale held, not the true one (which also runs through the mean and the std)."""

    name: ClassVar[str] = "true-gradient"

    def fits(self, op) -> str | None:
        return ("its true gradient (through the normalising mean and std) is not written yet: onnx-lrp's rules "
                "hold the scale constant; use occlusion, or LRP (attnlrp)")


def _product_gradient(rule, em, layer, r_outs):
    """The product rule: each activation factor gets J_i^T g (the others held), the whole gradient, not a share."""
    op, node = layer.op, layer.node
    idx = op.relevance_inputs(node)
    if r_outs[0] is None:
        return [None] * len(idx)
    return [op.vjp(em, node, r_outs[0], i) for i in idx]


def _gate_gradient(rule, em, layer, r_outs):
    """A gate h * sigmoid(s): the product rule on its two factors (the gate's own gradient runs on through s)."""
    return layer.op.as_product(em, layer, rule, r_outs, grad=False)


@dataclass(frozen=True)
class TrueGradient(FunctionGradient, Gradient):
    """The ``gradient`` rule with the product rule on products of two activations and on gates (the registered
    ``gradient`` rule refuses them: LRP shares their relevance instead)."""

    families: ClassVar[Mapping[Family, FamilyRule]] = family_table({
        **Gradient.families, Family.PRODUCT: FamilyRule(_product_gradient),
        Family.GATE: FamilyRule(_gate_gradient)})

    def propagate_one(self, em, layer, r_out) -> list:
        node = layer.node
        if node.op_type != "Relu" or r_out is None:
            return super().propagate_one(em, layer, r_out)
        # f'(x) = [x > 0] read as [relu(x) > 0], the same mask: the pre-activation is then read by the Relu alone,
        # which onnxruntime fuses into the Conv before it (never written out: ~20 % less memory per stacked row)
        y = node.outputs[0]
        mask = _blocked_mask(em, y)
        if mask is not None:
            if not _blocked(r_out):  # e.g. the average pool's Expand: into the blocked layout once, here
                r_out = _channelwise(em, r_out, y, 1.0, "s_blocked")
            return [_shaped(em.mul(r_out, mask, tag="r_in"), y)]
        pos = em.op("Greater", y, em.scalar(0.0), tag="y_pos")
        return [em.mul(r_out, em.op("Cast", pos, to=em.dtype.value, tag="dfdx"), tag="r_in")]


# The ReLU's mask in onnxruntime's blocked (NCHWc) layout. Its CPU convolutions run in that layout, with an activation
# fused, and so do the Add and Mul of two blocked tensors of one proven shape; Greater and Cast do not: the mask
# [y > 0] written with them took a reorder of y and of the upstream gradient to NCHW and one of the product back at
# every ReLU. Here it is one per-channel 1x1 convolution, 2^127 y, with HardSigmoid fused, max(0, min(1, 2^127 v)):
# 2^254 y reaches 1 from y = 2^-149, the least float32, on (2^127 y is exact or inf, 2^127 times that at least 2^105),
# and is 0 at y = 0: the same 0/1 mask as [y > 0] at every y >= 0 (a ReLU's output), with no rounding anywhere.
_BLOCK = 16  # onnxruntime's NCHWc block (8 with AVX2, 16 with AVX-512): other channel counts stay in NCHW

def _blocked(v: ir.Value, depth: int = 0) -> bool:
    """Whether onnxruntime computes ``v`` in the blocked layout (a Conv's output, or sums and products of such)."""
    node = v.producer()
    if node is None or depth > 64:
        return False
    if node.op_type == "Conv":
        return True
    if node.op_type in ("Relu", "HardSigmoid"):  # fused into the Conv before them
        return _blocked(node.inputs[0], depth + 1)
    return node.op_type in ("Add", "Mul", "Sum") and all(i is not None and _blocked(i, depth + 1)
                                                          for i in node.inputs)


def _shaped(v: ir.Value, like: ir.Value) -> ir.Value:
    """``v`` declared of ``like``'s type and shape (the blocked Mul/Add needs its operands' shapes proven equal)."""
    v.shape, v.type = like.shape, like.type
    return v


def _channelwise(em, v: ir.Value, like: ir.Value, w: float, tag: str) -> ir.Value:
    """``w * v`` as a per-channel 1x1 Conv (no bias: an empty bias input would keep it out of the blocked layout)."""
    c = like.shape[1]
    weight = em.const(np.full((c, 1, 1, 1), w, np.float32), tag=f"{tag}_w", key=("channelwise", c, w))
    return _shaped(em.op("Conv", v, weight, group=c, kernel_shape=[1, 1], tag=tag), like)


def _blocked_mask(em, y: ir.Value) -> ir.Value | None:
    """[y > 0] for a ReLU's output ``y`` (float32, (N, C, H, W), C a multiple of the block), computed in the blocked
    layout; None: not such a tensor (the mask is then Greater and Cast)."""
    shape = y.shape
    if em.dtype != ir.DataType.FLOAT or shape is None or len(shape) != 4 or not isinstance(shape[1], int) \
            or shape[1] % _BLOCK:
        return None
    up = _channelwise(em, y, y, 2.0 ** 127, "y_up")
    return _shaped(em.op("HardSigmoid", up, alpha=2.0 ** 127, beta=0.0, tag="dfdx"), y)


def gradient_composite() -> Composite:
    """The composite of the true gradient: the ``gradient`` rule (each op's own vector-Jacobian product) on every
    node; LayerNormalization's true gradient (:mod:`.normgrad`), other normalisations with a held scale refused
    (:class:`HeldScale`)."""
    return Composite("true-gradient", (Entry({"op_type": NORM_OPS}, TrueNormGradient()),
                                       Entry({"op_type": ["LSTM"]}, TrueLSTMGradient()),
                                       Entry({"kind": ["layernorm", "normalization"]}, HeldScale()),
                                       Entry({}, TrueGradient())),
                     "the gradient of the explained entry: every op's own vector-Jacobian product", "<methods>")


class GradientRunner:
    """The true-gradient relevance model of ``model``, built once: :meth:`gradients` runs it on stacked rows."""

    def __init__(self, model, settings: RunSettings = RunSettings(), relevance_at: tuple = ()):
        self.settings = settings
        before = budget.resident()
        forward = loader.load(model)
        stops = non_differentiable(model, settings.output, forward)
        self.activation_bytes = budget.activation_bytes(forward.graph)  # per row, at most, in the relevance graph
        del forward
        if stops:
            raise UnsupportedError(stops, "The gradient methods need a gradient from the output to the input: "
                                   "use occlusion (forwards only) or LRP.")
        try:
            self.runner = launch.runner(model, launch.ExplainOptions.from_keywords(
                gradient_composite(), settings.device, output=settings.output, explain_logits=False,
                start="one-hot", threads=settings.threads, relevance_at=relevance_at), {runtime.MEM_PATTERN: "0"})
        except UnsupportedError as exc:
            raise UnsupportedError(exc.nodes, "The gradient methods need every op's own gradient: use occlusion "
                                   "(forwards only) or LRP.") from None
        floats = [s for s in self.runner.inputs if s.dtype.kind == "f" and s.name in self.runner.relevance_inputs]
        held = [s for s in self.runner.inputs if s not in floats]
        if not floats or any(s.dtype.kind == "f" for s in held):
            spec = held[0]
            raise InputError(f"input {spec.name!r} is {np.dtype(spec.dtype).name}, not float: gradient methods "
                             "need float inputs (token ids: attribute at the embeddings' output; or use LRP)")
        self.spec = floats[0]
        self.resident_bytes = budget.held_bytes(before, len(self.runner.relevance_model.model_bytes))
        self.packing = Packing(floats) if len(floats) > 1 else None
        self.held_names = [s.name for s in held]  # integer inputs (masks, positions): fed as given, not attributed
        self.held: dict = {}
        self.sequence = self.runner.relevance_model.sequence_rows is not None or self.runner.relevance_model.whole
        if self.sequence:
            raise InputError(f"the gradient methods explain one entry per item; output "
                             f"{self.runner.explained_output!r} is a sequence or has no batch axis (use LRP)")

    def batch(self, x) -> tuple[np.ndarray, bool]:
        """``x`` checked and cast, with its batch axis (several inputs: packed, :mod:`.packing`); and whether it
        came without one."""
        if self.packing is None and not self.held_names:
            a = self.runner.checked_feeds(x)[self.spec.name]
            return a, a.ndim != np.ndim(x)
        names = [s.name for s in self.runner.inputs]
        if isinstance(x, (tuple, list)) and len(x) == len(names):
            x = dict(zip(names, x))
        if not isinstance(x, dict):
            raise InputError(f"the model has {len(names)} inputs ({', '.join(names)}): give a tuple of arrays in that "
                             "order or a dict by input name")
        feeds = self.runner.checked_feeds(x)
        self.held = {k: feeds[k] for k in self.held_names}
        bare = feeds[self.spec.name].ndim != np.ndim(x[self.spec.name])
        if self.packing is None:
            return feeds[self.spec.name], bare
        return self.packing.pack({k: feeds[k] for k in self.packing.names}), bare

    def packed_options(self, method: str, options, x: np.ndarray):
        """``options`` with the values given per input packed as ``x`` (one input: a 1-tuple is its value)."""
        return per_input_options(self.packing, self.spec.name, method, options, x)

    def result(self, out: np.ndarray, x, bare: bool):
        """The attribution in the form ``x`` came in (several inputs: a tuple or a dict, as given)."""
        if self.packing is not None:
            return self.packing.result(out, x, bare)
        out = out[0] if bare else out
        if not self.held_names:
            return out
        return {self.spec.name: out} if isinstance(x, dict) else (out,)

    def feeds(self, rows: np.ndarray, start: int = 0) -> dict:
        """The model's feeds for stacked (packed) rows ``start``, ``start + 1``, ...: row r is a copy of item
        r mod N (the methods stack their samples item by item), whose integer inputs it takes."""
        if self.packing is None:
            feeds = {self.spec.name: np.ascontiguousarray(rows, self.spec.dtype)}
        else:
            arrays = self.packing.unpack(rows)
            feeds = {s.name: np.ascontiguousarray(arrays[s.name], s.dtype) for s in self.runner.inputs
                     if s.name in arrays}
        for k, a in self.held.items():
            feeds[k] = a[np.arange(start, start + len(rows)) % len(a)]
        return feeds

    def targets(self, x: np.ndarray, target) -> np.ndarray:
        """One target per item of ``x``; None: the arg-max of the output at ``x`` (one run)."""
        t = self.runner.checked_targets(target, x.shape[0])
        if np.any(t < 0):
            t = np.asarray(self.run(x, t)[TARGET_OUTPUT], np.int64).reshape(-1)
        return t

    def rows_per_run(self, x: np.ndarray) -> int:
        if self.spec.dims and self.spec.dims[0] == 1:
            return 1  # exported with a fixed batch of 1
        if self.settings.internal_batch_size is not None:
            return self.settings.internal_batch_size
        row = max(self.activation_bytes, max(1, x[:1].nbytes) * budget.ROW_FACTOR)
        return budget.rows_within(self.settings.memory_budget, self.resident_bytes, row)

    def run(self, rows: np.ndarray, targets: np.ndarray, start: int = 0) -> dict:
        feeds = {**self.feeds(rows, start), TARGET_INPUT: targets, ONE_HOT_INPUT: np.array(True)}
        return self.runner.run_bound(feeds)

    def gradients(self, rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """The gradient of each row's target entry w.r.t. the row, in chunks of :meth:`rows_per_run` rows."""
        step = self.rows_per_run(rows)
        parts = [self._gradient(self.run(rows[i:i + step], targets[i:i + step], i)) for i in range(0, len(rows), step)]
        g = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if not np.all(np.isfinite(g)):
            raise InputError("the gradient is not finite at some of the inputs (an overflow in the model's forward "
                             "or at a point of the path); check the input's scale")
        return g


    def _gradient(self, out: dict) -> np.ndarray:
        if self.packing is None:
            return out[RELEVANCE_PREFIX + self.spec.name]
        return self.packing.pack({n: out[RELEVANCE_PREFIX + n] for n in self.packing.names})


def gradient(gr: GradientRunner, x: np.ndarray, targets: np.ndarray, options) -> np.ndarray:
    g = gr.gradients(x, targets)
    return np.abs(g) if options.abs else g


def gradient_x_input(gr: GradientRunner, x: np.ndarray, targets: np.ndarray, options) -> np.ndarray:
    return gr.gradients(x, targets) * x


def baselines_for(x: np.ndarray, baselines, name: str = "baselines") -> np.ndarray:
    """The baseline broadcast to ``x``'s shape (float64); None: zeros."""
    b = np.zeros(()) if baselines is None else np.asarray(baselines, np.float64)
    try:
        return np.broadcast_to(b, x.shape)
    except ValueError:
        raise InputError(f"{name} of shape {b.shape} do not broadcast to the input's shape {x.shape}") from None


def integrated_gradients(gr: GradientRunner, x: np.ndarray, targets: np.ndarray, options) -> np.ndarray:
    """captum's IntegratedGradients: sum_k step_k * grad(b + alpha_k (x - b)) * (x - b), the steps stacked along the
    batch axis (step-major, as captum stacks them)."""
    alphas, steps = alphas_and_steps(options.integration, options.n_steps)
    b = baselines_for(x, options.baselines)
    diff = x.astype(np.float64) - b
    rows = (b[None] + alphas.reshape((-1,) + (1,) * x.ndim) * diff[None]).astype(x.dtype)
    n = len(alphas)
    g = gr.gradients(rows.reshape((n * x.shape[0],) + x.shape[1:]), np.tile(targets, n))
    total = np.tensordot(steps, g.reshape((n,) + x.shape).astype(np.float64), axes=1)
    return (total * diff).astype(x.dtype)


__all__ = ["GradientRunner", "gradient_composite", "gradient", "gradient_x_input", "integrated_gradients",
           "baselines_for"]
