"""The explained forward beside the deployed one: how far apart their outputs are, and why.

onnx-lrp computes relevance on the *explained forward*: the deployed graph with its integer kernels rewritten as
``DequantizeLinear -> float op`` and float16 upcast to float32 (:mod:`onnx_lrp.load.passes`), run by onnxruntime with
its Q/DQ pairs as written. The deployed model, run as written by onnxruntime on the same machine, can compute other
outputs:

* onnxruntime's u8s8 int8 kernels on x86 CPUs without VNNI (AVX2; AVX-512 without VNNI) add pairs of 8-bit products
  in 16-bit registers, which saturate at 32767 (``session.x64quantprecision=1`` makes them exact, and slower);
* onnxruntime runs Q/DQ graphs through fused integer kernels (QLinearConv, ...) that requantize with their own
  rounding (``session.disable_quant_qdq=1`` runs them as written);
* requantized recurrent state (``DynamicQuantizeLSTM``) and rounding ties that move a quantized value to the
  neighbouring step in deep quantized stacks;
* float16 models compute in float16, the explanation in float32;
* onnxruntime's MatMulNBits with ``accuracy_level`` 4 (onnxruntime-genai's int4 models for CPU) quantize their
  activations to 8 bits per block; the explained forward dequantizes the same 4-bit weights and computes in float.

A decoder's past key/value inputs, fed empty in the relevance model, are fed empty to the deployed run too
(:func:`empty_past`).

:func:`measure` compares the explained output of both; the tolerance is one quantization step of that output (the
scale of the ``DequantizeLinear`` that writes it) or 1e-4 of its largest magnitude, whichever is larger.
:func:`cause` finds out which of the above it is by running the deployed model again with onnxruntime's exact int8
arithmetic and with its Q/DQ pairs as written: only for a gap beyond the tolerance, once per explainer.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

import numpy as np

from . import runtime


RELATIVE = 1e-4  # of max |y|: the tolerance of float outputs (and the floor of quantized ones)

SATURATE = ("int8 kernels of this CPU saturate (onnxruntime's u8s8 kernels without VNNI add 8-bit products in 16 "
            "bits; session.x64quantprecision=1 computes them exactly)")
QDQ_FUSED = "onnxruntime runs the Q/DQ pairs through fused integer kernels that round differently from the graph " \
            "as written (session.disable_quant_qdq=1 runs the explained forward)"
BOTH = "int8 kernels of this CPU saturate (no VNNI) and onnxruntime's fused Q/DQ kernels round differently " \
       "(session.x64quantprecision=1 and session.disable_quant_qdq=1 give the explained forward)"
ROUNDING = "onnxruntime's integer kernels round differently from the float path (requantized recurrent state, " \
           "rounding ties in deep quantized stacks)"
FLOAT16 = "the deployed model computes in float16, the explanation in float32"
INT8_ACTIVATIONS = "onnxruntime's MatMulNBits with accuracy_level 4 quantize their activations to 8 bits on this CPU; " \
                   "the explained forward computes them in float (the same 4-bit weights)"
# a past key/value input of a decoder (the relevance model feeds it empty; the deployed run gets it empty too)
_PAST = re.compile(r"^(past_key_values|past_key|past_value)([._/\-]|\d|$)|^past[._]?\d")
OTHER = "the deployed model's kernels compute differently from the explained forward"


@dataclass(frozen=True)
class Gap:
    """max |deployed - explained forward| over the explained output of one run, where it is, and the tolerance."""

    output: str
    max_abs: float
    item: int  # batch item of the largest difference
    index: int  # flat index within the item
    tolerance: float
    step: float | None  # the output's quantization step; None: a float output
    reason: str = ""

    @property
    def beyond(self) -> bool:
        return not self.max_abs <= self.tolerance  # NaN counts as beyond

    def message(self, names=None) -> str:
        """One line: why, by how much, where, against which criterion, and what is returned (``names``: the items'
        names, for the command line)."""
        crit = f"one output quantization step, {self.step:.3g}" if self.step and self.tolerance <= self.step * 1.01 \
            else f"1e-4 of max |{self.output}|"
        where = names[self.item] if names is not None and 0 <= self.item < len(names) else f"item {self.item}"
        return (f"{self.reason or OTHER}: the explained forward differs from the deployed one by up to "
                f"{self.max_abs:.3g} on {self.output}[{self.index}] of {where} (tolerance {self.tolerance:.3g}"
                f": {crit}); outputs are the deployed model's, the relevance is the explained forward's")

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["beyond"] = self.beyond
        return d

    def shifted(self, offset: int) -> "Gap":
        """The same gap with its item counted from ``offset`` (a chunk of a larger batch)."""
        return dataclasses.replace(self, item=self.item + offset)


def tolerance(deployed: np.ndarray, step: float | None) -> float:
    y = np.asarray(deployed, np.float64)
    scale = float(np.max(np.abs(y[np.isfinite(y)]))) if np.isfinite(y).any() else 0.0
    return max(1.001 * step if step else 0.0, RELATIVE * scale)


def measure(output: str, deployed: np.ndarray, forward: np.ndarray, step: float | None, items: int) -> Gap:
    """The gap on the explained output (``items``: the batch size, for where the largest difference is)."""
    a = np.asarray(deployed, np.float64)
    b = np.asarray(forward, np.float64)
    if a.shape != b.shape:  # e.g. a dynamic output length the two paths disagree on
        return Gap(output, float("inf"), 0, 0, tolerance(a, step), step)
    d = np.abs(a - b)
    d = np.where(np.isnan(d), np.inf, d)
    k = int(np.argmax(d)) if d.size else 0
    per_item = max(1, d.size // max(1, items))
    return Gap(output, float(d.reshape(-1)[k]) if d.size else 0.0, k // per_item, k % per_item, tolerance(a, step),
               step)


def worst(gaps: list) -> Gap | None:
    """The gap to report for several runs: the largest beyond its tolerance, else the largest."""
    gaps = [g for g in gaps if g is not None]
    if not gaps:
        return None
    return max(gaps, key=lambda g: (g.beyond, g.max_abs if np.isfinite(g.max_abs) else np.inf))


def cause(runner, feeds: dict, forward: np.ndarray, gap: Gap) -> str:
    """Why the deployed output differs: int8 models run again with onnxruntime's exact int8 arithmetic
    (``session.x64quantprecision``), with the Q/DQ pairs as written (``session.disable_quant_qdq``) and both; the
    first that brings the deployed output within the tolerance of the explained forward names the cause."""
    kinds = set(runner.deployed_kinds)
    if "int8" in kinds:
        tries = ((SATURATE, {"session.x64quantprecision": "1"}), (QDQ_FUSED, {"session.disable_quant_qdq": "1"}),
                 (BOTH, {"session.x64quantprecision": "1", "session.disable_quant_qdq": "1"}))
        for reason, config in tries:
            try:
                session = runtime.Session(runner.deployed, runner.device, deployed=True, config=config)
                y = runner.deployed_outputs(feeds, session).get(gap.output)
            except Exception:  # noqa: BLE001 - the diagnosis is best effort; the gap is reported without it
                continue
            if y is not None and np.asarray(y).shape == np.asarray(forward).shape and \
                    np.max(np.abs(np.asarray(y, np.float64) - np.asarray(forward, np.float64))) <= gap.tolerance:
                return reason
        return ROUNDING
    if "float16" in kinds:
        return FLOAT16
    if "int8-activations" in kinds:
        return INT8_ACTIVATIONS
    return OTHER


def is_past(name: str) -> bool:
    """Whether ``name`` is a decoder's past key/value input (``past_key_values.0.key``, ``past.1``, ...)."""
    return bool(_PAST.match(name))


def empty_past(inputs, feeds: dict) -> dict:
    """Feeds for the deployed model's past key/value inputs: length 0 along the sequence axis, the batch from the
    given inputs that share its symbol (``inputs``: onnxruntime's input descriptions, ``.name``, ``.shape``,
    ``.type``); an empty past in ``feeds`` (the loader's, batch 1) gets the run's batch, a missing one 0 for every
    other symbolic dimension."""
    sizes = {}
    for i in inputs:
        if i.name in feeds and not is_past(i.name) and isinstance(i.shape, (list, tuple)):
            for d, n in zip(i.shape, np.shape(feeds[i.name])):
                if isinstance(d, str) and d:
                    sizes.setdefault(d, n)
    out = {}
    for i in inputs:
        if not is_past(i.name) or not isinstance(i.shape, (list, tuple)):
            continue
        given = feeds.get(i.name)
        if given is not None and np.size(given):
            continue  # a past the caller gave
        known = np.shape(given) if given is not None else (0,) * len(i.shape)
        dims = [sizes.get(d, k) if isinstance(d, str) and d else d if isinstance(d, int) else k
                for d, k in zip(i.shape, known)]
        out[i.name] = np.zeros(dims, np.float16 if "float16" in str(i.type) else np.float32)
    return out


def cannot_run(message: str, source=None, device: str = "cpu") -> str:
    """One line for a deployed model onnxruntime cannot run here (``message``: its error; ``source``: the model
    file, read for its float type): the op without a kernel, for which type, and what is explained instead."""
    where = "this CPU" if device == "cpu" else device
    m = re.search(r"implementation for ([\w.]+)\(\d+\) node with name '([^']*)'", message)
    low = low_float_type(source)
    instead = "the explained forward is its float32 upcast" if low else \
        "the explained forward is the float32 computation of its weights"
    if m is None:
        said = message.split("] : ")[-1].splitlines()[0][:200] if message else "no reason given"
        return f"onnxruntime cannot run the deployed model as written on {where} ({said}); {instead}, the gap is " \
            "not measured here"
    return (f"onnxruntime cannot run the deployed model as written on {where}: {m.group(1)} (node {m.group(2)!r}) "
            f"has no {'CPU' if device == 'cpu' else device} kernel for {low or 'its types'}; {instead}, the gap is "
            "not measured here")


def low_float_type(source) -> str | None:
    """"bfloat16" or "float16": the low-precision float type of most of a model file's initializers (None: a
    float32 model, or not a file that can be read)."""
    if not isinstance(source, (str, os.PathLike)) or not os.path.isfile(source):
        return None
    try:
        import onnx_ir as ir

        model = ir.load(os.fspath(source))  # the graph; external data stays on disk, unread
        kinds = [v.dtype.name for v in model.graph.initializers.values() if v.dtype is not None]
    except Exception:  # noqa: BLE001 - a fact for the message only
        return None
    counts = {d: sum(k == d for k in kinds) for d in ("BFLOAT16", "FLOAT16", "FLOAT")}
    best = max(counts, key=counts.get)
    return best.lower() if best != "FLOAT" and counts[best] else None


def int8_saturates(device: str = "cpu") -> bool | None:
    """Whether onnxruntime's int8 matrix product saturates on this machine: MatMulInteger of 64 pairs 255 x 127
    (exact: 2072640; 16-bit pair sums: 1048544). None when it cannot be run."""
    try:
        import onnx_ir as ir

        from .. import load as loader  # serialising needs onnx: only here, in the builder process

        a = ir.Value(name="a", type=ir.TensorType(ir.DataType.UINT8), shape=ir.Shape([1, 64]))
        b = ir.Value(name="b", const_value=ir.tensor(np.full((64, 1), 127, np.int8), name="b"))
        node = ir.node("MatMulInteger", [a, b], num_outputs=1)
        node.outputs[0].name = "y"
        node.outputs[0].type = ir.TensorType(ir.DataType.INT32)
        graph = ir.Graph([a], node.outputs, nodes=[node], initializers=[b], opset_imports={"": 17})
        session = runtime.Session(loader.serialize(ir.Model(graph, ir_version=8)), device, deployed=True)
        y = session.run({"a": np.full((1, 64), 255, np.uint8)})["y"]
    except Exception:  # noqa: BLE001 - a fact for the record; unknown when it cannot be measured
        return None
    return bool(int(np.asarray(y).reshape(-1)[0]) != 255 * 127 * 64)


def machine_facts(device: str = "cpu") -> dict:
    """What a snapshot records about the machine: :func:`onnx_lrp.run.runtime.cpu_facts` and the measured int8 fact."""
    return dict(runtime.cpu_facts(), int8_saturates=int8_saturates(device))


__all__ = ["Gap", "cannot_run", "low_float_type", "measure", "tolerance", "worst", "cause", "empty_past", "is_past", "int8_saturates", "machine_facts", "RELATIVE",
           "SATURATE", "QDQ_FUSED", "BOTH", "ROUNDING", "FLOAT16", "INT8_ACTIVATIONS", "OTHER"]
