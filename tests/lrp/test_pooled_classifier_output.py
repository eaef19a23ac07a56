"""A classifier whose output keeps its pooled 1 x 1 spatial axes (N, C, 1, 1: squeezenet 1.0 and the onnx wheel's
light zoo models end this way) is explained by class, as the same model with a Flatten: targets index the C classes,
no position, the same relevance; an (N, T, 1) output stays a sequence of T positions."""
from __future__ import annotations

import numpy as np

import onnx_lrp
from util import make_model, node, to_bytes

RNG = np.random.default_rng(0)
W = RNG.normal(size=(5, 3, 3, 3)).astype(np.float32)
X = RNG.normal(size=(2, 3, 6, 6)).astype(np.float32)


def _model(flatten: bool) -> bytes:
    nodes = [node("Conv", ["x", "W"], "c", pads=[1, 1, 1, 1]), node("Relu", ["c"], "r"),
             node("GlobalAveragePool", ["r"], "p" if flatten else "y")]
    if flatten:
        nodes.append(node("Flatten", ["p"], "y"))
    return to_bytes(make_model(nodes, {"x": ["N", 3, 6, 6]}, ["y"], {"W": W}))


def test_pooled_output_is_explained_by_class():
    pooled = onnx_lrp.Explainer(_model(False), composite="epsilon")
    flat = onnx_lrp.Explainer(_model(True), composite="epsilon")
    assert pooled.relevance_model.sequence_rows is None
    for target in (None, 3):
        a, b = pooled.explain(X, target=target), flat.explain(X, target=target)
        np.testing.assert_array_equal(a.target, b.target)
        np.testing.assert_allclose(a.relevance, b.relevance, rtol=1e-6, atol=1e-7)
    assert list(pooled.explain(X, target=3).target) == [3, 3]


def test_sequence_of_single_entries_stays_a_sequence():
    seq = onnx_lrp.Explainer(to_bytes(make_model([node("MatMul", ["x", "V"], "y")], {"x": ["N", 4, 3]}, ["y"],
                                                 {"V": RNG.normal(size=(3, 1)).astype(np.float32)})),
                             composite="epsilon")
    assert seq.relevance_model.sequence_rows == (4, 1)
