"""Regression checks: metrics against independent formulas, the snapshot format, and the `snapshot` / `check` /
`diff` commands run as subprocesses of the installed entry point (exit codes 0 / 1 / 2, JSON and JUnit reports)."""
from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from onnx_lrp.core.files import sha256_file
import onnx_lrp
from onnx_lrp import regression as rg
from onnx_lrp.core.errors import InputError
from util import ROOT

DEMO = ROOT / "models" / "digits_cnn.onnx"
SAMPLES = ROOT / "models" / "samples" / "batch.npy"
CLI = Path(sys.executable).with_name("onnx-lrp")
logging.getLogger().setLevel(logging.ERROR)


# ---------------------------------------------------------------------------------------------- metrics
def test_rankdata_average_ties_brute_force():
    from onnx_lrp.metrics import similarity

    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, 40).astype(float)  # many ties
    # brute force: rank = 1 + #smaller + (#equal - 1) / 2
    want = np.array([1 + np.sum(a < v) + (np.sum(a == v) - 1) / 2 for v in a])
    np.testing.assert_array_equal(similarity.rankdata(a), want)
    np.testing.assert_array_equal(similarity.rankdata(a.astype(np.float32)), want)


def test_constant_map_spearman_is_undefined_but_a_regression_check_compares_it():
    """One Spearman (onnx_lrp.metrics.similarity), two callers: it is NaN on a constant map (no ranking: the
    randomisation check's per-layer figure, averaged with nanmean); the regression check gives a constant map its
    own meaning: two constant maps agree (1.0), a constant map against a varying one does not (0.0)."""
    from onnx_lrp.metrics import similarity

    z, c, v = np.zeros(6), np.full(6, 2.5), np.arange(6.0)
    for a, b in ((z, v), (v, c), (z, z), (z, c)):
        assert np.isnan(similarity.spearman(a, b))
    assert rg.spearman(z, z) == 1.0 and rg.spearman(z, c) == 1.0 and rg.spearman(c, c) == 1.0
    assert rg.spearman(z, v) == 0.0 and rg.spearman(v, c) == 0.0
    assert rg.spearman(v, 2 * v + 1) == 1.0 and rg.spearman(v, -v) == -1.0  # varying maps: the plain correlation
    same = rg.sample_metrics(z, z, np.ones(3), np.ones(3), 10)  # relevance all zero, before and now: no drift
    assert same["spearman"] == 1.0 and rg.failures(same, rg.DEFAULT_THRESHOLDS) == []
    flat = rg.sample_metrics(v, c, np.ones(3), np.ones(3), 10)  # the relevance lost its ranking: drift
    assert flat["spearman"] == 0.0 and "spearman 0 < 0.95" in rg.failures(flat, rg.DEFAULT_THRESHOLDS)


def test_spearman_matches_textbook_formula_without_ties():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(50), rng.standard_normal(50)
    d = np.argsort(np.argsort(a)) - np.argsort(np.argsort(b))
    n = a.size
    assert rg.spearman(a, b) == pytest.approx(1 - 6 * np.sum(d ** 2) / (n * (n * n - 1)), abs=1e-12)
    assert rg.spearman(a, np.exp(a)) == pytest.approx(1.0)  # monotone transform
    assert rg.spearman(a, -a) == pytest.approx(-1.0)


def test_cosine_rel_l2_topk_iou_output_diff():
    a = np.array([3.0, 1.0, 0.0, -2.0, 5.0, 4.0, 0.5, 0.2, 0.1, 0.0])
    b = a.copy()
    b[4], b[1] = b[1], b[4]  # swap the largest with a small one
    assert rg.cosine(a, 2 * a) == pytest.approx(1.0) and rg.cosine(a, -a) == pytest.approx(-1.0)
    assert rg.cosine(a, b) == pytest.approx(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
    assert rg.rel_l2(a, 1.1 * a) == pytest.approx(0.1)
    # top 20 % = 2 features: {4, 5} vs {1, 5}: IoU 1/3
    assert rg.topk_iou(a, b, 20) == pytest.approx(1 / 3)
    assert rg.topk_iou(a, a, 20) == 1.0
    assert rg.output_diff(np.array([10.0, -2.0]), np.array([10.5, -2.0])) == pytest.approx(0.05)
    m = rg.sample_metrics(a, np.full_like(a, np.nan), a, a, 10)
    assert np.isnan(m["cosine"]) and "cosine is not finite" in rg.failures(m, rg.DEFAULT_THRESHOLDS)
    # degenerate vectors
    z = np.zeros(4)
    assert rg.cosine(z, z) == 1.0 and rg.spearman(z, z) == 1.0 and rg.rel_l2(z, z) == 0.0
    assert rg.cosine(z, np.ones(4)) == 0.0 and rg.rel_l2(z, np.ones(4)) == np.inf


def test_failures_respect_directions_and_off():
    m = dict(output_diff=0.05, cosine=0.9, rel_l2=0.2, spearman=0.99, topk_iou=0.9)
    th = rg.Thresholds(max_output_diff=0.01, min_cosine=0.95, max_rel_l2=0.1, min_spearman=0.9, min_topk_iou=0.8)
    got = rg.failures(m, th)
    assert [f.split()[0] for f in got] == ["output_diff", "cosine", "rel_l2"]
    assert rg.failures(m, th.replace(max_output_diff=None, min_cosine=None, max_rel_l2=None)) == []


def test_thresholds_defaults_config_and_overrides(tmp_path):
    th, used = rg.load_thresholds(cwd=tmp_path)
    assert th == rg.DEFAULT_THRESHOLDS and used is None
    (tmp_path / ".onnx-lrp.toml").write_text("[check]\nmin_cosine = 0.9\nmax_rel_l2 = false\ntopk_percent = 5\n")
    th, used = rg.load_thresholds(cwd=tmp_path)
    assert (th.min_cosine, th.max_rel_l2, th.topk_percent, used) == (0.9, None, 5.0, str(tmp_path / ".onnx-lrp.toml"))
    th, _ = rg.load_thresholds(cwd=tmp_path, overrides=dict(min_cosine="0.8", max_rel_l2="0.3", min_spearman="off"))
    assert (th.min_cosine, th.max_rel_l2, th.min_spearman) == (0.8, 0.3, None)
    bad = tmp_path / "bad.toml"
    bad.write_text("[check]\nmin_cosin = 0.9\n")
    with pytest.raises(InputError, match="unknown key.*min_cosin"):
        rg.load_thresholds(bad)
    with pytest.raises(InputError, match="not a number"):
        rg.load_thresholds(cwd=tmp_path, overrides=dict(min_cosine="high"))


# ---------------------------------------------------------------------------------------------- snapshot
def test_snapshot_roundtrip_plain_arrays(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    name, toml = rg.composite_source("epsilon-gamma-box")
    low = np.array([0.0, -1.0, 0.5], np.float32).reshape(3, 1, 1)
    arrays = rg.snapshot_arrays(rg.Recorded(inputs={"x": x}, targets=[1, 0, 2], outputs={"y": x[:, :3]},
                                            relevance={"x": x * 2}, items=["a", "b", "c"]),
                                rg.Provenance(model_path=DEMO, composite_name=name, composite_toml=toml,
                                              params={"gamma": 0.5, "low": low}, start="one-hot", output=None,
                                              explained_output="y", target_request="argmax"))
    path = tmp_path / "s.npz"
    np.savez(path, **arrays)
    with np.load(path, allow_pickle=False) as z:  # plain arrays only: no pickle needed
        assert all(z[k].dtype != object for k in z.files)
    snap = rg.read_snapshot(path)
    assert snap.items == ["a", "b", "c"] and snap.meta["start"] == "one-hot"
    assert snap.meta["model"]["sha256"] == sha256_file(DEMO)
    comp = snap.composite()
    ref = onnx_lrp.rules.composite.load_composite("epsilon-gamma-box").with_params(gamma=0.5, low=low)
    assert [e.match for e in comp.entries] == [e.match for e in ref.entries]
    for e, r in zip(comp.entries, ref.entries):
        assert type(e.rule) is type(r.rule)
        for k, v in r.rule.params().items():
            np.testing.assert_array_equal(np.asarray(e.rule.params()[k]), np.asarray(v))
    np.testing.assert_array_equal(snap.relevance["x"], x * 2)
    np.testing.assert_array_equal(snap.targets, [1, 0, 2])


def test_read_snapshot_rejects_bad_files(tmp_path):
    p = tmp_path / "plain.npz"
    np.savez(p, a=np.zeros(3))
    with pytest.raises(InputError, match="not an onnx-lrp snapshot"):
        rg.read_snapshot(p)
    p2 = tmp_path / "pickled.npz"
    np.savez(p2, meta=np.array([{"format": rg.FORMAT}], dtype=object))
    with pytest.raises(InputError, match="pickled"):
        rg.read_snapshot(p2)
    p3 = tmp_path / "trunc.npz"
    p3.write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(InputError, match="not a valid .npz"):
        rg.read_snapshot(p3)


# ---------------------------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    if not DEMO.exists():
        pytest.skip("models/digits_cnn.onnx is missing (python models/build_digits.py)")
    if not CLI.exists():
        pytest.skip(f"the onnx-lrp entry point is not installed next to {sys.executable}")
    spec = importlib.util.spec_from_file_location("bdv", ROOT / "models" / "build_deployed_variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path_factory.mktemp("variants")
    return dict(reexport=mod.build_reexport(DEMO, out / "reexport.onnx"),
                perturbed=mod.build_perturbed(DEMO, out / "perturbed.onnx"),
                qdq=mod.build_qdq(DEMO, out / "qdq.onnx"))


def run_cli(*args, cwd):
    """The installed entry point as a subprocess (exit codes as CI sees them; ~4 s each, mostly imports): the
    baseline's snapshot, a failing check (exit 1) and a bad snapshot (exit 2); the other commands run in-process."""
    p = subprocess.run([str(CLI), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def run_here(run_cli):
    """The same command group in-process (same exit-code handling, no interpreter start-up)."""
    return run_cli


@pytest.fixture(scope="module")
def baseline(variants, tmp_path_factory):
    d = tmp_path_factory.mktemp("baseline")
    code, out, err = run_cli("snapshot", DEMO, SAMPLES, "-o", d / "baseline.npz", cwd=d)
    assert code == 0, err
    return d / "baseline.npz"


def _independent_metrics(model, snap):
    """Recompute the current relevance in-process and the metrics with inline numpy (not onnx_lrp.regression)."""
    ex = onnx_lrp.Explainer(model, composite=snap.composite(), start=snap.meta["start"])
    res = ex.explain(snap.inputs["image"], target=snap.targets)
    out = []
    for i in range(len(snap.targets)):
        a = snap.relevance["image"][i].ravel().astype(np.float64)
        b = res.relevance[i].ravel().astype(np.float64)
        a, b = a / np.abs(a).sum(), b / np.abs(b).sum()  # rel_l2 compares the shape: each map over its sum of |r|
        out.append(dict(cosine=a @ b / np.linalg.norm(a) / np.linalg.norm(b),
                        rel_l2=np.linalg.norm(b - a) / np.linalg.norm(a)))
    return out


def test_check_passes_for_reexported_model(variants, baseline, tmp_path, run_here):
    code, out, err = run_here("check", variants["reexport"], baseline, "--report-json", tmp_path / "r.json",
                              "--junit-xml", tmp_path / "j.xml", cwd=tmp_path)
    assert code == 0, out + err
    assert "OK: all 10 sample(s)" in out
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["passed"] and rep["n_samples"] == 10 and rep["drifted"] == [] and rep["model_changed"]
    assert all(s["metrics"]["cosine"] > 0.99999 for s in rep["samples"])
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert suite.get("tests") == "10" and suite.get("failures") == "0"
    assert not suite.findall("testcase/failure")


def test_check_fails_for_perturbed_layer(variants, baseline, tmp_path):
    code, out, err = run_cli("check", variants["perturbed"], baseline, "--report-json", tmp_path / "r.json",
                             "--junit-xml", tmp_path / "j.xml", "--heatmap-dir", tmp_path / "heat", cwd=tmp_path)
    assert code == 1, out + err
    rep = json.loads((tmp_path / "r.json").read_text())
    assert not rep["passed"] and rep["drifted"]
    for name in rep["drifted"]:
        assert name in out.split("DRIFT:")[-1]  # the drifted samples are named on stdout
    # the figures are the metrics of an independent in-process recomputation
    snap = rg.read_snapshot(baseline)
    ref = _independent_metrics(variants["perturbed"], snap)
    for s, r in zip(rep["samples"], ref):
        assert s["metrics"]["cosine"] == pytest.approx(r["cosine"], abs=1e-6)
        assert s["metrics"]["rel_l2"] == pytest.approx(r["rel_l2"], rel=1e-4, abs=1e-6)
    th = rep["thresholds"]
    assert th["fail_on"] == ["relevance", "predictions"]  # the default: output drift alone is reported, not failed
    for s in rep["samples"]:
        beyond = s["metrics"]["cosine"] < th["min_cosine"] or s["metrics"]["rel_l2"] > th["max_rel_l2"] or \
            s["metrics"]["spearman"] < th["min_spearman"] or s["metrics"]["topk_iou"] < th["min_topk_iou"]
        changed = s["predicted_baseline"] != s["predicted_current"]
        assert beyond == ("relevance" in s["drift"]) and changed == ("predictions" in s["drift"])
        assert (s["metrics"]["output_diff"] > th["max_output_diff"]) == ("outputs" in s["drift"])
        assert (beyond or changed) == (not s["passed"])
    # JUnit: one failure per drifted sample, carrying the figures
    cases = ET.parse(tmp_path / "j.xml").getroot().findall("testsuite/testcase")
    failed = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert sorted(failed) == sorted(rep["drifted"])
    for name, f in failed.items():
        s = next(x for x in rep["samples"] if x["item"] == name)
        assert f"cosine={s['metrics']['cosine']:.4f}" in f.text
    # heatmaps for the drifted samples only: baseline | current | difference
    from PIL import Image

    pngs = sorted((tmp_path / "heat").glob("*.png"))
    assert len(pngs) == len(rep["drifted"])
    with Image.open(pngs[0]) as im:  # three tiles side by side; captions and a colour bar below them
        assert im.size[0] > 2.0 * im.size[1]


def test_check_fails_for_quantized_model_beyond_config_thresholds(variants, baseline, tmp_path, run_here):
    """Thresholds from .onnx-lrp.toml in the working directory: the int8 QDQ model drifts beyond them, the
    re-exported float model does not."""
    (tmp_path / ".onnx-lrp.toml").write_text("[check]\nmin_cosine = 0.9999\nmax_rel_l2 = 0.01\n"
                                             "max_output_diff = 0.002\n")
    code, out, err = run_here("check", variants["qdq"], baseline, "--report-json", tmp_path / "q.json", cwd=tmp_path)
    assert code == 1, out + err
    rep = json.loads((tmp_path / "q.json").read_text())
    assert rep["config"].endswith(".onnx-lrp.toml") and rep["thresholds"]["min_cosine"] == 0.9999
    assert len(rep["drifted"]) >= 5
    code, out, err = run_here("check", variants["reexport"], baseline, cwd=tmp_path)
    assert code == 0, out + err
    # a command-line value wins over the file: with the checks loosened, the quantized model passes
    code, out, err = run_here("check", variants["qdq"], baseline, "--min-cosine", "0.9", "--max-rel-l2", "off",
                             "--max-output-diff", "0.2", "--min-spearman", "0.5", "--min-topk-iou", "0.3",
                             cwd=tmp_path)
    assert code == 0, out + err


def test_diff_between_model_versions(variants, tmp_path, run_here):
    code, out, err = run_here("diff", DEMO, variants["reexport"], SAMPLES, cwd=tmp_path)
    assert code == 0, out + err
    code, out, err = run_here("diff", DEMO, variants["perturbed"], SAMPLES, "--junit-xml", tmp_path / "d.xml",
                              cwd=tmp_path)
    assert code == 1, out + err
    suite = ET.parse(tmp_path / "d.xml").getroot().find("testsuite")
    assert suite.get("name") == "onnx-lrp diff" and int(suite.get("failures")) >= 1


def test_bad_input_exits_2_with_one_line(variants, baseline, tmp_path, run_here):
    np.savez(tmp_path / "plain.npz", a=np.zeros(2))
    for args in (("check", DEMO, tmp_path / "plain.npz"),
                 ("check", tmp_path / "missing.onnx", baseline),
                 ("check", DEMO, baseline, "--min-cosine", "high"),
                 ("snapshot", DEMO, SAMPLES, "-o", tmp_path / "x.npy")):
        code, out, err = (run_cli if args[0] == "snapshot" else run_here)(*args, cwd=tmp_path)
        assert code == 2, (args, out, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_baseline_from_another_cpu_fails_only_on_explanation_drift(variants, tmp_path, run_here):
    """A snapshot of a quantized model stores the deployed outputs, the explained forward and the machine's int8
    facts. Checked on a CPU whose int8 kernels compute other deployed outputs (faked: the baseline's deployed logits
    moved by 2.83 on one item, as AVX2's saturating kernels do to the dynamic demo's item 4, and its machine marked
    as saturating), the check passes and says so in one note; an explanation moved beyond the thresholds fails."""
    base = tmp_path / "q.npz"
    code, out, err = run_here("snapshot", variants["qdq"], SAMPLES, "-o", base, cwd=tmp_path)
    assert code == 0, out + err
    snap = rg.read_snapshot(base)
    assert set(snap.forward) == {"logits"} and snap.meta["machine"]["int8_saturates"] in (True, False)
    assert snap.meta["deployed_gap"]["output"] == "logits"
    ex = onnx_lrp.Explainer(variants["qdq"])  # independent of the CLI: outputs deployed, forward explained
    res = ex.explain(snap.inputs["image"], target=snap.targets)
    np.testing.assert_array_equal(snap.outputs["logits"], res.outputs["logits"])
    np.testing.assert_array_equal(snap.forward["logits"], res.forward["logits"])
    with np.load(base) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta"]))
    meta["machine"] = dict(meta["machine"], int8_saturates=not meta["machine"]["int8_saturates"])
    arrays["meta"] = np.array(json.dumps(meta))
    arrays["outputs/logits"] = arrays["outputs/logits"].copy()
    arrays["outputs/logits"][4, 0] += 2.83  # the other machine's deployed output
    other = tmp_path / "other_cpu.npz"
    np.savez_compressed(other, **arrays)
    code, out, err = run_here("check", variants["qdq"], other, "--report-json", tmp_path / "r.json", cwd=tmp_path)
    assert code == 0, out + err
    notes = [line for line in out.splitlines() if line.startswith("note: the deployed outputs differ")]
    assert len(notes) == 1 and "by up to 2.83 on logits[0] of batch.npy[4]" in notes[0]
    rep = json.loads((tmp_path / "r.json").read_text())
    d = rep["deployed_outputs"]
    assert d["differ"] and d["max_abs"] == pytest.approx(2.83, abs=1e-5) and d["item"] == "batch.npy[4]"
    assert d["machines"]["baseline"]["int8_saturates"] != d["machines"]["current"]["int8_saturates"]
    assert all(s["metrics"]["output_diff"] == 0 for s in rep["samples"])  # compared on the explained forward
    # the same baseline with one explanation moved (another item's relevance scaled): that item drifts
    arrays["relevance/image"] = arrays["relevance/image"].copy()
    arrays["relevance/image"][2] = arrays["relevance/image"][2] ** 2
    np.savez_compressed(other, **arrays)
    code, out, err = run_here("check", variants["qdq"], other, cwd=tmp_path)
    assert code == 1 and "DRIFT: 1 of 10 sample(s) beyond the thresholds (relevance 1): batch.npy[2]" in out, \
        out + err
