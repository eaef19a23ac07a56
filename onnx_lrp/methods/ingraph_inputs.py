"""The inputs of a method's graph (:mod:`.ingraph`) for a model with several inputs: the float inputs the method
moves and attributes, and the integer / bool ones (attention masks, positions) it holds, fed as given to every
stacked copy of an item, as the methods' runtime path feeds them (:meth:`.gradients.GradientRunner.feeds`: row r
takes item r mod N's).

Several float inputs are packed in the graph as :mod:`.packing` packs them at run time: each input's items
flattened and laid side by side (N x the sum of their sizes), so that every method's graph, written for one input,
runs unchanged on the packed tensor; its attribution is unpacked into one output per float input. Values given per
input (baselines, noise, a background set: graph inputs ``<name>/<input>`` or constants) are packed alike."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core.emitter import Emitter
from ..core.errors import InputError

END = np.iinfo(np.int64).max


class Inputs:
    """A method graph's inputs: the originals renamed out of the way (``old``), the new ones made (``new``, in the
    model's input order), the float ones (``floats``) packed when there are several."""

    def __init__(self, graph: ir.Graph, floats: list, held: list):
        order = [v.name for v in graph.inputs if v.name in floats or v.name in held]
        missing = [n for n in (*floats, *held) if n not in order]
        if missing:
            raise InputError(f"input {missing[0]!r} is not an input of the model")
        self.old = {v.name: v for v in graph.inputs if v.name in order}
        self.floats = [n for n in order if n in floats]
        self.held = [n for n in order if n in held]
        for v in self.old.values():
            v.name = "lrp/method/was/" + v.name
        self.new = {n: ir.Value(name=n, type=v.type, shape=v.shape) for n, v in self.old.items()}
        dtypes = {self.old[n].dtype for n in self.floats}
        if len(dtypes) > 1:
            raise InputError(f"the float inputs ({', '.join(self.floats)}) have different element types "
                             f"({', '.join(sorted(d.name for d in dtypes))}): the method's graph packs them into one "
                             "tensor; export them with one type")
        self.packed = len(self.floats) > 1
        self.em: Emitter | None = None

    def item_dims(self, name: str) -> list:
        """Input ``name``'s dims after its batch axis (ints, or None where symbolic)."""
        return [d if isinstance(d, int) else None for d in self.old[name].shape[1:]]

    def packed_dims(self) -> list:
        """The packed tensor's item dims: [the sum of the sizes] (None when one is symbolic)."""
        sizes = [None if None in self.item_dims(n) else int(np.prod(self.item_dims(n), dtype=np.int64))
                 for n in self.floats]
        return [None if None in sizes else sum(sizes)]

    def x(self) -> ir.Value:
        """The moved input: the one float input, or the float inputs packed (N x the sum of their sizes)."""
        if not self.packed:
            return self.new[self.floats[0]]
        return self.pack({n: self.new[n] for n in self.floats}, 1, "x")

    def _sizes(self) -> list:
        """Each float input's item size as an int64 [1] value (a constant where its dims are fixed)."""
        em, out = self.em, []
        for n in self.floats:
            dims = self.item_dims(n)
            if None not in dims:
                out.append(em.ints([int(np.prod(dims, dtype=np.int64))]))
            else:
                tail = em.op("Slice", em.op("Shape", self.new[n]), em.ints([1]), em.ints([END]), tag="item_shape")
                out.append(em.op("ReduceProd", tail, keepdims=1, tag="item_size"))
        return out

    def pack(self, values: dict, lead: int, tag: str) -> ir.Value:
        """``values`` (by float input: ``lead`` leading axes, then that input's item shape) packed along axis
        ``lead``."""
        em = self.em
        flat = []
        for n in self.floats:
            v = values[n]
            shape = em.op("Concat", em.op("Slice", em.op("Shape", v), em.ints([0]), em.ints([lead])), em.ints([-1]),
                          axis=0, tag=f"{tag}_flat_shape")
            flat.append(em.op("Reshape", v, shape, tag=f"{tag}_flat"))
        return em.op("Concat", *flat, axis=lead, tag=f"packed_{tag}")

    def unpack(self, packed: ir.Value, lead: int, tag: str) -> dict:
        """A packed tensor (``lead`` leading axes, then the packed axis) as a value per float input (its item
        shape restored)."""
        em = self.em
        out, start = {}, em.ints([0])
        for n, size in zip(self.floats, self._sizes()):
            end = em.op("Add", start, size, tag=f"{tag}_end")
            part = em.op("Slice", packed, start, end, em.ints([lead]), tag=f"{tag}_part")
            shape = em.op("Concat", em.op("Slice", em.op("Shape", packed), em.ints([0]), em.ints([lead])),
                          em.op("Slice", em.op("Shape", self.new[n]), em.ints([1]), em.ints([END])), axis=0,
                          tag=f"{tag}_shape")
            out[n] = em.op("Reshape", part, shape, tag=f"{tag}_unpacked")
            start = end
        return out

    def feed_plain(self) -> None:
        """The model run at the inputs as given."""
        for n, v in self.old.items():
            v.replace_all_uses_with(self.new[n])

    def feed_rows(self, rows: ir.Value, n: ir.Value) -> None:
        """The model run at stacked rows (``rows``: the moved input's, packed when several; ``n``: N as [1]):
        row r takes the held inputs of item r mod N (every copy stacked item by item after the input)."""
        em = self.em
        if self.packed:
            for k, v in self.unpack(rows, 1, "rows").items():
                self.old[k].replace_all_uses_with(v)
        else:
            self.old[self.floats[0]].replace_all_uses_with(rows)
        if not self.held:
            return
        copies = em.op("Div", em.op("Slice", em.op("Shape", rows), em.ints([0]), em.ints([1])), n, tag="copies")
        for k in self.held:
            reps = em.op("Concat", copies, em.ints([1] * (len(self.old[k].shape) - 1)), axis=0, tag="held_reps")
            self.old[k].replace_all_uses_with(em.op("Tile", self.new[k], reps, tag="held_rows"))

    def per_input(self, value, what: str) -> dict:
        """A value given per float input (a tuple in the model's order, or a dict by name) as a dict."""
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(self.floats))
            if unknown or len(value) != len(self.floats):
                raise InputError(f"{what} by input: give one for each of {', '.join(self.floats)}"
                                 + (f", not {unknown[0]!r}" if unknown else ""))
            return value
        if isinstance(value, (tuple, list)) and len(value) == len(self.floats):
            return dict(zip(self.floats, value))
        raise InputError(f"{what}: the model has {len(self.floats)} float inputs; give a tuple with one per input "
                         f"({', '.join(self.floats)}) or a dict by input name")

    def inputs_per_float(self, name: str, lead: list) -> dict:
        """New graph inputs ``name/<input>`` (``lead`` dims, then the input's item dims) by float input."""
        out = {}
        for n in self.floats:
            dims = [d if d is not None else f"d{i}" for i, d in enumerate(self.item_dims(n), 1)]
            out[n] = ir.Value(name=f"{name}/{n}", type=self.old[n].type, shape=ir.Shape([*lead, *dims]))
        return out

    def packed_constant(self, arrays: dict, lead: int, dtype, tag: str) -> ir.Value:
        """Per-input arrays (``lead`` leading axes, then the input's item shape) packed in numpy: one constant."""
        parts, heads = [], []
        for n in self.floats:
            a = np.asarray(arrays[n])
            dims = self.item_dims(n)
            if a.ndim != lead + len(dims) or any(d is not None and s != d for s, d in zip(a.shape[lead:], dims)):
                raise InputError(f"{tag} for input {n!r} has shape {' x '.join(map(str, a.shape))}; give "
                                 f"{lead} leading axes, then {' x '.join(str(d) for d in dims)}")
            heads.append(a.shape[:lead])
            parts.append(a)
        try:
            head = np.broadcast_shapes(*heads)
            flat = [np.broadcast_to(a, head + a.shape[lead:]).reshape(head + (-1,)) for a in parts]
        except ValueError:
            raise InputError(f"{tag}: the inputs' leading axes differ ({heads})") from None
        return self.em.const(np.concatenate(flat, axis=-1).astype(dtype), tag=tag)


__all__ = ["Inputs"]
