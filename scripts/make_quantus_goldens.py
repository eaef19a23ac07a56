"""Write tests/goldens/quantus_metrics.npz: Quantus 0.6's PixelFlipping, RegionPerturbation,
FaithfulnessCorrelation and RelevanceMassAccuracy on the demo model (models/digits_cnn.onnx) wrapped as a torch
module that calls onnxruntime, for fixed inputs and relevance arrays (epsilon-plus-flat relevance of onnx-lrp,
stored with the results, so the golden does not move when the LRP rules do).

    .venv/bin/pip install --no-deps quantus==0.6.0 && .venv/bin/pip install scikit-image scikit-learn scipy tqdm \
        cachetools pandas matplotlib opencv-python-headless
    .venv/bin/python scripts/make_quantus_goldens.py

tests/metrics/test_evaluate.py compares onnx_lrp.metrics with these arrays (and with live Quantus where it is installed).
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "digits_cnn.onnx"
OUT = ROOT / "tests" / "goldens" / "quantus_metrics.npz"

# name -> (Quantus class, constructor kwargs, call kwargs); "x3" = inputs with 15 x 15 pixels (region padding)
CASES = {
    "pf_black": ("PixelFlipping", dict(features_in_step=8, perturb_baseline="black"), {}),
    "pf_mean": ("PixelFlipping", dict(features_in_step=16, perturb_baseline="mean"), {}),
    "pf_logit": ("PixelFlipping", dict(features_in_step=8, perturb_baseline="black"), dict(softmax=False)),
    "rp_morf": ("RegionPerturbation", dict(patch_size=2, regions_evaluation=30, order="morf"), {}),
    "rp_lerf": ("RegionPerturbation", dict(patch_size=2, regions_evaluation=30, order="lerf"), {}),
    "rp_random": ("RegionPerturbation", dict(patch_size=2, regions_evaluation=30, order="random"), {}),
    "rp_mean_p4": ("RegionPerturbation", dict(patch_size=4, regions_evaluation=16, order="morf",
                                              perturb_baseline="mean"), {}),
    "rp_uniform": ("RegionPerturbation", dict(patch_size=2, regions_evaluation=20, order="morf",
                                              perturb_baseline="uniform"), {}),
    "rp_pad": ("RegionPerturbation", dict(patch_size=4, regions_evaluation=16, order="morf",
                                          perturb_baseline="mean"), dict(crop=True)),
    "fc": ("FaithfulnessCorrelation", dict(nr_runs=20, subset_size=32, return_aggregate=False), {}),
    "fc_uniform": ("FaithfulnessCorrelation", dict(nr_runs=15, subset_size=64, perturb_baseline="uniform",
                                                   return_aggregate=False), {}),
    "rma": ("RelevanceMassAccuracy", dict(), {}),
}
SEED = 7


class OnnxModule:
    """A torch module whose forward runs the ONNX model in onnxruntime (no gradient: the metrics need none)."""

    def __new__(cls, path):
        import onnxruntime as ort
        import torch

        class _M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                self.name = self.sess.get_inputs()[0].name

            def forward(self, x):
                y = self.sess.run(["logits"], {self.name: x.detach().cpu().numpy().astype(np.float32)})[0]
                return torch.from_numpy(y)

        return _M().eval()


def inputs():
    """Eight held-out digits (float32 in [0, 1]), their epsilon-plus-flat relevance, targets and masks."""
    import onnx_lrp

    data = np.load(ROOT / "models" / "digits_heldout.npz")
    x = data["images"][:8].astype(np.float32) / 255
    ex = onnx_lrp.Explainer(str(MODEL))
    res = ex.explain(x)
    a = res.relevance.astype(np.float32)
    mask = (x > 0.5).astype(np.float32)  # the strokes
    return x, a, np.asarray(res.target, np.int64), mask


def run_case(name, x, a, y, mask):
    import quantus

    cls_name, ctor, call = CASES[name]
    call = dict(call)
    crop = call.pop("crop", False)
    xx, aa = (x[:, :, :15, :15].copy(), a[:, :, :15, :15].copy()) if crop else (x, a)
    metric = getattr(quantus, cls_name)(disable_warnings=True, **ctor)
    np.random.seed(SEED)
    model = OnnxModule(MODEL)
    if crop:  # the model needs 16 x 16: pad back inside the module
        import torch

        inner = model

        class Padded(torch.nn.Module):
            def forward(self, t):
                return inner(torch.nn.functional.pad(t, (0, 1, 0, 1)))
        model = Padded().eval()
    out = metric(model=model, x_batch=xx, y_batch=y, a_batch=aa, s_batch=mask, device="cpu", **call)
    return np.asarray(out, np.float64)


def main():
    try:
        import quantus  # noqa: F401
    except ImportError:
        sys.exit("quantus is not installed: pip install --no-deps quantus==0.6.0 (see the docstring)")
    warnings.simplefilter("ignore")
    x, a, y, mask = inputs()
    arrays = dict(x=x, relevance=a, target=y, mask=mask)
    for name in CASES:
        arrays[f"out/{name}"] = run_case(name, x, a, y, mask)
        print(name, arrays[f"out/{name}"].shape)
    meta = dict(quantus=__import__("quantus").__version__, seed=SEED,
                cases={k: dict(metric=c, ctor=kw, call=call) for k, (c, kw, call) in CASES.items()})
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT} ({OUT.stat().st_size / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
