"""Relevance in the model's precision (onnx_lrp/precision.py), checked without a GPU.

Structurally, on the relevance graphs of the suite's transformer and CNN families (float32 models rewritten as if
written in float16 / bfloat16) and of a float16 / bfloat16 MLP: the matrix products run in the model's type, every
division, its stabiliser, softmax, normalisation and reduction in float32, the graph's outputs stay float32, and
every node reads one float type (the Casts sit where values cross). On the CPU a float16 relevance model runs
(onnxruntime casts around the ops it has no float16 kernels for) and its relevance stays within the float16 goal of
the float32 twin; bfloat16 (no CPU kernels) is refused in one line. CUDA itself is not exercised here.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import onnx_lrp
from onnx_lrp import load as loader
from onnx_lrp.building import precision
from onnx_lrp.lrp import rewriter
from onnx_lrp.core.errors import InputError
from onnx_lrp.rules.composite import load_composite

import bigmodels  # noqa: E402
from families import FAMILIES  # noqa: E402
from util import rel_l2

FLOAT, F16, BF16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16
LOW = {"float16": F16, "bfloat16": BF16}
MATRIX_OPS = precision.MATRIX_OPS
TYPE_ONLY = {"Cast", "Shape", "Size", "CastLike"}
STABILISER_OPS = {"Add", "Sub", "Mul", "Clip", "Where", "Max", "Min", "Abs", "Neg", "Relu", "Sign", "Equal", "Greater",
                  "GreaterOrEqual", "Less", "LessOrEqual", "Not", "Identity"}  # what the rules' stabilisers are made of


def _relevance_model(path, composite, params, dtype=None) -> tuple[onnx.ModelProto, int]:
    """The relevance model of ``path`` after the precision pass (``dtype``: the model's own when None), with the
    types onnx infers for every value."""
    model = loader.load(str(path))
    rewriter.rewrite(model, load_composite(composite).with_params(**params))
    low = precision.to_model_precision(model, None if dtype is None else getattr(
        __import__("onnx_ir").DataType, dtype.upper()))
    proto = onnx.load_model_from_string(loader.serialize_parts(model).model_bytes)
    return onnx.shape_inference.infer_shapes(proto), low


def _types(proto) -> dict:
    g = proto.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.value_info) + list(g.input) + list(g.output)}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def _float_types(names, types) -> set:
    return {types[n] for n in names if n and types.get(n) in (FLOAT, F16, BF16)}


def assert_model_precision(proto, low: int) -> None:
    types, g = _types(proto), proto.graph
    producer = {o: n for n in g.node for o in n.output}
    matrix = 0
    for n in g.node:
        ins, outs = _float_types(n.input, types), _float_types(n.output, types)
        if n.op_type not in TYPE_ONLY:
            assert len(ins | outs) <= 1, f"{n.name} ({n.op_type}) mixes float types {ins | outs}"
        relevance_elementwise = n.name.startswith("lrp/") and not n.name.startswith("lrp/precision/") and \
            n.op_type not in MATRIX_OPS | TYPE_ONLY
        if n.op_type in precision.FLOAT32_OPS or relevance_elementwise:
            assert ins | outs <= {FLOAT}, f"{n.name} ({n.op_type}) not in float32"
        if n.op_type == "Div":  # the division and the stabiliser that forms its denominator
            stab = producer.get(n.input[1])
            while stab is not None and stab.name.startswith("lrp/") and stab.op_type in STABILISER_OPS:
                assert _float_types(list(stab.input) + list(stab.output), types) <= {FLOAT}, stab.name
                stab = next((producer.get(x) for x in stab.input if types.get(x) in (FLOAT, F16, BF16)
                             and x in producer), None)
        if n.op_type in MATRIX_OPS and n.name not in {producer.get(o.name, n).name for o in g.output}:
            assert ins | outs == {low}, f"{n.name} ({n.op_type}) computes in {ins | outs}"
            matrix += 1
    assert matrix, "no matrix product in the model's precision"
    assert {types[o.name] for o in g.output if types[o.name] in (FLOAT, F16, BF16)} == {FLOAT}


FAMILY_SAMPLE = ["bert", "llama", "mixtral", "vit", "resnet-egb"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fam", [f for f in FAMILIES if f.name in FAMILY_SAMPLE], ids=lambda f: f.name)
def test_family_relevance_graph_in_model_precision(fam, dtype):
    """The suite's transformers and a gamma CNN, rewritten as if written in ``dtype``: matrix products in it,
    every division / stabiliser / softmax / norm / reduction and the relevance's elementwise nodes in float32,
    outputs float32, no node mixing types."""
    proto, n_low = _relevance_model(fam.model, fam.composite, fam.params(), dtype)
    assert n_low > 0
    assert_model_precision(proto, LOW[dtype])
    ops32 = {n.op_type for n in proto.graph.node} & precision.FLOAT32_OPS
    if fam.composite == "attnlrp":
        norms = {"LayerNormalization", "ReduceMean", "SimplifiedLayerNormalization", "RMSNormalization", "Sqrt", "Pow"}
        assert {"Softmax", "Div"} <= ops32 and ops32 & norms


@pytest.mark.parametrize("fam", [f for f in FAMILIES if f.name in ("llama", "bert")], ids=lambda f: f.name)
def test_untyped_values_are_typed_from_their_nodes(fam, monkeypatch):
    """The pass does not rely on shape inference typing every value: with every value the graph computes left
    untyped and no re-inference, the relevance graph still gets a Cast wherever types meet (before: a value of
    unknown type got none, and a Gemm read float32 and float16)."""
    import onnx_ir as ir

    model = loader.load(str(fam.model))
    rewriter.rewrite(model, load_composite(fam.composite).with_params(**fam.params()))
    for node in model.graph:
        for o in node.outputs:
            o.type = None
    monkeypatch.setattr(precision, "reinfer_shapes", lambda m: None)
    assert precision.to_model_precision(model, ir.DataType.FLOAT16) > 0
    proto = onnx.load_model_from_string(loader.serialize_parts(model).model_bytes)
    assert_model_precision(onnx.shape_inference.infer_shapes(proto), F16)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_mlp_weights_read_in_their_type(tmp_path, dtype):
    """A float16 / bfloat16 model: its weights go to the matrix products in their type, no Cast in between."""
    path = bigmodels.write_mlp(tmp_path, (16, 64, 64, 4), dtype=dtype)
    proto, _ = _relevance_model(path, "epsilon", {})
    assert_model_precision(proto, LOW[dtype])
    weights = {t.name for t in proto.graph.initializer if len(t.dims) == 2}
    assert {t.data_type for t in proto.graph.initializer if t.name in weights} == {LOW[dtype]}
    assert not [n.name for n in proto.graph.node if n.op_type == "Cast" and set(n.input) & weights]


def test_float16_model_precision_runs_on_cpu(tmp_path):
    """precision='model' on the CPU: onnxruntime runs the float16 relevance model (casting around the ops it has no
    float16 kernels for); relevance within the float16 goal of the float32 twin, the top-10 inputs unchanged. The
    default ('auto') computes in float32 on the CPU."""
    widths = (64, 512, 512, 10)  # 512 x 512 float16: over lower_upcasts' TIED_MIN
    low = bigmodels.write_mlp(tmp_path / "float16", widths, dtype="float16")
    f32 = bigmodels.write_mlp(tmp_path / "float32", widths, dtype="float32")
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = onnx_lrp.Explainer(str(low), composite="epsilon", precision="model")
        assert ex.relevance_model.model_precision == "float16"
        assert onnx_lrp.Explainer(str(low), composite="epsilon").relevance_model.model_precision == "float32"
        r_model = ex.explain(x, target=2).relevance
        r_32 = onnx_lrp.Explainer(str(f32), composite="epsilon").explain(x, target=2).relevance
    assert r_model.dtype == np.float32 and np.all(np.isfinite(r_model))
    assert rel_l2(r_model, r_32) < 1e-3
    for a, b in zip(r_model, r_32):
        assert set(np.argsort(-a)[:10]) == set(np.argsort(-b)[:10])


def test_bfloat16_model_precision_refused_on_cpu_in_one_line(tmp_path):
    path = bigmodels.write_mlp(tmp_path, (16, 32, 4), dtype="bfloat16")
    with pytest.raises(InputError) as info:
        onnx_lrp.Explainer(str(path), composite="epsilon", precision="model")
    msg = str(info.value)
    assert "\n" not in msg and "bfloat16" in msg and "precision='float32'" in msg
    with pytest.raises(InputError, match="precision must be one of"):
        onnx_lrp.Explainer(str(path), composite="epsilon", precision="half")


def test_auto_falls_back_to_float32_in_one_warning(tmp_path, monkeypatch):
    """precision='auto' where the model-precision graph cannot start (here: bfloat16 on the CPU, standing in for a
    CUDA build without a bfloat16 kernel): one warning naming the cause, then the float32 relevance model, whose
    relevance equals precision='float32'."""
    path = bigmodels.write_mlp(tmp_path, (16, 64, 4), dtype="bfloat16")
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    monkeypatch.setattr(precision, "wanted", lambda p, device: p in ("auto", "model"))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ex = onnx_lrp.Explainer(str(path), composite="epsilon")
    lines = [str(w.message) for w in said if "relevance model in bfloat16" in str(w.message)]  # (the deployed
    # model's own bfloat16 run is said apart: run/deployed_gap.cannot_run)
    assert len(lines) == 1 and "computed in float32" in lines[0] and "\n" not in lines[0]
    assert ex.relevance_model.model_precision == "float32"
    ref = onnx_lrp.Explainer(str(path), composite="epsilon", precision="float32")
    np.testing.assert_array_equal(ex.explain(x, target=1).relevance, ref.explain(x, target=1).relevance)


def test_float32_model_unchanged(tmp_path):
    path = bigmodels.write_mlp(tmp_path, (16, 32, 4))
    ex = onnx_lrp.Explainer(str(path), composite="epsilon", precision="model")
    assert ex.relevance_model.model_precision == "float32"
    assert {t.data_type for t in onnx.load_model_from_string(ex.relevance_model.model_bytes).graph.initializer} <= {
        FLOAT, onnx.TensorProto.INT64}


def test_cli_precision_flag_and_summary(tmp_path):
    """``explain --precision``: the summary line and the JSON say what the relevance model computed in; the float16
    relevance equals the API's with the same precision; a bad value exits 2 (click) without a traceback."""
    import json

    from click.testing import CliRunner

    from onnx_lrp.cli.main import main

    path = bigmodels.write_mlp(tmp_path, (16, 64, 4), dtype="float16")
    x = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    runner = CliRunner()
    seen = {}
    for p in ("model", "float32"):
        out = tmp_path / f"r_{p}.npy"
        res = runner.invoke(main, ["explain", str(path), str(tmp_path / "x.npy"), "--composite", "epsilon",
                                   "--target", "1", "--precision", p, "-o", str(out), "--json"])
        assert res.exit_code == 0, res.output
        summary = json.loads(res.stdout[res.stdout.index("{"):])
        seen[p] = summary["precision"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            api = onnx_lrp.Explainer(str(path), composite="epsilon", precision=p).explain(x, target=1).relevance
        np.testing.assert_array_equal(np.load(out), api)
    assert seen == {"model": "float16", "float32": "float32"}
    res = runner.invoke(main, ["explain", str(path), str(tmp_path / "x.npy"), "--composite", "epsilon",
                               "--precision", "model", "-o", str(tmp_path / "r.npy")])
    assert res.exit_code == 0 and "(float16)" in res.stdout, res.output
    res = runner.invoke(main, ["explain", str(path), str(tmp_path / "x.npy"), "--precision", "half"])
    assert res.exit_code == 2 and "Traceback" not in res.output
