"""The ``onnx-lrp`` command checked against the Python API.

The commands run in-process through click's CliRunner (the same ``main`` as the entry point, no interpreter start-up);
a few run the installed entry point as a subprocess to show it behaves the same (an explain, bad inputs, --version).
Bad inputs exit 2 with one line on stderr and leave no file behind.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

import onnx_lrp
from onnx_lrp.io import heatmap as hm
from onnx_lrp.cli.io import AtomicOutputs
from onnx_lrp.core.errors import OutputError
from onnx_lrp.cli.main import main
from onnx_lrp.rules.composite import builtin_names, load_composite
from util import ROOT, assert_close

MODELS = ROOT / "models"
DIGITS = MODELS / "digits_cnn.onnx"
SAMPLES = MODELS / "samples"
CLI = Path(sys.executable).parent / ("onnx-lrp.exe" if os.name == "nt" else "onnx-lrp")
RELU_TENSOR = "/classifier/classifier.2/Relu_output_0"


def run(*args, cwd=None, expect=0, installed=False):
    """Run the command and check its exit code: ``installed``, the installed entry point as a subprocess (as a user
    and CI run it; ~2-4 s of imports each), else the same ``main`` in-process (click's runner, stdout and stderr
    apart, from ``cwd``). A CompletedProcess either way."""
    args = [str(a) for a in args]
    if installed:
        assert CLI.exists(), f"{CLI} missing: install the project (pip install -e .) into this interpreter's venv"
        proc = subprocess.run([str(CLI), *args], capture_output=True, text=True, cwd=cwd, timeout=300)
    else:
        old = os.getcwd()
        try:
            os.chdir(cwd or old)
            r = CliRunner().invoke(main, args)
        finally:
            os.chdir(old)
        proc = subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)
    assert proc.returncode == expect, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def api(composite="epsilon-plus-flat", **kw):
    return onnx_lrp.Explainer(str(DIGITS), composite=composite, **kw)


def close(a, b):
    assert_close(a, b, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------- explain
def test_explain_npy_batch_npz_and_heatmap(tmp_path):
    x = np.load(SAMPLES / "batch.npy")
    out, heat = tmp_path / "rel.npz", tmp_path / "heat.png"
    p = run("explain", DIGITS, SAMPLES / "batch.npy", "-o", out, "--heatmap", heat, "--heatmap-style", "heatmap",
            "--device", "auto", installed=True)
    assert "--device auto: using cpu" in p.stderr or "--device auto: using cuda" in p.stderr
    res = api().explain(x)
    with np.load(out, allow_pickle=False) as z:
        assert sorted(z.files) == ["items", "outputs", "outputs/logits", "outputs/probabilities", "relevance",
                                   "targets"]
        close(z["relevance"], res.relevance)
        close(z["outputs"], res.outputs["logits"])
        close(z["outputs/probabilities"], res.outputs["probabilities"])
        assert z["targets"].tolist() == res.target.tolist() == res.outputs["logits"].argmax(1).tolist()
        assert z["items"].tolist() == [f"batch.npy[{i}]" for i in range(10)]
    # the summary: one row per item with predicted class, target, output value and relevance sum
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith("batch.npy[")]
    assert len(rows) == 10
    for i, row in enumerate(rows):
        logits = res.outputs["logits"][i]
        assert int(row[1]) == logits.argmax() and int(row[2]) == res.target[i]
        assert float(row[3]) == pytest.approx(logits[res.target[i]], rel=1e-5)
        assert float(row[4]) == pytest.approx(res.relevance[i].sum(), rel=1e-4, abs=1e-5)
    assert "explained in" in p.stdout
    # the heatmap: 10 tiles of 16x16 enlarged 8x, 8 per row, each with 3 caption lines, a colour bar below;
    # the most relevant pixel is the reddest one
    im = np.asarray(Image.open(heat).convert("RGB"))
    s = hm.tile_scale(16, 16)
    assert s == 8 and im.shape == (4 + 2 * (128 + 3 * hm.LINE_H + 2 + 4) + hm.BAR_H, 4 + 8 * (128 + 4), 3)
    maps = res.relevance.sum(axis=1)
    for i in range(10):
        x0, y0, x1, y1 = hm.cell_box(i, 10, 16, 16, style="heatmap", caption_lines=3)
        block = im[y0:y1:s, x0:x1:s].astype(int)
        hot = np.unravel_index(np.argmax(maps[i]), (16, 16))
        assert block[hot].tolist() == [255, 0, 0]  # colour map end point: +max is pure red
        redness = block[..., 0] - (block[..., 1] + block[..., 2]) / 2
        assert np.unravel_index(np.argmax(redness), (16, 16)) == hot
        cold = np.unravel_index(np.argmin(maps[i]), (16, 16))
        expect = hm.apply_cmap(np.array([0.5 + 0.5 * maps[i][cold] / np.abs(maps[i]).max()]), "bwr")[0]
        assert np.abs(block[cold] - expect).max() <= 1


def test_explain_image_with_zbox_bounds_json_and_beside_heatmap(tmp_path):
    png = SAMPLES / "png" / "digit_3.png"
    heat = tmp_path / "h.png"
    p = run("explain", DIGITS, png, "-o", tmp_path / "r.npy", "--heatmap", heat, "--composite",
            "epsilon-gamma-box", "--json", "--target", "5")
    summary = json.loads(p.stdout)
    # the PNG holds exactly the .npy sample * 255; --mean 0 --std 1 (defaults) -> ZBox low 0, high 1
    assert "ZBox bounds for pixels in [0, 1] (no --mean/--std given): low [0.0], high [1.0]" in p.stderr
    x = np.load(SAMPLES / "npy" / "digit_3.npy")
    np.testing.assert_array_equal(np.asarray(Image.open(png), np.float32)[None] / 255, x)
    res = api("epsilon-gamma-box", low=0.0, high=1.0).explain(x, target=5)
    rel = np.load(tmp_path / "r.npy", allow_pickle=False)
    assert rel.shape == (1, 1, 16, 16) and res.relevance.shape == (1, 16, 16)  # the CLI's batch; the item as given
    close(rel[0], res.relevance)
    other_box = api("epsilon-gamma-box", low=-3.0, high=3.0).explain(x, target=5).relevance  # not what ran
    assert np.abs(other_box - rel).max() > 1e-3
    (item,) = summary["items"]
    assert item == dict(item="digit_3.png", predicted=int(res.outputs["logits"].argmax()), target=5,
                        output=pytest.approx(float(res.outputs["logits"][5]), rel=1e-5),
                        relevance_sum=pytest.approx(float(res.relevance.sum()), rel=1e-4, abs=1e-5))
    assert summary["composite"] == "epsilon-gamma-box" and summary["device"] == "cpu"
    assert summary["heatmap_file"] == str(heat) and summary["explain_s"] >= 0
    # beside: the grey input (enlarged 8x) left of its heatmap
    im = np.asarray(Image.open(heat).convert("RGB"))
    assert im.shape == (4 + 128 + 3 * hm.LINE_H + 2 + 4 + hm.BAR_H, 4 + 2 * 128 + 4 + 4, 3)
    left = im[4:132:8, 4:132:8]
    np.testing.assert_array_equal(left, np.repeat(np.asarray(Image.open(png))[..., None], 3, axis=2))
    x0, y0, x1, y1 = hm.cell_box(0, 1, 16, 16, style="beside", caption_lines=3)
    np.testing.assert_array_equal(im[y0:y1:8, x0:x1:8], hm.colorize(res.relevance.sum(0), "bwr"))


def test_explain_directories_default_output_and_batches(tmp_path):
    # a directory of .npy files, in sorted order, 3 per run; the output lands next to the directory by default
    d = tmp_path / "digits"
    d.mkdir()
    for k in (7, 2, 9, 0):
        (d / f"d{k}.npy").write_bytes((SAMPLES / "npy" / f"digit_{k}.npy").read_bytes())
    (d / "notes.txt").write_text("ignored")
    run("explain", DIGITS, d, "--batch-size", "3", "--target", "7,2,9,0", "--start", "one-hot", cwd=tmp_path)
    out = tmp_path / "digits.relevance.npz"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits", "digits.relevance.npz"]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # an ordinary file, not the temporary file's 0600
    x = np.concatenate([np.load(SAMPLES / "npy" / f"digit_{k}.npy")[None] for k in (0, 2, 7, 9)])
    res = api(start="one-hot").explain(x, target=[7, 2, 9, 0])
    with np.load(out) as z:
        assert z["items"].tolist() == ["d0.npy", "d2.npy", "d7.npy", "d9.npy"]
        assert z["targets"].tolist() == [7, 2, 9, 0]
        close(z["relevance"], res.relevance)
    # a directory of PNGs gives the relevance of the same pixels as arrays
    p = run("explain", DIGITS, SAMPLES / "png", "-o", tmp_path / "png.npz", "--json")
    res = api().explain(np.load(SAMPLES / "batch.npy"))
    with np.load(tmp_path / "png.npz") as z:
        assert z["items"].tolist() == [f"digit_{k}.png" for k in range(10)]
        close(z["relevance"], res.relevance)
    assert [it["predicted"] for it in json.loads(p.stdout)["items"]] == list(range(10))


def test_explain_output_relevance_at_and_rule_parameters(tmp_path):
    out = tmp_path / "e.npz"
    run("explain", DIGITS, SAMPLES / "batch.npy", "-o", out, "--output", "probabilities", "--relevance-at",
        RELU_TENSOR, "--composite", "epsilon-alpha2-beta1", "--alpha", "3", "--epsilon", "0.01", "--target", "4")
    x = np.load(SAMPLES / "batch.npy")
    res = api("epsilon-alpha2-beta1", alpha=3.0, beta=2.0, epsilon=0.01, output="probabilities",
              relevance_at=(RELU_TENSOR,)).explain(x, target=4)
    other = api("epsilon-alpha2-beta1").explain(x, target=4)
    with np.load(out) as z:
        close(z["relevance"], res.relevance)
        close(z[f"relevance_at/{RELU_TENSOR}"], res.relevance_at[RELU_TENSOR])
        close(z["outputs"], res.outputs["probabilities"])  # the explained output: probabilities
        assert z["targets"].tolist() == [4] * 10
        assert np.abs(z["relevance"] - other.relevance).max() > 1e-3  # the parameters changed the result


def _two_input_model(path):
    rng = np.random.default_rng(0)
    w1, w2 = rng.normal(size=(7, 5)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32)
    nodes = [helper.make_node("Concat", ["a", "b"], ["ab"], axis=1),
             helper.make_node("Gemm", ["ab", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("Gemm", ["hr", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4]),
                                             helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, path)


def test_explain_npz_one_array_per_input(tmp_path):
    _two_input_model(tmp_path / "two.onnx")
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(3, 3)).astype(np.float32)
    np.savez(tmp_path / "in.npz", b=b, a=a)
    run("explain", tmp_path / "two.onnx", tmp_path / "in.npz", "--composite", "epsilon", cwd=tmp_path)
    res = onnx_lrp.Explainer(str(tmp_path / "two.onnx"), composite="epsilon").explain({"a": a, "b": b})
    with np.load(tmp_path / "in.relevance.npz") as z:  # default output: in the current directory
        close(z["relevance/a"], res.relevance["a"])
        close(z["relevance/b"], res.relevance["b"])
        # LRP-epsilon without biases conserves the explained logit
        total = z["relevance/a"].sum(1) + z["relevance/b"].sum(1)
        np.testing.assert_allclose(total, res.outputs["y"].max(1), rtol=1e-3)


# ------------------------------------------------------------------------------------------- rewrite
def test_rewrite_runs_in_plain_onnxruntime_without_onnx_lrp(tmp_path):
    out = tmp_path / "digits.lrp.onnx"
    p = run("rewrite", DIGITS, "-o", out, "--composite", "epsilon-gamma-box", "--low", "0", "--high", "1")
    assert "lrp/relevance/image" in p.stdout
    x = np.load(SAMPLES / "batch.npy")
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent("""
        import sys, importlib.abc
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "onnx_lrp":
                    raise ImportError("onnx_lrp is blocked in this test")
        sys.meta_path.insert(0, Block())
        import numpy as np, onnxruntime as ort
        sess = ort.InferenceSession("digits.lrp.onnx", providers=["CPUExecutionProvider"])
        x = np.load("x.npy")
        rel, used = sess.run(["lrp/relevance/image", "lrp/target_used"],
                             {"image": x, "lrp/target": np.full(len(x), 3, np.int64), "lrp/one_hot": np.array(True)})
        rel0, used0 = sess.run(["lrp/relevance/image", "lrp/target_used"],
                               {"image": x, "lrp/target": np.full(len(x), -1, np.int64), "lrp/one_hot": np.array(False)})
        np.savez("ort.npz", rel=rel, used=used, rel0=rel0, used0=used0)
        try:
            import onnx_lrp
        except ImportError:
            print("onnx_lrp not importable", sorted(m for m in sys.modules if m.startswith("onnx_lrp")))
    """)
    proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "onnx_lrp not importable []"
    ex = api("epsilon-gamma-box", low=0.0, high=1.0)
    with np.load(tmp_path / "ort.npz") as z:
        assert z["used"].tolist() == [3] * 10
        close(z["rel"], ex.explain(x, target=3, start="one-hot").relevance)
        assert z["used0"].tolist() == list(range(10))  # defaults: arg-max target, start at the logit
        close(z["rel0"], ex.explain(x).relevance)
    # only standard ONNX domains: nothing of onnx-lrp is needed to run it
    assert {o.domain for o in onnx.load(out).opset_import} <= {"", "ai.onnx"}


# ------------------------------------------------------------------------------------------- inspect
def _unsupported_model(path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"]), helper.make_node("LpNormalization", ["h"], ["hn"]),
             helper.make_node("Gemm", ["hn", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "unsup", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                              [numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w1"),
                               numpy_helper.from_array(rng.normal(size=(3, 2)).astype(np.float32), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, path)


def test_inspect_lists_every_node_with_its_rule(tmp_path):
    from onnx_lrp import load as loader
    from onnx_lrp.lrp import rewriter

    p = run("inspect", DIGITS, "--composite", "epsilon-gamma-box")
    plan = rewriter.plan(loader.load(str(DIGITS)), load_composite("epsilon-gamma-box"))
    rows = rewriter.describe(plan)
    lines = p.stdout.splitlines()
    assert lines[0].split()[:6] == ["node", "op", "role", "kind", "rule", "status"]
    body = [line.split() for line in lines[1:lines.index("inputs:")]]  # the table, then the interface
    assert [(r[0], r[1], r[2], r[4]) for r in body] == [(r["name"], r["op_type"], r["role"], r["rule"])
                                                       for r in rows]
    assert [r[4] for r in body if r[1] == "Conv"] == ["zbox", "gamma", "gamma"]
    coverage = next(line for line in lines if line.startswith("coverage: "))
    assert coverage == f"coverage: {len(rows) - 1}/{len(rows) - 1} nodes on the path to 'logits' supported " \
                       "with composite epsilon-gamma-box"  # the Softmax is off the path to the logits
    # the tensors listed are the names --relevance-at takes
    assert RELU_TENSOR in p.stdout
    j = json.loads(run("inspect", DIGITS, "--json").stdout)
    assert j["coverage"] == dict(supported=12, on_path=12, nodes=13, unsupported=[])

    _unsupported_model(tmp_path / "bad.onnx")
    p = run("inspect", tmp_path / "bad.onnx", expect=1)
    bad = [line for line in p.stdout.splitlines() if "UNSUPPORTED" in line]
    assert len(bad) == 1 and "LpNormalization" in bad[0]
    assert p.stdout.splitlines()[-1].startswith("coverage: 2/3 nodes")  # no command suggested: it would fail
    assert p.stderr.count("\n") == 1 and "1 unsupported node(s)" in p.stderr
    # explaining it is bad input (exit 2), not a failed check
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    p = run("explain", tmp_path / "bad.onnx", tmp_path / "x.npy", expect=2)
    assert "LpNormalization" in p.stderr and p.stderr.count("\n") == 1
    assert not (tmp_path / "x.relevance.npy").exists()


def test_composites_lists_every_builtin():
    p = run("composites")
    for name in builtin_names():
        comp = load_composite(name)
        header = f"{comp.name}: {comp.description}" if comp.description else comp.name
        assert header in p.stdout.splitlines()
        for line in comp.describe():
            assert f"  {line}" in p.stdout.splitlines()
    assert "first_linear=True, kind=convolution -> zbox(low=required, high=required, stabilizer=1e-06)" in p.stdout


def test_help_and_version():
    text = " ".join(run("explain", "--help").stdout.split())
    for opt in ("--composite", "--target", "--output", "--epsilon", "--gamma", "--low", "--high", "--alpha",
                "--beta", "--start", "--device", "--batch-size", "--relevance-at", "--heatmap", "--cmap", "--size",
                "--mean", "--std", "--crop", "--json", "Normalise any input: (x - mean) / std."):
        assert opt in text, opt
    assert onnx_lrp.__version__ in run("--version", installed=True).stdout


# ------------------------------------------------------------------------------------------- bad input
def _pickled(path):
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)


def _files(d: Path):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


BAD = {
    # name: (setup(tmp) -> args, part of the message)
    "missing model": (lambda t: ["explain", t / "nope.onnx", SAMPLES / "batch.npy", "-o", t / "o.npy"],
                      "nope.onnx not found"),
    "empty model": (lambda t: [_write(t / "m.onnx", b""), "explain", t / "m.onnx", SAMPLES / "batch.npy", "-o",
                               t / "o.npy"][1:], "is empty"),
    "truncated model": (lambda t: [_write(t / "m.onnx", DIGITS.read_bytes()[:5000]), "explain", t / "m.onnx",
                                   SAMPLES / "batch.npy", "-o", t / "o.npy"][1:], "not a valid ONNX model"),
    "garbage model": (lambda t: [_write(t / "m.onnx", os.urandom(3000)), "inspect", t / "m.onnx"][1:],
                      "not a valid ONNX model"),
    "missing input": (lambda t: ["explain", DIGITS, t / "nope.npy", "-o", t / "o.npy"], "nope.npy not found"),
    "empty npy": (lambda t: [_write(t / "x.npy", b""), "explain", DIGITS, t / "x.npy", "-o", t / "o.npy"][1:],
                  "is empty"),
    "truncated npy": (lambda t: [_write(t / "x.npy", (SAMPLES / "batch.npy").read_bytes()[:300]), "explain",
                                 DIGITS, t / "x.npy", "-o", t / "o.npy"][1:], "not a valid .npy"),
    "pickled npy": (lambda t: [_pickled(t / "x.npy"), "explain", DIGITS, t / "x.npy", "-o", t / "o.npy"][1:],
                    "pickled Python objects, which are never loaded"),
    "garbage image": (lambda t: [_write(t / "x.png", b"not a png"), "explain", DIGITS, t / "x.png", "-o",
                                 t / "o.npy"][1:], "not a readable image"),
    "unknown input type": (lambda t: [_write(t / "x.csv", b"1,2"), "explain", DIGITS, t / "x.csv"][1:],
                           "unknown type .csv"),
    "empty directory": (lambda t: [(t / "d").mkdir(), "explain", DIGITS, t / "d", "-o", t / "o.npz"][1:],
                        "holds no .npy"),
    "wrong rank": (lambda t: [np.save(t / "x.npy", np.zeros((2, 1, 1, 16, 16), np.float32)), "explain", DIGITS,
                              t / "x.npy", "-o", t / "o.npy"][1:], "wants rank 4"),
    "wrong shape": (lambda t: [np.save(t / "x.npy", np.zeros((2, 1, 8, 8), np.float32)), "explain", DIGITS,
                               t / "x.npy", "-o", t / "o.npy"][1:], "the model wants Nx1x16x16"),
    "wrong dtype": (lambda t: [np.save(t / "x.npy", np.zeros((2, 1, 16, 16), np.int64)), "explain", DIGITS,
                               t / "x.npy", "-o", t / "o.npy"][1:], "dtype int64"),
    "string dtype": (lambda t: [np.save(t / "x.npy", np.array(["a", "b"])), "explain", DIGITS, t / "x.npy", "-o",
                                t / "o.npy"][1:], "give a numeric array"),
    "nan input": (lambda t: [np.save(t / "x.npy", np.full((1, 1, 16, 16), np.nan, np.float32)), "explain",
                             DIGITS, t / "x.npy", "-o", t / "o.npy"][1:], "NaN or Inf"),
    "npz wrong names": (lambda t: [np.savez(t / "x.npz", a=np.zeros(3), b=np.zeros(3)), "explain", DIGITS,
                                   t / "x.npz", "-o", t / "o.npz"][1:], "the model's inputs are image"),
    "unknown composite": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--composite", "magic", "-o",
                                     t / "o.npy"], "unknown composite 'magic'"),
    "bad composite file": (lambda t: [_write(t / "c.toml", b"rules = [[["), "explain", DIGITS, SAMPLES / "batch.npy",
                                      "--composite", t / "c.toml", "-o", t / "o.npy"][1:], "not valid TOML"),
    "negative gamma": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--composite", "epsilon-gamma-box",
                                  "--gamma", "-1", "-o", t / "o.npy"], "gamma >= 0"),
    "alpha minus beta": (lambda t: ["rewrite", DIGITS, "--composite", "epsilon-alpha2-beta1", "--alpha", "2",
                                    "--beta", "2", "-o", t / "o.onnx"], "alpha - beta = 1"),
    "low above high": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--composite", "epsilon-gamma-box",
                                  "--low", "2", "--high", "1", "-o", t / "o.npy"], "low <= high"),
    "parameter no rule takes": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--gamma", "0.5", "-o",
                                           t / "o.npy"], "no rule with parameter gamma"),
    "non-numeric epsilon": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--epsilon", "tiny", "-o",
                                       t / "o.npy"], "'tiny' is not a valid float"),
    "target out of range": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--target", "10", "-o",
                                       t / "o.npy"], "out of range"),
    "target count": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--target", "1,2", "-o", t / "o.npy"],
                     "2 classes for 10 item(s)"),
    "target text": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--target", "cat", "-o", t / "o.npy"],
                    "--target 'cat'"),
    "unknown output": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--output", "scores", "-o",
                                  t / "o.npy"], "no output 'scores'"),
    "unknown tensor": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--relevance-at", "nothing", "-o",
                                  t / "o.npz"], "no tensor named nothing"),
    "bad size": (lambda t: ["explain", DIGITS, SAMPLES / "png" / "digit_1.png", "--size", "big", "-o",
                            t / "o.npy"], "--size 'big'"),
    "check against an .npy": (lambda t: ["check", DIGITS, SAMPLES / "batch.npy"], "is a single array, not an "
                                                                                 "onnx-lrp snapshot"),
    "huge size": (lambda t: ["explain", DIGITS, SAMPLES / "png" / "digit_1.png", "--size", "100000", "-o",
                             t / "o.npy"], "at most 16384"),
    "mean per channel": (lambda t: ["explain", DIGITS, SAMPLES / "png" / "digit_1.png", "--mean", "0.5,0.5", "-o",
                                    t / "o.npy"], "--mean has 2 values"),
    "output directory missing": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "-o", t / "no" / "o.npy"],
                                 "does not exist"),
    "output parent is a file": (lambda t: [_write(t / "f", b"x"), "explain", DIGITS, SAMPLES / "batch.npy", "-o",
                                           t / "f" / "o.npy"][1:], "is a file, not a directory"),
    "output is a directory": (lambda t: [(t / "o.npy").mkdir(), "explain", DIGITS, SAMPLES / "batch.npy", "-o",
                                         t / "o.npy"][1:], "it is a directory"),
    "heatmap directory missing": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "-o", t / "o.npy",
                                             "--heatmap", t / "no" / "h.png"], "does not exist"),
    "heatmap not an image": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "-o", t / "o.npy", "--heatmap",
                                       t / "h.pdf"], "give an image file name"),
    "output suffix": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "-o", t / "o.txt"], ".npy or .npz"),
    "output is the input": (lambda t: [_write(t / "x.npy", (SAMPLES / "batch.npy").read_bytes()), "explain",
                                       DIGITS, t / "x.npy", "-o", t / "x.npy"][1:], "is the input"),
    "rewrite into missing directory": (lambda t: ["rewrite", DIGITS, "-o", t / "no" / "m.onnx"], "does not exist"),
    "unknown option": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--frobnicate"],
                       "No such option '--frobnicate'"),
    "unknown device": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--device", "tpu"], "'tpu' is not one"),
    # malformed models, inputs and composite files (issue 9, point 7): refused, never an internal error
    "custom-domain op": (lambda t: ["explain", _digits(t, _custom_op), SAMPLES / "batch.npy", "-o", t / "o.npy"],
                         "com.example::Foo (opset 1) [/features/features.2/Relu]: no handler for this op"),
    "input rank changed": (lambda t: ["explain", _digits(t, _drop_input_axis), SAMPLES / "batch.npy", "-o",
                                      t / "o.npy"],
                           "the declared input shape(s) image batchx16x16 do not fit the graph: node "
                           "/features/features.0/Conv (Conv) cannot take them (Attribute dilations has incorrect size; "
                           "it takes them with one axis more)"),
    "conv strides 0": (lambda t: ["explain", _digits(t, _set_attr("/features/features.0/Conv", "strides", [0, 0])),
                                  SAMPLES / "batch.npy", "-o", t / "o.npy"], "malformed: strides=[0, 0]"),
    "conv group 0": (lambda t: ["explain", _digits(t, _set_attr("/features/features.0/Conv", "group", 0)),
                                SAMPLES / "batch.npy", "-o", t / "o.npy"], "malformed: group=0"),
    "gemm beta nan": (lambda t: ["explain", _digits(t, _set_attr("/classifier/classifier.4/Gemm", "beta",
                                                                 float("nan"))), SAMPLES / "batch.npy", "-o",
                                 t / "o.npy"], "alpha or beta is not finite"),
    "dimension 2**30": (lambda t: ["rewrite", _digits(t, _huge_axis), "-o", t / "o.onnx"],
                        # (the size check itself: tests/api/test_honesty.py, on a net whose shapes still fit)
                        "(Gemm: Dimension mismatch in unification between 512 and 34359738368)"),
    "empty batch": (lambda t: [np.save(t / "x.npy", np.zeros((0, 1, 16, 16), np.float32)), "explain", DIGITS,
                               t / "x.npy", "-o", t / "o.npy"][1:], "holds no items (an empty batch)"),
    "empty batch snapshot": (lambda t: [np.save(t / "x.npy", np.zeros((0, 1, 16, 16), np.float32)), "snapshot",
                                        DIGITS, t / "x.npy", "-o", t / "s.npz"][1:], "holds no items"),
    "composite rules = 5": (lambda t: _bad_toml(t, "rules = 5"), "`rules` must be a list"),
    "composite rule = 5": (lambda t: _bad_toml(t, "[[rules]]\nrule = 5"), "`rule` must be a rule name"),
    "composite match = 5": (lambda t: _bad_toml(t, "[[rules]]\nmatch = 5\nrule = 'epsilon'"),
                            "`match` must be a table"),
    "composite epsilon text": (lambda t: _bad_toml(t, "[[rules]]\nrule = 'epsilon'\nepsilon = 'abc'"),
                               "epsilon must be a number, not str 'abc'"),
    "composite entry not a table": (lambda t: _bad_toml(t, "rules = [5]"), "entry 1 must be a [[rules]] table"),
    "composite match kind 5": (lambda t: _bad_toml(t, "[[rules]]\nmatch = {kind = 5}\nrule = 'epsilon'"),
                               "match.kind must be a string"),
    "bounds per channel wrong count": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--composite",
                                                  "epsilon-gamma-box", "--low", "0,0,0", "--high", "1,1,1", "-o",
                                                  t / "o.npy"], "zbox bound low of shape [3, 1, 1] does not fit"),
    "zbox without bounds, npy": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--composite",
                                            "epsilon-gamma-box", "-o", t / "o.npy"], "has no input bounds"),
    "zbox without bounds, rewrite": (lambda t: ["rewrite", DIGITS, "--composite", "epsilon-gamma-box", "-o",
                                                t / "o.onnx"], "has no input bounds"),
    "zbox without bounds, snapshot": (lambda t: ["snapshot", DIGITS, SAMPLES / "batch.npy", "--composite",
                                                 "epsilon-gamma-box", "-o", t / "s.npz"], "--low/--high"),
    # issue 17: opsets that do not exist yet, negative stabilisers, files of the wrong kind, a declared input size
    # the graph was not exported for
    **{f"opset 99, {cmd}": (lambda t, cmd=cmd: [cmd, _digits(t, _opset(99))] + (
        [SAMPLES / "batch.npy", "-o", t / "o.npy"] if cmd == "explain" else ["-o", t / "o.onnx"] if cmd == "rewrite"
        else []), f"imports opset 99, which does not exist yet: the installed onnx {onnx.__version__} knows opsets up "
                  f"to {onnx.defs.onnx_opset_version()}") for cmd in ("explain", "inspect", "rewrite")},
    "composite epsilon -1": (lambda t: _bad_toml(t, "[[rules]]\nrule = 'epsilon'\nepsilon = -1"),
                             "entry 1: rule 'epsilon': epsilon must be >= 0, not -1"),
    "--stabilizer -1": (lambda t: ["explain", DIGITS, SAMPLES / "batch.npy", "--stabilizer", "-1", "-o", t / "o.npy"],
                        "stabilizer must be >= 0, not -1"),
    "--epsilon -1": (lambda t: ["rewrite", DIGITS, "--epsilon", "-1", "-o", t / "o.onnx"],
                     "epsilon must be >= 0, not -1 (it is added to each denominator"),
    "binary composite file": (lambda t: [_write(t / "c.toml", bytes(range(255, -1, -1))), "explain", DIGITS,
                                         SAMPLES / "batch.npy", "--composite", t / "c.toml", "-o", t / "o.npy"][1:],
                              "c.toml is not a UTF-8 TOML composite"),
    "text named .npy": (lambda t: [_write(t / "x.npy", b"1 2 3\n4 5 6\n"), "explain", DIGITS, t / "x.npy", "-o",
                                   t / "o.npy"][1:], "x.npy is a text file, not a NumPy .npy array"),
    "text named .npz": (lambda t: [_write(t / "x.npz", b"1 2 3\n"), "explain", DIGITS, t / "x.npz", "-o",
                                   t / "o.npz"][1:], "x.npz is not a .npz file"),
    **{f"input 15x15 for 16x16, {cmd}": (lambda t, cmd=cmd: [cmd, _digits(t, _input_side(15))] + (
        ["-o", t / "o.onnx"] if cmd == "rewrite" else []),
        "the shapes do not fit at node /classifier/classifier.1/Gemm (Gemm: Dimension mismatch in unification "
        "between 512 and 288), from the declared input shape(s) image batchx1x15x15; give the shapes the model was "
        "exported for (--input-shape") for cmd in ("inspect", "rewrite")},
}


def _opset(version):
    def edit(m):
        m.opset_import[0].version = version
    return edit


def _input_side(side):
    def edit(m):
        for d in m.graph.input[0].type.tensor_type.shape.dim[2:]:
            d.dim_value = side
        del m.graph.value_info[:]
    return edit


def _digits(t, edit):
    """The demo model with one edit, written to t/m.onnx (created before the test looks at the directory)."""
    m = onnx.load(str(DIGITS))
    edit(m)
    path = t / "models" / "m.onnx"
    path.parent.mkdir(exist_ok=True)
    onnx.save(m, str(path))
    return path


def _custom_op(m):
    relu = m.graph.node[1]
    relu.op_type, relu.domain = "Foo", "com.example"
    m.opset_import.append(helper.make_opsetid("com.example", 1))


def _drop_input_axis(m):
    del m.graph.input[0].type.tensor_type.shape.dim[1]


def _huge_axis(m):
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 2 ** 30


def _set_attr(node_name, name, value):
    def edit(m):
        n = next(n for n in m.graph.node if n.name == node_name)
        n.attribute.remove(next(a for a in n.attribute if a.name == name))
        n.attribute.append(helper.make_attribute(name, value))
    return edit


def _bad_toml(t, text):
    path = t / "composites" / "c.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return ["explain", DIGITS, SAMPLES / "batch.npy", "--composite", path, "-o", t / "o.npy"]


def _write(path, data):
    Path(path).write_bytes(data)
    return path


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_with_one_line_and_no_file(case, tmp_path, monkeypatch):
    setup, message = BAD[case]
    args = [str(a) for a in setup(tmp_path)]
    before = _files(tmp_path)
    monkeypatch.chdir(tmp_path)  # default outputs go to the current directory: checked too
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    assert result.stdout == ""
    err = result.stderr
    assert err.count("\n") == 1 and err.startswith("onnx-lrp: error: "), err
    assert "Traceback" not in err and message in err, err
    assert _files(tmp_path) == before  # nothing written, not even a temporary file


def test_bad_input_through_the_installed_command(tmp_path):
    _pickled(tmp_path / "x.npy")
    (tmp_path / "old.npy").write_bytes(b"precious")
    for args, message in [(["explain", DIGITS, tmp_path / "x.npy", "-o", tmp_path / "old.npy"], "pickled"),
                          (["explain", DIGITS, SAMPLES / "batch.npy", "-o", tmp_path / "old.npy", "--target", "12"],
                           "out of range"),
                          (["explain", DIGITS, SAMPLES / "batch.npy", "-o", tmp_path / "x.npy" / "o.npy"],
                           "is a file")]:
        p = run(*args, expect=2, installed=True)
        assert p.stdout == "" and p.stderr.count("\n") == 1 and message in p.stderr, p.stderr
    # a failed run never clobbers an existing output and leaves no temporary file
    assert (tmp_path / "old.npy").read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.npy", "x.npy"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        result = CliRunner().invoke(main, ["explain", str(DIGITS), str(SAMPLES / "batch.npy"), "-o",
                                           str(ro / "o.npy")])
        assert result.exit_code == 2 and "not writable" in result.stderr
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


def test_device_cuda_without_cuda_is_a_clear_error(tmp_path):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA is available here")
    p = run("explain", DIGITS, SAMPLES / "batch.npy", "--device", "cuda", "-o", tmp_path / "o.npy", expect=2)
    assert "CUDA was asked for" in p.stderr and "--device cpu" in p.stderr and p.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_atomic_outputs_commit_all_or_nothing(tmp_path):
    a, b = tmp_path / "a.npy", tmp_path / "b.png"
    a.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with AtomicOutputs() as w:
            w.save_npy(a, np.arange(3))
            w.write(b, lambda f: (f.write(b"half"), (_ for _ in ()).throw(RuntimeError("disk full"))))
    assert a.read_bytes() == b"old" and not b.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy"]  # no temporary files left
    with pytest.raises(OutputError, match="does not exist"):
        with AtomicOutputs() as w:
            w.save_npy(a, np.arange(3))
            w.save_npy(tmp_path / "missing" / "c.npy", np.arange(3))
    assert a.read_bytes() == b"old"
    with AtomicOutputs() as w:
        w.save_npy(a, np.arange(3))
        w.write_bytes(b, b"png")
    assert np.load(a).tolist() == [0, 1, 2] and b.read_bytes() == b"png"


def _nhwc_model(path):
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["xt", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]), helper.make_node("Gemm", ["f", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "nhwc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                              [numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w"),
                               numpy_helper.from_array(rng.normal(size=4).astype(np.float32), "b"),
                               numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, path)


def test_rgb_image_for_an_nhwc_model_with_per_channel_normalisation(tmp_path):
    _nhwc_model(tmp_path / "m.onnx")
    pixels = np.random.default_rng(3).integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels, mode="RGB").save(tmp_path / "img.png")
    mean, std = np.array([0.5, 0.4, 0.3], np.float32), np.array([0.2, 0.25, 0.3], np.float32)
    result = CliRunner().invoke(main, ["explain", str(tmp_path / "m.onnx"), str(tmp_path / "img.png"), "--mean",
                                       "0.5,0.4,0.3", "--std", "0.2,0.25,0.3", "--composite", "epsilon-gamma-box",
                                       "-o", str(tmp_path / "r.npy"), "--heatmap", str(tmp_path / "h.png")])
    assert result.exit_code == 0, result.stderr
    x = ((pixels.astype(np.float32) / 255 - mean) / std)[None]  # NHWC, as the model declares
    ex = onnx_lrp.Explainer(str(tmp_path / "m.onnx"), composite="epsilon-gamma-box",
                            low=((0 - mean) / std).reshape(3, 1, 1), high=((1 - mean) / std).reshape(3, 1, 1))
    res = ex.explain(x)
    rel = np.load(tmp_path / "r.npy")
    assert rel.shape == (1, 8, 8, 3)
    close(rel, res.relevance)
    # the heatmap sums the channels-last axis and shows the RGB input beside it
    im = np.asarray(Image.open(tmp_path / "h.png").convert("RGB"))
    s = hm.tile_scale(8, 8)
    np.testing.assert_array_equal(im[4:4 + 8 * s:s, 4:4 + 8 * s:s], pixels)
    x0, y0, x1, y1 = hm.cell_box(0, 1, 8, 8, style="beside", caption_lines=3)
    np.testing.assert_array_equal(im[y0:y1:s, x0:x1:s], hm.colorize(res.relevance[0].sum(-1), "bwr"))


def test_explainer_setup_reads_the_options_once():
    """cli.options.explainer_setup, the one reading of the options behind every command: for a ZBox composite
    without --low/--high the bounds are the range [0, 1] after --mean/--std (low = (0 - mean) / std,
    high = (1 - mean) / std) whatever the input kind (--mean/--std normalise every kind), or [0, 1] without them for
    images and uint8 arrays ("pixels"), whose range is known; the inputs' kind is asked for only then (a dataset
    source is not scanned for nothing); --constant and --input-shape go to the explainer's BuildOptions; click's option
    dict is read, never changed."""
    from onnx_lrp.cli.options import explainer_setup

    asked = []

    def kind(answer="npy"):
        def ask():
            asked.append(answer)
            return answer
        return ask

    kw = dict(mean="0.5", std="0.25", size=None, crop=False, constants=("sr=16000",),
              input_shapes=("image=1x1x16x16",), epsilon=None, gamma=None, low=None, high=None, alpha=None,
              beta=None, stabilizer=None, composite="epsilon-gamma-box", start="one-hot", output_name="logits")
    given = dict(kw)
    s = explainer_setup(str(DIGITS), kw, data_kind=kind("npy"))
    assert asked == [] and kw == given and "from --mean/--std" in s.zbox_note and s.bounds_from == "mean/std"
    assert s.run.start == "one-hot" and s.build.output == "logits" and s.build.input_shapes == {"image": (1, 1, 16, 16)}
    np.testing.assert_array_equal(s.params["low"].ravel(), [-2.0])
    np.testing.assert_array_equal(s.params["high"].ravel(), [2.0])
    b = s.bindings()
    assert sorted(b) == ["constants", "input_shapes"] and b["input_shapes"] == {"image": (1, 1, 16, 16)}
    assert int(b["constants"]["sr"]) == 16000 and s.composite.name == "epsilon-gamma-box"
    for composite, given in (("epsilon-plus-flat", {}), ("epsilon-gamma-box", {"low": "0", "high": "1"})):
        s = explainer_setup(str(DIGITS), dict(given, composite=composite), data_kind=kind("image"))
        assert asked == [] and s.zbox_note is None and s.bindings() == {}
    for known in ("image", "pixels"):
        s = explainer_setup(str(DIGITS), {"composite": "epsilon-gamma-box"}, data_kind=kind(known))
        assert s.bounds_from == "pixels" and "for pixels in [0, 1]" in s.zbox_note
        np.testing.assert_array_equal(np.ravel([s.params["low"], s.params["high"]]), [0.0, 1.0])
    s = explainer_setup(str(DIGITS), {"composite": "epsilon-gamma-box"}, data_kind="npy")
    assert "low" not in s.params and s.zbox_note is None and asked == ["image", "pixels"]


def test_progress_bar_only_when_it_takes_long(tmp_path, monkeypatch):
    from onnx_lrp.cli import explain as explain_module

    args = ["explain", str(DIGITS), str(SAMPLES / "png"), "--batch-size", "4", "-o", str(tmp_path / "r.npz")]
    quick = CliRunner().invoke(main, args)
    assert quick.exit_code == 0 and "explaining" not in quick.stderr
    monkeypatch.setattr(explain_module, "PROGRESS_AFTER_S", -1.0)  # as if every batch took long
    slow = CliRunner().invoke(main, args)
    assert slow.exit_code == 0 and "explaining" in slow.stderr and "explaining" not in slow.stdout
    with np.load(tmp_path / "r.npz") as z:  # 3 runs of 4, 4 and 2 items give the same as one run
        close(z["relevance"], api().explain(np.load(SAMPLES / "batch.npy")).relevance)


# ------------------------------------------------------------------------------------------- demo model
def test_shipped_model_accuracy_matches_the_readmes():
    meta = json.loads((MODELS / "digits_cnn.json").read_text())
    with np.load(MODELS / "digits_heldout.npz") as z:
        x, y = z["images"].astype(np.float32) / 255, z["labels"]
    sess = ort.InferenceSession(str(DIGITS), providers=["CPUExecutionProvider"])
    logits, probs = sess.run(["logits", "probabilities"], {"image": x})
    correct = int((logits.argmax(1) == y).sum())
    assert (correct, len(y)) == (meta["heldout_correct"], meta["heldout_total"]) and correct / len(y) > 0.95
    np.testing.assert_allclose(probs.sum(1), 1, rtol=1e-5)
    stated = f"{correct}/{len(y)}"
    assert stated in (MODELS / "README.md").read_text() and stated in (ROOT / "README.md").read_text()
    assert DIGITS.stat().st_size < 500_000
    assert {o.domain for o in onnx.load(DIGITS).opset_import} <= {"", "ai.onnx"}
    assert onnx.load(DIGITS).opset_import[0].version == 17
    # the shipped samples are held-out images the model classifies correctly, PNG and .npy alike
    batch = np.load(SAMPLES / "batch.npy")
    assert sess.run(["logits"], {"image": batch})[0].argmax(1).tolist() == list(range(10))
    for k in range(10):
        png = np.asarray(Image.open(SAMPLES / "png" / f"digit_{k}.png"), np.float32) / 255
        np.testing.assert_array_equal(png[None], np.load(SAMPLES / "npy" / f"digit_{k}.npy"))
        np.testing.assert_array_equal(batch[k], png[None])


# ------------------------------------------------------------------------------------------- honesty (issue 9)
def test_custom_op_of_unknown_type_is_listed_not_silently_cut(tmp_path):
    """Before: shape inference gave the custom op's output no type, the path was cut, `inspect` said all
    supported (exit 0) and `explain` returned zeros. Now the op is on the path and listed (exit 1 / exit 2)."""
    path = _digits(tmp_path, _custom_op)
    p = CliRunner().invoke(main, ["inspect", str(path)])
    assert p.exit_code == 1, p.output
    row = next(line for line in p.stdout.splitlines() if line.startswith("/features/features.2/Relu"))
    assert row.split()[1] == "Foo" and "UNSUPPORTED" in row.split() and "(no handler for this op)" in row, row


def test_relevance_at_a_graph_input_is_its_relevance(tmp_path):
    """--relevance-at naming a graph input: the input's own relevance (before: a duplicate output name that
    onnxruntime refused)."""
    out = tmp_path / "r.npz"
    CliRunner().invoke(main, ["explain", str(DIGITS), str(SAMPLES / "batch.npy"), "--relevance-at", "image", "-o",
                              str(out)], catch_exceptions=False)
    with np.load(out, allow_pickle=False) as z:
        np.testing.assert_array_equal(z["relevance_at/image"], z["relevance"])
        assert np.abs(z["relevance"]).sum() > 0
