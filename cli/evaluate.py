"""``onnx-lrp evaluate MODEL INPUT --metric ...``: is the explanation faithful? (onnx_lrp.metrics: Quantus 0.6's
definitions; the explanation beside a seeded random floor)."""
from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from onnx_lrp.core.errors import InputError, OutputError
from onnx_lrp.core.validate import check_npy
from onnx_lrp.io.inputs import items_kind

from .class_targets import class_names, labels_option, named, resolve_named, target_option
from .helpfmt import Command, Row
from .io import AtomicOutputs, check_writable, guard
from .options import BINDING_ROWS, INPUT_ROWS, RULE_ROWS, common, explainer_setup, input_options


METRICS = ("region-perturbation", "pixel-flipping", "faithfulness-correlation", "randomisation", "relevance-mass")


def _orders(text: str) -> list[str]:
    orders = [o.strip().lower() for o in text.split(",") if o.strip()]
    bad = [o for o in orders if o not in ("morf", "lerf", "random")]
    if not orders or bad:
        raise InputError(f"--order {text!r}: give morf, lerf or both (morf,lerf); the random order is always added")
    return orders


def _mask(path, n: int, shape: tuple) -> np.ndarray:
    p = Path(path)
    if p.suffix.lower() != ".npy" or not p.is_file():
        raise InputError(f"--mask {path}: give a .npy file (1 inside the region; one per item or one for all)")
    check_npy(p, f"--mask {path}")
    try:
        m = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"--mask {path}: cannot read it ({exc}); write it with np.save") from None
    if m.ndim == len(shape) - 1:
        m = m[None]
    try:
        np.broadcast_to(m, (n, *shape[1:]))
    except ValueError:
        raise InputError(f"--mask {path} has shape {'x'.join(map(str, m.shape))}; the input is "
                         f"{'x'.join(map(str, shape))}: give a mask of one item's shape, or one per item") from None
    return m


def _verdict_line(ev, s: dict) -> str:
    """The verdict of a perturbation curve, from the scores printed above it, saying which."""
    floor = "beats" if s["beats_random"] else "does NOT beat"
    aopc = f"AOPC (MoRF) {s['aopc/morf']:.4f} vs random {s['aopc/random']:.4f}"
    if "abpc" not in s:
        return f"the explanation {floor} the random order: {aopc} (verdict on AOPC)"
    why = "" if s["abpc"] > 0 else "; ABPC <= 0: removing the least relevant first drops the score as much"
    return (f"the explanation {floor} the random order: ABPC {s['abpc']:.4f}, {aopc} (verdict on "
            f"{ev.verdict_basis()}{why})")


def summary_lines(ev) -> list[str]:
    s = ev.summary()
    n = len(ev.target)
    lines = []
    if ev.metric in ("region-perturbation", "pixel-flipping"):
        p = ev.params
        unit = f"patch {p['patch']}, {p['steps']} regions" if ev.metric == "region-perturbation" else \
            f"{p['features_in_step']} features per step, {p['steps']} steps"
        lines.append(f"{ev.metric} on {n} item(s): {unit}, baseline {p['baseline']}, {p['prob']} of the target")
        lines.append(f"  {'order':<8} {'AOPC':>8} {'AUC':>9}")
        for o in p["orders"]:
            lines.append(f"  {o:<8} {s[f'aopc/{o}']:>8.4f} {s[f'auc/{o}']:>9.4f}")
        if "abpc" in s:
            lines.append(f"  ABPC (LeRF - MoRF) {s['abpc']:.4f}")
        if "aopc/morf" in s:
            lines.append(_verdict_line(ev, s))
    elif ev.metric == "faithfulness-correlation":
        lines.append(f"faithfulness correlation on {n} item(s) ({ev.params['runs']} subsets of "
                     f"{ev.params['subset_size']}, {ev.params['prob']}): {s['correlation']:.4f}; random relevance "
                     f"{s['correlation/random']:.4f} ({'beaten' if s['beats_random'] else 'NOT beaten'})")
    elif ev.metric == "relevance-mass":
        lines.append(f"relevance mass accuracy on {n} item(s): {s['mass']:.4f} inside the mask; the mask's area "
                     f"(evenly spread relevance) {s['mass/random']:.4f} "
                     f"({'beaten' if s['beats_random'] else 'NOT beaten'})")
    else:
        lines.append(f"randomisation (cascading {ev.params['layer_order'].replace('_', '-')}, seed "
                     f"{ev.params['seed']}) on {n} item(s): similarity to the original explanation per layer")
        width = max(len(r["layer"]) for r in ev.layers)
        lines.append(f"  {'randomised down to':<{width}}  {'spearman':>8}  {'ssim':>8}  {'entropy':>8}")
        for r in ev.layers:
            lines.append(f"  {r['layer']:<{width}}  {np.nanmean(r['spearman']):>8.4f}  "
                         f"{np.nanmean(r['ssim']) if np.isfinite(r['ssim']).any() else float('nan'):>8.4f}  "
                         f"{np.nanmean(r['entropy']):>8.4f}")
        lines.append(f"eMPRT (relative entropy change, original -> fully random) {s['emprt']:.4f}; Spearman at the "
                     f"end {s['spearman/last']:.4f}")
    return [line for line in lines if line]


def plot(ev):
    from .curves import line_plot, perturbation_series

    if ev.metric in ("region-perturbation", "pixel-flipping"):
        aopc = {o: ev.mean(f"aopc/{o}") for o in ev.curves}
        what = "regions" if ev.metric == "region-perturbation" else "steps"
        return line_plot(perturbation_series(ev.curves, aopc=aopc),
                         f"{ev.metric}: {ev.params['composite']}, {len(ev.target)} item(s)",
                         f"{what} replaced ({ev.params['baseline']})", f"{ev.params['prob']} of the target (mean)")
    if ev.metric == "randomisation":
        ticks = [(i, r["layer"].split("/")[-2] if r["layer"].count("/") > 1 else r["layer"])
                 for i, r in enumerate(ev.layers)]
        series = [dict(y=[np.nanmean(r["spearman"]) for r in ev.layers], label="Spearman |R|")]
        if any(np.isfinite(r["ssim"]).any() for r in ev.layers):
            series.append(dict(y=[np.nanmean(r["ssim"]) for r in ev.layers], label="SSIM"))
        step = max(1, len(ticks) // 6)
        return line_plot(series, f"cascading randomisation: {ev.params['composite']}", "randomised down to",
                         "similarity to the original", xticks=ticks[::step])
    raise InputError(f"--plot draws curves of the perturbation metrics and the randomisation check, not of "
                     f"{ev.metric}")


@click.command("evaluate", cls=Command, sections=[
    ("Metric", ["metric", "target", "labels", "patch", "steps", "order", "baseline", "prob", "seed",
                Row(("runs", "subset_size"), "faithfulness-correlation: subsets, size.", left="--runs N, --subset-size N"),
                "mask", "layout"]),
    ("Explanations", [*RULE_ROWS, *INPUT_ROWS, *BINDING_ROWS]),
    ("Output", ["methods", "layer", "as_json", "plot_path", "device"])],
    examples=["onnx-lrp evaluate models/digits_cnn.onnx models/samples/batch.npy --patch 2 \\",
              "    --steps 40 --plot curves.png",
              "onnx-lrp evaluate model.onnx x.npy -m randomisation --plot layers.png"])
@click.argument("model", metavar="MODEL")
@click.argument("input_path", metavar="INPUT")
@click.option("--metric", "-m", type=click.Choice(METRICS), default="region-perturbation", metavar="NAME",
              help="One of the five above (default: the first).")
@common
@input_options
@click.option("--target", "-t", default="argmax", metavar="INT|NAME[,..]|argmax",
              help="Class (index or name), one per item, or argmax (default).")
@labels_option
@click.option("--patch", type=click.IntRange(min=1), default=8, metavar="N",
              help="region-perturbation: region side (8).")
@click.option("--steps", type=click.IntRange(min=1), default=50, metavar="N",
              help="Regions, or pixel-flipping steps (50).")
@click.option("--order", "order", default="morf,lerf", metavar="morf,lerf",
              help="Perturbation orders (+ a seeded random one).")
@click.option("--baseline", type=click.Choice(["black", "white", "mean", "uniform"]), default="black",
              metavar="black|white|mean|uniform", help="Replacement: min, max, mean, U[0, 1).")
@click.option("--prob", type=click.Choice(["softmax", "logit"]), default=None, metavar="softmax|logit",
              help="Score to perturb (default: as Quantus).")
@click.option("--seed", type=int, default=0, metavar="INT", help="Seeds every random choice (default 0).")
@click.option("--runs", type=click.IntRange(min=2), default=100, help="faithfulness-correlation: subsets (100).")
@click.option("--subset-size", type=click.IntRange(min=1), default=224,
              help="faithfulness-correlation: features per subset (224).")
@click.option("--mask", default=None, metavar="MASK.npy", help="relevance-mass: 1 inside the region.")
@click.option("--layout", type=click.Choice(["auto", "channels-first", "channels-last"]), default="auto",
              metavar="LAYOUT", help="auto (Quantus' rule), channels-first, -last.")
@click.option("--json", "as_json", is_flag=True, help="Print every figure (per item too) as JSON.")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png",
              help="Draw the curves or the per-layer similarity.")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", metavar="cpu|cuda|auto",
              help="onnxruntime device (default cpu).")
@click.option("--methods", default=None, metavar="A,B,..",
              help="Side by side: lrp, composites, methods (docs/methods.md).")
@click.option("--layer", default=None, metavar="TENSOR",
              help="--methods grad-cam: its tensor (default: the last spatial one).")
def evaluate(model, input_path, **options):
    """Is the explanation faithful? Score MODEL's LRP explanations of INPUT with a Quantus 0.6 metric.

    \b
    region-perturbation       AOPC per order (MoRF, LeRF), ABPC; a random floor
    pixel-flipping            the same, one feature set per step
    faithfulness-correlation  subset relevance against the drop it causes
    randomisation             cascading weight randomisation: similarity per layer
    relevance-mass            share of the relevance inside --mask

    Exit 0, or 1 when the explanation does not beat its random floor.
    """
    import onnx_lrp

    o = options
    kind = items_kind(input_path)
    setup = explainer_setup(model, o, data_kind=kind)
    if setup.zbox_note:
        click.echo(f"onnx-lrp: {setup.zbox_note}", err=True)
    comp = setup.composite
    plot_path, as_json = o["plot_path"], o["as_json"]
    if plot_path is not None:
        if Path(plot_path).suffix.lower() != ".png":
            raise OutputError(f"--plot {plot_path}: give a .png file")
        check_writable(Path(plot_path))
        guard([("the input", input_path), ("the --mask", o["mask"])], [("--plot", plot_path)],
              models=[("the model", model)])
    orders = _orders(o["order"])
    ex = setup.explainer(model)
    batch = setup.read(input_path, ex.inputs)
    if len(batch) == 0:
        raise InputError(f"{input_path} holds no items; give at least one")
    x = next(iter(batch.arrays.values()))
    labels = class_names(o["labels"], ex, model)
    targets = resolve_named(target_option(o["target"]), ex, model, labels=labels)  # an index, or a class name
    m = _mask(o["mask"], len(x), x.shape) if o["mask"] is not None else None
    if o["layer"] is not None and o["methods"] is None:
        raise InputError("--layer is grad-cam's layer in --methods; give --methods ...,grad-cam")
    if o["methods"] is not None:
        return _side_by_side(model, batch, ex, setup, {**o, "targets": targets, "orders": orders}, m)
    metric = {k: o[k] for k in ("metric", "patch", "steps", "baseline", "prob", "seed", "runs", "subset_size")}
    ev = onnx_lrp.evaluate(model, batch.arrays, target=targets, orders=orders, mask=m, device=setup.run.device,
                           explainer=ex, composite=comp, **metric,
                           channels_last={"auto": None, "channels-first": False, "channels-last": True}[o["layout"]])
    if plot_path is not None:
        with AtomicOutputs() as w:
            w.save_png(Path(plot_path), plot(ev))
    if as_json:
        out = ev.as_dict()
        out.update(model=str(model), input=str(input_path), items=list(batch.names))
        if labels:
            out["target_labels"] = named(ev.target, labels)
        click.echo(json.dumps(out, indent=2))
    else:
        for line in summary_lines(ev):
            click.echo(line)
        if plot_path is not None:
            click.echo(f"wrote {plot_path}")
    if ev.summary().get("beats_random") is False:
        raise SystemExit(1)


def _side_by_side(model, batch, ex, setup, o: dict, mask) -> None:
    """--methods: every method explained and scored on the metric, one table, one picture (cli/compare.py);
    exit 0 whichever beats its floor (a comparison, not a check)."""
    from . import compare

    names = compare.method_list(o["methods"])
    o["channels_last"] = {"auto": None, "channels-first": False, "channels-last": True}[o["layout"]]
    columns = compare.compare(model, batch.arrays, names, setup, o, mask, lrp=ex if "lrp" in names else None)
    x = next(iter(batch.arrays.values()))

    def write(image):
        with AtomicOutputs() as w:
            w.save_png(Path(o["plot_path"]), image)

    compare.report(columns, x, list(batch.names), o["plot_path"], o["as_json"], write)


__all__ = ["evaluate", "summary_lines", "plot"]
