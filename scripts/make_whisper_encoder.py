"""Builds tests/goldens/transformers/whisper_encoder_torchscript.onnx: transformers' WhisperEncoder (2 layers, width
16, 2 heads, 8 mel bins, 16 frames; random weights) exported by torch.onnx's TorchScript exporter at opset 17, and
whisper_encoder.npz (its input and torch's output). It is one of the families tests/families.py walks (the
CUDA-safety test, the CUDA parity tests, scripts/gpu_check.py). Needs torch + transformers (not onnx-lrp's
dependencies)::

    python scripts/make_whisper_encoder.py
"""
from pathlib import Path

import numpy as np
import torch
from transformers import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder

OUT = Path(__file__).resolve().parent.parent / "tests" / "goldens" / "transformers"


class Encoder(torch.nn.Module):
    def __init__(self, enc):
        super().__init__()
        self.enc = enc

    def forward(self, input_features):
        return self.enc(input_features).last_hidden_state


def main():
    torch.manual_seed(0)
    cfg = WhisperConfig(d_model=16, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=32,
                        num_mel_bins=8, max_source_positions=8, attn_implementation="eager")
    enc = Encoder(WhisperEncoder(cfg).eval())
    x = torch.randn(1, cfg.num_mel_bins, 2 * cfg.max_source_positions)
    with torch.no_grad():
        y = enc(x)
    torch.onnx.export(enc, (x,), str(OUT / "whisper_encoder_torchscript.onnx"), dynamo=False, opset_version=17,
                      input_names=["input_features"], output_names=["last_hidden_state"])
    np.savez(OUT / "whisper_encoder.npz", input_features=x.numpy(), last_hidden_state=y.numpy())


if __name__ == "__main__":
    main()
