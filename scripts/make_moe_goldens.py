"""Torch references and TorchScript exports of a tiny Mixtral-style sparse mixture-of-experts block.

The block (transformers' ``MixtralSparseMoeBlock`` semantics, written densely so that one trace is valid for every
input): embeds [1, SEQ, D] -> router ``gate`` Linear -> softmax -> ``topk(k=2)`` -> weights renormalised to sum 1
-> experts ``w2(silu(w1 x) * w3 x)`` (Mixtral's SwiGLU) -> weighted sum of the selected experts -> residual -> mean
over the tokens -> linear head (5 classes). Two ways exporters and hand-written MoEs route, both exported:

- ``scatter``: the top-k weights are scattered into a dense [T, E] gate (``ScatterElements``), every expert output
  is multiplied by its column (zero for unselected experts) and summed;
- ``gather``: the expert outputs are stacked [T, E, D] and the selected ones gathered (``GatherElements``), then
  multiplied by the top-k weights and summed over k;
- ``topk_softmax``: as ``gather``, with the weights computed as in Mixtral's reference code: TopK of the router
  logits, then softmax over those k (the same weights).

References (relevance of the embeddings = embeds x gradient, seeded with 1 at the target, LXT's efficient mode):
the routing weights act as gates: held constant (detached), so no relevance flows through the router and all of an
expert product's relevance goes to the selected expert (signal-take-all, Arras et al. 2017; LXT's explicit Mixtral
CP-LRP composite gives the same: epsilon on the product and StopRelevance on the weight normalisation). Inside the
experts: attnlrp = identity rule on SiLU, uniform halving on ``silu(w1 x) * w3 x``; cp-lrp = the SiLU factor held
constant. Only torch is needed::

    .venv/bin/python scripts/make_moe_goldens.py [--out tests/goldens/moe]

writes ``moe_<routing>_torchscript17.onnx`` and ``moe.npz`` with ``embeds``, ``target``, ``logits``,
``selected`` (the top-k expert indices per token) and per routing/composite ``<routing>_<composite>`` and
``<routing>_expert_<composite>`` (the relevance that reaches each expert's output, [SEQ, E]); and a pure-MLP MoE
with ReLU experts ``w2(relu(w1 x))`` (scatter routing) for the CNN composites, ``moe_relu_scatter_torchscript17.onnx``
with ``relu_target``, ``relu_logits``, ``relu_selected``, ``relu_lrp0`` and ``relu_expert_lrp0`` (gradient x input
with the routing weights detached: LRP-0).

``--mixtral`` also exports transformers' own ``MixtralForCausalLM`` (one layer, 4 experts, top-2, random weights,
from ``inputs_embeds``, next-token logits; TorchScript opset 17: the MoE loop becomes OneHot/NonZero/Gather and
``index_add_`` a ScatterElements with reduction add; the loop is unrolled over the experts the traced input hits, so
the export is only valid for inputs that hit every expert, as the stored one does) and its references from LXT's
efficient patches (``patch_attention`` / ``patch_cp_attention``, ``rms_norm_forward``) plus the MoE block above
(routing weights detached, LXT's gated-MLP rules in the experts). LXT's own MoE patch (Qwen3-MoE) instead gives the
routing product the uniform rule (half of the relevance to the router); its explicit Mixtral CP-LRP composite holds
the weights. Needs ``pip install 'transformers==4.53.*'`` and ``pip install --no-deps lxt==2.1``; writes
``mixtral_embeds_torchscript17.onnx`` and ``mixtral.npz`` (``embeds``, ``logits``, ``target``, ``attnlrp``,
``cp-lrp``).
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np

SEQ, D, HIDDEN, EXPERTS, TOPK, CLASSES = 6, 8, 16, 4, 2, 5


def build(routing: str, torch, expert: str = "swiglu"):
    nn = torch.nn

    class Expert(nn.Module):  # MixtralBlockSparseTop2MLP
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(D, HIDDEN, bias=False)
            self.w2 = nn.Linear(HIDDEN, D, bias=False)
            self.w3 = nn.Linear(D, HIDDEN, bias=False)

        def forward(self, x, mode=None):
            h = self.w1(x)
            if expert == "relu":     # a plain MLP expert (LRP-0 on it is gradient x input)
                return self.w2(torch.relu(h))
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
            if routing == "topk_softmax":  # Mixtral's reference code: softmax over the top-k logits (same weights)
                w, idx = torch.topk(self.gate(x), TOPK, dim=-1)
                w = torch.softmax(w, dim=-1)
            else:
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
    ap.add_argument("--mixtral", action="store_true", help="also transformers' MixtralForCausalLM (needs lxt)")
    args = ap.parse_args(argv)
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    embeds = torch.randn(1, SEQ, D, generator=torch.Generator().manual_seed(3))
    data = {"embeds": embeds.numpy()[0]}
    for routing in ("scatter", "gather", "topk_softmax"):
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
    # a pure-MLP MoE (ReLU experts, scatter routing) for the CNN composites: epsilon at 0 is LRP-0 = gradient x input
    model = build("scatter", torch, expert="relu")
    with torch.no_grad():
        logits = model(embeds)
        _, idx = model.route(embeds[0])
    data["relu_target"], data["relu_logits"], data["relu_selected"] = int(logits[0].argmax()), logits.numpy()[0], idx
    data["relu_lrp0"], data["relu_expert_lrp0"] = relevance(model, embeds, int(data["relu_target"]), "lrp0", torch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (embeds,), str(out / "moe_relu_scatter_torchscript17.onnx"), dynamo=False,
                          input_names=["embeds"], output_names=["logits"], opset_version=17)
    np.savez(out / "moe.npz", **data)
    print(f"wrote {out}: " + ", ".join(sorted(data)))
    if args.mixtral:
        mixtral(out, torch)
    return 0


def mixtral(out: Path, torch) -> None:
    from lxt.efficient.patches import patch_attention, patch_cp_attention, patch_method, rms_norm_forward
    from lxt.efficient.rules import divide_gradient, identity_rule_implicit
    from transformers import MixtralConfig, MixtralForCausalLM
    from transformers.models.mixtral import modeling_mixtral as mm

    cfg = MixtralConfig(vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=32, initializer_range=0.3, attn_implementation="eager")
    torch.manual_seed(0)
    model = MixtralForCausalLM(cfg).eval()

    class FromEmbeds(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, embeds):  # a 4-d additive causal mask: transformers' mask builder does not trace
            n = embeds.shape[1]
            mask = torch.triu(torch.full((n, n), torch.finfo(torch.float32).min), 1)[None, None]
            return self.m(inputs_embeds=embeds, attention_mask=mask, use_cache=False).logits[:, -1]

    wrapper = FromEmbeds()
    embeds = torch.randn(1, SEQ, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = wrapper(embeds)
    target = int(logits[0].argmax())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, (embeds,), str(out / "mixtral_embeds_torchscript17.onnx"), dynamo=False,
                          input_names=["embeds"], output_names=["logits"], opset_version=17)
    data = {"embeds": embeds.numpy()[0], "logits": logits.numpy()[0], "target": np.array(target)}

    def expert_forward(mode):  # MixtralBlockSparseTop2MLP: w2(silu(w1 x) * w3 x)
        def forward(self, x):
            if mode == "attnlrp":
                h = divide_gradient(identity_rule_implicit(self.act_fn, self.w1(x)) * self.w3(x), 2)
            else:
                h = self.act_fn(self.w1(x)).detach() * self.w3(x)
            return self.w2(h)
        return forward

    def moe_forward(self, hidden_states):  # MixtralSparseMoeBlock, the routing weights detached (gates)
        b, s, d = hidden_states.shape
        x = hidden_states.view(-1, d)
        router_logits = self.gate(x)
        w, idx = torch.topk(torch.softmax(router_logits, dim=1, dtype=torch.float), self.top_k, dim=-1)
        w = (w / w.sum(dim=-1, keepdim=True)).detach()
        moe = torch.zeros_like(x)
        for e in range(self.num_experts):
            for k in range(self.top_k):
                moe = moe + self.experts[e](x) * (w[:, k:k + 1] * (idx[:, k] == e).to(x.dtype)[:, None])
        return moe.view(b, s, d), router_logits

    classes = (mm.MixtralBlockSparseTop2MLP, mm.MixtralSparseMoeBlock, mm.MixtralRMSNorm)
    saved = ({c: c.forward for c in classes}, mm.eager_attention_forward, dict(mm.ALL_ATTENTION_FUNCTIONS))
    for mode in ("attnlrp", "cp-lrp"):
        patch_method(expert_forward(mode), mm.MixtralBlockSparseTop2MLP)
        patch_method(moe_forward, mm.MixtralSparseMoeBlock)
        patch_method(rms_norm_forward, mm.MixtralRMSNorm)
        (patch_attention if mode == "attnlrp" else patch_cp_attention)(mm)
        try:
            x = embeds.clone().requires_grad_(True)
            y = wrapper(x)
            assert torch.allclose(y, logits, atol=1e-5)
            y[0, target].backward()
            data[mode] = (x * x.grad).detach().numpy()[0]
        finally:
            for c, f in saved[0].items():
                c.forward = f
            mm.eager_attention_forward = saved[1]
            mm.ALL_ATTENTION_FUNCTIONS = saved[2]
    np.savez(out / "mixtral.npz", **data)
    print(f"wrote {out}: mixtral_embeds_torchscript17.onnx, mixtral.npz")


if __name__ == "__main__":
    raise SystemExit(main())
