"""The relevance graph loses no digits in onnxruntime (issue 28): each relevance model, run by onnxruntime in float32
with its default optimisations (blocked NCHWc layouts, fusions), is as close to the SAME graph run in float64 by onnx's
reference interpreter (scripts/replay_float64.py) as the unoptimised float32 run is.

Criterion (the project's for ill-conditioned cases): the default run's relative L2 distance to float64 at most 3x the
plain float32 run's (floor 1e-6); the plain run itself within 1e-4 (float32's rounding through a few layers; the
pre-activation residual twin is the least well-conditioned at 2e-5). Models: the shipped digits CNN, the zennit
golden CNN, Flax residual twins (pre-activation with BatchNorm, max-pool with a crop, GroupNorm); epsilon-plus-flat
and epsilon-gamma-box.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import onnx_lrp
from util import ROOT

MODELS = ["models/digits_cnn.onnx", "tests/goldens/small_cnn_torchscript.onnx",
          "tests/goldens/flax_twins/preact_res_op17.onnx", "tests/goldens/flax_twins/max_res_crop_op17.onnx",
          "tests/goldens/flax_twins/gn_res_op17.onnx"]


def _replay():
    spec = importlib.util.spec_from_file_location("replay_float64", ROOT / "scripts" / "replay_float64.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("composite", ["epsilon-plus-flat", "epsilon-gamma-box"])
@pytest.mark.parametrize("model", MODELS, ids=lambda m: Path(m).stem)
def test_onnxruntime_float32_is_as_close_to_the_graph_in_float64_as_plain_float32(model, composite, tmp_path):
    import onnx

    rp = _replay()
    params = {"low": -3.0, "high": 3.0} if composite == "epsilon-gamma-box" else {}
    ex = onnx_lrp.Explainer(str(ROOT / model), composite=composite, threads=1, **params)
    dims = [2 if d is None else d for d in ex.inputs[0].dims]
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    ex.save(tmp_path / "r.onnx")
    relevance_model = onnx.load(tmp_path / "r.onnx")
    feeds = rp.feeds_of(relevance_model, x, ex.explain(x).target, False)
    wide, _ = rp.with_all_outputs(relevance_model)
    feeds64 = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in feeds.items()}
    ref = rp.ReferenceEvaluator(rp.to_float64(wide), new_ops=rp.reference_ops()).run(None, feeds64,
                                                                                      intermediate=True)
    name = f"lrp/relevance/{ex.inputs[0].name}"
    plain = rp.rel_l2(rp.run_ort(relevance_model, feeds, rp.LEVELS["none"])[name], ref[name])
    default = rp.rel_l2(rp.run_ort(relevance_model, feeds, rp.LEVELS["all"])[name], ref[name])
    assert plain <= 1e-4, plain
    assert default <= max(3 * plain, 1e-6), (default, plain)
    # and so is the Explainer's own result (its session: the default optimisations, one thread)
    assert rp.rel_l2(ex.explain(x, target=feeds["lrp/target"]).relevance, ref[name]) <= max(3 * plain, 1e-6)
