"""Computed weights: a saved relevance model without stored copies of modified weights.

The rules store modified weights (W+, |W|, W + gamma W+, the flipped and transposed kernels of a Conv's transpose,
...) as initializers: ResNet18 grows from 47 MB to 139 MB (epsilon-plus-flat) or 178 MB (gamma-box).
:func:`compute_in_graph` finds, for every large ``lrp/`` initializer, the original weight it derives from and
replaces it with a few nodes computing it from that weight (Reshape/Transpose/Slice for the layout, then Relu, Min,
Abs, Mul, Add for the values). onnxruntime folds them into constants when it loads the model, so the file is about
the size of the model and runs at the same speed once loaded.

Nothing is guessed: a replacement is made only when the expression reproduces the stored array (bit for bit for
the exact forms; to float32 rounding, 2e-6 of the weight's scale, for ``a W + b |W|``), else the copy stays.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from .. import load as loader
from ..core.emitter import Emitter
from ..core.relevance_model import RelevanceModel
from ..load.external import Parts


MIN_ELEMENTS = 256  # smaller constants are not worth an expression
INT64_MIN = np.iinfo(np.int64).min


@dataclass(frozen=True)
class Layout:
    """How a stored array's axes derive from an original weight's."""

    kind: str  # "same", "swap_last" (matrix transpose) or "conv_t" (grouped in/out swap, kernel flipped)
    group: int = 1
    flip: bool = True

    def apply(self, w: np.ndarray) -> np.ndarray:
        if self.kind == "same":
            return w
        if self.kind == "swap_last":
            return np.swapaxes(w, -1, -2)
        g, cout, cin_g = self.group, w.shape[0], w.shape[1]
        wt = w.reshape((g, cout // g, cin_g) + w.shape[2:]).swapaxes(1, 2).reshape((g * cin_g, cout // g)
                                                                                  + w.shape[2:])
        return np.flip(wt, axis=tuple(range(2, w.ndim))) if self.flip else wt

    def emit(self, em: Emitter, w: ir.Value, shape: tuple) -> ir.Value:
        if self.kind == "same":
            return w
        if self.kind == "swap_last":
            perm = list(range(len(shape)))
            perm[-1], perm[-2] = perm[-2], perm[-1]
            return em.op("Transpose", w, perm=perm, tag="layout")
        g, cout, cin_g, k = self.group, shape[0], shape[1], list(shape[2:])
        t = em.op("Reshape", w, em.ints([g, cout // g, cin_g] + k), tag="grouped")
        t = em.op("Transpose", t, perm=[0, 2, 1] + list(range(3, 3 + len(k))), tag="swapped")
        t = em.op("Reshape", t, em.ints([g * cin_g, cout // g] + k), tag="swapped_flat")
        if self.flip and k:
            axes = list(range(2, 2 + len(k)))
            t = em.op("Slice", t, em.ints([-1] * len(k)), em.ints([INT64_MIN] * len(k)), em.ints(axes),
                      em.ints([-1] * len(k)), tag="flipped")
        return t


def _layouts(w: np.ndarray, shape: tuple) -> list[Layout]:
    out = []
    if w.shape == shape:
        out.append(Layout("same"))
    if w.ndim >= 2 and np.swapaxes(w, -1, -2).shape == shape:
        out.append(Layout("swap_last"))
    if w.ndim >= 3 and len(shape) == w.ndim and shape[2:] == w.shape[2:] and w.shape[1] and shape[0] % w.shape[1] == 0:
        g = shape[0] // w.shape[1]
        if g >= 1 and w.shape[0] % g == 0 and shape[1] == w.shape[0] // g:
            out += [Layout("conv_t", g, True), Layout("conv_t", g, False)]
    return out


def _values(t: np.ndarray, a: np.ndarray):
    """An exact or float32-close expression of ``a`` in terms of ``t`` (same shape), or None."""
    if np.array_equal(a, t):
        return ("id",)
    if np.array_equal(a, np.maximum(t, 0)):
        return ("relu",)
    if np.array_equal(a, np.minimum(t, 0)):
        return ("min0",)
    if np.array_equal(a, np.abs(t)):
        return ("abs",)
    if np.array_equal(a, t * t):
        return ("square",)
    # a = alpha t + beta |t| (W + gamma W+, W - |W| / 2, ...): least squares on two samples' worth of entries
    t64, a64 = t.astype(np.float64).ravel(), a.astype(np.float64).ravel()
    basis = np.stack([t64, np.abs(t64)], axis=1)
    coef, *_ = np.linalg.lstsq(basis, a64, rcond=None)
    scale = float(np.max(np.abs(a64))) or 1.0
    if np.max(np.abs(basis @ coef - a64)) <= 2e-6 * scale:
        return ("affine", float(coef[0]), float(coef[1]))
    return None


def _emit_values(em: Emitter, t: ir.Value, expr) -> ir.Value:
    kind = expr[0]
    if kind == "id":
        return em.op("Identity", t, tag="w")
    if kind == "relu":
        return em.op("Relu", t, tag="w_pos")
    if kind == "min0":
        return em.op("Min", t, em.scalar(0.0), tag="w_neg")
    if kind == "abs":
        return em.op("Abs", t, tag="w_abs")
    if kind == "square":
        return em.op("Mul", t, t, tag="w_sq")
    _, alpha, beta = expr
    parts = []
    if alpha:
        parts.append(em.op("Mul", t, em.scalar(alpha), tag="w_alpha"))
    if beta:
        parts.append(em.op("Mul", em.op("Abs", t, tag="w_abs"), em.scalar(beta), tag="w_beta"))
    return em.sum(parts, tag="w_mod") if parts else em.op("Mul", t, em.scalar(0.0), tag="w_zero")


def compute_in_graph(model: ir.Model) -> dict:
    """Replace stored modified weights by expressions of the original weights (in place); returns counts."""
    graph = model.graph
    dtype = ir.DataType.FLOAT
    em = Emitter(graph, model.opset_imports.get("", 17), dtype=dtype)
    originals = {}
    for name, v in graph.initializers.items():
        if not name.startswith("lrp/") and v.const_value is not None:
            arr = v.const_value.numpy()
            if arr.dtype == np.float32 and arr.size >= MIN_ELEMENTS:
                originals.setdefault(arr.size, []).append((v, arr))
    done = dict(replaced=0, kept=0, constant=0, bytes_saved=0)
    replacements = []
    for name, v in list(graph.initializers.items()):
        if not name.startswith("lrp/") or v.const_value is None:
            continue
        a = v.const_value.numpy()
        if a.dtype != np.float32 or a.size < MIN_ELEMENTS:
            continue
        with em.scope(f"weights/{name.removeprefix('lrp/')}"):
            flat = a.ravel()
            if np.all(flat == flat[0]):  # e.g. the flat rule's ones
                new = em.op("ConstantOfShape", em.ints(a.shape), tag="fill",
                            value=ir.tensor(np.array([flat[0]], dtype=a.dtype)))
                replacements.append((v, new, a.nbytes))
                done["constant"] += 1
                continue
            found = None
            for w_val, w in originals.get(a.size, []):
                for layout in _layouts(w, a.shape):
                    expr = _values(layout.apply(w), a)
                    if expr is not None:
                        found = (w_val, w.shape, layout, expr)
                        break
                if found:
                    break
            if found is None:
                done["kept"] += 1
                continue
            w_val, shape, layout, expr = found
            new = _emit_values(em, layout.emit(em, w_val, shape), expr)
            replacements.append((v, new, a.nbytes))
            done["replaced"] += 1
    for old, new, nbytes in replacements:
        old.replace_all_uses_with(new)
        if old.is_graph_output():  # never the case for weights; kept for safety
            continue
        name = old.name
        del graph.initializers[name]
        new.name = name
        new.type = old.type
        new.shape = old.shape
        done["bytes_saved"] += nbytes
    graph.sort()
    return done


def with_computed_weights(relevance_model: RelevanceModel) -> tuple[Parts, dict]:
    """The relevance model with its modified weights computed in the graph (:func:`compute_in_graph`), as
    onnxruntime receives it, and the counts."""
    model = loader.deserialize(relevance_model.model_bytes, relevance_model.model_folder)
    for v in model.graph.initializers.values():  # the tensors onnx-lrp handed over from memory
        if v.name in relevance_model.model_arrays:
            v.const_value = ir.tensor(relevance_model.model_arrays[v.name], name=v.name)
    counts = compute_in_graph(model)
    return loader.serialize_parts(model), counts


__all__ = ["compute_in_graph", "with_computed_weights"]
