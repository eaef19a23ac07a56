"""Explain a whole dataset: sources, deterministic shards, a streaming local engine and a resumable output.

``explain_dataset(model, source, out_dir, engine="local")`` writes ``out_dir``:

* ``shards/part-NNNNN.npz``: per shard ``items`` (source id of each explained item), ``relevance`` (or
  ``relevance/<input>`` for several float inputs), ``targets``, ``outputs`` (the explained output; quantized and
  float16 models: the deployed model's, and ``forward`` the explained forward's);
* ``manifest.json``: model SHA-256, composite and parameters, onnx-lrp version, engine, item count, the shards done
  (item range, checksum, failed items);
* ``errors.jsonl``: one line per item that could not be read or explained (``{"item": id, "error": message}``).

Shard ``k`` holds the items ``[k * shard_size, (k + 1) * shard_size)`` of the sorted source, so a rerun of the same
command finds the same shards: it skips those the manifest lists (each file written to a temporary file, fsync'ed,
renamed, then added to the manifest) and explains only the rest. A manifest written with another model, composite,
parameters or source refuses unless ``overwrite=True``.

The package: `sources` (what items there are and how one is read), `shards` (one shard read, explained
and written: the task of both engines), `local` (the local engine, the manifest, the progress line) and
`ray` (the same shard task on Ray Data actors; `onnx_lrp.ray` is its public name). This module ties them
together; nothing below it imports it.
"""
from __future__ import annotations

import collections
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import InputError
from ..core.version import VERSION
from ..io.inputs import Preprocess, input_infos
from .local import Output, Progress, cpu_cores, run_local
from .shards import ERRORS, FORMAT, MANIFEST, SHARD_DIR, explain_items, explain_shard, write_shard  # noqa: F401
from .sources import ArraySource, FileSource, ParquetSource, Source, list_files, open_source  # noqa: F401


DEFAULT_SHARD_SIZE = 256
ENGINES = ("local", "ray")


def explainer_payload(ex) -> tuple:
    """What runs an Explainer's relevance model in another process without loading or rewriting the model again:
    the relevance model and the run options (see `onnx_lrp.run.runner.Runner.payload`)."""
    return ex.payload()


def explainer_from_payload(payload, device: str | None = None, threads: int | None = None):
    """A `onnx_lrp.run.runner.Runner` (``explain`` as the Explainer's) from `explainer_payload`; imports
    neither onnx_ir nor onnx."""
    from ..run.runner import Runner

    return Runner.from_payload(payload, device, threads)


def _composite_id(comp) -> dict:
    return dict(name=comp.name, sha256=hashlib.sha256(repr(comp).encode()).hexdigest())


def _json_target(targets):
    if targets is None:
        return "argmax"
    if isinstance(targets, (int, np.integer)):
        return int(targets)
    return hashlib.sha256(np.asarray(targets, np.int64).tobytes()).hexdigest()


@dataclass(frozen=True)
class DatasetOptions:
    """How `explain_dataset` runs (besides the model, the source, OUT and the relevance model's options):
    checked once when made, the engine and its sizes refused in one line before any work (Ray: that it is
    installed)."""

    engine: str = "local"  # "local" or "ray"
    batch_size: int = 32  # items per onnxruntime run
    shard_size: int = DEFAULT_SHARD_SIZE  # items per shard file
    workers: int | None = None  # local: reader threads (None: up to 4); Ray: actors (None: one per CPU / GPU)
    ray_address: str | None = None  # the Ray cluster to join (None: the current one, else a local one)
    overwrite: bool = False  # a manifest of another model / composite / source in OUT: start again
    progress: bool = False  # a progress line on stderr
    column: str | None = None  # Parquet: the column of the model's input
    preprocess: Preprocess = Preprocess()  # images: size, mean, std, crop (as onnx-lrp explain)

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise InputError(f"engine {self.engine!r}: use local or ray")
        if int(self.batch_size) < 1 or int(self.shard_size) < 1:
            raise InputError("batch_size and shard_size must be >= 1")
        if self.workers is not None and int(self.workers) < 1:
            raise InputError("workers must be >= 1")
        object.__setattr__(self, "batch_size", int(self.batch_size))
        object.__setattr__(self, "shard_size", int(self.shard_size))
        if self.engine == "ray":
            from .ray import require_ray
            require_ray()


def explain_dataset(model, source, out_dir, engine: str = "local", *, batch_size: int = 32,
                    shard_size: int = DEFAULT_SHARD_SIZE, workers: int | None = None, target=None,
                    ray_address: str | None = None, overwrite: bool = False, progress: bool = False,
                    size=None, mean=(0.0,), std=(1.0,), crop: bool = False, column: str | None = None,
                    explainer=None, squash: bool = False,
                    **explainer_options) -> dict:
    """Explain every item of ``source`` into ``out_dir`` (see the module docstring); returns the summary.

    ``explainer_options`` go to `onnx_lrp.Explainer` (composite, device, output, start, relevance_at and rule
    parameters); ``size``/``mean``/``std`` preprocess images (as ``onnx-lrp explain``: resizing keeps the aspect ratio and cuts the
    centre; ``squash=True`` stretches to the size instead, as ``--squash``); ``target`` is None
    (arg-max), a class index, or one index per item. ``explainer`` reuses an Explainer (or any
    `onnx_lrp.run.runner.Runner`) built by the caller. The other keywords: `DatasetOptions`.
    A summary: item count, explained, failed, shards (written now / resumed), seconds, seconds until the first
    shard was written (the fixed start: Ray's actors, imports, sessions), items/s.
    """
    pre = Preprocess(tuple(size) if size is not None else None, tuple(np.atleast_1d(mean).tolist()),
                     tuple(np.atleast_1d(std).tolist()), crop=bool(crop), squash=bool(squash))
    if pre.crop and pre.squash:
        raise InputError("crop keeps the aspect ratio and squash does not; give one of them")
    options = DatasetOptions(engine, batch_size, shard_size, workers, ray_address, overwrite, progress, column, pre)
    if explainer is None and _is_method(explainer_options.get("method")):
        explainer = _method_explainer(model, explainer_options)
    elif explainer is None:
        from ..run.launch import ExplainOptions, runner  # the loader and the rewriter: in the driver only

        explainer = runner(model, ExplainOptions.from_keywords(**_lrp_keywords(explainer_options)))
    return _run(model, source, Path(out_dir), options, (explainer, explainer_options), target)


def _run(model, source, out_dir: Path, options: DatasetOptions, explaining: tuple, target) -> dict:
    """``explaining``: (the runner, the keywords it was built with, which the manifest records)."""
    ex, given = explaining
    src = open_source(source, input_infos(ex.inputs), options.preprocess, options.column)
    target = _checked_target(target, len(src))
    start = None if _is_method(getattr(ex, "method", None)) else given.get("start", ex.options.start)
    header = _header(model, ex, (src, source), options, target, start, given)
    out = Output(out_dir, header, options.shard_size, options.overwrite)
    n, size = len(src), options.shard_size
    all_shards = [(k, lo, min(n, lo + size)) for k, lo in enumerate(range(0, n, size))]
    todo = [s for s in all_shards if s[0] not in out.done]
    prog = Progress(sum(hi - lo for _, lo, hi in todo), options.progress)
    t0 = time.perf_counter()
    try:
        if todo and options.engine == "local":
            run_local(ex, src, todo, out, options, target, start, prog)
        elif todo:
            from .ray import run_ray
            run_ray(ex, src, todo, out, options, target, start, prog)
    except BaseException:
        out.save()  # keep what was written for the rerun (Ctrl-C, a lost Ray cluster, ...)
        raise
    seconds = time.perf_counter() - t0
    out.save(complete=True)
    prog.update(0, final=bool(todo) and options.progress)
    return _summary(out, options.engine, n, len(all_shards), todo, seconds, t0)


def _is_method(name) -> bool:
    from ..methods.explain import is_method

    return is_method(name)


def _lrp_keywords(options: dict) -> dict:
    """The Explainer's keywords with ``method=`` naming a composite (or "lrp") turned into ``composite=``."""
    method = options.get("method")
    rest = {k: v for k, v in options.items() if k != "method"}
    if method in (None, "lrp"):
        return rest
    if rest.get("composite", "auto") not in ("auto", method):
        raise InputError(f"method={method!r} and composite={rest['composite']!r} name two rule sets; give one")
    return {**rest, "composite": method}


def _method_explainer(model, options: dict):
    """An attribution method's explainer (:class:`onnx_lrp.methods.explain.MethodExplainer`) from the keywords."""
    from ..methods.explain import MethodExplainer

    rest = {k: v for k, v in options.items() if k != "method"}
    return MethodExplainer(model, options["method"], rest.pop("device", None), **rest)


def _recipe(ex, options: dict) -> dict:
    """What the manifest records of how the relevance is computed: the composite (name, digest), or the method and a
    digest of its options (arrays by their bytes)."""
    if not _is_method(getattr(ex, "method", None)):
        from ..rules.composite import load_composite

        return _composite_id(load_composite(ex.relevance_model.source.composite_spec()))
    h = hashlib.sha256(ex.method.encode())
    for k in sorted(options):
        v = options[k]
        h.update(f"{k}={v.dtype}{v.shape}".encode() + v.tobytes() if isinstance(v, np.ndarray) else
                 f"{k}={v!r}".encode())
    return dict(name=ex.method, sha256=h.hexdigest())


def _checked_target(target, n: int):
    """None (arg-max), one class index, or one index per item of the ``n``."""
    if isinstance(target, str):
        if target != "argmax":
            raise InputError(f"target {target!r}: give argmax, an int or a list")
        return None
    if target is not None and not isinstance(target, (int, np.integer)):
        target = np.asarray(target, np.int64).reshape(-1)
        if len(target) != n:
            raise InputError(f"{len(target)} targets for {n} items; give one, or one per item")
    return target


def _header(model, ex, sources: tuple, o: DatasetOptions, target, start, options: dict) -> dict:
    """The manifest's header: what a rerun must match to resume (model, composite, parameters, source).
    ``sources``: (the opened source, as given); ``options``: the relevance model's keywords as given."""
    from ..load import model_sha256
    from ..rules.params import params_to_json
    from ..run.options import RunOptions

    src, source = sources
    pre = o.preprocess
    params = {} if _is_method(getattr(ex, "method", None)) else \
        {k: v for k, v in options.items() if k != "composite" and k not in RunOptions.UNRECORDED}
    return dict(format=FORMAT, onnx_lrp_version=VERSION, engine=o.engine, model=str(model),
                model_sha256=model_sha256(model) if isinstance(model, (str, os.PathLike)) else
                hashlib.sha256(ex.relevance_model.model_bytes).hexdigest(),
                composite=_recipe(ex, options),
                parameters=dict(params_to_json(params), target=_json_target(target), start=start,
                                output=ex.explained_output, size=list(pre.size) if pre.size else None,
                                mean=list(pre.mean), std=list(pre.std), crop=pre.crop, column=o.column,
                                **({"squash": True} if pre.squash else {})),
                source=dict(path=str(source), kind=src.kind, fingerprint=src.fingerprint()),
                shard_size=o.shard_size, item_count=len(src), batch_size=o.batch_size)


def _summary(out, engine: str, n: int, shards: int, todo: list, seconds: float, t0: float) -> dict:
    m = out.manifest(True)
    done_items = sum(hi - lo for _, lo, hi in todo)
    return dict(out_dir=str(out.dir), engine=engine, items=n, explained=m["explained"], failed=len(m["failed"]),
                shards=shards, shards_written=len(todo), shards_resumed=out.resumed,
                seconds=round(seconds, 3),
                first_shard_s=round(out.first_at - t0, 3) if out.first_at is not None else None,
                items_per_s=round(done_items / seconds, 2) if seconds > 0 and todo else None,
                manifest=str(out.dir / MANIFEST), errors=str(out.dir / ERRORS))


def read_shards(out_dir) -> dict:
    """All shards of a finished OUT concatenated in item order: {"items", "relevance", "targets", "outputs", ...}."""
    out_dir = Path(out_dir)
    from .local import read_manifest

    manifest = read_manifest(out_dir / MANIFEST, "run `onnx-lrp explain ... --out-dir` again to rewrite it")
    parts = collections.defaultdict(list)
    for rec in manifest["shards"]:
        with np.load(out_dir / rec["file"], allow_pickle=False) as z:
            for k in z.files:
                if len(z[k]):
                    parts[k].append(z[k])
    return {k: np.concatenate(v) for k, v in parts.items()}


def explain_arrays(ex, arrays: dict, targets=None, batch_size: int = 32, engine: str = "local",
                   workers: int | None = None, ray_address: str | None = None, progress=None):
    """(relevance by input, outputs by name, targets used) of in-memory arrays (``onnx-lrp check``'s snapshot
    inputs) on either engine."""
    if engine not in ENGINES:
        raise InputError(f"engine {engine!r}: use local or ray")
    if engine == "ray":
        from .ray import explain_arrays_ray
        return explain_arrays_ray(ex, arrays, targets, batch_size, workers, ray_address)
    from ..run.batches import explain_all
    return explain_all(ex, arrays, targets, batch_size, progress=progress)


__all__ = ["explain_dataset", "DatasetOptions", "explain_arrays", "open_source", "read_shards", "explain_items", "explainer_payload",
           "explainer_from_payload", "Source", "FileSource", "ArraySource", "ParquetSource"]
