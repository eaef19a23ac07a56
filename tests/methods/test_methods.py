"""onnx_lrp.methods (issue 36, first phase) against captum 0.9 on the same small torch models exported with
torch.onnx: the true gradient from the relevance graph (a ReLU CNN with BatchNorm and MaxPool; an MLP with Tanh,
Sigmoid and an inner Softmax), gradient x input, Integrated Gradients under every integration rule, SmoothGrad /
VarGrad with the same noise fed to both, Occlusion exactly up to float rounding; a residual block, products of
activations, gates and attention (the product rule); and the refusals, one line each."""
from __future__ import annotations

import copy
import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
captum_attr = pytest.importorskip("captum.attr")
nn = torch.nn

from onnx_lrp import InputError, LrpError, UnsupportedError  # noqa: E402
from onnx_lrp.methods import Attributor, attribute  # noqa: E402

TOL = 1e-5  # relative L2, float32 graphs against float32 torch


from captum_nets import CNN, MLP  # noqa: E402
from captum_nets import export as _export  # noqa: E402


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    m = CNN().eval()
    with torch.no_grad():  # a BatchNorm that is not the identity
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
        m.bn.weight.uniform_(0.5, 1.5)
        m.bn.bias.uniform_(-0.3, 0.3)
    x = np.random.default_rng(1).normal(size=(2, 3, 8, 8)).astype(np.float32)
    return m, _export(m, x), x


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(2)
    m = MLP().eval()
    x = np.random.default_rng(3).normal(size=(3, 10)).astype(np.float32)
    return m, _export(m, x), x


@pytest.fixture(scope="module", params=["cnn", "mlp"])
def net(request, cnn, mlp):
    return {"cnn": cnn, "mlp": mlp}[request.param]


def _targets(n):
    return np.arange(n) % 4 + 1


def test_gradient_is_captum_saliency(net):
    module, onnx_bytes, x = net
    t = _targets(len(x))
    attr = Attributor(onnx_bytes, "gradient")
    for abs_ in (False, True):
        ref = captum_attr.Saliency(module).attribute(torch.tensor(x), target=torch.tensor(t), abs=abs_).numpy()
        got = Attributor(onnx_bytes, "gradient", abs=abs_).attribute(x, target=t) if abs_ else \
            attr.attribute(x, target=t)
        assert got.shape == x.shape
        assert _rel(got, ref) <= TOL


def test_gradient_x_input_at_zero_input(cnn):
    """gradient x input is the gradient times x: no division by x, so zero entries of x are no special case."""
    module, onnx_bytes, x = cnn
    x0 = x.copy()
    x0[:, :, :3] = 0.0
    t = _targets(len(x0))
    ref = captum_attr.InputXGradient(module).attribute(torch.tensor(x0), target=torch.tensor(t)).detach().numpy()
    got = attribute(onnx_bytes, x0, "gradient-x-input", target=t)
    assert _rel(got, ref) <= TOL
    assert np.all(got[:, :, :3] == 0)


@pytest.mark.parametrize("integration", ["riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid",
                                         "gausslegendre"])
def test_integrated_gradients_every_rule(net, integration):
    module, onnx_bytes, x = net
    t = _targets(len(x))
    base = np.random.default_rng(5).normal(scale=0.3, size=x.shape).astype(np.float32)
    ref = captum_attr.IntegratedGradients(module).attribute(
        torch.tensor(x), baselines=torch.tensor(base), target=torch.tensor(t), n_steps=12, method=integration)
    got = attribute(onnx_bytes, x, "integrated-gradients", target=t, baselines=base, n_steps=12,
                    integration=integration, internal_batch_size=7)  # 7: chunks that cut through the steps
    assert _rel(got, ref.detach().numpy()) <= TOL


def test_integrated_gradients_scalar_baseline_and_completeness(mlp):
    """A scalar baseline as captum's; with many steps the sum approaches f(x) - f(baseline) (completeness)."""
    module, onnx_bytes, x = mlp
    t = _targets(len(x))
    ref = captum_attr.IntegratedGradients(module).attribute(torch.tensor(x), baselines=0.5, target=torch.tensor(t),
                                                            n_steps=64)
    got = attribute(onnx_bytes, x, "integrated-gradients", target=t, baselines=0.5, n_steps=64)
    assert _rel(got, ref.detach().numpy()) <= TOL
    with torch.no_grad():
        fx = module(torch.tensor(x))[np.arange(len(x)), t].numpy()
        fb = module(torch.full_like(torch.tensor(x), 0.5))[np.arange(len(x)), t].numpy()
    np.testing.assert_allclose(got.reshape(len(x), -1).sum(1), fx - fb, rtol=1e-3, atol=1e-4)


def _captum_noise(x, n, stdev, seed):
    """The noise captum's NoiseTunnel draws after torch.manual_seed(seed), as samples x input shape."""
    torch.manual_seed(seed)
    b = x.shape[0]
    drawn = torch.normal(0, torch.tensor(stdev).repeat((b * n,) + x.shape[1:])).numpy()
    return drawn.reshape((b, n) + x.shape[1:]).swapaxes(0, 1)  # captum: item-major rows


@pytest.mark.parametrize("nt_type", ["smoothgrad", "smoothgrad_sq", "vargrad"])
def test_noise_tunnel_same_noise(net, nt_type):
    module, onnx_bytes, x = net
    t = _targets(len(x))
    noise = _captum_noise(x, 4, 0.2, seed=11)
    torch.manual_seed(11)
    ref = captum_attr.NoiseTunnel(captum_attr.Saliency(module)).attribute(
        torch.tensor(x), nt_type=nt_type, nt_samples=4, stdevs=0.2, target=torch.tensor(t), abs=False).numpy()
    method = "vargrad" if nt_type == "vargrad" else "smoothgrad"
    extra = {} if method == "vargrad" else {"nt_type": nt_type}
    got = attribute(onnx_bytes, x, method, target=t, noise=noise, **extra)
    tol = TOL
    if nt_type == "vargrad":  # E[a^2] - E[a]^2 cancels: captum's own float32 result is off by more than 1e-5
        torch.manual_seed(11)
        ref64 = captum_attr.NoiseTunnel(captum_attr.Saliency(copy.deepcopy(module).double())).attribute(
            torch.tensor(x, dtype=torch.float64), nt_type=nt_type, nt_samples=4, stdevs=0.2,
            target=torch.tensor(t), abs=False).numpy()
        assert _rel(got, ref64) <= 3 * max(_rel(ref, ref64), TOL / 3), (_rel(got, ref64), _rel(ref, ref64))
    assert _rel(got, ref) <= max(tol, 1e-4 if nt_type == "vargrad" else tol)


def test_smoothgrad_of_integrated_gradients_and_of_gxi(mlp):
    """``base=`` any gradient method with its options: the mean of captum's attributions at the same noisy inputs."""
    module, onnx_bytes, x = mlp
    t = _targets(len(x))
    noise = np.random.default_rng(7).normal(scale=0.1, size=(3,) + x.shape).astype(np.float32)
    ig = captum_attr.IntegratedGradients(module)
    ref = np.mean([ig.attribute(torch.tensor(x + e), target=torch.tensor(t), n_steps=8,
                                method="riemann_middle").detach().numpy() for e in noise], axis=0)
    got = attribute(onnx_bytes, x, "smoothgrad", target=t, noise=noise, base="integrated-gradients",
                    base_options={"n_steps": 8, "integration": "riemann_middle"})
    assert _rel(got, ref) <= TOL
    gxi = captum_attr.InputXGradient(module)
    ref = np.mean([gxi.attribute(torch.tensor(x + e), target=torch.tensor(t)).detach().numpy() for e in noise], axis=0)
    assert _rel(attribute(onnx_bytes, x, "smoothgrad", target=t, noise=noise, base="gradient-x-input"), ref) <= TOL


def test_smoothgrad_of_a_composite_is_the_mean_of_lrp(cnn):
    """``base=`` an LRP composite: the mean of onnx-lrp's own LRP at the noisy inputs (one item at a time)."""
    import onnx_lrp
    _, onnx_bytes, x = cnn
    noise = np.random.default_rng(8).normal(scale=0.1, size=(3,) + x.shape).astype(np.float32)
    explainer = onnx_lrp.Explainer(onnx_bytes, composite="epsilon-plus-flat")
    ref = np.mean([explainer.explain(x + e, target=[1, 2]).relevance for e in noise], axis=0)
    got = attribute(onnx_bytes, x, "smoothgrad", target=[1, 2], noise=noise, base="epsilon-plus-flat")
    assert _rel(got, ref) <= TOL


def test_seeded_noise_repeats(mlp):
    _, onnx_bytes, x = mlp
    a = attribute(onnx_bytes, x, "smoothgrad", target=1, nt_samples=3, stdevs=0.3, seed=4)
    b = attribute(onnx_bytes, x, "smoothgrad", target=1, nt_samples=3, stdevs=0.3, seed=4)
    c = attribute(onnx_bytes, x, "smoothgrad", target=1, nt_samples=3, stdevs=0.3, seed=5)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize("window,strides", [((3, 3, 3), (1, 2, 2)), ((1, 4, 4), (1, 4, 4)), ((3, 5, 3), (2, 3, 2))])
def test_occlusion_is_captums(cnn, window, strides):
    module, onnx_bytes, x = cnn
    t = _targets(len(x))
    ref = captum_attr.Occlusion(module).attribute(torch.tensor(x), sliding_window_shapes=window, strides=strides,
                                                   baselines=0.25, target=torch.tensor(t)).numpy()
    got = attribute(onnx_bytes, x, "occlusion", target=t, sliding_window_shapes=window, strides=strides,
                    baselines=0.25, internal_batch_size=5)
    scale = np.abs(ref).max()
    np.testing.assert_allclose(got, ref, rtol=0, atol=scale * 4e-6)


def test_single_item_without_batch_axis_and_argmax_target(cnn):
    module, onnx_bytes, x = cnn
    with torch.no_grad():
        t = int(module(torch.tensor(x[:1])).argmax())
    ref = captum_attr.Saliency(module).attribute(torch.tensor(x[:1]), target=t, abs=False).numpy()[0]
    got = attribute(onnx_bytes, x[0], "gradient")
    assert got.shape == x[0].shape and _rel(got, ref) <= TOL


def _one_line(exc: pytest.ExceptionInfo, *words):
    text = str(exc.value)
    assert "\n" not in text and isinstance(exc.value, LrpError)
    for w in words:
        assert w in text, text


def test_refusals_one_line(cnn, mlp):
    _, cnn_bytes, x = cnn
    with pytest.raises(InputError) as exc:
        attribute(cnn_bytes, x, "occlusion", target=1, sliding_window_shapes=(3, 9, 3))
    _one_line(exc, "larger than the input", "3 x 9 x 3")
    with pytest.raises(InputError) as exc:
        attribute(cnn_bytes, x, "integrated-gradients", target=1, integration="simpson")
    _one_line(exc, "integration", "simpson")
    with pytest.raises(InputError) as exc:
        attribute(cnn_bytes, x, "integrated-gradients", target=1, steps=3)
    _one_line(exc, "no option steps", "n_steps")
    with pytest.raises(InputError) as exc:
        attribute(cnn_bytes, x, "gradcam", target=1)
    _one_line(exc, "unknown method", "gradcam")
    with pytest.raises(InputError) as exc:
        attribute(cnn_bytes, x, "integrated-gradients", target=1, baselines=np.zeros((4, 4)))
    _one_line(exc, "baselines", "broadcast")


class Ids(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.fc = nn.Embedding(20, 6), nn.Linear(6, 3)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


def test_integer_input_refused_for_integrated_gradients():
    torch.manual_seed(0)
    ids = np.array([[1, 4, 7]], np.int64)
    onnx_bytes = _export(Ids().eval(), ids)
    with pytest.raises(InputError) as exc:
        attribute(onnx_bytes, ids, "integrated-gradients", target=0)
    _one_line(exc, "'x'", "int64", "not float")


class Picked(nn.Module):
    """The output depends on the input through an ArgMax: no gradient on that path."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x):
        k = self.a(x).argmax(dim=1, keepdim=True).float()
        return self.b(x) * k


def test_argmax_path_refused_naming_the_node():
    torch.manual_seed(0)
    x = np.random.default_rng(0).normal(size=(2, 5)).astype(np.float32)
    onnx_bytes = _export(Picked().eval(), x)
    with pytest.raises(UnsupportedError) as exc:
        attribute(onnx_bytes, x, "gradient", target=0)
    _one_line(exc, "ArgMax", "/ArgMax", "occlusion")


class Normed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.ln, self.b = nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.relu(self.ln(self.a(x))))


def test_layernorm_true_gradient_not_held_scale():
    """LayerNorm's LRP rules hold its scale; the gradient methods take its true gradient (through the mean and the
    std, onnx_lrp.methods.normgrad): Integrated Gradients as captum's; occlusion (forwards only) as captum's."""
    torch.manual_seed(0)
    x = np.random.default_rng(0).normal(size=(2, 6)).astype(np.float32)
    module = Normed().eval()
    onnx_bytes = _export(module, x)
    ref = captum_attr.IntegratedGradients(module).attribute(torch.tensor(x), target=0, n_steps=8).detach().numpy()
    assert _rel(attribute(onnx_bytes, x, "integrated-gradients", target=0, n_steps=8), ref) <= TOL
    ref = captum_attr.Occlusion(module).attribute(torch.tensor(x), sliding_window_shapes=(2,), target=0).numpy()
    got = attribute(onnx_bytes, x, "occlusion", target=0, sliding_window_shapes=(2,))
    np.testing.assert_allclose(got, ref, rtol=0, atol=np.abs(ref).max() * 4e-6)


def test_gradient_of_a_softmax_output_is_of_the_probability(mlp):
    """A model whose output is a softmax: the gradient methods explain the output as it is (captum's convention),
    not the logits behind it (LRP's)."""
    module, _, x = mlp
    wrapped = nn.Sequential(module, nn.Softmax(dim=1)).eval()
    onnx_bytes = _export(wrapped, x)
    t = _targets(len(x))
    base = np.full_like(x, -0.2)
    ref = captum_attr.IntegratedGradients(wrapped).attribute(torch.tensor(x), baselines=torch.tensor(base),
                                                             target=torch.tensor(t), n_steps=16).detach().numpy()
    got = attribute(onnx_bytes, x, "integrated-gradients", target=t, baselines=base, n_steps=16)
    assert _rel(got, ref) <= TOL


def test_memory_budget_chunks_give_the_same_result(cnn):
    """A budget of one row per run: IG's 2 x 6 stacked rows in 12 runs, the same numbers as in one run."""
    _, onnx_bytes, x = cnn
    whole = attribute(onnx_bytes, x, "integrated-gradients", target=[0, 3], n_steps=6, internal_batch_size=12)
    tiny = attribute(onnx_bytes, x, "integrated-gradients", target=[0, 3], n_steps=6, memory_budget=1)
    np.testing.assert_allclose(tiny, whole, rtol=1e-6, atol=1e-7 * np.abs(whole).max())


def test_more_refusals_one_line(cnn):
    _, onnx_bytes, x = cnn
    with pytest.raises(InputError) as exc:
        attribute(onnx_bytes, x, "occlusion", target=1, sliding_window_shapes=(1, 2, 2), strides=(1, 3, 3))
    _one_line(exc, "strides", "skipped")
    with pytest.raises(InputError) as exc:
        attribute(onnx_bytes, x, "smoothgrad", target=1, noise=np.zeros((3, 2, 3, 8, 7), np.float32))
    _one_line(exc, "noise has shape", "(3, 2, 3, 8, 7)")
    with pytest.raises(InputError) as exc:
        attribute(onnx_bytes, x, "smoothgrad", target=1, nt_samples=4, noise=np.zeros((3,) + x.shape, np.float32))
    _one_line(exc, "noise has 3 samples", "nt_samples says 4")
    with pytest.raises(InputError) as exc:
        attribute(onnx_bytes, x, "vargrad", target=1, nt_type="smoothgrad")
    _one_line(exc, "vargrad")
    with pytest.raises(InputError) as exc:
        attribute(onnx_bytes, x, "smoothgrad", target=1, base="occlusion")
    _one_line(exc, "base 'occlusion'")
    with pytest.raises(InputError) as exc:
        attribute(onnx_bytes, x, "gradient", target=7)
    _one_line(exc, "target 7", "5 entries")
    with pytest.raises(InputError) as exc:
        attribute(onnx_bytes, x, "occlusion", target=7, sliding_window_shapes=(3, 4, 4), strides=4)
    _one_line(exc, "target 7", "5 entries")


def test_occlusion_single_item_float64_and_argmax(cnn):
    """One item without its batch axis, in float64 (cast to the model's float32), target None: the arg-max."""
    module, onnx_bytes, x = cnn
    with torch.no_grad():
        t = int(module(torch.tensor(x[1:])).argmax())
    ref = captum_attr.Occlusion(module).attribute(torch.tensor(x[1:]), sliding_window_shapes=(3, 2, 2), strides=2,
                                                   target=t).numpy()[0]
    got = attribute(onnx_bytes, x[1].astype(np.float64), "occlusion", sliding_window_shapes=(3, 2, 2), strides=2)
    assert got.shape == x[1].shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=np.abs(ref).max() * 4e-6)


def test_smoothgrad_of_a_composite_with_argmax_target(cnn):
    """target None with an LRP base: the arg-max at the clean input, kept for every noisy sample."""
    import onnx_lrp
    module, onnx_bytes, x = cnn
    with torch.no_grad():
        t = module(torch.tensor(x)).argmax(1).numpy()
    noise = np.random.default_rng(9).normal(scale=0.5, size=(2,) + x.shape).astype(np.float32)
    explainer = onnx_lrp.Explainer(onnx_bytes, composite="epsilon")
    ref = np.mean([explainer.explain(x + e, target=t).relevance for e in noise], axis=0)
    got = attribute(onnx_bytes, x, "smoothgrad", noise=noise, base="epsilon")
    assert _rel(got, ref) <= TOL


class Residual(nn.Module):
    """A ResNet basic block (conv-BN-ReLU-conv-BN + skip), a global average pool, a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.c1, self.b1 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.c2, self.b2 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(h + self.b2(self.c2(torch.relu(self.b1(self.c1(h))))))
        return self.head(nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))


def test_residual_block_gradient_and_ig():
    torch.manual_seed(4)
    module = Residual().eval()
    with torch.no_grad():
        for bn in (module.b1, module.b2):
            bn.running_var.uniform_(0.5, 2.0)
            bn.running_mean.uniform_(-0.3, 0.3)
    x = np.random.default_rng(4).normal(size=(2, 3, 6, 6)).astype(np.float32)
    onnx_bytes = _export(module, x)
    t = np.array([0, 2])
    ref = captum_attr.Saliency(module).attribute(torch.tensor(x), target=torch.tensor(t), abs=False).numpy()
    assert _rel(attribute(onnx_bytes, x, "gradient", target=t), ref) <= TOL
    ref = captum_attr.IntegratedGradients(module).attribute(torch.tensor(x), target=torch.tensor(t), n_steps=10)
    assert _rel(attribute(onnx_bytes, x, "integrated-gradients", target=t, n_steps=10), ref.detach().numpy()) <= TOL


class Products(nn.Module):
    """Products of two activations and a sigmoid gate (h * sigmoid(s)), one attention head (Q K^T, softmax, A V),
    and an ArgMax of the logits as a second output (off the explained path: no refusal)."""

    def __init__(self):
        super().__init__()
        self.a, self.c = nn.Linear(4, 4), nn.Linear(4, 4)
        self.q, self.k, self.v, self.o = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(20, 3)

    def forward(self, x):
        h, u = self.a(x), self.c(x)
        h = u * torch.sigmoid(h) + torch.tanh(u) * h
        att = torch.softmax(self.q(h) @ self.k(h).transpose(1, 2) / 2.0, dim=-1)
        y = self.o((att @ self.v(h)).flatten(1))
        return y, y.argmax(dim=1)


def test_products_gates_attention_take_the_product_rule():
    torch.manual_seed(6)
    module = Products().eval()
    x = np.random.default_rng(6).normal(size=(2, 5, 4)).astype(np.float32)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.tensor(x),), f, input_names=["x"], output_names=["y", "label"],
                          opset_version=17, dynamo=False, dynamic_axes={"x": {0: "N"}})
    first = lambda inp: module(inp)[0]  # noqa: E731
    t = np.array([2, 0])
    ref = captum_attr.Saliency(first).attribute(torch.tensor(x), target=torch.tensor(t), abs=False).numpy()
    assert _rel(attribute(f.getvalue(), x, "gradient", target=t), ref) <= TOL
    ref = captum_attr.IntegratedGradients(first).attribute(torch.tensor(x), target=torch.tensor(t), n_steps=8)
    got = attribute(f.getvalue(), x, "integrated-gradients", target=t, n_steps=8)
    assert _rel(got, ref.detach().numpy()) <= TOL
