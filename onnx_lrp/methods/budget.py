"""How many stacked rows one onnxruntime run of a method may take within ``memory_budget``: the budget is the
process's memory for the method, the built model included. The gradient methods' relevance model keeps the
forward's activations until the backward reads them, so a row costs at most the sum of the forward's float
activations per item (from the shapes the loader infers); what the built model itself holds (its weights as
onnxruntime keeps them, the serialised graph) is the larger of the rise of the resident set while it is built
(Linux; it misses memory the process had freed before and reused) and an estimate from the graph's bytes."""
from __future__ import annotations

import numpy as np

#: a stacked row's memory when the forward's shapes are unknown, in units of the input row's bytes (rough)
ROW_FACTOR = 64
#: what a built model holds at least, in units of its serialised graph's bytes (ResNet50's true-gradient model:
#: 195 MiB of graph, 926 MiB resident once built in a fresh process)
HELD_FACTOR = 5


def resident() -> int | None:
    """The process's resident set in bytes (Linux), else None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def activation_bytes(graph) -> int:
    """The bytes per item of every float node output of ``graph`` (an onnx_ir graph with inferred shapes) whose
    dimensions after the batch axis are known: what a backward pass over it may keep alive at once."""
    total = 0
    for node in graph:
        for v in node.outputs:
            if v is None or v.shape is None or v.dtype is None or not v.dtype.is_floating_point():
                continue
            dims = list(v.shape)[1:]
            if dims and all(isinstance(d, int) for d in dims):
                total += int(int(np.prod(dims, dtype=np.int64)) * v.dtype.itemsize)
    return total


def held_bytes(before: int | None, graph_bytes: int) -> int:
    """What a model built since the resident set was ``before`` holds: the rise (Linux), at least the estimate
    from its graph's bytes (weights in external files are in the rise only)."""
    now = resident()
    rise = now - before if before is not None and now is not None else 0
    return max(rise, HELD_FACTOR * graph_bytes)


def rows_within(budget: int, held: int, row: int) -> int:
    """Rows per run such that ``held`` plus the rows stay within ``budget`` (at least 1)."""
    return max(1, (budget - held) // max(1, row))


__all__ = ["ROW_FACTOR", "resident", "activation_bytes", "held_bytes", "rows_within"]
