"""``onnx-lrp explain MODEL INPUT``: relevance of inputs, written as .npy/.npz and optionally as a heatmap."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click
import numpy as np

from onnx_lrp.errors import InputError

from . import heatmap as hm
from .io import (IMAGENET_MEAN, IMAGENET_STD, AtomicOutputs, OutputError, Preprocess, check_writable, image_layout,
                 input_kind, load_inputs, model_input_dims, parse_floats, parse_size)
from .options import common, composite_with, rule_params, takes

PROGRESS_AFTER_S = 2.0  # show a progress bar when the whole run is expected to take longer than this
SUMMARY_ROWS = 20


def parse_target(text: str | None, what: str = "--target"):
    """None (arg-max), an int, or a list of ints."""
    if text is None or (what == "--target" and str(text).strip().lower() in ("", "argmax")):
        return None
    hint = "give argmax, one class index (3) or one per item (3,1,4)" if what == "--target" else \
        "give one index (5) or one per item (5,7,2)"
    try:
        vals = [int(v) for v in str(text).replace(" ", "").split(",") if v != ""]
    except ValueError:
        raise InputError(f"{what} {text!r}: {hint}") from None
    if not vals:
        raise InputError(f"{what} {text!r}: {hint}")
    if any(v < 0 for v in vals):
        raise InputError(f"{what} {text!r}: indices are >= 0")
    return vals[0] if len(vals) == 1 else vals


def default_output(input_path: Path, kind: str) -> Path:
    """Next to the input: ``x.npy`` -> ``x.relevance.npy``; a directory or .npz -> ``<name>.relevance.npz``."""
    input_path = Path(input_path)
    if kind == "directory":
        input_path = input_path.resolve()  # "." has no name of its own
        return input_path.parent / f"{input_path.name}.relevance.npz"
    suffix = ".npz" if kind == "npz" else ".npy"
    return input_path.with_name(f"{input_path.stem}.relevance{suffix}")


def _say(msg: str) -> None:
    click.echo(f"onnx-lrp: {msg}", err=True)


@click.command("explain")
@click.argument("model", metavar="MODEL")
@click.argument("input_path", metavar="INPUT")
@common
@click.option("--target", "-t", default="argmax", show_default=True, metavar="INT[,INT...]|argmax",
              help="Class (index into the explained output, flattened per item) to explain: one for all items, one "
                   "per item, or argmax (each item's largest output).")
@click.option("--output", "output_name", default=None, metavar="NAME",
              help="Model output to explain, for models with several (default: the first). A softmax output is "
                   "explained through its logits.")
@click.option("--position", default=None, metavar="INT[,INT...]",
              help="Sequence outputs (N x T x C, e.g. a language model's logits): the position along T to explain, "
                   "one for all items or one per item (default: the last).")
@click.option("--start", type=click.Choice(["logit", "one-hot"]), default="logit", show_default=True,
              help="Initial relevance at the target: its output value (logit) or 1 (one-hot, as zennit).")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True,
              help="onnxruntime device; auto takes CUDA when available and says which it used.")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True,
              help="Items per model run.")
@click.option("--relevance-at", "relevance_at", multiple=True, metavar="TENSOR",
              help="Also return the relevance of this intermediate tensor (repeatable; `onnx-lrp inspect` lists "
                   "tensor names). Needs an .npz output.")
@click.option("-o", "--out", "out", default=None, metavar="OUT.npy|OUT.npz",
              help="Where to write the relevance: .npy (the relevance array) or .npz (relevance, outputs, targets, "
                   "...). Default: next to INPUT, as <name>.relevance.npy (.npz for directories and .npz inputs).")
@click.option("--heatmap", "heatmap_path", default=None, metavar="FILE.png",
              help="Also write a heatmap: one tile per item, relevance summed over channels, symmetric around 0.")
@click.option("--cmap", type=click.Choice(list(hm.CMAPS)), default="bwr", show_default=True,
              help="Heatmap colour map (zennit's; diverging: " + ", ".join(hm.DIVERGING) + ").")
@click.option("--heatmap-style", type=click.Choice(hm.STYLES), default="beside", show_default=True,
              help="With image-like inputs: the input beside the heatmap, the heatmap over the input, or the "
                   "heatmap alone.")
@click.option("--size", default=None, metavar="H[,W]",
              help="Images: resize to this size (default: the model's input size).")
@click.option("--mean", default="0", show_default=True, metavar="FLOAT[,FLOAT...]",
              help="Images: pixels are scaled to [0,1], then (x - mean) / std per channel. ImageNet models: "
                   f"--mean {','.join(map(str, IMAGENET_MEAN))} --std {','.join(map(str, IMAGENET_STD))}.")
@click.option("--std", default="1", show_default=True, metavar="FLOAT[,FLOAT...]",
              help="Images: see --mean. For image inputs without --low/--high, the ZBox bounds are the pixel range "
                   "after this normalisation: low = (0 - mean) / std, high = (1 - mean) / std per channel.")
@click.option("--tokens", "tokens_path", default=None, metavar="FILE.txt",
              help="Token text, one token per line in input order: colour the tokens by relevance in the terminal "
                   "(summed over the embedding dimension for embedding inputs).")
@click.option("--html", "html_path", default=None, metavar="FILE.html",
              help="With --tokens: write an HTML page with the tokens coloured by relevance (one paragraph per "
                   "item).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def explain(model, input_path, target, output_name, position, start, device, batch_size, relevance_at, out,
            heatmap_path, cmap, heatmap_style, size, mean, std, tokens_path, html_path, as_json, composite,
            **rule_kw):
    """Explain MODEL's prediction for INPUT with LRP.

    INPUT is a .npy array (one item, or a batch on the first axis; never unpickled), a .npz with one array per
    model input (by input name), an image (PNG, JPEG, ...), or a directory of files of one of these kinds
    (explained as one batch, in sorted order).

    Prints a summary per item: predicted class, explained target, the output's value there, the sum of the
    relevance, and the time taken.
    """
    input_path = Path(input_path)
    kind = input_kind(input_path)
    data_kind = kind
    if kind == "directory":
        from .io import directory_files
        data_kind = directory_files(input_path)[0]

    # ---- outputs: checked before any work
    out_path = Path(out) if out else default_output(input_path, kind)
    if out_path.suffix.lower() not in (".npy", ".npz"):
        raise OutputError(f"-o {out_path}: the relevance is written as .npy or .npz; change the suffix")
    if relevance_at and out_path.suffix.lower() == ".npy":
        raise OutputError(f"-o {out_path}: --relevance-at needs an .npz output to hold several arrays")
    check_writable(out_path)
    if input_path.is_file() and out_path.exists() and out_path.resolve() == input_path.resolve():
        raise OutputError(f"-o {out_path} is the input; write the relevance to another file")
    heat_path = Path(heatmap_path) if heatmap_path else None
    if heat_path is not None:
        if heat_path.suffix.lower() != ".png":
            raise OutputError(f"--heatmap {heat_path}: heatmaps are written as PNG; give a .png file name")
        check_writable(heat_path)
        if heat_path.resolve() == out_path.resolve():
            raise OutputError(f"--heatmap and -o both name {out_path}; give two different files")
    targets = parse_target(target)
    positions = parse_target(position, "--position") if position is not None else None
    tokens = None
    if html_path and not tokens_path:
        raise OutputError("--html needs --tokens FILE (the token text, one token per line)")
    if tokens_path:
        from onnx_lrp.tokens import read_tokens
        tokens = read_tokens(tokens_path)
    html_out = Path(html_path) if html_path else None
    if html_out is not None:
        if html_out.suffix.lower() not in (".html", ".htm"):
            raise OutputError(f"--html {html_out}: give an .html file name")
        check_writable(html_out)

    # ---- preprocessing, composite and rule parameters
    pre = Preprocess(parse_size(size), parse_floats(mean, "--mean"), parse_floats(std, "--std"))
    params = rule_params(rule_kw)
    comp = composite_with(composite, {})
    zbox_note = None
    if data_kind == "image" and takes(comp, "low") and "low" not in params and "high" not in params:
        infos = model_input_dims(model)
        if len(infos) == 1:
            low, high = pre.box(image_layout(infos[0]))
            params["low"], params["high"] = low, high
            zbox_note = f"ZBox bounds from --mean/--std: low {[round(float(v), 4) for v in low.ravel()]}, " \
                        f"high {[round(float(v), 4) for v in high.ravel()]}"
    comp = composite_with(comp, params)

    # ---- build
    import onnx_lrp

    t0 = time.perf_counter()
    ex = onnx_lrp.Explainer(model, composite=comp, device=device, output=output_name,
                            relevance_at=tuple(relevance_at), start=start)
    t_build = time.perf_counter() - t0
    if device == "auto":
        _say(f"--device auto: using {ex.device}"
             + ("" if ex.device == "cuda" else " (onnxruntime has no CUDA provider here)"))
    if zbox_note:
        _say(zbox_note)
    if len(ex.relevance_inputs) > 1 and out_path.suffix.lower() == ".npy":
        raise OutputError(f"-o {out_path}: the model has {len(ex.relevance_inputs)} float inputs "
                          f"({', '.join(ex.relevance_inputs)}); write an .npz to hold a relevance per input")

    # ---- inputs
    batch = load_inputs(input_path, ex.inputs, pre)
    n = len(batch)
    if n == 0:
        raise InputError(f"{input_path} holds no items (an empty batch); give at least one")
    if isinstance(targets, list) and len(targets) != n:
        raise InputError(f"--target gives {len(targets)} classes for {n} item(s); give one, or one per item")
    if isinstance(positions, list) and len(positions) != n:
        raise InputError(f"--position gives {len(positions)} positions for {n} item(s); give one, or one per item")

    # ---- explain in batches
    t1 = time.perf_counter()
    chunks = list(range(0, n, batch_size))
    results = []
    bar = None
    try:
        for k, lo in enumerate(chunks):
            hi = min(n, lo + batch_size)
            feeds = {name: a[lo:hi] for name, a in batch.arrays.items()}
            t = targets[lo:hi] if isinstance(targets, list) else targets
            extra = {}
            if positions is not None:
                extra["position"] = positions[lo:hi] if isinstance(positions, list) else positions
            results.append(ex.explain(feeds, target=t, **extra))
            if k == 0 and len(chunks) > 1 and (time.perf_counter() - t1) * len(chunks) > PROGRESS_AFTER_S:
                bar = click.progressbar(length=len(chunks), label="explaining", file=sys.stderr)
                bar.__enter__()
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    t_explain = time.perf_counter() - t1

    relevance = _merge([r.relevance for r in results])
    outputs = {name: np.concatenate([r.outputs[name] for r in results]) for name in ex.output_names}
    target_used = np.concatenate([r.target for r in results]).astype(np.int64)
    rel_at = {name: np.concatenate([r.relevance_at[name] for r in results]) for name in relevance_at}
    explained = outputs[ex.explained_output]
    pos_used = None
    if getattr(results[0], "position", None) is not None:  # sequence outputs: one explained position per item
        pos_used = np.concatenate([np.asarray(r.position).reshape(-1) for r in results]).astype(np.int64)

    # ---- write
    with AtomicOutputs() as w:
        if out_path.suffix.lower() == ".npy":
            w.save_npy(out_path, relevance)
        else:
            arrays = {}
            if isinstance(relevance, dict):
                arrays.update({f"relevance/{k}": v for k, v in relevance.items()})
            else:
                arrays["relevance"] = relevance
            arrays["outputs"] = explained
            arrays["targets"] = target_used
            if pos_used is not None:
                arrays["positions"] = pos_used
            if len(outputs) > 1:
                arrays.update({f"outputs/{k}": v for k, v in outputs.items()})
            arrays.update({f"relevance_at/{k}": v for k, v in rel_at.items()})
            arrays["items"] = np.array(batch.names, dtype=str)
            w.save_npz(out_path, arrays)
        if heat_path is not None:
            w.save_png(heat_path, _heatmap(ex, batch, relevance, cmap, heatmap_style))
        token_rows = _token_rows(tokens, relevance, n) if tokens is not None else None
        if html_out is not None:
            from onnx_lrp.tokens import html_items
            w.write_bytes(html_out, html_items(tokens, token_rows, [f"item {name}: target {int(t)}" for name, t in
                                                                  zip(batch.names, target_used)]).encode())

    # ---- summary
    if pos_used is not None:  # the explained row of each item
        flat = np.stack([np.asarray(explained[i, pos_used[i]]).reshape(-1) for i in range(n)])
    else:
        flat = explained.reshape(n, -1)
    rel_flat = sum(np.asarray(v, np.float64).reshape(n, -1).sum(1) for v in
                   (relevance.values() if isinstance(relevance, dict) else [relevance]))
    items = [dict(item=batch.names[i], predicted=int(np.argmax(flat[i])), target=int(target_used[i]),
                  output=float(flat[i, target_used[i]]), relevance_sum=float(rel_flat[i])) for i in range(n)]
    if pos_used is not None:
        for it, p in zip(items, pos_used):
            it["position"] = int(p)
    summary = dict(model=str(model), input=str(input_path), composite=comp.name, start=start, device=ex.device,
                   explained_output=ex.explained_output, items=items, relevance_file=str(out_path),
                   heatmap_file=str(heat_path) if heat_path else None, build_s=round(t_build, 4),
                   explain_s=round(t_explain, 4))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    width = max(len("item"), *(len(it["item"]) for it in items[:SUMMARY_ROWS]))
    click.echo(f"{'item':<{width}}  predicted  target  {('output ' + ex.explained_output)[:18]:>18}  relevance sum")
    for it in items[:SUMMARY_ROWS]:
        click.echo(f"{it['item']:<{width}}  {it['predicted']:>9}  {it['target']:>6}  {it['output']:>18.6g}  "
                   f"{it['relevance_sum']:>13.6g}")
    if n > SUMMARY_ROWS:
        click.echo(f"... {n - SUMMARY_ROWS} more item(s) (--json lists all)")
    click.echo(f"{n} item(s), composite {comp.name}, start {start}, device {ex.device}: explained in "
               f"{t_explain:.3f} s (model built in {t_build:.3f} s)")
    if token_rows is not None:
        from onnx_lrp.tokens import terminal
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        for name, row in zip(batch.names, token_rows):
            click.echo(f"{name}: {terminal(tokens, row, color=color)}")
    click.echo(f"relevance -> {out_path}" + (f"; heatmap -> {heat_path}" if heat_path else "")
               + (f"; tokens -> {html_out}" if html_out else ""))


def _token_rows(tokens, relevance, n):
    """One relevance value per token and item (the first input's relevance, summed over embedding dims)."""
    from onnx_lrp.tokens import per_token
    rel = next(iter(relevance.values())) if isinstance(relevance, dict) else relevance
    return [per_token(np.asarray(rel[i]), len(tokens)) for i in range(n)]


def _merge(parts):
    if isinstance(parts[0], dict):
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate(parts)


def _heatmap(ex, batch, relevance, cmap, style):
    """The heatmap image of the first float input's relevance."""
    first = ex.relevance_inputs[0]
    rel = relevance[first] if isinstance(relevance, dict) else relevance
    layout = batch.layout
    channel_axis = layout.channel_axis if layout is not None else 1
    maps = hm.relevance_maps(rel, channel_axis)
    images = batch.images if batch.kind == "image" else hm.display_images(batch.arrays[first], channel_axis)
    return hm.render(maps, images, cmap=cmap, style=style)
