"""CUDA safety without a GPU: the relevance graph of every family the suite explains reads nothing that
onnxruntime's graph optimisations may drop.

onnxruntime fuses Add + LayerNormalization into SkipLayerNormalization (on CPU and CUDA); its CUDA kernel leaves the
optional Mean / InvStdDev outputs unwritten, so a relevance graph that read them failed on CUDA only ("Missing
Input: .../inv_std"). Two checks, both on CPU: (1) by the ONNX schema, no relevance node reads an optional output
of a forward node (except those onnxruntime always keeps, tests/families.KEPT_OPTIONAL); (2) in the model that
onnxruntime itself optimises (CPU provider, extended fusions: the same transformers that run for CUDA), no node
reads an output of a fused contrib op that the CUDA kernel does not compute. Fusions that remove intermediates
(Gelu, BiasGelu, FastGelu, Attention, EmbedLayerNormalization, MatMul + Add) only fuse nodes whose outputs have one
consumer, so a value the relevance graph reads keeps its producer.
"""
from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest

from families import FAMILIES, fused_dropped_reads, optional_reads
from util import ROOT


@pytest.mark.parametrize("fam", FAMILIES, ids=[f.name for f in FAMILIES])
def test_relevance_graph_reads_nothing_a_fusion_drops(fam, tmp_path):
    ex = fam.explainer()
    path = tmp_path / "lrp.onnx"
    ex.save(path)
    model = onnx.load(path)
    assert any(n.name.startswith("lrp/") for n in model.graph.node)
    assert optional_reads(model) == []
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    opts.log_severity_level = 3
    ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    assert fused_dropped_reads(onnx.load(tmp_path / "optimized.onnx")) == []


def test_the_check_sees_the_skiplayernorm_dependency(tmp_path):
    """The check's own reference: a relevance graph that reads LayerNormalization's InvStdDev after a residual Add
    (what onnx-lrp emitted before) is caught by both checks."""
    import numpy as np
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])
    r = helper.make_tensor_value_info("lrp/r", TensorProto.FLOAT, [1, 4, 1])
    w = onnx.numpy_helper.from_array(np.ones(8, np.float32), "w")
    b = onnx.numpy_helper.from_array(np.zeros(8, np.float32), "b")
    nodes = [helper.make_node("Add", ["x", "x"], ["s"], name="add"),
             helper.make_node("LayerNormalization", ["s", "w", "b"], ["y", "mean", "inv_std"], name="ln"),
             helper.make_node("Identity", ["inv_std"], ["lrp/r"], name="lrp/ln/JTs")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y, r], [w, b]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert len(optional_reads(model)) == 1
    onnx.save(model, tmp_path / "m.onnx")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(str(tmp_path / "m.onnx"), sess_options=opts, providers=["CPUExecutionProvider"])
    assert len(fused_dropped_reads(onnx.load(tmp_path / "opt.onnx"))) == 1


# ------------------------------------------------------------------------------ CUDA options without a GPU
def test_tf32_is_off_unless_asked_and_travels_with_the_payload():
    from onnx_lrp.run import runtime
    from onnx_lrp.core.errors import InputError
    from onnx_lrp.run.runner import Runner

    assert runtime.cuda_options() == {"use_tf32": "0"} and runtime.cuda_options(True) == {"use_tf32": "1"}
    fam = FAMILIES[-1]
    ex = fam.explainer(tf32=True)
    assert ex.options.tf32 is True and fam.explainer().options.tf32 is False
    assert Runner.from_payload(ex.payload()).options.tf32 is True
    with pytest.raises(InputError, match="tf32 must be True or False"):
        fam.explainer(tf32="yes")


def test_preload_loads_the_wheels_libraries_once_and_quietly(monkeypatch, capsys):
    """With nvidia-* wheels installed (a package ``nvidia``) onnxruntime's preload_dlls is called once, looking in
    the nvidia site packages first (directory=""), and what it prints does not reach stdout; without them it is
    not called (the system's libraries are found as before)."""
    import importlib.util
    import types

    from onnx_lrp.run import runtime

    calls = []

    def preload_dlls(**kw):
        calls.append(kw)
        print("Failed to load libcudnn.so.9")

    monkeypatch.setattr(runtime, "ort", types.SimpleNamespace(preload_dlls=preload_dlls))
    real = importlib.util.find_spec
    for wheels, want in ((False, []), (True, [{"directory": ""}])):
        monkeypatch.setattr(runtime, "_preloaded", False)
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: (object() if wheels else None) if name == "nvidia" else real(name, *a))
        calls.clear()
        runtime.preload_cuda()
        runtime.preload_cuda()
        assert calls == want
    assert capsys.readouterr().out == ""


def test_cli_tf32_on_cpu_changes_nothing(tmp_path):
    """--tf32 concerns CUDA only: on the CPU the relevance is the same and the summary says TF32 was not used."""
    import json

    import numpy as np
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main

    fam = FAMILIES[-1]
    np.save(tmp_path / "x.npy", fam.feeds()["image"][:2])
    outs = []
    for extra in ([], ["--tf32"]):
        out = tmp_path / f"r{len(extra)}.npy"
        result = CliRunner().invoke(main, ["explain", str(fam.model), str(tmp_path / "x.npy"), "--json", "-o",
                                           str(out), *extra])
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert summary["device"] == "cpu" and summary["tf32"] is False
        outs.append(np.load(out))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("choice,want", [("cpu", "onnxruntime>="), ("cuda", "onnxruntime-gpu[cuda,cudnn]>="),
                                         ("cuda-system", "onnxruntime-gpu>="), ("none", None)])
def test_install_choice_brings_exactly_one_runtime(choice, want, monkeypatch):
    """ONNX_LRP_RUNTIME picks one onnxruntime build; cuda brings the CUDA and cuDNN libraries as wheels
    (onnxruntime-gpu's extras) and never the CPU onnxruntime beside it."""
    import runpy

    import setuptools

    seen = {}
    monkeypatch.setenv("ONNX_LRP_RUNTIME", choice)
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.update(kw))
    runpy.run_path(str(ROOT / "setup.py"))
    runtimes = [r for r in seen["install_requires"] if r.startswith("onnxruntime")]
    assert runtimes == ([] if want is None else [r for r in runtimes if r.startswith(want)]) and len(runtimes) <= 1
    assert (want is None) == (runtimes == [])
