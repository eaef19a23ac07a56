"""A Runner carried to another process (a Ray actor, a worker of the dataset engines): built from
:meth:`onnx_lrp.run.runner.Runner.payload` (plain data: numpy, onnxruntime and the runner are all it imports), and, when
an item's relevance is not conserved, able to name the nodes that absorb or create it like an Explainer does: it
rebuilds the relevance model with the conservation ledger from the model the payload names (``ledger_source``:
the file path or the model's bytes, the composite, the options). Only then are onnx_ir, the loader and the
rewriter imported; the ledger model is kept for later items."""
from __future__ import annotations

from .runner import Runner


class CarriedRunner(Runner):
    def _culprits(self, feeds, item: int, target: int, start, positions):
        if self.ledger_source is None:  # built from an in-memory graph: nothing to rebuild the ledger from
            return None
        from ..explainer import ledger_book, ledger_culprits  # the loader and the rewriter: only on a trip

        return ledger_culprits(self, ledger_book(self, start), feeds, item, target, start, positions)


__all__ = ["CarriedRunner"]
