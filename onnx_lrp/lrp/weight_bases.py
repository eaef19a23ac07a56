"""The weights of one layer as combinations of bases (W, W+, W-, |W|) and the signs of modified weights, inputs and
groups, read from the numbers: what lets the terms of a rule share forwards and transposes in the generic linear
step (``onnx_lrp.lrp.linear_step``). Large weights are read in chunks, never copied whole."""
from __future__ import annotations

import numpy as np

from .ops import Params
from .vocabulary import XMod


def definite_sign(arr) -> int:
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
    """``test(part)`` for every part of the flattened ``arr`` (a large weight is never copied whole; ``test`` reads
    its entries in any order)."""
    a = np.asarray(arr)
    if not a.flags.c_contiguous and a.T.flags.c_contiguous:
        a = a.T  # a transposed view (a tied int4 head): flattened in memory order, not copied
    flat = a.reshape(-1)
    return all(bool(test(flat[i:i + chunk])) for i in range(0, flat.size, chunk))


class Basis:
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
            r = weight_ratio(wm, self.w)
            return None if r is None else {"W": r}
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
_X_SYM = {XMod.IDENTITY: {XMod.IDENTITY: 1.0}, XMod.POSITIVE: {XMod.IDENTITY: 0.5, XMod.ABS: 0.5},
          XMod.NEGATIVE: {XMod.IDENTITY: 0.5, XMod.ABS: -0.5}}
_W_SYM = {"W": {"W": 1.0}, "W+": {"W": 0.5, "|W|": 0.5}, "W-": {"W": 0.5, "|W|": -0.5}}
_SAFE = 0.5  # the least |sum| / sum|parts| of a weight's coefficient over the four sign patterns of (x, w)


def symmetric(combo: dict, x_of: dict) -> dict | None:
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
            value = sum(c * (sx if k[0][0] == XMod.IDENTITY else 1) * (sw if k[1] == "W" else 1)
                        for k, c in out.items())
            if abs(value) < _SAFE * parts:
                return None
    return out


def weight_ratio(wm, w):
    scale = float(np.abs(w).max()) if w.size else 0.0
    if scale == 0:
        return None
    idx = int(np.argmax(np.abs(w)))
    r = float(wm.ravel()[idx] / w.ravel()[idx])
    return r if np.allclose(wm, r * w, rtol=1e-6, atol=1e-7 * scale) else None


def channel_scale(value, dims) -> np.ndarray | None:
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


def same_bias(bias, b_orig) -> bool:
    """Whether a group's bias is the layer's own (its z_g is z itself); None and all-zero are no bias."""
    if bias is None or not np.any(bias):
        return b_orig is None
    return b_orig is not None and np.array_equal(np.asarray(bias, np.float64), np.asarray(b_orig, np.float64))



def beyond(group, w, b, nonneg: bool) -> set:
    """The signs that z_g - z can take, proven term by term ({1}: z_g >= z everywhere, {-1}: z_g <= z, set(): equal;
    {0} when not provable): the group must cover x once (x itself, or x+ and x-), every term with sign +1 and a
    weight (and bias) modification of definite sign, e.g. gamma's W + g W+ on x+ and W + g W- on x-."""
    if w is None:
        return {0}
    signs: set = set()
    seen = []
    b_sum = None
    for term in group.terms:
        if term.x == XMod.NEGATIVE and nonneg:
            continue
        how = XMod.IDENTITY if term.x == XMod.POSITIVE and nonneg else term.x
        if term.sign != 1.0 or how not in (XMod.IDENTITY, XMod.POSITIVE, XMod.NEGATIVE):
            return {0}
        seen.append(how)
        d = term.w(w) - w
        if np.any(d):
            ds = definite_sign(d)
            if ds == 0 or (how == XMod.IDENTITY and not nonneg):
                return {0}
            signs.add(-ds if how == XMod.NEGATIVE else ds)
        if term.b is not None and b is not None:
            b_sum = term.b(b) if b_sum is None else b_sum + term.b(b)
    if sorted(seen) not in ([XMod.IDENTITY], [XMod.NEGATIVE, XMod.POSITIVE]):
        return {0}
    db = (b_sum if b_sum is not None else 0.0) - (b if b is not None else 0.0)
    if np.any(db):
        ds = definite_sign(db)
        if ds == 0:
            return {0}
        signs.add(ds)
    return signs


__all__ = ["definite_sign", "any_negative", "all_chunks", "Basis", "symmetric", "weight_ratio", "channel_scale",
           "same_bias", "beyond"]
