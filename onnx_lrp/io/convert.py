"""What the Python API does to the values a caller passes before the run, so that it reads them as the command line
reads files (:mod:`onnx_lrp.io.inputs`): torch tensors become numpy arrays whatever their grad state or device (torch
is imported only when a value is a torch tensor) and the relevance goes back as torch tensors on the first tensor's
device; uint8 arrays for a float input are 8-bit pixels, divided by 255 with the command line's note (a warning); a
channels-last array for a channels-first input (or the reverse) is refused with the transpose that fits; per-channel
box-rule bounds given as a flat list (``low=[a, b, c]``, as ``--low a,b,c``) are shaped per channel
(:func:`onnx_lrp.io.preprocess.shaped_bounds`)."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from ..core.errors import InputError, LrpWarning


def is_torch(value) -> bool:
    """Whether ``value`` is a torch tensor (told without importing torch)."""
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach")


def to_numpy(value, name: str = "x"):
    """A torch tensor as a numpy array (detached, on the CPU; bfloat16 as float32); anything else as given."""
    if not is_torch(value):
        return value
    try:
        t = value.detach()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return t.cpu().numpy()
    except Exception as exc:  # a tensor numpy cannot hold (complex, quantized, sparse, meta)
        raise InputError(f"input {name!r}: cannot read the torch tensor ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:120]}); pass x.detach().float().cpu().numpy()") from None


def pixels_note(what: str) -> str:
    """The note of a uint8 array read as 8-bit pixels (the command line's, the API's warning)."""
    return f"{what}: uint8 values read as 8-bit pixels and divided by 255, as images are"


def layout_hint(what: str, shape: tuple, dims: tuple) -> str | None:
    """One line when an array of ``shape`` does not fit the model input ``dims`` (with or without the batch axis) but
    fits it with its channels moved (HWC / NHWC given for NCHW, or the reverse): the transpose to apply; else None."""
    dims = tuple(dims or ())
    if len(dims) != 4 or not shape or len(shape) not in (3, 4):
        return None
    batched = len(shape) == 4
    want = dims if batched else dims[1:]

    def fits(s):
        return all(d is None or not isinstance(d, int) or d == v for d, v in zip(want, s))

    if fits(shape):
        return None
    model = "x".join("N" if i == 0 else str(d) if isinstance(d, int) else "?" for i, d in enumerate(dims))
    got = "x".join(map(str, shape))
    to_first = (0, 3, 1, 2) if batched else (2, 0, 1)
    to_last = (0, 2, 3, 1) if batched else (1, 2, 0)
    for perm, was, now in ((to_first, "channels last", "channels first"), (to_last, "channels first",
                                                                           "channels last")):
        if fits(tuple(shape[p] for p in perm)):
            return (f"{what} has shape {got} ({was}) but the model wants {model} ({now}); transpose it: "
                    f"x.transpose{perm}" + (" (torch: x.permute" + str(perm) + ")"))
    return None


@dataclasses.dataclass(frozen=True)
class Given:
    """What :func:`api_inputs` made of the caller's ``x``: the arrays to run, and the torch tensor to answer like."""

    x: object
    like: object = None  # the first torch tensor given (the relevance goes back as torch, on its device)


def api_inputs(x, specs, device: str = "cpu") -> Given:
    """The caller's ``x`` (an array, a torch tensor, or a dict of them by input name) read as the command line reads
    files: see the module. ``specs``: the model's inputs (name, dims, dtype). ``device``: the explainer's; a CUDA
    tensor given to an explainer on CUDA is read in place (detached: :mod:`onnx_lrp.run.binding`), any other torch
    tensor is copied to numpy."""
    by_name = {s.name: s for s in specs}
    if isinstance(x, dict):
        like = next((v for v in x.values() if is_torch(v)), None)
        return Given({k: _one(v, by_name.get(k), k, device) for k, v in x.items()}, like)
    spec = specs[0] if len(specs) == 1 else None
    return Given(_one(x, spec, spec.name if spec else "x", device), x if is_torch(x) else None)


def _one(value, spec, name: str, device: str):
    if is_torch(value) and device == "cuda" and getattr(value.device, "type", None) == "cuda":
        return value.detach()  # read in place on the GPU; the relevance comes back there as torch
    a = to_numpy(value, name)
    if not isinstance(a, np.ndarray) or spec is None:
        return a
    if np.dtype(spec.dtype).kind == "f":
        if a.dtype == np.uint8:
            warnings.warn(pixels_note(f"input {name!r}"), LrpWarning, stacklevel=4)
            a = a.astype(np.float32) / np.float32(255.0)
        hint = layout_hint(f"input {name!r}", a.shape, tuple(spec.dims or ()))
        if hint:
            raise InputError(hint)
    return a


def answer_in_kind(res, like):
    """The Explanation ``res`` with its relevance (and ``relevance_at``) as torch tensors on ``like``'s device when
    the caller passed torch (``like`` a tensor); as it is otherwise."""
    if like is None:
        return res
    import torch

    def tensor(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(like.device) if isinstance(a, np.ndarray) else a

    rel = {k: tensor(v) for k, v in res.relevance.items()} if isinstance(res.relevance, dict) else \
        tensor(res.relevance)
    return dataclasses.replace(res, relevance=rel, relevance_at={k: tensor(v) for k, v in res.relevance_at.items()})


__all__ = ["Given", "answer_in_kind", "api_inputs", "is_torch", "layout_hint", "pixels_note", "to_numpy"]
