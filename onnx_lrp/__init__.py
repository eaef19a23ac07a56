"""onnx-lrp: Layer-wise Relevance Propagation for any neural network exported to ONNX."""
from .core.errors import (
    DeviceError,
    InputError,
    InternalError,
    LrpError,
    LrpWarning,
    ModelError,
    NumericError,
    UnsupportedError,
)


__version__ = "0.1.0"

__all__ = ["Explainer", "Explanation", "explain_dataset", "evaluate", "Evaluation", "RelMax", "RelevanceModel",
           "build", "LrpError", "LrpWarning", "ModelError", "InputError", "UnsupportedError", "DeviceError",
           "NumericError", "InternalError", "__version__"]


def __getattr__(name):  # imported on first use: `onnx-lrp --help` stays fast
    if name in ("Explainer", "Explanation"):
        from . import explainer
        return getattr(explainer, name)
    if name == "explain_dataset":
        from .dataset import explain_dataset
        return explain_dataset
    if name in ("evaluate", "Evaluation"):
        from . import metrics
        return getattr(metrics, name)
    if name == "RelMax":  # concept relevance maximisation (onnx_lrp.concepts)
        from .concepts import RelMax
        return RelMax
    if name == "RelevanceModel":
        from .core.relevance_model import RelevanceModel
        return RelevanceModel
    if name == "build":  # the package onnx_lrp.build, callable: onnx_lrp.build(model, composite, options)
        import importlib
        return importlib.import_module(".build", __name__)
    raise AttributeError(f"module 'onnx_lrp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
