"""The dataset engine on Ray with an attribution method (``explain_dataset(..., engine="ray", method=M)``,
``onnx-lrp explain --out-dir D --engine ray --method M``): each actor builds the method's explainer again from the
model file and writes the same shards as the local engine. Skipped without Ray."""
from __future__ import annotations

import json

import numpy as np
import pytest

from onnx_lrp import explain_dataset
from onnx_lrp.dataset import read_shards
from onnx_lrp.dataset.shards import MANIFEST
from util import GOLDENS, cli

TWO = GOLDENS / "methods" / "two_inputs.onnx"


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def _same_shards(a, b):
    """Two OUT folders hold the same items, targets, outputs and relevance (every relevance/<input>), shard by
    shard, and manifests that differ only in the engine."""
    got, want = read_shards(a), read_shards(b)
    assert sorted(got) == sorted(want) and any(k.startswith("relevance") for k in got)
    for k in want:
        if want[k].dtype.kind in "fc":
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=np.abs(want[k]).max() * 1e-6)
        else:
            np.testing.assert_array_equal(got[k], want[k])
    ma, mb = (json.loads((d / MANIFEST).read_text()) for d in (a, b))
    assert (ma["engine"], mb["engine"]) == ("ray", "local")
    strip = ("engine", "shards", "created", "updated", "seconds", "complete")
    assert {k: v for k, v in ma.items() if k not in strip} == {k: v for k, v in mb.items() if k not in strip}
    assert [(s["items"], s["explained"]) for s in ma["shards"]] == [(s["items"], s["explained"]) for s in mb["shards"]]


def test_ray_engine_with_a_method_writes_what_the_local_engine_writes(tmp_path, ray_cluster):
    """Ray through the API, the local engine through the command line: integrated-gradients on a model with two
    inputs (a relevance per input), three shards."""
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "uv.npz", u=rng.normal(size=(5, 4)).astype(np.float32),
             v=rng.normal(size=(5, 2, 5)).astype(np.float32))
    s = explain_dataset(str(TWO), tmp_path / "uv.npz", tmp_path / "ray", engine="ray", workers=1, shard_size=2,
                        target=1, method="integrated-gradients", n_steps=4, baselines=0.1)
    assert (s["explained"], s["failed"], s["shards_written"]) == (5, 0, 3)
    r = cli("explain", TWO, tmp_path / "uv.npz", "--out-dir", tmp_path / "local", "--method", "integrated-gradients",
            "--n-steps", "4", "--baselines", "0.1", "--shard-size", "2", "--target", "1")
    assert r.exit_code == 0, r.output
    assert {"relevance/u", "relevance/v"} <= set(read_shards(tmp_path / "ray"))
    _same_shards(tmp_path / "ray", tmp_path / "local")

