"""onnx_lrp.methods against captum 0.9's stored results (tests/goldens/methods, written by
scripts/make_captum_goldens.py): the same two models (a CNN with BatchNorm, MaxPool and ReLU; an MLP with Tanh,
Sigmoid and an inner Softmax), inputs, targets, baselines and noise; no torch or captum needed. Gradient-family
methods within 1e-5 relative L2 (vargrad: of captum run in float64, as its float32 cancels), occlusion equal up to
float32 rounding of the output differences."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from onnx_lrp.methods import Attributor
from util import GOLDENS as ALL_GOLDENS

GOLDENS = ALL_GOLDENS / "methods"
DATA = np.load(GOLDENS / "captum.npz")
INDEX = json.loads(str(DATA["index"]))
TOL = 1e-5


@pytest.mark.parametrize("key", sorted(INDEX))
def test_matches_captum(key):
    net = key.split("/")[0]
    case = INDEX[key]
    options = {**case["options"], **{name: DATA[f"{key}/{name}"] for name in case["arrays"]}}
    x, target, ref = DATA[f"{net}/x"], DATA[f"{net}/target"], DATA[f"{key}/ref"].astype(np.float64)
    got = Attributor(str(GOLDENS / f"{net}.onnx"), case["method"], **options).attribute(x, target)
    assert got.shape == x.shape and got.dtype == np.float32
    if case["method"] == "occlusion":
        np.testing.assert_allclose(got, ref, rtol=0, atol=np.abs(ref).max() * 4e-6)
    else:
        rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert rel <= TOL, rel


def test_goldens_cover_every_method():
    assert {c["method"] for c in INDEX.values()} == {"gradient", "gradient-x-input", "integrated-gradients",
                                                     "smoothgrad", "vargrad", "occlusion"}
