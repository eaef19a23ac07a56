"""Digests of what onnx-lrp computes over a set of models: shows that a restructuring changed no behaviour.

    python scripts/fingerprint.py write OUT.json [--only SUBSTRING] [--folders simple,light,...]
    python scripts/fingerprint.py compare A.json B.json [--values]

``write`` explains every model of the set with every built-in composite (one thread, fixed inputs) and records, per
model x composite, either the refusal's message or the SHA-256 of the relevance model's bytes, of the relevance and
of the outputs. The set: the onnx wheel's backend models (tests/conformance.py's folders; the node tests too when
asked) and every ``.onnx`` under tests/goldens and models/. ``compare`` lists what differs (exit 1 when anything
does): run ``write`` before and after a change that should change nothing.
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

COMPOSITES = ("epsilon", "epsilon-plus", "epsilon-plus-flat", "epsilon-gamma-box", "epsilon-alpha2-beta1",
              "epsilon-alpha2-beta1-flat", "attnlrp", "cp-lrp")


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _tree_digest(value) -> str:
    if isinstance(value, dict):
        return _digest(*[np.asarray(value[k]) for k in sorted(value)])
    return _digest(np.asarray(value))


def _generated_feeds(ex) -> dict:
    """Fixed inputs from the relevance model's input specs: floats ~N(0, 1) (seeded), integers in [0, 4)."""
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in ex.inputs:
        dims = tuple(2 if (d is None and i == 0) else (4 if d is None else d) for i, d in enumerate(spec.dims))
        if spec.dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(dims).astype(spec.dtype)
        elif spec.dtype.kind == "b":
            feeds[spec.name] = np.ones(dims, spec.dtype)
        else:
            feeds[spec.name] = rng.integers(0, 4, dims).astype(spec.dtype)
    return feeds


def _model_bytes(ex) -> bytes:
    parts = ex.model_parts()
    return parts.model_bytes


def one(model, name: str, composite: str, feeds=None) -> dict:
    from onnx_lrp import Explainer, LrpError

    params = {"low": -3.0, "high": 3.0} if composite == "epsilon-gamma-box" else {}
    try:
        ex = Explainer(model, composite=composite, threads=1, **params)
        graph = hashlib.sha256(_model_bytes(ex)).hexdigest()[:16]
        res = ex.explain(feeds if feeds is not None else _generated_feeds(ex))
    except LrpError as exc:
        return {"refused": str(exc)}
    except Exception as exc:  # noqa: BLE001 - recorded: a crash is behaviour too
        return {"crash": f"{type(exc).__name__}: {str(exc)[:200]}"}
    out = {"graph": graph, "relevance": _tree_digest(res.relevance), "outputs": _tree_digest(res.outputs),
           "target": _digest(np.asarray(res.target))}
    del ex, res
    gc.collect()  # one relevance model at a time: a zoo VGG's sessions add up to gigabytes
    return out


def model_set(folders, only, max_mb: float):
    import conformance

    items = []
    for case in conformance.all_cases(folders):
        feeds = conformance._feeds(case)
        if any(not isinstance(v, np.ndarray) for v in feeds.values()):
            continue
        if case.model.ByteSize() > max_mb * 1e6:
            continue
        items.append((f"{case.folder}/{case.name}", case.model, feeds))
    for path in sorted(list((ROOT / "tests" / "goldens").rglob("*.onnx")) + list((ROOT / "models").rglob("*.onnx"))):
        items.append((str(path.relative_to(ROOT)), str(path), None))
    return [it for it in items if not only or only in it[0]]


def write(out: str, folders, only, max_mb: float = 200.0) -> None:
    import onnxruntime

    onnxruntime.set_default_logger_severity(4)
    result = {}
    items = model_set(folders, only, max_mb)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, (name, model, feeds) in enumerate(items):
            result[name] = {c: one(model, name, c, feeds) for c in COMPOSITES}
            ok = sum("graph" in r for r in result[name].values())
            print(f"[{i + 1}/{len(items)}] {name}: {ok} explained", flush=True)
    Path(out).write_text(json.dumps(result, indent=1, sort_keys=True))
    explained = sum("graph" in r for m in result.values() for r in m.values())
    print(f"{len(result)} models, {explained} model x composite runs explained -> {out}")


def _values(record: dict | None) -> dict | None:
    """What a run computed, without the relevance model's bytes and the refusal's wording: the relevance, outputs and
    target digests, or the kind of failure."""
    if record is None:
        return None
    return {k: (v if k in ("relevance", "outputs", "target") else "") for k, v in record.items() if k != "graph"}


def compare(a: str, b: str, values: bool = False) -> int:
    A, B = json.loads(Path(a).read_text()), json.loads(Path(b).read_text())
    if values:  # a change that emits another graph for the same numbers, or words a refusal otherwise
        A = {m: {c: _values(r) for c, r in runs.items()} for m, runs in A.items()}
        B = {m: {c: _values(r) for c, r in runs.items()} for m, runs in B.items()}
    diffs = []
    for name in sorted(set(A) | set(B)):
        if name not in A or name not in B:
            diffs.append(f"{name}: only in {'B' if name not in A else 'A'}")
            continue
        for comp in COMPOSITES:
            if A[name].get(comp) != B[name].get(comp):
                diffs.append(f"{name} [{comp}]: {A[name].get(comp)} != {B[name].get(comp)}")
    runs = sum(len(m) for m in A.values())
    explained = sum("relevance" in r for m in A.values() for r in m.values())
    print(f"{len(A)} models, {runs} runs ({explained} explained): {len(diffs)} differ")
    for d in diffs:
        print(" ", d[:400])
    return 1 if diffs else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("out")
    w.add_argument("--only", default="")
    w.add_argument("--folders", default="simple,pytorch-converted,pytorch-operator,light")
    w.add_argument("--max-mb", type=float, default=200.0, help="leave out backend models larger than this")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--values", action="store_true",
                   help="compare what was computed only (not the relevance model's bytes nor a refusal's wording)")
    args = p.parse_args()
    if args.cmd == "write":
        write(args.out, tuple(f for f in args.folders.split(",") if f), args.only, args.max_mb)
        return 0
    return compare(args.a, args.b, args.values)


if __name__ == "__main__":
    raise SystemExit(main())
