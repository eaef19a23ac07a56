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

import numpy as np
import pytest

import onnx_lrp
from onnx_lrp.concepts import RelMax
from onnx_lrp.core.errors import InputError
from util import GOLDENS, ROOT, assert_close, rel_l2_items

GOLD = GOLDENS / "crp"
DIGITS = ROOT / "models" / "digits_cnn.onnx"
TOL, SHARE_TOL = 1e-4, 1e-5
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "torchvision", "zennit"))


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
    assert np.max(rel_l2_items(res.heatmaps.sum(1), gold[f"{tag}/heatmap"])) <= TOL
    for name, module in zip(meta["record"], meta["record_modules"]):
        assert res.relevance_at[name].shape == gold[f"{tag}/{module}"].shape
        assert np.max(rel_l2_items(res.relevance_at[name], gold[f"{tag}/{module}"])) <= TOL, name
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
    # scores are shares over 24 random inputs, some with a label logit near 0 (a tiny relevance, normalised):
    # measured 1.2e-5 at worst (VGG16-BN), 9e-7 (ResNet18)
    err = np.max(np.abs(rm.scores - ref_rel))
    assert err <= 5 * SHARE_TOL
    # a rank is compared where its score is apart from both neighbours' by more than the score errors could swap
    gap = np.abs(np.diff(ref_rel, axis=0))
    apart = np.ones_like(ref_rel, dtype=bool)
    apart[:-1] &= gap > 2 * err + 1e-9
    apart[1:] &= gap > 2 * err + 1e-9
    assert apart.mean() > 0.5
    assert np.array_equal(rm.indices[apart], ref_idx[apart])
    assert np.array_equal(rm.rf[apart], gold["relmax/rf"][apart])
    heat = rm.reference_heatmaps(xs, [int(c) for c in gold["relmax/show"]], count=1)
    for c, ref in zip(gold["relmax/show"], gold["relmax/heatmaps"]):
        assert rel_l2_items(heat[int(c)][:1].sum(1), ref[None])[0] <= TOL


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("crp") is None or not HAVE_TORCH, reason="zennit-crp not installed")
def test_crp_goldens_reproduce_live():
    """zennit-crp, run now on ResNet18 (~1.5 min), gives the committed goldens (the script is deterministic)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_crp_goldens import reference

    live = reference("resnet18")
    gold = dict(np.load(GOLD / "resnet18.npz"))
    assert set(live) == set(gold)
    for k in gold:
        if k == "meta":
            assert json.loads(str(live[k]))["edges"] == json.loads(str(gold[k]))["edges"]
        else:
            assert_close(live[k], gold[k], rtol=1e-6, atol=1e-9, err_msg=k)


# ------------------------------------------------------------------------------ properties on the digits model
LAYER = "/features/features.6/Conv_output_0"  # 32 channels; the graph is a chain (no skip connection)
BELOW = "/features/features.3/Conv_output_0"


@pytest.fixture(scope="module")
def digits():
    ex = onnx_lrp.Explainer(str(DIGITS))
    x = np.load(ROOT / "models" / "samples" / "npy" / "digit_3.npy")[None]
    return ex, x


@pytest.mark.parametrize("exclude_parallel", [True, False])
def test_concepts_partition_sums_to_plain_relevance(digits, exclude_parallel):
    """Every rule is linear in the relevance from above: the heatmaps of all 32 single-channel concepts add up to
    the plain explanation, at the input and at a recorded layer below."""
    ex, x = digits
    res = ex.explain_concepts(x, 3, LAYER, concepts=[[c] for c in range(32)], exclude_parallel=exclude_parallel,
                              record=[BELOW, LAYER], batch_size=10)
    plain = onnx_lrp.Explainer(str(DIGITS), relevance_at=[BELOW, LAYER]).explain(x, target=3)
    assert res.heatmaps.shape == (32,) + x.shape[1:]
    assert np.allclose(res.heatmaps.sum(0), plain.relevance[0], rtol=1e-4, atol=1e-6 * np.abs(plain.relevance).max())
    for name in (BELOW, LAYER):
        assert res.relevance_at[name].shape == (32,) + plain.relevance_at[name].shape[1:]
        got, want = res.relevance_at[name].sum(0), plain.relevance_at[name][0]
        assert np.allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
    shares = plain.relevance_at[LAYER][0].reshape(32, -1).sum(1)
    assert np.allclose(res.channel_shares, shares / np.abs(shares).sum(), atol=1e-6)
    assert np.isclose(res.logit, plain.explained_value[0])


def test_seeded_equals_masked_without_skip_connections(digits):
    """On a chain, starting below the layer from its masked relevance (exclude_parallel=True) is the same
    computation as masking it inside the whole relevance model (False): two differently built graphs agree."""
    ex, x = digits
    a = ex.explain_concepts(x, None, LAYER, concepts="top:3", exclude_parallel=True, record=[BELOW])
    b = ex.explain_concepts(x, None, LAYER, concepts="top:3", exclude_parallel=False, record=[BELOW])
    assert a.concepts == b.concepts and len(a.concepts) == 3
    assert np.max(rel_l2_items(a.heatmaps, b.heatmaps)) < 1e-5
    assert np.max(rel_l2_items(a.relevance_at[BELOW], b.relevance_at[BELOW])) < 1e-5
    # top:3 are the three largest shares, in order
    assert a.concepts == [[int(c)] for c in np.argsort(-a.channel_shares)[:3]]


def test_neuron_masks_add_up_to_their_channel(digits):
    """Full-shape masks, one per neuron of channel 25 (8 x 8): their heatmaps add up to the channel's."""
    ex, x = digits
    masks = np.zeros((64, 32, 8, 8), np.float32)
    masks[np.arange(64), 25, np.arange(64) // 8, np.arange(64) % 8] = 1
    neurons = ex.explain_concepts(x, 3, LAYER, concepts=masks, batch_size=32)
    channel = ex.explain_concepts(x, 3, LAYER, concepts=[[25]])
    assert neurons.heatmaps.shape == (64, 1, 16, 16)
    assert rel_l2_items(neurons.heatmaps.sum(0, keepdims=True), channel.heatmaps)[0] < 1e-5
    assert np.isclose(neurons.shares.sum(), channel.shares[0], atol=1e-6)
    with pytest.raises(InputError, match="do not fit"):
        ex.explain_concepts(x, 3, LAYER, concepts=np.ones((2, 16, 1, 1), np.float32))


def test_mask_input_defaults_to_ones(digits):
    """The masked relevance model runs without its mask input and then gives the plain relevance."""
    from onnx_lrp import concepts as crp

    ex, x = digits
    sess = crp.models_of(ex).masked((LAYER,), ())
    # an input with a default (onnxruntime lists it among the overridable initializers, not the required inputs)
    assert crp.MASK_PREFIX + LAYER in [i.name for i in sess.session.get_overridable_initializers()]
    out = sess.run({"image": x, "lrp/target": np.array([3]), "lrp/one_hot": np.array(False)})
    plain = ex.explain(x, target=3).relevance
    assert_close(out["lrp/relevance/image"], plain, rtol=1e-5, atol=1e-7)


def test_init_abs_and_one_hot_scale_the_logit_start(digits):
    ex, x = digits
    logit = ex.explain(x, target=5).explained_value[0]
    assert logit < 0  # a class the model votes against: |logit| flips the sign
    base = ex.explain_concepts(x, 5, LAYER, concepts=[[1], [2, 3]])
    for init, factor in (("abs", -1.0), ("one-hot", 1.0 / logit)):
        other = ex.explain_concepts(x, 5, LAYER, concepts=[[1], [2, 3]], init=init)
        assert_close(other.heatmaps, factor * base.heatmaps, rtol=1e-4, atol=1e-8)


def test_init_activation_starts_at_the_layer(digits):
    """init='activation': the relevance below the layer starts from its activation (no target): the relevance at
    the layer equals the activation times the mask."""
    from onnx_lrp import concepts as crp

    ex, x = digits
    res = ex.explain_concepts(x, None, LAYER, concepts=[[4]], init="activation", record=[LAYER])
    act = crp.upper_pass(ex, x, None, LAYER)["activation"]
    want = np.zeros_like(act)
    want[:, 4] = act[:, 4]
    assert np.allclose(res.relevance_at[LAYER], want)
    assert np.abs(res.heatmaps).sum() > 0


def test_concept_graph_edges_are_conditional_shares(digits):
    """Each edge's share is the share of the lower channel in the relevance conditioned on its parent concept
    (and the root), recomputed here with explain_concepts."""
    from onnx_lrp import concepts as crp

    ex, x = digits
    g = ex.concept_graph(x, 3, LAYER, 7, width=[3, 2])
    assert g.root == (LAYER, 7) and set(g.edges) >= {(LAYER, 7)}
    lower = g.edges[(LAYER, 7)]
    assert [d[0] for d in lower] == [BELOW] * 3
    cond = ex.explain_concepts(x, 3, LAYER, concepts=[[7]], exclude_parallel=False, record=[BELOW])
    shares = crp.shares_of(cond.relevance_at[BELOW])[0]
    assert [d[1] for d in lower] == [int(c) for c in np.argsort(-shares)[:3]]
    assert np.allclose([d[2] for d in lower], np.sort(shares)[::-1][:3], atol=1e-6)
    assert len(g.edges) == 4 and all(len(v) == 2 for k, v in g.edges.items() if k != (LAYER, 7))


def test_relmax_resumes_and_matches_the_shares(digits, tmp_path):
    from onnx_lrp.concepts import relmax_build
    from onnx_lrp.dataset import open_source
    from onnx_lrp.io.inputs import input_infos

    ex, _ = digits
    images = np.load(ROOT / "models" / "digits_heldout.npz")["images"][:20].astype(np.float32) / 255
    np.save(tmp_path / "set.npy", images)
    src = open_source(tmp_path / "set.npy", input_infos(ex.inputs))
    logs = []
    rm = relmax_build(ex, src, tmp_path / "out", LAYER, samples=5, shard_size=8, batch_size=4, log=logs.append)
    assert len(logs) == 3
    shares = ex.concept_relevance(images, None, LAYER)  # oracle: 20 x 32
    want = np.argsort(-shares, axis=0, kind="stable")[:5]
    assert np.array_equal(rm.indices, want)
    assert np.allclose(rm.scores, np.take_along_axis(shares, want, 0), atol=1e-6)
    logs.clear()
    again = relmax_build(ex, src, tmp_path / "out", LAYER, samples=5, shard_size=8, batch_size=4, log=logs.append)
    assert logs == [] and np.array_equal(again.indices, rm.indices)
    with pytest.raises(InputError, match="another run"):
        relmax_build(ex, src, tmp_path / "out", BELOW, samples=5, shard_size=8)
    heat = rm.reference_heatmaps(images, [0], count=2)[0]
    assert heat.shape == (2, 1, 16, 16) and np.abs(heat).sum() > 0


def test_bad_input_refused_in_one_line(digits):
    ex, x = digits
    cases = [
        (dict(layer="nope"), "no tensor named 'nope'.*features.6/Conv_output_0"),
        (dict(layer=LAYER, concepts=[[32]]), "channel 32 out of range: the layer has 32 channels"),
        (dict(layer=LAYER, concepts="best:3"), "top:K"),
        (dict(layer=LAYER, init="zero"), "init must be one of"),
        (dict(layer=LAYER, record=["nope"]), "no tensor named 'nope'"),
        (dict(layer=LAYER, channel_axis=4), "channel_axis 4 does not fit"),
        (dict(layer="probabilities"), "not on the way to the explained tensor 'logits'"),
    ]
    for kw, msg in cases:
        with pytest.raises(InputError, match=msg) as info:
            ex.explain_concepts(x, None, **kw)
        assert "\n" not in str(info.value)
    with pytest.raises(InputError, match="one item"):
        ex.explain_concepts(np.concatenate([x, x]), None, LAYER)


def test_cli_concepts(tmp_path):
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main

    sample = str(ROOT / "models" / "samples" / "npy" / "digit_3.npy")
    run = CliRunner().invoke
    r = run(main, ["concepts", str(DIGITS), sample, "--layer", LAYER, "--top", "3", "--heatmap",
                   str(tmp_path / "c.png"), "-o", str(tmp_path / "c.npz"), "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert len(got["concepts"]) == 3 and (tmp_path / "c.png").stat().st_size > 0
    assert np.load(tmp_path / "c.npz")["heatmaps"].shape == (3, 1, 16, 16)
    for args, msg in ((["--layer", "nope"], "no tensor named"), (["--layer", LAYER, "--concepts", "3;99"],
                                                                   "channel 99 out of range")):
        r = run(main, ["concepts", str(DIGITS), sample] + args)
        assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output
    r = run(main, ["concept-graph", str(DIGITS), sample, "--layer", LAYER, "--width", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.output)["edges"]) == 2
    images = np.load(ROOT / "models" / "digits_heldout.npz")["images"][:12].astype(np.float32) / 255
    np.save(tmp_path / "set.npy", images)
    r = run(main, ["relmax", "build", str(DIGITS), str(tmp_path / "set.npy"), "--layer", LAYER, "--out-dir",
                   str(tmp_path / "rm"), "--samples", "4", "--shard-size", "6"])
    assert r.exit_code == 0, r.output
    r = run(main, ["relmax", "show", str(DIGITS), str(tmp_path / "set.npy"), "--out-dir", str(tmp_path / "rm"),
                   "--channels", "0,5", "--count", "3", "--heatmap", str(tmp_path / "rm.png")])
    assert r.exit_code == 0, r.output
    assert r.output.count("channel ") == 2 and (tmp_path / "rm.png").exists()
