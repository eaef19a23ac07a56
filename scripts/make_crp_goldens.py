#!/usr/bin/env python
"""Golden zennit-crp (0.6.0, on zennit 0.5.1) references for onnx-lrp's concept relevance (tests/concepts/test_concepts.py).

For torchvision ``vgg16_bn`` and ``resnet18`` with seeded random weights and random BatchNorm statistics (no
downloads; rebuilt from the seed by the test), one 64x64 input (numpy-seeded) and the composite EpsilonPlusFlat
(VGG: SequentialMergeBatchNorm, ResNet: ResNetCanonizer; BN merged exactly as in make_zennit_goldens.py), in float64:

* ``shares``: ``ChannelConcept.attribute`` of the relevance at the conditioned layer (abs_norm);
* ``ep1/...``, ``ep0/...``: ``CondAttribution`` with ``exclude_parallel`` True / False for K concepts (the top
  channels and one two-channel group), start = the target's logit: the heatmaps (summed over colour channels, as
  zennit-crp's ``heatmap``) and the relevance at two recorded layers below;
* ``graph``: ``AttributionGraph`` edges (width [3, 2]) of the top concept;
* ``relmax/...``: ``Maximization("relevance", "sum", abs_norm=True)`` over 24 numpy-seeded inputs with seeded labels
  (batches of 8): the reference sample indices, scores and receptive-field neurons per channel, and the
  receptive-field heatmaps (``ChannelConcept.mask_rf``, started at the layer's activation) of 3 channels' top sample.

Usage: ``python scripts/make_crp_goldens.py [--models vgg16_bn,resnet18]`` (needs torch, torchvision, zennit 0.5.1
and zennit-crp 0.6.0, which pins zennit <= 0.4.6: install it with ``pip install --no-deps zennit-crp==0.6.0 tqdm``).
Writes ``tests/goldens/crp/<model>.npz`` and the exported ONNX is NOT stored (the test re-exports from the seed).
"""
from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from make_zennit_goldens import export, randomise_batchnorm  # noqa: E402 (also makes BN merging exact)

OUT = ROOT / "tests" / "goldens" / "crp"
SIZE = 64
MODELS = {
    # name: (torch seed, conditioned layer, recorded layers below it, graph root layer)
    "vgg16_bn": (11, "features.37", ("features.34", "features.27"), "features.34"),
    "resnet18": (12, "layer2.1.conv1", ("layer2.0.conv2", "layer1.1.conv1"), "layer2.0.conv2"),
}
N_DATA, DATA_BATCH, RELMAX_SHOW = 24, 8, 3


def build(name: str):
    """(float32 eval model, canonizer factory) from the seed."""
    import torchvision
    from zennit.torchvision import ResNetCanonizer, VGGCanonizer

    torch.manual_seed(MODELS[name][0])
    m = getattr(torchvision.models, name)(weights=None)
    if name.startswith("vgg"):  # at 64x64 the features end 2x2, and the TorchScript exporter cannot write the
        # 7x7 adaptive pool of a 2x2 map: pool to 1x1 and size the classifier's first layer for it (a smaller CI)
        m.avgpool = torch.nn.AdaptiveAvgPool2d(1)
        m.classifier[0] = torch.nn.Linear(512, 4096)
    randomise_batchnorm(m, seed=MODELS[name][0] + 100)
    return m.eval(), (lambda: [VGGCanonizer()]) if name.startswith("vgg") else (lambda: [ResNetCanonizer()])


def module_of(node_name: str) -> str:
    """The module path of a TorchScript-exported node: '/layer1/layer1.0/conv1/Conv' -> 'layer1.0.conv1'."""
    path = ""
    for seg in node_name.strip("/").split("/")[:-1]:
        path = seg if not path or seg.startswith(path + ".") else f"{path}.{seg}"
    return path


def onnx_names(onnx_bytes: bytes) -> dict:
    """Module name -> the ONNX tensor its Conv writes (BN folded by the exporter: the Conv+BN output)."""
    import onnx

    proto = onnx.load_from_string(onnx_bytes)
    return {module_of(n.name): n.output[0] for n in proto.graph.node if n.op_type == "Conv"}


def data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, SIZE, SIZE)).astype(np.float32), rng.integers(0, 1000, n)


def concept_groups(shares: np.ndarray) -> list[list[int]]:
    top = [int(c) for c in np.argsort(-shares, kind="stable")[:3]]
    return [[c] for c in top] + [[int(np.argsort(-shares, kind="stable")[5]), int(np.argmin(shares))]]


def reference(name: str) -> dict:
    from crp.attribution import AttributionGraph, CondAttribution
    from crp.concepts import ChannelConcept
    from crp.graph import trace_model_graph
    from crp.maximization import Maximization
    from zennit.composites import EpsilonPlusFlat

    seed, layer, record, root = MODELS[name]
    model, canon = build(name)
    x, _ = data(1, seed)
    names = onnx_names(export(model, torch.from_numpy(x), "torchscript"))
    ref = copy.deepcopy(model).double().eval()
    comp = lambda: EpsilonPlusFlat(canonizers=canon())  # noqa: E731
    attr = CondAttribution(ref, no_param_grad=True)
    cc = ChannelConcept()
    xt = torch.from_numpy(x).double()
    with torch.no_grad():
        logits = ref(xt).numpy()
    t = int(np.argmax(logits[0]))
    out = {"x": x, "target": np.array(t), "logits": logits.astype(np.float32)}
    res = attr(xt.clone().requires_grad_(True), [{"y": [t]}], comp(), record_layer=[layer])
    shares = cc.attribute(res.relevances[layer], abs_norm=True)[0].numpy()
    out["shares"] = shares
    groups = concept_groups(shares)
    out["concepts"] = np.array([g + [-1] * (2 - len(g)) for g in groups])
    for ep in (True, False):
        conds = [{layer: g, "y": [t]} for g in groups]
        res = attr(xt.clone().requires_grad_(True), conds, comp(), record_layer=list(record), exclude_parallel=ep)
        out[f"ep{int(ep)}/heatmap"] = res.heatmap.numpy()
        for r in record:
            out[f"ep{int(ep)}/{r}"] = res.relevances[r].numpy().astype(np.float32)
    # attribution graph of the root layer's top concept
    conv_names = [n for n, mod in ref.named_modules() if isinstance(mod, torch.nn.Conv2d)]
    graph = trace_model_graph(ref, xt, conv_names)
    ag = AttributionGraph(attr, graph, {n: ChannelConcept() for n in conv_names})
    res = attr(xt.clone().requires_grad_(True), [{"y": [t]}], comp(), record_layer=[root])
    root_c = int(np.argmax(cc.attribute(res.relevances[root], abs_norm=True)[0].numpy()))
    _, conns = ag(xt.clone().requires_grad_(True), comp(), root_c, root, t, width=[3, 2], abs_norm=True,
                  verbose=False, batch_size=8)
    edges = [[names[s[0]], s[1], names[d[0]], d[1], d[2]] for s, ds in conns.items() for d in ds]
    # RelMax over a small seeded dataset (labels as targets, as FeatureVisualization.run does)
    xs, labels = data(N_DATA, seed + 1)
    rm = Maximization("relevance", "sum", abs_norm=True, path=str(Path("/tmp") / f"crp_relmax_{name}"))
    for lo in range(0, N_DATA, DATA_BATCH):
        batch = torch.from_numpy(xs[lo:lo + DATA_BATCH]).double().requires_grad_(True)
        res = attr(batch, [{"y": [int(c)]} for c in labels[lo:lo + DATA_BATCH]], comp(), record_layer=[layer],
                   exclude_parallel=False)
        rm.analyze_layer(res.relevances[layer], cc, layer, np.arange(lo, lo + len(batch)), labels[lo:lo + len(batch)])
    out["relmax/data"] = rm.d_c_sorted[layer].numpy()
    out["relmax/rel"] = rm.rel_c_sorted[layer].numpy()
    out["relmax/rf"] = rm.rf_c_sorted[layer].numpy()
    chans = [int(c) for c in groups[0][:1] + groups[1][:1] + groups[2][:1]][:RELMAX_SHOW]
    heat = []
    for c in chans:
        s, n = int(out["relmax/data"][0, c]), int(out["relmax/rf"][0, c])
        sample = torch.from_numpy(xs[s:s + 1]).double().requires_grad_(True)
        res = attr(sample, [{layer: {c: [n]}}], comp(), mask_map=ChannelConcept.mask_rf, start_layer=layer,
                   exclude_parallel=False)
        heat.append(res.heatmap.numpy()[0])
    out["relmax/show"] = np.array(chans)
    out["relmax/heatmaps"] = np.array(heat)
    meta = {"model": name, "seed": seed, "size": SIZE, "layer": names[layer], "module": layer,
            "record": [names[r] for r in record], "record_modules": list(record), "graph_root": names[root],
            "graph_concept": root_c, "graph_width": [3, 2], "edges": edges, "composite": "epsilon-plus-flat",
            "n_data": N_DATA, "data_seed": seed + 1, "zennit": importlib.metadata.version("zennit"),
            "zennit-crp": importlib.metadata.version("zennit-crp"), "torch": torch.__version__,
            "made_by": "scripts/make_crp_goldens.py"}
    out["meta"] = np.array(json.dumps(meta))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        arrays = reference(name)
        np.savez_compressed(OUT / f"{name}.npz", **arrays)
        print(f"{name}: {(OUT / f'{name}.npz').stat().st_size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
