"""Models with several float inputs for the gradient methods, as captum attributes them (every input, a tuple in,
a tuple out): the inputs of one item flattened and laid side by side (``packed``: N x the sum of the inputs' sizes),
so that every method, which works entry by entry along the batch axis, runs unchanged on the packed array; the
relevance graph's gradients of every input packed the same way, and the result unpacked into the form ``x`` came
in (a tuple in the model's input order, or a dict by input name). Per-input options (``baselines``, ``noise``: a
tuple or a dict with one value per input) are packed alike."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..core.errors import InputError

#: the option fields given per input, with the number of leading axes before each input's item shape
PER_INPUT = {("integrated-gradients", "baselines"): "items", ("smoothgrad", "noise"): "samples-items",
             ("vargrad", "noise"): "samples-items", ("expected-gradients", "noise"): "samples-items",
             ("gradient-shap", "noise"): "samples-items", ("expected-gradients", "baselines"): "rows",
             ("gradient-shap", "baselines"): "rows"}


class Packing:
    """The float inputs ``specs`` (in the model's order) packed side by side along one axis per item."""

    def __init__(self, specs):
        self.names = [s.name for s in specs]
        self.shapes: dict = {}

    def as_dict(self, x) -> dict:
        """``x`` (a tuple or list in the model's input order, or a dict by name) as a dict by name."""
        if isinstance(x, dict):
            return x
        if isinstance(x, (tuple, list)) and len(x) == len(self.names):
            return dict(zip(self.names, x))
        raise InputError(f"the model has {len(self.names)} inputs ({', '.join(self.names)}): give a tuple of "
                         "arrays in that order or a dict by input name")

    def pack(self, arrays: dict) -> np.ndarray:
        """N x (sum of sizes): each input's items flattened, side by side; remembers the item shapes."""
        n = {a.shape[0] for a in arrays.values()}
        if len(n) != 1:
            raise InputError(f"the inputs have different batch sizes ({', '.join(map(str, sorted(n)))})")
        self.shapes = {k: arrays[k].shape[1:] for k in self.names}
        return np.concatenate([arrays[k].reshape(len(arrays[k]), -1) for k in self.names], axis=1)

    def unpack(self, packed: np.ndarray) -> dict:
        """The arrays by input name from a packed array (any leading axes before the packed one)."""
        sizes = [int(np.prod(self.shapes[k], dtype=np.int64)) for k in self.names]
        parts = np.split(packed, np.cumsum(sizes)[:-1], axis=-1)
        return {k: p.reshape(packed.shape[:-1] + self.shapes[k]) for k, p in zip(self.names, parts)}

    def pack_value(self, name: str, value, lead: tuple):
        """A per-input option value (a tuple or dict, one per input) packed, each broadcast to ``lead`` + its
        input's item shape; a single value (a number) stays as it is (it broadcasts against the packed array)."""
        if not isinstance(value, (tuple, dict)):
            if isinstance(value, np.ndarray) and value.ndim > 0:
                raise InputError(f"{name}: the model has {len(self.names)} inputs; give a tuple with one {name} per "
                                 f"input ({', '.join(self.names)}) or one number")
            return value
        values = self.as_dict(value if isinstance(value, dict) else tuple(value))
        parts = []
        for k in self.names:
            v = np.asarray(values[k], np.float64)
            head = lead if lead is not None else v.shape[:1]
            if lead is not None and v.ndim == len(self.shapes[k]) + len(lead) - 1 and len(lead) == 2:
                v = v[:, None]  # samples x item shape: the same for every item
            try:
                parts.append(np.broadcast_to(v, tuple(head) + self.shapes[k]).reshape(tuple(head) + (-1,)))
            except ValueError:
                raise InputError(f"{name} for input {k!r} has shape {v.shape}, not broadcastable to "
                                 f"{' x '.join(map(str, tuple(head) + self.shapes[k]))}") from None
        return np.concatenate(parts, axis=-1)

    def options(self, method: str, options, x: np.ndarray):
        """``options`` with their per-input fields packed for the packed input ``x``."""
        changes = {}
        for (m, field), kind in PER_INPUT.items():
            if m != method or getattr(options, field, None) is None:
                continue
            value = getattr(options, field)
            samples = getattr(options, "nt_samples", None) or getattr(options, "n_samples", None)
            lead = {"items": (x.shape[0],), "rows": None, "samples-items": (samples, x.shape[0])}[kind]
            changes[field] = self.pack_value(field, value, lead)
        return dataclasses.replace(options, **changes) if changes else options

    def result(self, packed: np.ndarray, given, bare: bool):
        """The packed attribution unpacked into the form ``given`` came in (tuple or dict), without the batch axis
        when the items came without one."""
        out = {k: (v[0] if bare else v) for k, v in self.unpack(packed).items()}
        return out if isinstance(given, dict) else tuple(out[k] for k in self.names)


__all__ = ["Packing", "PER_INPUT"]


def per_input_options(packing: "Packing | None", name: str, method: str, options, x: np.ndarray):
    """``options`` with the values given per input packed as ``x`` (several float inputs: ``packing``'s; one input
    ``name``: a 1-tuple or a one-entry dict is its value)."""
    if packing is not None:
        return packing.options(method, options, x)
    changes = {}
    for f in ("baselines", "noise"):
        v = getattr(options, f, None)
        if isinstance(v, (tuple, dict)):
            if len(v) != 1:
                raise InputError(f"{f} is given for {len(v)} inputs; the model has one float input ({name!r})")
            changes[f] = v[0] if isinstance(v, tuple) else next(iter(v.values()))
    return dataclasses.replace(options, **changes) if changes else options
