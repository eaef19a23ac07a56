"""Images as model input in Python, exactly as the command line reads them (``onnx-lrp explain MODEL IMAGE --size
--mean --std``): the same decoder, resize (the aspect ratio kept: the shorter side fitted, the centre cut, as
torchvision's ``Resize`` + ``CenterCrop``; ``crop=False`` squashes as ``--squash``) and normalisation; and the
box-rule bounds per channel as ``--low a,b,c`` gives them (:func:`shaped_bounds`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.errors import InputError, LrpError
from .inputs import ImageLayout, InputInfo, Preprocess, image_layout, input_infos, model_input_dims
from .inputs import load_image as _load_image


def load_image(path, size=None, *, crop: bool = True, mean=(0.0,), std=(1.0,), model=None, channels: int = 3,
               channels_last: bool = False) -> np.ndarray:
    """The image at ``path`` as a batch of one, float32 [1, C, H, W] ([1, H, W, C] for ``channels_last``): the array
    ``onnx-lrp explain`` feeds the model for the same file and options.

    ``size``: one side (224: the shorter side fitted, then the centre 224x224 cut) or (height, width); default the
    model's input size. ``crop``: keep the aspect ratio (default), else squash to the size (``--squash``). ``mean``,
    ``std``: one value or one per channel, applied to pixels scaled to [0, 1] (``--mean``, ``--std``). ``model``:
    an :class:`onnx_lrp.Explainer` or a model file, whose one image input gives the channels, layout and default
    size; without it ``channels`` (1 or 3) and ``channels_last`` say them."""
    layout = _layout(model, channels, channels_last)
    pre = Preprocess(_size(size), _floats(mean, "mean"), _floats(std, "std"), crop=bool(crop),
                     normalised=True, squash=not crop)
    x, _ = _load_image(Path(path), layout, pre)
    return x[None]


def _layout(model, channels: int, channels_last: bool) -> ImageLayout:
    if model is None:
        if channels not in (1, 3):
            raise InputError(f"channels={channels!r}: images give 1 (grey) or 3 (RGB) channels")
        return ImageLayout(channels, None, None, bool(channels_last))
    if hasattr(model, "inputs"):
        infos = input_infos(model.inputs)
    else:
        infos = model_input_dims(model)
    floats = [i for i in infos if i.dtype.kind == "f"] or infos
    if len(infos) != 1:
        raise InputError(f"the model has {len(infos)} inputs ({', '.join(i.name for i in infos)}); an image feeds "
                         "one")
    return image_layout(InputInfo(floats[0].name, floats[0].dims, floats[0].dtype))


def _size(size) -> tuple | None:
    if size is None:
        return None
    vals = (size, size) if isinstance(size, (int, np.integer)) and not isinstance(size, bool) else \
        tuple(size) if isinstance(size, (tuple, list)) else None
    if vals is None or len(vals) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                                  and 1 <= v <= 16384 for v in vals):
        raise InputError(f"size={size!r}: give one side (224) or (height, width), whole numbers up to 16384")
    return tuple(int(v) for v in vals)


def _floats(values, what: str) -> tuple:
    vals = np.atleast_1d(np.asarray(values, dtype=np.float64)) if not isinstance(values, str) else None
    if vals is None or vals.ndim != 1 or vals.size == 0 or not np.all(np.isfinite(vals)):
        raise InputError(f"{what}={values!r}: give one finite number or one per channel")
    return tuple(float(v) for v in vals)


def shaped_bounds(model, params: dict) -> dict:
    """``params`` with box-rule bounds given as a flat list of several values (one per channel, as ``--low a,b,c``)
    shaped [C, 1, 1] (one axis of 1 per spatial axis of the model's one float input); others as given."""
    flat = {k: v for k, v in params.items() if k in ("low", "high") and _flat_several(v)}
    if not flat:
        return params
    try:
        floats = [i for i in model_input_dims(model) if i.dtype.kind == "f"]
    except LrpError:
        return params  # the build reports the model
    if len(floats) != 1 or len(floats[0].dims) < 3:
        return params  # per feature (N x F), or not one input: as given
    spatial = (1,) * (len(floats[0].dims) - 2)
    return {**params, **{k: np.asarray(v, np.float32).reshape((-1,) + spatial) for k, v in flat.items()}}


def _flat_several(v) -> bool:
    if isinstance(v, (list, tuple)):
        return len(v) > 1 and all(isinstance(e, (int, float, np.number)) and not isinstance(e, bool) for e in v)
    return isinstance(v, np.ndarray) and v.ndim == 1 and v.size > 1


__all__ = ["load_image", "shaped_bounds"]
