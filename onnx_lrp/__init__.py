"""onnx-lrp: Layer-wise Relevance Propagation for any neural network exported to ONNX."""
from .errors import DeviceError, InputError, LrpError, ModelError, UnsupportedError
from .explainer import Explainer, Explanation
from .dataset import explain_dataset

__version__ = "0.1.0"

__all__ = ["Explainer", "Explanation", "explain_dataset", "LrpError", "ModelError", "InputError", "UnsupportedError",
           "DeviceError", "__version__"]
