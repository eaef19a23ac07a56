"""Concept Relevance Propagation (CRP, Achtibat et al. 2023; zennit-crp 0.6) on relevance models built from ONNX.

Every rule is linear in the relevance that arrives from above, so masking the relevance at a tensor commutes with the
propagation below it, and K concepts ride along the batch axis of one relevance model (the forward repeated for K).
Three relevance models per conditioned tensor ``L`` (an ONNX tensor name, e.g. a Conv's output), each made by
post-processing the rewriter's relevance model with onnx_ir (the rewriter itself is unchanged):

* **upper**: the forward pass and the relevance down to ``L`` only (everything below pruned): ``lrp/relevance/<L>``
  and the activation ``L``;
* **masked**: the whole relevance model with an input ``lrp/mask/<L>`` per masked tensor that multiplies the
  relevance at ``L`` before it flows on. The mask has the rank of ``L`` and broadcasts on every axis: per item
  ``[K, 1, 1, 1]``, per channel ``[K, C, 1, 1]`` (any channel axis), per neuron ``[K, C, H, W]``; its default is
  ones, so the model runs without it. This is zennit-crp's ``exclude_parallel=False``: relevance that bypasses ``L``
  through a skip connection reaches the input unmasked;
* **seeded**: the graph below ``L`` only (``L``'s ancestors), its relevance starting from the input
  ``lrp/seed/<L>`` (shaped like ``L``). zennit-crp's ``exclude_parallel=True`` (its default; skip connections do not
  leak the concept) and ``start_layer`` (RelMax references seeded with a layer's activation).

The masks enter where the relevance at ``L`` enters the rule nodes of ``L``'s producer (scope ``lrp/<node>/``, the
rewriter's naming): what those nodes read from outside their scope and from no forward tensor is the relevance of
``L`` (possibly in gradient form, ``R / z``, which an elementwise mask also commutes with).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from . import load as loader
from .core.errors import InputError, LrpError, NumericError, internal_error
from .core.graph import carries, is_param, static_dims
from .core.interface import ONE_HOT_INPUT, POSITION_INPUT, RELEVANCE_PREFIX, TARGET_INPUT, TARGET_OUTPUT, VALUE_OUTPUT
from .lrp import rewriter
from .run import runtime


MASK_PREFIX = "lrp/mask/"
SEED_PREFIX = "lrp/seed/"
LAYER_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
INITS = ("logit", "abs", "one-hot", "activation")
SAMPLES = 40  # RelMax reference samples per channel (zennit-crp's Maximization.SAMPLE_SIZE)


# ----------------------------------------------------------------------------------------------- graph lookups
def layer_names(graph: ir.Graph) -> list[str]:
    """The outputs of the graph's layers (Conv, ConvTranspose, Gemm, MatMul with a weight), in graph order."""
    return [n.outputs[0].name for n in graph if n.op_type in LAYER_OPS and n.domain in ("", "ai.onnx")
            and carries(n.outputs[0]) and any(v is not None and is_param(v) for v in n.inputs[1:])]


def _listing(names: list[str], limit: int = 30) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def find_tensor(graph: ir.Graph, name: str, what: str = "layer") -> ir.Value:
    """The value computed by a node under ``name``; an InputError listing the layers when there is none."""
    if not isinstance(name, str):
        raise InputError(f"{what} must be a tensor name (a string), not {name!r}")
    for node in graph:
        for o in node.outputs:
            if o.name == name:
                if not carries(o):
                    raise InputError(f"{what} {name!r} is not a float activation computed from the inputs; the "
                                     f"model's layers are: {_listing(layer_names(graph))}")
                if o.shape is None:
                    raise InputError(f"{what} {name!r} has no known rank (shape inference could not reach it); "
                                     f"name another tensor; the model's layers are: {_listing(layer_names(graph))}")
                return o
    raise InputError(f"no tensor named {name!r} in the model; its layers (Conv/Gemm/MatMul outputs) are: "
                     f"{_listing(layer_names(graph))}")


def input_layers(graph: ir.Graph, name: str, layers: list[str] | None = None) -> list[str]:
    """The nearest layers upstream of the layer ``name`` (through any non-layer node: activations, pooling, sums,
    skip connections), as zennit-crp's ``ModelGraph.find_input_layers``; ``layers``: the tensors that count as
    layers (default: :func:`layer_names`)."""
    wanted = set(layers if layers is not None else layer_names(graph))
    found: list[str] = []
    seen: set[int] = set()

    def search(node):
        for v in node.inputs:
            if v is None or not carries(v) or v.producer() is None:
                continue
            if v.name in wanted:
                if v.name not in found:
                    found.append(v.name)
            elif id(v) not in seen:
                seen.add(id(v))
                search(v.producer())

    search(find_tensor(graph, name).producer())
    return found


# ------------------------------------------------------------------------------------------- post-processing
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
                         f"Gemm, MatMul): {_listing(layer_names(graph))}")
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


# ----------------------------------------------------------------------------------------------- sessions
class Models:
    """Builds (once per key) and runs the three kinds of concept relevance models of one Explainer."""

    def __init__(self, explainer):
        self.ex = explainer
        self.sessions: dict = {}
        self._graph = None
        self._below = None  # (explained tensor's name, ids of the values it is computed from)

    def graph(self) -> ir.Graph:
        """The canonized forward graph (for names and the layer structure)."""
        if self._graph is None:
            self._graph = self._load().graph
        return self._graph

    def _load(self) -> ir.Model:
        src = self.ex.concept_source
        return loader.load(src["model"], constants=src["constants"], input_shapes=src["input_shapes"])

    def _session(self, key, build):
        if key not in self.sessions:
            src = self.ex.concept_source
            try:
                model = self._load()
                build(model)
                parts = loader.serialize_parts(model)  # a large model: its weights stay in their files
            except LrpError:
                raise
            except MemoryError:
                raise InputError("out of memory while building a concept relevance model") from None
            except Exception as exc:  # a bug: one line
                raise internal_error(None, exc) from exc
            self.sessions[key] = runtime.Session(parts.model_bytes, self.ex.device, src["threads"],
                                                 data_folder=parts.folder, arrays=parts.arrays, prepack=parts.prepack,
                                                 tf32=getattr(self.ex, "tf32", False))
        return self.sessions[key]

    def check_below(self, names) -> None:
        """Every tensor in ``names`` exists and lies on the way to the explained tensor (or is it)."""
        graph = self.graph()
        if self._below is None:
            src = self.ex.concept_source
            y, _ = rewriter.explained_value(graph, src["output"], src["explain_logits"])
            below, seen = {id(y)}, set()
            stack = [y.producer()] if y.producer() is not None else []
            while stack:
                node = stack.pop()
                if id(node) in seen:
                    continue
                seen.add(id(node))
                for v in node.inputs:
                    if v is not None and carries(v):
                        below.add(id(v))
                        if v.producer() is not None:
                            stack.append(v.producer())
            self._below = (y.name, below)
        y_name, below = self._below
        for name in names:
            if id(find_tensor(graph, name)) not in below:
                layers = [n for n in layer_names(graph) if id(find_tensor(graph, n)) in below]
                raise InputError(f"tensor {name!r} is not on the way to the explained tensor {y_name!r} (no relevance "
                                 f"reaches it); name one below it: {_listing(layers)}")

    def upper(self, layer: str):
        self.check_below([layer])
        src = self.ex.concept_source
        return self._session(("upper", layer), lambda m: build_upper(
            m, self.ex.composite, layer, src["output"], src["explain_logits"]))

    def masked(self, masks: tuple, record: tuple):
        self.check_below(masks + record)
        src = self.ex.concept_source
        return self._session(("masked", masks, record), lambda m: build_masked(
            m, self.ex.composite, masks, record, src["output"], src["explain_logits"]))

    def seeded(self, layer: str, record: tuple):
        self.check_below((layer,) + record)
        return self._session(("seeded", layer, record), lambda m: build_seeded(m, self.ex.composite, layer, record))


def models_of(explainer) -> Models:
    if getattr(explainer, "concept_models", None) is None:
        explainer.concept_models = Models(explainer)
    return explainer.concept_models


# ------------------------------------------------------------------------------------------------ running
def _feeds(ex, x) -> tuple[str, np.ndarray]:
    feeds = ex.checked_feeds(x)
    if len(feeds) != 1:
        raise InputError("concepts need a model with one input; this one has "
                         f"{len(feeds)} ({', '.join(feeds)})")
    name, arr = next(iter(feeds.items()))
    return name, arr


def _finite(out: dict, what: str) -> dict:
    for k, a in out.items():
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise NumericError(f"non-finite (NaN/Inf) values in {k!r} of the {what}; nothing was returned")
    return out


def _start_feeds(sess, targets, init: str) -> dict:
    feeds = {TARGET_INPUT: targets.astype(np.int64), ONE_HOT_INPUT: np.array(init == "one-hot")}
    if POSITION_INPUT in sess.input_names:
        feeds[POSITION_INPUT] = np.full(len(targets), -1, dtype=np.int64)
    return {k: v for k, v in feeds.items() if k in sess.input_names}


def upper_pass(ex, x, target, layer: str, init: str = "logit") -> dict:
    """Forward and relevance down to ``layer`` for a batch: ``relevance`` (at the layer), ``activation``,
    ``target``, ``logit`` (the explained value per item)."""
    if init not in INITS:
        raise InputError(f"init must be one of {', '.join(INITS)}, not {init!r}")
    sess = models_of(ex).upper(layer)
    name, arr = _feeds(ex, x)
    targets = ex.checked_targets(target, len(arr))
    out = _finite(sess.run({name: arr, **_start_feeds(sess, targets, init)}), "relevance down to " + layer)
    rel = out[RELEVANCE_PREFIX + layer]
    logit = out[VALUE_OUTPUT]
    if init == "abs":  # start from |logit|: every rule is linear, so the relevance only flips its sign
        rel = rel * np.sign(logit).reshape((-1,) + (1,) * (rel.ndim - 1))
    return dict(relevance=rel, activation=out[layer], target=out[TARGET_OUTPUT], logit=logit, input=name, x=arr)


def shares_of(rel: np.ndarray, channel_axis: int = 1, abs_norm: bool = True) -> np.ndarray:
    """Per item and channel: the relevance summed over every other axis, divided by the sum of its absolute values
    over the channels (+1e-10) when ``abs_norm`` (zennit-crp's ``ChannelConcept.attribute``)."""
    axis = _axis(channel_axis, rel.ndim)
    moved = np.moveaxis(rel.astype(np.float64), axis, 1).reshape(rel.shape[0], rel.shape[axis], -1)
    per = moved.sum(-1)
    if abs_norm:
        per = per / (np.abs(per).sum(-1, keepdims=True) + 1e-10)
    return per


def _axis(channel_axis, ndim: int) -> int:
    if isinstance(channel_axis, bool) or not isinstance(channel_axis, (int, np.integer)):
        raise InputError(f"channel_axis must be an int, not {channel_axis!r}")
    axis = int(channel_axis) + (ndim if channel_axis < 0 else 0)
    if not 1 <= axis < ndim:
        raise InputError(f"channel_axis {channel_axis} does not fit a layer of rank {ndim} (axis 0 is the batch)")
    return axis


def concept_relevance(ex, x, target=None, layer=None, channel_axis: int = 1, abs_norm: bool = True) -> np.ndarray:
    """Per item, the share of each channel of ``layer`` in the relevance: N x C."""
    up = upper_pass(ex, x, target, layer)
    return shares_of(up["relevance"], channel_axis, abs_norm)


def parse_concepts(concepts, shares: np.ndarray, channels: int) -> list[list[int]]:
    """``"top:K"`` (the K channels with the largest shares, descending), an int, a list of ints (one concept
    each) or a list of lists (channels summed into one concept)."""
    if isinstance(concepts, str):
        m = re.fullmatch(r"top:(\d+)", concepts.strip())
        if not m or int(m.group(1)) < 1:
            raise InputError(f"concepts must be 'top:K' (K >= 1) or a list of channel lists, not {concepts!r}")
        k = min(int(m.group(1)), channels)
        return [[int(c)] for c in np.argsort(-shares, kind="stable")[:k]]
    if isinstance(concepts, (int, np.integer)) and not isinstance(concepts, bool):
        concepts = [[concepts]]
    try:
        groups = [[c] if isinstance(c, (int, np.integer)) else list(c) for c in concepts]
    except TypeError:
        raise InputError(f"concepts must be 'top:K' or a list of channel lists, not {concepts!r}") from None
    if not groups or any(not g for g in groups):
        raise InputError("concepts must name at least one channel per concept")
    for g in groups:
        for c in g:
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= int(c) < channels:
                raise InputError(f"channel {c!r} out of range: the layer has {channels} channels (0..{channels - 1})")
    return [[int(c) for c in g] for g in groups]


def channel_masks(groups: list[list[int]], shape: tuple, axis: int, dtype=np.float32) -> np.ndarray:
    """K masks broadcastable against a batch of the layer: ones at the concept's channels along ``axis``."""
    dims = [len(groups)] + [1] * (len(shape) - 1)
    dims[axis] = shape[axis]
    masks = np.zeros(dims, dtype=dtype)
    for k, g in enumerate(groups):
        idx = [k] + [0] * (len(shape) - 1)
        for c in g:
            idx[axis] = c
            masks[tuple(idx)] = 1
    return masks


def _given_masks(masks: np.ndarray, shape: tuple, layer: str) -> np.ndarray:
    """Float masks K x (the layer's item shape, any axis 1 to broadcast): single neurons, regions, weights."""
    item = tuple(shape[1:])
    if masks.ndim != len(shape) or len(masks) < 1 or any(m not in (1, d) for m, d in zip(masks.shape[1:], item)):
        raise InputError(f"concept masks of shape {list(masks.shape)} do not fit {layer!r} (one item "
                         f"{'x'.join(map(str, item))}): give K x {'x'.join(map(str, item))}, axes of size 1 broadcast")
    if not np.all(np.isfinite(masks)):
        raise InputError("concept masks contain NaN or Inf")
    return masks


def _batched(n: int, batch_size: int):
    for lo in range(0, n, batch_size):
        yield lo, min(n, lo + batch_size)


def run_seeded(ex, layer: str, x1: np.ndarray, name: str, seeds: np.ndarray, record=(), batch_size: int = 16):
    """The seeded model for K seeds at ``layer`` on one item ``x1`` (1 x ...), repeated per batch: relevance at
    the input and at ``record``, K x ..."""
    sess = models_of(ex).seeded(layer, tuple(record))
    parts = []
    for lo, hi in _batched(len(seeds), batch_size):
        xs = np.repeat(x1, hi - lo, axis=0) if len(x1) == 1 else x1[lo:hi]
        parts.append(_finite(sess.run({name: xs, SEED_PREFIX + layer: seeds[lo:hi].astype(xs.dtype)}),
                             "relevance below " + layer))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def run_masked(ex, masks: dict, x1: np.ndarray, name: str, target: int, count: int, record=(), init: str = "logit",
               batch_size: int = 16):
    """The masked model on ``count`` copies of one item ``x1`` with the masks (name -> K x ...) at their tensors."""
    names = tuple(masks)
    sess = models_of(ex).masked(names, tuple(record))
    parts = []
    for lo, hi in _batched(count, batch_size):
        feeds = {name: np.repeat(x1, hi - lo, axis=0)}
        feeds.update(_start_feeds(sess, np.full(hi - lo, target, dtype=np.int64), init))
        for n, m in masks.items():
            feeds[MASK_PREFIX + n] = m[lo:hi] if len(m) > 1 else m
        parts.append(_finite(sess.run(feeds), "masked relevance"))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@dataclass
class ConceptExplanation:
    """What ``Explainer.explain_concepts`` returns for one item and K concepts.

    ``heatmaps``: K x the input item's shape (the relevance at the input conditioned on each concept);
    ``relevance_at``: by tensor name, K x that tensor's item shape (the conditioned layer itself: its relevance
    times each concept's mask); ``concepts``: the channels of each concept (None for masks given as an array);
    ``shares``: each concept's share of the relevance at the layer (its channels' shares summed; for given masks
    the masked relevance's sum over the absolute channel sums); ``channel_shares``: every channel's share (C);
    ``target``, ``logit``: the explained class and its value.
    """

    layer: str
    concepts: list
    heatmaps: np.ndarray
    relevance_at: dict
    shares: np.ndarray
    channel_shares: np.ndarray
    target: int
    logit: float
    exclude_parallel: bool = True
    init: str = "logit"
    x: np.ndarray | None = field(default=None, repr=False)


def explain_concepts(ex, x, target=None, layer=None, concepts="top:6", exclude_parallel: bool = True, record=(),
                     init: str = "logit", channel_axis: int = 1, batch_size: int = 16) -> ConceptExplanation:
    """Conditional heatmaps of one item for K concepts at ``layer`` (see :class:`ConceptExplanation`).

    ``concepts``: ``"top:K"``, channel lists (``[[35], [71, 2]]``), or a float array of K masks shaped like one item
    of the layer (axes of size 1 broadcast: ``K x C x 1 x 1`` per channel, ``K x C x H x W`` single neurons)."""
    if isinstance(record, str):
        record = [record]
    record = tuple(dict.fromkeys(record))
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive int, not {batch_size!r}")
    up = upper_pass(ex, x, target, layer, init)
    if len(up["x"]) != 1:
        raise InputError(f"explain_concepts explains one item; got a batch of {len(up['x'])} (use concept_relevance "
                         "for shares of a batch)")
    rel, act = up["relevance"], up["activation"]
    axis = _axis(channel_axis, rel.ndim)
    channel_shares = shares_of(rel, axis)[0]
    if isinstance(concepts, np.ndarray) and concepts.dtype.kind == "f":  # masks given: K x (broadcast) layer item
        masks = _given_masks(concepts, rel.shape, layer).astype(rel.dtype)
        groups = [None] * len(masks)
        per = np.moveaxis(rel.astype(np.float64), axis, 1).reshape(1, rel.shape[axis], -1).sum(-1)
        shares = (rel * masks).reshape(len(masks), -1).sum(1) / (np.abs(per).sum() + 1e-10)
    else:
        groups = parse_concepts(concepts, channel_shares, rel.shape[axis])
        masks = channel_masks(groups, rel.shape, axis, rel.dtype)
        shares = np.array([channel_shares[g].sum() for g in groups])
    below = tuple(r for r in record if r != layer)
    base = act if init == "activation" else rel
    if init == "activation" or exclude_parallel:
        out = run_seeded(ex, layer, up["x"], up["input"], base * masks, below, batch_size)
    else:
        out = run_masked(ex, {layer: masks}, up["x"], up["input"], int(up["target"][0]), len(groups), below,
                         "one-hot" if init == "one-hot" else "logit", batch_size)
        if init == "abs":
            sign = np.sign(up["logit"][0])
            out = {k: v * sign for k, v in out.items()}
    relevance_at = {r: out[RELEVANCE_PREFIX + r] for r in below}
    if layer in record:
        relevance_at[layer] = base * masks
    relevance_at = {r: relevance_at[r] for r in record}
    heat = out[RELEVANCE_PREFIX + up["input"]]
    return ConceptExplanation(layer=layer, concepts=groups, heatmaps=heat, relevance_at=relevance_at,
                              shares=shares,
                              channel_shares=channel_shares, target=int(up["target"][0]),
                              logit=float(up["logit"][0]), exclude_parallel=bool(exclude_parallel), init=init,
                              x=up["x"][0])


# ------------------------------------------------------------------------------------------ attribution graph
@dataclass
class ConceptGraph:
    """The attribution graph of one concept: ``nodes`` ((layer, channel), the root first) and ``edges``
    ({(layer, channel): [(lower layer, channel, share), ...]}), as zennit-crp's ``AttributionGraph``."""

    root: tuple
    nodes: list
    edges: dict
    target: int


def concept_graph(ex, x, target=None, layer=None, concept: int = 0, width=(5, 2), layers=None,
                  abs_norm: bool = True, batch_size: int = 16) -> ConceptGraph:
    """Decompose channel ``concept`` of ``layer`` into its most relevant lower-level concepts, recursively: at each
    level, every concept found (conditioned jointly with the root concept, the relevance starting at ``target``'s
    logit and passing skip connections: zennit-crp's ``exclude_parallel=False``) is split into the ``width[i]``
    channels of each nearest upstream layer with the largest shares."""
    if not isinstance(width, (list, tuple)) or not width or any(
            isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1 for w in width):
        raise InputError(f"width must be a list of positive ints (concepts kept per level), not {width!r}")
    graph = models_of(ex).graph()
    layers = list(layers) if layers is not None else layer_names(graph)
    up = upper_pass(ex, x, target, layer)
    if len(up["x"]) != 1:
        raise InputError(f"concept_graph explains one item; got a batch of {len(up['x'])}")
    channels = up["relevance"].shape[1]
    parse_concepts([[concept]], np.zeros(channels), channels)
    t = int(up["target"][0])
    root = (layer, int(concept))
    nodes, edges = [root], {}
    level = [root]
    for w in width:
        if not level:
            break
        ins = {name: input_layers(graph, name, layers) for name in {n for n, _ in level}}
        record = tuple(dict.fromkeys(r for n, _ in level for r in ins[n]))
        if not record:
            break
        names = tuple(dict.fromkeys([layer] + [n for n, _ in level]))
        masks = {}
        for name in names:
            shape = find_tensor(graph, name).shape
            chans = static_dims(find_tensor(graph, name))[1]
            if chans is None:
                raise InputError(f"layer {name!r} has a dynamic channel count; the attribution graph needs static "
                                 "channels (fix the input shape: input_shapes= / --input-shape)")
            m = np.ones([len(level), chans] + [1] * (len(shape) - 2), dtype=up["relevance"].dtype)
            for i, (n, c) in enumerate(level):  # every item: the root concept, and its own concept at its layer
                if name == layer or name == n:
                    m[i] = 0
                    m[i, concept if name == layer else c] = 1
            masks[name] = m
        out = run_masked(ex, masks, up["x"], up["input"], t, len(level), record, "logit", batch_size)
        nxt = []
        for i, (n, c) in enumerate(level):
            for r in ins[n]:
                share = shares_of(out[RELEVANCE_PREFIX + r][i:i + 1], 1, abs_norm)[0]
                top = np.argsort(-share, kind="stable")[:w]
                edges.setdefault((n, c), []).extend((r, int(k), float(share[k])) for k in top)
                for k in top:
                    if (r, int(k)) not in nodes:
                        nodes.append((r, int(k)))
                    if (r, int(k)) not in nxt:
                        nxt.append((r, int(k)))
        level = nxt
    return ConceptGraph(root=root, nodes=nodes, edges=edges, target=t)


# ------------------------------------------------------------------------------------------------- RelMax
class RelMax:
    """Relevance maximisation (zennit-crp's ``Maximization("relevance", "sum", abs_norm=True)``): per channel of
    ``layer``, the ``samples`` items whose relevance there, summed over the other axes and divided by the item's
    absolute sum over the channels, is largest; ``rf``: the position (flattened) of each one's largest relevance in
    that channel, the neuron whose receptive field :meth:`reference_heatmaps` shows."""

    def __init__(self, explainer, layer: str, samples: int = SAMPLES, channel_axis: int = 1, abs_norm: bool = True):
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise InputError(f"samples must be a positive int, not {samples!r}")
        self.ex, self.layer, self.samples = explainer, layer, samples
        self.channel_axis, self.abs_norm = channel_axis, abs_norm
        self.indices = self.scores = self.rf = None  # samples x C, best first

    def update(self, x, targets=None, ids=None) -> None:
        """Add a batch (``targets``: one class per item, None: arg-max; ``ids``: the items' indices in the
        dataset, default consecutive after those seen)."""
        up = upper_pass(self.ex, x, targets, self.layer)
        rel = up["relevance"]
        axis = _axis(self.channel_axis, rel.ndim)
        flat = np.moveaxis(rel.astype(np.float64), axis, 1).reshape(rel.shape[0], rel.shape[axis], -1)
        score = shares_of(rel, axis, self.abs_norm)
        ids = np.arange(len(rel)) if ids is None else np.asarray(ids, dtype=np.int64)
        if ids.shape != (len(rel),):
            raise InputError(f"{ids.size} ids for a batch of {len(rel)}")
        self.merge(np.repeat(ids[:, None], rel.shape[axis], 1), score, np.argmax(flat, -1))

    def merge(self, indices, scores, rf) -> None:
        """Merge candidates (rows: samples, columns: channels) into the kept top ``samples`` per channel."""
        if self.indices is not None:
            indices = np.concatenate([indices, self.indices])
            scores = np.concatenate([scores, self.scores])
            rf = np.concatenate([rf, self.rf])
        order = np.argsort(-scores, axis=0, kind="stable")[:self.samples]
        self.indices = np.take_along_axis(indices, order, 0).astype(np.int64)
        self.scores = np.take_along_axis(scores, order, 0)
        self.rf = np.take_along_axis(rf, order, 0).astype(np.int64)

    def arrays(self) -> dict:
        return {"indices": self.indices, "scores": self.scores, "rf": self.rf}

    def reference_heatmaps(self, data, channels, count: int = 8, batch_size: int = 16) -> dict:
        """Per channel, the receptive-field heatmaps (count x the input item's shape) of its top ``count``
        samples: the relevance below ``layer`` started from the activation at the sample's ``rf`` neuron only
        (zennit-crp's ``ChannelConcept.mask_rf`` with ``start_layer``). ``data``: an array of the items, or a
        dataset source (``read_item``)."""
        if self.indices is None:
            raise InputError("RelMax has seen no data: call update (or relmax build) first")
        out = {}
        for c in channels:
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= c < self.indices.shape[1]:
                raise InputError(f"channel {c!r} out of range: {self.layer!r} has {self.indices.shape[1]} channels")
            ids = self.indices[:count, c]
            xs = np.stack([_item(data, int(i)) for i in ids])
            up = upper_pass(self.ex, xs, None, self.layer)
            act = up["activation"]
            axis = _axis(self.channel_axis, act.ndim)
            moved = np.moveaxis(act, axis, 1)
            seed = np.zeros_like(moved).reshape(len(ids), moved.shape[1], -1)
            rows = np.arange(len(ids))
            seed[rows, c, self.rf[:count, c]] = moved.reshape(seed.shape)[rows, c, self.rf[:count, c]]
            seed = np.moveaxis(seed.reshape(moved.shape), 1, axis)
            res = run_seeded(self.ex, self.layer, up["x"], up["input"], seed, (), batch_size)
            out[int(c)] = res[RELEVANCE_PREFIX + up["input"]]
        return out


def _item(data, i: int) -> np.ndarray:
    if hasattr(data, "read_item"):
        arrays = data.read_item(i)
        return next(iter(arrays.values()))
    return np.asarray(data[i])


def relmax_build(explainer, source, out_dir, layer: str, targets=None, samples: int = SAMPLES,
                 shard_size: int = 256, batch_size: int = 32, overwrite: bool = False, log=None) -> RelMax:
    """RelMax over a dataset source (onnx_lrp.dataset.open_source), resumable: each shard's top candidates are
    written (atomically) to ``out_dir/relmax-shards/part-NNNNN.npz`` and listed in ``out_dir/relmax.json``; a
    rerun skips the shards done. The merged result: ``out_dir/relmax.npz`` (indices, scores, rf per channel, and
    the source ids of the items)."""
    import hashlib
    import io
    import json
    from pathlib import Path

    from .core.files import atomic_write

    out = Path(out_dir)
    (out / "relmax-shards").mkdir(parents=True, exist_ok=True)
    manifest_path = out / "relmax.json"
    setup = dict(layer=layer, samples=samples, shard_size=shard_size, items=len(source),
                 source=source.fingerprint(), composite=explainer.composite.name,
                 model=hashlib.sha256(explainer.model_bytes).hexdigest())
    manifest = {"setup": setup, "shards": {}}
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        if old.get("setup") != setup and not overwrite:
            diff = ", ".join(k for k in setup if old.get("setup", {}).get(k) != setup[k])
            raise InputError(f"{manifest_path} was written for another run (differs in: {diff}); use another "
                             "--out-dir or --overwrite")
        if old.get("setup") == setup:
            manifest = old
    labels = None if targets is None else np.asarray(targets)
    if labels is not None and labels.shape != (len(source),):
        raise InputError(f"{labels.size} targets for {len(source)} items; give one class per item")
    rm = RelMax(explainer, layer, samples)
    for k, lo in enumerate(range(0, len(source), shard_size)):
        hi = min(len(source), lo + shard_size)
        path = out / "relmax-shards" / f"part-{k:05d}.npz"
        rec = manifest["shards"].get(str(k))
        if rec and path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == rec["sha256"]:
            part = np.load(path)
            if part["indices"].size:
                rm.merge(part["indices"], part["scores"], part["rf"])
            continue
        shard = RelMax(explainer, layer, samples)
        ok, bad = source.read(lo, hi)
        for b in range(0, len(ok), batch_size):
            chunk = ok[b:b + batch_size]
            ids = np.array([i for i, _ in chunk])
            xs = np.stack([next(iter(a.values())) for _, a in chunk])
            shard.update(xs, None if labels is None else labels[ids], ids)
        arrays = shard.arrays() if shard.indices is not None else {
            "indices": np.zeros((0, 0), np.int64), "scores": np.zeros((0, 0)), "rf": np.zeros((0, 0), np.int64)}
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        atomic_write(path, buf.getvalue(), sync_dir=False)
        manifest["shards"][str(k)] = {"items": [lo, hi], "sha256": hashlib.sha256(buf.getvalue()).hexdigest(),
                                      "failed": [{"item": source.ids[i], "error": m} for i, m in bad]}
        atomic_write(manifest_path, json.dumps(manifest, indent=1).encode())
        if shard.indices is not None:
            rm.merge(shard.indices, shard.scores, shard.rf)
        if log:
            log(f"shard {k}: items {lo}..{hi - 1} ({len(bad)} failed)")
    if rm.indices is None:
        raise InputError("no item of the source could be read; see relmax.json for the errors")
    buf = io.BytesIO()
    np.savez(buf, **rm.arrays(), ids=np.array([str(source.ids[i]) for i in rm.indices.reshape(-1)]).reshape(
        rm.indices.shape), layer=np.array(layer))
    atomic_write(out / "relmax.npz", buf.getvalue())
    return rm


def relmax_load(explainer, out_dir) -> RelMax:
    """The RelMax result a :func:`relmax_build` wrote."""
    from pathlib import Path

    path = Path(out_dir) / "relmax.npz"
    if not path.exists():
        raise InputError(f"{path} not found; run `onnx-lrp relmax build` with this --out-dir first")
    data = np.load(path)
    rm = RelMax(explainer, str(data["layer"]), samples=len(data["indices"]))
    rm.indices, rm.scores, rm.rf = data["indices"], data["scores"], data["rf"]
    return rm


__all__ = ["ConceptExplanation", "ConceptGraph", "concept_relevance", "explain_concepts", "concept_graph",
           "layer_names", "input_layers", "shares_of", "RelMax", "relmax_build", "relmax_load", "MASK_PREFIX",
           "SEED_PREFIX"]
