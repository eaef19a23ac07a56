"""Rebuild the demo text models in ``models/text/`` (deterministic): one tokenizer, a sentiment classifier and a tiny
causal language model, both trained here on a small synthetic corpus written below (no download).

Torch and tokenizers are needed here only, never at run time::

    pip install torch tokenizers
    python models/build_text.py          # about 20 s

Writes, in ``models/text/``:

* ``tokenizer.json``  a byte-level BPE (as GPT-2's) trained on the corpus; it puts ``<s>`` before every text
* ``sentiment.onnx``  a 2-layer transformer encoder that classifies a review as negative (0) or positive (1) from its
                      ``<s>`` token; inputs ``input_ids``, ``attention_mask`` int64 [N, T]; output ``logits`` [N, 2];
                      the class names in its metadata (``id2label``)
* ``tiny_lm.onnx``    a 2-layer causal transformer language model (GPT-style, tied embeddings); the same inputs;
                      output ``logits`` [N, T, vocabulary]
* ``text.json``       the held-out sentiment sentences and the capital facts with the scores measured on them
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

HERE = Path(__file__).resolve().parent / "text"
SEED = 0
POSITIVE = ["gripping", "funny", "moving", "brilliant", "wonderful", "charming", "delightful", "beautiful", "clever",
            "touching", "superb", "great", "enjoyable", "excellent", "fresh", "powerful", "witty", "warm", "stunning",
            "heartfelt"]
NEGATIVE = ["dull", "boring", "tedious", "clumsy", "awful", "bland", "predictable", "messy", "weak", "lifeless",
            "tiresome", "silly", "terrible", "poor", "flat", "confusing", "shallow", "lazy", "forgettable", "painful"]
NOUNS = ["film", "movie", "story", "plot", "script", "cast", "ending", "soundtrack", "performance", "drama", "comedy",
         "show"]
TRAIN_TEMPLATES = ["a {a}, {b} and {c} {n}", "the {n} was {a} and {b}", "what a {a} {n}", "i found the {n} {a}",
                   "{a}, {b} and {c}", "the {n} is {a}, the acting {b}", "a {a} {n} with a {b} {m}",
                   "it was a {a} and {b} {n}", "this {n} is {a}", "the {n} seemed {a} to me",
                   "such a {a} {n}", "the whole {n} felt {a}", "really {a}, really {b}", "a {n} that is {a} and {b}"]
HELDOUT_TEMPLATES = ["this {n} felt {a} and {b}", "such a {a} {n}, really {b}", "the whole {n} is {a}",
                     "i found it {a} and {b}"]
FILLERS = ["really", "quite", "very", "so", "truly", "rather", "honestly", "overall", "this", "whole", "felt",
           "seemed", "such", "it", "to", "me", "and", "the", "a", "is", "was"]
FACTS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
         ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Russia", "Moscow"), ("Greece", "Athens"), ("Norway", "Oslo"),
         ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"),
         ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Cuba", "Havana"), ("Chile", "Santiago"), ("China", "Beijing"),
         ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Hungary", "Budapest"), ("Belgium", "Brussels"),
         ("Thailand", "Bangkok")]
FACT_TEMPLATES = ["The capital of {c} is {k}.", "{k} is the capital of {c}.", "The capital city of {c} is {k}."]
MAX_LEN = 32


def reviews(templates, n: int, rng, fill: bool = False) -> list:
    """``n`` (text, label) reviews from ``templates``: the adjectives all positive (1) or all negative (0); ``fill``:
    one or two neutral words inserted at random in half of them (so that no neutral word sways the class)."""
    out = []
    for _ in range(n):
        label = int(rng.integers(2))
        words = POSITIVE if label else NEGATIVE
        a, b, c = rng.choice(words, 3, replace=False)
        n1, n2 = rng.choice(NOUNS, 2, replace=False)
        text = str(rng.choice(templates)).format(a=a, b=b, c=c, n=n1, m=n2).split(" ")
        if fill and rng.random() < 0.5:
            for _ in range(int(rng.integers(1, 3))):
                text.insert(int(rng.integers(len(text) + 1)), str(rng.choice(FILLERS)))
        out.append((" ".join(text), label))
    return out


def tokenizer_built(corpus):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1000, special_tokens=["<pad>", "<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A </s> $B:1",
                                                       special_tokens=[("<s>", bos), ("</s>", eos)])
    return tok


class Block(nn.Module):
    """A pre-LayerNorm transformer block: softmax attention (masked), then a GELU MLP, each with a residual."""

    def __init__(self, d: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))

    def forward(self, x, bias):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + bias
        x = x + self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class Encoder(nn.Module):
    """Token and position embeddings, blocks, a final LayerNorm; ``causal``: each token sees only those before it."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, hidden: int, causal: bool):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(MAX_LEN, d)
        self.blocks = nn.ModuleList(Block(d, heads, hidden) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.causal = causal
        self.register_buffer("tri", torch.tril(torch.ones(MAX_LEN, MAX_LEN)), persistent=False)

    def forward(self, input_ids, attention_mask):
        t = input_ids.shape[1]
        x = self.tok(input_ids) + self.pos.weight[:t]
        keep = attention_mask[:, None, None, :].float()
        if self.causal:
            keep = keep * self.tri[:t, :t]
        bias = (1.0 - keep) * -1e4  # finite: masked scores get no relevance (docs/text.md)
        for block in self.blocks:
            x = block(x, bias)
        return self.ln(x)


class Sentiment(nn.Module):
    """The encoder's outputs averaged over the text's tokens (the attention mask's), then a linear classifier."""

    def __init__(self, vocab: int):
        super().__init__()
        self.encoder = Encoder(vocab, 32, 2, 2, 64, causal=False)
        self.classifier = nn.Linear(32, 2)

    def forward(self, input_ids, attention_mask):
        keep = attention_mask[:, :, None].float()
        pooled = (self.encoder(input_ids, attention_mask) * keep).sum(1) / keep.sum(1)
        return self.classifier(pooled)


class TinyLM(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.encoder = Encoder(vocab, 64, 2, 4, 128, causal=True)

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids, attention_mask) @ self.encoder.tok.weight.T  # tied embeddings


def batches(tok, texts, size: int, gen):
    """Padded (ids, mask) batches of ``texts`` in a seeded random order, with their indices."""
    enc = [tok.encode(t).ids for t in texts]
    pad = tok.token_to_id("<pad>")
    order = torch.randperm(len(texts), generator=gen).tolist()
    for i in range(0, len(order), size):
        idx = order[i:i + size]
        width = max(len(enc[j]) for j in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, j in enumerate(idx):
            ids[r, :len(enc[j])] = torch.tensor(enc[j])
            mask[r, :len(enc[j])] = 1
        yield idx, ids, mask


def train_sentiment(tok, train, epochs: int = 3) -> Sentiment:
    model = Sentiment(tok.get_vocab_size())
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-2)
    gen = torch.Generator().manual_seed(SEED)
    labels = torch.tensor([y for _, y in train])
    for _ in range(epochs):
        model.train()
        for idx, ids, mask in batches(tok, [t for t, _ in train], 32, gen):
            loss = F.cross_entropy(model(ids, mask), labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def train_lm(tok, texts, epochs: int = 80) -> TinyLM:
    model = TinyLM(tok.get_vocab_size())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    gen = torch.Generator().manual_seed(SEED)
    for _ in range(epochs):
        model.train()
        for _, ids, mask in batches(tok, texts, 16, gen):
            logits = model(ids, mask)[:, :-1]
            target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def export(model, tok, path: Path, metadata: dict | None = None) -> None:
    import onnx

    ids = torch.tensor([tok.encode("a gripping film").ids])
    axes = {0: "batch", 1: "sequence"}
    buf = io.BytesIO()
    torch.onnx.export(model, (ids, torch.ones_like(ids)), buf, input_names=["input_ids", "attention_mask"],
                      output_names=["logits"], opset_version=17, dynamo=False,
                      dynamic_axes={"input_ids": axes, "attention_mask": axes,
                                    "logits": axes if isinstance(model, TinyLM) else {0: "batch"}})
    proto = onnx.load_model_from_string(buf.getvalue())
    for node in proto.graph.node:
        node.doc_string = ""
    if metadata:
        onnx.helper.set_model_props(proto, metadata)
    path.write_bytes(proto.SerializeToString())


def scores(tok, sentiment, lm, heldout) -> dict:
    with torch.no_grad():
        correct = 0
        for text, label in heldout:
            ids = torch.tensor([tok.encode(text).ids])
            correct += int(sentiment(ids, torch.ones_like(ids)).argmax(-1).item() == label)
        recalled = 0
        for country, capital in FACTS:
            ids = torch.tensor([tok.encode(f"The capital of {country} is").ids])
            nxt = lm(ids, torch.ones_like(ids))[0, -1].argmax().item()
            recalled += int(tok.decode([nxt]) == f" {capital}")
    return dict(sentiment_correct=correct, sentiment_total=len(heldout), lm_recalled=recalled, lm_total=len(FACTS))


def main():
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest (and deterministic)
    rng = np.random.default_rng(SEED)
    train, heldout = reviews(TRAIN_TEMPLATES, 1500, rng, fill=True), reviews(HELDOUT_TEMPLATES, 300, rng)
    facts = [t.format(c=c, k=k) for c, k in FACTS for t in FACT_TEMPLATES]
    tok = tokenizer_built([t for t, _ in train] + facts * 20)
    for c, k in FACTS:  # each country and capital one token, so that the LM predicts " Paris" as one
        assert len(tok.encode(f" {c}", add_special_tokens=False).ids) == 1, c
        assert len(tok.encode(f" {k}", add_special_tokens=False).ids) == 1, k
    sentiment = train_sentiment(tok, train)
    torch.manual_seed(SEED)
    lm = train_lm(tok, facts + [t for t, _ in train[:100]])
    got = scores(tok, sentiment, lm, heldout)
    print(f"sentiment held-out: {got['sentiment_correct']}/{got['sentiment_total']}; "
          f"capitals recalled: {got['lm_recalled']}/{got['lm_total']}")
    HERE.mkdir(parents=True, exist_ok=True)
    tok.save(str(HERE / "tokenizer.json"))
    export(sentiment, tok, HERE / "sentiment.onnx", {"id2label": json.dumps({"0": "negative", "1": "positive"})})
    export(lm, tok, HERE / "tiny_lm.onnx")
    (HERE / "text.json").write_text(json.dumps(dict(
        **got, seed=SEED, vocabulary=tok.get_vocab_size(), labels=["negative", "positive"],
        heldout=[[t, y] for t, y in heldout], facts=[[c, k] for c, k in FACTS]), indent=1) + "\n")


if __name__ == "__main__":
    main()
