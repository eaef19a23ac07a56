"""The GPU check's Python parts (scripts/gpu_check.sh runs them in order): each prints a table and appends its rows
as JSON lines to $OUT/results.jsonl.

    python scripts/gpu_check.py sweep  [--device cuda|cpu] [--quick]   # every family: CUDA vs CPU, TF32 off / on
    python scripts/gpu_check.py bert   [--device cuda|cpu] [--quick]   # BERT-base attnlrp: times, drift, torch floor
    python scripts/gpu_check.py fullsize [--device cuda|cpu] [--quick] # ResNet50, VGG16: CUDA vs CPU, TF32 off / on
    python scripts/gpu_check.py engine [--device cuda|cpu] [--quick]   # ResNet50 EPF: CLI, dataset engine, images/s
    python scripts/gpu_check.py precision [--device cuda|cpu] [--quick] # float16 / bfloat16 in the model's precision
    python scripts/gpu_check.py profile                                 # the worst bench_cnn row's profile -> $OUT
    python scripts/gpu_check.py summary                                 # the steps and the goals, one table

``--device cpu`` runs every part with the CPU provider in place of CUDA (a dry run on a machine without a GPU);
``--quick`` shrinks the models and batches for that dry run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from timing import best, best_pair as pair  # noqa: E402

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]
OUT = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu-check-"))


def record(part: str, **row) -> None:
    with open(OUT / "results.jsonl", "a") as f:
        f.write(json.dumps(dict(part=part, **row)) + "\n")


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def first(rel):
    return next(iter(rel.values())) if isinstance(rel, dict) else rel


def plain_session(path, device: str, tf32: bool):
    import onnxruntime as ort

    from onnx_lrp.run import runtime
    providers = ["CPUExecutionProvider"]
    if device == "cuda":
        runtime.preload_cuda()
        providers = [("CUDAExecutionProvider", runtime.cuda_options(tf32))] + providers
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=providers)


# ---------------------------------------------------------------------------------------------- sweep
def sweep(args) -> None:
    from families import FAMILIES

    print(f"{'family':22s} {'composite':18s} {'cpu ms':>8s} {'dev ms':>8s} {'tf32 ms':>8s} {'rel-L2':>9s} "
          f"{'rel-L2 tf32':>11s}", flush=True)
    for fam in FAMILIES:
        row = dict(family=fam.name, composite=fam.composite)
        try:
            feeds = fam.feeds()
            cpu = fam.explainer()
            ref = cpu.explain(feeds)
            row["cpu_ms"] = 1e3 * best(lambda: cpu.explain(feeds, target=ref.target), 3)
            for tf32, key in ((False, "dev"), (True, "tf32")):
                ex = fam.explainer(device=args.device, tf32=tf32)
                row["provider"] = ex.session.providers[0]
                res = ex.explain(feeds, target=ref.target)
                row[f"{key}_rel_l2"] = rel_l2(first(res.relevance), first(ref.relevance))
                row[f"{key}_finite"] = bool(np.all(np.isfinite(first(res.relevance))))
                row[f"{key}_ms"] = 1e3 * best(lambda: ex.explain(feeds, target=ref.target), 5)
            print(f"{fam.name:22s} {fam.composite:18s} {row['cpu_ms']:8.2f} {row['dev_ms']:8.2f} "
                  f"{row['tf32_ms']:8.2f} {row['dev_rel_l2']:9.2e} {row['tf32_rel_l2']:11.2e}", flush=True)
        except Exception as exc:  # one failing family must not hide the others
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            print(f"{fam.name:22s} FAILED {row['error']}", flush=True)
        record("sweep", **row)


# ---------------------------------------------------------------------------------------------- BERT
def export_bert(path: Path, layers: int, seq: int):
    """transformers' BertForSequenceClassification (random weights, eager attention) with the embeddings as input
    and a dynamic batch axis, exported by torch.onnx's TorchScript exporter (opset 17): the export whose
    Add + LayerNormalization onnxruntime fuses into SkipLayerNormalization. Returns the torch model."""
    import torch
    from transformers import BertConfig
    from transformers.models.bert import modeling_bert

    cfg = BertConfig(num_hidden_layers=layers, attn_implementation="eager", num_labels=2)
    torch.manual_seed(0)
    model = modeling_bert.BertForSequenceClassification(cfg).eval()

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, e):
            return self.m(inputs_embeds=e).logits

    x = torch.randn(1, seq, cfg.hidden_size)
    torch.onnx.export(M(), (x,), str(path), dynamo=False, input_names=["embeds"], output_names=["logits"],
                      opset_version=17, dynamic_axes={"embeds": {0: "batch"}, "logits": {0: "batch"}})
    return M()


def torch_floor(model, x, device: str, repeat: int = 5) -> float | None:
    """PyTorch's forward + backward of the same model (the floor of any autograd method, LXT included)."""
    import torch
    if device != "cuda" or not torch.cuda.is_available():
        return None
    m = model.cuda()
    xt = torch.from_numpy(x).cuda().requires_grad_(True)

    def run():
        xt.grad = None
        y = m(xt)
        y[:, 0].sum().backward()
        torch.cuda.synchronize()
    t = best(run, repeat)
    model.cpu()
    return t


def bert(args) -> None:
    import onnx_lrp

    layers, seq = (2, 32) if args.quick else (12, 128)
    batches = (1, 4) if args.quick else (1, 16)
    path = OUT / "bert.onnx" if args.keep else Path(tempfile.mkdtemp()) / "bert.onnx"
    try:
        model = export_bert(path, layers, seq)
    except Exception as exc:  # transformers / torch.onnx of another version: the same shape by onnx.helper, batch 1
        from bench_transformer import build_helper_bert
        print(f"transformers export failed ({str(exc).splitlines()[0][:200]}); onnx.helper BERT, batch 1 only")
        build_helper_bert(path, layers, seq)
        model, batches = None, (1,)
    rng = np.random.default_rng(0)
    xs = {b: rng.standard_normal((b, seq, 768)).astype(np.float32) for b in batches}
    ref = onnx_lrp.Explainer(path, composite="attnlrp").explain(xs[1])
    print(f"BERT-base shape: {layers} layers, sequence {seq}; attnlrp; device {args.device}", flush=True)
    print(f"{'tf32':5s} {'batch':>5s} {'forward ms':>10s} {'explain ms':>10s} {'x fwd':>6s} {'rel-L2 b1':>10s}",
          flush=True)
    for tf32 in (False, True):
        try:
            ex = onnx_lrp.Explainer(path, composite="attnlrp", device=args.device, tf32=tf32)
            err = rel_l2(first(ex.explain(xs[1]).relevance), first(ref.relevance))
            sess = plain_session(path, args.device, tf32)
            for b in batches:
                t_fwd, t_exp = pair(lambda: sess.run(None, {"embeds": xs[b]}), lambda: ex.explain(xs[b]))
                print(f"{str(tf32):5s} {b:5d} {1e3 * t_fwd:10.2f} {1e3 * t_exp:10.2f} {t_exp / t_fwd:6.2f} "
                      f"{err:10.2e}", flush=True)
                record("bert", tf32=tf32, batch=b, forward_ms=1e3 * t_fwd, explain_ms=1e3 * t_exp, rel_l2_b1=err,
                       provider=ex.session.providers[0])
        except Exception as exc:
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            print(f"tf32={tf32} FAILED {msg}", flush=True)
            record("bert", tf32=tf32, error=msg)
    for b in batches if model is not None else ():
        try:
            t = torch_floor(model, xs[b], args.device)
        except Exception as exc:
            t, msg = None, str(exc).splitlines()[0][:200]
            print(f"torch floor b{b} FAILED {msg}", flush=True)
        if t is not None:
            print(f"PyTorch forward + backward b{b}: {1e3 * t:.2f} ms (TF32 as torch's default)", flush=True)
            record("bert", torch_fwd_bwd_ms=1e3 * t, batch=b)


# ---------------------------------------------------------------------------------------------- full size
def fullsize(args) -> None:
    """torchvision's ResNet50 and VGG16 (random weights, 224 x 224, batch 4): relevance on the device vs the CPU,
    TF32 off and on, for epsilon-plus-flat and epsilon-gamma-box."""
    import onnx_lrp
    from bench_cnn import build

    archs, size, batch = (("resnet18",), 64, 2) if args.quick else (("resnet50", "vgg16"), 224, 4)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-full-"))
    x = np.random.default_rng(1).standard_normal((batch, 3, size, size)).astype(np.float32)
    print(f"{'model':10s} {'composite':18s} {'rel-L2 TF32 off':>15s} {'rel-L2 TF32 on':>15s}", flush=True)
    for arch in archs:
        path = tmp / f"{arch}.onnx"
        build(arch, str(path), size)
        for comp in ("epsilon-plus-flat", "epsilon-gamma-box"):
            box = {"low": -3.0, "high": 3.0} if comp == "epsilon-gamma-box" else {}
            ref = onnx_lrp.Explainer(path, composite=comp, **box).explain(x)
            errs = []
            for tf32 in (False, True):
                res = onnx_lrp.Explainer(path, composite=comp, device=args.device, tf32=tf32, **box).explain(
                    x, target=ref.target)
                errs.append(rel_l2(res.relevance, ref.relevance))
            print(f"{arch:10s} {comp:18s} {errs[0]:15.2e} {errs[1]:15.2e}", flush=True)
            record("fullsize", arch=arch, composite=comp, batch=batch, rel_l2=errs[0], rel_l2_tf32=errs[1])
    shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- engines
def cli_cmd() -> list[str]:
    exe = shutil.which("onnx-lrp")
    return [exe] if exe else [sys.executable, "-c", "from onnx_lrp.cli.main import main; main()"]


def engine(args) -> None:
    import onnx_lrp
    from bench_cnn import build

    arch, size = ("resnet18", 64) if args.quick else ("resnet50", 224)
    n, batch = (16, 8) if args.quick else (args.items, args.batch)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-engine-"))
    path = tmp / f"{arch}.onnx"
    build(arch, str(path), size)
    x = np.random.default_rng(0).standard_normal((n, 3, size, size)).astype(np.float32)
    np.save(tmp / "x.npy", x)
    np.save(tmp / "x4.npy", x[:4])

    # the API and onnxruntime's forward at this batch, images per second
    ex = onnx_lrp.Explainer(path, composite="epsilon-plus-flat", device=args.device)
    sess = plain_session(path, args.device, False)
    xb = x[:batch]
    t_fwd, t_exp = pair(lambda: sess.run(None, {"x": xb}), lambda: ex.explain(xb), 5)
    print(f"{arch} EPF b{batch} ({args.device}): forward {batch / t_fwd:.0f} img/s, explain (API) "
          f"{batch / t_exp:.0f} img/s, ratio {t_exp / t_fwd:.2f}", flush=True)
    record("engine", what="api", arch=arch, batch=batch, forward_img_s=batch / t_fwd, explain_img_s=batch / t_exp)
    del ex

    # the CLI in a fresh process: --device cuda, and --device auto says which it used
    for dev in (args.device, "auto"):
        t0 = time.perf_counter()
        proc = subprocess.run(cli_cmd() + ["explain", str(path), str(tmp / "x4.npy"), "--device", dev, "-o",
                                           str(tmp / f"r_{dev}.npy")], capture_output=True, text=True, timeout=300)
        wall = time.perf_counter() - t0
        said = [line for line in proc.stderr.splitlines() if "--device auto" in line]
        last = proc.stdout.strip().splitlines()[-2:] if proc.stdout.strip() else [proc.stderr.strip()[-300:]]
        print(f"CLI --device {dev}: exit {proc.returncode}, {wall:.1f} s wall (fresh process, 4 items); "
              f"{' | '.join(said + last)}", flush=True)
        record("engine", what=f"cli --device {dev}", rc=proc.returncode, wall_s=wall, stderr=proc.stderr[-500:],
               stdout=proc.stdout[-500:])

    # the dataset engine (local): shards of relevance written to disk
    out_dir = tmp / "shards"
    proc = subprocess.run(cli_cmd() + ["explain", str(path), str(tmp / "x.npy"), "--out-dir", str(out_dir),
                                       "--device", args.device, "--batch-size", str(batch), "--json"],
                          capture_output=True, text=True, timeout=400)
    try:
        summary = json.loads(proc.stdout)
    except ValueError:
        summary = {"error": (proc.stderr or proc.stdout)[-400:]}
    print(f"dataset engine ({arch} EPF, {n} items, batch {batch}, --device {args.device}): exit {proc.returncode}, "
          f"{summary.get('items_per_s')} img/s over {summary.get('seconds')} s (first shard after "
          f"{summary.get('first_shard_s', summary.get('seconds_to_first_shard'))} s)"
          + (f" {summary['error']}" if "error" in summary else ""), flush=True)
    record("engine", what="dataset", arch=arch, batch=batch, items=n, rc=proc.returncode, summary=summary)
    shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- model precision




def precision(args) -> None:
    """float16 / bfloat16 MLPs (tests/bigmodels.py, twins of one float32 model): relevance in the model's precision
    (precision='auto': the model's type on CUDA, float32 on the CPU; onnx_lrp/precision.py) vs the same weights
    computed in float32 (precision='float32': what computing in the model's type changes; goal rel-L2 <= 1e-3
    float16, <= 1e-2 bfloat16, top-10 inputs unchanged) and vs the float32 twin (adds the weights' rounding), and
    explain time in the model's precision vs precision='float32'. On the CPU, bfloat16 in its own precision is
    refused (no kernels): 'auto' computes it in float32 there."""
    import warnings

    import bigmodels
    import onnx_lrp

    widths = (256, 1024, 1024, 10) if args.quick else (1024,) + (4096,) * 8 + (10,)
    batch = 4 if args.quick else 64
    tmp = Path(tempfile.mkdtemp(prefix="gpu-precision-"))
    x = np.random.default_rng(2).standard_normal((batch, widths[0])).astype(np.float32)
    f32 = bigmodels.write_mlp(tmp / "float32", widths, bias_scale=0.0)
    warnings.simplefilter("ignore")
    r32 = onnx_lrp.Explainer(str(f32), composite="epsilon", device=args.device).explain(x, target=2).relevance
    print(f"{'dtype':9s} {'computed in':12s} {'vs float32 compute':>18s} {'top-10 same':>11s} {'vs float32 twin':>15s} "
          f"{'explain ms':>10s} {'float32 ms':>10s}", flush=True)
    for dtype in ("float16", "bfloat16"):
        low = bigmodels.write_mlp(tmp / dtype, widths, dtype=dtype, bias_scale=0.0)
        try:
            ex = onnx_lrp.Explainer(str(low), composite="epsilon", device=args.device, precision=args.precision)
            ex32 = onnx_lrp.Explainer(str(low), composite="epsilon", device=args.device, precision="float32")
        except onnx_lrp.LrpError as exc:
            print(f"{dtype:9s} refused: {exc}", flush=True)
            record("precision", dtype=dtype, error=str(exc))
            continue
        r, r_same = ex.explain(x, target=2).relevance, ex32.explain(x, target=2).relevance
        err, twin = rel_l2(r, r_same), rel_l2(r, r32)
        same = all(set(np.argsort(-a)[:10]) == set(np.argsort(-b)[:10]) for a, b in zip(r, r_same))
        t_model, t_32 = pair(lambda: ex.explain(x, target=2), lambda: ex32.explain(x, target=2), 5)
        kind = ex.relevance_model.model_precision
        print(f"{dtype:9s} {kind:12s} {err:18.2e} {str(same):>11s} {twin:15.2e} {t_model * 1e3:10.1f} "
              f"{t_32 * 1e3:10.1f}", flush=True)
        record("precision", dtype=dtype, model_precision=kind, widths=list(widths), batch=batch,
               rel_l2_vs_float32_compute=err, top10_same=same, rel_l2_vs_float32_twin=twin, explain_s=t_model,
               explain_float32_s=t_32)
        del ex, ex32
    shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- profile, summary
def rows(part: str) -> list[dict]:
    path = OUT / "results.jsonl"
    if not path.exists():
        return []
    return [r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip())
            if r.get("part") == part]


def profile(args) -> None:
    """onnxruntime's profile of the relevance model of the worst bench_cnn row (explain / forward over its target)
    copied to $OUT/profile_worst.json (open it in chrome://tracing or Perfetto)."""
    cnn = [r for r in rows("bench_cnn") if r.get("profile_files")]
    if not cnn:
        print("no bench_cnn row with a profile", flush=True)
        return
    worst = max(cnn, key=lambda r: r["ratio"] / r["target"])
    src = Path(worst["profile_files"]["relevance"])
    dst = OUT / "profile_worst.json"
    shutil.copy(src, dst)
    print(f"worst row: {worst['arch']} b{worst['batch']} {worst['composite']} (explain/forward {worst['ratio']:.2f}, "
          f"target {worst['target']}); its relevance model's profile: {dst} ({dst.stat().st_size / 1e6:.1f} MB)",
          flush=True)


def _steps() -> list[list[str]]:
    path = OUT / "steps.tsv"
    return [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []


def summary(args) -> None:
    """One table: each step (its limit, the seconds it took, how it ended), then the goals of issue 29 per row."""
    print(f"{'step':24s} {'limit s':>7s} {'took s':>6s}  result")
    for name, cap, took, rc in _steps():
        result = {"0": "ok", "124": "TIME LIMIT", "137": "KILLED (time limit)", "skipped": "skipped"}.get(
            rc, f"FAILED (exit {rc})")
        print(f"{name:24s} {cap:>7s} {took:>6s}  {result}")
    print(f"\n{'bench_cnn':28s} {'x fwd':>6s} {'goal':>5s} {'host %':>6s} {'MiB out':>7s} {'fwd kern':>8s} "
          f"{'lrp kern':>8s} {'lrp wall':>8s} {'zennit/ours':>11s} {'CPU nodes':>9s}")
    for r in rows("bench_cnn"):
        goal = 3.0 if r["composite"] == "epsilon-plus-flat" else 4.6
        p = r.get("profile") or {}
        kern = {k: (v.get("kernels_ms") if v.get("kernels_ms") is not None else v.get("nodes_ms")) for k, v in p.items()}
        cpu = sum(1 for k in p.values() for n in k.get("cpu_nodes", []) if n.startswith("lrp/"))
        zen = r.get("zennit_s") or float("nan")
        print(f"{r['arch'] + ' b' + str(r['batch']) + ' ' + r['composite'][8:]:28s} {r['ratio']:6.2f} {goal:5.1f} "
              f"{100 * r['host_share']:6.2f} {r['bytes_to_host'] / 2**20:7.1f} {kern.get('forward') or 0:8.2f} "
              f"{kern.get('relevance') or 0:8.2f} {(p.get('relevance') or {}).get('run_ms', 0):8.2f} "
              f"{zen / r['explain_s']:11.2f} {cpu:9d}")
    for r in rows("bert"):
        if "explain_ms" in r:
            print(f"BERT-base tf32={r['tf32']} b{r['batch']}: {r['explain_ms'] / r['forward_ms']:.2f}x the forward "
                  "(goal b16 <= 2.5)")
    for f in sorted(OUT.glob("llm_*.json")):
        r = json.loads(f.read_text())
        print(f"LLaMA {r['size']} {r['dtype']}: explain/forward {r.get('explain_over_forward', float('nan')):.2f} "
              f"(goal <= 3), GPU peak {r.get('gpu_peak_over_weights', float('nan')):.2f}x the weights (goal <= 2.5), "
              f"vs float32 twin rel-L2 {r.get('rel_l2_vs_float32', float('nan')):.2e} top-10 same "
              f"{r.get('top10_tokens_same_as_float32')}")
    for r in rows("engine"):
        if r.get("what") == "dataset":
            print(f"dataset engine: {r['summary'].get('items_per_s')} items/s (exit {r['rc']})")
        elif r.get("what", "").startswith("cli"):
            print(f"{r['what']}: exit {r['rc']}, {r['wall_s']:.1f} s, stderr lines {len(r['stderr'].splitlines())}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["sweep", "bert", "fullsize", "engine", "precision", "profile", "summary"])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--precision", default="auto", choices=["auto", "model", "float32"],
                    help="precision: what the float16 / bfloat16 models compute in (auto: model on CUDA)")
    ap.add_argument("--keep", action="store_true", help="keep the exported models under $OUT")
    ap.add_argument("--batch", type=int, default=128, help="engine: the batch of the images/s rows")
    ap.add_argument("--items", type=int, default=512, help="engine: images through the dataset engine")
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    import warnings

    warnings.simplefilter("ignore")  # the random-weight models' conservation warnings are not what is checked here
    t0 = time.perf_counter()
    {"sweep": sweep, "bert": bert, "fullsize": fullsize, "engine": engine, "precision": precision,
     "profile": profile, "summary": summary}[args.part](args)
    print(f"[{args.part}: {time.perf_counter() - t0:.1f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
