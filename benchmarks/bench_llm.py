"""Benchmark: AttnLRP on a LLaMA-architecture model of a chosen size (random weights), exported by torch.onnx with
external data: build time, peak memory, explain / forward, and relevance vs LXT (efficient AttnLRP).

The model is built and exported in a child process with torch + transformers (``--ref-python``, default this
Python), which then runs LXT on the same weights when ``lxt`` imports (LXT 2.1 needs transformers < 5) and exits
before onnx-lrp starts, so the peak RSS printed is onnx-lrp's alone: building the relevance model and explaining
(then, separately, onnxruntime's plain forward of the exported model).

Sizes (``--size``): ``tiny`` (2 layers, hidden 64: a smoke test), ``0.1b``, ``0.6b`` (hidden 1024, 36 layers,
intermediate 4096, 16 heads / 8 key-value heads, vocabulary 32000: 0.60 B parameters, 2.4 GB of float32 weights),
``1b``, ``8b`` (LLaMA-3-8B-shaped). Run::

    python benchmarks/bench_llm.py [--size 0.6b] [--seq 32] [--dtype float32|bfloat16|float16] [--device cpu|cuda]
                                   [--precision auto|model|float32]

``--precision`` (a float16 / bfloat16 model): ``model`` computes the relevance in the model's type with float32
where stability needs it (onnx_lrp/precision.py), ``float32`` in float32, ``auto`` (the default) the first on CUDA
and the second on the CPU. On a GPU: ``--device cuda --dtype bfloat16`` (model precision) against the float32 twin.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from timing import best

SIZES = {  # hidden, intermediate, layers, heads, kv heads, vocabulary
    "tiny": (64, 128, 2, 4, 2, 256),
    "0.1b": (512, 2048, 16, 8, 4, 32000),
    "0.6b": (1024, 4096, 36, 16, 8, 32000),
    "1b": (2048, 8192, 16, 32, 8, 128256),
    "8b": (4096, 14336, 32, 32, 8, 128256),
}

_REF = r'''
import json, sys, time, warnings, os
warnings.simplefilter("ignore")
import numpy as np, torch
hidden, inter, layers, heads, kv, vocab = json.loads(sys.argv[1])
seq, out, dtype, device, threads = int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
if threads:
    torch.set_num_threads(threads)
dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama
cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=max(256, seq),
                  attn_implementation="eager", tie_word_embeddings=False, torch_dtype=dt)
torch.manual_seed(0)
t0 = time.perf_counter()
with torch.device("meta"):
    model = modeling_llama.LlamaForCausalLM(cfg)
model = model.to_empty(device="cpu")
g = torch.Generator().manual_seed(0)
with torch.no_grad():
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / p.shape[-1] ** 0.5))
    dh = hidden // heads
    theta = getattr(cfg, "rope_theta", None) or (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 1e4)
    model.model.rotary_emb.inv_freq.copy_(1.0 / (theta ** (torch.arange(0, dh, 2).float() / dh)))  # transformers 4 / 5
model.eval()
twin = sys.argv[7] if len(sys.argv) > 7 else ""
n_params = sum(p.numel() for p in model.parameters())
ids = torch.randint(0, vocab, (1, seq), generator=g)
class FromEmbeds(torch.nn.Module):
    def __init__(s, mask):
        super().__init__(); s.m = model; s.mask = mask
    def forward(s, e):
        return s.m(inputs_embeds=e, attention_mask=s.mask, use_cache=False).logits
def causal(dtype):  # a 4-D additive mask: transformers' own mask builder (vmap) does not trace
    return torch.full((1, 1, seq, seq), torch.finfo(dtype).min, dtype=dtype).triu(1)
if twin:  # the float32 model with the same (unrounded) weights, for the low-precision run's relevance difference
    with torch.no_grad():
        emb32 = model.get_input_embeddings()(ids)
    torch.onnx.export(FromEmbeds(causal(torch.float32)), (emb32,), twin, dynamo=False, input_names=["embeds"],
                      output_names=["logits"], opset_version=17)
model = model.to(dt)
with torch.no_grad():
    emb = model.get_input_embeddings()(ids)
mask = causal(dt)
torch.onnx.export(FromEmbeds(mask), (emb,), out, dynamo=False, input_names=["embeds"], output_names=["logits"],
                  opset_version=17)
np.save(out + ".x.npy", emb.float().numpy() if dtype == "bfloat16" else emb.numpy())
res = {"params": n_params, "export_s": time.perf_counter() - t0}
try:
    from lxt.efficient import monkey_patch
    monkey_patch(modeling_llama)
    with torch.device("meta"):
        lm = modeling_llama.LlamaForCausalLM(cfg)
    lm.load_state_dict(model.state_dict(), assign=True)  # the same tensors: no second copy of the weights
    lm.model.rotary_emb.inv_freq = model.model.rotary_emb.inv_freq  # a buffer outside the state dict
    lm.model.rotary_emb.original_inv_freq = model.model.rotary_emb.original_inv_freq
    lm.eval().to(device)
    for prm in lm.parameters():
        prm.requires_grad_(False)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ts = []
    for i in range(3):
        e = emb.clone().to(device).requires_grad_(True)
        t1 = time.perf_counter()
        y = lm(inputs_embeds=e, attention_mask=mask.to(device), use_cache=False).logits
        target = int(y[0, -1].argmax())
        y[0, -1, target].backward()
        if device == "cuda":
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t1)
    res["lxt_s"] = min(ts)
    res["target"] = target
    if device == "cuda":
        res["lxt_gpu_peak_bytes"] = torch.cuda.max_memory_allocated()
    np.save(out + ".lxt.npy", (e * e.grad).float().detach().cpu().numpy())
except ImportError as exc:
    res["lxt_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(res), flush=True)
'''


def weights_bytes(path: Path) -> int:
    """Bytes of the model file and every data file beside it (torch.onnx writes one file per tensor)."""
    return sum(f.stat().st_size for f in path.parent.iterdir() if f.is_file() and not f.name.endswith(".npy"))


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> None:
    try:  # Linux: VmHWM back to the current RSS
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return peak_rss()


class GpuPeak:
    """The process's GPU memory, polled with nvidia-smi (onnxruntime has no counter of its own)."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()

    def _poll(self):
        pid = str(os.getpid())
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,"
                                      "nounits"], capture_output=True, text=True, timeout=5).stdout
                for line in out.splitlines():
                    p, mib = [s.strip() for s in line.split(",")]
                    if p == pid:
                        self.peak = max(self.peak, int(mib) << 20)
            except (OSError, ValueError, subprocess.SubprocessError):
                return
            time.sleep(0.05)

    def stop(self) -> int:
        self._stop.set()
        return self.peak


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="0.6b", choices=sorted(SIZES))
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--precision", default="auto", choices=("auto", "model", "float32"),
                    help="what a float16 / bfloat16 model's relevance is computed in (auto: model on CUDA)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--ref-python", default=sys.executable)
    ap.add_argument("--keep", default=None, help="folder to export into and keep (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args(argv)

    tmp = Path(args.keep or tempfile.mkdtemp(prefix="bench_llm_"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        return _run(args, tmp)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)  # a 0.6 B export is 2.4 GB


def _run(args, tmp: Path) -> dict:
    path = tmp / "llama.onnx"
    t0 = time.perf_counter()
    twin = tmp / "float32" / "llama.onnx" if args.dtype != "float32" else None
    if twin:
        twin.parent.mkdir(exist_ok=True)
    ref = subprocess.run([args.ref_python, "-c", _REF, json.dumps(SIZES[args.size]), str(args.seq), str(path),
                          args.dtype, args.device, str(args.threads), str(twin or "")], capture_output=True,
                         text=True)
    if ref.returncode != 0 or not ref.stdout.strip():
        sys.exit(f"export failed:\n{ref.stderr[:2500]}")
    info = json.loads(ref.stdout.strip().splitlines()[-1])
    x = np.load(str(path) + ".x.npy")
    w_bytes = weights_bytes(path)
    print(f"{args.size}: {info['params'] / 1e9:.2f} B parameters, {w_bytes / 1e9:.2f} GB on disk ({args.dtype}), "
          f"{len(list(tmp.iterdir()))} files; exported in {time.perf_counter() - t0:.0f} s", flush=True)

    import onnxruntime as ort

    import onnx_lrp

    gpu = GpuPeak() if args.device == "cuda" else None
    reset_peak()
    t1 = time.perf_counter()
    ex = onnx_lrp.Explainer(str(path), composite="attnlrp", device=args.device, threads=args.threads or None,
                            precision=args.precision)
    build_s = time.perf_counter() - t1
    model_precision = ex.model_precision
    print(f"relevance computed in {model_precision} (--precision {args.precision}, {ex.device})", flush=True)
    target = info.get("target")
    feed = x.astype(ex.inputs[0].dtype)
    e = ex.explain(feed, target=target, position=-1)
    explain_s = best(lambda: ex.explain(feed, target=target, position=-1),
                     args.repeat)
    rss_explain = vm_hwm()
    gpu_explain = gpu.stop() if gpu else 0
    relevance = np.asarray(e.relevance)
    del ex, e

    reset_peak()
    gpu = GpuPeak() if args.device == "cuda" else None
    opts = ort.SessionOptions()
    if args.threads:
        opts.intra_op_num_threads = args.threads
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if args.device == "cuda" else None
    forward_of = args.dtype
    try:
        sess = ort.InferenceSession(str(path), opts, providers=providers)
    except Exception as exc:  # onnxruntime's CPU provider has no bfloat16 kernels: the float32 twin's forward
        if twin is None:
            raise
        print(f"plain onnxruntime cannot run the {args.dtype} model ({str(exc).splitlines()[0][:120]}); forward "
              "timed on the float32 model of the same weights")
        sess, forward_of, feed = ort.InferenceSession(str(twin), opts, providers=providers), "float32", \
            x.astype(np.float32)
    if sess.get_inputs()[0].type == "tensor(float16)":  # the float16 model's own input type
        feed = x.astype(np.float16)
    forward_s = best(lambda: sess.run(None, {"embeds": feed}), args.repeat)
    rss_forward = vm_hwm()
    gpu_forward = gpu.stop() if gpu else 0
    del sess

    res = dict(size=args.size, dtype=args.dtype, device=args.device, precision=args.precision,
               model_precision=model_precision, seq=args.seq, params=info["params"],
               weights_bytes=w_bytes, build_s=build_s, explain_s=explain_s, forward_s=forward_s,
               explain_over_forward=explain_s / forward_s, forward_dtype=forward_of, peak_rss_bytes=rss_explain,
               peak_rss_over_weights=rss_explain / w_bytes, forward_peak_rss_bytes=rss_forward)
    if args.device == "cuda":
        res.update(gpu_peak_bytes=gpu_explain, forward_gpu_peak_bytes=gpu_forward,
                   lxt_gpu_peak_bytes=info.get("lxt_gpu_peak_bytes"))
    if twin:  # the float32 model of the same weights, explained the same way
        ex32 = onnx_lrp.Explainer(str(twin), composite="attnlrp", device=args.device, threads=args.threads or None,
                                  precision="float32")
        r32 = np.asarray(ex32.explain(x.astype(np.float32), target=target, position=-1).relevance)
        del ex32
        tok, tok32 = relevance.sum(-1)[0], r32.sum(-1)[0]
        res.update(rel_l2_vs_float32=rel_l2(relevance, r32), rel_l2_tokens_vs_float32=rel_l2(tok, tok32),
                   top10_tokens_same_as_float32=bool(np.array_equal(np.argsort(-tok)[:10], np.argsort(-tok32)[:10])))
        print(f"{model_precision} relevance vs the float32 model of the same weights: rel-L2 "
              f"{res['rel_l2_vs_float32']:.2e} (per token "
              f"{res['rel_l2_tokens_vs_float32']:.2e}), top-10 tokens in the same order: "
              f"{res['top10_tokens_same_as_float32']}")
    lxt_path = Path(str(path) + ".lxt.npy")
    if lxt_path.exists():
        lxt = np.load(lxt_path)
        res.update(lxt_s=info["lxt_s"], rel_l2_vs_lxt=rel_l2(relevance, lxt),
                   rel_l2_tokens_vs_lxt=rel_l2(relevance.sum(-1), lxt.sum(-1)),
                   top10_tokens_same=bool(np.array_equal(np.argsort(-relevance.sum(-1)[0])[:10],
                                                         np.argsort(-lxt.sum(-1)[0])[:10])))
    else:
        res["lxt"] = info.get("lxt_error", "not run")
    print(f"build {build_s:.1f} s | explain {explain_s * 1e3:.0f} ms | forward {forward_s * 1e3:.0f} ms | "
          f"explain/forward {explain_s / forward_s:.2f}{'' if forward_of == args.dtype else ' (float32 forward)'} | "
          f"peak RSS build+explain {rss_explain / 1e9:.2f} GB "
          f"({rss_explain / w_bytes:.2f}x the weights) | forward alone {rss_forward / 1e9:.2f} GB")
    if args.device == "cuda":
        print(f"GPU peak: explain {gpu_explain / 1e9:.2f} GB, forward {gpu_forward / 1e9:.2f} GB, LXT "
              f"{(info.get('lxt_gpu_peak_bytes') or 0) / 1e9:.2f} GB (torch allocator)")
    if "rel_l2_vs_lxt" in res:
        print(f"LXT: {res['lxt_s'] * 1e3:.0f} ms per explanation; rel-L2 vs LXT {res['rel_l2_vs_lxt']:.2e} "
              f"(per token {res['rel_l2_tokens_vs_lxt']:.2e}), top-10 tokens the same: {res['top10_tokens_same']}")
    else:
        print(f"LXT not run: {res['lxt']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
