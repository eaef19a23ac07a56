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


def read_list_file(path, what: str, hint: str):
    """A .json file's content, or a text file's lines (a trailing newline is not a line); ``what`` names the file in
    the one-line errors, ``hint`` says what to give."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} {p} not found; give {hint}")
    from ..core.validate import loads_json, read_text

    text = read_text(p, f"{what} {p}")  # not UTF-8: one line
    if p.suffix.lower() != ".json":
        lines = text.split("\n")
        return [line.rstrip("\r") for line in (lines[:-1] if lines and lines[-1] == "" else lines)]
    return loads_json(text, f"{what} {p}", f"give {hint}")  # invalid or nested too deeply: one line


def read_tokens(path) -> "list[str] | list[list[str]]":
    """Tokens from a text file, one per line, in input order (a trailing newline is not a token; the same tokens
    label every item), or from a .json file: a list of tokens, or a list of token lists (one per item)."""
    data = read_list_file(path, "token file", "a text file with one token per line, or a JSON list of token lists")
    if isinstance(data, list) and all(isinstance(t, str) for t in data):
        return data
    if isinstance(data, list) and data and all(isinstance(row, list) and all(isinstance(t, str) for t in row)
                                               for row in data):
        return data
    raise InputError(f"token file {path}: give a JSON list of strings, or a list of lists of strings (one per item)")


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


def _luminance(rgb) -> float:
    """WCAG 2 relative luminance of an sRGB colour (0..255 channels)."""
    lin = [c / 255 / 12.92 if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a, b) -> float:
    """WCAG 2 contrast ratio of two sRGB colours (1..21)."""
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def text_colour(background) -> tuple[int, int, int]:
    """Black or white, whichever reads better on ``background`` (WCAG contrast; always >= 4.5:1, AA)."""
    black, white = (0, 0, 0), (255, 255, 255)
    return black if contrast(background, black) >= contrast(background, white) else white


def token_spans(tokens: list[str], relevance, percentile: float = 100.0, marks=(), sep: str = " ") -> str:
    """The tokens as HTML spans on backgrounds coloured by their relevance (hover shows the value), joined by
    ``sep`` ("" for tokens that carry their own spaces); tokens at ``marks`` are outlined."""
    r = per_token(relevance, len(tokens))
    marked = set(marks)
    spans = []
    for i, (tok, v, s) in enumerate(zip(tokens, r, _scaled(r, percentile))):
        back = _rgb(s)
        fore = text_colour(back)
        shown = html.escape(tok).replace(" ", "&nbsp;") or "&#8203;"
        outline = ";outline:2px solid #000;outline-offset:1px" if i in marked else ""
        spans.append(f'<span class="t" style="color:rgb({",".join(map(str, fore))});'
                     f'background:rgb({",".join(map(str, back))}){outline}" title="{v:.6g}">{shown}</span>')
    return sep.join(spans)


STYLE = ".t{padding:2px 1px;margin:0;border-radius:3px;font-family:monospace;line-height:2.2}"


def scale_note(relevance, percentile: float = 100.0) -> str:
    r = np.asarray(relevance, np.float64)
    return (f"max |relevance| = {float(np.max(np.abs(r))) if r.size else 0.0:.6g}; red positive, blue negative"
            + (f"; full colour at the {percentile:g}th percentile of |relevance|, clipped above" if percentile < 100
               else ""))


def html_page(tokens: list[str], relevance, title: str = "onnx-lrp token relevance", percentile: float = 100.0,
              marks=(), sep: str = " ", lines=(), model: str | None = None) -> str:
    """An HTML page with each token on a background coloured by its relevance (hover shows the value); colours
    reach full strength at the ``percentile`` of |relevance| (100: the largest), stronger values are clipped.
    ``lines``: paragraphs of plain text under the title; ``marks``, ``sep``: see :func:`token_spans`; ``model``: the
    model's file, named in the page's ``onnx-lrp-model`` meta tag (:func:`page_model` reads it back)."""
    r = per_token(relevance, len(tokens))
    body = "".join(f"<p>{html.escape(line)}</p>\n" for line in lines)
    meta = "" if model is None else f'<meta name="{MODEL_META}" content="{html.escape(str(model), quote=True)}">'
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">" + meta + "<title>" + html.escape(title)
            + "</title>\n"
            "<style>body{font-family:sans-serif}" + STYLE + "</style></head>\n<body><h3>" + html.escape(title)
            + "</h3>\n" + body + "<p>" + token_spans(tokens, r, percentile, marks, sep) + "</p>\n"
            f"<p>{scale_note(r, percentile)}</p>\n</body></html>\n")


MODEL_META = "onnx-lrp-model"


def page_model(path) -> "str | None":
    """The model an HTML token page was written for (its ``onnx-lrp-model`` meta tag), or None: not such a page
    (or unreadable)."""
    import re

    try:
        head = Path(path).read_bytes()[:4096].decode("utf-8", "replace")
    except OSError:
        return None
    found = re.search(r'<meta name="' + MODEL_META + r'" content="([^"]*)">', head)
    return html.unescape(found.group(1)) if found else None


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


def terminal(tokens: list[str], relevance, color: bool = True, percentile: float = 100.0, sep: str = " ") -> str:
    """The tokens with 24-bit ANSI background colours joined by ``sep``, or without colour ``token[relevance]``
    (stripped, joined by spaces)."""
    r = per_token(relevance, len(tokens))
    if not color:
        return " ".join(f"{t.strip() or t}[{v:+.3g}]" for t, v in zip(tokens, r))
    out = []
    for tok, s in zip(tokens, _scaled(r, percentile)):
        back = _rgb(s)
        fore = text_colour(back)
        out.append("\x1b[48;2;{};{};{}m\x1b[38;2;{};{};{}m".format(*back, *fore) + f"{tok}\x1b[0m")
    return sep.join(out)


__all__ = ["read_tokens", "tokens_for", "per_token", "token_spans", "scale_note", "html_page", "html_items",
           "contrast", "text_colour", "page_model",
           "write_html", "terminal"]
