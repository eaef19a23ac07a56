"""Files a model refers to (issue 37, items 1, 4, 6 and 8; issue 33's load fixpoints), each case made in the test.

Every tensor whose data lives in a file (initializers, node attribute tensors, sparse tensors, in If branches too)
is read from the model's real folder, never from the working directory: an attacker's model naming ``.env``,
``../secret`` or ``etc/passwd`` (a directory symlink in the working folder) is refused in one line naming the tensor
and the path (exit 2, no output written, the secret's bytes nowhere); a legitimate model with attribute data gives
the same relevance from any working directory as its inline twin; the Hugging Face cache layout (model and data
symlinked into ``blobs/``) explains as its plain folder does and as onnxruntime runs it; a model opened through a
symlink whose real folder lacks the data, or holds it truncated, is refused. A declared input shape the graph cannot
take (the shipped digits CNN declared 1 x 17 x 17) is refused by inspect, rewrite, explain and the API at load.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import onnx_lrp
import onnx_lrp.load
from onnx_lrp.cli.main import main
from onnx_lrp.core.errors import InputError, LrpError, ModelError
from onnx_lrp.load import fixpoint

from util import ROOT  # noqa: E402
DIGITS = ROOT / "models" / "digits_cnn.onnx"
SECRET = b"SECRET-hunter2!!"  # 16 bytes: four float32 values, what a leak would put into the results
W = np.array([[1, -2], [3, 4], [-5, 6], [7, 8]], np.float32)
X = np.array([[0.5, 0.25, 0.75, 0.125]], np.float32)
BIAS = np.array([0.5, -0.25], np.float32)  # the legitimate attribute data


# ---------------------------------------------------------------------------------------------- models made here
def _external(tensor: TensorProto, location: str, offset: int = 0, length: int | None = None) -> TensorProto:
    """``tensor`` with its data moved to ``location`` (bytes offset..offset+length), the data itself dropped."""
    t = TensorProto()
    t.CopyFrom(tensor)
    length = len(t.raw_data) if length is None else length
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def _bias_node(kind: str, value: TensorProto) -> list:
    """Nodes making ``c`` (2 floats) from ``value``: a ConstantOfShape (value of 1 element), a Constant, a Constant
    with a sparse value, or an If whose then-branch holds the ConstantOfShape."""
    if kind == "constant-of-shape":
        return [helper.make_node("ConstantOfShape", ["two"], ["c"], value=value)]
    if kind == "constant":
        return [helper.make_node("Constant", [], ["c"], value=value)]
    if kind == "sparse-attribute":
        sparse = helper.make_sparse_tensor(value, numpy_helper.from_array(np.array([0], np.int64), "i"), [2])
        return [helper.make_node("Constant", [], ["c"], sparse_value=sparse)]
    assert kind == "if-branch"
    out = [helper.make_tensor_value_info("c_then", TensorProto.FLOAT, [2])]
    then = helper.make_graph([helper.make_node("ConstantOfShape", ["two"], ["c_then"], value=value)], "then", [], out)
    other = helper.make_graph([helper.make_node("Constant", [], ["c_else"], value=numpy_helper.from_array(
        np.zeros(2, np.float32), "z"))], "else", [], [helper.make_tensor_value_info("c_else", TensorProto.FLOAT, [2])])
    return [helper.make_node("If", ["flag"], ["c"], then_branch=then, else_branch=other)]


def _model(kind: str, value: TensorProto, sparse_init: TensorProto | None = None) -> onnx.ModelProto:
    """y = x @ W + c, ``c`` made by ``_bias_node(kind, value)`` (or, kind "sparse-initializer", a sparse
    initializer whose values are ``sparse_init``)."""
    inits = [numpy_helper.from_array(W, "w"), numpy_helper.from_array(np.array([2], np.int64), "two"),
             numpy_helper.from_array(np.array(True), "flag")]
    nodes = [] if kind == "sparse-initializer" else _bias_node(kind, value)
    nodes += [helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
              helper.make_node("Add", ["h", "c"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], inits)
    if kind == "sparse-initializer":
        g.sparse_initializer.append(helper.make_sparse_tensor(
            sparse_init, numpy_helper.from_array(np.array([0, 1], np.int64), "i"), [2]))
        g.sparse_initializer[0].values.name = "c"
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _value(kind: str, data: np.ndarray) -> TensorProto:
    """The attribute tensor ``kind`` needs holding ``data`` (ConstantOfShape: its first element)."""
    if kind in ("constant-of-shape", "if-branch"):
        data = data[:1]
    elif kind == "sparse-attribute":
        data = data[:1]
    return numpy_helper.from_array(np.ascontiguousarray(data, np.float32), "v")


def _cli(*args) -> tuple[int, str]:
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.output


def _one_line_refusal(code: int, out: str) -> str:
    assert code == 2, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("onnx-lrp: error:"), out
    assert "Traceback" not in out
    return lines[0]


# ---------------------------------------------------------------------------------------------- the attacker
ATTACKS = {  # name -> (kind, location): each names data outside the model's folder
    "ConstantOfShape.value .env (in the cwd)": ("constant-of-shape", ".env"),
    "ConstantOfShape.value ../secret": ("constant-of-shape", "../secret"),
    "Constant.value ../secret": ("constant", "../secret"),
    "Constant.sparse_value .env": ("sparse-attribute", ".env"),
    "sparse initializer ../secret": ("sparse-initializer", "../secret"),
    "If branch ConstantOfShape .env": ("if-branch", ".env"),
    "If branch ../secret": ("if-branch", "../secret"),
    "etc/passwd through a directory symlink in the cwd": ("constant-of-shape", "etc/passwd"),
    "absolute path": ("constant", "/ABS/secret"),
}


def _attack_folder(tmp_path: Path, kind: str, location: str) -> tuple[Path, Path]:
    """cwd ``proj/`` (a ``.env``, ``secret``, ``etc -> outside``), model in ``proj/models/m.onnx``; every file the
    attack could reach holds SECRET."""
    proj, outside = tmp_path / "proj", tmp_path / "outside"
    (proj / "models").mkdir(parents=True)
    outside.mkdir()
    for f in (proj / ".env", proj / "secret", outside / "passwd", tmp_path / "secret"):
        f.write_bytes(SECRET)
    (proj / "etc").symlink_to(outside, target_is_directory=True)
    (proj / "models" / "etc").symlink_to(outside, target_is_directory=True)  # ... and in the model's folder
    location = location.replace("/ABS", str(proj))
    value = _external(_value(kind, np.zeros(2, np.float32)), location, 0, 4 if kind != "constant" else 8)
    sparse = _external(numpy_helper.from_array(np.zeros(2, np.float32), "c"), location, 0, 8)
    path = proj / "models" / "m.onnx"
    path.write_bytes(_model(kind, value, sparse).SerializeToString())
    return proj, path


def _leaks(tmp_path: Path) -> list[Path]:
    """Files under ``tmp_path`` (not the planted secrets) holding SECRET."""
    planted = {"secret", ".env", "passwd"}
    return [f for f in tmp_path.rglob("*") if f.is_file() and not f.is_symlink() and f.name not in planted
            and SECRET[:4] in f.read_bytes()]


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_attackers_model_is_refused_and_leaks_nothing(tmp_path, monkeypatch, attack):
    kind, location = ATTACKS[attack]
    proj, path = _attack_folder(tmp_path, kind, location)
    monkeypatch.chdir(proj)
    np.save(proj / "x.npy", X)
    before = path.read_bytes()
    for args in (["inspect", path], ["rewrite", path, "-o", proj / "r.onnx"],
                 ["explain", path, proj / "x.npy", "-o", proj / "out.npz"]):
        line = _one_line_refusal(*_cli(*args))
        assert "outside the model's folder" in line or "is missing from the model's folder" in line, line
        assert os.path.basename(location) in line and ("attribute" in line or "initializer" in line), line
        assert "SECR" not in line
    assert not (proj / "r.onnx").exists() and not (proj / "out.npz").exists()
    with pytest.raises(ModelError, match=r"(attribute|initializer) .*(outside|missing)"):
        onnx_lrp.Explainer(str(path), composite="epsilon")
    assert path.read_bytes() == before and _leaks(tmp_path) == []


def test_data_symlinked_out_of_the_models_folder_is_refused(tmp_path):
    """A file in the model's folder that is a symlink to a file elsewhere is outside it (resolved path)."""
    (tmp_path / "m").mkdir()
    (tmp_path / "secret").write_bytes(SECRET)
    (tmp_path / "m" / "bias.bin").symlink_to(tmp_path / "secret")
    value = _external(_value("constant-of-shape", np.zeros(2, np.float32)), "bias.bin", 0, 4)
    path = tmp_path / "m" / "m.onnx"
    path.write_bytes(_model("constant-of-shape", value).SerializeToString())
    with pytest.raises(ModelError, match=r"attribute 'value' of node .*'bias.bin'.*outside the model's folder"):
        onnx_lrp.Explainer(str(path), composite="epsilon")


def test_model_bytes_with_attribute_data_refused():
    """Bytes have no folder: an attribute tensor naming a file would be read from the working directory."""
    value = _external(_value("constant-of-shape", np.zeros(2, np.float32)), ".env", 0, 4)
    model = _model("constant-of-shape", value)
    for source in (model.SerializeToString(), model):
        with pytest.raises(ModelError, match=r"attribute 'value'.*'\.env'.*without its file; pass the model's path"):
            onnx_lrp.Explainer(source, composite="epsilon")


# ---------------------------------------------------------------------------------------------- legitimate models
@pytest.mark.parametrize("kind", ["constant-of-shape", "if-branch", "constant"])
def test_attribute_data_read_from_the_models_folder_from_any_cwd(tmp_path, monkeypatch, kind):
    """The same relevance as the inline twin from two working directories, one holding a decoy of the data file."""
    (tmp_path / "m").mkdir()
    data = np.full(2, BIAS[0], np.float32) if kind != "constant" else BIAS
    (tmp_path / "m" / "bias.bin").write_bytes(b"\0" * 12 + data.tobytes())  # at an offset
    path = tmp_path / "m" / "m.onnx"
    value = _value(kind, data)
    path.write_bytes(_model(kind, _external(value, "bias.bin", 12)).SerializeToString())
    inline = _model(kind, value).SerializeToString()
    want = onnx_lrp.Explainer(inline, composite="epsilon").explain(X, target=0)
    np.testing.assert_allclose(want.outputs["y"], X @ W + data, rtol=1e-6)  # the oracle: numpy
    decoy = tmp_path / "cwd"
    decoy.mkdir()
    (decoy / "bias.bin").write_bytes(np.full(8, 1e3, np.float32).tobytes())
    for cwd in (decoy, tmp_path):
        monkeypatch.chdir(cwd)
        got = onnx_lrp.Explainer(str(path), composite="epsilon").explain(X, target=0)
        np.testing.assert_array_equal(got.relevance, want.relevance)
        np.testing.assert_array_equal(got.outputs["y"], want.outputs["y"])
    monkeypatch.chdir(decoy)
    np.save(decoy / "x.npy", X)
    code, out = _cli("explain", path, decoy / "x.npy", "-c", "epsilon", "--target", "0", "-o", decoy / "r.npz")
    assert code == 0, out
    with np.load(decoy / "r.npz") as f:
        np.testing.assert_array_equal(f["relevance"], want.relevance)


def _external_mlp(folder: Path, name: str = "model.onnx") -> tuple[Path, bytes]:
    """A 4 -> 3 -> 2 MLP saved with its weights in ``name + '.data'``; also its bytes with the weights inline."""
    rng = np.random.default_rng(3)
    w1, w2 = np.abs(rng.standard_normal((4, 3))).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["y"], name="mm2")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    inline = model.SerializeToString()
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / name), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=name + ".data", size_threshold=0)
    return folder / name, inline


def _hf_cache(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """``hub/snapshots/<rev>/model.onnx -> ../../blobs/A`` and ``model.onnx.data -> ../../blobs/B`` (the files of
    a plain folder moved there); returns (the snapshot's model path, the plain folder's, the inline bytes)."""
    plain, inline = _external_mlp(tmp_path / "plain")
    hub = tmp_path / "hub"
    (hub / "blobs").mkdir(parents=True)
    snap = hub / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (hub / "blobs" / "A").write_bytes(plain.read_bytes())
    (hub / "blobs" / "B").write_bytes((plain.parent / "model.onnx.data").read_bytes())
    (snap / "model.onnx").symlink_to("../../blobs/A")
    (snap / "model.onnx.data").symlink_to("../../blobs/B")
    return snap / "model.onnx", plain, inline


def test_hugging_face_cache_layout_explains_as_the_plain_folder(tmp_path, monkeypatch):
    snap, plain, inline = _hf_cache(tmp_path)
    ran = ort.InferenceSession(str(snap), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    monkeypatch.chdir(tmp_path)
    want = onnx_lrp.Explainer(inline, composite="epsilon").explain(X, target=1)
    assert np.abs(want.relevance).sum() > 0
    for path in (plain, snap):
        got = onnx_lrp.Explainer(str(path), composite="epsilon").explain(X, target=1)
        np.testing.assert_array_equal(got.relevance, want.relevance)
        np.testing.assert_array_equal(got.outputs["y"], ran)  # as onnxruntime runs the snapshot
    out = tmp_path / "r.onnx"
    code, text = _cli("rewrite", snap, "-c", "epsilon", "-o", out)
    assert code == 0, text
    assert out.exists() and (tmp_path / "r.onnx.data").exists()
    assert (tmp_path / "hub" / "blobs" / "B").read_bytes() == (plain.parent / "model.onnx.data").read_bytes()


def test_loaded_model_with_external_data_explains_from_another_cwd(tmp_path, monkeypatch):
    """An onnx_ir model (loaded from a folder, its weights memory-mapped there) handed to the Explainer reads its
    data from that folder, not from the working directory."""
    path, inline = _external_mlp(tmp_path / "m")
    model = onnx_lrp.load.load(str(path))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    want = onnx_lrp.Explainer(inline, composite="epsilon").explain(X, target=1)
    got = onnx_lrp.Explainer(model, composite="epsilon").explain(X, target=1)
    assert np.abs(want.relevance).sum() > 0
    np.testing.assert_array_equal(got.relevance, want.relevance)


def test_metrics_forward_reads_external_data_from_the_models_folder(tmp_path, monkeypatch):
    """The metrics' forward pass (its own onnx_ir copy of the model) from another working directory: onnxruntime's
    outputs for the model file."""
    from onnx_lrp.metrics.forward import Forward

    path, _ = _external_mlp(tmp_path / "m")
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    got = Forward(str(path), "y", "x", 0, prob="logit")(X)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_model_symlink_whose_real_folder_lacks_the_data_is_refused(tmp_path):
    """``link/m.onnx -> ../real/m.onnx``, the data beside the link only: the data is read from the model's real
    folder (where it is missing), never from beside the link (one file checked, another read)."""
    path, _ = _external_mlp(tmp_path / "real", "m.onnx")
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "m.onnx").symlink_to(path)
    os.replace(tmp_path / "real" / "m.onnx.data", tmp_path / "link" / "m.onnx.data")
    for args in (["inspect", tmp_path / "link" / "m.onnx"], ["rewrite", tmp_path / "link" / "m.onnx", "-o",
                                                              tmp_path / "r.onnx"]):
        line = _one_line_refusal(*_cli(*args))
        assert "m.onnx.data" in line and "missing" in line and "w1" in line, line
    assert not (tmp_path / "r.onnx").exists()


def test_truncated_data_in_the_real_folder_is_refused(tmp_path):
    """The complete data beside the link, a truncated copy in the real folder (the one read): refused."""
    path, _ = _external_mlp(tmp_path / "real", "m.onnx")
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "m.onnx").symlink_to(path)
    data = (tmp_path / "real" / "m.onnx.data").read_bytes()
    (tmp_path / "link" / "m.onnx.data").write_bytes(data)
    (tmp_path / "real" / "m.onnx.data").write_bytes(data[:20])
    line = _one_line_refusal(*_cli("inspect", tmp_path / "link" / "m.onnx"))
    assert "truncated" in line and "m.onnx.data" in line, line
    with pytest.raises(ModelError, match="truncated"):
        onnx_lrp.Explainer(str(tmp_path / "link" / "m.onnx"), composite="epsilon")


def test_truncated_attribute_data_is_refused(tmp_path):
    (tmp_path / "bias.bin").write_bytes(b"\0\0")  # 2 of the 4 bytes the value reads
    value = _external(_value("constant-of-shape", BIAS), "bias.bin", 0, 4)
    path = tmp_path / "m.onnx"
    path.write_bytes(_model("constant-of-shape", value).SerializeToString())
    with pytest.raises(ModelError, match=r"attribute 'value' .*reads bytes 0\.\.4 of bias\.bin .*truncated"):
        onnx_lrp.Explainer(str(path), composite="epsilon")


# ---------------------------------------------------------------------------------------------- declared shapes
def _digits_declared(tmp_path: Path, dims: list) -> Path:
    m = onnx.load(str(DIGITS))
    m.graph.input[0].CopyFrom(helper.make_tensor_value_info("image", TensorProto.FLOAT, dims))
    path = tmp_path / "d.onnx"
    onnx.save(m, str(path))
    return path


@pytest.mark.skipif(not DIGITS.exists(), reason="models/digits_cnn.onnx is missing (python models/build_digits.py)")
def test_declared_input_the_graph_cannot_take_refused_by_every_command(tmp_path):
    path = _digits_declared(tmp_path, [1, 17, 17])  # rank 3: the 2-D Conv cannot take it
    np.save(tmp_path / "x.npy", np.zeros((1, 17, 17), np.float32))
    before = path.read_bytes()
    for args in (["inspect", path], ["rewrite", path, "-o", tmp_path / "r.onnx"],
                 ["explain", path, tmp_path / "x.npy", "-o", tmp_path / "o.npz"]):
        line = _one_line_refusal(*_cli(*args))
        assert "the declared input shape(s) image 1x17x17 do not fit the graph: node /features/features.0/Conv " \
               "(Conv)" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.onnx", "x.npy"] and path.read_bytes() == before
    with pytest.raises(InputError, match=r"image 1x17x17 .*/features/features\.0/Conv"):
        onnx_lrp.Explainer(str(path), composite="epsilon")


@pytest.mark.skipif(not DIGITS.exists(), reason="models/digits_cnn.onnx is missing (python models/build_digits.py)")
def test_declared_input_the_graph_can_take_still_loads(tmp_path):
    """1 x 1 x 17 x 17 fits (the floor-mode pools give 4 x 4 x 32 = 512 for the Gemm): not refused; the explained
    logits are onnxruntime's."""
    path = _digits_declared(tmp_path, [1, 1, 17, 17])
    x = np.random.default_rng(0).random((1, 1, 17, 17), np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"], {"image": x})[0]
    got = onnx_lrp.Explainer(str(path), composite="epsilon").explain(x)
    np.testing.assert_allclose(got.outputs["logits"], want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- the fixpoints
class _Count(ir.passes.InPlacePass):
    """Modifies the model its first ``until`` calls."""

    def __init__(self, until: int, error: Exception | None = None):
        super().__init__()
        self.until, self.calls, self.error = until, 0, error

    def call(self, model):
        self.calls += 1
        if self.error is not None:
            raise self.error
        return ir.passes.PassResult(model, self.calls <= self.until)


def test_fixpoint_runs_until_nothing_changes_or_the_cap():
    model = ir.Model(ir.Graph([], [], nodes=[]), ir_version=10)
    for until, steps, calls in ((0, 8, 1), (2, 8, 3), (20, 8, 8)):
        p = _Count(until)
        assert fixpoint([p], steps, model) == (until > 0)
        assert p.calls == calls


def test_fixpoint_lets_a_pass_error_through_unwrapped():
    model = ir.Model(ir.Graph([], [], nodes=[]), ir_version=10)
    with pytest.raises(ModelError, match="^node n: refused$"):
        fixpoint([_Count(1), _Count(1, ModelError("node n: refused"))], 4, model)
    assert issubclass(ModelError, LrpError)
