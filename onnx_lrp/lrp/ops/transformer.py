"""Ops of exported transformers: softmax, normalisations, masks and lookups, and the one dispatcher of MatMul / Mul /
Div over what they can mean.

- ``Products``: MatMul / Mul / Div as a linear map of one activation, a product of two activations (``Product``,
  kind ``bilinear``: ``onnx_lrp.lrp.ops.products``), a gate (``onnx_lrp.lrp.ops.gates``), or another pattern below.
- ``ElementwiseOfOne`` (kind ``activation``): a Mul recognised by ``onnx_lrp.lrp.patterns`` as a non-linearity of one
  tensor (SiLU, GELU, ...): relevance passes to that tensor (identity rule).
- ``NormScale`` (kind ``normalization``): ``n / s`` with ``s`` the detached std / rms of ``n`` (decomposed
  LayerNorm / RMSNorm): linear in ``n``; ``epsilon`` gives ``R_n = z R / stab(z)``.
- ``LayerNorm`` (kind ``layernorm``): LayerNormalization, RMSNormalization, SimplifiedLayerNormalization with the
  normalising scale held constant (LXT detaches it): a linear map of ``x`` whose transpose is
  ``J^T s = center(s ⊙ gamma) / std`` (no centering for the RMS forms).
- ``Softmax`` (kind ``softmax``): AttnLRP's rule ``R_in = x ⊙ (R_out − softmax(x) ΣR_out)``.
- Masks and tables: ``Where`` (selection), ``Tile``, ``Trilu`` (masking), ``Gather`` with computed indices (an
  embedding lookup when the table is a constant: the relevance path ends there and is reported per token),
  ``ConstantOfShape`` / ``Range`` / ``EyeLike`` (no relevance inputs).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...core import meta
from ...core.emitter import Emitter
from ...core.graph import carries, const, is_param, static_dims
from .. import patterns
from ..families import Family
from .base import (
    ActivationOp,
    LinearOp,
    Op,
    Params,
    Rel,
    RuleOp,
    ShapeOp,
    affine_back,
    affine_out,
    register,
    stabilized,
)
from .gates import GATE
from .linear import ElementwiseBinary, MatMul
from .products import PRODUCT_MUL, Einsum, Product
from .shape import Gather, index_axis_as_one
from ..vocabulary import Kind, Nonneg


class ElementwiseOfOne(ActivationOp):
    """A Mul or Div that computes a non-linearity of one tensor (x * Sigmoid(x), GELU subgraphs, x / (1 + |x|)):
    relevance goes to x."""

    op_types = ()

    def relevance_inputs(self, node):
        return []

    def relevance_values(self, node):
        return [meta.PATTERN.get(node).source]

    def at_zero(self, node):
        """0 when the function provably vanishes where its argument (the value both factors are computed from, a
        bias Add included) is 0 — SiLU, GELU, hard-swish: a factor is a, c a, tanh(a), ... —, else NaN (unknown:
        kind offset-activation, no identity rule)."""
        arg = patterns.function_argument(node)
        return 0.0 if arg is not None and patterns.vanishes_at_zero(node.outputs[0], arg) else float("nan")

    def pass_grad(self, em, node, g):
        """y = a * h (or a / h) with ``a`` an affine function of x (x + b, 0.5 x: SiLU, GELU, softsign as exported):
        R = y ⊙ g = a ⊙ (h ⊙ g), so (h ⊙ g, a) is the gradient form relative to ``a`` (the layer output below, bias
        included); a / h gives (g / h, a)."""
        x = meta.PATTERN.get(node).source
        if node.op_type == "Div":
            return (em.div(g, node.inputs[1], tag="g_in"), node.inputs[0]) if _affine_of(node.inputs[0], x) else None
        for a, h in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            if _affine_of(a, x):
                return em.mul(g, h, tag="g_in"), a
        return None


def _affine_of(v: ir.Value, x: ir.Value, depth: int = 0) -> bool:
    """Whether v is x, or x through Add/Sub/Mul/Div with constants."""
    while v is not x:
        p = v.producer()
        if p is None or p.op_type not in ("Add", "Sub", "Mul", "Div") or depth > 4:
            return False
        acts = [u for u in p.inputs if carries(u)]
        if len(acts) != 1 or (p.op_type == "Div" and p.inputs[0] is not acts[0]):
            return False
        v, depth = acts[0], depth + 1
    return True


class NormScale(RuleOp):
    """n / s (or n * (1/s)) with s the detached std or rms of n: linear in n. Steps for the rules of family
    ``norm_scale``: ``held_scale`` / ``held_scale_grad`` (epsilon, norm), ``held_scale_gradient`` (gradient); pass
    needs none."""

    kind = Kind.NORMALIZATION
    family = Family.NORM_SCALE
    refusal = "a normalisation with a detached scale (use epsilon or pass)"
    op_types = ()

    def relevance_inputs(self, node):
        return []

    def relevance_values(self, node):
        return [meta.PATTERN.get(node).source]

    def held_scale(self, em, layer, r_outs, eps: float):
        """R_n = z R / stab(z) (epsilon, norm)."""
        r = r_outs[0]
        if r is None:
            return [r]
        z = layer.node.outputs[0]
        s = em.div(r, stabilized(em, z, eps, tag="stab"), tag="s")
        return [em.mul(z, s, tag="r_in")]

    def held_scale_gradient(self, em, layer, r_outs):
        """J^T r = r / s: the numerator's gradient with the scale held (the gradient rule)."""
        r = r_outs[0]
        if r is None:
            return [r]
        z = layer.node.outputs[0]
        return [em.div(em.mul(r, z, tag="rz"), layer.xs[0], tag="r_in")]

    def held_scale_grad(self, em, layer, r_outs):
        """g_n = J^T g: z = n / scale (or n * inv) with the scale held, so g / scale (or g * inv)."""
        node = layer.node
        n = layer.xs[0]
        g = r_outs[0].normalised(em, node.outputs[0])
        other = node.inputs[1] if node.inputs[0] is n else node.inputs[0]
        g = em.div(g, other, tag="g_in") if node.op_type == "Div" else em.mul(g, other, tag="g_in")
        return [Rel(g, n)]


# ------------------------------------------------------------------------------------------ dispatchers
class Products(Op):
    """MatMul / Mul / Div, one handler for what they can mean: a linear map of one activation (``base``: MatMul or
    an element-wise affine op with a constant), a product of two activations (``product``; a Div of two activations
    has none), or a pattern ``onnx_lrp.lrp.patterns`` recognised (a normalisation's scale, a gate, a non-linearity of one
    tensor)."""

    def __init__(self, base: Op, product: Product | None):
        self.base = base
        self.product = product
        self.op_types = base.op_types
        self.kind = getattr(base, "kind", "")

    def resolve(self, node):
        m = meta.PATTERN.get(node)
        if m is not None:
            return NORM_SCALE if m.name.endswith("-scale") else GATE if m.name == "gate" else \
                ELEMENTWISE_OF_ONE.resolve(node)
        acts = [v for v in node.inputs[:2] if carries(v)]
        if self.product is not None and len(acts) == 2:
            return self.product
        return self.base.resolve(node)

    def check(self, node):
        acts = [v for v in node.inputs[:2] if carries(v)]
        if meta.PATTERN.get(node) is not None:
            return None
        if len(acts) == 2:
            if self.product is None:  # Div of two activations that is no normalisation
                return (f"quotient of two activations that is not a normalisation ({patterns.why(node)}); "
                        "LRP has no rule for it")
            return None
        return self.base.check(node)

    def nonneg_output(self, node, inputs_nonneg):
        return self.base.nonneg_output(node, inputs_nonneg)


ELEMENTWISE_OF_ONE = ElementwiseOfOne()
NORM_SCALE = NormScale()
register(Products(MatMul(), Product("MatMul")))
register(Products(ElementwiseBinary("Mul"), PRODUCT_MUL))
register(Products(ElementwiseBinary("Div"), None))
register(Einsum)


# ------------------------------------------------------------------------------------------ normalisations
class LayerNorm(LinearOp):
    """LayerNormalization / RMSNormalization / SimplifiedLayerNormalization, normalising scale held constant."""

    kind = Kind.LAYERNORM
    op_types = ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization")

    data_inputs = (0,)

    def centered(self, node):
        return node.op_type == "LayerNormalization"

    def axes(self, node):
        rank = len(node.inputs[0].shape)
        axis = node.attributes.get_int("axis", -1) % rank
        return list(range(axis, rank))

    def check(self, node):
        if node.inputs[0].shape is None:
            return "input rank unknown"
        for v in node.inputs[1:3]:
            if v is not None and not is_param(v):
                return "scale or bias is not a constant"
        dims = static_dims(node.inputs[0])
        if any(dims[a] is None for a in self.axes(node)):
            return "normalised dimensions must be static"
        return None

    def params(self, node):
        w = const(node.inputs[1])
        b = const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        return Params(w, b)

    def _center(self, em, node, v, tag):
        if not self.centered(node):
            return v
        mean = em.reduce_mean(v, self.axes(node), f"{tag}_mean")
        return em.sub(v, mean, tag=tag)

    def inv_scale(self, em: Emitter, node: ir.Node) -> ir.Value:
        """1 / std (or 1 / rms) of the forward input, computed once per node from that input: never from
        LayerNormalization's optional InvStdDev output, which onnxruntime's SkipLayerNormalization fusion leaves
        unwritten on CUDA (tests/run/test_cuda_safe.py)."""
        cached = meta.INV_SCALE.get(node)
        if cached is not None and cached[0] is em:
            return cached[1]
        x = node.inputs[0]
        d = self._center(em, node, x, "xc")
        inv = em.inv_std(d, self.axes(node), node.attributes.get_float("epsilon", 1e-5))
        meta.INV_SCALE.set(node, (em, inv))
        return inv

    def forward(self, em, node, xs, p):
        y = em.mul(self._center(em, node, xs[0], "c"), self.inv_scale(em, node), tag="xhat")
        return affine_out(em, node, y, p)

    def transpose(self, em, node, s, p):
        s = affine_back(em, node, s, p)
        s = self._center(em, node, s, "sc")
        return [em.mul(s, self.inv_scale(em, node), tag="JTs")]


register(LayerNorm)


# ------------------------------------------------------------------------------------------ softmax
@register
class Softmax(RuleOp):
    """R_in = x ⊙ (R_out − softmax(x) ΣR_out) along the softmax axis (AttnLRP). Steps for the rules of family
    ``softmax``: ``attn`` / ``attn_grad`` (softmax), ``gradient`` (gradient); zero needs none."""

    kind = Kind.SOFTMAX
    family = Family.SOFTMAX
    refusal = "a softmax (use softmax, gradient or zero)"
    op_types = ("Softmax",)
    nonneg = Nonneg.ALWAYS

    data_inputs = (0,)

    def check(self, node):
        if node.inputs[0].shape is None:
            return "input rank unknown"
        return None

    def gradient(self, em, layer, r_outs):
        """J^T r = y ⊙ (r − Σ y r) (the gradient rule)."""
        r = r_outs[0]
        if r is None:
            return [None]
        y = layer.node.outputs[0]
        tot = em.reduce_sum(em.mul(y, r, tag="yr"), [self._axis(layer.node)], tag="sum_yr")
        return [em.mul(y, em.sub(r, tot, tag="centred"), tag="r_in")]

    def _axis(self, node):
        return node.attributes.get_int("axis", -1) % len(node.inputs[0].shape)

    def attn(self, em, layer, r_outs):
        """R_in = x ⊙ (R_out − softmax(x) ΣR_out), zero at masked logits (AttnLRP)."""
        r = r_outs[0]
        if r is None:
            return [None]
        x, y = layer.node.inputs[0], layer.node.outputs[0]
        tot = em.reduce_sum(r, [self._axis(layer.node)], tag="sum_r")
        rin = em.mul(x, em.sub(r, em.mul(y, tot, tag="y_sum"), tag="centred"), tag="r_raw")
        return [self._unmask(em, x, rin)]

    def _unmask(self, em, x, rin):
        low = float(np.finfo(em.np_dtype).min) * 0.5
        masked = em.op("Less", x, em.scalar(low), tag="masked")  # -inf and the dtype's most negative values
        return em.op("Where", masked, em.scalar(0.0), rin, tag="r_in")

    def attn_grad(self, em, layer, r_outs):
        """In gradient form the rule is the softmax's own gradient: g_x = y ⊙ (g − Σ y ⊙ g), R_x = x ⊙ g_x (which
        vanishes at masked logits, where y = 0)."""
        node = layer.node
        r = r_outs[0]
        if r is None:
            return [None]
        x, y = node.inputs[0], node.outputs[0]
        if r.ref is not y:
            return [Rel(self.attn(em, layer, [r.as_relevance(em, tag="r_out")])[0])]
        tot = em.reduce_sum(em.mul(y, r.value, tag="yg"), [self._axis(node)], tag="sum_yg")
        return [Rel(em.mul(y, em.sub(r.value, tot, tag="centred"), tag="g_in"), x)]


# ------------------------------------------------------------------------------------------ masks, tables, moves
@register
class Where(ShapeOp):
    """Where(c, x, y): relevance follows the selection (R_x = R where c, R_y = R elsewhere), summed over broadcast."""

    op_types = ("Where",)

    def relevance_inputs(self, node):
        return [i for i in (1, 2) if carries(node.inputs[i])]

    def check(self, node):
        if static_dims(node.outputs[0]) is None or any(static_dims(node.inputs[i]) is None
                                                      for i in self.relevance_inputs(node)):
            return "ranks unknown"
        return None

    def transpose(self, em, node, r_outs):
        r = r_outs[0]
        out = []
        zero = em.scalar(0.0)
        for i in self.relevance_inputs(node):
            sel = em.op("Where", node.inputs[0], r, zero, tag=f"r{i}_sel") if i == 1 else em.op(
                "Where", node.inputs[0], zero, r, tag=f"r{i}_sel")
            out.append(em.unbroadcast(sel, static_dims(node.outputs[0]), node.inputs[i], tag=f"r{i}"))
        return out


@register
class Tile(ShapeOp):
    """J^T r = r summed over the tiles (static shapes, constant repeats)."""

    op_types = ("Tile",)

    data_inputs = (0,)

    def check(self, node):
        if const(node.inputs[1]) is None:
            return "repeats are not constant"
        dims = static_dims(node.inputs[0])
        if dims is None or any(d is None for d in dims[1:]):
            return "non-batch dimensions must be static"
        if dims[0] is None and int(const(node.inputs[1])[0]) != 1:
            return "the batch dimension is tiled but unknown"
        return None

    def transpose(self, em, node, r_outs):
        reps = [int(v) for v in const(node.inputs[1])]
        dims = static_dims(node.inputs[0])
        split = []  # output axis i is (repeat, size) in that order: tiles repeat whole blocks
        for rp, d in zip(reps, dims):
            split += [rp, d if d is not None else -1]  # only the batch may be unknown (checked)
        r = em.op("Reshape", r_outs[0], em.ints(split), tag="r_tiles")
        r = em.op("ReduceSum", r, em.ints(list(range(0, 2 * len(dims), 2))), keepdims=0, tag="r_in")
        return [r]


@register
class Trilu(ShapeOp):
    """Trilu masks a matrix: its transpose applies the same mask to the relevance."""

    op_types = ("Trilu",)

    data_inputs = (0,)

    def transpose(self, em, node, r_outs):
        k = node.inputs[1] if len(node.inputs) > 1 else None
        return [em.op("Trilu", r_outs[0], k, upper=node.attributes.get_int("upper", 1), tag="r_in")]


@register
class Leaf(ShapeOp):
    """Ops that make tensors from shapes or scalars (no activation input): the relevance path ends."""

    op_types = ("ConstantOfShape", "Range", "EyeLike", "RandomNormalLike", "RandomUniformLike", "Shape", "Size")

    def relevance_inputs(self, node):
        return []

    def transpose(self, em, node, r_outs):
        return []


class Lookup(ShapeOp):
    """Gather with computed indices: from a constant table (embedding lookup: the path ends, relevance is
    reported per token) or from an activation (J^T r = scatter-add r at the indices); with constant indices the
    move ``base`` (``onnx_lrp.lrp.ops.shape.Gather``)."""

    def __init__(self, base):
        self.base = base
        self.op_types = ("Gather",)

    def nonneg_output(self, node, inputs_nonneg):
        return self.base.nonneg_output(node, inputs_nonneg)

    def resolve(self, node):
        if const(node.inputs[1]) is None:
            return self
        dims = static_dims(node.inputs[0])
        if dims is not None and dims[node.attributes.get_int("axis", 0) % len(dims)] is None:
            return self  # constant indices into a dimension of unknown size (dynamic-axes exports)
        return self.base

    data_inputs = (0,)

    def check(self, node):
        if self.resolve(node) is self.base:
            return self.base.check(node)
        if is_param(node.inputs[0]):
            return None
        if static_dims(node.inputs[0]) is None:
            return "rank of the gathered tensor unknown"
        return None

    def transpose(self, em, node, r_outs):
        x, idx = node.inputs[0], node.inputs[1]
        if not carries(x):
            return []
        dims = static_dims(x)
        rank = len(dims)
        ax = node.attributes.get_int("axis", 0) % rank
        x_shape = em.shape_of(x, tag="x_shape")
        index_rank = len(idx.shape) if idx.shape is not None else None
        known = const(idx)
        if known is not None:  # constant indices: wrapped here where the axis is static, else negative for the
            flat = known.astype(np.int64).reshape(-1)  # scatter (ScatterElements takes [-n, n-1]): no run-time shape
            flat = np.where(flat < 0, flat + dims[ax], flat) if dims[ax] is not None else flat
            ind = em.const(flat.reshape([1] * ax + [-1] + [1] * (rank - ax - 1)), tag="idx_r", dtype=np.int64)
        else:
            n = em.scalar(dims[ax], np.int64) if dims[ax] is not None else em.op(
                "Gather", x_shape, em.scalar(ax, np.int64), axis=0, tag="n")
            idx = em.op("Cast", idx, to=ir.DataType.INT64.value, tag="idx64")
            flat = em.op("Reshape", idx, em.ints([-1]), tag="idx_flat")
            neg = em.op("Less", flat, em.scalar(0, np.int64), tag="idx_neg")
            flat = em.op("Where", neg, em.add(flat, n, tag="idx_wrap"), flat, tag="idx_pos")
            ind = em.op("Reshape", flat, em.ints([1] * ax + [-1] + [1] * (rank - ax - 1)), tag="idx_r")
        if index_rank is None:
            head = em.op("Slice", x_shape, em.ints([0]), em.ints([ax]), tag="head")
            tail = em.op("Slice", x_shape, em.ints([ax + 1]), em.ints([rank]), tag="tail")
            r = em.op("Reshape", r_outs[0], em.op("Concat", head, em.ints([-1]), tail, axis=0, tag="r_shape"),
                      tag="r3")
        else:
            r = index_axis_as_one(em, r_outs[0], x, x_shape, ax, index_rank, -1)
        ind = em.op("Expand", ind, em.shape_of(r, tag="r3_shape"), tag="idx_full")
        zeros = em.op("ConstantOfShape", x_shape, value=ir.tensor(np.zeros(1, dtype=em.np_dtype)), tag="zeros")
        return [em.op("ScatterElements", zeros, ind, r, axis=ax, reduction="add", tag="r_in")]


register(Lookup(Gather()))


# ------------------------------------------------------------------------------------------ element-wise
@register
class PowerLike(ActivationOp):
    """Element-wise functions met in normalisation and GELU chains: identity rule (Pass) when they carry relevance
    at all and f(0) = 0; Log, Reciprocal and Pow with an exponent <= 0 have f(0) != 0 (offset-activation)."""

    op_types = ("Pow", "Sqrt", "Reciprocal", "Log")

    def check(self, node):
        return None if node.op_type != "Pow" or const(node.inputs[1]) is not None else "exponent is not a constant"

    def at_zero(self, node):
        if node.op_type == "Log":
            return -np.inf
        if node.op_type == "Reciprocal":
            return np.inf
        if node.op_type == "Pow":
            e = const(node.inputs[1])
            return 0.0 if e is not None and np.all(e > 0) else (1.0 if e is not None and np.all(e == 0) else np.inf)
        return 0.0

    def derivative(self, em, node):
        x, y = node.inputs[0], node.outputs[0]
        if node.op_type == "Log":
            return em.op("Reciprocal", x, tag="dfdx")
        if node.op_type == "Reciprocal":
            return em.op("Neg", em.mul(y, y, tag="y2"), tag="dfdx")
        if node.op_type == "Pow":
            e = np.asarray(const(node.inputs[1]), dtype=em.np_dtype)
            return em.mul(em.op("Pow", x, em.const(e - 1, tag="e_1"), tag="x_e1"), em.const(e, tag="e"), tag="dfdx")
        return em.div(em.scalar(0.5), y, tag="dfdx")  # Sqrt


register(type("Rounding", (ActivationOp,), {
    "op_types": ("Sign", "Floor", "Ceil", "Round"),
    "__doc__": "Piecewise-constant functions with f(0) = 0 (in GELU and mask chains): identity rule (Pass) when they "
               "carry relevance at all."}))


# ------------------------------------------------------------------------------------------ token relevance
_ID_MOVES = ("Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten")


# element-wise maps of token ids (tf2onnx's Embedding: ids < 0 wrapped by where(ids < 0, ids + n, ids), written
# as Less/Not/Cast/Mul/Add; clipping to the table): the same positions, so a lookup at their result is per token
_ID_MAPS = ("Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Where", "Clip", "Min", "Max", "Not", "And", "Or",
            "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal")


def _small_const(v: ir.Value | None) -> bool:
    """An absent optional input or a constant of one element (broadcasting it keeps the ids' shape)."""
    if v is None or v.name == "":
        return True
    return is_param(v) and v.shape is not None and all(isinstance(d, int) for d in v.shape) and \
        int(np.prod(list(v.shape), dtype=np.int64)) == 1


def id_values(graph: ir.Graph, ids: ir.Value) -> set[int]:
    """The values that hold ``ids`` (an integer graph input) position by position: the ids cast, reshaped, or mapped
    element-wise with one-element constants (and the comparisons of those)."""
    derived = {id(ids)}
    for n in graph:
        if n.domain not in ("", "ai.onnx") or not n.inputs or not n.outputs:
            continue
        if n.op_type in _ID_MOVES and n.inputs[0] is not None and id(n.inputs[0]) in derived:
            derived.update(id(o) for o in n.outputs)
        elif n.op_type in _ID_MAPS and any(v is not None and id(v) in derived for v in n.inputs) and \
                all(v is not None and id(v) in derived or _small_const(v) for v in n.inputs) and \
                all(o.dtype is not None and (o.dtype.is_integer() or o.dtype == ir.DataType.BOOL) for o in n.outputs):
            derived.update(id(o) for o in n.outputs)
    return derived


def embedding_lookups(graph: ir.Graph, ids: ir.Value) -> list[ir.Node]:
    """Gather nodes that look ``ids`` (an integer graph input, possibly cast, reshaped or mapped element-wise:
    :func:`id_values`) up in a constant table (axis 0)."""
    derived = id_values(graph, ids)
    return [n for n in graph if n.op_type == "Gather" and n.domain in ("", "ai.onnx") and len(n.inputs) == 2
            and n.inputs[1] is not None and id(n.inputs[1]) in derived and is_param(n.inputs[0])
            and n.attributes.get_int("axis", 0) == 0 and carries(n.outputs[0])]


def token_relevance(em: Emitter, graph: ir.Graph, ids: ir.Value, relevance_of) -> ir.Value | None:
    """Relevance per token id: the relevance at every embedding lookup of ``ids``, summed over the embedding
    dimensions (None when ``ids`` feeds no lookup that received relevance)."""
    parts = []
    for n in embedding_lookups(graph, ids):
        r = relevance_of(n.outputs[0])
        if r is None:
            continue
        out_rank = len(n.outputs[0].shape)
        idx_rank = len(n.inputs[1].shape)
        r = em.op("ReduceSum", r, em.ints(list(range(idx_rank, out_rank))), keepdims=0, tag="per_token")
        if n.inputs[1] is not ids:  # looked up through reshapes: same elements, same order
            r = em.reshape_like(r, ids, tag="per_token_r")
        parts.append(r)
    if not parts:
        return None
    r = em.sum(parts, tag="tokens")
    return em.op("Cast", r, to=em.dtype.value, tag="tokens_f")


__all__ = ["Products", "ElementwiseOfOne", "NormScale", "LayerNorm", "Softmax", "Where", "Tile",
           "Trilu", "Leaf", "Lookup", "PowerLike", "embedding_lookups", "id_values", "token_relevance"]
