"""onnx-lrp: Layer-wise Relevance Propagation for any neural network exported to ONNX."""
from .errors import DeviceError, InputError, LrpError, ModelError, UnsupportedError
from .explainer import Explainer, Explanation

__version__ = "0.1.0"

__all__ = ["Explainer", "Explanation", "LrpError", "ModelError", "InputError", "UnsupportedError", "DeviceError",
           "__version__"]
