"""The two small torch models that onnx_lrp.methods is checked on against captum (tests/methods/test_methods.py
live, scripts/make_captum_goldens.py for the stored goldens), and their torch.onnx export: one definition for both."""
from __future__ import annotations

import io
import warnings

import torch
from torch import nn


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 8, 3)
        self.fc = nn.Linear(8 * 2 * 2, 5)

    def forward(self, x):
        h = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(torch.relu(self.conv2(h)).flatten(1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(10, 16), nn.Linear(16, 12), nn.Linear(12, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        h = torch.sigmoid(self.b(h)) + 0.25 * h[:, :12]
        return self.c(3.0 * torch.softmax(h, dim=1))


def export(module, x) -> bytes:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.as_tensor(x),), f, input_names=["x"], output_names=["y"], opset_version=17,
                          dynamo=False, dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    return f.getvalue()


# ---------------------------------------------------------------------------------------------- parity models
# (tests/methods/test_methods_parity_models.py, scripts/make_captum_goldens.py models): small widths, real shapes

def resnet_small(seed: int = 0) -> nn.Module:
    """A torchvision ResNet18-shaped network (7x7 stem, max pool, 4 stages of 2 BasicBlocks with BatchNorm and
    1x1 downsampling, average pool, linear head) at widths 4, 8, 16, 16; the BatchNorms' statistics random."""
    from torchvision.models.resnet import BasicBlock

    torch.manual_seed(seed)

    def stage(inplanes, planes, stride):
        down = None if stride == 1 and inplanes == planes else nn.Sequential(
            nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        return nn.Sequential(BasicBlock(inplanes, planes, stride, down), BasicBlock(planes, planes))

    net = nn.Sequential(nn.Conv2d(3, 4, 7, 2, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                        stage(4, 4, 1), stage(4, 8, 2), stage(8, 16, 2), stage(16, 16, 2),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return net.eval()


class BertLike(nn.Module):
    """A BERT-shaped sequence classifier on ``inputs_embeds`` (N x T x D, the word embeddings' output): position
    embeddings, LayerNorm, one encoder layer (multi-head self-attention, residual + LayerNorm, GELU feed-forward,
    residual + LayerNorm), a tanh pooler on the first token and a linear classifier."""

    def __init__(self, d: int = 8, heads: int = 2, t: int = 6, classes: int = 3):
        super().__init__()
        self.heads = heads
        self.pos = nn.Parameter(0.1 * torch.randn(t, d))
        self.ln0, self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ff1, self.ff2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.pool, self.cls = nn.Linear(d, d), nn.Linear(d, classes)
        with torch.no_grad():
            for ln in (self.ln0, self.ln1, self.ln2):
                ln.weight.uniform_(0.5, 1.5)
                ln.bias.uniform_(-0.2, 0.2)

    def _split(self, a):
        n, t, d = a.shape
        return a.reshape(n, t, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, e):
        h = self.ln0(e + self.pos)
        q, k, v = self._split(self.q(h)), self._split(self.k(h)), self._split(self.v(h))
        att = torch.softmax(q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5), dim=-1) @ v
        h = self.ln1(h + self.o(att.transpose(1, 2).reshape(h.shape)))
        h = self.ln2(h + self.ff2(nn.functional.gelu(self.ff1(h))))
        return self.cls(torch.tanh(self.pool(h[:, 0])))


class LSTMNet(nn.Module):
    """An LSTM sequence classifier: N x T x F -> LSTM (batch first) -> the last step's hidden state -> linear."""

    def __init__(self, f: int = 4, hidden: int = 6, classes: int = 3):
        super().__init__()
        self.lstm, self.fc = nn.LSTM(f, hidden, batch_first=True), nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc(self.lstm(x)[0][:, -1])


def plain_cnn(seed: int = 0) -> nn.Module:
    """A Sequential CNN without BatchNorm (Conv, ReLU, MaxPool, Conv, ReLU, Linear): zennit's EpsilonPlusFlat needs
    no canonizer on it, so zennit's attributors over it are onnx-lrp's methods over epsilon-plus-flat."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 8, 3), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 2 * 2, 5)).eval()


class TwoInputs(nn.Module):
    """Two float inputs (a vector u: N x 4, a sequence v: N x 2 x 5) joined before a linear head."""

    def __init__(self):
        super().__init__()
        self.a, self.c, self.fc = nn.Linear(4, 6), nn.Conv1d(2, 3, 3), nn.Linear(6 + 3 * 3, 3)

    def forward(self, u, v):
        return self.fc(torch.cat([torch.tanh(self.a(u)), torch.relu(self.c(v)).flatten(1)], 1))


def export_inputs(module, xs: tuple, names: tuple) -> bytes:
    """torch.onnx export of a model with several inputs (batch axis dynamic)."""
    f = io.BytesIO()
    axes = {n: {0: "N"} for n in names + ("y",)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(torch.as_tensor(x) for x in xs), f, input_names=list(names),
                          output_names=["y"], opset_version=17, dynamo=False, dynamic_axes=axes)
    return f.getvalue()


def seeded_cnn() -> CNN:
    """The CNN of the stored goldens: seed 10, BatchNorm statistics and affine drawn away from the identity."""
    torch.manual_seed(10)
    cnn = CNN().eval()
    with torch.no_grad():
        cnn.bn.running_mean.uniform_(-0.5, 0.5)
        cnn.bn.running_var.uniform_(0.5, 2.0)
        cnn.bn.weight.uniform_(0.5, 1.5)
        cnn.bn.bias.uniform_(-0.3, 0.3)
    return cnn
