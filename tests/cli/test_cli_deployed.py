"""``explain --deployed auto|on|off`` on the tiny onnxruntime-genai int4 folder (its MatMulNBits quantize their
activations to 8 bits, so the deployed run differs from the explained forward and the gap is said): over the
4-bit bound (lowered here) ``auto`` says once that the deployed model is not run beside and says no gap, ``on``
runs it (the gap said, as below the bound), ``off`` never; a wrong value exits 2 in one line."""
from __future__ import annotations

import pytest
from click.testing import CliRunner
from util import GOLDENS

from onnx_lrp.building import stages
from onnx_lrp.cli.main import main

pytest.importorskip("tokenizers")

FOLDER = GOLDENS / "llm" / "llama_genai_int4"
GAP = "accuracy_level 4 quantize their activations"


def _explain(*more):
    return CliRunner().invoke(main, ["explain", str(FOLDER), "--text", "the cat sat", *more])


@pytest.mark.parametrize("deployed, beside, gap", [(None, True, False), ("auto", True, False), ("on", False, True),
                                                   ("off", False, False)])
def test_deployed_over_the_4bit_bound(tmp_path, monkeypatch, deployed, beside, gap):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(stages, "DEPLOYED_PACKED_MAX", 0)
    res = _explain(*(["--deployed", deployed] if deployed else []))
    assert res.exit_code == 0, res.output
    assert res.output.count("not run beside") == int(beside)
    if beside:
        assert "--deployed on" in res.output
    assert (GAP in res.output) == gap


def test_below_the_bound_auto_runs_it_and_a_wrong_value_exits_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _explain()
    assert res.exit_code == 0 and GAP in res.output and "not run beside" not in res.output
    res = _explain("--deployed", "maybe")
    assert res.exit_code == 2 and "'maybe' is not one of 'auto', 'on', 'off'" in res.output
    assert "Traceback" not in res.output
