"""bench_llm's LLaMA exported by torch.onnx (TorchScript exporter, opset 17), and LXT's relevance on the same weights.

Run by ``bench_llm.py`` in a child process (``--ref-python``), so that torch's memory is gone before onnx-lrp
starts; ``tests/parity/test_llm_graph.py`` imports :func:`make_model` and :func:`export` to check ``llama_graph.py`` (the
same graph written directly) against it. Usage (what bench_llm passes)::

    python llama_export.py '[hidden, inter, layers, heads, kv, vocab]' SEQ OUT.onnx DTYPE DEVICE THREADS [TWIN.onnx]

writes ``OUT.onnx`` (and its external data), ``OUT.onnx.x.npy`` (the embeddings fed, float32), with LXT (when
``lxt`` imports: LXT 2.1 needs transformers < 5) ``OUT.onnx.lxt.npy``, and with ``TWIN.onnx`` the float32 model of
the same (rounded) weights; prints one JSON line: parameters, export seconds, LXT's time, target and GPU peak.
"""
from __future__ import annotations

import json
import sys
import time
import warnings

import numpy as np

DTYPES = ("float32", "bfloat16", "float16")


def make_model(shape, seq: int, seed: int = 0):
    """LlamaForCausalLM (eager attention, untied, float32) with bench_llm's random weights and ``seq`` random token
    ids: (model, ids). ``shape``: (hidden, inter, layers, heads, kv, vocab)."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama

    hidden, inter, layers, heads, kv, vocab = shape
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=max(256, seq),
                      attn_implementation="eager", tie_word_embeddings=False)
    with torch.device("meta"):
        model = modeling_llama.LlamaForCausalLM(cfg)
    model = model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / p.shape[-1] ** 0.5))
        dh = hidden // heads
        theta = getattr(cfg, "rope_theta", None) or (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta",
                                                                                                     1e4)
        model.model.rotary_emb.inv_freq.copy_(1.0 / (theta ** (torch.arange(0, dh, 2).float() / dh)))  # 4 / 5
    model.eval()
    return model, torch.randint(0, vocab, (1, seq), generator=g)


def causal(seq: int, dtype):
    """A 4-D additive causal mask (transformers' own mask builder, vmap, does not trace)."""
    import torch

    return torch.full((1, 1, seq, seq), torch.finfo(dtype).min, dtype=dtype).triu(1)


def export(model, emb, path) -> None:
    """torch.onnx.export (TorchScript, opset 17) of ``model`` from ``inputs_embeds`` ``emb`` with the causal mask of
    its type: input ``embeds``, output ``logits``."""
    import torch

    class FromEmbeds(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m, self.mask = model, causal(emb.shape[1], emb.dtype)

        def forward(self, e):
            return self.m(inputs_embeds=e, attention_mask=self.mask, use_cache=False).logits

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(FromEmbeds(), (emb,), str(path), dynamo=False, input_names=["embeds"],
                          output_names=["logits"], opset_version=17)


def lxt(model, emb, device: str, res: dict, out: str) -> None:
    """LXT's efficient AttnLRP on the same weights (no second copy), best of 3; its relevance to ``out``."""
    import torch
    from lxt.efficient import monkey_patch
    from transformers.models.llama import modeling_llama

    monkey_patch(modeling_llama)
    with torch.device("meta"):
        lm = modeling_llama.LlamaForCausalLM(model.config)
    lm.load_state_dict(model.state_dict(), assign=True)
    lm.model.rotary_emb.inv_freq = model.model.rotary_emb.inv_freq  # a buffer outside the state dict
    lm.model.rotary_emb.original_inv_freq = model.model.rotary_emb.original_inv_freq
    lm.eval().to(device)
    for prm in lm.parameters():
        prm.requires_grad_(False)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    mask, ts = causal(emb.shape[1], emb.dtype).to(device), []
    for _ in range(3):
        e = emb.clone().to(device).requires_grad_(True)
        t1 = time.perf_counter()
        y = lm(inputs_embeds=e, attention_mask=mask, use_cache=False).logits
        target = int(y[0, -1].argmax())
        y[0, -1, target].backward()
        if device == "cuda":
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t1)
    res.update(lxt_s=min(ts), target=target)
    if device == "cuda":
        res["lxt_gpu_peak_bytes"] = torch.cuda.max_memory_allocated()
    np.save(out, (e * e.grad).float().detach().cpu().numpy())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    import torch

    shape, seq, out, dtype, device, threads = json.loads(argv[0]), int(argv[1]), argv[2], argv[3], argv[4], \
        int(argv[5])
    twin = argv[6] if len(argv) > 6 else ""
    if threads:
        torch.set_num_threads(threads)
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    t0 = time.perf_counter()
    model, ids = make_model(shape, seq)
    res = {"params": sum(p.numel() for p in model.parameters())}
    model = model.to(dt)  # weights and the rotary buffer rounded to the model's type
    with torch.no_grad():
        emb = model.get_input_embeddings()(ids)
    export(model, emb, out)
    np.save(out + ".x.npy", emb.float().numpy())
    if twin:  # the float32 model of the same rounded weights (onnxruntime's CPU provider has no bfloat16 kernels);
        export(model.float(), emb.float(), twin)  # before LXT patches transformers' modules
        model = model.to(dt)  # exactly the rounded weights again
    res["export_s"] = time.perf_counter() - t0
    try:
        lxt(model, emb, device, res, out + ".lxt.npy")
    except ImportError as exc:
        res["lxt_error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
