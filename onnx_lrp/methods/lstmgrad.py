"""The true gradient of the ONNX LSTM op for the gradient methods (backpropagation through time in the relevance
graph): a forward ``Scan`` recomputes the gates and cell states, a backward ``Scan`` carries the gradients of
(h, c) between steps, and the input's gradient is one product over all steps. Per step (gates i, o, f, g in ONNX's
iofc order, ``tc = tanh(c_t)``):

    dh = dh_next + dY_t;  dc = dc_next + dh o (1 - tc^2)
    dz = [dc g i (1 - i), dh tc o (1 - o), dc c_{t-1} f (1 - f), dc i (1 - g^2)]
    dh_{t-1} = dz R;  dc_{t-1} = dc f;  dx_t = dz W

For the forward direction with the default activations, no peepholes, clip, coupled gates or sequence lengths;
other LSTMs (and GRU, RNN) are refused naming the node."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

import numpy as np
import onnx_ir as ir

from ..core.errors import UnsupportedError
from ..lrp.families import Family, FamilyRule, family_table
from ..lrp.ops.recurrent import DEFAULT_ACTS, Spec, input_proj, optional_input, scan, take
from ..rules.base import Rule


def _unsupported(node) -> str | None:
    spec = Spec.of(node, 0.0)
    if spec.direction != "forward":
        return f"direction {spec.direction}"
    if spec.acts != list(DEFAULT_ACTS["LSTM"]):
        return f"activations {spec.acts}"
    if spec.p_all is not None and np.any(spec.p_all):
        return "peepholes"
    if spec.clip is not None or node.attributes.get_int("input_forget", 0):
        return "clip or input_forget"
    if optional_input(node, 4) is not None:
        return "sequence_lens"
    return None


def _forward(em, spec, x, h0, c0):
    """The forward scan: per step the previous cell state and the gates i, f, g, o and the new cell state."""
    hid, r = spec.hidden, spec.r_all[0]
    xw = input_proj(em, x, spec.w_all[0], spec.b_all[0][:4 * hid] + spec.b_all[0][4 * hid:])

    def fwd(sub, st, sc):
        h, c = st
        z = sub.add(sc[0], sub.op("MatMul", h, sub.const(np.ascontiguousarray(r.T), tag="rT"), tag="hr"), tag="z")
        zi, zo, zf, zc = sub.op_multi("Split", [z, sub.ints([hid] * 4)], 4, axis=-1, tag="gate")
        i, o, f = (sub.op("Sigmoid", v, tag=t) for v, t in ((zi, "i"), (zo, "o"), (zf, "f")))
        g = sub.op("Tanh", zc, tag="g")
        c_new = sub.add(sub.mul(f, c, tag="fc"), sub.mul(i, g, tag="ig"), tag="c_new")
        h_new = sub.mul(o, sub.op("Tanh", c_new, tag="tc"), tag="h_new")
        return [h_new, c_new, c, i, f, g, o, c_new]

    return scan(em, "grad_fwd", [h0, c0], [(xw, em.dtype)], fwd, 6, reverse=False)[2:]


def _backward(em, spec, ry, dh_last, dc_last, saved):
    """The backward scan: the final (dh0, dc0) and dz per step [T, B, 4H]."""
    r = np.ascontiguousarray(spec.r_all[0])  # [4H, H]

    def bwd(sub, st, sc):
        dh, dc = st
        k = 0
        if ry is not None:
            dh, k = sub.add(dh, sc[0], tag="dh"), 1
        cp, i, f, g, o, cn = sc[k:]
        one = sub.scalar(1.0)
        tc = sub.op("Tanh", cn, tag="tc")
        dc = sub.add(dc, sub.mul(sub.mul(dh, o), sub.sub(one, sub.mul(tc, tc)), tag="dc_h"), tag="dc")
        sig = (lambda v: sub.mul(v, sub.sub(one, v), tag="dsig"))
        dz = sub.op("Concat", sub.mul(sub.mul(dc, g), sig(i), tag="di"), sub.mul(sub.mul(dh, tc), sig(o), tag="do"),
                    sub.mul(sub.mul(dc, cp), sig(f), tag="df"),
                    sub.mul(sub.mul(dc, i), sub.sub(one, sub.mul(g, g)), tag="dg"), axis=-1, tag="dz")
        return [sub.op("MatMul", dz, sub.const(r, tag="r_all"), tag="dh_prev"), sub.mul(dc, f, tag="dc_prev"), dz]

    scans = ([(ry, em.dtype)] if ry is not None else []) + [(v, em.dtype) for v in saved]
    return scan(em, "grad_bwd", [dh_last, dc_last], scans, bwd, 1, reverse=True)


def _lstm_gradient(rule, em, layer, r_outs):
    node = layer.node
    why = _unsupported(node)
    if why is not None:
        raise UnsupportedError([{"name": node.name, "op_type": node.op_type, "domain": node.domain, "opset": em.opset,
                                 "reason": f"the true gradient of this LSTM ({why}) is not written"}],
                               "The gradient methods take forward LSTMs with the default activations; use occlusion.")
    spec, x = Spec.of(node, 0.0), node.inputs[0]
    bh = em.op("Concat", em.op("Shape", x, start=1, end=2, tag="batch"), em.ints([spec.hidden]), axis=0, tag="bh")
    zeros = em.op("ConstantOfShape", bh, value=ir.tensor(np.zeros(1, dtype=em.np_dtype)), tag="zeros_bh")
    h0 = take(em, optional_input(node, 5), 0, 0, "h0") if optional_input(node, 5) is not None else zeros
    c0 = take(em, optional_input(node, 6), 0, 0, "c0") if optional_input(node, 6) is not None else zeros
    saved = _forward(em, spec, x, h0, c0)
    r_y, r_yh, r_yc = (list(r_outs) + [None, None, None])[:3]
    ry = take(em, r_y, 0, 1, "dy") if r_y is not None else None
    dh_last = take(em, r_yh, 0, 0, "dyh") if r_yh is not None else zeros
    dc_last = take(em, r_yc, 0, 0, "dyc") if r_yc is not None else zeros
    dh0, dc0, dz = _backward(em, spec, ry, dh_last, dc_last, saved)
    out = {0: em.op("MatMul", dz, em.const(np.ascontiguousarray(spec.w_all[0]), tag="w_all"), tag="dx"),
           5: em.op("Unsqueeze", dh0, em.ints([0]), tag="dh0"), 6: em.op("Unsqueeze", dc0, em.ints([0]), tag="dc0")}
    return [out[i] for i in layer.op.relevance_inputs(node)]


@dataclass(frozen=True)
class TrueLSTMGradient(Rule):
    """The LSTM op's true gradient (backpropagation through time)."""

    name: ClassVar[str] = "true-lstm-gradient"
    families: ClassVar[Mapping[Family, FamilyRule]] = family_table({Family.RECURRENT: FamilyRule(_lstm_gradient)})


__all__ = ["TrueLSTMGradient"]
