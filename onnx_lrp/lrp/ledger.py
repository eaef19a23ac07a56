"""The conservation ledger: the relevance sums that enter and leave every node, as extra outputs of the relevance model.

The walk calls :meth:`Ledger.enter` with a node's output relevance (the relevance arriving from the explained
output's side) and :meth:`Ledger.leave` with the relevance it hands to its carried inputs. Each becomes one
ReduceSum over every axis (batch included), and :meth:`Ledger.finish` concatenates them into two outputs
``lrp/ledger/entering`` and ``lrp/ledger/leaving`` (float, one entry per row, in the rewriter's reverse topological
order). ``entering - leaving`` is what the node absorbs: biases and stabilisers of the rules, rules that do not
conserve, relevance that reaches parameters or integer inputs (token ids), relevance held inside a recognised
pattern. Nothing here re-implements a rule: the sums read the very tensors the relevance model computes. Without a
ledger the walk books into ``NO_LEDGER``, which emits nothing.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..core import meta
from ..core.emitter import Emitter
from ..core.graph import carries, is_param
from ..core.interface import LEDGER_ENTERING, LEDGER_LEAVING, LedgerRow
from .vocabulary import LAYER_KINDS, Category, Kind


ENTERING_OUTPUT = LEDGER_ENTERING
LEAVING_OUTPUT = LEDGER_LEAVING


def _sinks(node: ir.Node, kind: str, has_bias: bool) -> str:
    parts = []
    if has_bias:
        parts.append("bias")
    if kind == Kind.HELD:
        parts.append("held pattern")
    ins = [v for v in node.inputs if v is not None]
    if kind not in LAYER_KINDS | {Kind.BIAS} and any(is_param(v) and v.dtype is not None
                                                            and v.dtype.is_floating_point() for v in ins):
        parts.append("parameters")
    if any(not carries(v) and not is_param(v) and v.dtype is not None and v.dtype.is_integer() for v in ins):
        parts.append("integer inputs")
    return ", ".join(parts)


def _absorbs_bias(node: ir.Node, op) -> bool:
    """A linear layer with a bias of its own or folded in from the Add after it."""
    return op.category is Category.LINEAR and (meta.BIAS.has(node) or meta.BIAS_ADD.has(node) or len(node.inputs) > 2)


class Ledger:
    """The ledger of one walk: one row per node that relevance reaches (``rows``, the caller's list)."""

    active = True  # the relevance is booked as tensors (the walk then converts gradient forms before a linear step)

    def __init__(self, em: Emitter, rows: list):
        self.em = em
        self.rows = rows  # LedgerRow per node, filled here (the caller keeps the list)
        self._entering: list[ir.Value] = []
        self._leaving: list[ir.Value | None] = []

    def _total(self, rels, tag: str) -> ir.Value | None:
        sums = []
        for k, r in enumerate(rels):
            if r is None:
                continue
            value = r.as_relevance(self.em, tag=f"{tag}_r{k}") if hasattr(r, "as_relevance") else r
            sums.append(self.em.op("ReduceSum", value, keepdims=0, tag=f"{tag}_sum{k}"))
        if not sums:
            return None
        return self.em.op("Reshape", self.em.sum(sums, tag=f"{tag}_total"), self.em.ints([1]), tag=tag)

    def enter(self, node: ir.Node, assignment, r_outs) -> None:
        """The relevance arriving at ``node``'s outputs (Rel or relevance values; None where none arrives)."""
        with self.em.scope(f"ledger/{node.name}"):
            total = self._total(r_outs, "entering")
        rule = assignment.rule.name if assignment.rule is not None else "-"
        has_bias = _absorbs_bias(node, assignment.op)
        self.rows.append(LedgerRow(node.name, node.op_type, assignment.kind, rule,
                                   _sinks(node, assignment.kind, has_bias)))
        self._entering.append(total)
        self._leaving.append(None)

    def leave(self, node: ir.Node, r_ins) -> None:
        """The relevance ``node`` hands to its carried inputs (the last row entered)."""
        with self.em.scope(f"ledger/{node.name}"):
            self._leaving[-1] = self._total(r_ins, "leaving")

    def finish(self) -> list[ir.Value]:
        """The two ledger outputs (empty when no node was entered)."""
        if not self._entering:
            return []
        em = self.em
        with em.scope("ledger"):
            zero = em.const(np.zeros(1, dtype=em.np_dtype), tag="zero")
            entering = em.op("Concat", *[v if v is not None else zero for v in self._entering], axis=0,
                             tag="entering")
            leaving = em.op("Concat", *[v if v is not None else zero for v in self._leaving], axis=0, tag="leaving")
        outs = []
        for v, name in ((entering, ENTERING_OUTPUT), (leaving, LEAVING_OUTPUT)):
            v.name = name
            v.type = ir.TensorType(em.dtype)
            v.shape = ir.Shape([len(self._entering)])
            outs.append(v)
        return outs


class NoLedger:
    """The ledger when none is asked for: books nothing, emits nothing."""

    active = False

    def enter(self, node: ir.Node, assignment, r_outs) -> None:
        pass

    def leave(self, node: ir.Node, r_ins) -> None:
        pass

    def finish(self) -> list[ir.Value]:
        return []


NO_LEDGER = NoLedger()


__all__ = ["ENTERING_OUTPUT", "LEAVING_OUTPUT", "Ledger", "LedgerRow", "NoLedger", "NO_LEDGER"]
