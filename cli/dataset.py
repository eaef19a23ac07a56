"""Dataset mode of ``onnx-lrp explain``: ``--out-dir OUT`` explains every item of SOURCE into sharded, resumable
output (see :mod:`onnx_lrp.dataset`), on the local engine or on Ray (``--engine ray``)."""
from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from onnx_lrp.core.errors import InputError
from onnx_lrp.io.inputs import stored_dtypes
from onnx_lrp.io.kinds import ARRAY_KINDS, KINDS, Kind, is_kind, kind_of

from .methods import method_explainer, method_keywords, with_base_params, with_lrp_method
from .options import explainer_setup, preprocess


DATASET_KEYS = ("out_dir", "engine", "ray_address", "workers", "shard_size", "overwrite", "column")


def dataset_options(f):
    """--out-dir (switches explain into dataset mode) and its engine options; read by :func:`dataset_mode`."""
    opts = [
        click.option("--out-dir", "out_dir", default=None, metavar="OUT",
                     help="A dataset into shards (see the docs)."),
        click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                     help="Dataset mode: run here (threads read and write around onnxruntime) or on Ray Data "
                          "(pip install 'onnx-lrp[ray]')."),
        click.option("--ray-address", "ray_address", default=None, metavar="ADDR",
                     help="--engine ray: the cluster to join (auto: the one `ray start --head` started; default: a "
                          "new local cluster)."),
        click.option("--workers", type=click.IntRange(min=1), default=None,
                     help="Dataset mode: reader threads (local; default up to 4) or Ray actors (default: one per CPU, or per "
                          "GPU with --device cuda)."),
        click.option("--shard-size", "shard_size", type=click.IntRange(min=1), default=256, show_default=True,
                     help="Dataset mode: items per output shard (the unit of resuming)."),
        click.option("--overwrite", is_flag=True,
                     help="Dataset mode: discard what OUT holds instead of resuming it."),
        click.option("--column", default=None, metavar="NAME",
                     help="Parquet sources: the column to explain (arrays or encoded images)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def dataset_mode(options) -> dict | None:
    """The dataset options of click's ``options``; None without --out-dir (explain then runs as always)."""
    opts = {k: options.get(k) for k in DATASET_KEYS}
    if opts["out_dir"] is None:
        others = [k for k in ("ray_address", "workers", "column") if opts[k] is not None]
        if others or opts["overwrite"] or opts["engine"] not in (None, "local"):
            names = [f"--{k.replace('_', '-')}" for k in others] + (["--overwrite"] if opts["overwrite"] else []) \
                + ([f"--engine {opts['engine']}"] if opts["engine"] not in (None, "local") else [])
            raise InputError(f"{', '.join(names)} belong(s) to dataset mode; add --out-dir OUT")
        return None
    return opts


def has_images(source: str) -> bool:
    """Whether a dataset SOURCE (a directory searched recursively, a glob or a file) holds images."""
    p = Path(source)
    if p.is_dir():
        return any(is_kind(q, Kind.IMAGE) for q in p.rglob("*"))
    return is_kind(p, Kind.IMAGE)


def check_source_preprocessing(source, pre) -> None:
    """A dataset SOURCE of arrays (.npy/.npz files, or a directory or glob of them) with --size/--crop/--mean/--std,
    or an .npy/.npz SOURCE of uint8 arrays: refused, since its reader feeds arrays as they are (the options apply to
    images and to Parquet image columns); a single run (explain without --out-dir) reads them as it reads images."""
    p = Path(source)
    if p.is_file() and is_kind(p, *ARRAY_KINDS) and any(d == np.uint8 for d in stored_dtypes(p)):
        raise InputError(f"{source} holds uint8 arrays, which the dataset reader feeds as they are: save them as "
                         "floats (x.astype(np.float32) / 255 for pixels), or explain them without --out-dir, which "
                         "reads uint8 as 8-bit pixels")
    if not (pre.normalised or pre.size is not None or pre.crop):
        return
    kinds = {kind_of(q) for q in p.rglob("*") if q.is_file()} if p.is_dir() else {kind_of(p)}
    kinds.discard(None)
    if any(KINDS[k].preprocessed for k in kinds) or not kinds & set(ARRAY_KINDS):
        return
    given = [o for o, v in (("--size", pre.size), ("--crop", pre.crop), ("--mean/--std", pre.normalised)) if v]
    raise InputError(f"{', '.join(given)}: the dataset reader feeds the arrays of {source} as they are; preprocess "
                     "them before saving, or explain them without --out-dir (a single run normalises arrays)")


def run_dataset(model, source, ds: dict, options: dict, targets, refused: dict) -> int:
    """Explain SOURCE into --out-dir (``ds``: :func:`dataset_mode`; ``options``: explain's click options; ``targets``:
    --target read); 0 when every item was explained, 1 when some failed (listed in errors.jsonl)."""
    import onnx_lrp

    given = [name for name, value in refused.items() if value]
    if given:
        raise InputError(f"{', '.join(given)} write(s) single-run outputs; with --out-dir the relevance goes to "
                         "OUT/shards (drop them, or drop --out-dir)")
    pre = preprocess(options)
    check_source_preprocessing(source, pre)
    # images among the sources: ZBox bounds from the pixel range after --mean/--std (no note in dataset mode)
    options = with_lrp_method(options)
    setup = explainer_setup(model, options, pre=pre, data_kind=lambda: "image" if has_images(source) else "array")
    summary = onnx_lrp.explain_dataset(
        model, source, ds["out_dir"], engine=ds["engine"] or "local", batch_size=options["batch_size"],
        shard_size=ds["shard_size"] or 256, workers=ds["workers"], target=targets,
        ray_address=ds["ray_address"], overwrite=bool(ds["overwrite"]), progress=True, size=pre.size, mean=pre.mean,
        std=pre.std, crop=pre.crop, squash=pre.squash, column=ds["column"], **_explaining(model, options, setup))
    as_json = options["as_json"]
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"explained {summary['explained']} of {summary['items']} item(s) into {summary['out_dir']}: "
                   f"{summary['shards_written']} shard(s) written, {summary['shards_resumed']} resumed, "
                   f"{summary['seconds']} s" + (f" ({summary['items_per_s']} items/s)" if summary['items_per_s']
                                                 else ""))
        if summary["failed"]:
            click.echo(f"{summary['failed']} item(s) failed: see {summary['errors']}")
    return 1 if summary["failed"] else 0


def _explaining(model, options: dict, setup) -> dict:
    """explain_dataset's keywords of how to explain: LRP's (the setup's), or --method's (cli/methods.py): its
    explainer, and the method and options the manifest records."""
    method, keywords = method_keywords(options)
    if method is None:
        return setup.keywords()
    keywords = with_base_params(method, keywords, setup.params)  # --base COMPOSITE: its rule parameters
    ex = method_explainer(model, method, keywords, output=options.get("output_name"), device=options.get("device"))
    return dict(explainer=ex, method=method, **keywords)


__all__ = ["check_source_preprocessing", "dataset_options", "dataset_mode", "has_images", "run_dataset"]
