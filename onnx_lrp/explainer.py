"""The Python API: ``Explainer(model, composite=...).explain(x, target=...)``."""
from __future__ import annotations

import gc
import os
import pickle
import warnings
import zlib
from pathlib import Path

import numpy as np
import onnx_ir as ir

from . import load as loader
from .build import auto_composite as choice
from .build import precision as precision_pass
from .core import meta
from .core.errors import InputError, LrpError, LrpWarning, ModelError, internal_error
from .core.graph import carries, static_dims
from .core.interface import POSITION_INPUT, RELEVANCE_PREFIX
from .load import external
from .lrp import rewriter
from .rules.composite import Composite, load_composite
from .run import conservation, runtime
from .run.runner import Explanation, InputSpec, Runner  # noqa: F401 (Explanation, InputSpec: part of this API)


#: bytes of float16 / bfloat16 weights above which the deployed model does not run beside the relevance model on
#: the CPU (README, "float16 / bfloat16": it would hold a float32 copy of every weight)
DEPLOYED_FLOAT16_MAX = 256 << 20


class Explainer(Runner):
    """Builds the relevance model once (load, canonize, rewrite) and one onnxruntime session for it; running it
    (``explain``) is :class:`onnx_lrp.run.runner.Runner`'s."""

    def __init__(self, model, composite: "str | Path | Composite" = "auto", device: str = "cpu",
                 output: str | None = None, relevance_at=(), explain_logits: bool = True, start: str = "logit",
                 threads: int | None = None, ledger: bool = False, constants: dict | None = None,
                 input_shapes: dict | None = None, strict: bool = False, precise: bool = False,
                 tf32: bool = False, precision: str = "auto", **rule_params):
        if start not in ("logit", "one-hot"):
            raise InputError(f"start must be 'logit' or 'one-hot', not {start!r}")
        try:
            self.composite = load_composite(composite).with_params(**rule_params)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        self.start = start
        self.strict = bool(strict)  # relevance far from conserved (onnx_lrp.run.conservation): an error, not a warning
        self.precise = bool(precise)  # onnxruntime without layout optimisations (runtime.Session)
        self._source = (model, output, explain_logits, constants, input_shapes)  # rebuilt with a ledger on a trip
        self.device = runtime.resolve_device(device)
        if not isinstance(tf32, bool):
            raise InputError(f"tf32 must be True or False, not {tf32!r}")
        self.tf32 = tf32  # CUDA only: TF32 convolutions and matrix products (faster, relevance drifts; README "GPU")
        # float16 / bfloat16 models: "model" computes in their type (float32 where stability needs it), "float32"
        # in float32, "auto" the first on CUDA, the second on the CPU (onnx_lrp/precision.py)
        self.precision = precision_pass.check(precision)
        self.model_precision = "float32"  # what the relevance model computes in (set by _build)
        if isinstance(relevance_at, str):
            relevance_at = [relevance_at]  # one tensor name
        try:
            relevance_at = list(relevance_at)
        except TypeError:
            raise InputError(f"relevance_at must be a list of tensor names, not {relevance_at!r}") from None
        if not all(isinstance(n, str) for n in relevance_at):
            raise InputError(f"relevance_at must be a list of tensor names (strings), not {relevance_at!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
            raise InputError(f"threads must be a non-negative int (0: onnxruntime's default), not {threads!r}")
        try:
            self._build(model, output, relevance_at, explain_logits, threads, ledger, device, constants,
                        input_shapes)
        except LrpError:
            raise
        except MemoryError:
            raise ModelError("out of memory while building the relevance model; the model (or a dimension of it) is "
                             "too large for this machine") from None
        except Exception as exc:  # a bug (or a malformed model no check foresaw): one line, counted by the fuzzer
            raise internal_error(None, exc) from exc

    def _build(self, model, output, relevance_at, explain_logits, threads, ledger, device, constants=None,
               input_shapes=None) -> None:
        ir_model = loader.load(model, constants=constants, input_shapes=input_shapes)
        try:  # "auto": the composite that fits the network (onnx_lrp/choice.py)
            self.composite, self.composite_reason = choice.resolve(self.composite, ir_model, output, explain_logits)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        self.composite_name = self.composite.name
        self.concept_source = dict(model=model, constants=constants, input_shapes=input_shapes, output=output,
                                   explain_logits=explain_logits, threads=threads)  # onnx_lrp.concepts rebuilds
        self.concept_models = None  # onnx_lrp.concepts.Models, made on the first concept call
        graph = ir_model.graph
        self.deployed_kinds = _deployed_kinds(ir_model)
        if self.deployed_kinds:  # quantized or float16: run the deployed model as written beside the relevance model
            self.deployed = _deployed_source(model)
            self.deployed_constants = {k: np.asarray(v) for k, v in (constants or {}).items()}
        self.n_nodes = sum(1 for _ in graph)  # of the canonized forward graph
        self.inputs = [InputSpec(v.name, np.dtype(v.dtype.numpy()), tuple(static_dims(v) or ()))
                       for v in graph.inputs]
        self.relevance_inputs = [v.name for v in graph.inputs if carries(v)]
        self.relevance_at = list(relevance_at)
        y_value, y_out = rewriter.explained_value(graph, output, explain_logits)
        self.output_step = _quantization_step(y_out)
        y_dims = static_dims(y_value)
        self.whole = rewriter.whole_output(graph, y_value)  # no batch axis: the output is one item
        self._rows_from = _sequence_axis_source(graph, y_value)
        self.ledger = bool(ledger)
        self.ledger_rows = [] if ledger else None  # one onnx_lrp.lrp.ledger.LedgerRow per node, reverse order
        self._trace: list = []
        rewriter.rewrite(ir_model, self.composite, output=output, relevance_at=self.relevance_at,
                         explain_logits=explain_logits, ledger=self.ledger_rows, trace=self._trace)
        self.output_names = [o.name for o in graph.outputs
                             if not o.name.startswith("lrp/")]
        self.explained_output = y_out.name
        self.explained_tensor = y_value.name  # what relevance starts from: the logits behind a softmax output
        produced = {o.name for o in graph.outputs}
        self.relevance_inputs = [v.name for v in graph.inputs if RELEVANCE_PREFIX + v.name in produced]
        self.sequence_rows = None  # (positions, entries per position) for explained outputs of rank >= 3
        if POSITION_INPUT in {v.name for v in graph.inputs} and y_dims is not None:
            # a dynamic sequence length (None) is read from the input axis with the same symbolic dimension
            # dynamic trailing axes (a detector's H x W map): entries per position (None) read from the output
            trailing = y_dims[2:]
            self.sequence_rows = (y_dims[1], int(np.prod(trailing)) if all(d is not None for d in trailing) else None)
        low_bytes = external.low_precision_bytes(ir_model)
        low_type = precision_pass.model_dtype(ir_model)
        if low_type is not None and precision_pass.wanted(self.precision, self.device) and \
                precision_pass.to_model_precision(ir_model, low_type):
            self.model_precision = low_type.name.lower()
        parts = loader.serialize_parts(ir_model)  # a large model: its weights stay in their files
        del ir_model, graph, y_value, y_out  # nothing of the onnx_ir graph outlives this
        if parts.folder is not None:
            gc.collect()  # the graph's cycles hold its memory-mapped weights: unmapped before onnxruntime maps them
        self.model_bytes, self.model_folder, self.model_arrays = parts.model_bytes, parts.folder, parts.arrays
        self.model_prepack = parts.prepack
        if self.deployed is not None and not parts.prepack:  # over 1 GiB of weights: a second full-size session
            warnings.warn(f"the deployed model ({', '.join(self.deployed_kinds)}) is not run beside the relevance "
                          "model: it has over 1 GiB of weights and would double the memory; outputs are the "
                          "explained forward's (float32)", LrpWarning, stacklevel=3)
            self.deployed = None
        elif self.deployed is not None and low_bytes > DEPLOYED_FLOAT16_MAX and self.device == "cpu":
            # onnxruntime's CPU provider has no float16 kernels for most ops: it holds a float32 copy of every weight
            warnings.warn(f"the deployed model ({', '.join(self.deployed_kinds)}) is not run beside the relevance "
                          f"model: onnxruntime's CPU provider would hold a float32 copy of its "
                          f"{low_bytes / 1e6:.0f} MB of float16/bfloat16 weights (3x the memory); outputs are the "
                          "explained forward's (float32)", LrpWarning, stacklevel=3)
            self.deployed = None
        try:
            session = runtime.Session(self.model_bytes, device, threads, data_folder=self.model_folder,
                                      arrays=self.model_arrays, prepack=self.model_prepack, precise=self.precise,
                                      tf32=self.tf32)
        except LrpError as exc:
            if self.model_precision == "float32":
                raise
            why = str(exc).split("; ")[0]
            why = why[why.find("[ONNXRuntimeError]"):] if "[ONNXRuntimeError]" in why else why
            if self.precision == "auto":  # the default: fall back to float32, said once
                warnings.warn(f"onnxruntime cannot run the relevance model in {self.model_precision} on "
                              f"{self.device} ({why}); it is computed in float32 (precision='float32' skips the "
                              "attempt)", LrpWarning, stacklevel=3)
                self.precision, self.model_precision = "float32", "float32"
                del parts
                return self._build(model, output, relevance_at, explain_logits, threads, ledger, device, constants,
                                   input_shapes)
            raise InputError(f"onnxruntime cannot run the relevance model in {self.model_precision} on "
                             f"{self.device} (precision={self.precision!r}): {why}; use precision='float32' "
                             "(computed in float32)") from None
        self._started(session)

    @property
    def ledger_source(self) -> tuple | None:
        """What rebuilds this relevance model with the ledger in another process (carried by :meth:`payload`)."""
        model, output, explain_logits, constants, input_shapes = self._source
        return _ledger_source(model, self.composite, output, explain_logits, constants, input_shapes)

    def _culprits(self, feeds, item: int, target: int, start, positions):
        book = self if self.ledger else ledger_book(self, start)
        return ledger_culprits(self, book, feeds, item, target, start, positions)

    def save(self, path, computed_weights: bool = False) -> dict | None:
        """Write the relevance model; it runs in stock onnxruntime without onnx-lrp.

        ``computed_weights``: store no modified copies of the weights (W+, |W|, transposed kernels, ...) but nodes
        that compute them from the original weights (onnxruntime folds them when it loads the file): a file about
        the model's size instead of 2-4 times it. Returns the counts of :func:`onnx_lrp.build.computed_weights.compute_in_graph`.
        """
        try:
            loader.save_parts(self.model_parts(computed_weights), path)
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        return self._computed_counts if computed_weights else None

    def explain_text(self, text: str, tokenizer, target=None, *, text_pair: str | None = None, position=None,
                     continuation: str | None = None, task: str | None = None, labels=None, embeddings=None,
                     start: str | None = None):
        """The relevance of each token of ``text`` (:func:`onnx_lrp.io.text.explain_text`): a text classifier's
        class (``target``: None for the arg-max, an index or a label name), a token classifier's class at
        ``position``, or a language model's next token (or ``continuation``). ``tokenizer``: the model's
        tokenizer.json (or a ``tokenizers`` / transformers fast tokenizer). Returns a
        :class:`onnx_lrp.io.text_result.TextExplanation` (``.tokens``, ``.relevance``, ``.html()``, ...)."""
        from .io.text import explain_text

        return explain_text(self, text, tokenizer, target, text_pair=text_pair, position=position,
                            continuation=continuation, task=task, labels=labels, embeddings=embeddings, start=start)

    # ------------------------------------------------------------------ concepts (onnx_lrp.concepts)
    def concept_relevance(self, x, target=None, layer: str | None = None, channel_axis: int = 1,
                          abs_norm: bool = True) -> np.ndarray:
        """Per item, each channel's share of the relevance at tensor ``layer`` (N x C; zennit-crp's
        ``ChannelConcept.attribute``): the relevance summed over the other axes, over its absolute sum."""
        from . import concepts

        return concepts.concept_relevance(self, x, target, _layer(layer), channel_axis, abs_norm)

    def explain_concepts(self, x, target=None, layer: str | None = None, concepts="top:6",
                         exclude_parallel: bool = True, record=(), init: str = "logit", channel_axis: int = 1,
                         batch_size: int = 16):
        """Concept-conditional heatmaps (CRP) of one item: :class:`onnx_lrp.concepts.ConceptExplanation`."""
        from . import concepts as crp

        return crp.explain_concepts(self, x, target, _layer(layer), concepts, exclude_parallel, record, init,
                                    channel_axis, batch_size)

    def concept_graph(self, x, target=None, layer: str | None = None, concept: int = 0, width=(5, 2),
                      layers=None, abs_norm: bool = True):
        """The attribution graph of channel ``concept`` of ``layer``: :class:`onnx_lrp.concepts.ConceptGraph`."""
        from . import concepts

        return concepts.concept_graph(self, x, target, _layer(layer), concept, width, layers, abs_norm)

    def model_bytes_computed(self) -> bytes:
        """The relevance model with modified weights computed in the graph (see :meth:`save`)."""
        return self.model_parts(True).model_bytes

    def model_parts(self, computed_weights: bool = False):
        """The relevance model as :class:`onnx_lrp.load.external.Parts` (bytes alone for a small model)."""
        from .build import computed_weights as weights
        from .load import external

        if not computed_weights:
            return external.Parts(self.model_bytes, self.model_folder, self.model_arrays, self.model_prepack)
        model = loader.deserialize(self.model_bytes, self.model_folder)
        for v in model.graph.initializers.values():  # the tensors onnx-lrp handed over from memory
            if v.name in self.model_arrays:
                v.const_value = ir.tensor(self.model_arrays[v.name], name=v.name)
        self._computed_counts = weights.compute_in_graph(model)
        return loader.serialize_parts(model)


def _ledger_source(model, composite, output, explain_logits, constants, input_shapes) -> tuple | None:
    """What rebuilds this relevance model with the conservation ledger in another process (a Ray actor, where the
    conservation check names the nodes from it): plain data (a file path or the model's bytes; a built-in
    composite's name, any other pickled and compressed, unpickled only there and only then). None for an in-memory
    graph (an onnx_ir model)."""
    if isinstance(model, (str, os.PathLike)):
        model = str(Path(model).resolve())
    elif not isinstance(model, bytes):
        try:
            model = model.SerializeToString()  # a ModelProto (under 2 GiB)
        except Exception:  # noqa: BLE001 - an onnx_ir model, or one too large for one protobuf: no names there
            return None
    constants = None if constants is None else {k: np.asarray(v) for k, v in constants.items()}
    return (model, _packed(composite), output, explain_logits, constants, input_shapes)


def _packed(composite: Composite) -> str | bytes:
    """A composite as few bytes as carry it: a built-in one by its name, any other pickled and compressed."""
    try:
        if isinstance(composite.source, str) and load_composite(composite.source) == composite:
            return composite.source
    except Exception:  # noqa: BLE001 - not a built-in name (a file that moved, ...): pickled below
        pass
    return zlib.compress(pickle.dumps(composite), 9)


def _unpacked(packed: str | bytes) -> Composite:
    return load_composite(packed) if isinstance(packed, str) else pickle.loads(zlib.decompress(packed))


def ledger_book(run, start: str) -> "Explainer":
    """The relevance model of ``run`` (an Explainer or a Runner from its payload) rebuilt with the conservation
    ledger: built on the first item that does not conserve and kept (one per start relevance), so a model that
    never conserves pays the build once, not on every call."""
    books = run.__dict__.setdefault("_ledger_books", {})
    if start not in books:
        if isinstance(run, Explainer):  # the model as it was given
            (model, output, explain_logits, constants, input_shapes), composite = run._source, run.composite
        elif run.ledger_source is not None:  # a Runner from a payload (a Ray actor)
            model, composite, output, explain_logits, constants, input_shapes = run.ledger_source
            composite = _unpacked(composite)
        else:
            raise InputError("no model to build the ledger from")
        books[start] = Explainer(model, composite, output=output, explain_logits=explain_logits,
                                 start=start, ledger=True, constants=constants, input_shapes=input_shapes)
    return books[start]


def ledger_culprits(run, book: "Explainer", feeds, item: int, target: int, start, positions):
    """The nodes that absorb or create most relevance for item ``item`` of ``feeds`` (``run``'s inputs), read from
    ``book``'s ledger (:func:`onnx_lrp.run.conservation.culprits`)."""
    one = {k: v[item:item + 1] for k, v in feeds.items()} if not run.whole else feeds
    extra = {} if positions is None else {"position": positions}
    book._reading_ledger = True  # this run only reads the ledger: no check of its own
    try:
        res = book.explain(one, target=target if run.sequence_rows is None else target % (
            run.sequence_rows[1] or 1 << 62), start=start, **extra)
    finally:
        book._reading_ledger = False
    return conservation.culprits(book.ledger_rows, res.ledger["entering"], res.ledger["leaving"])


def _deployed_kinds(ir_model) -> tuple:
    """What makes the deployed model's forward differ from the explained one: "int8" (quantized: Q/DQ pairs or
    dynamic quantization stay in the canonized graph) and "float16" (upcast by the loader)."""
    kinds = []
    if any(n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear") for n in ir_model.graph):
        kinds.append("int8")
    if any("float16" in note for note in meta.DEPLOYED_FORMS.get(ir_model) or ()):
        kinds.append("float16")
    return tuple(kinds)


def _deployed_source(model):
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


def _quantization_step(y) -> float | None:
    """The quantization step of the explained output: the largest scale of the DequantizeLinear that writes it."""
    node = y.producer()
    if node is None or node.op_type != "DequantizeLinear" or len(node.inputs) < 2 or node.inputs[1] is None \
            or node.inputs[1].const_value is None:
        return None
    return float(np.max(np.abs(node.inputs[1].const_value.numpy())))


def _layer(layer) -> str:
    if layer is None:
        raise InputError("give layer=, the name of an ONNX tensor (a Conv's output; `onnx-lrp concepts MODEL INPUT "
                         "--list-layers` lists them)")
    return layer


def _sequence_axis_source(graph, y) -> tuple[str, int] | None:
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
