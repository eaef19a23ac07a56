"""``onnx-lrp explain MODEL --text "..." [--tokenizer tokenizer.json]``: text in, tokens coloured by relevance out
(the terminal, and an HTML token heatmap in the current directory or where --html says); no token-id files by hand.

The model's own tokenizer builds the inputs (:mod:`onnx_lrp.io.text_inputs`): the token ids (or, with --embeddings, their
embeddings), attention mask, token types and positions by input name. What is explained follows from the explained
output's shape: a text classifier's class (N x C: --target, a class index or label name; default the prediction), a
token classifier's class at one token (N x T x C with C below the tokenizer's vocabulary: --position, default the
first non-special token), or a language model's next token (N x T x V: at the last position, or each token of
--continuation at the position before it, the relevances summed). --task overrides the last rule.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import click

from onnx_lrp.core.errors import InputError, OutputError, UnsupportedError
from onnx_lrp.io.genai import check_model_length

from .io import AtomicOutputs, check_writable, guard
from .generate import GENERATE_KEYS, generation_options, run_generation
from .options import device_note, explainer_setup, precision_note, uses_tf32

TEXT_KEYS = ("text", "text_pair", "tokenizer_path", "continuation", "task", "labels", "embeddings",
             "no_html") + GENERATE_KEYS
TASKS = ("text-classification", "token-classification", "text-generation")  # onnx_lrp.io.text_inputs.TASKS


def text_options(f):
    opts = [
        click.option("--text", default=None, metavar="TEXT",
                     help="Explain this text instead of an INPUT file (with the model's tokenizer): a classifier's "
                          "class, a token classifier's class at --position, or a language model's next token."),
        click.option("--text-pair", default=None, metavar="TEXT",
                     help="With --text: the second text of a sentence pair (NLI, question/answer); token types 1."),
        click.option("--tokenizer", "tokenizer_path", default=None, metavar="tokenizer.json",
                     help="The model's tokenizer.json (default: the one beside MODEL; needs pip install "
                          "'onnx-lrp[text]')."),
        click.option("--continuation", default=None, metavar="TEXT",
                     help="Language models: explain this continuation (its tokens' logits, summed) instead of the "
                          "predicted next token."),
        click.option("--task", type=click.Choice(TASKS), default=None,
                     help="What the model does, when its output's shape does not tell: N x T x C logits with C at "
                          "least the tokenizer's vocabulary are a language model's, else a token classifier's."),
        click.option("--labels", default=None, metavar="FILE",
                     help="Class names (a JSON list, a config.json with id2label, or one name per line); default: "
                          "the model's id2label metadata, or the config.json beside MODEL. --target takes them."),
        click.option("--embeddings", default=None, metavar="FILE.npy",
                     help="For a model that takes embeddings (inputs_embeds) instead of token ids: the embedding "
                          "table (vocabulary x hidden), or this text's embeddings (tokens x hidden)."),
        click.option("--no-html", "no_html", is_flag=True, default=None,
                     help="With --text: write no HTML token page (default: --html FILE, else MODEL.tokens.html here)."),
    ] + generation_options()
    for opt in reversed(opts):
        f = opt(f)
    return f


def text_mode(options) -> dict | None:
    """The text options of click's ``options``; None when none was given (explain reads INPUT)."""
    opts = {k: options.get(k) for k in TEXT_KEYS}
    return opts if any(v is not None for v in opts.values()) else None


def run_text(model, opts: dict, options: dict, refused: dict) -> int:
    """Explain ``opts["text"]`` (:func:`text_mode`); ``options``: explain's click options (the explainer's among
    them, :func:`cli.options.explainer_setup`). ``model``: an .onnx file or an export folder (its model.onnx)."""
    from onnx_lrp.io import text_inputs as tx
    from onnx_lrp.io.model_folder import resolve_model_folder
    from onnx_lrp.io.text import TextRequest, explain_request, labels_of

    if opts.get("generate") is not None or opts.get("contrast") is not None:
        return run_generation(model, opts, options, refused)
    model, folder = resolve_model_folder(model)
    folder = folder if folder is not None else Path(str(model)).absolute().parent  # a model not found: refused later
    target, position, start = options["target"], options["position"], options["start"]
    if isinstance(target, str) and target.strip().lower() in ("", "argmax"):
        target = None  # the default: the prediction
    out_path, html_out = _text_outputs(model, folder, opts, (target, position), options, refused)
    tok_path = _tokenizer_path(model, folder, opts["tokenizer_path"])
    tokenizer = tx.load_tokenizer(tok_path)
    enc = tx.encode(tokenizer, opts["text"], opts["text_pair"], opts["continuation"])
    check_model_length(model, len(enc.ids))
    t0 = time.perf_counter()
    ex, comp, note = _build(model, options, enc, opts["continuation"] is not None)
    t_build = time.perf_counter() - t0
    if note:
        click.echo(f"onnx-lrp: {note}", err=True)
    if options["device"] == "auto":
        why = ex.device_note or "onnxruntime has no CUDA provider here"
        click.echo(f"onnx-lrp: --device auto: using {ex.device}" + ("" if ex.device == "cuda" else f" ({why})"),
                   err=True)
    labels = tx.read_labels(opts["labels"]) if opts["labels"] else labels_of(ex)
    t1 = time.perf_counter()
    res = explain_request(ex, TextRequest(opts["text"], tokenizer, opts["text_pair"], target, position,
                                          opts["continuation"], opts["task"], labels, opts["embeddings"], start))
    timing = (t_build, time.perf_counter() - t1)
    _write_text(out_path, html_out, res, options["token_scale"])
    _text_report(model, ex, res, dict(tokenizer=str(tok_path), relevance_file=out_path, html_file=html_out,
                                      timing=timing, start=start, as_json=options["as_json"],
                                      token_scale=options["token_scale"]))
    return 0


def _text_report(model, ex, res, said: dict) -> None:
    """The summary: JSON, or the headline, the sums, the tokens coloured and where the files went."""
    t_build, t_explain = said["timing"]
    written = ", ".join(str(p) for p in (said["html_file"], said["relevance_file"]) if p is not None)
    if said["as_json"]:
        summary = dict(model=str(model), tokenizer=said["tokenizer"], composite=ex.composite_name,
                       start=said["start"], device=ex.device, tf32=uses_tf32(ex),
                       precision=ex.relevance_model.model_precision, **res.to_dict(),
                       relevance_file=_str(said["relevance_file"]), html_file=_str(said["html_file"]),
                       build_s=round(t_build, 4), explain_s=round(t_explain, 4))
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"{res.task}: {res.headline()}")
    click.echo(res.sums())
    if res.predictions is not None:
        click.echo("predicted per token: " + " ".join(f"{t.strip() or t}/{p}" for t, p in
                                                      zip(res.tokens, res.predictions)))
    click.echo(res.terminal(percentile=said["token_scale"]))
    click.echo(f"{len(res.tokens)} tokens, composite {ex.composite_name}, device {ex.device}"
               f"{device_note(ex)}{precision_note(ex)}: explained in "
               f"{t_explain:.3f} s (model built in {t_build:.3f} s); "
               + (f"wrote {written}" if written else "wrote nothing (--no-html)"))


def _str(path) -> str | None:
    return None if path is None else str(path)


def _text_outputs(model, folder, opts: dict, asked: tuple, options: dict, refused: dict):
    """(relevance file or None, HTML file or None), both checked before any work; the options that do not go with
    --text refused in one line. ``asked``: (target, position)."""
    target, position = asked
    given = [name for name, value in refused.items() if value]
    if given:
        raise InputError(f"{', '.join(given)} cannot be combined with --text (the input is the text)")
    if opts["text"] is None:
        names = [f"--{k.replace('_path', '').replace('_', '-')}" for k in TEXT_KEYS if opts.get(k) is not None]
        raise InputError(f"{' and '.join(names)} {'go' if len(names) > 1 else 'goes'} with --text: give the text to "
                         "explain")
    if opts["continuation"] is not None and (target is not None or position is not None):
        raise InputError("--continuation sets the explained tokens; drop --target and --position")
    for name, value in (("--target", target), ("--position", position)):
        if isinstance(value, str) and "," in value:
            raise InputError(f"{name} {value}: give one value (one text is one item)")
    out_path = Path(options["out"]) if options["out"] else None
    if out_path is not None:
        if out_path.suffix.lower() not in (".npy", ".npz"):
            raise OutputError(f"-o {out_path}: the relevance is written as .npy or .npz; change the suffix")
        check_writable(out_path)
    html_out = _html_file(model, folder, options["html_path"], opts["no_html"])
    guard([("the tokenizer", opts["tokenizer_path"] or folder / "tokenizer.json"),
           ("the --labels file", opts["labels"]), ("the --embeddings file", opts["embeddings"]),
           ("the config", folder / "config.json")],
          [("-o", out_path), ("--html", html_out)], models=[("the model", model)])
    return out_path, html_out


def _html_file(model, folder, html_path, no_html) -> Path | None:
    """The token page: --html FILE, none with --no-html, else <name>.tokens.html here, named after the model's
    file (after its folder for a generic model.onnx); refused when that page exists and was written for another
    model (or is not a token page of onnx-lrp)."""
    from onnx_lrp.io.tokens import page_model

    if no_html and html_path:
        raise InputError("--html and --no-html: give one")
    if no_html:
        return None
    if html_path:
        out = Path(html_path)
        if out.suffix.lower() not in (".html", ".htm"):
            raise OutputError(f"--html {out}: give an .html file name")
        check_writable(out)
        return out
    stem = Path(str(model)).stem
    if stem == "model" and folder is not None:
        stem = folder.name or stem
    out = Path(f"{stem}.tokens.html")
    check_writable(out)
    if out.exists():
        owner = page_model(out)
        mine = os.path.abspath(str(model))  # as the page names it (onnx_lrp.io.text.model_path)
        if owner != mine:
            whose = f"model {owner}" if owner else "something other than an onnx-lrp token page"
            raise OutputError(f"{out} here is the token page of {whose}, not of {model}; give --html FILE (or "
                              "--no-html), or remove it")
    return out


def _tokenizer_path(model, folder, given) -> Path:
    if given is not None:
        return Path(given)
    beside = folder / "tokenizer.json" if folder is not None else None
    if beside is not None and beside.is_file():
        return beside
    raise InputError(f"--text needs the model's tokenizer: give --tokenizer tokenizer.json (there is none beside "
                     f"{model})")


def _build(model, options: dict, enc, continuation: bool):
    """The explainer; a model refused with its dynamic sequence axis is built again at this text's length (shape
    computations that only fold with the length known, e.g. DeBERTa's relative positions exported by TorchScript).
    Returns (explainer, composite, the note to print or None)."""
    setup = explainer_setup(model, options, pre=_no_images())
    setup = setup.changed(precise=False)  # text runs without --precise; --strict holds as for any input
    try:
        return setup.explainer(model), setup.composite, None
    except UnsupportedError as exc:
        shapes = _text_shapes(model, len(enc.ids) - (1 if continuation else 0))
        if setup.input_shapes or not shapes:
            raise
        try:
            ex = setup.explainer(model, input_shapes=shapes)
        except UnsupportedError:
            raise exc from None
        return ex, setup.composite, (f"built for this text's {len(enc.ids)} tokens: with a dynamic sequence axis "
                                     f"the model is refused ({str(exc).split(':')[0]})")


def text_setup(model, options: dict):
    """The explainer setup of a command run on a text (``trace --text``): the image options refused in one line."""
    given = [f"--{k}" for k in ("size", "crop", "mean", "std") if options.get(k)]
    if given:
        raise InputError(f"{', '.join(given)} cannot be combined with --text (the input is the text)")
    return explainer_setup(model, options, pre=_no_images())


def text_batch(model, ex, text: str, tokenizer_path):
    """``text`` as a batch of one item (the model's inputs filled from its tokenizer, as ``explain --text`` fills
    them), named by the text: what ``trace --text`` traces."""
    from onnx_lrp.io import text_inputs as tx
    from onnx_lrp.io.model_folder import resolve_model_folder

    folder = resolve_model_folder(model)[1] or Path(str(model)).absolute().parent
    enc = tx.encode(tx.load_tokenizer(_tokenizer_path(model, folder, tokenizer_path)), text)
    feeds, _ = tx.model_feeds(ex.inputs, enc, len(enc.ids))
    return TextBatch(feeds, [repr(text[:40] + ("..." if len(text) > 40 else ""))])


@dataclass(frozen=True)
class TextBatch:
    """A text as one item of the model's inputs (``arrays`` by input name, batch axis 1) and its name."""
    arrays: dict
    names: list

    def __len__(self) -> int:
        return len(self.names)


def _no_images():
    from onnx_lrp.io.inputs import Preprocess

    return Preprocess()  # text: the image options are refused above, never read


def _text_shapes(model, n: int) -> dict | None:
    """Every input with the batch of 1 and ``n`` tokens (None if an input has other dynamic axes)."""
    from onnx_lrp.io.inputs import model_input_dims

    shapes = {}
    for info in model_input_dims(model):
        dims = tuple(info.dims)
        if len(dims) < 2 or any(d is None for d in dims[2:]):
            return None
        shapes[info.name] = (1, n) + dims[2:]
    return shapes


def _write_text(out_path, html_out, res, token_scale) -> None:
    """The relevance (.npy: one value per token; .npz: :meth:`TextExplanation.arrays`) and the token page, all or
    none."""
    with AtomicOutputs() as files:
        arrays = res.arrays()
        if out_path is not None and out_path.suffix.lower() == ".npy":
            files.save_npy(out_path, arrays["relevance"])
        elif out_path is not None:
            files.save_npz(out_path, arrays)
        if html_out is not None:
            files.write_bytes(html_out, res.html(percentile=token_scale).encode("utf-8"))


__all__ = ["TextBatch", "text_batch", "text_options", "text_mode", "text_setup", "run_text"]
