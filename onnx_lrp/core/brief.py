"""Short ``repr``s of result objects: arrays as their type and shape, short index arrays by their first values,
dicts by key; never a whole array (a relevance of a few million values printed in a notebook)."""
from __future__ import annotations

import numpy as np

MAX_VALUES = 6  # a 1-D integer array of at most this many values is shown whole (e.g. the targets of a few items)
MAX_KEYS = 8  # the keys of a dict shown before "..."


def brief(value) -> str:
    """One short piece of text for any field value: ``float32[10x1x16x16]``, ``[3, 7, 1, ... (10 items)]``,
    ``{'logits': float32[10x10], ...}``, a number as its value."""
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        return _array(np.asarray(value))
    if isinstance(value, dict):
        keys = list(value)
        parts = [f"{k!r}: {brief(value[k])}" for k in keys[:MAX_KEYS]]
        more = [f"... ({len(keys)} keys)"] if len(keys) > MAX_KEYS else []
        return "{" + ", ".join(parts + more) + "}"
    if isinstance(value, (list, tuple)) and len(value) > MAX_VALUES:
        return f"{type(value).__name__}({len(value)} items)"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _array(a: np.ndarray) -> str:
    shape = "x".join(map(str, a.shape))
    if a.ndim == 0:
        v = a.item()
        return f"{v:.4g}" if isinstance(v, float) else repr(v)
    if a.ndim == 1 and a.dtype.kind in "iub":
        vals = a[:MAX_VALUES].tolist()
        return "[" + ", ".join(map(str, vals)) + (f", ... ({a.size} items)]" if a.size > MAX_VALUES else "]")
    return f"{a.dtype}[{shape}]"


def brief_repr(obj, fields) -> str:
    """``Name(field=brief, ...)`` of ``obj``'s ``fields`` (names), leaving out None and empty containers."""
    parts = []
    for name in fields:
        value = getattr(obj, name)
        if value is None or (isinstance(value, (dict, list, tuple)) and not value):
            continue
        parts.append(f"{name}={brief(value)}")
    return f"{type(obj).__name__}(" + ", ".join(parts) + ")"


__all__ = ["brief", "brief_repr"]
