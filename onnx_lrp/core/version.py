"""The package's version (pyproject.toml's; ``tests/architecture/test_architecture.py`` holds them equal), for the files it writes
(dataset manifests, regression snapshots) and ``onnx_lrp.__version__``."""
VERSION = "0.1.0"

__all__ = ["VERSION"]
