"""The Python API reads inputs as the command line does (issue 35 item 1): uint8 arrays as 8-bit pixels (the same
note, a warning), per-channel box bounds from a flat list, a channels-last array refused with the transpose that
fits, torch tensors whatever their grad state (relevance back as torch), class names for targets, and
``onnx_lrp.preprocess.load_image`` equal to what ``onnx-lrp`` feeds for the same file (and to torchvision's Resize +
CenterCrop by hand, issue 35 item 4)."""
from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from PIL import Image, ImageDraw
from util import assert_close, make_model, node

import onnx_lrp
from onnx_lrp.cli.main import main
from onnx_lrp.core.errors import InputError, LrpWarning
from onnx_lrp.preprocess import load_image

NAMES = ["tench", "goldfish", "tabby, tabby cat", "tiger cat", "Persian cat"]


def _rgb_model(size: int = 8) -> onnx.ModelProto:
    """x [N, 3, size, size] -> Conv 3x3 -> Relu -> GlobalAveragePool -> Gemm: 5 classes."""
    rng = np.random.default_rng(0)
    inits = {"W": rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "B": rng.normal(size=4).astype(np.float32),
             "G": rng.normal(size=(5, 4)).astype(np.float32)}
    return make_model([node("Conv", ["x", "W", "B"], "c", pads=[1, 1, 1, 1]), node("Relu", ["c"], "r"),
                       node("GlobalAveragePool", ["r"], "p"), node("Flatten", ["p"], "f"),
                       node("Gemm", ["f", "G"], "y", transB=1)], {"x": (["N", 3, size, size], np.float32)}, ["y"],
                      inits)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("rgb")
    onnx.save(_rgb_model(), d / "rgb.onnx")
    return d / "rgb.onnx"


@pytest.fixture(scope="module")
def ex(model_path):
    return onnx_lrp.Explainer(str(model_path), composite="epsilon-gamma-box", low=-1.0, high=2.0, labels=NAMES)


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(1).random((2, 3, 8, 8), dtype=np.float32)


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_torch_tensors_with_grad_on_any_device_answered_in_kind(ex, x):
    torch = pytest.importorskip("torch")
    ref = ex.explain(x, target=[1, 3])
    t = torch.tensor(x, requires_grad=True)
    res = ex.explain(t, target=[1, 3])
    assert isinstance(res.relevance, torch.Tensor) and res.relevance.device == t.device
    assert_close(res.relevance.numpy(), ref.relevance, rtol=1e-6)
    assert isinstance(ref.relevance, np.ndarray)  # numpy in, numpy out
    one = ex.explain({"x": t[0].double()}, target=1)  # a dict, float64, one item without its batch axis
    assert isinstance(one.relevance, torch.Tensor) and tuple(one.relevance.shape) == (3, 8, 8)
    assert_close(one.relevance.numpy(), ref.relevance[0], rtol=1e-5)


def test_numpy_input_does_not_import_torch(ex, x, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # any `import torch` now raises ImportError
    with pytest.raises(ImportError):
        import torch  # noqa: F401,PLC0415
    res = ex.explain(x, target=1)
    assert isinstance(res.relevance, np.ndarray)


def test_uint8_scaled_as_the_command_line_does(ex, model_path, x, tmp_path):
    u = (x * 255).round().astype(np.uint8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = ex.explain(u, target=2)
    said = [str(w.message) for w in caught if issubclass(w.category, LrpWarning)]
    assert said == ["input 'x': uint8 values read as 8-bit pixels and divided by 255, as images are"]
    ref = ex.explain(u.astype(np.float32) / np.float32(255), target=2)  # the float path: the oracle
    assert_close(res.relevance, ref.relevance, rtol=1e-6)
    np.save(tmp_path / "u.npy", u)
    r = cli("explain", model_path, tmp_path / "u.npy", "-c", "epsilon-gamma-box", "--low", "-1", "--high", "2",
            "-t", "2", "-o", tmp_path / "r.npy")
    assert r.exit_code == 0, r.output
    assert "u.npy: uint8 values read as 8-bit pixels and divided by 255, as images are" in r.output
    assert_close(np.load(tmp_path / "r.npy"), ref.relevance, rtol=1e-6)


def test_per_channel_bounds_as_a_flat_list(model_path, x, tmp_path):
    low, high = [-1.0, -0.5, 0.0], [1.0, 1.5, 2.0]
    flat = onnx_lrp.Explainer(str(model_path), composite="epsilon-gamma-box", low=low, high=high)
    shaped = onnx_lrp.Explainer(str(model_path), composite="epsilon-gamma-box",
                                low=np.reshape(low, (3, 1, 1)), high=np.reshape(high, (3, 1, 1)))
    a, b = flat.explain(x, target=0).relevance, shaped.explain(x, target=0).relevance
    assert_close(a, b, rtol=1e-6)
    one = onnx_lrp.Explainer(str(model_path), composite="epsilon-gamma-box", low=-1.0, high=2.0)
    assert not np.allclose(a, one.explain(x, target=0).relevance)  # the per-channel bounds are used
    np.save(tmp_path / "x.npy", x)
    r = cli("explain", model_path, tmp_path / "x.npy", "-c", "epsilon-gamma-box", "--low", "-1,-0.5,0",
            "--high", "1,1.5,2", "-t", "0", "-o", tmp_path / "r.npy")
    assert r.exit_code == 0, r.output
    assert_close(np.load(tmp_path / "r.npy"), a, rtol=1e-6)


def test_channels_last_refused_with_the_transpose(ex, model_path, x, tmp_path):
    for given, perm in ((x.transpose(0, 2, 3, 1), "(0, 3, 1, 2)"), (x[0].transpose(1, 2, 0), "(2, 0, 1)")):
        with pytest.raises(InputError) as e:
            ex.explain(given)
        msg = str(e.value)
        assert "channels last" in msg and f"x.transpose{perm}" in msg and "Nx3x8x8" in msg
        assert_close(ex.explain(given.transpose(eval(perm)), target=1).relevance,  # the hint's transpose works
                     ex.explain(x if given.ndim == 4 else x[0], target=1).relevance, rtol=1e-6)
    np.save(tmp_path / "hwc.npy", x.transpose(0, 2, 3, 1))
    r = cli("explain", model_path, tmp_path / "hwc.npy", "-o", tmp_path / "r.npy")
    assert r.exit_code == 2 and "x.transpose(0, 3, 1, 2)" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "r.npy").exists()


def test_targets_by_class_name(ex, x):
    assert ex.labels == NAMES
    res = ex.explain(x, target="tabby cat")
    assert list(res.target) == [2, 2]
    assert list(ex.explain(x, target=["persian", 1]).target) == [4, 1]
    with pytest.raises(InputError, match=r"closest: 2 'tabby, tabby cat'"):
        ex.explain(x, target="tabby kat")


def test_class_names_beside_the_model_and_in_its_metadata(tmp_path, x):
    m = _rgb_model()
    onnx.save(m, tmp_path / "model.onnx")
    assert onnx_lrp.Explainer(str(tmp_path / "model.onnx")).labels is None
    (tmp_path / "config.json").write_text(json.dumps({"id2label": {str(i): n for i, n in enumerate(NAMES)}}))
    assert onnx_lrp.Explainer(str(tmp_path / "model.onnx")).labels == NAMES
    onnx.helper.set_model_props(m, {"id2label": json.dumps(["a", "b", "c", "d", "e"])})
    ex = onnx_lrp.Explainer(m.SerializeToString())  # bytes: no folder, the metadata names them
    assert ex.labels == ["a", "b", "c", "d", "e"] and list(ex.explain(x, target="d").target) == [3, 3]


def _circle(w: int, h: int) -> Image.Image:
    im = Image.new("RGB", (w, h), (255, 255, 255))
    r = min(w, h) // 3
    ImageDraw.Draw(im).ellipse((w // 2 - r, h // 2 - r, w // 2 + r, h // 2 + r), fill=(0, 0, 0))
    return im


def _extent(mask: np.ndarray) -> tuple[int, int]:
    rows, cols = np.nonzero(mask)
    return rows.max() - rows.min() + 1, cols.max() - cols.min() + 1


def test_size_resizes_the_shorter_side_then_cuts_the_centre(tmp_path):
    """A 320x240 circle stays a circle at --size 224; the oracle: torchvision's Resize(224) + CenterCrop(224) by
    hand (the shorter side to 224, the longer int(224 * 320 / 240) = 298, the centre cut at round((298 - 224) / 2))."""
    _circle(320, 240).save(tmp_path / "c.png")
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    x = load_image(tmp_path / "c.png", 224, mean=mean, std=std)
    by_hand = _circle(320, 240).resize((298, 224), Image.Resampling.BILINEAR).crop((37, 0, 261, 224))
    want = ((np.asarray(by_hand, np.float32) / np.float32(255) - np.float32(mean)) / np.float32(std))
    assert x.shape == (1, 3, 224, 224)
    assert_close(x[0].transpose(1, 2, 0), want, rtol=1e-6)
    dark = x[0, 0] * std[0] + mean[0] < 0.5
    hh, ww = _extent(dark)
    assert abs(hh - ww) <= 2  # a circle (161 px scaled by 224/240 and 298/320: 150.3 and 149.9)
    squashed = load_image(tmp_path / "c.png", 224, crop=False)
    hh, ww = _extent(squashed[0, 0] < 0.5)
    assert ww < hh - 20  # an ellipse: the width squeezed by 224/320 against 224/240


def test_load_image_equals_what_the_command_line_feeds(model_path, tmp_path):
    _circle(32, 24).save(tmp_path / "c.png")
    for flags, kw in (([], {}), (["--squash"], {"crop": False})):
        out = tmp_path / f"s{len(flags)}.npz"
        r = cli("snapshot", model_path, tmp_path / "c.png", "-o", out, "--mean", "0.5,0.4,0.3", "--std",
                "0.2,0.25,0.3", *flags)
        assert r.exit_code == 0, r.output
        with np.load(out) as z:
            fed = z[[k for k in z.files if k.startswith("inputs")][0]]
        mine = load_image(tmp_path / "c.png", mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), model=model_path, **kw)
        np.testing.assert_array_equal(mine, fed)


@pytest.mark.parametrize("w, h, size", [(320, 240, 224), (41, 53, 24), (50, 37, 17), (24, 25, 24)])
def test_size_equals_torchvisions_resize_and_center_crop(tmp_path, w, h, size):
    T = pytest.importorskip("torchvision.transforms")
    im = Image.fromarray(np.random.default_rng(w * h).integers(0, 256, (h, w, 3), dtype=np.uint8))
    im.save(tmp_path / "im.png")
    want = np.asarray(T.CenterCrop(size)(T.Resize(size)(im)), np.float32) / np.float32(255)
    np.testing.assert_array_equal(load_image(tmp_path / "im.png", size)[0].transpose(1, 2, 0), want)


def test_names_that_miscount_the_classes(model_path, tmp_path):
    """Given names must count the classes (refused); names found beside the model that do not are not used (one name
    too many would name every class by its neighbour's)."""
    with pytest.raises(InputError, match=r"labels: 6 names for the 5 classes of 'y'"):
        onnx_lrp.Explainer(str(model_path), labels=NAMES + ["background"])
    onnx.save(_rgb_model(), tmp_path / "model.onnx")
    (tmp_path / "config.json").write_text(json.dumps({"id2label": {"0": "a", "1": "b"}}))
    assert onnx_lrp.Explainer(str(tmp_path / "model.onnx")).labels is None  # a language model's 2 default names
