"""Print the op coverage table (op types with a handler, grouped by the kinds a composite assigns rules to) as
Markdown, for the README: ``python scripts/op_coverage.py``."""
from __future__ import annotations

import collections

import onnx_lrp.lrp.ops as ops


def kinds(op, seen=None) -> set[str]:
    """The kinds an op type can take (dispatchers hold one handler per form, e.g. Add of a constant or of two
    activations)."""
    seen = seen if seen is not None else set()
    if id(op) in seen:
        return set()
    seen.add(id(op))
    out = {op.kind} if getattr(op, "kind", "") else set()
    for v in vars(op).values():
        if isinstance(v, ops.Op):
            out |= kinds(v, seen)
    return out


def table() -> str:
    by_kind = collections.defaultdict(set)
    for name, op in ops.REGISTRY.items():
        for k in kinds(op) or {"(own rule)"}:
            by_kind[k].add(name)
    lines = ["| kind | op types |", "| --- | --- |"]
    for k in sorted(by_kind):
        lines.append(f"| `{k}` | {', '.join(sorted(by_kind[k]))} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
    print(f"\n{len(ops.REGISTRY)} op types")
