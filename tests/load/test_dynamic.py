"""Dynamic spatial and time axes: a network exported once with dynamic axes gives the same relevance as the same
network exported with every size fixed (the static path, whose transposes are checked against zennit elsewhere),
for every CNN composite, at lengths that leave trailing inputs unreached by strided windows (cropped/padded back at
run time) and through ceil_mode pools whose divisors are counted at run time.

Real TorchScript exports (torch is a test dependency); each export takes well under a second.
"""
from __future__ import annotations

import io

import numpy as np
import pytest

import onnx_lrp
from util import assert_close

torch = pytest.importorskip("torch")
nn = torch.nn
COMPOSITES = ["epsilon", "epsilon-plus-flat", "epsilon-gamma-box", "epsilon-alpha2-beta1"]
PARAMS = {"epsilon-gamma-box": dict(low=-3.0, high=3.0)}


class Net1d(nn.Module):
    """An EEG/audio-style 1-D CNN: conv, BN, max-pool, strided conv, average pools with ceil_mode and padding not
    counted, a transposed conv, a mean over time."""

    def __init__(self):
        super().__init__()
        self.c1, self.bn, self.p = nn.Conv1d(4, 8, 5, padding=2), nn.BatchNorm1d(8), nn.MaxPool1d(2)
        self.c2 = nn.Conv1d(8, 8, 3, stride=2)
        self.ap = nn.AvgPool1d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        self.ct = nn.ConvTranspose1d(8, 6, 4, stride=2, padding=1)
        self.ap2 = nn.AvgPool1d(2)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        h = self.p(torch.relu(self.bn(self.c1(x))))
        h = self.ap(torch.relu(self.c2(h)))
        h = self.ap2(torch.relu(self.ct(h)))
        return self.fc(h.mean(-1))


class Net2d(nn.Module):
    """Dynamic H x W: strided 3x3 and 1x1 convs, an average pool with ceil_mode counting padding, a global pool."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(6, 8, 1, stride=2)
        self.ap = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=True)
        self.c3 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.c1(x))
        h = self.ap(torch.relu(self.c2(h)))
        h = torch.relu(self.c3(h))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1))


class NetUp(nn.Module):
    """Dynamic H x W through copy paddings and upsampling (super-resolution / FPN style): reflection and replication
    padding (ONNX Pad reflect / edge), nearest upsampling (Resize asymmetric floor, as YOLO and PP-OCR), bilinear
    interpolation (half_pixel and align_corners)."""

    def __init__(self):
        super().__init__()
        self.c1, self.rp, self.c2 = nn.Conv2d(3, 6, 3, padding=1), nn.ReflectionPad2d((2, 1, 1, 2)), nn.Conv2d(6, 6, 3)
        self.up, self.ep = nn.Upsample(scale_factor=2, mode="nearest"), nn.ReplicationPad2d(1)
        self.c3, self.c4, self.fc = nn.Conv2d(6, 8, 3, stride=2), nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.c2(self.rp(torch.relu(self.c1(x)))))
        h = torch.relu(self.c3(self.ep(self.up(h))))
        h = nn.functional.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)
        h = torch.relu(self.c4(h))
        h = nn.functional.interpolate(h, scale_factor=1.5, mode="bilinear", align_corners=True)
        return self.fc(h.mean((2, 3)))


def _export(model, x, dynamic):
    f = io.BytesIO()
    axes = {"x": {0: "batch", **{i: f"s{i}" for i in range(2, x.ndim) if dynamic != "batch"}}} if dynamic else None
    torch.onnx.export(model, x, f, input_names=["x"], output_names=["y"], opset_version=17, dynamo=False,
                      dynamic_axes=axes)
    return f.getvalue()


def _model(cls):
    torch.manual_seed(0)
    m = cls().eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm1d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 1.5)
    return m


@pytest.mark.parametrize("cls, sizes", [(Net1d, [(51,), (36,)]), (Net2d, [(20, 23), (17, 16)]),
                                        (NetUp, [(10, 13), (9, 8)])])
def test_dynamic_axes_match_static_exports(cls, sizes):
    model = _model(cls)
    channels = 4 if cls is Net1d else 3
    dyn = _export(model, torch.randn(1, channels, *sizes[0]), dynamic=True)
    dyn_ex = {c: onnx_lrp.Explainer(dyn, composite=c, **PARAMS.get(c, {})) for c in COMPOSITES}
    rng = np.random.default_rng(1)
    for size in sizes:
        x = rng.standard_normal((2, channels) + size).astype(np.float32)
        static = _export(model, torch.from_numpy(x[:1]), dynamic=False)
        with torch.no_grad():
            y = model(torch.from_numpy(x)).numpy()
        for c in COMPOSITES:
            got = dyn_ex[c].explain(x, target=1)
            assert_close(got.outputs["y"], y, rtol=1e-4, atol=1e-5)
            ref = onnx_lrp.Explainer(static, composite=c, **PARAMS.get(c, {})).explain(x, target=1)
            assert got.relevance.shape == x.shape
            scale = np.abs(ref.relevance).max()
            np.testing.assert_allclose(got.relevance, ref.relevance, rtol=1e-4, atol=1e-5 * scale,
                                       err_msg=f"{c} at size {size}")


@pytest.mark.parametrize("composite", ["attnlrp", "cp-lrp"])
def test_vit_with_dynamic_batch_matches_static_export(composite):
    """torchvision's ViT exported as in the README's quickstart (TorchScript, dynamic batch axis): the class token
    is expanded to the run-time batch, so the Concat before the encoder has no static sizes."""
    from torchvision.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                              num_classes=5).eval()
    nn.init.normal_(model.heads.head.weight)  # torchvision zero-initialises the head
    x = np.random.default_rng(2).standard_normal((3, 3, 32, 32)).astype(np.float32)
    dyn = onnx_lrp.Explainer(_export(model, torch.from_numpy(x[:1]), dynamic="batch"), composite=composite)
    static = onnx_lrp.Explainer(_export(model, torch.from_numpy(x[:1]), dynamic=False), composite=composite)
    got, ref = dyn.explain(x, target=[0, 3, 4]), static.explain(x, target=[0, 3, 4])  # static: item by item
    with torch.no_grad():
        assert_close(got.outputs["y"], model(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-5)
    scale = np.abs(ref.relevance).max()
    assert scale > 0
    np.testing.assert_allclose(got.relevance, ref.relevance, rtol=1e-4, atol=1e-5 * scale)


def test_shufflenet_with_dynamic_batch_matches_static_export():
    """torchvision's ShuffleNetV2 (tiny stages) with a dynamic batch axis: its channel split slices at bounds
    computed from shapes that become static only after folding and re-inferring shapes stage by stage."""
    from torchvision.models import ShuffleNetV2
    torch.manual_seed(0)
    model = ShuffleNetV2([2, 2, 1], [8, 16, 32, 48, 64], num_classes=6).eval()
    x = np.random.default_rng(4).standard_normal((2, 3, 48, 48)).astype(np.float32)
    dyn = onnx_lrp.Explainer(_export(model, torch.from_numpy(x[:1]), dynamic="batch"), composite="epsilon-plus-flat")
    static = onnx_lrp.Explainer(_export(model, torch.from_numpy(x[:1]), dynamic=False), composite="epsilon-plus-flat")
    got, ref = dyn.explain(x, target=2), static.explain(x, target=2)
    scale = np.abs(ref.relevance).max()
    assert scale > 0
    np.testing.assert_allclose(got.relevance, ref.relevance, rtol=1e-4, atol=1e-5 * scale)


def test_copy_pads_and_upsampling_match_zennit():
    """Reflection / replication padding and nearest upsampling are linear copy maps: zennit passes relevance through
    them as the gradient (each input element gets the relevance of all its copies). The dynamic H x W export matches
    zennit (float64 reference, relative L2) for the CNN composites."""
    pytest.importorskip("zennit")
    from test_zennit_parity import TOL, load_script, rel_errors

    class Net(NetUp):  # modules, not functions, for zennit's rules (ReLU: pass; the pool: norm)
        def __init__(self):
            super().__init__()
            self.relu, self.pool = nn.ReLU(), nn.AdaptiveAvgPool2d(1)

        def forward(self, x):
            h = self.relu(self.c2(self.rp(self.relu(self.c1(x)))))
            h = self.relu(self.c3(self.ep(self.up(h))))
            return self.fc(torch.flatten(self.pool(h), 1))

    script = load_script()
    torch.manual_seed(3)
    model = Net().eval()
    x = torch.randn(2, 3, 11, 9, generator=torch.Generator().manual_seed(5))
    data = _export(model, x[:1], dynamic=True)
    for comp in ("epsilon-plus-flat", "epsilon-alpha2-beta1", "epsilon@0.01"):
        name, params = (comp.split("@")[0], {"epsilon": 0.01}) if "@" in comp else (comp, {})
        ref, target, _ = script.zennit_relevance(script.as_float64(model), x, comp, [])
        got = onnx_lrp.Explainer(data, composite=name, start="one-hot", **params).explain(x.numpy(), target=target)
        err = rel_errors(got.relevance, ref)
        assert np.all(err <= TOL), f"{comp}: relative L2 error {err}"


class DenseMap(nn.Module):
    """A detector / segmentation head (PP-OCR's text map): the explained output is N x 1 x H x W with dynamic H x W,
    so its width is known only at run time."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 6, 3, padding=1, stride=2), nn.Conv2d(6, 1, 3, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, x):
        return self.c2(self.up(torch.relu(self.c1(x))))


class Track(nn.Module):
    """A streaming VAD's shape: a fixed batch of 1 and a dynamic length; the output [T'] has no batch axis and is
    explained as one item whose size is known only at run time."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv1d(1, 4, 5, stride=2, padding=2), nn.Conv1d(4, 1, 3, padding=1)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x)))[0, 0]


def test_dense_output_with_dynamic_map_matches_static_export():
    torch.manual_seed(0)
    model = DenseMap().eval()
    rng = np.random.default_rng(6)
    dyn = onnx_lrp.Explainer(_export(model, torch.randn(1, 3, 12, 10), dynamic=True), composite="epsilon-plus-flat")
    for h, w in ((12, 10), (9, 14)):
        x = rng.standard_normal((2, 3, h, w)).astype(np.float32)
        static = onnx_lrp.Explainer(_export(model, torch.from_numpy(x[:1]), dynamic="batch"),
                                    composite="epsilon-plus-flat")
        size = ((h + 1) // 2 * 2) * ((w + 1) // 2 * 2)
        for target in (None, size - 1, [3, 17]):
            got, ref = dyn.explain(x, target=target, position=0), static.explain(x, target=target, position=0)
            np.testing.assert_array_equal(got.target, ref.target)
            np.testing.assert_array_equal(got.position, [0, 0])
            scale = np.abs(ref.relevance).max()
            assert scale > 0
            np.testing.assert_allclose(got.relevance, ref.relevance, rtol=1e-4, atol=1e-5 * scale)
        with pytest.raises(onnx_lrp.InputError, match="out of range.*entries") as info:
            dyn.explain(x, target=size, position=0)  # one past the end: would select nothing
        assert "\n" not in str(info.value)


def test_whole_output_of_dynamic_length_matches_static_export():
    torch.manual_seed(1)
    model = Track().eval()
    f = io.BytesIO()
    torch.onnx.export(model, torch.randn(1, 1, 40), f, input_names=["x"], output_names=["y"], opset_version=17,
                      dynamo=False, dynamic_axes={"x": {2: "t"}})
    dyn = onnx_lrp.Explainer(f.getvalue(), composite="epsilon-plus-flat")
    for t in (40, 27):
        x = np.random.default_rng(t).standard_normal((1, 1, t)).astype(np.float32)
        static = onnx_lrp.Explainer(_export(model, torch.from_numpy(x), dynamic=False), composite="epsilon-plus-flat")
        for target in (None, 3):
            got, ref = dyn.explain(x, target=target), static.explain(x, target=target)
            np.testing.assert_array_equal(got.target, ref.target)
            scale = np.abs(ref.relevance).max()
            assert scale > 0
            np.testing.assert_allclose(got.relevance, ref.relevance, rtol=1e-4, atol=1e-5 * scale)
    with pytest.raises(onnx_lrp.InputError, match="out of range"):
        dyn.explain(x, target=(27 + 1) // 2)


def test_same_padding_with_stride_on_a_dynamic_axis_is_refused_in_one_line():
    from onnx import TensorProto, helper
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 1, 3], np.ones(6, np.float32))
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv_s2", auto_pad="SAME_UPPER",
                                            strides=[2])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, "t"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2, "u"])], initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    with pytest.raises(onnx_lrp.UnsupportedError, match="conv_s2.*auto_pad SAME with a stride > 1") as info:
        onnx_lrp.Explainer(m.SerializeToString(), composite="epsilon")
    assert "\n" not in str(info.value)
