"""Small random-weight transformers that take an attention mask, exported by TorchScript, and LXT references.

Writes to tests/goldens/masks (each file < 200 KB):

* ``opt.onnx`` (OPTForCausalLM: positions counted from the mask by CumSum, the padding mask folded into the causal
  mask; transformers 4.x exports it with a mask-only ScatterND), ``falcon.onnx`` (FalconForCausalLM, multi-query,
  rotary; positions ``cumsum(mask) - 1`` as in generation), ``bert_pool.onnx`` (BertModel + sentence-transformers'
  masked mean pooling ``sum(h * m) / clamp(sum(m))``; its first output is an int64 token count, the second the
  sentence embedding): inputs ``input_ids`` and ``attention_mask`` (int64), dynamic batch and sequence axes;
* ``masks.npz``: the padded inputs and, for OPT and BERT + pooling, LXT's efficient AttnLRP relevance per token
  (embeddings x gradient with LXT's rules: LayerNorm std detached, the uniform rule on q, k, v; seeded with 1), the
  explained target (and position), the reference outputs. LXT ships no Falcon patch: Falcon is checked by the
  padding property only (tests/lrp/test_masks.py).

Run with transformers 4.53 and lxt 2.1 importable (they need not be in the main venv), e.g.::

    .venv/bin/pip install --no-deps --target /tmp/t4 'transformers==4.53.*' lxt==2.1 'huggingface_hub<1.0' \\
        'tokenizers<0.22' requests urllib3 idna charset_normalizer certifi
    PYTHONPATH=/tmp/t4 .venv/bin/python scripts/make_mask_goldens.py
"""
from __future__ import annotations

import argparse
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore")
VOCAB, SEQ, PAD = 64, 8, 3  # PAD positions of padding: left for the causal LMs, right for BERT


def _inputs():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(4, VOCAB, (2, SEQ), generator=g)
    left = torch.ones(2, SEQ, dtype=torch.long)
    left[0, :PAD] = 0  # item 0 padded on the left, item 1 not
    right = torch.ones(2, SEQ, dtype=torch.long)
    right[0, SEQ - PAD:] = 0
    ids_left = ids.clone()
    ids_left[0, :PAD] = 1  # the pad token id
    ids_right = ids.clone()
    ids_right[0, SEQ - PAD:] = 0
    return ids_left, left, ids_right, right


def _export(module, args, names, out_names, path):
    axes = {n: {0: "batch", 1: "seq"} for n in names}
    module.eval()  # export restores the wrapper's mode recursively: a fresh wrapper would leave dropout on
    torch.onnx.export(module, args, str(path), input_names=names, output_names=out_names, opset_version=17,
                      dynamo=False, dynamic_axes=axes)


class CausalLM(torch.nn.Module):
    def __init__(self, model, positions):
        super().__init__()
        self.model, self.positions = model, positions

    def forward(self, input_ids, attention_mask):
        kw = {}
        if self.positions:
            kw["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kw).logits


class BertPool(torch.nn.Module):
    """sentence-transformers' Transformer + Pooling(mean) modules, with a token count listed first."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, inputs_embeds=None):
        if inputs_embeds is None:
            h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        else:
            h = self.bert(inputs_embeds=inputs_embeds, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).expand(h.size()).float()
        pooled = torch.sum(h * m, 1) / torch.clamp(m.sum(1), min=1e-9)
        return attention_mask.sum(1), pooled


def _opt():
    from transformers import OPTConfig
    from transformers.models.opt import modeling_opt
    cfg = OPTConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, ffn_dim=32, num_attention_heads=2,
                    max_position_embeddings=32, word_embed_proj_dim=16, pad_token_id=1, attn_implementation="eager")
    torch.manual_seed(0)
    return modeling_opt, modeling_opt.OPTForCausalLM(cfg).eval()


def _falcon():
    from transformers import FalconConfig, FalconForCausalLM
    cfg = FalconConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                       new_decoder_architecture=False, multi_query=True, alibi=False, attn_implementation="eager")
    torch.manual_seed(1)
    return FalconForCausalLM(cfg).eval()


def _bert():
    from transformers import BertConfig
    from transformers.models.bert import modeling_bert
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32, attn_implementation="eager")
    torch.manual_seed(2)
    return modeling_bert, modeling_bert.BertModel(cfg).eval()


def _lxt_tokens(model, ids, mask, explain):
    """LXT relevance per token: embeddings x gradient of the explained scalar (seeded with 1)."""
    e = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    y = explain(e)
    y.backward()
    return (e * e.grad).sum(-1).detach().numpy()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests" / "goldens" / "masks"))
    out = Path(ap.parse_args(argv).out)
    out.mkdir(parents=True, exist_ok=True)
    ids_l, mask_l, ids_r, mask_r = _inputs()
    arrays = dict(ids_left=ids_l.numpy(), mask_left=mask_l.numpy(), ids_right=ids_r.numpy(),
                  mask_right=mask_r.numpy())
    from lxt.efficient import monkey_patch
    from lxt.efficient.patches import dropout_forward, layer_norm_forward, patch_attention, patch_method

    # ---- OPT: exported unpatched, then LXT's AttnLRP patches (LayerNorm, the attention interface; ReLU's identity
    # rule is its gradient) on a fresh instance with the same weights
    modeling_opt, opt = _opt()
    _export(CausalLM(opt, False), (ids_l, mask_l), ["input_ids", "attention_mask"], ["logits"], out / "opt.onnx")
    with torch.no_grad():
        logits = opt(input_ids=ids_l, attention_mask=mask_l, use_cache=False).logits
    arrays["opt_logits"] = logits.numpy()
    target = logits[:, -1].argmax(-1)
    state = opt.state_dict()
    monkey_patch(modeling_opt, {torch.nn.LayerNorm: partial(patch_method, layer_norm_forward),
                                torch.nn.Dropout: partial(patch_method, dropout_forward),
                                modeling_opt: patch_attention})
    opt_lxt = modeling_opt.OPTForCausalLM(opt.config).eval()
    opt_lxt.load_state_dict(state)
    arrays["opt_target"] = target.numpy()
    arrays["opt_lxt"] = np.stack([_lxt_tokens(
        opt_lxt, ids_l[i:i + 1], mask_l[i:i + 1],
        lambda e, i=i: opt_lxt(inputs_embeds=e, attention_mask=mask_l[i:i + 1], use_cache=False).logits[
            0, -1, target[i]])[0] for i in range(2)])

    # ---- Falcon
    falcon = _falcon()
    _export(CausalLM(falcon, True), (ids_l, mask_l), ["input_ids", "attention_mask"], ["logits"], out / "falcon.onnx")
    with torch.no_grad():
        arrays["falcon_logits"] = CausalLM(falcon, True)(ids_l, mask_l).numpy()

    # ---- BERT + masked mean pooling (right padding)
    modeling_bert, bert = _bert()
    pool = BertPool(bert)
    _export(pool, (ids_r, mask_r), ["input_ids", "attention_mask"], ["n_tokens", "sentence_embedding"],
            out / "bert_pool.onnx")
    with torch.no_grad():
        emb = pool(ids_r, mask_r)[1]
    arrays["bert_pool_embedding"] = emb.numpy()
    target = emb.argmax(-1)
    state = bert.state_dict()
    monkey_patch(modeling_bert)
    bert_lxt = modeling_bert.BertModel(bert.config).eval()
    bert_lxt.load_state_dict(state)
    pool_lxt = BertPool(bert_lxt)
    arrays["bert_pool_target"] = target.numpy()
    arrays["bert_pool_lxt"] = np.stack([_lxt_tokens(
        bert_lxt, ids_r[i:i + 1], mask_r[i:i + 1],
        lambda e, i=i: pool_lxt(None, mask_r[i:i + 1], inputs_embeds=e)[1][0, target[i]])[0] for i in range(2)])
    np.savez_compressed(out / "masks.npz", **arrays)
    for f in sorted(out.iterdir()):
        print(f"{f.name}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
