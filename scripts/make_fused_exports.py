"""A small random-weight export whose attention onnxruntime's transformer optimizer fuses, for tests/load/test_fused.py.

The optimizer's attention fusions match older exports: transformers 4.26's ViT (``scores / sqrt(head)``) fuses to
``com.microsoft::Attention`` with ``model_type="vit"``; 4.53's ViT (``scores * scaling``) and torchvision's ViT do
not. Run it in a venv with torch and ``transformers==4.26.1`` (not a runtime or test dependency)::

    .venv/bin/pip install 'transformers==4.26.1'
    .venv/bin/python scripts/make_fused_exports.py [--out tests/goldens/fused]

writes ``vit_hf426.onnx`` (TorchScript exporter, opset 17, dynamic batch; image 3x32x32, 2 layers, 4 heads, hidden
16, 5 classes; ~75 KB).
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests" / "goldens" / "fused"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    import torch
    import transformers
    from transformers import ViTConfig, ViTForImageClassification

    if transformers.__version__ != "4.26.1":
        warnings.warn(f"transformers {transformers.__version__}: onnxruntime may not fuse this version's attention")
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=32, num_labels=5, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
    model = ViTForImageClassification(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, image):
            return self.m(pixel_values=image).logits

    path = out / "vit_hf426.onnx"
    torch.onnx.export(Logits(), (torch.randn(1, 3, 32, 32),), str(path), input_names=["image"],
                      output_names=["logits"], opset_version=17, dynamo=False,
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
