"""Text in, the inputs: a text and the model's tokenizer -> the tokens and the model's inputs; what the model's
output is (:func:`task_of`) and its class names. :mod:`onnx_lrp.io.text` explains with them.

The inputs are filled by name as the tokenizer gives them (:func:`model_feeds`): the token ids, ``attention_mask``,
``token_type_ids`` (a sentence pair: 0 and 1), ``position_ids`` (0..T-1). A model that takes embeddings instead of
ids (a float ``inputs_embeds``) gets them from ``embeddings``: the embedding table (vocabulary x hidden; looked up at
the ids) or this text's embeddings (T x hidden).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import InputError

TASKS = ("text-classification", "token-classification", "text-generation")
ID_NAMES = ("input_ids", "ids", "tokens", "token_ids", "input")  # the token-id input, by name (an only int input too)
EMBEDS_NAMES = ("inputs_embeds", "input_embeds", "embeds", "embeddings")  # an embeddings input, by name
FILLED = ("attention_mask", "token_type_ids", "position_ids")


@dataclass
class Encoded:
    """A text as the tokenizer encodes it: ids, the mask and segment ids it gives, which tokens are special, how each
    token reads in the text, and how many of them are the prompt's (the rest: a continuation)."""

    ids: list
    attention_mask: list
    type_ids: list
    special: list
    shown: list
    n_prompt: int


# ----------------------------------------------------------------------------------------------------- tokenizer
def load_tokenizer(tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer: from a tokenizer.json (or a folder holding one), a
    ``tokenizers.Tokenizer``, or a transformers fast tokenizer (its ``backend_tokenizer``)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend
    if hasattr(tokenizer, "encode") and hasattr(tokenizer, "id_to_token"):
        return tokenizer
    if not isinstance(tokenizer, (str, Path)):
        raise InputError(f"tokenizer must be a tokenizer.json path or a tokenizers.Tokenizer, not "
                         f"{type(tokenizer).__name__}")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError("text needs the tokenizers library: pip install 'onnx-lrp[text]' (or pip install "
                         "tokenizers)") from None
    p = Path(tokenizer)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise InputError(f"tokenizer {p} not found; give the tokenizer.json the model ships with")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library's own parse errors
        raise InputError(f"tokenizer {p} is not a tokenizers tokenizer.json ({str(exc).splitlines()[0][:120]})"
                         ) from None


def vocab_size(tokenizer) -> int:
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


def encode(tokenizer, text: str, text_pair: str | None = None, continuation: str | None = None) -> Encoded:
    """The prompt's tokens (with the tokenizer's special tokens: [CLS]/[SEP], BOS, ...) then the continuation's
    (without); token types as the tokenizer gives them (a pair: 0, then 1)."""
    if not isinstance(text, str) or not text:
        raise InputError("the text is empty; give the text to explain")
    if text_pair is not None and continuation is not None:
        raise InputError("a sentence pair is for classifiers, a continuation for language models: give one")
    enc = tokenizer.encode(text, text_pair) if text_pair is not None else tokenizer.encode(text)
    if not enc.ids:
        raise InputError(f"the text {text!r} has no tokens under this tokenizer")
    sources = (text, text_pair)
    shown = _shown(tokenizer, enc, lambda i: sources[enc.sequence_ids[i] or 0])
    ids, mask, types, special = list(enc.ids), list(enc.attention_mask), list(enc.type_ids), \
        list(enc.special_tokens_mask)
    n_prompt = len(ids)
    if continuation is not None:
        more = tokenizer.encode(continuation, add_special_tokens=False)
        if not more.ids:
            raise InputError(f"the continuation {continuation!r} has no tokens under this tokenizer")
        ids += list(more.ids)
        mask += [1] * len(more.ids)
        types += [types[-1]] * len(more.ids)
        special += [0] * len(more.ids)
        shown += _shown(tokenizer, more, lambda i: continuation)
    return Encoded(ids, mask, types, special, shown, n_prompt)


def _shown(tokenizer, enc, source) -> list:
    """How each token reads: its span of the text (a space before it where the text has one), a special token as
    its vocabulary entry; a token without a span of its own (part of a character) as it decodes."""
    out, prev = [], None
    for i, (tid, (s, e)) in enumerate(zip(enc.ids, enc.offsets)):
        if enc.special_tokens_mask[i] or e <= s:
            text = tokenizer.id_to_token(tid) if enc.special_tokens_mask[i] else \
                tokenizer.decode([tid], skip_special_tokens=False)
            out.append(text or tokenizer.id_to_token(tid) or f"<{tid}>")
            continue
        src = source(i)
        where = (enc.sequence_ids[i], s)
        if prev is not None and prev[0] == where[0] and s < prev[1]:  # overlaps the last token (a split character)
            out.append(tokenizer.decode([tid], skip_special_tokens=False) or src[s:e])
        else:
            gap = prev is not None and prev[0] == where[0] and s > prev[1] and src[prev[1]:s].isspace()
            out.append((" " if gap else "") + src[s:e])
        prev = (where[0], max(e, prev[1] if prev is not None and prev[0] == where[0] else e))
    special = enc.special_tokens_mask
    for i in range(1, len(out)):  # a space between special tokens and the words beside them
        if special[i] != special[i - 1] and not out[i].startswith(" "):
            out[i] = " " + out[i]
    return out


# ----------------------------------------------------------------------------------------------------- inputs
def model_feeds(specs, enc: Encoded, n: int, embeddings=None, vocab: int | None = None) -> tuple[dict, str]:
    """The model's inputs for the first ``n`` tokens of ``enc`` and the name of the input whose relevance is the
    tokens' (the ids, or the embeddings). ``specs``: the explainer's ``inputs`` (name, dtype, dims)."""
    ints = {s.name: s for s in specs if np.issubdtype(np.dtype(s.dtype), np.integer)}
    floats = [s for s in specs if not np.issubdtype(np.dtype(s.dtype), np.integer)]
    id_spec = next((ints[k] for k in ID_NAMES if k in ints), None)
    if id_spec is None and len(ints) == 1 and next(iter(ints)) not in FILLED:
        id_spec = next(iter(ints.values()))
    emb_spec = None
    if id_spec is None:
        emb_spec = next((s for s in floats if s.name in EMBEDS_NAMES), None) or \
            (floats[0] if len(floats) == 1 and len(floats[0].dims) == 3 else None)
    if id_spec is None and emb_spec is None:
        raise InputError("text needs a model that takes token ids or embeddings: it has no integer input named "
                         f"{' / '.join(ID_NAMES)} and no float input named {' / '.join(EMBEDS_NAMES)}")
    ids = np.asarray(enc.ids[:n], np.int64)[None]
    fill = {"attention_mask": np.asarray(enc.attention_mask[:n])[None], "position_ids": np.arange(n)[None],
            "token_type_ids": np.asarray(enc.type_ids[:n])[None]}
    feeds = {}
    for s in specs:
        if s is id_spec:
            value = ids
        elif s is emb_spec:
            value = token_embeddings(embeddings, enc.ids[:n], s, vocab)[None]
        elif s.name in fill:
            value = fill[s.name]
        else:
            given = id_spec.name if id_spec is not None else emb_spec.name
            raise InputError(f"text fills the inputs {given}, {', '.join(FILLED)}; the model also takes {s.name!r}: "
                             "give all inputs as an .npz INPUT instead")
        dims = tuple(s.dims or ())
        if len(dims) >= 2 and isinstance(dims[1], int) and dims[1] != n:
            raise InputError(f"the model takes exactly {dims[1]} tokens in {s.name!r} (exported with a fixed "
                             f"length) and the text has {n}; re-export it with a dynamic sequence axis, or give "
                             f"{dims[1]} tokens")
        feeds[s.name] = np.asarray(value).astype(np.dtype(s.dtype))
    return feeds, (id_spec or emb_spec).name


def token_embeddings(embeddings, ids, spec, vocab: int | None) -> np.ndarray:
    """The embeddings of ``ids`` (T x H) for a model that takes embeddings: looked up in the table (vocabulary x H)
    or given for this text (T x H or 1 x T x H)."""
    if embeddings is None:
        raise InputError(f"the model takes embeddings ({spec.name!r}) instead of token ids: give the embedding table "
                         "(a vocabulary x hidden .npy: --embeddings TABLE.npy, or embeddings=...) or this text's "
                         "embeddings (tokens x hidden)")
    if isinstance(embeddings, (str, Path)):
        p = Path(embeddings)
        if not p.is_file() or p.suffix.lower() != ".npy":
            raise InputError(f"embeddings {p}: give an .npy file (the vocabulary x hidden table, or tokens x hidden)")
        try:
            embeddings = np.load(p, allow_pickle=False, mmap_mode="r")
        except ValueError as exc:
            raise InputError(f"embeddings {p} is not a plain .npy array ({exc})") from None
    e = np.asarray(embeddings) if not isinstance(embeddings, np.memmap) else embeddings
    if e.ndim == 3 and e.shape[0] == 1:
        e = e[0]
    hidden = spec.dims[-1] if spec.dims and isinstance(spec.dims[-1], int) else None
    if e.ndim != 2 or e.dtype.kind != "f" or (hidden is not None and e.shape[1] != hidden):
        raise InputError(f"embeddings of shape {'x'.join(map(str, e.shape))} ({e.dtype}): give float tokens x "
                         f"{hidden or 'hidden'} or the vocabulary x {hidden or 'hidden'} table")
    if vocab is not None and e.shape[0] >= vocab:
        if max(ids) >= e.shape[0]:
            raise InputError(f"token id {max(ids)} is outside the embedding table ({e.shape[0]} rows)")
        return np.asarray(e[np.asarray(ids)], np.float32)
    if e.shape[0] == len(ids):
        return np.asarray(e, np.float32)
    raise InputError(f"embeddings with {e.shape[0]} rows are neither the embedding table (at least the tokenizer's "
                     f"{vocab} tokens) nor this text's {len(ids)} tokens")


# ----------------------------------------------------------------------------------------------------- task, labels
def task_of(ex, tokenizer, task: str | None = None, per_position: int | None = None) -> str:
    """What the explained output is: a pooled classifier (N x C), a token classifier (N x T x C, C smaller than the
    tokenizer's vocabulary) or a causal LM (N x T x V, V at least the vocabulary); ``task`` overrides the last
    rule. ``per_position``: the entries per position when the model does not declare them."""
    if task is not None and task not in TASKS:
        raise InputError(f"task {task!r}: give one of {', '.join(TASKS)}")
    name = ex.explained_output
    if ex.relevance_model.sequence_rows is None:
        if task not in (None, "text-classification"):
            raise InputError(f"task {task}: the explained output {name!r} has no sequence axis (N x classes): it is "
                             "a text classifier")
        return "text-classification"
    if task == "text-classification":
        raise InputError(f"task text-classification: the explained output {name!r} has a sequence axis (N x T x C): "
                         "give token-classification or text-generation")
    if task is not None:
        return task
    width = ex.relevance_model.sequence_rows[1] or per_position
    return "text-generation" if width is not None and width >= vocab_size(tokenizer) else "token-classification"


def read_labels(labels) -> dict | None:
    """Class names by index: a list, a dict (index -> name), or a file (a JSON list or dict, a config.json with
    ``id2label``, or a text file with one name per line), read by :mod:`onnx_lrp.io.labels` as for any classifier."""
    from .labels import as_labels

    names = as_labels(labels)
    return None if names is None else dict(enumerate(names))


def model_labels(ex) -> dict | None:
    """The ``id2label`` the model carries in its ONNX metadata (a JSON dict or list), if any."""
    from .labels import metadata_labels

    try:
        meta = ex.session.session.get_modelmeta().custom_metadata_map
    except AttributeError:
        return None
    names = metadata_labels(meta)
    return None if names is None else dict(enumerate(names))


def config_labels(folder) -> dict | None:
    """The ``id2label`` of the config.json in the model's ``folder`` (what transformers and optimum save), if any.
    A config.json that is not UTF-8 JSON (or nested too deeply to read) is refused in one line; one without usable
    id2label is ignored (a model without class names)."""
    from .labels import labels_beside
    from .model_folder import CONFIG

    names = labels_beside(Path(folder) / CONFIG) if folder is not None else None
    return None if names is None else dict(enumerate(names))


def class_index(target, labels: dict | None, width: int | None, what: str = "target") -> int | None:
    """A class from an index, a class name (case-insensitive, an alias or a unique prefix:
    :func:`onnx_lrp.io.labels.resolve_target`) or None (the arg-max)."""
    from .labels import resolve_target

    names = [labels[i] for i in sorted(labels)] if labels else None
    return resolve_target(target, names, width, what)


__all__ = ["TASKS", "Encoded", "load_tokenizer", "encode", "model_feeds", "token_embeddings",
           "task_of", "read_labels", "model_labels", "config_labels", "class_index", "vocab_size"]
