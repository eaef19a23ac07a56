"""Rule parameters as JSON and back (arrays, e.g. per-channel ZBox bounds, as nested lists with their dtype): how a
snapshot and a dataset manifest record the parameters a composite was given."""
from __future__ import annotations


def params_to_json(params: dict) -> dict:
    """Rule-parameter overrides as JSON (arrays as {"array": nested lists, "dtype": ...})."""
    import numpy as np  # listing composites (`onnx-lrp composites`) imports no numpy

    out = {}
    for k, v in params.items():
        if isinstance(v, np.ndarray) or isinstance(v, (list, tuple)):
            a = np.asarray(v)
            out[k] = {"array": a.tolist(), "dtype": str(a.dtype)}
        elif isinstance(v, (np.floating, np.integer)):
            out[k] = v.item()
        else:
            out[k] = v
    return out


def params_from_json(data: dict) -> dict:
    """The parameters :func:`params_to_json` wrote (arrays back as numpy arrays)."""
    import numpy as np

    out = {}
    for k, v in (data or {}).items():
        out[k] = np.asarray(v["array"], dtype=v.get("dtype", "float32")) if isinstance(v, dict) else v
    return out


__all__ = ["params_from_json", "params_to_json"]
