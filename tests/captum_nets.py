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
