"""snapshot / check with a method over a composite (``--method smoothgrad --base epsilon-gamma-box --low --high``):
the composite's rule parameters reach the snapshot as they reach ``explain --method`` (the same attributions), are
stored, and ``check`` recomputes them; a rule parameter for a method not over a composite is refused in one line."""
from __future__ import annotations

import numpy as np

from util import GOLDENS, cli

MODEL = GOLDENS / "methods" / "plain_cnn.onnx"
BASE = ["--method", "smoothgrad", "--base", "epsilon-gamma-box", "--low", "-3", "--high", "3", "--nt-samples", "3",
        "--stdevs", "0.2", "--seed", "1"]


def test_snapshot_of_a_method_over_a_composite_takes_its_bounds(tmp_path):
    x = np.random.default_rng(0).normal(size=(2,) + tuple(np.load(GOLDENS / "methods" / "ig_composite.npz")["x"]
                                                           .shape[1:])).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = cli("explain", MODEL, tmp_path / "x.npy", *BASE, "-o", tmp_path / "r.npy")
    assert r.exit_code == 0, r.output
    r = cli("snapshot", MODEL, tmp_path / "x.npy", *BASE, "-o", tmp_path / "s.npz")
    assert r.exit_code == 0, r.output
    with np.load(tmp_path / "s.npz") as z:
        rel = [z[k] for k in z.files if k.startswith("relevance")]
    assert len(rel) == 1 and np.array_equal(rel[0], np.load(tmp_path / "r.npy"))
    r = cli("check", MODEL, tmp_path / "s.npz")
    assert r.exit_code == 0, r.output
    r = cli("snapshot", MODEL, tmp_path / "x.npy", "--method", "gradient", "--epsilon", "0.1", "-o",
            tmp_path / "g.npz")
    assert r.exit_code == 2 and "over a composite" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "g.npz").exists()
