"""The API's conventions for users of zennit, captum and Quantus (issue 27, point 5).

* relevance has the input's shape as given: one item without its batch axis gets every per-item field without one
  (checked against the same item explained with its batch axis);
* ``onnx_lrp.plot.heatmap`` / ``imsave`` and ``Explanation.heatmap()`` draw what ``explain --heatmap`` draws (tiles
  checked pixel by pixel against the command's picture and against a numpy oracle of the bwr colour map);
* ``repr`` of results is short (never a whole array);
* ``evaluate`` takes Quantus' attribution layout, N x 1 x H x W for N x 3 x H x W inputs: the numbers Quantus 0.6
  computes from it (tests/goldens/quantus_rgb.npz, scripts/make_quantus_rgb_goldens.py; live where quantus is
  installed).
"""
from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import onnx_lrp
import onnx_lrp.plot
from onnx_lrp.cli.main import main
from onnx_lrp.io import heatmap as hm
from util import GOLDENS, ROOT, assert_close

DIGITS = str(ROOT / "models" / "digits_cnn.onnx")
X = np.load(ROOT / "models" / "samples" / "batch.npy")  # [10, 1, 16, 16]
RGB = GOLDENS / "quantus_rgb.npz"
HIDDEN = "/classifier/classifier.2/Relu_output_0"


@pytest.fixture(scope="module")
def ex():
    return onnx_lrp.Explainer(DIGITS, relevance_at=[HIDDEN])


# ------------------------------------------------------------------------------------------ the batch axis
def test_one_item_without_batch_axis_answers_without_one(ex):
    one, batched = ex.explain(X[3]), ex.explain(X[3:4])
    assert one.batched is False and batched.batched is True
    assert one.relevance.shape == X[3].shape == (1, 16, 16)  # was (1, 1, 16, 16)
    np.testing.assert_array_equal(one.relevance, batched.relevance[0])
    assert np.ndim(one.target) == 0 and one.target == batched.target[0] == 3
    assert np.ndim(one.explained_value) == 0 and one.explained_value == batched.explained_value[0]
    for name in ("logits", "probabilities"):
        assert one.outputs[name].shape == (10,)
        np.testing.assert_array_equal(one.outputs[name], batched.outputs[name][0])
    assert one.forward is one.outputs
    assert one.relevance_at[HIDDEN].shape == batched.relevance_at[HIDDEN].shape[1:]
    np.testing.assert_array_equal(one.relevance_at[HIDDEN], batched.relevance_at[HIDDEN][0])
    # a dict by input name: the same rule; a given target works as for a batch
    d = ex.explain({"image": X[3]}, target=5)
    assert d.relevance.shape == (1, 16, 16) and d.target == 5
    np.testing.assert_array_equal(d.relevance, ex.explain(X[3:4], target=5).relevance[0])


def test_a_batch_keeps_its_axis(ex):
    res = ex.explain(X[:4])
    assert res.batched and res.relevance.shape == (4, 1, 16, 16) and res.target.shape == (4,)
    assert res.outputs["logits"].shape == (4, 10) and res.relevance_at[HIDDEN].shape[0] == 4


# ------------------------------------------------------------------------------------------ pictures
def _bwr(v):
    """zennit's bwr by its nodes: blue (0) -> white (0.5) -> red (1), linear between them."""
    v = np.clip(v, 0, 1)[..., None]
    lo = np.array([0, 0, 255]) + (np.array([255, 255, 255]) - np.array([0, 0, 255])) * (v / 0.5)
    hi = np.array([255, 255, 255]) + (np.array([255, 0, 0]) - np.array([255, 255, 255])) * ((v - 0.5) / 0.5)
    return np.round(np.where(v <= 0.5, lo, hi)).astype(np.uint8)


def test_heatmaps_draw_what_the_command_draws(ex, tmp_path):
    res = ex.explain(X)
    old = os.getcwd()
    try:
        os.chdir(tmp_path)
        r = CliRunner().invoke(main, ["explain", DIGITS, str(ROOT / "models" / "samples" / "batch.npy"),
                                      "--heatmap", "cli.png"])
    finally:
        os.chdir(old)
    assert r.exit_code == 0, r.output
    cli = np.asarray(Image.open(tmp_path / "cli.png").convert("RGB"))
    api = np.asarray(res.heatmap())
    arrays = np.asarray(onnx_lrp.plot.heatmap(res.relevance, X, labels=res._labels(res.relevance),
                                              colorbar="colours scaled per tile to its largest |relevance|"))
    assert api.shape == cli.shape == arrays.shape
    maps = res.relevance.astype(np.float64).sum(1)
    for i in range(len(X)):
        left, top, right, bottom = hm.cell_box(i, len(X), 16, 16, style="beside", caption_lines=3)
        tile = api[top:bottom, left:right]
        np.testing.assert_array_equal(tile, cli[top:bottom, left:right])
        np.testing.assert_array_equal(tile, arrays[top:bottom, left:right])
        s = (bottom - top) // 16  # each relevance value is an s x s block
        want = _bwr(0.5 + 0.5 * maps[i] / np.abs(maps[i]).max())
        np.testing.assert_array_equal(tile[::s, ::s], want)
        # the input beside it: grey, scaled to the item's range
        pic = api[top:bottom, left - (right - left) - 4:left - 4][::s, ::s, 0].astype(int)
        x = X[i, 0]
        np.testing.assert_allclose(pic, (x - x.min()) / (x.max() - x.min()) * 255, atol=1)


def test_plot_api_like_zennit_imsave(ex, tmp_path):
    res = ex.explain(X[:3])
    alone = onnx_lrp.plot.heatmap(res.relevance)
    assert isinstance(alone, Image.Image) and alone.mode == "RGB"
    onnx_lrp.plot.imsave(tmp_path / "h.png", res.relevance, cmap="coldnhot")
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "h.png").convert("RGB")),
                                  np.asarray(onnx_lrp.plot.heatmap(res.relevance, cmap="coldnhot")))
    buf = io.BytesIO()
    onnx_lrp.plot.imsave(buf, res.relevance, format="PNG")  # a file object, as zennit's
    assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
    # one item without its batch axis: batch=False draws it as the batched call does
    one = ex.explain(X[0])
    np.testing.assert_array_equal(np.asarray(onnx_lrp.plot.heatmap(one.relevance, X[0], batch=False)),
                                  np.asarray(onnx_lrp.plot.heatmap(one.relevance[None], X[:1])))
    np.testing.assert_array_equal(np.asarray(one.heatmap()), np.asarray(ex.explain(X[:1]).heatmap()))
    res.heatmap(tmp_path / "res.png")
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "res.png").convert("RGB")),
                                  np.asarray(res.heatmap()))


@pytest.mark.parametrize("call, words", [
    (lambda r: onnx_lrp.plot.heatmap(r * np.nan), "NaN"),
    (lambda r: onnx_lrp.plot.heatmap(r[0, 0, 0]), "cannot draw"),
    (lambda r: onnx_lrp.plot.heatmap(r, np.zeros((2, 5))), "cannot be drawn beside"),
    (lambda r: onnx_lrp.plot.heatmap(r, cmap="viridis"), "unknown colour map"),
    (lambda r: onnx_lrp.plot.imsave("/tmp/heat.unknown-suffix", r), "give a file name ending in"),
    (lambda r: onnx_lrp.plot.imsave("/nonexistent-dir/heat.png", r), "cannot write"),
])
def test_plot_refuses_in_one_line(call, words):
    with pytest.raises(onnx_lrp.LrpError) as e:
        call(np.ones((2, 1, 4, 4)) * np.arange(16).reshape(4, 4))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_notebooks_show_a_picture_and_a_short_repr(ex):
    res = ex.explain(X)
    png = res._repr_png_()
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png)).convert("RGB")), np.asarray(res.heatmap()))
    text = repr(res)
    assert len(text) < 400 and "\n" not in text and "[[" not in text, text
    assert "relevance=float32[10x1x16x16]" in text and "target=[0, 1, 2, 3, 4, 5, ... (10 items)]" in text
    assert "batched=False" in repr(ex.explain(X[0]))
    big = onnx_lrp.Explainer(DIGITS).explain(np.repeat(X, 5, axis=0))  # 50 items: no inline picture, the text
    assert big._repr_png_() is None and len(repr(big)) < 400
    ev = onnx_lrp.evaluate(DIGITS, X, patch=4, steps=4, explainer=ex)
    text = repr(ev)
    assert text.startswith("Evaluation(metric='region-perturbation', items=10") and len(text) < 400, text
    assert "beats_random=True" in text and "[[" not in text


def test_the_explainer_its_relevance_model_and_concepts_have_short_reprs(ex):
    """What a notebook prints for the objects a user holds: the model, the composite, the inputs with their
    dimensions; never the relevance model's bytes (a megabyte of text before) nor an array's values; dir() and
    the package name the result classes (TextExplanation too)."""
    text = repr(ex)
    assert text.startswith(f"Explainer({DIGITS!r}, composite='epsilon-plus-flat', device='cpu', ") and len(text) < 400
    assert "inputs=[image: float32[? x 1 x 16 x 16]]" in text and "explained_output='logits'" in text
    text = repr(ex.relevance_model)
    assert text.startswith("RelevanceModel(composite='epsilon-plus-flat'") and len(text) < 400, text[:400]
    assert "\\x" not in text and "graph=" in text and "MiB" in text
    layer = "/features/features.6/Conv_output_0"
    concepts = ex.explain_concepts(X[:1], layer=layer, concepts="top:3")
    text = repr(concepts)
    assert text.startswith(f"ConceptExplanation(layer={layer!r}, concepts=[[") and len(text) < 400, text
    assert "heatmaps=float32[3x1x16x16]" in text and "shares=float64[3]" in text and "[[0." not in text
    graph = ex.concept_graph(X[:1], layer=layer, width=(2,))
    assert repr(graph) == (f"ConceptGraph(root=({layer!r}, 0), target={graph.target}, nodes={len(graph.nodes)}, "
                           f"edges={sum(map(len, graph.edges.values()))})")
    assert {"TextExplanation", "Explanation", "Explainer"} <= set(dir(onnx_lrp)) and "annotations" not in dir(onnx_lrp)
    from onnx_lrp.io.text_result import TextExplanation
    assert onnx_lrp.TextExplanation is TextExplanation


# ------------------------------------------------------------------------------------------ Quantus' layout
@pytest.fixture(scope="module")
def rgb():
    g = np.load(RGB, allow_pickle=False)
    return {k: g[k] for k in g.files}


def _ours(g, name, relevance):
    meta = json.loads(str(g["meta"]))
    kw = dict(meta["cases"][name]["ours"])
    kw["orders"] = tuple(kw.get("orders", ("morf", "lerf")))
    ev = onnx_lrp.evaluate(g["model"].tobytes(), g["x"], relevance=relevance, target=g["target"], seed=meta["seed"],
                           mask=g["mask"], **kw)
    return {"rp": lambda: ev.quantus["morf"], "pf": lambda: ev.quantus["morf"],
            "fc": lambda: ev.scores["correlation"], "rma": lambda: ev.scores["mass"]}[name]()


@pytest.mark.parametrize("name", ["rp", "pf", "fc", "rma"])
def test_evaluate_takes_quantus_layout(rgb, name):
    """N x 1 x H x W relevance of N x 3 x H x W inputs: Quantus 0.6's numbers (it broadcasts over the channels);
    N x H x W (its expand_attribution_channel) the same."""
    a = rgb["relevance"]
    assert a.shape == (6, 1, 8, 8) and rgb["x"].shape == (6, 3, 8, 8)
    want = rgb[f"out/{name}"]
    assert_close(_ours(rgb, name, a), want, rtol=0, atol=1e-6)
    assert_close(_ours(rgb, name, a[:, 0]), want, rtol=0, atol=1e-6)


def test_evaluate_quantus_layout_live(rgb):
    pytest.importorskip("quantus")
    import importlib.util
    import warnings

    spec = importlib.util.spec_from_file_location("mqrg", ROOT / "scripts" / "make_quantus_rgb_goldens.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a = rgb["relevance"] * np.linspace(1, 2, 8, dtype=np.float32)  # other numbers than the golden's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("rp", "pf", "fc"):
            want = mod.run_quantus(name, rgb["model"].tobytes(), rgb["x"], a, rgb["target"], rgb["mask"])
            assert_close(_ours(rgb, name, a), want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("shape", [(6, 2, 8, 8), (6, 8), (5, 1, 8, 8), (6, 3, 8, 8, 1)])
def test_evaluate_refuses_other_layouts(rgb, shape):
    with pytest.raises(onnx_lrp.InputError) as e:
        onnx_lrp.evaluate(rgb["model"].tobytes(), rgb["x"], relevance=np.ones(shape, np.float32),
                          target=rgb["target"])
    assert "relevance has shape" in str(e.value) and "\n" not in str(e.value)


def test_randomisation_sums_the_randomised_relevance_like_the_given(rgb):
    """A relevance given summed over the channels is compared with the randomised models' relevance summed the same
    way (quantus.explain's layout): the first row (the original model) agrees with itself exactly."""
    model = rgb["model"].tobytes()
    res = onnx_lrp.Explainer(model).explain(rgb["x"])
    a1 = res.relevance.sum(1, keepdims=True)
    full = onnx_lrp.evaluate(model, rgb["x"], metric="randomisation", relevance=res.relevance, target=res.target)
    summed = onnx_lrp.evaluate(model, rgb["x"], metric="randomisation", relevance=a1, target=res.target)
    assert [r["layer"] for r in full.layers] == [r["layer"] for r in summed.layers]
    assert_close(full.layers[-1]["ssim"], summed.layers[-1]["ssim"], rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(summed.scores["spearman/last"]))
