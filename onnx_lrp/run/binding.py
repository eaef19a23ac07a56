"""Where each input and output of a relevance model's run lives, and what crosses between host and device.

Every run goes through onnxruntime's IOBinding (:meth:`onnx_lrp.run.runtime.Session.run_bound`):

* host arrays (numpy, or anything ``numpy.asarray`` takes) are bound where they are: on the CPU without a copy, on
  CUDA copied to the device once by onnxruntime;
* device arrays are bound in place, without a copy: an onnxruntime ``OrtValue``, or a tensor of a library that
  speaks DLPack (``__dlpack__``: torch, cupy, jax) or ``__cuda_array_interface__`` (numba) on the GPU;
* outputs: when ``x`` is given as device arrays, the relevance, the ``relevance_at`` tensors and the model's outputs
  stay where ``x`` is and come back as the caller's kind (torch / cupy tensors through DLPack, else ``OrtValue``);
  the target, the explained value and the checks' few numbers per item (:func:`onnx_lrp.lrp.rewriter.check_outputs`)
  always come to the host. With host arrays everything comes back as numpy, as before.

:func:`plan` says, without running anything, where each value is bound and how many bytes cross the bus per call;
the runner follows it. Only numpy here (and the caller's own library, through the objects it passed).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from ..core.errors import InputError

# DLPack device types (dlpack.h)
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED = 1, 2, 3, 13
_HOST_TYPES = (DL_CPU, DL_CUDA_HOST)
_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
              "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
              "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_}


@dataclass(frozen=True)
class DeviceArray:
    """An input the caller gave as a device array (or an OrtValue): bound in place, never copied to the host."""

    value: object  # the caller's object
    kind: str  # "ortvalue", "dlpack" (torch, cupy, jax, ...) or "cai" (only __cuda_array_interface__)
    device: str  # "cpu" or "cuda"
    index: int  # the device's ordinal
    shape: tuple
    dtype: np.dtype
    library: str  # the top-level module of the caller's type ("torch", "cupy", "onnxruntime", ...)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def reshaped(self, shape: tuple) -> "DeviceArray":
        """The same memory under another shape of as many elements (a single item given without its batch axis)."""
        return DeviceArray(self.value, self.kind, self.device, self.index, tuple(shape), self.dtype, self.library)


def _is_ortvalue(a) -> bool:
    t = type(a)
    return t.__name__ == "OrtValue" and t.__module__.split(".")[0] == "onnxruntime"


def _dtype_of(a) -> np.dtype | None:
    dt = getattr(a, "dtype", None)
    if dt is None:
        return None
    try:
        return np.dtype(str(dt).replace("torch.", ""))
    except TypeError:
        return None


def _known_dtype(a) -> np.dtype:
    dt = _dtype_of(a)
    if dt is None:
        raise InputError(f"a device array of element type {getattr(a, 'dtype', '?')}, which onnxruntime's Python API "
                         "cannot bind; give float16/32/64 or integer data")
    return dt


def classify(a) -> DeviceArray | None:
    """The :class:`DeviceArray` for an OrtValue or an array on a GPU; None for host data (numpy's to handle)."""
    library = type(a).__module__.split(".")[0]
    if _is_ortvalue(a):
        name = a.device_name().lower()
        return DeviceArray(a, "ortvalue", "cuda" if name in ("cuda", "gpu") else name, 0, tuple(a.shape()),
                           np.dtype(_ORT_TYPES.get(a.data_type(), np.float32)), "onnxruntime")
    if isinstance(a, np.ndarray):
        return None
    device = getattr(a, "__dlpack_device__", None)
    if device is not None:
        try:
            kind, index = device()
        except Exception:  # noqa: BLE001 - an object that cannot say where it lives is read as host data
            return None
        if int(kind) in _HOST_TYPES:
            return None
        if int(kind) not in (DL_CUDA, DL_CUDA_MANAGED):
            raise InputError(f"an input lives on a device onnx-lrp cannot read (DLPack device type {int(kind)}); "
                             "give it as a numpy array or a CUDA tensor")
        return DeviceArray(a, "dlpack", "cuda", int(index), tuple(int(d) for d in a.shape), _known_dtype(a), library)
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        return DeviceArray(a, "cai", "cuda", 0, tuple(int(d) for d in cai["shape"]), np.dtype(cai["typestr"]),
                           library)
    return None


def contiguous(a: DeviceArray) -> bool:
    """Whether the device array is C-contiguous (onnxruntime binds dense row-major memory only)."""
    if a.kind == "ortvalue":
        return True
    check = getattr(a.value, "is_contiguous", None)  # torch
    if callable(check):
        return bool(check())
    flags = getattr(a.value, "flags", None)  # cupy
    if flags is not None and hasattr(flags, "c_contiguous"):
        return bool(flags.c_contiguous)
    cai = getattr(a.value, "__cuda_array_interface__", None)
    if cai is not None and cai.get("strides") is not None:
        want, step = [], a.dtype.itemsize
        for d in reversed(a.shape):
            want.insert(0, step)
            step *= d
        return tuple(cai["strides"]) == tuple(want)
    return True


def settle(a: DeviceArray) -> None:
    """Wait for the caller's library to finish writing ``a``: onnxruntime reads it on a stream of its own (torch's
    current stream, cupy's device)."""
    if a.kind == "ortvalue" or a.device != "cuda":
        return
    module = sys.modules.get(a.library)
    try:
        if a.library == "torch":
            module.cuda.current_stream(a.value.device).synchronize()
        elif a.library == "cupy":
            a.value.device.synchronize()
    except Exception:  # noqa: BLE001 - best effort: the library's own synchronisation when it has one
        pass


def to_kind(value, like: DeviceArray):
    """An output (an onnxruntime OrtValue) as the caller's kind: the OrtValue itself for OrtValue inputs, else the
    caller's library's tensor over the same memory (``from_dlpack``); an OrtValue where the library has none."""
    if like.kind != "dlpack":
        return value
    module = sys.modules.get(like.library)
    convert = getattr(module, "from_dlpack", None)
    if convert is None:
        return value
    if not hasattr(value, "__dlpack__"):  # an onnxruntime without DLPack on its public OrtValue
        value = value._get_c_value().to_dlpack()  # noqa: SLF001 - onnxruntime's capsule, its documented form
    return convert(value)


def to_host(value) -> np.ndarray:
    """A copy on the host of an output or input in any kind (for the rare paths that must read the data: the
    diagnosis of non-finite relevance, the deployed model's run)."""
    if isinstance(value, np.ndarray):
        return value
    if _is_ortvalue(value):
        return np.asarray(value.numpy())
    for method in ("get", "cpu"):  # cupy: .get(); torch: .cpu()
        f = getattr(value, method, None)
        if callable(f):
            value = f()
            break
    if hasattr(value, "detach"):
        value = value.detach()
    return np.asarray(value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else value)


def shape_of(value) -> tuple:
    """The shape of an output of any kind (OrtValue's is a method)."""
    shape = value.shape() if _is_ortvalue(value) else value.shape
    return tuple(int(d) for d in shape)


@dataclass(frozen=True)
class Place:
    """Where one input or output of a run is bound, and what crosses the bus for it."""

    name: str
    device: str  # "cpu" or "cuda"
    index: int
    copied: str  # "" (bound in place), "to device" (a host input on CUDA), "to host" (a device output fetched)


@dataclass(frozen=True)
class Plan:
    """Where a run binds its inputs and outputs (:func:`plan`)."""

    inputs: tuple  # Place per input
    outputs: tuple  # Place per output
    returned_as: str  # "numpy", or the caller's kind for the outputs left on its device ("dlpack", "ortvalue", ...)

    def copied(self, direction: str) -> list[str]:
        return [p.name for p in self.inputs + self.outputs if p.copied == direction]


def plan(session_device: str, feeds: dict, outputs: list[str], host_outputs: set[str]) -> Plan:
    """Where each feed (numpy arrays or :class:`DeviceArray`) and output is bound in a session on
    ``session_device``: host feeds stay on the host (copied once to CUDA by onnxruntime), device arrays in place;
    outputs in ``host_outputs`` (the small ones) come to the host, the others stay beside the first device array
    given (or come to the host when every feed is a host array). Refuses, in one line, a CUDA array for a CPU
    session and arrays on different devices."""
    like = first_device_array(feeds)
    places = []
    for name, a in feeds.items():
        if isinstance(a, DeviceArray):
            if a.device == "cuda" and session_device != "cuda":
                raise InputError(f"input {name!r} is on the GPU (cuda:{a.index}) but the explainer runs on the CPU; "
                                 "give a host (numpy) array, or build the explainer with device='cuda'")
            if a.device == "cuda" and a.index != 0:
                raise InputError(f"input {name!r} is on cuda:{a.index}; onnx-lrp's CUDA session runs on cuda:0 "
                                 "(set CUDA_VISIBLE_DEVICES to choose the GPU)")
            places.append(Place(name, a.device, a.index, ""))
        else:
            places.append(Place(name, "cpu", 0, "to device" if session_device == "cuda" else ""))
    out = []
    for name in outputs:
        device, index = ("cpu", 0) if name in host_outputs or like is None else (like.device, like.index)
        copied = "to host" if session_device == "cuda" and device == "cpu" else ""
        out.append(Place(name, device, index, copied))
    return Plan(tuple(places), tuple(out), "numpy" if like is None else like.kind)


def first_device_array(feeds: dict) -> DeviceArray | None:
    """The device array whose kind and place the outputs follow: the first one among the feeds."""
    return next((a for a in feeds.values() if isinstance(a, DeviceArray)), None)


def bytes_moved(p: Plan, feeds: dict, results: dict) -> dict:
    """Bytes that crossed between host and device in a run bound by ``p`` (``results``: its outputs)."""
    nbytes = {n: (a.nbytes if isinstance(a, DeviceArray) else np.asarray(a).nbytes) for n, a in feeds.items()}
    to_device = sum(nbytes[q.name] for q in p.inputs if q.copied == "to device")
    to_host = sum(int(np.prod(shape_of(results[q.name]), dtype=np.int64)) * _itemsize(results[q.name])
                  for q in p.outputs if q.copied == "to host" and q.name in results)
    return {"to_device": int(to_device), "to_host": int(to_host)}


def _itemsize(value) -> int:
    if isinstance(value, np.ndarray):
        return value.itemsize
    dt = _dtype_of(value)
    if dt is None and _is_ortvalue(value):
        dt = np.dtype(_ORT_TYPES.get(value.data_type(), np.float32))
    return 4 if dt is None else dt.itemsize


def fits(dims, shape) -> bool:
    """Whether ``shape`` fits the static ``dims`` (None: any size)."""
    return all(d is None or d == s for d, s in zip(dims, shape))


def check_shape(spec, shape: tuple) -> None:
    """Refuse, in one line, an input whose shape does not fit its InputSpec."""
    if len(shape) != len(spec.dims) or not fits(spec.dims[1:], shape[1:]):
        want = "x".join("N" if i == 0 else ("?" if d is None else str(d)) for i, d in enumerate(spec.dims))
        raise InputError(f"input {spec.name!r} has shape {'x'.join(map(str, shape))}; the model wants {want}")


def device_feed(spec, a: DeviceArray) -> DeviceArray:
    """A device array checked against its input (an InputSpec): its type exactly (it is read in place, never
    cast), C-contiguous, its shape; given a batch axis where it came as one item."""
    if a.dtype != spec.dtype:
        raise InputError(f"input {spec.name!r} is a device array of {a.dtype}; the model wants {spec.dtype} (device "
                         "arrays are read in place: convert it on the device, e.g. x.to(torch.float32))")
    if not contiguous(a):
        raise InputError(f"input {spec.name!r} is not contiguous in memory; give x.contiguous()")
    if spec.dims:
        if a.ndim == len(spec.dims) - 1 and fits(spec.dims[1:], a.shape):
            a = a.reshaped((1,) + a.shape)
        check_shape(spec, a.shape)
    return a


def on_host(feeds: dict, what: str) -> dict:
    """The feeds as numpy arrays, device arrays copied to the host (for the runs that need them there: ``what``)."""
    if not any(isinstance(a, DeviceArray) for a in feeds.values()):
        return feeds
    try:
        return {k: to_host(a.value).reshape(a.shape) if isinstance(a, DeviceArray) else a for k, a in feeds.items()}
    except Exception as exc:  # noqa: BLE001 - the caller's library could not copy it
        raise InputError(f"{what} needs the inputs on the host, and this device array could not be copied there "
                         f"({type(exc).__name__}); give numpy arrays") from None


__all__ = ["DeviceArray", "Place", "Plan", "bytes_moved", "check_shape", "classify", "contiguous", "device_feed",
           "first_device_array", "fits", "on_host", "plan", "settle", "shape_of", "to_host", "to_kind"]
