"""A packed weight's float value on demand (load.passes.block_quant._value: what the rules read while they write the
relevance graph) equals a plain numpy dequantization, (q - z) * s per block, for blocks along either axis, a last
block shorter than block_size, no / integer / float zero points, and steps of any size (_CHUNK lowered so that one
weight is walked in several)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnx_lrp.load.passes import block_quant


class _Const:
    def __init__(self, a):
        self.const_value = ir.tensor(a)


def _oracle(q, s, z, axis, block):
    rep = np.repeat(s, block, axis=axis)[:q.shape[0], :q.shape[1]] if axis == 0 else \
        np.repeat(s, block, axis=1)[:, :q.shape[1]]
    zz = 0 if z is None else (np.repeat(z, block, axis=axis)[:q.shape[0]] if axis == 0 else
                              np.repeat(z, block, axis=1)[:, :q.shape[1]])
    return (q.astype(np.float64) - zz) * rep


@pytest.mark.parametrize("chunk", [block_quant._CHUNK, 700])
@pytest.mark.parametrize("axis,shape,block", [(0, (70, 9), 32), (1, (9, 70), 32), (0, (64, 40), 16), (1, (40, 64), 16)])
@pytest.mark.parametrize("zero", [None, "int", "float"])
def test_value_is_the_blockwise_dequantization(monkeypatch, chunk, axis, shape, block, zero):
    monkeypatch.setattr(block_quant, "_CHUNK", chunk)
    rng = np.random.default_rng(3)
    q = rng.integers(0, 16, shape).astype(np.uint8)
    nb = -(-shape[axis] // block)
    s = (0.01 + rng.random((nb, shape[1]) if axis == 0 else (shape[0], nb))).astype(np.float32)
    z = None if zero is None else rng.integers(0, 16, s.shape).astype(np.uint8) if zero == "int" else \
        (rng.random(s.shape) * 15).astype(np.float32)
    vals = [_Const(q.astype(ir.DataType.UINT4.numpy())), _Const(s)]
    if zero == "int":
        vals.append(_Const(z.astype(ir.DataType.UINT4.numpy())))
    got = block_quant._value(vals, z if zero == "float" else None, 4, axis, block)
    want = _oracle(q, s, z, axis, block)
    assert got.shape == shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-6)
