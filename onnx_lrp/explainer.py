"""The Python API: ``Explainer(model, composite=...).explain(x, target=...)``."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .core.errors import InputError
from .core.relevance_model import BuildOptions
from .io.model_folder import resolve_model_folder
from .load import external
from .rules.composite import Composite
from .run import launch
from .run.runner import Explanation, InputSpec, Runner, RunOptions  # noqa: F401 (Explanation, InputSpec: this API)

if TYPE_CHECKING:
    import numpy as np

    from .run.generation import GenerationExplanation


class Explainer(Runner):
    """An ONNX model's relevance model, built once and run in one onnxruntime session.

    The constructor loads and canonizes the model and rewrites it into the relevance model (`relevance_model`);
    `explain` runs it. Every option is checked once, here: a bad value raises an
    [`InputError`][onnx_lrp.core.errors.InputError] in one line before any work.

    Example:
        ```python
        ex = onnx_lrp.Explainer("model.onnx", composite="epsilon-gamma-box", low=0.0, high=1.0)
        e = ex.explain(x)  # x: N x C x H x W; the arg-max class of each item
        ```
    """

    def __new__(cls, model=None, composite="auto", device=None, *, method: str = "lrp", **options):
        """`method=` one of `onnx_lrp.methods.METHODS`: an `onnx_lrp.methods.explain.MethodExplainer` (its `explain`
        returns the method's attribution as the Explanation's `relevance`); else LRP."""
        from .methods.explain import MethodExplainer, is_method

        if cls is Explainer and is_method(method):
            if composite != "auto":
                raise InputError(f"composite={composite!r} is LRP's; method {method!r} takes no composite (smoothgrad "
                                 "and vargrad take base=COMPOSITE)")
            return MethodExplainer(model, method, device, **options)
        return super().__new__(cls)

    def __init__(self, model, composite: "str | Path | Composite" = "auto", device: str | None = None, *,
                 method: str = "lrp", build: BuildOptions | None = None, run: RunOptions | None = None,
                 labels: "list | dict | str | Path | None" = None, **options):
        """Build the relevance model of `model` and start its onnxruntime session.

        Args:
            model (str | Path | bytes): a path, an export folder (optimum, onnxruntime-genai) or the model's bytes.
            composite: the rules: a built-in name (`"epsilon-plus-flat"`, `"attnlrp"`, ...; [Composites and
                rules](../composites.md)), a TOML file or a `Composite`. Default `"auto"`: `epsilon-plus-flat` for
                ReLU networks, `attnlrp` for the others (`composite_reason` says why).
            device: `"cpu"` (default), `"cuda"`, or `"auto"` (CUDA when it starts, else the CPU).
            method: `"lrp"` (default: the composite's rules), a composite's name (as `composite=`), or an
                attribution method of `onnx_lrp.methods` (`"gradient"`, `"integrated-gradients"`, `"smoothgrad"`,
                `"occlusion"`, `"grad-cam"`, ...; [Methods](../methods.md)) with its options as keywords (captum's
                names: `n_steps`, `baselines`, ...): `explain` then returns the method's attribution.
            build: a `BuildOptions` made by the caller, instead of its keywords below.
            run: a `RunOptions` made by the caller, instead of its keywords below.
            labels: the class names: a list, a dict of index -> name, or a file as `--labels` takes (a JSON list,
                one name per line, a config.json with `id2label`). Default: the model's `id2label` metadata, else
                the config.json beside the model. Targets may then be given by name.
            **options (Any): keywords of how the relevance model is built, how it runs, and the composite's rule
                parameters, described below.

        Keywords of the build (`onnx_lrp.BuildOptions`):

        - `output` (None): the output to explain (None: the first), through its logits when it is behind a softmax
          unless `explain_logits=False`.
        - `relevance_at` (()): names of tensors whose relevance is returned too (names from `onnx-lrp inspect`).
        - `ledger` (False): also return the relevance entering and leaving every node (`Explanation.ledger`).
        - `constants` (None): `{input name: value}`, inputs bound to fixed values (no longer fed).
        - `input_shapes` (None): `{input name: shape}`, dynamic input dimensions fixed.
        - `past_inputs` (False): a decoder's past key/value inputs kept (fed empty else); `explain` sets it for a past.
        - `deployed` (`"auto"`: unless too large, e.g. 4-bit weights over 256 MiB on a CPU): run the deployed form too.
        - `precision` (`"auto"`: `"model"` on CUDA, `"float32"` on a CPU): a float16 / bfloat16 model's relevance type.

        Keywords of the run (`onnx_lrp.RunOptions`):

        - `threads` (None): onnxruntime's intra-op threads (None: `ONNX_LRP_THREADS`, else onnxruntime's default).
        - `start` (`"logit"`): the default start relevance, the target's logit or 1 (`"one-hot"`, as zennit).
        - `strict` (False): relevance that is not conserved raises `NumericError` instead of warning.
        - `precise` (False): onnxruntime without layout optimisations (about 13 % slower).
        - `tf32` (False): CUDA only, TF32 convolutions and matrix products (faster; the relevance drifts).

        Rule parameters (unset: the composite's): `epsilon`, `gamma`, `low` / `high` (per channel too), `alpha` / `beta`,
        `stabilizer`.

        Raises:
            LrpError: the model, an option or the device is refused (a subclass naming what and why).
        """
        from .io import labels as names
        from .io.preprocess import shaped_bounds

        # an export folder (optimum, save_pretrained, onnxruntime-genai): its model file, tokenizer and config.json
        model, self.folder = resolve_model_folder(model)
        composite = _lrp_composite(method, composite)
        given = launch.ExplainOptions.from_keywords(composite, device, build=build, run=run,
                                                    **shaped_bounds(model, options))
        relevance_model, session = launch.build_and_start(model, given.composite, given.build, given.run)
        super().__init__(relevance_model, given.run, session)
        self.labels = names.find_labels(labels, self, model)

    def explain(self, x: "np.ndarray | dict", target: "int | str | list | None" = None, start: str | None = None,
                position: "int | list | None" = None) -> Explanation:
        """Relevance of the inputs for `target`.

        Args:
            x: a numpy array or a torch tensor (any grad state or device; the relevance then comes back as torch
                tensors on its device), or a dict of them by input name. uint8 arrays are 8-bit pixels, divided
                by 255 with a warning. A decoder's past key/value state (`past_key_values.*`) given in the dict
                is used (`attention_mask`, `position_ids` filled for it when not given; [Deployed LLMs](../llm.md)).
            target: None (the arg-max per item), a class index or a class name (see `labels`), or one per item.
            start: the start relevance, `"logit"` or `"one-hot"` (default: the explainer's `start`).
            position: for sequence outputs, the explained position(s) (default: the last).

        Returns:
            Explanation: the relevance of each input, the outputs, the targets and the checks.
        """
        from .run import given_past

        if isinstance(x, dict) and given_past.past_names(x):  # a decoder's past given: the model keeping its past
            return self._explain_past(x, target, start, position)
        return self._explain_arrays(x, target, start, position)

    def _explain_arrays(self, x, target, start, position) -> Explanation:
        from .io import convert, labels as names

        given = convert.api_inputs(x, self.inputs, self.device)
        if self.relevance_model.sequence_rows is None and names.by_name(target):
            target = names.resolve_targets(target, self.labels, self.output_width())
        res = convert.answer_in_kind(super().explain(given.x, target, start, position), given.like)
        if self.labels:
            res.class_names = self.labels  # captions and .npz name the classes
        return res

    def _explain_past(self, x: dict, target, start, position) -> Explanation:
        """``explain`` with a past key/value state in ``x``: run by the relevance model that keeps its past inputs
        (built once, on the first such call), the lengths' inputs filled; the past's part is said in ``notes``."""
        import dataclasses

        from .run import given_past

        source = self.relevance_model.source
        if not source.options.past_inputs:
            if getattr(self, "_with_past", None) is None:
                build = dataclasses.replace(source.options, past_inputs=True)
                self._with_past = Explainer(source.model, source.composite_spec(), self.device, build=build,
                                            run=self.options, labels=self.labels)
            return self._with_past.explain(x, target, start, position)
        arrays, p = given_past.complete(self.inputs, x)
        res = self._explain_arrays(arrays, target, start, position)
        res.notes.append(given_past.note(res.relevance, given_past.past_names(arrays), p))
        return res

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
        `onnx_lrp.building.computed_weights.compute_in_graph`.
        """
        from . import load as loader

        parts, counts = self._parts(computed_weights)
        try:
            loader.save_parts(parts, path)
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        return counts

    def model_parts(self, computed_weights: bool = False) -> external.Parts:
        """The relevance model as `onnx_lrp.load.external.Parts` (bytes alone for a small model)."""
        return self._parts(computed_weights)[0]

    def _parts(self, computed_weights: bool) -> tuple[external.Parts, dict | None]:
        """(the relevance model's parts, the counts of computed weights or None): as built, or with the modified
        weights computed in the graph (`onnx_lrp.building.computed_weights.with_computed_weights`)."""
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

    def explain_generation(self, prompt: str, n: int, tokenizer: "str | Path | None" = None, *,
                           contrast: "str | int | None" = None, start: str | None = None,
                           eos: "int | list | None" = None, decoder: "str | Path | None" = None
                           ) -> "GenerationExplanation":
        """Greedy generation of `n` tokens after `prompt`, each generated token explained over everything before
        it, in one batched relevance run.

        Args:
            prompt: the text to continue.
            n: how many tokens to generate (greedy, through the model's KV cache when it has one).
            tokenizer: a tokenizer.json path or a `tokenizers.Tokenizer` (default: the one beside the model).
            contrast: a foil token: each row explains logit(generated) - logit(foil).
            start: the start relevance, as `explain`.
            eos: the end-of-sequence id(s) that stop generation (default: the model folder's).
            decoder: the model that generates (an .onnx file with or without KV cache, or an onnxruntime-genai
                folder; default the model this explainer was built from).

        Returns:
            GenerationExplanation: `relevance` (one row per generated token), `generated` ids and `tokens`.
        """
        from .run import generation as gen

        source = decoder if decoder is not None else self.relevance_model.source.model
        if not isinstance(source, (str, Path)):
            raise InputError("explain_generation needs the model as a file or folder to generate with: give "
                             "decoder=PATH (the .onnx file or its onnxruntime-genai folder)")
        dec = gen.Decoder(source, threads=self.options.threads)
        tok = tokenizer if tokenizer is not None else dec.folder.tokenizer if dec.folder is not None else \
            dec.path.parent / "tokenizer.json"
        return gen.explain_generation(self, tok, gen.GenerationRequest(prompt, n, contrast, start, eos), dec)

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
        """Concept-conditional heatmaps (CRP) of one item: `onnx_lrp.concepts.ConceptExplanation`."""
        from . import concepts as crp

        layer = _layer(layer)
        options = crp.ConceptOptions(exclude_parallel=exclude_parallel, record=record, init=init,
                                     channel_axis=channel_axis, batch_size=batch_size)
        return crp.explain_concepts(self, x, target, layer, concepts, options)

    def concept_graph(self, x, target=None, layer: str | None = None, concept: int = 0, width=(5, 2),
                      layers=None, abs_norm: bool = True):
        """The attribution graph of channel ``concept`` of ``layer``: `onnx_lrp.concepts.ConceptGraph`."""
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
