"""The README's "Is the explanation faithful?" table and docs/faithfulness.png: AOPC / ABPC of every built-in CNN
composite against the seeded random order, on the demo model (trained) and on a torchvision ResNet18 with seeded
random weights (untrained: its figures say little about the composites, only that the check runs at that size).

    .venv/bin/python scripts/faithfulness_table.py [--items 100] [--resnet-items 4] [--skip-resnet]

Prints the markdown table and writes docs/faithfulness.png (mean MoRF curves per composite beside the random
order, both models) and docs/faithfulness.json (every figure).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnx_lrp  # noqa: E402
from onnx_lrp.cli.curves import line_plot  # noqa: E402

COLORS = [(200, 30, 30), (30, 90, 200), (20, 140, 60), (150, 60, 190), (225, 130, 0), (0, 150, 160)]
COMPOSITES = ["epsilon", "epsilon-plus", "epsilon-plus-flat", "epsilon-gamma-box", "epsilon-alpha2-beta1",
              "epsilon-alpha2-beta1-flat"]


def demo_inputs(n):
    data = np.load(ROOT / "models" / "digits_heldout.npz")
    return data["images"][:n].astype(np.float32) / 255


def resnet18(path: Path, size: int):
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    torch.onnx.export(model, torch.randn(1, 3, size, size), str(path), input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}}, opset_version=17, dynamo=False)


def resnet_inputs(n, size):
    """Smooth random images (low-frequency noise upsampled), normalised like ImageNet inputs."""
    rng = np.random.default_rng(0)
    small = rng.standard_normal((n, 3, size // 16, size // 16)).astype(np.float32)
    return np.repeat(np.repeat(small, 16, axis=2), 16, axis=3)


def run(model, x, patch, steps, bounds, randomise=False):
    rows, curves = [], {}
    for comp in COMPOSITES:
        kw = dict(low=bounds[0], high=bounds[1]) if comp == "epsilon-gamma-box" else {}
        t0 = time.perf_counter()
        ev = onnx_lrp.evaluate(model, x, metric="region-perturbation", composite=comp, patch=patch, steps=steps, **kw)
        s = ev.summary()
        row = dict(composite=comp, aopc_morf=s["aopc/morf"], aopc_lerf=s["aopc/lerf"], abpc=s["abpc"],
                   aopc_random=s["aopc/random"], beats_random=s["beats_random"], seconds=time.perf_counter() - t0)
        if randomise:
            rv = onnx_lrp.evaluate(model, x[:16], metric="randomisation", composite=comp, seed=0, **kw)
            row.update(spearman_random=rv.mean("spearman/last"), emprt=rv.mean("emprt"))
        rows.append(row)
        curves[comp] = ev.curves["morf"].mean(axis=0).tolist()
        random_curve = ev.curves["random"].mean(axis=0).tolist()
        print(f"  {comp}: {json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})}",
              file=sys.stderr)
    curves["random order"] = random_curve
    return rows, curves


def table(rows, randomise=False):
    head = "| composite | AOPC MoRF | AOPC LeRF | ABPC | AOPC random order | beats random |"
    sep = "| --- | ---: | ---: | ---: | ---: | --- |"
    if randomise:
        head += " Spearman, all weights random | eMPRT |"
        sep += " ---: | ---: |"
    best = max(rows, key=lambda r: r["abpc"])
    best = best["composite"] if best["beats_random"] else None  # no winner where nothing beats the floor
    lines = [head, sep]
    for r in rows:
        name = f"**{r['composite']}**" if r["composite"] == best else r["composite"]
        line = (f"| {name} | {r['aopc_morf']:.3f} | {r['aopc_lerf']:.3f} | {r['abpc']:.3f} | {r['aopc_random']:.3f} "
                f"| {'yes' if r['beats_random'] else 'no'} |")
        if randomise:
            line += f" {r['spearman_random']:.3f} | {r['emprt']:.3f} |"
        lines.append(line)
    return "\n".join(lines)


def panel(curves, title, xlabel):
    series = [dict(y=c, label=name, color=COLORS[i % len(COLORS)] if name != "random order" else (110, 110, 110),
                   dashed=name == "random order") for i, (name, c) in enumerate(curves.items())]
    return line_plot(series, title, xlabel, "softmax of the target (mean)", size=(620, 400))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--resnet-items", type=int, default=4)
    ap.add_argument("--resnet-size", type=int, default=224)
    ap.add_argument("--skip-resnet", action="store_true")
    args = ap.parse_args()
    out = {}
    print(f"demo model, {args.items} held-out digits, patch 2, 64 regions", file=sys.stderr)
    demo_rows, demo_curves = run(str(ROOT / "models" / "digits_cnn.onnx"), demo_inputs(args.items), 2, 64, (0.0, 1.0),
                                 randomise=True)
    out["demo"] = dict(rows=demo_rows, curves=demo_curves)
    print(table(demo_rows, randomise=True))
    panels = [panel(demo_curves, f"demo model ({args.items} digits): MoRF per composite", "2x2 regions replaced")]
    if not args.skip_resnet:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "resnet18.onnx"
            resnet18(path, args.resnet_size)
            x = resnet_inputs(args.resnet_items, args.resnet_size)
            print(f"ResNet18 (random weights), {args.resnet_items} images {args.resnet_size}^2, patch 16, 49 regions",
                  file=sys.stderr)
            rn_rows, rn_curves = run(str(path), x, 16, 49, (float(x.min()), float(x.max())))
        out["resnet18"] = dict(rows=rn_rows, curves=rn_curves)
        print()
        print(table(rn_rows))
        panels.append(panel(rn_curves, f"ResNet18, random weights ({args.resnet_items} images)",
                            "16x16 regions replaced"))
    from PIL import Image

    w = sum(p.width for p in panels)
    img = Image.new("RGB", (w, max(p.height for p in panels)), "white")
    x0 = 0
    for p in panels:
        img.paste(p, (x0, 0))
        x0 += p.width
    img.save(ROOT / "docs" / "faithfulness.png", optimize=True)
    (ROOT / "docs" / "faithfulness.json").write_text(json.dumps(out, indent=1) + "\n")
    print("wrote docs/faithfulness.png, docs/faithfulness.json", file=sys.stderr)


if __name__ == "__main__":
    main()
