"""Token heatmaps: tokens coloured by their relevance, as an HTML page or in the terminal.

``relevance`` is one number per token (for token-id inputs ``Explanation.relevance`` already is; for an embeddings
input sum it over the embedding dimension). Colours are scaled by the largest absolute relevance: red for
positive, blue for negative, white for zero (the LXT / zennit ``bwr`` convention).
"""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from ..core.errors import InputError
from ..core.files import atomic_write


def read_tokens(path) -> "list[str] | list[list[str]]":
    """Tokens from a text file, one per line, in input order (a trailing newline is not a token; the same tokens
    label every item), or from a .json file: a list of tokens, or a list of token lists (one per item)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"token file {p} not found; give a text file with one token per line, or a JSON list of "
                         "token lists")
    text = p.read_text(encoding="utf-8")
    if p.suffix.lower() == ".json":
        import json
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InputError(f"token file {p} is not valid JSON ({exc}); give a list of token lists") from None
        if isinstance(data, list) and all(isinstance(t, str) for t in data):
            return data
        if isinstance(data, list) and data and all(isinstance(row, list) and all(isinstance(t, str) for t in row)
                                                   for row in data):
            return data
        raise InputError(f"token file {p}: give a JSON list of strings, or a list of lists of strings (one per item)")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    return [line.rstrip("\r") for line in lines]


def per_token(relevance, n_tokens: int | None = None) -> np.ndarray:
    """One relevance per token from (T,), (1, T), (T, H) or (1, T, H) arrays (summed over H)."""
    r = np.asarray(relevance, dtype=np.float64)
    while r.ndim > 1 and r.shape[0] == 1:
        r = r[0]
    if r.ndim == 2:
        r = r.sum(-1)
    if r.ndim != 1:
        raise InputError(f"relevance of shape {np.shape(relevance)} is not one value per token; give (T,), (1, T) "
                         "or (T, H)")
    if n_tokens is not None and r.shape[0] != n_tokens:
        raise InputError(f"{n_tokens} tokens but {r.shape[0]} relevance values; the token file needs one line per "
                         "input position")
    return r


def tokens_for(tokens, item: int, n_items: int) -> list[str]:
    """The tokens of one item: per-item lists (their number must equal the batch size) or one list for all."""
    if tokens and isinstance(tokens[0], list):
        if len(tokens) != n_items:
            raise InputError(f"--tokens holds {len(tokens)} token lists for {n_items} item(s); give one list per item")
        return tokens[item]
    return tokens


def _scaled(r: np.ndarray, percentile: float = 100.0) -> np.ndarray:
    """r / scale in [-1, 1]: scale = the ``percentile`` of |r| (100: the largest), values beyond it clipped."""
    a = np.abs(r)
    m = float(np.max(a) if percentile >= 100 else np.percentile(a, percentile)) if r.size else 0.0
    if m <= 0 and r.size:
        m = float(np.max(a))
    return np.clip(r / m, -1, 1) if m > 0 else np.zeros_like(r)


def _rgb(v: float) -> tuple[int, int, int]:
    """bwr: -1 blue, 0 white, +1 red."""
    v = max(-1.0, min(1.0, float(v)))
    fade = int(round(255 * (1 - abs(v))))
    return (255, fade, fade) if v >= 0 else (fade, fade, 255)


def html_page(tokens: list[str], relevance, title: str = "onnx-lrp token relevance", percentile: float = 100.0
              ) -> str:
    """An HTML page with each token on a background coloured by its relevance (hover shows the value); colours
    reach full strength at the ``percentile`` of |relevance| (100: the largest), stronger values are clipped."""
    r = per_token(relevance, len(tokens))
    spans = []
    for tok, v, s in zip(tokens, r, _scaled(r, percentile)):
        red, green, blue = _rgb(s)
        shown = html.escape(tok).replace(" ", "&nbsp;") or "&#8203;"
        spans.append(f'<span class="t" style="background:rgb({red},{green},{blue})" '
                     f'title="{v:.6g}">{shown}</span>')
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + html.escape(title) + "</title>\n"
            "<style>body{font-family:monospace;line-height:2}.t{padding:2px 3px;margin:1px;border-radius:3px}"
            "</style></head>\n<body><h3>" + html.escape(title) + "</h3>\n<p>" + " ".join(spans) + "</p>\n"
            f"<p>max |relevance| = {float(np.max(np.abs(r))) if r.size else 0.0:.6g}; red positive, blue negative"
            + (f"; full colour at the {percentile:g}th percentile of |relevance|, clipped above" if percentile < 100
               else "") + "</p>\n</body></html>\n")


def html_items(tokens, rows, labels, title: str = "onnx-lrp token relevance", percentile: float = 100.0) -> str:
    """One page, one paragraph per batch item (each row: that item's relevance, see ``per_token``); ``tokens`` is
    one token list for all items or one list per item."""
    pages = [html_page(tokens_for(tokens, i, len(rows)), row, f"{label}", percentile)
             for i, (row, label) in enumerate(zip(rows, labels))]
    bodies = [pg[pg.index("<body>") + len("<body>"):pg.index("</body>")] for pg in pages]
    head = pages[0][:pages[0].index("<body>")].replace(
        "<title>" + html.escape(str(labels[0])) + "</title>", "<title>" + html.escape(title) + "</title>")
    return head + "<body>\n" + "<hr>\n".join(bodies) + "</body></html>\n"


def write_html(path, tokens: list[str], relevance, title: str = "onnx-lrp token relevance", page=None) -> None:
    page = page if page is not None else html_page(tokens, relevance, title)
    atomic_write(path, page.encode("utf-8"))


def terminal(tokens: list[str], relevance, color: bool = True, percentile: float = 100.0) -> str:
    """The tokens with 24-bit ANSI background colours (or ``token[relevance]`` without colour)."""
    r = per_token(relevance, len(tokens))
    if not color:
        return " ".join(f"{t}[{v:+.3g}]" for t, v in zip(tokens, r))
    out = []
    for tok, s in zip(tokens, _scaled(r, percentile)):
        red, green, blue = _rgb(s)
        out.append(f"\x1b[48;2;{red};{green};{blue}m\x1b[38;2;0;0;0m{tok}\x1b[0m")
    return " ".join(out)


# ---------------------------------------------------------------------------------------------- text in
ID_NAMES = ("input_ids", "ids", "tokens", "token_ids", "input")  # the token-id input, by name (an only int input too)


def load_tokenizer(path):
    """A Hugging Face ``tokenizers`` tokenizer from its tokenizer.json (the optional extra ``onnx-lrp[text]``)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError("--tokenizer needs the tokenizers library: pip install 'onnx-lrp[text]' (or pip install "
                         "tokenizers)") from None
    p = Path(path)
    if not p.is_file():
        raise InputError(f"tokenizer {p} not found; give a tokenizer.json (the file a Hugging Face model ships)")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as exc:
        raise InputError(f"tokenizer {p} is not a tokenizers tokenizer.json ({str(exc).splitlines()[0][:120]})"
                         ) from None


def token_text(tokenizer, ids) -> list[str]:
    """How each token reads (``decode`` of that id alone, so byte-level BPE shows ' the', not 'Ġthe'); a token that
    decodes to nothing (a special token) shows as its vocabulary entry."""
    out = []
    for i in ids:
        t = tokenizer.decode([int(i)], skip_special_tokens=False)
        out.append(t if t else (tokenizer.id_to_token(int(i)) or f"<{int(i)}>"))
    return out


def encode_text(tokenizer, text: str, continuation: str | None = None) -> tuple[list[int], int]:
    """(ids, n_prompt): the prompt's ids (with the tokenizer's special tokens, e.g. LLaMA's BOS) followed by the
    continuation's (without); ``n_prompt`` of them are the prompt's."""
    if not isinstance(text, str) or not text:
        raise InputError("--text is empty; give the text to explain")
    ids = list(tokenizer.encode(text).ids)
    if not ids:
        raise InputError(f"--text {text!r} has no tokens under this tokenizer")
    n_prompt = len(ids)
    if continuation is not None:
        more = list(tokenizer.encode(continuation, add_special_tokens=False).ids)
        if not more:
            raise InputError(f"--continuation {continuation!r} has no tokens under this tokenizer")
        ids += more
    return ids, n_prompt


def text_feeds(specs, ids) -> dict:
    """The model's inputs for one sequence of token ids: the id input, and where the model has them an attention
    mask of ones, positions 0..T-1 and token types of zero (all by input name). ``specs``: the Explainer's
    ``inputs`` (name, dtype, dims)."""
    ids = np.asarray(ids, np.int64)[None]
    n = ids.shape[1]
    ints = [s for s in specs if np.issubdtype(np.dtype(s.dtype), np.integer)]
    floats = [s.name for s in specs if not np.issubdtype(np.dtype(s.dtype), np.integer)]
    by_name = {s.name: s for s in ints}
    id_spec = next((by_name[k] for k in ID_NAMES if k in by_name), ints[0] if len(ints) == 1 else None)
    if id_spec is None:
        raise InputError("--text needs a model that takes token ids: it has no integer input named "
                         f"{' / '.join(ID_NAMES)}" + (f" (float inputs: {', '.join(floats)}; a model that takes "
                                                      "embeddings needs them as an .npy INPUT)" if floats else ""))
    fill = {"attention_mask": np.ones_like(ids), "position_ids": np.arange(n, dtype=np.int64)[None],
            "token_type_ids": np.zeros_like(ids)}
    feeds = {}
    for s in specs:
        if s is id_spec:
            value = ids
        elif s.name in fill:
            value = fill[s.name]
        else:
            raise InputError(f"--text fills the inputs {id_spec.name}, attention_mask, position_ids and token_type_ids;"
                             f" the model also takes {s.name!r}: give all inputs as an .npz INPUT instead")
        dims = tuple(s.dims or ())
        if len(dims) == 2 and isinstance(dims[1], int) and dims[1] != n:
            raise InputError(f"the model takes exactly {dims[1]} tokens in {s.name!r} (exported with a fixed "
                             f"length) and the text has {n}; re-export it with a dynamic sequence axis, or give "
                             f"{dims[1]} tokens")
        feeds[s.name] = value.astype(np.dtype(s.dtype))
    return feeds


__all__ = ["read_tokens", "tokens_for", "per_token", "html_page", "html_items", "write_html", "terminal",
           "load_tokenizer", "token_text", "encode_text", "text_feeds"]
