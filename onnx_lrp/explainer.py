"""The Python API: ``Explainer(model, composite=...).explain(x, target=...)``."""
from __future__ import annotations

from pathlib import Path

from .core.errors import InputError
from .core.relevance_model import BuildOptions
from .io.model_folder import resolve_model_folder
from .load import external
from .rules.composite import Composite
from .run import launch
from .run.runner import Explanation, InputSpec, Runner, RunOptions  # noqa: F401 (Explanation, InputSpec: this API)


class Explainer(Runner):
    """Builds the relevance model once (:func:`onnx_lrp.building.build`: load, canonize, rewrite) and runs it in one
    onnxruntime session (``explain``: :class:`onnx_lrp.run.runner.Runner`'s). ``relevance_model`` is what was built
    (:class:`onnx_lrp.core.relevance_model.RelevanceModel`), ``options`` how it runs."""

    def __init__(self, model, composite: "str | Path | Composite" = "auto", device: str | None = None, *,
                 build: BuildOptions | None = None, run: RunOptions | None = None, **options):
        """``options``: the fields of :class:`onnx_lrp.core.relevance_model.BuildOptions` (output, relevance_at,
        explain_logits, ledger, constants, input_shapes, precision) and of :class:`onnx_lrp.run.options.RunOptions`
        (threads, start, strict, precise, tf32, ...), the rest rule parameters of the composite (epsilon, gamma,
        low, high, ...); ``device``: "cpu" (default), "cuda" or "auto". ``build`` / ``run``: those objects made by
        the caller instead of their keywords. Every value is checked once, refused in one line
        (:class:`onnx_lrp.run.launch.ExplainOptions`)."""
        given = launch.ExplainOptions.from_keywords(composite, device, build=build, run=run, **options)
        # an export folder (optimum, save_pretrained) is its model.onnx; the tokenizer.json, config.json are read there
        model, self.folder = resolve_model_folder(model)
        relevance_model, session = launch.build_and_start(model, given.composite, given.build, given.run)
        super().__init__(relevance_model, given.run, session)

    @property
    def composite(self) -> Composite:
        """The composite the relevance model was built with (for "auto": the one chosen)."""
        return self.relevance_model.source.composite

    @property
    def composite_reason(self) -> str:
        """Why "auto" chose the composite ("" when it was given)."""
        return self.relevance_model.composite_reason

    @property
    def n_nodes(self) -> int:
        """Nodes of the canonized forward graph."""
        return self.relevance_model.forward_nodes

    @property
    def precision(self) -> str:
        """The precision asked for ("auto", "model", "float32"; "float32" after the fallback)."""
        return self.relevance_model.source.options.precision

    def save(self, path, computed_weights: bool = False) -> dict | None:
        """Write the relevance model; it runs in stock onnxruntime without onnx-lrp.

        ``computed_weights``: store no modified copies of the weights (W+, |W|, transposed kernels, ...) but nodes
        that compute them from the original weights (onnxruntime folds them when it loads the file): a file about
        the model's size instead of 2-4 times it. Returns the counts of
        :func:`onnx_lrp.building.computed_weights.compute_in_graph`.
        """
        from . import load as loader

        parts, counts = self._parts(computed_weights)
        try:
            loader.save_parts(parts, path)
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        return counts

    def model_parts(self, computed_weights: bool = False) -> external.Parts:
        """The relevance model as :class:`onnx_lrp.load.external.Parts` (bytes alone for a small model)."""
        return self._parts(computed_weights)[0]

    def _parts(self, computed_weights: bool) -> tuple[external.Parts, dict | None]:
        """(the relevance model's parts, the counts of computed weights or None): as built, or with the modified
        weights computed in the graph (:func:`onnx_lrp.building.computed_weights.with_computed_weights`)."""
        if computed_weights:
            from .building.computed_weights import with_computed_weights

            return with_computed_weights(self.relevance_model)
        m = self.relevance_model
        return external.Parts(m.model_bytes, m.model_folder, m.model_arrays, m.model_prepack), None

    def explain_text(self, text: str, tokenizer=None, target=None, *, text_pair: str | None = None, position=None,
                     continuation: str | None = None, task: str | None = None, labels=None, embeddings=None,
                     start: str | None = None):
        """The relevance of each token of ``text`` (``onnx_lrp.io.text``): a text classifier's class (``target``:
        None for the arg-max, an index or a class name), a token classifier's class at ``position``, or a language
        model's next token (or ``continuation``). ``tokenizer``: the model's tokenizer.json (or a ``tokenizers`` /
        transformers fast tokenizer); default the tokenizer.json beside the model (or in its export folder). Class
        names: ``labels``, else the model's ``id2label`` metadata, else the config.json beside it. The other
        arguments: ``onnx_lrp.io.text.TextRequest``. Returns a ``TextExplanation``
        (``.tokens``, ``.relevance``, ``.html()``, ...)."""
        from .io.text import TextRequest, explain_request

        return explain_request(self, TextRequest(text, tokenizer, text_pair, target, position, continuation, task,
                                                 labels, embeddings, start))

    # ------------------------------------------------------------------ concepts (onnx_lrp.concepts)
    def concept_relevance(self, x, target=None, layer: str | None = None, channel_axis: int = 1,
                          abs_norm: bool = True):
        """Per item, each channel's share of the relevance at tensor ``layer`` (N x C; zennit-crp's
        ``ChannelConcept.attribute``): the relevance summed over the other axes, over its absolute sum."""
        from . import concepts

        return concepts.concept_relevance(self, x, target, _layer(layer), channel_axis, abs_norm)

    def explain_concepts(self, x, target=None, layer: str | None = None, concepts="top:6",
                         exclude_parallel: bool = True, record=(), init: str = "logit", channel_axis: int = 1,
                         batch_size: int = 16):
        """Concept-conditional heatmaps (CRP) of one item: :class:`onnx_lrp.concepts.ConceptExplanation`."""
        from . import concepts as crp

        layer = _layer(layer)
        options = crp.ConceptOptions(exclude_parallel=exclude_parallel, record=record, init=init,
                                     channel_axis=channel_axis, batch_size=batch_size)
        return crp.explain_concepts(self, x, target, layer, concepts, options)

    def concept_graph(self, x, target=None, layer: str | None = None, concept: int = 0, width=(5, 2),
                      layers=None, abs_norm: bool = True):
        """The attribution graph of channel ``concept`` of ``layer``: :class:`onnx_lrp.concepts.ConceptGraph`."""
        from . import concepts

        layer = _layer(layer)
        options = concepts.ConceptOptions(width=width, layers=layers, abs_norm=abs_norm)
        return concepts.concept_graph(self, x, target, layer, concept, options)


def _layer(layer) -> str:
    if layer is None:
        raise InputError("give layer=, the name of an ONNX tensor (a Conv's output; `onnx-lrp concepts MODEL INPUT "
                         "--list-layers` lists them)")
    return layer


__all__ = ["Explainer", "Explanation", "InputSpec"]
