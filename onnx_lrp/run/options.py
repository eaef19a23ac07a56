"""How a relevance model runs: :class:`RunOptions`, the settings of its sessions and of each run (not of the
graph: the same relevance model runs with any of them), checked once when made. Plain data, imported by the runner,
its checks and every other session of the relevance model (the diagnostic one, the concept models)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core.errors import InputError


@dataclass(frozen=True)
class RunOptions:
    """How a :class:`onnx_lrp.run.runner.Runner` runs a relevance model: settings of the session and of each run, not of the graph (the
    same relevance model runs with any of them; a Ray actor takes the builder's or its own)."""

    device: str = "cpu"  # "cpu", "cuda" or "auto" (CUDA when it starts, else the CPU)
    threads: int | None = None  # onnxruntime's intra-op threads (None: ONNX_LRP_THREADS, else onnxruntime's default)
    start: str = "logit"  # the default start relevance: the explained logit, or 1 ("one-hot")
    strict: bool = False  # relevance far from conserved (onnx_lrp.run.conservation): an error, not a warning
    precise: bool = False  # onnxruntime without layout optimisations (runtime.Session)
    tf32: bool = False  # CUDA only: TF32 convolutions and matrix products (faster, relevance drifts; docs/gpu.md)
    #: where and how fast it runs, not what it computes: not recorded in a dataset's manifest (a rerun on another
    #: device or with other threads resumes it)
    UNRECORDED: ClassVar[tuple] = ("device", "threads", "tf32")

    def __post_init__(self):
        """Each value checked once, refused in one line; ``strict`` and ``precise`` as bools."""
        if self.device is not None and not isinstance(self.device, str):
            raise InputError(f"device must be 'cpu', 'cuda' or 'auto', not {self.device!r}")
        if self.start not in ("logit", "one-hot"):
            raise InputError(f"start must be 'logit' or 'one-hot', not {self.start!r}")
        if not isinstance(self.tf32, bool):
            raise InputError(f"tf32 must be True or False, not {self.tf32!r}")
        threads = self.threads
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
            raise InputError(f"threads must be a non-negative int (0: onnxruntime's default), not {threads!r}")
        object.__setattr__(self, "strict", bool(self.strict))
        object.__setattr__(self, "precise", bool(self.precise))

    def session_settings(self) -> dict:
        """What every onnxruntime session of the relevance model takes besides its device and threads (the
        relevance model's, the deployed model's, the diagnostic one, the concept models'): a new session setting is
        a field above, one entry here and its keyword of :class:`onnx_lrp.run.runtime.Session`."""
        return dict(tf32=self.tf32)


__all__ = ["RunOptions"]
