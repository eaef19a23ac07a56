"""CUDA = CPU: every family of tests/families.py explained on CUDA gives the CPU's relevance (TF32 off, the default)
to rel-L2 <= 1e-4; TF32 on (the opt-in) stays finite and close. Runs only where onnxruntime can start its CUDA
provider (skipped as one module otherwise); scripts/gpu_check.sh runs it on the GPU machine.
ONNX_LRP_PARITY_DEVICE=cpu runs the same checks with the CPU provider in place of CUDA (a dry run of this file).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import onnx_lrp
from families import FAMILIES
from onnx_lrp.run import runtime
from onnx_lrp.core.errors import LrpError


DEVICE = os.environ.get("ONNX_LRP_PARITY_DEVICE", "cuda")
PROVIDER = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}[DEVICE]


def _cuda_starts() -> bool:
    try:
        if DEVICE not in runtime.available_devices():
            return False
        onnx_lrp.Explainer(FAMILIES[-1].model, composite="epsilon", device=DEVICE)
        return True
    except LrpError:
        return False


if not _cuda_starts():
    pytest.skip("no CUDA device for onnxruntime here", allow_module_level=True)

TOL = 1e-4


def _rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _first(rel):
    return next(iter(rel.values())) if isinstance(rel, dict) else rel


@pytest.mark.parametrize("fam", FAMILIES, ids=[f.name for f in FAMILIES])
def test_cuda_relevance_equals_cpu(fam):
    feeds = fam.feeds()
    cpu = fam.explainer().explain(feeds)
    cuda_ex = fam.explainer(device=DEVICE)
    assert cuda_ex.device == DEVICE and cuda_ex.session.providers[0] == PROVIDER
    cuda = cuda_ex.explain(feeds)
    np.testing.assert_array_equal(cuda.target, cpu.target)
    err = _rel_l2(_first(cuda.relevance), _first(cpu.relevance))
    assert err <= TOL, f"{fam.name}: CUDA vs CPU rel-L2 {err:.2e}"
    tf32 = fam.explainer(device=DEVICE, tf32=True).explain(feeds, target=cpu.target)
    assert np.all(np.isfinite(_first(tf32.relevance)))
    assert _rel_l2(_first(tf32.relevance), _first(cpu.relevance)) < 0.1


def test_auto_takes_cuda_and_says_so():
    ex = FAMILIES[-1].explainer(device="auto")
    assert ex.device == ("cuda" if DEVICE == "cuda" else ex.device) and ex.device_note is None
