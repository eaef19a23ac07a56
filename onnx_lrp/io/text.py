"""Text in: a text and the model's tokenizer -> the model's inputs -> relevance per token.

:func:`explain_request` (``Explainer.explain_text``) covers the text models users have, told apart by the explained
output's shape (:func:`onnx_lrp.io.text_inputs.task_of`):

* ``text-classification`` (sentiment, NLI, intent; logits N x C): the class logit (``target``: the arg-max, a class
  index, or a label name) explained over the tokens;
* ``token-classification`` (NER, tagging; logits N x T x C with C smaller than the tokenizer's vocabulary): the class
  logit of one token (``position``: default the first token that is not a special token);
* ``text-generation`` (causal LMs; logits N x T x V with V at least the tokenizer's vocabulary): the next token at the
  last position, or each token of a ``continuation`` at the position before it (the relevances summed).

The model's inputs come from :mod:`onnx_lrp.io.text_inputs` (ids or embeddings, attention mask, token types,
positions); the relevance per token is that of the tokens' embeddings, summed over the hidden axis.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..core.errors import InputError, LrpError
from . import tokens as tk
from .model_folder import TOKENIZER, beside
from .text_inputs import TASKS, class_index, config_labels, encode, load_tokenizer, model_feeds, model_labels, \
    read_labels, task_of, vocab_size
from .text_result import TextExplanation


@dataclass(frozen=True)
class TextRequest:
    """What :func:`explain_request` explains.

    ``text``: the text. ``tokenizer``: a tokenizer.json (or its folder), a ``tokenizers.Tokenizer`` or a transformers
    fast tokenizer; None: the tokenizer.json beside the model (or in its export folder). ``text_pair``: the second
    text of a sentence pair. ``target``: a class index or name (classifiers), a token id or a token's text (language
    models); None: the prediction. ``position``: the explained token (token classifiers; language models: the
    position whose next token is explained), an index or the token as it reads. ``continuation``: language models:
    explain these tokens. ``task``: one of TASKS, when the output's shape does not tell. ``labels``: class names (a
    list, a dict, or a file); None: the model's ``id2label`` metadata, else the config.json beside the model.
    ``embeddings``: for a model that takes embeddings, the table (vocabulary x hidden) or this text's (T x hidden),
    an array or an .npy path. ``start``: the start relevance ("logit" or "one-hot"; None: the explainer's)."""
    text: str
    tokenizer: object = None
    text_pair: str | None = None
    target: object = None
    position: object = None
    continuation: str | None = None
    task: str | None = None
    labels: object = None
    embeddings: object = None
    start: str | None = None


def explain_request(ex, request: TextRequest) -> TextExplanation:
    """Explain ``ex``'s prediction for ``request.text`` (see the module docstring): the relevance per token."""
    tok = load_tokenizer(tokenizer_of(ex, request.tokenizer))
    enc = encode(tok, request.text, request.text_pair, request.continuation)
    names = read_labels(request.labels) if request.labels is not None else labels_of(ex)
    return run(ex, tok, enc, dataclasses.replace(request, labels=names))


def tokenizer_of(ex, tokenizer):
    """The tokenizer given, or the tokenizer.json beside the model (``ex.folder``); refused in one line without."""
    if tokenizer is not None:
        return tokenizer
    found = beside(ex.folder, TOKENIZER)
    if found is None:
        where = f"beside the model in {ex.folder}" if ex.folder is not None else \
            "for a model not given as a file"
        raise InputError(f"no tokenizer.json {where}: give the model's tokenizer (tokenizer='tokenizer.json', or "
                         "--tokenizer FILE)")
    return found


def labels_of(ex) -> dict | None:
    """The model's class names: its ``id2label`` metadata, else the config.json beside it (what transformers and
    optimum save); None when neither names them."""
    return model_labels(ex) or config_labels(ex.folder)


def run(ex, tok, enc, request: TextRequest) -> TextExplanation:
    """:func:`explain_request` on a loaded tokenizer ``tok``, an encoded text ``enc`` and a request whose ``labels``
    are class names (read): the explained logits (one, or one per continuation token) and the relevance per token
    summed over them. A text longer than the model's positions (its position embedding table's rows) is refused in
    one line with both lengths."""
    try:
        return _run(ex, tok, enc, request)
    except LrpError:
        n = len(enc.ids) - (1 if request.continuation is not None else 0)
        limit = position_limit(ex)
        if limit is not None and n > limit[0]:
            raise InputError(f"the text has {n} tokens, more than the model's {limit[0]} positions (position table "
                             f"{limit[1]!r}); shorten it by {n - limit[0]} token(s)") from None
        raise


def position_limit(ex) -> "tuple[int, str] | None":
    """(rows, name) of the model's position embedding table, or None when none is found: a 2-D initializer as wide
    as the token embedding table (the Gather of the token ids), other than it, that a Gather (by other indices) or
    a Slice reads rows of."""
    from .. import load as loader

    try:
        rm = ex.relevance_model
        graph = loader.deserialize(rm.model_bytes, rm.model_folder).graph
        ids = {s.name for s in ex.inputs if np.issubdtype(np.dtype(s.dtype), np.integer)}
    except Exception:  # noqa: BLE001 - best effort: the original refusal stands without it
        return None

    def table(v):
        return v is not None and v.is_initializer() and v.shape is not None and len(v.shape) == 2 and \
            all(isinstance(d, int) for d in v.shape)

    words = [n.inputs[0] for n in graph if n.op_type == "Gather" and table(n.inputs[0]) and len(n.inputs) > 1
             and n.inputs[1] is not None and n.inputs[1].name in ids]
    if not words:
        return None
    hidden = {w.shape[1] for w in words}
    found = [(int(n.inputs[0].shape[0]), n.inputs[0].name) for n in graph
             if n.op_type in ("Gather", "Slice") and n.inputs and table(n.inputs[0]) and n.inputs[0] not in words
             and n.inputs[0].shape[1] in hidden and not (n.op_type == "Gather" and n.inputs[1].name in ids)
             and (n.op_type != "Gather" or n.attributes.get_int("axis", 0) == 0)]
    return min(found) if found else None


def _run(ex, tok, enc, request: TextRequest) -> TextExplanation:
    text, text_pair, target, position, continuation = (request.text, request.text_pair, request.target,
                                                       request.position, request.continuation)
    task, labels, embeddings, start = request.task, request.labels, request.embeddings, request.start
    vocab = vocab_size(tok)
    n = len(enc.ids) - (1 if continuation is not None else 0)  # the last continuation token conditions nothing
    feeds, rel_name = model_feeds(ex.inputs, enc, n, embeddings, vocab)
    kind = _task(ex, tok, task, feeds, start)
    _check(kind, position, continuation, target, text_pair)
    if kind == "text-classification":
        steps = [(None, class_index(target, labels, ex.output_width()))]
    elif kind == "token-classification":
        steps = [(token_position(position, enc, n, first_word=True),
                  class_index(target, labels, ex.relevance_model.sequence_rows[1]))]
    elif continuation is not None:
        steps = [(p - 1, enc.ids[p]) for p in range(enc.n_prompt, len(enc.ids))]
    else:
        steps = [(token_position(position, enc, n, first_word=False), token_target(target, tok, vocab))]
    relevance = np.zeros(n, np.float64)
    records, explanations = [], []
    for pos, tgt in steps:
        res, rel = explain_one(ex, feeds, rel_name, pos, tgt, start, n)
        relevance += rel
        records.append(_record(ex, res, kind, pos, tok, labels))
        explanations.append(res)
    first = records[0]
    names = labels if kind != "text-generation" else None
    predictions = None
    if kind == "token-classification":
        logits = np.asarray(explanations[0].outputs[ex.explained_output])[0]
        predictions = [_name(int(c), names) for c in logits.reshape(n, -1).argmax(-1)]
    many = len(records) > 1
    # every token listed: a continuation's last token is only explained, never fed (relevance 0)
    relevance = np.concatenate([relevance, np.zeros(len(enc.ids) - n)])
    return TextExplanation(
        text=text, text_pair=text_pair, continuation=continuation, task=kind, tokens=list(enc.shown),
        input_ids=list(enc.ids), relevance=relevance, special=[bool(s) for s in enc.special],
        start=start or ex.options.start, model=model_path(ex), absorbers=absorbers(ex),
        n_prompt=enc.n_prompt, target=[r["target"] for r in records] if many else first["target"],
        label=continuation if many or continuation is not None else first["label"],
        predicted=first["predicted"], predicted_label=first["predicted_label"],
        logit=float(sum(r["logit"] for r in records)), position=first["position"], predictions=predictions,
        steps=records, explanations=explanations)


def model_path(ex) -> str | None:
    """The model's file as an absolute path, or None for a model not given as a file (bytes, a ModelProto)."""
    import os

    given = ex.relevance_model.source.model
    return os.path.abspath(os.fspath(given)) if isinstance(given, (str, os.PathLike)) else None


NORMS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization", "RMSNormalization",
                   "SkipSimplifiedLayerNormalization", "BatchNormalization", "GroupNormalization",
                   "InstanceNormalization"})


def absorbers(ex) -> tuple:
    """What in this model can keep relevance from the tokens, named from the ops of its relevance walk: biases (of
    its linear layers), normalisations, the attention softmax, embeddings added to the tokens' (more lookups than the
    tokens' own)."""
    ops = [step.op_type for step in ex.relevance_model.trace]
    found = []
    if {"Gemm", "MatMul", "Conv"} & set(ops):
        found.append("biases")
    if NORMS & set(ops):
        found.append("normalisations")
    if "Softmax" in ops:
        found.append("the attention softmax")
    if ops.count("Gather") > 1:
        found.append("the position and token-type embeddings")
    return tuple(found)


def _task(ex, tok, task, feeds, start) -> str:
    """The task; for a sequence output whose entries per position the model does not declare, read from a run."""
    if task is None and ex.relevance_model.sequence_rows is not None and ex.relevance_model.sequence_rows[1] is None:
        probe = ex.explain(feeds, position=-1, start=start)
        width = int(np.prod(np.asarray(probe.outputs[ex.explained_output]).shape[2:]))
        return task_of(ex, tok, None, width)
    return task_of(ex, tok, task)


def _check(kind, position, continuation, target, text_pair) -> None:
    if continuation is not None and kind != "text-generation":
        raise InputError(f"a continuation is for language models; this model is a {kind.replace('-', ' ')} model "
                         "(explain a class with target=..., or say task='text-generation' if it is a language model)")
    if continuation is not None and (target is not None or position is not None):
        raise InputError("the continuation sets the explained tokens and positions; drop the target and position")
    if kind == "text-classification" and position is not None:
        raise InputError("a position is for token classifiers and language models; this model classifies the whole "
                         "text (N x classes)")
    if kind == "text-generation" and text_pair is not None:
        raise InputError("a sentence pair is for classifiers; a language model continues one text")


def token_position(position, enc, n: int, first_word: bool) -> int:
    """The explained position: an index (negative: from the end), a token as it reads (its first occurrence), or
    None: the first token that is not a special token (``first_word``: token classifiers) or the last one."""
    if position is None:
        if first_word:
            return next((i for i in range(n) if not enc.special[i]), 0)
        return n - 1
    if isinstance(position, str) and not position.strip().lstrip("-").isdigit():
        want = position.strip().lower()
        found = [i for i in range(n) if enc.shown[i].strip().lower() == want]
        if not found:
            raise InputError(f"position {position!r} is not a token of the text; its tokens: "
                             + ", ".join(f"{i} {t.strip()!r}" for i, t in enumerate(enc.shown[:n])))
        return found[0]
    try:
        p = int(position)
    except (TypeError, ValueError):
        raise InputError(f"position must be a token index or a token, not {position!r}") from None
    if not -n <= p < n:
        raise InputError(f"position {p} does not fit: the text has {n} tokens (give 0..{n - 1}, or -1 for the last)")
    return p % n


def token_target(target, tok, vocab: int) -> int | None:
    """A language model's explained next token: None (the arg-max), a token id, or a token's text (one token)."""
    if target is None or (isinstance(target, str) and target.strip().lower() in ("", "argmax")):
        return None
    if isinstance(target, (int, np.integer)) and not isinstance(target, bool) or \
            isinstance(target, str) and target.strip().isdigit():
        t = int(target)
        if not 0 <= t < vocab:
            raise InputError(f"target {t} is not a token id of this tokenizer (0..{vocab - 1})")
        return t
    if isinstance(target, str):
        ids = tok.encode(target, add_special_tokens=False).ids
        if len(ids) != 1:
            raise InputError(f"target {target!r} is {len(ids)} tokens under this tokenizer; give one token (e.g. with "
                             "its leading space: ' Paris'), or explain it as a continuation")
        return int(ids[0])
    raise InputError(f"target must be a token id or a token's text, not {target!r}")


def explain_one(ex, feeds, rel_name: str, position, target, start, n: int):
    """One explanation and its relevance per token (the relevance of ``rel_name``, summed over a hidden axis)."""
    kw = {} if position is None else {"position": position}
    res = ex.explain(feeds, target=target, start=start, **kw)
    rel = res.relevance
    if isinstance(rel, dict):
        if rel_name not in rel:
            raise InputError(f"the model returns no relevance for {rel_name!r} (no embedding lookup of the ids "
                             "was found on the path to the explained output)")
        rel = rel[rel_name]
    return res, tk.per_token(np.asarray(rel)[0], n)


def _name(index: int, labels: dict | None) -> str:
    return labels.get(index, str(index)) if labels else str(index)


def _record(ex, res, kind: str, position, tok, labels) -> dict:
    """What one explanation explained: the position, the target and its label, its logit, the prediction there."""
    out = np.asarray(res.outputs[ex.explained_output])[0]
    row = out if position is None else out[position]
    t, pred = int(np.asarray(res.target).reshape(-1)[0]), int(np.argmax(row))
    if kind == "text-generation":
        label, pred_label = tok.decode([t], skip_special_tokens=False), tok.decode([pred], skip_special_tokens=False)
    else:
        label = labels.get(t) if labels else None
        pred_label = labels.get(pred) if labels else None
    value = res.explained_value
    logit = float(np.asarray(value).reshape(-1)[0]) if value is not None else float(row.reshape(-1)[t])
    return dict(position=position, target=t, label=label, logit=logit, predicted=pred, predicted_label=pred_label)


__all__ = ["TASKS", "TextExplanation", "TextRequest", "explain_request", "labels_of", "run", "tokenizer_of",
           "token_position", "token_target", "explain_one"]
