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

Needs jax, flax 0.12 (nnx) and jax2onnx 0.17 (only to regenerate; tests/test_flax_twins.py reads the files).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "goldens" / "flax_twins"
NETS = ("pool_res_crop", "avg_proj_crop", "max_res_crop", "preact_res")
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


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    make()
