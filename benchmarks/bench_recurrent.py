"""Speed of ``Explainer.explain`` on torch LSTM / GRU / RNN exports, as ratios measured in one run on this machine.

For each cell type and sequence length it prints the plain onnxruntime forward of the original model, the
explain run (forward + relevance: two Scans per layer and direction), and explain/forward. The relevance
recurrence runs step by step in a Scan, while onnxruntime's LSTM kernel is one fused op: expect explain/forward
to grow with the hidden size's share of the work less than with the number of steps.

    python benchmarks/bench_recurrent.py [--steps 50,200] [--batch 16] [--hidden 128] [--threads 2]

torch is needed to build the models (random weights).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from timing import best as timed


def export(cell: str, hidden: int, path: str) -> None:
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(torch.nn, cell)(64, hidden, num_layers=2, bidirectional=True, batch_first=True)
            self.head = torch.nn.Linear(2 * hidden, 10)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    torch.manual_seed(0)
    torch.onnx.export(Net().eval(), torch.zeros(2, 10, 64), path, input_names=["x"], output_names=["logits"],
                      opset_version=17, dynamo=False, dynamic_axes={"x": {0: "batch", 1: "time"}})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="50,200")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    import onnxruntime as ort

    import onnx_lrp
    print(f"{'model':<6} {'steps':>5} {'forward ms':>11} {'explain ms':>11} {'explain/forward':>16}")
    with tempfile.TemporaryDirectory() as tmp:
        for cell in ("LSTM", "GRU", "RNN"):
            path = os.path.join(tmp, f"{cell}.onnx")
            export(cell, args.hidden, path)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = args.threads
            sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            ex = onnx_lrp.Explainer(path, composite="epsilon", threads=args.threads)
            for steps in (int(s) for s in args.steps.split(",")):
                x = np.random.default_rng(0).normal(size=(args.batch, steps, 64)).astype(np.float32)
                fwd = timed(lambda: sess.run(None, {"x": x}), args.repeat)
                exp = timed(lambda: ex.explain(x), args.repeat)
                print(f"{cell:<6} {steps:>5} {fwd * 1e3:>11.1f} {exp * 1e3:>11.1f} {exp / fwd:>16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
