"""issue 35 item 7: evaluate's verdict follows the metric its summary prints (ABPC and AOPC both shown, the verdict
says which). A case with ABPC < 0 and the MoRF AOPC above the random order's (the issue's ResNet18 numbers) must
not say "beats the random order"; the demo model's own relevance, whose ABPC is clearly positive, does."""
from __future__ import annotations

import numpy as np
from util import ROOT

import onnx_lrp
from onnx_lrp.metrics import Evaluation
from onnx_lrp.cli.evaluate import summary_lines

MODEL = str(ROOT / "models" / "digits_cnn.onnx")


def _curve_eval(morf, lerf, rnd):
    """An Evaluation with the given per-item AOPC values (the issue's numbers), ABPC computed as the code does."""
    scores = {"aopc/morf": np.array(morf), "aopc/lerf": np.array(lerf), "aopc/random": np.array(rnd)}
    scores["abpc"] = scores["aopc/morf"] - scores["aopc/lerf"]
    scores.update({f"auc/{o}": np.zeros(len(morf)) for o in ("morf", "lerf", "random")})
    params = dict(patch=8, steps=50, baseline="black", prob="softmax", orders=["morf", "lerf", "random"])
    return Evaluation("region-perturbation", params, np.zeros(len(morf), np.int64), scores)


def test_negative_abpc_does_not_beat_the_random_order_even_when_aopc_does():
    # issue 35: AOPC -0.0188 vs -0.0293 (MoRF above random) but ABPC = -0.017
    ev = _curve_eval([-0.0188], [-0.0018], [-0.0293])
    s = ev.summary()
    assert s["aopc/morf"] > s["aopc/random"] and s["abpc"] < 0 and s["beats_random"] is False
    text = "\n".join(summary_lines(ev))
    assert "does NOT beat the random order" in text and "beats the random order" not in text.replace("NOT ", "X")
    verdict = text.splitlines()[-1]
    assert "ABPC -0.0170" in verdict and "AOPC (MoRF) -0.0188 vs random -0.0293" in verdict, verdict
    assert "verdict on ABPC > 0" in verdict, verdict
    d = ev.as_dict()  # the JSON says the same
    assert d["summary"]["beats_random"] is False and d["verdict_on"].startswith("ABPC > 0")


def test_positive_abpc_and_aopc_beat_it_and_say_so():
    ev = _curve_eval([0.30], [0.05], [0.10])
    assert ev.summary()["beats_random"] is True
    verdict = summary_lines(ev)[-1]
    assert verdict.startswith("the explanation beats the random order: ABPC 0.2500"), verdict
    assert "verdict on ABPC > 0 and AOPC (MoRF) above the random order's" in verdict


def test_without_lerf_the_verdict_is_on_aopc_alone():
    scores = {"aopc/morf": np.array([0.2]), "aopc/random": np.array([0.1]), "auc/morf": np.zeros(1),
              "auc/random": np.zeros(1)}
    ev = Evaluation("pixel-flipping", dict(features_in_step=4, steps=8, baseline="black", prob="softmax",
                                           orders=["morf", "random"]), np.zeros(1, np.int64), scores)
    assert ev.summary()["beats_random"] is True
    verdict = summary_lines(ev)[-1]
    assert "(verdict on AOPC)" in verdict and "ABPC" not in verdict, verdict


def test_negated_relevance_on_the_demo_model_has_negative_abpc_and_fails_the_verdict():
    x = (np.load(ROOT / "models" / "digits_heldout.npz")["images"][:6].astype(np.float32) / 255)
    rel = onnx_lrp.Explainer(MODEL).explain(x).relevance
    good = onnx_lrp.evaluate(MODEL, x, metric="region-perturbation", patch=2, steps=16)
    bad = onnx_lrp.evaluate(MODEL, x, metric="region-perturbation", patch=2, steps=16, relevance=-rel)
    assert good.summary()["abpc"] > 0 and good.summary()["beats_random"]
    assert bad.summary()["abpc"] < 0 and not bad.summary()["beats_random"]
    assert summary_lines(bad)[-1].startswith("the explanation does NOT beat the random order: ABPC -")
