"""Regenerate tests/goldens/selection_cnn* and tests/goldens/sdpa_opset*.onnx.

selection_cnn*: a small CNN with GroupNorm, InstanceNorm, bilinear and nearest
upsampling, torch.maximum, topk and gather, exported by TorchScript (opset 18: GroupNorm written as
InstanceNormalization) and by dynamo (opset 21: GroupNormalization), and the reference relevance of attnlrp:
gradient x input of the same network with the normalising std detached (LXT's convention), for the target logit.

sdpa_opset23_dynamo.onnx / sdpa_opset18_torchscript.onnx: a small causal self-attention block
(F.scaled_dot_product_attention), which dynamo writes as one ONNX Attention node at opset 23 and TorchScript as
MatMul/Softmax at opset 18; the input is sdpa_x.npy.

    python scripts/make_selection_goldens.py   (needs torch; writes < 100 KB)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = Path(__file__).resolve().parent.parent / "tests" / "goldens"


def _held_norm(h, groups, weight, bias, eps=1e-5):
    g = h.reshape(h.shape[0], groups, -1)
    m = g.mean(2, keepdim=True)
    v = g.var(2, unbiased=False, keepdim=True)
    return ((g - m) / (v + eps).sqrt().detach()).reshape(h.shape) * weight[:, None, None] + bias[:, None, None]


class SelectionCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.inorm = nn.InstanceNorm2d(8, affine=True)
        self.fc = nn.Linear(8 * 4, 5)

    def forward(self, x, held: bool = False):
        h = self.c1(x)
        h = _held_norm(h, 2, self.gn.weight, self.gn.bias) if held else self.gn(h)
        h = F.relu(h)
        up = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)
        near = F.interpolate(h, scale_factor=2, mode="nearest")
        k = self.c2(up)
        k = _held_norm(k, 8, self.inorm.weight, self.inorm.bias) if held else self.inorm(k)
        h = torch.maximum(k, near)
        vals, idx = torch.topk(h.flatten(2), 4, dim=2)
        picked = torch.gather(h.flatten(2), 2, idx)
        return self.fc((vals + picked).flatten(1))


class SDPA(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (f(x).reshape(b, t, 2, 4).transpose(1, 2) for f in (self.q, self.k, self.v))
        h = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, 8)
        return self.o(h.mean(1))


def attention_exports() -> None:
    torch.manual_seed(1)
    net = SDPA().eval()
    x = torch.randn(2, 5, 8)
    torch.onnx.export(net, (x,), None, input_names=["x"], output_names=["y"], opset_version=23,
                      dynamo=True).save(str(OUT / "sdpa_opset23_dynamo.onnx"))
    torch.onnx.export(net, (x,), str(OUT / "sdpa_opset18_torchscript.onnx"), input_names=["x"], output_names=["y"],
                      opset_version=18, dynamo=False)
    np.save(OUT / "sdpa_x.npy", x.numpy())


def main() -> int:
    attention_exports()
    torch.manual_seed(0)
    net = SelectionCNN().eval()
    with torch.no_grad():  # non-trivial affine parameters of the norms
        for norm in (net.gn, net.inorm):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 3, 6, 6)
    torch.onnx.export(net, (x,), str(OUT / "selection_cnn_torchscript.onnx"), input_names=["x"], output_names=["y"],
                      opset_version=18, dynamo=False, dynamic_axes={"x": {0: "batch"}})
    prog = torch.onnx.export(net, (x,), None, input_names=["x"], output_names=["y"], opset_version=21, dynamo=True)
    prog.save(str(OUT / "selection_cnn_dynamo.onnx"))
    xr = x.clone().requires_grad_(True)
    y = net(xr, held=True)
    target = y.argmax(1)
    y.gather(1, target[:, None]).sum().backward()
    np.savez(OUT / "selection_cnn.npz", x=x.numpy(), y=y.detach().numpy(), target=target.numpy(),
             relevance=(xr.grad * xr).detach().numpy())
    return 0


if __name__ == "__main__":
    sys.exit(main())
