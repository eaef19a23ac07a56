"""Keras GRU / SimpleRNN / LSTM classifiers and their Flax and PyTorch twins (tests/goldens/recurrent_twins).

Per recurrent kind (``gru``: Keras GRU with reset_after=True, the default; ``rnn``: SimpleRNN; ``lstm``) and bias
setting (``zb``: every bias zero, for conservation; ``b``: random biases), one network
``Input(7 x 5) -> layer(6 units) -> Dense(3)`` with the same weights written as:

* ``<kind>_<bias>_loop.onnx``: Keras, the layer as Keras runs it (unroll=False), exported by tf2onnx: GRU and
  SimpleRNN become a ``Loop`` whose body reads the sequence by name; LSTM becomes an ONNX ``LSTM`` op;
* ``<kind>_<bias>_unrolled.onnx``: the same Keras layer with unroll=True (the cell written out 7 times);
* ``<kind>_<bias>_torch.onnx``: ``nn.GRU`` / ``nn.RNN`` / ``nn.LSTM`` (batch first) + ``nn.Linear`` with the Keras
  weights mapped (Keras GRU gate order z, r, h -> torch r, z, n; Keras' input bias -> ``bias_ih``, its recurrent
  bias -> ``bias_hh``; reset_after=True is torch's GRU, ONNX ``linear_before_reset=1``), exported by torch.onnx
  (TorchScript, opset 17): one ONNX GRU / RNN / LSTM op.

* ``<kind>_<bias>_flax.onnx``: the Flax (nnx) cell with the same weights run by ``jax.lax.scan``, exported by
  jax2onnx (a ``Loop``; not for the GRU with biases: Flax's GRU has no bias on its hidden map).

``recurrent_twins.npz``: the input batch ``x`` [3, 7, 5] and Keras' logits per net (``<kind>_<bias>``).

Needs tensorflow-cpu, keras, tf2onnx, torch, jax, flax and jax2onnx (only to regenerate; the tests read the
committed files). Made with
tensorflow-cpu 2.21 / keras 3.15 / tf2onnx 1.17 / torch 2.14 / jax 0.10 / flax 0.12 / jax2onnx 0.17.
"""
from __future__ import annotations

import argparse
import io
import os
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "goldens" / "recurrent_twins"
T, F, H, C = 7, 5, 6, 3
KINDS = {"gru": "GRU", "rnn": "SimpleRNN", "lstm": "LSTM"}


def keras_net(kind: str, unroll: bool, weights=None, zero_bias: bool = False):
    import keras
    inp = keras.Input((T, F), name="x")
    layer = getattr(keras.layers, KINDS[kind])(H, unroll=unroll, name="rec",
                                                bias_initializer="zeros" if zero_bias else "random_normal")
    out = keras.layers.Dense(C, name="head", bias_initializer="zeros" if zero_bias else "random_normal")(layer(inp))
    km = keras.Model(inp, out)
    if weights is not None:
        km.set_weights(weights)
    return km


def export_keras(km) -> bytes:
    import tensorflow as tf
    import tf2onnx
    spec = (tf.TensorSpec((None, T, F), tf.float32, name="x"),)
    proto, _ = tf2onnx.convert.from_keras(km, input_signature=spec, opset=17)
    return proto.SerializeToString()


def torch_twin(kind: str, weights):
    """The torch network with the Keras weights [kernel, recurrent_kernel, bias, dense W, dense b]."""
    import torch
    kernel, rec, bias, dw, db = [np.asarray(w, np.float32) for w in weights]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cls = {"gru": torch.nn.GRU, "rnn": torch.nn.RNN, "lstm": torch.nn.LSTM}[kind]
            self.rec = cls(F, H, batch_first=True)
            self.head = torch.nn.Linear(H, C)

        def forward(self, x):
            y, _ = self.rec(x)
            return self.head(y[:, -1])

    net = Net().eval()
    if kind == "gru":  # Keras z, r, h -> torch r, z, n
        def order(m):
            return np.concatenate([m[..., H:2 * H], m[..., :H], m[..., 2 * H:]], axis=-1)
        w_ih, w_hh, b_ih, b_hh = order(kernel).T, order(rec).T, order(bias[0]), order(bias[1])
    else:  # LSTM i, f, c, o = torch i, f, g, o; SimpleRNN one bias
        w_ih, w_hh, b_ih, b_hh = kernel.T, rec.T, bias, np.zeros_like(bias)
    with torch.no_grad():
        net.rec.weight_ih_l0.copy_(torch.from_numpy(np.ascontiguousarray(w_ih)))
        net.rec.weight_hh_l0.copy_(torch.from_numpy(np.ascontiguousarray(w_hh)))
        net.rec.bias_ih_l0.copy_(torch.from_numpy(b_ih))
        net.rec.bias_hh_l0.copy_(torch.from_numpy(b_hh))
        net.head.weight.copy_(torch.from_numpy(dw.T.copy()))
        net.head.bias.copy_(torch.from_numpy(db))
    return net


def flax_twin(kind: str, weights):
    """The Flax (nnx) cell with the Keras weights, run by ``jax.lax.scan`` (as ``nnx.RNN`` does), + Linear head, as a
    function of x [N, T, F]. Flax's GRU has no bias on its hidden map (only zero-bias Keras weights are exact), its
    LSTM no bias on the input maps (Keras' one bias goes to the hidden ones)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    kernel, rec, bias, dw, db = [np.asarray(w, np.float32) for w in weights]
    rngs = nnx.Rngs(0)
    cell = {"gru": nnx.GRUCell, "rnn": nnx.SimpleCell, "lstm": nnx.LSTMCell}[kind](F, H, rngs=rngs)
    head = nnx.Linear(H, C, rngs=rngs)

    def put(layer, k, b=None):
        layer.kernel.value = jnp.asarray(k)
        if b is not None:
            layer.bias.value = jnp.asarray(b)

    if kind == "gru":  # Keras z, r, h -> flax r, z, n
        assert not np.any(bias[1]), "Flax's GRU has no hidden bias"
        def order(m):
            return np.concatenate([m[..., H:2 * H], m[..., :H], m[..., 2 * H:]], axis=-1)
        put(cell.dense_i, order(kernel), order(bias[0]))
        put(cell.dense_h, order(rec))
    elif kind == "rnn":
        put(cell.dense_i, kernel, bias)
        put(cell.dense_h, rec)
    else:  # Keras i, f, c, o
        for g, (i_name, h_name) in enumerate((("ii", "hi"), ("if_", "hf"), ("ig", "hg"), ("io", "ho"))):
            put(getattr(cell, i_name), kernel[:, g * H:(g + 1) * H])
            put(getattr(cell, h_name), rec[:, g * H:(g + 1) * H], bias[g * H:(g + 1) * H])
    put(head, dw, db)

    def fn(x):
        z = jnp.zeros((x.shape[0], H), x.dtype)
        carry, ys = jax.lax.scan(lambda c, xt: cell(c, xt), (z, z) if kind == "lstm" else z, jnp.swapaxes(x, 0, 1))
        return head(ys[-1])
    return fn


def export_flax(fn) -> bytes:
    import jax2onnx
    return jax2onnx.to_onnx(fn, [("N", T, F)], input_names=["x"], output_names=["y"]).SerializeToString()


def export_torch(net) -> bytes:
    import torch
    buf = io.BytesIO()
    torch.onnx.export(net, torch.zeros(1, T, F), buf, input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}}, opset_version=17, dynamo=False)
    return buf.getvalue()


def make(out_dir: Path = OUT) -> dict:
    import keras
    import torch
    out_dir.mkdir(parents=True, exist_ok=True)
    x = np.random.default_rng(5).normal(size=(3, T, F)).astype(np.float32)
    arrays = {"x": x}
    ops = {}
    for kind in KINDS:
        for bias in ("zb", "b"):
            keras.utils.set_random_seed(11 + len(kind))
            km = keras_net(kind, unroll=False, zero_bias=bias == "zb")
            w = km.get_weights()
            ku = keras_net(kind, unroll=True, weights=w)
            y = np.asarray(km(x))
            yu = np.asarray(ku(x))
            net = torch_twin(kind, w)
            with torch.no_grad():
                yt = net(torch.from_numpy(x)).numpy()
            assert np.abs(yu - y).max() < 1e-5 and np.abs(yt - y).max() < 1e-5, (kind, bias)
            arrays[f"{kind}_{bias}"] = y
            exports = [("loop", export_keras(km)), ("unrolled", export_keras(ku)), ("torch", export_torch(net))]
            if not (kind == "gru" and bias == "b"):
                fx = flax_twin(kind, w)
                assert np.abs(np.asarray(fx(x)) - y).max() < 1e-5, (kind, bias, "flax")
                exports.append(("flax", export_flax(fx)))
            for name, data in exports:
                (out_dir / f"{kind}_{bias}_{name}.onnx").write_bytes(data)
                import onnx
                got = sorted({n.op_type for n in onnx.load_model_from_string(data).graph.node}
                             & {"Loop", "Scan", "LSTM", "GRU", "RNN"})
                ops[f"{kind}_{bias}_{name}"] = got
            print(f"{kind}/{bias}: written", {n: ops[f"{kind}_{bias}_{n}"] for n, _ in exports})
    np.savez_compressed(out_dir / "recurrent_twins.npz", **arrays)
    return ops


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    make(ap.parse_args().out)
