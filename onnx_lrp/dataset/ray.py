"""Ray integration (``pip install 'onnx-lrp[ray]'``): `ExplainBatch` for a user's own Ray Data pipeline and
the ``engine="ray"`` of `onnx_lrp.explain_dataset`.

    import ray, onnx_lrp.ray
    ref = onnx_lrp.ray.relevance_model("model.onnx", composite="epsilon-plus-flat")  # built once, in the object store
    ds = ray.data.read_parquet(...)  # a column per model input (e.g. "image"), optional "id" and "target" columns
    out = ds.map_batches(onnx_lrp.ray.ExplainBatch, fn_constructor_kwargs={"relevance_model": ref},
                         compute=ray.data.ActorPoolStrategy(size=4), batch_size=64)
    # on GPU nodes: num_gpus=1 and fn_constructor_kwargs={"relevance_model": ref, "device": "cuda"}

An attribution method beyond LRP (``explain_dataset(..., engine="ray", method=M)``) travels as its
`onnx_lrp.methods.explain.MethodPayload` (the model's path or bytes, the method and its options): each actor builds
the method's explainer from it (loading the model and building the method's graph there).

This module is ``onnx_lrp.dataset.ray`` (public as ``onnx_lrp.ray``); of the dataset package it imports only
`onnx_lrp.dataset.shards` (the shard task). Every import below is absolute, so ``import ray`` is always the real
Ray.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from onnx_lrp.core.errors import InputError, LrpError
from onnx_lrp.core.interface import FORWARD_PREFIX
from onnx_lrp.dataset.shards import ShardJob, Span, explain_shard, write_shard
from onnx_lrp.run.runner import Runner


INSTALL = "pip install 'onnx-lrp[ray]'"


def require_ray():
    """The ``ray`` package, or one line saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise InputError(f"--engine ray needs Ray, which is not installed: {INSTALL}") from None
    return ray


def relevance_model(model, **explainer_options):
    """Build the relevance model once (load, canonize, rewrite) and put it in Ray's object store.

    Returns an ObjectRef to pass as ``ExplainBatch(relevance_model=ref)``: the relevance model and the run options
    (`onnx_lrp.run.runner.Runner.payload`, plain data); each actor then imports only numpy, onnxruntime and
    `onnx_lrp.run.runner` (not onnx_ir, onnx or the rewriter) and opens one onnxruntime session."""
    from onnx_lrp.run.launch import ExplainOptions, runner

    ray = require_ray()
    return ray.put(runner(model, ExplainOptions.from_keywords(**explainer_options)).payload())


def _explainer(model, relevance_model, device, threads, explainer_options):
    """The actor's runner: from a payload or a relevance model (plain data; imports only numpy, onnxruntime and
    onnx_lrp.run.runner) or, given a model file, built in the actor (load, canonize, rewrite)."""
    if relevance_model is not None:
        payload = relevance_model
        ray = require_ray()
        if isinstance(payload, ray.ObjectRef):
            payload = ray.get(payload)
        if getattr(payload, "kind", None) == "method":  # an attribution method: built in the actor
            return payload.explainer(device, threads)
        return Runner.from_payload(payload, device, threads)
    if model is None:
        raise InputError("ExplainBatch needs model= (an ONNX file) or relevance_model= (from "
                         "onnx_lrp.ray.relevance_model)")
    from onnx_lrp.run.launch import ExplainOptions, runner

    return runner(model, ExplainOptions.from_keywords(device=device or "cpu", threads=threads, **explainer_options))


class ExplainBatch:
    """A callable class for ``Dataset.map_batches``: one `onnx_lrp.run.runner.Runner` (one onnxruntime session)
    per actor; ``explain`` as `onnx_lrp.Explainer.explain`. ``relevance_model``: what
    `relevance_model` put in the object store (or a `onnx_lrp.RelevanceModel`, run with default
    options).

    Input batches (numpy format) hold one column per model input; a ``target`` column, when present, gives each
    row's class (else ``target``: None = arg-max, or an int). Output: every other input column unchanged (ids
    pass through), ``relevance`` (``relevance/<input>`` for several float inputs), ``target`` and ``output`` (the
    explained output). A row whose relevance is not finite raises an `onnx_lrp.LrpError` naming it."""

    def __init__(self, model=None, *, relevance_model=None, device: str | None = None, target=None,
                 start: str | None = None, threads: int | None = None, **explainer_options):
        self.explainer = _explainer(model, relevance_model, device, threads, explainer_options)
        self.target = target
        self.start = start

    def __call__(self, batch: dict) -> dict:
        ex = self.explainer
        names = [s.name for s in ex.inputs]
        missing = [n for n in names if n not in batch]
        if missing:
            raise InputError(f"the batch has columns {', '.join(sorted(batch))} but the model's inputs are "
                             f"{', '.join(names)}; add a column per input")
        feeds = {n: _dense(batch[n], n) for n in names}
        target = batch["target"] if "target" in batch else self.target
        res = ex.explain(feeds, target=target, start=self.start)
        out = {k: v for k, v in batch.items() if k not in names and k != "target"}
        rel = res.relevance if isinstance(res.relevance, dict) else {None: res.relevance}
        for k, v in rel.items():
            bad = ~np.isfinite(v.reshape(len(v), -1)).all(axis=1)
            if bad.any():
                ids = batch["id"][bad] if "id" in batch else np.flatnonzero(bad)
                raise InputError(f"the relevance of rows {list(map(str, ids[:10]))} is not finite (NaN or Inf); try "
                                 "a larger epsilon or another composite")
            out["relevance" if k is None else f"relevance/{k}"] = v
        out["target"] = np.asarray(res.target, np.int64)
        out["output"] = res.outputs[ex.explained_output]
        if res.forward is not None and res.forward is not res.outputs:  # quantized / float16: the explained forward
            out["forward"] = res.forward[ex.explained_output]
        return out


def _dense(col, name):
    a = np.asarray(col)
    if a.dtype == object:  # Ray hands variable-shaped tensor columns as object arrays of arrays
        try:
            a = np.stack([np.asarray(v) for v in a])
        except ValueError:
            raise InputError(f"column {name!r} holds arrays of different shapes; one batch must agree") from None
    return a


# ---------------------------------------------------------------------------------------------- the dataset engine
class _ShardTask(ExplainBatch):
    """One shard per call: read and decode its items, explain, write the shard file (write, fsync, rename) and
    return its manifest record. Rerunning a shard (a retried task) writes the same file again."""

    def __init__(self, *, relevance_model, source, job: dict, start, device=None, threads=None):
        """``job``: out_dir, batch_size, targets, readers (decoding threads per actor)."""
        super().__init__(relevance_model=relevance_model, device=device, threads=threads, start=start)
        ray = require_ray()
        if isinstance(source, ray.ObjectRef):
            source = ray.get(source)
        self.source, self.out_dir, self.batch_size = source, Path(job["out_dir"]), job["batch_size"]
        self.targets, self.readers = job["targets"], job.get("readers", 1)

    def __call__(self, batch: dict) -> dict:
        records = []
        for index, lo, hi in zip(batch["index"], batch["lo"], batch["hi"]):
            res = explain_shard(self.explainer, Span(self.source, int(index), int(lo), int(hi)),
                                ShardJob(self.batch_size, self.targets, self.start, self.readers))
            records.append(json.dumps(write_shard(self.out_dir, res)))
        return {"record": np.array(records, dtype=object)}


class _RowsTask(ExplainBatch):
    """Rows ``id`` of arrays shared through the object store (``onnx-lrp check --engine ray``)."""

    def __init__(self, *, relevance_model, arrays, targets, start=None, device=None, threads=None):
        super().__init__(relevance_model=relevance_model, device=device, threads=threads, start=start)
        ray = require_ray()
        self.arrays = ray.get(arrays) if isinstance(arrays, ray.ObjectRef) else arrays
        self.targets = targets

    def __call__(self, batch: dict) -> dict:
        idx = np.asarray(batch["data"], np.int64)
        rows = {k: a[idx] for k, a in self.arrays.items()}
        if self.targets is not None and np.ndim(self.targets):
            rows["target"] = np.asarray(self.targets)[idx]
        elif self.targets is not None:
            self.target = int(self.targets)
        rows["id"] = idx
        return super().__call__(rows)


def _connect(address):
    """(ray, started_here): join a running cluster (``address``) or the current one, else start a local one."""
    import logging

    ray = require_ray()
    started = False
    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False, include_dashboard=False, logging_level="ERROR")
        except Exception as exc:  # ConnectionError, RuntimeError, ValueError, depending on the address
            raise InputError(f"--ray-address {address}: cannot connect to a Ray cluster "
                             f"({str(exc).splitlines()[0]}); start one with `ray start --head`") from None
        started = True
    ray.data.DataContext.get_current().enable_progress_bars = False  # onnx-lrp prints its own progress
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    return ray, started


def _actor_options(ray, ex, workers):
    """(actors, their resources, onnxruntime threads, decoding threads per actor). CPU: one single-threaded actor per
    CPU. GPU: one actor per GPU with the cluster's CPUs shared out among them for decoding beside the GPU run."""
    res = ray.cluster_resources()
    cpus = max(1, int(res.get("CPU", 1)))
    if ex.device == "cuda":
        gpus = max(1, int(res.get("GPU", 1)))
        n = workers or gpus
        per = max(1, cpus // max(n, gpus))
        return n, dict(num_gpus=1, num_cpus=per), None, per
    n = workers or cpus
    return n, dict(num_cpus=1), max(1, cpus // n), 1


def run_ray(ex, source, todo, out, options, targets, start, progress) -> None:
    """The shards ``todo`` on Ray Data actors (``options``: `onnx_lrp.dataset.DatasetOptions`); the manifest
    is updated here, in the driver, as records arrive.

    Actors are restarted and their tasks retried when a worker dies; a shard explained twice (a retry after its
    file was written) is written with the same content and counted once."""
    ray, started = _connect(options.ray_address)
    batch_size = options.batch_size
    try:
        n, res_args, threads, readers = _actor_options(ray, ex, options.workers)
        ref = ray.put(ex.payload())
        items = [dict(index=k, lo=lo, hi=hi) for k, lo, hi in todo]
        ds = ray.data.from_items(items, override_num_blocks=len(items))
        # Ray Data's actors restart and retry their tasks when a worker dies (max_restarts=-1,
        # max_task_retries=-1 are its defaults for map_batches actors)
        ds = ds.map_batches(_ShardTask, batch_size=1, compute=ray.data.ActorPoolStrategy(size=n),
                            fn_constructor_kwargs=dict(relevance_model=ref, source=ray.put(source),
                                                       job=dict(out_dir=str(out.dir), batch_size=batch_size,
                                                                targets=targets, readers=readers),
                                                       start=start, device=ex.device, threads=threads), **res_args)
        seen = set()
        try:
            for row in ds.iter_rows():
                rec = json.loads(row["record"])
                if rec["index"] in seen:
                    continue
                seen.add(rec["index"])
                out.add(rec)
                progress.update(rec["items"][1] - rec["items"][0])
        except LrpError:
            raise
        except Exception as exc:  # a task failed for good (e.g. OUT not writable on a node)
            first = " ".join(str(exc).split())[:300]
            raise LrpError(f"the Ray run stopped after {len(seen)} of {len(todo)} shard(s) ({type(exc).__name__}: "
                           f"{first}); fix the cause and run the same command again to finish") from None
        missing = sorted({k for k, _, _ in todo} - seen)
        if missing:
            raise LrpError(f"Ray returned no result for shard(s) {missing[:10]}; run the same command again to "
                           "finish them")
    finally:
        if started:
            ray.shutdown()


def explain_arrays_ray(ex, arrays: dict, targets, batch_size: int, workers=None, address=None):
    """(relevance by input, outputs {explained output}, targets used) of in-memory arrays, on Ray actors."""
    ray, started = _connect(address)
    try:
        nw, res_args, threads, _ = _actor_options(ray, ex, workers)
        n = len(next(iter(arrays.values())))
        # from_numpy makes its blocks in the driver: no read task competes with the actors for the CPUs
        ds = ray.data.from_numpy(np.array_split(np.arange(n), max(1, min(n, nw * 4))))
        ds = ds.map_batches(_RowsTask, batch_size=batch_size, compute=ray.data.ActorPoolStrategy(size=nw),
                            fn_constructor_kwargs=dict(relevance_model=ray.put(ex.payload()),
                                                       arrays=ray.put(dict(arrays)), targets=targets,
                                                       device=ex.device, threads=threads), **res_args)
        parts = list(ds.iter_batches(batch_size=None, batch_format="numpy"))
    finally:
        if started:
            ray.shutdown()
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(cat["id"], kind="stable")
    if not np.array_equal(cat["id"][order], np.arange(n)):
        raise LrpError(f"Ray returned {len(cat['id'])} rows for {n} items; run the check again")
    rel = {(ex.relevance_inputs[0] if k == "relevance" else k.split("/", 1)[1]): v[order]
           for k, v in cat.items() if k.startswith("relevance")}
    outs = {ex.explained_output: cat["output"][order]}
    if "forward" in cat:
        outs[FORWARD_PREFIX + ex.explained_output] = cat["forward"][order]
    return rel, outs, cat["target"][order]


__all__ = ["ExplainBatch", "relevance_model", "require_ray", "run_ray", "explain_arrays_ray"]
