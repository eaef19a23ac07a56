"""Execution on onnxruntime; the only module that imports ``onnxruntime``."""
from __future__ import annotations

import contextlib
import io
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Mapping

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


@contextlib.contextmanager
def quiet_while(active: bool = True):
    """onnxruntime's process-wide log at fatal only while inside (``active``): on CUDA, onnxruntime logs the cuDNN
    frontend's refusals of a convolution plan as errors on stderr ("[cudnn_frontend] Error: No execution plans
    support the graph", ``CudaErrString`` in onnxruntime's cudnn_fe_call.cc) and then falls back to another plan:
    nothing failed. Real failures still raise (onnx-lrp reports them in one line); outside, :func:`quiet`'s level."""
    if not active or ort is None or not hasattr(ort, "set_default_logger_severity"):
        yield
        return
    ort.set_default_logger_severity(4)
    try:
        yield
    finally:
        quiet()


@contextlib.contextmanager
def captured_stderr(active: bool = True):
    """What native libraries write to file descriptor 2 while inside (onnxruntime's providers, CUDA, cuDNN write
    there directly, past Python's ``sys.stderr``): held in a temporary file instead of the terminal; yields a list
    that holds those lines on exit (the caller puts the first of them in its error when something failed)."""
    lines: list[str] = []
    if not active:
        yield lines
        return
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(line for line in tmp.read().decode("utf-8", "replace").splitlines() if line.strip())


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


def _keep_packed(model_bytes, deployed: bool, opts=None) -> dict:
    """A relevance model with block-quantized weights (DequantizeLinear with ``block_size``: int4 LLMs) runs without
    onnxruntime's constant folding, which would dequantize them to float32 copies when Q/DQ handling is off, nor its
    common subexpression elimination, which would merge the per-consumer copies of a dequantized weight again
    (building.transient_weights), in the order of its nodes (each copy right before its consumer), and without the
    CPU memory arena, which would keep the blocks of the transient float weights."""
    if deployed or not isinstance(model_bytes, (bytes, bytearray)) or b"block_size" not in model_bytes:
        return {}
    if opts is not None:  # the arena would keep every transient float weight's block (and grow run after run)
        opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        opts.enable_cpu_mem_arena = False
    return {"disabled_optimizers": ["ConstantFolding", "CommonSubexpressionElimination"]}


def basic_optimized(model_bytes: bytes, folder=None) -> bytes:
    """The model after onnxruntime's basic (level 1) graph optimisations, as a CPU session writes it: the graph
    onnxruntime partitions between its providers (constants folded, redundant nodes gone; :mod:`.placement`)."""
    import tempfile

    check_install()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.log_severity_level = 4
    opts.add_session_config_entry("session.disable_quant_qdq", "1")
    if folder is not None:
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    with tempfile.TemporaryDirectory(prefix="onnx-lrp-opt-") as tmp:
        path = os.path.join(tmp, "basic.onnx")
        opts.optimized_model_filepath = path
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", "basic.data")
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(model_bytes, sess_options=opts, providers=["CPUExecutionProvider"])
        with open(path, "rb") as f:
            return f.read()


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


@dataclass(frozen=True)
class ExternalData:
    """A model with external data as onnxruntime receives it (:class:`onnx_lrp.load.external.Parts`): ``folder``,
    the folder of its data files (onnxruntime maps them itself; None: none); ``arrays``, onnx-lrp's own large tensors
    handed over from memory as external initializers (no copy: referenced as long as the session, used in place);
    ``prepack``: False for a model over 1 GiB of weights (a packed copy of every MatMul weight doubles the memory:
    README, "Large models, float16 and bfloat16")."""

    folder: str | None = None
    arrays: Mapping = field(default_factory=dict)
    prepack: bool = True

    def configure(self, opts) -> None:
        """Set the session options for this data."""
        if self.folder is not None:
            opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(self.folder))
        if self.arrays:
            opts.add_external_initializers(list(self.arrays),
                                           [ort.OrtValue.ortvalue_from_numpy(a) for a in self.arrays.values()])
        if not self.prepack:
            opts.add_session_config_entry("session.disable_prepacking", "1")


NO_EXTERNAL_DATA = ExternalData()
# a config entry of Session ("1"): onnxruntime's memory reuse off. The same kernels and arithmetic; for graphs whose
# declared shapes mislead onnxruntime's buffer planner (onnxruntime-genai's CPU float16 folders from the second
# cached step: onnx_lrp.run.generation)
NO_MEMORY_REUSE = "onnx_lrp.no_memory_reuse"


def _configure(opts, config: dict) -> None:
    """Session config entries on ``opts`` (NO_MEMORY_REUSE and MEM_PATTERN: session options, not config entries)."""
    for key, value in config.items():
        if key == NO_MEMORY_REUSE:
            opts.enable_mem_reuse = str(value) != "1"
        elif key == MEM_PATTERN:
            opts.enable_mem_pattern = str(value) != "0"
        else:
            opts.add_session_config_entry(key, value)

#: a ``config`` entry of :class:`Session` that is no onnxruntime config entry: "0" turns onnxruntime's memory
#: pattern off (the methods' stacked runs: with it, a run of a shape seen before takes one new block the size of all
#: its tensors beside the arena's chunks from the first run, twice the memory; without it the chunks are reused)
MEM_PATTERN = "onnx_lrp.mem_pattern"


class Session:
    """An onnxruntime session built once and reused.

    ``model_bytes``: the model's bytes (or, for ``deployed``, also a file path: onnxruntime reads external data beside
    it). A relevance model runs its Q/DQ pairs as written (``session.disable_quant_qdq``); a ``deployed`` model runs
    with onnxruntime's defaults, as a user's plain ``InferenceSession`` does (its integer kernels, its QDQ fusions).
    ``config``: further session config entries (the gap diagnosis of :mod:`onnx_lrp.run.deployed_gap` sets
    ``session.x64quantprecision`` and ``session.disable_quant_qdq``).

    ``external``: a model with external data (:class:`ExternalData`: its folder, onnx-lrp's own large tensors handed
    over from memory, no weight pre-packing over 1 GiB of weights). ``precise``: no layout optimisations (see
    ``_start``)."""

    def __init__(self, model_bytes, device: str = "cpu", threads: int | None = None, deployed: bool = False,
                 config: dict | None = None, external: ExternalData = NO_EXTERNAL_DATA, precise: bool = False,
                 tf32: bool = False):
        check_install()
        self.precise = precise
        self.external = external
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
        # precise: no layout optimisations (NCHWc blocked convolutions): the same float32 computation rounded
        # otherwise, ~13 % slower. Not more exact: both are as close to a float64 run of the relevance model as
        # zennit's float32 is to its float64 (ResNet50 224 px: 4.8e-7 without, 7.9e-7 with, zennit 5.5e-7); each
        # can round a max-pool near-tie the other way (docs/limitations.md, Numerics)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED if self.precise else \
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if not self.deployed:
            # relevance models: run Q/DQ pairs as written (the float path the relevance is computed on); ORT's QDQ
            # fusions would regroup them around the float weights the qdq loading pass folds
            opts.add_session_config_entry("session.disable_quant_qdq", "1")
        _configure(opts, self.config)
        threads = _threads(threads)
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        opts.log_severity_level = 4  # fatal only: onnx-lrp reports every error itself, in one line
        providers = PROVIDERS[self.device]
        if self.device == "cuda":
            preload_cuda()
            providers = [("CUDAExecutionProvider", cuda_options(self.tf32))] + providers[1:]
        self.external.configure(opts)
        cuda = self.device == "cuda"
        try:  # onnxruntime's own warnings (e.g. an unavailable provider) and the CUDA libraries' lines stay quiet
            with warnings.catch_warnings(), quiet_while(cuda), captured_stderr(cuda) as said:
                warnings.simplefilter("ignore")
                self.session = ort.InferenceSession(model_bytes, sess_options=opts, providers=providers,
                                                    **_keep_packed(model_bytes, self.deployed, opts))
        except Exception as exc:  # onnxruntime raises its own exception types
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if cuda:
                why = f"; the CUDA libraries said: {said[0][:200]}" if said else ""
                raise DeviceError(f"onnxruntime could not start the model on CUDA ({msg}{why}); check the CUDA and "
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
            with quiet_while(self.device == "cuda"):
                values = self.session.run(names, feeds)
        except Exception as exc:
            raise self._run_failed(exc) from None
        return dict(zip(names, values))

    def run_bound(self, feeds: dict, plan) -> dict:
        """One run through onnxruntime's IOBinding (:mod:`onnx_lrp.run.binding`): host arrays bound where they are
        (copied to the device once on CUDA), device arrays (:class:`~onnx_lrp.run.binding.DeviceArray`) bound in
        place, each output bound where ``plan`` puts it. Returns onnxruntime ``OrtValue``s by output name."""
        bound = self.session.io_binding()
        alive = []  # OrtValues over the caller's device memory: referenced until the run is over
        for place in plan.inputs:
            a = feeds[place.name]
            if hasattr(a, "kind"):  # a DeviceArray
                if a.kind == "ortvalue" and a.shape == tuple(a.value.shape()):
                    bound.bind_ortvalue_input(place.name, a.value)
                    continue
                ptr, owner = _pointer(a)
                alive.append(owner)
                bound.bind_input(place.name, a.device, a.index, a.dtype.type, list(a.shape), ptr)
            else:
                bound.bind_cpu_input(place.name, a)
        for place in plan.outputs:
            bound.bind_output(place.name, place.device, place.index)
        try:
            with quiet_while(self.device == "cuda"):
                self.session.run_with_iobinding(bound)
        except Exception as exc:
            raise self._run_failed(exc) from None
        return dict(zip([p.name for p in plan.outputs], bound.get_outputs()))

    def _run_failed(self, exc: Exception) -> Exception:
        """onnxruntime's exception of a failed run as the one-line error onnx-lrp raises."""
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if self.deployed:
            return ModelError(f"onnxruntime cannot run the deployed model itself on this input: "
                              f"{msg.split('Status Message:')[-1].strip()[:200]}")
        node = re.search(r"running (\w+) node\. Name:'([^']*)'", msg)
        if node and not node.group(2).startswith("lrp/"):  # a node of the model itself, not of the relevance
            return ModelError(f"onnxruntime cannot run node {node.group(2)} ({node.group(1)}) of the model "
                              f"itself on this input: {msg.split('Status Message:')[-1].strip()[:200]}; check that "
                              "the model runs in plain onnxruntime on this input (a model traced for one input, "
                              "e.g. a MoE export's unrolled expert loop, fails on others; an old opset lifted to 17 "
                              "can break, e.g. PRelu slopes: re-export with opset >= 17)")
        if node and node.group(2).startswith("lrp/start/"):  # rows of the explained output are not the items
            return InputError("the explained output's first axis does not follow the inputs' batch axis at run "
                              "time (its rows are not the input items), so no target can be set per item: "
                              "explain another output (--output) or re-export the model so that its output "
                              f"keeps the batch axis (onnxruntime: {msg.split('Status Message:')[-1].strip()[:120]})")
        return InputError(f"onnxruntime failed to run the model: {msg}")


def _pointer(a) -> tuple[int, object]:
    """(address, the object that owns it) of a device array's memory: the library's own pointer where it gives
    one (torch ``data_ptr()``, cupy ``data.ptr``, ``__cuda_array_interface__``), else an OrtValue over it
    (DLPack)."""
    v = a.value
    if callable(getattr(v, "data_ptr", None)):
        return int(v.data_ptr()), v
    data = getattr(v, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return int(data.ptr), v
    try:
        cai = getattr(v, "__cuda_array_interface__", None)
    except Exception:  # noqa: BLE001 - torch refuses it on tensors that require grad
        cai = None
    if cai is not None:
        return int(cai["data"][0]), v
    owner = ort.OrtValue.from_dlpack(v)
    return int(owner.data_ptr()), owner


def _threads(threads) -> int:
    """The intra-op thread count: ``threads`` when given, else ONNX_LRP_THREADS (0 or unset: onnxruntime's
    default); both range-checked (0 to 4 x the CPUs, at most 1024: onnxruntime crashes on absurd counts)."""
    from ..core.validate import env_int, expect_int, max_threads

    if threads is None:
        return env_int("ONNX_LRP_THREADS", 0, 0, max_threads())
    return expect_int(threads, "threads", 0, max_threads())
