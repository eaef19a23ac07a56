"""onnx-lrp: Layer-wise Relevance Propagation for any neural network exported to ONNX."""
from .errors import DeviceError, InputError, InternalError, LrpError, ModelError, NumericError, UnsupportedError
from .explainer import Explainer, Explanation

__version__ = "0.1.0"

__all__ = ["Explainer", "Explanation", "LrpError", "ModelError", "InputError", "UnsupportedError", "DeviceError",
           "NumericError", "InternalError", "__version__"]
