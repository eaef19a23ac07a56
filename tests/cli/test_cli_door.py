"""The command line's front door (issue 27): what a user types first and what they get back.

* ``inspect`` shows the model's inputs and outputs (checked against the ONNX file read with the onnx package) and
  an ``explain`` command that runs as printed;
* preprocessing applies to every input kind by one rule (checked against numpy: (x - mean) / std, pixels / 255)
  or is refused in one line; the box-rule bounds follow from --mean/--std (checked against the API given the
  bounds computed by hand);
* outputs land in the current directory, never beside the inputs; messages name the fix;
* the exit-code contract: 1 for a result that fails a check (--strict), 2 for bad input;
* every subcommand's help fits 60 lines and shows an example.
"""
from __future__ import annotations

import json
import os
import shlex
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from util import ROOT, assert_close, explain, make_model, node, to_bytes

import onnx_lrp
from onnx_lrp.cli.main import COMMANDS, main
from onnx_lrp.core.errors import LrpWarning
from onnx_lrp.rules.composite import builtin_names

DIGITS = ROOT / "models" / "digits_cnn.onnx"
SAMPLES = ROOT / "models" / "samples"
X = np.load(SAMPLES / "batch.npy")  # [10, 1, 16, 16] in [0, 1]; the PNGs hold exactly X * 255
FLAT = "epsilon-plus-flat"  # what the CLI's composite "auto" gives the digits CNN


def cli(*args, cwd=None):
    """The command in-process (click's runner: stdout and stderr apart), from ``cwd``."""
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        return CliRunner().invoke(main, [str(a) for a in args])
    finally:
        os.chdir(old)


def one_line_error(r, code: int = 2) -> str:
    assert r.exit_code == code, (r.exit_code, r.output, r.stderr)
    errors = [line for line in r.stderr.splitlines() if line.startswith("onnx-lrp: error: ")]
    assert len(errors) == 1 and r.stderr.endswith(errors[0] + "\n"), r.stderr  # notes may come before it
    return errors[0]


def close(a, b):
    assert_close(a, b, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------- inspect (point 3)
def test_inspect_prints_the_interface_and_a_command_that_runs(tmp_path):
    proto = onnx.load(str(DIGITS))

    def described(v):  # the independent reading: the onnx package's own
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim]
        return dict(name=v.name, dims=dims,
                    dtype=str(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)))

    r = cli("inspect", DIGITS)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    at = lines.index("inputs:")
    assert lines[at + 1].split() == ["image", "float32", "[batch,", "1,", "16,", "16]"]
    assert lines[at + 2] == "outputs:" and [x.split()[0] for x in lines[at + 3:at + 5]] == ["logits", "probabilities"]
    j = json.loads(cli("inspect", DIGITS, "--json").stdout)
    assert j["inputs"] == [described(v) for v in proto.graph.input]
    assert j["outputs"] == [described(v) for v in proto.graph.output]
    command = j["suggested"]["command"]
    assert f"explain it: {command}" in lines
    # the suggested command runs as printed once its placeholder is filled in, and writes here
    args = shlex.split(command.replace("IMAGE.png", str(SAMPLES / "png" / "digit_3.png")))
    assert args[:3] == ["onnx-lrp", "explain", str(DIGITS)]
    r = cli(*args[1:], cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits_cnn.heat.png", "digits_cnn.relevance.npy"]
    close(np.load(tmp_path / "digits_cnn.relevance.npy"), explain(DIGITS, X[3:4], FLAT).relevance)


def test_inspect_suggests_an_npz_for_several_inputs_and_text_for_token_ids(tmp_path):
    rng = np.random.default_rng(0)
    two = make_model([node("Concat", ["a", "b"], "ab", axis=1), node("Gemm", ["ab", "w"], "y")],
                     {"a": ["N", 4], "b": ["N", 3]}, ["y"], {"w": rng.normal(size=(7, 3)).astype(np.float32)})
    (tmp_path / "two.onnx").write_bytes(to_bytes(two))
    j = json.loads(cli("inspect", tmp_path / "two.onnx", "--json").stdout)
    assert [(v["name"], v["dims"], v["dtype"]) for v in j["inputs"]] == [("a", ["N", 4], "float32"),
                                                                         ("b", ["N", 3], "float32")]
    assert "INPUTS.npz" in j["suggested"]["command"] and "named a, b" in j["suggested"]["note"]
    np.savez(tmp_path / "in.npz", a=np.ones((2, 4), np.float32), b=np.ones((2, 3), np.float32))
    args = shlex.split(j["suggested"]["command"].replace("INPUTS.npz", str(tmp_path / "in.npz")))
    assert cli(*args[1:], cwd=tmp_path).exit_code == 0 and (tmp_path / "two.relevance.npz").exists()
    emb = rng.normal(size=(11, 4)).astype(np.float32)
    lm = make_model([node("Gather", ["emb", "input_ids"], "e"), node("MatMul", ["e", "w"], "logits")],
                    {"input_ids": (["batch", "sequence"], np.int64)}, ["logits"],
                    {"emb": emb, "w": rng.normal(size=(4, 11)).astype(np.float32)})
    (tmp_path / "lm.onnx").write_bytes(to_bytes(lm))
    r = cli("inspect", tmp_path / "lm.onnx", "-c", "attnlrp")
    assert "  input_ids  int64    [batch, sequence]" in r.stdout
    assert "--text TEXT --tokenizer TOKENIZER.json" in r.stdout  # none beside the model: a placeholder


# ------------------------------------------------------------------------------------------- preprocessing (point 4)
def test_mean_std_normalise_arrays_as_they_do_images(tmp_path):
    mean, std = 0.25, 0.5
    want = explain(DIGITS, (X - mean) / std, FLAT).relevance  # numpy's normalisation, explained through the API
    for inputs in (SAMPLES / "batch.npy", SAMPLES / "png"):
        r = cli("explain", DIGITS, inputs, "--mean", mean, "--std", std, "-o", tmp_path / "r.npz")
        assert r.exit_code == 0, r.output
        with np.load(tmp_path / "r.npz") as z:
            close(z["relevance"], want)
    # uint8 arrays are 8-bit pixels, divided by 255 as PNGs are (and said so)
    np.save(tmp_path / "u8.npy", np.round(X * 255).astype(np.uint8))
    r = cli("explain", DIGITS, tmp_path / "u8.npy", "--mean", mean, "--std", std, "-o", tmp_path / "u.npy")
    assert r.exit_code == 0 and "uint8 values read as 8-bit pixels and divided by 255" in r.stderr
    close(np.load(tmp_path / "u.npy"), want)
    # an array normalised already, normalised again: warned (no box rule needs its range here)
    np.save(tmp_path / "normed.npy", (X - mean) / std)
    r = cli("explain", DIGITS, tmp_path / "normed.npy", "--mean", mean, "--std", std, "-o", tmp_path / "n.npy")
    assert r.exit_code == 0 and "warning: " in r.stderr and "normalised already" in r.stderr


def test_box_bounds_follow_from_mean_std_for_every_kind(tmp_path):
    mean, std = np.array([0.25]), np.array([0.5])
    low, high = (0 - mean) / std, (1 - mean) / std  # the pixel range [0, 1], normalised
    want = explain(DIGITS, (X - mean[0]) / std[0], "epsilon-gamma-box", box=(low[0], high[0])).relevance
    for inputs in (SAMPLES / "batch.npy", SAMPLES / "png"):
        r = cli("explain", DIGITS, inputs, "-c", "epsilon-gamma-box", "--mean", 0.25, "--std", 0.5, "-o",
                tmp_path / "r.npz")
        assert r.exit_code == 0, r.output
        assert "ZBox bounds from --mean/--std: low [-0.5], high [1.5]" in r.stderr
        with np.load(tmp_path / "r.npz") as z:
            close(z["relevance"], want)
    # an array of unknown range: refused, the hint names --mean/--std and the formula, not low=0, high=1
    msg = one_line_error(cli("explain", DIGITS, SAMPLES / "batch.npy", "-c", "epsilon-gamma-box"))
    assert "--mean/--std" in msg and "low = (0 - mean) / std" in msg and "low=0.0" not in msg
    # an array normalised already, then given --mean/--std: its values lie outside [0, 1]: refused, not normalised twice
    np.save(tmp_path / "normed.npy", (X - 0.25) / 0.5)
    msg = one_line_error(cli("explain", DIGITS, tmp_path / "normed.npy", "-c", "epsilon-gamma-box", "--mean",
                             0.25, "--std", 0.5, "-o", tmp_path / "n.npy"))
    assert "outside [0, 1]" in msg and "--low/--high" in msg and not (tmp_path / "n.npy").exists()
    # ... with its own range it runs, and equals the bounds given by hand
    r = cli("explain", DIGITS, tmp_path / "normed.npy", "-c", "epsilon-gamma-box", "--low", -0.5, "--high", 1.5,
            "-o", tmp_path / "n.npy")
    assert r.exit_code == 0, r.output
    close(np.load(tmp_path / "n.npy"), want)
    # uint8 arrays have a known range, like images: [0, 1] without --mean/--std
    np.save(tmp_path / "u8.npy", np.round(X * 255).astype(np.uint8))
    r = cli("explain", DIGITS, tmp_path / "u8.npy", "-c", "epsilon-gamma-box", "-o", tmp_path / "u.npy")
    assert r.exit_code == 0 and "ZBox bounds for pixels in [0, 1]" in r.stderr, r.output
    close(np.load(tmp_path / "u.npy"), explain(DIGITS, X, "epsilon-gamma-box", box=(0.0, 1.0)).relevance)


def test_preprocessing_that_cannot_apply_is_refused_in_one_line(tmp_path):
    msg = one_line_error(cli("explain", DIGITS, SAMPLES / "batch.npy", "--size", 16, "-o", tmp_path / "o.npy"))
    assert "--size and --crop resize images" in msg and "drop --size" in msg
    msg = one_line_error(cli("explain", DIGITS, "--text", "hello", "--tokenizer", tmp_path / "t.json", "--mean",
                             0.5))
    assert "--mean cannot be combined with --text" in msg
    msg = one_line_error(cli("explain", DIGITS, SAMPLES / "batch.npy", "--out-dir", tmp_path / "out", "--mean",
                             0.5))
    assert "--mean/--std" in msg and "as they are" in msg
    msg = one_line_error(cli("relmax", "build", DIGITS, SAMPLES / "npy", "--layer", "logits", "--out-dir",
                             tmp_path / "rm", "--std", 2))
    assert "--mean/--std" in msg
    np.save(tmp_path / "i64.npy", np.round(X * 255).astype(np.int64))
    msg = one_line_error(cli("explain", DIGITS, tmp_path / "i64.npy", "-o", tmp_path / "o.npy"))
    assert "dtype int64" in msg and "astype(np.float32)" in msg
    np.save(tmp_path / "u8.npy", np.round(X * 255).astype(np.uint8))  # read as pixels by a single run only
    msg = one_line_error(cli("explain", DIGITS, tmp_path / "u8.npy", "--out-dir", tmp_path / "out"))
    assert "uint8 arrays" in msg and "without --out-dir" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i64.npy", "u8.npy"]


def test_outputs_go_to_the_current_directory_never_beside_the_inputs(tmp_path):
    store, here = tmp_path / "store", tmp_path / "here"
    store.mkdir()
    here.mkdir()
    (store / "m.onnx").write_bytes(DIGITS.read_bytes())
    np.save(store / "x.npy", X[:2])
    (store / "png").mkdir()
    (store / "png" / "d.png").write_bytes((SAMPLES / "png" / "digit_1.png").read_bytes())
    store.chmod(0o555)  # a read-only model store
    try:
        assert cli("explain", store / "m.onnx", store / "x.npy", cwd=here).exit_code == 0
        assert cli("explain", store / "m.onnx", store / "png", cwd=here).exit_code == 0
        r = cli("rewrite", store / "m.onnx", cwd=here)
        assert r.exit_code == 0, r.output
    finally:
        store.chmod(0o755)
    assert sorted(p.name for p in here.iterdir()) == ["m.lrp.onnx", "png.relevance.npz", "x.relevance.npy"]
    assert sorted(p.name for p in store.iterdir()) == ["m.onnx", "png", "x.npy"]
    close(np.load(here / "x.relevance.npy"), explain(DIGITS, X[:2], FLAT).relevance)


# ------------------------------------------------------------------------------------------- messages
def test_messages_name_the_fix(tmp_path):
    msg = one_line_error(cli("explain", SAMPLES / "batch.npy", DIGITS))
    assert "the first argument is the model" in msg
    msg = one_line_error(cli("inspect", SAMPLES / "png" / "digit_1.png"))
    assert "not an ONNX model: the first argument is the model" in msg
    msg = one_line_error(cli("explain", DIGITS, SAMPLES / "png" / "digit_1.png", "--mean", "0.5,0.5,0.5", "-o",
                             tmp_path / "o.npy"))
    assert "--mean has 3 values but the model's input has 1 channel; give one value" in msg
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        msg = one_line_error(cli("explain", DIGITS, SAMPLES / "batch.npy", "--device", "cuda", "-o",
                                 tmp_path / "o.npy"))
        assert "ONNX_LRP_RUNTIME=cuda pip install -e ." in msg and "--device cpu" in msg
    assert list(tmp_path.iterdir()) == []


def test_strict_exits_1_and_bad_input_2(tmp_path):
    """``--strict``: a result that fails a check, exit 1 with nothing written, as the help and docs/exit-codes.md say;
    without it the same run warns and writes (exit 0); bad input stays exit 2."""
    w1 = np.array([[1.0, 0.5, -0.25], [0.5, 1.0, 0.25], [0.25, -0.5, 1.0], [1.0, 1.0, 1.0]], np.float32)
    w2 = np.array([[1.0, -1.0], [0.5, 0.25], [0.25, 1.0]], np.float32)
    mlp = make_model([node("Gemm", ["x", "w1", "b1"], "h"), node("Relu", ["h"], "a"), node("Gemm", ["a", "w2"], "y")],
                     {"x": ["N", 4]}, ["y"], {"w1": w1, "b1": np.full(3, 100.0, np.float32), "w2": w2})
    (tmp_path / "m.onnx").write_bytes(to_bytes(mlp))
    np.save(tmp_path / "x.npy", np.array([[0.5, 0.25, 0.75, 0.125]], np.float32))
    with warnings.catch_warnings():  # the premise: the bias absorbs nearly all relevance (numpy: x w / (x w + b))
        warnings.simplefilter("ignore", LrpWarning)
        res = onnx_lrp.Explainer(str(tmp_path / "m.onnx"), composite="epsilon").explain(np.load(tmp_path / "x.npy"))
    assert res.relevance.sum() < 0.01 * res.explained_value[0]
    args = ["explain", tmp_path / "m.onnx", tmp_path / "x.npy", "-c", "epsilon", "-o", tmp_path / "r.npy"]
    msg = one_line_error(cli(*args, "--strict"), code=1)
    assert "relevance not conserved" in msg and not (tmp_path / "r.npy").exists()
    r = cli(*args)
    assert r.exit_code == 0 and "warning: " in r.stderr and (tmp_path / "r.npy").exists()
    one_line_error(cli(*args, "--strict", "--target", 7), code=2)  # out of range: bad input


# ------------------------------------------------------------------------------------------- help (point 7)
def _commands():
    for name in COMMANDS:
        cmd = main.get_command(None, name)
        subs = getattr(cmd, "commands", {})
        yield [name], cmd
        for sub, c in subs.items():
            yield [name, sub], c


@pytest.mark.parametrize("path,cmd", list(_commands()), ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_every_help_fits_60_lines_with_an_example_and_every_option(path, cmd):
    r = CliRunner().invoke(main, [*path, "--help"], terminal_width=80)
    assert r.exit_code == 0, r.output
    text = r.stdout
    lines = text.rstrip("\n").splitlines()
    assert len(lines) <= 60, f"{' '.join(path)} --help: {len(lines)} lines"
    assert max(map(len, lines)) <= 80
    if not getattr(cmd, "commands", None):  # a group lists its commands; its commands show the examples
        assert "Examples:" in text and f"  onnx-lrp {' '.join(path)} " in text, text
    # every option is still there, by name, and the composite list is not repeated (`onnx-lrp composites` has it)
    for p in cmd.params:
        for opt in getattr(p, "opts", []):
            if opt.startswith("--"):
                assert opt in text, (path, opt)
    assert sum(n in text for n in builtin_names()) <= 2, text
