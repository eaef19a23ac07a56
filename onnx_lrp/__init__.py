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
from .core.version import VERSION as __version__

__all__ = ["Explainer", "Explanation", "TextExplanation", "explain_dataset", "evaluate", "Evaluation", "plot", "RelMax",
           "RelevanceModel", "BuildOptions", "RunOptions", "EvaluateOptions", "DatasetOptions", "build_relevance_model", "LrpError", "LrpWarning", "ModelError",
           "InputError", "UnsupportedError", "DeviceError", "NumericError", "InternalError", "__version__"]


def __getattr__(name):  # imported on first use: `onnx-lrp --help` stays fast
    if name in ("Explainer", "Explanation"):
        from . import explainer
        return getattr(explainer, name)
    if name == "TextExplanation":  # what Explainer.explain_text returns
        from .io.text_result import TextExplanation
        return TextExplanation
    if name == "explain_dataset":
        from .dataset import explain_dataset
        return explain_dataset
    if name == "RunOptions":  # how a relevance model runs (onnx_lrp.run.options)
        from .run.options import RunOptions
        return RunOptions
    if name == "DatasetOptions":
        from .dataset import DatasetOptions
        return DatasetOptions
    if name in ("evaluate", "Evaluation", "EvaluateOptions"):
        from . import metrics
        return getattr(metrics, name)
    if name == "plot":  # heatmap pictures: onnx_lrp.plot.heatmap / imsave
        import importlib
        return importlib.import_module(".plot", __name__)
    if name == "RelMax":  # concept relevance maximisation (onnx_lrp.concepts)
        from .concepts import RelMax
        return RelMax
    if name in ("RelevanceModel", "BuildOptions"):
        from .core import relevance_model
        return getattr(relevance_model, name)
    if name == "build_relevance_model":  # onnx_lrp.building.build: load, choose, rewrite, precision, serialise
        from .building import build
        return build
    raise AttributeError(f"module 'onnx_lrp' has no attribute {name!r}")


def __dir__():  # the public API (and the stage packages imported so far), not the module's own machinery
    return sorted(set(__all__) | {k for k in globals() if not k.startswith("_")})
