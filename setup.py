"""Dependencies with the onnxruntime build chosen at install time (everything else is in pyproject.toml).

onnxruntime and onnxruntime-gpu install into the same folder: with both installed, removing one breaks the other. So
exactly one is required, chosen by the environment variable ONNX_LRP_RUNTIME when pip builds the package:

    pip install -e .                               # onnxruntime (CPU), the default
    ONNX_LRP_RUNTIME=cuda pip install -e .         # onnxruntime-gpu (CUDA), never onnxruntime
    ONNX_LRP_RUNTIME=none pip install -e .         # neither: bring your own build (e.g. onnxruntime-openvino)
"""
import os

from setuptools import setup

BASE = ["numpy>=1.24", "onnx>=1.16", "onnx-ir>=0.1.16", "click>=8.1", "pillow>=10"]
RUNTIMES = {"cpu": ["onnxruntime>=1.18"], "cuda": ["onnxruntime-gpu>=1.18"], "gpu": ["onnxruntime-gpu>=1.18"],
            "none": []}
choice = os.environ.get("ONNX_LRP_RUNTIME", "cpu").strip().lower() or "cpu"
if choice not in RUNTIMES:
    raise SystemExit(f"ONNX_LRP_RUNTIME={choice!r}: choose cpu (onnxruntime), cuda (onnxruntime-gpu) or none")

setup(install_requires=BASE + RUNTIMES[choice])
