"""Where onnxruntime will run each node of a model in a CUDA session, predicted on any machine (no GPU needed).

onnxruntime's CUDA provider takes every node it has a kernel for, except the nodes that
``GetCpuPreferredNodes`` (onnxruntime/core/framework/fallback_cpu_capability.cc) hands back to the CPU provider:
starting from the outputs that CUDA kernels write to host memory (``Shape``, ``Size``), it walks forward in
topological order and moves a node to the CPU when each of its inputs is such a host tensor (one the CUDA kernel
does not itself take in host memory), a small initializer (<= 100 elements) or a graph input, and none is float16 /
bfloat16 / float8. Such a node between two CUDA nodes costs a device-to-host copy and a stream synchronisation in
the middle of the graph. Nodes without a CUDA kernel run on the CPU as well.

:func:`predict` mirrors that walk over the graph onnxruntime partitions: the model after its basic (level 1)
optimisations (:func:`onnx_lrp.run.runtime.basic_optimized`), which run before partitioning. The kernel facts below
(which inputs and outputs a CUDA kernel keeps in host memory, which op types have no CUDA kernel) are read from
onnxruntime's CUDA kernel registrations; the GPU check (scripts/gpu_check.py placement) compares the prediction with
the placement onnxruntime itself reports.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import onnx_ir as ir

# op type -> input indices a CUDA kernel reads from host memory (shapes, axes, counts, bounds), by opset where it
# changed: (first opset, indices)
CPU_INPUTS: dict[str, tuple] = {
    "Reshape": ((5, (1,)),),
    "Expand": ((8, (1,)),),
    "Tile": ((6, (1,)),),
    "Unsqueeze": ((13, (1,)),),
    "Squeeze": ((13, (1,)),),
    "Slice": ((10, (1, 2, 3, 4)),),
    "ConstantOfShape": ((9, (0,)),),
    "OneHot": ((9, (1, 2)),),
    "Range": ((11, (0, 1, 2)),),
    "Pad": ((11, (1, 2, 3)),),
    "TopK": ((10, (1,)),),
    "Split": ((13, (1,)),),
    "Clip": ((11, (1, 2)),),
    "CumSum": ((11, (1,)),),
    "Resize": ((10, (1, 2, 3)),),
    "Upsample": ((9, (1,)),),
    "Trilu": ((14, (1,)),),
    "ReduceSum": ((13, (1,)),),
    **{op: ((18, (1,)),) for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                                    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
    "Dropout": ((12, (1, 2)),),
    "NonMaxSuppression": ((10, (2, 3, 4)),),
}
# op type -> output indices a CUDA kernel writes to host memory
CPU_OUTPUTS: dict[str, tuple] = {"Shape": (0,), "Size": (0,)}
# default-domain op types without any CUDA kernel: onnxruntime runs them on the CPU provider
NO_CUDA_KERNEL = frozenset({"StringNormalizer", "TfIdfVectorizer", "Unique", "Col2Im", "DFT", "STFT",
                            "MelWeightMatrix", "HannWindow", "HammingWindow", "BlackmanWindow", "Multinomial",
                            "RegexFullMatch", "StringConcat", "StringSplit", "ImageDecoder", "Optional",
                            "OptionalHasElement", "OptionalGetElement", "SequenceMap", "CenterCropPad"})
# element types onnxruntime never moves to the CPU (no fast CPU kernels)
LOW_PRECISION = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.FLOAT8E4M3FN,
                           ir.DataType.FLOAT8E4M3FNUZ, ir.DataType.FLOAT8E5M2, ir.DataType.FLOAT8E5M2FNUZ}
                          | ({ir.DataType.FLOAT4E2M1} if hasattr(ir.DataType, "FLOAT4E2M1") else set()))
SMALL_INITIALIZER = 100  # elements: onnxruntime's kSmallInitializerThreshold


@dataclass
class Placement:
    """Predicted placement of a model's nodes in a CUDA session: node names on the CPU provider, split by why."""

    shape_fallback: list = field(default_factory=list)  # moved to the CPU by GetCpuPreferredNodes
    no_kernel: list = field(default_factory=list)  # no CUDA kernel (default domain) or a domain CUDA lacks
    nodes: int = 0  # nodes in the graph predicted over

    @property
    def on_cpu(self) -> list:
        return self.no_kernel + self.shape_fallback

    def relevance_nodes(self, scope: str = "lrp/") -> list:
        """The predicted CPU nodes of the relevance graph (names in ``scope``)."""
        return [n for n in self.on_cpu if n.startswith(scope)]


def _opset(model: ir.Model, node: ir.Node) -> int:
    return model.opset_imports.get(node.domain or "", 1) if node.version is None else node.version


def cpu_input_indices(op_type: str, opset: int) -> tuple:
    """The inputs a CUDA kernel of ``op_type`` (at ``opset``) reads from host memory."""
    chosen = ()
    for since, indices in CPU_INPUTS.get(op_type, ()):
        if opset >= since:
            chosen = indices
    return chosen


def _has_kernel(node: ir.Node) -> bool:
    domain = node.domain or ""
    if domain in ("", "ai.onnx"):
        return node.op_type not in NO_CUDA_KERNEL
    return domain == "com.microsoft"  # contrib ops: most have CUDA kernels; others are the model's, not ours


def _small_initializer(v: ir.Value) -> bool:
    if v.const_value is None or not v.is_initializer():
        return False
    return int(v.const_value.size) <= SMALL_INITIALIZER


def _low_precision(v: ir.Value) -> bool:
    return v.type is not None and v.dtype in LOW_PRECISION


def predict(model: ir.Model) -> Placement:
    """The nodes of ``model`` (as onnxruntime partitions it: see :func:`onnx_lrp.run.runtime.basic_optimized`) that
    a CUDA session runs on the CPU provider."""
    graph = model.graph
    order = {id(n): i for i, n in enumerate(graph)}
    nodes = list(graph)
    out = Placement(nodes=len(nodes))
    tentative = {id(n) for n in nodes if _has_kernel(n)}
    out.no_kernel = [n.name for n in nodes if id(n) not in tentative]
    inputs = {id(v) for v in graph.inputs}
    host: set[int] = set()  # values in host memory
    queue: list = []

    def push_consumers(v: ir.Value) -> None:
        for use in v.uses():
            if id(use.node) in order:
                heapq.heappush(queue, (order[id(use.node)], id(use.node), use.node))

    for n in nodes:
        if id(n) in tentative:
            for i in CPU_OUTPUTS.get(n.op_type, ()):
                if i < len(n.outputs):
                    host.add(id(n.outputs[i]))
                    push_consumers(n.outputs[i])
    seen: set[int] = set()
    while queue:
        _, key, node = heapq.heappop(queue)
        if key in seen:
            continue
        seen.add(key)
        if key not in tentative:  # runs on the CPU anyway: its outputs are host tensors
            for o in node.outputs:
                host.add(id(o))
                push_consumers(o)
            continue
        if _moves_to_cpu(node, _opset(model, node), host, inputs):
            out.shape_fallback.append(node.name)
            for o in node.outputs:
                host.add(id(o))
                push_consumers(o)
    return out


def _moves_to_cpu(node: ir.Node, opset: int, host: set, graph_inputs: set) -> bool:
    """GetCpuPreferredNodes' test for one candidate node."""
    on_host = cpu_input_indices(node.op_type, opset)
    for i, v in enumerate(node.inputs):
        if v is None:  # an omitted optional input: not a host tensor
            return False
        if _low_precision(v):
            return False
        if _small_initializer(v) or id(v) in graph_inputs:
            continue
        if id(v) not in host or i in on_host:
            return False
    return True


def predict_bytes(model_bytes: bytes, folder=None, optimized: bool = True) -> Placement:
    """:func:`predict` over a serialised model; ``optimized``: over onnxruntime's basic-optimised form of it (the
    graph it partitions), else as written."""
    from .. import load as loader
    from . import runtime

    if optimized:
        model_bytes = runtime.basic_optimized(model_bytes, folder)
    model = loader.deserialize(model_bytes, folder)
    loader.reinfer_shapes(model)  # onnxruntime's optimised model types few of its values: the float16 test needs them
    return predict(model)


__all__ = ["CPU_INPUTS", "CPU_OUTPUTS", "NO_CUDA_KERNEL", "Placement", "cpu_input_indices", "predict",
           "predict_bytes"]
