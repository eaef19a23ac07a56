"""What a new user trips over (issue 12): install checks, messages, composite typos, shared input options, lazy imports.

Each test checks behaviour against an independent fact: the pixels of the PNG, the repaired install command, the
node counts of the graph, the modules Python actually loaded.
"""
from __future__ import annotations

import subprocess
import sys
import warnings
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from util import ROOT, assert_close, make_model, node, to_bytes

import onnx_lrp
from onnx_lrp.run import runtime
from onnx_lrp.cli.main import COMMANDS, main
from onnx_lrp.core.errors import DeviceError, LrpWarning, UnsupportedError

DIGITS = ROOT / "models" / "digits_cnn.onnx"
PNG = ROOT / "models" / "samples" / "png"


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


# ------------------------------------------------------------------------------------------- install and devices
def test_broken_onnxruntime_is_named_with_the_repair_command(monkeypatch):
    class Broken:  # what remains of onnxruntime after uninstalling one of two distributions sharing its folder
        __name__ = "onnxruntime"

    monkeypatch.setattr(runtime, "ort", Broken())
    with pytest.raises(DeviceError) as err:
        onnx_lrp.Explainer(str(DIGITS))
    msg = str(err.value)
    assert "SessionOptions" in msg and "pip uninstall -y onnxruntime onnxruntime-gpu" in msg and "\n" not in msg


def test_mixed_install_warns_once_in_one_line(monkeypatch):
    monkeypatch.setattr(runtime, "installed_runtimes", lambda: ["onnxruntime", "onnxruntime-gpu"])
    monkeypatch.setattr(runtime, "_warned_mixed", False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        runtime.check_install()
        runtime.check_install()
    ours = [w for w in seen if issubclass(w.category, LrpWarning)]
    assert len(ours) == 1 and "onnxruntime and onnxruntime-gpu" in str(ours[0].message)


def test_device_auto_falls_back_to_cpu_when_cuda_cannot_start(monkeypatch):
    # onnxruntime (CPU build) claims CUDA here; the session then runs without the CUDA provider
    monkeypatch.setattr(runtime, "available_devices", lambda: ["cpu", "cuda"])
    ex = onnx_lrp.Explainer(str(DIGITS), device="auto")
    assert ex.device == "cpu" and ex.device_note and "CUDA" in ex.device_note
    x = np.load(ROOT / "models" / "samples" / "batch.npy")[:2]
    ref = onnx_lrp.Explainer(str(DIGITS)).explain(x)
    assert_close(ex.explain(x).relevance, ref.relevance, rtol=1e-6, atol=1e-7)
    with pytest.raises(DeviceError):  # asked for explicitly: an error, not a fallback
        onnx_lrp.Explainer(str(DIGITS), device="cuda")


# ------------------------------------------------------------------------------------------- lazy imports, help
def test_help_and_composites_load_no_numpy_onnx_or_onnxruntime():
    code = ("import sys; from onnx_lrp.cli.main import main\n"
            "try:\n    main(['composites'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('numpy', 'onnx', 'onnxruntime', 'onnx_ir') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:] + out.stderr[-500:]
    text = cli("--help").output
    for name in COMMANDS:
        assert f"\n  {name} " in text, name
        assert cli(name, "--help").exit_code == 0
    assert "_ONNX_LRP_COMPLETE" in text


# ------------------------------------------------------------------------------------------- messages
def _attention_model():
    """x [1, 4, 8] -> self-attention (two Softmax heads over MatMuls of activations) -> Gemm: a transformer shape."""
    rng = np.random.default_rng(0)
    w = {k: rng.normal(size=(8, 8)).astype(np.float32) for k in ("wq", "wk", "wq2", "wk2")}
    w["w_out"] = rng.normal(size=(32, 3)).astype(np.float32)
    nodes = []
    for h, (wq, wk) in enumerate((("wq", "wk"), ("wq2", "wk2"))):
        nodes += [node("MatMul", ["x", wq], [f"q{h}"]), node("MatMul", ["x", wk], [f"k{h}"]),
                  node("Transpose", [f"k{h}"], [f"kt{h}"], perm=[0, 2, 1]),
                  node("MatMul", [f"q{h}", f"kt{h}"], [f"s{h}"]), node("Softmax", [f"s{h}"], [f"a{h}"], axis=-1),
                  node("MatMul", [f"a{h}", "x"], [f"o{h}"])]
    nodes += [node("Add", ["o0", "o1"], ["o"]), node("Flatten", ["o"], ["f"], axis=1),
              node("MatMul", ["f", "w_out"], ["y"])]
    return to_bytes(make_model(nodes, {"x": [1, 4, 8]}, ["y"], w))


def test_unsupported_transformer_message_is_grouped_short_and_suggests_attnlrp(tmp_path):
    model = _attention_model()
    with pytest.raises(UnsupportedError) as err:
        onnx_lrp.Explainer(model, composite="epsilon-plus-flat")
    msg = str(err.value)
    assert len(err.value.nodes) == 6  # 2 Softmax + 4 MatMuls of two activations: all listed in .nodes
    assert "2 x Softmax" in msg and "4 x MatMul" in msg and "--composite attnlrp" in msg
    assert 'rule = "pass"' not in msg and "inspect" in msg and len(msg) < 600 and "\n" not in msg
    onnx_lrp.Explainer(model, composite="attnlrp")  # the suggestion works
    assert onnx_lrp.Explainer(model).composite_name == "attnlrp"  # and is the default's choice (auto: softmax)
    path = tmp_path / "attn.onnx"
    path.write_bytes(model)
    r = cli("inspect", path, "--composite", "epsilon-plus-flat")
    assert r.exit_code == 1 and "attnlrp" in r.output
    r = cli("inspect", path)
    assert r.exit_code == 0 and "composite attnlrp (auto: non-ReLU non-linearities (4 x MatMul, 2 x Softmax))" in r.output


def test_inspect_exits_1_on_an_onnxruntime_optimised_model(tmp_path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    opts.log_severity_level = 3
    ort.InferenceSession(str(DIGITS), opts, providers=["CPUExecutionProvider"])
    import onnx
    ops = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    r = cli("inspect", tmp_path / "opt.onnx")
    if not any(n.endswith("nchwc") for n in
               [d.domain for d in onnx.load(str(tmp_path / "opt.onnx")).graph.node]):
        assert r.exit_code == 0, (ops, r.output)  # no NCHWc kernels on this CPU: the model stays supported
    else:
        assert r.exit_code == 1, r.output
        assert "unsupported" in r.output and "NCHWc" in r.output


def test_inspect_prints_whole_names(tmp_path):
    long = "/encoder/layer.11/attention/output/dense/MatMul_with_a_rather_long_exported_name"
    nodes = [node("Relu", ["x"], ["h"], name=long), node("Flatten", ["h"], ["y"], name="flat", axis=1)]
    path = tmp_path / "m.onnx"
    path.write_bytes(to_bytes(make_model(nodes, {"x": [1, 4]}, ["y"])))
    assert long in cli("inspect", path).output
    assert any(line.startswith(long) for line in cli("inspect", path, "--wide").output.splitlines())


def test_composite_typos_refused_and_unmatched_globs_warned(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rules]]\nmatch = { kind = "convolutoin" }\nrule = "zplus"\n[[rules]]\nrule = "epsilon"\n')
    r = cli("explain", DIGITS, PNG / "digit_3.png", "-o", tmp_path / "r.npy", "-c", bad)
    assert r.exit_code == 2 and "'convolutoin'" in r.output and "did you mean convolution" in r.output
    assert cli("composites", bad).exit_code == 2  # also without a model
    bad.write_text('[[rules]]\nmatch = { op_type = "Conv2D" }\nrule = "zplus"\n[[rules]]\nrule = "epsilon"\n')
    assert cli("inspect", DIGITS, "-c", bad).exit_code == 2
    glob = tmp_path / "glob.toml"
    glob.write_text('[[rules]]\nmatch = { name = "/layer4/*" }\nrule = "zplus"\n[[rules]]\n'
                    'match = { kind = ["activation"] }\nrule = "pass"\n[[rules]]\n'
                    'match = { kind = ["maxpool", "shape"] }\nrule = "gradient"\n[[rules]]\nrule = "epsilon"\n')
    with pytest.warns(LrpWarning, match="/layer4/"):
        onnx_lrp.Explainer(str(DIGITS), composite=str(glob))
    glob.write_text(glob.read_text().replace("/layer4/*", "/features/*/Conv"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", LrpWarning)
        onnx_lrp.Explainer(str(DIGITS), composite=str(glob))


# ------------------------------------------------------------------------------------------- shared input options
def test_snapshot_takes_the_input_options_and_compresses(tmp_path):
    out = tmp_path / "base.npz"
    r = cli("snapshot", DIGITS, PNG, "-o", out, "--mean", "0.5", "--std", "0.25")
    assert r.exit_code == 0, r.output
    pixels = np.stack([np.asarray(Image.open(p), np.float32) / 255 for p in sorted(PNG.glob("*.png"))])[:, None]
    with np.load(out, allow_pickle=False) as z:
        stored = z[[k for k in z.files if k.startswith("inputs")][0]]
    assert_close(stored, (pixels - 0.5) / 0.25, rtol=1e-6, atol=1e-6)
    with zipfile.ZipFile(out) as zf:
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in zf.infolist())
    assert cli("check", DIGITS, out).exit_code == 0
    diff = cli("diff", DIGITS, DIGITS, PNG, "--mean", "0.5", "--std", "0.25", "-c", "epsilon-gamma-box")
    assert diff.exit_code == 0 and "ZBox bounds from --mean/--std: low [-2.0], high [2.0]" in diff.output


# ------------------------------------------------------------------------------------------- saved models
def test_saved_model_loads_silently_and_computed_weights_keep_it_small(tmp_path):
    stored, computed = tmp_path / "stored.onnx", tmp_path / "computed.onnx"
    for path, extra in ((stored, []), (computed, ["--computed-weights"])):
        r = cli("rewrite", DIGITS, "-o", path, "-c", "epsilon-gamma-box", "--low", "0", "--high", "1", *extra)
        assert r.exit_code == 0, r.output
    model_size = DIGITS.stat().st_size
    assert stored.stat().st_size > 2 * model_size and computed.stat().st_size < 1.3 * model_size
    x = np.load(ROOT / "models" / "samples" / "batch.npy")
    np.save(tmp_path / "x.npy", x)
    # a fresh interpreter, onnxruntime's default logging (warnings shown): nothing on stderr for either model
    code = ("import numpy as np, onnxruntime as ort, sys\n"
            "x = np.load(sys.argv[1])\n"
            "for model, out in zip(sys.argv[2::2], sys.argv[3::2]):\n"
            "    s = ort.InferenceSession(model, providers=['CPUExecutionProvider'])\n"
            "    r = s.run(['lrp/relevance/image'], {'image': x, 'lrp/target': np.full(len(x), -1, np.int64),\n"
            "              'lrp/one_hot': np.array(False)})[0]\n"
            "    np.save(out, r)\n")
    outs = [tmp_path / "r_stored.npy", tmp_path / "r_computed.npy"]
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.npy"), str(stored), str(outs[0]),
                          str(computed), str(outs[1])], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "appears in graph inputs" not in out.stderr and "[W:" not in out.stderr, \
        out.stderr[-800:]
    rels = [np.load(o) for o in outs]
    ref = onnx_lrp.Explainer(str(DIGITS), composite="epsilon-gamma-box", low=0.0, high=1.0).explain(x).relevance
    assert_close(rels[0], ref, rtol=1e-6, atol=1e-7)
    assert_close(rels[1], rels[0], rtol=1e-6, atol=1e-7)


def test_computed_weights_cover_grouped_and_strided_convolutions(tmp_path):
    """Depthwise (group = channels), grouped and strided convolutions and a Gemm with transB: every modified copy
    is found as an expression of its weight (none kept) and the relevance is unchanged."""
    rng = np.random.default_rng(5)
    p = {"w1": rng.normal(size=(32, 3, 3, 3)).astype(np.float32),
         "w2": rng.normal(size=(32, 1, 3, 3)).astype(np.float32),
         "w3": rng.normal(size=(16, 16, 3, 3)).astype(np.float32), "b3": rng.normal(size=16).astype(np.float32),
         "w4": rng.normal(size=(5, 16 * 16)).astype(np.float32)}
    nodes = [node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), node("Relu", ["c1"], ["a1"]),
             node("Conv", ["a1", "w2"], ["c2"], group=32, pads=[1, 1, 1, 1]), node("Relu", ["c2"], ["a2"]),
             node("Conv", ["a2", "w3", "b3"], ["c3"], group=2, strides=[2, 2], pads=[1, 1, 1, 1]),
             node("Relu", ["c3"], ["a3"]), node("Flatten", ["a3"], ["f"], axis=1),
             node("Gemm", ["f", "w4"], ["y"], transB=1)]
    model = to_bytes(make_model(nodes, {"x": [1, 3, 8, 8]}, ["y"], p))
    x = rng.normal(size=(1, 3, 8, 8)).astype(np.float32)
    for comp in ("epsilon-gamma-box", "epsilon-plus-flat", "epsilon-alpha2-beta1"):
        ex = onnx_lrp.Explainer(model, composite=comp, low=-3.0, high=3.0) if comp.endswith("box") else \
            onnx_lrp.Explainer(model, composite=comp)
        counts = ex.save(tmp_path / "c.onnx", computed_weights=True)
        assert counts["kept"] == 0 and counts["replaced"] >= 3, (comp, counts)
        import onnxruntime as ort
        sess = ort.InferenceSession(str(tmp_path / "c.onnx"), providers=["CPUExecutionProvider"])
        rel = sess.run(["lrp/relevance/x"], {"x": x, "lrp/target": np.array([-1]), "lrp/one_hot": np.array(False)})[0]
        np.testing.assert_allclose(rel, ex.explain(x).relevance, rtol=1e-5, atol=1e-6 * np.abs(rel).max())


# ------------------------------------------------------------------------------------------- pictures and summaries
def _nhwc_ambiguous(path):
    """Input [N, 3, 6, 3] transposed to NCHW right after the input: the dims alone look channels-first."""
    rng = np.random.default_rng(2)
    p = {"w": rng.normal(size=(4, 3, 3, 3)).astype(np.float32),
         "w2": rng.normal(size=(4 * 3 * 6, 3)).astype(np.float32)}
    nodes = [node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]), node("Conv", ["xt", "w"], ["c"], pads=[1, 1, 1, 1]),
             node("Relu", ["c"], ["r"]), node("Flatten", ["r"], ["f"], axis=1), node("Gemm", ["f", "w2"], ["y"])]
    path.write_bytes(to_bytes(make_model(nodes, {"x": [1, 3, 6, 3]}, ["y"], p)))


def test_channels_last_npy_drawn_over_the_models_channel_axis(tmp_path):
    from onnx_lrp.io import heatmap as hm

    _nhwc_ambiguous(tmp_path / "m.onnx")
    x = np.random.default_rng(1).normal(size=(1, 3, 6, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = cli("explain", tmp_path / "m.onnx", tmp_path / "x.npy", "-o", tmp_path / "r.npy", "--heatmap",
            tmp_path / "h.png", "--heatmap-style", "heatmap")
    assert r.exit_code == 0, r.output
    rel = np.load(tmp_path / "r.npy")
    im = np.asarray(Image.open(tmp_path / "h.png").convert("RGB"))
    s = hm.tile_scale(3, 6)
    x0, y0, x1, y1 = hm.cell_box(0, 1, 3, 6, style="heatmap", caption_lines=3)
    np.testing.assert_array_equal(im[y0:y1:s, x0:x1:s], hm.colorize(rel[0].sum(-1), "bwr"))  # H x W = 3 x 6


def test_large_batches_go_to_several_labelled_files_and_jpeg_works(tmp_path):
    x = np.concatenate([np.load(ROOT / "models" / "samples" / "batch.npy")] * 5)  # 50 items
    np.save(tmp_path / "x.npy", x)
    r = cli("explain", DIGITS, tmp_path / "x.npy", "-o", tmp_path / "r.npz", "--heatmap", tmp_path / "h.jpg")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "h.jpg").exists() and (tmp_path / "h-2.jpg").exists() and "2 files" in r.output
    with Image.open(tmp_path / "h.jpg") as a, Image.open(tmp_path / "h-2.jpg") as b:
        assert a.format == "JPEG" and a.size[0] <= 4 + 4 * (2 * 128 + 4 + 4)  # at most 4 beside cells per row
        assert b.size[1] < a.size[1]  # 2 items on the second page, 48 on the first


def test_softmax_output_summary_shows_the_logit_relevance_starts_from(tmp_path):
    r = cli("explain", DIGITS, PNG / "digit_8.png", "-o", tmp_path / "r.npy", "--output", "probabilities", "--json")
    assert r.exit_code == 0, r.output
    import json
    item = json.loads(r.output[r.output.index("{"):])["items"][0]
    res = onnx_lrp.Explainer(str(DIGITS)).explain(np.load(ROOT / "models" / "samples" / "npy" / "digit_8.npy"))
    assert item["logit"] == pytest.approx(float(res.outputs["logits"][item["target"]]), rel=1e-6)  # one item
    assert item["output"] == pytest.approx(float(res.outputs["probabilities"][item["target"]]), rel=1e-6)
    text = cli("explain", DIGITS, PNG / "digit_8.png", "-o", tmp_path / "r.npy", "--output", "probabilities").output
    assert "logit logits" in text and "output probabilities" in text and "relevance starts from the logit" in text


def _embedding_model(path):
    rng = np.random.default_rng(3)
    p = {"w": rng.normal(size=(4 * 3, 2)).astype(np.float32)}
    nodes = [node("Flatten", ["e"], ["f"], axis=1), node("Gemm", ["f", "w"], ["y"])]
    path.write_bytes(to_bytes(make_model(nodes, {"e": ["N", 4, 3]}, ["y"], p)))


def test_tokens_per_item_and_clipped_scale(tmp_path):
    import json

    from onnx_lrp.io.tokens import _scaled

    _embedding_model(tmp_path / "m.onnx")
    np.save(tmp_path / "e.npy", np.random.default_rng(4).normal(size=(2, 4, 3)).astype(np.float32))
    toks = [["[CLS]", "a", "b", "c"], ["[CLS]", "x", "y", "z"]]
    (tmp_path / "t.json").write_text(json.dumps(toks))
    r = cli("explain", tmp_path / "m.onnx", tmp_path / "e.npy", "-o", tmp_path / "r.npy", "--tokens",
            tmp_path / "t.json", "--html", tmp_path / "t.html", "--token-scale", "75", "-c", "epsilon")
    assert r.exit_code == 0, r.output
    rel = np.load(tmp_path / "r.npy").sum(-1)
    lines = [line for line in r.output.splitlines() if line.startswith("e.npy[") and "]: " in line]
    assert len(lines) == 2 and len(set(np.round(rel[0], 6))) > 1
    for i, line in enumerate(lines):  # each item labelled with its own tokens and its own relevance
        assert all(f"{t}[{v:+.3g}]" in line for t, v in zip(toks[i], rel[i]))
    page = (tmp_path / "t.html").read_text()
    assert ">z</span>" in page and ">c</span>" in page and "75th percentile" in page
    s = _scaled(np.array([10.0, 1.0, -1.0, 0.5]), 75)  # scale = 75th percentile of |r|: the outlier is clipped
    assert s[0] == 1.0 and 0 < s[1] < 1 and s[2] == -s[1]
    (tmp_path / "t.json").write_text(json.dumps([["a", "b", "c", "d"]] * 3))
    bad = cli("explain", tmp_path / "m.onnx", tmp_path / "e.npy", "-o", tmp_path / "r.npy", "--tokens",
              tmp_path / "t.json")
    assert bad.exit_code == 2 and "3 token lists for 2 item(s)" in bad.output
    (tmp_path / "t.json").write_text(json.dumps([["a", "b", "c"], ["a", "b", "c", "d"]]))
    bad = cli("explain", tmp_path / "m.onnx", tmp_path / "e.npy", "-o", tmp_path / "r.npy", "--tokens",
              tmp_path / "t.json")
    assert bad.exit_code == 2 and "item 0" in bad.output and "3 tokens but 4" in bad.output


def test_check_summary_names_the_worst_sample_per_metric():
    from onnx_lrp import regression as rg

    base_rel = np.random.default_rng(0).normal(size=(4, 50))
    noise = np.random.default_rng(1).normal(size=(4, 50)) * np.array([0.01, 0.5, 0.02, 0.05])[:, None]
    y = np.random.default_rng(2).normal(size=(4, 3))
    base = rg.Result({"x": base_rel}, y, np.zeros(4, np.int64), ["a", "b", "c", "d"])
    cur = rg.Result({"x": base_rel + noise}, y, np.zeros(4, np.int64), ["a", "b", "c", "d"])
    comp = rg.compare(base, cur)
    summ = comp.summary()
    cos = [s.metrics["cosine"] for s in comp.samples]
    assert summ["cosine"]["worst_item"] == "b" and summ["cosine"]["worst"] == min(cos)
    assert summ["rel_l2"]["worst_item"] == "b" and summ["rel_l2"]["worst"] == max(s.metrics["rel_l2"]
                                                                                   for s in comp.samples)
    table = rg.format_table(comp)
    assert "worst item per metric: " in table and "cosine b" in table and "95% worst" in table


def test_crop_keeps_the_aspect_ratio(tmp_path):
    """A 32x16 (W x H) image for a 16x16 model: --crop (the default) cuts the centre 16 columns (no resize needed),
    --squash squeezes the image to half its width."""
    rng = np.random.default_rng(6)
    pixels = rng.integers(0, 256, size=(16, 32), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(tmp_path / "wide.png")
    for crop, expect in ((True, pixels[:, 8:24]), (False, None)):
        out = tmp_path / f"s{crop}.npz"
        r = cli("snapshot", DIGITS, tmp_path / "wide.png", "-o", out, *(["--crop"] if crop else ["--squash"]))
        assert r.exit_code == 0, r.output
        with np.load(out) as z:
            x = z[[k for k in z.files if k.startswith("inputs")][0]][0, 0]
        if expect is not None:
            assert_close(x, expect / 255.0, atol=1e-6)
        else:
            squeezed = np.asarray(Image.fromarray(pixels, mode="L").resize((16, 16), Image.Resampling.BILINEAR))
            assert_close(x, squeezed / 255.0, atol=1e-6)
