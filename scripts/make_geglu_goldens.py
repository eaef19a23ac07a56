"""LXT references (AttnLRP and CP-LRP) for a Gemma3-like GeGLU block, and its TorchScript exports.

The block: embeddings [1, SEQ, D] -> Gemma RMSNorm ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` -> gated MLP
``down(act(gate(x)) * up(x))`` with ``act`` = ``nn.GELU()`` (erf) or ``nn.GELU(approximate="tanh")`` (Gemma's
``gelu_pytorch_tanh``) -> residual -> last position -> linear head (5 classes). TorchScript writes the GELUs out
(``x * (1 + erf(x / sqrt 2)) * 0.5`` and the tanh form), which is what CP-LRP's gate search has to see through.

The references use LXT's own forward functions for Gemma3 (``lxt.efficient.patches.gated_mlp_forward`` and
``cp_gated_mlp_forward``, ``lxt.efficient.models.gemma3.gemma3_norm``'s detached rsqrt), seeded with 1 at the target
(relevance = embeddings x gradient, LXT's efficient mode). Only torch and lxt are needed (lxt's package ``__init__``
imports transformers, so its two modules are loaded without it)::

    .venv/bin/pip install --no-deps lxt==2.1
    .venv/bin/python scripts/make_geglu_goldens.py [--out tests/goldens/geglu]

writes ``geglu_<act>_torchscript18.onnx`` for act in (erf, tanh) and ``geglu.npz`` with ``embeds`` and per act
``<act>_target``, ``<act>_logits``, ``<act>_attnlrp`` and ``<act>_cp-lrp`` (the relevance of the embeddings).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import types
import warnings
from pathlib import Path

import numpy as np

SEQ, D, HIDDEN, CLASSES = 6, 16, 32, 5


def _lxt():
    """lxt.efficient.rules and .patches without lxt.efficient's __init__ (which imports transformers)."""
    root = Path(importlib.util.find_spec("lxt").submodule_search_locations[0]) / "efficient"
    pkg = types.ModuleType("lxt.efficient")
    pkg.__path__ = [str(root)]
    sys.modules.setdefault("lxt.efficient", pkg)
    import lxt.efficient.patches as patches
    import lxt.efficient.rules as rules
    return patches, rules


def build(act: str, torch):
    nn = torch.nn

    class GemmaRMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.eps = 1e-6
            self.weight = nn.Parameter(torch.randn(D) * 0.3)
            self.detach_scale = False

        def forward(self, x):
            scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            if self.detach_scale:  # lxt.efficient.models.gemma3.gemma3_norm
                scale = scale.detach()
            return x * scale * (1.0 + self.weight)

    class MLP(nn.Module):  # attribute names as transformers' Gemma3MLP: LXT's patched forwards use them
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(D, HIDDEN, bias=False)
            self.up_proj = nn.Linear(D, HIDDEN, bias=False)
            self.down_proj = nn.Linear(HIDDEN, D, bias=False)
            self.act_fn = nn.GELU() if act == "erf" else nn.GELU(approximate="tanh")

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = GemmaRMSNorm()
            self.mlp = MLP()
            self.head = nn.Linear(D, CLASSES)

        def forward(self, embeds):
            h = embeds + self.mlp(self.norm(embeds))
            return self.head(h[:, -1])

    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.4)
    return model


def relevance(model, embeds, target, mode, torch):
    patches, _ = _lxt()
    fwd = patches.gated_mlp_forward if mode == "attnlrp" else patches.cp_gated_mlp_forward
    model.norm.detach_scale = True
    try:
        x = embeds.clone().requires_grad_(True)
        h = x + fwd(model.mlp, model.norm(x))
        y = model.head(h[:, -1])
        y[0, target].backward()
        return (x * x.grad).detach().numpy()[0]
    finally:
        model.norm.detach_scale = False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/goldens/geglu")
    args = ap.parse_args(argv)
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(3)
    embeds = torch.randn(1, SEQ, D, generator=g)
    data = {"embeds": embeds.numpy()[0]}
    for act in ("erf", "tanh"):
        model = build(act, torch)
        with torch.no_grad():
            logits = model(embeds)
        target = int(logits[0].argmax())
        data[f"{act}_target"] = np.array(target)
        for mode in ("attnlrp", "cp-lrp"):
            data[f"{act}_{mode}"] = relevance(model, embeds, target, mode, torch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (embeds,), str(out / f"geglu_{act}_torchscript18.onnx"), dynamo=False,
                              input_names=["embeds"], output_names=["logits"], opset_version=18)
        data[f"{act}_logits"] = logits.numpy()[0]
    np.savez(out / "geglu.npz", **data)
    print(f"wrote {out}: " + ", ".join(sorted(data)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
