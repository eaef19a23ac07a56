"""``onnx-lrp explain MODEL --text "..." --tokenizer tokenizer.json [--continuation "..."]``: text in, tokens
coloured by relevance out (terminal, and HTML with --html); no token-id files by hand.

The tokenizer (Hugging Face ``tokenizers``, the optional extra ``onnx-lrp[text]``) builds the ids; the model's
attention mask, position ids and token types are filled by input name (:func:`onnx_lrp.io.tokens.text_feeds`).
Without --continuation the next token is explained (the arg-max at the last position, or --target); with it, each
continuation token is explained at the position before it and the relevances are summed: the relevance of the
continuation's summed logits, over the prompt and the continuation tokens that precede each one.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click
import numpy as np

from onnx_lrp.core.errors import InputError, OutputError

from .io import AtomicOutputs, Preprocess, check_writable
from .options import explainer_setup, precision_note


TEXT_KEYS = ("text", "tokenizer_path", "continuation")


def text_options(f):
    opts = [
        click.option("--text", default=None, metavar="TEXT",
                     help="Explain this text (with --tokenizer) instead of an INPUT file: the model's next token, or "
                          "--continuation."),
        click.option("--tokenizer", "tokenizer_path", default=None, metavar="tokenizer.json",
                     help="The tokenizer.json that turns --text into token ids (needs pip install 'onnx-lrp[text]')."),
        click.option("--continuation", default=None, metavar="TEXT",
                     help="With --text: explain this continuation (its tokens' logits, summed) instead of the "
                          "predicted next token."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def pop_text_options(kw: dict) -> dict | None:
    """The text options, popped from ``kw``; None when none was given."""
    opts = {k: kw.pop(k, None) for k in TEXT_KEYS}
    return opts if any(v is not None for v in opts.values()) else None


def run_text(model, opts: dict, *, target, start, device, tf32, precision, composite, rule_kw, out, html_path,
             token_scale, as_json, refused: dict) -> int:
    from onnx_lrp.io import tokens as tk

    out_path, html_out = _text_outputs(opts, target, out, html_path, refused)
    tokenizer = tk.load_tokenizer(opts["tokenizer_path"])
    ids, n_prompt = tk.encode_text(tokenizer, opts["text"], opts["continuation"])
    fed = ids if opts["continuation"] is None else ids[:-1]  # the last continuation token conditions nothing
    setup = explainer_setup(model, composite, rule_kw, pre=Preprocess())  # text: the image options are not read
    comp = setup.composite
    t0 = time.perf_counter()
    ex = setup.build(model, device=device, start=start, tf32=tf32, precision=precision)
    t_build = time.perf_counter() - t0
    if device == "auto":
        why = ex.device_note or "onnxruntime has no CUDA provider here"
        click.echo(f"onnx-lrp: --device auto: using {ex.device}" + ("" if ex.device == "cuda" else f" ({why})"),
                   err=True)
    if ex.sequence_rows is None:
        raise InputError(f"--text explains a language model's next token: the explained output "
                         f"{ex.explained_output!r} has no sequence axis (N x T x vocabulary)")
    steps = [(len(fed) - 1, target)] if opts["continuation"] is None else \
        [(p - 1, ids[p]) for p in range(n_prompt, len(ids))]
    t1 = time.perf_counter()
    relevance, explained = _explain_steps(ex, tk, tokenizer, fed, steps)
    t_explain = time.perf_counter() - t1
    words = tk.token_text(tokenizer, fed)
    _write_text(out_path, html_out, relevance, fed, n_prompt, explained, words, token_scale)
    summary = dict(model=str(model), text=opts["text"], continuation=opts["continuation"], composite=comp.name,
                   start=start, device=ex.device, tf32=bool(ex.tf32 and ex.device == "cuda"),
                   precision=ex.model_precision,
                   tokens=words, input_ids=[int(i) for i in fed], relevance=[float(v) for v in relevance],
                   explained=explained, relevance_file=str(out_path) if out_path else None,
                   html_file=str(html_out) if html_out else None, build_s=round(t_build, 4),
                   explain_s=round(t_explain, 4))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return 0
    _print_text(tk, ex, comp, explained, words, relevance, fed, token_scale, out_path, html_out, t_explain, t_build)
    return 0


def _text_outputs(opts: dict, target, out, html_path, refused: dict):
    """(relevance file, HTML file), both checked before any work; the options that do not go with --text refused."""
    given = [name for name, value in refused.items() if value]
    if given:
        raise InputError(f"{', '.join(given)} cannot be combined with --text (the input is the text)")
    if opts["text"] is None or opts["tokenizer_path"] is None:
        raise InputError("--text and --tokenizer go together: give the text and the tokenizer.json that encodes it")
    if opts["continuation"] is not None and target is not None:
        raise InputError("--continuation sets the explained tokens; drop --target")
    out_path = Path(out) if out else None
    if out_path is not None:
        if out_path.suffix.lower() not in (".npy", ".npz"):
            raise OutputError(f"-o {out_path}: the relevance is written as .npy or .npz; change the suffix")
        check_writable(out_path)
    html_out = Path(html_path) if html_path else None
    if html_out is not None:
        if html_out.suffix.lower() not in (".html", ".htm"):
            raise OutputError(f"--html {html_out}: give an .html file name")
        check_writable(html_out)
    if isinstance(target, list):
        raise InputError("--target: give one token id (one text is one item)")
    return out_path, html_out


def _explain_steps(ex, tk, tokenizer, fed, steps):
    """Each (position, target) explained; the per-token relevance summed over them and a record per step."""
    feeds = tk.text_feeds(ex.inputs, fed)
    id_name = next(n for n in ex.relevance_inputs) if ex.relevance_inputs else None
    relevance = np.zeros(len(fed), np.float64)
    explained = []
    for position, tgt in steps:
        res = ex.explain(feeds, target=tgt, position=position)
        rel = res.relevance[id_name] if isinstance(res.relevance, dict) else res.relevance
        relevance += tk.per_token(np.asarray(rel)[0], len(fed))
        logits = np.asarray(res.outputs[ex.explained_output])[0, position]
        t = int(res.target[0])
        explained.append(dict(position=position, token_id=t, token=tk.token_text(tokenizer, [t])[0],
                              logit=float(logits[t]), predicted_id=int(np.argmax(logits)),
                              predicted=tk.token_text(tokenizer, [int(np.argmax(logits))])[0]))
    return relevance, explained


def _write_text(out_path, html_out, relevance, fed, n_prompt, explained, words, token_scale) -> None:
    from onnx_lrp.io import tokens as tk

    with AtomicOutputs() as files:
        if out_path is not None and out_path.suffix.lower() == ".npy":
            files.save_npy(out_path, relevance.astype(np.float32))
        elif out_path is not None:
            files.save_npz(out_path, dict(relevance=relevance.astype(np.float32),
                                          input_ids=np.asarray(fed, np.int64), n_prompt=np.int64(n_prompt),
                                          positions=np.asarray([e["position"] for e in explained], np.int64),
                                          targets=np.asarray([e["token_id"] for e in explained], np.int64)))
        if html_out is not None:
            what = " + ".join(repr(e["token"]) for e in explained)
            page = tk.html_page(words, relevance, f"relevance for {what}", token_scale)
            files.write_bytes(html_out, page.encode("utf-8"))


def _print_text(tk, ex, comp, explained, words, relevance, fed, token_scale, out_path, html_out, t_explain,
                t_build) -> None:
    for e in explained:
        pred = "" if e["predicted_id"] == e["token_id"] else f" (the model predicts {e['predicted']!r})"
        click.echo(f"explained token {e['token']!r} (id {e['token_id']}, logit {e['logit']:.4g}) at position "
                   f"{e['position']}{pred}")
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    click.echo(tk.terminal(words, relevance, color=color, percentile=token_scale))
    click.echo(f"{len(fed)} tokens, composite {comp.name}, device {ex.device}"
               f"{' (TF32)' if ex.tf32 and ex.device == 'cuda' else ''}{precision_note(ex)}: explained in "
               f"{t_explain:.3f} s (model built in {t_build:.3f} s)" + (f"; relevance -> {out_path}" if out_path else "")
               + (f"; tokens -> {html_out}" if html_out else ""))


__all__ = ["text_options", "pop_text_options", "run_text"]
