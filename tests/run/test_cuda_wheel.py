"""The GPU check runs the CUDA tests against the installed onnx-lrp (the wheel the device machine installs), from the
checkout: ``python -P -m pytest`` keeps the checkout's folder off the path, which alone has no ``onnx_lrp.rules``
(rules/ and cli/ are mapped in by the install). Rehearsed here on the CPU: the wheel built and installed into a fresh
virtual environment (its dependencies shared from this one), the CUDA-safety tests and the CUDA tests with the CPU
provider run against it. Slow (a wheel build and a venv: ~1 min): ONNX_LRP_SLOW=1."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from util import ROOT


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("ONNX_LRP_SLOW"), reason="builds a wheel and a venv (ONNX_LRP_SLOW=1)")
def test_the_cuda_tests_run_against_an_installed_wheel(tmp_path):
    env = dict(os.environ, ONNX_LRP_RUNTIME="none")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(ROOT)],
                   check=True, env=env, capture_output=True, timeout=600)
    wheel = next((tmp_path / "dist").glob("onnx_lrp-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    shared = [p for p in sys.path if p.endswith("site-packages")] + [sysconfig.get_paths()["purelib"]]
    Path(site, "zz_shared.pth").write_text("\n".join(dict.fromkeys(shared)) + "\n")  # numpy, onnx, onnxruntime, ...
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300)
    where = subprocess.run([str(python), "-P", "-c", "import onnx_lrp, onnx_lrp.rules, onnx_lrp.cli; "
                            "print(onnx_lrp.__file__)"], cwd=ROOT, check=True, capture_output=True, text=True)
    assert where.stdout.strip().startswith(str(venv)), where.stdout
    shadowed = subprocess.run([str(python), "-c", "import onnx_lrp.rules"], cwd=ROOT, capture_output=True, text=True)
    assert shadowed.returncode != 0  # without -P the checkout's folder shadows the wheel: why the check uses -P
    tests = subprocess.run([str(python), "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
                            "tests/run/test_cuda_safe.py", "tests/run/test_cuda.py"], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, ONNX_LRP_PARITY_DEVICE="cpu"), timeout=900)
    assert tests.returncode == 0, tests.stdout[-2000:] + tests.stderr[-2000:]
