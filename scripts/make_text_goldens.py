"""Builds tests/goldens/text: a byte-level BPE tokenizer.json trained on a few sentences (the tokenizers library,
offline) and a 2-layer GPT-2 with random weights over its vocabulary (transformers), exported by torch.onnx's
TorchScript exporter at opset 17 with dynamic batch and sequence axes (inputs input_ids, attention_mask; output
logits); and a LLaMA-style pair: the same tokenizer with a BOS token added to every text (tokenizer_bos.json, as
LLaMA's) and a 1-layer LlamaForCausalLM that also takes position_ids (llama_text.onnx). For the text input of ``onnx-lrp explain MODEL --text ... --tokenizer ...`` (tests/io/test_text.py). Needs
torch, transformers and tokenizers (none is a dependency of onnx-lrp)::

    python scripts/make_text_goldens.py
"""
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

OUT = Path(__file__).resolve().parent.parent / "tests" / "goldens" / "text"
SENTENCES = [
    "the cat sat on the mat and looked at the dog",
    "the dog ran after the cat across the green field",
    "a bird sang in the tree while the sun went down",
    "explain the model with relevance on every token",
    "layer-wise relevance propagation explains the prediction",
]


class LM(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask).logits


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(SENTENCES, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<s>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(OUT / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=16, n_layer=2, n_head=2,
                     attn_implementation="eager")
    model = LM(GPT2LMHeadModel(cfg).eval())
    ids = torch.tensor([tok.encode("the cat sat on").ids])
    torch.onnx.export(model, (ids, torch.ones_like(ids)), str(OUT / "gpt2_text.onnx"), dynamo=False,
                      opset_version=17, input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                                    "logits": {0: "batch", 1: "seq"}})

    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tok.save(str(OUT / "tokenizer_bos.json"))
    torch.manual_seed(0)
    lcfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                       attn_implementation="eager", bos_token_id=bos)
    llama = LlamaForCausalLM(lcfg).eval()

    class Llama(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = llama

        def forward(self, input_ids, attention_mask, position_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits

    ids = torch.tensor([tok.encode("the cat sat on").ids])
    pos = torch.arange(ids.shape[1])[None]
    axes = {0: "batch", 1: "seq"}
    torch.onnx.export(Llama(), (ids, torch.ones_like(ids), pos), str(OUT / "llama_text.onnx"), dynamo=False,
                      opset_version=17, input_names=["input_ids", "attention_mask", "position_ids"],
                      output_names=["logits"], dynamic_axes={"input_ids": axes, "attention_mask": axes,
                                                             "position_ids": axes, "logits": axes})


if __name__ == "__main__":
    main()
