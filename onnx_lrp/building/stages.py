"""The stages of :func:`onnx_lrp.building.build`, one function each: load the model, choose the composite, read what is
explained, rewrite, the precision pass, serialise, and whether the deployed model runs beside the relevance model."""
from __future__ import annotations

import functools
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from .. import load as loader
from ..core import meta
from ..core.errors import InputError, LrpError, LrpWarning, ModelError, internal_error
from ..core.graph import static_dims
from ..core.interface import POSITION_INPUT, RELEVANCE_PREFIX
from ..core.relevance_model import BuildOptions, Deployed, InputSpec
from ..load import external
from ..lrp import rewriter
from ..rules.composite import Composite, builtin_names, load_composite
from . import auto_composite as choice
from . import precision as precision_pass
from .transient_weights import make_transient


#: bytes of float16 / bfloat16 weights above which the deployed model does not run beside the relevance model on
#: the CPU (README, "float16 / bfloat16": it would hold a float32 copy of every weight)
DEPLOYED_FLOAT16_MAX = 256 << 20
#: bytes of 4-bit weights above which the deployed model does not run beside the relevance model on the CPU
#: (docs/llm-precisions.md, "Memory and time": its pre-packed weights would take the memory past 3x the weights)
DEPLOYED_PACKED_MAX = 256 << 20


@contextmanager
def only_lrp_errors(what: str, memory_error=ModelError, hint: str = ""):
    """Let only :class:`onnx_lrp.LrpError` out of the block: a MemoryError as ``memory_error`` ("out of memory while
    ``what``", then ``hint``), any other exception as one line naming it (a bug, or a malformed model no check
    foresaw; counted by the fuzzer)."""
    try:
        yield
    except LrpError:
        raise
    except MemoryError:
        raise memory_error(f"out of memory while {what}{hint}") from None
    except Exception as exc:
        raise internal_error(None, exc) from exc


# ------------------------------------------------------------------------------------------------ load, choose
def load(model, options: BuildOptions) -> ir.Model:
    """The canonized forward graph of ``model`` (:func:`onnx_lrp.load.load`)."""
    return loader.load(model, constants=options.constants, input_shapes=options.input_shapes,
                       past_inputs=options.past_inputs)


def choose(composite, forward: ir.Model, options: BuildOptions) -> tuple[Composite, str]:
    """The composite (a name or TOML path loaded) and why it was chosen: for "auto" the built-in that fits the
    network (:mod:`onnx_lrp.building.auto_composite`), else "" (given)."""
    try:
        return choice.resolve(load_composite(composite), forward, options.output, options.explain_logits)
    except ValueError as exc:
        raise InputError(str(exc)) from None


@functools.lru_cache(maxsize=None)
def _builtin(name: str) -> Composite:
    return load_composite(name)


def composite_by_name(composite: Composite) -> str | None:
    """The name (a built-in's, or a TOML file's path) that loads ``composite`` again unchanged, or None: a composite
    carried to another process travels as this name, any other pickled."""
    try:
        source = composite.source
        again = _builtin(source) if source in builtin_names() else load_composite(source)
        return source if again == composite else None
    except Exception:  # noqa: BLE001 - not a name that loads (a file that moved, ...), array parameters that do not
        return None  # compare: pickled when carried


# ------------------------------------------------------------------------------------------------ deployed model
def deployed_model(model, forward: ir.Model, options: BuildOptions) -> Deployed | None:
    """The deployed model to run beside the relevance model when its forward differs from the explained one
    (quantized or float16), as onnxruntime loads it; None for a float model (or one that cannot be serialised)."""
    kinds = deployed_kinds(forward)
    source = deployed_source(model) if kinds else None
    if source is None:
        return None
    constants = {k: np.asarray(v) for k, v in (options.constants or {}).items()}
    for name, dims in (meta.EMPTY_PAST.get(forward) or {}).items():  # a decoder's past: empty (its batch: the run's)
        constants.setdefault(name, np.zeros(dims, np.float32))
    return Deployed(source, kinds, constants)


def deployed_kinds(forward: ir.Model) -> tuple:
    """What makes the deployed model's forward differ from the explained one: "int8" (quantized: Q/DQ pairs or
    dynamic quantization stay in the canonized graph), "float16" (upcast by the loader) and "int8-activations"
    (MatMulNBits with accuracy_level 4)."""
    kinds = []
    if any(n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear") for n in forward.graph):
        kinds.append("int8")
    if any("float16" in note for note in meta.DEPLOYED_FORMS.get(forward) or ()):
        kinds.append("float16")
    if any("accuracy_level 4" in note for note in meta.DEPLOYED_FORMS.get(forward) or ()):
        kinds.append("int8-activations")  # MatMulNBits quantizing their activations (load.passes.block_quant)
    return tuple(kinds)


def deployed_source(model):
    """The deployed model as onnxruntime loads it: a path as given (external data beside it), bytes as given, an
    in-memory model serialised (None when it cannot be: no deployed run)."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    try:
        return loader.read_proto(model).SerializeToString()
    except Exception:  # noqa: BLE001 - e.g. over protobuf's 2 GiB: the outputs are then the explained forward's
        return None


def deployed_kept(deployed: Deployed | None, prepack: bool, low_bytes: int, options: BuildOptions,
                  packed_bytes: int = 0) -> Deployed | None:
    """``deployed``, or None when ``options.deployed`` is False, or when it is "auto" (with one warning) and running
    the deployed model beside the relevance model would cost too much memory: over 1 GiB of weights (a second
    full-size session), float16 weights over DEPLOYED_FLOAT16_MAX on the CPU, or 4-bit weights
    (``packed_bytes``) over DEPLOYED_PACKED_MAX on the CPU."""
    if deployed is None or options.deployed is True:
        return deployed
    if options.deployed is False:
        return None
    kinds = ", ".join(deployed.kinds)
    if not prepack:  # over 1 GiB of weights: a second full-size session
        why = "it has over 1 GiB of weights and would double the memory"
    elif low_bytes > DEPLOYED_FLOAT16_MAX and options.device == "cpu":
        # onnxruntime's CPU provider has no float16 kernels for most ops: it holds a float32 copy of every weight
        why = (f"onnxruntime's CPU provider would hold a float32 copy of its {low_bytes / 1e6:.0f} MB of "
               "float16/bfloat16 weights (3x the memory)")
    elif packed_bytes > DEPLOYED_PACKED_MAX and options.device == "cpu":
        # MatMulNBits pre-pack their weights for the CPU's kernels: ~1.4x the 4-bit bytes (1.06 GB for 0.77 GB)
        why = (f"onnxruntime would hold a pre-packed copy of its {packed_bytes / 1e6:.0f} MB of 4-bit weights "
               "(about 1.4x their bytes, beyond 3x the weights in all)")
    else:
        return deployed
    warnings.warn(f"the deployed model ({kinds}) is not run beside the relevance model: {why}; outputs are the "
                  "explained forward's (float32) and no deployed gap is measured; deployed=True (--deployed on) "
                  "runs it anyway", LrpWarning, stacklevel=3)
    return None


# ------------------------------------------------------------------------------------------------ what is explained
@dataclass
class Explained:
    """What the forward graph says about the explanation, read before the rewrite adds its inputs and outputs."""

    value: ir.Value  # the tensor explained (the logits behind a softmax output)
    output: ir.Value  # the model output it belongs to
    inputs: tuple  # InputSpec per model input
    dims: tuple | None  # the explained tensor's static dimensions
    whole: bool  # no batch axis: the output is one item
    sequence_rows_from: tuple | None  # (input, axis) giving the dynamic number of positions of a sequence output
    step: float | None  # the explained output's quantization step
    nodes: int  # nodes of the canonized forward graph


def explained(forward: ir.Model, options: BuildOptions) -> Explained:
    """What is explained: the explained tensor and output (:func:`onnx_lrp.lrp.rewriter.explained_value`), the
    inputs, whether the output is one item, where a sequence output's positions come from."""
    graph = forward.graph
    nodes = sum(1 for _ in graph)
    inputs = tuple(InputSpec(v.name, np.dtype(v.dtype.numpy()), tuple(static_dims(v) or ())) for v in graph.inputs)
    y_value, y_out = rewriter.explained_value(graph, options.output, options.explain_logits)
    return Explained(value=y_value, output=y_out, inputs=inputs, dims=static_dims(y_value),
                     whole=rewriter.whole_output(graph, y_value),
                     sequence_rows_from=sequence_axis_source(graph, y_value), step=quantization_step(y_out),
                     nodes=nodes)


def quantization_step(y: ir.Value) -> float | None:
    """The quantization step of the explained output: the largest scale of the DequantizeLinear that writes it."""
    node = y.producer()
    if node is None or node.op_type != "DequantizeLinear" or len(node.inputs) < 2 or node.inputs[1] is None \
            or node.inputs[1].const_value is None:
        return None
    return float(np.max(np.abs(node.inputs[1].const_value.numpy())))


def sequence_axis_source(graph: ir.Graph, y: ir.Value) -> tuple[str, int] | None:
    """(input name, axis) whose symbolic dimension is the explained output's axis 1 (e.g. ``seq``), if any."""
    if y.shape is None or len(y.shape) < 3 or isinstance(y.shape[1], int):
        return None
    name = getattr(y.shape[1], "value", None)
    if not name:
        return None
    for v in graph.inputs:
        for axis, d in enumerate(v.shape or ()):
            if not isinstance(d, int) and getattr(d, "value", None) == name:
                return v.name, axis
    return None


# ------------------------------------------------------------------------------------------------ rewrite
def rewrite(forward: ir.Model, composite: Composite, options: BuildOptions) -> tuple[tuple, tuple | None]:
    """Append the relevance graph (:func:`onnx_lrp.lrp.rewriter.rewrite`, in place); returns the walk's steps and
    the ledger's rows (None without the ledger)."""
    ledger = [] if options.ledger else None
    trace: list = []
    rewriter.rewrite(forward, composite, output=options.output, relevance_at=list(options.relevance_at),
                     explain_logits=options.explain_logits, ledger=ledger, trace=trace)
    return tuple(trace), None if ledger is None else tuple(ledger)


@dataclass(frozen=True)
class Interface:
    """The relevance model's outputs, read after the rewrite."""

    output_names: tuple  # the model's own outputs
    relevance_inputs: tuple  # the inputs whose relevance it returns
    explained_output: str
    explained_tensor: str
    sequence_rows: tuple | None  # (positions, entries per position) of an explained output of rank >= 3


def interface(relevance: ir.Model, what: Explained) -> Interface:
    """The rewritten graph's outputs: the model's own, the relevance of which inputs, the sequence rows."""
    graph = relevance.graph
    produced = {o.name for o in graph.outputs}
    rows = None
    if POSITION_INPUT in {v.name for v in graph.inputs} and what.dims is not None:
        # a dynamic sequence length (None) is read from the input axis with the same symbolic dimension
        # dynamic trailing axes (a detector's H x W map): entries per position (None) read from the output
        trailing = what.dims[2:]
        rows = (what.dims[1], int(np.prod(trailing)) if all(d is not None for d in trailing) else None)
    return Interface(output_names=tuple(o.name for o in graph.outputs if not o.name.startswith("lrp/")),
                     relevance_inputs=tuple(v.name for v in graph.inputs if RELEVANCE_PREFIX + v.name in produced),
                     explained_output=what.output.name, explained_tensor=what.value.name, sequence_rows=rows)


# ------------------------------------------------------------------------------------------------ precision, bytes
def precision(relevance: ir.Model, options: BuildOptions) -> tuple[str, int]:
    """(what the relevance model computes in, bytes of float16 / bfloat16 weights): a float16 / bfloat16 model in
    its own type where :func:`onnx_lrp.building.precision.wanted` says so (:func:`~onnx_lrp.building.precision.
    to_model_precision`), else float32."""
    low_bytes = external.low_precision_bytes(relevance)
    low_type = precision_pass.model_dtype(relevance)
    if low_type is not None and precision_pass.wanted(options.precision, options.device) and \
            precision_pass.to_model_precision(relevance, low_type):
        return low_type.name.lower(), low_bytes
    return "float32", low_bytes


def serialise(relevance: ir.Model) -> external.Parts:
    """The relevance model as onnxruntime receives it (a large model: its weights stay in their files); packed
    weights dequantized once per consumer (:mod:`.transient_weights`)."""
    make_transient(relevance)
    return loader.serialize_parts(relevance, packed_file=True)


__all__ = ["DEPLOYED_FLOAT16_MAX", "DEPLOYED_PACKED_MAX", "Explained", "Interface", "only_lrp_errors", "load", "choose", "composite_by_name",
           "deployed_model", "deployed_kinds", "deployed_source", "deployed_kept", "explained", "quantization_step",
           "sequence_axis_source", "rewrite", "interface", "precision", "serialise"]
