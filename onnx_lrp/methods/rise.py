"""RISE (Petsiuk et al. 2018, "Randomized Input Sampling for Explanation") as batched forwards of the original model
in plain onnxruntime: ``n_masks`` random masks, the input multiplied by each (filled with ``baselines`` where a
mask is 0), and the saliency ``S = sum_i f(x * M_i + b * (1 - M_i)) M_i / (n_masks * probability)``.

The masks are drawn as the paper draws them: a grid of ``cells`` cells per masked axis, each cell kept with
``probability``, upsampled bilinearly to ``cells + 1`` cells' size and cropped at a random shift below one cell; or
given explicitly (``masks=``: n_masks x the masked axes, the trailing axes of the input after its batch axis, e.g.
H x W for an image N x C x H x W), so that a result can be reproduced against any reference."""
from __future__ import annotations

import numpy as np

from ..core.errors import InputError
from .occlusion import Forward


def masked_axes(x: np.ndarray) -> tuple:
    """The axes RISE masks when it draws its masks: an image's or a sequence's spatial axes (rank >= 3: every axis
    after the batch and channel axes), a vector's features (rank 2)."""
    return x.shape[2:] if x.ndim >= 3 else x.shape[1:]


def upsample_linear(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    """Bilinear (linear along one axis) upsampling with half-pixel centres, clamped at the edges."""
    n = a.shape[axis]
    src = np.clip((np.arange(size) + 0.5) * (n / size) - 0.5, 0, n - 1)
    i0 = np.floor(src).astype(int)
    i1 = np.minimum(i0 + 1, n - 1)
    w = (src - i0).reshape((-1,) + (1,) * (a.ndim - axis - 1))
    return np.take(a, i0, axis=axis) * (1 - w) + np.take(a, i1, axis=axis) * w


def draw_masks(shape: tuple, options) -> np.ndarray:
    """``n_masks`` masks over ``shape`` (float64 in [0, 1]) as the paper draws them, with ``seed``."""
    rng = np.random.default_rng(options.seed)
    cells = options.cells
    grid = (rng.random((options.n_masks,) + (cells,) * len(shape)) < options.probability).astype(np.float64)
    step = [int(np.ceil(d / cells)) for d in shape]
    up = grid
    for k, c in enumerate(step):
        up = upsample_linear(up, k + 1, (cells + 1) * c)
    shifts = [rng.integers(0, c, size=options.n_masks) for c in step]
    out = np.empty((options.n_masks,) + tuple(shape))
    for i in range(options.n_masks):
        out[i] = up[(i,) + tuple(slice(s[i], s[i] + d) for s, d in zip(shifts, shape))]
    return out


def masks_for(x: np.ndarray, options) -> np.ndarray:
    """The masks, n_masks x (1, ...) x the masked axes, ready to broadcast against one item of ``x``."""
    if options.masks is None:
        masks = draw_masks(masked_axes(x), options)
    else:
        masks = options.masks
        tail = masks.shape[1:]
        if len(tail) > x.ndim - 1 or tail != x.shape[x.ndim - len(tail):]:
            raise InputError(f"masks have shape {' x '.join(map(str, masks.shape))}; give n_masks x the input's "
                             f"trailing axes (e.g. n_masks x {' x '.join(map(str, masked_axes(x)))})")
    lead = x.ndim - 1 - (masks.ndim - 1)
    return masks.reshape((masks.shape[0],) + (1,) * lead + masks.shape[1:])


def rise(fwd: Forward, x, targets, options) -> np.ndarray:
    """The RISE saliency of each item's target, N x (1, ...) x the masked axes (float32 for a float32 input); the
    masked copies run a chunk of masks at a time. ``x`` an array, or a dict by input name with one float input (the
    one masked) and integer ones (attention masks, positions) held as given in every copy."""
    name, held = _split(fwd, x)
    x = x[name] if isinstance(x, dict) else x
    masks = masks_for(x, options)
    base = np.broadcast_to(np.asarray(options.baselines, np.float64), x.shape[1:])
    batch, n = x.shape[0], masks.shape[0]
    if targets is None:
        targets = np.argmax(fwd.scores({name: x, **held}), axis=1)
    targets = np.broadcast_to(np.asarray(targets, np.int64).reshape(-1), (batch,))
    total = np.zeros((batch,) + masks.shape[1:], np.float64)
    per_run = max(1, fwd.rows_per_run({name: x, **held}) // batch)
    xf = x.astype(np.float64)
    for start in range(0, n, per_run):
        m = masks[start:start + per_run]
        rows = (xf[None] * m[:, None] + base * (1 - m[:, None])).astype(x.dtype)
        feeds = {name: rows.reshape((-1,) + x.shape[1:]), **{k: np.tile(a, (len(m),) + (1,) * (a.ndim - 1))
                                                            for k, a in held.items()}}
        scores = fwd.entries(feeds, np.tile(targets, len(m))).reshape(len(m), batch)
        total += np.tensordot(scores, m, axes=(0, 0))
    out = total / (n * options.probability)
    return out.astype(x.dtype if x.dtype.kind == "f" else np.float32)


def _split(fwd: Forward, x) -> tuple:
    """The masked input's name and the held inputs (a dict by name) of ``x``: an array (the model's one input), or
    a dict with one float input; else refused in one line."""
    if not isinstance(x, dict):
        if x.dtype.kind != "f":
            raise InputError(f"rise multiplies the input by masks: input {fwd.input!r} must be float, not {x.dtype} "
                             "(token ids: use occlusion with a baseline token, or LRP)")
        return fwd.input, {}
    floats = [k for k, a in x.items() if a.dtype.kind == "f"]
    if len(floats) != 1:
        raise InputError(f"rise masks one float input; the model has {len(floats)} ({', '.join(floats) or 'none'} "
                         f"of {', '.join(x)}): use occlusion or a gradient method")
    return floats[0], {k: a for k, a in x.items() if k != floats[0]}


__all__ = ["rise", "upsample_linear", "draw_masks", "masks_for", "masked_axes"]
