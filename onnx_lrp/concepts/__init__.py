"""Concept Relevance Propagation (CRP, Achtibat et al. 2023; zennit-crp 0.6) on relevance models built from ONNX.

Every rule is linear in the relevance that arrives from above, so masking the relevance at a tensor commutes with the
propagation below it, and K concepts ride along the batch axis of one relevance model (the forward repeated for K).
Three relevance models per conditioned tensor ``L`` (an ONNX tensor name, e.g. a Conv's output), each made by
post-processing the rewriter's relevance model with onnx_ir (the rewriter itself is unchanged):

* **upper**: the forward pass and the relevance down to ``L`` only (everything below pruned): ``lrp/relevance/<L>``
  and the activation ``L``;
* **masked**: the whole relevance model with an input ``lrp/mask/<L>`` per masked tensor that multiplies the
  relevance at ``L`` before it flows on. The mask has the rank of ``L`` and broadcasts on every axis: per item
  ``[K, 1, 1, 1]``, per channel ``[K, C, 1, 1]`` (any channel axis), per neuron ``[K, C, H, W]``; its default is
  ones, so the model runs without it. This is zennit-crp's ``exclude_parallel=False``: relevance that bypasses ``L``
  through a skip connection reaches the input unmasked;
* **seeded**: the graph below ``L`` only (``L``'s ancestors), its relevance starting from the input
  ``lrp/seed/<L>`` (shaped like ``L``). zennit-crp's ``exclude_parallel=True`` (its default; skip connections do not
  leak the concept) and ``start_layer`` (RelMax references seeded with a layer's activation).

The masks enter where the relevance at ``L`` enters the rule nodes of ``L``'s producer (scope ``lrp/<node>/``, the
rewriter's naming): what those nodes read from outside their scope and from no forward tensor is the relevance of
``L`` (possibly in gradient form, ``R / z``, which an elementwise mask also commutes with).

The package: :mod:`.lookup` (layers and tensors of the forward graph), :mod:`.variants` (the three relevance models),
:mod:`.models` (built from the relevance model's build source, one session each), :mod:`.running` (running them),
:mod:`.conditional` (conditional heatmaps), :mod:`.attribution` (the attribution graph), :mod:`.relmax` (relevance
maximisation). Each takes an :class:`onnx_lrp.Explainer` (or any :class:`onnx_lrp.run.runner.Runner` built in this
process) through its public API.
"""
from __future__ import annotations

from .attribution import ConceptGraph, concept_graph
from .conditional import ConceptExplanation, channel_masks, explain_concepts, parse_concepts
from .lookup import LAYER_OPS, find_tensor, input_layers, layer_names
from .models import Models, models_of
from .relmax import SAMPLES, RelMax, relmax_build, relmax_load
from .running import INITS, ConceptOptions, concept_relevance, run_masked, run_seeded, shares_of, upper_pass
from .variants import MASK_PREFIX, SEED_PREFIX, add_mask, build_masked, build_seeded, build_upper


__all__ = ["ConceptOptions", "ConceptExplanation", "ConceptGraph", "concept_relevance", "explain_concepts", "concept_graph",
           "layer_names", "input_layers", "find_tensor", "shares_of", "upper_pass", "run_seeded", "run_masked",
           "parse_concepts", "channel_masks", "add_mask", "build_upper", "build_masked", "build_seeded", "Models",
           "models_of", "RelMax", "relmax_build", "relmax_load", "MASK_PREFIX", "SEED_PREFIX", "LAYER_OPS", "INITS",
           "SAMPLES"]
