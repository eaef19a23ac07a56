"""The relevance model as a value: what :func:`onnx_lrp.building.build` makes and :class:`onnx_lrp.run.runner.Runner`
runs, and what rebuilds it.

A :class:`RelevanceModel` is plain data (bytes, strings, tuples, numpy arrays and dtypes): it pickles into another
process (a Ray actor) that runs it without onnx_ir, onnx, the loader or the rewriter, so this module imports only
numpy and the relevance model's interface. Its :class:`BuildSource` (the model as given, the composite, the
:class:`BuildOptions`) rebuilds it with other options: with the conservation ledger when an item does not conserve,
or as the concept relevance models (:mod:`onnx_lrp.concepts`). Pickled, the source carries the model as a file path
or its bytes and the composite by name (or compressed), so that unpickling it imports nothing more either.
"""
from __future__ import annotations

import os
import pickle
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import InputError

#: what a float16 / bfloat16 model computes in (BuildOptions.precision; onnx_lrp.building.precision)
PRECISIONS = ("auto", "model", "float32")

@dataclass(frozen=True)
class InputSpec:
    """One input of the model: its name, numpy element type and dimensions (ints, None where dynamic)."""

    name: str
    dtype: np.dtype
    dims: tuple


@dataclass(frozen=True)
class BuildOptions:
    """How :func:`onnx_lrp.building.build` makes a relevance model (besides the model and the composite)."""

    output: str | None = None  # the explained output's name (None: the model's first output)
    explain_logits: bool = True  # an output behind a softmax: relevance starts from the logits before it
    relevance_at: tuple = ()  # names of tensors whose relevance the relevance model returns too
    ledger: bool = False  # also output the conservation ledger (onnx_lrp.lrp.ledger): one row per node
    constants: dict | None = None  # inputs bound to constant values (input name -> value), folded by the loader
    input_shapes: dict | None = None  # dynamic input dimensions fixed (input name -> shape)
    #: float16 / bfloat16 models: "model" computes in their type (float32 where stability needs it), "float32" in
    #: float32, "auto" the first on CUDA, the second on the CPU (onnx_lrp.building.precision)
    precision: str = "auto"
    #: the device the relevance model is built for ("cpu" or "cuda"): it decides precision="auto" and whether a
    #: float16 deployed model fits beside the relevance model
    device: str = "cpu"
    #: a decoder's past key/value inputs stay inputs (a past given at run time gets the relevance that reaches it)
    #: instead of being fed empty (onnx_lrp.load.passes.past_state)
    past_inputs: bool = False
    #: whether the deployed model (quantized, float16, int4 with 8-bit activations) runs beside the relevance model,
    #: so that outputs and the gap are the deployed ones: "auto" unless it would cost too much memory
    #: (onnx_lrp.building.stages.deployed_kept), True always, False never
    deployed: object = "auto"

    def __post_init__(self):
        """Each value checked once, refused in one line; ``relevance_at`` as a tuple (one name: a str), ``ledger`` a
        bool."""
        if self.precision not in PRECISIONS:
            raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}")
        if self.device not in ("cpu", "cuda"):
            raise InputError(f"the build device must be 'cpu' or 'cuda' (resolved), not {self.device!r}")
        if not (self.deployed == "auto" or isinstance(self.deployed, bool)):
            raise InputError(f"deployed must be 'auto', True or False, not {self.deployed!r}")
        object.__setattr__(self, "relevance_at", _names(self.relevance_at))
        object.__setattr__(self, "ledger", bool(self.ledger))


def _names(relevance_at) -> tuple:
    """``relevance_at`` as a tuple of tensor names (one name may be given as a str)."""
    if isinstance(relevance_at, str):
        relevance_at = [relevance_at]  # one tensor name
    try:
        relevance_at = tuple(relevance_at)
    except TypeError:
        raise InputError(f"relevance_at must be a list of tensor names, not {relevance_at!r}") from None
    if not all(isinstance(n, str) for n in relevance_at):
        raise InputError(f"relevance_at must be a list of tensor names (strings), not {list(relevance_at)!r}")
    return relevance_at


@dataclass(frozen=True)
class Deployed:
    """The deployed model, run beside the relevance model so that the returned outputs are the deployed ones (a
    quantized or float16 model's forward differs from the float32 forward that is explained)."""

    source: str | bytes  # as onnxruntime loads it: a file path (external data beside it) or the model's bytes
    kinds: tuple  # "int8", "float16": what makes the deployed forward differ from the explained one
    constants: dict = field(default_factory=dict)  # inputs bound with BuildOptions.constants, fed to it too


@dataclass(frozen=True, eq=False)
class BuildSource:
    """What rebuilds a relevance model: the model as it was given, the composite it was built with (the chosen one
    when it was "auto") and the options.

    In the process that built it, ``model`` is the model as given (a path, bytes, an onnx ModelProto or an onnx_ir
    model) and ``composite`` the :class:`onnx_lrp.rules.composite.Composite`. Pickled (carried to another process),
    ``model`` becomes the absolute file path or the model's bytes (None for a model that has neither: an onnx_ir
    model, a ModelProto over protobuf's 2 GiB; nothing can rebuild it there) and ``composite`` the name it loads
    from (``composite_by_name``) or the composite pickled and compressed; :meth:`composite_spec` reads either.
    """

    model: object
    composite: object
    options: BuildOptions
    composite_by_name: str | None = None  # a built-in name (or TOML path) that loads this very composite again

    def composite_spec(self):
        """The composite as :func:`onnx_lrp.building.build` takes it: a Composite, or the name it loads from (a
        carried composite is unpickled here: that imports onnx_lrp.rules)."""
        if isinstance(self.composite, bytes):
            return pickle.loads(zlib.decompress(self.composite))
        return self.composite

    def __reduce__(self):
        """Pickled: the model as a path or bytes, the composite by name or compressed (see the class docstring)."""
        return (BuildSource, (carried_model(self.model), self._carried_composite(), self.options))

    def _carried_composite(self) -> str | bytes:
        if isinstance(self.composite, (str, bytes)):
            return self.composite
        if self.composite_by_name is not None:
            return self.composite_by_name
        return zlib.compress(pickle.dumps(self.composite), 9)


def carried_model(model) -> str | bytes | None:
    """The model as another process reads it: a file path made absolute, bytes as given, a ModelProto serialised;
    None when there is no such form (an onnx_ir model, a ModelProto too large for one protobuf)."""
    if model is None or isinstance(model, bytes):
        return model
    if isinstance(model, (str, os.PathLike)):
        return str(Path(model).resolve())
    try:
        return model.SerializeToString()
    except Exception:  # noqa: BLE001 - an onnx_ir model, or one too large for one protobuf: nothing to carry
        return None


@dataclass(frozen=True, eq=False)
class RelevanceModel:
    """One relevance model, built: the ONNX graph that computes the forward pass and the relevance in one run, and
    what running it needs to know.

    The graph's interface (:mod:`onnx_lrp.core.interface`): besides the model's inputs it takes the target
    (``lrp/target``), the start relevance's kind (``lrp/one_hot``) and, for sequence outputs, the position
    (``lrp/position``); besides the model's outputs it returns the relevance of every relevance input
    (``lrp/relevance/<input>``) and of ``relevance_at``, the target used, the explained value and (with the ledger)
    the ledger's sums.
    """

    # ------------------------------------------------------------------ the graph, as onnxruntime receives it
    model_bytes: bytes  # the serialised graph (a large model's weights stay in their files, or in model_arrays)
    model_folder: str | None  # the folder of the external data files it reads (None: none)
    model_arrays: dict  # tensors handed over from memory (name -> numpy array): onnx-lrp's own large ones
    model_prepack: bool  # whether onnxruntime may pre-pack the weights (off for very large models: the memory)
    # ------------------------------------------------------------------ its interface
    inputs: tuple  # InputSpec per model input, in the model's order
    relevance_inputs: tuple  # names of the inputs whose relevance it returns (float inputs, token ids' lookups)
    relevance_at: tuple  # names of the other tensors whose relevance it returns
    explained_output: str  # the model output whose entry is explained (the target indexes it, flattened per item)
    explained_tensor: str  # where relevance starts: the explained output, or the logits behind its softmax
    output_names: tuple  # the model's own outputs, returned with the relevance
    whole: bool  # the explained output has no batch axis: the batch is explained as one item
    #: outputs of rank >= 3 (N x T x C...): (positions along axis 1, entries per position), None where dynamic;
    #: None for other outputs
    sequence_rows: tuple | None
    #: (input name, axis) whose dimension gives a dynamic number of positions (the output's axis 1 shares its
    #: symbolic dimension), or None
    sequence_rows_from: tuple | None
    output_step: float | None  # a quantized explained output's step (its DequantizeLinear's largest scale)
    # ------------------------------------------------------------------ the walk
    trace: tuple  # Step per node of the relevance walk, output side first (locates non-finite relevance)
    ledger_rows: tuple | None  # LedgerRow per node (reverse order) when built with the ledger, else None
    # ------------------------------------------------------------------ how it was made
    deployed: Deployed | None  # the deployed model run beside it; None: a float model (or too large to run twice)
    composite_name: str  # the composite's name (the chosen one for "auto")
    composite_reason: str  # why "auto" chose it ("" when the composite was given)
    model_precision: str  # what the relevance model computes in: "float32", "float16" or "bfloat16"
    forward_nodes: int  # nodes of the canonized forward graph
    source: BuildSource  # what rebuilds it (with the ledger, as the concept models)

    @property
    def ledger(self) -> bool:
        """Whether the relevance model outputs the conservation ledger (``ledger_rows`` names its rows)."""
        return self.ledger_rows is not None

    def __repr__(self) -> str:  # never the graph's bytes (megabytes in a notebook)
        return (f"RelevanceModel(composite={self.composite_name!r}, inputs={describe_inputs(self.inputs)}, "
                f"explained_output={self.explained_output!r}, relevance_inputs={list(self.relevance_inputs)}, "
                f"precision={self.model_precision!r}, forward_nodes={self.forward_nodes}, "
                f"graph={len(self.model_bytes) / 2**20:.3g} MiB" + (", ledger=True" if self.ledger else "") + ")")


def describe_inputs(inputs) -> str:
    """``image: float32[N x 1 x 28 x 28], ...`` of InputSpecs (N or ? where a dimension is dynamic)."""
    def dims(spec):
        return " x ".join("?" if d is None else str(d) for d in spec.dims)
    return "[" + ", ".join(f"{s.name}: {np.dtype(s.dtype).name}[{dims(s)}]" for s in inputs) + "]"


__all__ = ["PRECISIONS", "InputSpec", "BuildOptions", "Deployed", "BuildSource", "RelevanceModel", "carried_model", "describe_inputs"]
