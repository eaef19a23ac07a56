"""Builds tests/goldens/text: a byte-level BPE tokenizer.json trained on a few sentences (the tokenizers library,
offline) and a 2-layer GPT-2 with random weights over its vocabulary (transformers), exported by torch.onnx's
TorchScript exporter at opset 17 with dynamic batch and sequence axes (inputs input_ids, attention_mask; output
logits). For the text input of ``onnx-lrp explain MODEL --text ... --tokenizer ...`` (tests/test_text.py). Needs
torch, transformers and tokenizers (none is a dependency of onnx-lrp)::

    python scripts/make_text_goldens.py
"""
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel

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
    tok.train_from_iterator(SENTENCES, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
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


if __name__ == "__main__":
    main()
