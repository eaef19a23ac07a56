"""Token heatmaps: tokens coloured by their relevance, as an HTML page or in the terminal.

``relevance`` is one number per token (for token-id inputs ``Explanation.relevance`` already is; for an embeddings
input sum it over the embedding dimension). Colours are scaled by the largest absolute relevance: red for
positive, blue for negative, white for zero (the LXT / zennit ``bwr`` convention).
"""
from __future__ import annotations

import html
import os
from pathlib import Path

import numpy as np

from .errors import InputError


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
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)


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


__all__ = ["read_tokens", "tokens_for", "per_token", "html_page", "html_items", "write_html", "terminal"]
