"""The same small transformer in Flax (nnx) and PyTorch with the same weights, exported by jax2onnx and by
torch.onnx, for tests/parity/test_framework_twins.py::test_flax_transformer_twin.

    python scripts/make_transformer_twins.py [--out tests/goldens/twins]

Writes ``transformer_flax.onnx`` (jax2onnx: LayerNorm written out with Flax's fast variance
``max(mean(x*x) - mean(x)**2, 0)``, nnx.MultiHeadAttention as Gemm/Reshape/MatMul/Softmax, tanh GELU),
``transformer_torch.onnx`` (TorchScript, opset 17: LayerNormalization ops, einsum projections) and
``transformer.npz`` (the input ``x`` and both frameworks' outputs ``y_flax``, ``y_torch``).
Net: tokens of 6 features -> Linear(16) -> 2 pre-norm blocks (LayerNorm, 4-head self-attention, LayerNorm,
MLP 16-32-16 with GELU) -> LayerNorm -> mean over tokens -> Linear(3).
Needs jax, flax, jax2onnx and torch (only to regenerate; made with jax 0.10 / flax 0.12.8 / jax2onnx 0.17.1 /
torch 2.14).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def flax_net():
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, d, rngs):
            self.ln1 = nnx.LayerNorm(d, rngs=rngs)
            self.att = nnx.MultiHeadAttention(num_heads=4, in_features=d, decode=False, rngs=rngs)
            self.ln2 = nnx.LayerNorm(d, rngs=rngs)
            self.fc1 = nnx.Linear(d, 2 * d, rngs=rngs)
            self.fc2 = nnx.Linear(2 * d, d, rngs=rngs)

        def __call__(self, x):
            h = self.ln1(x)
            x = x + self.att(h, h, h)
            return x + self.fc2(nnx.gelu(self.fc1(self.ln2(x))))

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.emb = nnx.Linear(6, 16, rngs=rngs)
            self.b1, self.b2 = Block(16, rngs), Block(16, rngs)
            self.ln = nnx.LayerNorm(16, rngs=rngs)
            self.head = nnx.Linear(16, 3, rngs=rngs)

        def __call__(self, x):
            return self.head(self.ln(self.b2(self.b1(self.emb(x)))).mean(axis=1))

    return Net(nnx.Rngs(0))


def torch_twin(net):
    import torch

    def p(a):
        return torch.tensor(np.asarray(a))

    def linear(lin, f):
        lin.weight.data, lin.bias.data = p(f.kernel.value).T.contiguous(), p(f.bias.value)
        return lin

    def norm(f):
        ln = torch.nn.LayerNorm(16, eps=1e-6)  # Flax's default epsilon
        ln.weight.data, ln.bias.data = p(f.scale.value), p(f.bias.value)
        return ln

    class Block(torch.nn.Module):
        def __init__(self, b):
            super().__init__()
            self.ln1, self.ln2 = norm(b.ln1), norm(b.ln2)
            a = b.att  # kernels (in, heads, head_dim) and (heads, head_dim, out)
            self.wq, self.bq = torch.nn.Parameter(p(a.query.kernel.value)), torch.nn.Parameter(p(a.query.bias.value))
            self.wk, self.bk = torch.nn.Parameter(p(a.key.kernel.value)), torch.nn.Parameter(p(a.key.bias.value))
            self.wv, self.bv = torch.nn.Parameter(p(a.value.kernel.value)), torch.nn.Parameter(p(a.value.bias.value))
            self.wo, self.bo = torch.nn.Parameter(p(a.out.kernel.value)), torch.nn.Parameter(p(a.out.bias.value))
            self.fc1 = linear(torch.nn.Linear(16, 32), b.fc1)
            self.fc2 = linear(torch.nn.Linear(32, 16), b.fc2)

        def forward(self, x):
            h = self.ln1(x)
            q = torch.einsum("bti,ihd->bhtd", h, self.wq) + self.bq[None, :, None, :]
            k = torch.einsum("bti,ihd->bhtd", h, self.wk) + self.bk[None, :, None, :]
            v = torch.einsum("bti,ihd->bhtd", h, self.wv) + self.bv[None, :, None, :]
            a = torch.softmax(q / q.shape[-1] ** 0.5 @ k.transpose(-1, -2), -1)
            x = x + torch.einsum("bhtd,hdo->bto", a @ v, self.wo) + self.bo
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = linear(torch.nn.Linear(6, 16), net.emb)
            self.b1, self.b2 = Block(net.b1), Block(net.b2)
            self.ln = norm(net.ln)
            self.head = linear(torch.nn.Linear(16, 3), net.head)

        def forward(self, x):
            return self.head(self.ln(self.b2(self.b1(self.emb(x)))).mean(1))

    return Net().eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "goldens" / "twins")
    args = ap.parse_args()
    import jax.numpy as jnp
    import torch
    from jax2onnx import to_onnx

    net = flax_net()
    twin = torch_twin(net)
    x = np.random.default_rng(0).standard_normal((4, 5, 6)).astype(np.float32)
    y_flax = np.asarray(net(jnp.asarray(x)))
    with torch.no_grad():
        y_torch = twin(torch.tensor(x)).numpy()
    print("forward |flax - torch|:", float(np.abs(y_flax - y_torch).max()))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transformer_flax.onnx").write_bytes(
        to_onnx(net, [("B", 5, 6)], model_name="transformer_flax").SerializeToString())
    torch.onnx.export(twin, (torch.tensor(x),), str(args.out / "transformer_torch.onnx"), dynamo=False,
                      opset_version=17, input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "B"}})
    np.savez(args.out / "transformer.npz", x=x, y_flax=y_flax, y_torch=y_torch)


if __name__ == "__main__":
    main()
