"""Builds tests/goldens/text_hf: small Hugging Face text classifiers with random weights, exported to ONNX by
torch.onnx (TorchScript, and dynamo where it exports) and by optimum, with a tokenizer.json per tokenizer family and
reference relevance per token computed on the torch model (tests/io/test_text_hf.py).

Architectures (transformers 4.57, eager attention): BERT (a sentence pair: token_type_ids 0 and 1), RoBERTa,
DistilBERT, DeBERTa-v2 (disentangled relative-position attention), ModernBERT (rotary embeddings, GeGLU, local
attention layers, mean pooling) sequence classifiers, a BERT token classifier, and the BERT classifier exported
with ``inputs_embeds`` instead of ids (its embedding table as ``bert_embeddings.npy``).

References, per token (the relevance of the word embeddings summed over the hidden axis, for the arg-max class; for
the token classifier at the first non-special token):

* ``lxt``: LXT 2.1's own AttnLRP patch of transformers' BERT (``lxt.efficient.monkey_patch(modeling_bert)``),
  gradient x input in float64 (BERT and the BERT token classifier; LXT patches no other encoder);
* ``attnlrp-mode``: LXT 2.1's rule functions (``divide_gradient``, ``identity_rule_implicit``, its LayerNorm with the
  standard deviation held constant) applied to the unmodified transformers code by a ``torch.overrides``
  TorchFunctionMode: every product of two input-dependent tensors (matmul, bmm, mul) divides the gradient by 2, every
  element-wise non-linearity (GELU, tanh, ReLU, SiLU) takes the identity rule, every LayerNorm holds its standard
  deviation constant; softmax and everything linear keep their gradient. This is what LXT's patches do, without
  writing a patch per architecture; on BERT it matches LXT's patch (the difference is recorded in exports.json).

Each reference is computed in float64 and in float32 (``relevance64``, ``relevance32``): tests compare onnx-lrp's
float32 relevance with the float64 one, within a multiple of the float32 reference's own distance from it.

Needs torch, transformers 4.x (< 5: LXT 2.1), lxt 2.1, tokenizers and optimum-onnx (none a dependency of onnx-lrp)::

    python -m venv /tmp/hf && echo $PWD/.venv/lib/python3.11/site-packages > \\
        /tmp/hf/lib/python3.11/site-packages/deps.pth   # torch, onnx, tokenizers of the project's venv
    /tmp/hf/bin/pip install 'transformers==4.57.6' lxt==2.1 optimum-onnx==0.1.0
    /tmp/hf/bin/python scripts/make_text_hf_goldens.py
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "goldens" / "text_hf"
CORPUS = """the cat sat on the mat and looked at the dog
the dog ran after the cat across the green field
a bird sang in the tree while the sun went down
the quick brown fox jumps over the lazy dog
paris is the capital of france and berlin is the capital of germany
john smith works for acme in london since last year
the film was gripping funny and moving
the plot was dull slow and boring
a man is playing a guitar on the street
nobody is playing any music in the park""".splitlines()
TEXTS = {  # what each case explains: (text, text pair or None)
    "bert": ("the cat sat on the mat", "a dog ran in the park"),
    "bert_tokens": ("john smith works in london", None),
    "bert_embeds": ("the cat sat on the mat", "a dog ran in the park"),
    "roberta": ("the quick brown fox jumps over the lazy dog", None),
    "distilbert": ("the film was gripping funny and moving", None),
    "deberta_v2": ("a man is playing a guitar on the street", None),
    "modernbert": ("the dog ran after the cat across the green field and sat on the mat", None),
}
TOKENIZER = {"bert": "wordpiece", "bert_tokens": "wordpiece", "bert_embeds": "wordpiece", "roberta": "bytelevel",
             "distilbert": "wordpiece", "deberta_v2": "unigram", "modernbert": "modernbert"}
CASES = tuple(TEXTS)
EXPORTERS = ("torchscript", "dynamo", "optimum")


# ------------------------------------------------------------------------------------------------ tokenizers
def tokenizers_built(out: Path) -> dict:
    """One tokenizer.json per family, trained on CORPUS (offline, deterministic)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    made = {}
    # WordPiece and Unigram from vocabularies written here (their trainers order ties differently run to run): the
    # corpus' words whole, and every character alone (WordPiece: also as a continuation "##c")
    words = sorted({w for line in CORPUS for w in line.split()})
    chars = sorted({c for w in words for c in w})
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = specials + words + [c for c in chars if c not in words] + [f"##{c}" for c in chars]
    wp = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece()
    wp.post_processor = cls_sep(wp, "[CLS] $A [SEP] $B:1 [SEP]:1")
    made["wordpiece"] = wp

    bl = bytelevel_bpe(330, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bl.post_processor = processors.RobertaProcessing(("</s>", bl.token_to_id("</s>")), ("<s>", bl.token_to_id("<s>")),
                                                     trim_offsets=True, add_prefix_space=False)
    made["bytelevel"] = bl

    pieces = [(t, 0.0) for t in ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]]
    pieces += [(f"\u2581{w}", -2.0 - 0.1 * len(w)) for w in words] + [("\u2581", -3.0)]
    pieces += [(c, -5.0) for c in chars]
    ug = Tokenizer(models.Unigram(pieces, unk_id=3))
    ug.normalizer = normalizers.Lowercase()
    ug.pre_tokenizer = pre_tokenizers.Metaspace()
    ug.decoder = decoders.Metaspace()
    ug.post_processor = cls_sep(ug, "[CLS] $A [SEP] $B:1 [SEP]:1")
    made["unigram"] = ug

    mb = bytelevel_bpe(320, ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    mb.post_processor = cls_sep(mb, "[CLS] $A [SEP] $B [SEP]")
    made["modernbert"] = mb
    for name, tok in made.items():
        tok.save(str(out / f"{name}.tokenizer.json"))
    return made


def cls_sep(tok, pair: str):
    """BERT's template: [CLS] text [SEP] (``pair``: how a sentence pair reads)."""
    from tokenizers import processors

    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    return processors.TemplateProcessing(single="[CLS] $A [SEP]", pair=pair,
                                         special_tokens=[("[CLS]", cls), ("[SEP]", sep)])


def bytelevel_bpe(size: int, specials: list):
    """A byte-level BPE (GPT-2's, RoBERTa's and ModernBERT's kind) trained on CORPUS (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=size, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


# ------------------------------------------------------------------------------------------------ models
def model_built(case: str, tok):
    """A small random-weight model of the case's architecture (eval mode, eager attention, no dropout)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    vocab = tok.get_vocab_size()
    common = dict(attn_implementation="eager")
    if case in ("bert", "bert_tokens", "bert_embeds"):
        cfg = tf.BertConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=32, max_position_embeddings=64, type_vocab_size=2, num_labels=3,
                            initializer_range=0.2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                            pad_token_id=tok.token_to_id("[PAD]"), **common)
        cls = tf.BertForTokenClassification if case == "bert_tokens" else tf.BertForSequenceClassification
        if case == "bert_tokens":
            cfg.num_labels = 5
            cfg.id2label = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "B-ORG"}
            cfg.label2id = {v: k for k, v in cfg.id2label.items()}
        else:
            cfg.id2label = {0: "entailment", 1: "neutral", 2: "contradiction"}
            cfg.label2id = {v: k for k, v in cfg.id2label.items()}
    elif case == "roberta":
        cfg = tf.RobertaConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=32, max_position_embeddings=66, type_vocab_size=1, num_labels=2,
                               initializer_range=0.2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                               pad_token_id=tok.token_to_id("<pad>"), bos_token_id=tok.token_to_id("<s>"),
                               eos_token_id=tok.token_to_id("</s>"), **common)
        cls = tf.RobertaForSequenceClassification
    elif case == "distilbert":
        cfg = tf.DistilBertConfig(vocab_size=vocab, dim=16, n_layers=2, n_heads=2, hidden_dim=32,
                                  max_position_embeddings=64, num_labels=2, initializer_range=0.2, dropout=0.0,
                                  attention_dropout=0.0, seq_classif_dropout=0.0,
                                  pad_token_id=tok.token_to_id("[PAD]"), **common)
        cls = tf.DistilBertForSequenceClassification
    elif case == "deberta_v2":
        cfg = tf.DebertaV2Config(vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=32, max_position_embeddings=64, type_vocab_size=0, num_labels=3,
                                 initializer_range=0.2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                 relative_attention=True, position_buckets=8, max_relative_positions=-1,
                                 pos_att_type=["p2c", "c2p"], position_biased_input=False, norm_rel_ebd="layer_norm",
                                 share_att_key=True, pooler_hidden_size=16, pooler_hidden_act="gelu",
                                 pooler_dropout=0.0, pad_token_id=tok.token_to_id("[PAD]"), **common)
        cls = tf.DebertaV2ForSequenceClassification
    elif case == "modernbert":
        cfg = tf.ModernBertConfig(vocab_size=vocab, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
                                  num_attention_heads=2, max_position_embeddings=64, global_attn_every_n_layers=3,
                                  local_attention=8, num_labels=2, initializer_range=0.2, classifier_pooling="mean",
                                  pad_token_id=tok.token_to_id("[PAD]"), cls_token_id=tok.token_to_id("[CLS]"),
                                  sep_token_id=tok.token_to_id("[SEP]"), bos_token_id=tok.token_to_id("[CLS]"),
                                  eos_token_id=tok.token_to_id("[SEP]"), reference_compile=False, **common)
        cls = tf.ModernBertForSequenceClassification
    else:
        raise SystemExit(f"unknown case {case!r}")
    model = cls(cfg).eval()
    if case == "modernbert":  # ModernBERT initialises with a truncated normal of std 0.02 regardless: larger weights
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.2)
    return model


def encoded(case: str, tok) -> dict:
    text, pair = TEXTS[case]
    enc = tok.encode(text, pair) if pair is not None else tok.encode(text)
    feeds = {"input_ids": np.asarray([enc.ids], np.int64), "attention_mask": np.asarray([enc.attention_mask], np.int64)}
    if case.startswith("bert"):
        feeds["token_type_ids"] = np.asarray([enc.type_ids], np.int64)
    return feeds, enc


# ------------------------------------------------------------------------------------------------ exporters
def wrapper(model, names, embeds: bool):
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, first, *rest):
            kw = dict(zip(names[1:], rest))
            kw["inputs_embeds" if embeds else "input_ids"] = first
            return self.m(**kw).logits

    return Wrapped()


def export(case: str, model, feeds: dict, exporter: str, path: Path, embeds_value=None) -> str:
    import torch

    names = list(feeds)
    args = [torch.tensor(v) for v in feeds.values()]
    if embeds_value is not None:
        names[0] = "inputs_embeds"
        args[0] = torch.tensor(embeds_value)
    module = wrapper(model, names, embeds_value is not None)
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if exporter == "torchscript":
                torch.onnx.export(module, tuple(args), str(path), dynamo=False, opset_version=17, input_names=names,
                                  output_names=["logits"], dynamic_axes=axes | {"logits": {0: "batch"} | (
                                      {1: "sequence"} if case == "bert_tokens" else {})})
            elif exporter == "dynamo":
                seq = torch.export.Dim("sequence", min=2, max=60)
                shapes = ({1: seq}, tuple({1: seq} for _ in names[1:]))  # forward(first, *rest)
                prog = torch.onnx.export(module, tuple(args), dynamo=True, input_names=names, output_names=["logits"],
                                         dynamic_shapes=shapes, opset_version=18, verbose=False)
                prog.save(str(path))
            else:
                optimum_export(case, model, path)
        slim(path)
        return "ok"
    except Exception as exc:  # an exporter that cannot handle the model is recorded, not fatal
        if path.exists():
            path.unlink()
        msg = str(exc).strip().splitlines()
        return f"failed: {type(exc).__name__}: {msg[0][:300] if msg else ''}"


def slim(path: Path) -> None:
    """Drop what only documents the export (node doc strings and metadata: dynamo's stack traces, two thirds of
    its small files); the graph is unchanged."""
    import onnx

    model = onnx.load(str(path))
    for node in model.graph.node:
        node.doc_string = ""
        del node.metadata_props[:]
    onnx.save(model, str(path))


def optimum_export(case: str, model, path: Path) -> None:
    from optimum.exporters.onnx import main_export

    task = "token-classification" if case == "bert_tokens" else "text-classification"
    with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
        model.save_pretrained(src)
        with open(os.devnull, "w") as null:
            old = sys.stdout
            sys.stdout = null
            try:
                main_export(src, output=dst, task=task, device="cpu", do_validation=True)
            finally:
                sys.stdout = old
        Path(dst, "model.onnx").replace(path)


# ------------------------------------------------------------------------------------------------ references
def attnlrp_mode():
    """LXT 2.1's efficient AttnLRP rules on unmodified transformers code (see the module docstring)."""
    import torch
    import torch.nn.functional as F
    from lxt.efficient.rules import divide_gradient, identity_rule_implicit, stop_gradient
    from torch.overrides import TorchFunctionMode

    nonlinear = {F.gelu, torch.tanh, torch.Tensor.tanh, F.relu, torch.relu, torch.Tensor.relu, F.silu}
    products = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm, torch.mul,
                torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.einsum}

    def grads(args):
        return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in nonlinear and isinstance(args[0], torch.Tensor) and args[0].requires_grad:
                rest = args[1:]
                return identity_rule_implicit(lambda t: func(t, *rest, **kwargs), args[0])
            if func is F.layer_norm:
                x, shape = args[0], args[1]
                weight = args[2] if len(args) > 2 else kwargs.get("weight")
                bias = args[3] if len(args) > 3 else kwargs.get("bias")
                eps = args[4] if len(args) > 4 else kwargs.get("eps", 1e-5)
                dims = tuple(range(-len(shape), 0))
                mean = x.mean(dim=dims, keepdim=True)
                var = ((x - mean) ** 2).mean(dim=dims, keepdim=True)
                y = (x - mean) / stop_gradient((var + eps).sqrt())
                if weight is not None:
                    y = y * weight
                if bias is not None:
                    y = y + bias
                return y
            out = func(*args, **kwargs)
            operands = args[1] if func is torch.einsum else args
            if func in products and len(grads(operands)) >= 2:
                out = divide_gradient(out, 2)
            return out

    return Mode()


def relevance(case: str, model, feeds: dict, dtype, lxt: bool) -> dict:
    """Gradient x input at the word embeddings (summed over the hidden axis) for the arg-max class (the token
    classifier: at the first non-special token), the model in ``dtype``, under LXT's patch or the AttnLRP mode."""
    import contextlib

    import torch

    model = model.to(dtype)
    for p in model.parameters():
        p.requires_grad_(False)
    ids = torch.tensor(feeds["input_ids"])
    emb = model.get_input_embeddings()(ids).detach().to(dtype).requires_grad_(True)
    kw = {k: torch.tensor(v) for k, v in feeds.items() if k != "input_ids"}
    with (contextlib.nullcontext() if lxt else attnlrp_mode()):
        logits = model(inputs_embeds=emb, **kw).logits
        position = 1 if case == "bert_tokens" else None
        row = logits[0, position] if position is not None else logits[0]
        target = int(row.argmax())
        row[target].backward()
    rel = (emb * emb.grad).detach().double()
    top2 = torch.topk(row.detach().double(), 2).values
    return dict(relevance=rel.sum(-1)[0].numpy(), relevance_hidden=rel[0].numpy(), target=target,
                position=-1 if position is None else position, logits=logits.detach().double().numpy(),
                margin=float(top2[0] - top2[1]))


def lxt_model(case: str, model):
    """The same weights in LXT's patched BERT classes."""
    from lxt.efficient import monkey_patch
    from transformers.models.bert import modeling_bert

    monkey_patch(modeling_bert)
    cls = modeling_bert.BertForTokenClassification if case == "bert_tokens" else \
        modeling_bert.BertForSequenceClassification
    patched = cls(model.config)
    patched.load_state_dict(model.state_dict())
    return patched.eval()


def one(case: str, out: Path, exporters) -> dict:
    import torch
    from tokenizers import Tokenizer

    torch.use_deterministic_algorithms(True)
    tok = Tokenizer.from_file(str(out / f"{TOKENIZER[case]}.tokenizer.json"))
    model = model_built(case, tok)
    feeds, enc = encoded(case, tok)
    status = {}
    embeds = None
    if case == "bert_embeds":
        table = model.get_input_embeddings().weight.detach().numpy().astype(np.float32)
        np.save(out / "bert_embeddings.npy", table)
        embeds = table[feeds["input_ids"]]
    for exp in exporters:
        if case == "bert_embeds" and exp == "optimum":
            continue  # optimum exports ids; the embeddings form is torch.onnx's
        status[f"{case}_{exp}"] = export(case, model, feeds, exp, out / f"{case}_{exp}.onnx", embeds)
    import copy
    mode64 = relevance(case, copy.deepcopy(model), feeds, torch.float64, lxt=False)
    mode32 = relevance(case, copy.deepcopy(model), feeds, torch.float32, lxt=False)
    ref64, ref32, kind = mode64, mode32, "attnlrp-mode"
    if case.startswith("bert"):
        ref64 = relevance(case, lxt_model(case, model), feeds, torch.float64, lxt=True)
        ref32 = relevance(case, lxt_model(case, model), feeds, torch.float32, lxt=True)
        kind = "lxt"
        d = np.linalg.norm(mode64["relevance_hidden"] - ref64["relevance_hidden"]) / np.linalg.norm(
            ref64["relevance_hidden"])
        status[f"{case}_mode_vs_lxt_rel_l2"] = float(f"{d:.3g}")
    status[f"{case}_margin"] = round(ref64["margin"], 4)
    text, pair = TEXTS[case]
    np.savez_compressed(out / f"{case}.npz", text=text, text_pair="" if pair is None else pair,
                        reference=kind, target=ref64["target"], position=ref64["position"],
                        logits=ref64["logits"], relevance64=ref64["relevance"], relevance32=ref32["relevance"],
                        relevance_hidden64=ref64["relevance_hidden"], tokens=np.asarray(enc.tokens),
                        **{k: v for k, v in feeds.items()})
    return status


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--exporters", default=",".join(EXPORTERS))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    exporters = [e for e in args.exporters.split(",") if e]
    if args.one:
        print(json.dumps(one(args.one, out, exporters)))
        return
    out.mkdir(parents=True, exist_ok=True)
    tokenizers_built(out)
    from importlib.metadata import version
    report = {"versions": {p: version(p) for p in ("torch", "transformers", "optimum", "optimum-onnx", "lxt",
                                                   "tokenizers")}}
    for case in [c for c in args.cases.split(",") if c]:  # one process each: LXT's patches are global
        report.update(case_in_its_process(case, out, exporters))
    path = out / "exports.json"
    path.write_text(json.dumps({**(json.loads(path.read_text()) if path.exists() else {}), **report}, indent=1,
                               sort_keys=True) + "\n")


def case_in_its_process(case: str, out: Path, exporters) -> dict:
    """What :func:`one` reports for ``case``, run in a fresh interpreter; printed line by line."""
    command = [sys.executable, __file__, "--one", case, "--out", str(out), "--exporters", ",".join(exporters)]
    env = dict(os.environ, PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(f"{case}: FAILED\n{proc.stderr[-3000:]}", file=sys.stderr)
        return {case: "failed"}
    status = json.loads(proc.stdout.strip().splitlines()[-1])
    print("\n".join(f"{k:36s} {v}" for k, v in status.items()))
    return status

if __name__ == "__main__":
    main()
