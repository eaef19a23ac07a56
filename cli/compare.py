"""``onnx-lrp evaluate MODEL INPUT --methods lrp,integrated-gradients,smoothgrad,occlusion``: the methods side by
side on one faithfulness metric (onnx_lrp.evaluate given each method's attribution), one table (the scores beside
their random floor, the time per item) and one picture with a column per method (``--plot``)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import click
import numpy as np

from onnx_lrp.core.errors import InputError

COMPARED = ("region-perturbation", "pixel-flipping", "faithfulness-correlation", "relevance-mass")
# per metric: (summary key, column title) shown beside each method
COLUMNS = {
    "region-perturbation": (("aopc/morf", "AOPC MoRF"), ("aopc/lerf", "AOPC LeRF"), ("abpc", "ABPC"),
                            ("aopc/random", "AOPC random")),
    "faithfulness-correlation": (("correlation", "correlation"), ("correlation/random", "random")),
    "relevance-mass": (("mass", "mass"), ("mass/random", "mask area")),
}
COLUMNS["pixel-flipping"] = COLUMNS["region-perturbation"]
MAX_PICTURE_ITEMS = 8


@dataclass
class Column:
    """One method of the comparison: its name, explainer, attribution, targets and seconds per item."""

    name: str
    explainer: object
    relevance: np.ndarray = None
    target: np.ndarray = None
    seconds_per_item: float = 0.0
    evaluation: object = None
    note: str = ""  # what the table says below it (grad-cam's layer)


def method_list(text: str) -> list[str]:
    names = [m.strip() for m in str(text).split(",") if m.strip()]
    if not names or len(set(names)) != len(names):
        raise InputError(f"--methods {text!r}: give distinct names separated by commas "
                         "(lrp,integrated-gradients,smoothgrad,occlusion)")
    return names


def default_options(method: str, x: np.ndarray, patch: int, seed: int) -> dict:
    """The options a method runs with in the comparison: IG 32 steps from 0; SmoothGrad / VarGrad 16 samples of
    noise 0.1 x the input's range (zennit's noise level), seeded; occlusion windows of --patch (every channel)
    moved by half of it; expected-gradients / gradient-shap 16 draws with the batch and a zero input as the
    background set (gradient-shap: with SmoothGrad's noise); RISE 1000 masks, half of the cells kept, seeded.
    grad-cam's layer: :func:`grad_cam_layer`."""
    spread = float(x.max() - x.min()) or 1.0
    if method == "integrated-gradients":
        return dict(n_steps=32, baselines=0.0)
    if method in ("smoothgrad", "vargrad"):
        return dict(nt_samples=16, stdevs=0.1 * spread, seed=seed)
    if method in ("expected-gradients", "gradient-shap"):
        background = np.concatenate([np.zeros_like(x[:1]), x]).astype(np.float32)
        noise = dict(stdevs=0.1 * spread) if method == "gradient-shap" else {}
        return dict(baselines=background, n_samples=16, seed=seed, **noise)
    if method == "rise":
        return dict(n_masks=1000, probability=0.5, seed=seed)
    if method == "occlusion":
        item = x.shape[1:]
        side = [min(patch, d) for d in item[-2:]] if len(item) >= 2 else [min(patch, item[-1])]
        window = tuple(item[:len(item) - len(side)]) + tuple(side)
        return dict(sliding_window_shapes=window, strides=tuple([1] * (len(item) - len(side)) +
                                                                [max(1, s // 2) for s in side]))
    return {}


def grad_cam_layer(model, x: np.ndarray, device: str) -> str:
    """grad-cam's layer in the comparison: the last tensor with the input's spatial axes (the last convolution
    block's output, before pooling or flattening; onnx_lrp.methods.explain.spatial_tensors)."""
    from onnx_lrp.methods.explain import spatial_tensors

    names = spatial_tensors(model, x, device)
    if not names:
        raise InputError("--methods grad-cam: the model has no tensor N x C x spatial axes at this input; drop "
                         "grad-cam or explain it with `onnx-lrp explain --method grad-cam --layer NAME`")
    return names[-1]


def explainers(model, names: list[str], setup, x: np.ndarray, options: dict, lrp=None) -> list[Column]:
    """One explainer per name: "lrp" (``lrp``, or the setup's composite), a composite's name, or a method."""
    import onnx_lrp
    from onnx_lrp.methods.explain import is_method

    if options.get("layer") is not None and "grad-cam" not in names:
        raise InputError("--layer is grad-cam's layer; add grad-cam to --methods or drop --layer")
    columns = []
    for name in names:
        note = ""
        if name == "lrp":
            ex = lrp or setup.explainer(model)
        elif is_method(name):
            kw = default_options(name, x, options["patch"], options["seed"])
            if name == "grad-cam" and options.get("layer") is not None:
                kw["layer"] = options["layer"]
            elif name == "grad-cam":
                kw["layer"] = grad_cam_layer(model, x, setup.run.device)
                note = f"grad-cam at {kw['layer']} (the last spatial tensor; --layer names another), upsampled"
            ex = onnx_lrp.Explainer(model, method=name, device=setup.run.device, **kw)
        else:
            ex = onnx_lrp.Explainer(model, composite=name, device=setup.run.device)
        columns.append(Column(name, ex, note=note))
    return columns


def explain_all(columns: list[Column], x: np.ndarray, targets) -> None:
    """Each column's attribution of ``x`` for the first column's targets (arg-max: the first resolves them)."""
    for col in columns:
        t0 = time.perf_counter()
        res = col.explainer.explain(x, target=targets)
        col.seconds_per_item = (time.perf_counter() - t0) / len(x)
        col.relevance, col.target = res.relevance, np.asarray(res.target, np.int64).reshape(-1)
        if isinstance(col.relevance, dict):
            raise InputError("--methods compares models with one float input")
        targets = col.target


def compare(model, batch_arrays: dict, names: list[str], setup, options: dict, mask=None, lrp=None
            ) -> list[Column]:
    """Every method explained and scored with the metric of ``options`` (the scoring: the first column's
    explained tensor, the same targets for all)."""
    import onnx_lrp

    metric = options["metric"]
    if metric not in COMPARED:
        raise InputError(f"--methods compares on {', '.join(COMPARED)}; {metric} rebuilds each model: run it per "
                         "method")
    x = next(iter(batch_arrays.values()))
    columns = explainers(model, names, setup, x, options, lrp)
    explain_all(columns, x, options["targets"])
    scoring = columns[0].explainer
    keys = ("metric", "patch", "steps", "baseline", "prob", "seed", "runs", "subset_size")
    for col in columns:
        col.evaluation = onnx_lrp.evaluate(model, batch_arrays, target=col.target, relevance=col.relevance,
                                           orders=options["orders"], mask=mask, device=setup.run.device,
                                           explainer=scoring, channels_last=options["channels_last"],
                                           **{k: options[k] for k in keys})
    return columns


def table_lines(columns: list[Column]) -> list[str]:
    ev = columns[0].evaluation
    cols = COLUMNS[ev.metric]
    width = max(len("method"), *(len(c.name) for c in columns))
    head = "  ".join(f"{title:>11}" for _, title in cols)
    lines = [f"{ev.metric} on {len(ev.target)} item(s), {ev.params['prob']} of the target, seed {ev.params['seed']}"
             + (f", baseline {ev.params['baseline']}" if "baseline" in ev.params else ""),
             f"  {'method':<{width}}  {head}  {'beats random':>12}  {'s / item':>9}"]
    for c in columns:
        s = c.evaluation.summary()
        values = "  ".join(f"{s.get(k, float('nan')):>11.4f}" for k, _ in cols)
        beats = {True: "yes", False: "NO", None: "-"}[s.get("beats_random")]
        lines.append(f"  {c.name:<{width}}  {values}  {beats:>12}  {c.seconds_per_item:>9.4f}")
    return lines + [c.note for c in columns if c.note]


def as_dict(columns: list[Column]) -> dict:
    return {c.name: {**c.evaluation.as_dict(), "seconds_per_item": c.seconds_per_item,
                     **({"layer": c.explainer.attributor.options.layer} if c.name == "grad-cam" else {})}
            for c in columns}


def picture(columns: list[Column], x: np.ndarray, item_names: list[str]):
    """One image: a row per item (the first few), a column per method, each map scaled to its own |max|."""
    from onnx_lrp.io import heatmap as hm

    n = min(len(x), MAX_PICTURE_ITEMS)
    maps = [hm.relevance_maps(c.relevance[:n]) for c in columns]
    tiles = np.stack([maps[k][i] for i in range(n) for k in range(len(columns))])
    labels = [[columns[k].name, str(item_names[i])] for i in range(n) for k in range(len(columns))]
    return hm.render(tiles, None, style="heatmap", cols=len(columns), labels=labels,
                     colorbar="colours scaled per tile to its largest |attribution|")


def report(columns: list[Column], x: np.ndarray, names: list[str], plot_path, as_json: bool, writer) -> None:
    if plot_path is not None:
        writer(picture(columns, x, names))
    if as_json:
        import json

        click.echo(json.dumps({"methods": as_dict(columns), "items": list(names)}, indent=2))
        return
    for line in table_lines(columns):
        click.echo(line)
    if plot_path is not None:
        click.echo(f"wrote {plot_path}")


__all__ = ["COMPARED", "Column", "method_list", "default_options", "compare", "table_lines", "as_dict", "picture",
           "report"]
