"""The gradient methods' ReLU derivative in onnxruntime's blocked layout (onnx_lrp.methods.gradients): for float32
(N, C, H, W) tensors with C a multiple of 16 the mask [y > 0] is a per-channel 1x1 Conv and a HardSigmoid. It must
be the same 0/1 mask as torch's ReLU backward at every float32 y >= 0: 0 at +0 and -0, 1 at the least denormal, at
denormals, at the least normal and at values whose scaled copies overflow to inf. Checked against captum's Saliency
(torch autograd) on a residual CNN whose first ReLU reads the input itself (so the mask sees the chosen values), and
the graph written: the blocked mask at every such ReLU, Greater / Cast where the channels are not a multiple of 16."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
captum_attr = pytest.importorskip("captum.attr")
onnx = pytest.importorskip("onnx")
nn = torch.nn

from onnx_lrp.methods import Attributor  # noqa: E402

TOL = 1e-5  # relative L2, float32 graph against float32 torch
SPECIAL = np.array([0.0, -0.0, 1e-45, 1e-40, 1.1754944e-38, 1e-30, 3.0, 1e30, -1e-45, -2.0], np.float32)


class ResidualNet(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv0 = nn.Conv2d(c, c, 3, padding=1)
        self.conv1 = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(2 * c, 2 * c, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * c, 5)

    def forward(self, x):
        h = torch.relu(self.conv0(torch.relu(x)))
        h = torch.relu(self.conv1(h))
        h = torch.relu(self.conv2(h) + h)  # the branch gradients summed at the skip
        return self.fc(torch.flatten(self.pool(h), 1))


def _export(module, x) -> bytes:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.as_tensor(x),), f, input_names=["x"], output_names=["y"], opset_version=17,
                          dynamo=False, dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    return f.getvalue()


def _net(c: int, seed: int = 0):
    torch.manual_seed(seed)
    m = ResidualNet(c).eval()
    x = np.random.default_rng(seed).normal(size=(3, c, 8, 8)).astype(np.float32)
    x.reshape(-1)[: 4 * len(SPECIAL)] = np.tile(SPECIAL, 4)  # every special value in several channels and rows
    return m, _export(m, x), x


@pytest.fixture(scope="module")
def net16():
    return _net(16)


def _relevance_ops(onnx_bytes) -> list[str]:
    a = Attributor(onnx_bytes, "gradient")
    model = onnx.load_from_string(a.engine.runner.relevance_model.model_bytes)
    return [n.op_type for n in model.graph.node if n.name.startswith("lrp/") and "/Relu" in n.name]


def test_mask_is_torch_relu_backward_at_every_special_value(net16):
    module, onnx_bytes, x = net16
    t = np.array([0, 3, 4])
    ref = captum_attr.Saliency(module).attribute(torch.tensor(x), target=torch.tensor(t), abs=False).numpy()
    got = Attributor(onnx_bytes, "gradient").attribute(x, target=t)
    rel = float(np.linalg.norm((got - ref).astype(np.float64)) / np.linalg.norm(ref.astype(np.float64)))
    assert rel <= TOL
    flat_x, flat_g, flat_r = x.reshape(-1), got.reshape(-1), ref.reshape(-1)
    special = slice(0, 4 * len(SPECIAL))
    assert np.array_equal(flat_g[special] == 0, flat_r[special] == 0)  # the same mask at every special value
    off = flat_x[special] <= 0
    assert np.all(flat_g[special][off] == 0) and np.all(flat_g[special][~off] != 0)
    on = ~off
    np.testing.assert_allclose(flat_g[special][on], flat_r[special][on], rtol=1e-4, atol=1e-6 * np.abs(ref).max())


def test_integrated_gradients_through_the_blocked_mask(net16):
    module, onnx_bytes, x = net16
    x = np.random.default_rng(7).normal(size=x.shape).astype(np.float32)  # IG scales x: no extremes here
    t = np.array([1, 2, 0])
    ref = captum_attr.IntegratedGradients(module).attribute(torch.tensor(x), target=torch.tensor(t),
                                                            n_steps=6, method="riemann_trapezoid").numpy()
    got = Attributor(onnx_bytes, "integrated-gradients", n_steps=6, integration="riemann_trapezoid").attribute(
        x, target=t)
    assert float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) <= TOL


def test_blocked_mask_written_only_for_channels_of_the_block(net16):
    ops = _relevance_ops(net16[1])
    assert "Greater" not in ops and "Cast" not in ops
    assert ops.count("HardSigmoid") == 4  # per ReLU: a per-channel Conv and HardSigmoid
    # and the upstream gradient entered into the blocked layout where it is not there already: after the average
    # pool's Expand and after the stride-2 ConvTranspose, not after the skip connection's sum of blocked tensors
    assert ops.count("Conv") == 4 + 2
    ops12 = _relevance_ops(_net(12)[1])  # 12, 24 channels: not a multiple of the block, Greater and Cast
    assert ops12.count("Greater") == 4 and ops12.count("Cast") == 4 and "Conv" not in ops12


def test_mask_without_onnxruntime_fusions(net16):
    """Run as written (onnxruntime's basic optimisations: no layout change, the Conv and HardSigmoid not fused,
    HardSigmoid's own kernel, as on other providers): the same gradient."""
    ort = pytest.importorskip("onnxruntime")
    from onnx_lrp.core.interface import ONE_HOT_INPUT, RELEVANCE_PREFIX, TARGET_INPUT

    module, onnx_bytes, x = net16
    t = np.array([2, 0, 4])
    a = Attributor(onnx_bytes, "gradient")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(a.engine.runner.relevance_model.model_bytes, opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    feeds = {k: v for k, v in {"x": x, TARGET_INPUT: t, ONE_HOT_INPUT: np.array(True)}.items() if k in names}
    got = sess.run([RELEVANCE_PREFIX + "x"], feeds)[0]
    ref = captum_attr.Saliency(module).attribute(torch.tensor(x), target=torch.tensor(t), abs=False).numpy()
    assert float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) <= TOL
    special = slice(0, 4 * len(SPECIAL))
    assert np.array_equal(got.reshape(-1)[special] == 0, ref.reshape(-1)[special] == 0)
