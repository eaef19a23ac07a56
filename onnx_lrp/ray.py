"""The public name of the Ray integration (``import onnx_lrp.ray``): :class:`ExplainBatch` for a user's own Ray Data
pipeline and :func:`relevance_model`. The engine lives in :mod:`onnx_lrp.dataset.ray`."""
from onnx_lrp.dataset.ray import INSTALL, ExplainBatch, relevance_model, require_ray

__all__ = ["ExplainBatch", "relevance_model", "require_ray", "INSTALL"]
