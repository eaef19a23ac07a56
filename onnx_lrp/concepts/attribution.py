"""The attribution graph of a concept (zennit-crp's ``AttributionGraph``): a channel of a layer decomposed into its
most relevant channels of the nearest upstream layers, level by level."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import InputError
from ..core.graph import static_dims
from ..core.interface import RELEVANCE_PREFIX
from .conditional import parse_concepts
from .lookup import find_tensor, input_layers, layer_names
from .models import models_of
from .running import ConceptOptions, run_masked, shares_of, upper_pass


@dataclass
class ConceptGraph:
    """The attribution graph of one concept: ``nodes`` ((layer, channel), the root first) and ``edges``
    ({(layer, channel): [(lower layer, channel, share), ...]}), as zennit-crp's ``AttributionGraph``."""

    root: tuple
    nodes: list
    edges: dict
    target: int

    def __repr__(self) -> str:
        return (f"ConceptGraph(root={self.root!r}, target={self.target}, nodes={len(self.nodes)}, "
                f"edges={sum(len(e) for e in self.edges.values())})")


def concept_graph(ex, x, target=None, layer=None, concept: int = 0,
                  options: ConceptOptions = ConceptOptions()) -> ConceptGraph:
    """Decompose channel ``concept`` of ``layer`` into its most relevant lower-level concepts, recursively: at each
    level, every concept found (conditioned jointly with the root concept, the relevance starting at ``target``'s
    logit and passing skip connections: zennit-crp's ``exclude_parallel=False``) is split into the ``width[i]``
    channels of each nearest upstream layer with the largest shares (``options``: ``width``, ``layers``,
    ``abs_norm``, ``batch_size``)."""
    width, layers, abs_norm = options.width, options.layers, options.abs_norm
    graph = models_of(ex).graph()
    layers = list(layers) if layers is not None else layer_names(graph)
    up = upper_pass(ex, x, target, layer)
    if len(up["x"]) != 1:
        raise InputError(f"concept_graph explains one item; got a batch of {len(up['x'])}")
    channels = up["relevance"].shape[1]
    parse_concepts([[concept]], np.zeros(channels), channels)
    t = int(up["target"][0])
    root = (layer, int(concept))
    nodes, edges = [root], {}
    level = [root]
    for w in width:
        if not level:
            break
        ins = {name: input_layers(graph, name, layers) for name in {n for n, _ in level}}
        record = tuple(dict.fromkeys(r for n, _ in level for r in ins[n]))
        if not record:
            break
        masks = _level_masks(graph, root, level, up["relevance"].dtype)
        out = run_masked(ex, masks, up, t, len(level), record, "logit", options.batch_size)
        nxt = []
        for i, (n, c) in enumerate(level):
            for r in ins[n]:
                share = shares_of(out[RELEVANCE_PREFIX + r][i:i + 1], 1, abs_norm)[0]
                top = np.argsort(-share, kind="stable")[:w]
                edges.setdefault((n, c), []).extend((r, int(k), float(share[k])) for k in top)
                for k in top:
                    if (r, int(k)) not in nodes:
                        nodes.append((r, int(k)))
                    if (r, int(k)) not in nxt:
                        nxt.append((r, int(k)))
        level = nxt
    return ConceptGraph(root=root, nodes=nodes, edges=edges, target=t)


def _level_masks(graph, root: tuple, level: list, dtype) -> dict:
    """The masks of one level (one item per concept of ``level``), by layer: at the root's layer its channel, at
    each concept's own layer its channel."""
    layer, concept = root
    masks = {}
    for name in dict.fromkeys([layer] + [n for n, _ in level]):
        shape = find_tensor(graph, name).shape
        chans = static_dims(find_tensor(graph, name))[1]
        if chans is None:
            raise InputError(f"layer {name!r} has a dynamic channel count; the attribution graph needs static "
                             "channels (fix the input shape: input_shapes= / --input-shape)")
        m = np.ones([len(level), chans] + [1] * (len(shape) - 2), dtype=dtype)
        for i, (n, c) in enumerate(level):  # every item: the root concept, and its own concept at its layer
            if name == layer or name == n:
                m[i] = 0
                m[i, concept if name == layer else c] = 1
        masks[name] = m
    return masks


__all__ = ["ConceptGraph", "concept_graph"]
