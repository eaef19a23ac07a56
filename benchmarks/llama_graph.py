"""The LLaMA graph of ``bench_llm.py`` written directly with onnx_ir, random weights streamed to external data.

``bench_llm.py`` exports transformers' ``LlamaForCausalLM`` (eager attention, no cache) from ``inputs_embeds`` with a
4-D additive causal mask through torch.onnx's TorchScript exporter at opset 17 (``llama_export.py``). That takes
minutes and twice the weights' memory for a billion parameters. :func:`write` writes the same graph, node for node
(op types, order, attributes, constants, the exporter's node and value names; only the weights' names differ), with
its weights written straight to one external data file as they are drawn, chunk by chunk on ``threads`` threads: no
tensor larger than a chunk is ever held, no protobuf holds a weight. (Under 2 GiB of weights they are then read into
the model file, as torch.onnx stores such a model.) ``tests/parity/test_llm_graph.py`` checks it against
the exporter at a small size (graph and numbers). What the exporter writes, per decoder layer (transformers 5):

* RMSNorm: ``Cast`` to float32, ``Pow 2``, ``ReduceMean``, ``Add eps``, ``Sqrt``, ``Div 1 /``, ``Mul``, ``Cast``
  back, ``Mul`` by the weight. In a float32 model the residual reads the first Cast's output (``.to(float32)``
  returns its input, and the tracer records the Cast); in float16 / bfloat16 the norm's input itself.
* attention: q / k / v ``MatMul`` (weights stored transposed, ``[in, out]``), ``Reshape`` + ``Transpose``; rotary
  embedding (``Mul`` by cos, ``Slice`` / ``Neg`` / ``Concat``, ``Mul`` by sin, ``Add``) with cos / sin from one
  folded float32 angle table (``Cos`` / ``Sin``, ``Mul`` by the attention scaling 1.0, ``Cast`` to the model's
  type); grouped-query ``repeat_kv`` (``Unsqueeze``, ``Expand`` with the exporter's Where-on-shape, ``Reshape``);
  ``MatMul`` q k^T, ``Mul`` by the scaling, ``Add`` of the causal mask constant, ``Softmax``, ``Cast`` to float32
  and back, ``MatMul`` with v, ``Transpose`` + ``Reshape``, ``MatMul`` o_proj, residual ``Add``.
* MLP: gate ``MatMul``, ``Sigmoid`` + ``Mul`` (SiLU), up ``MatMul``, ``Mul``, down ``MatMul``, residual ``Add``.

Then the final RMSNorm and the lm_head ``MatMul`` to ``logits``. The sequence length is static (the export's is).

Weights as ``bench_llm``'s export draws them (normal * 0.5 / sqrt(fan-in); norm weights 1 + 0.1 normal), from
numpy generators seeded per (seed, tensor, chunk): the same values for any ``threads`` and any ``dtype`` (each
rounded to it), so a float32 graph written with ``round_to="bfloat16"`` is the bfloat16 model's float32 twin.
``weights=`` takes given float32 tensors instead (torch's state-dict names and layout), as the test does.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx_ir as ir

DTYPES = {"float32": (ir.DataType.FLOAT, np.dtype(np.float32)),
          "float16": (ir.DataType.FLOAT16, np.dtype(np.float16)),
          "bfloat16": (ir.DataType.BFLOAT16, np.dtype(ml_dtypes.bfloat16))}
CHUNK = 1 << 23  # elements drawn at once (32 MB of float32)
ALIGN = 1 << 16  # offsets of tensors over ALIGN_MIN bytes in the data file (memory-mappable at any page size)
ALIGN_MIN = 1 << 20
INLINE_MAX = 2 << 30  # bytes of weights from which they are external data (torch.onnx: a protobuf's limit)
INT64_MAX = np.iinfo(np.int64).max


SIZES = {  # hidden, intermediate, layers, heads, kv heads, vocabulary
    "tiny": (64, 128, 2, 4, 2, 256),
    "0.1b": (512, 2048, 16, 8, 4, 32000),
    "0.6b": (1024, 4096, 36, 16, 8, 32000),
    "1b": (2048, 8192, 16, 32, 8, 128256),
    "8b": (4096, 14336, 32, 32, 8, 128256),
}


@dataclass(frozen=True)
class Shape:
    """A LLaMA configuration: what :data:`SIZES` lists (LlamaConfig's defaults for the rest)."""

    hidden: int
    inter: int
    layers: int
    heads: int
    kv: int
    vocab: int
    theta: float = 10000.0
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params(self) -> int:
        """Parameters of LlamaForCausalLM with this shape (the input embedding included, untied)."""
        dh = self.head_dim
        layer = 2 * self.hidden * self.heads * dh + 2 * self.hidden * self.kv * dh + 3 * self.hidden * self.inter \
            + 2 * self.hidden
        return 2 * self.vocab * self.hidden + self.layers * layer + self.hidden

    def tensors(self):
        """(state-dict name, torch shape) of every weight the graph reads, in the order it reads them."""
        h, dh = self.hidden, self.head_dim
        for i in range(self.layers):
            p = f"model.layers.{i}."
            yield p + "input_layernorm.weight", (h,)
            yield p + "self_attn.q_proj.weight", (self.heads * dh, h)
            yield p + "self_attn.k_proj.weight", (self.kv * dh, h)
            yield p + "self_attn.v_proj.weight", (self.kv * dh, h)
            yield p + "self_attn.o_proj.weight", (h, self.heads * dh)
            yield p + "post_attention_layernorm.weight", (h,)
            yield p + "mlp.gate_proj.weight", (self.inter, h)
            yield p + "mlp.up_proj.weight", (self.inter, h)
            yield p + "mlp.down_proj.weight", (h, self.inter)
        yield "model.norm.weight", (h,)
        yield "lm_head.weight", (self.vocab, h)


def inv_freq(shape: Shape, dtype: str = "float32") -> np.ndarray:
    """The rotary inverse frequencies 1 / theta ** (2i / head_dim), computed in float32 as transformers does, then
    rounded to ``dtype`` as ``model.to(dtype)`` rounds the buffer (the export folds that into the angle table)."""
    dh = shape.head_dim
    f = np.float32(1) / (np.float32(shape.theta) ** (np.arange(0, dh, 2, dtype=np.float32) / np.float32(dh)))
    return f.astype(DTYPES[dtype][1]).astype(np.float32)


def embeds(shape: Shape, seq: int, dtype: str = "float32", seed: int = 0) -> np.ndarray:
    """A [1, seq, hidden] input as bench_llm's export feeds (embedding rows: normal * 0.5 / sqrt(hidden)), its values
    representable in ``dtype``, as float32."""
    rng = np.random.default_rng([seed, 1 << 30])
    x = rng.standard_normal((1, seq, shape.hidden), dtype=np.float32) * np.float32(0.5 / shape.hidden ** 0.5)
    return x.astype(DTYPES[dtype][1]).astype(np.float32)


class _Data:
    """One external data file written tensor by tensor; a tensor's chunks are drawn on a thread pool and written in
    order, at most ``2 * threads`` chunks in memory."""

    def __init__(self, folder: Path, location: str, threads: int):
        self.folder, self.location = folder, location
        self.file = open(folder / location, "wb")
        self.pool = ThreadPoolExecutor(threads)
        self.window = 2 * threads

    def close(self):
        self.file.close()
        self.pool.shutdown()

    def add(self, name: str, dims: tuple, dtype: str, jobs: list) -> ir.ExternalTensor:
        """Write the chunks ``jobs`` (functions returning the next float32 elements, in row-major order)."""
        np_type = DTYPES[dtype][1]
        if int(np.prod(dims)) * np_type.itemsize > ALIGN_MIN:
            self.file.write(b"\0" * (-self.file.tell() % ALIGN))
        offset = self.file.tell()
        for start in range(0, len(jobs), self.window):
            for a in self.pool.map(lambda job: job().astype(np_type), jobs[start:start + self.window]):
                self.file.write(a.view(np.uint8).data)
        length = self.file.tell() - offset
        assert length == int(np.prod(dims)) * np_type.itemsize, (name, length, dims)
        return ir.ExternalTensor(self.location, offset, length, DTYPES[dtype][0], shape=ir.Shape(dims), name=name,
                                 base_dir=str(self.folder))


def _drawn(seed: int, index: int, torch_shape: tuple, round_to: str | None):
    """Chunk functions for weight number ``index``, drawn directly in the graph's layout ([in, out] for a MatMul
    weight: the draws are independent, the layout does not matter)."""
    n = int(np.prod(torch_shape))
    norm = len(torch_shape) == 1
    scale = np.float32(0.1 if norm else 0.5 / torch_shape[-1] ** 0.5)

    def job(c):
        def draw():
            a = np.random.default_rng([seed, index, c]).standard_normal(min(CHUNK, n - c * CHUNK), np.float32)
            a *= scale
            if norm:
                a += np.float32(1)
            return a if round_to is None else a.astype(DTYPES[round_to][1]).astype(np.float32)
        return draw

    return [job(c) for c in range((n + CHUNK - 1) // CHUNK)]


def _given(array: np.ndarray):
    """One chunk function for a given tensor (torch layout): a 2-D weight transposed to [in, out]."""
    a = np.asarray(array, np.float32)
    return [lambda: np.ascontiguousarray(a.T if a.ndim == 2 else a)]


class _Builder:
    """Nodes named as torch.onnx names them: ``<scope>/<Op>[_k]`` with output ``<name>_output_0``."""

    def __init__(self, dtype: str):
        self.nodes, self.counts = [], {}
        self.dtype, self.low = DTYPES[dtype][0], DTYPES[dtype][1]
        self.rope = self.unsqueezed = None  # the rotary cos / sin, and their Unsqueeze for the attention

    def op(self, scope: str, op_type: str, inputs, out: str | None = None, node_name: str | None = None,
           **attrs) -> ir.Value:
        k = self.counts.get((scope, op_type), 0)
        self.counts[(scope, op_type)] = k + 1
        name = node_name or f"{scope}/{op_type}" + (f"_{k}" if k else "")
        value = ir.Value(name=out or f"{name}_output_0")
        self.nodes.append(ir.node(op_type, list(inputs), attrs or None, outputs=[value], name=name))
        return value

    def const(self, scope: str, array) -> ir.Value:
        return self.op(scope, "Constant", [], value=ir.tensor(np.asarray(array)))

    def ints(self, scope: str, values, scalar: bool = False) -> ir.Value:
        return self.const(scope, np.array(values[0] if scalar else values, np.int64))


def _rms_norm(b: _Builder, scope: str, x: ir.Value, weight: ir.Value, eps: float) -> tuple:
    """transformers' LlamaRMSNorm as exported; returns (output, the residual's value)."""
    x32 = b.op(scope, "Cast", [x], to=ir.DataType.FLOAT.value)
    var = b.op(scope, "ReduceMean", [b.op(scope, "Pow", [x32, b.const(scope, np.float32(2))])], axes=[-1],
               keepdims=1)
    std = b.op(scope, "Sqrt", [b.op(scope, "Add", [var, b.const(scope, np.float32(eps))])])
    normed = b.op(scope, "Mul", [x32, b.op(scope, "Div", [b.const(scope, np.float32(1)), std])])
    y = b.op(scope, "Mul", [weight, b.op(scope, "Cast", [normed], to=b.dtype.value)])
    return y, (x32 if b.dtype == ir.DataType.FLOAT else x)


def _rotate(b: _Builder, scope: str, t: ir.Value, cos: ir.Value, sin: ir.Value, dh: int) -> ir.Value:
    """t * cos + rotate_half(t) * sin."""
    t_cos = b.op(scope, "Mul", [t, cos])
    halves = []
    for lo, hi in ((0, dh // 2), (dh // 2, INT64_MAX)):
        axes, starts, ends, steps = (b.ints(scope, [v]) for v in (3, lo, hi, 1))
        halves.append(b.op(scope, "Slice", [t, starts, ends, axes, steps]))
    rotated = b.op(scope, "Concat", [b.op(scope, "Neg", [halves[1]]), halves[0]], axis=-1)
    return b.op(scope, "Add", [t_cos, b.op(scope, "Mul", [rotated, sin])])


def _expand(b: _Builder, scope: str, t: ir.Value, dims: list) -> ir.Value:
    """torch's ``expand`` as exported: the target shape through ConstantOfShape / Equal / Where (-1 keeps a dim)."""
    target = b.ints(scope, dims)
    ones = b.op(scope, "ConstantOfShape", [b.ints(scope, [len(dims)])], value=ir.tensor(np.array([1], np.int64)))
    minus = b.op(scope, "Mul", [ones, b.ints(scope, [-1], scalar=True)])
    return b.op(scope, "Expand", [t, b.op(scope, "Where", [b.op(scope, "Equal", [target, minus]), ones, target])])


def _repeat_kv(b: _Builder, scope: str, t: ir.Value, shape: Shape, seq: int) -> ir.Value:
    """repeat_kv as exported: Unsqueeze, Expand to [1, kv, n_rep, seq, dh], Reshape to [1, heads, seq, dh]."""
    n_rep, dh = shape.heads // shape.kv, shape.head_dim
    if n_rep == 1:
        return t
    t = _expand(b, scope, b.op(scope, "Unsqueeze", [t, b.ints(scope, [2])]), [1, shape.kv, n_rep, seq, dh])
    return b.op(scope, "Reshape", [t, b.ints(scope, [1, shape.heads, seq, dh])], allowzero=0)


def _attention(b: _Builder, scope: str, x: ir.Value, w: dict, shape: Shape, seq: int) -> ir.Value:
    """Self-attention; cos / sin (``b.rope``) are unsqueezed by the first layer, whose Unsqueeze nodes every layer
    reads (the exporter's common-subexpression elimination)."""
    dh = shape.head_dim
    heads, views = [], []
    for p in "qkv":  # the exporter writes q's MatMul, then the three views' shapes, then the rest in order
        t = b.op(f"{scope}/{p}_proj", "MatMul", [x, w[p]])
        views = views or [b.ints(scope, [1, seq, -1, dh]) for _ in range(3)]
        t = b.op(scope, "Reshape", [t, views[len(heads)]], allowzero=0)
        heads.append(b.op(scope, "Transpose", [t], perm=[0, 2, 1, 3]))
    q, k, v = heads
    if b.unsqueezed is None:
        b.unsqueezed = tuple(b.op(scope, "Unsqueeze", [t, b.ints(scope, [1])]) for t in b.rope)
    cos, sin = b.unsqueezed
    q, k = _rotate(b, scope, q, cos, sin, dh), _rotate(b, scope, k, cos, sin, dh)
    k, v = _repeat_kv(b, scope, k, shape, seq), _repeat_kv(b, scope, v, shape, seq)
    scores = b.op(scope, "MatMul", [q, b.op(scope, "Transpose", [k], perm=[0, 1, 3, 2])])
    scores = b.op(scope, "Mul", [scores, b.const(scope, np.array(np.float32(dh ** -0.5), b.low))])
    mask = np.triu(np.full((1, 1, seq, seq), _lowest(b.low), np.float32), 1).astype(b.low)
    p = b.op(scope, "Softmax", [b.op(scope, "Add", [scores, b.const(scope, mask)])], axis=-1)
    p = b.op(scope, "Cast", [b.op(scope, "Cast", [p], to=ir.DataType.FLOAT.value)], to=b.dtype.value)
    out = b.op(scope, "Transpose", [b.op(scope, "MatMul", [p, v])], perm=[0, 2, 1, 3])
    out = b.op(scope, "Reshape", [out, b.ints(scope, [1, seq, -1])], allowzero=0)
    return b.op(f"{scope}/o_proj", "MatMul", [out, w["o"]])


def _lowest(np_type: np.dtype) -> float:
    return float(ml_dtypes.finfo(np_type).min)


def _layer(b: _Builder, i: int, h: ir.Value, w: dict, shape: Shape, seq: int) -> ir.Value:
    scope = f"/m/model/layers.{i}"
    x, residual = _rms_norm(b, f"{scope}/input_layernorm", h, w["input_layernorm"], shape.eps)
    h = b.op(scope, "Add", [residual, _attention(b, f"{scope}/self_attn", x, w, shape, seq)])
    x, residual = _rms_norm(b, f"{scope}/post_attention_layernorm", h, w["post_attention_layernorm"], shape.eps)
    m = f"{scope}/mlp"
    gate = b.op(f"{m}/gate_proj", "MatMul", [x, w["gate"]])
    act = b.op(f"{m}/act_fn", "Mul", [gate, b.op(f"{m}/act_fn", "Sigmoid", [gate])])
    down = b.op(f"{m}/down_proj", "MatMul", [b.op(m, "Mul", [act, b.op(f"{m}/up_proj", "MatMul", [x, w["up"]])]),
                                              w["down"]])
    return b.op(scope, "Add", [residual, down])


def _rope(b: _Builder, freqs: np.ndarray, seq: int, rope: str) -> None:
    """cos / sin of the angle table [1, seq, head_dim] (float32), times the attention scaling, cast to the model's
    type (``b.rope``). ``rope="folded"`` (transformers 5: position * inv_freq): the exporter folds the table into a
    Constant; ``"computed"`` (transformers 4: inv_freq[None, :, None] expanded, MatMul with the positions [1, 1,
    seq], transposed) it is computed from an unscoped Constant of inv_freq."""
    s = "/m/model/rotary_emb"
    if rope == "folded":
        angles = np.arange(seq, dtype=np.float32)[:, None] * freqs[None, :]
        table = b.const(s, np.concatenate([angles, angles], -1)[None])
    else:
        inv = b.op("", "Constant", [], value=ir.tensor(freqs.reshape(1, -1, 1)), node_name="Constant_0",
                   out="onnx::Expand_0")
        inv = b.op(s, "Cast", [b.op(s, "Cast", [_expand(b, s, inv, [1, -1, 1])], to=ir.DataType.FLOAT.value)],
                   to=ir.DataType.FLOAT.value)
        angles = b.op(s, "MatMul", [inv, b.const(s, np.arange(seq, dtype=np.float32).reshape(1, 1, seq))])
        angles = b.op(s, "Transpose", [angles], perm=[0, 2, 1])
        table = b.op(s, "Concat", [angles, angles], axis=-1)
    out = []
    for fn in ("Cos", "Sin"):
        out.append(b.op(s, "Mul", [b.op(s, fn, [table]), b.const(s, np.float32(1))]))
    b.rope = tuple(b.op(s, "Cast", [t], to=b.dtype.value) for t in out)


def _weights(shape: Shape, dtype: str, data: _Data, weights, seed: int, round_to: str | None) -> list:
    """Every weight as an initializer value (written to ``data`` in the order the graph reads them)."""
    values = []
    for index, (name, dims) in enumerate(shape.tensors()):
        jobs = _given(weights[name]) if weights is not None else _drawn(seed, index, dims, round_to)
        onnx_name = "m." + name + (".T" if len(dims) == 2 else "")  # MatMul weights: transposed, [in, out]
        onnx_dims = tuple(reversed(dims))
        t = data.add(onnx_name, onnx_dims, dtype, jobs)
        values.append(ir.Value(name=onnx_name, shape=ir.Shape(onnx_dims), type=ir.TensorType(DTYPES[dtype][0]),
                               const_value=t))
    return values


def write(folder, shape: Shape, seq: int, dtype: str = "float32", *, weights=None, seed: int = 0,
          round_to: str | None = None, freqs: np.ndarray | None = None, threads: int | None = None,
          name: str = "llama.onnx", external: bool | None = None, rope: str = "folded") -> Path:
    """Write ``folder/name`` and its data file ``name.data``; returns the model's path.

    ``weights``: float32 arrays by state-dict name in torch's layout (default: drawn from ``seed``);
    ``round_to``: draw, round to this type, store in ``dtype`` (a float32 twin of a bfloat16 model);
    ``freqs``: the rotary inverse frequencies (default :func:`inv_freq`);
    ``external``: weights in the data file, or in the model file (None: as torch.onnx stores them, in the data file
    from 2 GiB of weights on); ``rope``: the rotary table as transformers 5 ("folded") or 4 ("computed") exports."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = _Data(folder, name + ".data", threads or os.cpu_count() or 1)
    try:
        inits = _weights(shape, dtype, data, weights, seed, round_to)
    finally:
        data.close()
    b = _Builder(dtype)
    x = ir.Value(name="embeds", shape=ir.Shape([1, seq, shape.hidden]), type=ir.TensorType(b.dtype))
    _rope(b, inv_freq(shape, round_to or dtype) if freqs is None else np.asarray(freqs, np.float32), seq, rope)
    per = iter(inits)
    h = x
    for i in range(shape.layers):
        w = {"input_layernorm": next(per)}
        w.update((k, next(per)) for k in "qkvo")
        w["post_attention_layernorm"] = next(per)
        w.update((k, next(per)) for k in ("gate", "up", "down"))
        h = _layer(b, i, h, w, shape, seq)
    y, _ = _rms_norm(b, "/m/model/norm", h, next(per), shape.eps)
    logits = b.op("/m/lm_head", "MatMul", [y, next(per)], out="logits")
    logits.shape, logits.type = ir.Shape([1, seq, shape.vocab]), ir.TensorType(b.dtype)
    graph = ir.Graph([x], [logits], nodes=b.nodes, initializers=inits, opset_imports={"": 17}, name="main_graph")
    model = ir.Model(graph, ir_version=8, producer_name="onnx-lrp benchmarks/llama_graph.py")
    path = folder / name
    if external is None:
        external = sum(v.const_value.nbytes for v in inits) >= INLINE_MAX
    if not external:  # read into the protobuf, as torch.onnx writes a model under 2 GiB
        for v in inits:
            v.const_value = ir.tensor(v.const_value.numpy(), name=v.name)
    ir.save(model, path)  # external: the weights stay where _Data wrote them
    if not external:
        (folder / (name + ".data")).unlink()
    return path


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description="write the LLaMA graph of bench_llm directly (random weights)")
    ap.add_argument("folder")
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    shape = Shape(*SIZES[args.size])
    t0 = time.perf_counter()
    path = write(args.folder, shape, args.seq, args.dtype, threads=args.threads or None)
    size = sum(f.stat().st_size for f in path.parent.iterdir() if f.name.startswith(path.name))
    print(f"{path}: {shape.params() / 1e9:.2f} B parameters, {size / 1e9:.2f} GB ({args.dtype}) written in "
          f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
