"""Graph inputs the caller fixes before shape inference: bound to constant values (``constants``) or given sizes
for their dynamic dimensions (``input_shapes``)."""
from __future__ import annotations

import numpy as np
import onnx

from ...core.errors import InputError


def _copy_for_inputs(proto: onnx.ModelProto, given, arg: str, what: str, verb: str, name: str):
    """A copy of ``proto`` to change some graph inputs of, and its inputs by name; ``given`` (input name -> ``what``)
    must be a dict naming only inputs of the model (else one line, ``verb`` saying what could not be done)."""
    if not isinstance(given, dict):
        raise InputError(f"{arg} must be a dict of input name -> {what}, not {type(given).__name__}")
    names = [v.name for v in proto.graph.input]
    unknown = [k for k in given if k not in names]
    if unknown:
        raise InputError(f"{name}: cannot {verb.format(', '.join(map(repr, unknown)))}: the model's inputs are "
                         f"{', '.join(names)}")
    proto = onnx.ModelProto.FromString(proto.SerializeToString()) if proto.ByteSize() < (1 << 31) - 1 else proto
    return proto, {v.name: v for v in proto.graph.input}


def bind_constants(proto: onnx.ModelProto, constants: dict | None, name: str = "model") -> onnx.ModelProto:
    """Graph inputs the caller fixes (``constants``: input name -> value), made initializers of the input's type:
    a sample rate or a flag that an If branches on. The bound inputs are no longer inputs of the model."""
    if not constants:
        return proto
    proto, by_name = _copy_for_inputs(proto, constants, "constants", "value", "bind {} to a constant", name)
    inits = {t.name for t in proto.graph.initializer}
    for key, value in constants.items():
        vi = by_name[key]
        tt = vi.type.tensor_type
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
            arr = np.asarray(value)
            if arr.dtype == object or (arr.dtype.kind == "f" and dtype.kind in "iub" and
                                       not np.all(arr == np.round(arr))):
                raise ValueError
            arr = arr.astype(dtype)
        except (ValueError, TypeError):
            raise InputError(f"{name}: constant for input {key!r} must be a number or array convertible to its type "
                             f"{onnx.helper.tensor_dtype_to_string(tt.elem_type)}, not {value!r}") from None
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim] if tt.HasField("shape") \
            else None
        if dims is not None and arr.shape != tuple(dims):
            if arr.size == int(np.prod([d or 1 for d in dims])) and len(dims) == len(dims) and None not in dims:
                arr = arr.reshape(dims)
            elif len(dims) != arr.ndim or any(d is not None and d != a for d, a in zip(dims, arr.shape)):
                raise InputError(f"{name}: constant for input {key!r} has shape {list(arr.shape)}; the input's is "
                                 f"{['?' if d is None else d for d in dims]}")
        if key in inits:
            raise InputError(f"{name}: input {key!r} already has a default value (an initializer); it is a parameter")
        proto.graph.initializer.append(onnx.numpy_helper.from_array(arr, key))
    kept = [v for v in proto.graph.input if v.name not in constants]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    proto.ir_version = max(proto.ir_version, 4)
    return proto


def fix_input_shapes(proto: onnx.ModelProto, shapes: dict | None, name: str = "model") -> onnx.ModelProto:
    """Dynamic dimensions of graph inputs fixed by the caller (``shapes``: input name -> sizes, one per axis) before
    shape inference, so that shape checks (an ``If`` on ``x.shape[0] == 1``) fold. A static dimension keeps its size:
    giving it another one, an unknown input or another rank is refused. Two inputs sharing a symbolic dimension
    (``batch``) must get the same size for it; inputs not given take the sizes of the symbolic dimensions fixed."""
    if not shapes:
        return proto
    proto, by_name = _copy_for_inputs(proto, shapes, "input_shapes", "sizes", "fix the shape of {}", name)
    symbols: dict[str, tuple[int, str]] = {}
    for key, sizes in shapes.items():
        given = sizes
        try:
            arr = np.asarray(given, dtype=np.float64)
            if isinstance(given, (str, bytes)) or arr.ndim != 1 or not np.all((arr >= 1) & (arr <= 2 ** 62) & (arr == np.round(arr))):
                raise ValueError
            sizes = [int(a) for a in arr]
        except (ValueError, TypeError, OverflowError):
            raise InputError(f"{name}: the shape for input {key!r} must be positive integer sizes, one per axis "
                             f"(e.g. (1, 512)), not {given!r}") from None
        vi = by_name[key]
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            raise InputError(f"{name}: input {key!r} has no declared rank; its shape cannot be fixed")
        dims = vi.type.tensor_type.shape.dim
        have = "x".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)
        if len(dims) != len(sizes):
            raise InputError(f"{name}: the shape {'x'.join(map(str, sizes))} for input {key!r} has rank {len(sizes)}; "
                             f"the input's is {have or '(a scalar)'} (rank {len(dims)})")
        for axis, (d, s) in enumerate(zip(dims, sizes)):
            if d.HasField("dim_value"):
                if d.dim_value != s:
                    raise InputError(f"{name}: input {key!r} has the static size {d.dim_value} on axis {axis}, not "
                                     f"{s}; only its dynamic dimensions ({have}) can be fixed")
                continue
            if d.dim_param:
                prev = symbols.setdefault(d.dim_param, (s, key))
                if prev[0] != s:
                    raise InputError(f"{name}: inputs {prev[1]!r} and {key!r} share the dimension {d.dim_param!r}; "
                                     f"it was fixed to {prev[0]} and {s}")
            d.Clear()
            d.dim_value = s
    for vi in proto.graph.input:  # the inputs not given that share a fixed symbolic dimension take its size
        if vi.name not in shapes and vi.type.HasField("tensor_type"):
            for d in vi.type.tensor_type.shape.dim:
                if not d.HasField("dim_value") and d.dim_param in symbols:
                    size = symbols[d.dim_param][0]
                    d.Clear()
                    d.dim_value = size
    return proto
