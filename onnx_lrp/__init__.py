"""onnx-lrp: Layer-wise Relevance Propagation for any neural network exported to ONNX."""
from .errors import DeviceError, InputError, LrpError, LrpWarning, ModelError, UnsupportedError

__version__ = "0.1.0"

__all__ = ["Explainer", "Explanation", "LrpError", "LrpWarning", "ModelError", "InputError", "UnsupportedError",
           "DeviceError", "__version__"]


def __getattr__(name):  # Explainer and Explanation are imported on first use: `onnx-lrp --help` stays fast
    if name in ("Explainer", "Explanation"):
        from . import explainer
        return getattr(explainer, name)
    raise AttributeError(f"module 'onnx_lrp' has no attribute {name!r}")
