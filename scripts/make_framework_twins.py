#!/usr/bin/env python
"""Framework twins: the same small architectures with the same weights built in PyTorch, Keras and Flax, exported to
ONNX (torch.onnx TorchScript exporter; tf2onnx; jax2onnx), with zennit's relevances on the PyTorch twin.

Writes ``tests/goldens/twins/``:

* ``<net>_torch.onnx``, ``<net>_keras.onnx``, ``<net>_flax.onnx``: the three exports (NCHW input ``x`` for torch,
  NHWC input ``x`` for Keras and Flax; dynamic batch axis);
* ``<net>.npz``: the input batch ``x`` (NCHW, 4 items), the logits, a given target, zennit's relevance for every
  built-in CNN composite (``<composite>/b4/{argmax,given}`` and ``.../target``; start = one-hot, float64 reference)
  and the gradient x input of the arg-max logit (``gxi``, the LRP-0 reference);
* ``twins.json``: versions and what each export contains;
* ``gru_keras.onnx``, ``lstm_keras.onnx``, ``recurrent.npz``: Keras GRU / LSTM classifiers as tf2onnx writes them
  (the GRU as a ``Loop``, the LSTM as an ONNX ``LSTM`` op), an input and Keras' logits.

Nets (input 3 x 16 x 16, 10 classes):

* ``resnet``: Conv-BN-ReLU stem, MaxPool, a residual block (Conv-BN-ReLU-Conv-BN + skip), a BatchNorm after the
  residual sum (not foldable: zennit's Pass), ReLU, a 1-pixel crop (Keras ``Cropping2D``), global average pool,
  Dense-BN-ReLU, Dense.
* ``mobilenet``: Conv-BN-ReLU6 stem, an inverted residual block (1x1 expand-BN-ReLU6, depthwise 3x3-BN-ReLU6,
  1x1 project-BN, + skip), global average pool, Dense.
* ``select``: Conv-BN-ReLU stem, the element-wise maximum of a 1x1 and a 3x3 convolution (Keras ``Maximum``,
  ``torch.maximum``), ReLU, the element-wise minimum of two 1x1 convolutions (``Minimum``), ReLU, global average
  pool, Dense: ONNX ``Max``/``Min`` of two activations, winner takes all (zennit: their plain gradient).
* ``strided``: Conv-BN-ReLU, a strided crop ``x[:, :, ::2, 1::2]`` (torch and tf2onnx: Slice with steps; jax2onnx:
  GatherND with indices built at run time from the batch size), Conv-ReLU, global average pool, Dense.

tf2onnx writes a Keras BatchNormalization it does not fuse as Mul -> Add (after depthwise convolutions, after
Dense layers, after the residual sum): onnx-lrp's canonizer folds those after a linear layer and gives the others
BatchNormalization's kind, so both exports get the same rules.

Usage::

    python scripts/make_framework_twins.py            # rewrite tests/goldens/twins/
    python scripts/make_framework_twins.py --report   # rel-L2 between the twins per composite (needs no TF)

Needs torch, zennit, tensorflow-cpu, tf2onnx, jax, flax and jax2onnx (only to regenerate; the tests read the committed
files). Made with tensorflow-cpu 2.21 / keras 3.15 / tf2onnx 1.17 (``from_keras`` works with Keras 3 there) and
jax 0.10 / flax 0.12 (nnx) / jax2onnx 0.17 (opset 23; Flax BatchNorm is exported as a BatchNormalization op).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "goldens" / "twins"
NETS = ("resnet", "mobilenet", "select", "strided")
SIZE, N_CLASSES, BN_EPS = 16, 10, 1e-3
COMPOSITES = ("epsilon", "epsilon-plus", "epsilon-plus-flat", "epsilon-gamma-box", "epsilon-alpha2-beta1",
              "epsilon-alpha2-beta1-flat")
VARIANTS = COMPOSITES + ("epsilon@0.01",)


_ZS = []


def _zennit_script():
    """scripts/make_zennit_goldens.py, loaded once (it patches zennit's MergeBatchNorm on import)."""
    if _ZS:
        return _ZS[0]
    spec = importlib.util.spec_from_file_location("make_zennit_goldens", ROOT / "scripts" / "make_zennit_goldens.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _ZS.append(mod)
    return mod


# ------------------------------------------------------------------------------------------------- PyTorch
def torch_net(name: str):
    import torch
    from torch import nn

    class Residual(nn.Module):
        """x + body(x); zennit sees the sum as a ``Sum`` module (``canonizer_sum``, set by the canonizer)."""

        def __init__(self, body):
            super().__init__()
            self.body = body

        def forward(self, x):
            y = self.body(x)
            summer = getattr(self, "canonizer_sum", None)
            return x + y if summer is None else summer(torch.stack([x, y], dim=-1))

    class Select(nn.Module):
        """torch.maximum / torch.minimum of two branches (functional: zennit applies their gradient)."""

        def __init__(self, a, b, fn):
            super().__init__()
            self.a, self.b, self.fn = a, b, fn

        def forward(self, x):
            return self.fn(self.a(x), self.b(x))

    class Crop(nn.Module):
        def forward(self, x):
            return x[:, :, 1:-1, 1:-1]

    class StridedCrop(nn.Module):
        def forward(self, x):
            return x[:, :, ::2, 1::2]

    def bn(c, d=2):
        return (nn.BatchNorm2d if d == 2 else nn.BatchNorm1d)(c, eps=BN_EPS)

    torch.manual_seed({"resnet": 31, "mobilenet": 32, "select": 33, "strided": 34}[name])
    if name == "resnet":
        m = nn.Sequential(OrderedDict(
            stem=nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), bn(8), nn.ReLU()),
            pool=nn.MaxPool2d(2),
            block=Residual(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), bn(8), nn.ReLU(),
                                         nn.Conv2d(8, 8, 3, padding=1), bn(8))),
            post_bn=bn(8),  # after the residual sum: not foldable (zennit: Pass)
            relu=nn.ReLU(),
            crop=Crop(),
            gap=nn.AdaptiveAvgPool2d(1),
            flat=nn.Flatten(),
            fc1=nn.Linear(8, 16),
            fc1_bn=bn(16, 1),
            fc1_relu=nn.ReLU(),
            fc2=nn.Linear(16, N_CLASSES),
        ))
    elif name == "mobilenet":
        m = nn.Sequential(OrderedDict(
            stem=nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), bn(8), nn.ReLU6()),
            block=Residual(nn.Sequential(
                nn.Conv2d(8, 24, 1), bn(24), nn.ReLU6(),
                nn.Conv2d(24, 24, 3, padding=1, groups=24), bn(24), nn.ReLU6(),
                nn.Conv2d(24, 8, 1), bn(8))),
            gap=nn.AdaptiveAvgPool2d(1),
            flat=nn.Flatten(),
            fc=nn.Linear(8, N_CLASSES),
        ))
    elif name == "select":
        m = nn.Sequential(OrderedDict(
            stem=nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), bn(8), nn.ReLU()),
            max=Select(nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 3, padding=1), torch.maximum),
            relu1=nn.ReLU(),
            min=Select(nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1), torch.minimum),
            relu2=nn.ReLU(),
            gap=nn.AdaptiveAvgPool2d(1),
            flat=nn.Flatten(),
            fc=nn.Linear(8, N_CLASSES),
        ))
    elif name == "strided":
        m = nn.Sequential(OrderedDict(
            stem=nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), bn(8), nn.ReLU()),
            crop=StridedCrop(),
            conv=nn.Conv2d(8, 8, 3, padding=1),
            relu=nn.ReLU(),
            gap=nn.AdaptiveAvgPool2d(1),
            flat=nn.Flatten(),
            fc=nn.Linear(8, N_CLASSES),
        ))
    else:
        raise ValueError(name)
    _zennit_script().randomise_batchnorm(m, seed=len(name))
    return m.eval(), Residual


def zennit_canonizers(residual_cls):
    from zennit.canonizers import AttributeCanonizer, SequentialMergeBatchNorm
    from zennit.layer import Sum

    def attribute_map(name, module):
        return {"canonizer_sum": Sum()} if isinstance(module, residual_cls) else None

    return [SequentialMergeBatchNorm(), AttributeCanonizer(attribute_map)]


# --------------------------------------------------------------------------------------------------- Keras
def keras_net(name: str, tm):
    """The Keras twin of the torch module ``tm`` (NHWC), with its weights."""
    import keras
    from keras import layers as L

    mods = dict(tm.named_modules())

    def conv(key, x, depthwise=False):
        c = mods[key]
        w, b = c.weight.detach().numpy(), c.bias.detach().numpy()
        k = w.shape[-1]
        if depthwise:
            layer = L.DepthwiseConv2D(k, padding="same", name=key.replace(".", "_"))
            out = layer(x)
            layer.set_weights([w.transpose(2, 3, 0, 1), b])  # (C, 1, kh, kw) -> (kh, kw, C, 1)
        else:
            layer = L.Conv2D(w.shape[0], k, padding="same", name=key.replace(".", "_"))
            out = layer(x)
            layer.set_weights([w.transpose(2, 3, 1, 0), b])  # (O, I, kh, kw) -> (kh, kw, I, O)
        return out

    def bn(key, x):
        b = mods[key]
        layer = L.BatchNormalization(epsilon=b.eps, name=key.replace(".", "_"))
        out = layer(x)
        layer.set_weights([t.detach().numpy() for t in (b.weight, b.bias, b.running_mean, b.running_var)])
        return out

    def dense(key, x):
        d = mods[key]
        layer = L.Dense(d.out_features, name=key)
        out = layer(x)
        layer.set_weights([d.weight.detach().numpy().T, d.bias.detach().numpy()])
        return out

    inp = keras.Input((SIZE, SIZE, 3), name="x")
    if name == "resnet":
        x = L.ReLU()(bn("stem.1", conv("stem.0", inp)))
        x = L.MaxPooling2D(2)(x)
        y = L.ReLU()(bn("block.body.1", conv("block.body.0", x)))
        y = bn("block.body.4", conv("block.body.3", y))
        x = L.Add()([x, y])
        x = L.ReLU()(bn("post_bn", x))
        x = L.Cropping2D(1)(x)
        x = L.GlobalAveragePooling2D()(x)
        x = L.ReLU()(bn("fc1_bn", dense("fc1", x)))
        out = dense("fc2", x)
    elif name == "select":
        x = L.ReLU()(bn("stem.1", conv("stem.0", inp)))
        x = L.ReLU()(L.Maximum()([conv("max.a", x), conv("max.b", x)]))
        x = L.ReLU()(L.Minimum()([conv("min.a", x), conv("min.b", x)]))
        x = L.GlobalAveragePooling2D()(x)
        out = dense("fc", x)
    elif name == "strided":
        x = L.ReLU()(bn("stem.1", conv("stem.0", inp)))
        x = L.Lambda(lambda t: t[:, ::2, 1::2, :])(x)
        x = L.ReLU()(conv("conv", x))
        x = L.GlobalAveragePooling2D()(x)
        out = dense("fc", x)
    else:
        x = L.ReLU(6.0)(bn("stem.1", conv("stem.0", inp)))
        y = L.ReLU(6.0)(bn("block.body.1", conv("block.body.0", x)))
        y = L.ReLU(6.0)(bn("block.body.4", conv("block.body.3", y, depthwise=True)))
        y = bn("block.body.7", conv("block.body.6", y))
        x = L.Add()([x, y])
        x = L.GlobalAveragePooling2D()(x)
        out = dense("fc", x)
    return keras.Model(inp, out, name=name)


# ---------------------------------------------------------------------------------------------------- Flax
def flax_net(name: str, tm):
    """The Flax (nnx) twin of the torch module ``tm`` (NHWC) with its weights, as a function of x."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    mods = dict(tm.named_modules())
    rngs = nnx.Rngs(0)

    def conv(key, depthwise=False):
        c = mods[key]
        w, b = c.weight.detach().numpy(), c.bias.detach().numpy()
        k = w.shape[-1]
        groups = w.shape[0] if depthwise else 1
        layer = nnx.Conv(w.shape[1] * groups, w.shape[0], (k, k), padding="SAME", feature_group_count=groups,
                         rngs=rngs)
        layer.kernel.value = jnp.asarray(w.transpose(2, 3, 1, 0))  # (O, I/g, kh, kw) -> (kh, kw, I/g, O)
        layer.bias.value = jnp.asarray(b)
        return layer

    def bn(key):
        b = mods[key]
        layer = nnx.BatchNorm(b.num_features, use_running_average=True, epsilon=b.eps, rngs=rngs)
        layer.scale.value, layer.bias.value = jnp.asarray(b.weight.detach().numpy()), jnp.asarray(b.bias.detach().numpy())
        layer.mean.value, layer.var.value = jnp.asarray(b.running_mean.numpy()), jnp.asarray(b.running_var.numpy())
        return layer

    def dense(key):
        d = mods[key]
        layer = nnx.Linear(d.in_features, d.out_features, rngs=rngs)
        layer.kernel.value, layer.bias.value = jnp.asarray(d.weight.detach().numpy().T), jnp.asarray(d.bias.detach().numpy())
        return layer

    relu, relu6 = jax.nn.relu, jax.nn.relu6
    if name == "resnet":
        L = dict(c0=conv("stem.0"), b0=bn("stem.1"), c1=conv("block.body.0"), b1=bn("block.body.1"),
                 c2=conv("block.body.3"), b2=bn("block.body.4"), pb=bn("post_bn"), f1=dense("fc1"), fb=bn("fc1_bn"),
                 f2=dense("fc2"))

        def fn(x):
            x = relu(L["b0"](L["c0"](x)))
            x = nnx.max_pool(x, window_shape=(2, 2), strides=(2, 2))
            y = L["b2"](L["c2"](relu(L["b1"](L["c1"](x)))))
            x = relu(L["pb"](x + y))[:, 1:-1, 1:-1, :]
            x = x.mean(axis=(1, 2))
            return L["f2"](relu(L["fb"](L["f1"](x))))
    elif name == "mobilenet":
        L = dict(c0=conv("stem.0"), b0=bn("stem.1"), c1=conv("block.body.0"), b1=bn("block.body.1"),
                 c2=conv("block.body.3", depthwise=True), b2=bn("block.body.4"), c3=conv("block.body.6"),
                 b3=bn("block.body.7"), f=dense("fc"))

        def fn(x):
            x = relu6(L["b0"](L["c0"](x)))
            y = relu6(L["b2"](L["c2"](relu6(L["b1"](L["c1"](x))))))
            x = x + L["b3"](L["c3"](y))
            return L["f"](x.mean(axis=(1, 2)))
    elif name == "strided":
        L = dict(c0=conv("stem.0"), b0=bn("stem.1"), c1=conv("conv"), f=dense("fc"))

        def fn(x):
            x = relu(L["b0"](L["c0"](x)))[:, ::2, 1::2, :]
            return L["f"](relu(L["c1"](x)).mean(axis=(1, 2)))
    else:
        L = dict(c0=conv("stem.0"), b0=bn("stem.1"), ma=conv("max.a"), mb=conv("max.b"), na=conv("min.a"),
                 nb=conv("min.b"), f=dense("fc"))

        def fn(x):
            x = relu(L["b0"](L["c0"](x)))
            x = relu(jnp.maximum(L["ma"](x), L["mb"](x)))
            x = relu(jnp.minimum(L["na"](x), L["nb"](x)))
            return L["f"](x.mean(axis=(1, 2)))
    return fn


def export_flax(fn) -> bytes:
    import jax2onnx
    proto = jax2onnx.to_onnx(fn, [("N", SIZE, SIZE, 3)], input_names=["x"], output_names=["y"])
    return proto.SerializeToString()


def export_keras(km) -> bytes:
    import tensorflow as tf
    import tf2onnx
    spec = (tf.TensorSpec((None, SIZE, SIZE, 3), tf.float32, name="x"),)
    proto, _ = tf2onnx.convert.from_keras(km, input_signature=spec, opset=17, output_path=None)
    return proto.SerializeToString()


# ------------------------------------------------------------------------------------------------ the set
def make(out_dir: Path = OUT) -> dict:
    import torch
    zs = _zennit_script()
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"zennit": importlib.metadata.version("zennit"), "torch": torch.__version__,
            "tensorflow": importlib.metadata.version("tensorflow-cpu"), "keras": importlib.metadata.version("keras"),
            "tf2onnx": importlib.metadata.version("tf2onnx"), "jax": importlib.metadata.version("jax"),
            "flax": importlib.metadata.version("flax"), "jax2onnx": importlib.metadata.version("jax2onnx"),
            "input": [4, 3, SIZE, SIZE], "start": "one-hot",
            "reference_dtype": "float64", "made_by": "scripts/make_framework_twins.py", "nets": {}}
    for name in NETS:
        tm, residual = torch_net(name)
        x4 = torch.randn(4, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(5))
        (out_dir / f"{name}_torch.onnx").write_bytes(zs.export(tm, x4, "torchscript"))
        km = keras_net(name, tm)
        y_keras = np.asarray(km(np.ascontiguousarray(x4.numpy().transpose(0, 2, 3, 1)), training=False))
        (out_dir / f"{name}_keras.onnx").write_bytes(export_keras(km))
        fx = flax_net(name, tm)
        y_flax = np.asarray(fx(np.ascontiguousarray(x4.numpy().transpose(0, 2, 3, 1))))
        (out_dir / f"{name}_flax.onnx").write_bytes(export_flax(fx))
        ref = zs.as_float64(tm)
        y = zs.logits(ref, x4)
        diff = float(np.abs(y_keras - y).max() / np.abs(y).max())
        assert diff < 1e-4, f"{name}: the Keras twin computes another function (relative difference {diff:.1e})"
        diff_flax = float(np.abs(y_flax - y).max() / np.abs(y).max())
        assert diff_flax < 1e-4, f"{name}: the Flax twin computes another function ({diff_flax:.1e})"
        given = zs.pick_target(y)
        arrays = {"x": x4.numpy(), "logits": y.astype(np.float32), "given_target": np.array(given)}
        for comp in VARIANTS:
            for tname, target in (("argmax", None), ("given", given)):
                r, t, _ = zs.zennit_relevance(ref, x4, comp, zennit_canonizers(residual), target)
                arrays[f"{comp}/b4/{tname}"], arrays[f"{comp}/b4/{tname}/target"] = r, t
        xg = x4.to(torch.float64).requires_grad_(True)
        out = ref(xg)
        (g,) = torch.autograd.grad(out[torch.arange(4), out.argmax(1)].sum(), xg)
        arrays["gxi"] = (g * xg).detach().numpy().astype(np.float32)
        np.savez_compressed(out_dir / f"{name}.npz", **arrays)
        meta["nets"][name] = {"keras_vs_torch_logits": diff, "flax_vs_torch_logits": diff_flax, "given_target": given}
        print(f"{name}: written (Keras vs torch logits {diff:.1e}, Flax {diff_flax:.1e})")
    meta["recurrent"] = make_recurrent(out_dir)
    (out_dir / "twins.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def make_recurrent(out_dir: Path = OUT) -> dict:
    """Keras GRU and LSTM classifiers (7 steps x 5 features -> 6 units -> Dense 3) exported by tf2onnx: the GRU
    becomes a ``Loop``, the LSTM an ONNX ``LSTM`` op. ``recurrent.npz`` holds an input batch and Keras' logits."""
    import keras
    keras.utils.set_random_seed(3)
    x = np.random.default_rng(4).normal(size=(2, 7, 5)).astype(np.float32)
    arrays, emitted = {"x": x}, {}
    for kind in ("GRU", "LSTM"):
        inp = keras.Input((7, 5), name="x")
        out = keras.layers.Dense(3)(getattr(keras.layers, kind)(6)(inp))
        km = keras.Model(inp, out)
        arrays[f"{kind.lower()}/logits"] = np.asarray(km(x))
        import tensorflow as tf
        import tf2onnx
        spec = (tf.TensorSpec((None, 7, 5), tf.float32, name="x"),)
        proto, _ = tf2onnx.convert.from_keras(km, input_signature=spec, opset=17)
        (out_dir / f"{kind.lower()}_keras.onnx").write_bytes(proto.SerializeToString())
        emitted[kind] = sorted({n.op_type for n in proto.graph.node} & {"Loop", "Scan", "LSTM", "GRU", "RNN"})
    np.savez_compressed(out_dir / "recurrent.npz", **arrays)
    return emitted


# ------------------------------------------------------------------- Keras-only twins: reference = TF's gradient
def _keras_conv1d(name: str):
    """Keras 1-D CNNs (input 32 steps x 4 features) as tf2onnx writes them: Conv1D as Unsqueeze -> Conv -> Squeeze,
    MaxPooling1D as Unsqueeze -> MaxPool -> Squeeze, the BatchNorms as Mul -> Add after the Squeeze."""
    import keras
    L = keras.layers
    layers = {
        # the net: "same" padding, BN, ReLU, MaxPooling1D, a "valid" Conv1D with its activation, GAP
        "conv1d": [L.Conv1D(16, 5, padding="same"), L.BatchNormalization(), L.ReLU(), L.MaxPooling1D(2),
                   L.Conv1D(16, 3, activation="relu"), L.GlobalAveragePooling1D(), L.Dense(5)],
        # dilation, a strided "valid" convolution, a pool with "same" padding, Flatten
        "conv1d_dilated": [L.Conv1D(8, 3, dilation_rate=2, padding="same"), L.BatchNormalization(), L.ReLU(),
                           L.Conv1D(8, 3, strides=2), L.BatchNormalization(), L.ReLU(),
                           L.MaxPooling1D(3, strides=2, padding="same"), L.Flatten(), L.Dense(4)],
        # "causal" padding (a Pad), a BatchNorm after the activation (not foldable), average and max pools
        "conv1d_causal": [L.Conv1D(8, 4, padding="causal", activation="relu"), L.BatchNormalization(),
                          L.Conv1D(6, 1), L.ReLU(), L.AveragePooling1D(2), L.GlobalMaxPooling1D(), L.Dense(3)],
    }[name]
    return keras.Sequential([keras.Input((32, 4))] + layers)


def _keras_densenet():
    """A DenseNet-like Keras CNN (input 16 x 16 x 3): dense blocks whose BatchNorms follow concatenations (not
    foldable), BN-ReLU-Conv, a transition, GAP, Dense."""
    import keras
    L = keras.layers
    inp = keras.Input((16, 16, 3))
    h = L.Conv2D(8, 3, padding="same")(inp)
    for block in range(2):
        for _ in range(2):
            b = L.ReLU()(L.BatchNormalization()(h))
            h = L.Concatenate()([h, L.Conv2D(4, 3, padding="same")(b)])
        if block == 0:  # transition: BN-ReLU-1x1 conv-average pool
            h = L.AveragePooling2D(2)(L.Conv2D(8, 1)(L.ReLU()(L.BatchNormalization()(h))))
    h = L.GlobalAveragePooling2D()(L.ReLU()(L.BatchNormalization()(h)))
    return keras.Model(inp, L.Dense(5)(h))


KERAS_EXTRA = {"conv1d": ((32, 4), lambda: _keras_conv1d("conv1d")),
               "conv1d_dilated": ((32, 4), lambda: _keras_conv1d("conv1d_dilated")),
               "conv1d_causal": ((32, 4), lambda: _keras_conv1d("conv1d_causal")),
               "densenet": ((16, 16, 3), _keras_densenet)}
KERAS_EXTRA_OPSETS = {"conv1d": (13, 17), "conv1d_dilated": (13, 17), "conv1d_causal": (17,), "densenet": (17,)}


def _randomize(km, rng) -> None:
    """Non-zero biases and BatchNorm statistics (Keras initialises them to 0/1, which would hide bias errors)."""
    import keras
    for layer in km.layers:
        ws = layer.get_weights()
        if isinstance(layer, keras.layers.BatchNormalization):
            g, b, m, v = ws
            layer.set_weights([rng.uniform(0.5, 1.5, g.shape), rng.normal(0, 0.2, b.shape),
                               rng.normal(0, 0.3, m.shape), rng.uniform(0.5, 2.0, v.shape)])
        elif len(ws) == 2:
            layer.set_weights([ws[0], rng.normal(0, 0.1, ws[1].shape).astype(ws[1].dtype)])


def make_keras_extra(out_dir: Path = OUT) -> dict:
    """Keras-only twins whose reference is TensorFlow's own float64 gradient x input (LRP-0's value): the 1-D CNNs
    (opsets 13 and 17), a DenseNet-like CNN; and Keras text classifiers (token-id input, :func:`_keras_text`).
    Writes ``<net>_keras_op<opset>.onnx`` and ``keras_extra.npz`` (per net:
    ``<net>/x``, ``<net>/logits``, ``<net>/gxi`` of the arg-max logit)."""
    import keras
    import tensorflow as tf
    import tf2onnx
    arrays, meta = {}, {}
    for k, (name, (shape, build)) in enumerate(KERAS_EXTRA.items()):
        keras.config.set_floatx("float32")
        keras.utils.set_random_seed(10 + k)
        km = build()
        km.output_names = ["output"]  # tf2onnx 1.17 with a Keras 3 Sequential needs the output named
        _randomize(km, np.random.default_rng(20 + k))
        x = np.random.default_rng(30 + k).normal(size=(3,) + shape).astype(np.float32)
        for opset in KERAS_EXTRA_OPSETS[name]:
            spec = (tf.TensorSpec((None,) + shape, tf.float32, name="x"),)
            proto, _ = tf2onnx.convert.from_keras(km, input_signature=spec, opset=opset)
            (out_dir / f"{name}_keras_op{opset}.onnx").write_bytes(proto.SerializeToString())
            meta[f"{name}_op{opset}"] = sorted({n.op_type for n in proto.graph.node})
        keras.config.set_floatx("float64")
        k64 = build()
        k64.set_weights([w.astype(np.float64) for w in km.get_weights()])
        xv = tf.Variable(x.astype(np.float64))
        with tf.GradientTape() as tape:
            y = k64(xv)
            picked = tf.reduce_sum(tf.gather(y, tf.argmax(y, 1), batch_dims=1))
        arrays[f"{name}/x"], arrays[f"{name}/logits"] = x, np.asarray(km(x)).astype(np.float32)
        arrays[f"{name}/gxi"] = tape.gradient(picked, xv).numpy() * x.astype(np.float64)
    keras.config.set_floatx("float32")
    meta.update(_keras_text(out_dir, arrays))
    np.savez_compressed(out_dir / "keras_extra.npz", **arrays)
    return meta


def _keras_text(out_dir: Path, arrays: dict) -> dict:
    """Keras text classifiers ``Input((20,), int32) -> Embedding(100, 16) -> LSTM(24) | GRU(24) -> Dense(4)``
    (tf2onnx: the ids cast, compared and wrapped before a Gather of the table), and the same layers after the
    embedding as a second model with a float input (``text_<kind>_embedded_keras.onnx``): the reference for the
    per-token relevance (``text/ids``, ``text_<kind>/embedded`` = table[ids], ``text_<kind>/logits``)."""
    import keras
    import tensorflow as tf
    import tf2onnx
    L = keras.layers
    ids = np.random.default_rng(40).integers(0, 100, size=(3, 20)).astype(np.int32)
    arrays["text/ids"] = ids
    meta = {}
    for k, kind in enumerate(("LSTM", "GRU")):
        keras.utils.set_random_seed(50 + k)
        km = keras.Sequential([keras.Input((20,), dtype="int32"), L.Embedding(100, 16), getattr(L, kind)(24),
                               L.Dense(4)])
        km.output_names = ["output"]
        _randomize(km, np.random.default_rng(60 + k))
        tail = keras.Sequential([keras.Input((20, 16)), getattr(L, kind)(24), L.Dense(4)])
        tail.output_names = ["output"]
        tail.set_weights(km.get_weights()[1:])
        table = km.get_weights()[0]
        arrays[f"text_{kind.lower()}/embedded"] = table[ids].astype(np.float32)
        arrays[f"text_{kind.lower()}/logits"] = np.asarray(km(ids)).astype(np.float32)
        for model, shape, dtype, suffix in ((km, (None, 20), tf.int32, ""), (tail, (None, 20, 16), tf.float32,
                                                                              "_embedded")):
            spec = (tf.TensorSpec(shape, dtype, name="x"),)
            proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17)
            (out_dir / f"text_{kind.lower()}{suffix}_keras.onnx").write_bytes(proto.SerializeToString())
            meta[f"text_{kind.lower()}{suffix}"] = sorted({n.op_type for n in proto.graph.node})
    return meta


# ------------------------------------------------------------------- Flax-only twin: reference = JAX's gradient
def make_flax_extra(out_dir: Path = OUT) -> dict:
    """A Flax (nnx) CNN with pooling, a crop and residual blocks (input 16 x 16 x 3): Conv-ReLU, max pool, two
    residual blocks Conv-BN-ReLU-Conv-BN + skip with a BatchNorm after the sum (not foldable), a crop between them,
    a 3 x 3 "SAME" average pool, mean, Linear; random biases and BatchNorm statistics. Exported by jax2onnx at opsets
    17 and 23 (``resflax_flax_op<opset>.onnx``); ``flax_extra.npz`` holds ``x``, the logits and JAX's float64
    gradient x input of the arg-max logit (``gxi``)."""
    import jax
    import jax.numpy as jnp
    import jax2onnx
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, c, rngs):
            self.c1 = nnx.Conv(c, c, (3, 3), padding="SAME", rngs=rngs)
            self.c2 = nnx.Conv(c, c, (3, 3), padding="SAME", rngs=rngs)
            self.n1, self.n2, self.n3 = (nnx.BatchNorm(c, use_running_average=True, rngs=rngs) for _ in range(3))

        def __call__(self, x):
            return nnx.relu(self.n3(x + self.n2(self.c2(nnx.relu(self.n1(self.c1(x)))))))

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.stem = nnx.Conv(3, 8, (3, 3), padding="SAME", rngs=rngs)
            self.b1, self.b2 = Block(8, rngs), Block(8, rngs)
            self.fc = nnx.Linear(8, 5, rngs=rngs)

        def __call__(self, x):
            x = nnx.max_pool(nnx.relu(self.stem(x)), window_shape=(2, 2), strides=(2, 2))
            x = self.b1(x)[:, 1:-1, 1:-1, :]
            x = nnx.avg_pool(self.b2(x), window_shape=(3, 3), strides=(1, 1), padding="SAME")
            return self.fc(x.mean(axis=(1, 2)))

    jax.config.update("jax_enable_x64", False)
    net = Net(nnx.Rngs(0))
    rng = np.random.default_rng(70)
    for kind, draw in ((nnx.Param, lambda a: a if a.ndim > 1 else rng.normal(0, 0.1, a.shape)),
                       (nnx.BatchStat, lambda a: rng.uniform(0.5, 1.5, a.shape))):
        leaves, tree = jax.tree_util.tree_flatten(nnx.state(net, kind))
        nnx.update(net, jax.tree_util.tree_unflatten(tree, [jnp.asarray(np.asarray(draw(np.asarray(a))),
                                                                           jnp.float32) for a in leaves]))
    x = np.random.default_rng(71).normal(size=(3, SIZE, SIZE, 3)).astype(np.float32)
    meta = {}
    for opset in (17, 23):
        proto = jax2onnx.to_onnx(lambda v: net(v), [("N", SIZE, SIZE, 3)], input_names=["x"], output_names=["y"],
                                 opset=opset)
        (out_dir / f"resflax_flax_op{opset}.onnx").write_bytes(proto.SerializeToString())
        meta[f"resflax_op{opset}"] = sorted({n.op_type for n in proto.graph.node})
    logits = np.asarray(net(x))
    jax.config.update("jax_enable_x64", True)
    net64 = nnx.merge(nnx.graphdef(net), jax.tree_util.tree_map(
        lambda a: a.astype(jnp.float64) if getattr(a, "dtype", None) == jnp.float32 else a, nnx.state(net)))
    x64 = jnp.asarray(x, jnp.float64)
    t = jnp.argmax(net64(x64), 1)
    g = jax.grad(lambda v: jnp.sum(net64(v)[jnp.arange(len(x)), t]))(x64)
    jax.config.update("jax_enable_x64", False)
    np.savez_compressed(out_dir / "flax_extra.npz", x=x, logits=logits, gxi=np.asarray(g * x64))
    return meta


def rel_l2(a, b) -> float:
    a = np.asarray(a, np.float64).reshape(len(a), -1)
    b = np.asarray(b, np.float64).reshape(len(b), -1)
    return float(np.max(np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)))


def report(out_dir: Path = OUT) -> dict:
    """Worst rel-L2 per composite: Keras twin vs torch twin (onnx-lrp on both), torch twin vs zennit."""
    sys.path.insert(0, str(ROOT))
    import onnx_lrp
    table = {}
    for name in NETS:
        g = np.load(out_dir / f"{name}.npz")
        x = g["x"]
        for comp in VARIANTS:
            c, params = (comp.split("@")[0], {"epsilon": float(comp.split("@")[1])}) if "@" in comp else (comp, {})
            box = {"low": -3.0, "high": 3.0} if c == "epsilon-gamma-box" else {}  # the zennit references' bounds
            rt = onnx_lrp.Explainer(str(out_dir / f"{name}_torch.onnx"), composite=c, start="one-hot", **box,
                                    **params).explain(x).relevance
            rk = onnx_lrp.Explainer(str(out_dir / f"{name}_keras.onnx"), composite=c, start="one-hot", **box,
                                    **params).explain(np.ascontiguousarray(x.transpose(0, 2, 3, 1))).relevance
            rf = onnx_lrp.Explainer(str(out_dir / f"{name}_flax.onnx"), composite=c, start="one-hot", **box,
                                    **params).explain(np.ascontiguousarray(x.transpose(0, 2, 3, 1))).relevance
            rk, rf = rk.transpose(0, 3, 1, 2), rf.transpose(0, 3, 1, 2)
            table[f"{name}/{comp}"] = {"keras_vs_torch": rel_l2(rk, rt), "flax_vs_torch": rel_l2(rf, rt),
                                       "torch_vs_zennit": rel_l2(rt, g[f"{comp}/b4/argmax"])}
            print(f"{name:10s} {comp:26s} " + "  ".join(f"{k} {v:.1e}" for k, v in table[f"{name}/{comp}"].items()))
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", action="store_true", help="only compare the committed twins (needs onnx-lrp only)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--keras-extra", action="store_true",
                    help="only the Keras-only twins (1-D CNNs, DenseNet-like; needs tensorflow-cpu and tf2onnx)")
    ap.add_argument("--flax-extra", action="store_true",
                    help="only the Flax-only twin (pooling, crop, residual blocks; needs jax, flax, jax2onnx)")
    args = ap.parse_args(argv)
    if args.report:
        report(args.out)
        return 0
    if args.flax_extra:
        print(json.dumps(make_flax_extra(args.out), indent=1))
        return 0
    if args.keras_extra:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        print(json.dumps(make_keras_extra(args.out), indent=1))
        return 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import torch
    torch.set_grad_enabled(True)
    print(json.dumps(make(args.out), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
