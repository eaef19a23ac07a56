"""Every file the tool reads is validated before use (issue 37, items 4-6 and 8): malformed baselines, manifests,
RelMax results, labels and config files, environment variables, archives that inflate beyond a cap, texts longer
than the model's positions, control characters in output names, bad masks and a forward pass made non-finite by the
input: each refused in one line with exit 2 (InputError), never exit 3, never a traceback, no input file changed.

The last test is the property test: every command, each of its file arguments, fed a set of malformed files."""
from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import onnx_lrp
from onnx_lrp import regression as rg
from onnx_lrp.cli.main import main
from onnx_lrp.core.errors import InputError, NumericError

from util import ROOT  # noqa: E402
DIGITS = ROOT / "models" / "digits_cnn.onnx"
TEXT = ROOT / "models" / "text"
LAYER = "/features/features.6/Conv_output_0"
RNG = np.random.default_rng(37)
X = RNG.random((2, 1, 16, 16)).astype(np.float32)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Every command runs in its own folder: default outputs (e.g. ``MODEL.tokens.html``) never land in the repo."""
    monkeypatch.chdir(tmp_path)


def invoke(*args, env=None):
    """(exit code, stdout, stderr) of the command line run in this process."""
    r = CliRunner().invoke(main, [str(a) for a in args], env=env)
    return r.exit_code, r.stdout, r.stderr


def refused(code, err, *words):
    """Exit 2 with one line on stderr that says ``words``, no traceback."""
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("onnx-lrp: error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def digests(folder: Path) -> dict:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """A valid snapshot of the digits model on two items (made once), and its arrays."""
    d = tmp_path_factory.mktemp("base")
    np.save(d / "x.npy", X)
    code, _, err = invoke("snapshot", DIGITS, d / "x.npy", "-o", d / "base.npz")
    assert code == 0, err
    with np.load(d / "base.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return d / "base.npz", arrays


def _with_meta(arrays: dict, path: Path, **change) -> Path:
    meta = json.loads(str(arrays["meta"]))
    meta.update(change)
    np.savez(path, **dict(arrays, meta=np.array(json.dumps(meta))))
    return path


# ---------------------------------------------------------------------------------------------- 1. baselines
@pytest.mark.parametrize("change, words", [
    (dict(format_version="abc"), "format_version is a string"),
    (dict(items=5), "items is an integer"),
    (dict(items=None), "items is null"),
    (dict(composite="epsilon"), "composite is a string ('epsilon'); give a mapping"),
    (dict(batch_size=-5), "batch_size is -5; give an integer >= 1"),
    (dict(explained_output=["logits"]), "explained_output is a list"),
    (dict(model=[1]), "model is a list"),
])
def test_a_baseline_with_a_malformed_field_is_refused_naming_it(tmp_path, baseline, change, words):
    path, arrays = baseline
    bad = _with_meta(arrays, tmp_path / "bad.npz", **change)
    with pytest.raises(InputError, match="baseline"):
        rg.read_snapshot(bad)
    before = digests(tmp_path)
    refused(*invoke("check", DIGITS, bad)[::2], words, str(bad))
    assert digests(tmp_path) == before


def test_a_baseline_whose_params_or_meta_or_targets_are_the_wrong_kind_is_refused(tmp_path, baseline):
    _, arrays = baseline
    meta = json.loads(str(arrays["meta"]))
    comp = dict(meta["composite"], params=[1, 2])
    refused(*invoke("check", DIGITS, _with_meta(arrays, tmp_path / "p.npz", composite=comp))[::2],
            "composite.params is a list")
    np.savez(tmp_path / "m.npz", **dict(arrays, meta=np.array(json.dumps([meta]))))
    refused(*invoke("check", DIGITS, tmp_path / "m.npz")[::2], "its metadata is a list")
    np.savez(tmp_path / "t.npz", **dict(arrays, targets=np.array(["a", "b"])))
    refused(*invoke("check", DIGITS, tmp_path / "t.npz")[::2], "targets is <U1")
    np.savez(tmp_path / "d.npz", **dict(arrays, meta=np.array("[" * 50000 + "]" * 50000)))
    refused(*invoke("check", DIGITS, tmp_path / "d.npz")[::2], "nested too deeply")


def test_the_valid_baseline_still_checks(baseline):
    """The oracle for the refusals above: the unchanged file passes."""
    path, _ = baseline
    code, out, err = invoke("check", DIGITS, path)
    assert code == 0, err


# ---------------------------------------------------------------------------------------------- 1. manifests
def _dataset_run(tmp_path) -> Path:
    np.save(tmp_path / "x.npy", X)
    out = tmp_path / "out"
    code, _, err = invoke("explain", DIGITS, tmp_path / "x.npy", "--out-dir", out, "--shard-size", "1")
    assert code == 0, err
    return out


def test_a_malformed_manifest_is_refused_in_one_line(tmp_path):
    from onnx_lrp.dataset import read_shards

    out = _dataset_run(tmp_path)
    good = json.loads((out / "manifest.json").read_text())
    assert len(read_shards(out)["items"]) == 2  # the oracle: the written manifest reads
    rec = good["shards"][0]
    cases = [([good], "manifest .* is a list"),
             (dict(good, shards=[1, 2]), r"shards\[0\] is an integer"),
             (dict(good, shards=[{k: v for k, v in rec.items() if k != "file"}]), r"shards\[0\] lacks 'file'"),
             (dict(good, shards=[dict(rec, index="0")]), r"shards\[0\].index is a string"),
             (dict(good, shards=[dict(rec, file="../../../../etc/passwd")]), "points outside"),
             (dict(good, shards=[dict(rec, file=str((tmp_path / "x.npy").resolve()))]), "points outside")]
    args = ["explain", DIGITS, tmp_path / "x.npy", "--out-dir", out, "--shard-size", "1"]
    for data, words in cases:
        (out / "manifest.json").write_text(json.dumps(data))
        with pytest.raises(InputError, match=words):
            read_shards(out)
        before = digests(tmp_path)
        code, _, err = invoke(*args)
        line = refused(code, err)
        assert __import__("re").search(words, line), (words, line)
        assert digests(tmp_path) == before


# ---------------------------------------------------------------------------------------------- 1. relmax
def test_a_malformed_relmax_result_is_refused(tmp_path):
    np.save(tmp_path / "x.npy", X)
    out = tmp_path / "rm"
    build = ["relmax", "build", DIGITS, tmp_path / "x.npy", "--layer", LAYER, "--out-dir", out, "--samples", "2"]
    code, _, err = invoke(*build)
    assert code == 0, err
    show = ["relmax", "show", DIGITS, tmp_path / "x.npy", "--out-dir", out, "--channels", "0"]
    assert invoke(*show)[0] == 0  # the oracle: the written result shows
    good = (out / "relmax.json").read_text()
    for text, words in (("[1, 2]", "is a list"), (good[:len(good) // 2], "not valid JSON"),
                        (b"\xff\xfe{", "not UTF-8"), ("[" * 50000 + "]" * 50000, "nested too deeply")):
        (out / "relmax.json").write_bytes(text if isinstance(text, bytes) else text.encode())
        refused(*invoke(*build)[::2], "relmax.json", words)
    (out / "relmax.npz").write_bytes(b"PK\x03\x04garbage" + bytes(range(200)))
    refused(*invoke(*show)[::2], "relmax.npz")
    np.savez(out / "relmax.npz", indices=np.zeros((2, 3)), scores=np.zeros((2, 3)), rf=np.zeros((2, 3), int),
             layer=np.array(LAYER))
    refused(*invoke(*show)[::2], "not a consistent RelMax result")


# ---------------------------------------------------------------------------------------------- 1. labels, config
def test_labels_and_config_json_deeply_nested_or_not_utf8_are_refused(tmp_path):
    from onnx_lrp.io.text_inputs import read_labels

    deep = "[" * 50000 + "]" * 50000
    for name, data, words in (("l.json", deep.encode(), "nested too deeply"), ("l.json", b"\xff[1]", "not UTF-8"),
                              ("l.txt", b"neg\n\xffpos\n", "not UTF-8")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(InputError, match=words):
            read_labels(tmp_path / name)
    (tmp_path / "ok.json").write_text(json.dumps(["neg", "pos"]))
    assert read_labels(tmp_path / "ok.json") == {0: "neg", 1: "pos"}  # the oracle: a good file reads
    folder = tmp_path / "m"
    folder.mkdir()
    import onnx

    model = onnx.load(TEXT / "sentiment.onnx")
    del model.metadata_props[:]  # no id2label of its own: the config.json beside it is read
    onnx.save(model, folder / "sentiment.onnx")
    (folder / "tokenizer.json").write_bytes((TEXT / "tokenizer.json").read_bytes())
    (folder / "config.json").write_text(json.dumps({"id2label": {"0": "NEG", "1": "POS"}}))
    code, out, err = invoke("explain", folder / "sentiment.onnx", "--text", "good", "--json")
    assert code == 0 and "NEG" in out or "POS" in out, (code, err)  # the oracle: a good config.json names them
    for data, words in ((deep.encode(), "nested too deeply"), (b"\xff{}", "not UTF-8")):
        (folder / "config.json").write_bytes(data)
        before = digests(tmp_path)
        refused(*invoke("explain", folder / "sentiment.onnx", "--text", "good")[::2], "config.json", words)
        assert digests(tmp_path) == before


def test_a_deeply_nested_check_config_is_refused(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[check]\nmin_cosine = " + "[" * 50000 + "]" * 50000)
    with pytest.raises(InputError, match="nested too deeply"):
        rg.load_thresholds(p)
    p.write_bytes(b"[check]\nmin_cosine = 0.9\n")
    assert rg.load_thresholds(p)[0].min_cosine == 0.9
    deep = tmp_path / "deep.toml"  # a composite file too: one line, not a RecursionError (exit 3)
    deep.write_text("a = " + "[" * 50000 + "]" * 50000)
    refused(*invoke("composites", deep)[::2], "nested too deeply")
    refused(*invoke("inspect", DIGITS, "-c", deep)[::2], "nested too deeply")
    refused(*invoke("check", DIGITS, deep, "--config", deep)[::2], "nested too deeply")


# ---------------------------------------------------------------------------------------------- 2. environment
@pytest.mark.parametrize("value", ["abc", "1.5", "", "-1", "100000", "2 3"])
def test_onnx_lrp_threads_is_range_checked(tmp_path, value):
    np.save(tmp_path / "x.npy", X)
    code, _, err = invoke("explain", DIGITS, tmp_path / "x.npy", "-o", tmp_path / "r.npy",
                          env={"ONNX_LRP_THREADS": value})
    refused(code, err, "ONNX_LRP_THREADS")
    assert not (tmp_path / "r.npy").exists()


def test_onnx_lrp_threads_in_range_runs(tmp_path):
    from onnx_lrp.core.validate import max_threads

    np.save(tmp_path / "x.npy", X)
    want = onnx_lrp.Explainer(str(DIGITS)).explain(X).relevance
    for value in ("1", str(max_threads()), " 2 "):
        code, _, err = invoke("explain", DIGITS, tmp_path / "x.npy", "-o", tmp_path / "r.npy",
                              env={"ONNX_LRP_THREADS": value})
        assert code == 0, err
        np.testing.assert_allclose(np.load(tmp_path / "r.npy"), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="threads is 100000"):
        onnx_lrp.Explainer(str(DIGITS), threads=100000).explain(X)


def test_every_environment_variable_read_is_known():
    """A new os.environ read in the package must be added to this list (and validated, or a plain flag)."""
    import re

    found = set()
    for base in (ROOT / "onnx_lrp", ROOT / "cli", ROOT / "rules"):
        for p in base.rglob("*.py"):
            found |= set(re.findall(r"environ(?:\.get)?\(?\[?[\"']([A-Z_]+)", p.read_text(encoding="utf-8")))
            found |= set(re.findall(r"env_int\(\s*[\"']([A-Z_]+)", p.read_text(encoding="utf-8")))
            found |= set(re.findall(r"_VARIABLE = [\"']([A-Z_]+)", p.read_text(encoding="utf-8")))
    # the first two are range-checked integers (env_int); NO_COLOR and ONNX_LRP_DEBUG are flags: set or not
    assert found == {"ONNX_LRP_THREADS", "ONNX_LRP_MAX_ARRAY_BYTES", "NO_COLOR", "ONNX_LRP_DEBUG"}, found


# ---------------------------------------------------------------------------------------------- 3. archive caps
def _bomb(path: Path, shape=(64, 1024, 1024)) -> Path:
    """A .npz whose one member declares ``shape`` float32 (256 MiB) but is stored compressed in a few KiB: only the
    header is written, then zeros streamed (never the whole array in memory)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("x.npy", "w", force_zip64=True) as f:
            f.write(header.getvalue())
            chunk = bytes(1 << 20)
            for _ in range(int(np.prod(shape)) * 4 // len(chunk)):
                f.write(chunk)
    return path


def test_an_npz_that_inflates_beyond_the_cap_is_refused_before_inflating(tmp_path):
    bomb = _bomb(tmp_path / "bomb.npz")
    assert bomb.stat().st_size < 2 ** 20  # small on disk, 256 MiB inflated
    cap = {"ONNX_LRP_MAX_ARRAY_BYTES": str(2 ** 20)}
    line = refused(*invoke("explain", DIGITS, bomb, env=cap)[::2], "256.0 MiB", "1.0 MiB", str(bomb))
    assert "batch-size" not in line
    refused(*invoke("check", DIGITS, bomb, env=cap)[::2], "256.0 MiB", "cap")
    big = tmp_path / "big.npy"  # a .npy whose header declares more than the cap: refused before reading
    with open(big, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (1, 1, 1024, 1024)})
        f.write(bytes(4 << 20))
    refused(*invoke("explain", DIGITS, big, env=cap)[::2], "4.0 MiB", "1.0 MiB")
    for bad in ("abc", "0", "-1"):
        refused(*invoke("explain", DIGITS, big, env={"ONNX_LRP_MAX_ARRAY_BYTES": bad})[::2],
                "ONNX_LRP_MAX_ARRAY_BYTES")


def test_an_image_size_beyond_the_cap_is_refused(tmp_path):
    png = ROOT / "models" / "samples" / "png"
    image = sorted(png.iterdir())[0]
    cap = {"ONNX_LRP_MAX_ARRAY_BYTES": str(2 ** 20)}
    refused(*invoke("explain", DIGITS, image, "--size", "16384", env=cap)[::2], "16384x16384", "1.0 MiB")
    from onnx_lrp.core.validate import array_cap

    refused(*invoke("explain", DIGITS, image, "--size", "16384")[::2], "16384x16384") \
        if 16384 ** 2 * 3 * 4 > array_cap() else None
    code, _, err = invoke("explain", DIGITS, image, "-o", tmp_path / "r.npy", env=cap)  # 16 x 16: within it
    assert code == 0, err


# ---------------------------------------------------------------------------------------------- 4. text length
def test_a_text_longer_than_the_models_positions_says_both_lengths(tmp_path):
    from onnx_lrp.io.text import position_limit
    import onnx

    model = onnx.load(TEXT / "sentiment.onnx")
    rows = next(i.dims[0] for i in model.graph.initializer if i.name == "encoder.pos.weight")
    ex = onnx_lrp.Explainer(str(TEXT / "sentiment.onnx"), composite="attnlrp")
    assert position_limit(ex) == (rows, "encoder.pos.weight")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TEXT / "tokenizer.json"))
    words = ["good"] * 200
    n = len(tok.encode(" ".join(words)).ids)
    assert n > rows
    with pytest.raises(InputError, match=fr"the text has {n} tokens, more than the model's {rows} positions"):
        ex.explain_text(" ".join(words), TEXT / "tokenizer.json")
    refused(*invoke("explain", TEXT / "sentiment.onnx", "--text", " ".join(words))[::2], f"{n} tokens",
            f"{rows} positions", f"by {n - rows} token")
    fits = " ".join(["good"] * 3)
    assert len(tok.encode(fits).ids) <= rows
    assert ex.explain_text(fits, TEXT / "tokenizer.json").relevance.shape == (len(tok.encode(fits).ids),)


# ---------------------------------------------------------------------------------------------- 5. names
@pytest.mark.parametrize("option, name", [("--heatmap", "a\nb.png"), ("--heatmap", "t\x1b]0;owned\x07.png"),
                                          ("--heatmap-dir", "maps\ndir"), ("-o", "r\r.npy")])
def test_a_file_name_with_a_control_character_is_refused_before_any_work(tmp_path, baseline, option, name):
    path, _ = baseline
    np.save(tmp_path / "x.npy", X)
    args = ["check", DIGITS, path] if option == "--heatmap-dir" else ["explain", DIGITS, tmp_path / "x.npy"]
    before = set(tmp_path.iterdir())
    refused(*invoke(*args, option, tmp_path / name)[::2], option, "control character")
    refused(*invoke(*args, f"{option}={tmp_path / name}")[::2], "control character") if option != "-o" else None
    assert set(tmp_path.iterdir()) == before  # nothing written


# ---------------------------------------------------------------------------------------------- 6. masks, numbers
@pytest.mark.parametrize("mask, words", [(np.full((1, 16, 16), np.nan, np.float32), "NaN"),
                                         (np.full((1, 16, 16), "1"), "dtype <U1"),
                                         (np.array(1.0), "0-d")])
def test_a_bad_relevance_mass_mask_is_refused(tmp_path, mask, words):
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "m.npy", mask)
    code, out, err = invoke("evaluate", DIGITS, tmp_path / "x.npy", "-m", "relevance-mass", "--mask",
                            tmp_path / "m.npy")
    refused(code, err, words)
    assert "inside the mask" not in out


def test_a_good_mask_gives_the_share_inside(tmp_path):
    """The oracle for the refusals: relevance mass = sum(R inside) / sum(R) (Arras et al.), by hand."""
    mask = np.zeros((1, 16, 16), np.float32)
    mask[:, :8] = 1
    from onnx_lrp.metrics import evaluate

    ev = evaluate(str(DIGITS), X, metric="relevance-mass", mask=mask)
    r = onnx_lrp.Explainer(str(DIGITS), composite="epsilon-plus-flat").explain(X).relevance.astype(np.float64)
    want = (r * mask[None]).reshape(2, -1).sum(1) / r.reshape(2, -1).sum(1)  # a common scale cancels
    np.testing.assert_allclose(ev.scores["mass"], want, rtol=1e-4, atol=1e-6)


def test_no_numpy_warning_before_the_one_line_message(tmp_path):
    np.save(tmp_path / "x.npy", X)
    code, _, err = invoke("evaluate", DIGITS, tmp_path / "x.npy", "--epsilon", "1e308")
    refused(code, err, "--epsilon", "float32")
    code, _, err = invoke("explain", DIGITS, tmp_path / "x.npy", "--epsilon", "3.4e38", "-o", tmp_path / "r.npy")
    assert "RuntimeWarning" not in err and code in (0, 1), err


def _nan_model(path: Path) -> Path:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(DIGITS)
    for i, t in enumerate(m.graph.initializer):
        a = numpy_helper.to_array(t)
        if a.ndim == 2:
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(np.full_like(a, np.nan), t.name))
            break
    onnx.save(m, path)
    return path


def test_a_non_finite_forward_is_bad_input_exit_2(tmp_path):
    np.save(tmp_path / "big.npy", np.full((1, 1, 16, 16), 3e38, np.float32))
    np.save(tmp_path / "x.npy", X)
    nan = _nan_model(tmp_path / "nan.onnx")
    for args in (("explain", DIGITS, tmp_path / "big.npy"), ("explain", nan, tmp_path / "x.npy"),
                 ("evaluate", nan, tmp_path / "x.npy"),
                 ("evaluate", nan, tmp_path / "x.npy", "-m", "relevance-mass", "--mask", tmp_path / "x.npy")):
        before = digests(tmp_path)
        code, _, err = invoke(*args)
        refused(code, err, "the forward pass is already non-finite at node")
        assert "Warning" not in err
        assert digests(tmp_path) == before
    with pytest.raises(InputError, match="already non-finite at node /features/features.0/Conv") as err:
        onnx_lrp.Explainer(str(DIGITS)).explain(np.full((1, 1, 16, 16), 3e38, np.float32))
    assert not isinstance(err.value, NumericError)


# ---------------------------------------------------------------------------------------------- 7. the property
PNG = (ROOT / "models" / "samples" / "png").iterdir().__next__().read_bytes()
DEEP = b"[" * 100000 + b"]" * 100000


def _malformed(valid: bytes, suffix: str) -> dict:
    """Malformed versions of a file whose valid content is ``valid``: empty, random bytes, truncated, another kind
    of valid file (a PNG; a model where a PNG goes), a JSON list, a deeply nested JSON (TOML), invalid UTF-8."""
    rng = np.random.default_rng(len(valid))
    return {"empty": b"", "random": b"\x01" + rng.integers(0, 256, 300, dtype=np.uint8).tobytes(),
            "truncated": valid[:max(1, len(valid) // 2)], "other-kind": DIGITS.read_bytes() if suffix == ".png"
            else PNG, "json-list": b"[1, 2, 3]",
            "deep": b"a = " + DEEP if suffix == ".toml" else DEEP, "not-utf8": b"\xff\xfe\xfd{\x80"}


def _slots(base: Path) -> list:
    """(command line with a FILE placeholder, the placeholder's suffix, its valid content): every command's every
    file argument / option that is read."""
    M, x, b = DIGITS, base / "x.npy", base / "base.npz"
    model, npy, toml = DIGITS.read_bytes(), x.read_bytes(), b"[[rules]]\nmatch = \"*\"\nrule = \"epsilon\"\n"
    lay = ["--layer", LAYER]
    return [
        (["explain", "F", x], ".onnx", model), (["explain", M, "F"], ".npy", npy),
        (["explain", M, "F"], ".npz", b.read_bytes()), (["explain", M, "F"], ".png", PNG),
        (["explain", M, x, "-c", "F"], ".toml", toml),
        (["explain", TEXT / "sentiment.onnx", "--text", "good", "--tokenizer", "F"], ".json",
         (TEXT / "tokenizer.json").read_bytes()),
        (["explain", TEXT / "sentiment.onnx", "--text", "good", "--labels", "F"], ".json", b'["neg", "pos"]'),
        (["trace", "F", x], ".onnx", model), (["trace", M, "F"], ".npy", npy),
        (["inspect", "F"], ".onnx", model), (["inspect", M, "-c", "F"], ".toml", toml),
        (["rewrite", "F", "-o", base / "out.onnx"], ".onnx", model),
        (["evaluate", "F", x], ".onnx", model), (["evaluate", M, "F"], ".npy", npy),
        (["evaluate", M, x, "-m", "relevance-mass", "--mask", "F"], ".npy", npy),
        (["snapshot", "F", x, "-o", base / "s.npz"], ".onnx", model),
        (["snapshot", M, "F", "-o", base / "s.npz"], ".npy", npy),
        (["check", "F", b], ".onnx", model), (["check", M, "F"], ".npz", b.read_bytes()),
        (["check", M, b, "--config", "F"], ".toml", b"[check]\nmin_cosine = 0.9\n"),
        (["diff", "F", M, x], ".onnx", model), (["diff", M, "F", x], ".onnx", model),
        (["diff", M, M, "F"], ".npy", npy),
        (["concepts", "F", x, *lay], ".onnx", model), (["concepts", M, "F", *lay], ".npy", npy),
        (["concept-graph", "F", x, *lay], ".onnx", model), (["concept-graph", M, "F", *lay], ".npy", npy),
        (["relmax", "build", "F", x, *lay, "--out-dir", base / "rm"], ".onnx", model),
        (["relmax", "build", M, "F", *lay, "--out-dir", base / "rm"], ".npy", npy),
        (["relmax", "build", M, x, *lay, "--out-dir", base / "rm", "--labels", "F"], ".npy",
         _npy_bytes(np.array([1, 2]))),
        (["relmax", "show", "F", x, "--out-dir", base / "rm"], ".onnx", model),
        (["composites", "F"], ".toml", toml),
    ]


def _npy_bytes(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_every_file_argument_of_every_command_refuses_malformed_files_in_one_line(tmp_path, baseline):
    """The property: for each command and each file it reads, every malformed version gives exit 2, one line on
    stderr (no traceback) and leaves every input file as it was."""
    np.save(tmp_path / "x.npy", X)
    (tmp_path / "base.npz").write_bytes(baseline[0].read_bytes())
    failures = []
    for args, suffix, valid in _slots(tmp_path):
        for kind, data in _malformed(valid, suffix).items():
            f = tmp_path / f"bad-{kind}{suffix}"
            f.write_bytes(data)
            before = digests(tmp_path)
            code, _, err = invoke(*[f if a == "F" else a for a in args])
            lines = err.strip().splitlines()
            if code != 2 or len(lines) != 1 or "Traceback" in err or digests(tmp_path) != before:
                failures.append(f"{' '.join(map(str, args))} [{kind}]: exit {code}: {err.strip()[-300:]}")
            f.unlink()
    assert not failures, "\n".join(failures)
