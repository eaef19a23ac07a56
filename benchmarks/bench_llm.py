"""Benchmark: AttnLRP on a LLaMA-architecture model of a chosen size (random weights): build time, peak memory,
explain / forward, relevance vs its float32 twin (float16 / bfloat16) and vs LXT (efficient AttnLRP).

The model (``--build``):

* ``export``: built and exported by torch.onnx (TorchScript, opset 17, external data) in a child process with
  torch + transformers (``--ref-python``, default this Python; ``llama_export.py``), which then runs LXT on the
  same weights when ``lxt`` imports (LXT 2.1 needs transformers < 5) and exits before onnx-lrp starts, so the peak
  memory printed is onnx-lrp's alone. A 1.5 B export takes about 2 minutes.
* ``direct``: the same graph, node for node, written by ``llama_graph.py`` with onnx_ir, its random weights streamed
  to one external data file (no torch, no transformers; ``tests/parity/test_llm_graph.py`` checks it against the export).
  An 8 B model in bfloat16 is 16 GB on disk: a GPU run of it fits in minutes.
* ``auto`` (the default): ``direct`` for ``1b`` and ``8b``, ``export`` below.

Sizes (``--size``): ``tiny`` (2 layers, hidden 64: a smoke test), ``0.1b``, ``0.6b`` (hidden 1024, 36 layers,
intermediate 4096, 16 heads / 8 key-value heads, vocabulary 32000: 0.60 B parameters, 2.4 GB of float32 weights),
``1b`` (LLaMA-3.2-1B-shaped: 1.50 B parameters with the input embedding, 2.47 GB of bfloat16 in the graph),
``8b`` (LLaMA-3-8B-shaped: 8.03 B, 15.0 GB of bfloat16 in the graph). Run::

    python benchmarks/bench_llm.py [--size 0.6b] [--seq 32] [--dtype float32|bfloat16|float16] [--device cpu|cuda]
                                   [--precision auto|model|float32] [--build auto|export|direct]

``--precision`` (a float16 / bfloat16 model): ``model`` computes the relevance in the model's type with float32
where stability needs it (onnx_lrp/precision.py), ``float32`` in float32, ``auto`` (the default) the first on CUDA
and the second on the CPU. Its float32 twin is the same file with ``precision="float32"``: the same (rounded)
weights computed in float32. The plain forward feeds the model's own type (bfloat16 as an OrtValue); onnxruntime's
CPU provider has no bfloat16 kernels, so on the CPU a bfloat16 model's forward is timed on a float32 model of the
same weights. The last line checks the goals of a LLaMA in bfloat16 on one GPU (``--device cuda --dtype bfloat16``):
peak GPU memory <= 2.5x the weights, explain <= 3x the forward, relevance within 1e-2 rel-L2 of the float32 twin
with the same top-10 tokens (on the CPU: peak RSS).

Deployed forms (``--forms DIR``): the rows of the files people deploy a LLaMA with, from a folder written by
``scripts/make_llm_models.py --out DIR`` (the same weights as an optimum export without past, the float export,
and as onnxruntime-genai builder folders, fp32 and int4)::

    python scripts/make_llm_models.py --out /tmp/llm1b --archs llama --shape 2048,8192,16,32,8,128256 --no-refs \
        --builder-python /work/llmenv-genai/bin/python
    python benchmarks/bench_llm.py --forms /tmp/llm1b [--arch llama] [--seq 32]

The LLaMA-3.2-1B shape with its tied embeddings (the int4 folder as the builder writes it: the embedding a
``GatherBlockQuantized`` of the head's 4-bit weights), without the optimum export::

    python benchmarks/bench_llm.py --make-genai /tmp/genai1b --builder-python /work/llmenv-genai/bin/python \
        [--precisions int4 fp32]
    python benchmarks/bench_llm.py --forms /tmp/genai1b --seq 32

Each row runs in its own process (its peak RSS its own): build (the relevance model), explain (the last position's
arg-max token, best of ``--repeat``), forward (onnxruntime's plain run of the same file, the KV cache fed at length
0), peak RSS over the form's weight bytes, what the explainer holds after the build, the explanations' own peak above
that, and what a plain onnxruntime session of the form holds (an int4 explainer runs one beside its relevance model:
the deployed outputs); a form onnx-lrp refuses is a row with its one-line reason.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from llama_graph import SIZES
from timing import best

DIRECT_SIZES = ("1b", "8b")  # --build auto: written directly (an export takes minutes)


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
    ap.add_argument("--build", default="auto", choices=("auto", "export", "direct"),
                    help="export with torch.onnx, or write the same graph directly (auto: direct from 1b)")
    ap.add_argument("--no-twin", dest="twin", action="store_false",
                    help="skip the float32 twin's relevance (a float16 / bfloat16 model)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--ref-python", default=sys.executable)
    ap.add_argument("--keep", default=None, help="folder to export into and keep (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--forms", default=None, metavar="DIR",
                    help="rows of the deployed forms in DIR (scripts/make_llm_models.py --out DIR) instead")
    ap.add_argument("--arch", default="llama", help="with --forms: the files' prefix (llama, qwen2)")
    ap.add_argument("--form-row", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--make-genai", default=None, metavar="DIR",
                    help="write LLaMA-3.2-1B-shaped genai folders (random weights) into DIR for --forms, and stop")
    ap.add_argument("--precisions", nargs="+", default=["int4"], help="with --make-genai: the builder's -p values")
    ap.add_argument("--builder-python", default=sys.executable,
                    help="with --make-genai: a Python with torch, transformers and onnxruntime-genai's builder")
    args = ap.parse_args(argv)
    if args.make_genai:
        return make_genai(Path(args.make_genai), args.precisions, args.builder_python)
    if args.form_row:
        return print(json.dumps(form_row(Path(args.form_row), args.seq, args.repeat, args.threads)))
    if args.forms:
        return forms(args)
    if args.build == "auto":
        args.build = "direct" if args.size in DIRECT_SIZES else "export"

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # `timeout`: the folder below is still removed
    tmp = Path(args.keep or tempfile.mkdtemp(prefix="bench_llm_"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        return _run(args, tmp)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)  # an 8 B model in bfloat16 is 16 GB


def build(args, tmp: Path) -> dict:
    """The model (``path``), its input (``x``, float32), parameters, seconds, LXT's figures, and the float32 model
    of the same weights whose forward is timed where onnxruntime cannot run the model (``forward_twin``, or None)."""
    path, t0 = tmp / "llama.onnx", time.perf_counter()
    twin = tmp / "float32" / "llama.onnx" if args.dtype == "bfloat16" and args.device == "cpu" else None
    if twin:  # onnxruntime's CPU provider has no bfloat16 kernels
        twin.parent.mkdir(exist_ok=True)
    if args.build == "direct":
        import llama_graph

        shape = llama_graph.Shape(*SIZES[args.size])
        llama_graph.write(tmp, shape, args.seq, args.dtype, threads=args.threads or None)
        info = {"params": shape.params(), "x": llama_graph.embeds(shape, args.seq, args.dtype)}
        if twin:
            llama_graph.write(twin.parent, shape, args.seq, "float32", round_to=args.dtype,
                              threads=args.threads or None)
    else:
        ref = subprocess.run([args.ref_python, str(Path(__file__).with_name("llama_export.py")),
                              json.dumps(SIZES[args.size]), str(args.seq), str(path), args.dtype, args.device,
                              str(args.threads), str(twin or "")], capture_output=True, text=True)
        if ref.returncode != 0 or not ref.stdout.strip():
            sys.exit(f"export failed:\n{ref.stderr[-2500:]}")
        info = json.loads(ref.stdout.strip().splitlines()[-1])
        info["x"] = np.load(str(path) + ".x.npy")
    info.update(path=path, forward_twin=twin, build_s=time.perf_counter() - t0)
    return info


def feed_of(sess, x: np.ndarray) -> dict:
    """The plain session's input in its own type: float16 as numpy, bfloat16 as an OrtValue of the bit patterns
    (numpy has no bfloat16 and onnxruntime takes no ml_dtypes array), float32 as is."""
    import onnxruntime as ort

    spec = sess.get_inputs()[0]
    if spec.type == "tensor(bfloat16)":
        import ml_dtypes

        bits = np.ascontiguousarray(x.astype(ml_dtypes.bfloat16)).view(np.uint16)
        return {spec.name: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, 16)}  # TensorProto.BFLOAT16
    return {spec.name: x.astype(np.float16 if spec.type == "tensor(float16)" else np.float32)}


def forward(args, built: dict) -> dict:
    """onnxruntime's plain forward of the model in its type (of the float32 twin where it cannot run), timed."""
    import onnxruntime as ort

    reset_peak()
    gpu = GpuPeak() if args.device == "cuda" else None
    opts = ort.SessionOptions()
    if args.threads:
        opts.intra_op_num_threads = args.threads
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if args.device == "cuda" else None
    path, of = built["path"], args.dtype
    try:
        sess = ort.InferenceSession(str(path), opts, providers=providers)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's CPU provider has no bfloat16 kernels
        if built["forward_twin"] is None:
            raise
        print(f"plain onnxruntime cannot run the {args.dtype} model ({str(exc).splitlines()[0][:120]}); forward "
              "timed on the float32 model of the same weights")
        sess, of = ort.InferenceSession(str(built["forward_twin"]), opts, providers=providers), "float32"
    feed = feed_of(sess, built["x"])
    forward_s = best(lambda: sess.run(None, feed), args.repeat)
    out = dict(forward_s=forward_s, forward_dtype=of, forward_peak_rss_bytes=vm_hwm())
    if gpu:
        out["forward_gpu_peak_bytes"] = gpu.stop()
    return out


def explain(args, built: dict) -> dict:
    """Build the relevance model and explain (timed, peak memory); then the same weights computed in float32 (the
    float32 twin: the same file, ``precision="float32"``) for a float16 / bfloat16 model."""
    import onnx_lrp

    gpu = GpuPeak() if args.device == "cuda" else None
    reset_peak()
    t1 = time.perf_counter()
    ex = onnx_lrp.Explainer(str(built["path"]), composite="attnlrp", device=args.device,
                            threads=args.threads or None, precision=args.precision)
    build_s = time.perf_counter() - t1
    precision = ex.relevance_model.model_precision
    print(f"relevance computed in {precision} (--precision {args.precision}, {ex.device})", flush=True)
    x, target = built["x"].astype(ex.inputs[0].dtype), built.get("target")
    e = ex.explain(x, target=target, position=-1)
    target = int(np.asarray(e.target).reshape(-1)[0])
    explain_s = best(lambda: ex.explain(x, target=target, position=-1), args.repeat)
    res = dict(model_precision=precision, build_s=build_s, explain_s=explain_s, peak_rss_bytes=vm_hwm(),
               target=target)
    if gpu:
        res["gpu_peak_bytes"] = gpu.stop()
    relevance = np.asarray(e.relevance)
    del ex, e
    if args.dtype != "float32" and args.twin:
        ex32 = onnx_lrp.Explainer(str(built["path"]), composite="attnlrp", device=args.device,
                                  threads=args.threads or None, precision="float32")
        r32 = np.asarray(ex32.explain(built["x"], target=target, position=-1).relevance)
        del ex32
        tok, tok32 = relevance.sum(-1)[0], r32.sum(-1)[0]
        res.update(rel_l2_vs_float32=rel_l2(relevance, r32), rel_l2_tokens_vs_float32=rel_l2(tok, tok32),
                   top10_tokens_same_as_float32=bool(np.array_equal(np.argsort(-tok)[:10], np.argsort(-tok32)[:10])))
    return res, relevance


def report(args, built: dict, res: dict, relevance: np.ndarray) -> None:
    """The figures, and the goals of a LLaMA in bfloat16 on one GPU: peak memory <= 2.5x the weights, explain <=
    3x the forward, relevance within 1e-2 rel-L2 of the float32 twin with the same top-10 tokens."""
    lxt_path = Path(str(built["path"]) + ".lxt.npy")
    if lxt_path.exists():
        lxt = np.load(lxt_path)
        res.update(lxt_s=built["lxt_s"], rel_l2_vs_lxt=rel_l2(relevance, lxt),
                   rel_l2_tokens_vs_lxt=rel_l2(relevance.sum(-1), lxt.sum(-1)),
                   top10_tokens_same=bool(np.array_equal(np.argsort(-relevance.sum(-1)[0])[:10],
                                                         np.argsort(-lxt.sum(-1)[0])[:10])))
    w, ratio = res["weights_bytes"], res["explain_s"] / res["forward_s"]
    res["explain_over_forward"], res["peak_rss_over_weights"] = ratio, res["peak_rss_bytes"] / w
    print(f"build {res['build_s']:.1f} s | explain {res['explain_s'] * 1e3:.0f} ms | forward "
          f"{res['forward_s'] * 1e3:.0f} ms ({res['forward_dtype']}) | explain/forward {ratio:.2f} | peak RSS "
          f"build+explain {res['peak_rss_bytes'] / 1e9:.2f} GB ({res['peak_rss_over_weights']:.2f}x the weights) | "
          f"forward alone {res['forward_peak_rss_bytes'] / 1e9:.2f} GB")
    peak, where = res["peak_rss_bytes"], "host RSS"
    if args.device == "cuda":
        peak, where = res["gpu_peak_bytes"], "GPU"
        res["gpu_peak_over_weights"] = peak / w
        print(f"GPU peak (nvidia-smi): build+explain {peak / 1e9:.2f} GB ({peak / w:.2f}x the weights), forward "
              f"{res['forward_gpu_peak_bytes'] / 1e9:.2f} GB, LXT {(built.get('lxt_gpu_peak_bytes') or 0) / 1e9:.2f}"
              " GB (torch allocator)")
    if "rel_l2_vs_lxt" in res:
        print(f"LXT: {res['lxt_s'] * 1e3:.0f} ms per explanation; rel-L2 vs LXT {res['rel_l2_vs_lxt']:.2e} "
              f"(per token {res['rel_l2_tokens_vs_lxt']:.2e}), top-10 tokens the same: {res['top10_tokens_same']}")
    else:
        print(f"LXT not run: {built.get('lxt_error', 'the model was written directly')}")
    goals = [f"peak {where} {peak / w:.2f}x the weights (goal <= 2.5: {'ok' if peak <= 2.5 * w else 'MISSED'})",
             f"explain/forward {ratio:.2f} (goal <= 3: {'ok' if ratio <= 3 else 'MISSED'})"
             + ("" if res["forward_dtype"] == args.dtype else " [float32 forward]")]
    if "rel_l2_vs_float32" in res:
        ok = res["rel_l2_vs_float32"] <= 1e-2 and res["top10_tokens_same_as_float32"]
        goals.append(f"{res['model_precision']} relevance vs the float32 twin rel-L2 {res['rel_l2_vs_float32']:.2e} "
                     f"(per token {res['rel_l2_tokens_vs_float32']:.2e}), top-10 tokens in the same order: "
                     f"{res['top10_tokens_same_as_float32']} (goal <= 1e-2, same: {'ok' if ok else 'MISSED'}"
                     + (", trivially: computed in float32)" if res["model_precision"] == "float32" else ")"))
    print(f"goals ({args.size}, {args.dtype}, {args.device}): " + " | ".join(goals))


#: LLaMA-3.2-1B's shape (hidden 2048, 16 layers, 32 / 8 heads, intermediate 8192, vocabulary 128256, tied embeddings)
LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=2048,
                rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, pad_token_id=1)
_MAKE_HF = """import sys, json, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)  # half the memory of float32 while writing; the builder reads it
m = LlamaForCausalLM(LlamaConfig(**json.loads(sys.argv[2]))).eval()
m.save_pretrained(sys.argv[1], safe_serialization=True)
m.generation_config.save_pretrained(sys.argv[1])
"""


def make_genai(out: Path, precisions: list, python: str) -> None:
    """``out/llama_genai_<p>`` for each precision: a random-weight LLaMA-3.2-1B-shaped model (bfloat16, the
    tokenizer of tests/goldens/llm) saved with ``save_pretrained`` to ``out/hf``, converted by onnxruntime-genai's
    model builder (``-p <p> -e cpu``). About 2.5 GB of disk for the model, 0.8 GB per int4 folder, 5 GB for fp32."""
    hf = out / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    tok = Path(__file__).resolve().parent.parent / "tests" / "goldens" / "llm" / "llama_genai_int4"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / name, hf / name)
    if not (hf / "config.json").exists():
        subprocess.run([python, "-c", _MAKE_HF, str(hf), json.dumps(LLAMA_1B)], check=True)
    for p in precisions:
        subprocess.run([python, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o",
                        str(out / f"llama_genai_{p}"), "-p", p, "-e", "cpu", "-c", str(out / "cache")], check=True)
        print(f"{out / f'llama_genai_{p}'}: {sum(f.stat().st_size for f in (out / f'llama_genai_{p}').iterdir()) / 1e9:.2f}"
              " GB", flush=True)


FORMS = ("optimum_nopast.onnx", "genai_fp32", "genai_int4")  # the float export first: the others beside it


def form_row(path: Path, seq: int, repeat: int, threads: int) -> dict:
    """One deployed form's figures (in this process): weight bytes, build / explain / forward seconds, peak RSS."""
    import onnx_lrp
    from onnx_lrp.run.generation import Decoder, sequence_feeds

    before = vm_rss()
    dec = Decoder(path, threads=threads or None)
    files = [f for f in dec.path.parent.iterdir() if f.is_file() and f.name.startswith(dec.path.name)] \
        if dec.folder is not None else [dec.path]
    row = dict(form=path.name, weights_bytes=sum(f.stat().st_size for f in files))
    ids = [int(i) for i in np.random.default_rng(0).integers(3, 256, seq)]
    feeds = dec.prompt_feeds(ids)
    row["forward_s"] = best(lambda: dec.session.run(feeds, [dec.logits]), repeat)
    row["forward_session_rss_bytes"] = vm_rss() - before  # what a plain session of the form holds (the deployed
    del dec  # model an int4 explainer runs beside its relevance model costs as much)
    reset_peak()
    row["base_rss_bytes"] = vm_rss()  # Python, numpy, onnxruntime and the decoder's session: not the explainer's
    t0 = time.perf_counter()
    try:
        ex = onnx_lrp.Explainer(str(path if dec_file(path) is None else dec_file(path)), composite="attnlrp",
                                threads=threads or None)
    except onnx_lrp.LrpError as exc:
        return dict(row, refused=str(exc).splitlines()[0][:300])
    row["build_s"] = time.perf_counter() - t0
    row["build_peak_rss_bytes"], row["built_rss_bytes"] = vm_hwm(), vm_rss()
    x, _ = sequence_feeds(ex, ids, 1)
    reset_peak()
    row["explain_s"] = best(lambda: ex.explain(x, position=-1), repeat)
    row["explain_peak_rss_bytes"] = vm_hwm()  # the explanations alone: from the built explainer's RSS
    row["peak_rss_bytes"] = max(row["build_peak_rss_bytes"], row["explain_peak_rss_bytes"])
    return row


def vm_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def dec_file(path: Path) -> "Path | None":
    """A genai folder's model file (the Explainer takes the file)."""
    from onnx_lrp.io import genai

    return genai.model_file(path) if path.is_dir() else None


def forms(args) -> list:
    """The rows of ``--forms DIR`` (one child process each), printed as a table."""
    rows = []
    for form in FORMS:
        path = Path(args.forms) / f"{args.arch}_{form}"
        if not path.exists():
            rows.append(dict(form=path.name, refused="not in the folder"))
            continue
        cmd = [sys.executable, __file__, "--form-row", str(path), "--seq", str(args.seq), "--repeat",
               str(args.repeat), "--threads", str(args.threads)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        lines = done.stdout.strip().splitlines()
        rows.append(json.loads(lines[-1]) if done.returncode == 0 and lines else
                    dict(form=path.name, refused=(done.stderr.strip().splitlines() or ["failed"])[-1][:300]))
    print(f"{'form':<24} {'weights':>10} {'build s':>8} {'explain ms':>11} {'forward ms':>11} {'x fwd':>6} "
          f"{'peak RSS':>10} {'x weights':>9} {'built':>8} {'explain':>8} {'session':>8}  (peak RSS: above the "
          "process before the build; built: held after the build; explain: the explanations' peak above that; "
          "session: a plain onnxruntime session of the form)")
    for r in rows:
        if "refused" in r:
            print(f"{r['form']:<24} refused: {r['refused']}")
            continue
        extra = r["peak_rss_bytes"] - r["base_rss_bytes"]
        print(f"{r['form']:<24} {r['weights_bytes'] / 1e6:>8.1f}MB {r['build_s']:>8.2f} {r['explain_s'] * 1e3:>11.1f} "
              f"{r['forward_s'] * 1e3:>11.1f} {r['explain_s'] / r['forward_s']:>6.2f} "
              f"{extra / 1e6:>8.0f}MB {extra / r['weights_bytes']:>9.2f} "
              f"{(r['built_rss_bytes'] - r['base_rss_bytes']) / 1e6:>6.0f}MB "
              f"{(r['explain_peak_rss_bytes'] - r['built_rss_bytes']) / 1e6:>6.0f}MB "
              f"{r['forward_session_rss_bytes'] / 1e6:>6.0f}MB")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


def _run(args, tmp: Path) -> dict:
    built = build(args, tmp)
    w_bytes = weights_bytes(built["path"])
    print(f"{args.size}: {built['params'] / 1e9:.2f} B parameters, {w_bytes / 1e9:.2f} GB on disk ({args.dtype}), "
          f"{sum(1 for f in tmp.iterdir() if f.is_file() and not f.name.endswith('.npy'))} files; "
          f"{'written' if args.build == 'direct' else 'exported'} in {built['build_s']:.0f} s", flush=True)
    res = dict(size=args.size, dtype=args.dtype, device=args.device, precision=args.precision, build=args.build,
               seq=args.seq, params=built["params"], weights_bytes=w_bytes, graph_s=built["build_s"])
    r, relevance = explain(args, built)
    res.update(r)
    res.update(forward(args, built))
    report(args, built, res, relevance)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
