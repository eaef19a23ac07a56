"""Builds tests/goldens/llm: tiny decoder LLMs (random weights) in the forms people deploy them, with references.

Two architectures (transformers 4.57, eager attention, a byte-level BPE tokenizer of 300 tokens (no BOS added) trained here on a
few lines of text with ``tokenizers``):

* ``llama``: LLaMA, hidden 64, 2 layers, grouped-query attention with 4 query and 2 key/value heads (head 16),
  rotary embeddings, SiLU MLP of 128, untied embeddings;
* ``qwen2``: Qwen2 of the same sizes, with biases on the query / key / value projections (drawn at random, as the
  weights) and tied input / output embeddings.

Each is saved with ``save_pretrained`` (in a temporary folder; the weights are not committed) and converted by:

* optimum-onnx ``--task text-generation`` -> ``<arch>_optimum_nopast.onnx`` (no KV cache) and
  ``--task text-generation-with-past`` -> ``<arch>_optimum_past.onnx`` (``past_key_values.*`` in, ``present.*``
  out): single files, weights inside;
* onnxruntime-genai's model builder (``python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p P -e cpu``)
  -> folders ``<arch>_genai_<p>/`` (``genai_config.json``, ``model.onnx`` (+ ``model.onnx.data``), the tokenizer
  files): ``fp32`` and ``int4`` for both (LLaMA's int4 with the builder's CPU defaults: symmetric, block 32,
  ``accuracy_level`` 4; Qwen2's int4 asymmetric (zero points), block 16, ``accuracy_level`` 0, embeddings quantized
  too (``GatherBlockQuantized``, tied to the head)), and ``fp16`` for LLaMA where the builder writes it for the CPU
  (MultiHeadAttention and RotaryEmbedding in float16);
* the same builder with ``-e cuda`` (it writes CUDA folders without a GPU) -> ``llama_genai_fp16_cuda/``,
  ``llama_genai_bf16_cuda/`` (GroupQueryAttention with packed QKV and ``do_rotary``, in float16 / bfloat16) and
  ``llama_genai_int4_cuda/`` (MatMulNBits with float16 scales, no ``accuracy_level``). ``-p fp32 -e cuda`` is not
  kept: onnxruntime-genai 0.18 writes a graph whose ``present.*`` outputs no node produces (the ONNX checker and
  onnxruntime refuse it).

References, one ``<arch>.npz`` (and ``refs.json`` with what ran, versions and sizes):

* ``prompt_ids``: the fixed prompt ``PROMPT`` as onnxruntime-genai's tokenizer encodes it (the same as
  ``tokenizers``' ``tokenizer.json``, checked here);
* ``hf_logits``: the Hugging Face model's logits over the prompt (float32);
* per genai folder ``<p>``: ``genai_<p>_generated`` (onnxruntime-genai's own greedy generation of ``N_NEW`` tokens
  after the prompt, ``do_sample=False``; the new tokens only) and ``genai_<p>_logits`` (its logits for the prompt,
  the ``logits`` output after ``append_tokens``); for the CUDA folders in ``<arch>_cuda.npz`` (onnxruntime-genai run
  on the CPU, its providers cleared; none for bf16, which has no CPU kernels);
* ``lxt_relevance64`` / ``lxt_relevance32``, ``lxt_target``: LXT 2.1's efficient AttnLRP (``monkey_patch`` of
  transformers' llama / qwen2 modules) on the Hugging Face model for the arg-max logit at the prompt's last
  position, the gradient seeded with 1 (onnx-lrp's ``start="logit"``), embeddings x gradient summed over the hidden
  axis, in float64 and float32; ``lxt_relevance_embeds64`` keeps the hidden axis.

Needs (none a dependency of onnx-lrp): torch, transformers 4.57, optimum-onnx 0.1, lxt 2.1, onnxruntime-genai 0.18,
tokenizers. onnxruntime-genai 0.18's builder imports classes of transformers 5 while LXT 2.1 needs transformers 4,
so the builder runs in a second environment (``--builder-python``) that sees the first one's packages::

    python -m venv /work/llmenv && /work/llmenv/bin/pip install torch transformers==4.57.6 optimum-onnx lxt==2.1 \\
        onnxruntime-genai onnx onnx-ir tokenizers accelerate
    python -m venv /work/llmenv-genai
    echo /work/llmenv/lib/python3.11/site-packages > /work/llmenv-genai/lib/python3.11/site-packages/llmenv.pth
    /work/llmenv-genai/bin/pip install transformers==5.24.0
    /work/llmenv/bin/python scripts/make_llm_models.py --builder-python /work/llmenv-genai/bin/python
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "goldens" / "llm"
ARCHS = ("llama", "qwen2")
PROMPT = "the cat sat on the mat and the dog"
N_NEW = 8
VOCAB = 300
SHAPE = (64, 128, 2, 4, 2, VOCAB)  # hidden, intermediate, layers, heads, key/value heads, vocabulary
CONTEXT = 64  # max_position_embeddings: the genai folder's context_length
BOS, EOS = "<|bos|>", "<|eos|>"
CORPUS = """the cat sat on the mat and looked at the dog
the dog ran after the cat across the green field
a bird sang in the tree while the sun went down
the quick brown fox jumps over the lazy dog
paris is the capital of france and berlin is the capital of germany
once upon a time there was a little model that wanted to explain itself
every token the model writes depends on every token before it""".splitlines()
GENAI = {  # folder suffix -> builder arguments per architecture (None: not built); -e cpu unless they say -e
    "fp32": {"llama": ["-p", "fp32"], "qwen2": ["-p", "fp32"]},
    "fp16": {"llama": ["-p", "fp16"], "qwen2": None},
    "int4": {"llama": ["-p", "int4"],
             "qwen2": ["-p", "int4", "--extra_options", "is_symmetric=false", "block_size=16", "accuracy_level=0",
                       "algo_config=rtn"]},
    # the CUDA folders (written without a GPU): GroupQueryAttention in float16 / bfloat16, MatMulNBits with float16
    # scales; their references in <arch>_cuda.npz (onnxruntime-genai on the CPU, its providers cleared)
    "fp16_cuda": {"llama": ["-p", "fp16", "-e", "cuda"], "qwen2": ["-p", "fp16", "-e", "cuda"]},
    "bf16_cuda": {"llama": ["-p", "bf16", "-e", "cuda"], "qwen2": ["-p", "bf16", "-e", "cuda"]},
    "int4_cuda": {"llama": ["-p", "int4", "-e", "cuda"], "qwen2": ["-p", "int4", "-e", "cuda"]},
}


def tokenizer_files(out: Path) -> None:
    """A byte-level BPE of VOCAB tokens, saved as a Hugging Face tokenizer.

    No post-processor: onnxruntime-genai's tokenizer prepends no BOS (whatever tokenizer_config.json says), and the
    ids must be the same whichever reads tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS)
    fast.save_pretrained(out)


def hf_model(arch: str, hf_dir: Path, shape=SHAPE):
    """The random-weight model, saved with its tokenizer; returns the torch model (eval, float32). ``shape``:
    (hidden, intermediate, layers, heads, key/value heads, vocabulary; at least the tokenizer's)."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    hidden, inter, layers, heads, kv, vocab = shape
    common = dict(vocab_size=max(len(tok), vocab), hidden_size=hidden, intermediate_size=inter,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                  max_position_embeddings=CONTEXT,
                  initializer_range=0.2, rope_theta=10000.0, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, attn_implementation="eager")
    torch.manual_seed(0 if arch == "llama" else 1)
    if arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **common))
    else:
        from transformers import Qwen2Config, Qwen2ForCausalLM
        model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, use_sliding_window=False, **common))
    with torch.no_grad():  # transformers zero-initialises biases and sets the norms to 1: draw them too
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.2)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    model.eval()
    model.save_pretrained(hf_dir, safe_serialization=True)
    model.generation_config.save_pretrained(hf_dir)
    return model


def optimum_export(hf_dir: Path, task: str, target: Path) -> str:
    """One optimum-onnx export as a single file (weights inside)."""
    import onnx
    from optimum.exporters.onnx import main_export

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main_export(str(hf_dir), output=tmp, task=task, opset=17, device="cpu", do_validation=False)
        files = sorted(Path(tmp).glob("*.onnx"))
        if len(files) != 1:
            return f"failed: optimum wrote {[f.name for f in files]}"
        onnx.save(onnx.load(str(files[0])), str(target))  # external data (if any) back inside
    return "ok"


def genai_build(builder_python: str, hf_dir: Path, args: list, target: Path) -> str:
    """onnxruntime-genai's builder on the saved model into ``target`` (a folder), the cache in a temporary folder."""
    with tempfile.TemporaryDirectory() as cache:
        cmd = [builder_python, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(target),
               "-c", cache] + ([] if "-e" in args else ["-e", "cpu"]) + args
        done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    if done.returncode != 0 or not (target / "genai_config.json").exists():
        shutil.rmtree(target, ignore_errors=True)
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        return f"failed: {tail[0][:300]}"
    return "ok"


def genai_model(folder: Path):
    """onnxruntime-genai's model of ``folder`` on the CPU (a CUDA folder's providers cleared)."""
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    config.clear_providers()
    return og.Model(config)


def genai_reference(folder: Path, prompt_ids: list) -> dict:
    """onnxruntime-genai's greedy generation (the new tokens) and its logits for the prompt; ``error``: what failed
    (a model it cannot run on the CPU: no logits either)."""
    import onnxruntime_genai as og

    logits = None
    try:
        model = genai_model(folder)
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt_ids) + N_NEW, batch_size=1)
        gen = og.Generator(model, params)
        gen.append_tokens(np.asarray(prompt_ids, dtype=np.int32))
        logits = np.asarray(gen.get_output("logits"), dtype=np.float32)
        while not gen.is_done():
            gen.generate_next_token()
    except RuntimeError as exc:  # recorded: the folder stays, without generated ids
        return {"error": str(exc).splitlines()[0][:300]} | ({"logits": logits} if logits is not None else {})
    seq = np.asarray(gen.get_sequence(0), dtype=np.int64)
    return {"generated": seq[len(prompt_ids):], "logits": logits}


def genai_prompt_ids(folder: Path) -> list:
    """The prompt as onnxruntime-genai's tokenizer encodes it (tokenizers' reading of the folder's tokenizer.json
    where onnxruntime-genai cannot load the model on the CPU)."""
    import onnxruntime_genai as og
    from tokenizers import Tokenizer

    try:
        return [int(i) for i in og.Tokenizer(genai_model(folder)).encode(PROMPT)]
    except RuntimeError:
        return Tokenizer.from_file(str(folder / "tokenizer.json")).encode(PROMPT).ids


def lxt_relevance(arch: str, hf_dir: Path, ids: list, dtype: str) -> tuple:
    """LXT's efficient AttnLRP relevance per token (and per embedding unit) for the last position's arg-max logit."""
    import torch
    from lxt.efficient import monkey_patch

    if arch == "llama":
        from transformers.models.llama import modeling_llama as module
        cls = module.LlamaForCausalLM
    else:
        from transformers.models.qwen2 import modeling_qwen2 as module
        cls = module.Qwen2ForCausalLM
    monkey_patch(module)
    model = cls.from_pretrained(hf_dir, attn_implementation="eager", torch_dtype=getattr(torch, dtype)).eval()
    x = torch.tensor([ids])
    emb = model.get_input_embeddings()(x).detach().requires_grad_(True)
    logits = model(inputs_embeds=emb, use_cache=False).logits
    target = int(logits[0, -1].argmax())
    logits[0, -1, target].backward()
    rel = (emb * emb.grad).detach()[0]
    return target, rel.sum(-1).numpy(), rel.numpy()


def lxt_in_process(arch: str, hf_dir: Path, ids: list, out: Path) -> None:
    """LXT patches transformers' modules globally: each run in its own process."""
    cmd = [sys.executable, __file__, "--lxt-only", arch, "--hf-dir", str(hf_dir), "--ids", ",".join(map(str, ids)),
           "--lxt-out", str(out)]
    subprocess.run(cmd, check=True)


def one(arch: str, out: Path, args, tok_dir: Path, work: Path) -> dict:
    import torch

    builder_python = args.builder_python
    hf_dir = work / f"{arch}_hf"
    shutil.copytree(tok_dir, hf_dir)
    model = hf_model(arch, hf_dir, tuple(args.shape))
    status = {}
    for task, suffix in (("text-generation", "nopast"), ("text-generation-with-past", "past")):
        status[f"{arch}_optimum_{suffix}"] = optimum_export(hf_dir, task, out / f"{arch}_optimum_{suffix}.onnx")
    arrays, cuda = {}, {}
    for precision, per_arch in GENAI.items():
        if per_arch[arch] is None:
            continue
        folder = out / f"{arch}_genai_{precision}"
        shutil.rmtree(folder, ignore_errors=True)
        status[folder.name] = genai_build(builder_python, hf_dir, per_arch[arch], folder)
        if status[folder.name] != "ok" or not args.refs:
            continue
        ids = genai_prompt_ids(folder)
        arrays.setdefault("prompt_ids", np.asarray(ids, dtype=np.int64))
        if ids != arrays["prompt_ids"].tolist():
            raise SystemExit(f"{folder.name}: genai tokenizes the prompt as {ids}, not {arrays['prompt_ids']}")
        ref = genai_reference(folder, ids)
        put = cuda if precision.endswith("_cuda") else arrays  # existing goldens stay as they were
        if "logits" in ref:
            put[f"genai_{precision}_logits"] = ref["logits"]
        if "error" in ref:
            status[folder.name] = f"built; onnxruntime-genai's own generation fails: {ref['error']}"
        else:
            put[f"genai_{precision}_generated"] = ref["generated"]
    if not args.refs:
        return status
    ids = arrays["prompt_ids"].tolist()
    from tokenizers import Tokenizer
    hf_ids = Tokenizer.from_file(str(tok_dir / "tokenizer.json")).encode(PROMPT).ids
    if hf_ids != ids:
        raise SystemExit(f"tokenizer.json encodes the prompt as {hf_ids}, onnxruntime-genai as {ids}")
    with torch.no_grad():
        arrays["hf_logits"] = model(torch.tensor([ids]), use_cache=False).logits.numpy().astype(np.float32)
    lxt_file = work / f"{arch}_lxt.npz"
    lxt_in_process(arch, hf_dir, ids, lxt_file)
    arrays.update(dict(np.load(lxt_file)))
    np.savez_compressed(out / f"{arch}.npz", **arrays)
    if cuda:
        np.savez_compressed(out / f"{arch}_cuda.npz", prompt_ids=arrays["prompt_ids"], **cuda)
    return status


def lxt_only(args) -> None:
    ids = [int(i) for i in args.ids.split(",")]
    arrays = {}
    for dtype, tag in (("float64", "64"), ("float32", "32")):
        target, tokens, embeds = lxt_relevance(args.lxt_only, Path(args.hf_dir), ids, dtype)
        arrays[f"lxt_relevance{tag}"] = tokens
        arrays["lxt_target"] = np.int64(target)
        if tag == "64":
            arrays["lxt_relevance_embeds64"] = embeds
    np.savez(args.lxt_out, **arrays)


def sizes(out: Path) -> dict:
    return {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}


def versions() -> dict:
    from importlib.metadata import version
    return {p: version(p) for p in ("torch", "transformers", "optimum-onnx", "onnxruntime-genai", "onnxruntime",
                                     "lxt", "tokenizers")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--archs", nargs="+", default=list(ARCHS), choices=ARCHS)
    ap.add_argument("--builder-python", default=sys.executable,
                    help="a python whose transformers onnxruntime-genai's builder can import")
    ap.add_argument("--shape", type=lambda v: [int(i) for i in v.split(",")], default=list(SHAPE),
                    metavar="H,I,L,HEADS,KV,V", help="larger models for benchmarks/bench_llm.py --forms (with --no-refs)")
    ap.add_argument("--no-refs", dest="refs", action="store_false",
                    help="no references (genai's generation, logits, LXT): the models only")
    ap.add_argument("--lxt-only", help=argparse.SUPPRESS)
    ap.add_argument("--hf-dir", help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    ap.add_argument("--lxt-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.lxt_only:
        return lxt_only(args)
    args.out.mkdir(parents=True, exist_ok=True)
    old = args.out / "refs.json"
    status = json.loads(old.read_text())["status"] if old.exists() else {}  # a run of some --archs keeps the others
    with tempfile.TemporaryDirectory() as work:
        tok_dir = Path(work) / "tokenizer"
        tokenizer_files(tok_dir)
        for arch in args.archs:
            status.update(one(arch, args.out, args, tok_dir, Path(work)))
            print(arch, {k: v for k, v in status.items() if k.startswith(arch)}, flush=True)
    refs = {"prompt": PROMPT, "n_new": N_NEW, "context_length": CONTEXT, "status": status, "versions": versions()}
    (args.out / "refs.json").write_text(json.dumps(refs, indent=1) + "\n")
    refs["sizes"] = sizes(args.out)
    (args.out / "refs.json").write_text(json.dumps(refs, indent=1) + "\n")
    print(f"{sum(refs['sizes'].values()) / 1e6:.2f} MB in {args.out}")


if __name__ == "__main__":
    main()
