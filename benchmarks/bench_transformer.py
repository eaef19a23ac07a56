"""Benchmark: AttnLRP on a BERT-base-sized transformer on CPU (12 layers, hidden 768, 12 heads, sequence 128,
random weights): onnx-lrp's explain time over a plain onnxruntime forward, and over LXT's (efficient mode) time.

Targets (issue 18): explain <= 2.1x the forward (the floor is 2: the forward and one transposed GEMM per weight),
and never slower than LXT at its best (parameters without gradients); both LXT settings are printed.

The model is exported by a Python that has torch + transformers (+ lxt for the LXT column): ``--ref-python``
(default: $LXT_PYTHON, else /work/venv-lxt/bin/python, see scripts/make_lxt_goldens.py). Without one, the same
architecture is built directly with onnx.helper (erf GELU, LayerNormalization, eager attention) and the LXT column
is left out. Run::

    python benchmarks/bench_transformer.py [--seq 128] [--layers 12] [--repeat 5] [--threads 0]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from timing import best

_REF = r'''
import json, sys, time, torch, warnings
warnings.simplefilter("ignore")
layers, seq, threads, out, repeat = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
if threads:
    torch.set_num_threads(threads)
from transformers import BertConfig
cfg = BertConfig(num_hidden_layers=layers, attn_implementation="eager", num_labels=2)
torch.manual_seed(0)
from transformers.models.bert import modeling_bert
model = modeling_bert.BertForSequenceClassification(cfg).eval()
x = torch.randn(1, seq, cfg.hidden_size)
class M(torch.nn.Module):
    def __init__(s):
        super().__init__(); s.m = model
    def forward(s, e):
        return s.m(inputs_embeds=e).logits
torch.onnx.export(M(), (x,), out, dynamo=False, input_names=["embeds"], output_names=["logits"], opset_version=17)
torch.save(x, out + ".x.pt")
res = {}
import numpy as np
np.save(out + ".x.npy", x.numpy())
try:
    from lxt.efficient import monkey_patch
    state = model.state_dict()
    monkey_patch(modeling_bert)
    lm = modeling_bert.BertForSequenceClassification(cfg).eval()
    lm.load_state_dict(state)
    e = x.clone().requires_grad_(True)
    y = lm(inputs_embeds=e).logits
    y[0, int(y[0].argmax())].backward()
    np.save(out + ".lxt.npy", (e * e.grad).detach().numpy())
    with torch.no_grad():
        ts = []
        for i in range(repeat + 1):
            t0 = time.perf_counter(); model(inputs_embeds=x); ts.append(time.perf_counter() - t0)
    res["torch_forward_s"] = min(ts[1:])
except ImportError as exc:
    res["lxt_error"] = str(exc)
print(json.dumps(res), flush=True)
# then one timed LXT explanation per request, so that the caller can alternate it with its own runs:
# "lxt" (parameters with gradients, LXT's default) or "lxt_nograd" (as LXT's README advises)
for line in sys.stdin:
    cmd = line.strip()
    if cmd not in ("lxt", "lxt_nograd"):
        break
    for prm in lm.parameters():
        prm.requires_grad_(cmd == "lxt")
    e = x.clone().requires_grad_(True)
    t0 = time.perf_counter()
    y = lm(inputs_embeds=e).logits
    y[0, int(y[0].argmax())].backward()
    print(json.dumps({"t": time.perf_counter() - t0}), flush=True)
'''


def _ref_python(arg):
    for cand in (arg, os.environ.get("LXT_PYTHON"), "/work/venv-lxt/bin/python"):
        if cand and Path(cand).exists():
            return cand
    return None


def build_helper_bert(path: Path, layers: int, seq: int, hidden: int = 768, heads: int = 12, inter: int = 3072):
    """A BERT-base-shaped encoder written with onnx.helper (no torch): embeddings input, post-LN layers, erf GELU."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def w(name, *shape, scale=0.02):
        inits.append(numpy_helper.from_array((rng.normal(size=shape) * scale).astype(np.float32), name))
        return name

    def c(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def n(op, ins, out, **kw):
        nodes.append(helper.make_node(op, ins, [out], name=out, **kw))
        return out

    dh = hidden // heads
    c("split_heads", np.array([1, seq, heads, dh], np.int64))
    c("merge_heads", np.array([1, seq, hidden], np.int64))
    c("scale", np.array(1 / np.sqrt(dh), np.float32))
    c("sqrt2", np.array(np.sqrt(2), np.float32))
    c("one", np.array(1.0, np.float32))
    c("half", np.array(0.5, np.float32))
    h = n("LayerNormalization", ["embeds", c("ln0_g", np.ones(hidden, np.float32)),
                                 c("ln0_b", np.zeros(hidden, np.float32))], "emb_ln", axis=-1, epsilon=1e-12)
    for i in range(layers):
        p = f"l{i}_"
        qkv = {}
        for k in "qkv":
            t = n("Add", [n("MatMul", [h, w(p + k + "_w", hidden, hidden)], p + k + "_mm"),
                          w(p + k + "_b", hidden)], p + k)
            t = n("Reshape", [t, "split_heads"], p + k + "_r")
            qkv[k] = n("Transpose", [t], p + k + "_t", perm=[0, 2, 3, 1] if k == "k" else [0, 2, 1, 3])
        s = n("Mul", [n("MatMul", [qkv["q"], qkv["k"]], p + "scores"), "scale"], p + "scaled")
        a = n("Softmax", [s], p + "probs", axis=-1)
        ctx = n("Transpose", [n("MatMul", [a, qkv["v"]], p + "ctx")], p + "ctx_t", perm=[0, 2, 1, 3])
        ctx = n("Reshape", [ctx, "merge_heads"], p + "ctx_r")
        o = n("Add", [n("MatMul", [ctx, w(p + "o_w", hidden, hidden)], p + "o_mm"), w(p + "o_b", hidden)], p + "o")
        h = n("LayerNormalization", [n("Add", [o, h], p + "res1"), c(p + "ln1_g", np.ones(hidden, np.float32)),
                                     c(p + "ln1_b", np.zeros(hidden, np.float32))], p + "ln1", axis=-1,
              epsilon=1e-12)
        f = n("Add", [n("MatMul", [h, w(p + "f1_w", hidden, inter)], p + "f1_mm"), w(p + "f1_b", inter)], p + "f1")
        g = n("Mul", [n("Mul", [f, n("Add", [n("Erf", [n("Div", [f, "sqrt2"], p + "g_div")], p + "g_erf"), "one"],
                                     p + "g_add")], p + "g_mul"), "half"], p + "gelu")
        f2 = n("Add", [n("MatMul", [g, w(p + "f2_w", inter, hidden)], p + "f2_mm"), w(p + "f2_b", hidden)], p + "f2")
        h = n("LayerNormalization", [n("Add", [f2, h], p + "res2"), c(p + "ln2_g", np.ones(hidden, np.float32)),
                                     c(p + "ln2_b", np.zeros(hidden, np.float32))], p + "ln2", axis=-1,
              epsilon=1e-12)
    cls = n("Gather", [h, c("zero_idx", np.array(0, np.int64))], "cls", axis=1)
    pooled = n("Tanh", [n("Gemm", [cls, w("pool_w", hidden, hidden), w("pool_b", hidden)], "pool")], "pooled")
    n("Gemm", [pooled, w("cls_w", hidden, 2), w("cls_b", 2)], "logits")
    graph = helper.make_graph(nodes, "bert", [helper.make_tensor_value_info("embeds", TensorProto.FLOAT,
                                                                            [1, seq, hidden])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 2])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return rng.normal(size=(1, seq, hidden)).astype(np.float32)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads for onnxruntime and torch (0: all)")
    ap.add_argument("--ref-python", default=None)
    ap.add_argument("--helper", action="store_true", help="build the model with onnx.helper even if torch is there")
    args = ap.parse_args(argv)

    import onnxruntime as ort

    import onnx_lrp

    tmp = Path(tempfile.mkdtemp(prefix="bench_transformer_"))
    path = tmp / "bert.onnx"
    ref = None if args.helper else _ref_python(args.ref_python)
    info = {}
    proc = None
    if ref:
        proc = subprocess.Popen([ref, "-c", _REF, str(args.layers), str(args.seq), str(args.threads), str(path),
                                 str(args.repeat)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        try:
            info = json.loads(line)
            x = np.load(str(path) + ".x.npy")
        except json.JSONDecodeError:
            print(f"reference python failed; building the model with onnx.helper\n{proc.stderr.read()[-1500:]}",
                  file=sys.stderr)
            proc.kill()
            ref, proc = None, None
        if proc is not None and "lxt_error" in info:
            proc.stdin.close()
            proc = None
    if not ref:
        x = build_helper_bert(path, args.layers, args.seq)
    source = "torch.onnx (transformers BertForSequenceClassification)" if ref else "onnx.helper"

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if args.threads:
        opts.intra_op_num_threads = args.threads
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])

    t0 = time.perf_counter()
    ex = onnx_lrp.Explainer(path, composite="attnlrp", threads=args.threads or None)
    t_build = time.perf_counter() - t0
    res = ex.explain(x)
    # alternate all of them, best of each: a load that comes and goes hits them alike (the pauses let each
    # library's spinning worker threads go idle before the other one runs)
    t_fwd = t_exp = float("inf")
    for _ in range(args.repeat):
        t_fwd = min(t_fwd, best(lambda: sess.run(None, {"embeds": x}), 1))
        t_exp = min(t_exp, best(lambda: ex.explain(x), 1))
        if proc is not None:
            for key in ("lxt", "lxt_nograd"):
                time.sleep(0.3)
                proc.stdin.write(key + "\n")
                proc.stdin.flush()
                info[key + "_s"] = min(info.get(key + "_s", float("inf")), json.loads(proc.stdout.readline())["t"])
            time.sleep(0.3)
    if proc is not None:
        proc.stdin.close()
        proc.wait()

    rows = [("onnxruntime forward", t_fwd, 1.0), ("onnx-lrp explain (attnlrp)", t_exp, t_exp / t_fwd)]
    if "torch_forward_s" in info:
        rows.append(("torch forward", info["torch_forward_s"], info["torch_forward_s"] / t_fwd))
    if "lxt_s" in info:
        rows.append(("LXT efficient AttnLRP", info["lxt_s"], info["lxt_s"] / t_fwd))
    if "lxt_nograd_s" in info:
        rows.append(("  same, no parameter gradients", info["lxt_nograd_s"], info["lxt_nograd_s"] / t_fwd))
    print(f"model: BERT-base shape, {args.layers} layers, hidden 768, sequence {args.seq}, batch 1, CPU "
          f"({os.cpu_count()} cores), built by {source}")
    print(f"{'what':32s} {'time [ms]':>10s} {'x forward':>10s}")
    for name, t, ratio in rows:
        print(f"{name:32s} {1000 * t:10.1f} {ratio:10.2f}")
    print(f"explainer build (load, rewrite, session): {t_build:.1f} s")
    print(f"explain / forward = {t_exp / t_fwd:.2f} (floor 2, target <= 2.1)")
    if "lxt_s" in info:
        print(f"LXT / explain     = {info['lxt_s'] / t_exp:.2f} (parameters with gradients, LXT's default)")
        if "lxt_nograd_s" in info:
            print(f"LXT without parameter gradients / explain = {info['lxt_nograd_s'] / t_exp:.2f} (target >= 1)")
        lxt = np.load(str(path) + ".lxt.npy")
        err = np.linalg.norm(res.relevance - lxt) / np.linalg.norm(lxt)
        print(f"relative L2 error to LXT on this model: {err:.2e}")
    elif "lxt_error" in info:
        print(f"LXT not available: {info['lxt_error']}")


if __name__ == "__main__":
    main()
