"""Builds tests/goldens/newcomer: what a newcomer brings (tests/cli/test_newcomer_text.py): a tiny 3-label BERT
sentence classifier (random weights, class names in its config.json, none in the ONNX file) exported twice,

* ``torch_onnx/``: by ``torch.onnx.export`` (TorchScript) as ``classifier.onnx``, with the ``config.json`` that
  ``save_pretrained`` writes and the ``tokenizer.json`` beside it;
* ``bert_optimum/``: by optimum's ``main_export`` (the folder it writes: ``model.onnx`` and ``config.json``), with
  the ``tokenizer.json`` added,

and ``reference.json``: the text the test explains and the torch model's logits for it in float64 (the reference
the explained logit is checked against). The tokenizer is tests/goldens/text_hf/wordpiece.tokenizer.json.

Needs torch, transformers 4.x and optimum-onnx (none a dependency of onnx-lrp)::

    /work/llmenv/bin/python scripts/make_newcomer_models.py     # or any env with the three
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "goldens" / "newcomer"
TOKENIZER = ROOT / "tests" / "goldens" / "text_hf" / "wordpiece.tokenizer.json"
TEXT = "the film was gripping funny and moving"
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def model_built(vocab: int, pad: int):
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, type_vocab_size=2, num_labels=3,
                        initializer_range=0.2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        pad_token_id=pad, attn_implementation="eager", id2label=dict(LABELS),
                        label2id={v: k for k, v in LABELS.items()})
    return tf.BertForSequenceClassification(cfg).eval()


def slim(path: Path) -> None:
    """Drop the exporters' doc strings and node metadata (stack traces); the graph is unchanged."""
    import onnx

    model = onnx.load(str(path))
    for node in model.graph.node:
        node.doc_string = ""
        del node.metadata_props[:]
    onnx.save(model, str(path))


def torch_onnx(model, feeds: dict, folder: Path) -> None:
    import torch

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).logits

    folder.mkdir(parents=True, exist_ok=True)
    axes = {n: {0: "batch", 1: "sequence"} for n in INPUTS} | {"logits": {0: "batch"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits(), tuple(torch.tensor(feeds[n]) for n in INPUTS), str(folder / "classifier.onnx"),
                          dynamo=False, opset_version=17, input_names=list(INPUTS), output_names=["logits"],
                          dynamic_axes=axes)
    slim(folder / "classifier.onnx")
    with tempfile.TemporaryDirectory() as src:
        model.save_pretrained(src)
        shutil.copy(Path(src) / "config.json", folder / "config.json")
    shutil.copy(TOKENIZER, folder / "tokenizer.json")


def optimum_folder(model, folder: Path) -> None:
    from optimum.exporters.onnx import main_export

    with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
        model.save_pretrained(src)
        with open(os.devnull, "w") as null:
            old, sys.stdout = sys.stdout, null
            try:
                main_export(src, output=dst, task="text-classification", device="cpu", do_validation=True)
            finally:
                sys.stdout = old
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("model.onnx", "config.json"):
            shutil.copy(Path(dst) / name, folder / name)
    slim(folder / "model.onnx")
    shutil.copy(TOKENIZER, folder / "tokenizer.json")


def main() -> None:
    import numpy as np
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER))
    model = model_built(tok.get_vocab_size(), tok.token_to_id("[PAD]"))
    enc = tok.encode(TEXT)
    feeds = dict(input_ids=np.asarray([enc.ids], np.int64), attention_mask=np.asarray([enc.attention_mask], np.int64),
                 token_type_ids=np.asarray([enc.type_ids], np.int64))
    if OUT.exists():
        shutil.rmtree(OUT)
    torch_onnx(model, feeds, OUT / "torch_onnx")
    optimum_folder(model, OUT / "bert_optimum")
    with torch.no_grad():
        logits = model.double()(**{k: torch.tensor(v) for k, v in feeds.items()}).logits[0].tolist()
    (OUT / "reference.json").write_text(json.dumps(dict(text=TEXT, labels=[LABELS[i] for i in range(3)],
                                                        logits=logits, tokens=len(enc.ids)), indent=1) + "\n")
    print({p.relative_to(OUT).as_posix(): p.stat().st_size for p in sorted(OUT.rglob("*")) if p.is_file()})


if __name__ == "__main__":
    main()
