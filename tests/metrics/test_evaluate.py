"""Faithfulness metrics (onnx_lrp.metrics, `onnx-lrp evaluate`) against Quantus 0.6 and numpy oracles.

* Quantus parity: tests/goldens/quantus_metrics.npz (scripts/make_quantus_goldens.py: Quantus 0.6 on the demo
  model wrapped as a torch module that calls onnxruntime) holds inputs, relevance arrays, targets and Quantus'
  outputs; the same arrays through onnx_lrp.metrics agree to 1e-6. Where quantus is importable, a live run too.
* Oracles written from the papers: region perturbation and AOPC (Samek et al. 2017) with explicit loops.
* The randomisation check randomises the ORIGINAL parameters and rebuilds: the relevance of the randomised model
  equals the numpy LRP oracle on the randomised weights (BatchNorm folded, z+ weights derived from them).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from util import GOLDENS, ROOT, assert_close, conv_matrix, f32_tol, make_model, node, to_bytes

import onnx_lrp
from onnx_lrp.core.errors import InputError
from onnx_lrp.metrics import correlation, perturbation, randomisation, similarity
from onnx_lrp.metrics.forward import Forward

MODEL = str(ROOT / "models" / "digits_cnn.onnx")
GOLDEN = GOLDENS / "quantus_metrics.npz"
SEED = 7


@pytest.fixture(scope="module")
def golden():
    g = np.load(GOLDEN, allow_pickle=False)
    return {k: g[k] for k in g.files}


def _predict(prob="softmax", crop=False):
    fwd = Forward(MODEL, "logits", "image", None, prob=prob)
    if not crop:
        return fwd
    return lambda x: fwd(np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1))))


def ours(name, g):
    """A golden case computed with onnx_lrp.metrics: the same arguments, RandomState(seed) as Quantus' global."""
    case = json.loads(str(g["meta"]))["cases"][name]
    kw, call = case["ctor"], case["call"]
    x, a, y, mask = g["x"], g["relevance"], g["target"], g["mask"]
    crop = call.get("crop", False)
    if crop:
        x, a = x[:, :, :15, :15].copy(), a[:, :, :15, :15].copy()
    default = "logit" if case["metric"] == "FaithfulnessCorrelation" else "softmax"  # Quantus' __call__ defaults
    predict = _predict({False: "logit", True: "softmax"}.get(call.get("softmax"), default), crop)
    a_n = perturbation.normalise_by_max(a)
    rng = np.random.RandomState(SEED)
    base = kw.get("perturb_baseline", "black")
    if case["metric"] == "PixelFlipping":
        c = perturbation.pixel_flipping(predict, x, a_n, y, ("morf",), kw["features_in_step"], base, {"morf": rng})
        return perturbation.quantus_curve("pixel-flipping", c["morf"])
    if case["metric"] == "RegionPerturbation":
        o = kw["order"]
        c = perturbation.region_perturbation(perturbation.Scored(predict, x, a_n, y), (o,), kw["patch_size"],
                                             kw["regions_evaluation"], base, {o: rng})
        return perturbation.quantus_curve("region-perturbation", c[o])
    if case["metric"] == "FaithfulnessCorrelation":
        return correlation.faithfulness_correlation(perturbation.Scored(predict, x, a_n, y), kw["nr_runs"],
                                                    kw["subset_size"], base, rng)["correlation"]
    return correlation.relevance_mass(a_n, mask)


def quantus_atol(golden) -> float:
    """The golden's values come from the model's float32 logits, near 25 here (``out/pf_logit``), where one float32
    step is 1.9e-6: onnxruntime's kernels on other CPUs (AVX2 / AVX-512 / VNNI) give logits a few steps apart (AVX2:
    2 steps). Each value is a difference of two forwards or a softmax of them (which enlarges no absolute error):
    8 steps at the logits' magnitude, on top of 1e-6 for the metrics' own arithmetic."""
    return 1e-6 + f32_tol(golden["out/pf_logit"], ulps=8)


CASES = ["pf_black", "pf_mean", "pf_logit", "rp_morf", "rp_lerf", "rp_random", "rp_mean_p4", "rp_uniform", "rp_pad",
         "fc", "fc_uniform", "rma"]


@pytest.mark.parametrize("name", CASES)
def test_quantus_golden(golden, name):
    want = golden[f"out/{name}"]
    got = ours(name, golden)
    assert got.shape == want.shape
    assert np.all(np.isfinite(want))
    np.testing.assert_allclose(got, want, rtol=0, atol=quantus_atol(golden))


def test_quantus_live(golden):
    """Live Quantus 0.6 on other settings than the goldens (skipped where quantus is not installed)."""
    pytest.importorskip("quantus")
    import importlib.util
    import sys
    import warnings

    spec = importlib.util.spec_from_file_location("mqg", ROOT / "scripts" / "make_quantus_goldens.py")
    mqg = importlib.util.module_from_spec(spec)
    sys.modules["mqg"] = mqg
    spec.loader.exec_module(mqg)
    mqg.CASES = {"pf4": ("PixelFlipping", dict(features_in_step=4, perturb_baseline="mean"), {}),
                 "rp3": ("RegionPerturbation", dict(patch_size=3, regions_evaluation=25, order="lerf"), {}),
                 "fc9": ("FaithfulnessCorrelation", dict(nr_runs=12, subset_size=100, return_aggregate=False), {})}
    meta = json.dumps(dict(cases={k: dict(metric=c, ctor=kw, call=call) for k, (c, kw, call) in mqg.CASES.items()}))
    g = dict(golden, meta=np.array(meta))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in mqg.CASES:
            want = mqg.run_case(name, g["x"], g["relevance"], g["target"], g["mask"])
            np.testing.assert_allclose(ours(name, g), want, rtol=0, atol=quantus_atol(golden))


# ------------------------------------------------------------------------------------------ oracles
def samek_region_perturbation(f, x, r, t, patch, steps):
    """Samek et al. 2017 from the paper: non-overlapping patches ordered by summed relevance, the most relevant
    replaced first (here by the image's minimum); AOPC = 1/(L+1) sum_k f(x^0) - f(x^k). Loops, one item at a time."""
    n, c, h, w = x.shape
    aopcs, curves = [], []
    for i in range(n):
        xi = x[i].copy()
        regions = [(p, q) for p in range(0, h, patch) for q in range(0, w, patch)]
        scores = [float(r[i, :, p:p + patch, q:q + patch].sum()) for p, q in regions]
        ranked = sorted(range(len(regions)), key=lambda j: -scores[j])
        low = float(x[i].min())
        fs = [f(xi[None])[0, t[i]]]
        for j in ranked[:steps]:
            p, q = regions[j]
            xi[:, p:p + patch, q:q + patch] = low
            fs.append(f(xi[None])[0, t[i]])
        curves.append(fs)
        aopcs.append(sum(fs[0] - v for v in fs) / (len(fs)))
    return np.array(aopcs), np.array(curves)


@pytest.fixture(scope="module")
def digits():
    data = np.load(ROOT / "models" / "digits_heldout.npz")
    return data["images"][:12].astype(np.float32) / 255


def test_region_perturbation_matches_samek_oracle(digits):
    f = _predict()
    ev = onnx_lrp.evaluate(MODEL, digits, metric="region-perturbation", patch=4, steps=10)
    rel = onnx_lrp.Explainer(MODEL).explain(digits).relevance
    aopc, curves = samek_region_perturbation(f, digits, rel, ev.target, 4, 10)
    assert_close(ev.curves["morf"], curves, atol=1e-6)
    assert_close(ev.scores["aopc/morf"], aopc, atol=1e-6)
    # ABPC is the mean gap between the LeRF and MoRF curves
    assert_close(ev.scores["abpc"], (ev.curves["lerf"] - ev.curves["morf"]).mean(axis=1), atol=1e-12)


def test_one_run_per_step_for_the_whole_batch(digits):
    ev = onnx_lrp.evaluate(MODEL, digits, metric="region-perturbation", patch=2, steps=20)
    assert ev.calls == 20 + 1  # every order of every item per step, plus the unperturbed scores
    ev = onnx_lrp.evaluate(MODEL, digits, metric="pixel-flipping", steps=16)
    assert ev.params["features_in_step"] == 16 and ev.calls == 16 + 1


def test_explanation_beats_the_random_floor_and_its_inverse_does_not(digits):
    """On the trained demo model LRP's MoRF order destroys the prediction faster than a random order; the same
    relevance negated (its LeRF order first) falls below the floor. Both would fail for an unfaithful metric."""
    ev = onnx_lrp.evaluate(MODEL, digits, metric="region-perturbation", patch=2, steps=32)
    s = ev.summary()
    assert s["beats_random"] and s["aopc/morf"] > s["aopc/random"] + 0.1 and s["abpc"] > 0.2
    inv = onnx_lrp.evaluate(MODEL, digits, metric="region-perturbation", patch=2, steps=32,
                            relevance=-onnx_lrp.Explainer(MODEL).explain(digits).relevance)
    assert not inv.summary()["beats_random"]
    assert_close(inv.scores["aopc/morf"], ev.scores["aopc/lerf"], atol=1e-6)


def test_faithfulness_correlation_and_relevance_mass_floors(digits):
    ev = onnx_lrp.evaluate(MODEL, digits, metric="faithfulness-correlation", subset_size=32, runs=30)
    s = ev.summary()
    assert s["correlation"] > s["correlation/random"] and s["beats_random"]
    mask = digits > 0.5
    ev = onnx_lrp.evaluate(MODEL, digits, metric="relevance-mass", mask=mask)
    rel = onnx_lrp.Explainer(MODEL).explain(digits).relevance
    want = (rel * mask).reshape(len(digits), -1).sum(1) / rel.reshape(len(digits), -1).sum(1)
    np.testing.assert_allclose(ev.scores["mass"], want, rtol=1e-5)
    np.testing.assert_allclose(ev.scores["mass/random"], mask.reshape(len(digits), -1).mean(1))


def test_bad_arguments_are_refused_in_one_line(digits):
    for kw in (dict(metric="nope"), dict(baseline="grey"), dict(metric="relevance-mass"),
               dict(metric="region-perturbation", patch=40), dict(orders=("sideways",)),
               dict(metric="faithfulness-correlation", subset_size=400)):
        with pytest.raises(InputError) as err:
            onnx_lrp.evaluate(MODEL, digits[:2], **kw)
        assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------ similarity
def test_similarity_functions_against_scipy_and_skimage():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((16, 16)), rng.standard_normal((16, 16))
    b[:4] = a[:4]
    a[0, :3] = 1.0  # ties
    stats = pytest.importorskip("scipy.stats")
    assert similarity.spearman(a, b) == pytest.approx(stats.spearmanr(a.ravel(), b.ravel())[0], abs=1e-12)
    h, _ = np.histogram(a.ravel(), bins=100)
    assert similarity.discrete_entropy(a) == pytest.approx(stats.entropy(h), abs=1e-12)
    x = rng.standard_normal((8, 5))
    y = x + rng.standard_normal((8, 5))
    assert_close(correlation.pearson(x, y), stats.pearsonr(x, y, axis=1)[0], atol=1e-12)
    metrics = pytest.importorskip("skimage.metrics")
    rng_ = abs(max(a.max(), b.max()) - min(a.min(), b.min()))
    assert similarity.ssim(a, b) == pytest.approx(metrics.structural_similarity(a, b, data_range=rng_), abs=1e-10)


# ------------------------------------------------------------------------------------------ randomisation
def _tiny_model():
    rng = np.random.default_rng(3)
    inits = {"W": rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32),
             "s": rng.uniform(0.5, 2, 3).astype(np.float32), "B": rng.standard_normal(3).astype(np.float32),
             "m": rng.standard_normal(3).astype(np.float32), "v": rng.uniform(0.5, 2, 3).astype(np.float32),
             "W2": rng.standard_normal((4, 27)).astype(np.float32), "b2": rng.standard_normal(4).astype(np.float32)}
    nodes = [node("Conv", ["x", "W", "b"], "c", name="conv"),
             node("BatchNormalization", ["c", "s", "B", "m", "v"], "bn", name="bn", epsilon=1e-5),
             node("Relu", ["bn"], "r", name="relu"), node("Flatten", ["r"], "f", name="flat"),
             node("Gemm", ["f", "W2", "b2"], "y", name="fc", transB=1)]
    return to_bytes(make_model(nodes, {"x": ["N", 2, 5, 5]}, ["y"], inits)), inits


def _oracle(p, x, t):
    """epsilon-plus on Conv -> BN -> ReLU -> Gemm from the rules' formulas: BN folded into the convolution, z+ at
    the convolution (the first linear layer), epsilon at the dense layer, relevance starting from the logit."""
    scale = p["s"] / np.sqrt(p["v"] + 1e-5)
    A, _ = conv_matrix(p["W"] * scale[:, None, None, None], (5, 5))
    b = np.repeat((p["b"] - p["m"]) * scale + p["B"], 9)
    out = []
    for xi, ti in zip(x.reshape(len(x), -1).astype(np.float64), t):
        z1 = A @ xi + b
        a1 = np.maximum(z1, 0)
        y = p["W2"] @ a1 + p["b2"]
        r = np.zeros(4)
        r[ti] = y[ti]
        zz = a1 @ p["W2"].T + p["b2"]
        r1 = a1 * ((r / (zz + 1e-6 * (np.sign(zz) + (zz == 0)))) @ p["W2"])
        zp = np.clip(xi, 0, None) @ np.clip(A, 0, None).T + np.clip(xi, None, 0) @ np.clip(A, None, 0).T \
            + np.clip(b, 0, None)
        s = r1 / (zp + 1e-6 * (np.sign(zp) + (zp == 0)))
        out.append(np.clip(xi, 0, None) * (s @ np.clip(A, 0, None)) + np.clip(xi, None, 0) * (s @ np.clip(A, None, 0)))
    return np.stack(out).reshape(x.shape)


def test_randomised_model_relevance_follows_randomised_weights():
    """Each cascade step rebuilds the relevance model from the randomised ORIGINAL: its relevance equals the oracle
    on the current (randomised) parameters, with BatchNorm folded and z+ weights derived from them, and differs
    from the oracle on the original parameters once the convolution or BatchNorm changed."""
    model, inits = _tiny_model()
    x = np.random.default_rng(1).standard_normal((3, 2, 5, 5)).astype(np.float32)
    t = np.array([0, 1, 2])
    original = _oracle({k: v.astype(np.float64) for k, v in inits.items()}, x, t)
    steps = []
    for layer, ir_model in randomisation.cascade(model, seed=5):
        p = {k: ir_model.graph.initializers[k].const_value.numpy().astype(np.float64) for k in inits}
        rel = onnx_lrp.Explainer(ir_model, composite="epsilon-plus").explain(x, target=t).relevance
        np.testing.assert_allclose(rel, _oracle(p, x, t), rtol=1e-4, atol=1e-5 * np.abs(rel).max())
        steps.append((layer, p))
    assert [s[0] for s in steps] == ["fc", "bn", "conv"]  # top-down
    assert not np.allclose(steps[0][1]["W2"], inits["W2"]) and np.allclose(steps[0][1]["W"], inits["W"])
    assert np.allclose(steps[1][1]["s"], 1) and np.allclose(steps[1][1]["v"], 1)  # torch's reset_parameters
    assert not np.allclose(steps[2][1]["W"], inits["W"])
    assert np.abs(steps[2][1]["W"]).max() <= 1 / np.sqrt(18)  # U(+-1/sqrt(fan_in))
    assert not np.allclose(_oracle(steps[-1][1], x, t), original, rtol=0.1)


def test_randomisation_check_on_the_demo_model(digits):
    ev = onnx_lrp.evaluate(MODEL, digits[:4], metric="randomisation", seed=3)
    names = [row["layer"] for row in ev.layers]
    assert names[0] == "original" and names[1] == "/classifier/classifier.4/Gemm" and len(names) == 1 + 5
    rho = [np.mean(row["spearman"]) for row in ev.layers]
    assert rho[0] == 1.0 and rho[-1] < 0.6  # the explanation depends on the weights
    assert np.all(np.isfinite(ev.scores["emprt"]))
    # eMPRT from its definition: relative change of the histogram entropy, original -> fully randomised
    h0, h1 = ev.layers[0]["entropy"], ev.layers[-1]["entropy"]
    np.testing.assert_allclose(ev.scores["emprt"], (h1 - h0) / h0)
    again = onnx_lrp.evaluate(MODEL, digits[:4], metric="randomisation", seed=3)
    np.testing.assert_array_equal(again.scores["spearman/last"], ev.scores["spearman/last"])  # seeded


# ------------------------------------------------------------------------------------------ command line
def _cli(*args):
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_evaluate_json_matches_the_api_and_plots(tmp_path):
    batch = ROOT / "models" / "samples" / "batch.npy"
    r = _cli("evaluate", MODEL, batch, "--patch", 2, "--steps", 20, "--json", "--plot", tmp_path / "c.png")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    ev = onnx_lrp.evaluate(MODEL, np.load(batch), patch=2, steps=20)
    for k, v in ev.summary().items():
        assert out["summary"][k] == pytest.approx(v, abs=1e-12)
    from PIL import Image
    assert Image.open(tmp_path / "c.png").size[0] == 720
    r = _cli("evaluate", MODEL, batch, "-m", "relevance-mass")
    assert r.exit_code == 2 and "mask" in r.output and r.output.count("\n") == 1
    np.save(tmp_path / "m.npy", np.load(batch) > 0.5)
    r = _cli("evaluate", MODEL, batch, "-m", "relevance-mass", "--mask", tmp_path / "m.npy")
    assert r.exit_code == 0 and "relevance mass accuracy on 10 item(s)" in r.output


def test_cli_evaluate_exits_1_below_the_random_floor(tmp_path):
    """A model whose prediction ignores its input: every order gives the same curve, nothing beats random."""
    W = np.zeros((10, 256), np.float32)
    nodes = [node("Flatten", ["image"], "f"), node("Gemm", ["f", "W", "b"], "logits", transB=1)]
    m = tmp_path / "flat.onnx"
    m.write_bytes(to_bytes(make_model(nodes, {"image": ["N", 1, 16, 16]}, ["logits"],
                                      {"W": W, "b": np.arange(10, dtype=np.float32)})))
    r = _cli("evaluate", m, ROOT / "models" / "samples" / "batch.npy", "--patch", 4, "-c", "epsilon")
    assert r.exit_code == 1 and "does NOT beat" in r.output, r.output


# ------------------------------------------------------------------------------------------ regression checks
def _damaged_model(path):
    """The demo model with its two dense layers randomised (top-down cascade, 2 steps)."""
    from onnx_lrp import load
    gen = randomisation.cascade(MODEL, seed=1)
    next(gen)
    _, ir_model = next(gen)
    path.write_bytes(load.serialize(ir_model))
    return path


def test_snapshot_metrics_and_check_metric_tol(tmp_path):
    batch = ROOT / "models" / "samples" / "batch.npy"
    base = tmp_path / "base.npz"
    r = _cli("snapshot", MODEL, batch, "-o", base, "--metrics", "aopc,abpc", "--metric-patch", 2, "--metric-steps", 24)
    assert r.exit_code == 0, r.output
    z = np.load(base, allow_pickle=False)
    meta = json.loads(str(z["meta"]))["faithfulness"]
    assert meta["metrics"] == ["aopc", "abpc"] and meta["patch"] == 2 and meta["steps"] == 24
    ev = onnx_lrp.evaluate(MODEL, np.load(batch), patch=2, steps=24)  # the stored figures are the API's
    assert_close(z["faithfulness/aopc"], ev.scores["aopc/morf"], atol=1e-12)
    assert_close(z["faithfulness/abpc"], ev.scores["abpc"], atol=1e-12)
    assert z["faithfulness/curve_morf"].shape == (10, 25)
    # the same model passes; JSON and JUnit carry the figures, the PNG report plots the curves
    r = _cli("check", MODEL, base, "--metric-tol", "aopc=0.05", "--report-json", tmp_path / "r.json",
             "--junit-xml", tmp_path / "j.xml", "--heatmap-dir", tmp_path / "hd")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "r.json").read_text())["faithfulness"]
    assert rep["passed"] and rep["metrics"][0]["change"] == pytest.approx(0, abs=1e-9)
    xml = (tmp_path / "j.xml").read_text()
    assert 'name="faithfulness.aopc"' in xml and 'name="faithfulness.random_floor"' in xml and 'failures="0"' in xml
    assert (tmp_path / "hd" / "faithfulness_curves.png").is_file()
    # a damaged model: the paired AOPC drops, the check fails and says so, JUnit has the failing case
    bad = _damaged_model(tmp_path / "bad.onnx")
    r = _cli("check", bad, base, "--metric-tol", "aopc=0.05", "--max-output-diff", "off", "--min-cosine", "off",
             "--max-rel-l2", "off", "--min-spearman", "off", "--min-topk-iou", "off", "--fail-on", "none",
             "--junit-xml", tmp_path / "b.xml")
    assert r.exit_code == 1 and "FAITHFULNESS: aopc mean dropped" in r.output, r.output
    assert "OK: all 10 sample(s)" in r.output  # no drift fails (--fail-on none): only faithfulness failed
    cur = onnx_lrp.evaluate(str(bad), np.load(batch), patch=2, steps=24, target=z["targets"])
    drop = float(np.mean(cur.scores["aopc/morf"] - z["faithfulness/aopc"]))
    assert drop < -0.05 and f"change {drop:+.4f}" in r.output
    assert 'type="FaithfulnessDrop"' in (tmp_path / "b.xml").read_text()
    # a tolerance that accepts the drop passes the metric (the random floor still decides on its own)
    r = _cli("check", bad, base, "--metric-tol", f"aopc={-drop + 0.01:.4f},abpc=off", "--max-output-diff", "off",
             "--min-cosine", "off", "--max-rel-l2", "off", "--min-spearman", "off", "--min-topk-iou", "off",
             "--fail-on", "none")
    assert ("aopc mean dropped" not in r.output) and (r.exit_code == 0) == cur.summary()["beats_random"], r.output


def test_check_metric_tol_refusals(tmp_path):
    batch = ROOT / "models" / "samples" / "batch.npy"
    plain = tmp_path / "plain.npz"
    assert _cli("snapshot", MODEL, batch, "-o", plain).exit_code == 0
    for args, words in (((plain, "--metric-tol", "aopc=0.05"), "holds no faithfulness"),
                        ((plain, "--metric-tol", "auc=0.05"), "NAME=DROP"),
                        ((plain, "--metric-tol", "aopc=-1"), ">= 0")):
        r = _cli("check", MODEL, *args)
        assert r.exit_code == 2 and words in r.output and r.output.count("\n") == 1, r.output
    r = _cli("snapshot", MODEL, batch, "-o", tmp_path / "x.npz", "--metrics", "aopc,iou")
    assert r.exit_code == 2 and "--metrics" in r.output and not (tmp_path / "x.npz").exists()


def test_cli_randomisation_table_and_plot(tmp_path):
    r = _cli("evaluate", MODEL, ROOT / "models" / "samples" / "batch.npy", "-m", "randomisation", "--seed", 3,
             "--plot", tmp_path / "r.png")
    assert r.exit_code == 0, r.output
    ev = onnx_lrp.evaluate(MODEL, np.load(ROOT / "models" / "samples" / "batch.npy"), metric="randomisation", seed=3)
    for row in ev.layers:  # one line per layer, with the API's mean Spearman
        assert f"{row['layer']}" in r.output and f"{np.mean(row['spearman']):.4f}" in r.output
    assert f"{ev.mean('emprt'):.4f}" in r.output and (tmp_path / "r.png").is_file()


def test_channels_last_models_are_perturbed_channel_first(tmp_path, digits):
    """A model taking N x H x W x C (a Transpose in front) scores exactly as the same network taking N x C x H x W:
    Quantus perturbs channel-first, whatever the model's layout."""
    rng = np.random.default_rng(2)
    inits = {"W": rng.standard_normal((4, 1, 3, 3)).astype(np.float32),
             "W2": (rng.standard_normal((10, 1024)) / 30).astype(np.float32), "b2": np.zeros(10, np.float32)}
    body = [node("Conv", ["xc", "W"], "c", pads=[1, 1, 1, 1]), node("Relu", ["c"], "r"), node("Flatten", ["r"], "f"),
            node("Gemm", ["f", "W2", "b2"], "y", transB=1)]
    first = tmp_path / "nchw.onnx"
    first.write_bytes(to_bytes(make_model([node("Identity", ["x"], "xc")] + body, {"x": ["N", 1, 16, 16]}, ["y"],
                                          inits)))
    last = tmp_path / "nhwc.onnx"
    last.write_bytes(to_bytes(make_model([node("Transpose", ["x"], "xc", perm=[0, 3, 1, 2])] + body,
                                         {"x": ["N", 16, 16, 1]}, ["y"], inits)))
    x = digits * 2 - 1
    for metric, kw in (("region-perturbation", dict(patch=4, steps=8)), ("pixel-flipping", dict(steps=32)),
                       ("faithfulness-correlation", dict(subset_size=40, runs=10))):
        a = onnx_lrp.evaluate(str(first), x, metric=metric, composite="epsilon", **kw)
        b = onnx_lrp.evaluate(str(last), x.transpose(0, 2, 3, 1), metric=metric, composite="epsilon", **kw)
        assert b.params.get("channels_last") and not a.params.get("channels_last")
        for k in a.scores:
            assert_close(b.scores[k], a.scores[k], atol=1e-6)


def test_randomisation_measures_match_quantus_functions():
    """The randomisation check's measures against Quantus' own functions (EfficientMPRT's discrete_entropy,
    MPRT's correlation_spearman and ssim), where quantus is installed."""
    pytest.importorskip("quantus")
    from quantus.functions.complexity_func import discrete_entropy
    from quantus.functions.similarity_func import correlation_spearman
    from quantus.functions.similarity_func import ssim as q_ssim

    rng = np.random.default_rng(5)
    a = rng.standard_normal((16, 16))
    b = a + rng.standard_normal((16, 16))
    assert similarity.discrete_entropy(a) == pytest.approx(discrete_entropy(a=a, x=a, n_bins=100), abs=1e-12)
    assert similarity.spearman(a, b) == pytest.approx(correlation_spearman(a.ravel(), b.ravel()), abs=1e-12)
    assert similarity.ssim(a, b) == pytest.approx(q_ssim(a, b), abs=1e-10)


def test_models_the_metrics_cannot_score_are_refused(tmp_path):
    """Two float inputs, or a sequence output (N x T x C): one line each, never a wrong number."""
    two = tmp_path / "two.onnx"
    two.write_bytes(to_bytes(make_model([node("Add", ["a", "b"], "s"), node("Flatten", ["s"], "y")],
                                        {"a": ["N", 1, 4, 4], "b": ["N", 1, 4, 4]}, ["y"])))
    x = np.ones((2, 1, 4, 4), np.float32)
    with pytest.raises(InputError, match="one float input") as err:
        onnx_lrp.evaluate(str(two), {"a": x, "b": x}, patch=2)
    assert "\n" not in str(err.value)
    seq = tmp_path / "seq.onnx"
    W = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    seq.write_bytes(to_bytes(make_model([node("MatMul", ["x", "W"], "y")], {"x": ["N", 5, 4]}, ["y"], {"W": W})))
    with pytest.raises(InputError, match="N x classes") as err:
        onnx_lrp.evaluate(str(seq), np.ones((2, 5, 4), np.float32), metric="pixel-flipping", steps=4,
                          composite="epsilon")
    assert "\n" not in str(err.value)
