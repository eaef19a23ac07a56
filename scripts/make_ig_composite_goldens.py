"""Write tests/goldens/methods/ig_composite.npz: zennit 0.5.1's ``IntegratedGradients(model, composite=C,
n_iter=n)`` (the path integral of a composite's modified gradient) on the small plain CNN of the methods' goldens
(tests/goldens/methods/plain_cnn.onnx, tests/captum_nets.plain_cnn(53)), for EpsilonPlusFlat and EpsilonGammaBox,
from a zero baseline and from a constant one, with the output attribution one-hot at the target (zennit's usual
``torch.eye(classes)[target]``); each reference in float32 and its distance (relative L2) to the same run in
float64, so that tests/methods/test_ig_composite.py checks onnx_lrp's ``integrated-gradients`` with ``base=`` a
composite against it without torch or zennit.

    .venv/bin/python scripts/make_ig_composite_goldens.py
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "goldens" / "methods"
sys.path.insert(0, str(ROOT / "tests"))
from captum_nets import plain_cnn  # noqa: E402

BOX = (-3.0, 3.0)  # EpsilonGammaBox's bounds, given to onnx-lrp as low= / high=
#: case -> (composite, onnx-lrp's composite and parameters, n_iter, the constant baseline)
CASES = {"epf": ("EpsilonPlusFlat", "epsilon-plus-flat", {}, 8, 0.0),
         "egb": ("EpsilonGammaBox", "epsilon-gamma-box", {"low": BOX[0], "high": BOX[1]}, 8, 0.0),
         "epf_base": ("EpsilonPlusFlat", "epsilon-plus-flat", {}, 6, 0.2)}


def _composite(name: str):
    from zennit.composites import EpsilonGammaBox, EpsilonPlusFlat

    return EpsilonGammaBox(low=BOX[0], high=BOX[1]) if name == "EpsilonGammaBox" else EpsilonPlusFlat()


def zennit_ig(module, x: np.ndarray, t: np.ndarray, case: tuple, dtype) -> np.ndarray:
    """zennit's IntegratedGradients over the case's composite, in ``dtype``."""
    from zennit.attribution import IntegratedGradients

    name, _, _, n_iter, base = case
    net = copy.deepcopy(module).to(dtype)
    X = torch.tensor(x, dtype=dtype)
    one_hot = torch.eye(5, dtype=dtype)[torch.tensor(t)]
    with IntegratedGradients(net, composite=_composite(name), n_iter=n_iter,
                             baseline_fn=lambda a: torch.full_like(a, base)) as attributor:
        _, attr = attributor(X, one_hot)
    return attr.detach().numpy()


def main() -> None:
    module = plain_cnn(53)
    rng = np.random.default_rng(81)
    x = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
    t = np.array([4, 1])
    import onnxruntime as ort

    session = ort.InferenceSession(str(OUT / "plain_cnn.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        y = module(torch.tensor(x)).numpy()
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    assert np.allclose(got, y, rtol=1e-5, atol=1e-6), "plain_cnn.onnx is not captum_nets.plain_cnn(53)"
    arrays, index = {"x": x, "target": t}, {}
    for key, case in CASES.items():
        ref32 = zennit_ig(module, x, t, case, torch.float32)
        ref64 = zennit_ig(module, x, t, case, torch.float64)
        arrays[f"{key}/ref"] = ref32
        index[key] = {"composite": case[1], "params": case[2], "n_steps": case[3], "baselines": case[4],
                      "f32_vs_f64": float(np.linalg.norm(ref32 - ref64) / np.linalg.norm(ref64))}
    arrays["index"] = np.array(json.dumps(index))
    np.savez_compressed(OUT / "ig_composite.npz", **arrays)
    print(json.dumps(index, indent=1))


if __name__ == "__main__":
    main()
