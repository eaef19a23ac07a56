"""The onnx backend conformance sweep: every model shipped with the installed onnx wheel's backend tests.

Sources: the node tests (generated in memory from ``onnx.backend.test.case.node``, as ``onnx`` ships their
definitions; the wheel carries no ``data/node`` folder), and the folders ``data/simple``, ``data/pytorch-converted``,
``data/pytorch-operator`` (model.onnx with test_data_set_0) and ``data/light`` (the classic zoo: expected output
shipped, input generated like onnx's runner: ``arange(n) / n``).

Each model goes through ``Explainer`` with a composite and is classed as

- ``explained``: the forward outputs equal the shipped expected outputs (``|a - b| <= RTOL * max(|b|, 1)`` per
  element) and the relevance is finite;
- ``refused``: an ``LrpError`` with a one-line message (not "onnxruntime cannot load / failed to run": a relevance
  graph that onnxruntime rejects is our bug);
- ``other``: anything else (another exception, wrong outputs, non-finite relevance, a graph onnxruntime rejects).

``python tests/conformance.py`` prints the counts per folder and composite and the main refusal reasons.
"""
from __future__ import annotations

import collections
import contextlib
import io
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

RTOL = 1e-4
DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
FOLDERS = ("node", "simple", "pytorch-converted", "pytorch-operator", "light")
LOW_FLOAT_RTOL = {onnx.TensorProto.FLOAT16: 2 * 2.0 ** -10, onnx.TensorProto.BFLOAT16: 2 * 2.0 ** -7}
ORT_REJECTS = ("onnxruntime cannot load", "onnxruntime failed to run")


@dataclass
class Case:
    folder: str
    name: str
    model: onnx.ModelProto
    inputs: list  # arrays in graph-input order (non-initializer inputs)
    outputs: list  # expected arrays in graph-output order


@dataclass
class Outcome:
    case: str
    folder: str
    composite: str
    status: str  # explained / refused / other
    detail: str = ""
    seconds: float = 0.0


def _array(item):
    if isinstance(item, onnx.TensorProto):
        return numpy_helper.to_array(item)
    if isinstance(item, (list, tuple)) or item is None or isinstance(item, (onnx.SequenceProto, onnx.OptionalProto)):
        return item  # sequences / optionals: the Explainer refuses such inputs
    return np.asarray(item)


def _read_pb(path: Path):
    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    if t.data_type:  # a tensor
        return numpy_helper.to_array(t)
    s = onnx.SequenceProto()
    s.ParseFromString(path.read_bytes())
    return [numpy_helper.to_array(x) for x in s.tensor_values]


def node_cases() -> list[Case]:
    cache = os.environ.get("CONFORMANCE_CACHE")  # a pickle of the cases, to skip the 14 s of generation
    if cache and os.path.exists(cache):
        import pickle

        with open(cache, "rb") as f:
            return pickle.load(f)
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        tests = node.collect_testcases(None)
    cases = []
    for t in tests:
        if t.model is None or not t.data_sets:
            continue
        ins, outs = t.data_sets[0]
        cases.append(Case("node", t.name, t.model, [_array(a) for a in ins], [_array(a) for a in outs]))
    return cases


def folder_cases(folder: str) -> list[Case]:
    cases = []
    for d in sorted((DATA / folder).iterdir()):
        model_file, data = d / "model.onnx", d / "test_data_set_0"
        if not model_file.exists() or not data.exists():
            continue
        ins = [_read_pb(p) for p in sorted(data.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
        outs = [_read_pb(p) for p in sorted(data.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
        cases.append(Case(folder, d.name, onnx.load(str(model_file)), ins, outs))
    return cases


def light_cases() -> list[Case]:
    cases = []
    for f in sorted((DATA / "light").glob("light_*.onnx")):
        model = onnx.load(str(f))
        inits = {i.name for i in model.graph.initializer}
        ins = []
        for x in model.graph.input:
            if x.name in inits:
                continue
            shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in x.type.tensor_type.shape.dim)
            n = int(np.prod(shape))
            ins.append((np.arange(n).reshape(shape) / n).astype(np.float32))  # onnx's runner: random=False
        outs = []
        for i in range(len(model.graph.output)):
            p = f.with_name(f"{f.stem}_output_{i}.pb")
            if p.exists():
                outs.append(_read_pb(p))
        if len(outs) == len(model.graph.output):
            cases.append(Case("light", f.stem, model, ins, outs))
    return cases


def all_cases(folders=FOLDERS) -> list[Case]:
    cases = []
    for folder in folders:
        cases += node_cases() if folder == "node" else light_cases() if folder == "light" else folder_cases(folder)
    return cases


def _feeds(case: Case) -> dict:
    inits = {i.name for i in case.model.graph.initializer}
    names = [x.name for x in case.model.graph.input if x.name not in inits]
    return dict(zip(names, case.inputs))


def _close(got, want, rtol=RTOL) -> bool:
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(_close(g, w, rtol) for g, w in zip(got, want))
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return False
    if want.dtype.kind not in "fc":
        return bool(np.array_equal(got, want))
    g, w = got.astype(np.float64), want.astype(np.float64)
    same_nonfinite = (np.isnan(g) & np.isnan(w)) | (g == w)
    return bool(np.all(same_nonfinite | (np.abs(g - w) <= rtol * np.maximum(np.abs(w), 1.0))))


def _plain_ort(case: Case) -> dict | None:
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, _feeds(case))))
    except Exception:  # noqa: BLE001
        return None


def run_case(case: Case, composite: str, **params) -> Outcome:
    from onnx_lrp import Explainer, LrpError

    t0 = time.perf_counter()

    def done(status, detail=""):
        return Outcome(case.name, case.folder, composite, status, detail, time.perf_counter() - t0)

    try:
        ex = Explainer(case.model, composite=composite, threads=1, **params)
        res = ex.explain(_feeds(case))
    except LrpError as exc:
        msg = str(exc)
        if "\n" in msg.strip():
            return done("other", f"multi-line error: {msg[:200]}")
        if any(m in msg for m in ORT_REJECTS):
            return done("other", f"onnxruntime rejects our graph: {msg}")
        return done("refused", msg)
    except Exception as exc:  # noqa: BLE001 - the point of the sweep
        return done("other", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    outs = list(case.model.graph.output)
    plain = None
    for out, want in zip(outs, case.outputs):
        name = out.name
        if name not in res.outputs:
            return done("other", f"output {name!r} is missing")
        # float16/bfloat16 models run upcast to float32 (onnx_lrp/load/passes/float16.py): equal up to their rounding
        rtol = LOW_FLOAT_RTOL.get(out.type.tensor_type.elem_type, RTOL)
        if _close(res.outputs[name], want, rtol):
            continue
        # onnxruntime itself may differ from onnx's numpy reference (float16 internals): then the rewritten
        # model must still give the outputs plain onnxruntime gives for the original model
        if plain is None:
            plain = _plain_ort(case)
        if plain is None or not _close(res.outputs[name], plain.get(name)):
            return done("other", f"output {name!r} differs from the expected output")
    rel = res.relevance if isinstance(res.relevance, dict) else {"x": res.relevance}
    for k, r in rel.items():
        if not np.all(np.isfinite(r)):
            return done("other", f"non-finite relevance for {k!r}")
    return done("explained")


# the CNN composite without ZBox (epsilon-plus-flat needs no bounds) and the transformer composite
COMPOSITES = ("epsilon-plus-flat", "attnlrp")


def sweep(cases, composites=COMPOSITES, log=None) -> list[Outcome]:
    import onnxruntime

    onnxruntime.set_default_logger_severity(4)  # run-time failures are reported as outcomes, not logged
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in cases:
            for comp in composites:
                o = run_case(case, comp)
                results.append(o)
                if log is not None:
                    print(f"{o.folder}/{o.case} [{comp}] {o.status} {o.seconds:.2f}s {o.detail[:160]}", file=log,
                          flush=True)
    return results


def reason_of(detail: str) -> str:
    """A refusal message reduced to its kind (node names and numbers dropped) for the summary."""
    m = re.search(r"\(([\w.]+)::(\w+), opset \d+: ([^);]*)", detail)
    if m:
        return f"unsupported {m.group(2)}: {m.group(3)[:70]}"
    d = re.sub(r"'[^']*'", "'…'", detail)
    d = re.sub(r"\d+", "N", d)
    return d[:110]


def summary(results: list[Outcome]) -> str:
    lines = []
    table = collections.defaultdict(collections.Counter)
    for o in results:
        table[(o.folder, o.composite)][o.status] += 1
    lines.append(f"{'folder':20} {'composite':20} {'explained':>9} {'refused':>8} {'other':>6}")
    for (folder, comp), c in sorted(table.items()):
        lines.append(f"{folder:20} {comp:20} {c['explained']:9d} {c['refused']:8d} {c['other']:6d}")
    tot = collections.Counter(o.status for o in results)
    lines.append(f"{'total':41} {tot['explained']:9d} {tot['refused']:8d} {tot['other']:6d}")
    reasons = collections.Counter(reason_of(o.detail) for o in results if o.status == "refused")
    lines.append("main refusal reasons (model x composite):")
    lines += [f"  {n:5d}  {r}" for r, n in reasons.most_common(25)]
    others = [o for o in results if o.status == "other"]
    if others:
        lines.append("other:")
        lines += [f"  {o.folder}/{o.case} [{o.composite}]: {o.detail[:200]}" for o in others]
    return "\n".join(lines)


if __name__ == "__main__":
    folders = tuple(sys.argv[1:]) or FOLDERS
    t = time.perf_counter()
    cases = all_cases(folders)
    if os.environ.get("CONFORMANCE_FILTER"):
        cases = [c for c in cases if re.search(os.environ["CONFORMANCE_FILTER"], c.name)]
    print(f"{len(cases)} models loaded in {time.perf_counter() - t:.1f}s", flush=True)
    log = open(os.environ["CONFORMANCE_LOG"], "w") if os.environ.get("CONFORMANCE_LOG") else None
    res = sweep(cases, log=log)
    print(summary(res))
    print(f"total {time.perf_counter() - t:.1f}s")
