"""Recurrent layers: the ONNX ``LSTM``, ``GRU`` and ``RNN`` ops (kind ``recurrent``, rule ``recurrent``).

The rule (``rules.recurrent.Recurrent``, LRP for LSTMs after Arras et al. 2017 and 2019) is written out per time
step in its docstring. Per direction the relevance model

1. recomputes the forward quantities the rule needs (gates, cell states, pre-activations, the state entering each
   step) in a forward ``Scan`` over time, from the op's own inputs and weights;
2. runs the relevance recurrence in a backward ``Scan`` (``scan_input_directions = 1``): its state is the relevance
   of (h, c) between steps, its per-step output the normalised relevance ``s`` of the signal pre-activation;
3. gives the inputs their relevance in one batched product over all steps: ``R_x = x ⊙ (S W_signal)``.

Both scans run for any sequence length, static or dynamic. ``reverse`` processes the sequence reversed (within
``sequence_lens`` per item, as ``ReverseSequence``); ``bidirectional`` is both, summed at the input. With
``sequence_lens`` the steps past an item's length carry the state through unchanged (and get no relevance), as in
the op. ``layout = 1`` (batch first, which onnxruntime does not run) reaches here as ``layout = 0`` between
Transposes (``canonize.recurrent_layout0``).
Initial states get relevance when they are graph activations; constant or shape-derived ones take part in the
forward only (their share of the relevance is not returned, like a bias's).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ...core.emitter import Emitter
from ...core.graph import carries, const, is_param, static_dims
from ..families import Family
from .base import RuleOp, register, stabilized
from ..vocabulary import Kind


_ACTS = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu"}
_DEFAULT_ACTS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


class _BodyEmitter(Emitter):
    """An Emitter that appends nodes to a Scan body; names and constants stay shared with the outer graph (the
    body reads constants from the outer scope)."""

    def __init__(self, outer: Emitter, graph: ir.Graph):
        self.__dict__.update(outer.__dict__)
        self.graph = graph
        self._outer = outer

    def const(self, array, tag: str = "const", dtype=None, key=None):
        return self._outer.const(array, tag=tag, dtype=dtype, key=key)


def _scan(em: Emitter, tag: str, states: list, scans: list, build, n_scan_out: int, reverse: bool) -> list:
    """Emit a Scan over axis 0. ``build(sub, state_vals, scan_vals)`` returns the new states and the per-step
    outputs. ``scans`` holds (value, dtype) pairs; states are float. Returns the final states, then the stacked
    per-step outputs (in the original time order)."""
    fl = ir.TensorType(em.dtype)
    s_in = [ir.Value(name=em.name(f"{tag}_state{k}"), type=fl) for k in range(len(states))]
    x_in = [ir.Value(name=em.name(f"{tag}_step{k}"), type=ir.TensorType(dt)) for k, (_, dt) in enumerate(scans)]
    body = ir.Graph(s_in + x_in, [], nodes=[], name=em.name(f"{tag}_body"))
    sub = _BodyEmitter(em, body)
    outs = build(sub, s_in, x_in)
    fixed = []
    for k, o in enumerate(outs):
        if o.producer() is None or o.producer().graph is not body or any(o is f for f in fixed):
            # a body input, an outer value, or a value listed twice (a state that is also a per-step output)
            o = sub.op("Identity", o, tag=f"{tag}_out{k}")
        if o.type is None:
            o.type = fl
        fixed.append(o)
    body.outputs.extend(fixed)
    d = 1 if reverse else 0
    return em.op_multi("Scan", list(states) + [v for v, _ in scans], len(states) + n_scan_out, tag=tag, body=body,
                       num_scan_inputs=len(scans), scan_input_directions=[d] * len(scans),
                       scan_output_directions=[d] * n_scan_out)


def _acts(node) -> list[str]:
    t = node.op_type
    n_dir = 2 if node.attributes.get_string("direction", "forward") == "bidirectional" else 1
    if "activations" not in node.attributes:
        return list(_DEFAULT_ACTS[t]) * n_dir
    return [str(a) for a in node.attributes.get_strings("activations", [])]


@register
class Recurrent(RuleOp):
    """LSTM / GRU / RNN with constant weights: LRP for LSTMs (``rules.recurrent.Recurrent``)."""

    kind = Kind.RECURRENT
    family = Family.RECURRENT
    refusal = "a recurrent layer (use recurrent)"
    op_types = ("LSTM", "GRU", "RNN")
    multi_output = True  # relevance may arrive at Y_h / Y_c alone

    def _init_idx(self, node) -> list[int]:
        return [5, 6] if node.op_type == "LSTM" else [5]

    def relevance_inputs(self, node):
        return [i for i in [0] + self._init_idx(node) if i < len(node.inputs) and carries(node.inputs[i])]

    def check(self, node):
        t = node.op_type
        for i, what in ((1, "W"), (2, "R"), (3, "B")) + (((7, "P"),) if t == "LSTM" else ()):
            if i < len(node.inputs) and node.inputs[i] is not None and not is_param(node.inputs[i]):
                return f"{what} is not a constant (export with the weights as initializers)"
        if len(node.inputs) > 4 and node.inputs[4] is not None and (
                node.inputs[4].dtype is None or not node.inputs[4].dtype.is_integer()):
            return "sequence_lens is not an integer tensor"
        direction = node.attributes.get_string("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            return f"direction {direction!r} is not forward, reverse or bidirectional"
        n_dir = 2 if direction == "bidirectional" else 1
        if const(node.inputs[1]).shape[0] != n_dir:
            return f"W has {const(node.inputs[1]).shape[0]} directions, direction={direction} needs {n_dir}"
        acts = _acts(node)
        bad = [a for a in acts if a.lower() not in _ACTS]
        if bad or len(acts) != len(_DEFAULT_ACTS[t]) * n_dir:
            return (f"activations {acts} are not supported (each one of Sigmoid, Tanh, Relu; "
                    f"{len(_DEFAULT_ACTS[t]) * n_dir} of them); re-export with the default activations")
        if "activation_alpha" in node.attributes or "activation_beta" in node.attributes:
            return "activation_alpha/activation_beta are not supported (use activations without parameters)"
        if node.attributes.get_int("layout", 0) != 0:  # the loader's canonizer rewrites layout=1
            return "layout is not 0 (load the model with onnx_lrp.load, which transposes layout=1 to 0)"
        dims = static_dims(node.inputs[0])
        if dims is not None and len(dims) != 3:
            return "X is not of rank 3"
        return None


    # ------------------------------------------------------------------------------------------ emission
    def propagate(self, em: Emitter, layer, rule, r_outs: list) -> list:
        """The relevance of X (and of the initial states that are activations): per direction, the forward scan
        recomputes what the rule needs, the backward scan runs the relevance recurrence (``_direction``)."""
        node = layer.node
        spec = _Spec.of(node, float(rule.epsilon))
        x = node.inputs[0]
        lens = _opt(node, 4)
        if lens is not None:
            lens = em.op("Cast", lens, to=ir.DataType.INT64.value, tag="lens")
        # zeros [B, H] for absent initial states and relevance
        bh_shape = em.op("Concat", em.op("Shape", x, start=1, end=2, tag="batch"), em.ints([spec.hidden]), axis=0,
                         tag="bh_shape")
        zeros_bh = em.op("ConstantOfShape", bh_shape, value=ir.tensor(np.zeros(1, dtype=em.np_dtype)), tag="zeros_bh")
        mask = _length_mask(em, x, lens) if lens is not None else None
        r_x_parts, r_h0, r_c0 = [], [], []
        for d in spec.dirs:
            with em.scope(f"{node.name}/dir{d}"):
                rx, rh, rc = _direction(em, spec, d, r_outs, lens, mask, zeros_bh)
                r_x_parts.append(rx)
                r_h0.append(em.op("Unsqueeze", rh, em.ints([0]), tag="r_h0"))
                if rc is not None:
                    r_c0.append(em.op("Unsqueeze", rc, em.ints([0]), tag="r_c0"))
        with em.scope(node.name):
            out = {0: em.sum(r_x_parts, tag="r_x")}
            for i, parts in ((5, r_h0), (6, r_c0)):
                if not parts:
                    continue
                out[i] = parts[0] if len(parts) == 1 else em.op("Concat", *parts, axis=0, tag=f"r_init{i}")
        return [out[i] for i in self.relevance_inputs(node)]


def _opt(node: ir.Node, i: int) -> ir.Value | None:
    """Optional input i (None when absent)."""
    return node.inputs[i] if len(node.inputs) > i and node.inputs[i] is not None else None


@dataclass(frozen=True)
class _Spec:
    """What one recurrent node fixes: its type, directions, weights per direction (W, R, B, peepholes P), hidden
    size, clip, activations, and the rule's epsilon."""

    node: ir.Node
    direction: str
    dirs: list
    w_all: np.ndarray
    r_all: np.ndarray
    b_all: np.ndarray
    p_all: np.ndarray | None
    hidden: int
    clip: float | None
    acts: list
    eps: float

    @classmethod
    def of(cls, node: ir.Node, eps: float) -> "_Spec":
        t = node.op_type
        direction = node.attributes.get_string("direction", "forward")
        dirs = [0, 1] if direction == "bidirectional" else [0]
        w_all, r_all = const(node.inputs[1]), const(node.inputs[2])
        hidden = r_all.shape[-1]
        b_all = const(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
        if b_all is None:
            b_all = np.zeros((len(dirs), 2 * _GATES[t] * hidden), dtype=w_all.dtype)
        p_all = const(node.inputs[7]) if t == "LSTM" and len(node.inputs) > 7 and node.inputs[7] is not None else None
        clip = node.attributes.get_float("clip", 0.0) if "clip" in node.attributes else None
        return cls(node, direction, dirs, w_all, r_all, b_all, p_all, hidden, clip, _acts(node), eps)


def _length_mask(em: Emitter, x: ir.Value, lens: ir.Value) -> ir.Value:
    """[T, B, 1]: step t of item b is inside its length."""
    steps = em.op("Range", em.op("Squeeze", em.ints([0]), tag="zero"),  # Range takes 0-d scalars
                  em.op("Squeeze", em.op("Shape", x, start=0, end=1, tag="T"), tag="T_n"),
                  em.op("Squeeze", em.ints([1]), tag="one"), tag="steps")
    mask = em.op("Less", em.op("Unsqueeze", steps, em.ints([1]), tag="steps_col"),
                 em.op("Unsqueeze", lens, em.ints([0]), tag="lens_row"), tag="mask_tb")
    return em.op("Unsqueeze", mask, em.ints([2]), tag="mask")


def _reverse_t(em: Emitter, v: ir.Value, lens: ir.Value | None, tag: str) -> ir.Value:
    """v reversed along time (axis 0), within each item's length where ``lens`` is given."""
    if lens is not None:
        return em.op("ReverseSequence", v, lens, batch_axis=1, time_axis=0, tag=tag)
    return em.op("Slice", v, em.ints([-1]), em.ints([-(2 ** 62)]), em.ints([0]), em.ints([-1]), tag=tag)


def _direction(em: Emitter, spec: _Spec, d: int, r_outs: list, lens, mask, zeros_bh) -> tuple:
    """(R_x, R_h0, R_c0 or None) of direction d (layout 0: Y [T, D, B, H], Y_h / Y_c / initial states [D, B, H])."""
    node, t = spec.node, spec.node.op_type
    rev = spec.direction == "reverse" or d == 1
    x = node.inputs[0]
    xd = _reverse_t(em, x, lens, "x_rev") if rev else x
    per_dir = len(_DEFAULT_ACTS[t])
    a_fw = [_ACTS[a.lower()] for a in spec.acts[d * per_dir:(d + 1) * per_dir]]
    init_h, init_c = _opt(node, 5), (_opt(node, 6) if t == "LSTM" else None)
    h0 = _take(em, init_h, d, 0, "h0") if init_h is not None else zeros_bh
    c0 = None
    if t == "LSTM":
        c0 = _take(em, init_c, d, 0, "c0") if init_c is not None else zeros_bh
    r_y = r_outs[0]
    r_yh = r_outs[1] if len(r_outs) > 1 else None
    r_yc = r_outs[2] if len(r_outs) > 2 else None
    ry = None
    if r_y is not None:
        ry = _take(em, r_y, d, 1, "r_y")
        if rev:
            ry = _reverse_t(em, ry, lens, "r_y_rev")
    ryh = _take(em, r_yh, d, 0, "r_yh") if r_yh is not None else zeros_bh
    ryc = None
    if t == "LSTM":
        ryc = _take(em, r_yc, d, 0, "r_yc") if r_yc is not None else zeros_bh
    step = dict(LSTM=_lstm, GRU=_gru, RNN=_rnn)[t]
    p = spec.p_all[d] if spec.p_all is not None else None
    s_sig, w_sig, rh, rc = step(em, Cell(node, xd, spec.w_all[d], spec.r_all[d], spec.b_all[d], p, spec.clip, a_fw,
                                         h0, c0, ry, ryh, ryc, mask, spec.eps, spec.hidden))
    jt = em.op("MatMul", s_sig, em.const(w_sig, tag="w_signal"), tag="JTs_x")
    rx = em.mul(xd, jt, tag="r_x")
    return (_reverse_t(em, rx, lens, "r_x_unrev") if rev else rx), rh, rc


# ------------------------------------------------------------------------------------------ cells
@dataclass
class Cell:
    """One direction of a recurrent layer as ``_lstm`` / ``_gru`` / ``_rnn`` read it: the input sequence ``xd``
    (time-reversed for the backward direction), this direction's weights ``w``, ``r``, bias ``b`` and peepholes
    ``p``, ``clip``, the activations, the initial states ``h0`` / ``c0``, the relevance of Y (``ry``), Y_h
    (``ryh``) and Y_c (``ryc``), the length mask [T, B, 1] (or None), the rule's ``eps`` and the hidden size."""

    node: ir.Node
    xd: ir.Value
    w: np.ndarray
    r: np.ndarray
    b: np.ndarray
    p: np.ndarray | None
    clip: float | None
    acts: list
    h0: ir.Value
    c0: ir.Value | None
    ry: ir.Value | None
    ryh: ir.Value
    ryc: ir.Value | None
    mask: ir.Value | None
    eps: float
    hid: int


def _take(em, v, d, axis, tag):
    """Direction d of v along ``axis`` (the axis removed)."""
    return em.op("Squeeze", em.op("Gather", v, em.ints([d]), axis=axis, tag=f"{tag}_d"), em.ints([axis]), tag=tag)


def _clip(em, v, clip, tag):
    if clip is None:
        return v
    return em.op("Clip", v, em.scalar(-clip), em.scalar(clip), tag=tag)


def _masked(em, m, new, old, tag):
    return new if m is None else em.op("Where", m, new, old, tag=tag)


def _input_proj(em, xd, w, bias):
    """x W^T + bias for all steps at once: [T, B, gates * H]."""
    xw = em.op("MatMul", xd, em.const(np.ascontiguousarray(w.T), tag="wT"), tag="xw")
    return em.add(xw, em.const(bias, tag="b_in"), tag="xw_b") if np.any(bias) else xw


def _backward_step(sub, rh, sc, ry, mask):
    """One step of a backward scan: the hidden state's relevance plus the relevance of this step's output Y (masked
    past the sequence's length), the step's mask (or None), and the remaining scanned forward values."""
    k = 0
    if ry is not None:
        m_ry = sc[0] if mask is None else sub.op("Where", sc[1], sc[0], sub.scalar(0.0), tag="r_y_valid")
        rh = sub.add(rh, m_ry, tag="r_h")
        k = 1
    m = sc[k] if mask is not None else None
    return rh, m, sc[k + (1 if mask is not None else 0):]


def _lstm(em, cell: Cell):
    """ONNX LSTM, gates in the order i, o, f, c (ONNX's iofc)."""
    node, xd, w, r, b, p, clip, acts = cell.node, cell.xd, cell.w, cell.r, cell.b, cell.p, cell.clip, cell.acts
    h0, c0, ry, ryh, ryc, mask, eps, hid = cell.h0, cell.c0, cell.ry, cell.ryh, cell.ryc, cell.mask, cell.eps, cell.hid
    f_act, g_act, h_act = acts
    xw = _input_proj(em, xd, w, b[:4 * hid] + b[4 * hid:])
    fl = em.dtype

    def fwd(sub, st, sc):
        h, c = st
        m = sc[1] if mask is not None else None
        zz = sub.add(sc[0], sub.op("MatMul", h, sub.const(np.ascontiguousarray(r.T), tag="rT"), tag="hr"), tag="z")
        zi, zo, zf, zc = sub.op_multi("Split", [zz, sub.ints([hid] * 4)], 4, axis=-1, tag="gate")
        if p is not None:
            zi = sub.add(zi, sub.mul(c, sub.const(p[:hid], tag="p_i"), tag="pc_i"), tag="zi_p")
            zf = sub.add(zf, sub.mul(c, sub.const(p[2 * hid:], tag="p_f"), tag="pc_f"), tag="zf_p")
        i = sub.op(f_act, _clip(sub, zi, clip, "zi_clip"), tag="i")
        if node.attributes.get_int("input_forget", 0):  # coupled gates: f = 1 - i
            f = sub.sub(sub.scalar(1.0), i, tag="f")
        else:
            f = sub.op(f_act, _clip(sub, zf, clip, "zf_clip"), tag="f")
        gg = sub.op(g_act, _clip(sub, zc, clip, "zc_clip"), tag="g")
        c_new = sub.add(sub.mul(f, c, tag="fc"), sub.mul(i, gg, tag="ig"), tag="c_new")
        if p is not None:
            zo = sub.add(zo, sub.mul(c_new, sub.const(p[hid:2 * hid], tag="p_o"), tag="pc_o"), tag="zo_p")
        o = sub.op(f_act, _clip(sub, zo, clip, "zo_clip"), tag="o")
        h_new = sub.mul(o, sub.op(h_act, c_new, tag="hc"), tag="h_new")
        return [_masked(sub, m, h_new, h, "h_next"), _masked(sub, m, c_new, c, "c_next"),
                h, c, i, f, gg, zc, c_new]

    scans = [(xw, fl)] + ([(mask, ir.DataType.BOOL)] if mask is not None else [])
    outs = _scan(em, "fwd", [h0, c0], scans, fwd, 7, reverse=False)
    h_prev, c_prev, i, f, gg, zc, c_new = outs[2:]
    r_c = np.ascontiguousarray(r[3 * hid:])  # the signal's recurrent weight [H, H]

    def bwd(sub, st, sc):
        rh, rc = st
        rh, m, (hp, cp, ii, ff, gv, a, cn) = _backward_step(sub, rh, sc, ry, mask)
        rc_t = sub.add(rc, rh, tag="r_c")               # o ⊙ tanh(c): all relevance to c
        s_c = sub.div(rc_t, stabilized(sub, cn, eps, tag="c_stab"), tag="s_c")
        r_cp = sub.mul(sub.mul(ff, cp, tag="fc"), s_c, tag="r_c_prev")
        r_a = sub.mul(sub.mul(ii, gv, tag="ig"), s_c, tag="r_g")   # i ⊙ g: all relevance to g
        s_a = sub.div(r_a, stabilized(sub, a, eps, tag="a_stab"), tag="s_a")
        r_hp = sub.mul(hp, sub.op("MatMul", s_a, sub.const(r_c, tag="r_signal"), tag="JTs_h"), tag="r_h_prev")
        return [_masked(sub, m, r_hp, rh, "r_h_next"), _masked(sub, m, r_cp, rc, "r_c_next"),
                _masked(sub, m, s_a, sub.scalar(0.0), "s_a_valid")]

    scans = ([(ry, fl)] if ry is not None else []) + ([(mask, ir.DataType.BOOL)] if mask is not None else []) + \
        [(v, fl) for v in (h_prev, c_prev, i, f, gg, zc, c_new)]
    rh0, rc0, s_a = _scan(em, "bwd", [ryh, ryc], scans, bwd, 1, reverse=True)
    return s_a, np.ascontiguousarray(w[3 * hid:]), rh0, rc0


def _gru(em, cell: Cell):
    """ONNX GRU, gates in the order z, r, h."""
    node, xd, w, r, b, clip, acts = cell.node, cell.xd, cell.w, cell.r, cell.b, cell.clip, cell.acts
    h0, ry, ryh, mask, eps, hid = cell.h0, cell.ry, cell.ryh, cell.mask, cell.eps, cell.hid
    f_act, g_act = acts
    lbr = node.attributes.get_int("linear_before_reset", 0)
    wb, rb = b[:3 * hid], b[3 * hid:]
    bias = wb + np.concatenate([rb[:2 * hid], np.zeros(hid, rb.dtype) if lbr else rb[2 * hid:]])
    xw = _input_proj(em, xd, w, bias)
    r_zr, r_n = np.ascontiguousarray(r[:2 * hid]), np.ascontiguousarray(r[2 * hid:])
    fl = em.dtype

    def fwd(sub, st, sc):
        (h,) = st
        m = sc[1] if mask is not None else None
        xz, xr, xn = sub.op_multi("Split", [sc[0], sub.ints([hid] * 3)], 3, axis=-1, tag="x_gate")
        hz, hr = sub.op_multi("Split", [sub.op("MatMul", h, sub.const(r_zr.T, tag="r_zrT"), tag="h_zr"),
                                        sub.ints([hid] * 2)], 2, axis=-1, tag="h_gate")
        z = sub.op(f_act, _clip(sub, sub.add(xz, hz, tag="zz"), clip, "zz_clip"), tag="z")
        rr = sub.op(f_act, _clip(sub, sub.add(xr, hr, tag="zr"), clip, "zr_clip"), tag="r")
        r_nT = sub.const(np.ascontiguousarray(r_n.T), tag="r_nT")
        if lbr:
            hn = sub.op("MatMul", h, r_nT, tag="h_n")
            if np.any(rb[2 * hid:]):
                hn = sub.add(hn, sub.const(rb[2 * hid:], tag="rb_n"), tag="h_nb")
            a = sub.add(xn, sub.mul(rr, hn, tag="r_hn"), tag="a")
        else:
            a = sub.add(xn, sub.op("MatMul", sub.mul(rr, h, tag="rh"), r_nT, tag="rh_n"), tag="a")
        n = sub.op(g_act, _clip(sub, a, clip, "a_clip"), tag="n")
        h_new = sub.add(sub.mul(sub.sub(sub.scalar(1.0), z, tag="1-z"), n, tag="zn"), sub.mul(z, h, tag="zh"),
                        tag="h_new")
        return [_masked(sub, m, h_new, h, "h_next"), h, z, rr, n, a, h_new]

    scans = [(xw, fl)] + ([(mask, ir.DataType.BOOL)] if mask is not None else [])
    outs = _scan(em, "fwd", [h0], scans, fwd, 6, reverse=False)
    h_prev, z, rr, n, a, h_new = outs[1:]

    def bwd(sub, st, sc):
        (rh,) = st
        rh, m, (hp, zv, rv, nv, av, hn) = _backward_step(sub, rh, sc, ry, mask)
        s = sub.div(rh, stabilized(sub, hn, eps, tag="h_stab"), tag="s_h")
        r_n_rel = sub.mul(sub.mul(sub.sub(sub.scalar(1.0), zv, tag="1-z"), nv, tag="zn"), s, tag="r_n")
        r_direct = sub.mul(sub.mul(zv, hp, tag="zh"), s, tag="r_h_direct")
        s_a = sub.div(r_n_rel, stabilized(sub, av, eps, tag="a_stab"), tag="s_a")
        rn = sub.const(r_n, tag="r_signal")
        if lbr:   # a = W x + r ⊙ (R_n h + b): J_h^T s = R_n^T (r ⊙ s)
            jt = sub.op("MatMul", sub.mul(rv, s_a, tag="r_s"), rn, tag="JTs_h")
        else:     # a = W x + R_n (r ⊙ h) + b: J_h^T s = r ⊙ R_n^T s
            jt = sub.mul(rv, sub.op("MatMul", s_a, rn, tag="Rs"), tag="JTs_h")
        r_hp = sub.add(r_direct, sub.mul(hp, jt, tag="r_h_lin"), tag="r_h_prev")
        return [_masked(sub, m, r_hp, rh, "r_h_next"), _masked(sub, m, s_a, sub.scalar(0.0), "s_a_valid")]

    scans = ([(ry, fl)] if ry is not None else []) + ([(mask, ir.DataType.BOOL)] if mask is not None else []) + \
        [(v, fl) for v in (h_prev, z, rr, n, a, h_new)]
    rh0, s_a = _scan(em, "bwd", [ryh], scans, bwd, 1, reverse=True)
    return s_a, np.ascontiguousarray(w[2 * hid:]), rh0, None


def _rnn(em, cell: Cell):
    """ONNX RNN: h_t = f(x W^T + h R^T + Wb + Rb)."""
    xd, w, r, b, clip, acts = cell.xd, cell.w, cell.r, cell.b, cell.clip, cell.acts
    h0, ry, ryh, mask, eps, hid = cell.h0, cell.ry, cell.ryh, cell.mask, cell.eps, cell.hid
    (f_act,) = acts
    xw = _input_proj(em, xd, w, b[:hid] + b[hid:])
    fl = em.dtype

    def fwd(sub, st, sc):
        (h,) = st
        m = sc[1] if mask is not None else None
        a = sub.add(sc[0], sub.op("MatMul", h, sub.const(np.ascontiguousarray(r.T), tag="rT"), tag="hr"), tag="a")
        h_new = sub.op(f_act, _clip(sub, a, clip, "a_clip"), tag="h_new")
        return [_masked(sub, m, h_new, h, "h_next"), h, a]

    scans = [(xw, fl)] + ([(mask, ir.DataType.BOOL)] if mask is not None else [])
    _, h_prev, a = _scan(em, "fwd", [h0], scans, fwd, 2, reverse=False)

    def bwd(sub, st, sc):
        (rh,) = st
        rh, m, (hp, av) = _backward_step(sub, rh, sc, ry, mask)
        s_a = sub.div(rh, stabilized(sub, av, eps, tag="a_stab"), tag="s_a")   # f(a): identity
        r_hp = sub.mul(hp, sub.op("MatMul", s_a, sub.const(r, tag="r_signal"), tag="JTs_h"), tag="r_h_prev")
        return [_masked(sub, m, r_hp, rh, "r_h_next"), _masked(sub, m, s_a, sub.scalar(0.0), "s_a_valid")]

    scans = ([(ry, fl)] if ry is not None else []) + ([(mask, ir.DataType.BOOL)] if mask is not None else []) + \
        [(h_prev, fl), (a, fl)]
    rh0, s_a = _scan(em, "bwd", [ryh], scans, bwd, 1, reverse=True)
    return s_a, w, rh0, None


# the building blocks onnx_lrp.methods.lstmgrad (the LSTM's true gradient) emits its scans with
scan, Spec, input_proj, optional_input, take, DEFAULT_ACTS = _scan, _Spec, _input_proj, _opt, _take, _DEFAULT_ACTS
