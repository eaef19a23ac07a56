"""Write tests/goldens/quantus_rgb.npz: Quantus 0.6 given attributions in its own layout, N x 1 x H x W, for
N x 3 x H x W inputs (what ``quantus.explain`` returns: the channels summed, the axis kept), on a small RGB CNN
(seeded numpy weights, stored in the file as ONNX bytes) wrapped as a torch module that calls onnxruntime.

    .venv/bin/pip install --no-deps quantus==0.6.0 && .venv/bin/pip install scikit-image scikit-learn tqdm \
        cachetools pandas matplotlib opencv-python-headless
    .venv/bin/python scripts/make_quantus_rgb_goldens.py

tests/metrics/test_evaluate.py checks that ``onnx_lrp.evaluate(..., relevance=<N x 1 x H x W>)`` gives these numbers (and
runs Quantus live where it is installed).
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "goldens" / "quantus_rgb.npz"
SEED = 11
# name -> (Quantus class, constructor kwargs, onnx_lrp.evaluate kwargs)
CASES = {
    "rp": ("RegionPerturbation", dict(patch_size=2, regions_evaluation=12, order="morf"),
           dict(metric="region-perturbation", patch=2, steps=12, orders=("morf",))),
    "pf": ("PixelFlipping", dict(features_in_step=16, perturb_baseline="black"),
           dict(metric="pixel-flipping", features_in_step=16, orders=("morf",))),
    "fc": ("FaithfulnessCorrelation", dict(nr_runs=10, subset_size=24, return_aggregate=False),
           dict(metric="faithfulness-correlation", runs=10, subset_size=24)),
    "rma": ("RelevanceMassAccuracy", dict(), dict(metric="relevance-mass")),
}


def rgb_model() -> bytes:
    """Conv 3 -> 4 (3 x 3, pad 1), ReLU, max-pool 2, flatten, dense -> 5 logits; input [N, 3, 8, 8]."""
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(5)
    inits = dict(w=rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), b=rng.normal(0, 0.1, 4).astype(np.float32),
                 wd=rng.normal(0, 0.3, (64, 5)).astype(np.float32), bd=rng.normal(0, 0.1, 5).astype(np.float32),
                 shape=np.array([0, -1], np.int64))
    nodes = [helper.make_node("Conv", ["image", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "wd"], ["m"]),
             helper.make_node("Add", ["m", "bd"], ["logits"])]
    graph = helper.make_graph(nodes, "rgb", [helper.make_tensor_value_info("image", 1, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("logits", 1, ["N", 5])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def inputs(model: bytes):
    """Six RGB images in [0, 1], their relevance summed over the channels (N x 1 x 8 x 8), targets, masks."""
    import onnx_lrp

    x = np.random.default_rng(3).uniform(0, 1, (6, 3, 8, 8)).astype(np.float32)
    res = onnx_lrp.Explainer(model).explain(x)
    a = res.relevance.sum(axis=1, keepdims=True).astype(np.float32)
    mask = np.zeros((6, 1, 8, 8), np.float32)
    mask[:, :, 2:6, 1:5] = 1
    return x, a, np.asarray(res.target, np.int64), mask


def run_quantus(name: str, model: bytes, x, a, y, mask) -> np.ndarray:
    import quantus
    import torch

    import onnxruntime as ort

    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])

    class Module(torch.nn.Module):
        def forward(self, t):
            return torch.from_numpy(sess.run(["logits"], {"image": t.detach().cpu().numpy().astype(np.float32)})[0])

    cls_name, ctor, _ = CASES[name]
    metric = getattr(quantus, cls_name)(disable_warnings=True, **ctor)
    np.random.seed(SEED)
    out = metric(model=Module().eval(), x_batch=x, y_batch=y, a_batch=a, s_batch=mask, device="cpu")
    return np.asarray(out, np.float64)


def main():
    try:
        version = __import__("quantus").__version__
    except ImportError:
        sys.exit("quantus is not installed: pip install --no-deps quantus==0.6.0 (see the docstring)")
    warnings.simplefilter("ignore")
    model = rgb_model()
    x, a, y, mask = inputs(model)
    outs = {f"out/{k}": run_quantus(k, model, x, a, y, mask) for k in CASES}
    meta = json.dumps(dict(quantus=version, seed=SEED, cases={k: dict(metric=c, ctor=kw, ours=ours)
                                                               for k, (c, kw, ours) in CASES.items()}))
    np.savez_compressed(OUT, model=np.frombuffer(model, np.uint8), x=x, relevance=a, target=y, mask=mask,
                        meta=np.array(meta), **outs)
    print(f"wrote {OUT}: " + ", ".join(f"{k} {v.shape}" for k, v in outs.items()))


if __name__ == "__main__":
    main()
