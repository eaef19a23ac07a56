"""The Python API: ``Explainer(model, composite=...).explain(x, target=...)``."""
from __future__ import annotations

from pathlib import Path

from .core.errors import InputError
from .core.relevance_model import BuildOptions
from .load import external
from .rules.composite import Composite
from .run import launch
from .run.runner import Explanation, InputSpec, Runner, RunOptions  # noqa: F401 (Explanation, InputSpec: this API)


class Explainer(Runner):
    """Builds the relevance model once (:func:`onnx_lrp.building.build`: load, canonize, rewrite) and runs it in one
    onnxruntime session (``explain``: :class:`onnx_lrp.run.runner.Runner`'s). ``relevance_model`` is what was built
    (:class:`onnx_lrp.core.relevance_model.RelevanceModel`), ``options`` how it runs."""

    def __new__(cls, model=None, composite="auto", device=None, *, method: str = "lrp", **options):
        """``method=`` one of :data:`onnx_lrp.methods.METHODS`: a :class:`onnx_lrp.methods.explain.MethodExplainer`
        (its ``explain`` returns the method's attribution as the Explanation's ``relevance``); else LRP."""
        from .methods.explain import MethodExplainer, is_method

        if cls is Explainer and is_method(method):
            if composite != "auto":
                raise InputError(f"composite={composite!r} is LRP's; method {method!r} takes no composite (smoothgrad "
                                 "and vargrad take base=COMPOSITE)")
            return MethodExplainer(model, method, device, **options)
        return super().__new__(cls)

    def __init__(self, model, composite: "str | Path | Composite" = "auto", device: str | None = None, *,
                 method: str = "lrp", build: BuildOptions | None = None, run: RunOptions | None = None, **options):
        """``options``: the fields of :class:`onnx_lrp.core.relevance_model.BuildOptions` (output, relevance_at,
        explain_logits, ledger, constants, input_shapes, precision) and of :class:`onnx_lrp.run.options.RunOptions`
        (threads, start, strict, precise, tf32, ...), the rest rule parameters of the composite (epsilon, gamma,
        low, high, ...); ``device``: "cpu" (default), "cuda" or "auto". ``build`` / ``run``: those objects made by
        the caller instead of their keywords. Every value is checked once, refused in one line
        (:class:`onnx_lrp.run.launch.ExplainOptions`). ``method``: "lrp" (default), a composite's name (as
        ``composite=``), or a method of :mod:`onnx_lrp.methods` (then :meth:`__new__` answers)."""
        composite = _lrp_composite(method, composite)
        given = launch.ExplainOptions.from_keywords(composite, device, build=build, run=run, **options)
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


def _lrp_composite(method, composite):
    """The composite ``method=`` names ("lrp": ``composite`` as given)."""
    if method is None or method == "lrp":
        return composite
    if not isinstance(method, str):
        raise InputError(f"method must be a name (lrp, a composite or one of onnx_lrp.methods.METHODS), not "
                         f"{type(method).__name__}")
    if composite != "auto" and composite != method:
        raise InputError(f"method={method!r} and composite={composite!r} name two rule sets; give one")
    return method


def _layer(layer) -> str:
    if layer is None:
        raise InputError("give layer=, the name of an ONNX tensor (a Conv's output; `onnx-lrp concepts MODEL INPUT "
                         "--list-layers` lists them)")
    return layer


__all__ = ["Explainer", "Explanation", "InputSpec"]
