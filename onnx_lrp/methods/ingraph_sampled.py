"""The sampled gradient methods in one graph (:mod:`.ingraph`): SmoothGrad / SmoothGrad-squared / VarGrad over
``gradient``, ``gradient-x-input``, ``integrated-gradients`` or an LRP composite, and Expected Gradients / GradientSHAP. Every sample
is a row of the true-gradient relevance model's one stacked run; the means (and the variance) are taken in float64.

The random parts are graph inputs with the Attributor's names, so that a result can be reproduced: ``lrp/noise``
(samples x N x the item's shape), ``lrp/baseline_indices`` (int64 samples x N, rows of the background set) and
``lrp/alphas`` (samples x N); or given as arrays (``noise=``: a constant); or, with ``seed=``, drawn in the graph
(onnxruntime's RandomNormalLike / RandomUniformLike with that seed: not numpy's numbers, and each run of one
session draws anew)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core.errors import InputError
from .gradients import GradientRunner
from .ingraph_base import GradientGraph, batch_axis_free, constant_baseline, ig_sum
from .options import make_options

NOISE_INPUT, INDICES_INPUT, ALPHAS_INPUT = "lrp/noise", "lrp/baseline_indices", "lrp/alphas"
BASES = ("gradient", "gradient-x-input", "integrated-gradients")


def _samples_like(w: GradientGraph, samples: int) -> ir.Value:
    """The input repeated ``samples`` times along a new first axis (a template for RandomNormalLike)."""
    em = w.em
    return em.op("Expand", em.op("Unsqueeze", w.x, em.ints([0])), em.ints([samples] + [1] * w.rank),
                 tag="template")


def _noise(w: GradientGraph, noise, samples: int, stdevs: float, seed) -> tuple[ir.Value, list]:
    """(the noise, samples x (N or 1) x the item's shape; the new inputs): a constant when given, drawn in the
    graph with ``seed``, else the input lrp/noise (several float inputs: one per input, lrp/noise/<input>, packed)."""
    em = w.em
    if noise is not None and w.io.packed:
        arrays = w.io.per_input(noise, "noise")
        arrays = {k: (a[:, None] if np.ndim(a) == len(w.io.item_dims(k)) + 1 else a)
                  for k, a in ((k, np.asarray(a)) for k, a in arrays.items())}
        return w.io.packed_constant(arrays, 2, w.dtype.numpy(), "noise"), []
    if noise is not None:
        a = np.asarray(w.io.per_input(noise, "noise")[w.name] if isinstance(noise, (tuple, dict)) else noise)
        if a.ndim == w.rank:  # samples x the item's shape: the same noise for every item
            a = a[:, None]
        if a.ndim != w.rank + 1 or any(d is not None and s != d for s, d in zip(a.shape[2:], w.item_dims())):
            raise InputError(f"noise has shape {np.shape(a)}; give samples x the input's shape "
                             f"({' x '.join(str(d) for d in [None] + w.item_dims())} after the samples)")
        return em.const(a.astype(w.dtype.numpy()), tag="noise"), []
    if seed is not None and stdevs == 0:  # onnxruntime aborts on a normal of scale 0
        return em.const(np.zeros((samples,) + (1,) * w.rank, w.dtype.numpy()), tag="noise"), []
    if seed is not None:
        return em.op("RandomNormalLike", _samples_like(w, samples), mean=0.0, scale=float(stdevs), seed=float(seed),
                     dtype=w.dtype, tag="noise"), []
    if w.io.packed:
        given = w.io.inputs_per_float(NOISE_INPUT, ["samples", "N"])
        return w.io.pack(given, 2, "noise"), list(given.values())
    v = w.input(NOISE_INPUT, w.dtype, ["samples", "N", *[d if d is not None else f"d{i}" for i, d in
                                                         enumerate(w.item_dims(), 1)]])
    return v, [v]


def _mean0(w: GradientGraph, v: ir.Value) -> ir.Value:
    """The mean of ``v`` (float64) over its first axis (ReduceSum over the count: any opset)."""
    em = w.em
    count = em.op("Cast", em.op("Slice", em.op("Shape", v), em.ints([0]), em.ints([1])), to=ir.DataType.DOUBLE)
    return em.op("Div", em.op("ReduceSum", v, em.ints([0]), keepdims=0), count, tag="mean")


def _lrp_graph(runner) -> GradientGraph:
    """An LRP composite's relevance model opened for SmoothGrad: float inputs attributed (the others held), one
    explained entry per item."""
    rm = runner.relevance_model
    floats = [s for s in runner.inputs if s.name in runner.relevance_inputs]
    if not floats or any(s.dtype.kind != "f" for s in floats):
        raise InputError(f"rewrite --method smoothgrad over a composite moves the attributed inputs: they must be "
                         f"float ({', '.join(f'{s.name}: {np.dtype(s.dtype).name}' for s in floats) or 'none'})")
    if rm.sequence_rows is not None or rm.whole:
        raise InputError(f"smoothgrad explains one entry per item; output {runner.explained_output!r} is a sequence "
                         "or has no batch axis (use LRP)")
    for spec in floats:
        batch_axis_free(spec.name, spec.dims)
    return GradientGraph(runner, one_hot=runner.options.start == "one-hot")


def noise_tunnel_model(engine, options) -> ir.Model:
    """captum's NoiseTunnel (``options``: :class:`onnx_lrp.methods.options.NoiseTunnelOptions`) over a gradient
    method (``engine`` a :class:`GradientRunner`) or an LRP composite (``engine`` its runner: zennit's SmoothGrad
    of a composite), in one graph."""
    lrp = not isinstance(engine, GradientRunner)
    base = None if lrp else make_options(options.base, dict(options.base_options))
    w = _lrp_graph(engine) if lrp else GradientGraph(engine.runner)
    em = w.em
    with em.scope("method/noise_tunnel"):
        noise, extra = _noise(w, options.noise, options.nt_samples, options.stdevs, options.seed)
        xs = em.op("Add", em.op("Unsqueeze", w.x, em.ints([0])), noise, tag="noisy")
        if not lrp and options.base == "integrated-gradients":
            attr, target, n = ig_sum(w, xs, 1, constant_baseline(w, base.baselines), base)
        else:
            g, target, n = w.stacked(xs, 1)
            attr = w.double(g)
            if options.base == "gradient-x-input":
                attr = em.op("Mul", attr, w.double(xs), tag="times_input")
            elif not lrp and base.abs:
                attr = em.op("Abs", attr, tag="abs")
        mean = _mean0(w, attr)
        out = mean
        if options.nt_type != "smoothgrad":
            out = _mean0(w, em.op("Mul", attr, attr, tag="squares"))
            if options.nt_type == "vargrad":
                out = em.op("Sub", out, em.op("Mul", mean, mean, tag="mean_squared"), tag="variance")
        relevance = em.op("Cast", out, to=w.dtype, tag="attribution")
    return w.finish(relevance, target, n, extra)


def _background(w: GradientGraph, options, baseline_input: bool) -> tuple[ir.Value, list]:
    """(the background set, rows x the item's shape (packed for several float inputs); the new inputs)."""
    if baseline_input and w.io.packed:
        given = w.io.inputs_per_float("lrp/baselines", ["background"])
        return w.io.pack(given, 1, "background"), list(given.values())
    if baseline_input:
        v = w.input("lrp/baselines", w.dtype, ["background", *[d if d is not None else f"d{i}" for i, d in
                                                             enumerate(w.item_dims(), 1)]])
        return v, [v]
    if w.io.packed:
        return w.io.packed_constant(w.io.per_input(options.baselines, "baselines"), 1, w.dtype.numpy(),
                                    "background"), []
    given = options.baselines
    b = np.asarray(w.io.per_input(given, "baselines")[w.name] if isinstance(given, (tuple, dict)) else given)
    if b.ndim != w.rank or any(d is not None and s != d for s, d in zip(b.shape[1:], w.item_dims())):
        raise InputError(f"baselines have shape {' x '.join(map(str, b.shape))}; give a background set n x "
                         f"{' x '.join(str(d) for d in w.item_dims())} (the input's shape after its batch axis)")
    return w.em.const(b.astype(w.dtype.numpy()), tag="background"), []


def _draws(w: GradientGraph, options, background: ir.Value) -> tuple[ir.Value, ir.Value, list]:
    """(baseline indices, alphas: samples x N; the new inputs): inputs, or drawn in the graph with ``seed``."""
    em = w.em
    if options.seed is None:
        idx = w.input(INDICES_INPUT, ir.DataType.INT64, ["samples", "N"])
        alphas = w.input(ALPHAS_INPUT, w.dtype, ["samples", "N"])
        return idx, alphas, [idx, alphas]
    n = em.op("Slice", em.op("Shape", w.x), em.ints([0]), em.ints([1]), tag="n")
    template = em.op("Expand", em.scalar(0.0), em.op("Concat", em.ints([options.n_samples]), n, axis=0),
                     tag="draws_template")
    seed = float(options.seed)
    alphas = em.op("RandomUniformLike", template, low=0.0, high=1.0, seed=seed, tag="alphas")
    rows = em.op("Cast", em.op("Slice", em.op("Shape", background), em.ints([0]), em.ints([1])), to=w.dtype)
    u = em.op("RandomUniformLike", template, low=0.0, high=1.0, seed=seed + 1, tag="u")
    idx = em.op("Cast", em.op("Floor", em.op("Mul", u, rows)), to=ir.DataType.INT64, tag="indices")
    last = em.op("Sub", em.op("Cast", rows, to=ir.DataType.INT64), em.ints([1]))
    return em.op("Min", idx, last, tag="baseline_indices"), alphas, []


def expected_gradients_model(gr: GradientRunner, options, baseline_input: bool = False) -> ir.Model:
    """captum's GradientShap / Expected Gradients (``options``:
    :class:`onnx_lrp.methods.options.ExpectedGradientsOptions`) in one graph: mean over the samples of
    grad(b + alpha (x + noise - b)) * (x + noise - b), b the background row each draw picks."""
    given = [k for k in ("baseline_indices", "alphas") if getattr(options, k) is not None]
    if given:
        raise InputError(f"rewrite takes {given[0]} as the input lrp/{given[0]} (samples x N), or drawn with seed=; "
                         "do not give it as an option")
    w = GradientGraph(gr.runner)
    em = w.em
    with em.scope("method/expected_gradients"):
        background, extra = _background(w, options, baseline_input)
        idx, alphas, drawn = _draws(w, options, background)
        xs = em.op("Unsqueeze", w.x, em.ints([0]), tag="input")
        if options.noise is not None or options.stdevs > 0:
            seed = None if options.seed is None else options.seed + 2  # a stream apart from the draws'
            noise, more = _noise(w, options.noise, options.n_samples, options.stdevs, seed)
            xs, drawn = em.op("Add", xs, noise, tag="noisy"), drawn + more
        b = em.op("Gather", background, idx, axis=0, tag="baselines")
        diff = em.op("Sub", xs, b, tag="diff")
        rows = em.op("Add", b, em.op("Mul", w.lead_shape(alphas, 2), diff, tag="scaled"), tag="points")
        g, target, n = w.stacked(rows, 1)
        attr = _mean0(w, em.op("Mul", w.double(g), w.double(diff), tag="times_diff"))
        relevance = em.op("Cast", attr, to=w.dtype, tag="attribution")
    return w.finish(relevance, target, n, extra + drawn)


__all__ = ["noise_tunnel_model", "expected_gradients_model", "NOISE_INPUT", "INDICES_INPUT", "ALPHAS_INPUT"]
