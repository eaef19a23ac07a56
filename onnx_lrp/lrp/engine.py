"""The generic LRP step, written once for every linear op and every rule (cf. zennit.core.BasicHook)::

    for each group g of the rule:
        z_g  = sum_k sign_k * f(xmod_k(x); wmod_k(w), bmod_k(b))        # op.forward
        s_g  = coef_g * mask_g * r_out / stab(z_g)
        r_in += sum_k sign_k * xmod_k(x) * J^T(s_g; wmod_k(w))           # op.transpose

Relevance travels in one of two forms (``Rel``): as itself, or in *gradient form* ``R = ref ⊙ g`` (LXT's
efficient mode). Rules that are exact in gradient form (LRP-0 on linear ops, moves, AttnLRP's uniform and softmax
rules) take and give ``g``: ``g_in = J^T g_out`` needs no division and no multiplication by the input, so chains
of them cost one transpose per layer. Any other rule reads ``R`` (one multiply converts).

The rules themselves (``onnx_lrp.rules``) decide what applies to an op and call the steps here: ``linear_rule``
(the engine of every rule given as groups of terms: ``collect``, ``normalise`` by the denominator, ``transposes``),
``linear_grad``, ``move`` / ``move_grad``, ``gradient``, ``gradient_x_input`` and ``pass_grad``. This module does
not import the rules.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core.emitter import Emitter
from ..core.graph import static_dims
from .ops import LinearOp, Params
from .ops.base import Rel, stabilized


class Layer:
    """A node as the rewriter sees it: its relevance inputs ``xs``, its output ``z`` (after a folded bias Add)."""

    def __init__(self, node: ir.Node, op, xs: list[ir.Value], z: ir.Value, nonneg: list[bool]):
        self.node, self.op, self.xs, self.z, self.nonneg = node, op, xs, z, nonneg
        self.relu_out: ir.Value | None = None  # set when z feeds only a Relu whose relevance vanishes at zeros
        self.zero_at_zero = False  # the relevance of z is known to be zero wherever z is
        # inputs whose relevance a linear rule may give in gradient form, Rel(J^T s, x): x feeds several layers, whose
        # parts are then summed before one multiply by x (the rewriter sets it where a step that reads relevance,
        # not its gradient form, converts the sum)
        self.grad_out: frozenset = frozenset()
        self.keep_ref = False  # an activation under Pass: its input's relevance is converted below (the rewriter)
        self._mods: dict = {}

    def x_mod(self, em: Emitter, i: int, how: str, value=None) -> ir.Value | None:
        """The modified input (None means 'ones', handled by the caller)."""
        x = self.xs[i]
        if how == "identity" or (how == "positive" and self.nonneg[i]):
            return x
        key = (i, how, id(value))
        if key not in self._mods:
            if how == "positive":
                self._mods[key] = em.positive(x, tag=f"x{i}+")
            elif how == "negative":
                self._mods[key] = em.negative(x, tag=f"x{i}-")
            elif how == "abs":
                self._mods[key] = em.op("Abs", x, tag=f"x{i}_abs")
            elif how == "ones":
                dims = static_dims(x)
                if dims is not None and all(d is not None for d in dims[1:]):
                    self._mods[key] = em.const(np.ones([1] + dims[1:]), tag=f"x{i}_ones")
                else:
                    self._mods[key] = em.op("ConstantOfShape", em.shape_of(x), value=ir.tensor(
                        np.ones(1, dtype=em.np_dtype)), tag=f"x{i}_ones")
            elif how == "constant":
                dims = static_dims(x)
                arr = np.asarray(value, dtype=em.np_dtype)
                if dims is None:
                    raise ValueError(f"node {self.node.name}: a constant-input rule needs the input's rank")
                dynamic = any(d is None for d in dims[1:])  # e.g. a dynamic time axis: expanded at run time
                target = tuple(1 if d is None else d for d in dims[1:])
                if arr.ndim == len(dims):
                    if arr.shape[0] != 1:
                        raise ValueError(f"node {self.node.name}: bounds have a batch dimension of {arr.shape[0]};"
                                         " give them per sample (shape of one input)")
                    arr = arr[0]
                try:
                    arr = np.broadcast_to(arr, target)
                except ValueError:
                    raise ValueError(f"node {self.node.name}: bounds of shape {np.shape(value)} do not broadcast to "
                                     f"the input shape {target}") from None
                self._mods[key] = em.const(arr[None], tag=f"x{i}_bound")
                if dynamic:
                    self._mods[key] = em.op("Expand", self._mods[key], em.shape_of(x), tag=f"x{i}_bound_full")
            else:
                raise ValueError(f"unknown input modifier {how!r}")
        return self._mods[key]


def _definite_sign(arr) -> int:
    """+1 if every entry is >= 0 (or there is nothing), -1 if every entry is <= 0, 0 if mixed."""
    if arr is None:
        return 1
    a = np.asarray(arr)
    if a.size == 0 or not any_negative(a):
        return 1
    return -1 if all_chunks(a, lambda part: not np.any(part > 0)) else 0


def any_negative(arr: np.ndarray) -> bool:
    """Whether any entry is < 0 (read in chunks: no temporary the size of a large weight)."""
    return not all_chunks(arr, lambda a: not np.any(a < 0))


def all_chunks(arr: np.ndarray, test, chunk: int = 1 << 22) -> bool:
    """``test(part)`` for every part of the flattened ``arr`` (a large weight is never copied whole)."""
    flat = np.asarray(arr).reshape(-1)
    return all(bool(test(flat[i:i + chunk])) for i in range(0, flat.size, chunk))


class _Basis:
    """Weights of one layer as combinations ``a W + c W+``: terms that share an input then share their convolutions
    (``f(x; W + g W+) = f(x; W) + g f(x; W+)``, and ``f(x; W)`` is the forward output minus its bias)."""

    def __init__(self, w: np.ndarray | None):
        self.w = w
        self._w_pos = None
        self.mixed = w is not None and any_negative(w)

    @property
    def w_pos(self) -> np.ndarray | None:
        """W+, made when a rule needs it (a large model's epsilon layers never hold a copy of their weights)."""
        if self._w_pos is None and self.w is not None:
            self._w_pos = np.clip(self.w, 0, None)
        return self._w_pos

    def decompose(self, fn, wm) -> dict | None:
        """{basis name: coefficient} with ``wm = sum coef * basis``, or None if wm is no such combination."""
        if self.w is None:
            return {"W": 1.0}
        if fn.name == "identity":
            return {"W": 1.0}
        if not self.mixed:
            ratio = _ratio(wm, self.w)
            return None if ratio is None else {"W": ratio}
        if fn.name == "positive":
            return {"W+": 1.0}
        if fn.name == "negative":
            # its own basis, not W - W+: transposing W and W+ apart and subtracting cancels catastrophically
            # when a denominator is ~eps (s ~ R / eps); its forward is still shared (see linear_rule)
            return {"W-": 1.0}
        a, b = self.w.ravel().astype(np.float64), self.w_pos.ravel().astype(np.float64)
        m = wm.ravel().astype(np.float64)
        gram = np.array([[a @ a, a @ b], [a @ b, b @ b]])
        try:
            ca, cb = np.linalg.solve(gram, np.array([m @ a, m @ b]))
        except np.linalg.LinAlgError:
            return None
        if not np.allclose(m, ca * a + cb * b, rtol=1e-6, atol=1e-7 * float(np.abs(a).max())):
            return None
        # least squares leaves ~1e-15 noise: snap to 10 significant digits so that 1.0 stays a free multiply
        return {k: float(f"{v:.10g}") for k, v in (("W", ca), ("W+", cb)) if abs(v) > 1e-12}

    def params(self, name) -> Params:
        if name == "W-":
            return Params(np.clip(self.w, None, 0), None, key=name)
        if name == "|W|":
            return Params(np.abs(self.w), None, key=name)
        return Params(self.w if name == "W" else self.w_pos, None, key=name)


# x+ = (x + |x|) / 2, x- = (x - |x|) / 2, and the same for W: parts in the basis {x, |x|} x {W, |W|}
_X_SYM = {"identity": {"identity": 1.0}, "positive": {"identity": 0.5, "abs": 0.5},
          "negative": {"identity": 0.5, "abs": -0.5}}
_W_SYM = {"W": {"W": 1.0}, "W+": {"W": 0.5, "|W|": 0.5}, "W-": {"W": 0.5, "|W|": -0.5}}
_SAFE = 0.5  # the least |sum| / sum|parts| of a weight's coefficient over the four sign patterns of (x, w)


def _symmetric(combo: dict, x_of: dict) -> dict | None:
    """A group's terms on an input of both signs rewritten in {x, |x|} x {W, |W|}: zennit's gamma then needs
    f(x; W) (the forward) and f(|x|; |W|) instead of four convolutions with x+, x-, W+, W- (and two transposes
    instead of four). None when a term is not of that kind, or when for some sign pattern the coefficient of an
    input-weight product is a near-cancelling difference (z+: x+ W+ + x- W- is 0 for x > 0 > w as 1/2 - 1/2, which
    float32 cannot keep when the denominator is ~eps)."""
    out: dict = {}
    for (xkey, bkey), c in combo.items():
        how = x_of[xkey][0]
        if how not in _X_SYM or bkey not in _W_SYM:
            return None
        for xh, cx in _X_SYM[how].items():
            for wh, cw in _W_SYM[bkey].items():
                key = ((xh, id(None)), wh)
                out[key] = out.get(key, 0.0) + c * cx * cw
    out = {k: c for k, c in out.items() if abs(c) > 1e-8}  # the decompositions are exact to ~1e-10
    parts = sum(abs(c) for c in out.values())
    for sx in (1, -1):
        for sw in (1, -1):
            value = sum(c * (sx if k[0][0] == "identity" else 1) * (sw if k[1] == "W" else 1) for k, c in out.items())
            if abs(value) < _SAFE * parts:
                return None
    return out


def _ratio(wm, w):
    scale = float(np.abs(w).max()) if w.size else 0.0
    if scale == 0:
        return None
    idx = int(np.argmax(np.abs(w)))
    r = float(wm.ravel()[idx] / w.ravel()[idx])
    return r if np.allclose(wm, r * w, rtol=1e-6, atol=1e-7 * scale) else None


def _channel_scale(value, dims) -> np.ndarray | None:
    """The per-channel values of a constant input (one per channel of an N x C x spatial... input), or None when it
    varies along another axis or the input's shape is not known."""
    if dims is None or len(dims) < 3 or any(d is None for d in dims[1:]):
        return None
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == len(dims):
        if arr.shape[0] != 1:
            return None
        arr = arr[0]
    try:
        arr = np.broadcast_to(arr, tuple(dims[1:]))
    except ValueError:
        return None
    flat = arr.reshape(arr.shape[0], -1)
    return flat[:, 0].copy() if np.all(flat == flat[:, :1]) else None


def _same_bias(bias, b_orig) -> bool:
    """Whether a group's bias is the layer's own (its z_g is z itself); None and all-zero are no bias."""
    if bias is None or not np.any(bias):
        return b_orig is None
    return b_orig is not None and np.array_equal(np.asarray(bias, np.float64), np.asarray(b_orig, np.float64))


def _weighted_sum(em: Emitter, items: dict, tag: str) -> ir.Value:
    """sum coef * value over {key: (coef, value)} with scalar multiplies only where needed."""
    parts = [em.scale(v, c, tag=f"{tag}_part") for c, v in items.values() if c != 0]
    return em.sum(parts, tag=tag)


def _beyond(group, w, b, nonneg: bool) -> set:
    """The signs that z_g - z can take, proven term by term ({1}: z_g >= z everywhere, {-1}: z_g <= z, set(): equal;
    {0} when not provable): the group must cover x once (x itself, or x+ and x-), every term with sign +1 and a
    weight (and bias) modification of definite sign, e.g. gamma's W + g W+ on x+ and W + g W- on x-."""
    if w is None:
        return {0}
    signs: set = set()
    seen = []
    b_sum = None
    for term in group.terms:
        if term.x == "negative" and nonneg:
            continue
        how = "identity" if term.x == "positive" and nonneg else term.x
        if term.sign != 1.0 or how not in ("identity", "positive", "negative"):
            return {0}
        seen.append(how)
        d = term.w(w) - w
        if np.any(d):
            ds = _definite_sign(d)
            if ds == 0 or (how == "identity" and not nonneg):
                return {0}
            signs.add(-ds if how == "negative" else ds)
        if term.b is not None and b is not None:
            b_sum = term.b(b) if b_sum is None else b_sum + term.b(b)
    if sorted(seen) not in (["identity"], ["negative", "positive"]):
        return {0}
    db = (b_sum if b_sum is not None else 0.0) - (b if b is not None else 0.0)
    if np.any(db):
        ds = _definite_sign(db)
        if ds == 0:
            return {0}
        signs.add(ds)
    return signs


class _LinearStep:
    """One linear rule on one layer: terms collected per group into shared forwards (``collect``), each group's
    denominator and normalised relevance (``normalise``), then one transpose per (input modifier, weight basis)
    (``transposes``). Terms are grouped by (input modifier, basis) so that convolutions are shared."""

    def __init__(self, em: Emitter, layer: Layer, rule, rel: Rel):
        self.em, self.layer, self.rule = em, layer, rule
        self.rel, self._r_plain = rel, None  # the relevance of z (in gradient form where the rewriter gave it so)
        self.op: LinearOp = layer.op
        self.node = layer.node
        self.p0 = self.op.params(self.node)
        self.eps = rule.eps()
        self.basis = _Basis(self.p0.w)
        self.b_orig = self.p0.b if self.p0.b is not None and np.any(self.p0.b) else None
        self.forwards: dict = {}  # (x key, basis key) -> f(x_mod; basis), without bias
        self.x_of: dict = {}      # x key -> (how, value)
        self.weights: dict = {}   # basis key -> Params
        self.exact_w: dict = {}   # group index -> {x key: the group's own weights on that input (its terms' sum)}
        self.masked: dict = {}    # mask -> r_out * [z > 0] / [z < 0], emitted once
        self.rests: list = []     # fused remainders (w, b, value) of masked denominators, shared up to a factor
        self.first_raw = None     # (Q, c, c z + Q) of the first masked group whose Q >= eps: the second reads it

    def forward(self, xkey, bkey) -> ir.Value:
        em, layer, op, node = self.em, self.layer, self.op, self.node
        forwards, weights = self.forwards, self.weights
        if (xkey, bkey) not in forwards and bkey == "W-" and xkey == ("identity", id(None)):
            # f(x; W-) = f(x; W) - f(x; W+), f(x; W) = z - b: one convolution fewer (benign in the forward)
            zf = layer.z if self.b_orig is None else em.sub(
                layer.z, op.bias_const(em, node, self.b_orig, tag="b_orig"), tag="z_nobias")
            weights.setdefault("W+", self.basis.params("W+"))
            forwards[(xkey, bkey)] = em.sub(zf, self.forward(xkey, "W+"), tag="z_neg")
        if (xkey, bkey) not in forwards:
            how, value = self.x_of[xkey]
            xs = [layer.x_mod(em, i, how, value) for i in range(len(layer.xs))]
            forwards[(xkey, bkey)] = op.forward(em, node, xs, weights[bkey])
        return forwards[(xkey, bkey)]

    def collect(self, gi: int, group) -> tuple[dict, object, int]:
        """(combo, bias, sign) of a group: {(x key, basis key): coefficient in z_g}, its summed modified bias, and
        whether z_g is provably positive (1) or not (0)."""
        layer, p0, basis = self.layer, self.p0, self.basis
        combo: dict = {}
        exact_w = self.exact_w.setdefault(gi, {})
        bias = None
        sign = 1
        for k, term in enumerate(group.terms):
            if term.x == "negative" and all(layer.nonneg):
                continue  # x- = 0 after a Relu: the term vanishes
            wm = term.w(p0.w) if p0.w is not None else None
            bm = term.b(p0.b) if (term.b is not None and p0.b is not None) else None
            if wm is not None and not np.any(wm) and (bm is None or not np.any(bm)):
                continue
            how = "identity" if term.x == "positive" and all(layer.nonneg) else term.x
            xkey = (how, id(term.x_value))
            self.x_of[xkey] = (how, term.x_value)
            if wm is not None:
                signed = wm if term.sign == 1.0 else wm * wm.dtype.type(term.sign)
                exact_w[xkey] = signed if xkey not in exact_w else exact_w[xkey] + signed
            parts = basis.decompose(term.w, wm) if wm is not None or p0.w is None else None
            if parts is None:  # not a combination of W and W+: its own weights
                bkey = ("own", gi, k)
                self.weights[bkey] = Params(wm.astype(p0.w.dtype), None, key=(term.w, term.tag))
                parts = {bkey: 1.0}
            else:
                for name in parts:
                    self.weights.setdefault(name, basis.params(name))
            for bkey, c in parts.items():
                combo[(xkey, bkey)] = combo.get((xkey, bkey), 0.0) + term.sign * c
            if bm is not None and np.any(bm):
                bias = term.sign * bm if bias is None else bias + term.sign * bm
            x_sign = {"identity": 1 if all(layer.nonneg) else 0, "positive": 1, "negative": -1, "ones": 1,
                      "constant": _definite_sign(term.x_value)}[how]
            t_sign = term.sign * x_sign * _definite_sign(wm) if wm is not None else term.sign * x_sign
            b_sign = term.sign * _definite_sign(bm)
            if t_sign <= 0 or b_sign <= 0:
                sign = 0
        combo = {k: c for k, c in combo.items() if c != 0}
        if combo and basis.mixed and len(layer.xs) == 1 and not layer.nonneg[0]:
            sym = _symmetric(combo, self.x_of)
            if sym is not None and len(sym) < len(combo):
                combo = sym
                exact_w.clear()
                self.x_of[("identity", id(None))] = ("identity", None)
                self.x_of[("abs", id(None))] = ("abs", None)
                for _, bkey in combo:
                    self.weights.setdefault(bkey, basis.params(bkey))
        return combo, bias, sign

    def r_plain(self) -> ir.Value:
        """The relevance of z as a tensor: ``rel`` multiplied out once, where a group needs it."""
        if self._r_plain is None:
            self._r_plain = self.rel.as_relevance(self.em, tag="r_out")
        return self._r_plain

    def _of_z(self) -> bool:
        """Whether the relevance arrived in gradient form relative to z itself, R = z * g."""
        return self.rel.ref is not None and self.rel.ref is self.layer.z

    def normalise(self, gtag: str, group, combo: dict, bias, sign: int) -> tuple[ir.Value, float]:
        """(s_g, k): s_g = coef-free r_out * mask_g / (k stab(z_g)), k the factor the denominator was divided by
        (1 but where ``_masked_denominator`` folds z's coefficient out), which the transposes' weights take. z_g
        from the shared forwards (f(x; W) for the unmodified input is the forward output minus its bias). Where z
        feeds only a Relu (``relu_out``) the relevance is zero wherever z <= 0, so a mask z > 0 needs no emitting
        (``linear_rule`` drops groups masked to z < 0)."""
        em, layer, node, eps = self.em, self.layer, self.node, self.eps
        mask = None if layer.relu_out is not None and group.mask == "positive" else group.mask
        stab, k = None, 1.0
        if group.mask is not None and eps and node.op_type == "Conv" and len(layer.xs) == 1 and \
                _beyond(group, self.p0.w, self.p0.b, all(layer.nonneg)) <= {1 if group.mask == "positive" else -1}:
            # z_g - z has the mask's sign: where the mask keeps, stab(z_g) = z_g +- eps, from z and one convolution
            stab, k = self._masked_denominator(gtag, combo, bias, eps if group.mask == "positive" else -eps,
                                               unmasked=mask is None)
        if stab is None and mask is None and self._of_z() and eps and sign == 0 and layer.relu_out is None and \
                combo == {(("identity", id(None)), "W"): 1.0} and _same_bias(bias, self.b_orig):
            # R = z * g and z_g = z: s = z g / (z + eps sign(z)) = g |z| / (|z| + eps), zennit's stabiliser of either
            # sign without its passes (for z = 0 both are 0)
            mag = em.op("Abs", layer.z, tag=f"{gtag}_abs")
            ratio = em.div(mag, em.add(mag, em.scalar(eps), tag=f"{gtag}_stab"), tag=f"{gtag}_ratio")
            return em.mul(self.rel.value, ratio, tag=f"{gtag}_s"), k
        if stab is None:
            stab, k = self._denominator(gtag, combo, bias, sign), 1.0
        return em.div(self._masked_r(mask) if mask is not None else self.r_plain(), stab, tag=f"{gtag}_s"), k

    def _masked_r(self, mask: str) -> ir.Value:
        """r_out * [z > 0] (or [z < 0]), once per layer; exact where every denominator is finite and non-zero."""
        em, layer = self.em, self.layer
        if mask not in self.masked:
            other = "negative" if mask == "positive" else "positive"
            if self._of_z():  # R = z * g: R [z > 0] = max(z, 0) g, R [z < 0] = min(z, 0) g (equal where z = 0: 0)
                part = (em.positive_part if mask == "positive" else em.negative)(layer.z, tag=f"z_{mask[:3]}")
                self.masked[mask] = em.mul(part, self.rel.value, tag=f"r_{mask[:3]}")
            elif other in self.masked and layer.zero_at_zero:  # r_out = 0 where z = 0: the complement by one Sub
                self.masked[mask] = em.sub(self.r_plain(), self.masked[other], tag=f"r_{mask[:3]}")
            else:
                # [z > 0] as clip(z * 2^126, 0, 1): 1 for every positive normal float, 0 for z <= 0 (a positive
                # denormal, |z| < 1.2e-38, would get a fraction); two light passes and a multiply instead of a
                # comparison and a Cast (slow in onnxruntime) or a Where (about 8x a Mul there)
                gain = em.scalar(2.0 ** 126 if mask == "positive" else -2.0 ** 126)
                keep = em.op("Clip", em.mul(layer.z, gain, tag=f"{mask[:3]}_gain"), em.scalar(0.0),
                             em.scalar(1.0), tag=f"{mask[:3]}_mask")
                self.masked[mask] = em.mul(self.r_plain(), keep, tag=f"r_{mask[:3]}")
        return self.masked[mask]

    def _masked_denominator(self, gtag: str, combo: dict, bias, eps_signed: float, unmasked: bool):
        """stab(z_g) of a masked group whose z_g - z has the mask's sign: z_g + eps (mask z > 0) or z_g - eps (z < 0).

        Written as c z + Q, Q = f(x'; W_rest, b_rest + eps) one convolution (shared, up to a factor, with the other
        group: gamma's two groups are z + Q and (1 + g) z - Q), clipped to [eps, inf) or (-inf, -eps] so that it is
        non-zero where the mask drops (where it keeps, the clip does nothing: z_g has the sign of z there). Returns
        (stab, k): where z feeds only a rectifier (one group) and c != 1 (gamma on an input of either sign: c = 1 +
        gamma / 2), the denominator is written c (z + Q / c): Q / c is the convolution with its weights and bias
        divided by c, z + Q / c its one consumer, which onnxruntime fuses into it, and k = c goes to the transposes'
        weights (a multiply and an add fewer per such layer). (None, 1) when the remainder reads more than one
        modified input."""
        em, layer, weights = self.em, self.layer, self.weights
        ident = (("identity", id(None)), "W")
        c_id = combo.get(ident, 0.0)
        rest = {k: c for k, c in combo.items() if k != ident}
        if len({xk for xk, _ in rest}) != 1:
            return None, 1.0
        w_rest, xkey = None, None
        for (xk, bkey), c in rest.items():
            part = weights[bkey].w if c == 1.0 else weights[bkey].w * weights[bkey].w.dtype.type(c)
            w_rest, xkey = (part if w_rest is None else w_rest + part), xk
        dtype = np.dtype(em.np_dtype)
        b_rest = np.zeros(w_rest.shape[0], dtype=dtype) if bias is None else np.asarray(bias, dtype=dtype)
        if self.b_orig is not None and c_id:
            b_rest = b_rest - dtype.type(c_id) * self.b_orig.astype(dtype)
        b_rest = b_rest + dtype.type(eps_signed)
        q, factor = None, 1.0
        for w_prev, b_prev, v_prev in self.rests:
            r = _ratio(w_rest, w_prev)
            if r is not None and np.allclose(b_rest, r * b_prev, rtol=1e-6, atol=1e-7 * float(np.abs(b_prev).max())):
                q, factor = v_prev, r
                break
        how, value = self.x_of[xkey]
        big = float(np.finfo(dtype).max)
        if q is None and unmasked and eps_signed > 0 and c_id > 0 and c_id != 1.0:
            w_rest, b_rest = w_rest / dtype.type(c_id), b_rest / dtype.type(c_id)
            q = self.op.forward(em, self.node, [layer.x_mod(em, 0, how, value)],
                                Params(w_rest, b_rest, key=("rest", gtag)))
            self.rests.append((w_rest, b_rest, q))
            raw = em.add(layer.z, q, tag=f"{gtag}_z")
            return em.op("Clip", raw, em.scalar(abs(eps_signed) / c_id), em.scalar(big), tag=f"{gtag}_stab"), c_id
        if q is None:
            q = self.op.forward(em, self.node, [layer.x_mod(em, 0, how, value)],
                                Params(w_rest, b_rest, key=("rest", gtag)))
            self.rests.append((w_rest, b_rest, q))
        nonneg_q = factor == 1.0 and bool(np.all(w_rest >= 0)) and bool(np.all(b_rest > 0)) and (
            how in ("positive", "abs") or (how == "identity" and all(layer.nonneg)))
        if unmasked and c_id == 1.0 and nonneg_q and layer.relu_out is not layer.z:
            return em.add(layer.relu_out, q, tag=f"{gtag}_stab"), 1.0  # relu(z) + Q: Q >= eps, z_g + eps where z > 0
        first = self.first_raw
        if first is not None and first[0] is q and factor == -1.0 and eps_signed < 0 and c_id >= 1.0:
            # gamma's second group (1 + g) z - Q as (2 + g) z - (z + Q) from the first group's sum: Q then feeds one Add,
            # which onnxruntime fuses into Q's convolution (one pass fewer). Exact to a few roundings where the mask
            # keeps (z < 0, Q >= eps: |(2 + g) z| + |z + Q| <= 3 |(1 + g) z - Q|, no cancellation)
            raw = em.sub(em.scale(layer.z, c_id + first[1], tag=f"{gtag}_zc"), first[2], tag=f"{gtag}_z")
            return em.op("Clip", raw, em.scalar(-big), em.scalar(eps_signed), tag=f"{gtag}_stab"), 1.0
        zc = em.scale(layer.z, c_id, tag=f"{gtag}_zc") if c_id else None
        if zc is not None and abs(factor) == 1.0:
            raw = (em.add if factor == 1.0 else em.sub)(zc, q, tag=f"{gtag}_z")
            if factor == 1.0 and c_id == 1.0 and nonneg_q and eps_signed > 0 and self.first_raw is None:
                self.first_raw = (q, c_id, raw)
        else:
            raw = _weighted_sum(em, {"q": (factor, q)} | ({"z": (1.0, zc)} if zc is not None else {}), tag=f"{gtag}_z")
        lo, hi = (abs(eps_signed), big) if eps_signed > 0 else (-big, eps_signed)
        return em.op("Clip", raw, em.scalar(lo), em.scalar(hi), tag=f"{gtag}_stab"), 1.0

    def _denominator(self, gtag: str, combo: dict, bias, sign: int) -> ir.Value:
        """stab(z_g) for any group (zennit's stabiliser, with the shortcuts its sign allows)."""
        em, layer, op, node, eps = self.em, self.layer, self.op, self.node, self.eps
        ident = (("identity", id(None)), "W")
        # z_g = sum of f(x'; W') (+ b') with a positive sign (z+: x+ W+ and x- W-): b' + eps ride on the first
        # convolution as its bias (two passes fewer; zennit's conv(x', W', b') + eps rounds once more, ~1e-7 relative)
        fold_eps = bool(eps) and sign > 0 and node.op_type == "Conv" and bool(combo) and ident not in combo \
            and all(c == 1.0 for c in combo.values()) and len(self.rule.groups()) == 1
        items = {}
        for n, (key, c) in enumerate(combo.items()):
            if fold_eps and n == 0:
                how, value = self.x_of[key[0]]
                pw = self.weights[key[1]]
                b_eps = np.full(pw.w.shape[0], eps, dtype=pw.w.dtype)
                if bias is not None:
                    b_eps = b_eps + np.asarray(bias, dtype=pw.w.dtype)
                items[key] = (c, op.forward(em, node, [layer.x_mod(em, i, how, value) for i in range(len(layer.xs))],
                                            Params(pw.w, b_eps, key=(pw.key, "eps", gtag))))
                bias = None
            elif key == ident:
                items[key] = (c, layer.z)
                shift = -c * self.b_orig if self.b_orig is not None else None
                if shift is not None:
                    bias = shift if bias is None else bias + shift
            else:
                items[key] = (c, self.forward(*key))
        if bias is not None and not np.any(bias):
            bias = None  # e.g. epsilon's own bias, already in z: z_g is z itself
        z = _weighted_sum(em, items, tag=f"{gtag}_z") if items else None
        if bias is not None:
            bconst = op.bias_const(em, node, bias, tag=f"{gtag}_b")
            z = em.add(z, bconst, tag=f"{gtag}_zb") if z is not None else bconst
        if len(items) == 1 and ident in items and items[ident][0] == 1.0 and bias is None \
                and layer.relu_out is not None and eps:
            # z feeds only a Relu and the relevance is zero where relu(z) is: stab(z) = relu(z) + eps there
            if layer.relu_out is not layer.z:
                return em.add(layer.relu_out, em.scalar(eps), tag=f"{gtag}_stab")
            return em.relu_plus(layer.z, eps, tag=f"{gtag}_stab")  # a Clip(0, max) follows: from z itself
        if sign > 0 and eps:
            return z if fold_eps else em.add(z, em.scalar(eps), tag=f"{gtag}_stab")
        return stabilized(em, z, eps, tag=f"{gtag}_stab")

    def transposes(self, groups_s: list) -> list[ir.Value]:
        """The relevance of each input: J^T is linear in the weight, so one transpose per group and input modifier
        with the group's own weights (as zennit's modified layer) where the groups are no more than the weight
        bases, else one per basis applied to the combined normalised relevance; times the modified input."""
        em, layer, op, node, weights = self.em, self.layer, self.op, self.node, self.weights
        per_x: dict = {}
        for s, coef, combo, gi in groups_s:
            for (xkey, bkey), c in combo.items():
                per_x.setdefault(xkey, {}).setdefault(gi, (s, coef, {}))[2][bkey] = c
        contributions: list[list[ir.Value]] = [[] for _ in layer.xs]
        for gi, (s, w) in self._fold_constant_inputs(per_x).items():
            contributions[0].append(op.transpose(em, node, s, Params(w, None, key=("folded", gi)))[0])
        for xkey, by_group in per_x.items():
            how, value = self.x_of[xkey]
            grads_sum: list[list[ir.Value]] = [[] for _ in layer.xs]
            bases = {b for _, _, bc in by_group.values() for b in bc}
            if len(by_group) <= len(bases) and all(weights[b].w is not None for b in bases):
                for gi, (s, coef, bc) in by_group.items():
                    pw = self._group_weights(bc, coef, self.exact_w.get(gi, {}).get(xkey), key=("group", gi, xkey))
                    for i, g in enumerate(op.transpose(em, node, s, pw)):
                        grads_sum[i].append(g)
            else:
                by_basis: dict = {}
                for s, coef, bc in by_group.values():
                    for bkey, c in bc.items():
                        by_basis.setdefault(bkey, []).append((coef * c, s))
                for bkey, uses in by_basis.items():
                    t = em.sum([em.scale(s, c, tag="t_part") for c, s in uses], tag="t")
                    for i, g in enumerate(op.transpose(em, node, t, weights[bkey])):
                        grads_sum[i].append(g)
            for i, gs in enumerate(grads_sum):
                g = em.sum(gs, tag=f"JTt{i}")
                if how == "ones":
                    contributions[i].append(g)
                elif how == "identity" and i in layer.grad_out:
                    contributions[i].append(Rel(g, layer.xs[i]))  # x J^T s, multiplied once x's parts are summed
                else:
                    contributions[i].append(em.mul(layer.x_mod(em, i, how, value), g, tag=f"r{i}"))
        out = []
        for i, parts in enumerate(contributions):
            if len(parts) == 1 and isinstance(parts[0], Rel):
                out.append(parts[0])
                continue
            parts = [p.as_relevance(em, tag=f"r{i}") if isinstance(p, Rel) else p for p in parts]
            out.append(em.sum(parts, tag=f"r_in{i}") if parts else em.zeros_like(layer.xs[i], tag=f"r_in{i}_zero"))
        return out

    def _fold_constant_inputs(self, per_x: dict) -> dict:
        """Constant modified inputs of a convolution that vary only along the channels (zbox's bounds l and h, scalar
        or per channel): c * J^T(s; W') = J^T(s; W' scaled per input channel by c), so every such input of a group
        folds into ONE transpose with the summed scaled weights and no multiply (zbox: 2 transposes instead of 3).
        Removes the folded inputs from ``per_x``; returns {group: (s, summed weights)}."""
        node, layer = self.node, self.layer
        if node.op_type != "Conv" or len(layer.xs) != 1 or node.attributes.get_int("group", 1) != 1:
            return {}
        folded: dict = {}
        for xkey in list(per_x):
            how, value = self.x_of[xkey]
            scale = _channel_scale(value, static_dims(layer.xs[0])) if how == "constant" else None
            by_group = per_x[xkey]
            if scale is None or any(self.weights[b].w is None for _, _, bc in by_group.values() for b in bc) or \
                    len(by_group) > len({b for _, _, bc in by_group.values() for b in bc}):
                continue
            for gi, (s, coef, bc) in by_group.items():
                w = self._group_weights(bc, coef, self.exact_w.get(gi, {}).get(xkey), key=None).w
                w = w * scale.astype(w.dtype).reshape((1, -1) + (1,) * (w.ndim - 2))
                folded[gi] = (s, w if gi not in folded else folded[gi][1] + w)
            del per_x[xkey]
        return folded

    def _group_weights(self, bc: dict, coef: float, w_exact, key) -> Params:
        """The weights one group applies to one input: its terms' own modified weights where known (zennit's), else
        the combination of the bases (W- stays a basis of its own: transposing W and W+ apart and subtracting would
        cancel); the group's coefficient folded in."""
        if len(bc) == 1 and coef == 1.0 and list(bc.values()) == [1.0]:
            return self.weights[next(iter(bc))]  # a basis as it is: its constant is shared with the forward's
        if w_exact is None:
            for b, c in bc.items():
                part = self.weights[b].w if c == 1.0 else self.weights[b].w * self.weights[b].w.dtype.type(c)
                w_exact = part if w_exact is None else w_exact + part
        if coef != 1.0:
            w_exact = w_exact * w_exact.dtype.type(coef)
        return Params(w_exact, None, key=key)


def linear_rule(em: Emitter, layer: Layer, rule, r_out: "ir.Value | Rel") -> list:
    """The generic step of a linear rule (``rule.groups()``): per group collect its terms, normalise the relevance
    by the group's denominator; then the transposes. ``r_out`` may come in gradient form (a ``Rel``): relative to z
    itself, masks and epsilon's stabiliser of either sign use it (fewer passes); else it is multiplied out once."""
    step = _LinearStep(em, layer, rule, r_out if isinstance(r_out, Rel) else Rel(r_out))
    groups_s = []  # per group: (s_g, coef_g, {(x key, basis key): coef}, group index)
    for gi, group in enumerate(rule.groups()):
        if layer.relu_out is not None and group.mask == "negative":
            continue  # kept only where z < 0, where the relevance is zero already (z feeds only a Relu): s_g = 0
        combo, bias, sign = step.collect(gi, group)
        if not combo and bias is None:
            continue
        s, k = step.normalise(group.tag or f"g{gi}", group, combo, bias, sign)
        groups_s.append((s, group.coef / k, combo, gi))
    return step.transposes(groups_s)


# ------------------------------------------------------------------------------------------ steps the rules call
def move(em: Emitter, layer: Layer, r_outs: list) -> list:
    """Moves (reshapes, slices, ...): the op's transpose of the relevance."""
    return layer.op.transpose(em, layer.node, r_outs)


def move_grad(em: Emitter, layer: Layer, r_outs: list) -> list:
    """A move, or the Gradient rule on a max pool, in gradient form: the same transpose of ``g`` when every output's
    relevance is in gradient form relative to that output, else of the relevance itself."""
    op, node = layer.op, layer.node
    grad = all(r is None or r.ref is o for r, o in zip(r_outs, node.outputs))
    vals = [None if r is None else (r.value if grad else r.as_relevance(em, tag="r_out")) for r in r_outs]
    ins = op.transpose(em, node, vals) if op.category == "move" else op.transpose(em, node, vals[0], op.params(node))
    return [None if v is None else Rel(v, x if grad else None) for v, x in zip(ins, layer.xs)]


def gradient(em: Emitter, layer: Layer, r_out: ir.Value) -> list:
    """R_in = J^T R_out: the op's transpose (linear ops) or f'(x) R_out (element-wise functions)."""
    op = layer.op
    if op.category == "linear":
        return op.transpose(em, layer.node, r_out, op.params(layer.node))
    return [em.mul(r_out, op.derivative(em, layer.node), tag="r_in")]


def gradient_x_input(em: Emitter, layer: Layer, r_out: ir.Value) -> list:
    """R_x = x f'(x) R_y / f(x)."""
    g = Rel(r_out).normalised(em, layer.node.outputs[0], tag="g_out")
    return [em.mul(layer.xs[0], em.mul(g, layer.op.derivative(em, layer.node), tag="g_in"), tag="r_in")]


def gradient_x_input_grad(em: Emitter, layer: Layer, r_outs: list) -> list:
    """g_x = f'(x) g_y (g_y = R_y / y)."""
    node = layer.node
    g = r_outs[0].normalised(em, node.outputs[0], tag="g_out")
    return [Rel(em.mul(g, layer.op.derivative(em, node), tag="g_in"), node.inputs[0])]


def pass_grad(em: Emitter, layer: Layer, r_outs: list) -> list:
    """R_x = R_y through an element-wise function, in gradient form where the op gives one."""
    op, node = layer.op, layer.node
    r = r_outs[0]
    if r.ref is not None and layer.keep_ref:
        return [r]  # R_x = R_y = ref * g as it is: the step below multiplies it out (as it would R_y)
    got = op.pass_grad(em, node, r.value) if r.ref is node.outputs[0] else None
    return [Rel(*got) if got is not None else Rel(r.as_relevance(em, tag="r_in"))]


def linear_grad(em: Emitter, layer: Layer, r_outs: list) -> list:
    """LRP-0 on a linear op in gradient form: g_x = J^T (R / z)."""
    op, node = layer.op, layer.node
    s = r_outs[0].normalised(em, layer.z)
    return [Rel(g, x) for g, x in zip(op.transpose(em, node, s, op.params(node)), layer.xs)]
