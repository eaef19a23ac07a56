"""Occlusion and RISE in one graph (:mod:`.ingraph`): the original model's one batched forward, the input first
and then its perturbed copies along the batch axis, and the attribution from the explained output's entries.

``occlusion``: the windows' masks a constant (captum's windows, :func:`onnx_lrp.methods.occlusion.windows`), each
window filled with the baseline, and each entry's attribution the sum of the drops of the windows that cover it over
their count, as captum; over a symbolic axis (a sequence) the windows are made in the graph from the input's
run-time shape; several float inputs are occluded each in turn with its own window, the others as given (captum),
all the windows in one batch. The batch (windows per item) is refused when it would take more than ``memory_budget``.
``rise``: the masks a constant (``masks=``, or drawn with ``seed=`` as :func:`onnx_lrp.methods.rise.draw_masks`
draws them) or the input ``lrp/masks`` (n_masks x the masked axes); the saliency
``sum_i f(x * M_i + b (1 - M_i)) M_i / (n_masks * probability)``, N x (1, ...) x the masked axes."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from .. import load
from ..core.errors import InputError
from .ingraph_base import END, MethodGraph, argmax_targets, batch_axis_free
from .occlusion import ROW_FACTOR, windows
from .occlusion import per_input as occlusion_per_input
from .rise import draw_masks

MASKS_INPUT = "lrp/masks"


def _opened(model, fwd, several: bool = False) -> MethodGraph:
    """The original model opened for occlusion / RISE: its float input perturbed (``several``: its float inputs,
    packed), integer and bool inputs (attention masks) held, fed as given to every perturbed copy."""
    ir_model = load.to_ir(load.read_proto(model), load.data_folder(model))
    kinds = {v.name: v.dtype for v in ir_model.graph.inputs}
    floats = [n for n in fwd.names if kinds[n] in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16)]
    if not floats or (len(floats) > 1 and not several):
        has = f"{len(floats)} ({', '.join(floats)})" if floats else f"none ({', '.join(fwd.names)}: token ids)"
        raise InputError(f"rewrite --method {'occlusion' if several else 'rise'} perturbs "
                         f"{'float inputs' if several else 'one float input'}, the integer ones held; the model has "
                         f"{has}: use `onnx-lrp explain --method` or the Python API's Attributor")
    held = [n for n in fwd.names if n not in floats]
    w = MethodGraph(ir_model, floats, [v.name for v in ir_model.graph.outputs], fwd.output, held)
    for name in floats:
        batch_axis_free(name, list(w.io.old[name].shape))
    w.forget_shapes()
    return w


def _entries(w: MethodGraph, perturbed: ir.Value, lead: int) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """(the explained entry at the input (float64, N); at each perturbed row (float64, ``perturbed``'s ``lead``
    axes x N); the targets; N): one forward of the input and ``perturbed`` stacked."""
    em = w.em
    shape = em.op("Shape", w.x, tag="shape")
    n = em.op("Slice", shape, em.ints([0]), em.ints([1]), tag="n")
    tail = em.op("Slice", shape, em.ints([1]), em.ints([END]), tag="tail")
    flat = em.op("Reshape", perturbed, em.op("Concat", em.ints([-1]), tail, axis=0), tag="perturbed_rows")
    w.feed_rows(em.op("Concat", w.x, flat, axis=0, tag="rows"), n)
    target = argmax_targets(em, w.explained, w.t, n)
    pshape = em.op("Shape", perturbed, tag="perturbed_shape")
    k = em.op("ReduceProd", em.op("Slice", pshape, em.ints([0]), em.ints([lead])), keepdims=1, tag="per_item")
    index = em.op("Unsqueeze", em.op("Concat", target, em.op("Tile", target, k), axis=0), em.ints([1]), tag="index")
    scores = em.op("Flatten", w.explained, axis=1, tag="scores")
    entries = em.op("Cast", em.op("GatherElements", scores, index, axis=1), to=ir.DataType.DOUBLE, tag="entries")
    entries = em.op("Reshape", entries, em.ints([-1]), tag="entry")
    whole = em.op("Slice", entries, em.ints([0]), n, em.ints([0]), tag="whole")
    rest = em.op("Slice", entries, n, em.ints([END]), em.ints([0]), tag="rest")
    lead_n = em.op("Concat", em.op("Slice", pshape, em.ints([0]), em.ints([lead])), n, axis=0, tag="lead_n")
    return whole, em.op("Reshape", rest, lead_n, tag="perturbed_entries"), target, n


def _static_windows(w: MethodGraph, dims: list, options, budget: int) -> tuple[ir.Value, ir.Value]:
    """(the windows' masks, K x the item's entries (bool); their count per entry, 1 x entries (float64)): captum's
    windows over the input's fixed shape, refused when the batch would exceed ``budget``."""
    spots = windows(tuple(dims), options.sliding_window_shapes, options.strides)
    row = int(np.prod(dims)) * w.dtype.itemsize
    if len(spots) * row * ROW_FACTOR > budget:
        raise InputError(f"occlusion: {len(spots)} windows of one item ({len(spots) * row / 2**20:.1f} MiB of "
                         f"rows) exceed the memory budget ({budget / 2**20:.0f} MiB, memory_budget / --memory-budget "
                         "counts about 16x the rows); give larger strides or windows, or a larger budget")
    masks = np.zeros((len(spots),) + tuple(dims), bool)
    for k, spot in enumerate(spots):
        masks[(k,) + spot] = True
    flat = w.em.const(masks.reshape(len(spots), -1), tag="windows")
    return flat, w.em.const(masks.sum(axis=0).reshape(1, -1).astype(np.float64), tag="cover", dtype=np.float64)


def _axis_windows(w: MethodGraph, axis: int, size: int, stride: int) -> ir.Value:
    """One axis's windows over its run-time length d: count x d (bool), window j covering [j s, j s + size) cut
    at d, count = ceil((d - size) / s) + 1 (captum's windows along one axis)."""
    em = w.em
    d = em.op("Reshape", em.op("Slice", em.op("Shape", w.x), em.ints([axis + 1]), em.ints([axis + 2])), em.ints([]),
              tag="length")
    over = em.op("Max", em.op("Sub", d, em.scalar(size, np.int64)), em.scalar(0, np.int64), tag="beyond_window")
    count = em.op("Add", em.op("Div", em.op("Add", over, em.scalar(stride - 1, np.int64)),
                               em.scalar(stride, np.int64)), em.scalar(1, np.int64), tag="count")
    one, zero = em.scalar(1, np.int64), em.scalar(0, np.int64)
    starts = em.op("Unsqueeze", em.op("Mul", em.op("Range", zero, count, one), em.scalar(stride, np.int64)),
                   em.ints([1]), tag="starts")
    pos = em.op("Range", zero, d, one, tag="positions")
    after = em.op("Not", em.op("Less", pos, starts), tag="from_start")
    return em.op("And", after, em.op("Less", pos, em.op("Add", starts, em.scalar(size, np.int64))), tag="axis_window")


def _dynamic_windows(w: MethodGraph, dims: list, options) -> tuple[ir.Value, ir.Value]:
    """:func:`_static_windows` for an input with symbolic axes: the windows built in the graph from the input's
    run-time shape (every axis's windows crossed; no budget check: the count is known at run time only)."""
    em, window, strides = w.em, options.sliding_window_shapes, options.strides
    if len(window) != len(dims) or len(strides) != len(dims):
        raise InputError(f"sliding_window_shapes has {len(window)} axes, the input has {len(dims)} after the batch "
                         f"axis ({' x '.join(str(d) for d in dims)})")
    if any(d is not None and size > d for size, d in zip(window, dims)) or any(
            s > size and d != size for s, size, d in zip(strides, window, dims)):
        windows(tuple(d if d is not None else max(size, s) for d, size, s in zip(dims, window, strides)), window,
                strides)  # refused there in its words
    r = len(dims)
    full = None
    for k, (size, stride) in enumerate(zip(window, strides)):
        m = _axis_windows(w, k, size, stride)
        m = em.op("Unsqueeze", m, em.ints([i for i in range(2 * r) if i not in (k, r + k)]), tag="crossed")
        full = m if full is None else em.op("And", full, m, tag="windows_nd")
    flat = em.op("Reshape", full, em.op("Concat", em.ints([-1]), em.op("Reshape", em.op("ReduceProd", em.op(
        "Slice", em.op("Shape", w.x), em.ints([1]), em.ints([END])), keepdims=1), em.ints([1])), axis=0),
        tag="windows")
    cover = em.op("ReduceSum", em.op("Cast", flat, to=ir.DataType.DOUBLE), em.ints([0]), keepdims=1, tag="cover")
    return flat, cover


def _packed_windows(w: MethodGraph, options, budget: int) -> tuple[ir.Value, ir.Value, np.ndarray]:
    """Several float inputs, each occluded in turn with its own window, the others as given (captum): (the
    windows' masks over the packed entries, K x entries; their count per entry; the packed baseline)."""
    io = w.io
    several = isinstance(options.sliding_window_shapes[0], tuple)
    shapes = occlusion_per_input(options.sliding_window_shapes, io.floats, several, loose=False)
    strides = occlusion_per_input(options.strides, io.floats, several, loose=False)
    bases = occlusion_per_input(options.baselines, io.floats, False)
    blocks, base = [], []
    for name in io.floats:
        dims = io.item_dims(name)
        if None in dims:
            raise InputError(f"rewrite --method occlusion over several float inputs needs their shapes after the "
                             f"batch axis fixed; {name!r} is {' x '.join(str(d) for d in ['N'] + dims)}")
        spots = windows(tuple(dims), shapes[name], strides[name])
        block = np.zeros((len(spots),) + tuple(dims), bool)
        for k, spot in enumerate(spots):
            block[(k,) + spot] = True
        blocks.append(block.reshape(len(spots), -1))
        base.append(np.broadcast_to(np.asarray(bases[name], np.float64), tuple(dims)).reshape(-1))
    sizes = [b.shape[1] for b in blocks]
    masks = np.zeros((sum(len(b) for b in blocks), sum(sizes)), bool)
    row = col = 0
    for b in blocks:
        masks[row:row + len(b), col:col + b.shape[1]] = b
        row, col = row + len(b), col + b.shape[1]
    if len(masks) * sum(sizes) * w.dtype.itemsize * ROW_FACTOR > budget:
        raise InputError(f"occlusion: {len(masks)} windows of one item exceed the memory budget ({budget / 2**20:.0f} "
                         "MiB, memory_budget / --memory-budget); give larger strides or windows, or a larger budget")
    cover = masks.sum(axis=0).reshape(1, -1).astype(np.float64)
    return (w.em.const(masks, tag="windows"), w.em.const(cover, tag="cover", dtype=np.float64),
            np.concatenate(base))


def _windows(w: MethodGraph, options, budget: int) -> tuple[ir.Value, ir.Value, np.ndarray]:
    """(the windows' masks, K x the item's entries (bool); their count per entry (float64); the baseline)."""
    if w.io.packed:
        return _packed_windows(w, options, budget)
    dims = w.item_dims()
    if isinstance(options.sliding_window_shapes[0], tuple):
        if len(options.sliding_window_shapes) != 1:
            raise InputError("sliding_window_shapes: one window for the model's one float input "
                             f"({w.name!r}; integer inputs are held as given), not one per input")
        options = dataclasses.replace(options, sliding_window_shapes=options.sliding_window_shapes[0],
                                      strides=options.strides[0])
    base = np.asarray(options.baselines, np.float64)
    if None in dims:
        return (*_dynamic_windows(w, dims, options), base)
    return (*_static_windows(w, dims, options, budget), np.broadcast_to(base, tuple(dims)))


def occlusion_model(model, fwd, options) -> ir.Model:
    """captum's Occlusion (``options``: :class:`onnx_lrp.methods.options.OcclusionOptions`) in one graph."""
    w = _opened(model, fwd, several=True)
    em = w.em
    with em.scope("method/occlusion"):
        flat_masks, cover, base = _windows(w, options, fwd.settings.memory_budget)
        m = em.op("Reshape", flat_masks, em.op("Concat", em.ints([-1, 1]), em.op("Slice", em.op("Shape", w.x), em.ints(
            [1]), em.ints([END])), axis=0), tag="window_masks")
        perturbed = em.op("Where", m, em.const(base.astype(w.dtype.numpy()), tag="baseline"),
                          em.op("Unsqueeze", w.x, em.ints([0])), tag="occluded")
        whole, parts, target, n = _entries(w, perturbed, 1)
        drops = em.op("Sub", em.op("Unsqueeze", whole, em.ints([0])), parts, tag="drops")
        flat = em.op("Cast", flat_masks, to=ir.DataType.DOUBLE, tag="windows64")
        total = em.op("MatMul", em.op("Transpose", drops, perm=[1, 0]), flat, tag="total")
        out = em.op("Reshape", em.op("Div", total, cover, tag="mean"), em.op("Shape", w.x), tag="by_entry")
        relevance = em.op("Cast", out, to=w.dtype, tag="attribution")
    return w.finish(relevance, target, n)


def _rise_masks(w: MethodGraph, options) -> tuple[ir.Value, list, int]:
    """(the masks, n_masks x their axes; the new inputs; the masks' axes)."""
    dims = w.item_dims()
    masked = dims[1:] if w.rank >= 3 else dims
    if options.masks is not None or options.seed is not None:
        if options.masks is None and None in masked:
            raise InputError(f"rise draws its masks over the input's fixed axes; {w.name!r} is "
                             f"{' x '.join(str(d) for d in ['N'] + dims)}: give masks=, or feed lrp/masks")
        masks = options.masks if options.masks is not None else draw_masks(tuple(masked), options)
        tail = masks.shape[1:]
        if len(tail) > w.rank - 1 or any(d is not None and t != d for t, d in zip(tail[::-1], dims[::-1])):
            raise InputError(f"masks have shape {' x '.join(map(str, masks.shape))}; give n_masks x the input's "
                             f"trailing axes (e.g. n_masks x {' x '.join(str(d) for d in masked)})")
        return w.em.const(np.asarray(masks, np.float64), tag="masks", dtype=np.float64), [], len(tail)
    v = w.input(MASKS_INPUT, w.dtype, ["n_masks", *[d if d is not None else f"m{i}" for i, d in
                                                    enumerate(masked, 1)]])
    return w.em.op("Cast", v, to=ir.DataType.DOUBLE, tag="masks"), [v], len(masked)


def rise_model(model, fwd, options) -> ir.Model:
    """RISE (``options``: :class:`onnx_lrp.methods.options.RiseOptions`) in one graph."""
    w = _opened(model, fwd)
    em = w.em
    with em.scope("method/rise"):
        masks, extra, axes = _rise_masks(w, options)
        lead = w.rank - 1 - axes
        mshape = em.op("Shape", masks, tag="masks_shape")
        count = em.op("Slice", mshape, em.ints([0]), em.ints([1]), tag="count")
        m = em.op("Reshape", masks, em.op("Concat", count, em.ints([1] * (lead + 1)),
                                          em.op("Slice", mshape, em.ints([1]), em.ints([END])), axis=0), tag="m")
        item = tuple(d if d is not None else 1 for d in w.item_dims())
        base = np.asarray(options.baselines, np.float64)
        b = em.const(base if base.ndim == 0 else np.broadcast_to(base, item), tag="baseline", dtype=np.float64)
        xd = em.op("Unsqueeze", em.op("Cast", w.x, to=ir.DataType.DOUBLE), em.ints([0]), tag="x64")
        keep = em.op("Sub", em.const(np.array(1.0), dtype=np.float64, tag="one"), m, tag="dropped")
        rows = em.op("Add", em.op("Mul", xd, m), em.op("Mul", b, keep), tag="masked64")
        _, scores, target, n = _entries(w, em.op("Cast", rows, to=w.dtype, tag="masked"), 1)
        flat = em.op("Reshape", masks, em.op("Concat", count, em.ints([-1]), axis=0), tag="masks_flat")
        total = em.op("MatMul", em.op("Transpose", scores, perm=[1, 0]), flat, tag="total")
        scale = em.op("Mul", em.op("Cast", count, to=ir.DataType.DOUBLE),
                      em.const(np.array([options.probability]), dtype=np.float64, tag="probability"), tag="scale")
        out_shape = em.op("Concat", n, em.ints([1] * lead), em.op("Slice", mshape, em.ints([1]), em.ints([END])),
                          axis=0, tag="out_shape")
        out = em.op("Reshape", em.op("Div", total, scale, tag="saliency"), out_shape, tag="by_entry")
        relevance = em.op("Cast", out, to=w.dtype, tag="attribution")
    return w.finish(relevance, target, n, extra)


def forward_model(model, fwd, method: str, options) -> ir.Model:
    return occlusion_model(model, fwd, options) if method == "occlusion" else rise_model(model, fwd, options)


__all__ = ["occlusion_model", "rise_model", "forward_model", "MASKS_INPUT"]
