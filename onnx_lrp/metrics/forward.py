"""The model's own forward pass for the perturbation metrics: the ORIGINAL model (not the relevance model) in one
onnxruntime session, returning the explained tensor (the logits behind a softmax output) as softmax
probabilities or as they are."""
from __future__ import annotations

import numpy as np

from .. import load
from ..core.errors import InputError, NumericError
from ..run import runtime


def softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class Forward:
    """``Forward(model, tensor, input_name, batch_dim)(x) -> [N, classes]``: one onnxruntime run per call (split
    into chunks of ``batch_size`` items; one item at a time for a model exported with batch size 1)."""

    def __init__(self, model, tensor: str, input_name: str, batch_dim, prob: str = "softmax", device: str = "cpu",
                 batch_size: int = 256):
        if prob not in ("softmax", "logit"):
            raise InputError(f"prob must be 'softmax' or 'logit', not {prob!r}")
        ir_model = load.to_ir(load.read_proto(model), load.data_folder(model))
        graph = ir_model.graph
        value = next((o for n in graph for o in n.outputs if o.name == tensor), None)
        value = value or next((v for v in graph.inputs if v.name == tensor), None)
        if value is None:
            raise InputError(f"the explained tensor {tensor!r} is not in the original model; metrics need the model's "
                             "own output (explain an output of the model with --output)")
        graph.outputs.clear()
        graph.outputs.append(value)
        parts = load.serialize_parts(ir_model)  # a large model: its weights stay in their files
        # the deployed arithmetic (onnxruntime's defaults: its int8 kernels for a quantized model), as in production
        self.session = runtime.Session(parts.model_bytes, device, deployed=True,
                                       external=runtime.ExternalData(parts.folder, parts.arrays, parts.prepack))
        self.input_name = input_name
        self.tensor = tensor
        self.prob = prob
        self.chunk = batch_dim if isinstance(batch_dim, int) and batch_dim > 0 else batch_size
        self.fixed = isinstance(batch_dim, int) and batch_dim > 0
        self.calls = 0  # onnxruntime runs, for the tests' "one run per step" check

    def __call__(self, x: np.ndarray) -> np.ndarray:
        parts = []
        for i in range(0, len(x), self.chunk):
            part = x[i:i + self.chunk]
            if self.fixed and len(part) != self.chunk:
                raise InputError(f"the model takes exactly {self.chunk} item(s) per run; give a batch that is a "
                                 f"multiple of {self.chunk}")
            self.calls += 1
            y = self.session.run({self.input_name: np.ascontiguousarray(part)}, [self.tensor])[self.tensor]
            parts.append(np.asarray(y))
        y = np.concatenate(parts, axis=0)
        if not np.all(np.isfinite(y)):
            bad = int((~np.isfinite(y)).any(axis=tuple(range(1, y.ndim))).sum())
            raise NumericError(f"the model's output {self.tensor!r} is NaN or Inf for {bad} perturbed input(s); the "
                               "metric cannot score them (try another --baseline)")
        if y.ndim != 2:
            raise InputError(f"the explained output {self.tensor!r} has shape {'x'.join(map(str, y.shape))}; the "
                             "faithfulness metrics need N x classes scores")
        return softmax(y) if self.prob == "softmax" else y.astype(np.float64)
