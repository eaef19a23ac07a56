"""Torch references and TorchScript exports of a tiny Mixtral-style sparse mixture-of-experts block.

The block (transformers' ``MixtralSparseMoeBlock`` semantics, written densely so that one trace is valid for every
input): embeds [1, SEQ, D] -> router ``gate`` Linear -> softmax -> ``topk(k=2)`` -> weights renormalised to sum 1
-> experts ``w2(silu(w1 x) * w3 x)`` (Mixtral's SwiGLU) -> weighted sum of the selected experts -> residual -> mean
over the tokens -> linear head (5 classes). Two ways exporters and hand-written MoEs route, both exported:

- ``scatter``: the top-k weights are scattered into a dense [T, E] gate (``ScatterElements``), every expert output
  is multiplied by its column (zero for unselected experts) and summed;
- ``gather``: the expert outputs are stacked [T, E, D] and the selected ones gathered (``GatherElements``), then
  multiplied by the top-k weights and summed over k.

References (relevance of the embeddings = embeds x gradient, seeded with 1 at the target, LXT's efficient mode):
the routing weights act as gates: held constant (detached), so no relevance flows through the router and all of an
expert product's relevance goes to the selected expert (signal-take-all, Arras et al. 2017; LXT's explicit Mixtral
CP-LRP composite gives the same: epsilon on the product and StopRelevance on the weight normalisation). Inside the
experts: attnlrp = identity rule on SiLU, uniform halving on ``silu(w1 x) * w3 x``; cp-lrp = the SiLU factor held
constant. Only torch is needed::

    .venv/bin/python scripts/make_moe_goldens.py [--out tests/goldens/moe]

writes ``moe_<routing>_torchscript17.onnx`` and ``moe.npz`` with ``embeds``, ``target``, ``logits``,
``selected`` (the top-k expert indices per token) and per routing/composite ``<routing>_<composite>`` and
``<routing>_expert_<composite>`` (the relevance that reaches each expert's output, [SEQ, E]).
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np

SEQ, D, HIDDEN, EXPERTS, TOPK, CLASSES = 6, 8, 16, 4, 2, 5


def build(routing: str, torch):
    nn = torch.nn

    class Expert(nn.Module):  # MixtralBlockSparseTop2MLP
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(D, HIDDEN, bias=False)
            self.w2 = nn.Linear(HIDDEN, D, bias=False)
            self.w3 = nn.Linear(D, HIDDEN, bias=False)

        def forward(self, x, mode=None):
            h = self.w1(x)
            if mode == "attnlrp":    # identity rule on SiLU, uniform halving on the product
                act = h * torch.sigmoid(h).detach()
                prod = act * self.w3(x)
                prod = 0.5 * prod + 0.5 * prod.detach()
            elif mode == "cp-lrp":   # the SiLU factor held constant
                prod = nn.functional.silu(h).detach() * self.w3(x)
            else:
                prod = nn.functional.silu(h) * self.w3(x)
            return self.w2(prod)

    class Moe(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(D, EXPERTS, bias=False)
            self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))
            self.head = nn.Linear(D, CLASSES)
            self.mode = None
            self.expert_out = None  # [T, E, D] expert outputs of the last forward (for the per-expert relevance)

        def route(self, x):
            probs = torch.softmax(self.gate(x), dim=-1)
            w, idx = torch.topk(probs, TOPK, dim=-1)
            w = w / w.sum(dim=-1, keepdim=True)
            if self.mode is not None:   # the router weights act as gates
                w = w.detach()
            return w, idx

        def forward(self, embeds):
            x = embeds[0]                                                   # [T, D]
            w, idx = self.route(x)
            outs = torch.stack([e(x, self.mode) for e in self.experts], 1)  # [T, E, D]
            if self.mode is not None:
                outs.retain_grad()
                self.expert_out = outs
            if routing == "scatter":
                g = torch.zeros(x.shape[0], EXPERTS).scatter(1, idx, w)     # [T, E], zero off the top-k
                moe = (outs * g[:, :, None]).sum(1)
            else:
                sel = torch.gather(outs, 1, idx[:, :, None].expand(-1, -1, D))  # [T, k, D]
                moe = (sel * w[:, :, None]).sum(1)
            h = x + moe
            return self.head(h.mean(0, keepdim=True))                       # [1, CLASSES]

    torch.manual_seed(0)
    model = Moe().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model


def relevance(model, embeds, target, mode, torch):
    model.mode = mode
    try:
        x = embeds.clone().requires_grad_(True)
        model(x)[0, target].backward()
        outs = model.expert_out
        expert = (outs * outs.grad).sum(-1).detach().numpy()  # relevance reaching each expert's output [T, E]
        return (x * x.grad).detach().numpy()[0], expert
    finally:
        model.mode = None
        model.expert_out = None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/goldens/moe")
    args = ap.parse_args(argv)
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    embeds = torch.randn(1, SEQ, D, generator=torch.Generator().manual_seed(3))
    data = {"embeds": embeds.numpy()[0]}
    for routing in ("scatter", "gather"):
        model = build(routing, torch)
        with torch.no_grad():
            logits = model(embeds)
            _, idx = model.route(embeds[0])
        if routing == "scatter":
            data["target"] = np.array(int(logits[0].argmax()))
            data["logits"] = logits.numpy()[0]
            data["selected"] = idx.numpy()
        for mode in ("attnlrp", "cp-lrp"):
            data[f"{routing}_{mode}"], data[f"{routing}_expert_{mode}"] = relevance(
                model, embeds, int(data["target"]), mode, torch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (embeds,), str(out / f"moe_{routing}_torchscript17.onnx"), dynamo=False,
                              input_names=["embeds"], output_names=["logits"], opset_version=17)
    np.savez(out / "moe.npz", **data)
    print(f"wrote {out}: " + ", ".join(sorted(data)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
