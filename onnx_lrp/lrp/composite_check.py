"""Composite entries checked against the op handlers and the graph: a typo never silently disables a rule.

* a ``kind`` no op handler has (``kind = "convolutoin"``) or an ``op_type`` without a handler is refused (InputError,
  with the closest known names);
* a ``name`` glob that matches no node of the graph gives an :class:`onnx_lrp.core.errors.LrpWarning`.
"""
from __future__ import annotations

import difflib
import fnmatch
import warnings

import onnx_ir as ir

from ..core.errors import InputError, LrpWarning
from .ops import REGISTRY
from .ops.base import Op


def known_kinds() -> set[str]:
    found, stack = set(), [Op]
    while stack:
        cls = stack.pop()
        kind = getattr(cls, "kind", "")
        if isinstance(kind, str) and kind:
            found.add(kind)
        found.update(getattr(cls, "variant_kinds", ()))
        stack.extend(cls.__subclasses__())
    return found | {getattr(op, "kind", "") for op in REGISTRY.values()} - {""}


def _values(want) -> list:
    return list(want) if isinstance(want, (list, tuple)) else [want]


def _unknown(kind_or_op: str, values, known: set[str], source: str, index: int) -> None:
    for v in values:
        if str(v) not in known:
            close = difflib.get_close_matches(str(v), sorted(known), n=3)
            hint = f"did you mean {' or '.join(close)}?" if close else f"known: {', '.join(sorted(known))}"
            raise InputError(f"composite {source}: entry {index + 1} matches {kind_or_op} {v!r}, which no node can "
                             f"have; {hint}")


def check_composite(composite, graph: ir.Graph | None = None) -> None:
    """Refuse unknown kinds and op types; with a graph, warn about name globs that match none of its nodes."""
    source = composite.source or composite.name
    kinds, op_types = known_kinds(), set(REGISTRY)
    names = [n.name or "" for n in graph] if graph is not None else None
    for i, entry in enumerate(composite.entries):
        match = entry.match
        if "kind" in match:
            _unknown("kind", _values(match["kind"]), kinds, source, i)
        if "op_type" in match:
            _unknown("op_type", _values(match["op_type"]), op_types, source, i)
        if "name" in match and names is not None:
            globs = [str(g) for g in _values(match["name"])]
            if not any(fnmatch.fnmatchcase(n, g) for g in globs for n in names):
                warnings.warn(f"composite {source}: entry {i + 1} (name {', '.join(globs)}) matches no node of "
                              "the model; `onnx-lrp inspect MODEL` lists the node names", LrpWarning, stacklevel=4)


__all__ = ["check_composite", "known_kinds"]
