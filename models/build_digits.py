"""Rebuild the demo model ``models/digits_cnn.onnx`` and its sample inputs (deterministic).

A small CNN trained on scikit-learn's bundled digits data set (1797 grey 8x8 images of the digits 0-9),
upsampled to 16x16 and scaled to [0, 1]. Torch and scikit-learn are needed here only, never at run time::

    pip install torch scikit-learn
    python models/build_digits.py          # about 15 s on 2 cores

Writes, next to this script:

* ``digits_cnn.onnx``          the model, opset 17, dynamic batch; input ``image`` float32 [N,1,16,16] in [0,1],
                                outputs ``logits`` [N,10] and ``probabilities`` [N,10] (softmax of the logits)
* ``digits_heldout.npz``       the held-out quarter of the data: ``images`` uint8 [450,1,16,16] (value*255),
                                ``labels`` int64 [450]; the accuracy in README.md is measured on it
* ``samples/png/digit_<k>.png``  one held-out image per class, 16x16 8-bit grey
* ``samples/npy/digit_<k>.npy``  the same image as float32 [1,16,16] (exactly png/255)
* ``samples/batch.npy``        all ten as one float32 batch [10,1,16,16]
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn import functional as F

HERE = Path(__file__).resolve().parent
SEED = 0
SIZE = 16
EPOCHS = 25


def data():
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0  # [N,1,8,8] in [0,1]
    x = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False).clamp(0, 1)
    x = np.round(x.numpy() * 255).astype(np.uint8)  # what a PNG can hold: inputs are exactly k/255
    y = digits.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.25, random_state=SEED, stratify=y)


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),         # 8x8
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))         # 4x4
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Dropout(0.25),
                                        nn.Linear(64, 10))

    def forward(self, x):
        logits = self.classifier(self.features(x))
        return logits, torch.softmax(logits, dim=1)


def main():
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(2)
    x_tr, x_te, y_tr, y_te = data()
    xt = torch.tensor(x_tr, dtype=torch.float32) / 255
    yt = torch.tensor(y_tr)
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(SEED)
    for epoch in range(EPOCHS):
        model.train()
        perm = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            # light augmentation: shift by up to one pixel
            dx, dy = torch.randint(-1, 2, (2,), generator=gen).tolist()
            xb = torch.roll(xt[idx], shifts=(dy, dx), dims=(2, 3))
            loss = F.cross_entropy(model(xb)[0], yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        pred = model(torch.tensor(x_te, dtype=torch.float32) / 255)[0].argmax(1).numpy()
    correct = int((pred == y_te).sum())
    print(f"held-out accuracy: {correct}/{len(y_te)} = {correct / len(y_te):.4f}")

    buf = io.BytesIO()
    torch.onnx.export(model, torch.zeros(1, 1, SIZE, SIZE), buf, input_names=["image"],
                      output_names=["logits", "probabilities"], opset_version=17, dynamo=False,
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}, "probabilities": {0: "batch"}})
    (HERE / "digits_cnn.onnx").write_bytes(buf.getvalue())
    np.savez_compressed(HERE / "digits_heldout.npz", images=x_te, labels=y_te)

    samples = HERE / "samples"
    (samples / "png").mkdir(parents=True, exist_ok=True)
    (samples / "npy").mkdir(parents=True, exist_ok=True)
    batch = []
    for k in range(10):
        i = int(np.flatnonzero((y_te == k) & (pred == k))[0])  # first correctly classified held-out k
        img = x_te[i, 0]
        Image.fromarray(img, mode="L").save(samples / "png" / f"digit_{k}.png")
        arr = (img[None].astype(np.float32) / 255)
        np.save(samples / "npy" / f"digit_{k}.npy", arr)
        batch.append(arr)
    np.save(samples / "batch.npy", np.stack(batch))
    (HERE / "digits_cnn.json").write_text(json.dumps(
        dict(heldout_correct=correct, heldout_total=int(len(y_te)), accuracy=round(correct / len(y_te), 4),
             input="image float32 [N,1,16,16] in [0,1]", outputs=["logits", "probabilities"], seed=SEED,
             epochs=EPOCHS), indent=2) + "\n")


if __name__ == "__main__":
    main()
