"""Dependencies with the onnxruntime build chosen at install time (everything else is in pyproject.toml).

onnxruntime and onnxruntime-gpu install into the same folder: with both installed, removing one breaks the other. So
exactly one is required, chosen by the environment variable ONNX_LRP_RUNTIME when pip builds the package:

    pip install -e .                               # onnxruntime (CPU), the default
    ONNX_LRP_RUNTIME=cuda pip install -e .         # onnxruntime-gpu with the CUDA and cuDNN libraries as wheels
    ONNX_LRP_RUNTIME=cuda-system pip install -e .  # onnxruntime-gpu alone: CUDA and cuDNN installed system-wide
    ONNX_LRP_RUNTIME=none pip install -e .         # neither: bring your own build (e.g. onnxruntime-openvino)
"""
import os

from setuptools import setup

BASE = ["numpy>=1.24", "onnx>=1.16", "onnx-ir>=0.1.16", "click>=8.1", "pillow>=10"]
# onnxruntime-gpu's extras cuda (nvidia-cuda-runtime, -nvrtc, -cufft, -curand) and cudnn (nvidia-cudnn, which
# brings cuBLAS): a machine with only the NVIDIA driver runs it; onnx_lrp.run.runtime.preload_cuda loads them (1.21+)
WHEEL_CUDA = ["onnxruntime-gpu[cuda,cudnn]>=1.21"]
RUNTIMES = {"cpu": ["onnxruntime>=1.18"], "cuda": WHEEL_CUDA, "gpu": WHEEL_CUDA,
            "cuda-system": ["onnxruntime-gpu>=1.18"], "none": []}
choice = os.environ.get("ONNX_LRP_RUNTIME", "cpu").strip().lower() or "cpu"
if choice not in RUNTIMES:
    raise SystemExit(f"ONNX_LRP_RUNTIME={choice!r}: choose cpu (onnxruntime), cuda (onnxruntime-gpu with "
                     "CUDA and cuDNN wheels), cuda-system (onnxruntime-gpu alone) or none")

setup(install_requires=BASE + RUNTIMES[choice])
