"""``onnx-lrp concepts``, ``onnx-lrp concept-graph`` and ``onnx-lrp relmax build|show``: Concept Relevance
Propagation (onnx_lrp.concepts) from the command line."""
from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from onnx_lrp.core.errors import InputError, OutputError
from onnx_lrp.core.files import printable, require_suffix
from onnx_lrp.core.validate import check_npy
from onnx_lrp.io import heatmap as hm
from onnx_lrp.io.inputs import items_kind
from onnx_lrp.io.kinds import Kind, is_kind

from .class_targets import labels_option, one_class
from .dataset import check_source_preprocessing, has_images
from .helpfmt import Command, Group
from .io import AtomicOutputs, check_writable, guard
from .options import BINDING_ROWS, INPUT_ROWS, RULE_ROWS, common, explainer_setup, input_options, preprocess


def _concepts_arg(top: int | None, concepts: str | None):
    if top is not None and concepts is not None:
        raise InputError("give --top K or --concepts, not both")
    if concepts is None:
        return f"top:{top or 6}"
    try:
        return [[int(c) for c in group.split(",") if c.strip()] for group in concepts.split(";") if group.strip()]
    except ValueError:
        raise InputError(f"--concepts {concepts!r}: give channel numbers, ',' within a concept, ';' between "
                         "concepts (e.g. '35;71,2')") from None


def _one_item(input_path, ex, setup, item: int) -> np.ndarray:
    batch = setup.read(input_path, ex.inputs)
    arrays = list(batch.arrays.values())
    if len(arrays) != 1:
        raise InputError(f"concepts need a model with one input; this one has {len(arrays)}: use onnx-lrp explain "
                         "--relevance-at TENSOR for the relevance at a layer")
    a = arrays[0]
    if not 0 <= item < len(a):
        raise InputError(f"--item {item} out of range: {input_path} holds {len(a)} item(s); give 0 to {len(a) - 1}")
    return a[item:item + 1]


def _name(target, labels) -> str | None:
    from onnx_lrp.io.labels import label_of

    return label_of(None if target is None else int(target), labels)


def _shown(target, labels) -> str:
    """``3`` or, with class names, ``3 'cat'``."""
    name = _name(target, labels)
    return f"{target} {name!r}" if name else f"{target}"


def _build(model, options: dict, pre, inputs=None, source: bool = False):
    """(setup, explainer) of click's ``options``. ``inputs``: the INPUT path (or, with ``source``, the dataset SOURCE),
    whose kind sets the box-rule bounds (:func:`explainer_setup`); a SOURCE of arrays is refused the preprocessing
    its reader does not apply (:func:`check_source_preprocessing`)."""
    kind = None
    if source:
        check_source_preprocessing(inputs, pre)
        kind = lambda: Kind.IMAGE if has_images(inputs) else Kind.NPY  # noqa: E731 (the range of arrays is unknown)
    elif inputs is not None:
        kind = lambda: items_kind(inputs)  # noqa: E731
    setup = explainer_setup(model, options, pre=pre, data_kind=kind)
    return setup, setup.explainer(model)


def _layer_help(ex) -> None:
    """Every tensor --layer accepts, one per line with its op and shape: the layers (Conv/Gemm/MatMul outputs, the
    usual choice) first, then the others (activations, pooling, sums, moves) on the way to the explained output."""
    from onnx_lrp import concepts as crp

    models = crp.models_of(ex)
    graph = models.graph()
    values = {v.name: v for n in graph for v in n.outputs}
    accepted = models.tensors()
    layers = [n for n in crp.layer_names(graph) if n in set(accepted)]
    others = [n for n in accepted if n not in set(layers)]
    width = max(map(len, accepted), default=0)
    for title, names in ((f"layers (Conv/Gemm/MatMul outputs): {len(layers)}", layers),
                         (f"other tensors accepted (activations, pooling, sums, moves): {len(others)}", others)):
        click.echo(title)
        for name in names:
            v = values[name]
            shape = "x".join(str(d) for d in v.shape) if v.shape is not None else "?"
            click.echo(f"  {printable(name):<{width}}  {v.producer().op_type:<12} {shape}")


def concept_picture(res, x: np.ndarray, full: np.ndarray, scale: int | None = None):
    """The input, the full heatmap and one tile per concept (its channels and share), side by side."""
    from PIL import Image, ImageDraw, ImageFont

    maps = np.concatenate([hm.relevance_maps(full[None] if full.ndim == x.ndim - 1 else full),
                           hm.relevance_maps(res.heatmaps)])
    labels = [[f"all (class {res.target})", f"logit {res.logit:.3g}"]] + [
        [f"ch {','.join(map(str, g))}", f"share {s:+.1%}"] for g, s in zip(res.concepts, res.shares)]
    grid = hm.render(maps, labels=labels, style="heatmap", scale=scale)
    pics = hm.display_images(x)
    if pics is None:
        return grid
    s = hm.tile_scale(*maps.shape[1:]) if scale is None else scale
    tile = Image.fromarray(np.repeat(np.repeat(pics[0], s, 0), s, 1))
    canvas = Image.new("RGB", (grid.width + tile.width + 4, max(grid.height, tile.height + 4 + 2 * hm.LINE_H)),
                       (200, 200, 200))
    canvas.paste(tile, (4, 4))
    canvas.paste(grid, (tile.width + 4, 0))
    ImageDraw.Draw(canvas).text((4, tile.height + 5), "input", fill=(0, 0, 0), font=ImageFont.load_default())
    return canvas


CONCEPT_SECTIONS = [("Explanations", ["target", "labels", "item", *RULE_ROWS, *INPUT_ROWS, *BINDING_ROWS])]
LAYER = "/features/features.6/Conv_output_0"


@click.command("concepts", cls=Command, sections=[
    ("Concepts", ["layer", "top", "concept_spec", "include_parallel", "init", "record", "list_layers"]),
    ("Outputs", ["heatmap_path", "out", "as_json"]), *CONCEPT_SECTIONS],
    examples=["onnx-lrp concepts models/digits_cnn.onnx models/samples/npy/digit_3.npy \\",
              f"    --layer {LAYER} --top 6 --heatmap concepts.png",
              "onnx-lrp concepts models/digits_cnn.onnx --list-layers"])
@click.argument("model", metavar="MODEL")
@click.argument("input_path", metavar="[INPUT]", required=False)
@click.option("--layer", default=None, metavar="TENSOR", help="Its channels are the concepts (a Conv's output).")
@click.option("--top", type=click.IntRange(min=1), default=None, metavar="K",
              help="The K channels of largest share (default 6).")
@click.option("--concepts", "concept_spec", default=None, metavar="C[,C..][;C..]",
              help="These: ',' joins channels, ';' splits concepts.")
@click.option("--target", "-t", default=None, metavar="INT|NAME",
              help="Class explained, index or name (default: arg-max).")
@labels_option
@click.option("--item", type=click.IntRange(min=0), default=0, metavar="N",
              help="Which item of INPUT (default 0).")
@click.option("--include-parallel", is_flag=True,
              help="Keep relevance bypassing the layer (skips).")
@click.option("--init", type=click.Choice(["logit", "abs", "one-hot", "activation"]), default="logit",
              metavar="logit|abs|one-hot|activation", help="Start from the logit (default), |logit|, 1, or the "
              "layer's activation (no target).")
@click.option("--record", multiple=True, metavar="TENSOR", help="Also the conditioned relevance here.")
@click.option("--heatmap", "heatmap_path", default=None, metavar="FILE.png",
              help="Input, heatmap and one tile per concept.")
@click.option("-o", "--out", "out", default=None, metavar="OUT.npz", help="Heatmaps, shares, concepts, record.")
@click.option("--list-layers", is_flag=True, help="List the tensors --layer accepts and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@common
@input_options
def concepts(model, input_path, **options):
    """Concept Relevance Propagation: which channels of --layer the prediction used, and where each sits in INPUT.

    Prints each concept's share of the relevance at the layer; --heatmap draws the conditional heatmaps.
    """
    o = options
    layer, target, init, heatmap_path, out = o["layer"], o["target"], o["init"], o["heatmap_path"], o["out"]
    pre = preprocess(o)
    setup, ex = _build(model, o, pre, input_path)
    if o["list_layers"]:
        _layer_help(ex)
        return
    if input_path is None or layer is None:
        raise InputError("give MODEL, INPUT and --layer TENSOR (--list-layers lists the layers)")
    for p in (heatmap_path, out):
        if p:
            check_writable(p)
    if out and Path(out).suffix.lower() != ".npz":
        raise OutputError(f"-o {out}: give a file name ending in .npz")
    if heatmap_path:
        require_suffix("--heatmap", heatmap_path, (".png",), "the picture")
    guard([("the input", input_path)], [("--heatmap", heatmap_path), ("-o", out)], models=[("the model", model)])
    x = _one_item(input_path, ex, setup, o["item"])
    target, labels = one_class(target, ex, model, o["labels"])
    res = ex.explain_concepts(x, target, layer, concepts=_concepts_arg(o["top"], o["concept_spec"]),
                              exclude_parallel=not o["include_parallel"], record=list(o["record"]), init=init)
    rows = [dict(channels=g, share=float(s)) for g, s in zip(res.concepts, res.shares)]
    with AtomicOutputs() as w:
        if heatmap_path:
            full = ex.explain(x, target=res.target).relevance
            w.save_png(heatmap_path, concept_picture(res, x, full))
        if out:
            arrays = {"heatmaps": res.heatmaps, "shares": res.shares, "channel_shares": res.channel_shares,
                      "concepts": np.array([g + [-1] * (max(map(len, res.concepts)) - len(g)) for g in res.concepts]),
                      **{f"relevance_at/{k}": v for k, v in res.relevance_at.items()}}
            w.save_npz(out, arrays)
    if o["as_json"]:
        named = {"target_label": _name(res.target, labels)} if labels else {}
        click.echo(json.dumps(dict(layer=layer, target=res.target, **named, logit=res.logit, concepts=rows,
                                   exclude_parallel=res.exclude_parallel, init=init)))
        return
    click.echo(f"class {_shown(res.target, labels)} (logit {res.logit:.4g}), layer {layer}, "
               f"{'excluding' if res.exclude_parallel else 'including'} parallel paths:")
    for r in rows:
        word = "channel " if len(r["channels"]) == 1 else "channels"
        click.echo(f"  {word} {','.join(map(str, r['channels'])):>12}: share {r['share']:+.2%}")
    for p in (heatmap_path, out):
        if p:
            click.echo(f"wrote {p}")


@click.command("concept-graph", cls=Command, sections=[
    ("Graph", ["layer", "concept", "width", "as_json"]), *CONCEPT_SECTIONS],
    examples=["onnx-lrp concept-graph models/digits_cnn.onnx models/samples/npy/digit_3.npy \\",
              f"    --layer {LAYER} --width 5,2"])
@click.argument("model", metavar="MODEL")
@click.argument("input_path", metavar="INPUT")
@click.option("--layer", required=True, metavar="TENSOR", help="The concept's layer (a Conv's output).")
@click.option("--concept", type=click.IntRange(min=0), default=None, metavar="C",
              help="Its channel (default: the most relevant).")
@click.option("--width", default="5,2", metavar="W[,W...]",
              help="Concepts kept per level (default 5,2).")
@click.option("--target", "-t", default=None, metavar="INT|NAME",
              help="Class explained, index or name (default: arg-max).")
@labels_option
@click.option("--item", type=click.IntRange(min=0), default=0, metavar="N", help="Which item of INPUT (default 0).")
@click.option("--json", "as_json", is_flag=True, help="Print the graph as JSON.")
@common
@input_options
def concept_graph(model, input_path, **options):
    """The attribution graph of a concept: its most relevant lower-level concepts, level by level."""
    o = options
    layer, concept, width, target = o["layer"], o["concept"], o["width"], o["target"]
    pre = preprocess(o)
    try:
        widths = [int(w) for w in width.split(",")]
    except ValueError:
        raise InputError(f"--width {width!r}: give positive ints separated by ',' (e.g. 5,2)") from None
    setup, ex = _build(model, o, pre, input_path)
    x = _one_item(input_path, ex, setup, o["item"])
    target, labels = one_class(target, ex, model, o["labels"])
    if concept is None:
        concept = int(np.argmax(ex.concept_relevance(x, target, layer)[0]))
    g = ex.concept_graph(x, target, layer, concept, width=widths)
    if o["as_json"]:
        named = {"target_label": _name(g.target, labels)} if labels else {}
        click.echo(json.dumps(dict(target=g.target, **named, root=list(g.root), nodes=[list(n) for n in g.nodes],
                                   edges=[dict(source=list(s), target=[d[0], d[1]], share=d[2])
                                          for s, ds in g.edges.items() for d in ds])))
        return
    click.echo(f"class {_shown(g.target, labels)}: concept {concept} of {layer}")

    def show(node, depth, seen):
        for lower, c, share in g.edges.get(node, []):
            click.echo(f"{'  ' * depth}{share:+7.2%}  {lower} channel {c}")
            if (lower, c) not in seen:
                show((lower, c), depth + 1, seen | {(lower, c)})

    show(g.root, 1, {g.root})


@click.group("relmax", cls=Group, examples=[
    "onnx-lrp relmax build model.onnx images/ --layer TENSOR --out-dir relmax/",
    "onnx-lrp relmax show model.onnx images/ --out-dir relmax/ --channels 3,5"])
def relmax():
    """Relevance maximisation: the reference samples of each channel over a dataset (build, then show)."""


@relmax.command("build", cls=Command, sections=[
    ("Scan", ["layer", "out_dir", "labels", "target", "samples", "shard_size", "batch_size", "overwrite"]),
    ("Explanations", [*RULE_ROWS, *INPUT_ROWS, *BINDING_ROWS])],
    examples=["onnx-lrp relmax build model.onnx images/ --layer TENSOR --out-dir relmax/",
              "onnx-lrp relmax build model.onnx data.parquet --layer TENSOR --out-dir relmax/"])
@click.argument("model", metavar="MODEL")
@click.argument("source", metavar="SOURCE")
@click.option("--layer", required=True, metavar="TENSOR", help="Its channels get reference samples.")
@click.option("--out-dir", required=True, metavar="DIR", help="Where the result goes; a rerun resumes.")
@click.option("--labels", default=None, metavar="FILE",
              help="FILE.npy: one class per item; else class names.")
@click.option("--target", "-t", default=None, metavar="INT|NAME",
              help="One class for every item (default: the arg-max).")
@click.option("--samples", type=click.IntRange(min=1), default=40, metavar="N",
              help="Reference samples kept per channel (40).")
@click.option("--shard-size", type=click.IntRange(min=1), default=256, metavar="N", help="Items per shard (256).")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, metavar="N", help="Items per model run (32).")
@click.option("--overwrite", is_flag=True, help="Replace a result made with other settings.")
@common
@input_options
def relmax_build(model, source, **options):
    """Scan SOURCE (a directory, glob, .npy/.npz or Parquet) and keep each channel's most relevant items."""
    from onnx_lrp import concepts as crp
    from onnx_lrp.dataset import open_source
    from onnx_lrp.io.inputs import input_infos

    o = options
    layer, out_dir, labels = o["layer"], o["out_dir"], o["labels"]
    pre = preprocess(o)
    guard([("the source", source), ("the --labels file", labels)],
          [("--out-dir", Path(out_dir) / n) for n in ("relmax.npz", "relmax.json")], models=[("the model", model)])
    _, ex = _build(model, o, pre, source, source=True)
    crp.find_tensor(crp.models_of(ex).graph(), layer)
    src = open_source(source, input_infos(ex.inputs), pre)
    targets = _relmax_targets(o, ex, model, len(src))
    rm = crp.relmax_build(ex, src, out_dir, layer, targets, samples=o["samples"], shard_size=o["shard_size"],
                          batch_size=o["batch_size"], overwrite=o["overwrite"], log=lambda m: click.echo(m, err=True))
    click.echo(f"wrote {Path(out_dir) / 'relmax.npz'}: {rm.indices.shape[1]} channels x {rm.indices.shape[0]} "
               f"reference samples of {len(src)} items")


def _relmax_targets(o: dict, ex, model, n: int):
    """relmax build's classes: one per item (``--labels FILE.npy``), one for all (``--target INT|NAME``, names from
    ``--labels`` as a names file, the model's id2label or the config.json beside it), or None (the arg-max)."""
    labels, target = o["labels"], o["target"]
    if not labels or not is_kind(labels, Kind.NPY):
        index = one_class(target, ex, model, labels)[0]
        return None if index is None else np.full(n, index, np.int64)
    if target is not None:
        raise InputError("--labels FILE.npy gives one class per item; --target one for all: give one of them")
    check_npy(labels, f"--labels {labels}")
    try:
        targets = np.load(labels, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"--labels {labels}: cannot read it as .npy ({exc}); give one class index per item, "
                         "saved with np.save") from None
    if targets.ndim != 1 or targets.dtype.kind not in "iu":
        raise InputError(f"--labels {labels} holds {targets.dtype} of shape {targets.shape}; give one class index "
                         "per item (integers, one axis), saved with np.save")
    return targets


@relmax.command("show", cls=Command, sections=[
    ("Show", ["out_dir", "channels", "count", "heatmap_path"]),
    ("Explanations", [*RULE_ROWS, *INPUT_ROWS, *BINDING_ROWS])],
    examples=["onnx-lrp relmax show model.onnx images/ --out-dir relmax/ --channels 35,71 \\",
              "    --heatmap refs.png"])
@click.argument("model", metavar="MODEL")
@click.argument("source", metavar="SOURCE")
@click.option("--out-dir", required=True, metavar="DIR", help="What `relmax build` wrote.")
@click.option("--channels", required=True, metavar="C[,C...]", help="The channels to show.")
@click.option("--count", type=click.IntRange(min=1), default=8, metavar="N",
              help="Reference samples per channel (8).")
@click.option("--heatmap", "heatmap_path", default=None, metavar="FILE.png",
              help="Their receptive-field heatmaps, a row each.")
@common
@input_options
def relmax_show(model, source, out_dir, channels, count, heatmap_path, **options):
    """Print each channel's reference samples; --heatmap draws their receptive-field heatmaps."""
    from onnx_lrp import concepts as crp
    from onnx_lrp.dataset import open_source
    from onnx_lrp.io.inputs import input_infos

    pre = preprocess(options)
    try:
        chans = [int(c) for c in channels.split(",")]
    except ValueError:
        raise InputError(f"--channels {channels!r}: give ints separated by ','") from None
    if heatmap_path:
        require_suffix("--heatmap", heatmap_path, (".png",), "the picture")
        check_writable(heatmap_path)
        guard([("the source", source), ("a file of --out-dir", Path(out_dir) / "relmax.npz"),
               ("a file of --out-dir", Path(out_dir) / "relmax.json")], [("--heatmap", heatmap_path)],
              models=[("the model", model)])
    _, ex = _build(model, options, pre, source, source=True)
    rm = crp.relmax_load(ex, out_dir)
    src = open_source(source, input_infos(ex.inputs), pre)
    for c in chans:
        if not 0 <= c < rm.indices.shape[1]:
            raise InputError(f"channel {c} out of range: {rm.layer!r} has {rm.indices.shape[1]} channels; give 0 to "
                             f"{rm.indices.shape[1] - 1}")
        ids = ", ".join(f"{src.ids[int(i)]} ({s:+.3f})" for i, s in zip(rm.indices[:count, c], rm.scores[:count, c]))
        click.echo(f"channel {c}: {ids}")
    if heatmap_path:
        heat = rm.reference_heatmaps(src, chans, count)
        maps = np.concatenate([hm.relevance_maps(heat[c]) for c in chans])
        labels = [[f"ch {c}", str(src.ids[int(i)])[-14:]] for c in chans for i in rm.indices[:count, c]]
        with AtomicOutputs() as w:
            w.save_png(heatmap_path, hm.render(maps, labels=labels, style="heatmap",
                                               cols=min(count, rm.indices.shape[0])))
        click.echo(f"wrote {heatmap_path}")
