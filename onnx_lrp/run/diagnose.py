"""Locating where relevance first became non-finite: a second session over the relevance model that also returns
every forward activation and every relevance tensor of the walk. Used by :class:`onnx_lrp.run.runner.Runner` only when a
run's relevance is not finite (it imports onnx_ir and the loader, which running alone does not need)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .. import load as loader
from ..core.errors import InputError, NumericError
from ..core.graph import carries
from ..core.interface import ONE_HOT_INPUT, POSITION_INPUT, RELEVANCE_PREFIX, TARGET_INPUT
from ..core.relevance_model import RelevanceModel
from . import runtime


FORWARD_NON_FINITE = "the forward pass is already non-finite"


def error_class(where: str | None) -> type:
    """The class of the refusal :func:`locate`'s finding makes: a forward pass that is already non-finite comes from
    what was given (the input's range, the model's weights), so it is bad input (InputError: exit 2); relevance
    that became non-finite under a rule is a result that failed (NumericError: exit 1)."""
    return InputError if where is not None and where.startswith(FORWARD_NON_FINITE) else NumericError


def diagnostic_session(relevance_model: RelevanceModel, device: str, settings: dict | None = None):
    """(session, forward activations as (node, op type, output)): a session over the relevance model that also
    returns every forward activation and every relevance tensor of the walk (built only when needed); ``settings``:
    :meth:`onnx_lrp.run.options.RunOptions.session_settings`."""
    model = loader.deserialize(relevance_model.model_bytes, relevance_model.model_folder)
    graph = model.graph
    have = {id(v) for v in graph.outputs}
    rel_type = next((o.type for o in graph.outputs if o.name.startswith(RELEVANCE_PREFIX)
                     and o.type is not None), ir.TensorType(ir.DataType.FLOAT))
    forward, extra = [], []
    for node in graph:
        if node.name.startswith("lrp/"):
            continue
        for o in node.outputs:
            if not o.name.startswith("lrp/") and carries(o):
                forward.append((node, o))
                if id(o) not in have:
                    extra.append(o)
                    have.add(id(o))
    by_name = {o.name: o for n in graph for o in n.outputs}
    for step in relevance_model.trace:
        for name in step.values:
            v = by_name.get(name)
            if v is not None and id(v) not in have:
                if v.type is None:
                    v.type = rel_type
                extra.append(v)
                have.add(id(v))
    graph.outputs.extend(extra)
    forward = [(n.name, n.op_type, o.name) for n, o in forward]
    external = runtime.ExternalData(relevance_model.model_folder, relevance_model.model_arrays,
                                    relevance_model.model_prepack)
    session = runtime.Session(loader.serialize(model), device, external=external, **(settings or {}))
    return session, forward


def locate(rm: RelevanceModel, diagnostic, feeds, targets, start, positions, item: int) -> str:
    """Where the relevance of item ``item`` first became non-finite, as the refusal says it: the forward node
    (a non-finite activation) or the first node of the walk whose relevance is not finite and its rule.
    ``diagnostic``: :func:`diagnostic_session`'s (session, forward activations)."""
    session, forward = diagnostic
    one = all(spec.dims and spec.dims[0] in (None, 1) for spec in rm.inputs)
    if one:
        feeds = {k: v[item:item + 1] for k, v in feeds.items()}
        targets = targets[item:item + 1]
        positions = None if positions is None else positions[item:item + 1]
    feeds = dict(feeds)
    if positions is not None:
        feeds[POSITION_INPUT] = positions
    feeds[TARGET_INPUT] = targets
    feeds[ONE_HOT_INPUT] = np.array(start == "one-hot")
    got = session.run(feeds)

    def finite(name):
        a = got.get(name)
        return a is None or a.dtype.kind != "f" or bool(np.isfinite(a).all())

    first_forward = next(((n, op, o) for n, op, o in forward if not finite(o)), None)
    if not finite(rm.explained_output) or (first_forward is not None and
                                             not all(finite(v) for s in rm.trace[:1] for v in s.values)):
        if first_forward is not None:
            n, op, o = first_forward
            return (f"{FORWARD_NON_FINITE} at node {n} ({op}, output {o!r}); "
                    "check the model's parameters (a NaN/Inf weight?) and the input's range")
        return f"{FORWARD_NON_FINITE}; check the model's parameters and the input's range"
    for step in rm.trace:
        if not all(finite(v) for v in step.values):
            hint = ("its forward values are non-finite too (first: node "
                    f"{first_forward[0]}, {first_forward[1]})" if first_forward is not None else
                    "its forward values are finite: the rule's denominators vanish or overflow; give a larger "
                    "epsilon/stabilizer or map this node to another rule in a composite file")
            return f"first at node {step.node} ({step.op_type}) under rule {step.rule!r}; {hint}"
    return "every relevance tensor of the walk is finite in a separate run (a summed relevance overflowed?)"
