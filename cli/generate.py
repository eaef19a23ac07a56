"""``onnx-lrp explain MODEL --text PROMPT --generate N [--contrast TOKEN]``: greedy generation through the deployed
model (its KV cache in plain onnxruntime), each generated token explained over everything before it in one batched
relevance run (:mod:`onnx_lrp.run.generation`). MODEL may be an onnxruntime-genai folder (genai_config.json: the
model file, tokenizer.json, eos ids, context_length; :mod:`onnx_lrp.io.genai`).

Writes ``-o`` (.npz: relevance N x (P + N - 1), generated, prompt_ids, tokens, logits, predicted) and an HTML page
(the prompt and the continuation, a row per generated token); prints the continuation and each step's top tokens.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import click
import numpy as np

from onnx_lrp.core.errors import InputError, OutputError
from onnx_lrp.io.kinds import Kind, is_kind

from .io import check_writable, guard
from .options import explainer_setup

GENERATE_KEYS = ("generate", "contrast")


def generation_options() -> list:
    """The click options of generation (added to explain's text options)."""
    return [
        click.option("--generate", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Language models: generate N tokens greedily after --text (through the model's KV cache) "
                          "and explain each over everything before it (one batched run)."),
        click.option("--contrast", default=None, metavar="TOKEN",
                     help="With --generate (default 1): explain logit(generated) - logit(TOKEN) at each step "
                          "(a token id or one token's text; inseq's contrastive step)."),
    ]


def genai_model(model, tokenizer_path=None) -> tuple:
    """(the model file, the tokenizer path or None, the genai folder or None) for MODEL: an onnxruntime-genai
    folder gives its model file and tokenizer.json (refused in one line when either is missing), an export folder
    its model.onnx, a model file in a genai folder that folder's tokenizer."""
    from onnx_lrp.io import genai

    if genai.is_genai_folder(model):
        folder = genai.read_folder(model)
        return folder.model, Path(tokenizer_path) if tokenizer_path else folder.tokenizer, folder
    if Path(str(model)).is_dir():  # an export folder (optimum, save_pretrained): its model.onnx
        if not (Path(str(model)) / "model.onnx").is_file():
            raise InputError(f"{model} is a folder without {genai.CONFIG} or model.onnx; give the .onnx file (or an "
                             "onnxruntime-genai model folder)")
        model = Path(str(model)) / "model.onnx"
    folder = genai.config_beside(model)
    tok = tokenizer_path or (folder.tokenizer if folder is not None else None)
    return Path(str(model)), Path(tok) if tok else None, folder


def run_generation(model, opts: dict, options: dict, refused: dict) -> int:
    """Generate and explain (the module docstring); ``options``: explain's click options."""
    from onnx_lrp.io.text_inputs import encode, load_tokenizer
    from onnx_lrp.run.generation import Decoder, GenerationRequest, check_context, explain_generation

    if opts.get("text") is None:
        raise InputError("--generate and --contrast go with --text: give the prompt")
    model_file, tok_path, folder = genai_model(model, opts.get("tokenizer_path"))
    out_path, html_out = _outputs(model, model_file, opts, options, refused)
    if tok_path is None:
        tok_path = model_file.parent / "tokenizer.json"
    if not tok_path.is_file():
        raise InputError(f"--generate needs the model's tokenizer: give --tokenizer tokenizer.json (there is none "
                         f"beside {model_file})")
    n = opts.get("generate") or 1
    tokenizer = load_tokenizer(tok_path)
    check_context(folder, len(encode(tokenizer, opts["text"]).ids), n)  # before the model is built
    t0 = time.perf_counter()
    setup = explainer_setup(model_file, options, pre=_no_images()).changed(strict=False, precise=False)
    ex = setup.explainer(model_file)
    t_build = time.perf_counter() - t0
    t1 = time.perf_counter()
    res = explain_generation(ex, tokenizer, GenerationRequest(opts["text"], n, opts.get("contrast"), options["start"]),
                             Decoder(folder.folder if folder is not None else model_file, threads=ex.options.threads))
    t_explain = time.perf_counter() - t1
    if out_path is not None:
        from onnx_lrp.core.files import atomic_write
        import io

        buf = io.BytesIO()
        np.savez(buf, **res.arrays())
        atomic_write(out_path, buf.getvalue())
    if html_out is not None:
        res.html(html_out, percentile=options["token_scale"])
    if options["as_json"]:
        click.echo(json.dumps(dict(model=str(model), tokenizer=str(tok_path), composite=ex.composite_name,
                                   prompt=res.prompt, prompt_ids=res.prompt_ids, generated=res.generated,
                                   tokens=res.tokens, continuation=res.continuation, logits=res.logits,
                                   predicted=res.predicted, contrast=res.contrast, decoded=res.decoded,
                                   relevance=res.relevance.tolist(),
                                   relevance_file=str(out_path) if out_path else None, html_file=str(html_out) if html_out else None,
                                   build_s=round(t_build, 4), explain_s=round(t_explain, 4)), indent=2))
        return 0
    for line in res.lines():
        click.echo(line)
    written = ", ".join(str(p) for p in (html_out, out_path) if p is not None)
    click.echo(f"{len(res.generated)} token(s) generated and explained, composite {ex.composite_name}: decoded and "
               f"explained in {t_explain:.3f} s (model built in {t_build:.3f} s); wrote {written}")
    return 0


def _outputs(model, model_file: Path, opts: dict, options: dict, refused: dict):
    """(-o file or None, HTML file), checked before any work; options that do not go with --generate refused."""
    given = [name for name, value in refused.items() if value]
    given += [f"--{k}" for k in ("text_pair", "continuation", "labels", "embeddings") if opts.get(k) is not None]
    given += ["--position"] * (options.get("position") is not None)
    target = options.get("target")
    if target is not None and str(target).strip().lower() not in ("", "argmax"):
        given.append("--target")
    if given:
        raise InputError(f"{', '.join(given).replace('_', '-')} cannot be combined with --generate (the generated "
                         "tokens are the targets)")
    if opts.get("task") not in (None, "text-generation"):
        raise InputError(f"--generate is for language models; --task {opts['task']} says this is not one")
    out_path = Path(options["out"]) if options.get("out") else None
    if out_path is not None:
        if not is_kind(out_path, Kind.NPZ):
            raise OutputError(f"-o {out_path}: a generation is written as .npz (relevance, generated, tokens); change "
                              "the suffix")
        check_writable(out_path)
    if opts.get("no_html") and options.get("html_path"):
        raise InputError("--html and --no-html: give one")
    html_out = None if opts.get("no_html") else Path(options["html_path"]) if options.get("html_path") else \
        Path(f"{_page_stem(model, model_file)}.generation.html")
    if html_out is not None and html_out.suffix.lower() not in (".html", ".htm"):
        raise OutputError(f"--html {html_out}: give an .html file name")
    if html_out is not None:
        check_writable(html_out)
    guard([("the tokenizer", opts.get("tokenizer_path") or model_file.parent / "tokenizer.json")],
          [("-o", out_path), ("--html", html_out)], models=[("the model", model_file)])
    return out_path, html_out


def _no_images():
    from onnx_lrp.io.inputs import Preprocess

    return Preprocess()


def _page_stem(model, model_file: Path) -> str:
    """The default page's name: the folder's for a folder or a generic model.onnx, else the model file's."""
    if Path(str(model)).is_dir():
        return Path(str(model)).resolve().name
    return model_file.parent.resolve().name if model_file.stem == "model" else model_file.stem
