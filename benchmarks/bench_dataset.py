"""Items per second when explaining a dataset of image files: a plain loop vs the local engine vs Ray.

For each model it prints, on this machine, the best of --repeat interleaved rounds (the machine is shared: the
best round is the least disturbed one; the load average is printed before and after):
  decode        reading + decoding + preprocessing the files alone (onnx_lrp/inputs.py's load_image, one thread)
  explain       Explainer.explain alone on the decoded batches
  loop          a plain loop: per batch decode the files (load_image), Explainer.explain, np.savez the result
  local         onnx_lrp.explain_dataset(engine="local") (decode and write overlap with the onnxruntime run)
  ray (start)   engine="ray" on a local Ray cluster (ray.init(num_cpus=CPUs) before timing): seconds until the
                first shard is written (actor processes, imports, sessions, the first shard)
  ray (steady)  the items after the first shard over the time after it: the engine's throughput
  ray (total)   the whole run, start included
and the ratios to the loop (goal: >= 0.9). Overlap shows as local ~ max(decode, explain) rather than the sum.

    python benchmarks/bench_dataset.py [--models resnet18,digits] [--items 96,2000] [--repeat 3] [--no-ray]

Models: ResNet18 (torchvision, random weights, exported to ONNX; needs torch + torchvision) on 224x224 JPEG files
generated into /tmp (smooth random images, 256x256, resized by the reader), and models/digits_cnn.onnx on its
held-out images written as PNG files. Run it when the machine is quiet and say so (and the load) with the numbers.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def build_resnet18(path: Path) -> Path:
    if path.exists():
        return path
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    torch.onnx.export(model, torch.zeros(1, 3, 224, 224), str(path), opset_version=17, dynamo=False,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})
    return path


def make_jpegs(folder: Path, n: int, size: int = 256) -> Path:
    from PIL import Image

    if folder.exists() and len(list(folder.glob("*.jpg"))) == n:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        small = rng.uniform(0, 255, size=(16, 16, 3)).astype(np.uint8)  # smooth, photo-like after upsampling
        im = Image.fromarray(small).resize((size, size), Image.Resampling.BICUBIC)
        im.save(folder / f"img{i:06d}.jpg", quality=90)
    return folder


def make_pngs(folder: Path, n: int) -> Path:
    from PIL import Image

    if folder.exists() and len(list(folder.glob("*.png"))) == n:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with np.load(ROOT / "models" / "digits_heldout.npz") as z:
        images = z["images"]
    for i in range(n):
        Image.fromarray(images[i % len(images), 0]).save(folder / f"d{i:06d}.png")
    return folder


def run(name, model, folder, batch, shard, pre, engines, workers, repeat):
    import onnx_lrp
    from onnx_lrp.io.inputs import Preprocess, image_layout, input_infos, load_image

    ex = onnx_lrp.Explainer(model)
    files = sorted(folder.iterdir())
    n = len(files)
    prep = Preprocess(None, pre["mean"], pre["std"])
    layout = image_layout(input_infos(ex.inputs)[0])
    ex.explain(np.stack([load_image(f, layout, prep)[0] for f in files[:batch]]))  # warm-up
    out = Path(tempfile.mkdtemp(prefix="bench_dataset_"))
    times: dict[str, list[float]] = {}

    def note(label, t):
        times.setdefault(label, []).append(t)

    for r in range(repeat):
        t0 = time.perf_counter()
        decoded = [np.stack([load_image(f, layout, prep)[0] for f in files[lo:lo + batch]])
                   for lo in range(0, n, batch)]
        note("decode", time.perf_counter() - t0)
        t0 = time.perf_counter()
        for x in decoded:
            ex.explain(x)
        note("explain", time.perf_counter() - t0)
        del decoded
        t0 = time.perf_counter()
        for k, lo in enumerate(range(0, n, batch)):
            x = np.stack([load_image(f, layout, prep)[0] for f in files[lo:lo + batch]])
            e = ex.explain(x)
            np.savez(out / f"loop{k:05d}.npz", relevance=e.relevance, targets=e.target)
        note("loop", time.perf_counter() - t0)
        for engine in engines:
            t0 = time.perf_counter()
            s = onnx_lrp.explain_dataset(model, folder, out / f"{engine}{r}", engine=engine, batch_size=batch,
                                         shard_size=shard, workers=workers, mean=pre["mean"], std=pre["std"],
                                         explainer=ex if engine == "local" else None)
            t = time.perf_counter() - t0
            assert s["explained"] == n, s
            shutil.rmtree(out / f"{engine}{r}")
            if engine == "local":
                note("local", t)
            else:  # steady state: the items after the first shard over the time after it
                note("ray (start)", s["first_shard_s"])
                note("ray (steady)", (t - s["first_shard_s"]) * n / (n - min(shard, n)) if n > shard else t)
                note("ray (total)", t)
    shutil.rmtree(out, ignore_errors=True)
    best = {k: min(v) for k, v in times.items()}
    print(f"\n{name}: {n} files, batch {batch}, shard {shard}, {os.cpu_count()} CPUs, best of {repeat}")
    print(f"{'':13s} {'seconds':>8s} {'items/s':>8s} {'ms/item':>8s} {'vs loop':>8s}   all rounds (s)")
    for label, t in best.items():
        ratio = f"{best['loop'] / t:8.2f}" if label in ("local", "ray (steady)", "ray (total)") else " " * 8
        per = "" if label == "ray (start)" else f"{n / t:8.1f} {1000 * t / n:8.2f}"
        print(f"{label:13s} {t:8.2f} {per or ' ' * 17} {ratio}   {' '.join(f'{v:.2f}' for v in times[label])}")
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet18,digits")
    ap.add_argument("--items", default="96,2000", help="files per model, in --models order")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds; the best is printed")
    args = ap.parse_args(argv)
    engines = ["local"] + ([] if args.no_ray else ["ray"])
    if "ray" in engines:
        import ray
        t0 = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        print(f"ray.init (local cluster): {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    tmp = Path(tempfile.gettempdir()) / "onnx_lrp_bench_dataset"
    tmp.mkdir(exist_ok=True)
    for name, n in zip(args.models.split(","), map(int, args.items.split(","))):
        if name == "resnet18":
            model = build_resnet18(tmp / "resnet18.onnx")
            run(name, model, make_jpegs(tmp / f"jpeg{n}", n), 16, 16, IMAGENET, engines, args.workers, args.repeat)
        elif name == "digits":
            run(name, ROOT / "models" / "digits_cnn.onnx", make_pngs(tmp / f"png{n}", n), 64, 128,
                dict(mean=(0.0,), std=(1.0,)), engines, args.workers, args.repeat)
        else:
            raise SystemExit(f"unknown model {name}")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
