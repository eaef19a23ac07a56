"""The model families the suite explains, each as one small committed model with its composite and an input: the
list that the CUDA-safety test (test_cuda_safe.py), the CUDA parity tests (test_cuda.py) and the GPU check
(scripts/gpu_check.py) walk. Inputs come from the goldens next to each model (the LXT / zennit references of the
other tests), so every family here is one those tests already hold to a reference on CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

GOLDENS = Path(__file__).parent / "goldens"
ROOT = Path(__file__).parent.parent


@dataclass(frozen=True)
class Family:
    name: str
    model: Path
    composite: str
    golden: Path  # .npz holding the input
    keys: tuple  # (input name, key in the golden) pairs
    batch_axis: bool = True  # False: the golden holds one item without its batch axis
    items: int | None = None  # the first items only
    scale: float | None = None  # integer pixels -> float32 * scale
    bounds: tuple | None = None  # (low, high) for the composites with a ZBox

    def params(self) -> dict:
        return {"low": self.bounds[0], "high": self.bounds[1]} if self.bounds else {}

    def explainer(self, **kw):
        import onnx_lrp

        return onnx_lrp.Explainer(self.model, composite=self.composite, **self.params(), **kw)

    def feeds(self) -> dict:
        out = {}
        with np.load(self.golden) as g:
            for name, key in self.keys:
                a = g[key] if self.batch_axis else g[key][None]
                a = a[: self.items] if self.items else a
                out[name] = (a.astype(np.float32) * self.scale) if self.scale else a
        return out


T = GOLDENS / "transformers"
FAMILIES = [
    Family("bert", T / "bert_ids_torchscript.onnx", "attnlrp", T / "bert.npz",
           (("input_ids", "input_ids"), ("attention_mask", "attention_mask"))),
    Family("bert-embeds-dynamic", T / "bert_embeds_torchscriptdyn.onnx", "attnlrp", T / "bert.npz",
           (("embeds", "embeds"), ("attention_mask", "attention_mask"))),
    Family("bert-opset14", T / "bert_embeds_torchscript14.onnx", "attnlrp", T / "bert.npz",
           (("embeds", "embeds"), ("attention_mask", "attention_mask"))),
    Family("gpt2", T / "gpt2_ids_torchscript.onnx", "attnlrp", T / "gpt2.npz", (("input_ids", "input_ids"),)),
    Family("gpt2-dynamo", T / "gpt2_embeds_dynamo.onnx", "attnlrp", T / "gpt2.npz", (("embeds", "embeds"),)),
    Family("llama", T / "llama_ids_torchscript.onnx", "attnlrp", T / "llama.npz", (("input_ids", "input_ids"),)),
    Family("llama-dynamo", T / "llama_embeds_dynamo.onnx", "attnlrp", T / "llama.npz", (("embeds", "embeds"),)),
    Family("vit", T / "vit_image_torchscript.onnx", "cp-lrp", T / "vit.npz", (("image", "image"),)),
    Family("vit-hf-fused", GOLDENS / "fused" / "vit_hf426.onnx", "attnlrp", T / "vit.npz", (("image", "image"),)),
    Family("whisper-encoder", T / "whisper_encoder_torchscript.onnx", "attnlrp", T / "whisper_encoder.npz",
           (("input_features", "input_features"),)),
    Family("mixtral", GOLDENS / "moe" / "mixtral_embeds_torchscript17.onnx", "attnlrp",
           GOLDENS / "moe" / "mixtral.npz", (("embeds", "embeds"),), batch_axis=False),
    Family("resnet-epf", GOLDENS / "twins" / "resnet_torch.onnx", "epsilon-plus-flat", GOLDENS / "twins" / "resnet.npz",
           (("x", "x"),)),
    Family("resnet-egb", GOLDENS / "twins" / "resnet_torch.onnx", "epsilon-gamma-box", GOLDENS / "twins" / "resnet.npz",
           (("x", "x"),), bounds=(-3.0, 3.0)),
    Family("mobilenet-egb", GOLDENS / "twins" / "mobilenet_torch.onnx", "epsilon-gamma-box",
           GOLDENS / "twins" / "mobilenet.npz", (("x", "x"),), bounds=(-3.0, 3.0)),
    Family("small-cnn-epf", GOLDENS / "small_cnn_torchscript.onnx", "epsilon-plus-flat", GOLDENS / "small_cnn.npz",
           (("x", "x"),)),
    Family("selection-cnn", GOLDENS / "selection_cnn_torchscript.onnx", "epsilon-plus-flat",
           GOLDENS / "selection_cnn.npz", (("x", "x"),)),
    Family("digits-cnn", ROOT / "models" / "digits_cnn.onnx", "epsilon-gamma-box",
           ROOT / "models" / "digits_heldout.npz", (("image", "images"),), items=8, scale=1 / 255,
           bounds=(0.0, 1.0)),
]


# ------------------------------------------------------------------------------------------ CUDA safety
# Optional outputs the relevance graph may read: onnxruntime computes them on every provider and none of its graph
# transformers rewrites a node that has them (its NCHWc transformer bails out on a MaxPool with Indices; no CUDA
# fusion takes a MaxPool).
KEPT_OPTIONAL = {("MaxPool", 1)}
# Outputs beyond the first that onnxruntime's CUDA kernels of its fused contrib ops compute (the others, e.g.
# SkipLayerNormalization's mean / inv_std_var, they leave unwritten).
CUDA_FUSED_OUTPUTS = {("SkipLayerNormalization", 3), ("SkipSimplifiedLayerNormalization", 3),
                      ("EmbedLayerNormalization", 1), ("EmbedLayerNormalization", 2), ("Attention", 1)}


def _consumers(graph) -> dict:
    uses = {}
    for node in graph.node:
        for name in node.input:
            if name:
                uses.setdefault(name, []).append(node)
    return uses


def optional_reads(model) -> list[str]:
    """Forward nodes whose optional outputs (by the ONNX schema) the relevance graph reads: a fusion may take such
    a node into a fused op that leaves them unwritten (SkipLayerNormalization on CUDA drops LayerNormalization's
    Mean / InvStdDev). One line per problem."""
    import onnx

    opset = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    uses = _consumers(model.graph)
    out = []
    for node in model.graph.node:
        if node.name.startswith("lrp/"):
            continue
        for i, name in enumerate(node.output):
            readers = [n.name for n in uses.get(name, []) if n.name.startswith("lrp/")]
            if i == 0 or not name or not readers or (node.op_type, i) in KEPT_OPTIONAL:
                continue
            domain = node.domain or "ai.onnx"
            try:
                schema = onnx.defs.get_schema(node.op_type, opset.get(domain, 1), "" if domain == "ai.onnx"
                                              else domain)
            except Exception:  # a contrib op: any output beyond the first is at the mercy of its kernel
                out.append(f"{node.name} ({node.op_type}) output {i} read by {readers[0]}")
                continue
            formal = schema.outputs[min(i, len(schema.outputs) - 1)]
            if formal.option == onnx.defs.OpSchema.FormalParameterOption.Optional:
                out.append(f"{node.name} ({node.op_type}) optional output {i} read by {readers[0]}")
    return out


def fused_dropped_reads(optimized) -> list[str]:
    """In onnxruntime's optimised model: outputs of its fused contrib ops (com.microsoft) that some node reads and
    that the CUDA kernels of those ops do not compute."""
    uses = {k: [n.name for n in v] for k, v in _consumers(optimized.graph).items()}
    for o in optimized.graph.output:
        uses.setdefault(o.name, []).append("the graph's outputs")
    out = []
    for node in optimized.graph.node:
        if node.domain != "com.microsoft":
            continue
        for i, name in enumerate(node.output):
            if i and name and uses.get(name) and (node.op_type, i) not in CUDA_FUSED_OUTPUTS:
                out.append(f"{node.name} ({node.op_type}) output {i} read by {uses[name][0]}")
    return out
