"""CUDA = CPU: every family of tests/families.py explained on CUDA gives the CPU's relevance (TF32 off, the default)
to rel-L2 <= 1e-4; TF32 on (the opt-in) stays finite and close. On CUDA also: no relevance node runs on the CPU
provider (onnxruntime's own placement, read from its profile, and the prediction of onnx_lrp.run.placement), device
arrays stay on the device, and the command line shows nothing of onnxruntime's log. Runs only where onnxruntime can
start its CUDA provider (skipped as one module otherwise); scripts/gpu_check.sh runs it on the GPU machine.
ONNX_LRP_PARITY_DEVICE=cpu runs the same checks with the CPU provider in place of CUDA (a dry run of this file).

Run it against an installed onnx-lrp (a wheel) from the checkout with ``python -P -m pytest``: ``-P`` keeps the
checkout's own ``onnx_lrp`` folder off the path (its rules/ and cli/ packages are mapped in only by an install).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import onnx_lrp

try:
    import onnx_lrp.rules  # noqa: F401 - mapped in by the install (pyproject's package-dir)
except ImportError:  # pragma: no cover - a checkout on sys.path shadows the installed package
    raise ImportError(f"onnx_lrp was imported from {Path(onnx_lrp.__file__).parent}, a checkout without an install "
                      "(no onnx_lrp.rules): run `python -P -m pytest ...` with onnx-lrp installed (the wheel), or "
                      "`pip install -e .` in the checkout") from None

from families import FAMILIES
from onnx_lrp.core.errors import LrpError
from onnx_lrp.run import placement, runtime
from util import rel_l2


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
    err = rel_l2(_first(cuda.relevance), _first(cpu.relevance))
    assert err <= TOL, f"{fam.name}: CUDA vs CPU rel-L2 {err:.2e}"
    tf32 = fam.explainer(device=DEVICE, tf32=True).explain(feeds, target=cpu.target)
    assert np.all(np.isfinite(_first(tf32.relevance)))
    assert rel_l2(_first(tf32.relevance), _first(cpu.relevance)) < 0.1


def real_placement(ex, feeds: dict) -> dict:
    """Node name -> provider, as onnxruntime ran one explain of ``ex`` (its profile's node events)."""
    import tempfile

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.log_severity_level = 3
    opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="onnx-lrp-place-"), "p")
    providers = ["CPUExecutionProvider"]
    if DEVICE == "cuda":
        providers = [("CUDAExecutionProvider", runtime.cuda_options(False))] + providers
    sess = ort.InferenceSession(ex.relevance_model.model_bytes, sess_options=opts, providers=providers)
    checked = ex.checked_feeds(feeds)
    batch = next((a.shape[0] for a in checked.values() if a.ndim), 1)
    whole = ex.relevance_model.whole
    steer = {"lrp/target": np.full(1 if whole else batch, -1, np.int64), "lrp/one_hot": np.array(False)}
    if ex.relevance_model.sequence_rows is not None:
        steer["lrp/position"] = np.full(batch, -1, np.int64)
    sess.run(None, {**checked, **steer})
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    return {e["name"][: -len("_kernel_time")]: e["args"].get("provider", "")
            for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")}


@pytest.mark.parametrize("fam", FAMILIES, ids=[f.name for f in FAMILIES])
def test_no_relevance_node_runs_on_the_cpu_provider(fam):
    """onnxruntime's own placement (its profile) puts every relevance node on CUDA, as onnx_lrp.run.placement
    predicts; the forward's CPU nodes are the model's (listed, not held against it)."""
    ex = fam.explainer(device=DEVICE)
    placed = real_placement(ex, fam.feeds())
    assert placed and any(n.startswith("lrp/") for n in placed)
    predicted = placement.predict_bytes(ex.relevance_model.model_bytes, ex.relevance_model.model_folder)
    assert predicted.relevance_nodes() == []
    if DEVICE != "cuda":
        return
    on_cpu = sorted(n for n, p in placed.items() if p == "CPUExecutionProvider" and n.startswith("lrp/"))
    assert on_cpu == [], f"{fam.name}: relevance nodes on the CPU provider: {on_cpu[:8]}"


def test_device_arrays_stay_on_the_gpu_and_only_the_small_outputs_cross():
    torch = pytest.importorskip("torch")
    if DEVICE != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    fam = next(f for f in FAMILIES if f.name == "resnet-epf")
    ex = fam.explainer(device="cuda")
    x = next(iter(fam.feeds().values()))
    ref = ex.explain(x)
    host_bytes = ex.last_transfer["to_host"]
    res = ex.explain(torch.from_numpy(x).cuda())
    assert isinstance(res.relevance, torch.Tensor) and res.relevance.is_cuda
    np.testing.assert_array_equal(res.relevance.cpu().numpy(), ref.relevance)
    assert ex.last_transfer["to_device"] < 1024 and ex.last_transfer["to_host"] < 64 * len(x)
    assert host_bytes >= ref.relevance.nbytes  # the numpy caller got its relevance copied back


def test_the_command_line_on_cuda_shows_nothing_of_onnxruntimes_log(tmp_path):
    fam = next(f for f in FAMILIES if f.name == "resnet-epf")
    x = next(iter(fam.feeds().values()))
    np.save(tmp_path / "x.npy", x)
    code = "import sys; from onnx_lrp.cli.main import main; sys.argv[0] = 'onnx-lrp'; main()"
    proc = subprocess.run([sys.executable, "-P", "-c", code, "explain", str(fam.model), str(tmp_path / "x.npy"),
                           "--composite", fam.composite, "--device", DEVICE, "-o", str(tmp_path / "r.npy")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-500:]
    noise = [line for line in proc.stderr.splitlines() if "onnxruntime" in line.lower() or "cudnn" in line.lower()
             or line.startswith(("[W:", "[E:", "[I:", "["))]
    assert noise == [], noise[:5]


def test_auto_takes_cuda_and_says_so():
    ex = FAMILIES[-1].explainer(device="auto")
    assert ex.device == ("cuda" if DEVICE == "cuda" else ex.device) and ex.device_note is None
