"""A numpy oracle for LRP through ONNX LSTM / GRU / RNN, written from the papers' formulas.

The forward follows the ONNX operator definitions (gate order iofc / zrh, per item and step, ``sequence_lens``
processing only each item's first L steps, ``reverse`` running them from L-1 down to 0). The backward applies, step
by step and item by item, LRP for LSTMs (Arras et al. 2017, "Explaining Recurrent Neural Network Predictions in
Sentiment Analysis"; Arras et al. 2019, "Explaining and Interpreting LSTMs"): epsilon on the linear maps
W x_t + R h_{t-1} + b, signal-take-all at gate ⊙ signal products, the cell state's sum split proportionally.
Everything in float64, on layout 0 ([T, B, ...]) arrays of one direction.
"""
from __future__ import annotations

import numpy as np


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


_ACT = {"Sigmoid": _sig, "Tanh": np.tanh, "Relu": lambda x: np.maximum(x, 0.0)}


def stab(z, eps):
    """zennit: z + eps (sign(z) + (z == 0)); eps = 0 keeps z and replaces its exact zeros by 1."""
    if eps == 0:
        return np.where(z == 0, 1.0, z)
    return z + eps * (np.sign(z) + (z == 0))


def _steps(T, L, reverse):
    return list(range(L - 1, -1, -1)) if reverse else list(range(L))


def lrp(op, x, w, r, b, h0, c0, ry, ryh, ryc, lens=None, reverse=False, eps=1e-6, p=None, lbr=0, acts=None,
        clip=None, input_forget=0):
    """One direction. x [T, B, I]; w [G*H, I]; r [G*H, H]; b [2*G*H]; h0/c0/ryh/ryc [B, H]; ry [T, B, H].

    Returns (Y [T, B, H], Y_h [B, H], Y_c [B, H] or None, R_x [T, B, I], R_h0 [B, H], R_c0 [B, H] or None)."""
    x, w, r, b = (np.asarray(a, np.float64) for a in (x, w, r, b))
    ACT = {k: (lambda v, f=f: f(np.clip(v, -clip, clip))) for k, f in _ACT.items()} if clip else _ACT
    T, B, _ = x.shape
    H = r.shape[1]
    lens = np.full(B, T) if lens is None else np.asarray(lens)
    Y = np.zeros((T, B, H))
    Yh, Yc = np.zeros((B, H)), np.zeros((B, H))
    Rx, Rh0, Rc0 = np.zeros_like(x), np.zeros((B, H)), np.zeros((B, H))
    for it in range(B):
        ts = _steps(T, int(lens[it]), reverse)
        h = np.asarray(h0[it], np.float64)
        c = np.asarray(c0[it], np.float64) if c0 is not None else None
        saved = []
        for t in ts:
            xt = x[t, it]
            if op == "LSTM":
                f, g = (ACT[a] for a in (acts or ("Sigmoid", "Tanh", "Tanh"))[:2])
                hh = _ACT[(acts or ("Sigmoid", "Tanh", "Tanh"))[2]]  # onnxruntime clips the gates' inputs only
                Wi, Wo, Wf, Wc = np.split(w, 4)
                Ri, Ro, Rf, Rc = np.split(r, 4)
                wb, rb = np.split(b, 2)
                bi, bo, bf, bc = np.split(wb + rb, 4)
                Pi, Po, Pf = np.split(np.zeros(3 * H) if p is None else np.asarray(p, np.float64), 3)
                i = f(Wi @ xt + Ri @ h + Pi * c + bi)
                ff = 1.0 - i if input_forget else f(Wf @ xt + Rf @ h + Pf * c + bf)
                a = Wc @ xt + Rc @ h + bc      # the signal's linear map
                gg = g(a)
                c_new = ff * c + i * gg
                o = f(Wo @ xt + Ro @ h + Po * c_new + bo)
                h_new = o * hh(c_new)
                saved.append((t, xt, h, c, i, ff, gg, a, c_new))
                c = c_new
            elif op == "GRU":
                f, g = (ACT[a] for a in (acts or ("Sigmoid", "Tanh")))
                Wz, Wr, Wn = np.split(w, 3)
                Rz, Rr, Rn = np.split(r, 3)
                wb, rb = np.split(b, 2)
                Wbz, Wbr, Wbn = np.split(wb, 3)
                Rbz, Rbr, Rbn = np.split(rb, 3)
                z = f(Wz @ xt + Rz @ h + Wbz + Rbz)
                rr = f(Wr @ xt + Rr @ h + Wbr + Rbr)
                if lbr:
                    a = Wn @ xt + rr * (Rn @ h + Rbn) + Wbn
                else:
                    a = Wn @ xt + Rn @ (rr * h) + Rbn + Wbn
                n = g(a)
                h_new = (1 - z) * n + z * h
                saved.append((t, xt, h, z, rr, n, a, h_new))
            else:
                f = ACT[(acts or ("Tanh",))[0]]
                wb, rb = np.split(b, 2)
                a = w @ xt + r @ h + wb + rb
                h_new = f(a)
                saved.append((t, xt, h, a))
            h = h_new
            Y[t, it] = h
        Yh[it] = h
        if c is not None:
            Yc[it] = c
        # relevance, step by step backwards
        Rh = np.asarray(ryh[it], np.float64).copy()
        Rcs = np.asarray(ryc[it], np.float64).copy() if op == "LSTM" else None
        for rec in reversed(saved):
            t = rec[0]
            Rh = Rh + ry[t, it]
            if op == "LSTM":
                _, xt, hp, cp, i, ff, gg, a, c_new = rec
                Rc_t = Rcs + Rh                                  # h = o ⊙ tanh(c): all to c
                R_cp = ff * cp * Rc_t / stab(c_new, eps)         # c = f ⊙ c_prev + i ⊙ g: proportional split
                R_a = i * gg * Rc_t / stab(c_new, eps)           # i ⊙ g: all to g, identity through tanh
                Wsig, Rsig = np.split(w, 4)[3], np.split(r, 4)[3]
                Rx[t, it] = xt * (Wsig.T @ (R_a / stab(a, eps)))
                Rh = hp * (Rsig.T @ (R_a / stab(a, eps)))
                Rcs = R_cp
            elif op == "GRU":
                _, xt, hp, z, rr, n, a, h_new = rec
                R_n = (1 - z) * n * Rh / stab(h_new, eps)
                R_direct = z * hp * Rh / stab(h_new, eps)
                s = R_n / stab(a, eps)
                Wn, Rn = np.split(w, 3)[2], np.split(r, 3)[2]
                Rx[t, it] = xt * (Wn.T @ s)
                # the term of h_j in a_k: rr_k Rn_kj h_j (lbr) or Rn_kj rr_j h_j
                lin = hp * (Rn.T @ (rr * s)) if lbr else hp * rr * (Rn.T @ s)
                Rh = R_direct + lin
            else:
                _, xt, hp, a = rec
                s = Rh / stab(a, eps)
                Rx[t, it] = xt * (w.T @ s)
                Rh = hp * (r.T @ s)
        Rh0[it] = Rh
        if op == "LSTM":
            Rc0[it] = Rcs
    return Y, Yh, (Yc if op == "LSTM" else None), Rx, Rh0, (Rc0 if op == "LSTM" else None)


def lrp_op(op, x, w, r, b, h0, c0, ry, ryh, ryc, direction="forward", layout=0, **kw):
    """The whole op (all directions) in ONNX's layouts: x [T, B, I] (layout 1: [B, T, I]), W [D, G*H, I], ...,
    ry [T, D, B, H] (layout 1: [B, T, D, H]), ryh/ryc/h0/c0 [D, B, H] (layout 1: [B, D, H]). Returns
    (Y, Y_h, Y_c, R_x, R_h0, R_c0) in the same layouts."""
    if layout == 1:
        x = np.swapaxes(x, 0, 1)
        ry = np.transpose(ry, (1, 2, 0, 3))
        h0, c0, ryh, ryc = (None if a is None else np.swapaxes(a, 0, 1) for a in (h0, c0, ryh, ryc))
    D = 2 if direction == "bidirectional" else 1
    outs = []
    for d in range(D):
        rev = direction == "reverse" or d == 1
        outs.append(lrp(op, x, w[d], r[d], b[d], h0[d], None if c0 is None else c0[d], ry[:, d], ryh[d],
                        None if ryc is None else ryc[d], reverse=rev, p=None if kw.get("p") is None else kw["p"][d],
                        **{k: v for k, v in kw.items() if k != "p"}))
    Y = np.stack([o[0] for o in outs], axis=1)
    Yh = np.stack([o[1] for o in outs])
    Yc = None if op != "LSTM" else np.stack([o[2] for o in outs])
    Rx = sum(o[3] for o in outs)
    Rh0 = np.stack([o[4] for o in outs])
    Rc0 = None if op != "LSTM" else np.stack([o[5] for o in outs])
    if layout == 1:
        Y = np.transpose(Y, (2, 0, 1, 3))
        Rx = np.swapaxes(Rx, 0, 1)
        Yh, Yc, Rh0, Rc0 = (None if a is None else np.swapaxes(a, 0, 1) for a in (Yh, Yc, Rh0, Rc0))
    return Y, Yh, Yc, Rx, Rh0, Rc0
