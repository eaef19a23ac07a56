#!/usr/bin/env python
"""Flax (nnx) CNN twins for issue 17: ReLU CNNs with pooling, crops and residual blocks, random weights, exported by
jax2onnx at opsets 17 and 23, with the float64 gradient x input of JAX itself (the LRP-0 reference: on a
piecewise-linear network LRP-0, i.e. ``epsilon`` with epsilon = 0 and stabilizer 0, started from the logit, equals
gradient x input).

Writes ``tests/goldens/flax_twins/``: ``<net>_op<opset>.onnx`` and ``<net>.npz`` (``x`` NHWC float32 [2, 16, 16, 3],
``target``, ``gxi`` float64). Nets (8 channels, 5 classes):

* ``pool_res_crop``: Conv-ReLU, 3x3 max pool stride 2 "SAME" (asymmetric padding), two Flax-ResNet blocks (convs
  without bias + BatchNorm, folded by the loader; the second with a strided 1x1 projection and a strided slice of the
  main branch), a 1-pixel crop, global mean, Dense.
* ``avg_proj_crop``: Conv-ReLU, 3x3 average pool stride 2 "SAME" (count_include_pad), a projection block (strided
  3x3 conv + BN, strided 1x1 conv), a crop, global mean, Dense.
* ``max_res_crop``: Conv-ReLU, 3x3 max pool stride 1 "SAME" then 2x2 max pool (ties between the two pools), two
  identity residual blocks with biases, a crop, global mean, Dense.
* ``preact_res``: Conv-ReLU, 2x2 max pool, two pre-activation residual blocks (x + Conv(ReLU(BN(x)))), BN-ReLU, a
  crop, global mean, Dense: its BatchNorms follow residual sums and cannot be folded (kind "batchnorm").

User-style nets (``nnx.Module`` classes exported as they are, fresh Flax initialisation plus random biases and
statistics; x [3, 16, 16, 3]), issue 17's second round:

* ``ln_res``: Conv-ReLU, 2x2 max pool, a residual block Conv -> LayerNorm -> ReLU -> Conv, a crop, mean, Dense.
* ``gn_res``: Conv-ReLU, 3x3 average pool stride 1 "SAME" without the padding in the count, a residual block with
  GroupNorm (2 groups, ``use_fast_variance=False``), a crop, mean, Dense.
  A LayerNorm / GroupNorm is not piecewise linear: the rules hold its normalising std constant (LXT), so LRP-0 is
  JAX's gradient x input with the variance under ``stop_gradient`` (``gxi_held``); ``gxi`` (the full gradient)
  differs by 0.1-0.2 rel-L2 (issue 17's "0.198").
* ``ops_mix``: explicit asymmetric conv padding, kernel dilation, ``jnp.pad``, a grouped and a depthwise conv,
  average pool "SAME" count_include_pad=False, an asymmetric crop, a strided projection block with BatchNorm
  (folded), a strided slice with offsets, mean, Dense; also exported with a static batch of 1
  (``ops_mix_b1_op17.onnx``).
* ``wrap_slices``: a Conv with ``padding="CIRCULAR"``, ``jnp.pad(mode="reflect")``, ``lax.dynamic_slice``: jax2onnx
  writes their Slices with ends computed from the dynamic batch size (refused as "not constants" before).
* ``gn_silu`` (GroupNorm -> SiLU, the diffusion-UNet block) and ``ln_gelu`` (LayerNorm -> GELU, tanh form):
  residual blocks whose activations are not ReLU; explained with ``attnlrp`` (LXT: identity rule on the
  activation, the norm's std held, LRP-0 elsewhere), whose reference is JAX's float64 gradient x input with every
  activation ``f`` written ``x * stop_gradient(f(x) / x)`` and the variance under ``stop_gradient``
  (``gxi_identity``). Before, the decomposed norm's scale and shift were held inside the SiLU/GELU pattern
  (relevance passed unchanged through them): 1.7-390 rel-L2 off.
* ``hand_ln``: a LayerNorm written by hand, ``(h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1,
  keepdims=True) + eps)``, in a residual block (jax2onnx: ReduceSumSquare, Reshape/Expand broadcasts, a Where that
  guards the divisor; refused before); reference ``gxi_held`` (the variance under stop_gradient).
* ``dropout_train``: ``nnx.Dropout(0.5)`` left in training mode (jax2onnx writes Dropout with training_mode = true):
  must be refused (no goldens).

Needs jax, flax 0.12 (nnx) and jax2onnx 0.17 (only to regenerate; tests/parity/test_flax_twins.py reads the files).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "goldens" / "flax_twins"
NETS = ("pool_res_crop", "avg_proj_crop", "max_res_crop", "preact_res")
USER_NETS = ("ln_res", "gn_res", "ops_mix", "dropout_train", "wrap_slices", "gn_silu", "ln_gelu", "hand_ln")
IDENTITY = {"on": False, "held": False}  # the reference's activations in identity-rule form (_identity_form); a
# hand-written norm's variance held
SIZE, C, N_CLASSES = 16, 8, 5


def build(name: str, seed: int = 0):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    rngs = nnx.Rngs(seed)
    rnd = np.random.default_rng(seed)

    def conv(k=3, stride=1, bias=True, cin=C):
        layer = nnx.Conv(cin, C, (k, k), strides=(stride, stride), padding="SAME", use_bias=bias, rngs=rngs)
        if bias:
            layer.bias.value = jnp.asarray(rnd.normal(scale=0.1, size=C).astype(np.float32))
        return layer

    def bn():
        layer = nnx.BatchNorm(C, use_running_average=True, rngs=rngs)
        layer.mean.value = jnp.asarray(rnd.normal(scale=0.2, size=C).astype(np.float32))
        layer.var.value = jnp.asarray(rnd.uniform(0.5, 2.0, size=C).astype(np.float32))
        layer.scale.value = jnp.asarray(rnd.uniform(0.5, 1.5, size=C).astype(np.float32))
        layer.bias.value = jnp.asarray(rnd.normal(scale=0.1, size=C).astype(np.float32))
        return layer

    relu = jax.nn.relu
    stem, head = conv(cin=3), nnx.Linear(C, N_CLASSES, rngs=rngs)
    head.bias.value = jnp.asarray(rnd.normal(scale=0.1, size=N_CLASSES).astype(np.float32))
    if name == "pool_res_crop":
        c = [conv(bias=False) for _ in range(4)] + [conv(k=1, stride=2, bias=False)]
        b = [bn() for _ in range(5)]

        def body(x):
            x = nnx.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding="SAME")
            x = relu(x + b[1](c[1](relu(b[0](c[0](x))))))
            y = b[3](c[3](relu(b[2](c[2](x)))))
            return relu(b[4](c[4](x)) + y[:, ::2, ::2, :])
    elif name == "avg_proj_crop":
        main, proj, b = conv(stride=2), conv(k=1, stride=2), bn()

        def body(x):
            x = nnx.avg_pool(x, window_shape=(3, 3), strides=(2, 2), padding="SAME")
            return relu(proj(x) + b(main(x)))
    elif name == "max_res_crop":
        c = [conv() for _ in range(4)]

        def body(x):
            x = nnx.max_pool(x, window_shape=(3, 3), strides=(1, 1), padding="SAME")
            x = nnx.max_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = relu(x + c[1](relu(c[0](x))))
            return relu(x + c[3](relu(c[2](x))))
    elif name == "preact_res":
        c, b = [conv(bias=False) for _ in range(2)], [bn() for _ in range(3)]

        def body(x):
            x = nnx.max_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = x + c[0](relu(b[0](x)))
            x = x + c[1](relu(b[1](x)))
            return relu(b[2](x))
    else:
        raise ValueError(name)

    def fn(x):
        x = body(relu(stem(x)))[:, 1:-1, 1:-1, :]
        return head(x.mean(axis=(1, 2)))
    return fn


def make(out_dir: Path = OUT) -> None:
    import jax
    import jax.numpy as jnp
    import jax2onnx

    jax.config.update("jax_enable_x64", True)
    out_dir.mkdir(parents=True, exist_ok=True)
    x = np.random.default_rng(1).normal(size=(2, SIZE, SIZE, 3)).astype(np.float32)
    for name in NETS:
        fn = build(name)
        for opset in (17, 23):
            proto = jax2onnx.to_onnx(fn, [("N", SIZE, SIZE, 3)], input_names=["x"], output_names=["y"], opset=opset)
            (out_dir / f"{name}_op{opset}.onnx").write_bytes(proto.SerializeToString())
        y = np.asarray(fn(jnp.asarray(x)))
        target = y.argmax(1)
        x64 = jnp.asarray(x, jnp.float64)
        grad = jax.grad(lambda v: jnp.sum(fn(v)[jnp.arange(len(x)), target]))(x64)
        np.savez(out_dir / f"{name}.npz", x=x, target=target, logits=y, gxi=np.asarray(grad) * x.astype(np.float64))
        print(f"{name}: written")


def build_user(name: str, seed: int = 0):
    """A user-style ``nnx.Module`` (fresh initialisation; biases, norm scales/shifts and BatchNorm statistics
    randomised so that none is trivially 0 or 1)."""
    import jax.numpy as jnp
    from flax import nnx
    from jax import lax

    rngs = nnx.Rngs(seed)
    relu = nnx.relu

    class LnRes(nnx.Module):
        def __init__(self):
            self.stem = nnx.Conv(3, C, (3, 3), rngs=rngs)
            self.conv1 = nnx.Conv(C, C, (3, 3), rngs=rngs)
            self.norm = nnx.LayerNorm(C, rngs=rngs)
            self.conv2 = nnx.Conv(C, C, (3, 3), rngs=rngs)
            self.head = nnx.Linear(C, N_CLASSES, rngs=rngs)

        def __call__(self, x):
            x = nnx.max_pool(relu(self.stem(x)), window_shape=(2, 2), strides=(2, 2))
            x = relu(x + self.conv2(relu(self.norm(self.conv1(x)))))
            return self.head(x[:, 1:-1, 1:-1, :].mean(axis=(1, 2)))

    class GnRes(LnRes):
        def __init__(self):
            super().__init__()
            self.norm = nnx.GroupNorm(C, num_groups=2, use_fast_variance=False, rngs=rngs)

        def __call__(self, x):
            x = nnx.avg_pool(relu(self.stem(x)), window_shape=(3, 3), strides=(1, 1), padding="SAME",
                             count_include_pad=False)
            x = relu(x + self.conv2(relu(self.norm(self.conv1(x)))))
            return self.head(x[:, 1:-1, 1:-1, :].mean(axis=(1, 2)))

    class OpsMix(nnx.Module):
        def __init__(self):
            self.stem = nnx.Conv(3, C, (3, 3), padding=((2, 0), (1, 1)), rngs=rngs)
            self.dilated = nnx.Conv(C, C, (3, 3), kernel_dilation=2, rngs=rngs)
            self.grouped = nnx.Conv(C, C, (3, 3), feature_group_count=4, rngs=rngs)
            self.depthwise = nnx.Conv(C, C, (3, 3), feature_group_count=C, rngs=rngs)
            self.main = nnx.Conv(C, 2 * C, (3, 3), strides=2, use_bias=False, rngs=rngs)
            self.bn = nnx.BatchNorm(2 * C, use_running_average=True, rngs=rngs)
            self.proj = nnx.Conv(C, 2 * C, (1, 1), strides=2, rngs=rngs)
            self.head = nnx.Linear(2 * C, N_CLASSES, rngs=rngs)

        def __call__(self, x):
            x = relu(self.dilated(relu(self.stem(x))))
            x = jnp.pad(x, ((0, 0), (2, 1), (1, 2), (0, 0)))
            x = relu(self.depthwise(relu(self.grouped(x))))
            x = nnx.avg_pool(x, window_shape=(3, 3), strides=(1, 1), padding="SAME", count_include_pad=False)
            x = x[:, 1:-1, 2:, :]
            x = relu(self.proj(x) + self.bn(self.main(x)))
            return self.head(x[:, ::2, 1::2, :].mean(axis=(1, 2)))

    class DropoutTrain(nnx.Module):
        def __init__(self):
            self.stem = nnx.Conv(3, C, (3, 3), rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)  # deterministic=False: training mode
            self.head = nnx.Linear(C, N_CLASSES, rngs=rngs)

        def __call__(self, x):
            return self.head(self.drop(relu(self.stem(x))).mean(axis=(1, 2)))

    class WrapSlices(nnx.Module):
        def __init__(self):
            self.stem = nnx.Conv(3, C, (3, 3), padding="CIRCULAR", rngs=rngs)
            self.conv = nnx.Conv(C, C, (3, 3), padding="VALID", rngs=rngs)
            self.head = nnx.Linear(C, N_CLASSES, rngs=rngs)

        def __call__(self, x):
            x = jnp.pad(relu(self.stem(x)), ((0, 0), (1, 1), (2, 1), (0, 0)), mode="reflect")
            x = relu(self.conv(x))  # 16 x 17
            x = lax.dynamic_slice(x, (0, 2, 3, 0), (x.shape[0], 10, 9, C))
            return self.head(x.mean(axis=(1, 2)))

    class GnSilu(nnx.Module):
        def __init__(self, norm, act):
            self.stem = nnx.Conv(3, C, (3, 3), rngs=rngs)
            self.conv1 = nnx.Conv(C, C, (3, 3), rngs=rngs)
            self.norm = norm
            self.conv2 = nnx.Conv(C, C, (3, 3), rngs=rngs)
            self.head = nnx.Linear(C, N_CLASSES, rngs=rngs)
            self.act = act

        def __call__(self, x):
            h = self.act(self.stem(x))
            h = self.act(h + self.conv2(self.act(self.norm(self.conv1(h)))))
            return self.head(h.mean(axis=(1, 2)))

    class HandLn(nnx.Module):
        def __init__(self):
            self.stem = nnx.Conv(3, C, (3, 3), rngs=rngs)
            self.conv1 = nnx.Conv(C, C, (3, 3), rngs=rngs)
            self.conv2 = nnx.Conv(C, C, (3, 3), rngs=rngs)
            self.head = nnx.Linear(C, N_CLASSES, rngs=rngs)

        def __call__(self, x):
            h = relu(self.stem(x))
            z = self.conv1(h)
            var = z.var(axis=-1, keepdims=True)
            if IDENTITY["held"]:
                var = lax.stop_gradient(var)
            z = (z - z.mean(axis=-1, keepdims=True)) / jnp.sqrt(var + 1e-5)
            return self.head(relu(h + self.conv2(relu(z))).mean(axis=(1, 2)))

    if name == "hand_ln":
        model = HandLn()
    elif name == "gn_silu":
        model = GnSilu(nnx.GroupNorm(C, num_groups=4, rngs=rngs), _identity_form(nnx.silu))
    elif name == "ln_gelu":
        model = GnSilu(nnx.LayerNorm(C, rngs=rngs), _identity_form(lambda v: nnx.gelu(v, approximate=True)))
    else:
        model = {"ln_res": LnRes, "gn_res": GnRes, "ops_mix": OpsMix, "dropout_train": DropoutTrain,
                 "wrap_slices": WrapSlices}[name]()
    rnd = np.random.default_rng(seed)
    for _, m in nnx.iter_graph(model):
        if isinstance(m, nnx.BatchNorm):
            n = m.mean.value.shape[0]
            m.mean.value = jnp.asarray(rnd.normal(scale=0.2, size=n), jnp.float32)
            m.var.value = jnp.asarray(rnd.uniform(0.5, 2, size=n), jnp.float32)
        if isinstance(m, (nnx.BatchNorm, nnx.LayerNorm, nnx.GroupNorm)):
            m.scale.value = jnp.asarray(rnd.uniform(0.5, 1.5, size=m.scale.value.shape), jnp.float32)
        if isinstance(m, (nnx.Conv, nnx.Linear, nnx.BatchNorm, nnx.LayerNorm, nnx.GroupNorm)) and m.bias is not None:
            m.bias.value = jnp.asarray(rnd.normal(scale=0.1, size=m.bias.value.shape), jnp.float32)
    return model


def _identity_form(f):
    """``f`` as the model computes it; with IDENTITY on, ``x * stop_gradient(f(x) / x)``: the same values, and the
    gradient of LXT's identity rule (relevance passes the activation unchanged)."""
    def act(x):
        import jax
        import jax.numpy as jnp

        y = f(x)
        if not IDENTITY["on"]:
            return y
        return x * jax.lax.stop_gradient(jnp.where(x == 0, 0.0, y / jnp.where(x == 0, 1.0, x)))
    return act


def _gxi64(model, x, target, held: bool):
    """float64 gradient x input of ``model`` (per item, the target logit); ``held``: the norms' variance under
    stop_gradient (the rules hold the normalising std constant)."""
    import jax
    import jax.numpy as jnp
    import flax.nnx.nn.normalization as norms
    from flax import nnx

    graphdef, state = nnx.split(model)
    pure64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64) if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating)
                          else a, nnx.to_pure_dict(state))
    stats = norms._compute_stats

    def held_stats(*a, **k):
        mean, var = stats(*a, **k)
        return mean, jax.lax.stop_gradient(var)

    def f(v):
        st = nnx.clone(state)
        nnx.replace_by_pure_dict(st, pure64)
        return nnx.merge(graphdef, st)(v)

    norms._compute_stats = held_stats if held else stats
    IDENTITY["held"] = held
    try:
        x64 = jnp.asarray(x, jnp.float64)
        grad = jax.grad(lambda v: jnp.sum(f(v)[jnp.arange(len(x)), target]))(x64)
    finally:
        norms._compute_stats = stats
        IDENTITY["held"] = False
    return np.asarray(grad) * np.asarray(x64)


def make_user(out_dir: Path = OUT, nets=USER_NETS) -> None:
    import jax
    import jax.numpy as jnp
    import jax2onnx
    from flax import nnx

    out_dir.mkdir(parents=True, exist_ok=True)
    x = np.random.default_rng(1).normal(size=(3, SIZE, SIZE, 3)).astype(np.float32)
    for name in nets:
        model = build_user(name)
        graphdef, state = nnx.split(model)

        def fn(v):
            return nnx.merge(graphdef, nnx.clone(state))(v)
        for opset in (17, 23):
            proto = jax2onnx.to_onnx(fn, [("N", SIZE, SIZE, 3)], input_names=["x"], output_names=["y"], opset=opset)
            (out_dir / f"{name}_op{opset}.onnx").write_bytes(proto.SerializeToString())
        if name == "dropout_train":
            print(f"{name}: written (no goldens: it must be refused)")
            continue
        if name == "ops_mix":
            proto = jax2onnx.to_onnx(fn, [(1, SIZE, SIZE, 3)], input_names=["x"], output_names=["y"], opset=17)
            (out_dir / f"{name}_b1_op17.onnx").write_bytes(proto.SerializeToString())
        y = np.asarray(fn(jnp.asarray(x)))
        target = y.argmax(1)
        jax.config.update("jax_enable_x64", True)
        try:
            gxi, held = _gxi64(model, x, target, False), _gxi64(model, x, target, True)
            IDENTITY["on"] = True
            identity = _gxi64(model, x, target, True)
        finally:
            IDENTITY["on"] = False
            jax.config.update("jax_enable_x64", False)
        np.savez(out_dir / f"{name}.npz", x=x, target=target, logits=y, gxi=gxi, gxi_held=held, gxi_identity=identity)
        print(f"{name}: written")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--user", action="store_true", help="only the user-style nets (USER_NETS)")
    if not parser.parse_args().user:
        make()
    make_user()
