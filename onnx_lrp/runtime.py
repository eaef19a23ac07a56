"""Execution on onnxruntime; the only module that imports ``onnxruntime``."""
from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort

from .errors import DeviceError, InputError

PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


def available_devices() -> list[str]:
    provs = ort.get_available_providers()
    return ["cpu"] + (["cuda"] if "CUDAExecutionProvider" in provs else [])


def resolve_device(device: str) -> str:
    if device is not None and not isinstance(device, str):
        raise InputError(f"device must be 'cpu', 'cuda' or 'auto', not {device!r}")
    device = (device or "cpu").lower()
    if device == "auto":
        return "cuda" if "cuda" in available_devices() else "cpu"
    if device not in PROVIDERS:
        raise InputError(f"unknown device {device!r}; use cpu, cuda or auto")
    if device == "cuda" and "cuda" not in available_devices():
        raise DeviceError("CUDA was asked for but onnxruntime has no CUDAExecutionProvider here "
                          f"(providers: {', '.join(ort.get_available_providers())}); install onnxruntime-gpu with a "
                          "matching CUDA, or use --device cpu")
    return device


class Session:
    """An onnxruntime session built once and reused."""

    def __init__(self, model_bytes: bytes, device: str = "cpu", threads: int | None = None):
        self.device = resolve_device(device)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # QDQ models: run Q/DQ pairs as written, so a relevance model's outputs equal the deployed model's
        # (ORT's QDQ fusions otherwise regroup them around the float weights onnx_lrp.deployed folds)
        opts.add_session_config_entry("session.disable_quant_qdq", "1")
        threads = threads if threads is not None else int(os.environ.get("ONNX_LRP_THREADS", "0"))
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(model_bytes, sess_options=opts, providers=PROVIDERS[self.device])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise InputError(f"onnxruntime cannot load the model: {str(exc).splitlines()[0]}") from None
        if self.device == "cuda" and "CUDAExecutionProvider" not in self.session.get_providers():
            raise DeviceError("onnxruntime could not start the CUDA provider (check the CUDA and cuDNN libraries); "
                              "use --device cpu")
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def inputs(self):
        return self.session.get_inputs()

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        names = outputs or self.output_names
        try:
            values = self.session.run(names, feeds)
        except Exception as exc:
            raise InputError(f"onnxruntime failed to run the model: {str(exc).splitlines()[0]}") from None
        return dict(zip(names, values))
