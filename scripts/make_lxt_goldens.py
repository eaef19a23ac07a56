"""Golden AttnLRP / CP-LRP references from LXT for small random-weight transformers, and their ONNX exports.

Run it in a SEPARATE venv (LXT 2.1 needs transformers < 5; the main venv stays untouched)::

    /work/venv/bin/python -m venv /work/venv-lxt
    /work/venv-lxt/bin/pip install torch==2.14.1 torchvision==0.29.1 'transformers==4.53.*' lxt==2.1 \\
        onnx onnxruntime onnx-ir onnxscript numpy click pillow
    /work/venv-lxt/bin/pip install -e /work/main --no-deps
    /work/venv-lxt/bin/python scripts/make_lxt_goldens.py [--out tests/goldens/transformers] [--models ...]

For each model (BERT, GPT-2, LLaMA with grouped-query attention and rotary embeddings: LXT efficient AttnLRP;
torchvision's ViT: LXT CP-LRP) it writes, per exporter (TorchScript ``dynamo=False`` at opset 17 and at opset 14 —
older exporters' decomposed LayerNorm — and ``dynamo=True``; BERT also with dynamic batch and sequence axes,
``torchscriptdyn``) and input kind (``embeds``: the embeddings as a float input; ``ids``: token ids),
``<model>_<kind>_<exporter>.onnx``, and one ``<model>.npz`` with the inputs, the explained target and LXT's
relevance: ``relevance_embeds`` (embeddings x gradient, LXT's efficient mode) and ``relevance_tokens`` (the same
summed over the embedding dimension). GPT-2 and LLaMA are also explained with LXT's CP-LRP maps
(``<model>_cp-lrp.npz``, same ONNX files).

The gradient is seeded with 1 (``y.backward()``): in LXT's Gradient*Input framework the output's relevance is then
``y * 1 = y``, the target logit's value, which is onnx-lrp's default ``start="logit"`` (LXT's README seeds with
``y`` itself, which scales every relevance by ``y``). Each model runs in its own process: LXT's monkey patches are
global.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np

SEQ = 8
VOCAB = 64
MODELS = ("bert", "gpt2", "llama", "vit")
EXPORTERS = ("torchscript", "torchscript14", "dynamo")
# also exported with dynamic batch and sequence axes (masks, positions and rotary tables are then computed from the
# input's shape at run time; the TorchScript exporter still bakes LLaMA's sequence length into one Reshape)
DYNAMIC_OK = ("bert", "gpt2", "llama")


def _build(name: str, torch):
    """A small random-weight model (eval mode, eager attention) and its example inputs."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=g)
    if name == "bert":
        from transformers import BertConfig, BertForSequenceClassification
        cfg = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=32, max_position_embeddings=32, num_labels=3, initializer_range=0.2,
                         attn_implementation="eager", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = BertForSequenceClassification(cfg)
        mask = torch.ones(1, SEQ, dtype=torch.int64)
        mask[0, -2:] = 0  # padded tail: exercises the attention-mask arithmetic
        extra = {"attention_mask": mask}
    elif name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=4, n_positions=32, initializer_range=0.2,
                         attn_implementation="eager", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(cfg)
        extra = {}
    elif name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          initializer_range=0.2, attn_implementation="eager", tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
        extra = {}
    elif name == "vit":
        from torchvision.models.vision_transformer import VisionTransformer
        model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=16, mlp_dim=32,
                                  num_classes=10)
        with torch.no_grad():  # torchvision zero-initialises the head and class token: give them values
            for p in model.parameters():
                if p.dim() and float(p.abs().max()) == 0.0:
                    p.normal_(0, 0.2, generator=g)
        extra = {}
    else:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    model.eval()
    return model, ids, extra




def _wrappers(name, model, torch, extra):
    nn = torch.nn

    class FromEmbeds(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, embeds, *args):
            kw = dict(zip(extra, args))
            return self.m(inputs_embeds=embeds, **kw).logits

    class FromIds(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, *args):
            kw = dict(zip(extra, args))
            return self.m(input_ids=input_ids, **kw).logits

    return FromEmbeds(), FromIds()


def _export(module, args, names, path: Path, exporter: str, torch) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if exporter == "torchscriptdyn":  # batch and sequence as dynamic axes
                torch.onnx.export(module, args, str(path), dynamo=False, input_names=names, output_names=["logits"],
                                  opset_version=17, dynamic_axes={n: {0: "batch", 1: "seq"} for n in names} | {
                                      "logits": {0: "batch"}})
            elif exporter == "dynamo":
                prog = torch.onnx.export(module, args, dynamo=True, input_names=names, output_names=["logits"],
                                         opset_version=18, verbose=False)
                prog.save(str(path))
            else:
                torch.onnx.export(module, args, str(path), dynamo=False, input_names=names, output_names=["logits"],
                                  opset_version=14 if exporter == "torchscript14" else 17, do_constant_folding=True)
        return "ok"
    except Exception as exc:  # an exporter that cannot handle the model is recorded, not fatal
        if path.exists():
            path.unlink()
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def one(name: str, out: Path, exporters, mode: str = "attnlrp") -> dict:
    import torch
    model, ids, extra = _build(name, torch)
    status = {}
    if mode == "cp-lrp":  # LXT's CP-LRP maps for the causal LMs; the ONNX files are those of the attnlrp run
        exporters = []
    if name == "vit":
        x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
        for exp in exporters:
            status[f"vit_image_{exp}"] = _export(model, (x,), ["image"], out / f"vit_image_{exp}.onnx", exp, torch)
        from lxt.efficient import monkey_patch
        from torchvision.models import vision_transformer
        monkey_patch(vision_transformer)  # LXT's default for torchvision ViT: CP-LRP
        xg = x.clone().requires_grad_(True)
        logits = model(xg)
        target = int(logits[0].argmax())
        y = logits[0, target]
        y.backward()
        np.savez_compressed(out / "vit.npz", image=x.numpy(), logits=logits.detach().numpy(), target=target,
                            relevance_image=(xg * xg.grad).detach().numpy(), composite="cp-lrp")
        return status
    emb = model.get_input_embeddings()(ids).detach()
    from_embeds, from_ids = _wrappers(name, model, torch, extra)
    extra_vals = tuple(extra.values())
    for exp in exporters + (["torchscriptdyn"] if name in DYNAMIC_OK else []):
        status[f"{name}_embeds_{exp}"] = _export(from_embeds, (emb,) + extra_vals, ["embeds"] + list(extra),
                                                 out / f"{name}_embeds_{exp}.onnx", exp, torch)
        status[f"{name}_ids_{exp}"] = _export(from_ids, (ids,) + extra_vals, ["input_ids"] + list(extra),
                                              out / f"{name}_ids_{exp}.onnx", exp, torch)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    from lxt.efficient import monkey_patch
    if mode == "cp-lrp":
        import importlib
        from transformers.models.gpt2 import modeling_gpt2
        from transformers.models.llama import modeling_llama
        maps = importlib.import_module(f"lxt.efficient.models.{name}").cp_LRP
        module = modeling_gpt2 if name == "gpt2" else modeling_llama
        monkey_patch(module, maps)
        cls = module.GPT2LMHeadModel if name == "gpt2" else module.LlamaForCausalLM
        model = cls(model.config)
    elif name == "bert":
        from transformers.models.bert import modeling_bert
        monkey_patch(modeling_bert)
        model = modeling_bert.BertForSequenceClassification(model.config)  # the patched classes
    elif name == "gpt2":
        from transformers.models.gpt2 import modeling_gpt2
        monkey_patch(modeling_gpt2)
        model = modeling_gpt2.GPT2LMHeadModel(model.config)
    else:
        from transformers.models.llama import modeling_llama
        monkey_patch(modeling_llama)
        model = modeling_llama.LlamaForCausalLM(model.config)
    model.load_state_dict(state)
    model.eval()
    e = emb.clone().requires_grad_(True)
    logits = model(inputs_embeds=e, **extra).logits
    if logits.dim() == 3:
        position = logits.shape[1] - 1
        target = int(logits[0, position].argmax())
        y = logits[0, position, target]
    else:
        position = -1
        target = int(logits[0].argmax())
        y = logits[0, target]
    y.backward()
    rel = (e * e.grad).detach().numpy()
    arrays = dict(input_ids=ids.numpy(), embeds=emb.numpy(), logits=logits.detach().numpy(), target=target,
                  position=position, relevance_embeds=rel, relevance_tokens=rel.sum(-1), composite=mode)
    arrays.update({k: v.numpy() for k, v in extra.items()})
    np.savez_compressed(out / (f"{name}.npz" if mode == "attnlrp" else f"{name}_{mode}.npz"), **arrays)
    return status


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests" / "goldens" / "transformers"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--exporters", default=",".join(EXPORTERS))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="attnlrp", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    exporters = [e for e in args.exporters.split(",") if e]
    if args.one:
        status = one(args.one, out, exporters, args.mode)
        print(json.dumps(status))
        return
    report = {}
    runs = [(m, "attnlrp") for m in args.models.split(",") if m]
    runs += [(m, "cp-lrp") for m, _ in runs if m in ("gpt2", "llama")]
    for name, mode in runs:
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--out", str(out), "--exporters",
                               ",".join(exporters), "--mode", mode], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONWARNINGS="ignore"))
        if proc.returncode != 0:
            print(f"{name}: FAILED\n{proc.stderr[-3000:]}", file=sys.stderr)
            report[name] = "failed"
            continue
        status = json.loads(proc.stdout.strip().splitlines()[-1])
        report.update(status)
        for k, v in status.items():
            print(f"{k:32s} {v}")
    old = out / "exports.json"
    merged = json.loads(old.read_text()) if old.exists() else {}
    merged.update(report)
    old.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
