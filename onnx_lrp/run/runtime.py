"""Execution on onnxruntime; the only module that imports ``onnxruntime``."""
from __future__ import annotations

import contextlib
import io
import os
import re
import warnings

import numpy as np

from ..core.errors import DeviceError, InputError, LrpWarning, ModelError


try:
    import onnxruntime as ort
except ImportError as _exc:  # reported with the repair command when a session is needed
    ort, _IMPORT_ERROR = None, _exc
else:
    _IMPORT_ERROR = None

PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}
REPAIR = ("repair it with: pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime "
          "(or onnxruntime-gpu for CUDA, never both)")


def installed_runtimes() -> list[str]:
    """The onnxruntime distributions pip has installed (onnxruntime, onnxruntime-gpu, ...)."""
    from importlib import metadata

    names = []
    for dist in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino",
                 "ort-nightly", "ort-nightly-gpu"):
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        names.append(dist)
    return names


_warned_mixed = False


def check_install() -> None:
    """Raise DeviceError with the repair command when onnxruntime is missing, broken or mixed.

    onnxruntime and onnxruntime-gpu install into one folder: with both installed the last one wins, and removing
    either leaves a module without SessionOptions."""
    dists = installed_runtimes()
    if ort is None:
        raise DeviceError(f"onnxruntime cannot be imported ({_IMPORT_ERROR}); " + REPAIR)
    if not hasattr(ort, "SessionOptions") or not hasattr(ort, "InferenceSession"):
        raise DeviceError("onnxruntime is broken (the module has no SessionOptions"
                          + (f"; installed: {', '.join(dists)}" if dists else "") + "); " + REPAIR)
    global _warned_mixed
    if len(dists) > 1 and not _warned_mixed:
        _warned_mixed = True
        warnings.warn(f"both {' and '.join(dists)} are installed and share one folder (uninstalling either breaks "
                      "the other); " + REPAIR, LrpWarning, stacklevel=3)


def quiet() -> None:
    """onnxruntime's own log: errors only (its warnings are not for our users). This is onnxruntime's process-wide
    default logger: sessions a program creates itself after importing onnx_lrp log errors only too, unless it sets
    their ``log_severity_level``."""
    if ort is not None and hasattr(ort, "set_default_logger_severity"):
        ort.set_default_logger_severity(3)


quiet()


_preloaded = False


def preload_cuda() -> None:
    """Load the CUDA and cuDNN libraries that pip installed as wheels (onnxruntime-gpu's ``cuda`` and ``cudnn``
    extras: the nvidia-* packages) before the first CUDA session, so a machine with only the NVIDIA driver finds
    them; onnxruntime's own ``preload_dlls`` (1.21+) does it. Without those wheels the system's libraries are used
    as before. Once per process; its messages (printed on stdout) are dropped."""
    global _preloaded
    if _preloaded or ort is None or not hasattr(ort, "preload_dlls"):
        return
    _preloaded = True
    from importlib.util import find_spec

    try:
        wheels = find_spec("nvidia") is not None
    except (ImportError, ValueError):
        wheels = False
    if not wheels:
        return
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            ort.preload_dlls(directory="")  # "": the nvidia site packages first, then the default paths
        except Exception:  # a library that cannot be loaded is reported by the CUDA session that needs it
            pass


def cuda_options(tf32: bool = False) -> dict:
    """The CUDA provider's options: TF32 off unless asked for. onnxruntime's default (on) computes convolutions
    and matrix products with 10-bit mantissas: relevance then differs from the CPU's by rel-L2 up to ~2e-2
    (VGG16), 1e-3 (ResNet50) on an H200; README "GPU" has the measured drift and speed."""
    return {"use_tf32": "1" if tf32 else "0"}


_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
                "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
                "tensor(int8)": np.int8,
                "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
                "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_}

#: the x86 CPU flags that decide which int8 kernels onnxruntime's MLAS runs (it reads CPUID at run time): without
#: a VNNI flag, its u8s8 kernels add pairs of 8-bit products in 16-bit registers, which saturate
INT8_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")


def cpu_facts() -> dict:
    """What decides onnxruntime's int8 arithmetic on this machine: the architecture, onnxruntime's version and the
    int8-relevant CPU flags (Linux: /proc/cpuinfo; None where they cannot be read)."""
    import platform

    flags = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    flags = [name for name in INT8_FLAGS if name in present]
                    break
    except OSError:
        flags = None
    return dict(machine=platform.machine(), onnxruntime=getattr(ort, "__version__", None), cpu_flags=flags)


def available_devices() -> list[str]:
    check_install()
    provs = ort.get_available_providers()
    return ["cpu"] + (["cuda"] if "CUDAExecutionProvider" in provs else [])


def resolve_device(device: str) -> str:
    if device is not None and not isinstance(device, str):
        raise InputError(f"device must be 'cpu', 'cuda' or 'auto', not {device!r}")
    check_install()  # before any work: a broken onnxruntime is named with its repair command
    device = (device or "cpu").lower()
    if device == "auto":
        return "cuda" if "cuda" in available_devices() else "cpu"
    if device not in PROVIDERS:
        raise InputError(f"unknown device {device!r}; use cpu, cuda or auto")
    if device == "cuda" and "cuda" not in available_devices():
        raise DeviceError("CUDA was asked for but onnxruntime has no CUDAExecutionProvider here "
                          f"(providers: {', '.join(ort.get_available_providers())}); install onnx-lrp's CUDA build in "
                          "place of the CPU one: pip uninstall -y onnxruntime && ONNX_LRP_RUNTIME=cuda pip install -e "
                          ". (in the clone; README, Install), or use --device cpu")
    return device


def _external_data(opts, folder: str | None, arrays: dict, prepack: bool) -> None:
    """Session options for a model with external data: its data files' folder (onnxruntime maps them itself), the
    in-memory tensors as external initializers (no copy), and, for a model over 1 GiB of weights, no pre-packing
    (a packed copy of every MatMul weight doubles the memory: README, "Large models, float16 and bfloat16")."""
    if folder is not None:
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    if arrays:
        opts.add_external_initializers(list(arrays), [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays.values()])
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")


class Session:
    """An onnxruntime session built once and reused.

    ``model_bytes``: the model's bytes (or, for ``deployed``, also a file path: onnxruntime reads external data beside
    it). A relevance model runs its Q/DQ pairs as written (``session.disable_quant_qdq``); a ``deployed`` model runs
    with onnxruntime's defaults, as a user's plain ``InferenceSession`` does (its integer kernels, its QDQ fusions).
    ``config``: further session config entries (the gap diagnosis of :mod:`onnx_lrp.run.deployed_gap` sets
    ``session.x64quantprecision`` and ``session.disable_quant_qdq``).

    ``data_folder``, ``arrays``, ``prepack``: a model with external data (:class:`onnx_lrp.load.external.Parts`): read
    from its folder, onnx-lrp's own large tensors handed over from memory (referenced as long as the session: used
    in place), no weight pre-packing over 1 GiB of weights. ``precise``: no layout optimisations (see ``_start``)."""

    def __init__(self, model_bytes, device: str = "cpu", threads: int | None = None, deployed: bool = False,
                 config: dict | None = None, data_folder: str | None = None, arrays: dict | None = None,
                 prepack: bool = True, precise: bool = False, tf32: bool = False):
        check_install()
        self.precise = precise
        self.data_folder, self.arrays, self.prepack = data_folder, dict(arrays or {}), prepack
        self.deployed = deployed
        self.config = dict(config or {})
        self.threads = threads
        self.device = resolve_device(device)
        self.tf32 = bool(tf32)
        self.fallback = None  # why device "auto" fell back to the CPU, if it did
        trying = device == "auto" and self.device == "cuda"
        try:
            if trying:  # a CUDA provider that cannot start logs errors of its own: silent while we try
                ort.set_default_logger_severity(4)
            self._start(model_bytes, threads, quiet=trying)
        except DeviceError as exc:
            if device != "auto":
                raise
            self.fallback = str(exc).split(";")[0]
            self.device = "cpu"
            self._start(model_bytes, threads)
        finally:
            if trying:
                quiet()

    def _start(self, model_bytes: bytes, threads: int | None, quiet: bool = False) -> None:
        opts = ort.SessionOptions()
        # precise: no layout optimisations (NCHWc blocked convolutions), which lose digits on deep residual nets:
        # ResNet50 vs zennit float64 (epsilon 0.01) 4.5e-4 -> 8.9e-5, zennit's own float32 5.6e-5; ~13 % slower
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED if self.precise else \
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if not self.deployed:
            # relevance models: run Q/DQ pairs as written (the float path the relevance is computed on); ORT's QDQ
            # fusions would regroup them around the float weights the qdq loading pass folds
            opts.add_session_config_entry("session.disable_quant_qdq", "1")
        for key, value in self.config.items():
            opts.add_session_config_entry(key, value)
        threads = threads if threads is not None else int(os.environ.get("ONNX_LRP_THREADS", "0"))
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        opts.log_severity_level = 4  # fatal only: onnx-lrp reports every error itself, in one line
        providers = PROVIDERS[self.device]
        if self.device == "cuda":
            preload_cuda()
            providers = [("CUDAExecutionProvider", cuda_options(self.tf32))] + providers[1:]
        _external_data(opts, self.data_folder, self.arrays, self.prepack)
        try:
            with warnings.catch_warnings():  # onnxruntime's own warnings (e.g. an unavailable provider) stay quiet
                warnings.simplefilter("ignore")
                self.session = ort.InferenceSession(model_bytes, sess_options=opts, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if self.device == "cuda":
                raise DeviceError(f"onnxruntime could not start the model on CUDA ({msg}); check the CUDA and "
                                  "cuDNN libraries, or use --device cpu") from None
            node = re.search(r"node with name '([^']*)'|Node \(([^)]*)\)", msg)
            foreign = re.search(r"([\w.]+):\w+\(-?\d+\) is not a registered function/op", msg)
            if self.deployed:
                raise ModelError(f"onnxruntime cannot run the deployed model as written: {msg}") from None
            if (node and not (node.group(1) or node.group(2) or "").startswith("lrp/")) or (
                    foreign and foreign.group(1) not in ("", "ai.onnx")):  # relevance graphs add default-domain ops
                raise ModelError(f"onnxruntime cannot run the model itself (not only its relevance graph): {msg}; "
                                 "check that the model runs in plain onnxruntime") from None
            raise InputError(f"onnxruntime cannot load the model: {msg}") from None
        if self.device == "cuda" and "CUDAExecutionProvider" not in self.session.get_providers():
            raise DeviceError("onnxruntime could not start the CUDA provider (check the CUDA and cuDNN libraries); "
                              "use --device cpu")
        self.providers = self.session.get_providers()
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.input_types = {i.name: _NUMPY_TYPES.get(i.type) for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]

    def inputs(self):
        return self.session.get_inputs()

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        names = outputs or self.output_names
        try:
            values = self.session.run(names, feeds)
        except Exception as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if self.deployed:
                raise ModelError(f"onnxruntime cannot run the deployed model itself on this input: "
                                 f"{msg.split('Status Message:')[-1].strip()[:200]}") from None
            node = re.search(r"running (\w+) node\. Name:'([^']*)'", msg)
            if node and not node.group(2).startswith("lrp/"):  # a node of the model itself, not of the relevance
                raise ModelError(f"onnxruntime cannot run node {node.group(2)} ({node.group(1)}) of the model "
                                 f"itself on this input: {msg.split('Status Message:')[-1].strip()[:200]}; check that "
                                 "the model runs in plain onnxruntime on this input (a model traced for one input, "
                                 "e.g. a MoE export's unrolled expert loop, fails on others; an old opset lifted to 17 "
                                 "can break, e.g. PRelu slopes: re-export with opset >= 17)") from None
            if node and node.group(2).startswith("lrp/start/"):  # rows of the explained output are not the items
                raise InputError("the explained output's first axis does not follow the inputs' batch axis at run "
                                 "time (its rows are not the input items), so no target can be set per item: "
                                 "explain another output (--output) or re-export the model so that its output "
                                 f"keeps the batch axis (onnxruntime: {msg.split('Status Message:')[-1].strip()[:120]})"
                                 ) from None
            raise InputError(f"onnxruntime failed to run the model: {msg}") from None
        return dict(zip(names, values))
