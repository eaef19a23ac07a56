"""Explaining a whole dataset (onnx_lrp.dataset, onnx_lrp.dataset.ray, `onnx-lrp explain --out-dir`).

Every item's relevance is checked against an independent single-process ``Explainer.explain`` of that item alone;
resuming is checked by SIGKILLing a real run half way; the Ray tests start a local cluster (skipped without Ray).
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

import onnx_lrp
from onnx_lrp.io.inputs import Preprocess, image_layout, input_infos, load_image
from onnx_lrp.cli.main import main
from onnx_lrp.dataset import MANIFEST, SHARD_DIR, explain_dataset, read_shards
from util import ROOT, assert_close

DIGITS = ROOT / "models" / "digits_cnn.onnx"
CLI = Path(sys.executable).parent / "onnx-lrp"
TOL = 1e-6


@pytest.fixture(scope="module")
def ex():
    return onnx_lrp.Explainer(DIGITS)


@pytest.fixture(scope="module")
def digits():
    with np.load(ROOT / "models" / "digits_heldout.npz") as z:
        return z["images"].astype(np.float32) / 255.0


def single(ex, x, target=None):
    """The reference: each item explained alone, in this process."""
    rel, tgt = [], []
    for i in range(len(x)):
        e = ex.explain(x[i:i + 1], target=None if target is None else int(np.broadcast_to(target, len(x))[i]))
        rel.append(e.relevance[0])
        tgt.append(int(e.target[0]))
    return np.stack(rel), np.array(tgt)


def assert_same(out_dir, ids, rel, tgt):
    got = read_shards(out_dir)
    assert list(got["items"]) == list(ids)  # every item exactly once, in source order
    np.testing.assert_allclose(got["relevance"], rel, rtol=0, atol=TOL)
    np.testing.assert_array_equal(got["targets"], tgt)


def image_dir(root: Path, digits, n: int) -> Path:
    """n PNGs in nested directories (8-bit, so the decoded pixels are exact)."""
    for i in range(n):
        sub = root / f"class{i % 3}" / ("deep" if i % 2 else "")
        sub.mkdir(parents=True, exist_ok=True)
        Image.fromarray((digits[i, 0] * 255).round().astype(np.uint8)).save(sub / f"img{i:03d}.png")
    return root


# ---------------------------------------------------------------------------------------------- same numbers
@pytest.mark.parametrize("shard_size,batch_size,workers", [(1, 1, 1), (7, 5, 2), (64, 32, 3)])
def test_array_source_equals_single_explain(tmp_path, ex, digits, shard_size, batch_size, workers):
    x = digits[:40]
    np.save(tmp_path / "x.npy", x)
    s = explain_dataset(DIGITS, tmp_path / "x.npy", tmp_path / "out", shard_size=shard_size, batch_size=batch_size,
                        workers=workers)
    assert (s["items"], s["explained"], s["failed"]) == (40, 40, 0)
    assert s["shards"] == -(-40 // shard_size)
    rel, tgt = single(ex, x)
    assert_same(tmp_path / "out", [f"x.npy[{i}]" for i in range(40)], rel, tgt)
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    import hashlib
    for rec in manifest["shards"]:  # the listed checksums are those of the files
        assert hashlib.sha256((tmp_path / "out" / rec["file"]).read_bytes()).hexdigest() == rec["sha256"]
    assert manifest["model_sha256"] == hashlib.sha256(DIGITS.read_bytes()).hexdigest()
    assert [r["items"] for r in manifest["shards"]] == [[lo, min(40, lo + shard_size)]
                                                      for lo in range(0, 40, shard_size)]


def test_image_directory_recursive_with_a_corrupt_image(tmp_path, ex, digits):
    src = image_dir(tmp_path / "imgs", digits, 9)
    (src / "class1" / "broken.png").write_bytes(b"not a png at all")
    r = CliRunner().invoke(main, ["explain", str(DIGITS), str(src), "--out-dir", str(tmp_path / "out"),
                                  "--shard-size", "4", "--batch-size", "3", "--json", "-t", "3"])
    assert r.exit_code == 1, r.output
    summary = json.loads(r.stdout)
    assert (summary["items"], summary["explained"], summary["failed"]) == (10, 9, 1)
    errors = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [e["item"] for e in errors] == ["class1/broken.png"] and "not a readable image" in errors[0]["error"]
    files = sorted((p for p in src.rglob("*.png") if p.name != "broken.png"),
                   key=lambda p: p.relative_to(src).as_posix())
    layout = image_layout(input_infos(ex.inputs)[0])
    x = np.stack([load_image(f, layout, Preprocess())[0] for f in files])
    rel, tgt = single(ex, x, target=3)
    assert_same(tmp_path / "out", [f.relative_to(src).as_posix() for f in files], rel, tgt)


def test_shard_with_decoding_threads_equals_sequential(tmp_path, ex, digits):
    """explain_shard(readers=3) (a Ray actor beside a GPU decodes in threads) = readers=1 = each item alone."""
    from onnx_lrp.dataset import explain_shard, open_source
    from onnx_lrp.dataset.shards import ShardJob, Span
    src = image_dir(tmp_path / "imgs", digits, 11)
    (src / "class0" / "zz.png").write_bytes(b"broken")
    source = open_source(src, input_infos(ex.inputs))
    a = explain_shard(ex, Span(source, 0, 0, len(source)), ShardJob(2, readers=3))
    b = explain_shard(ex, Span(source, 0, 0, len(source)), ShardJob(2, readers=1))
    assert a.items == b.items and len(a.items) == 11 and a.failed == b.failed and len(a.failed) == 1
    # the threads read in chunks of the raw items, so the broken image leaves a batch of one there; onnxruntime's
    # kernels are not bitwise batch-size invariant (float32 rounding), so: equal to rounding, not bit for bit
    assert_close(a.arrays["relevance"], b.arrays["relevance"], rtol=1e-6, atol=1e-9)
    x = np.stack([load_image(src / i, image_layout(input_infos(ex.inputs)[0]), Preprocess())[0] for i in a.items])
    rel, tgt = single(ex, x)
    np.testing.assert_allclose(a.arrays["relevance"], rel, rtol=0, atol=TOL)
    np.testing.assert_array_equal(a.arrays["targets"], tgt)


def test_images_and_arrays_in_one_directory_and_a_size_that_does_not_fit(tmp_path, ex, digits):
    """Images are decoded per file and normalised per shard: mixed with .npy items they keep the source order and
    equal load_image + a single explain; a --size the model cannot take fails every image under its own id, and
    the .npy items of the same shards are still explained."""
    src = tmp_path / "mixed"
    src.mkdir()
    pixels = (digits[:6, 0] * 255).round().astype(np.uint8)
    for i in range(6):
        if i % 2:
            np.save(src / f"i{i}.npy", pixels[i][None].astype(np.float32) / 255)
        else:
            Image.fromarray(pixels[i]).save(src / f"i{i}.png")
    ids = [f"i{i}.{'npy' if i % 2 else 'png'}" for i in range(6)]
    s = explain_dataset(DIGITS, src, tmp_path / "out", shard_size=4, batch_size=3, workers=2)
    assert (s["explained"], s["failed"]) == (6, 0) and s["first_shard_s"] <= s["seconds"]
    layout = image_layout(input_infos(ex.inputs)[0])
    x = np.stack([load_image(src / i, layout, Preprocess())[0] if i.endswith(".png") else np.load(src / i)
                  for i in ids])
    rel, tgt = single(ex, x)
    assert_same(tmp_path / "out", ids, rel, tgt)
    s = explain_dataset(DIGITS, src, tmp_path / "small", shard_size=4, batch_size=3, size=(8, 8))
    errors = [json.loads(line) for line in (tmp_path / "small" / "errors.jsonl").read_text().splitlines()]
    assert [e["item"] for e in errors] == ids[0::2] and s["explained"] == 3
    assert all(f"item {e['item']} " in e["error"] and "1x8x8" in e["error"] for e in errors)
    assert_same(tmp_path / "small", ids[1::2], rel[1::2], tgt[1::2])


def test_glob_and_npz_and_target_list(tmp_path, ex, digits):
    x = digits[:12]
    for i in range(6):
        np.save(tmp_path / f"a{i}.npy", x[i])  # without batch axis
        np.save(tmp_path / f"b{i}.npy", x[6 + i:7 + i])  # with a batch axis of 1
    targets = np.arange(12) % 10
    s = explain_dataset(DIGITS, str(tmp_path / "*.npy"), tmp_path / "out", shard_size=5, target=targets)
    ids = [f"a{i}.npy" for i in range(6)] + [f"b{i}.npy" for i in range(6)]
    assert s["explained"] == 12
    rel, tgt = single(ex, x, target=targets)
    assert_same(tmp_path / "out", ids, rel, tgt)
    np.savez(tmp_path / "x.npz", image=x)
    explain_dataset(DIGITS, tmp_path / "x.npz", tmp_path / "out2", shard_size=5, target=targets)
    assert_same(tmp_path / "out2", [f"x.npz[{i}]" for i in range(12)], rel, tgt)


def test_parquet_arrays_and_image_bytes(tmp_path, ex, digits):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import io as _io
    x = digits[:10]
    pngs = []
    for i in range(10):
        buf = _io.BytesIO()
        Image.fromarray((x[i, 0] * 255).round().astype(np.uint8)).save(buf, format="PNG")
        pngs.append(buf.getvalue())
    pngs[4] = b"broken"
    table = pa.table({"id": [f"row{i}" for i in range(10)], "pixels": [a.ravel().tolist() for a in x],
                      "png": pngs})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=3)
    explain_dataset(DIGITS, tmp_path / "d.parquet", tmp_path / "arr", shard_size=4, column="pixels")
    rel, tgt = single(ex, x)
    assert_same(tmp_path / "arr", [f"row{i}" for i in range(10)], rel, tgt)
    s = explain_dataset(DIGITS, tmp_path / "d.parquet", tmp_path / "img", shard_size=4, column="png")
    assert s["failed"] == 1
    keep = [i for i in range(10) if i != 4]
    xr = (np.round(x * 255) / 255).astype(np.float32)
    rel, tgt = single(ex, xr[keep])
    assert_same(tmp_path / "img", [f"row{i}" for i in keep], rel, tgt)
    with pytest.raises(onnx_lrp.InputError, match="--column"):
        explain_dataset(DIGITS, tmp_path / "d.parquet", tmp_path / "x")


# ---------------------------------------------------------------------------------------------- never silently wrong
def _overflow_model(path: Path) -> Path:
    """y = x @ W with W[0, 0] = 1e38: an input of 10 in x[0] overflows z to inf; small inputs are fine."""
    w = np.array([[1e38, 0.0], [0.0, 1.0]], np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                              [numpy_helper.from_array(w, "W")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


def test_non_finite_relevance_and_nan_inputs_are_errors_not_results(tmp_path):
    model = _overflow_model(tmp_path / "m.onnx")
    x = np.array([[1e-3, 1.0], [10.0, 1.0], [np.nan, 1.0], [2e-3, 3.0]], np.float32)
    np.save(tmp_path / "x.npy", x)
    s = explain_dataset(model, tmp_path / "x.npy", tmp_path / "out", batch_size=4, composite="epsilon")
    errors = {e["item"]: e["error"] for e in map(json.loads, (tmp_path / "out" / "errors.jsonl").read_text()
                                                 .splitlines())}
    assert set(errors) == {"x.npy[1]", "x.npy[2]"} and s["failed"] == 2
    assert "non-finite" in errors["x.npy[1]"] and "NaN" in errors["x.npy[2]"]
    got = read_shards(tmp_path / "out")
    assert list(got["items"]) == ["x.npy[0]", "x.npy[3]"] and np.all(np.isfinite(got["relevance"]))
    ref = onnx_lrp.Explainer(model, composite="epsilon")
    for row, i in zip(got["relevance"], (0, 3)):  # the good items of the failing batch, explained one by one
        np.testing.assert_allclose(row, ref.explain(x[i:i + 1]).relevance[0], rtol=1e-6, atol=0)


_ACTOR = """
import pickle, sys
import numpy as np
import onnx_lrp.ray, onnx_lrp.dataset.ray  # what a Ray actor of the dataset engine imports
from onnx_lrp.run.runner import Runner
payload, x = pickle.loads(sys.stdin.buffer.read())
run = Runner.from_payload(payload, threads=1)
e = run.explain(x)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("onnx", "onnx_ir", "sympy", "onnxscript")
               or m in ("onnx_lrp.explainer", "onnx_lrp.load", "onnx_lrp.lrp.rewriter", "onnx_lrp.lrp.ops"))
sys.stdout.buffer.write(pickle.dumps((heavy, e.relevance, e.target)))
"""


def test_an_actor_runs_the_payload_without_onnx_ir_or_onnx(ex, digits):
    """A Ray actor's imports: the runner and the plain-data payload in a fresh process give Explainer.explain's
    numbers without importing onnx_ir, onnx, sympy, the loader or the rewriter."""
    import pickle

    x = digits[:5]
    payload = ex.payload()
    proc = subprocess.run([sys.executable, "-c", _ACTOR], input=pickle.dumps((payload, x)), capture_output=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    heavy, rel, tgt = pickle.loads(proc.stdout)
    assert heavy == []
    ref = ex.explain(x)
    np.testing.assert_allclose(rel, ref.relevance, rtol=0, atol=TOL)
    np.testing.assert_array_equal(tgt, ref.target)


def test_a_runner_from_a_payload_still_names_where_relevance_became_non_finite(tmp_path):
    from onnx_lrp.run.runner import Runner

    model = _overflow_model(tmp_path / "m.onnx")
    run = Runner.from_payload(onnx_lrp.Explainer(model, composite="epsilon").payload())
    np.testing.assert_allclose(run.explain(np.array([[1e-3, 1.0]], np.float32)).relevance,
                               onnx_lrp.Explainer(model, composite="epsilon").explain(
                                   np.array([[1e-3, 1.0]], np.float32)).relevance, rtol=1e-6, atol=0)
    with pytest.raises(onnx_lrp.InputError, match="non-finite.*node mm"):  # the forward overflows: bad input
        run.explain(np.array([[10.0, 1.0]], np.float32))


# ---------------------------------------------------------------------------------------------- resuming
def test_manifest_mismatch_refuses_unless_overwrite(tmp_path, digits):
    np.save(tmp_path / "x.npy", digits[:6])
    args = ["explain", str(DIGITS), str(tmp_path / "x.npy"), "--out-dir", str(tmp_path / "out"), "--shard-size", "2"]
    assert CliRunner().invoke(main, args).exit_code == 0
    box = ["-c", "epsilon-gamma-box", "--low", "0", "--high", "1"]  # digits pixels lie in [0, 1]
    for extra, what in ((box, "composite"), (["--epsilon", "0.5"], "composite"),
                        (["--start", "one-hot"], "parameters")):
        r = CliRunner().invoke(main, args + extra)
        assert r.exit_code == 2 and what in r.stderr and "--overwrite" in r.stderr, r.output
    np.save(tmp_path / "x.npy", digits[:7])  # the source changed
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "source" in r.stderr
    r = CliRunner().invoke(main, args + box + ["--overwrite", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["shards_written"] == 4
    assert json.loads((tmp_path / "out" / MANIFEST).read_text())["composite"]["name"] == "epsilon-gamma-box"


# the fault a test injects (not the engine): the CLI with each shard's write delayed, so a run can be killed half way
_SLOW_SHARDS = """
import sys, time
import onnx_lrp.dataset.local as engine
from onnx_lrp.cli.main import main
write = engine.write_shard
def slow_write(out_dir, res):
    time.sleep(0.1)
    return write(out_dir, res)
engine.write_shard = slow_write
main(sys.argv[1:], prog_name="onnx-lrp")
"""


def test_sigkill_half_way_then_resume_equals_uninterrupted(tmp_path, ex, digits):
    n = 20
    x = digits[:n]
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    cmd = [str(CLI), "explain", str(DIGITS), str(tmp_path / "x.npy"), "--out-dir", str(out), "--shard-size", "1",
           "--batch-size", "1", "--json"]
    slow = [sys.executable, "-c", _SLOW_SHARDS] + cmd[1:]  # the same command, each shard written 0.1 s later
    proc = subprocess.Popen(slow, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done = 0
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            done = len(json.loads((out / MANIFEST).read_text())["shards"])
        except (OSError, ValueError, KeyError):
            done = 0
        if done >= n // 2:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and n // 2 <= done < n, "the run was not killed half way"
    # no partial shard is visible: every part-*.npz is whole, whatever the manifest says
    for p in (out / SHARD_DIR).glob("part-*.npz"):
        with np.load(p) as z:
            assert len(z["items"]) == 1
    listed = json.loads((out / MANIFEST).read_text())
    assert not listed["complete"]
    r = CliRunner().invoke(main, cmd[1:])  # the resume in-process: the same command, no interpreter start-up
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["shards_resumed"] >= len(listed["shards"]) and summary["shards_written"] == n - \
        summary["shards_resumed"] < n
    from onnx_lrp.core.files import temporaries
    assert not temporaries(out / SHARD_DIR) and not temporaries(out)  # the killed run's temporaries: removed
    rel, tgt = single(ex, x)
    assert_same(out, [f"x.npy[{i}]" for i in range(n)], rel, tgt)
    assert json.loads((out / MANIFEST).read_text())["complete"]


def _wide_conv(path: Path) -> Path:
    """Conv(3->4, 3x3) - ReLU - GlobalAveragePool - Flatten - Gemm(4->10) on 3x32x32 inputs (12 KiB per item)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "cw"),
             numpy_helper.from_array(rng.normal(size=4).astype(np.float32), "cb"),
             numpy_helper.from_array(rng.normal(size=(10, 4)).astype(np.float32), "gw"),
             numpy_helper.from_array(rng.normal(size=10).astype(np.float32), "gb")]
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], transB=1, name="fc")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


PEAK_SCRIPT = """
import os, sys, threading, time
import onnx_lrp

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

model, source, out, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ex = onnx_lrp.Explainer(model)
peak, stop = [rss()], threading.Event()

def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.002)

t = threading.Thread(target=sample)
t.start()
s = onnx_lrp.explain_dataset(model, source, out, shard_size=50, batch_size=50, workers=2, explainer=ex)
stop.set()
t.join()
assert s["explained"] == n, s
print(peak[0])
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the RSS from /proc")
def test_peak_memory_does_not_grow_with_the_dataset(tmp_path):
    """Peak RSS during the run (sampled) for N and 10 N items (10 and 100 shards, so both fill the pipeline):
    within 10 %. Holding every input and its relevance would add 120 MB at 10 N, most of the peak: a
    non-streaming engine fails this (all 4000 items in one shard measured +130 %)."""
    model = _wide_conv(tmp_path / "m.onnx")
    x = np.random.default_rng(1).uniform(size=(5000, 3, 32, 32)).astype(np.float32)
    peaks = []
    for n in (500, 5000):
        np.save(tmp_path / f"x{n}.npy", x[:n])
        r = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(model), str(tmp_path / f"x{n}.npy"),
                            str(tmp_path / f"out{n}"), str(n)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        peaks.append(int(r.stdout.split()[-1]))
    held = x.nbytes * 2
    assert peaks[1] <= 1.10 * peaks[0] and held > peaks[0] / 4, (peaks, held)


# ---------------------------------------------------------------------------------------------- Ray
def test_engine_ray_without_ray_says_how_to_install(tmp_path, digits, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    np.save(tmp_path / "x.npy", digits[:2])
    r = CliRunner().invoke(main, ["explain", str(DIGITS), str(tmp_path / "x.npy"), "--out-dir",
                                  str(tmp_path / "out"), "--engine", "ray"])
    assert r.exit_code == 2 and "pip install 'onnx-lrp[ray]'" in r.stderr


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    ray = pytest.importorskip("ray")
    marker = str(tmp_path_factory.mktemp("fault") / "killed")

    def kill_on_shard_3_once():
        """The fault this test injects into each Ray worker at its start (a closure: it travels by value): the
        engine's shard task on shard 3 kills the worker process once (the marker file records it)."""
        import os
        from pathlib import Path

        import onnx_lrp.dataset.ray as engine

        explain_shard = engine.explain_shard

        def dying(ex, span, *args, **kwargs):
            if span.index == 3 and not os.path.exists(marker):
                Path(marker).write_text(str(os.getpid()))
                os._exit(1)
            return explain_shard(ex, span, *args, **kwargs)
        engine.explain_shard = dying

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"worker_process_setup_hook": kill_on_shard_3_once})
    yield ray, Path(marker)
    ray.shutdown()


def test_ray_engine_same_numbers_and_a_killed_worker_is_retried(tmp_path, ex, digits, ray_cluster):
    ray, marker = ray_cluster
    x = digits[:45]
    np.save(tmp_path / "x.npy", x)
    s = explain_dataset(DIGITS, tmp_path / "x.npy", tmp_path / "out", engine="ray", shard_size=6, batch_size=4,
                        workers=2)
    assert marker.exists(), "the fault hook did not kill a worker"
    assert (s["explained"], s["shards_written"]) == (45, 8)
    rel, tgt = single(ex, x)
    assert_same(tmp_path / "out", [f"x.npy[{i}]" for i in range(45)], rel, tgt)  # every item exactly once
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["engine"] == "ray" and sorted(r["index"] for r in manifest["shards"]) == list(range(8))

    def rows(shard):  # reading the shards back with Ray Data, as docs/dataset.md shows
        with np.load(shard["path"]) as z:
            return [dict(item=str(i), relevance=r, target=int(t))
                    for i, r, t in zip(z["items"], z["relevance"], z["targets"])]
    paths = sorted(str(p) for p in (tmp_path / "out" / SHARD_DIR).glob("part-*.npz"))
    back = sorted(ray.data.from_items([{"path": p} for p in paths]).flat_map(rows).take_all(),
                  key=lambda r: int(r["item"].split("[")[1][:-1]))
    np.testing.assert_allclose(np.stack([r["relevance"] for r in back]), rel, rtol=0, atol=TOL)


def test_explain_batch_in_a_user_pipeline(ex, digits, ray_cluster):
    ray, _ = ray_cluster
    import onnx_lrp.ray as lrp_ray
    x = digits[:20]
    ref = lrp_ray.relevance_model(DIGITS)
    ds = ray.data.from_items([{"id": f"s{i}", "image": x[i]} for i in range(20)])
    out = ds.map_batches(lrp_ray.ExplainBatch, fn_constructor_kwargs={"relevance_model": ref},
                         compute=ray.data.ActorPoolStrategy(size=1), batch_size=6).take_all()
    got = sorted(out, key=lambda r: int(r["id"][1:]))
    rel, tgt = single(ex, x)
    assert [r["id"] for r in got] == [f"s{i}" for i in range(20)]
    np.testing.assert_allclose(np.stack([r["relevance"] for r in got]), rel, rtol=0, atol=TOL)
    np.testing.assert_array_equal([r["target"] for r in got], tgt)


@pytest.mark.slow  # 15 s: a second actor pool
def test_check_engine_ray_recomputes_a_snapshot(tmp_path, digits, ray_cluster):
    """The snapshot is made in this process; Ray's recomputation must match it to a relative L2 error <= 1e-6 and
    the same outputs per sample (check's own per-sample comparison)."""
    np.save(tmp_path / "x.npy", digits[:24])
    assert CliRunner().invoke(main, ["snapshot", str(DIGITS), str(tmp_path / "x.npy"), "-o",
                                     str(tmp_path / "base.npz")]).exit_code == 0
    r = CliRunner().invoke(main, ["check", str(DIGITS), str(tmp_path / "base.npz"), "--engine", "ray", "--workers",
                                  "2", "--batch-size", "5", "--max-rel-l2", "1e-6", "--max-output-diff", "1e-6",
                                  "--min-cosine", "0.999999"])
    assert r.exit_code == 0 and "OK: all 24 sample(s)" in r.stdout, r.output


def test_the_package_never_imports_the_command_line():
    """Imports run cli -> API -> ...: no module of onnx_lrp (outside cli/) imports onnx_lrp.cli (the dataset
    engines read inputs through onnx_lrp.io.inputs, which the commands import too)."""
    import ast

    offenders = []
    for path in sorted((ROOT / "onnx_lrp").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("onnx_lrp." if node.level else "") + (node.module or "")]
            else:
                continue
            offenders += [f"{path.name}: {n}" for n in names if n == "onnx_lrp.cli" or n.startswith("onnx_lrp.cli.")]
    assert not offenders, offenders


def test_directory_listing_equals_pathlib(tmp_path):
    """list_files (one scandir per directory) = the pathlib definition: every file below the root, sorted by relative
    POSIX path, hidden entries skipped, symbolic links to files kept and to directories not followed."""
    from onnx_lrp.dataset import list_files
    root = tmp_path / "src"
    for p in ["a/b/x.png", "a/.h/y.png", ".z.png", "b.npy", "a/c.jpg", "a/b/.q.npy", "A/d.png", "a b/é.png",
              "a.b/e.png"]:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_bytes(b"x")
    os.symlink(root / "a", root / "link_dir")
    os.symlink(root / "b.npy", root / "link.npy")
    os.symlink(root / "missing", root / "broken.png")
    want = sorted(Path(os.path.relpath(p, root)).as_posix() for p in root.rglob("*") if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(root).parts) and "link_dir" not in p.parts)
    assert list_files(root) == want and "link.npy" in want and "a/c.jpg" in want and len(want) == 7
