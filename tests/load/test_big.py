"""Models of any size: weights in external data files (one or several) stay there, memory-mapped; nothing serialises
the whole model into one protobuf (2 GiB limit).

The > 2 GiB model (one 2.15 GB weight, two data files, written directly in seconds by tests/bigmodels.py) is
explained through the API, rewritten by the CLI (``MODEL.lrp.onnx`` + its data file, run in plain onnxruntime) and
snapshot / checked, each against the numpy LRP-epsilon oracle of the same memory-mapped weights. The small models
check the same paths cheaply (several data files, truncated or missing data named in one line) and the peak memory
of build + explain in a fresh process.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import onnx_lrp
from onnx_lrp.cli.main import main as cli
from onnx_lrp.core.errors import ModelError

import bigmodels  # noqa: E402
from util import rel_l2

BIG_WIDTHS = (128, 23200, 23200, 16)  # w1: 23200 x 23200 float32 = 2.153 GB > 2 GiB, 2.17 GB in all


def oracle32(path, x, target):
    """LRP-epsilon in float32 on the memory-mapped weights."""
    return bigmodels.epsilon_oracle(bigmodels.weights(path), x, target, dtype=np.float32)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    folder = tmp_path_factory.mktemp("big")
    path = bigmodels.write_mlp(folder, BIG_WIDTHS, files=2, sparse=True)  # w1: random first 64 MB, then a hole
    assert bigmodels.weights(path)[1][0].nbytes > 2 ** 31
    x = np.random.default_rng(3).standard_normal((2, BIG_WIDTHS[0])).astype(np.float32)
    return path, x


def test_big_model_explained_rewritten_and_checked(big, tmp_path):
    path, x = big
    ref = oracle32(path, x, target=5)
    ex = onnx_lrp.Explainer(str(path), composite="epsilon")
    rm = ex.relevance_model
    assert rm.model_folder == str(path.parent) and len(rm.model_bytes) < 1 << 20  # the weights stayed in their files
    rel = ex.explain(x, target=5).relevance
    assert rel_l2(rel, ref) < 1e-3  # float32 sums of 23200 terms, in another order
    del ex

    out = tmp_path / "big.lrp.onnx"
    res = CliRunner().invoke(cli, ["rewrite", str(path), "-o", str(out), "-c", "epsilon"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "big.lrp.onnx.data").stat().st_size > 2 ** 31
    sess = ort.InferenceSession(str(out))  # plain onnxruntime reads MODEL.lrp.onnx + its data file
    got = sess.run(["lrp/relevance/x"], {"x": x, "lrp/target": np.array([5, 5]), "lrp/one_hot": np.array(False)})
    del sess
    assert rel_l2(got[0], ref) < 1e-3

    np.save(tmp_path / "x.npy", x)
    base = tmp_path / "base.npz"
    res = CliRunner().invoke(cli, ["snapshot", str(path), str(tmp_path / "x.npy"), "-o", str(base), "-c", "epsilon",
                                   "--target", "5"])
    assert res.exit_code == 0, res.output
    assert rel_l2(np.load(base)["relevance/x"], ref) < 1e-3
    res = CliRunner().invoke(cli, ["check", str(path), str(base)])
    assert res.exit_code == 0, res.output


def test_several_data_files_and_inspect(tmp_path):
    path = bigmodels.write_mlp(tmp_path, (32, 256, 256, 10), files=2)  # 0.3 MB of weights: the graph is ~8 kB
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    ex = onnx_lrp.Explainer(str(path), composite="epsilon")
    ref = bigmodels.epsilon_oracle(bigmodels.weights(path), x, 4)
    assert rel_l2(ex.explain(x, target=4).relevance, ref) < 1e-5
    res = CliRunner().invoke(cli, ["inspect", str(path), "-c", "epsilon"])
    assert res.exit_code == 0, res.output
    assert "mm1" in res.output
    # what a Ray actor receives: the graph and the data files' folder, not the weights
    import pickle
    from onnx_lrp.run.runner import Runner
    payload = ex.payload()
    assert len(pickle.dumps(payload)) < sum(f.stat().st_size for f in tmp_path.glob("*.data")) / 4
    np.testing.assert_array_equal(Runner.from_payload(pickle.loads(pickle.dumps(payload))).explain(x, 4).relevance,
                                  ex.explain(x, 4).relevance)
    res = CliRunner().invoke(cli, ["trace", str(path), str(_npy(tmp_path, x)), "-c", "epsilon", "--target", "4"])
    assert res.exit_code == 0, res.output


def _npy(folder, x):
    np.save(folder / "x.npy", x)
    return folder / "x.npy"


@pytest.mark.parametrize("damage", ["missing", "truncated", "outside"])
def test_bad_external_data_named_in_one_line(tmp_path, damage):
    path = bigmodels.write_mlp(tmp_path, (32, 64, 10), files=2)
    import onnx
    if damage == "missing":
        (tmp_path / "mlp.w0.data").unlink()
    elif damage == "truncated":
        with open(tmp_path / "mlp.data", "r+b") as f:
            f.truncate(100)
    else:
        m = onnx.load(str(path), load_external_data=False)
        for e in m.graph.initializer[0].external_data:
            if e.key == "location":
                e.value = "../elsewhere.data"
        path.write_bytes(m.SerializeToString())
    with pytest.raises(ModelError) as info:
        onnx_lrp.Explainer(str(path), composite="epsilon")
    msg = str(info.value)
    assert "\n" not in msg and ("w0" in msg or "b0" in msg or "w1" in msg)
    assert {"missing": "missing", "truncated": "truncated", "outside": "outside"}[damage] in msg


_PEAK = r'''
import json, resource, sys, numpy as np, onnx_lrp
ex = onnx_lrp.Explainer(sys.argv[1], composite="epsilon")
x = np.ones((1, int(sys.argv[2])), np.float32)
ex.explain(x.astype(ex.inputs[0].dtype), target=0)
print(json.dumps({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
'''
_BASE = r'''
import json, resource, numpy as np, onnxruntime, onnx_lrp, onnx_lrp.explainer, onnx_lrp.load, onnx_lrp.lrp.rewriter
print(json.dumps({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
'''


@pytest.fixture(scope="module")
def base_rss() -> int:
    """Peak RSS of an interpreter that imported onnx-lrp (and onnxruntime) and did nothing else."""
    return _peak(_BASE)


def _peak(code, *args) -> int:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["peak"]


def test_build_and_explain_peak_within_twice_the_weights(tmp_path, base_rss):
    """A 1.16 GB model (over 1 GiB: no weight pre-packing; its large weight random in its first 64 MB, a file hole
    after it): peak RSS of build + explain, less the interpreter with onnx-lrp imported, <= 2x the weights' bytes
    (the weights are memory-mapped; onnxruntime reads them from their file)."""
    widths = (64, 17000, 17000, 8)
    path = bigmodels.write_mlp(tmp_path, widths, sparse=True)
    weights = sum(w.nbytes + b.nbytes for w, b in bigmodels.weights(path, as_float32=False))
    used = _peak(_PEAK, path, widths[0]) - base_rss
    assert used <= 2 * weights, f"peak {used / 1e6:.0f} MB for {weights / 1e6:.0f} MB of weights"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_build_and_explain_peak_within_twice_its_weights(tmp_path, base_rss, dtype):
    """A 274 MB float16 / bfloat16 MLP of ten 3700 x 3700 layers (over DEPLOYED_FLOAT16_MAX: no deployed session
    beside on the CPU): its weights stay in their type and onnxruntime converts one weight to float32 where it is
    used (lower_upcasts' tied Casts), so build + explain peaks within 2x the weights' own bytes (measured ~1.3x /
    0.9x; before: 6.7x / 4.4x, a float32 copy of every weight in the relevance session and in the deployed one)."""
    widths = (64,) + (3700,) * 11 + (8,)
    path = bigmodels.write_mlp(tmp_path, widths, dtype=dtype, bias_scale=0.0)  # conserved: no ledger rebuild
    low = sum(w.nbytes + b.nbytes for w, b in bigmodels.weights(path, as_float32=False))
    used = _peak(_PEAK, path, widths[0]) - base_rss
    assert used <= 2 * low, f"peak {used / 1e6:.0f} MB for {low / 1e6:.0f} MB of {dtype} weights"


@pytest.mark.slow  # ~25 s and ~4 GB: one float16 weight of 1.15 GB
def test_float16_one_huge_weight_peak(tmp_path, base_rss):
    """A model whose weight is one 24000 x 24000 float16 matrix: it is converted to float32 once where it is used,
    so the peak is the float16 bytes plus that weight in float32 (~3x; within 2x the weights' float32 size)."""
    widths = (64, 24000, 24000, 8)
    path = bigmodels.write_mlp(tmp_path, widths, dtype="float16", sparse=True)
    f16 = sum(w.nbytes + b.nbytes for w, b in bigmodels.weights(path, as_float32=False))
    used = _peak(_PEAK, path, widths[0]) - base_rss
    assert used <= 2 * (2 * f16), f"peak {used / 1e6:.0f} MB for {f16 / 1e6:.0f} MB of float16 weights"


def test_low_precision_weights_cast_where_used(tmp_path, monkeypatch):
    """In a model with TIED_MODEL_MIN bytes of float16 weights (here lowered to 0), each use of a weight of
    TIED_MIN bytes or more reads it through its own Cast that depends on the node's computed input (onnxruntime can
    neither fold it into a float32 initializer nor run it before that input exists); smaller weights share one
    Cast."""
    from onnx_lrp.load import external
    from onnx_lrp.load.external import TIED_MIN

    monkeypatch.setattr(external, "TIED_MODEL_MIN", 0)

    path = bigmodels.write_mlp(tmp_path, (64, 512, 512, 10), dtype="float16")
    import onnx
    proto = onnx.load_model_from_string(onnx_lrp.Explainer(str(path), composite="epsilon").relevance_model.model_bytes)
    producer = {o: n for n in proto.graph.node for o in n.output}
    inputs = {i.name for i in proto.graph.input}
    sizes = {t.name: 2 * int(np.prod(t.dims)) for t in proto.graph.initializer if t.data_type == ONNX_F16}

    def computed(name):  # whether a value depends on a graph input
        n = producer.get(name)
        return name in inputs or (n is not None and any(computed(x) for x in n.input if x))

    for w, nbytes in sizes.items():
        casts = [n for n in proto.graph.node if n.op_type == "Cast" and _reads(n, w, producer)]
        if nbytes >= TIED_MIN:
            assert len(casts) == 2 and all(computed(c.input[0]) for c in casts), w  # forward and relevance use
        else:
            assert len(casts) == 1 and not computed(casts[0].input[0]), w


ONNX_F16 = 10


def _reads(cast, weight, producer) -> bool:
    """Whether ``cast`` reads ``weight`` directly or through a Reshape."""
    x = cast.input[0]
    if x == weight:
        return True
    n = producer.get(x)
    return n is not None and n.op_type == "Reshape" and n.input[0] == weight


@pytest.mark.parametrize("tied", [True, False], ids=["cast-where-used", "one-cast"])
@pytest.mark.parametrize("dtype,tol", [("bfloat16", 1e-2), ("float16", 1e-3)])
def test_low_precision_relevance_near_its_float32_twin(tmp_path, monkeypatch, dtype, tol, tied):
    """The same random weights written in float32 and in ``dtype``: relevance within ``tol`` rel-L2 of the
    float32 model's, the 10 most relevant input features the same, and equal (float32 rounding) to the numpy
    oracle on the rounded weights; the relevance model keeps the weights in ``dtype`` (read through Casts where
    used, as in models over TIED_MODEL_MIN, or through one Cast each)."""
    from onnx_lrp.load import external

    monkeypatch.setattr(external, "TIED_MODEL_MIN", 0 if tied else 1 << 62)
    widths = (64, 512, 512, 10)  # 512 x 512: over TIED_MIN, cast where used
    low = bigmodels.write_mlp(tmp_path / dtype, widths, dtype=dtype)
    f32 = bigmodels.write_mlp(tmp_path / "float32", widths, dtype="float32")
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    ex = onnx_lrp.Explainer(str(low), composite="epsilon")
    import onnx
    graph = onnx.load_model_from_string(ex.relevance_model.model_bytes).graph
    kept = {t.data_type for t in graph.initializer if len(t.dims) == 2}
    assert kept == {bigmodels.ONNX_TYPE[dtype]}
    r_low = ex.explain(x, target=2).relevance
    r_32 = onnx_lrp.Explainer(str(f32), composite="epsilon").explain(x, target=2).relevance
    assert rel_l2(r_low, bigmodels.epsilon_oracle(bigmodels.weights(low), x, 2)) < 1e-5
    assert rel_l2(r_low, r_32) < tol
    for a, b in zip(r_low, r_32):
        assert set(np.argsort(-a)[:10]) == set(np.argsort(-b)[:10])


def test_deployed_float16_not_run_beside_above_its_bound(tmp_path, monkeypatch):
    """On the CPU the deployed float16 model would hold a float32 copy of every weight (onnxruntime folds its
    inserted Casts): above DEPLOYED_FLOAT16_MAX bytes of float16 weights it is not run beside, one warning says so
    with the size, and the outputs are the explained forward's; below it, it runs (outputs are its own)."""
    import warnings

    from onnx_lrp.building import stages

    path = bigmodels.write_mlp(tmp_path, (16, 64, 4), dtype="float16")
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    assert onnx_lrp.Explainer(str(path), composite="epsilon").deployed is not None
    monkeypatch.setattr(stages, "DEPLOYED_FLOAT16_MAX", 0)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ex = onnx_lrp.Explainer(str(path), composite="epsilon")
    lines = [str(w.message) for w in said if "not run beside" in str(w.message)]
    assert len(lines) == 1 and "float32 copy" in lines[0] and "\n" not in lines[0]
    assert ex.deployed is None and ex.deployed_session is None
    res = ex.explain(x, target=1)
    np.testing.assert_array_equal(res.outputs["y"], res.forward["y"])
