"""The concept relevance models of one relevance model: built from its build source (once per kind and tensors),
each run in its own onnxruntime session on the runner's device."""
from __future__ import annotations

import weakref

import onnx_ir as ir

from .. import load as loader
from ..building.stages import only_lrp_errors
from ..core.errors import InputError
from ..core.graph import ancestors, carries
from ..core.relevance_model import BuildSource
from ..lrp import rewriter
from ..rules.composite import load_composite
from ..run import runtime
from .lookup import find_tensor, layer_names, listing, tensor_values
from .variants import build_masked, build_seeded, build_upper


class Models:
    """Builds (once per key) and runs the three kinds of concept relevance models (:mod:`.variants`) of the
    relevance model that ``source`` built, in sessions on ``device`` with ``threads`` (and ``settings``:
    :meth:`onnx_lrp.run.options.RunOptions.session_settings`)."""

    def __init__(self, source: BuildSource, device: str, threads: int | None = None, settings: dict | None = None):
        self.source, self.device, self.threads, self.settings = source, device, threads, settings or {}
        self.composite = load_composite(source.composite_spec())
        self.sessions: dict = {}
        self._graph = None
        self._below = None  # (explained tensor's name, ids of the values it is computed from)

    def graph(self) -> ir.Graph:
        """The canonized forward graph (for names and the layer structure)."""
        if self._graph is None:
            self._graph = self._load().graph
        return self._graph

    def _load(self) -> ir.Model:
        options = self.source.options
        return loader.load(self.source.model, constants=options.constants, input_shapes=options.input_shapes)

    def _session(self, key, build):
        if key not in self.sessions:
            with only_lrp_errors("building a concept relevance model", InputError):
                model = self._load()
                build(model)
                parts = loader.serialize_parts(model)  # a large model: its weights stay in their files
            external = runtime.ExternalData(parts.folder, parts.arrays, parts.prepack)
            self.sessions[key] = runtime.Session(parts.model_bytes, self.device, self.threads, external=external,
                                                 **self.settings)
        return self.sessions[key]

    def check_below(self, names) -> None:
        """Every tensor in ``names`` exists and lies on the way to the explained tensor (or is it)."""
        graph = self.graph()
        y_name, reached = self._reached()
        for name in names:
            if id(find_tensor(graph, name)) not in reached:
                layers = [n for n in layer_names(graph) if id(find_tensor(graph, n)) in reached]
                raise InputError(f"tensor {name!r} is not on the way to the explained tensor {y_name!r} (no relevance "
                                 f"reaches it); name one below it: {listing(layers)}")

    def _reached(self):
        """(the explained tensor's name, the ids of the values relevance starting at it reaches)."""
        if self._below is None:
            graph = self.graph()
            y, _ = rewriter.explained_value(graph, self.source.options.output, self.source.options.explain_logits)
            self._below = (y.name, ancestors(y, carries).values)
        return self._below

    def tensors(self) -> list[str]:
        """Every tensor a concept layer (or a recorded tensor) may name: accepted by ``find_tensor`` and on the way
        to the explained tensor, in graph order."""
        _, reached = self._reached()
        return [v.name for v in tensor_values(self.graph()) if id(v) in reached]

    def upper(self, layer: str):
        self.check_below([layer])
        options = self.source.options
        return self._session(("upper", layer), lambda m: build_upper(
            m, self.composite, layer, options.output, options.explain_logits))

    def masked(self, masks: tuple, record: tuple):
        self.check_below(masks + record)
        options = self.source.options
        return self._session(("masked", masks, record), lambda m: build_masked(
            m, self.composite, masks, record, options.output, options.explain_logits))

    def seeded(self, layer: str, record: tuple):
        self.check_below((layer,) + record)
        return self._session(("seeded", layer, record), lambda m: build_seeded(m, self.composite, layer, record))


_MODELS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # runner -> its Models, while it lives


def models_of(runner) -> Models:
    """The concept models of ``runner`` (an Explainer, or any Runner whose relevance model can be rebuilt here),
    made on the first concept call and kept as long as the runner."""
    if runner not in _MODELS:
        if runner.relevance_model.source.model is None:
            raise InputError("concepts rebuild the relevance model from the model it was built from; this one was "
                             "carried from another process without it: build it here (onnx_lrp.Explainer)")
        _MODELS[runner] = Models(runner.relevance_model.source, runner.device, runner.options.threads,
                                 runner.options.session_settings())
    return _MODELS[runner]


__all__ = ["Models", "models_of"]
